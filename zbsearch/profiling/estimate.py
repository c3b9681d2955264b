"""Estimate the built-in GPT's per-layer costs from FLOP counts; no torch, nothing runs.

FLOP counts of the Zero Bubble paper's Table 1 (arXiv 2401.10241) divided by a GPU's dense peak times
a model FLOPs utilization (MFU). Units: times in microseconds, memory in bytes.
"""

from __future__ import annotations

from ..core.errors import ProfilerError
from .costs import LayerCost
from .hardware import gpu_spec
from .request import ATTENTIONS, DEFAULT_MFU, DTYPE_BYTES, DTYPES, GptShape, bad_input, check_choice

PAPER = "Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, arXiv:2401.10241"

ESTIMATE_FORMULAS = (
    "per transformer layer, the Zero Bubble paper's Table 1: F = b*s*h*(24h + 4s), B = b*s*h*(24h + 8s), "
    "W = b*s*h*24h FLOPs; M_B = b*s*(34h + 5as) and M_W = 32*b*s*h bytes for 16-bit activations (twice that "
    "for fp32), with the 5as attention-matrix term dropped for fused (flash, --attention sdpa) attention, which "
    "keeps no s x s matrix. LM head (not in Table 1): 2*b*s*h*V FLOPs for each of F, B, W; M_B = b*s*(2dh + dV + 4V) bytes "
    "(norm input and output, logits, fp32 log-softmax), M_W = b*s*(dh + dV) bytes (head input, logits gradient), "
    "d = bytes per element. Embedding: no FLOPs; it holds the token ids, 8*b*s bytes"
)


def check_mfu(mfu: float) -> float:
    """`mfu` when it is a fraction of the peak in (0, 1]."""
    if not (isinstance(mfu, (int, float)) and not isinstance(mfu, bool) and 0 < mfu <= 1):
        raise bad_input(ProfilerError, f"MFU {mfu} is not a fraction of the GPU's peak: give 0 < MFU <= 1, e.g. 0.4",
                        "mfu")
    return mfu


def estimate_gpt(shape: GptShape, gpu: str, *, dtype: str = "bf16", mfu: float = DEFAULT_MFU,
                 attention: str = "naive") -> list[LayerCost]:
    """Per-layer costs of the built-in GPT from FLOP counts and a GPU's peak.

    time = FLOPs / (peak TFLOP/s of the dtype * mfu). See ESTIMATE_FORMULAS for the counts used.

    Examples
    --------
    >>> layers = estimate_gpt(GptShape(layers=2), "a100", mfu=0.5)
    >>> [c.name for c in layers]
    ['embedding', 'block0', 'block1', 'head']
    >>> layers[1].B + layers[1].W == 2 * layers[1].F  # the paper's T_B + T_W = 2 T_F
    True
    """
    shape.check()
    check_choice(attention, ATTENTIONS, "attention", "attention")
    spec = gpu_spec(gpu)
    check_choice(dtype, DTYPES, "dtype", "dtype")
    check_mfu(mfu)
    b, s, h, a, V = shape.micro_batch, shape.seq, shape.hidden, shape.heads, shape.vocab
    rate = spec.peak_tflops[dtype] * 1e12 * mfu / 1e6  # FLOPs per microsecond
    act = DTYPE_BYTES[dtype] / 2  # the paper's byte counts assume 16-bit activations
    out_bytes = b * s * h * DTYPE_BYTES[dtype]
    layers = [LayerCost("embedding", 0.0, 0.0, 0.0, 0.0, 8.0 * b * s, 8.0 * b * s,
                        params=V * h + s * h, out_bytes=out_bytes, extra={"flops_F": 0})]
    f, bi, w = b * s * h * (24 * h + 4 * s), b * s * h * (24 * h + 8 * s), b * s * h * 24 * h
    for i in range(shape.layers):
        layers.append(LayerCost(
            f"block{i}", f / rate, bi / rate, w / rate, (bi + w) / rate,
            act * b * s * (34 * h + (5 * a * s if attention == "naive" else 0)), act * 32 * b * s * h,
            params=shape.block_params(),
            out_bytes=out_bytes, extra={"flops_F": f, "flops_B": bi, "flops_W": w},
        ))
    head, d = 2 * b * s * h * V, DTYPE_BYTES[dtype]
    layers.append(LayerCost(
        "head", head / rate, head / rate, head / rate, 2 * head / rate,
        float(b * s * (2 * d * h + d * V + 4 * V)), float(b * s * (d * h + d * V)), params=V * h + 2 * h,
        out_bytes=4, extra={"flops_F": head, "flops_B": head, "flops_W": head},
    ))
    return layers

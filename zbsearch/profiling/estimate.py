"""Estimate a model's per-layer costs from FLOP counts and bytes moved; no torch, nothing runs.

Matrix work: FLOP counts (the Zero Bubble paper's Table 1 for the GPT, the same convention for the
Llama-style and MoE blocks, see transformer.py) divided by a GPU's dense peak times a model FLOPs
utilization (MFU). The embedding does no matrix work: its gather and its gradient's scatter-add are
memory-bound, so their time is the bytes they move over the GPU's HBM bandwidth. Units: times in
microseconds, memory in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union

from ..core.errors import ProfilerError
from .costs import LayerCost, apply_layout, decoder_layout
from .hardware import gpu_spec
from .request import (ATTENTIONS, DEFAULT_MFU, DTYPE_BYTES, DTYPES, GptShape, LlamaShape, MoeShape, bad_input,
    check_choice)
from .transformer import block_flops, kept_for_W, per_token, saved_for_B, stored_for_W

PAPER = "Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, arXiv:2401.10241"

Shape = Union[GptShape, LlamaShape, MoeShape]

GPT_FORMULAS = (
    "per transformer layer, the Zero Bubble paper's Table 1: F = b*s*h*(24h + 4s), B = b*s*h*(24h + 8s), "
    "W = b*s*h*24h FLOPs; M_B = b*s*(34h + 5as) and M_W = 32*b*s*h bytes for 16-bit activations (twice that "
    "for fp32), with the 5as attention-matrix term dropped for fused (flash, sdpa) attention, which "
    "keeps no s x s matrix"
)
DECODER_FORMULAS = (
    "per block, the Zero Bubble paper's convention: F = 2*b*s*P + 4*b*s^2*h_a, B = 2*b*s*P + 8*b*s^2*h_a, "
    "W = 2*b*s*P FLOPs, P = the weights of the matrix multiplies a token passes through (q, k, v and output "
    "projections; gate, up and down; in a MoE block the router, its top-k routed experts and the shared "
    "experts), h_a = heads * head_dim; norms, RoPE, SwiGLU and softmax count no FLOPs. M_B counts the tensors "
    "saved for backward one by one (attention and MLP norm inputs, normed inputs, q, k, v, the attention output, "
    "the SwiGLU inputs and output; fused sdpa attention keeps a log-sum-exp per head and no s x s matrix, naive "
    "keeps the probabilities; MoE: router probabilities, top-k indices and weights, tokens dispatched to k "
    "experts and the experts' tensors), M_W the matrix multiplies' inputs plus their output gradients; see "
    "details.estimate.activation_bytes_per_token"
)
HEAD_FORMULA = (
    "Output (final norm, vocabulary projection, cross-entropy; not in Table 1): 2*b*s*h*V FLOPs for each of F, "
    "B, W; M_B = b*s*(2dh + dV + 4V) bytes (norm input and output, logits, fp32 log-softmax), "
    "M_W = b*s*(dh + dV) bytes (projection input, logits gradient), d = bytes per element"
)
EMBEDDING_FORMULA = (
    "Token embedding (no FLOPs, memory-bound): F = the bytes its gather moves (token ids 8*b*s, rows read and "
    "output written 2*b*s*h*d{pos_f}) over the GPU's HBM bandwidth, W = the bytes the scatter-add of its output "
    "gradient into the table's gradient moves (ids 8*b*s, gradient read b*s*h*d, gradient rows read and "
    "written 2*b*s*h*d{pos_w}) over the same bandwidth, at the datasheet figure; B = 0 (token ids take no "
    "gradient); it holds the token ids, 8*b*s bytes"
)
GPT_POSITION = ("; the learned position table and the add another 2*b*s*h*d + 3*s*h*d",
                "; the position table's gradient another b*s*h*d + 3*s*h*d")


def estimate_formulas(shape: Shape) -> str:
    """How `estimate_layers` counts, in words, for the profile's source."""
    gpt = isinstance(shape, GptShape)
    pos_f, pos_w = GPT_POSITION if gpt else ("", "")
    return "; ".join((GPT_FORMULAS if gpt else DECODER_FORMULAS, HEAD_FORMULA,
                      EMBEDDING_FORMULA.format(pos_f=pos_f, pos_w=pos_w)))


def check_mfu(mfu: float) -> float:
    """`mfu` when it is a fraction of the peak in (0, 1]."""
    if not (isinstance(mfu, (int, float)) and not isinstance(mfu, bool) and 0 < mfu <= 1):
        raise bad_input(ProfilerError, f"MFU {mfu} is not a fraction of the GPU's peak: give 0 < MFU <= 1, e.g. 0.4",
                        "mfu")
    return mfu


@dataclass(frozen=True)
class Rates:
    """What one microsecond buys on the GPU: FLOPs of matrix work at the MFU, bytes of HBM traffic."""

    flops: float
    bytes: float
    d: int  # bytes per activation element


def rates(gpu: str, dtype: str, mfu: float) -> Rates:
    spec = gpu_spec(gpu)
    check_choice(dtype, DTYPES, "dtype", "dtype")
    check_mfu(mfu)
    return Rates(spec.peak_tflops[dtype] * 1e12 * mfu / 1e6, spec.memory_bandwidth / 1e6, DTYPE_BYTES[dtype])


def _flops_cost(name: str, flops: Mapping[str, float], r: Rates, mem: tuple[float, float], params: int,
                out_bytes: int) -> LayerCost:
    F, B, W = (flops[k] / r.flops for k in ("F", "B", "W"))
    return LayerCost(name, F, B, W, B + W, mem[0], mem[1], params=params, out_bytes=out_bytes, extra={"flops": flops})


def _held_by_torch(cost: LayerCost, stored_for_W: float) -> LayerCost:
    """The cost with what torch's split backward holds of the layer from I until W: everything saved for
    B (I keeps the whole graph) plus the gradients it stores for W (core/calibration.py reads it)."""
    cost.extra["mem_W_torch_runtime"] = cost.mem_B + stored_for_W
    return cost


def embedding_cost(shape: Shape, r: Rates, params: int) -> LayerCost:
    """The token embedding (with the GPT's learned positions): a memory-bound gather and scatter-add."""
    b, s, h, d = shape.micro_batch, shape.seq, shape.hidden, r.d
    moved = {"F": 8 * b * s + 2 * b * s * h * d, "W": 8 * b * s + 3 * b * s * h * d}
    if isinstance(shape, GptShape):
        moved = {"F": moved["F"] + 2 * b * s * h * d + 3 * s * h * d, "W": moved["W"] + b * s * h * d + 3 * s * h * d}
    F, W = moved["F"] / r.bytes, moved["W"] / r.bytes
    cost = LayerCost("tok_embeddings", F, 0.0, W, W, 8.0 * b * s, 8.0 * b * s, params=params,
                     out_bytes=b * s * h * d, extra={"bytes_moved": moved, "flops": {"F": 0, "B": 0, "W": 0}})
    return _held_by_torch(cost, 0.0)  # on the first stage torch runs the whole backward at once


def head_cost(shape: Shape, r: Rates, params: int) -> LayerCost:
    """Final norm, vocabulary projection and cross-entropy (logits in the activation dtype, fp32 log-softmax)."""
    b, s, h, V, d = shape.micro_batch, shape.seq, shape.hidden, shape.vocab, r.d
    flops = 2.0 * b * s * h * V
    mem = (float(b * s * (2 * d * h + d * V + 4 * V)), float(b * s * (d * h + d * V)))
    cost = _flops_cost("output", {"F": flops, "B": flops, "W": flops}, r, mem, params, 4)
    return _held_by_torch(cost, b * s * d * (V + h))  # the logits' and the final norm's output gradients


def _with_recompute(cost: LayerCost, input_bytes: float, core: tuple[float, float] | None) -> LayerCost:
    """The block with its recompute options (core/recompute/options.py). full keeps only the block's input and
    runs its forward again in I; selective (naive attention only; `core`: the bytes the attention core
    saves and its forward time) drops the core's saved tensors and runs the core again in I. Either way I
    rebuilds what was dropped and, keeping its graph for W, holds it until W: the options' mem_W and peak
    are the block's mem_W_torch."""
    held_w = cost.extra["mem_W_torch_runtime"]
    options = [{"level": "full", "time": cost.F, "pays": "I", "mem_B": float(input_bytes), "mem_W": held_w,
                "peak": held_w}]
    if core is not None:
        options.insert(0, {"level": "selective", "time": core[1], "pays": "I", "mem_B": cost.mem_B - core[0],
                           "mem_W": held_w, "peak": held_w})
    cost.extra["recompute"] = options
    return cost


def _gpt_block(shape: GptShape, i: int, r: Rates, attention: str) -> LayerCost:
    b, s, h, a = shape.micro_batch, shape.seq, shape.hidden, shape.heads
    flops = {"F": b * s * h * (24 * h + 4 * s), "B": b * s * h * (24 * h + 8 * s), "W": b * s * h * 24 * h}
    act = r.d / 2  # the paper's byte counts assume 16-bit activations
    mem = (act * b * s * (34 * h + (5 * a * s if attention == "naive" else 0)), act * 32 * b * s * h)
    cost = _flops_cost(f"layers.{i}", flops, r, mem, shape.block_params(i), b * s * h * r.d)
    # The output gradients of q/k/v (3h), the projection (h), the MLP's two (4h, h) and both norms (2h):
    # measured exact on the profiler's GPT (profiles/cpu-gpt-fidelity.json: 11h per token in fp32).
    cost = _held_by_torch(cost, 11 * b * s * h * r.d)
    # Korthikanti et al.'s attention core: 5as/h of the 34 + 5as/h, and its score and value products.
    core = (act * b * s * 5 * a * s, 4.0 * b * s * s * h / r.flops) if attention == "naive" else None
    return _with_recompute(cost, b * s * h * r.d, core)


def _decoder_block(shape: LlamaShape, i: int, r: Rates, attention: str) -> LayerCost:
    tokens = shape.micro_batch * shape.seq
    mem = (tokens * per_token(saved_for_B(shape, i, r.d, attention)), tokens * per_token(kept_for_W(shape, i, r.d)))
    cost = _held_by_torch(_flops_cost(f"layers.{i}", block_flops(shape, i), r, mem, shape.block_params(i),
                                      tokens * shape.hidden * r.d), tokens * per_token(stored_for_W(shape, i, r.d)))
    if isinstance(shape, MoeShape):
        cost.extra["mlp"] = "MoE" if shape.is_moe(i) else "dense"
    # The naive core keeps its softmax probabilities (s per head and token); its products cost 4bs^2 h_a.
    core = (tokens * shape.heads * shape.seq * r.d, 4.0 * tokens * shape.seq * shape.heads * shape.dh / r.flops) \
        if attention == "naive" else None
    return _with_recompute(cost, tokens * shape.hidden * r.d, core)


def estimate_layers(shape: Shape, gpu: str, *, dtype: str = "bf16", mfu: float = DEFAULT_MFU,
                    attention: str = "naive") -> list[LayerCost]:
    """Per-layer costs of a GPT, Llama-style or MoE shape from FLOP counts, bytes moved and a GPU's datasheet.

    Layers are named by their module paths: tok_embeddings, layers.0 ... layers.{L-1}, output (which
    covers the final norm). See `estimate_formulas` for the counts used.

    Examples
    --------
    >>> layers = estimate_layers(LlamaShape(layers=2), "a100", mfu=0.5)
    >>> [c.name for c in layers], [c.kind for c in layers][::3]
    (['tok_embeddings', 'layers.0', 'layers.1', 'output'], ['embedding', 'output'])
    """
    shape.check()
    check_choice(attention, ATTENTIONS, "attention", "attention")
    r = rates(gpu, dtype, mfu)
    params = shape.layer_params()
    if isinstance(shape, GptShape):
        blocks = [_gpt_block(shape, i, r, attention) for i in range(shape.layers)]
    else:
        blocks = [_decoder_block(shape, i, r, attention) for i in range(shape.layers)]
    costs = [embedding_cost(shape, r, params[0]), *blocks, head_cost(shape, r, params[-1])]
    return apply_layout(costs, decoder_layout(shape.layers, positions=isinstance(shape, GptShape)))


def estimate_gpt(shape: GptShape, gpu: str, *, dtype: str = "bf16", mfu: float = DEFAULT_MFU,
                 attention: str = "naive") -> list[LayerCost]:
    """Per-layer costs of the built-in GPT from FLOP counts and a GPU's peak.

    time = FLOPs / (peak TFLOP/s of the dtype * mfu). See `estimate_formulas` for the counts used.

    Examples
    --------
    >>> layers = estimate_gpt(GptShape(layers=2), "a100", mfu=0.5)
    >>> [c.name for c in layers]
    ['tok_embeddings', 'layers.0', 'layers.1', 'output']
    >>> layers[1].B + layers[1].W == 2 * layers[1].F  # the paper's T_B + T_W = 2 T_F
    True
    """
    return estimate_layers(shape, gpu, dtype=dtype, mfu=mfu, attention=attention)

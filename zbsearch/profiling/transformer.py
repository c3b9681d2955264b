"""FLOP counts and saved-tensor inventories of Llama-style and MoE decoder blocks, for estimates; no torch.

FLOPs follow the Zero Bubble paper's convention (Qi et al., ICLR 2024, arXiv:2401.10241), as the GPT's
Table 1 does: a token through a k x n weight costs 2kn FLOPs in F, the same again in B (the input
gradient) and in W (the weight gradient); attention's score and value products cost 4*b*s^2*h_a in F
and 8*b*s^2*h_a in B (no causal halving), with h_a = heads * head_dim. Norms, RoPE, SwiGLU, softmax
and the routing's bookkeeping count no FLOPs.

Activation memory is counted tensor by tensor, per token: `saved_for_B` lists what a block keeps from
its F until its B, `kept_for_W` what its W still needs after B (the inputs of its weight matrix
multiplies and the gradients of their outputs, the paper's M_W convention; norm weights left out).
"""

from __future__ import annotations

from typing import Any

from .request import LlamaShape, MoeShape

Tensor = tuple[str, float]  # (what, bytes per token)

FP32 = 4
INDEX = 8  # int64


def _moe(shape: LlamaShape, i: int) -> bool:
    return isinstance(shape, MoeShape) and shape.is_moe(i)


def matmul_params(shape: LlamaShape, i: int) -> int:
    """Weights of the matrix multiplies one token passes through in block i (its routed top-k only)."""
    h = shape.hidden
    if not _moe(shape, i):
        return shape.attention_params() + shape.mlp_params(i)
    assert isinstance(shape, MoeShape)
    active = shape.top_k + shape.shared_experts
    return shape.attention_params() + h * shape.experts + 3 * h * shape.expert_size * active


def block_flops(shape: LlamaShape, i: int) -> dict[str, float]:
    """F, B and W FLOPs of block i for one microbatch."""
    b, s = shape.micro_batch, shape.seq
    mm = 2.0 * b * s * matmul_params(shape, i)
    scores = float(b * s * s * shape.heads * shape.dh)
    return {"F": mm + 4 * scores, "B": mm + 8 * scores, "W": mm}


def _attention_saved(shape: LlamaShape, d: int, attention: str) -> list[Tensor]:
    h, q, kv = shape.hidden, shape.heads * shape.dh, 2 * shape.kv * shape.dh
    out: list[Tensor] = [
        ("attention norm input", h * d), ("attention norm 1/rms (fp32)", FP32),
        ("q, k, v projection input (normed)", h * d), ("q and k after RoPE, v", (q + kv) * d),
        ("attention output (also the output projection's input)", q * d),
    ]
    if attention == "sdpa":
        out.append(("fused attention log-sum-exp per head (fp32)", FP32 * shape.heads))
    else:
        out.append(("attention probabilities, s per head", shape.heads * shape.seq * d))
    return out


def _mlp_saved(shape: LlamaShape, i: int, d: int) -> list[Tensor]:
    h = shape.hidden
    out: list[Tensor] = [("MLP norm input", h * d), ("MLP norm 1/rms (fp32)", FP32),
                         ("MLP input (normed)", h * d)]
    if not _moe(shape, i):
        f = shape.ffn_size
        return out + [("gate and up outputs (SwiGLU inputs)", 2 * f * d), ("down projection input", f * d)]
    assert isinstance(shape, MoeShape)
    k, f, n = shape.top_k, shape.expert_size, shape.shared_experts
    out += [("router probabilities (fp32)", FP32 * shape.experts),
            ("top-k expert indices (int64) and weights (fp32)", (INDEX + FP32) * k),
            ("tokens dispatched to their top-k experts", k * h * d),
            ("routed experts' gate and up outputs", 2 * k * f * d), ("routed experts' down inputs", k * f * d),
            ("routed experts' outputs (for the routing weights' gradient)", k * h * d)]
    if n:
        out += [("shared experts' gate and up outputs", 2 * n * f * d), ("shared experts' down inputs", n * f * d)]
    return out


def saved_for_B(shape: LlamaShape, i: int, d: int, attention: str) -> list[Tensor]:
    """What block i keeps from F until B, per token; `d` bytes per activation element. Fused attention
    (sdpa, flash) keeps q, k, v, its output and a log-sum-exp per head, no s x s matrix; naive attention
    keeps the softmax probabilities instead of the log-sum-exp. SwiGLU keeps its two inputs (its output
    is the down projection's input); nothing else is recomputed and there is no dropout."""
    return _attention_saved(shape, d, attention) + _mlp_saved(shape, i, d)


def kept_for_W(shape: LlamaShape, i: int, d: int) -> list[Tensor]:
    """What block i's W still needs after B, per token: each weight matrix multiply's input and the
    gradient of its output."""
    h, q, kv = shape.hidden, shape.heads * shape.dh, 2 * shape.kv * shape.dh
    out: list[Tensor] = [("q, k, v projection input", h * d), ("q, k, v output gradients", (q + kv) * d),
                         ("output projection input", q * d), ("output projection output gradient", h * d),
                         ("MLP input (normed)", h * d)]
    if not _moe(shape, i):
        f = shape.ffn_size
        return out + [("gate and up output gradients", 2 * f * d), ("down projection input", f * d),
                      ("down projection output gradient", h * d)]
    assert isinstance(shape, MoeShape)
    k, f, n = shape.top_k, shape.expert_size, shape.shared_experts
    out += [("router output gradient (fp32)", FP32 * shape.experts),
            ("tokens dispatched to their top-k experts", k * h * d),
            ("routed experts' gate and up output gradients", 2 * k * f * d),
            ("routed experts' down inputs", k * f * d), ("routed experts' down output gradients", k * h * d)]
    if n:
        out += [("shared experts' gate and up output gradients", 2 * n * f * d),
                ("shared experts' down inputs", n * f * d), ("shared experts' down output gradient", h * d)]
    return out


def stored_for_W(shape: LlamaShape, i: int, d: int) -> list[Tensor]:
    """The gradients torch's split backward stores for block i's W, per token: each weight-bearing op's
    output gradient (its matrix multiplies', as kept_for_W lists them, and the two norms', whose weights
    need theirs). From I until W torch holds these on top of everything saved for B, since I keeps the
    whole graph (retain_graph); measured exact on a CPU Llama-style block (issue 28)."""
    grads = [t for t in kept_for_W(shape, i, d) if "gradient" in t[0]]
    return grads + [("attention norm output gradient", shape.hidden * d), ("MLP norm output gradient", shape.hidden * d)]


def per_token(tensors: list[Tensor]) -> float:
    return float(sum(nbytes for _, nbytes in tensors))


def inventory(shape: LlamaShape, d: int, attention: str) -> dict[str, Any]:
    """Bytes per token of every tensor each kind of block holds (the dense and, for a MoE shape, the MoE
    block), for the profile's details."""
    kinds = {"dense block": 0}
    if isinstance(shape, MoeShape):
        kinds = {"dense block": 0} if shape.dense_layers else {}
        if shape.dense_layers < shape.layers:
            kinds["MoE block"] = shape.dense_layers
    return {name: {"saved from F until B": dict(saved_for_B(shape, i, d, attention)),
                   "kept from B until W": dict(kept_for_W(shape, i, d)),
                   "stored by torch's I for W": dict(stored_for_W(shape, i, d))} for name, i in kinds.items()}

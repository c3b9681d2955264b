"""The Llama-style and MoE decoders the profiler measures on torch, built from the shape records the
estimate counts (request.LlamaShape, MoeShape), so that a measured and an estimated profile of one shape
line up layer by layer: the same names (tok_embeddings, layers.{i}, output), the same parameters, the
same matrix multiplies (transformer.py's FLOP convention).

A block: RMSNorm, q/k/v projections, rotary positions on q and k, causal attention over grouped
key/value heads, the output projection and the residual; RMSNorm, a SwiGLU MLP (or a router over SwiGLU
experts) and the residual. No biases, no dropout. Submodules carry torchtitan's Llama names (wq, wk, wv,
wo, attention_norm, ffn_norm, feed_forward.w1/w2/w3); `attention` is the core's kind (naive or sdpa),
as on models.Block, which the recompute probes read (measure_recompute.levels_of).

What autograd saves here against what the estimate counts (transformer.py's inventory, per token, d
bytes per element, f the SwiGLU inner size), left as plain torch computes it rather than forced:
* SwiGLU `w2(silu(w1 x) * w3 x)` keeps silu's output for the product's gradient: 4f*d, where the estimate
  counts the gate and up outputs and the down projection's input, 3f*d (every routed and shared expert too).
* nn.RMSNorm: where torch runs it fused (its CUDA kernel) it keeps the input and a fp32 1/rms, as counted;
  its composite form (the CPU) keeps the normalized input again for the weight's gradient (h*d more, and a
  fp32 copy of the input in 16-bit dtypes).
* naive attention repeats k and v to every query head inside the core (heads*head_dim each, the estimate
  counts key/value heads); sdpa takes the groups as they are (enable_gqa), when its kernel supports that.
* MoE: the dispatch order (int64, k per token) and the routing weights in the activation dtype (the
  estimate counts fp32 weights); no auxiliary load-balancing loss.
Importing this module needs torch.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from .costs import decoder_layout
from .models import LayerSpec, seeded
from .request import ATTENTIONS, LlamaShape, MoeShape, check_choice

NORM_EPS = 1e-5  # Llama 3's rms_norm_eps
ROPE_THETA = 500000.0  # Llama 3's rope_theta


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x): gate w1, up w3, down w2 (Llama's names)."""

    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.w1, self.w3 = nn.Linear(hidden, inner, bias=False), nn.Linear(hidden, inner, bias=False)
        self.w2 = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    """A router over SwiGLU experts, each token through its top-k (weighted by the router's softmax
    probabilities, not renormalized) plus the shared experts (one SwiGLU of their joint size, as
    DeepSeek builds them: the same weights and FLOPs)."""

    def __init__(self, shape: MoeShape) -> None:
        super().__init__()
        h, size = shape.hidden, shape.expert_size
        self.top_k = shape.top_k
        self.router = nn.Linear(h, shape.experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(h, size) for _ in range(shape.experts))
        self.shared = SwiGLU(h, size * shape.shared_experts) if shape.shared_experts else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        probs = self.router(tokens).float().softmax(-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        flat = chosen.flatten()
        order = flat.argsort(stable=True)  # the tokens' k copies grouped by expert
        # how many copies each expert takes: a sync with the device, as a dropless MoE has somewhere
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        parts = tokens.index_select(0, order // self.top_k).split(counts)
        outs = torch.cat([expert(part) for expert, part in zip(self.experts, parts)])
        # back in token order (a gather, which keeps only its indices, where a scatter-add keeps its source)
        back = outs.index_select(0, order.argsort()).view(-1, self.top_k, outs.shape[-1])
        out = (back * weights.unsqueeze(-1).to(back.dtype)).sum(1)
        if self.shared is not None:
            out = out + self.shared(tokens)
        return out.view_as(x)


def rotary_tables(head_dim: int, seq: int, theta: float = ROPE_THETA) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, (seq, 1, head_dim), for `rotate`."""
    half = (head_dim + 1) // 2
    inv = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
    angles = torch.cat((angles, angles), -1)[:, :head_dim].unsqueeze(1)
    return angles.cos().float(), angles.sin().float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions on x (b, s, heads, head_dim), in the rotate-half form: it saves only the tables
    (buffers), nothing per token."""
    s = x.shape[1]
    x1, x2 = x.chunk(2, -1)
    return x * cos[:s] + torch.cat((-x2, x1), -1) * sin[:s]


class DecoderBlock(nn.Module):
    """Pre-norm Llama-style block i of `shape`: grouped-query attention with rotary positions, then a
    SwiGLU MLP (or, in a MoE shape's block past its dense ones, the experts)."""

    cos: torch.Tensor  # buffers
    sin: torch.Tensor
    future: torch.Tensor

    def __init__(self, shape: LlamaShape, i: int, attention: str) -> None:
        super().__init__()
        h, dh = shape.hidden, shape.dh
        self.heads, self.kv, self.dh, self.attention = shape.heads, shape.kv, dh, attention
        self.attention_norm, self.ffn_norm = nn.RMSNorm(h, eps=NORM_EPS), nn.RMSNorm(h, eps=NORM_EPS)
        self.wq, self.wo = nn.Linear(h, self.heads * dh, bias=False), nn.Linear(self.heads * dh, h, bias=False)
        self.wk, self.wv = nn.Linear(h, self.kv * dh, bias=False), nn.Linear(h, self.kv * dh, bias=False)
        self.feed_forward: nn.Module = MoE(shape) if isinstance(shape, MoeShape) and shape.is_moe(i) \
            else SwiGLU(h, shape.ffn_size)
        cos, sin = rotary_tables(dh, shape.seq)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        if attention == "naive":  # a buffer, so that the mask masked_fill keeps is no activation
            self.register_buffer("future", torch.ones(shape.seq, shape.seq, dtype=torch.bool).triu(1),
                                 persistent=False)
        # Set by recompute_once.recompute_core: runs `attend` with selective recompute.
        self.core_wrapper: Callable[..., torch.Tensor] | None = None
        self.attention_kernel: str | None = None  # sdpa's backward node once it ran: which kernel torch chose

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        normed = self.attention_norm(x)
        q = rotate(self.wq(normed).view(b, s, self.heads, self.dh), self.cos, self.sin).transpose(1, 2)
        k = rotate(self.wk(normed).view(b, s, self.kv, self.dh), self.cos, self.sin).transpose(1, 2)
        v = self.wv(normed).view(b, s, self.kv, self.dh).transpose(1, 2)
        o = self.attend(q, k, v) if self.core_wrapper is None else self.core_wrapper(self.attend, q, k, v)
        if self.attention == "sdpa" and o.grad_fn is not None:  # flash, cuDNN, efficient, or math's last op
            self.attention_kernel = type(o.grad_fn).__name__
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, self.heads * self.dh))
        return x + self.feed_forward(self.ffn_norm(x))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention core (scores, softmax, value product), what selective recompute runs again."""
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.heads)
        group = self.heads // self.kv
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        s = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)) * self.dh ** -0.5
        return scores.masked_fill(self.future[:s, :s], float("-inf")).softmax(-1) @ v


class DecoderHead(nn.Module):
    """Final RMSNorm, the untied output projection and cross-entropy (in fp32) against fixed random targets;
    `norm` and `output` are the module paths the layout gives the layer."""

    targets: torch.Tensor  # a buffer

    def __init__(self, shape: LlamaShape, targets: torch.Tensor) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(shape.hidden, eps=NORM_EPS)
        self.output = nn.Linear(shape.hidden, shape.vocab, bias=False)
        self.register_buffer("targets", targets, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.output(self.norm(x))
        return F.cross_entropy(logits.float().flatten(0, 1), self.targets.flatten())


def decoder_layers(shape: LlamaShape, attention: str = "sdpa", seed: int = 0,
                   device: torch.device | None = None) -> tuple[list[LayerSpec], torch.Tensor]:
    """A Llama-style or MoE shape as lazily built layers (token embedding, blocks, head) and a sample
    batch of token ids; `device`: where each layer is built (its weights initialized there: on a GPU,
    much faster than on the CPU for billions of parameters)."""
    shape.check()
    check_choice(attention, ATTENTIONS, "attention", "attention")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(shape.vocab, (shape.micro_batch, shape.seq), generator=gen)
    targets = torch.randint(shape.vocab, (shape.micro_batch, shape.seq), generator=gen)
    names = [name for name, _, _ in decoder_layout(shape.layers)]
    specs: list[LayerSpec] = [(names[0], seeded(seed, partial(nn.Embedding, shape.vocab, shape.hidden), device))]
    for i in range(shape.layers):
        specs.append((names[i + 1], seeded(seed + i + 1, partial(DecoderBlock, shape, i, attention), device)))
    specs.append((names[-1], seeded(seed + shape.layers + 1, partial(DecoderHead, shape, targets), device)))
    return specs, ids

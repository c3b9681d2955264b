"""One tensor-parallel rank's share of a Llama-style or MoE block, as a shape record of its own.

Megatron-LM's tensor parallelism (Shoeybi et al., Megatron-LM, arXiv:1909.08053, section 3) splits the
attention by heads (query heads and key/value groups alike) and the MLP by its inner size, and a
vocabulary-parallel embedding and output projection split the vocabulary; the residual stream (hidden
size) is whole on every rank. So the share of t ranks is the same kind of shape with heads, key/value
heads, FFN (and each expert's FFN) and vocabulary divided by t and the head size kept: its FLOPs, weights
and per-head activations are the whole block's divided by t. What the share leaves out is the
collectives that join the ranks (whole-run planning adds them per block) and, under sequence
parallelism, the sequence split of the hidden-wide activations (norm inputs and the residual), which
the shard record still counts whole.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Union

from ..core.errors import ProfilerError
from .request import GptShape, LlamaShape, MoeShape, bad_input

Shape = Union[GptShape, LlamaShape, MoeShape]


def tp_degrees(shape: LlamaShape, limit: int) -> list[int]:
    """The tensor-parallel degrees up to `limit` that split the shape's heads and key/value heads whole.

    >>> tp_degrees(LlamaShape(heads=32, kv_heads=8, hidden=4096), 16)
    [1, 2, 4, 8]
    """
    return [t for t in range(1, limit + 1) if shape.heads % t == 0 and shape.kv % t == 0
            and shape.ffn_size % t == 0 and (not isinstance(shape, MoeShape) or shape.expert_size % t == 0)]


def tp_shard(shape: Shape, t: int) -> LlamaShape:
    """The share of one of `t` tensor-parallel ranks (t = 1: the shape itself).

    The vocabulary is padded up to a multiple of t, as Megatron pads it.

    >>> s = tp_shard(LlamaShape(layers=2, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256), 8)
    >>> (s.heads, s.kv_heads, s.head_dim, s.ffn, s.vocab)
    (4, 1, 128, 1792, 16032)

    Raises
    ------
    ProfilerError
        t below 1, a GPT shape (its MLP size is fixed at 4h, so no record holds its share), or t not
        dividing the heads, the key/value heads or the FFN (the message lists the degrees that do).
    """
    if isinstance(t, bool) or not isinstance(t, int) or t < 1:
        raise bad_input(ProfilerError, f"tensor-parallel degree {t!r}: give a whole number >= 1", "tp")
    if isinstance(shape, GptShape):
        raise bad_input(ProfilerError, "tensor parallelism is modelled for llama and moe shapes, not gpt: use "
                        "a llama or moe shape (or a preset)", "tp")
    if t == 1:
        return shape
    fits = tp_degrees(shape, max(t, 64))
    if t not in fits:
        raise bad_input(ProfilerError, f"tensor-parallel degree {t} does not split {shape.heads} heads, {shape.kv} "
                        f"key/value heads and FFN {shape.ffn_size} whole: use one of "
                        f"{', '.join(map(str, fits))}", "tp")
    shard: LlamaShape = replace(shape, heads=shape.heads // t, kv_heads=shape.kv // t, head_dim=shape.dh,
                                ffn=shape.ffn_size // t, vocab=math.ceil(shape.vocab / t))
    if isinstance(shape, MoeShape):
        shard = replace(shape, heads=shard.heads, kv_heads=shard.kv_heads, head_dim=shard.head_dim, ffn=shard.ffn,
                        vocab=shard.vocab, expert_ffn=shape.expert_size // t)
    return shard.check()

"""Megatron's interleaved 1F1B (Narayanan et al., arXiv 2104.04473), full backward per chunk.

Placement ir.interleaved(p, v): rank r holds chunks r, r+p, ..., r+(v-1)p, each doing 1/v of a stage.
A rank works through m*v chunk-passes in each direction. Microbatches go in groups of p and, within a
group, chunk by chunk: the k-th forward of a rank is on its local chunk (k mod pv) // p for microbatch
(k // pv) p + k mod p; the k-th backward visits the same microbatches with the local chunks reversed
(the last chunk first, since the backward enters at the end of the model).

Rank r of p, with N = m v chunk-passes per direction:
  phase 1, warm-up:  w = min((p-r-1)*2 + (v-1)*p, N) chunk-forwards;
  phase 2, steady:   N - w rounds of (next forward, next full backward);
  phase 3, drain:    the remaining w full backwards.
The (v-1)*p term fills every chunk of the rank but the last before the first backward comes back;
the 2(p-r-1) term covers the round trip from rank r to the last rank and back. For v > 1 it needs m a
multiple of p, or a group would be cut short and the order above would not be Megatron's. Under
uniform stages with no comm the bubble is (p-1)(F + B + W)/v and rank 0 peaks at p + (p-1)/v stages'
activations (m >= 2p). With v = 1 this is exactly 1F1B (warm-up p-r-1), which is what Megatron runs
for one chunk.
"""

from __future__ import annotations

from typing import Callable

from ..core.ir import BW, Action, F, Schedule, build, interleaved
from . import one_f_one_b
from .spec import BubbleForm, MicrobatchRule, PassTimes, ScheduleSpec, no_comm


def _pass(kind: Callable[[int, int], Action], k: int, r: int, p: int, v: int) -> Action:
    """Rank r's k-th chunk-pass of one direction, in Megatron's order."""
    local = (k % (p * v)) // p
    if kind is BW:
        local = v - 1 - local  # the backward enters at the end of the model
    return kind(local * p + r, (k // (p * v)) * p + k % p)


def interleaved_1f1b(p: int, m: int, v: int) -> Schedule:
    """Interleaved 1F1B with v chunks per rank (looped placement); m must be a multiple of p."""
    SPEC.require(p, m, v)
    total = m * v
    ranks = []
    for r in range(p):
        # One chunk has no second lap to fill, so the round-trip term would only hold extra memory.
        warmup = min((p - r - 1) * 2 + (v - 1) * p if v > 1 else p - r - 1, total)
        order = [_pass(F, k, r, p, v) for k in range(warmup)]                 # phase 1: warm-up forwards
        for i in range(total - warmup):                                       # phase 2: one F, one backward
            order += [_pass(F, warmup + i, r, p, v), _pass(BW, i, r, p, v)]
        order += [_pass(BW, k, r, p, v) for k in range(total - warmup, total)]  # phase 3: drain
        ranks.append(order)
    return build("interleaved-1f1b", interleaved(p, v), m, ranks, chunks_per_rank=v)


def _microbatches(p: int, v: int) -> MicrobatchRule:
    if v == 1:
        return MicrobatchRule()
    return MicrobatchRule(p, p, "m a multiple of p", f"microbatches run in groups of p; with v={v} chunks per rank")


def _bubble(p: int, m: int, v: int, t: PassTimes, objective: str) -> BubbleForm:
    if v == 1:
        return one_f_one_b.bubble(p, m, v, t, objective)
    failed: list[str] = []
    no_comm(t, failed)
    return BubbleForm((p - 1) * (t.F + t.BW) / v, "(p-1)(F+BW)/v",
                      "identical stages split evenly over v chunks, comm 0; m a multiple of p", failed, p)


def _peak(p: int, m: int, v: int) -> float:
    """Rank 0, m a multiple of p: p + (p-1)/v stages' activations, capped at m."""
    if v == 1:
        return one_f_one_b.one_stage_peak(p, m, v)
    return min(p + (p - 1) / v, float(m))


SPEC = ScheduleSpec(
    "interleaved-1f1b", "Megatron's interleaved 1F1B with V chunks per rank (looped)", interleaved_1f1b, _bubble,
    peak_memory=_peak, placement="interleaved", takes_chunks=True, default_chunks=2, fused_backward=True,
    # Every one of the v p - 1 chunk boundaries a microbatch crosses is between two ranks.
    p2p_hops=lambda p, v: v * p - 1, microbatch_rule=_microbatches, one_chunk_twin="1f1b",
)
SPECS = (SPEC,)

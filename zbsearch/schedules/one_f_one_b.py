"""1F1B (PipeDream-Flush, Megatron's non-interleaved schedule), with the backward not split.

Rank r: warm-up of min(p-r-1, m) forwards; steady state of alternating (F, full backward) pairs; drain of
the remaining full backwards. At most p-r microbatches are in flight on rank r, so peak activation
memory is min(p, m) (on rank 0); the bubble is (p-1)(F + BW) under uniform stages and comm 0.
"""

from __future__ import annotations

from ..core.ir import BW, F, Schedule, build, linear
from .spec import BubbleForm, PassTimes, ScheduleSpec, no_comm


def one_f_one_b(p: int, m: int) -> Schedule:
    SPEC.require(p, m)
    ranks = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        order = [F(r, i) for i in range(warmup)]                 # phase 1: warm-up forwards
        for i in range(m - warmup):                              # phase 2: one F, one full backward
            order += [F(r, warmup + i), BW(r, i)]
        order += [BW(r, i) for i in range(m - warmup, m)]        # phase 3: drain
        ranks.append(order)
    return build("1f1b", linear(p), m, ranks)


def bubble(p: int, m: int, v: int, t: PassTimes, objective: str) -> BubbleForm:
    """(p-1)(F+BW): also interleaved 1F1B's with one chunk per rank, which is this schedule."""
    failed: list[str] = []
    no_comm(t, failed)
    return BubbleForm((p - 1) * (t.F + t.BW), "(p-1)(F+BW)", "identical stages, comm 0; any m", failed, 1)


def one_stage_peak(p: int, m: int, v: int) -> float:
    """p - r microbatches in flight on rank r, capped at m: also ZB-H1's and ZB-V's."""
    return float(min(p, m))


SPEC = ScheduleSpec(
    "1f1b", "PipeDream-Flush: warm-up forwards, then one forward / one full backward", one_f_one_b, bubble,
    peak_memory=one_stage_peak, fused_backward=True,
)
SPECS = (SPEC,)

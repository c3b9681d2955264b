"""GPipe: every rank runs all m forwards, then all m full backwards (in microbatch order).

Peak activation memory is m microbatches on every rank; the bubble is (p-1)(F + BW + 2c) per rank.
"""

from __future__ import annotations

from ..core.ir import BW, F, Schedule, build, linear
from .spec import BubbleForm, PassTimes, ScheduleSpec


def gpipe(p: int, m: int) -> Schedule:
    SPEC.require(p, m)
    ranks = [[F(r, i) for i in range(m)] + [BW(r, i) for i in range(m)] for r in range(p)]
    return build("gpipe", linear(p), m, ranks)


def _bubble(p: int, m: int, v: int, t: PassTimes, objective: str) -> BubbleForm:
    return BubbleForm((p - 1) * (t.F + t.BW + 2 * t.comm), "(p-1)(F+BW+2c)", "identical stages; any m", [], 1)


SPEC = ScheduleSpec(
    "gpipe", "all forwards, then all full backwards", gpipe, _bubble,
    peak_memory=lambda p, m, v: float(m), fused_backward=True,
)
SPECS = (SPEC,)

"""ZB-V (Zero Bubble paper, arXiv 2401.10241, section 6; torch's ScheduleZBVZeroBubble runs the same order).

V-shape placement: rank r holds chunk0 = r and chunk1 = 2p-1-r, so a microbatch goes down the ranks
through the chunk0s and back up through the chunk1s, and its loss is on rank 0. Backward is split: every
B (input gradient) runs right before its W except in the cool-down, where the W are held back to fill it.

Rank r, with n = max(m, 2p-1) microbatches per chunk:
1. 2(p-r)-1 chunk0 forwards;
2. r pairs (chunk1 F, chunk0 F);
3. p-r rounds (chunk1 F, B, W): the first backwards are coming back up the V;
4. steady state: (chunk0 F, B, W, chunk1 F, B, W) until every chunk0 F has run and chunk1 F caught up;
5. r rounds (chunk0 B, chunk1 B), their W held back;
6. p-r rounds (chunk0 B, one held-back chunk0 W);
7. the held-back W: all of chunk1's, then the rest of chunk0's.
Each rank holds at most 2p chunk-microbatches (each half a stage), so peak activation memory is p whole
stages, 1F1B's. Under uniform F = B = W and no communication the span bubble is exactly 0 once m >= 2p-1.

With m < 2p-1 the phases are laid out for 2p-1 microbatches and the missing ones are dropped, as torch
does: the order stays valid and simply has idle time.
"""

from __future__ import annotations

from ..core.ir import Action, B, F, Schedule, W, build, vshape
from .one_f_one_b import one_stage_peak
from .spec import BubbleForm, PassTimes, ScheduleSpec, close, no_comm, v_hops
from ..core.objective import Objective


def zb_v(p: int, m: int) -> Schedule:
    """ZB-V for p ranks (2p chunks) and any m >= 1 microbatches."""
    SPEC.require(p, m)
    n = max(m, 2 * p - 1)   # the phase counts below assume the pipeline can be filled
    ranks = []
    for r in range(p):
        c0, c1 = r, 2 * p - 1 - r
        order: list[Action] = []
        f0 = f1 = b0 = b1 = 0
        for _ in range(2 * (p - r) - 1):                       # 1: chunk0 forwards
            order.append(F(c0, f0))
            f0 += 1
        for _ in range(r):                                     # 2: (F1, F0) pairs
            order += [F(c1, f1), F(c0, f0)]
            f1 += 1
            f0 += 1
        for _ in range(p - r):                                 # 3: (F1, B1, W1)
            order += [F(c1, f1), B(c1, b1), W(c1, b1)]
            f1 += 1
            b1 += 1
        while f1 < f0 or f0 < n:                               # 4: steady state
            if f0 < n:
                order.append(F(c0, f0))
                f0 += 1
            order += [B(c0, b0), W(c0, b0), F(c1, f1), B(c1, b1), W(c1, b1)]
            f1 += 1
            b0 += 1
            b1 += 1
        w0, w1 = b0, b1
        for _ in range(r):                                     # 5: (B0, B1), W held back
            order += [B(c0, b0), B(c1, b1)]
            b0 += 1
            b1 += 1
        for _ in range(p - r):                                 # 6: (B0, W0)
            order += [B(c0, b0), W(c0, w0)]
            b0 += 1
            w0 += 1
        order += [W(c1, i) for i in range(w1, b1)]             # 7: held-back W
        order += [W(c0, i) for i in range(w0, b0)]
        ranks.append([a for a in order if a.microbatch < m])
    return build("zb-v", vshape(p), m, ranks)


def _bubble(p: int, m: int, v: int, t: PassTimes, objective: str) -> BubbleForm:
    failed: list[str] = []
    no_comm(t, failed)
    if not (close(t.F, t.B) and close(t.B, t.W)):
        failed.append("F, B, W not all equal")
    if m < 2 * p - 1:
        failed.append("m < 2p-1")
    cond = "identical stages, comm 0, m >= 2p-1, F = B = W"
    if Objective.parse(objective) is Objective.SPAN:
        return BubbleForm(0.0, "0", cond, failed, 2 * p - 1)
    return BubbleForm((p - 1) * t.F / 2, "(p-1)F/2", cond, failed, 2 * p - 1)


SPEC = ScheduleSpec(
    "zb-v", "Zero Bubble V: V-shape, 2 chunks per rank, 1F1B memory", zb_v, _bubble,
    peak_memory=one_stage_peak, placement="v", fixed_chunks=2, p2p_hops=v_hops,
)
SPECS = (SPEC,)

"""The Zero Bubble paper's handcrafted schedules ZB-H1 and ZB-H2 (Qi et al., ICLR 2024, arXiv 2401.10241).

Both keep 1F1B's linear placement and split the backward into B (gradient for inputs, torch's `I`) and
W (gradient for weights). B is on the critical path back to rank 0, W is not, so each rank holds some
of its W back and runs them where 1F1B would sit idle waiting for a B.

Rank r of p, with w warm-up forwards and h held-back W (both capped at m):
  phase 1, warm-up:  w forwards F0 .. F(w-1);
  phase 2, steady:   m - w rounds of (F, B), each followed by a W once h W have been held back;
  phase 3, cool-down: w rounds of B, each followed by a W once h have been held back;
  phase 4, tail:     the h held-back W.

ZB-H1: w = p-r-1, h = r. Rank r has at most p-r microbatches in flight, as in 1F1B, so peak activation
memory is p M_B (rank 0). Under uniform stages with comm 0, m >= p and W <= min(F, B), the bubble from
time 0 (makespan) is (p-1)(F + B - W): a third of 1F1B's when F = B = W.
ZB-H2: w = 2(p-r-1), h = 2r. Rank 0 has 2p-1 microbatches in flight (peak (2p-1) M_B when m >= 2p-1).
Measured per rank from its own first F (span), with comm 0, m >= 2p-1, W <= F and 2W <= F + B, the
bubble is (p-1)(F + B - 2W): zero when 2W = F + B. With comm c small next to the passes (the paper's
profiles) it is (p-1)(F + B + 2c - 2W).
For smaller m the warm-up and the held-back W are capped at m: the schedule stays valid, only the
closed forms no longer hold.
"""

from __future__ import annotations

from ..core.ir import Action, B, F, Schedule, W, build, linear
from .one_f_one_b import one_stage_peak
from .spec import BubbleForm, PassTimes, ScheduleSpec, exceeds, no_comm
from ..core.objective import Objective


def _split_backward_1f1b(r: int, m: int, warmup: int, held: int) -> list[Action]:
    """One rank's order: 1F1B with B/W split and W of microbatch i run right after B of i + held."""
    w, h = min(warmup, m), min(held, m)
    order = [F(r, i) for i in range(w)]                          # phase 1: warm-up forwards

    def backward(i: int) -> list[Action]:
        return [B(r, i)] + ([W(r, i - h)] if i >= h else [])

    for i in range(m - w):                                       # phase 2: F, B (, W)
        order += [F(r, w + i)] + backward(i)
    for i in range(m - w, m):                                    # phase 3: B (, W)
        order += backward(i)
    order += [W(r, i) for i in range(m - h, m)]                  # phase 4: held-back W
    return order


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1: 1F1B's warm-up (p-r-1 forwards) with rank r holding back its first r W to the end."""
    ZB_H1.require(p, m)
    ranks = [_split_backward_1f1b(r, m, p - r - 1, r) for r in range(p)]
    return build("zb-h1", linear(p), m, ranks)


def zb_h2(p: int, m: int) -> Schedule:
    """ZB-H2: 2(p-r-1) warm-up forwards (2p-1 in flight on rank 0) with rank r holding back 2r W."""
    ZB_H2.require(p, m)
    ranks = [_split_backward_1f1b(r, m, 2 * (p - r - 1), 2 * r) for r in range(p)]
    return build("zb-h2", linear(p), m, ranks)


def _h1_bubble(p: int, m: int, v: int, t: PassTimes, objective: str) -> BubbleForm:
    failed: list[str] = []
    no_comm(t, failed)
    if exceeds(t.W, t.F):
        failed.append("W > F")
    if exceeds(t.W, t.B):
        failed.append("W > B")
    if m < p:
        failed.append("m < p")
    return BubbleForm((p - 1) * (t.F + t.B - t.W), "(p-1)(F+B-W)", "identical stages, comm 0, m >= p, W <= min(F, B)",
                      failed, p)


def _h2_bubble(p: int, m: int, v: int, t: PassTimes, objective: str) -> BubbleForm:
    F, B, W, c = t.F, t.B, t.W, t.comm
    failed: list[str] = []
    if exceeds(W, F):
        failed.append("W > F")
    if exceeds(2 * W, F + B):
        failed.append("2W > F + B")
    if exceeds(2 * c, F + B):
        failed.append("2c > F + B")
    if m < 2 * p - 1:
        failed.append("m < 2p-1")
    cond = "identical stages, m >= 2p-1, W <= F, 2W <= F+B, 2c <= F+B"
    if Objective.parse(objective) is Objective.SPAN:
        return BubbleForm((p - 1) * (F + B + 2 * c - 2 * W), "(p-1)(F+B+2c-2W)", cond, failed, 2 * p - 1)
    return BubbleForm((p - 1) * max(F + c, F + B + 2 * c - 2 * W), "(p-1)max(F+c, F+B+2c-2W)", cond, failed,
                      2 * p - 1)


ZB_H1 = ScheduleSpec(
    "zb-h1", "Zero Bubble H1: 1F1B with B/W split, W deferred into the drain; 1F1B memory", zb_h1, _h1_bubble,
    peak_memory=one_stage_peak,
)
ZB_H2 = ScheduleSpec(
    "zb-h2", "Zero Bubble H2: extra warm-up forwards, W fills the drain; ~2p memory", zb_h2, _h2_bubble,
    peak_memory=lambda p, m, v: float(min(2 * p - 1, m)),
)
SPECS = (ZB_H1, ZB_H2)

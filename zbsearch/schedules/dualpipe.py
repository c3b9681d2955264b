"""DeepSeek's DualPipe (DeepSeek-V3 report, arXiv 2412.19437) and DualPipeV, its V-shape half.

Both give each rank two chunks and run every rank's list in the same eight phases, with counts in
closed form; only the placement and the meaning of "chunk 0" and "chunk 1" differ:
- DualPipeV (`ir.vshape(p)`): chunk 0 = stage r on the way down, chunk 1 = the mirrored stage 2p-1-r
  on the way back up; every microbatch takes the one route. P = p ranks, M = m microbatches, h = r.
- DualPipe (`ir.dualpipe(p)`, p even): two model copies fed from both ends. A rank's chunk 0 is the copy
  whose microbatches reach it first (copy 0 on ranks 0..p/2-1, copy 1 on ranks p/2..p-1), chunk 1 the
  other. Each direction is a pipeline of P = p/2 ranks carrying M = m/2 microbatches, and a rank's
  position in it is h = min(r, p-1-r).

The phases of one rank (F0/F1 = forward of chunk 0/1, B = backward, F&B = an overlapped pair):
1. 2(P-h-1) F0;
2. h+1 rounds (F0, F1);
3. P-h-1 rounds (B1, W, F1), the backward split so its W can follow at once;
4. M-2P+h+1 rounds (F0&B1, F1&B0): the overlapped main phase;
5. P-h-1 rounds (B1, F1&B0);
6. h+1 rounds (B1, B0), of which the last h+1 backwards are split;
7. P-h-1 rounds (W, split B0);
8. h+1 W.
Overlapped pairs and unsplit backwards are full backwards (Kind.FULL_B); a split backward (Kind.B)
queues its W, and the W steps pop that queue oldest first, as DeepSeek's WeightGradStore does. The
rank where the two directions meet (h = P-1) runs its first F0 and B1 apart rather than overlapped,
as DeepSeek does to shrink the bubble further.

Peak activation memory: p+1 stages for DualPipe, p+1/2 for DualPipeV. Idle time per rank on uniform
stages with no communication is DeepSeek's (P'/2 - 1)(F&B + B - 3W) exactly when F = B (input
backward) and W <= F, reading B in the formula as DeepSeek does, the FULL backward of a chunk, F&B as
F + full backward, and P' as the stages one direction flows through (p for DualPipe, 2p for DualPipeV).
"""

from __future__ import annotations

from collections import deque

from ..core.ir import BW, Action, B, F, Schedule, W, build, overlap, vshape
from ..core.ir import dualpipe as dualpipe_placement
from ..core.placement import even_ranks
from .spec import BubbleForm, MicrobatchRule, PassTimes, ScheduleSpec, close, exceeds, no_comm, v_hops


def _phases(P: int, M: int, h: int, chunks: tuple[int, int], first_mb: tuple[int, int]) -> list[Action]:
    """One rank's order: `chunks` are the global indices of its chunk 0 and chunk 1, `first_mb` the
    first microbatch index of each chunk's route (microbatches of a route are numbered consecutively)."""
    order: list[Action] = []
    pending_w: deque[Action] = deque()
    n_f = [0, 0]
    n_b = [0, 0]

    def fwd(c: int) -> Action:
        n_f[c] += 1
        return F(chunks[c], first_mb[c] + n_f[c] - 1)

    def bwd(c: int, split: bool = False) -> Action:
        n_b[c] += 1
        mb = first_mb[c] + n_b[c] - 1
        if not split:
            return BW(chunks[c], mb)
        pending_w.append(W(chunks[c], mb))
        return B(chunks[c], mb)

    def weight() -> Action:
        return pending_w.popleft()

    for _ in range(2 * (P - h - 1)):                          # 1: F0
        order.append(fwd(0))
    for _ in range(h + 1):                                    # 2: (F0, F1)
        order += [fwd(0), fwd(1)]
    for _ in range(P - h - 1):                                # 3: (B1, W, F1), split backward
        order.append(bwd(1, split=True))
        order += [weight(), fwd(1)]
    for i in range(M - 2 * P + h + 1):                        # 4: (F0&B1, F1&B0)
        if i == 0 and h == P - 1:
            order += [fwd(0), bwd(1)]
        else:
            order.append(overlap(fwd(0), bwd(1)))
        order.append(overlap(fwd(1), bwd(0)))
    for _ in range(P - h - 1):                                # 5: (B1, F1&B0)
        order.append(bwd(1))
        order.append(overlap(fwd(1), bwd(0)))
    for j in range(h + 1):                                    # 6: (B1, B0), the last h+1 split
        order.append(bwd(1, split=2 * j >= h + 1))
        order.append(bwd(0, split=2 * j + 1 >= h + 1))
    for _ in range(P - h - 1):                                # 7: (W, split B0)
        order.append(weight())
        order.append(bwd(0, split=True))
    for _ in range(h + 1):                                    # 8: W
        order.append(weight())
    if pending_w:
        raise AssertionError(f"DualPipe phases left {len(pending_w)} W unscheduled (P={P}, M={M}, h={h})")
    return order


def dualpipev(p: int, m: int) -> Schedule:
    """DualPipeV on the V-shape placement: p ranks, 2p chunks, m >= 2p microbatches."""
    DUALPIPEV.require(p, m)
    ranks = [_phases(p, m, r, (r, 2 * p - 1 - r), (0, 0)) for r in range(p)]
    return build("dualpipev", vshape(p), m, ranks)


def dualpipe(p: int, m: int) -> Schedule:
    """DualPipe on two model copies: p even ranks, m even microbatches with m >= 2p; the first m/2
    enter at rank 0, the other m/2 at rank p-1."""
    DUALPIPE.require(p, m)
    placement = dualpipe_placement(p)
    half = m // 2
    ranks = []
    for r in range(p):
        down, up = r, 2 * p - 1 - r   # this rank's chunk of copy 0 (enters at rank 0) and of copy 1
        if r < p // 2:
            chunks, first_mb = (down, up), (0, half)
        else:
            chunks, first_mb = (up, down), (half, 0)
        ranks.append(_phases(p // 2, half, min(r, p - 1 - r), chunks, first_mb))
    return build("dualpipe", placement, m, ranks)


def _failed(t: PassTimes) -> list[str]:
    failed: list[str] = []
    no_comm(t, failed)
    if not close(t.F, t.B):
        failed.append("F != B")
    if exceeds(t.W, t.F):
        failed.append("W > F")
    if t.full_backward is not None and not close(t.full_backward, t.B + t.W):
        failed.append("full_backward != B + W")
    if t.overlap_f_b is not None and not close(t.overlap_f_b, t.F + t.BW):
        failed.append("the profile gives an F&B overlap time (the formula gives pairs no credit)")
    return failed


_CONDITIONS = ("identical stages, comm 0, F = B, W <= F; F&B pairs cost F + full backward (no overlap "
               "credit); DeepSeek's (P/2-1)(F&B + B_full - 3W) with P the stages one direction crosses")


def _dualpipe_bubble(p: int, m: int, v: int, t: PassTimes, objective: str) -> BubbleForm:
    return BubbleForm((p / 2 - 1) * (t.F + 2 * t.B - t.W), "(p/2-1)(F+2B-W)",
                      _CONDITIONS + "; p even, m even, m >= 2p", _failed(t), 2 * p)


def _dualpipev_bubble(p: int, m: int, v: int, t: PassTimes, objective: str) -> BubbleForm:
    return BubbleForm((p - 1) * (t.F + 2 * t.B - t.W) / 2, "(p-1)(F+2B-W)/2", _CONDITIONS + "; m >= 2p",
                      _failed(t), 2 * p)


DUALPIPE = ScheduleSpec(
    "dualpipe", "DeepSeek DualPipe: two directions, overlapped F&B pairs; p even", dualpipe, _dualpipe_bubble,
    peak_memory=lambda p, m, v: p + 1.0, placement="dualpipe", fixed_chunks=2, param_copies=2,
    ranks_rule=even_ranks,
    microbatch_rule=lambda p, v: MicrobatchRule(2 * p, 2, "m even and m >= 2p",
                                                "m/2 microbatches per direction, at least p of them"),
)
DUALPIPEV = ScheduleSpec(
    "dualpipev", "DualPipeV: DualPipe cut in half on a V-shape placement", dualpipev, _dualpipev_bubble,
    peak_memory=lambda p, m, v: p + 0.5, placement="v", fixed_chunks=2, p2p_hops=v_hops,
    microbatch_rule=lambda p, v: MicrobatchRule(2 * p, 1, "m >= 2p", "every rank needs at least one main-phase round"),
)
SPECS = (DUALPIPE, DUALPIPEV)

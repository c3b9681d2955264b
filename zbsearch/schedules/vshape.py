"""V-Half and V-Min ("Pipeline Parallelism with Controllable Memory", Qi et al., arXiv 2405.15362).

Both use the V-shape placement (rank r holds chunk0 = r and chunk1 = 2p-1-r; loss on rank 0) and are
built from one building block: the four passes of microbatch 0 on every rank (F0, F1, then the
backward-for-inputs B1, B0, in the order a microbatch flows through the V) at fixed offsets on a grid
of slots, each slot one chunk pass. The block repeats every 6 slots, one microbatch per period; the
two slots per period the block leaves free on each rank hold W passes, oldest B first, and any W still
pending after a rank's last B runs at its end. Each rank's list is its passes in slot order.

A microbatch's activations live on a rank from its F to its W, so the offsets fix the memory: from a
rank's F0 to its B0 is about 4p slots for V-Min and 6p for V-Half, against 6 slots per microbatch, so
about 2p/3 (V-Min) and p (V-Half) chunk-microbatches of half a stage are alive on the busiest rank:
p/3 and p/2 whole stages, plus a constant. The offsets of rank r:
- V-Min:  F0 at r, F1 at 2p-1-r, B1 at 2p+g+r, B0 at 4p+g-1-r, with g = 2 when 3 divides p, else 0;
- V-Half: F0 at 2r, F1 at 3p-2-r, B1 at 3p+g-1+2r, B0 at 6p+g-2-r, with g = 3 when p is even, else 0.
g is the smallest gap that keeps a rank's four passes on distinct slots modulo 6, so the blocks of
consecutive microbatches never collide. Every pass sits at least one slot after its input.

The repeated block leaves the warm-up and cool-down sparse, so the grid is then squeezed, in the
spirit of the paper's squeezing step (its greedy reordering is not reproduced pass for pass): in slot order each pass moves to the earliest free slot after its inputs (and after the same
pass of the previous microbatch) provided no rank's activation level on the grid rises above the
unsqueezed peak. The level counts B and W as freeing half of the F's allocation each. Moving passes
only earlier in a grid that respects every dependency keeps the order executable.

Measured (uniform F = B = W, mem_W = mem_B / 2, m >= 2p): V-Half peaks at floor(p/2) + 1 whole stages,
V-Min at floor(2(p+3)/3) / 2 (about p/3 + 1); tests/schedules/test_vshape.py pins exact figures.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from ..core.ir import Action, B, F, Kind, Schedule, W, build, vshape
from .spec import BubbleForm, PassTimes, ScheduleSpec, v_hops

PERIOD = 6  # slots per microbatch on a rank: F0, F1, B1, B0 and two W
F0, F1, B1, B0 = range(4)  # the four block passes, in the order a microbatch meets them on the V

Offsets = Callable[[int, int], tuple[int, int, int, int]]
Slot = tuple[int, int, int]  # (rank, pass, microbatch)


def _v_min_offsets(p: int, r: int) -> tuple[int, int, int, int]:
    g = 2 if p % 3 == 0 else 0
    return r, 2 * p - 1 - r, 2 * p + g + r, 4 * p + g - 1 - r


def _v_half_offsets(p: int, r: int) -> tuple[int, int, int, int]:
    g = 3 if p % 2 == 0 else 0
    return 2 * r, 3 * p - 2 - r, 3 * p + g - 1 + 2 * r, 6 * p + g - 2 - r


def _inputs(p: int, r: int, kind: int, k: int) -> list[Slot]:
    """The passes that must come earlier on the grid: the previous pass of microbatch k on the V, and
    the same pass of microbatch k-1 on this rank (which keeps each pass kind in microbatch order)."""
    out: list[Slot] = []
    if kind == F0 and r > 0:
        out.append((r - 1, F0, k))
    elif kind == F1:
        out.append((r + 1, F1, k) if r < p - 1 else (r, F0, k))
    elif kind == B1:
        out.append((r - 1, B1, k) if r > 0 else (r, F1, k))
    elif kind == B0:
        out.append((r + 1, B0, k) if r < p - 1 else (r, B1, k))
    if k > 0:
        out.append((r, kind, k - 1))
    return out


def _step(kind: int | None, level: int, pending: int) -> tuple[int, int]:
    """Activation level and pending W after one slot: an F allocates 2, a B frees 1 and queues a W,
    a free slot runs a pending W, which frees the other 1."""
    if kind in (F0, F1):
        return level + 2, pending
    if kind in (B1, B0):
        return level - 1, pending + 1
    if pending:
        return level - 1, pending - 1
    return level, pending


class _RankGrid:
    """One rank's slots and the (level, pending W) before each, kept at or under a cap on the level.

    A move changes the levels only from the slot it moves to until the state after it matches the
    old one again, and every level outside that window already respects the cap, so a move is
    checked and committed by walking that window alone."""

    def __init__(self, occ: list[int | None]) -> None:
        self.occ = occ
        self.state = [(0, 0)] * (len(occ) + 1)
        for t, kind in enumerate(occ):
            self.state[t + 1] = _step(kind, *self.state[t])

    @property
    def peak(self) -> int:
        return max(level for level, _ in self.state)

    def try_move(self, src: int, dst: int, cap: int) -> bool:
        """Move the pass at slot src to the free slot dst < src unless some level would exceed cap."""
        kind = self.occ[src]
        level, pending = self.state[dst]
        window = []
        for t in range(dst, len(self.occ)):
            here = kind if t == dst else None if t == src else self.occ[t]
            level, pending = _step(here, level, pending)
            if level > cap:
                return False
            if t >= src and (level, pending) == self.state[t + 1]:
                break
            window.append((level, pending))
        self.state[dst + 1:dst + 1 + len(window)] = window
        self.occ[dst], self.occ[src] = kind, None
        return True


def _squeeze(p: int, times: dict[Slot, int], horizon: int) -> None:
    occ: list[list[int | None]] = [[None] * horizon for _ in range(p)]
    for (r, kind, _), t in times.items():
        occ[r][t] = kind
    grids = [_RankGrid(o) for o in occ]
    cap = max(grid.peak for grid in grids)
    for slot in sorted(times, key=lambda s: (times[s], s[0])):
        r, kind, k = slot
        grid, src = grids[r], times[slot]
        earliest = max((times[d] + 1 for d in _inputs(p, r, kind, k)), default=0)
        for dst in range(earliest, src):
            if grid.occ[dst] is None and grid.try_move(src, dst, cap):
                times[slot] = dst
                break


def _from_block(spec: ScheduleSpec, p: int, m: int, offsets: Offsets) -> Schedule:
    spec.require(p, m)
    times: dict[Slot, int] = {}
    for r in range(p):
        for kind, offset in enumerate(offsets(p, r)):
            for k in range(m):
                times[(r, kind, k)] = offset + PERIOD * k
    horizon = max(times.values()) + 2 * m + 1   # room for every pending W to drain
    _squeeze(p, times, horizon)

    ranks = []
    for r in range(p):
        chunk = (r, 2 * p - 1 - r, 2 * p - 1 - r, r)
        make = (F, F, B, B)
        slots: dict[int, Action] = {}
        for kind in range(4):
            for k in range(m):
                slots[times[(r, kind, k)]] = make[kind](chunk[kind], k)
        order: list[Action] = []
        pending_w: deque[Action] = deque()
        for t in range(max(slots) + 1):
            action = slots.get(t)
            if action is None:
                if pending_w:
                    order.append(pending_w.popleft())
                continue
            order.append(action)
            if action.kind is Kind.B:
                pending_w.append(W(action.chunk, action.microbatch))
        order += pending_w
        ranks.append(order)
    return build(spec.name, vshape(p), m, ranks)


def v_half(p: int, m: int) -> Schedule:
    """V-Half: about half of 1F1B's peak activation memory; any p, m >= 1."""
    return _from_block(V_HALF, p, m, _v_half_offsets)


def v_min(p: int, m: int) -> Schedule:
    """V-Min: about a third of 1F1B's peak activation memory; any p, m >= 1."""
    return _from_block(V_MIN, p, m, _v_min_offsets)


def _v_half_bubble(p: int, m: int, v: int, t: PassTimes, objective: str) -> BubbleForm:
    return BubbleForm((p - 1) * (t.F + t.B + t.W) / 2, "~(p-1)(F+B+W)/2",
                      "approximation: about half of 1F1B's bubble (arXiv 2405.15362); not exact for any times",
                      [], 2 * p, approximate=True)


def _v_min_bubble(p: int, m: int, v: int, t: PassTimes, objective: str) -> BubbleForm:
    return BubbleForm(2 * (p - 1) * (t.F + t.B + t.W) / 3, "~2(p-1)(F+B+W)/3",
                      "approximation: about two thirds of 1F1B's bubble (arXiv 2405.15362); not exact for any times",
                      [], 2 * p, approximate=True)


# Peak memory measured at M_W = M_B/2 and m >= 2p (see the module docstring), not a closed form.
V_HALF = ScheduleSpec(
    "v-half", "V-Half: V-shape with about half of 1F1B's activation memory", v_half, _v_half_bubble,
    peak_memory=lambda p, m, v: min(p // 2 + 1.0, float(m)), peak_memory_exact=False, placement="v",
    fixed_chunks=2, p2p_hops=v_hops,
)
V_MIN = ScheduleSpec(
    "v-min", "V-Min: V-shape with about a third of 1F1B's activation memory", v_min, _v_min_bubble,
    peak_memory=lambda p, m, v: min((2 * (p + 3) // 3) / 2, float(m)), peak_memory_exact=False, placement="v",
    fixed_chunks=2, p2p_hops=v_hops,
)
SPECS = (V_HALF, V_MIN)

"""The record each handcrafted schedule keeps in its own module: what it is, which p and m it accepts,
and the closed forms the planner reads (bubble, peak activation memory, P2P hops, parameter copies).

Notation as in zbsearch.plan.closed_forms: p ranks, m microbatches, v chunks per rank; F, B, W one
whole stage's forward, backward-for-inputs and backward-for-weights time per microbatch; BW the fused
backward; c the hop time between adjacent ranks. Memory in whole-stage activations M_B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ..core.errors import PreconditionError
from ..core.ir import Schedule
from ..core.profile import Profile


def close(a: float, b: float) -> bool:
    """Equal up to rounding (the closed forms compare times, which are floats)."""
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def exceeds(a: float, b: float) -> bool:
    """a > b by more than rounding: a condition like W <= F fails."""
    return a > b and not close(a, b)


@dataclass(frozen=True)
class PassTimes:
    """One stage's per-microbatch times, the same on every stage (what the closed forms assume)."""

    F: float = 1.0
    B: float = 1.0
    W: float = 1.0
    comm: float = 0.0
    full_backward: float | None = None
    overlap_f_b: float | None = None     # an overlapped F&B pair's time (DualPipe's pairs), when given

    @property
    def BW(self) -> float:
        """The fused backward: the profile's figure, else B + W."""
        return self.full_backward if self.full_backward is not None else self.B + self.W

    @classmethod
    def of(cls, profile: Profile) -> "PassTimes | None":
        """The profile's times when its stages are identical (times, memory and static bytes), its links
        all equal, it gives no per-chunk costs and no action overhead, and plans use the paper's memory
        accounting; None otherwise (only the simulator applies then)."""
        first = profile.stages[0]
        if profile.chunks is not None or any(s != first for s in profile.stages):
            return None
        if profile.action_overhead or profile.memory_model != "paper":  # the closed forms leave these out
            return None
        if any(not close(c, profile.comm[0]) for c in profile.comm):
            return None
        comm = profile.comm[0] if profile.comm else 0.0
        return cls(first.F, first.B, first.W, comm, first.full_backward, first.overlap_f_b)


@dataclass(frozen=True)
class BubbleForm:
    """A closed-form bubble (idle time per rank) and the conditions under which it is exact."""

    bubble: float
    formula: str
    conditions: str
    failed: list[str]          # conditions that do not hold, in words
    exact_from_m: int          # the m-condition: exact for every accepted m >= this
    approximate: bool = False  # the formula is an approximation even when `failed` is empty


def no_comm(times: PassTimes, failed: list[str]) -> None:
    """Note a failed condition when the formula leaves out a communication time that is not zero."""
    if not close(times.comm, 0.0):
        failed.append("comm c > 0 (the formula leaves communication out)")


@dataclass(frozen=True)
class MicrobatchRule:
    """Which m a schedule accepts: m >= lowest and a multiple of step; `need` says so in words and
    `why` gives the reason (the generator's error adds it; the planner prints `need` alone)."""

    lowest: int = 1
    step: int = 1
    need: str = "m >= 1"
    why: str = ""

    def accepts(self, m: int) -> bool:
        return m >= self.lowest and m % self.step == 0


BubbleFn = Callable[[int, int, int, PassTimes, str], BubbleForm]   # (p, m, v, times, objective)
PeakFn = Callable[[int, int, int], float]                          # (p, m, v) -> M_B, busiest rank
HopsFn = Callable[[int, int], int]                                 # (p, v) -> rank-to-rank hops
RanksFn = Callable[[int], str | None]                              # p -> what it needs, or None
MicrobatchFn = Callable[[int, int], MicrobatchRule]                # (p, v) -> the rule on m


def linear_hops(p: int, v: int) -> int:
    """A microbatch crosses every boundary between p stages once (linear, and each copy of DualPipe)."""
    return p - 1


def v_hops(p: int, v: int) -> int:
    """V-shape: 2p - 1 chunk boundaries, of which the turn at rank p-1 stays on the rank."""
    return 2 * (p - 1)


def any_ranks(p: int) -> str | None:
    return None


def any_m(p: int, v: int) -> MicrobatchRule:
    return MicrobatchRule()


@dataclass(frozen=True)
class ScheduleSpec:
    """Everything zbsearch knows about one handcrafted schedule, in one place.

    The generator, the planner's closed forms, the heuristics (by placement) and `zbsearch list` all
    read this record; a schedule's module defines its own and the registry collects them.
    """

    name: str
    summary: str
    generator: Callable[..., Schedule]   # (p, m) or, when takes_chunks, (p, m, v)
    bubble: BubbleFn
    peak_memory: PeakFn
    peak_memory_exact: bool = True       # False: measured at M_W = M_B/2, not a closed form
    # Name of the placement its schedules use (Placement.name), so a search on one placement can
    # skip the others without generating them; interleaved-1f1b with one chunk is linear.
    placement: str = "linear"
    takes_chunks: bool = False           # the user chooses v, the chunks per rank
    default_chunks: int | None = None
    fixed_chunks: int = 1                # chunks per rank when the user cannot choose
    fused_backward: bool = False         # runs B and W as one full backward
    p2p_hops: HopsFn = linear_hops
    param_copies: int = 1                # model replicas a rank holds
    ranks_rule: RanksFn = any_ranks
    microbatch_rule: MicrobatchFn = any_m
    one_chunk_twin: str | None = None    # the schedule it becomes with one chunk per rank

    def chunks_per_rank(self, v: int = 1) -> int:
        return v if self.takes_chunks else self.fixed_chunks

    def work(self, times: PassTimes) -> float:
        """One rank's work per microbatch under this schedule."""
        return times.F + (times.BW if self.fused_backward else times.B + times.W)

    def p2p_relative(self, p: int, v: int = 1) -> float:
        """Cross-rank messages per iteration relative to 1F1B's 2m(p-1) at the same m."""
        return self.p2p_hops(p, v) / (p - 1) if p >= 2 else 1.0

    def problem(self, p: int, m: int, v: int = 1) -> str | None:
        """What the schedule needs that (p, m) lacks, in the planner's words, or None."""
        need = self.ranks_rule(p)
        if need:
            return need
        rule = self.microbatch_rule(p, v)
        return None if rule.accepts(m) else rule.need

    def require(self, p: int, m: int, v: int = 1) -> None:
        """Raise a PreconditionError saying what the schedule needs, e.g. 'm >= 2p', and why."""
        need: str | None = None
        if not (p >= 1 and m >= 1):
            need = "p >= 1 and m >= 1"
        elif self.takes_chunks and not (isinstance(v, int) and v >= 1):
            need = f"v >= 1 chunks per rank (got v={v!r})"
        else:
            need = self.ranks_rule(p)
            rule = self.microbatch_rule(p, v)
            if need is None and not rule.accepts(m):
                need = f"{rule.need} ({rule.why})" if rule.why else rule.need
        if need:
            raise PreconditionError(f"{self.name} needs {need}; got p={p}, m={m}")

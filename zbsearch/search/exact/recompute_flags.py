"""Recompute chosen per microbatch by CP-SAT, inside a window of the large-neighbourhood search
(exact/lns.py).

On a chunk with recomputed layers a microbatch either recomputes (the chunk's cost) or keeps its
activations (StageCost.without_recompute). The choice changes two things only: how long its B (or W,
where the option pays in W) runs, and the blocks of memory its F opens (what it holds from F until B,
from B until W, and after W). Both are affine in one Boolean per (chunk, microbatch), which CP-SAT's
interval sizes and cumulative demands accept as they are. The Boolean exists where the microbatch's F,
B and W all lie in the window: then every block the choice changes opens and (but for what the loss chunk
keeps after W) closes inside it, so the level after the window is as it was, as the window model assumes;
the spliced schedule is validated in full anyway. A microbatch outside keeps the choice it has.

The model is not a relaxation over every choice (add_symmetry_breaking's relabelling does not carry a
per-microbatch choice), so no bound is read from it; its schedules are re-timed and validated like every
other window's.
"""

from __future__ import annotations

from typing import Iterable

from ortools.sat.python import cp_model

from ...core.ir import Action, Kind
from ...core.stage_cost import StageCost
from ...core.plan_record import Choice
from ..problem import Problem
from .cpsat import memory_blocks

Flags = dict[tuple[int, int], cp_model.IntVar]  # per (chunk, microbatch): recomputes (1) or keeps (0)


def add_flags(model: cp_model.CpModel, grid: Problem, inside: Iterable[Action]) -> Flags:
    """A Boolean per (chunk, microbatch) with recomputed layers whose F, B and W are all in `inside`."""
    freed = set(inside)
    return {(a.chunk, a.microbatch): model.new_bool_var(f"recompute_c{a.chunk}_mb{a.microbatch}")
            for a in sorted(freed, key=lambda x: (x.chunk, x.microbatch))
            if a.kind is Kind.F and grid.chunk_costs[a.chunk].without_recompute is not None
            and Action(a.chunk, Kind.B, a.microbatch) in freed and Action(a.chunk, Kind.W, a.microbatch) in freed}


def _time(cost: StageCost, kind: Kind) -> int:
    return int({Kind.F: cost.F, Kind.B: cost.B, Kind.W: cost.W}[kind])


def durations_of(grid: Problem, a: Action) -> tuple[int, int]:
    """The pass's grid duration when its microbatch keeps its activations, and when it recomputes."""
    cost = grid.chunk_costs[a.chunk]
    assert cost.without_recompute is not None
    return _time(cost.without_recompute, a.kind), _time(cost, a.kind)


def most_extra(grid: Problem) -> int:
    """The most a choice can lengthen one pass (the window's horizon leaves room for it)."""
    return max((max(0, _time(c, k) - _time(c.without_recompute, k)) for c in grid.chunk_costs
                if c.without_recompute is not None for k in (Kind.B, Kind.W)), default=0)


def add_chosen_interval(model: cp_model.CpModel, grid: Problem, a: Action, start: cp_model.IntVar,
                        flag: cp_model.IntVar, horizon: int) -> tuple[cp_model.IntVar, cp_model.IntervalVar]:
    """The pass's end and interval, its size the kept or the recomputing duration as `flag` says."""
    keep, recompute = durations_of(grid, a)
    end = model.new_int_var(0, horizon + max(keep, recompute), f"end_{a}")
    interval = model.new_interval_var(start, keep + (recompute - keep) * flag, end, f"run_{a}")
    return end, interval


def chosen_blocks(grid: Problem, f: Action, scale: float, flag: cp_model.IntVar | None
                  ) -> list[tuple[str, int | cp_model.LinearExpr, Action, Action | None]]:
    """memory_blocks of the microbatch `f` opens, with each demand affine in `flag` (its kept
    demand where it keeps, its recomputing one where it recomputes); blocks empty either way left out.
    Without a flag, the blocks of its current choice."""
    if flag is None:
        return [b for b in memory_blocks(grid.cost_of(f.chunk, f.microbatch), f, scale) if b[1] > 0]
    cost = grid.chunk_costs[f.chunk]
    assert cost.without_recompute is not None
    keep, recompute = memory_blocks(cost.without_recompute, f, scale), memory_blocks(cost, f, scale)
    return [(name, k + (r - k) * flag, src, until)
            for (name, k, src, until), (_, r, _, _) in zip(keep, recompute) if k > 0 or r > 0]


def hint_flags(model: cp_model.CpModel, grid: Problem, flags: Flags) -> None:
    for (c, i), flag in flags.items():
        model.add_hint(flag, grid.recomputes(c, i))


def changed(grid: Problem, flags: Flags, solver: cp_model.CpSolver) -> bool:
    """Whether the solved flags differ from the problem's current choice."""
    return any(bool(solver.value(flag)) != grid.recomputes(c, i) for (c, i), flag in flags.items())


def read_choice(grid: Problem, flags: Flags, solver: cp_model.CpSolver) -> Choice:
    """The problem's choice with the window's flags as solved."""
    return grid.choice_where(lambda c, i: bool(solver.value(flags[(c, i)])) if (c, i) in flags
                             else grid.recomputes(c, i))

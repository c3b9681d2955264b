"""The validator: is a schedule complete, executable (deadlock-free) and within a memory limit?

It builds the dependency graph with networkx (one node per action; an edge for every data dependency
and for each rank's program order) and checks, in this order:
1. structure: each action's chunk lives on the rank that runs it, microbatches are in range, and each
   chunk is on its microbatch's route;
2. completeness: every (chunk, microbatch) on a route has exactly one F and either one B and one W or
   one full backward;
3. acyclicity: a cycle in the graph is a deadlock (or an order that runs a pass before its input);
   the message names the actions on the cycle;
4. memory: with a profile and a limit, no rank's activation memory exceeds its limit; the message
   names the rank, the time and the action where it first does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import networkx as nx

from ..core.errors import ScheduleError
from ..core.ir import Action, Kind, Schedule
from ..core.memory import MemoryLimit
from ..core.profile import Profile
from .simulate import Timeline, dependencies, pass_key, simulate

# Relative slack for float round-off when comparing memory to a limit: a schedule that sits exactly on
# its limit is within it.
MEMORY_RTOL = 1e-9
MAX_LISTED = 5


@dataclass
class ValidationReport:
    """What the validator found. `ok` is True when `problems` is empty."""

    problems: list[str] = field(default_factory=list)
    timeline: Timeline | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_invalid(self, name: str) -> None:
        if self.problems:
            more = len(self.problems) - MAX_LISTED
            listed = "; ".join(self.problems[:MAX_LISTED]) + (f"; and {more} more" if more > 0 else "")
            raise ScheduleError(f"schedule {name!r} is invalid: {listed}")


def _where(rank: int, index: int, action: Action) -> str:
    return f"{action} (rank {rank}, step {index})"


def check_structure(schedule: Schedule) -> list[str]:
    """Problems with placement, ranges and completeness; empty when the schedule is well formed."""
    placement, m = schedule.placement, schedule.num_microbatches
    problems: list[str] = []
    if len(schedule.ranks) != placement.num_ranks:
        return [f"it lists {len(schedule.ranks)} ranks but its placement has {placement.num_ranks}"]
    seen: Counter[tuple[int, str, int]] = Counter()
    for r, rank in enumerate(schedule.ranks):
        for idx, action in enumerate(rank):
            for a in action.passes():
                if not 0 <= a.chunk < placement.num_chunks:
                    problems.append(f"{_where(r, idx, action)} names chunk {a.chunk}; chunks are 0..{placement.num_chunks - 1}")
                    continue
                if not 0 <= a.microbatch < m:
                    problems.append(f"{_where(r, idx, action)} names microbatch {a.microbatch}; microbatches are 0..{m - 1}")
                    continue
                if placement.chunk_to_rank[a.chunk] != r:
                    problems.append(f"{_where(r, idx, action)} runs chunk {a.chunk}, which lives on rank {placement.chunk_to_rank[a.chunk]}")
                    continue
                if a.chunk not in placement.route(a.microbatch, m):
                    problems.append(f"{_where(r, idx, action)}: microbatch {a.microbatch} never visits chunk {a.chunk}")
                    continue
                seen[(a.chunk, a.kind.value, a.microbatch)] += 1
    if problems:
        return problems
    for i in range(m):
        for c in placement.route(i, m):
            nF, nB, nW, nBW = (seen[(c, k.value, i)] for k in (Kind.F, Kind.B, Kind.W, Kind.FULL_B))
            label = f"chunk {c} microbatch {i}"
            if nF != 1:
                problems.append(f"{label} has {nF} forwards (F); it needs exactly 1")
            if nBW == 1 and nB == 0 and nW == 0:
                continue
            if nBW > 0:
                problems.append(f"{label} has {nBW} full backwards (B) and {nB} I, {nW} W; use one full backward or one I plus one W")
            elif nB != 1 or nW != 1:
                problems.append(f"{label} has {nB} input backwards (I) and {nW} weight backwards (W); it needs exactly 1 of each")
    return problems


def dependency_graph(schedule: Schedule, profile: Profile | None = None) -> nx.DiGraph:
    """Nodes are (rank, step); node attribute `action`. Edges: program order on each rank (kind
    'order') and data dependencies (kind 'data', weight = hop time). Assumes check_structure passed."""
    g = nx.DiGraph()
    owner: dict[tuple[int, str, int], tuple[int, int]] = {}
    for r, rank in enumerate(schedule.ranks):
        for idx, action in enumerate(rank):
            g.add_node((r, idx), action=action)
            if idx:
                g.add_edge((r, idx - 1), (r, idx), kind="order", weight=0.0)
            for a in action.passes():
                owner[pass_key(a)] = (r, idx)
    for r, rank in enumerate(schedule.ranks):
        for idx, action in enumerate(rank):
            for a in action.passes():
                for key, hop in dependencies(schedule, profile, a):
                    # A self-loop here is an overlap pair whose backward needs its own forward: the
                    # pair can never start, and find_cycle reports it.
                    g.add_edge(owner[key], (r, idx), kind="data", weight=hop)
    return g


def _cycle_message(g: nx.DiGraph, cycle: list[tuple]) -> str:
    nodes = [u for u, _, *_ in cycle]
    names = [_where(n[0], n[1], g.nodes[n]["action"]) for n in nodes]
    if len(nodes) == 1:
        return (f"{names[0]} pairs a backward with the forward it needs, so the pair can never start "
                "(pair passes of different microbatches, or run the two apart)")
    if len({n[0] for n in nodes}) == 1:
        return (f"rank {nodes[0][0]} runs a pass before its own input: " + " -> ".join(names[:8])
                + " (reorder that rank's list)")
    shown = " -> ".join(names[:8]) + (" -> ..." if len(names) > 8 else "")
    return f"deadlock: these actions wait on each other in a cycle: {shown}"


def check(schedule: Schedule, profile: Profile | None = None, limit: MemoryLimit | None = None) -> ValidationReport:
    """Run every check; never raises for an invalid schedule (see ValidationReport.problems)."""
    report = ValidationReport(check_structure(schedule))
    if profile is not None and profile.num_stages != schedule.num_ranks:
        report.problems.append(
            f"it has {schedule.num_ranks} ranks but profile {profile.name!r} has {profile.num_stages} stages: "
            "use a profile with one stage per rank"
        )
    if not report.ok:
        return report
    g = dependency_graph(schedule, profile)
    try:
        cycle = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle:
        report.problems.append(_cycle_message(g, cycle))
        return report
    if profile is None:
        return report
    report.timeline = simulate(schedule, profile)
    if limit is not None:
        report.problems.extend(memory_problems(report.timeline, limit))
    return report


def over_limit(level: float, cap: float) -> bool:
    """Whether a memory level exceeds a rank's limit, beyond float round-off."""
    return level > cap * (1 + MEMORY_RTOL) + 1e-12


def memory_problems(timeline: Timeline, limit: MemoryLimit) -> list[str]:
    """One message per rank whose activation memory exceeds its limit, at the first point it does."""
    out = []
    profile = timeline.profile
    for r, curve in enumerate(timeline.memory):
        cap = limit.per_rank[r]
        for t, level, action in curve:
            if over_limit(level, cap):
                unit = profile.stage_mem_B(r)
                out.append(
                    f"rank {r} holds {level / unit:.4g} x its stage M_B at time {t:g} after {action}, over the "
                    f"limit {limit.text} = {cap / unit:.4g} x M_B (peak {timeline.peak_memory(r) / unit:.4g}): "
                    "raise the limit or pick a schedule that holds fewer microbatches"
                )
                break
    return out


def validate(schedule: Schedule, profile: Profile | None = None, limit: MemoryLimit | None = None) -> Timeline | None:
    """Raise ScheduleError (one line, naming the problems) unless the schedule passes every check;
    return the simulated timeline when a profile is given."""
    report = check(schedule, profile, limit)
    report.raise_if_invalid(schedule.name)
    return report.timeline

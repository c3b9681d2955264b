"""What the HTML report (html.py) draws, as plain JSON-ready data: one box per pass with what it waited
for, the critical path, and each rank's memory over time.

Computed here in Python rather than in the page's script so that tests can check it against the
Timeline (one box per pass, the critical path ends at the makespan, the memory peaks are the Timeline's)
and the script only draws.

What a pass waited for follows the simulator's rule (sim/simulate.py): a pass starts when its rank is
free and its last input has arrived, so its start is bound either by the previous pass on its rank or by
the input that arrived last (its producer's end plus the hop). The critical path walks back from the
pass that ends last through whichever of those two bound each start, to a pass that started at time 0.
"""

from __future__ import annotations

import math
from typing import Any

from ..core.ir import Action, Kind
from ..core.memory import MemoryLimit
from ..sim.simulate import PassCosts, Slot, Timeline, chunk_costs, dependencies, pass_key

# A memory level this close to the peak (float noise) reaches it.
_EPS = 1e-9
KIND_CODES = {Kind.F: "F", Kind.B: "B", Kind.W: "W", Kind.FULL_B: "BW", Kind.OVERLAP: "FB"}


def _num(x: float) -> float:
    """Times and sizes to 6 significant digits: the page never shows more, and the file stays small."""
    return float(f"{x:.6g}")


def _ids(timeline: Timeline) -> tuple[list[Slot], dict[tuple[int, str, int], int]]:
    """Every slot in rank order with a box id (its index), and the box of each pass key."""
    slots = list(timeline.iter_slots())
    owner = {pass_key(a): k for k, slot in enumerate(slots) for a in slot.action.passes()}
    return slots, owner


def _inputs(timeline: Timeline, slot: Slot, owner: dict[tuple[int, str, int], int],
            slots: list[Slot]) -> list[tuple[int, float]]:
    """(producing box, arrival time) of every data input of the slot's passes."""
    out = []
    for a in slot.action.passes():
        for key, hop in dependencies(timeline.schedule, timeline.profile, a):
            producer = owner[key]
            out.append((producer, slots[producer].end + hop))
    return out


def waits(timeline: Timeline) -> list[tuple[int, str]]:
    """Per box (rank order): (the box its start waited for, why), why being `rank` (its rank's previous
    pass was still running), `input` (its last input arrived then) or `start` (nothing: it started at 0,
    box -1)."""
    slots, owner = _ids(timeline)
    out: list[tuple[int, str]] = []
    for k, slot in enumerate(slots):
        arrivals = _inputs(timeline, slot, owner, slots)
        # Its start is the later of these two (the simulator's rule); on a tie the data input is named.
        bounds = [(t, producer, "input") for producer, t in arrivals]
        if slot.index > 0:
            bounds.append((slots[k - 1].end, k - 1, "rank"))
        latest = max(bounds, key=lambda b: b[0], default=None)
        out.append((-1, "start") if latest is None else (latest[1], latest[2]))
    return out


def critical_path(timeline: Timeline, bound_by: list[tuple[int, str]] | None = None) -> list[int]:
    """The boxes (rank order ids) on the chain that sets the makespan, first to last."""
    slots = list(timeline.iter_slots())
    if not slots:
        return []
    bound_by = waits(timeline) if bound_by is None else bound_by
    k = max(range(len(slots)), key=lambda i: slots[i].end)
    path = [k]
    while bound_by[k][0] >= 0:
        k = bound_by[k][0]
        path.append(k)
    return path[::-1]


def _recomputes(timeline: Timeline, costs: PassCosts, action: Action) -> bool:
    """Whether a backward re-runs its chunk's recomputed layers for this microbatch (the plan's levels
    and its per-microbatch choice): where the recompute time is spent."""
    return any(a.kind in (Kind.B, Kind.FULL_B) and costs[a.chunk].without_recompute is not None
               and timeline.schedule.plan.recomputes(a.chunk, a.microbatch) for a in action.passes())


def _label(action: Action) -> tuple[str, str, str]:
    """(kind label, chunk text, microbatch text): a pair names both halves, forward first."""
    if action.kind is Kind.OVERLAP:
        f, b = action.pair
        return f"F&{b.kind.label}", f"{f.chunk}&{b.chunk}", f"{f.microbatch}&{b.microbatch}"
    return action.kind.label, str(action.chunk), str(action.microbatch)


def boxes(timeline: Timeline) -> list[list[Any]]:
    """One box per pass, in rank order: [rank, start, end, kind code, kind label, chunk, microbatch,
    recompute 0/1, waited-for box, why, inputs as [[box, arrival], ...], on the critical path 0/1]."""
    slots, owner = _ids(timeline)
    bound_by = waits(timeline)
    critical = set(critical_path(timeline, bound_by))
    costs = chunk_costs(timeline.schedule, timeline.profile)
    out = []
    for k, slot in enumerate(slots):
        kind, chunk, mb = _label(slot.action)
        ins = [[p, _num(t)] for p, t in _inputs(timeline, slot, owner, slots)]
        out.append([slot.rank, _num(slot.start), _num(slot.end), KIND_CODES[slot.action.kind], kind, chunk, mb,
                    int(_recomputes(timeline, costs, slot.action)), bound_by[k][0], bound_by[k][1], ins,
                    int(k in critical)])
    return out


def memory_scale(timeline: Timeline) -> tuple[float, str]:
    """(divisor, unit) memory is shown in: GiB on a bytes profile, else multiples of the rank's stage M_B
    (the unit of a `2p` limit) shown per rank, divisor 1 here."""
    return (2.0**30, "GiB") if timeline.profile.memory_unit == "bytes" else (1.0, "stage M_B")


def memory(timeline: Timeline, limit: MemoryLimit | None) -> list[dict[str, Any]]:
    """Per rank: the activation curve as [time, level] steps from 0, the activation cap (None: none),
    the peak and when it is first reached, and the static bytes held; all in memory_scale's unit."""
    prof, pl = timeline.profile, timeline.schedule.placement
    divisor, unit = memory_scale(timeline)
    static = prof.static_bytes_per_rank(pl)
    out = []
    for r in range(timeline.num_ranks):
        scale = divisor if unit == "GiB" else prof.stage_mem_B(r)
        points = [[0.0, 0.0]] + [[_num(t), _num(level / scale)] for t, level, _ in timeline.memory[r]]
        peak = timeline.peak_memory(r)
        at = next((t for t, level, _ in timeline.memory[r] if level >= peak - _EPS * max(1.0, abs(peak))), 0.0)
        cap = None if limit is None or math.isinf(limit.per_rank[r]) else _num(limit.per_rank[r] / scale)
        out.append({"rank": r, "points": points, "cap": cap, "peak": _num(peak / scale), "peak_at": _num(at),
                    "static": None if static is None or unit != "GiB" else _num(static[r] / divisor)})
    return out


def page_data(timeline: Timeline, limit: MemoryLimit | None) -> dict[str, Any]:
    """Everything the page's script draws: the plan's shape, its boxes and its memory."""
    schedule, prof = timeline.schedule, timeline.profile
    pl = schedule.placement
    _, unit = memory_scale(timeline)
    return {
        "name": schedule.name, "placement": pl.name, "ranks": timeline.num_ranks, "chunks": pl.num_chunks,
        "microbatches": schedule.num_microbatches, "time_unit": prof.time_unit, "memory_unit": unit,
        "makespan": _num(timeline.makespan), "chunk_rank": list(pl.chunk_to_rank),
        "local_chunk": [pl.chunks_on(pl.chunk_to_rank[c]).index(c) for c in range(pl.num_chunks)],
        "limit": None if limit is None else limit.text, "includes_static": bool(limit and limit.includes_static),
        "boxes": boxes(timeline), "memory": memory(timeline, limit),
    }

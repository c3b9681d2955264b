"""Read torch.distributed.pipelining schedules into zbsearch: its CSV files and its built-in orders.

A torch CSV has one row per rank and one action per cell. Compute cells (`0F1`, `1I0`, `2W3`, `3B0`,
`(0F3;3B1)OVERLAP_F_B`) become our actions unchanged (ir.py uses torch's strings); communication and
bookkeeping cells (SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD, REDUCE_GRAD) and empty cells are
dropped, so ours, torchtitan's and torch's lowered dumps all import. The placement is inferred the way
torch infers it: a stage lives on the rank whose row mentions it. Names it recognises (linear,
interleaved, v) are the same Placement objects our generators build; any other mapping is "custom".

Nothing here imports torch except `torch_schedules` and `torch_builtin`, and only when called.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable, Sequence

from ...core.errors import DependencyError, ScheduleError
from ...core.fileio import read_text
from ...core.ir import Action, Placement, Schedule, interleaved, linear, vshape

INSTALL_HINT = "pip install 'zbsearch[torch]' (torch==2.13.0; the CPU wheel is enough)"
# Cells the lowering adds; they carry no compute and are dropped on import.
_COMM_RE = re.compile(r"^\s*\d+\s*(SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD)\s*\d*\s*$", re.ASCII)
# torch's built-in schedules that run one stage per rank (PipelineScheduleSingle subclasses).
_SINGLE_STAGE = {"gpipe", "1f1b"}


def torch_schedules(what: str) -> ModuleType:
    """torch.distributed.pipelining.schedules, or a one-line DependencyError saying how to install it."""
    try:
        import torch.distributed.pipelining.schedules as schedules
    except ImportError:
        raise DependencyError(f"{what} needs torch, which is not installed: {INSTALL_HINT}") from None
    return schedules


def infer_placement(chunk_to_rank: Sequence[int], num_ranks: int) -> Placement:
    """The placement holding chunk c on rank chunk_to_rank[c], with the one route 0..N-1 torch uses.

    Returns linear(p), interleaved(p, v) or vshape(p) when the mapping is one of those, else a
    Placement named "custom".
    """
    mapping = tuple(chunk_to_rank)
    n, p = len(mapping), num_ranks
    candidates = [linear(p), vshape(p)] + [interleaved(p, v) for v in range(2, n // p + 1) if n == v * p]
    for candidate in candidates:
        if candidate.chunk_to_rank == mapping:
            return candidate
    placement = Placement("custom", p, mapping, (tuple(range(n)),))
    placement.check()
    return placement


def from_rows(rows: Iterable[Iterable[Any]], num_microbatches: int | None = None, name: str = "imported",
              origin: str = "torch schedule") -> Schedule:
    """A Schedule from per-rank cells (strings or torch `_Action`s; None and "" are idle slots).

    Parameters
    ----------
    rows
        Row r is rank r's actions in order.
    num_microbatches
        The iteration's microbatch count; default: the largest microbatch mentioned, plus one.
    name
        The schedule's name.
    origin
        Where the rows come from, for error messages (e.g. the file name).

    Raises
    ------
    ScheduleError
        A cell is not an action; a stage is on two ranks; a stage between 0 and the largest is never
        mentioned; a microbatch is >= num_microbatches.
    """
    ranks: list[list[Action]] = []
    for r, row in enumerate(rows):
        actions = []
        for step, cell in enumerate(row):
            text = "" if cell is None else str(cell).strip()
            if not text or _COMM_RE.match(text):
                continue
            try:
                actions.append(Action.parse(text))
            except ScheduleError as exc:
                raise ScheduleError(f"{origin}, rank {r} (row {r + 1}), cell {step + 1}: {exc}") from None
        ranks.append(actions)
    if not ranks:
        raise ScheduleError(f"{origin} has no rows: write one row of actions per rank")
    owner: dict[int, int] = {}
    top_mb = -1
    for r, actions in enumerate(ranks):
        for action in actions:
            for a in action.passes():
                top_mb = max(top_mb, a.microbatch)
                seen = owner.setdefault(a.chunk, r)
                if seen != r:
                    raise ScheduleError(
                        f"{origin}: stage {a.chunk} appears on rank {seen} and rank {r} ({a}); torch runs each "
                        "stage on exactly one rank: keep all of a stage's actions in one row"
                    )
    if not owner:
        raise ScheduleError(f"{origin} has no compute actions (F, I, W, B): nothing to import")
    n = max(owner) + 1
    missing = [c for c in range(n) if c not in owner]
    if missing:
        raise ScheduleError(f"{origin}: stage(s) {missing} never appear, but stage {n - 1} does; stages must be "
                            f"numbered 0..{n - 1} without gaps")
    m = top_mb + 1 if num_microbatches is None else num_microbatches
    if m < 1 or top_mb >= m:
        raise ScheduleError(f"microbatch count {m} does not cover {origin}, which mentions microbatch {top_mb} "
                            f"(counted from 0): give {top_mb + 1} or more, or leave the count out to infer it",
                            subject="microbatches")
    placement = infer_placement([owner[c] for c in range(n)], len(ranks))
    return Schedule(name, placement, m, tuple(tuple(a) for a in ranks), {"imported_from": origin})


def parse_torch_csv(text: str, num_microbatches: int | None = None, name: str = "imported",
                    origin: str = "torch CSV") -> Schedule:
    """A Schedule from torch CSV text (compute-only or lowered with comms)."""
    return from_rows(csv.reader(io.StringIO(text)), num_microbatches, name, origin)


def import_torch_csv(path: str | Path, num_microbatches: int | None = None, name: str | None = None) -> Schedule:
    """Read a torch schedule CSV file (ours, torchtitan's, or a dump of torch's built-in schedules).

    The result is not validated: pass it to zbsearch.sim.validate to check it.
    """
    path = Path(path)
    text = read_text(path, "CSV")
    return parse_torch_csv(text, num_microbatches, name or path.stem, origin=str(path))


def torch_builtin(schedule: str, num_ranks: int, num_microbatches: int, stages_per_rank: int | None = None) -> Schedule:
    """One of torch's built-in schedules as a zbsearch Schedule, from torch's own order dump
    (`torch.distributed.pipelining._schedule_visualizer.get_schedule_ops`; no process group needed).

    `schedule` is a torch name such as InterleavedZeroBubble, ZBVZeroBubble, DualPipeV, Interleaved1F1B,
    LoopedBFS or GPipe. Multi-stage schedules default to 2 stages per rank. torch 2.13's dump of 1F1B is
    wrong for the last rank; the validator says so.
    """
    torch_schedules(f"importing torch's {schedule}")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    if stages_per_rank is None and schedule.lower() not in _SINGLE_STAGE:
        stages_per_rank = 2
    try:
        ops = get_schedule_ops(schedule, num_ranks, num_microbatches, num_stages_per_rank=stages_per_rank)
    except (ValueError, AssertionError, RuntimeError) as exc:
        raise ScheduleError(f"torch cannot build {schedule} for {num_ranks} ranks and {num_microbatches} "
                            f"microbatches: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    imported = from_rows(ops, None, name=f"torch:{schedule}", origin=f"torch's {schedule}")
    if imported.num_microbatches > num_microbatches:
        raise ScheduleError(
            f"torch's own order for {schedule} with {num_microbatches} microbatches mentions microbatch "
            f"{imported.num_microbatches - 1}: torch's dump of this schedule is wrong (torch 2.13's 1F1B dump is, "
            "on the last rank); compare against another schedule"
        )
    return replace(imported, num_microbatches=num_microbatches)

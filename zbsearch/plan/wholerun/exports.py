"""The chosen plan of a whole run as its trainers take it (issue 41, deliverable 7): torchtitan's config module
and the schedule CSV it runs, Megatron-LM's arguments, and the plan itself, written into one folder together
or not at all (`export_plan`).

A trainer gets its files only where it runs the plan as planned (shape, split, recompute, memory); where it
cannot, one line says why (`Exports.refused`) and the other trainer's files are still written. Where it runs
the plan within the plan's memory but otherwise than costed, one line says how (`Exports.notes`). What each
trainer takes, checked against its source (trainer_fit.py holds the mapping and every citation):

- torchtitan main (b5bcd76c) or 0.3.0: `torchtitan_config.py` with `apply_plan(config)`: the degrees
  (tensor with sequence parallelism, pipeline, data-parallel shard and replicate, expert), the microbatch
  and global batch, and, with a pipeline, everything the single-pipeline export sets (module parts, schedule
  CSV, recompute, attention; torchtitan_python.py); `schedule.csv` where p > 1. Shardings: ddp (replicate),
  fsdp, zero1 (FSDP2 that does not reshard after forward: under pipelining it holds and moves what ZeRO-1
  does), and without pipelining zero2 and fsdp-reshard; under pipelining zero2 and fsdp-reshard are refused.
- Megatron-LM (d98e8a64): `megatron_args.txt`, one shell-quoted line. Shardings ddp, zero1 and fsdp
  (--use-distributed-optimizer); zero2 and fsdp-reshard refused; V-shape and two-copy placements refused
  (trainers.check_megatron_placement); Megatron's own order simulated on the plan's costs where the plan's is
  not Megatron's.
- `plan.json`: the chosen shape's record (ShapeResult.to_dict: shape, step, split, recompute, the schedule
  under "plan") and what was exported and refused; `schedule.json` where p > 1, the schedule file every
  zbsearch command reads (what `configure -o` writes).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...core.errors import FileError, PlanError, ZbsearchError
from ...core.fileio import write_atomic
from ...core.ir import BW, F, Schedule, build, linear
from ...core.plan_record import PlanRecord
from ...interop.formats.export import render
from ...interop.formats.torchtitan import CHECKED, layout_words, resolve_version, torchtitan_parts
from ...interop.formats.torchtitan_plan import titan_plan, titan_single
from ...interop.formats.torchtitan_python import torchtitan_run_python
from ...interop.formats.trainers import torchtitan_schedule_name
from .chosen import ChosenPlan, chosen_plan
from .cluster import Cluster
from .cost import PlanChoices
from .shape_result import ShapeResult
from .trainer_fit import megatron_line, titan_degrees, titan_notes
from .workload import Workload

TITAN_CONFIG, SCHEDULE_CSV, MEGATRON_ARGS = "torchtitan_config.py", "schedule.csv", "megatron_args.txt"
PLAN_JSON, SCHEDULE_JSON = "plan.json", "schedule.json"
# Every file an export writes; one an earlier export left that this one does not write is removed, so the
# folder never mixes two plans.
OWN_FILES = (TITAN_CONFIG, SCHEDULE_CSV, MEGATRON_ARGS, PLAN_JSON, SCHEDULE_JSON)
TORCHTITAN, MEGATRON = "torchtitan", "Megatron-LM"


@dataclass(frozen=True)
class Exports:
    """The files of an export (name -> text, in the order written), the trainers refused with why, and the
    notes (one line each, naming its trainer)."""

    files: dict[str, str]
    refused: dict[str, str]
    notes: tuple[str, ...] = ()

    def lines(self, folder: str | Path) -> list[str]:
        """What a command prints: the files written, one line per refused trainer, the notes."""
        return ([f"wrote {', '.join(self.files)} into {folder}"]
                + [f"{trainer}: not exported: {why}" for trainer, why in self.refused.items()] + list(self.notes))


def _titan_header(plan: ChosenPlan, version: str, cluster: Cluster) -> str:
    r = plan.result
    how = (f"{r.schedule_name} on placement {r.placement}" if plan.schedule is not None else "no pipeline")
    return (f"torchtitan {CHECKED[version]}: zbsearch configure's plan {r.shape.label()} on {cluster.gpus} "
            f"{cluster.gpu.upper()} ({how}).")


def torchtitan_files(plan: ChosenPlan, workload: Workload, cluster: Cluster, version: str) -> tuple[dict[str, str],
                                                                                                      list[str]]:
    """torchtitan's files for the plan (the config module and, with a pipeline, the CSV) and its notes.

    Raises
    ------
    ZbsearchError
        torchtitan cannot run the plan as planned (the message says why); nothing is rendered.
    """
    if version == "0.2":
        raise ZbsearchError("the whole-run export writes torchtitan main or 0.3 Python configs, and the torchtitan "
                            "asked for (or installed here) is 0.2, whose configs are TOML: ask for main or 0.3",
                            subject="torchtitan")
    shape = plan.result.shape
    shard, reshard, degrees = titan_degrees(shape, workload)
    notes = titan_notes(shape, plan.partial)
    parts = torchtitan_parts(plan.split, version)  # refuses a split that does not name every module once
    files: dict[str, str] = {}
    schedule = plan.schedule
    if schedule is None:
        record = titan_single(plan.split, shape.m, plan.profile, plan.levels)
        layout = None
    else:
        files[SCHEDULE_CSV] = render(schedule, "torch-csv", plan.planned)
        # the plan's sharding is the shape's (trainer_fit.py), not its memory kind the plan record holds
        unsharded = replace(schedule, plan=replace(schedule.plan, sharding=None))
        record = titan_plan(unsharded, plan.split, parts, SCHEDULE_CSV, torchtitan_schedule_name(schedule),
                            plan.profile, plan.levels)
        layout = layout_words(schedule, record.schedule)
    record = replace(record, shard_degree=shard, reshard=reshard)
    files[TITAN_CONFIG] = torchtitan_run_python(record, degrees, version, _titan_header(plan, version, cluster),
                                                layout, [f"Note: {line}" for line in notes])
    return files, [f"{TORCHTITAN}: {line}" for line in notes]


def _one_rank(plan: ChosenPlan) -> Schedule:
    """The plan without pipelining as a one-rank schedule (each microbatch's forward, then its backward):
    what megatron_recompute reads the recompute of."""
    m = plan.result.shape.m
    record = PlanRecord(split=plan.split, recompute=tuple(plan.levels.items()))
    return build("no-pipeline", linear(1), m, [[a for i in range(m) for a in (F(0, i), BW(0, i))]], plan=record)


def megatron_file(plan: ChosenPlan, workload: Workload) -> tuple[str, list[str]]:
    """Megatron-LM's arguments on one line and its notes.

    Raises
    ------
    ZbsearchError
        Megatron-LM cannot run the plan as planned (the message says why).
    """
    schedule = plan.schedule if plan.schedule is not None else _one_rank(plan)
    line, notes = megatron_line(plan.result.shape, workload, schedule, plan.split, plan.profile, plan.usable_bytes,
                                pipelined=plan.schedule is not None)
    return line, [f"{MEGATRON}: {note}" for note in notes]


def _plan_json(plan: ChosenPlan, exported: dict[str, list[str]], refused: dict[str, str], notes: list[str]) -> str:
    out: dict[str, Any] = {"format": "zbsearch-run-plan/1", **plan.result.to_dict()}
    out["exports"] = {"files": exported, "refused": refused, "notes": notes}
    return json.dumps(out, indent=1, allow_nan=False) + "\n"


def render_exports(result: ShapeResult, workload: Workload, cluster: Cluster, choices: PlanChoices = PlanChoices(),
                   torchtitan: str | None = None) -> Exports:
    """Every file of the export of `result`, rendered and checked, nothing written (see the module).
    `torchtitan`: the version to write for (main or 0.3; None: the installed one, else main).

    Raises
    ------
    PlanError, ScheduleError
        The result holds no plan, or its plan does not validate (chosen_plan).
    ZbsearchError
        An unknown torchtitan version.
    """
    return exports_of(chosen_plan(result, workload, cluster, choices), workload, cluster, torchtitan)


def exports_of(plan: ChosenPlan, workload: Workload, cluster: Cluster, torchtitan: str | None = None) -> Exports:
    """Every file of the export of a plan already rebuilt and validated (chosen.chosen_plan), nothing written:
    a caller that writes the plan out otherwise too validates it once for all its writers.

    Raises
    ------
    ZbsearchError
        An unknown torchtitan version.
    """
    version, _ = resolve_version(torchtitan)
    by_trainer: dict[str, dict[str, str]] = {}
    refused: dict[str, str] = {}
    notes: list[str] = []
    try:
        titan, more = torchtitan_files(plan, workload, cluster, version)
        by_trainer[TORCHTITAN], notes = titan, notes + more
    except ZbsearchError as exc:
        refused[TORCHTITAN] = " ".join(str(exc).split())
    try:
        line, more = megatron_file(plan, workload)
        by_trainer[MEGATRON], notes = {MEGATRON_ARGS: line}, notes + more
    except ZbsearchError as exc:
        refused[MEGATRON] = " ".join(str(exc).split())
    files = {name: text for trainer in (TORCHTITAN, MEGATRON) for name, text in by_trainer.get(trainer, {}).items()}
    if plan.schedule is not None:
        files[SCHEDULE_JSON] = json.dumps(plan.schedule.to_dict(), indent=1) + "\n"
    exported = {trainer: list(named) for trainer, named in by_trainer.items()}
    files[PLAN_JSON] = _plan_json(plan, exported, refused, notes)
    return Exports(files, refused, tuple(notes))


def write_exports(exports: Exports, folder: str | Path) -> list[Path]:
    """Write every file of `exports` into `folder` (made where missing): each into a staging folder inside
    it first, then moved into place, then the files of an earlier export this one does not write removed.
    Returns the paths written.

    Raises
    ------
    FileError
        The folder cannot be made or written to; nothing is written.
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=folder, prefix=".zbsearch-export."))
    except OSError as exc:
        raise FileError(f"cannot write the exports into {folder}: {exc.strerror or exc}; give a folder you can "
                        "write to", subject="export_dir") from None
    try:
        for name, text in exports.files.items():
            write_atomic(staging / name, text)
        for name in exports.files:
            os.replace(staging / name, folder / name)
        for name in OWN_FILES:
            if name not in exports.files:
                (folder / name).unlink(missing_ok=True)
    except OSError as exc:
        raise FileError(f"cannot write the exports into {folder}: {exc.strerror or exc}",
                        subject="export_dir") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [folder / name for name in exports.files]


def export_plan(result: ShapeResult | None, folder: str | Path, workload: Workload, cluster: Cluster,
                choices: PlanChoices = PlanChoices(), torchtitan: str | None = None) -> Exports:
    """Render the export of the chosen plan `result` (chosen_plan, then exports_of), then write it into
    `folder` (write_exports). Nothing is written where rendering fails or the folder cannot be written.

    Raises
    ------
    PlanError
        No plan was chosen.
    """
    plan = None if result is None else chosen_plan(result, workload, cluster, choices)
    return export_chosen(plan, folder, workload, cluster, torchtitan)


def export_chosen(plan: ChosenPlan | None, folder: str | Path, workload: Workload, cluster: Cluster,
                  torchtitan: str | None = None) -> Exports:
    """export_plan of a plan already rebuilt and validated (chosen.chosen_plan; None: no plan was chosen).

    Raises
    ------
    PlanError
        No plan was chosen.
    """
    if plan is None:
        raise PlanError("no shape gave a plan, so there is nothing to export", subject="export_dir")
    exports = exports_of(plan, workload, cluster, torchtitan)
    write_exports(exports, folder)
    return exports

"""Run a schedule for real on torch.distributed.pipelining and check it against a plain model.

`run` exports the schedule as a compute-only torch CSV, spawns one process per rank
(torch.multiprocessing; gloo on CPU, nccl with one GPU per rank), and in each process (worker.py):
1. builds the same small model everywhere from one seed, cut into as many chunks as the schedule has
   stages (mlp: Linear+Tanh chunks; gpt-tiny: a causal transformer block per chunk, the embedding on
   chunk 0 and the head on the last), in float64 so the check can be tight;
2. computes a single-process reference: the whole model, the same microbatches, the mean of their
   losses, one backward;
3. wraps the chunks it holds in `PipelineStage`s (sorted by stage index), loads the CSV with
   `_PipelineScheduleRuntime._load_csv(path, format="compute_only")` and runs `step()` `steps` times;
4. after every step compares the loss (on the rank holding the last stage) and every parameter
   gradient of its chunks with the reference (`torch.allclose`), and records how long each F, I, W and B
   took (the stage's own compute call, so waits for a receive are not counted).

This module is the launcher: it checks the request, starts the processes and turns what they wrote
into a RunResult next to the plan. Measured times are in seconds. The first step is a warm-up (shape
inference, allocation) and is left out of the timings when there is more than one step. torch is
imported only when a run starts.
"""

from __future__ import annotations

import json
import socket
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import RunError
from ..core.ir import Kind, Schedule
from ..core.profile import Profile, StageCost
from ..sim.simulate import chunk_costs, pass_cost, simulate
from ..sim.validate import validate
from . import worker as worker_module
from .export import export, torch_compatible
from .worker import MODELS, Job, require_torch, worker

BACKENDS = ("gloo", "nccl")
KINDS = tuple(k.value for k in (Kind.F, Kind.B, Kind.W, Kind.FULL_B))  # torch letters F, I, W, B


@dataclass
class RunResult:
    """What `run` measured and checked. Times are seconds; `planned` is in `time_unit`."""

    schedule: str
    backend: str
    model: str
    nproc: int
    steps: int
    ok: bool
    problems: list[str]
    loss: float
    reference_loss: float
    max_grad_diff: float
    parameters_checked: int
    measured: list[dict[str, dict[str, float]]]  # per rank: kind letter -> {count, mean_s}
    step_seconds: list[float]  # per timed step: the slowest rank's wall time
    predicted_step_seconds: float  # the simulator's makespan with the measured pass times
    planned: list[dict[str, float]] | None = None  # per rank: kind letter -> mean planned time
    time_unit: str | None = None
    plan_seconds_per_unit: float | None = None  # fits the profile's scale to the measured times
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def measured_step_seconds(self) -> float:
        return statistics.median(self.step_seconds) if self.step_seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["measured_step_seconds"] = self.measured_step_seconds
        return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_method(mp: Any, backend: str) -> str:
    """gloo: a fork server that has imported torch once, so each run forks ready workers instead of
    importing torch in every process (seconds each on a small machine) and without forking a parent that
    may have started threads. nccl: spawn (CUDA cannot be used after a fork)."""
    if backend == "nccl":
        return "spawn"
    mp.set_forkserver_preload(["torch", "torch.distributed.pipelining", worker_module.__name__])
    return "forkserver"


def _failure(exc: BaseException) -> str:
    rank = getattr(exc, "error_index", None)
    text = str(exc).strip().splitlines()
    last = next((line for line in reversed(text) if line.strip()), type(exc).__name__)
    return f"rank {rank} failed: {last.strip()}" if rank is not None else last.strip()


def measured_profile(schedule: Schedule, per_chunk: dict[int, dict[str, list[float]]]) -> Profile:
    """A profile whose per-chunk F, B (torch's I) and W are the measured means (seconds), so the
    simulator's makespan is the plan for the times this machine actually took. A chunk that ran full
    backwards gets that time as its fused backward; hops are left at 0."""
    def mean(xs: list[float]) -> float:
        return statistics.fmean(xs) if xs else 0.0

    pl = schedule.placement
    chunks = []
    for c in range(pl.num_chunks):
        t = per_chunk.get(c, {})
        full = mean(t.get("B", []))
        i, w = (mean(t.get("I", [])), mean(t.get("W", []))) if t.get("W") else (full, 0.0)
        chunks.append(StageCost(mean(t.get("F", [])), i, w, full_backward=full if t.get("B") else None))
    stages = tuple(
        StageCost(*(sum(getattr(chunks[c], f) for c in pl.chunks_on(r)) for f in ("F", "B", "W")))
        for r in range(pl.num_ranks)
    )
    return Profile("measured", stages, (), schedule.num_microbatches,
                   {"kind": "measured", "device": "zbsearch run", "date": time.strftime("%Y-%m-%d")},
                   time_unit="s", chunks=tuple(chunks))


def _planned(schedule: Schedule, profile: Profile) -> list[dict[str, float]]:
    costs = chunk_costs(schedule, profile)
    out = []
    for r in range(schedule.num_ranks):
        per: dict[str, list[float]] = {}
        for a in schedule.passes(r):
            per.setdefault(a.kind.value, []).append(pass_cost(costs, a))
        out.append({k: statistics.fmean(v) for k, v in per.items()})
    return out


def run(schedule: Schedule, nproc: int | None = None, backend: str = "gloo", model: str = "mlp", steps: int = 3,
        *, profile: Profile | None = None, seed: int = 0, microbatch_size: int = 2,
        timeout_s: float = 300.0, comms: bool = False) -> RunResult:
    """Execute `schedule` with torch's pipelining runtime on `nproc` processes and check it.

    Parameters
    ----------
    schedule
        A valid schedule on a linear, interleaved or V-shape placement.
    nproc
        Processes (one per rank); default and only allowed value: the schedule's rank count.
    backend
        gloo (CPU) or nccl (one GPU per rank).
    model
        mlp or gpt-tiny, cut into one chunk per stage.
    steps
        Iterations; each is checked, and all but the first are timed when there are several.
    profile
        Optional costs to show the plan next to the measurements (its stage count must be the rank count).
    comms
        Run the torch-csv-comms export (torch's lowering, loaded with format="compute_comms") instead of
        the compute-only CSV.

    Returns
    -------
    RunResult
        `ok` is True when every loss and gradient matched the reference; `problems` says what did not.

    Raises
    ------
    DependencyError
        torch is not installed.
    RunError
        An option is out of range; nccl without enough GPUs; a worker failed.
    ScheduleError
        The schedule is invalid or torch's runtime cannot run its placement.
    """
    _check_request(schedule, nproc, backend, model, steps, profile)
    import torch.multiprocessing as mp

    p = schedule.num_ranks
    with tempfile.TemporaryDirectory(prefix="zbsearch-run-") as tmp:
        fmt, csv_format = ("torch-csv-comms", "compute_comms") if comms else ("torch-csv", "compute_only")
        csv_path = export(schedule, fmt, Path(tmp, "schedule.csv"))
        job = Job(schedule, str(csv_path), tmp, _free_port(), backend, model, steps, seed, microbatch_size,
                  timeout_s, csv_format)
        t0 = time.perf_counter()
        try:
            mp.start_processes(worker, args=(job,), nprocs=p, join=True, start_method=_start_method(mp, backend))
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
            raise RunError(f"running {schedule.name!r} on torch failed: {_failure(exc)}") from None
        wall = time.perf_counter() - t0
        results = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(p)]
    return _collect(schedule, backend, model, steps, profile, results, wall, fmt)


def _check_request(schedule: Schedule, nproc: int | None, backend: str, model: str, steps: int,
                   profile: Profile | None) -> None:
    """Refuse, before any process starts, what cannot run: each message says what to use instead."""
    if backend not in BACKENDS:
        raise RunError(f"backend {backend!r} is not known: use gloo (CPU) or nccl (GPUs)")
    if model not in MODELS:
        raise RunError(f"model {model!r} is not known: use one of {', '.join(MODELS)}")
    if steps < 1:
        raise RunError(f"step count {steps} is too small: run at least 1 step")
    p = schedule.num_ranks
    if nproc is not None and nproc != p:
        raise RunError(f"process count {nproc} does not match schedule {schedule.name!r}, which has {p} ranks: "
                       f"start {p} processes, one per rank")
    validate(schedule, profile)
    torch_compatible(schedule)
    torch = require_torch()
    if backend == "nccl" and (not torch.cuda.is_available() or torch.cuda.device_count() < p):
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise RunError(f"backend nccl needs one GPU per rank: {p} ranks but {have} GPU(s) visible; "
                       "use gloo to run on CPU")


def _collect(schedule: Schedule, backend: str, model: str, steps: int, profile: Profile | None,
             results: list[dict[str, Any]], wall: float, csv_name: str) -> RunResult:
    per_chunk: dict[int, dict[str, list[float]]] = {}
    measured: list[dict[str, dict[str, float]]] = []
    for res in results:
        per_kind: dict[str, list[float]] = {}
        for kind, stage, seconds in res["events"]:
            per_kind.setdefault(kind, []).append(seconds)
            per_chunk.setdefault(stage, {}).setdefault(kind, []).append(seconds)
        measured.append({k: {"count": len(v), "mean_s": statistics.fmean(v)}
                         for k in KINDS if (v := per_kind.get(k))})
    timed_steps = list(zip(*(r["step_seconds"] for r in results)))
    if len(timed_steps) > 1:
        timed_steps = timed_steps[1:]
    step_seconds = [max(s) for s in timed_steps]
    loss = next(r["loss"] for r in results if r["loss"] is not None)
    predicted = simulate(schedule, measured_profile(schedule, per_chunk)).makespan
    out = RunResult(
        schedule=schedule.name, backend=backend, model=model, nproc=schedule.num_ranks, steps=steps,
        ok=not any(r["problems"] for r in results),
        problems=[f"rank {r['rank']}: {msg}" for r in results for msg in r["problems"]],
        loss=loss, reference_loss=results[0]["reference_loss"],
        max_grad_diff=max(r["max_grad_diff"] for r in results),
        parameters_checked=sum(r["parameters_checked"] for r in results),
        measured=measured, step_seconds=step_seconds, predicted_step_seconds=predicted,
        details={"wall_seconds": wall, "stages_per_rank": [r["stages"] for r in results], "csv": csv_name},
    )
    if profile is not None:
        out.planned = _planned(schedule, profile)
        out.time_unit = profile.time_unit
        planned_total = sum(pass_cost(chunk_costs(schedule, profile), a)
                            for r in range(schedule.num_ranks) for a in schedule.passes(r))
        measured_total = sum(v["count"] * v["mean_s"] for rank in measured for v in rank.values())
        runs = max(1, steps - 1) if steps > 1 else 1
        out.plan_seconds_per_unit = measured_total / runs / planned_total if planned_total > 0 else None
    return out

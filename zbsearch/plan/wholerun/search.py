"""Branch and bound across the shapes of a run (docs/whole-run.md), generic over the two per-shape entry points.

1. Every enumerated shape gets its cheap lower bound (in the pool; those in the results file are read back);
   a refused shape leaves with its reason.
2. The rest are solved best bound first, at most `workers` at once, each for a time in proportion to its
   promise: the base limit x best bound / its bound, clamped to [min_share, 1] of the base (TIME RULE: the
   shape of least bound gets the whole limit, one bounded twice as slow half of it, none less than
   `min_share`).
3. Before a shape starts it is pruned if it cannot beat the incumbent: (bound, order) > (step, order) of the
   incumbent, order being the enumeration's. That is the bound >= the incumbent's step, except that at a tie
   a shape enumerated before the incumbent is still solved (it would win the tie).
4. The certificate: L = the least lower bound over the space (each solved shape's the larger of its cheap
   bound and the one its solve proved); gap = chosen step / L - 1.

What is identical from run to run (deterministic entry points; any worker count, pool or Ray, any order in
which jobs end, interrupted and resumed or not): the whole table, `Outcome.table()`. The chosen plan is the
least (step, order) over every shape, as no shape that could beat the incumbent is ever pruned, so every run
solves it. Which other shapes a run solves depends on when results came back, so the table is drawn from the
chosen plan alone: `ranked` lists exactly the shapes whose (bound, order) is below the chosen plan's (step,
order), which every run solves; every other shape is listed as pruned against the chosen plan, even where
this run happened to solve it before the incumbent was found (its result stays in the results file). The
certificate is computed from that table. What differs: `Outcome.ran`, the progress events, and the results
file's lines (their order, and the extra shapes a run solved).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Generic, Mapping, TypeVar, cast

from ...core.errors import PlanError
from ...search.options import SearchOptions
from .cluster import Cluster
from .jobs import Done, Job, Runner, open_runner, run_jobs
from .outcome import (BoundLike, Certificate, Failed, Outcome, Pruned, ResultLike, SearchProgress,
                      certificate_of)
from .results_file import ResultsFile
from .shape import Enumerated, Refused, RunShape, Space, enumerate_shapes
from .workload import Workload

BoundT = TypeVar("BoundT", bound=BoundLike)
ResultT = TypeVar("ResultT", bound=ResultLike)
DEFAULT_MIN_SHARE = 0.25  # the least share of the base time limit a shape is solved for (TIME RULE above)


@dataclass(frozen=True)
class ShapeJobs(Generic[BoundT, ResultT]):
    """The per-shape entry points, top-level functions (they are pickled to the workers): `bound` and
    `evaluate` take (workload, cluster, shape, options), `evaluate` with the shape's own time limit in
    `options.time_limit`; `load_bound` and `load_result` read their records back from `to_dict`'s JSON."""

    bound: Callable[[Workload, Cluster, RunShape, SearchOptions], BoundT]
    evaluate: Callable[[Workload, Cluster, RunShape, SearchOptions], ResultT]
    load_bound: Callable[[dict[str, Any]], BoundT]
    load_result: Callable[[dict[str, Any]], ResultT]

    def names(self) -> list[str]:
        """The two functions by name, with what a partial binds (plan choices change the results)."""
        return [_name(fn) for fn in (self.bound, self.evaluate)]


def _name(fn: Callable[..., object]) -> str:
    if isinstance(fn, partial):
        bound = ", ".join(f"{k}={v!r}" for k, v in sorted(fn.keywords.items()))
        return f"{_name(fn.func)}({bound})"
    return f"{fn.__module__}.{fn.__qualname__}"


@dataclass(frozen=True)
class Settings:
    """How a search runs: `workers` jobs at once, in local processes or on the Ray cluster at `ray_address`;
    `results`: the results file (None: none); `fixed`: the user's configuration, solved even where pruned;
    `progress`: told of each shape done or pruned; `min_share`: the TIME RULE's clamp; `arguments`: more
    data for the results file's fingerprint (a version of the cost model, say)."""

    workers: int = 1
    ray_address: str | None = None
    results: str | Path | None = None
    fixed: RunShape | None = None
    progress: Callable[[SearchProgress], None] | None = None
    min_share: float = DEFAULT_MIN_SHARE
    arguments: Mapping[str, Any] = field(default_factory=dict)


def arguments_of(workload: Workload, cluster: Cluster, space: Space, options: SearchOptions, settings: Settings,
                 jobs: ShapeJobs[Any, Any]) -> dict[str, Any]:
    """What the results depend on, as plain JSON data for the results file's fingerprint. Not the worker count
    nor where jobs run, nor the fixed configuration: they change no shape's result (a shape's time limit
    depends on its bound and the space's best bound only)."""
    return {"workload": {**asdict(workload), "model_kind": type(workload.model).__name__},
            "cluster": asdict(cluster), "space": space.to_dict(),
            "options": {"time_limit": options.time_limit, "workers": options.workers, "seed": options.seed,
                        "resolution": options.resolution, "budget": asdict(options.budget)},
            "min_share": settings.min_share, "jobs": jobs.names(), "more": dict(settings.arguments)}


def time_share(bound: float, best: float, min_share: float) -> float:
    """The share of the base time limit a shape of `bound` gets when the best bound is `best` (TIME RULE).

    >>> time_share(100.0, 100.0, 0.25), time_share(200.0, 100.0, 0.25), time_share(1000.0, 100.0, 0.25)
    (1.0, 0.5, 0.25)
    """
    ratio = best / bound if bound > 0 and math.isfinite(bound) else 1.0
    return min(1.0, max(min_share, ratio))


def search_shapes(workload: Workload, cluster: Cluster, space: Space, jobs: ShapeJobs[BoundT, ResultT],
                  options: SearchOptions, settings: Settings = Settings()) -> Outcome[ResultT]:
    """Branch and bound over the shapes of `space` (module docstring).

    Raises
    ------
    PlanError
        No shape in the space (shape.enumerate_shapes), a fixed configuration of another cluster or batch, a
        results file of other arguments, a worker count below 1 or an unreachable Ray address.
    """
    found = enumerate_shapes(workload, cluster, space)
    fixed = _check_fixed(settings.fixed, workload, cluster)
    if not 0 < settings.min_share <= 1:
        raise PlanError(f"least time share {settings.min_share!r} is not in (0, 1]: give e.g. 0.25",
                        subject="min_share")
    arguments = arguments_of(workload, cluster, space, options, settings, jobs)
    run = _Run(workload, cluster, found, jobs, replace(options, progress=None), settings, fixed)
    run.store.load(settings.results, arguments)
    try:
        run.bound_all()
        run.solve_best_first()
        run.solve_fixed()
    except BaseException:
        run.close(abort=True)
        raise
    run.close(abort=False)
    return run.outcome()


def _check_fixed(shape: RunShape | None, workload: Workload, cluster: Cluster) -> RunShape | None:
    if shape is not None and (shape.gpus != cluster.gpus or shape.m * shape.b * shape.d != workload.global_batch):
        raise PlanError(f"configuration {shape.label()} uses {shape.gpus} GPUs and a global batch of "
                        f"{shape.m * shape.b * shape.d}, not {cluster.gpus} and {workload.global_batch}: give t x p "
                        "x d = the GPUs and m x b x d = the global batch", subject="fixed")
    return shape


class _Store(Generic[BoundT, ResultT]):
    """Every finished bound and solve by shape, and the results file they are written to as they end."""

    def __init__(self, jobs: ShapeJobs[BoundT, ResultT]) -> None:
        self.jobs = jobs
        self.bounds: dict[RunShape, BoundT | Failed] = {}
        self.results: dict[RunShape, ResultT | Failed] = {}
        self.file: ResultsFile | None = None

    def load(self, path: str | Path | None, arguments: Mapping[str, Any]) -> None:
        if path is None:
            return
        self.file = ResultsFile.open(path, arguments)
        for entry in self.file.finished:
            self._take(entry)

    def _take(self, entry: dict[str, Any]) -> None:
        shape = RunShape.from_dict(entry["shape"])
        if entry["kind"] == "bound":
            self.bounds[shape] = Failed(shape, entry["failed"]) if "failed" in entry else \
                self.jobs.load_bound(entry["record"])
        else:
            self.results[shape] = Failed(shape, entry["failed"]) if "failed" in entry else \
                self.jobs.load_result(entry["record"])

    def add(self, kind: str, shape: RunShape, done: Done) -> None:
        """Record a finished job, on disk first."""
        entry: dict[str, Any] = {"kind": kind, "shape": shape.to_dict()}
        entry.update({"failed": done.error} if done.error is not None else {"record": done.value.to_dict()})
        if self.file is not None:
            self.file.append(entry)
        if kind == "bound":
            self.bounds[shape] = Failed(shape, done.error) if done.error is not None else cast(BoundT, done.value)
        else:
            self.results[shape] = Failed(shape, done.error) if done.error is not None else cast(ResultT, done.value)


class _Run(Generic[BoundT, ResultT]):
    """One search's state: the shapes in enumeration order (the fixed configuration last where the space
    lacks it), the store, the runner (started at the first job, so a fully resumed search starts none)."""

    def __init__(self, workload: Workload, cluster: Cluster, found: Enumerated, jobs: ShapeJobs[BoundT, ResultT],
                 options: SearchOptions, settings: Settings, fixed: RunShape | None) -> None:
        self.workload, self.cluster, self.found, self.jobs = workload, cluster, found, jobs
        self.options, self.settings, self.fixed = options, settings, fixed
        self.shapes = list(found.shapes) + ([fixed] if fixed is not None and fixed not in found.shapes else [])
        self.order = {shape: i for i, shape in enumerate(self.shapes)}
        self.space = set(found.shapes)
        self.store: _Store[BoundT, ResultT] = _Store(jobs)
        self.runner: Runner | None = None
        self.ran = 0
        self.pruned: set[RunShape] = set()
        self.candidates: list[RunShape] = []  # the space's shapes with a bound, best bound first

    def close(self, abort: bool) -> None:
        if self.runner is not None:
            self.runner.close(abort)

    def in_flight(self) -> int:
        return self.runner.in_flight if self.runner is not None else 0

    def drain(self, queue: list[RunShape], kind: str, job_of: Callable[[RunShape], Job | None]) -> None:
        """Run the job of each shape of `queue` in its order, at most `workers` at once, recording each as it
        ends; `job_of` decides when the shape's turn comes, and returns None to skip it."""
        queue = list(queue)
        while queue or self.in_flight():
            while queue and self.in_flight() < self.settings.workers:
                shape = queue.pop(0)
                job = job_of(shape)
                if job is not None:
                    if self.runner is None:
                        self.runner = open_runner(self.settings.workers, self.settings.ray_address)
                    self.runner.submit(self.order[shape], job)
                    self.ran += 1
            if self.runner is not None and self.runner.in_flight:
                done = self.runner.next_done()
                self.store.add(kind, self.shapes[done.key], done)
                self.tell(kind)

    def job(self, fn: Callable[..., Any], shape: RunShape, seconds: float) -> Job:
        return fn, (self.workload, self.cluster, shape, self.options.with_time(seconds))

    def bound_all(self) -> None:
        self.drain([s for s in self.shapes if s not in self.store.bounds], "bound",
                   lambda s: self.job(self.jobs.bound, s, self.options.time_limit))
        bounded = [s for s in self.found.shapes if self.bound_of(s) is not None]
        self.candidates = sorted(bounded, key=lambda s: (self.bound_of(s) or 0.0, self.order[s]))

    def bound_of(self, shape: RunShape) -> float | None:
        """The shape's cheap bound, None where it was refused or its bound failed."""
        found = self.store.bounds.get(shape)
        if found is None or isinstance(found, Failed) or found.refused is not None:
            return None
        return found.bound

    def seconds_for(self, shape: RunShape) -> float:
        bound = self.bound_of(shape)
        best = self.bound_of(self.candidates[0]) if self.candidates else None
        if bound is None or best is None:
            return self.options.time_limit
        return self.options.time_limit * time_share(bound, best, self.settings.min_share)

    def incumbent(self) -> tuple[float, int, RunShape] | None:
        """(step, order, shape) of the least step solved so far among the space's shapes."""
        plans = [(r.step, self.order[s], s) for s, r in self.store.results.items()
                 if s in self.space and not isinstance(r, Failed) and math.isfinite(r.step)]
        return min(plans, default=None)

    def solve_best_first(self) -> None:
        self.drain(self.candidates, "result", self.solve_or_prune)

    def solve_or_prune(self, shape: RunShape) -> Job | None:
        """The solve of `shape`, or None where it was solved before (the results file) or is pruned: its
        (bound, order) above the incumbent's (step, order), so it can neither beat nor tie-break past it."""
        if shape in self.store.results:
            self.tell("result")
            return None
        best, bound = self.incumbent(), self.bound_of(shape)
        if best is not None and bound is not None and (bound, self.order[shape]) > best[:2]:
            self.pruned.add(shape)
            self.tell("result")
            return None
        return self.job(self.jobs.evaluate, shape, self.seconds_for(shape))

    def solve_fixed(self) -> None:
        """The user's configuration is solved even where it was pruned or lies outside the space."""
        shape = self.fixed
        if shape is not None and shape not in self.store.results and self.bound_of(shape) is not None:
            self.drain([shape], "result", lambda s: self.job(self.jobs.evaluate, s, self.seconds_for(s)))

    def lower_bound(self, shape: RunShape, solved: bool) -> float:
        """The shape's lower bound: its cheap one, raised by the bound its solve proved where `solved`."""
        cheap = self.bound_of(shape)
        assert cheap is not None
        result = self.store.results.get(shape) if solved else None
        return max(cheap, result.bound) if result is not None and not isinstance(result, Failed) else cheap

    def tell(self, kind: str) -> None:
        if self.settings.progress is None:
            return
        if kind == "bound":
            done = sum(s in self.store.bounds for s in self.shapes)
            self.settings.progress(SearchProgress("bound", done, 0, len(self.shapes) - done, None, None, None))
            return
        done = sum(s in self.store.results for s in self.candidates)
        best = self.incumbent()
        certificate = certificate_of(best[0], [self.lower_bound(s, True) for s in self.candidates]) \
            if best is not None else None
        self.settings.progress(SearchProgress("solve", done, len(self.pruned), len(self.candidates) - done -
                                              len(self.pruned), best[2] if best else None,
                                              best[0] if best else None, certificate))

    def outcome(self) -> Outcome[ResultT]:
        return _outcome(self)


def _refusal(run: _Run[Any, Any], shape: RunShape) -> Refused | None:
    """Why the shape's bound leaves it out (refused, or the bound failed), None where it has a bound."""
    found = run.store.bounds.get(shape)
    if isinstance(found, Failed):
        return Refused(shape.label(), f"its bound failed: {found.reason}")
    if found is not None and found.refused is not None:
        return Refused(shape.label(), found.refused)
    return None


def _outcome(run: _Run[BoundT, ResultT]) -> Outcome[ResultT]:
    """The table, drawn from the chosen plan alone (module docstring): the same whichever shapes this run
    happened to solve past it."""
    best = run.incumbent()
    refused = list(run.found.refused) + [r for r in (_refusal(run, s) for s in run.found.shapes) if r is not None]
    keep = [s for s in run.candidates if best is None or s == best[2]
            or (run.bound_of(s) or 0.0, run.order[s]) < best[:2]]
    solved = [run.store.results[s] for s in keep if s in run.store.results]
    ranked = sorted((r for r in solved if not isinstance(r, Failed)), key=lambda r: (r.step, run.order[r.shape]))
    pruned = [] if best is None else [
        Pruned(s, run.bound_of(s) or 0.0, f"bound {(run.bound_of(s) or 0.0) / 1e6:.4g} s >= plan {best[0] / 1e6:.4g} s of {best[2].label()}")
        for s in run.candidates if s not in keep]
    certificate: Certificate | None = None
    if best is not None:
        certificate = certificate_of(best[0], [run.lower_bound(s, s in keep) for s in run.candidates])
    chosen = cast(ResultT, run.store.results[best[2]]) if best is not None else None  # never Failed: a plan
    return Outcome(chosen, tuple(ranked), tuple(r for r in solved if isinstance(r, Failed)),
                   tuple(pruned), tuple(refused), certificate, _fixed_row(run), run.ran)


def _fixed_row(run: _Run[BoundT, ResultT]) -> ResultT | Failed | Refused | None:
    if run.fixed is None:
        return None
    return _refusal(run, run.fixed) or run.store.results.get(run.fixed)

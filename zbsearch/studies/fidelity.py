"""The fidelity study: for one profiled model, the simulator's predicted iteration time and activation
memory of each schedule next to what torch's pipelining runtime measures on this machine.

Schedules: the handcrafted ones (1F1B, ZB-H1, ZB-H2, ZB-V, interleaved 1F1B), torch's built-in orders
(interop.torch_import) and zbsearch's solved schedule for every memory limit and every profile variant.
Variants: `raw` is the profile as measured, without calibration and under the paper's memory
accounting; `calibrated` adds the runtime's per-action overhead and measured message times and plans
with torch's runtime memory (core/calibration.py, interop/run/calibrate.py). Every prediction is made on the
costs the run executes: the profile's stages for one chunk per rank, else the sums of its per-layer
costs over the chunks the run cuts (interop.run_model.predicted_profile).

Every distinct schedule runs `repeats` times (round robin, so drift in the machine's speed spreads over
all of them), each time `warmup` untimed steps then `steps` timed ones, gradients unchecked, one torch
thread per rank (and each rank pinned to its own CPU with `pin_cpu`, where the platform allows); the
first run of each also records the activation memory its ranks hold (interop.probe). The analysis and
the files live in fidelity_analysis.py and fidelity_report.py.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..core.errors import PlanError, ZbsearchError
from ..core.ir import Schedule
from ..core.plan_record import Split
from ..core.profile import Profile
from ..interop.run.model import plan_profiled_model, predicted_profile, seconds_per_unit
from ..interop.run.result import PassTimes
from ..schedules import generate
from ..search.options import SearchOptions
from ..search.problem import make_problem
from ..sim.simulate import simulate
from ..interop.formats.torch_import import torch_builtin
from ..core.memory import parse_mem_limit
from ..interop.run.launcher import run

HANDCRAFTED = ("1f1b", "zb-h1", "zb-h2", "zb-v", "interleaved-1f1b")
TORCH_ORDERS = ("ZBVZeroBubble", "InterleavedZeroBubble", "Interleaved1F1B")
VARIANTS = ("raw", "calibrated")
SOLVE_PLACEMENTS = ("linear", "v")
MEMORY_OF = {"raw": "paper", "calibrated": "torch-runtime"}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class StudyRequest:
    """What the study runs; see the module docstring."""

    profile: Profile
    calibrated: Profile | None = None
    limits: tuple[str, ...] = ("1p", "2p")
    schedules: tuple[str, ...] = HANDCRAFTED
    torch_orders: tuple[str, ...] = TORCH_ORDERS
    steps: int = 10
    warmup: int = 2
    repeats: int = 2
    solve_seconds: float = 20.0
    backend: str = "gloo"
    device: str | None = None
    timeout_s: float = 600.0
    pin_cpu: bool = True
    track_memory: bool = True


@dataclass
class Entry:
    """One schedule of the study: what the simulator predicts and what the runs measured."""

    label: str
    source: str  # handcrafted, torch or zbsearch
    schedule: Schedule
    solved_for: tuple[str, str] | None = None  # (variant, limit) of a solved schedule
    predicted: dict[str, float] = field(default_factory=dict)  # variant -> seconds
    peaks: dict[str, list[float]] = field(default_factory=dict)  # memory model -> per-rank bytes
    fits: dict[str, bool] = field(default_factory=dict)  # "variant limit" -> within the limit on every rank
    rounds: list[list[float]] = field(default_factory=list)  # timed step seconds of every run
    memory: list[float] | None = None  # measured activation bytes per rank
    passes: list[PassTimes] = field(default_factory=list)  # the first run's per-pass means
    replay: float | None = None  # the simulator with the measured pass times, no hops (first run)
    note: str = ""

    @property
    def steps(self) -> list[float]:
        return [s for r in self.rounds for s in r]

    @property
    def measured(self) -> float | None:
        return statistics.median(self.steps) if self.steps else None


@dataclass
class Study:
    request: StudyRequest
    entries: list[Entry]
    variants: tuple[str, ...]
    limits_bytes: dict[str, list[float]]  # limit text -> per-rank bytes
    details: dict[str, Any] = field(default_factory=dict)


def variants_of(request: StudyRequest) -> dict[str, Profile]:
    """The profile variants predictions are made on."""
    out = {"raw": request.profile.uncalibrated()}
    if request.calibrated is not None:
        cal = request.calibrated
        out["calibrated"] = cal if cal.memory_model == "torch-runtime" else replace(cal, memory_model="torch-runtime")
    return out


def run_profile(variant: Profile, base: Profile, schedule: Schedule, plan: Any = None) -> Profile:
    """The variant's costs on the chunks the run executes for this schedule (`plan`: the run's cut of
    `base`'s model, interop.run_model.plan_profiled_model, when already made)."""
    plan = plan if plan is not None else plan_profiled_model(schedule, base, check=False)
    return predicted_profile(schedule, variant, plan)[0]


def _schedules(request: StudyRequest, p: int, m: int) -> list[Entry]:

    out = []
    for name in request.schedules:
        try:
            out.append(Entry(name, "handcrafted", generate(name, p, m)))
        except ZbsearchError as exc:
            raise PlanError(f"schedule {name} cannot run on p={p}, m={m}: {exc}") from None
    for name in request.torch_orders:
        out.append(Entry(f"torch:{name}", "torch", torch_builtin(name, p, m)))
    return out


def _solve(request: StudyRequest, variants: dict[str, Profile], progress: Progress | None) -> list[Entry]:
    """zbsearch's schedule for every variant and limit, over the placements in SOLVE_PLACEMENTS, each
    placement planned on the chunk costs its run will execute."""
    # defers OR-Tools until the study solves
    from ..search.solve.driver import solve_placements

    p, m, base = request.profile.num_stages, request.profile.microbatches, request.profile
    shapes = {"linear": generate("1f1b", p, m), "v": generate("zb-v", p, m)}
    out = []
    for name, variant in variants.items():
        for limit in request.limits:
            if progress:
                progress(f"solving on the {name} profile at {limit}")
            problems = [make_problem(run_profile(variant, base, shapes[pl]), limit, "makespan", pl)
                        for pl in SOLVE_PLACEMENTS]
            result = solve_placements(problems, SearchOptions(time_limit=request.solve_seconds))
            schedule = result.schedule
            if schedule.placement.num_chunks != p:
                chunks = plan_profiled_model(shapes["v"], base, check=False).chunks
                split = Split(chunks, chunks, tuple(("other",) * len(c) for c in chunks))
                schedule = replace(schedule, plan=replace(schedule.plan, split=split))
            entry = Entry(f"zbsearch {name} {limit}", "zbsearch", schedule, (name, limit))
            entry.note = f"{result.status}, gap {result.gap:.1%}, start {result.start_heuristic}"
            out.append(entry)
    return out


def predict(entries: list[Entry], variants: dict[str, Profile], request: StudyRequest) -> dict[str, list[float]]:
    """Fill every entry's predicted times, peaks and fits; return each limit in bytes per rank."""

    base, unit = request.profile, seconds_per_unit(request.profile) or 1.0
    limits = {text: list(parse_mem_limit(text, base).per_rank) for text in request.limits}
    for e in entries:
        plan = plan_profiled_model(e.schedule, base, check=False)
        for name, variant in variants.items():
            prof = run_profile(variant, base, e.schedule, plan)
            tl = simulate(e.schedule, prof)
            e.predicted[name] = tl.makespan * unit
            e.peaks[MEMORY_OF[name]] = [tl.peak_memory(r) for r in range(tl.num_ranks)]
            for text, per_rank in limits.items():
                e.fits[f"{name} {text}"] = all(x <= cap * (1 + 1e-9) for x, cap in zip(e.peaks[MEMORY_OF[name]], per_rank))
        if "torch-runtime" not in e.peaks:  # the torch-runtime accounting, even without a calibrated profile
            prof = run_profile(replace(variants["raw"], memory_model="torch-runtime"), base, e.schedule, plan)
            tl = simulate(e.schedule, prof)
            e.peaks["torch-runtime"] = [tl.peak_memory(r) for r in range(tl.num_ranks)]
    return limits


def measure(entries: list[Entry], request: StudyRequest, progress: Progress | None) -> None:
    """Run every distinct schedule `repeats` times, round robin; entries with the same orders share runs."""

    groups: dict[Any, list[Entry]] = {}
    for e in entries:
        groups.setdefault((e.schedule.placement, e.schedule.ranks), []).append(e)
    order = list(groups.values())
    for r in range(request.repeats):
        for k, group in enumerate(order[r % len(order):] + order[:r % len(order)]):
            first = group[0]
            if progress:
                progress(f"round {r + 1}/{request.repeats}: {first.label} ({k + 1}/{len(order)})")
            result = run(first.schedule, profile=request.profile, steps=request.steps, warmup=request.warmup,
                         backend=request.backend, device=request.device, check=False, timeout_s=request.timeout_s,
                         track_memory=request.track_memory and not first.rounds, pin_cpu=request.pin_cpu)
            for e in group:
                e.rounds.append(list(result.step_seconds))
                if result.memory_peak_bytes is not None:
                    e.memory = list(result.memory_peak_bytes)
                if not e.passes:
                    e.passes, e.replay = list(result.passes), result.predicted_step_seconds
                    e.note = e.note or ("same orders as " + group[0].label if e is not group[0] else "")


def require_model(profile: Profile) -> None:
    """Refuse a profile that records no model to run (only profiles the profiler wrote do)."""
    if not isinstance(profile.details.get("model"), dict):
        raise PlanError(f"profile {profile.label} records no model (details.model): the study runs the model a "
                        "profile was measured from, so measure one with zbsearch profile")
    if profile.num_stages < 2:
        raise PlanError(f"profile {profile.label} has 1 stage: the study compares pipeline schedules, profile 2 or "
                        "more stages")


def run_study(request: StudyRequest, progress: Progress | None = None) -> Study:
    """Solve, predict and measure (see the module docstring).

    Raises
    ------
    PlanError
        A schedule cannot be built for the profile's p and m, or the profile records no model to run.
    RunError, ScheduleError
        A run fails or times out; torch cannot build one of its orders.
    """
    prof = request.profile
    require_model(prof)
    variants = variants_of(request)
    entries = _schedules(request, prof.num_stages, prof.microbatches) + _solve(request, variants, progress)
    limits = predict(entries, variants, request)
    measure(entries, request, progress)
    return Study(request, entries, tuple(variants), limits)

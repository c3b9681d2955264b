"""Run a schedule for real on torch.distributed.pipelining and check it against a plain model.

`run` exports the schedule as a compute-only torch CSV, spawns one process per rank
(torch.multiprocessing; gloo on CPU, nccl with one GPU per rank), and in each process:
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

Measured times are in seconds. The first step is a warm-up (shape inference, allocation) and is left
out of the timings when there is more than one step. torch is imported only when a run starts.
"""

from __future__ import annotations

import copy
import json
import math
import socket
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from ..core.errors import ZbsearchError
from .export import export, torch_compatible
from ..core.ir import Kind, Schedule
from ..core.profile import Profile, StageCost
from ..sim.simulate import chunk_costs, pass_cost, simulate
from .torch_import import INSTALL_HINT
from ..sim.validate import validate

MODELS = ("mlp", "gpt-tiny")
BACKENDS = ("gloo", "nccl")
KINDS = tuple(k.value for k in (Kind.F, Kind.B, Kind.W, Kind.FULL_B))  # torch letters F, I, W, B
# float64 model: the pipeline and the reference differ only by summation order.
RTOL, ATOL = 1e-7, 1e-10
MLP_WIDTH = 16
GPT = {"vocab": 64, "width": 32, "heads": 2, "seq": 8}


@dataclass(frozen=True)
class _Job:
    """Everything a worker process needs (pickled to each spawned process)."""

    schedule: Schedule
    csv_path: str
    out_dir: str
    port: int
    backend: str
    model: str
    steps: int
    seed: int
    microbatch_size: int
    timeout_s: float
    csv_format: str = "compute_only"


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


# -- the models ----------------------------------------------------------------------------------

def _require_torch() -> Any:
    try:
        import torch
        import torch.distributed.pipelining  # noqa: F401
    except ImportError:
        raise ZbsearchError(f"zbsearch run needs torch, which is not installed: {INSTALL_HINT}") from None
    return torch


def build_chunks(model: str, num_chunks: int, seed: int) -> list[Any]:
    """The model cut into `num_chunks` float64 modules, identical in every process for one seed."""
    torch = _require_torch()
    nn = torch.nn
    torch.manual_seed(seed)
    if model == "mlp":
        chunks = [nn.Sequential(nn.Linear(MLP_WIDTH, MLP_WIDTH), nn.Tanh()) for _ in range(num_chunks)]
    elif model == "gpt-tiny":
        chunks = [_gpt_chunk(torch, first=c == 0, last=c == num_chunks - 1) for c in range(num_chunks)]
    else:
        raise ZbsearchError(f"--model {model!r} is not a model: use one of {', '.join(MODELS)}")
    return [c.double() for c in chunks]


def _gpt_chunk(torch: Any, first: bool, last: bool) -> Any:
    """One transformer block, with the embeddings in front on the first chunk and the head behind on
    the last."""
    nn, F = torch.nn, torch.nn.functional
    V, D, H, T = GPT["vocab"], GPT["width"], GPT["heads"], GPT["seq"]

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
            self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
            self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
            q, k, v = (z.view(b, t, H, D // H).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, D))
            return x + self.mlp(self.ln2(x))

    class Chunk(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            if first:
                self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(T, D)
            self.block = Block()
            if last:
                self.ln_f, self.head = nn.LayerNorm(D), nn.Linear(D, V)

        def forward(self, x: Any) -> Any:
            if first:
                x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
            x = self.block(x)
            return self.head(self.ln_f(x)) if last else x

    return Chunk()


def make_batch(model: str, num_microbatches: int, microbatch_size: int, seed: int) -> tuple[Any, Any]:
    """Inputs and targets for one iteration, identical in every process."""
    torch = _require_torch()
    g = torch.Generator().manual_seed(seed + 1)
    n = num_microbatches * microbatch_size
    if model == "mlp":
        return (torch.randn(n, MLP_WIDTH, generator=g, dtype=torch.float64),
                torch.randn(n, MLP_WIDTH, generator=g, dtype=torch.float64))
    V, T = GPT["vocab"], GPT["seq"]
    return torch.randint(0, V, (n, T), generator=g), torch.randint(0, V, (n, T), generator=g)


def loss_function(model: str) -> Callable[[Any, Any], Any]:
    torch = _require_torch()
    F = torch.nn.functional
    if model == "mlp":
        return F.mse_loss
    return lambda logits, target: F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


# -- the worker ----------------------------------------------------------------------------------

def _timed(torch: Any, fn: Callable, record: Callable[[str, int, float, float], None], kind_of: Callable[..., str],
           stage: int, sync: bool) -> Callable:
    def wrapper(mb: int, *args: Any, **kwargs: Any) -> Any:
        if sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(mb, *args, **kwargs)
        if sync:
            torch.cuda.synchronize()
        record(kind_of(*args, **kwargs), stage, t0, time.perf_counter())
        return out
    return wrapper


def _full_backward(loss: Any = None, full_backward: bool = True, last_backward: bool = False) -> str:
    return "B" if full_backward else "I"


def _reference(torch: Any, chunks: list[Any], x: Any, y: Any, m: int, loss_fn: Callable) -> tuple[list[Any], float]:
    """The single-process reference: a copy of the whole model, the mean of the microbatch losses, one
    backward. Returns the copy (its parameters hold the reference gradients) and the loss."""
    reference = copy.deepcopy(chunks)
    losses = []
    for xi, yi in zip(x.chunk(m), y.chunk(m)):
        out = xi
        for chunk in reference:
            out = chunk(out)
        losses.append(loss_fn(out, yi))
    total = torch.stack(losses).mean()
    total.backward()
    return reference, float(total.detach())


def _compare_grads(torch: Any, chunk: Any, reference: Any, where: str, problems: list[str]) -> tuple[float, int]:
    """Append a problem for every parameter whose gradient is missing or not allclose to the reference;
    return the largest difference and the number of parameters compared."""
    worst, count = 0.0, 0
    for (name, p), (_, q) in zip(chunk.named_parameters(), reference.named_parameters()):
        count += 1
        if p.grad is None:
            problems.append(f"{where} parameter {name} got no gradient")
            continue
        diff = float((p.grad - q.grad).abs().max())
        worst = max(worst, diff)
        if not torch.allclose(p.grad, q.grad, rtol=RTOL, atol=ATOL):
            problems.append(f"{where} parameter {name} gradient differs from the reference (max |diff| {diff:.3g})")
    return worst, count


def _worker(rank: int, job: _Job) -> None:
    torch = _require_torch()
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    torch.set_num_threads(1)
    schedule = job.schedule
    placement = schedule.placement
    n, m = placement.num_chunks, schedule.num_microbatches
    device = torch.device(f"cuda:{rank}") if job.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(job.backend, init_method=f"tcp://127.0.0.1:{job.port}", rank=rank,
                            world_size=placement.num_ranks, timeout=timedelta(seconds=job.timeout_s))
    try:
        chunks = [c.to(device) for c in build_chunks(job.model, n, job.seed)]
        x, y = (t.to(device) for t in make_batch(job.model, m, job.microbatch_size, job.seed))
        loss_fn = loss_function(job.model)

        reference, ref_loss = _reference(torch, chunks, x, y, m, loss_fn)

        mine = sorted(placement.chunks_on(rank))
        stages = [PipelineStage(chunks[c], c, n, device) for c in mine]
        runtime = _PipelineScheduleRuntime(stages, m, loss_fn=loss_fn, scale_grads=True)
        runtime._load_csv(job.csv_path, format=job.csv_format)

        events: list[tuple[str, int, float, float]] = []
        record = lambda kind, stage, t0, t1: events.append((kind, stage, t0, t1))  # noqa: E731
        sync = device.type == "cuda"
        for st in stages:
            st.forward_one_chunk = _timed(torch, st.forward_one_chunk, record, lambda *a, **k: "F", st.stage_index, sync)
            st.backward_one_chunk = _timed(torch, st.backward_one_chunk, record, _full_backward, st.stage_index, sync)
            st.backward_weight_one_chunk = _timed(torch, st.backward_weight_one_chunk, record,
                                                  lambda *a, **k: "W", st.stage_index, sync)

        has_first, has_last = 0 in mine, n - 1 in mine
        problems: list[str] = []
        max_diff, checked, loss_value = 0.0, 0, float("nan")
        step_seconds: list[float] = []
        timed: list[tuple[str, int, float, float]] = []
        for step in range(job.steps):
            for c in mine:
                for p in chunks[c].parameters():
                    p.grad = None
            step_losses: list[Any] = []
            args = (x,) if has_first else ()
            kwargs = {"target": y, "losses": step_losses} if has_last else {}
            events.clear()
            dist.barrier()
            t0 = time.perf_counter()
            runtime.step(*args, **kwargs)
            if sync:
                torch.cuda.synchronize()
            step_seconds.append(time.perf_counter() - t0)
            if step > 0 or job.steps == 1:
                timed.extend(events)
            if has_last:
                loss_value = float(torch.stack(step_losses).detach().mean())
                if not math.isclose(loss_value, ref_loss, rel_tol=RTOL, abs_tol=ATOL):
                    problems.append(f"step {step}: loss {loss_value!r} differs from the reference {ref_loss!r}")
            for c in mine:
                diff, count = _compare_grads(torch, chunks[c], reference[c], f"step {step}: stage {c}", problems)
                max_diff = max(max_diff, diff)
                checked += count if step == 0 else 0
        result = {
            "rank": rank, "stages": mine, "problems": problems, "max_grad_diff": max_diff,
            "parameters_checked": checked, "loss": loss_value if has_last else None,
            "reference_loss": ref_loss, "step_seconds": step_seconds,
            "events": [[k, s, t1 - t0] for k, s, t0, t1 in timed],
        }
        Path(job.out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


# -- the parent ----------------------------------------------------------------------------------

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
    mp.set_forkserver_preload(["torch", "torch.distributed.pipelining", __name__])
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
    ZbsearchError
        torch is missing; an option is out of range; nccl without enough GPUs; a worker failed.
    ScheduleError
        The schedule is invalid or torch's runtime cannot run its placement.
    """
    if backend not in BACKENDS:
        raise ZbsearchError(f"--backend {backend!r}: use gloo (CPU) or nccl (GPUs)")
    if model not in MODELS:
        raise ZbsearchError(f"--model {model!r} is not a model: use one of {', '.join(MODELS)}")
    if steps < 1:
        raise ZbsearchError(f"--steps {steps}: run at least 1 step")
    p = schedule.num_ranks
    if nproc is not None and nproc != p:
        raise ZbsearchError(f"--nproc {nproc} does not match schedule {schedule.name!r}, which has {p} ranks: "
                            f"drop --nproc or use --nproc {p} (one process per rank)")
    validate(schedule, profile)
    torch_compatible(schedule)
    torch = _require_torch()
    if backend == "nccl" and (not torch.cuda.is_available() or torch.cuda.device_count() < p):
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise ZbsearchError(f"--backend nccl needs one GPU per rank: {p} ranks but {have} GPU(s) visible; "
                            "use --backend gloo to run on CPU")
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="zbsearch-run-") as tmp:
        fmt, csv_format = ("torch-csv-comms", "compute_comms") if comms else ("torch-csv", "compute_only")
        csv_path = export(schedule, fmt, Path(tmp, "schedule.csv"))
        job = _Job(schedule, str(csv_path), tmp, _free_port(), backend, model, steps, seed, microbatch_size,
                   timeout_s, csv_format)
        t0 = time.perf_counter()
        try:
            mp.start_processes(_worker, args=(job,), nprocs=p, join=True, start_method=_start_method(mp, backend))
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
            raise ZbsearchError(f"running {schedule.name!r} on torch failed: {_failure(exc)}") from None
        wall = time.perf_counter() - t0
        results = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(p)]
    return _collect(schedule, backend, model, steps, profile, results, wall, fmt)


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

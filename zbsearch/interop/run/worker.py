"""What runs in each process of `zbsearch run`: the model, the single-process reference, torch's
pipelining runtime on this rank's stages, and the checks and timings of every step.

The launcher (runtime.py) pickles one `Job` to every process; each writes `rank<r>.json` into the job's
folder, and the launcher reads them back. Measured times are in seconds. torch is imported only here,
and only when a model is built or a worker starts.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Concatenate, Literal, ParamSpec, TypeVar

from ...core.ir import Schedule
from ...profiling.distributed import Torchrun, host, pingpong
from ...profiling.request import RUN_THREADS
from .build import build_profiled, recompute_layers
from .model import ModelPlan
from .probe import MemoryProbe
from .small_models import build_chunks, loss_function, make_batch, require_torch

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn
    from torch.distributed.pipelining import PipelineStage

    from ...profiling.recompute_once import Frames, Switch

P = ParamSpec("P")
R = TypeVar("R")

# float64 model: the pipeline and the reference differ only by summation order.
RTOL, ATOL = 1e-7, 1e-10

Event = tuple[str, int, float, float]  # torch's kind letter, stage, start, end (perf_counter seconds)
# When a pass started or ended, as recorded: a perf_counter float on a CPU, a torch.cuda.Event on a GPU
# (read when the step ends); which one is known per run, not per value, so the union would not narrow.
Stamp = Any
RawEvent = tuple[str, int, Stamp, Stamp]  # an event as recorded (an Event once the step has ended)
CsvFormat = Literal["compute_only", "compute_comms"]  # torch's _load_csv formats


@dataclass(frozen=True)
class Job:
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
    csv_format: CsvFormat = "compute_only"
    warmup: int = 0  # untimed steps before the `steps` timed ones
    device: str = "cpu"  # cpu, or cuda (one GPU per rank: cuda:<rank>)
    plan: ModelPlan | None = None  # the profiled model; None: the built-in `model`
    pingpong_sizes: tuple[int, ...] = ()  # message sizes to time between ranks 0 and 1 first (probe.py)
    track_memory: bool = False  # one more, untimed step that records the activation memory held (probe.py)
    pin_cpu: bool = False  # pin rank r's process (and its threads) to the r-th CPU it may run on, round robin


# -- checks against the reference -----------------------------------------------------------------

def reference(torch: ModuleType, chunks: list[nn.Module], x: Tensor, y: Tensor, m: int,
              loss_fn: Callable[[Tensor, Tensor], Tensor], dtype: torch.dtype | None = None
              ) -> tuple[list[nn.Module], float]:
    """The single-process reference: a copy of the whole model (in `dtype` when given, e.g. float64), the
    mean of the microbatch losses, one backward. Returns the copy (its parameters hold the reference
    gradients) and the loss."""
    reference = copy.deepcopy(chunks)
    if dtype is not None:
        reference = [c.to(dtype) for c in reference]
        x = x.to(dtype) if x.is_floating_point() else x
    losses = []
    for xi, yi in zip(x.chunk(m), y.chunk(m)):
        out = xi
        for chunk in reference:
            out = chunk(out)
        losses.append(loss_fn(out, yi))
    total = torch.stack(losses).mean()
    total.backward()
    return reference, float(total.detach())


def compare_grads(torch: ModuleType, chunk: nn.Module, reference: nn.Module, where: str, problems: list[str],
                  tolerance: float | None = None) -> tuple[float, int, float]:
    """Append a problem for every parameter whose gradient is missing or differs from the reference;
    return the largest absolute difference, the number of parameters compared and the largest relative
    L2 error. `tolerance` None: same dtype, `allclose` (RTOL, ATOL); else the largest relative L2 error
    allowed against a higher-precision reference."""
    worst, count, worst_rel = 0.0, 0, 0.0
    for (name, p), (_, q) in zip(chunk.named_parameters(), reference.named_parameters()):
        count += 1
        if p.grad is None:
            problems.append(f"{where} parameter {name} got no gradient")
            continue
        r = q.grad
        assert r is not None  # the reference's backward reached every parameter the pipeline's did
        g = p.grad.to(r.dtype)
        diff = float((g - r).abs().max()) if g.numel() else 0.0
        error, norm = float((g - r).norm()), float(r.norm())
        rel = error / max(norm, 1e-300)  # finite, so that the result stays valid JSON
        worst, worst_rel = max(worst, diff), max(worst_rel, rel)
        if tolerance is None:
            ok = torch.allclose(g, r, rtol=RTOL, atol=ATOL)
        else:
            ok = error <= tolerance * norm + ATOL * math.sqrt(g.numel())
        if not ok:
            problems.append(f"{where} parameter {name} gradient differs from the reference (max |diff| {diff:.3g}, "
                            f"relative error {rel:.3g})")
    return worst, count, worst_rel


# -- the worker ----------------------------------------------------------------------------------

def _timed(torch: ModuleType, fn: Callable[Concatenate[int, P], R], record: Callable[[str, int, Stamp, Stamp], None],
           kind_of: Callable[..., str], stage: int, cuda: bool) -> Callable[Concatenate[int, P], R]:
    """`fn` timed: perf_counter on a CPU; on a GPU, CUDA events recorded around it (read after the step,
    so timing never synchronizes the device)."""
    def wrapper(mb: int, *args: P.args, **kwargs: P.kwargs) -> R:
        t0: Stamp
        t1: Stamp
        if cuda:
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            out = fn(mb, *args, **kwargs)
            t1.record()
        else:
            t0 = time.perf_counter()
            out = fn(mb, *args, **kwargs)
            t1 = time.perf_counter()
        record(kind_of(*args, **kwargs), stage, t0, t1)
        return out
    return wrapper


def _full_backward(loss: Tensor | None = None, full_backward: bool = True, last_backward: bool = False) -> str:
    return "B" if full_backward else "I"


def _instrument(torch: ModuleType, stages: list[PipelineStage], record: Callable[[str, int, Stamp, Stamp], None],
                cuda: bool) -> None:
    """Time every stage's own compute calls, so a wait for a receive is not counted."""
    # setattr: each stage's methods are replaced on the instance (torch's runtime calls them through it)
    for st in stages:
        setattr(st, "forward_one_chunk",
                _timed(torch, st.forward_one_chunk, record, lambda *a, **k: "F", st.stage_index, cuda))
        setattr(st, "backward_one_chunk",
                _timed(torch, st.backward_one_chunk, record, _full_backward, st.stage_index, cuda))
        setattr(st, "backward_weight_one_chunk",
                _timed(torch, st.backward_weight_one_chunk, record, lambda *a, **k: "W", st.stage_index, cuda))


def _switched(fn: Callable[Concatenate[int, P], R], switch: Switch,
              microbatches: frozenset[int] | None) -> Callable[Concatenate[int, P], R]:
    """`fn` (a stage's forward_one_chunk, microbatch first) with the chunk's recompute switched on for the
    microbatches that recompute it, off for the others."""
    def wrapper(mb: int, *args: P.args, **kwargs: P.kwargs) -> R:
        switch.on = microbatches is None or mb in microbatches
        return fn(mb, *args, **kwargs)
    return wrapper


def _recompute_per_microbatch(stages: list[PipelineStage], switches: dict[int, Switch], plan: ModelPlan | None) -> None:
    for st in stages:
        if st.stage_index in switches:
            chosen = None if plan is None or plan.recompute_microbatches is None else \
                plan.recompute_microbatches[st.stage_index]
            # setattr: the stage's method is replaced on the instance (torch's runtime calls it through it)
            setattr(st, "forward_one_chunk", _switched(st.forward_one_chunk, switches[st.stage_index], chosen))


class _RankRun:
    """One rank: its stages on torch's runtime and the reference, stepped and checked step by step."""

    def __init__(self, torch: ModuleType, dist: ModuleType, rank: int, job: Job, device: torch.device) -> None:
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

        self.torch, self.dist, self.rank, self.job = torch, dist, rank, job
        placement = job.schedule.placement
        n, m = placement.num_chunks, job.schedule.num_microbatches
        self.mine = sorted(placement.chunks_on(rank))
        self.check = job.plan is None or job.plan.check
        self.tolerance = None if job.plan is None else job.plan.tolerance
        self.chunks, self.x, self.y, loss_fn = self._model(n, m, device)
        self.reference, self.reference_loss = None, None
        if self.check:  # a profiled model is checked against a float64 copy of itself
            self.reference, self.reference_loss = reference(
                torch, [self._chunk(c) for c in range(n)], self.x, self.y, m, loss_fn,
                None if job.plan is None else torch.float64)

        # after the reference was copied, so that it runs the layers as they are
        self.frames: Frames | None
        switches, self.frames = recompute_layers(job.plan, self.chunks, self.mine) if job.plan else ({}, None)
        self.stages = [PipelineStage(self._chunk(c), c, n, device) for c in self.mine]
        _recompute_per_microbatch(self.stages, switches, job.plan)
        self.runtime = _PipelineScheduleRuntime(self.stages, m, loss_fn=loss_fn, scale_grads=True)
        self.runtime._load_csv(job.csv_path, format=job.csv_format)
        self.sync = device.type == "cuda"
        self.device = device
        self.events: list[RawEvent] = []
        self.probe: MemoryProbe | None = None  # during the memory step
        self.memory_peak: float | None = None
        _instrument(torch, self.stages, self._record, self.sync)

        self.has_first, self.has_last = 0 in self.mine, n - 1 in self.mine
        self.problems: list[str] = []
        self.max_diff, self.max_rel, self.checked, self.loss = 0.0, 0.0, 0, float("nan")
        self.step_seconds: list[float] = []
        self.timed: list[Event] = []

    def _model(self, n: int, m: int, device: torch.device) -> tuple[list[nn.Module | None], Tensor, Tensor,
                                                            Callable[[Tensor, Tensor], Tensor]]:
        """(chunks, inputs, targets, loss): the built-in model, or the profiled one (only this rank's
        chunks when there is no reference to compute)."""
        job = self.job
        if job.plan is None:
            chunks: list[nn.Module | None] = [c.to(device) for c in build_chunks(job.model, n, job.seed)]
            x, y = (t.to(device) for t in make_batch(job.model, m, job.microbatch_size, job.seed))
            return chunks, x, y, loss_function(job.model)

        return build_profiled(job.plan, m, job.seed, device, set(range(n)) if self.check else set(self.mine))

    def _chunk(self, c: int) -> nn.Module:
        """Chunk c, which this rank built: one of its own, or any when it checks against the reference."""
        chunk = self.chunks[c]
        assert chunk is not None, f"rank {self.rank} did not build chunk {c}"
        return chunk

    def _record(self, kind: str, stage: int, t0: Stamp, t1: Stamp) -> None:
        self.events.append((kind, stage, t0, t1))
        if self.probe is not None:
            self.probe.sample()

    def _arguments(self, losses: list[Tensor]) -> tuple[tuple[Tensor, ...], dict[str, Any]]:
        """(args, kwargs) of torch's step: the inputs on the first stage; target and losses (a tensor and
        a list, which torch's step takes as loosely typed keywords) on the last."""
        for c in self.mine:
            for p in self._chunk(c).parameters():
                p.grad = None
        args = (self.x,) if self.has_first else ()
        kwargs = {"target": self.y, "losses": losses} if self.has_last else {}
        return args, kwargs

    def memory_step(self) -> None:
        """One more, untimed iteration that records the activation memory this rank holds (probe.py)."""

        args, kwargs = self._arguments([])
        self.probe = MemoryProbe(self.torch, self.stages, self.device,
                                 None if self.frames is None else self.frames.tensors)
        self.dist.barrier()
        with self.probe.hooks():
            self.runtime.step(*args, **kwargs)
        self.memory_peak, self.probe = self.probe.finish(), None

    def step(self, step: int) -> None:
        """One iteration on torch's runtime, timed, then checked against the reference."""
        losses: list[Tensor] = []
        args, kwargs = self._arguments(losses)
        self.events.clear()
        self.dist.barrier()
        t0 = time.perf_counter()
        self.runtime.step(*args, **kwargs)
        if self.sync:
            self.torch.cuda.synchronize()
            self.events[:] = [(k, s, 0.0, a.elapsed_time(b) / 1e3) for k, s, a, b in self.events]
        self.step_seconds.append(time.perf_counter() - t0)
        if step >= self.job.warmup:  # warm-up steps infer shapes and allocate: not pass times worth reporting
            self.timed.extend(self.events)
        self._check(step, losses)

    def _check(self, step: int, losses: list[Tensor]) -> None:
        if self.has_last:
            self.loss = float(self.torch.stack(losses).detach().double().mean())
        if not self.check:
            return
        assert self.reference is not None and self.reference_loss is not None  # computed when checking
        rel, abs_tol = (RTOL, ATOL) if self.tolerance is None else (self.tolerance, 0.0)
        if self.has_last and not math.isclose(self.loss, self.reference_loss, rel_tol=rel, abs_tol=abs_tol):
            self.problems.append(f"step {step}: loss {self.loss!r} differs from the reference {self.reference_loss!r}")
        for c in self.mine:
            diff, count, worst_rel = compare_grads(self.torch, self._chunk(c), self.reference[c],
                                                   f"step {step}: stage {c}", self.problems, self.tolerance)
            self.max_diff, self.max_rel = max(self.max_diff, diff), max(self.max_rel, worst_rel)
            self.checked += count if step == 0 else 0

    def result(self) -> dict[str, Any]:
        """What the launcher reads back from rank<r>.json."""
        return {
            "rank": self.rank, "stages": self.mine, "problems": self.problems, "checked": self.check,
            "max_grad_diff": self.max_diff, "max_grad_rel_error": self.max_rel,
            "parameters_checked": self.checked, "loss": self.loss if self.has_last else None,
            "reference_loss": self.reference_loss, "step_seconds": self.step_seconds,
            "events": [[k, s, t1 - t0] for k, s, t0, t1 in self.timed],
            "memory_peak_bytes": self.memory_peak,
            "recomputes": 0 if self.frames is None else self.frames.recomputes,
        }


def _pin(rank: int) -> list[int] | None:
    """Pin this process to one of the CPUs it may use (rank r to the r-th, round robin); the CPUs it ends
    up on, or None where the platform cannot pin (os.sched_setaffinity is Linux-only)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {allowed[rank % len(allowed)]})
    return sorted(os.sched_getaffinity(0))


def _start(job: Job, local_rank: int) -> tuple[ModuleType, torch.device, list[int] | None]:
    """torch set up for one rank's process: its threads, its CPU (pinned by its rank on this machine) and
    its device (cuda:<rank on this machine> on a GPU). Returns (torch, device, CPUs pinned to)."""
    torch = require_torch()
    torch.set_num_threads(RUN_THREADS)
    cpus = _pin(local_rank) if job.pin_cpu else None
    # The launcher reports a failure in one line; torch's runtime would also log the whole schedule.
    logging.getLogger("torch.distributed.pipelining").setLevel(logging.CRITICAL)
    device = torch.device(f"cuda:{local_rank}") if job.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return torch, device, cpus


def _run_rank(torch: ModuleType, dist: ModuleType, rank: int, job: Job, device: torch.device,
              cpus: list[int] | None) -> dict[str, Any]:
    """Step this rank's stages (after the ping-pong, when asked) and return what the launcher reads."""
    run = _RankRun(torch, dist, rank, job, device)
    pings = pingpong(torch, dist, rank, job.pingpong_sizes, device) if job.pingpong_sizes else None
    for step in range(job.warmup + job.steps):
        run.step(step)
    if job.track_memory:
        run.memory_step()
    return {**run.result(), "pingpong": pings, "cpus": cpus, "host": host()}


def worker(rank: int, job: Job) -> None:
    """One process of a run started on this machine (torch.multiprocessing passes the rank): join the
    group, step, write rank<r>.json into the job's folder."""
    torch, device, cpus = _start(job, rank)
    import torch.distributed as dist

    dist.init_process_group(job.backend, init_method=f"tcp://127.0.0.1:{job.port}", rank=rank,
                            world_size=job.schedule.placement.num_ranks, timeout=timedelta(seconds=job.timeout_s))
    try:
        result = _run_rank(torch, dist, rank, job, device, cpus)
        Path(job.out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def torchrun_worker(job: Job, env: Torchrun) -> list[dict[str, Any]]:
    """This process's rank of a run that torchrun started (one process per rank, on any node): join
    torchrun's group, step, and return every rank's result (gathered on every rank, so each can build
    the same report; only rank 0 prints it)."""
    torch, device, cpus = _start(job, env.local_rank)
    dist = env.init_group(job.backend, job.timeout_s)
    try:
        result = _run_rank(torch, dist, env.rank, job, device, cpus)
        results: list[Any] = [None] * env.world_size
        dist.all_gather_object(results, result)
        return results
    finally:
        dist.destroy_process_group()

"""Run a schedule for real on torch.distributed.pipelining and check it against a plain model.

`run` exports the schedule as a compute-only torch CSV, spawns one process per rank
(torch.multiprocessing; gloo on CPU, nccl with one GPU per rank), and in each process (worker.py).
Started by torchrun (one process per rank on any number of nodes; profiling/distributed.py), it
spawns nothing: each process runs its own rank, found from torchrun's environment, every rank gets
every rank's result, and each builds the same report (the CLI prints it on rank 0 only). In each rank:
1. builds the model everywhere from one seed: the model a profile was made from (the built-in GPT or a
   user factory, cut into the schedule's chunks by the profile's partition or the schedule's
   meta.partition, in the profile's dtype; run_model.py, run_build.py), or a small float64 test model
   (mlp: Linear+Tanh chunks; gpt-tiny: a causal transformer block per chunk);
2. computes a single-process reference: the whole model (float64), the same microbatches, the mean of
   their losses, one backward (for a large profiled model only when asked);
3. wraps the chunks it holds in `PipelineStage`s (sorted by stage index), loads the CSV with
   `_PipelineScheduleRuntime._load_csv(path, format="compute_only")` and runs `step()` warmup + steps
   times;
4. after every step compares the loss (on the rank holding the last stage) and every parameter
   gradient of its chunks with the reference, and records how long each F, I, W and B took (the stage's
   own compute call, so waits for a receive are not counted).

This module is the launcher: it checks the request, starts the processes, stops them all when one fails
or the run outlives its timeout, and turns what they wrote into a RunResult next to the profile's
prediction (run_result.py). Measured times are in seconds; the warm-up steps (shape inference,
allocation) are checked but not timed. torch is imported only when a run starts.
"""

from __future__ import annotations

import json
import logging
import pickle
import re
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from ...core.errors import RunError
from ...core.ir import Schedule
from ...core.profile import Profile
from ...profiling.distributed import Torchrun, torchrun_env
from ...profiling.request import RUN_THREADS
from ...sim.validate import validate
from . import worker as worker_module
from ..formats.export import export, torch_compatible
from .model import plan_profiled_model, predicted_profile
from .result import KINDS, RunResult, collect, measured_profile  # noqa: F401 (the run API)
from .small_models import MODELS, require_torch
from .worker import CsvFormat, Job, torchrun_worker, worker

BACKENDS = ("gloo", "nccl")
DEVICES = {"gloo": "cpu", "nccl": "cuda"}  # the device each backend runs on


def thread_mismatch(profile: Profile | None) -> str | None:
    """Why a CPU profile's times will not be the run's: it was measured with more (or fewer) torch threads
    than each rank computes with (RUN_THREADS); None when they agree or the profile does not say."""
    if profile is None or profile.details.get("device") != "cpu":
        return None
    threads = (profile.details.get("environment") or {}).get("threads")
    if not isinstance(threads, int) or threads == RUN_THREADS:
        return None
    return (f"profile {profile.label} was measured with {threads} torch threads, but each rank of this run computes "
            f"with {RUN_THREADS}: its predicted times will not be the run's; profile again with {RUN_THREADS} "
            f"thread{'s' if RUN_THREADS != 1 else ''} (the profiler's default on a CPU)")


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


# Errors a rank reports when another rank died first: not the cause worth showing.
KNOCK_ON = ("remote worker", "Connection closed by peer", "Connection reset by peer", "terminated with signal")
ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception)):[ \t]*(\S.*)$")


def _cause(text: str) -> str:
    """The last `SomeError: message` line of a traceback (a chained error's outermost one with a message),
    shortened to one readable line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    found = [m for m in map(ERROR_LINE.match, lines) if m]
    line = f"{found[-1].group(1)}: {found[-1].group(2)}" if found else (lines[-1] if lines else "")
    return line if len(line) <= 300 else line[:297] + "..."


def _failure(exc: BaseException, error_files: list[str] | None = None) -> str:
    """The first rank's error that is not a knock-on of another rank's death (else the one torch raised)."""
    rank = getattr(exc, "error_index", None)
    message = _cause(str(exc)) or type(exc).__name__
    for r, path in enumerate(error_files or ()):
        try:
            with open(path, "rb") as fh:
                line = _cause(str(pickle.load(fh)))
        except (OSError, EOFError, pickle.UnpicklingError):
            continue
        if line and not any(k in line for k in KNOCK_ON):
            rank, message = r, line
            break
    return f"rank {rank} failed: {message}" if rank is not None else message


def run(schedule: Schedule, nproc: int | None = None, backend: str = "gloo", model: str | None = None,
        steps: int = 3, *, profile: Profile | None = None, seed: int = 0, microbatch_size: int = 2,
        timeout_s: float = 300.0, comms: bool = False, warmup: int = 1, device: str | None = None,
        check: bool | None = None, track_memory: bool = False, pingpong_sizes: tuple[int, ...] = (),
        pin_cpu: bool = False) -> RunResult:
    """Execute `schedule` with torch's pipelining runtime on `nproc` processes and check it.

    Parameters
    ----------
    schedule
        A valid schedule on a linear, interleaved or V-shape placement.
    nproc
        Processes (one per rank); default and only allowed value: the schedule's rank count.
    backend, device
        gloo on the cpu, or nccl on cuda (one GPU per rank); the device defaults to the backend's.
    model
        "profile": the model `profile` was made from (its built-in GPT or factory, cut by its partition or
        the schedule's meta.partition, in its dtype; see run_model.py); mlp or gpt-tiny: a small float64
        model, one chunk per stage. Default: "profile" when the profile records a model, else mlp.
    steps, warmup
        Timed iterations, after `warmup` untimed ones; every iteration is checked.
    profile
        Costs to compare the measurements with (its stage count must be the rank count).
    timeout_s
        The whole run, start-up included; past it every process is stopped and RunError raised. Under
        torchrun: how long a rank waits for another (the process group's timeout); torchrun stops the
        others when one fails.
    comms
        Run the torch-csv-comms export (torch's lowering, loaded with format="compute_comms") instead of
        the compute-only CSV.
    check
        Profiled model only: compare gradients with a float64 single-process reference. None: when the
        model has at most run_model.CHECK_MAX_PARAMETERS parameters. The small models are always checked.
    track_memory
        Run one more, untimed step that records the activation memory each rank holds
        (`memory_peak_bytes`; see probe.py for what is counted).
    pingpong_sizes
        Before the steps, time messages of these sizes (bytes) between ranks 0 and 1
        (`details["pingpong"]`: [bytes, one-way seconds] per size).
    pin_cpu
        Pin rank r's process to the r-th CPU it may use (round robin; Linux); `details["cpus"]` says where
        each rank ran. Each rank runs torch with one thread either way.

    Returns
    -------
    RunResult
        `ok` is True when every checked loss and gradient matched the reference; `problems` says what did not.

    Raises
    ------
    DependencyError
        torch is not installed.
    RunError
        An option is out of range; an unknown backend or device, or too few GPUs; the profile's model
        cannot be built or cut for this schedule; a worker failed or the run timed out.
    ScheduleError
        The schedule is invalid or torch's runtime cannot run its placement.
    """
    env = torchrun_env()
    device, model = _check_request(schedule, nproc, backend, device, model, steps, warmup, timeout_s, profile,
                                   pingpong_sizes, env)
    plan = plan_profiled_model(schedule, profile, check, seed) if model == "profile" and profile else None
    if plan is not None and plan.recompute and profile is not None:  # (a plan has a profile)
        predicted_profile(schedule, profile, plan)  # a plan its profile cannot cost fails before any process starts
    validate(schedule, profile)
    torch_compatible(schedule)
    with tempfile.TemporaryDirectory(prefix="zbsearch-run-") as tmp:
        csv_format: CsvFormat
        fmt, csv_format = ("torch-csv-comms", "compute_comms") if comms else ("torch-csv", "compute_only")
        csv_path = export(schedule, fmt, Path(tmp, "schedule.csv"))
        job = Job(schedule, str(csv_path), tmp, 0 if env else _free_port(), backend, model, steps, seed,
                  microbatch_size, timeout_s, csv_format, warmup, device, plan, tuple(int(x) for x in pingpong_sizes),
                  track_memory, pin_cpu)
        t0 = time.perf_counter()
        results = _launch(job, schedule.num_ranks) if env is None else torchrun_worker(job, env)
        wall = time.perf_counter() - t0
    out = collect(schedule, job, profile, results)
    out.details.update({"wall_seconds": wall, "csv": fmt, "launcher": "torch.multiprocessing" if env is None else
                        f"torchrun (rank 0 at {env.master})", "hosts": [r.get("host") for r in results]})
    return out


def _launch(job: Job, nprocs: int) -> list[dict[str, Any]]:
    """Start one worker per rank on this machine and wait for all of them, at most `job.timeout_s`;
    whatever happens, no worker outlives this call. Returns what each rank wrote, rank 0 first."""
    import torch.multiprocessing as mp

    name = job.schedule.name
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)  # we report failures ourselves
    deadline = time.monotonic() + job.timeout_s
    context = mp.start_processes(worker, args=(job,), nprocs=nprocs, join=False,
                                 start_method=_start_method(mp, job.backend))
    try:
        while not context.join(timeout=0.2):
            if time.monotonic() > deadline:
                raise RunError(f"running {name!r} on torch did not finish within the timeout of {job.timeout_s:g} s; "
                               "its processes were stopped: allow more time, or run fewer steps or a smaller model")
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        _stop(context.processes)
        raise RunError(f"running {name!r} on torch failed: {_failure(exc, context.error_files)}") from None
    finally:
        _stop(context.processes)
    return [json.loads(Path(job.out_dir, f"rank{r}.json").read_text()) for r in range(nprocs)]


def _stop(processes: list[Any]) -> None:
    """Terminate the workers still alive, then kill those that ignore it."""
    alive = [proc for proc in processes if proc.is_alive()]
    for proc in alive:
        proc.terminate()
    for proc in alive:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def _check_torchrun(schedule: Schedule, env: Torchrun, backend: str) -> None:
    """Under torchrun, one process per rank: refuse a world that is not the schedule's rank count, or a
    node with fewer GPUs than processes."""
    p = schedule.num_ranks
    if env.world_size != p:
        raise RunError(f"torchrun started {env.world_size} processes but schedule {schedule.name!r} has {p} ranks: "
                       f"start {p} in all (nodes times processes per node = {p})")
    torch = require_torch()
    if backend == "nccl" and torch.cuda.device_count() <= env.local_rank:
        raise RunError(f"process {env.rank} is number {env.local_rank} on its node, which has "
                       f"{torch.cuda.device_count()} GPU(s): start at most that many processes per node")


def _check_request(schedule: Schedule, nproc: int | None, backend: str, device: str | None, model: str | None,
                   steps: int, warmup: int, timeout_s: float, profile: Profile | None,
                   pingpong_sizes: tuple[int, ...] = (), env: Torchrun | None = None) -> tuple[str, str]:
    """Refuse, before any process starts, what cannot run: each message says what to use instead.
    Returns the device (cpu or cuda) and the model (profile, mlp or gpt-tiny)."""
    if backend not in BACKENDS:
        raise RunError(f"backend {backend!r} is not known: use gloo (CPU) or nccl (GPUs)", subject="backend")
    device = device if device is not None else DEVICES[backend]
    if device not in DEVICES.values():
        raise RunError(f"device {device!r} is not known: use cpu (with gloo) or cuda (with nccl, one GPU per rank)",
                       subject="device")
    if device != DEVICES[backend]:
        raise RunError(f"device {device} does not go with backend {backend}: use gloo on the cpu, or nccl on cuda",
                       subject="device")
    if model is None:
        model = "profile" if profile is not None and isinstance(profile.details.get("model"), dict) else "mlp"
    if model not in MODELS + ("profile",):
        raise RunError(f"model {model!r} is not known: use one of profile, {', '.join(MODELS)}", subject="model")
    if model == "profile" and profile is None:
        raise RunError("model 'profile' runs the model a profile was made from: give the profile", subject="model")
    if steps < 1:
        raise RunError(f"step count {steps} is too small: run at least 1 step", subject="steps")
    if pingpong_sizes and schedule.num_ranks < 2:
        raise RunError("timing messages needs two ranks: run a schedule for 2 or more ranks")
    if warmup < 0:
        raise RunError(f"warm-up step count {warmup} is negative: use 0 or more", subject="warmup")
    if not timeout_s > 0:
        raise RunError(f"timeout {timeout_s} s is not positive: allow the run some seconds, e.g. 300",
                       subject="timeout")
    p = schedule.num_ranks
    if nproc is not None and nproc != p:
        raise RunError(f"process count {nproc} does not match schedule {schedule.name!r}, which has {p} ranks: "
                       f"start {p} processes, one per rank", subject="nproc")
    if env is not None:
        _check_torchrun(schedule, env, backend)
        return device, model
    torch = require_torch()
    if backend == "nccl" and (not torch.cuda.is_available() or torch.cuda.device_count() < p):
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise RunError(f"backend nccl needs one GPU per rank: {p} ranks but {have} GPU(s) visible; "
                       "use gloo to run on CPU", subject="backend")
    return device, model

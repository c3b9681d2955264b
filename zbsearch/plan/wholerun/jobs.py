"""Independent shape jobs, run in a local process pool or as tasks on a running Ray cluster, each result
handed back as it ends.

A job is a top-level (picklable) function and its arguments. A job that raises a ZbsearchError ends as a
failure with its one-line reason, which the caller records against its shape; any other exception is a bug
and propagates.

The local pool starts its processes with "forkserver" (or "spawn" where there is no fork): OR-Tools' CP-SAT
runs threads, and a child forked from a process holding threads may inherit a lock some thread held.
Ray is an optional extra (`pip install 'zbsearch[ray]'`), imported only when a Ray address is given.
"""

from __future__ import annotations

import multiprocessing
import re
import socket
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator, Protocol

from ...core.errors import DependencyError, PlanError, ZbsearchError

Job = tuple[Callable[..., Any], tuple[Any, ...]]
RAY_HINT = "pip install 'zbsearch[ray]'"
_CONNECT_TIMEOUT_S = 5.0  # how long a Ray address may take to accept a connection before it is called unreachable


@dataclass(frozen=True)
class Done:
    """A finished job: its `key`, and its `value` or, where it raised a ZbsearchError, the one-line `error`."""

    key: int
    value: Any
    error: str | None = None


def call_job(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, str | None]:
    """Run one job where it was sent: (value, None), or (None, the reason) for a ZbsearchError. Only the
    message travels back, so no exception needs to survive pickling."""
    try:
        return fn(*args), None
    except ZbsearchError as exc:
        return None, " ".join(str(exc).split()) or type(exc).__name__


class Runner(Protocol):
    """Where jobs run: `submit` starts one, `next_done` waits for any to end, `close` ends the runner
    (`abort`: without waiting for the jobs in flight)."""

    @property
    def in_flight(self) -> int: ...

    def submit(self, key: int, job: Job) -> None: ...

    def next_done(self) -> Done: ...

    def close(self, abort: bool) -> None: ...


def open_runner(workers: int, ray_address: str | None = None) -> Runner:
    """A runner of `workers` local processes, or tasks on the Ray cluster at `ray_address` (an address, or
    "auto" for the cluster this machine belongs to).

    Raises
    ------
    PlanError
        workers below 1, or no Ray cluster answering at `ray_address`.
    DependencyError
        A Ray address given and ray not installed.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise PlanError(f"worker count {workers!r} is not a count: give a whole number >= 1", subject="workers")
    return RayRunner(ray_address) if ray_address is not None else PoolRunner(workers)


def run_jobs(runner: Runner, jobs: Iterable[tuple[int, Job]], in_flight: int) -> Iterator[Done]:
    """Run `jobs` (key, job) with at most `in_flight` running at once, yielding each as it ends."""
    pending = iter(jobs)
    for key, job in pending:
        runner.submit(key, job)
        if runner.in_flight >= in_flight:
            yield runner.next_done()
    while runner.in_flight:
        yield runner.next_done()


def _unpack(key: int, outcome: tuple[Any, str | None]) -> Done:
    value, error = outcome
    return Done(key, value, error)


class PoolRunner:
    """Jobs in a local ProcessPoolExecutor of `workers` processes."""

    def __init__(self, workers: int) -> None:
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method))
        self.futures: dict[Future[tuple[Any, str | None]], int] = {}

    @property
    def in_flight(self) -> int:
        return len(self.futures)

    def submit(self, key: int, job: Job) -> None:
        self.futures[self.pool.submit(call_job, *job)] = key

    def next_done(self) -> Done:
        done, _ = wait(list(self.futures), return_when=FIRST_COMPLETED)
        # Of several ended together, the least key first: the order a caller sees then depends less on timing.
        future = min(done, key=lambda f: self.futures[f])
        key = self.futures.pop(future)
        try:
            return _unpack(key, future.result())
        except BrokenProcessPool:
            raise PlanError("a worker process ended abruptly (killed, or out of memory) while jobs ran: the shapes "
                            "finished so far are in the results file; run again with it to go on") from None

    def close(self, abort: bool) -> None:
        if abort:
            for future in self.futures:
                future.cancel()
            # A job in flight would otherwise run to its end (a whole solve) after an interrupt.
            # (Python 3.14 has terminate_workers(); before it, the pool's own table of its processes.)
            for process in list((getattr(self.pool, "_processes", None) or {}).values()):
                process.terminate()
        self.pool.shutdown(wait=not abort, cancel_futures=abort)
        self.futures.clear()


def require_ray() -> ModuleType:
    """The ray module, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise DependencyError(f"running shapes on a Ray cluster needs ray, which is not installed: {RAY_HINT}") \
            from None
    return ray


def check_reachable(address: str) -> None:
    """Fail fast on a host:port nothing listens at: ray.init would otherwise wait minutes for it."""
    found = re.fullmatch(r"(?:ray://)?\[?([^\]]+?)\]?:(\d+)", address.strip())
    if found is None:
        return  # "auto", or a form ray resolves itself
    try:
        socket.create_connection((found.group(1), int(found.group(2))), timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise _unreachable(address, f"{exc.strerror or type(exc).__name__}") from None


def _unreachable(address: str, why: str) -> PlanError:
    return PlanError(f"no Ray cluster answers at {address} ({why}): start one there (ray start, head node) or give "
                     "the address of a running one, or 'auto' on one of its nodes", subject="ray_address")


class RayRunner:
    """Jobs as tasks on a running Ray cluster, one CPU each."""

    def __init__(self, address: str) -> None:
        self.ray = require_ray()
        check_reachable(address)
        self.started = not self.ray.is_initialized()
        if self.started:
            try:
                self.ray.init(address=address, log_to_driver=False, logging_level="ERROR")
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise _unreachable(address, " ".join(str(exc).split())[:200]) from None
        self.remote = self.ray.remote(num_cpus=1)(call_job)
        self.refs: dict[Any, int] = {}

    @property
    def in_flight(self) -> int:
        return len(self.refs)

    def submit(self, key: int, job: Job) -> None:
        self.refs[self.remote.remote(*job)] = key

    def next_done(self) -> Done:
        ready, _ = self.ray.wait(list(self.refs), num_returns=1)
        ref = ready[0]
        return _unpack(self.refs.pop(ref), self.ray.get(ref))

    def close(self, abort: bool) -> None:
        if abort:
            for ref in self.refs:
                self.ray.cancel(ref, force=True)
        self.refs.clear()
        if self.started:
            self.ray.shutdown()

"""Running under torchrun: which process this is, where it computes, and how it joins the others.

torchrun (torch.distributed.run) starts the same command once per rank and tells each process who it
is in its environment: RANK and WORLD_SIZE (over every node), LOCAL_RANK (on this node), and
MASTER_ADDR/MASTER_PORT (where rank 0 listens). `zbsearch run`, `calibrate` and `profile` read that
environment when it is there: each process runs one rank instead of starting its own workers, joins the
process group from it (init_method env://), computes on cuda:LOCAL_RANK with nccl (the CPU with gloo),
and only rank 0 reports and writes files.

Also here, because both the profiler (the link between two nodes) and `run`'s calibration (the message
table) time it: a ping-pong between ranks 0 and 1 over a process group, as torch's pipelining runtime
sends (isend/irecv). torch is passed in; nothing here imports it.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Mapping, Sequence

from ..core.errors import RunError

if TYPE_CHECKING:
    import torch

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
PING_REPEATS = 20  # timed round trips per size, after 3 untimed ones
# The profiler's link probe: one message this large is dominated by bandwidth, not latency, on any link a
# pipeline runs over (64 MiB: 2.7 ms at 200 Gb/s, 30 us of latency is 1%).
LINK_PROBE_BYTES = 64 * 2**20
LINK_PROBE_REPEATS = 5


@dataclass(frozen=True)
class Torchrun:
    """This process's place among torchrun's processes."""

    rank: int
    world_size: int
    local_rank: int
    master: str  # MASTER_ADDR:MASTER_PORT, for messages

    @property
    def leader(self) -> bool:
        """Rank 0: the process that reports and writes files."""
        return self.rank == 0

    def device(self, backend: str) -> str:
        """Where this rank computes: cuda:LOCAL_RANK with nccl, the CPU with gloo."""
        return f"cuda:{self.local_rank}" if backend == "nccl" else "cpu"

    def init_group(self, backend: str, timeout_s: float) -> ModuleType:
        """Join torchrun's process group (env://); returns torch.distributed."""
        import torch.distributed as dist  # defers torch: only a process that computes needs it

        dist.init_process_group(backend, init_method="env://", rank=self.rank, world_size=self.world_size,
                                timeout=timedelta(seconds=timeout_s))
        return dist


def torchrun_env(environ: Mapping[str, str] | None = None) -> Torchrun | None:
    """The torchrun environment of this process, or None when it was not started by torchrun (or a
    launcher that sets the same variables, as Slurm recipes do).

    Raises
    ------
    RunError
        Some of the variables are set but not all, or one is not a whole number in range.
    """
    env = os.environ if environ is None else environ
    present = [k for k in TORCHRUN_VARIABLES if k in env]
    if not present:
        return None
    missing = [k for k in TORCHRUN_VARIABLES if k not in env]
    if missing:
        raise RunError(f"environment variable {missing[0]} is not set but {present[0]} is: start the command with "
                       "torchrun, which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, or unset "
                       f"{', '.join(present)} to run on this machine alone")
    numbers = {}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        try:
            numbers[key] = int(env[key])
        except ValueError:
            raise RunError(f"environment variable {key}={env[key]!r} is not a whole number: start the command "
                           "with torchrun") from None
    if numbers["WORLD_SIZE"] < 1 or not 0 <= numbers["RANK"] < numbers["WORLD_SIZE"] or numbers["LOCAL_RANK"] < 0:
        raise RunError(f"environment variables RANK={numbers['RANK']}, WORLD_SIZE={numbers['WORLD_SIZE']}, "
                       f"LOCAL_RANK={numbers['LOCAL_RANK']} are out of range: start the command with torchrun")
    return Torchrun(numbers["RANK"], numbers["WORLD_SIZE"], numbers["LOCAL_RANK"],
                    f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}")


def reports_here() -> bool:
    """Whether this process prints and writes: always, unless torchrun started it as a rank other than 0."""
    env = torchrun_env()
    return env is None or env.leader


def host() -> str:
    return socket.gethostname()


def pingpong(torch: ModuleType, dist: ModuleType, rank: int, sizes: Sequence[int], device: torch.device,
             repeats: int = PING_REPEATS) -> list[list[float]]:
    """[[bytes, one-way seconds], ...]: half the median round trip of a message between ranks 0 and 1
    (isend/irecv and wait, as torch's pipelining runtime sends), for every size, on rank 0 (other
    ranks only wait, and get an empty list)."""
    out = []
    for nbytes in sizes:
        buf = torch.zeros(max(1, int(nbytes) // 4), dtype=torch.float32, device=device)
        times = []
        for i in range(repeats + 3):
            dist.barrier()
            if rank > 1:
                continue
            t0 = time.perf_counter()
            if rank == 0:
                dist.isend(buf, 1).wait()
                dist.irecv(buf, 1).wait()
            else:
                dist.irecv(buf, 0).wait()
                dist.isend(buf, 0).wait()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= 3:
                times.append(time.perf_counter() - t0)
        if rank == 0:
            out.append([float(buf.numel() * 4), statistics.median(times) / 2])
    return out


def measure_link(env: Torchrun, device: torch.device, timeout_s: float = 600.0) -> tuple[float, str] | None:
    """The link between torchrun's ranks 0 and 1 (across nodes when they are on two), timed by a ping-pong
    of LINK_PROBE_BYTES: (Gb/s, where the number comes from) on rank 0; None on the other ranks, and with
    a single process. Every rank must call it: each joins the ping-pong, then the group is left."""
    if env.world_size < 2:
        return None
    import torch  # defers torch: only the measured profiler calls this

    dist = env.init_group("nccl" if device.type == "cuda" else "gloo", timeout_s)
    try:
        times = pingpong(torch, dist, env.rank, [LINK_PROBE_BYTES], device, repeats=LINK_PROBE_REPEATS)
        hosts: list[str | None] = [None] * env.world_size  # each rank's host once gathered
        dist.all_gather_object(hosts, host())
    finally:
        dist.destroy_process_group()
    if not env.leader:
        return None
    nbytes, seconds = times[0]
    return nbytes * 8 / seconds / 1e9, (f"measured: ping-pong of {nbytes:.0f} bytes between torchrun ranks 0 "
                                        f"({hosts[0]}) and 1 ({hosts[1]}), half the median of "
                                        f"{LINK_PROBE_REPEATS} round trips")

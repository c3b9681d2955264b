"""Calibrate a profile against torch's pipelining runtime on this machine: the runtime's own cost per
action and the time of a message by its size (core/calibration.py says how plans use them).

One run of `runtime.run` on the profile's rank count does both:
- messages: before the steps, ranks 0 and 1 time a ping-pong (profiling/distributed.pingpong) for sizes from 256 bytes to
  well past the largest activation the profile sends; half the median round trip is the one-way time;
- per-action overhead: a pipeline whose compute is negligible (the float64 `mlp` test model, one
  Linear+Tanh per chunk) runs ZB-H1 for `steps` timed iterations. Its pure compute (F, torch's I and W
  and the fused backward, timed alone in this process through the runtime's own backward functions)
  and its hops (the message table at its activation size) go into the simulator, and the overhead is
  the value per action that makes the simulated makespan equal the measured median step time
  (bisection; the makespan only grows with it). Whatever the runtime adds beyond compute and the
  messages' time (action dispatch, posting and waiting on sends and receives, the stage's bookkeeping)
  lands there, spread evenly over the actions.

torch is imported only when a calibration runs. Run from a script guarded by `if __name__ == "__main__":`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any

from ...core.calibration import CommTable, comm_time
from ...core.errors import RunError
from ...core.profile import Profile
from ...core.stage_cost import StageCost
from ...schedules import generate
from ...sim.simulate import simulate
from .model import seconds_per_unit
from .small_models import build_chunks
from .launcher import run

CALIBRATION_SCHEDULE = "zb-h1"
SMALLEST_MESSAGE = 256
MICROBATCH_SIZE = 2  # rows of the mlp's input per microbatch (runtime.run's default)
MLP_MESSAGE_BYTES = MICROBATCH_SIZE * 16 * 8  # one float64 activation of the mlp (small_models.MLP_WIDTH = 16)


def message_sizes(profile: Profile) -> tuple[int, ...]:
    """Sizes to time: powers of 4 from 256 bytes to 4 times the largest activation the profile's layers
    hand on (at least 1 MiB), and the mlp's own message.

    >>> message_sizes(Profile.from_dict({"stages": [{"F": 1, "B": 1, "W": 1}] * 2,
    ...     "source": {"kind": "estimated", "method": "doctest"}}))
    (256, 1024, 4096, 16384, 65536, 262144, 1048576)
    """
    biggest = max((layer.out_bytes for layer in profile.layers or ()), default=0.0)
    top, sizes, size = max(4 * biggest, 2 ** 20), {MLP_MESSAGE_BYTES}, SMALLEST_MESSAGE
    while size <= top:
        sizes.add(size)
        size *= 4
    return tuple(sorted(sizes))


def pure_compute(device: str = "cpu", repeats: int = 50) -> dict[str, float]:
    """Seconds of one mlp chunk's F, I, W and fused backward (median of `repeats`), timed alone through
    torch's pipelining backward functions, with one CPU thread (on a GPU, synchronized around each)."""
    import torch

    # defers torch, which measuring needs
    from ...profiling.measure import torch_backward_functions

    backward, saved = torch_backward_functions(), torch.get_num_threads()
    torch.set_num_threads(1)
    dev = torch.device("cuda:0" if device == "cuda" else "cpu")
    try:
        chunk = build_chunks("mlp", 1, 0)[0].to(dev)
        x = torch.randn(MICROBATCH_SIZE, 16, dtype=torch.float64, device=dev, requires_grad=True)
        grad = [torch.randn(MICROBATCH_SIZE, 16, dtype=torch.float64, device=dev)]
        samples: dict[str, list[float]] = {"F": [], "I": [], "W": [], "B": []}
        def now() -> float:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            return time.perf_counter()

        for i in range(repeats + 5):
            t = [now()]
            out = chunk(x)
            t.append(now())
            _, groups = backward.input([out], grad, [x], iter(list(chunk.parameters())))
            t.append(now())
            backward.weight(iter(list(chunk.parameters())), groups)
            t.append(now())
            out = chunk(x)
            t.append(now())
            backward.full([out], grad, [x])
            t.append(now())
            if i >= 5:
                for key, (a, b) in zip(("F", "I", "W"), zip(t, t[1:])):
                    samples[key].append(b - a)
                samples["B"].append(t[5] - t[4])
        return {k: statistics.median(v) for k, v in samples.items()}
    finally:
        torch.set_num_threads(saved)


def fit_overhead(schedule: Any, compute: dict[str, float], hop: float, measured: float) -> float:
    """The per-action overhead (seconds) at which the simulated makespan of `schedule` (its first stage as
    torch runs it: I empty, W the fused backward) equals `measured`; 0 when compute alone exceeds it."""
    p = schedule.num_ranks
    first = StageCost(compute["F"], 0.0, compute["B"], full_backward=compute["B"])
    other = StageCost(compute["F"], compute["I"], compute["W"], full_backward=compute["B"])
    base = Profile("calibration", (first,) + (other,) * (p - 1), (hop,) * (p - 1), schedule.num_microbatches,
                   {"kind": "measured", "device": "calibration", "date": "now"}, time_unit="s")

    def makespan(overhead: float) -> float:
        return simulate(schedule, replace(base, action_overhead=overhead)).makespan

    low, high = 0.0, measured
    if makespan(low) >= measured:
        return 0.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if makespan(mid) < measured else (low, mid)
    return (low + high) / 2


def calibrate(profile: Profile, *, backend: str = "gloo", device: str | None = None, steps: int = 20,
              warmup: int = 3, timeout_s: float = 300.0, memory_model: str | None = None,
              pin_cpu: bool = True) -> Profile:
    """`profile` with `action_overhead` and `comm_table` measured on this machine (in its time unit), its
    comm recomputed from the table at each boundary's activation size, and `details["calibration"]`
    saying how. `memory_model` (when given) is set too. `pin_cpu`: pin rank r to the r-th CPU, as the
    fidelity study runs (runtime.run).

    Raises
    ------
    RunError
        The profile has one stage (nothing to send), its time unit is not a known one (us, ms, s, ns), or
        the calibration run fails or times out.
    """

    p, unit = profile.num_stages, seconds_per_unit(profile)
    if p < 2:
        raise RunError(f"profile {profile.label} has 1 stage: calibrating needs at least 2 ranks to send between")
    if unit is None:
        raise RunError(f"profile {profile.label} has time unit {profile.time_unit!r}: calibrating needs a known "
                       "unit (us, ms, s or ns) to convert what it measures")
    schedule = generate(CALIBRATION_SCHEDULE, p, 4 * p)
    result = run(schedule, model="mlp", steps=steps, warmup=warmup, backend=backend, device=device,
                 timeout_s=timeout_s, pingpong_sizes=message_sizes(profile), pin_cpu=pin_cpu)
    seconds: CommTable = tuple((float(b), float(t)) for b, t in result.details["pingpong"])
    compute = pure_compute(result.device)
    measured = result.measured_step_seconds
    overhead = fit_overhead(schedule, compute, comm_time(seconds, MLP_MESSAGE_BYTES), measured)
    table = tuple((b, t / unit) for b, t in seconds)
    out = replace(profile, action_overhead=overhead / unit, comm_table=table,
                  memory_model=memory_model or profile.memory_model)
    out = replace(out, comm=_stage_comm(out))
    pinned = "rank r pinned to CPU r" if pin_cpu else "not pinned"
    info = {"method": (f"zbsearch calibrate: {p} processes ({backend}, {result.device}, one torch thread each, "
                       f"{pinned}); messages: ping-pong "
                       "between ranks 0 and 1, half the median round trip; action overhead: fitted so that the "
                       f"simulator reproduces the median step time of {CALIBRATION_SCHEDULE} (m={4 * p}) on a "
                       "float64 Linear+Tanh chunk per stage, its pure compute timed alone"),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "steps": steps, "warmup": warmup,
            "measured_step_s": measured, "step_s": result.step_seconds, "pure_compute_s": compute,
            "action_overhead_s": overhead}
    return replace(out, details={**profile.details, "calibration": info})


def _stage_comm(profile: Profile) -> tuple[float, ...]:
    """Each stage boundary's hop from the message table: the out_bytes of the last layer of each stage
    (the profiler's split), else details.boundary_bytes, else the profile's comm unchanged."""
    names = profile.stage_split
    by_name = {layer.name: layer for layer in profile.layers or ()}
    sizes: list[float] | None = None
    if names is not None and len(names) == profile.num_stages and all(s and s[-1] in by_name for s in names):
        sizes = [by_name[s[-1]].out_bytes for s in names[:-1]]
    elif isinstance(profile.details.get("boundary_bytes"), list):
        sizes = [float(b) for b in profile.details["boundary_bytes"]]
    if sizes is None or len(sizes) != profile.num_stages - 1:
        return profile.comm
    return tuple(profile.message_time(b) or 0.0 for b in sizes)

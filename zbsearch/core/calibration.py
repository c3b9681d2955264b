"""What a runtime adds to the profile's pure compute, and what it really holds: the calibration fields
of a profile and the one rule that turns a chunk's measured cost into the cost of running it.

- `action_overhead` (time units per action): the runtime's own cost of every action it executes
  (torch's `_PipelineScheduleRuntime`: looking the action up, posting its sends and receives, the
  stage's bookkeeping), on top of the pass's compute. A fused backward is one action, so it pays it
  once where I then W pay it twice; an overlapped F&B pair is one action too.
- `comm_table`: measured one-way time of a message by its size, as points (bytes, time); a hop's time
  is read off it by linear interpolation (below the smallest size: that size's time, the latency; above
  the largest: the last segment extended).
- `memory_model`: "paper" (the Zero Bubble paper's accounting: F holds mem_B, B frees mem_B - mem_W, W
  frees mem_W) or "torch-runtime" (what torch's pipelining runtime holds: from F until its I a chunk
  keeps `mem_B_torch`, the saved tensors plus the stage output it caches; from I until W `mem_W_torch`,
  which is more than mem_B under torch's split backward, since I keeps the whole autograd graph alive and
  adds the gradients it stores for W). Without measured torch figures a chunk's mem_B stands for
  mem_B_torch and mem_B + mem_W for mem_W_torch (an upper bound: every saved tensor plus everything W
  needs). torch also keeps every stage's output (through its send) and every microbatch's loss until
  the step ends, and with them whatever of the graph W did not free: `mem_kept_torch`, held from W
  until the end of the iteration (not on the first stage, whose whole backward torch runs at once).

`running_cost` is the only place these meet a chunk's cost: Profile.chunk_cost applies it, so the
simulator, the heuristics, the bounds and CP-SAT all read the same durations and memory.
"""

from __future__ import annotations

import bisect
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

from .errors import ProfileError
from .stage_cost import StageCost

if TYPE_CHECKING:
    from .layers import Layer

MEMORY_MODELS = ("paper", "torch-runtime")
CommTable = tuple[tuple[float, float], ...]


def parse_comm_table(origin: str, raw: Sequence[dict[str, Any]]) -> CommTable:
    """(bytes, time) points from a schema-checked `comm_table`, checked: sizes strictly increasing."""
    points = tuple((float(p["bytes"]), float(p["time"])) for p in raw)
    for i in range(1, len(points)):
        if points[i][0] <= points[i - 1][0]:
            raise ProfileError(f"{origin}: field comm_table[{i}].bytes ({points[i][0]:g}) is not above "
                               f"comm_table[{i - 1}].bytes ({points[i - 1][0]:g}); list the points by increasing "
                               "message size, each size once")
    return points


def comm_time(table: CommTable, nbytes: float) -> float:
    """One message's time by its size: linear between the measured points, the smallest size's time
    below it, the last segment extended above the largest (never below the largest point's time).

    >>> table = ((1000.0, 10.0), (3000.0, 30.0))
    >>> comm_time(table, 500), comm_time(table, 2000), comm_time(table, 5000)
    (10.0, 20.0, 50.0)
    """
    sizes = [b for b, _ in table]
    if nbytes <= sizes[0] or len(table) == 1:
        return table[0][1] if nbytes <= sizes[0] else max(t for _, t in table)
    k = min(bisect.bisect_left(sizes, nbytes), len(table) - 1)
    (b0, t0), (b1, t1) = table[k - 1], table[k]
    value = t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)
    return max(value, table[-1][1]) if nbytes > sizes[-1] else value


def torch_memory(cost: "StageCost") -> tuple[float, float]:
    """(held from F until I, held from I until W) under torch's runtime: the measured figures, else
    mem_B and mem_B + mem_W (see the module docstring)."""
    held_b = cost.mem_B_torch if cost.mem_B_torch is not None else cost.mem_B
    held_w = cost.mem_W_torch if cost.mem_W_torch is not None else cost.mem_B + cost.mem_W
    return held_b, held_w


def running_cost(cost: "StageCost", overhead: float, memory_model: str) -> "StageCost":
    """A chunk's cost as it runs: `overhead` added to every action (once to a fused backward and to an
    overlapped pair), and its memory under `memory_model`. Under torch-runtime mem_W may exceed mem_B:
    I then adds mem_W - mem_B at its end (sim.rank_state.memory_delta)."""
    if cost.without_recompute is not None:
        cost = replace(cost, without_recompute=running_cost(cost.without_recompute, overhead, memory_model))
    if memory_model == "torch-runtime":
        held_b, held_w = torch_memory(cost)
        cost = replace(cost, mem_B=held_b, mem_W=held_w, mem_kept=cost.mem_kept_torch)
    if overhead:
        cost = replace(cost, F=cost.F + overhead, B=cost.B + overhead, W=cost.W + overhead,
                       full_backward=cost.BW + overhead,
                       overlap_f_b=None if cost.overlap_f_b is None else cost.overlap_f_b + overhead)
    return cost


def kept_after_w(layers: Sequence[Layer], first: bool, loss: bool) -> float | None:
    """What a chunk of these layers (core.layers.Layer) keeps under torch's runtime from W until the
    iteration ends: nothing on the first stage (its whole backward runs at once), the loss chunk's
    measured shares (mem_kept_loss_torch), else each layer's own (mem_kept_torch); None when not measured."""
    if first:
        return 0.0
    values = [layer.mem_kept_loss_torch if loss else layer.mem_kept_torch for layer in layers]
    known = [v for v in values if v is not None]
    return None if len(known) < len(values) else float(sum(known))


def torch_chunk_memory(saved: Sequence[float], kept: Sequence[float | None], out_bytes: float,
                       first_stage: bool = False) -> tuple[float, float | None]:
    """(mem_B_torch, mem_W_torch) of a chunk of layers under torch's runtime, from each layer's saved
    bytes (`saved`), what its split backward keeps from I until W (`kept`, None where not measured) and
    the bytes of the chunk's output. The stage caches its output from F until I, and from I until W
    keeps that output and the gradient it received. On the first stage torch's I does nothing (W runs
    the whole backward), so it keeps its graph and adds the received gradient.

    >>> torch_chunk_memory([100.0, 200.0], [150.0, 250.0], 10.0)
    (310.0, 420.0)
    >>> torch_chunk_memory([100.0], [None], 10.0, first_stage=True)
    (110.0, 120.0)
    """
    held_b = float(sum(saved)) + out_bytes
    if first_stage:
        return held_b, held_b + out_bytes
    if any(k is None for k in kept):
        return held_b, None
    return held_b, float(sum(k or 0.0 for k in kept)) + 2 * out_bytes


def check_memory_model(origin: str, value: Any) -> str:
    if value not in MEMORY_MODELS:
        raise ProfileError(f"{origin}: field memory_model is {value!r}; use one of {', '.join(MEMORY_MODELS)}")
    return value

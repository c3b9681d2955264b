"""Which model `run` executes when it runs the model a profile was made from, and how it is cut.

A profile written by the profiler records its model in `details.model` (the built-in GPT's shape, or a
`package.module:factory`), its dtype, its layers (`details.layers`, with per-layer costs) and the stage
split (`details.partition.layers_per_stage`, layer names per stage). `plan_profiled_model` turns that,
and the schedule, into a `ModelPlan`: the layer names of every global chunk, the dtype, and whether the
gradients are checked. Layers are matched by the names the profile lists, never by a naming pattern.

The cut, first match wins:
1. the schedule's plan record's split (`plan.split.chunks`): one list of layer names per global chunk;
2. the profile's `layers_per_stage`, when the schedule has one chunk per rank;
3. on chunked placements (interleaved, V), the profile's layers, in order, cut into the schedule's chunk
   count by the profiler's exact linear-partition DP on the per-layer F + B + W.

`predicted_profile` gives the costs the run is compared with: the profile's stages when the cut is the
profile's own, else per-chunk sums of its per-layer costs. Needs torch only to list a model's layers.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any, Sequence

from ...core.calibration import torch_chunk_memory
from ...core.errors import RunError, ScheduleError, ZbsearchError
from ...core.ir import Schedule
from ...core.layers import Layer
from ...core.partition import summed
from ...core.profile import Profile
from ...core.stage_cost import StageCost
from ...core.recompute.levels import plan_levels, with_recompute
from ...profiling.partition import linear_partition
from ...profiling.request import GptShape

DTYPES = ("fp32", "bf16", "fp16")
# Default gradient check: on when the model has at most this many parameters (a float64 copy of the
# whole model runs in every process), off above; `check=True` forces it.
CHECK_MAX_PARAMETERS = 20_000_000
# Largest relative L2 error of a gradient (and of the loss) against the float64 reference, per dtype.
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 2e-2}
UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


@dataclass(frozen=True)
class ModelPlan:
    """The profiled model as every process rebuilds it (pickled to the workers)."""

    kind: str  # "gpt" or "factory"
    spec: Any  # gpt: the GptShape fields plus attention; factory: "package.module:factory"
    chunks: tuple[tuple[str, ...], ...]  # layer names of every global chunk, in model order
    dtype: str  # fp32, bf16 or fp16
    check: bool  # compare gradients with a float64 single-process reference
    cut: str  # where the chunks come from, in words
    label: str  # the model in a few words
    sys_path: tuple[str, ...] = ()  # where the launcher found a factory's module; the workers look there too
    recompute: tuple[tuple[str, str], ...] = ()  # (layer name, full or selective): the plan's recomputed layers
    # per global chunk, the microbatches whose passes recompute that chunk's layers; None: all of them
    recompute_microbatches: tuple[frozenset[int] | None, ...] | None = None

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype]


def _model_record(profile: Profile) -> dict[str, Any]:
    record = profile.details.get("model")
    if not isinstance(record, dict) or not isinstance(record.get("model"), str):
        raise RunError(f"profile {profile.label} records no model in details.model (only profiles written by "
                       "zbsearch profile do): run one of the built-in test models, mlp or gpt-tiny, next to it")
    return record


def layer_names(kind: str, spec: Any, seed: int) -> list[str]:
    """The model's layers, named as the profiler names them (building a factory's model once)."""
    # defers torch: planning a run reads the model's layer names only when asked
    from ...profiling.models import gpt_layers, load_factory

    if kind == "gpt":
        shape = GptShape(**{k: v for k, v in spec.items() if k != "attention"})
        return [name for name, _ in gpt_layers(shape, spec.get("attention", "naive"), seed)[0]]
    import torch

    torch.manual_seed(seed)
    return [name for name, _ in load_factory(spec)[0]]


def _model(profile: Profile, seed: int) -> tuple[str, Any, str, list[str]]:
    """(kind, spec, label, layer names) of the profile's model; errors name details.model."""

    record = _model_record(profile)
    where = f"profile {profile.label} details.model"
    kind = "gpt" if record["model"] == "gpt" else "factory"
    try:
        if kind == "gpt":
            fields = set(GptShape.__dataclass_fields__)
            spec = {k: v for k, v in record.items() if k in fields or k == "attention"}
            label = GptShape(**{k: v for k, v in spec.items() if k != "attention"}).label()
        else:
            spec = label = record["model"]
        return kind, spec, label, layer_names(kind, spec, seed)
    except ZbsearchError as exc:
        message = str(exc)
        fix = ("; run from the folder that holds its module, or put that folder on PYTHONPATH"
               if "cannot import" in message else
               "; fix the factory so that it builds the model" if "the factory raised" in message else "")
        raise RunError(f"{where}: {message}{fix}") from None


def _profile_stages(profile: Profile) -> list[list[str]]:
    stages = profile.stage_split
    if stages is None:
        raise RunError(f"profile {profile.label} has no details.partition.layers_per_stage (layer names per "
                       "stage): profile the model again with this zbsearch")
    return [[str(n) for n in s] for s in stages]


def _layers(profile: Profile) -> dict[str, Layer]:
    """The profile's per-layer costs by name (none for a profile without layers)."""
    return {layer.name: layer for layer in profile.layers or ()}


def _plan_chunks(schedule: Schedule) -> list[list[str]] | None:
    split = schedule.plan.split
    if split is None:
        return None
    n = schedule.placement.num_chunks
    if split.num_chunks != n:
        raise RunError(f"schedule {schedule.name!r} plan.split.chunks has {split.num_chunks} chunks but the schedule "
                       f"has {n}: give one list of layer names per chunk")
    return [list(c) for c in split.chunks]


def cut_chunks(schedule: Schedule, profile: Profile) -> tuple[list[list[str]], str]:
    """The layer names of every global chunk, and where they come from (see the module docstring)."""
    planned = _plan_chunks(schedule)
    if planned is not None:
        return planned, "the schedule's plan.split.chunks"
    stages = _profile_stages(profile)
    p, n = schedule.num_ranks, schedule.placement.num_chunks
    if len(stages) != p:
        raise RunError(f"profile {profile.label} details.partition.layers_per_stage has {len(stages)} stages but "
                       f"schedule {schedule.name!r} has {p} ranks: profile the model with {p} stages, or run a "
                       f"schedule for {len(stages)} ranks")
    if n == p:
        return stages, "the profile's stages"
    names = [name for stage in stages for name in stage]
    if len(names) < n:
        raise RunError(f"profile {profile.label} partition has {len(names)} layers but schedule {schedule.name!r} has "
                       f"{n} chunks: every chunk needs at least one layer; run a schedule with at most "
                       f"{len(names)} chunks, or profile a model with more layers")
    costs = _layers(profile)
    weights = [costs[x].work if x in costs else 1.0 for x in names]
    counts = linear_partition(weights, n)
    starts = [sum(counts[:c]) for c in range(n)]
    return ([names[s:s + k] for s, k in zip(starts, counts)],
            f"the profile's layers cut into {n} chunks by the linear-partition DP on per-layer F + B + W")


def _check_chunks(chunks: Sequence[Sequence[str]], names: list[str], where: str, label: str) -> None:
    known = set(names)
    for c, chunk in enumerate(chunks):
        if not chunk:
            raise RunError(f"{where}: chunk {c} has no layers: every chunk needs at least one layer")
        unknown = [x for x in chunk if x not in known]
        if unknown:
            raise RunError(f"{where}: chunk {c} names layer {unknown[0]!r}, which model {label} does not have "
                           f"(its layers: {', '.join(names[:4])}{', ...' if len(names) > 4 else ''}): "
                           "name its layers as the profile lists them")
    flat = [x for chunk in chunks for x in chunk]
    if flat != names:
        raise RunError(f"{where}: the chunks list {len(flat)} layers but model {label} has {len(names)} "
                       f"({names[0]} ... {names[-1]}): list every layer once, in model order")


def plan_profiled_model(schedule: Schedule, profile: Profile, check: bool | None = None,
                        seed: int = 0) -> ModelPlan:
    """The model `profile` was made from, cut into the schedule's chunks, in the profile's dtype.

    `check` None: check the gradients when the model has at most CHECK_MAX_PARAMETERS parameters.

    Raises
    ------
    RunError
        The profile records no model, its factory cannot be imported or raises, the cut does not fit the
        schedule (stage or chunk counts, fewer layers than chunks, unknown layer names), or its dtype is
        not one torch runs.
    """
    kind, spec, label, names = _model(profile, seed)
    chunks, cut = cut_chunks(schedule, profile)
    where = f"schedule {schedule.name!r} plan.split.chunks" if "plan" in cut else \
        f"profile {profile.label} details.partition"
    _check_chunks(chunks, names, where, label)
    dtype = profile.details.get("dtype") or profile.source.get("dtype") or "fp32"
    if dtype not in DTYPES:
        raise RunError(f"profile {profile.label} dtype {dtype!r} is not one the run supports: use one of "
                       f"{', '.join(DTYPES)}")
    if check is None:
        params = sum(layer.params or 0 for layer in profile.layers or ())
        check = params <= CHECK_MAX_PARAMETERS
    levels, microbatches = plan_recompute(schedule, chunks, kind, spec)
    return ModelPlan(kind, spec, tuple(tuple(c) for c in chunks), dtype, check, cut, label, tuple(sys.path),
                     tuple(sorted(levels.items())), microbatches)


def plan_recompute(schedule: Schedule, chunks: Sequence[Sequence[str]], kind: str,
                   spec: Any) -> tuple[dict[str, str], tuple[frozenset[int] | None, ...] | None]:
    """The layers the schedule recomputes (its plan record's levels: layer name -> full or selective) and,
    per chunk, the microbatches that recompute it (the record's recompute_microbatches; absent, or None
    for a chunk: every microbatch).

    Raises
    ------
    RunError
        A level other than full or selective, a layer no chunk holds, or selective on a layer without the
        built-in GPT's unfused attention core.
    """
    where = f"schedule {schedule.name!r} plan"
    held = {x for chunk in chunks for x in chunk}
    try:
        levels = plan_levels(schedule.plan, schedule.name, held, "no chunk of the run holds: name the layers of "
                             "plan.split.chunks")
    except ScheduleError as exc:
        raise RunError(str(exc)) from None
    attention = spec.get("attention", "naive") if kind == "gpt" else None
    blocks = {x for chunk in chunks for x in chunk if x.startswith("layers.")} if attention == "naive" else set()
    for name, level in levels.items():
        if level == "selective" and name not in blocks:
            raise RunError(f"{where}.recompute gives layer {name!r} level selective, but only the built-in GPT's "
                           "blocks with naive attention have an attention core the run can recompute alone: use full")
    chosen = schedule.plan.recompute_microbatches
    if chosen is not None and len(chosen) != len(chunks):
        raise RunError(f"{where}.recompute_microbatches lists {len(chosen)} chunks but the run has {len(chunks)}: give "
                       "one entry per chunk")
    return dict(levels), chosen


def predicted_profile(schedule: Schedule, profile: Profile, plan: ModelPlan | None) -> tuple[Profile, str]:
    """The costs the run is compared with, and how they were obtained.

    The profile itself when the chunks are its stages and nothing is recomputed (or no plan); else
    per-chunk sums of its per-layer costs (stage 0 costed as torch runs it when the profile was: I empty,
    W the whole backward); else, without per-layer costs, each rank's stage split evenly over its chunks.
    The plan's recompute levels apply where it recomputes: each chunk also carries its cost without them,
    which the simulator gives the microbatches the plan does not recompute (its record's recompute_microbatches).
    """
    stages = profile.stage_split
    if plan is not None and plan.recompute and profile.layers is not None:
        # the plan's levels (as validate does); a profile that already carries them is left as it is
        profile = with_recompute(profile, dict(plan.recompute), restage=False)
    elif plan is None or (schedule.placement.num_chunks == schedule.num_ranks
                          and tuple(map(tuple, plan.chunks)) == stages):
        return profile, "the profile's stages"
    costs = _layers(profile)
    if not all(x in costs for chunk in plan.chunks for x in chunk):
        return profile, "each rank's profiled stage split evenly over its chunks"
    out = [summed([costs[x] for x in chunk], c == len(plan.chunks) - 1, c == 0) for c, chunk in enumerate(plan.chunks)]
    if profile.details.get("torch_stage0"):  # I does nothing on stage 0: W runs the whole backward
        group = [costs[x] for x in plan.chunks[0]]
        kept = out[0].without_recompute
        out[0] = replace(_as_torch_stage0(out[0], group), without_recompute=None if kept is None else
                         _as_torch_stage0(kept, [x.as_profiled or x for x in group]))
    return replace(profile, chunks=tuple(out)), "sums of the profile's per-layer costs over each chunk's layers"


def _as_torch_stage0(cost: StageCost, group: Sequence[Layer]) -> StageCost:
    """The first chunk's cost as torch runs it: no I, W the whole backward, the graph held until W."""
    torch_b, torch_w = torch_chunk_memory(
        [x.mem_B if x.mem_B_torch is None else x.mem_B_torch for x in group], [], group[-1].out_bytes, True)
    return replace(cost, B=0.0, W=cost.BW, mem_W=cost.mem_B, mem_B_torch=torch_b, mem_W_torch=torch_w)


def seconds_per_unit(profile: Profile | None) -> float | None:
    """Seconds in one of the profile's time units, when the unit is a known one (us, ms, s, ns)."""
    return None if profile is None else UNIT_SECONDS.get(profile.time_unit)

"""`shape_costs`: the costs of one pipeline of a run shape, as the joint search reads them, and the
data-parallel terms a step adds once its split is known.

The pipeline is one tensor-parallel rank's share of the model at b sequences per microbatch
(profiling.tensor_parallel.tp_shard), estimated from FLOP counts on the cluster's GPU at the workload's
MFU (profiling.build.profile_estimate), in p stages and m microbatches. parallel_layers.py then adds what
joins the ranks of a shape to its layers (tensor- and expert-parallel collectives, sequence-sharded
activations, experts per expert-parallel rank), data_parallel.py shards their static bytes, and each
pipeline boundary's hop is a message over the link the two stages share, given as the profile's `comm`
per boundary (no `link_bandwidth`): every split then pays boundary k's link at boundary k, since every
layer hands on the same b*s*h/t activation. The profile's `source.method` says all of it, with citations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable

from ...core.errors import PlanError, about
from ...core.memory import DEFAULT_HEADROOM, byte_cap
from ...core.partition import layers_by_stage, route_length, summed
from ...core.placement import AUTO_PLACEMENTS, parse_placement
from ...core.profile import Profile
from ...core.sharding import param_bytes
from ...profiling.build import profile_estimate
from ...profiling.estimate import estimate_layers
from ...profiling.hardware import gpu_spec
from ...profiling.presets import PRESETS
from ...profiling.request import DTYPE_BYTES, PipelineSetup, StageSplit
from ...profiling.tensor_parallel import tp_shard
from ...search.entry.request import PlanRequest
from .cluster import Cluster
from .collectives import CITATION
from .data_parallel import DataParallel, RankTraffic, reshard_gathers, sharded_layers, sharding_record
from .measured import measured_method, with_measured
from .parallel_layers import LayerParams, ep_block_comm, hop_times, shape_layers, tp_block_comm
from .shape import SHARDINGS, RunShape
from .workload import Workload


@dataclass(frozen=True)
class PlanChoices:
    """What the joint search is asked besides the shape (search.entry.PlanRequest's fields): by default the
    search chooses placement (among those the layers fill), split and recompute (per layer, every microbatch
    alike: what torchtitan and Megatron-LM run). `mem_limit` None: the GPU's capacity less `headroom` (the
    allocator's and NCCL's buffers) as a byte count, which caps static bytes and activations together on
    every split (`auto` would first check the static bytes of the profiler's own split). `schedules`: all (the
    joint search) or 1f1b-family (the baseline of family.py: 1F1B and interleaved 1F1B only)."""

    mem_limit: str | None = None
    placement: str = "auto"
    partition: str = "auto"
    recompute: str = "auto-layers"
    headroom: float = DEFAULT_HEADROOM
    allow_param_copies: bool = False
    schedules: str = "all"


@dataclass(frozen=True)
class ShapeCosts:
    """One pipeline of `shape`: the `profile` to plan on and the `request` to plan it with, each layer's
    parameters on one GPU (`params`, model order) and the data-parallel group (`data_parallel`), the GPU's
    memory, and the model FLOPs of a step (forward and backward of the global batch, the estimator's
    counts, no recompute) with one GPU's dense peak, for MFU."""

    shape: RunShape
    profile: Profile
    request: PlanRequest
    params: tuple[LayerParams, ...]
    data_parallel: DataParallel
    capacity_bytes: float
    usable_bytes: float  # what a plan may fill: the limit as a byte count
    flops_per_step: float
    peak_flops_per_us: float
    tokens_per_step: int

    def traffic(self, names: Iterable[str]) -> RankTraffic:
        """The data-parallel terms of a rank holding the named layers (a layer named twice, as on a
        placement with two model copies, counts twice)."""
        by_name = {own.name: own for own in self.params}
        held = [by_name[name] for name in names]
        return self.data_parallel.traffic(math.fsum(x.dense for x in held), math.fsum(x.expert for x in held))


def check_shape(workload: Workload, cluster: Cluster, shape: RunShape) -> None:
    """The shape fits the cluster and the workload: t p d GPUs, m b d sequences, ep dividing d."""
    if shape.gpus != cluster.gpus:
        raise PlanError(f"shape {shape.label()} uses {shape.gpus} GPUs but the cluster has {cluster.gpus}: choose "
                        "t, p and d with t x p x d equal to the GPUs", subject="shape")
    if shape.m * shape.b * shape.d != workload.global_batch:
        raise PlanError(f"shape {shape.label()} runs {shape.m * shape.b * shape.d} sequences a step but the global "
                        f"batch is {workload.global_batch}: choose m = global batch / (d x b)", subject="shape")
    if shape.sharding not in SHARDINGS:
        raise PlanError(f"sharding {shape.sharding!r} is not known: use one of {', '.join(SHARDINGS)}",
                        subject="sharding")
    if shape.ep < 1 or shape.d % shape.ep:
        raise PlanError(f"expert-parallel degree {shape.ep} does not divide the data-parallel degree {shape.d}: "
                        "expert-parallel ranks are drawn from the data-parallel ones", subject="ep")


def shape_costs(workload: Workload, cluster: Cluster, shape: RunShape, choices: PlanChoices = PlanChoices()) -> ShapeCosts:
    """The costs of one pipeline of `shape` (see the module).

    Raises
    ------
    PlanError
        The shape does not fit the cluster or the workload.
    ProfilerError, PartitionError
        t does not split the model's heads and FFN, or p exceeds its blocks (from profiling).
    """
    check_shape(workload, cluster, shape)
    model = workload.at_micro_batch(shape.b)
    with about("tp"):
        share = tp_shard(model, shape.t)
    with about("pp"):
        estimated = profile_estimate(share, cluster.gpu, StageSplit(stages=shape.p),
                                     PipelineSetup(microbatches=shape.m, optimizer=workload.optimizer),
                                     mfu=workload.mfu, dtype=workload.dtype, attention=workload.attention,
                                     preset=PRESETS.get(workload.preset or ""),
                                     name=f"{model.label()} {shape.label()} on {cluster.gpus} {cluster.gpu}")
    estimated, measured = with_measured(estimated, workload.measured, share, workload.dtype, cluster.gpu)
    layers, params = shape_layers(estimated.layers or (), workload, shape, share, cluster)
    spec = gpu_spec(cluster.gpu)
    dp = DataParallel(shape.sharding, shape.d, shape.ep, shape.m, cluster.link_for(shape.t * shape.d),
                      param_bytes(DTYPE_BYTES[workload.dtype], workload.optimizer), spec.memory_bandwidth / 1e6)
    layers = reshard_gathers(sharded_layers(layers, params, dp), params, dp)
    hops = hop_times(shape, share, workload.dtype, cluster)
    profile = _restaged(estimated, layers, hops, cluster.capacity)
    profile = _described(profile, workload, cluster, shape, dp, measured)
    usable = cluster.capacity * (1 - choices.headroom)
    limit = choices.mem_limit if choices.mem_limit is not None else f"{math.floor(usable)}"
    with about("mem_limit"):
        usable = byte_cap(limit, profile, choices.headroom) or usable
    request = PlanRequest(limit, placement=_placement(choices.placement, len(layers), shape.p),
                          partition=choices.partition, stages=shape.p, recompute=choices.recompute,
                          headroom=choices.headroom, allow_param_copies=choices.allow_param_copies)
    flops = sum(sum(cost.extra["flops"][k] for k in ("F", "B", "W"))
                for cost in estimate_layers(model, cluster.gpu, dtype=workload.dtype, mfu=workload.mfu,
                                            attention=workload.attention))
    return ShapeCosts(shape, profile, request, params, dp, cluster.capacity, usable, flops * shape.m * shape.d,
                      spec.peak_tflops[workload.dtype] * 1e6, workload.tokens_per_step)


def _placement(given: str, layers: int, p: int) -> str:
    """`given`, or for auto the one automatic placement whose chunks the layers fill where only one does
    (the V-shape needs two layers per rank; find_plan would refuse the shape for it)."""
    if given.strip().lower() != "auto" or p == 1:
        return given
    fits = [name for name in AUTO_PLACEMENTS if route_length(parse_placement(name, p)) <= layers]
    return fits[0] if len(fits) == 1 else given


def _restaged(profile: Profile, layers: tuple, hops: tuple[float, ...], capacity: float) -> Profile:
    """The profile on these layers: its stages summed again from them (the profiler's split), each
    boundary's hop time as `comm` and no link bandwidth (so every split keeps boundary k's link), and the
    cluster's GPU memory as the device's capacity."""
    changed = replace(profile, layers=layers)
    groups = layers_by_stage(changed, layers, "whole-run planning sums each stage's costs from its layers")
    stages = tuple(summed(group, k == len(groups) - 1, k == 0) for k, group in enumerate(groups))
    return replace(changed, stages=stages, comm=hops, link_bandwidth=None, comm_table=None,
                   device_capacity_bytes=float(capacity))


def _described(profile: Profile, workload: Workload, cluster: Cluster, shape: RunShape, dp: DataParallel,
               measured: Profile | None) -> Profile:
    """The profile with the whole-run costs in its source's method and its details."""
    model = workload.at_micro_batch(shape.b)
    share = tp_shard(model, shape.t)
    tp = tp_block_comm(shape, share, workload.dtype, cluster)
    ep = ep_block_comm(shape, share, workload.dtype, cluster)
    details = dict(profile.details)
    static = dict(details.get("static") or {})
    record = sharding_record(dp)
    if record is not None:
        static["sharding"] = record
    details["static"] = static
    details["whole_run"] = {"shape": shape.to_dict(), "gpus": cluster.gpus, "tp_block_us": tp, "ep_block_us": ep,
                            "hops_us": list(profile.comm), "tp_link": cluster.link_for(shape.t).name,
                            "dp_link": dp.link.name, "sharding": shape.sharding,
                            "measured": None if measured is None else measured.name}
    method = profile.source["method"] + "; " + whole_run_method(shape, tp, ep, dp)
    if measured is not None:
        method += "; " + measured_method(measured)
    source = {**profile.source, "method": method}
    return replace(profile, details=details, source=source)


def whole_run_method(shape: RunShape, tp: float, ep: float, dp: DataParallel) -> str:
    """How the shape's costs were added to the estimate, in words (the profile's source.method)."""
    return (
        f"whole-run shape {shape.label()}: one tensor-parallel rank's share of {shape.t} (heads, key/value heads, FFN, "
        "experts' FFN and vocabulary / t; Shoeybi et al., Megatron-LM, arXiv:1909.08053); sequence parallelism "
        "(Korthikanti et al., MLSys 2023): per block F and I each add 2 all-gathers + 2 reduce-scatters of b*s*h "
        f"elements over the tensor-parallel link ({tp:.4g} us), exposed; the embedding reduce-scatters its output in "
        "F and all-gathers its gradient in W, the head all-gathers its input in F and reduce-scatters in I; the "
        "hidden-wide saved tensors (norm inputs, their 1/rms, the normed q/k/v and MLP inputs; W's inputs; the norm "
        "output gradients torch's I stores) and each block's output and full-recompute input are divided by t; "
        f"MoE blocks: routed experts' weights / ep = {shape.ep}, and F and I each add a dispatch and a combine "
        f"all-to-all of b*s*top_k*h elements over the expert-parallel link ({ep:.4g} us; GShard, arXiv:2006.16668); "
        "pipeline hops: one message of b*s*h/t elements per boundary over the link the two stages share (mesh pp, "
        "dp, tp: neighbours t*d GPUs apart), latency + bytes / bandwidth; collectives: alpha-beta, ring volumes "
        f"({CITATION}); data parallelism {shape.sharding} over {dp.d} on {dp.link.name}: static bytes per "
        "core.sharding (ZeRO: Rajbhandari et al., SC 2020); gradients synced once per step on the last "
        "microbatch's backward (torch/distributed/pipelining/stage.py), zero2 every microbatch; the optimizer "
        "step reads and writes its shard at the HBM bandwidth"
    )

"""Assemble a zbsearch profile from per-layer costs: the stage split, the stage sums, communication,
static memory and provenance; and the two whole flows, measured and estimated.

`build_profile` splits the layers into p contiguous stages (exact linear-partition DP, or a forced
split), adds communication times from the bytes crossing each stage boundary and a link bandwidth,
and returns a validated `Profile` that lists the layers too. `profile_measured` and `profile_estimate`
get the layer costs (see measure.py and estimate.py) and write the `source` prose that says how they
were obtained.

Units: times in microseconds, memory in bytes. torch is imported only by `profile_measured`.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence, Union

from ..core.calibration import torch_chunk_memory
from ..core.errors import PartitionError, ProfilerError
from ..core.profile import Profile, check_microbatches, check_stages
from ..core.sharding import param_bytes
from .costs import LayerCost, apply_layout, sig9
from .estimate import PAPER, estimate_formulas, estimate_layers
from .distributed import measure_link, torchrun_env
from .hardware import default_dtype, device_info, gpu_spec, import_torch, resolve_device
from .measured import DECODER_ANCHORS, DEFAULT_LINK, load_model, measured_method, measured_request, resolve_link
from .partition import check_stage_counts, linear_partition, stage_costs
from .presets import Preset, resolve_shape
from .request import (DEFAULT_LINK_GBPS, DEFAULT_MFU, DTYPE_BYTES, OPTIMIZERS, GptShape, LlamaShape,
    RUN_THREADS, MeasureRequest, MoeShape, PipelineSetup, Progress, StageSplit, bad_input, check_choice,
    check_factory_spec)
from .tensor_parallel import tp_details, tp_label, tp_shard, tp_words
from .transformer import inventory

Shape = Union[GptShape, LlamaShape, MoeShape]


@dataclass(frozen=True)
class Provenance:
    """What the profile says about where its numbers come from."""

    name: str
    source: dict[str, Any]  # the profile's `source`: kind, method, device or GPU, date
    link_origin: str  # where the link bandwidth comes from: given, measured or the default
    details: dict[str, Any] | None = None  # model, dtype, environment...; the stage split is added
    capacity_bytes: float | None = None  # the device's memory


def optimizer_bytes_per_param(optimizer: str, dtype: str) -> int:
    """Parameter, gradient and optimizer-state bytes per parameter (core/sharding.py's param_bytes).

    >>> optimizer_bytes_per_param("adam", "bf16"), optimizer_bytes_per_param("sgd", "fp32")
    (16, 12)
    """
    check_choice(optimizer, OPTIMIZERS, "optimizer", "optimizer")
    return param_bytes(DTYPE_BYTES[dtype], optimizer).total


def check_split(n_layers: int, split: StageSplit) -> None:
    """Check a stage split against the model's layer count before anything is measured."""
    movable = n_layers - sum(split.anchored)
    what = "transformer layers" if any(split.anchored) else "layers"
    if split.layers_per_stage:
        check_stage_counts(list(split.layers_per_stage), movable, split.stages)
        return
    if split.stages is None:
        raise bad_input(PartitionError, "the number of pipeline stages is not given: give a stage count, or the "
                        "layers per stage", "stages", "layers_per_stage")
    check_stages(split.stages)
    if split.stages > movable:
        raise bad_input(PartitionError, f"{split.stages} stages are more than the model's {movable} {what}: every "
                        f"stage needs at least one, so use {movable} stages or fewer", "stages")


def split_layers(costs: Sequence[LayerCost], split: StageSplit) -> list[int]:
    """Layers per stage (counting every layer, anchored ones included).

    `split.anchored` = (a, z): the first a layers always sit on the first stage and the last z on the
    last stage (the GPT's embedding and head); the DP, or `split.layers_per_stage`, places the layers between.
    """
    first, last = split.anchored
    check_split(len(costs), split)
    if split.layers_per_stage:
        counts = list(split.layers_per_stage)
    else:
        middle = [c.compute for c in costs[first:len(costs) - last]]
        extra_first = sum(c.compute for c in costs[:first])
        extra_last = sum(c.compute for c in costs[len(costs) - last:])
        assert split.stages is not None  # check_split raised otherwise
        counts = linear_partition(middle, split.stages, extra_first, extra_last)
    counts[0] += first
    counts[-1] += last
    return counts


def _raise_mem_B(costs: Sequence[LayerCost], notes: list[str]) -> list[LayerCost]:
    """The layers, each holding at least its mem_W from F until B (the profile format needs mem_W <= mem_B)."""
    out = []
    for c in costs:
        if c.mem_W > c.mem_B:
            notes.append(f"layer {c.name}: mem_B raised from {c.mem_B:.0f} to mem_W {c.mem_W:.0f} bytes")
            extra = {**c.extra, "mem_B_torch": c.mem_B} if "mem_W_torch_runtime" in c.extra else c.extra
            c = replace(c, mem_B=c.mem_W, extra=extra)
        out.append(c)
    return out


def _stage(k: int, group: Sequence[LayerCost], torch_stage0: bool, notes: list[str], last: bool) -> dict[str, float]:
    """Stage k's F, B, W, fused backward, M_B and M_W: the sums over its layers (see build_profile)."""
    st = {key: math.fsum(sig9(getattr(c, key)) for c in group) for key in ("F", "B", "W", "full_backward")}
    st.update({key: math.fsum(getattr(c, key) for c in group) for key in ("mem_B", "mem_W")})
    if st["mem_B"] <= 0:
        notes.append(f"stage {k}: no saved activations measured; mem_B set to 1 byte")
        st["mem_B"], st["mem_W"] = 1.0, min(st["mem_W"], 1.0)
    if all("mem_W_torch_runtime" in c.extra for c in group):  # measured on torch: what its runtime holds
        st["mem_B_torch"], torch_w = torch_chunk_memory(
            [c.extra.get("mem_B_torch", c.mem_B) for c in group], [c.extra["mem_W_torch_runtime"] for c in group],
            group[-1].out_bytes, first_stage=k == 0 and torch_stage0)
        if torch_w is not None:
            st["mem_W_torch"] = torch_w
        key = "mem_kept_loss_torch" if last else "mem_kept_torch"
        if k == 0:
            st["mem_kept_torch"] = 0.0  # torch runs the first stage's whole backward at once
        elif all(key in c.extra for c in group):
            st["mem_kept_torch"] = math.fsum(c.extra[key] for c in group)
    if k == 0 and torch_stage0:
        st["B"], st["W"], st["mem_W"] = 0.0, st["full_backward"] or st["B"] + st["W"], st["mem_B"]
    if st["B"] + st["W"] <= 0:
        raise ProfilerError(f"stage {k} ({', '.join(c.name for c in group)}) has no backward work: its layers have "
                            "no parameters and pass no gradient; put them on a stage with trainable layers")
    if st["full_backward"] <= 0:
        del st["full_backward"]
    return st


def _partition_details(costs: Sequence[LayerCost], split: StageSplit, counts: list[int],
                       names: list[list[str]]) -> dict[str, Any]:
    if split.layers_per_stage:
        method = "forced by --layers-per-stage"
    else:
        method = "exact linear-partition DP minimizing the largest stage F + B + W"
        if split.anchored != (0, 0):
            method += ", embedding pinned to the first stage and head + loss to the last"
    return {"layers_per_stage": names, "method": method,
            "stage_compute_us": [round(x, 3) for x in stage_costs([c.compute for c in costs], counts)]}


def build_profile(costs: Sequence[LayerCost], split: StageSplit, setup: PipelineSetup, provenance: Provenance,
                  *, dtype: str = "fp32") -> Profile:
    """Group layer costs into stages and return a validated profile (times in us, memory in bytes).

    A stage's F, B, W, fused backward, M_B and M_W are the sums over its layers; its static bytes are its
    parameters times `optimizer_bytes_per_param` (of `setup.optimizer` and `dtype`); the time of
    boundary k is the bytes of the activation leaving stage k divided by `setup.link_gbps` (the default
    when None; latency ignored). When a layer needs more from B to W than from F to B (small attention,
    large output gradients), its mem_B is raised to its mem_W: the profile format needs mem_W <= mem_B,
    and raising mem_B never under-counts memory.

    The profile lists every layer (`layers`, in model order, with its static bytes) and the link's
    bandwidth in bytes per microsecond (`link_bandwidth`), so that another split can be chosen later; the
    stages are the sums over the layers of this split.

    With `setup.torch_stage0`, stage 0 is costed as torch.distributed.pipelining runs it: it has no input
    gradient to compute, so its I does nothing (B = 0) and its W runs the fused backward, holding mem_B.
    """
    setup.check()
    link_gbps = setup.link_gbps if setup.link_gbps is not None else DEFAULT_LINK_GBPS
    counts = split_layers(costs, split)
    p = len(counts)
    m = check_microbatches(setup.microbatches if setup.microbatches is not None else 2 * p)
    per_param = optimizer_bytes_per_param(setup.optimizer, dtype)
    stages: list[dict[str, Any]] = []
    names: list[list[str]] = []
    boundary_bytes: list[int] = []
    notes: list[str] = []
    costs = _raise_mem_B(costs, notes)
    start = 0
    for k, count in enumerate(counts):
        group = list(costs[start:start + count])
        start += count
        names.append([c.name for c in group])
        st = _stage(k, group, setup.torch_stage0, notes, k == len(counts) - 1)
        st["static_bytes"] = math.fsum(c.params * per_param for c in group)
        stages.append(st)
        if k < len(counts) - 1:
            boundary_bytes.append(group[-1].out_bytes)
    bandwidth = link_gbps * 1e9 / 8 / 1e6  # bytes per microsecond
    comm = [nbytes / bandwidth for nbytes in boundary_bytes]
    info = dict(provenance.details or {})
    info.update({
        "partition": _partition_details(costs, split, counts, names),
        "boundary_bytes": boundary_bytes,
        "link": {"gbps": link_gbps, "origin": provenance.link_origin,
                 "model": "time = bytes / bandwidth, latency ignored"},
        "static": {"optimizer": setup.optimizer, "bytes_per_param": per_param,
                   "what": "parameters + gradients + optimizer state (+ fp32 master weights in mixed precision)"},
        "torch_stage0": setup.torch_stage0,
    })
    if notes:
        info["notes"] = notes
    data = {
        "format": "zbsearch-profile/1", "name": provenance.name, "num_stages": p, "microbatches": m,
        "time_unit": "us", "memory_unit": "bytes",
        "stages": stages, "comm": comm, "layers": [c.entry(per_param) for c in costs],
        "link_bandwidth": bandwidth, "source": provenance.source, "details": info,
    }
    if provenance.capacity_bytes:
        data["device_capacity_bytes"] = float(provenance.capacity_bytes)
    return Profile.from_dict(data, origin=provenance.name)


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def profile_estimate(shape: Shape | str, gpu: str, split: StageSplit = StageSplit(),
                     setup: PipelineSetup = PipelineSetup(), *, mfu: float = DEFAULT_MFU, dtype: str = "bf16",
                     attention: str | None = None, name: str | None = None,
                     preset: Preset | None = None, memory_model: str = "torch-runtime", tp: int = 1) -> Profile:
    """The estimated profile of a GPT, Llama-style or MoE shape on a GPU (a key of hardware.GPUS); no torch.

    `shape` is a record (GptShape, LlamaShape, MoeShape) or a preset's name (presets.PRESETS, e.g.
    "llama3-8b"); `preset` says which preset a record was made from, for the profile's citation.
    `attention` defaults to naive for a GptShape of one's own and to sdpa (fused) otherwise.
    `memory_model`: the accounting plans on it use; by default what torch's runtime holds (each layer
    carries its estimate: everything saved for B plus the gradients I stores for W), since plans run on
    torch and torchtitan. `tp` > 1: one of `tp` tensor-parallel ranks' share of each layer of a Llama-style
    or MoE shape (tensor_parallel.tp_shard), its collectives left out, the degree in
    `details.tensor_parallel`.
    """
    if isinstance(shape, str):
        shape, preset = resolve_shape(shape, {})
    whole, shape = shape, tp_shard(shape.check(), tp) if tp != 1 else shape
    if attention is None:
        attention = "naive" if isinstance(shape, GptShape) and preset is None else "sdpa"
    costs = estimate_layers(shape, gpu, dtype=dtype, mfu=mfu, attention=attention)
    spec = gpu_spec(gpu)
    method = (f"estimated from FLOP counts and bytes moved, not measured: matrix work time = FLOPs / "
              f"({spec.peak_tflops[dtype]} TFLOP/s dense {dtype} peak of the {spec.name} * MFU {mfu}); memory-bound "
              f"time = bytes / {spec.memory_bandwidth / 1e12:g} TB/s HBM bandwidth; attention {attention}; "
              f"{estimate_formulas(shape)}" + (f"; {tp_words(tp)}" if tp != 1 else ""))
    source: dict[str, Any] = {"kind": "estimated", "method": method,
                              "citation": f"{PAPER}, Table 1 (FLOPs and activation memory) and its conventions",
                              "gpu": spec.name, "peak_source": spec.source, "mfu": mfu, "date": now_utc()}
    model: dict[str, Any] = {**shape.describe(), "attention": attention}
    changed = {k: v for k, v in asdict(whole).items() if preset and getattr(preset.shape, k) != v}
    if preset:
        model["preset"] = preset.name
        source["shape"] = f"{preset.name}-like: {preset.citation}; {preset.note}"
        if changed:
            source["shape"] += "; changed here: " + ", ".join(f"{k} {v}" for k, v in changed.items())
    details: dict[str, Any] = {"model": model, "dtype": dtype, "gpu": gpu, "mfu": mfu,
                               "peak_tflops": spec.peak_tflops[dtype], "memory_bandwidth": spec.memory_bandwidth,
                               **tp_details(whole, tp)}
    if not isinstance(shape, GptShape):
        details["estimate"] = {"activation_bytes_per_token": inventory(shape, DTYPE_BYTES[dtype], attention)}
    label = tp_label(preset.name if preset and not changed else whole.label(), tp)
    provenance = Provenance(
        name=name or f"{label}-{gpu}-estimated", source=source, details=details,
        link_origin="--link-gbps" if setup.link_gbps is not None else DEFAULT_LINK,
        capacity_bytes=spec.memory_bytes)
    built = build_profile(costs, replace(split, anchored=DECODER_ANCHORS), setup, provenance, dtype=dtype)
    return replace(built, memory_model=memory_model)


def profile_gpt_estimate(shape: GptShape, gpu: str, split: StageSplit = StageSplit(),
                         setup: PipelineSetup = PipelineSetup(), *, mfu: float = DEFAULT_MFU, dtype: str = "bf16",
                         attention: str = "naive", name: str | None = None) -> Profile:
    """The estimated profile of the built-in GPT on a GPU: `profile_estimate` of a GptShape."""
    return profile_estimate(shape, gpu, split, setup, mfu=mfu, dtype=dtype, attention=attention, name=name)


def profile_measured(model: str = "gpt", split: StageSplit = StageSplit(), setup: PipelineSetup = PipelineSetup(),
                     request: MeasureRequest = MeasureRequest(), *, shape: Shape | None = None,
                     attention: str | None = None, tp: int = 1, seed: int = 0, name: str | None = None,
                     progress: Progress | None = None, memory_model: str = "torch-runtime") -> Profile | None:
    """Measure a built-in model (`model` gpt, llama, moe or a preset's name; `shape` its record when the
    defaults are changed) or a user's `package.module:factory` on torch, and build its profile.

    `attention` defaults to naive for a GPT shape of one's own and to sdpa (fused) otherwise, as for
    estimates. `tp` > 1: one of `tp` tensor-parallel ranks' share of each layer of a Llama-style or MoE
    shape (tensor_parallel.tp_shard), its collectives left out; the profile records the degree in
    `details.tensor_parallel`. `split.anchored` is set by the model (a built-in decoder's embedding and
    head stay on the end stages). `memory_model`: the accounting plans on it use; by default what torch's
    runtime holds, which the profile measures (core/calibration.py), since its schedules run on torch.

    Under torchrun (profiling/distributed.py) every process calls this: ranks 0 and 1 time the link
    between them (unless `setup.link_gbps` is given), then rank 0 measures the layers on its device
    (cuda:LOCAL_RANK on a GPU) and returns the profile; the other ranks return None.
    """
    asked = measured_request(model, shape, tp)
    if attention is None:
        attention = "naive" if isinstance(asked.shape, GptShape) and asked.preset is None else "sdpa"
    import_torch()
    # defers torch (import_torch above says how to install it)
    from .measure import measure_layers

    dev = resolve_device(request.device)
    env = torchrun_env()
    probed = None
    if env is not None:
        dev = resolve_device(f"cuda:{env.local_rank}") if dev.type == "cuda" else dev
        probed = measure_link(env, dev) if setup.link_gbps is None else None
        if not env.leader:
            return None
    dtype = request.dtype or default_dtype(dev)
    request = replace(request, dtype=dtype).check()
    if dev.type == "cpu" and request.threads is None:
        request = replace(request, threads=RUN_THREADS)  # the run's conditions, so profile and run agree
    if split.stages is not None:
        check_stages(split.stages)
    setup.check()
    loaded = load_model(asked, attention, seed, dev)
    split = replace(split, anchored=loaded.anchored)
    check_split(len(loaded.specs), split)
    costs = measure_layers(loaded.specs, loaded.sample, replace(request, device=str(dev)), progress)
    costs = apply_layout(costs, loaded.layout)
    info = device_info(dev)
    cuda = dev.type == "cuda"
    if not cuda:
        info["threads"] = request.threads if request.threads is not None else info["threads"]
    setup, origin = resolve_link(setup, costs, cuda, probed)
    method, timer, order, memory = measured_method(request, cuda, asked.tp)
    device_name = info["name"]
    if not cuda:
        device_name += f", {info['threads']} torch thread{'s' if info['threads'] != 1 else ''}"
    source = {"kind": "measured", "device": device_name, "date": now_utc(), "method": method,
              "torch": info["torch"], "cuda": info["cuda"], "dtype": request.dtype}
    details = {"model": loaded.info, **asked.details(attention), "dtype": request.dtype, "device": str(dev),
               "environment": info,
               "timing": {"warmup": request.warmup, "repeats": request.repeats, "statistic": "median",
                          "timer": timer, "order": order},
               "memory_method": memory,
               "torch_runtime_note": "torch's split backward keeps the autograd graph from I until W, so between "
                                     "them it holds about mem_W_torch_runtime per layer (see each layer's details), "
                                     "more than mem_W"}
    dev_tag = "cuda" if cuda else "cpu"
    provenance = Provenance(name=name or f"{asked.label()}-{request.dtype}-{dev_tag}", source=source, details=details,
                            link_origin=origin, capacity_bytes=info.get("capacity_bytes"))
    return replace(build_profile(costs, split, setup, provenance, dtype=dtype), memory_model=memory_model)

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
from typing import TYPE_CHECKING, Any, Sequence, Union

from ..core.calibration import torch_chunk_memory
from ..core.errors import PartitionError, ProfilerError
from ..core.profile import Profile, check_microbatches, check_stages
from ..core.sharding import param_bytes
from .costs import LayerCost, Layout, apply_layout, decoder_layout, sig9
from .estimate import PAPER, estimate_formulas, estimate_layers
from .distributed import measure_link, torchrun_env
from .hardware import default_dtype, device_info, gpu_spec, import_torch, measure_link_gbps, resolve_device
from .partition import check_stage_counts, linear_partition, stage_costs
from .presets import Preset, is_builtin, resolve_shape
from .request import (DEFAULT_LINK_GBPS, DEFAULT_MFU, DTYPE_BYTES, OPTIMIZERS, GptShape, LlamaShape,
    RUN_THREADS, MeasureRequest, MoeShape, PipelineSetup, Progress, StageSplit, bad_input, check_choice,
    check_factory_spec)
from .transformer import inventory

if TYPE_CHECKING:
    import torch

    from .models import LayerSpec

GPT_ANCHORS = (1, 1)  # the GPT's embedding stays on the first stage, its head and loss on the last
Shape = Union[GptShape, LlamaShape, MoeShape]
DEFAULT_LINK = f"default {DEFAULT_LINK_GBPS} Gb/s"


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
                     preset: Preset | None = None, memory_model: str = "torch-runtime") -> Profile:
    """The estimated profile of a GPT, Llama-style or MoE shape on a GPU (a key of hardware.GPUS); no torch.

    `shape` is a record (GptShape, LlamaShape, MoeShape) or a preset's name (presets.PRESETS, e.g.
    "llama3-8b"); `preset` says which preset a record was made from, for the profile's citation.
    `attention` defaults to naive for a GptShape of one's own and to sdpa (fused) otherwise.
    `memory_model`: the accounting plans on it use; by default what torch's runtime holds (each layer
    carries its estimate: everything saved for B plus the gradients I stores for W), since plans run on
    torch and torchtitan.
    """
    if isinstance(shape, str):
        shape, preset = resolve_shape(shape, {})
    if attention is None:
        attention = "naive" if isinstance(shape, GptShape) and preset is None else "sdpa"
    costs = estimate_layers(shape, gpu, dtype=dtype, mfu=mfu, attention=attention)
    spec = gpu_spec(gpu)
    method = (f"estimated from FLOP counts and bytes moved, not measured: matrix work time = FLOPs / "
              f"({spec.peak_tflops[dtype]} TFLOP/s dense {dtype} peak of the {spec.name} * MFU {mfu}); memory-bound "
              f"time = bytes / {spec.memory_bandwidth / 1e12:g} TB/s HBM bandwidth; attention {attention}; "
              f"{estimate_formulas(shape)}")
    source: dict[str, Any] = {"kind": "estimated", "method": method,
                              "citation": f"{PAPER}, Table 1 (FLOPs and activation memory) and its conventions",
                              "gpu": spec.name, "peak_source": spec.source, "mfu": mfu, "date": now_utc()}
    model: dict[str, Any] = {**shape.describe(), "attention": attention}
    changed = {k: v for k, v in asdict(shape).items() if preset and getattr(preset.shape, k) != v}
    if preset:
        model["preset"] = preset.name
        source["shape"] = f"{preset.name}-like: {preset.citation}; {preset.note}"
        if changed:
            source["shape"] += "; changed here: " + ", ".join(f"{k} {v}" for k, v in changed.items())
    details: dict[str, Any] = {"model": model, "dtype": dtype, "gpu": gpu, "mfu": mfu,
                               "peak_tflops": spec.peak_tflops[dtype], "memory_bandwidth": spec.memory_bandwidth}
    if not isinstance(shape, GptShape):
        details["estimate"] = {"activation_bytes_per_token": inventory(shape, DTYPE_BYTES[dtype], attention)}
    label = preset.name if preset and not changed else shape.label()
    provenance = Provenance(
        name=name or f"{label}-{gpu}-estimated", source=source, details=details,
        link_origin="--link-gbps" if setup.link_gbps is not None else DEFAULT_LINK,
        capacity_bytes=spec.memory_bytes)
    built = build_profile(costs, replace(split, anchored=GPT_ANCHORS), setup, provenance, dtype=dtype)
    return replace(built, memory_model=memory_model)


def profile_gpt_estimate(shape: GptShape, gpu: str, split: StageSplit = StageSplit(),
                         setup: PipelineSetup = PipelineSetup(), *, mfu: float = DEFAULT_MFU, dtype: str = "bf16",
                         attention: str = "naive", name: str | None = None) -> Profile:
    """The estimated profile of the built-in GPT on a GPU: `profile_estimate` of a GptShape."""
    return profile_estimate(shape, gpu, split, setup, mfu=mfu, dtype=dtype, attention=attention, name=name)


def _measured_method(request: MeasureRequest, cuda: bool) -> tuple[str, str, str, str]:
    """(method, timer, order, memory method): how a measured profile's numbers were taken, in words."""
    timer = "CUDA events" if cuda else "time.perf_counter"
    order = ("round-robin over all layers, one run of each per round" if request.interleave else
             "one layer at a time")
    memory = ("M_B: torch.cuda.memory_allocated delta over F (minus the output, plus the input when saved); "
              if cuda else
              "M_B: bytes of the distinct non-parameter tensors saved for backward (saved-tensor hooks); ")
    memory += ("M_W: bytes of the tensors the weight-gradient step still needs after B (saved inputs of the "
               "parameter-using autograd nodes plus the output gradients stored for them)")
    method = (f"zbsearch profile: each layer measured alone on its real input; F forward, B = torch's "
              f"stage_backward_input (the runtime's I), W = stage_backward_weight (the runtime's W), and the fused "
              f"backward (stage_backward); {request.warmup} warm-up runs, median of {request.repeats} ({timer}, "
              f"{order}); {memory}")
    return method, timer, order, memory


def _resolve_link(setup: PipelineSetup, costs: Sequence[LayerCost], cuda: bool,
                  probed: tuple[float, str] | None = None) -> tuple[PipelineSetup, str]:
    """The link bandwidth given, else the one probed between torchrun's ranks, else measured between two
    GPUs, else the default; with its origin."""
    if setup.link_gbps is not None:
        return setup, "--link-gbps"
    if probed is not None:
        return replace(setup, link_gbps=probed[0]), probed[1]
    biggest = max(c.out_bytes for c in costs)
    measured = measure_link_gbps(biggest) if cuda else None
    if measured is not None:
        return replace(setup, link_gbps=measured), f"measured cuda:0 -> cuda:1 copy of {biggest} bytes"
    return replace(setup, link_gbps=DEFAULT_LINK_GBPS), DEFAULT_LINK


@dataclass(frozen=True)
class _Model:
    specs: list[LayerSpec]
    sample: torch.Tensor  # the first layer's input
    anchored: tuple[int, int]
    info: dict[str, Any]
    label: str  # the start of the profile's default name
    layout: Layout  # kind and modules of the named layers


def _load_model(model: str, shape: GptShape | None, attention: str, seed: int) -> _Model:
    """The built-in GPT or a factory's layers, ready to measure."""
    torch = import_torch()
    # defers torch (import_torch above says how to install it)
    from .models import describe_tensor, gpt_layers, load_factory

    if model == "gpt":
        shape = (shape or GptShape()).check()
        specs, sample = gpt_layers(shape, attention, seed)
        return _Model(specs, sample, GPT_ANCHORS, {**shape.describe(), "attention": attention}, shape.label(),
                      decoder_layout(shape.layers, positions=True))
    torch.manual_seed(seed)
    specs, sample = load_factory(model)
    info = {"model": model, "layers": len(specs), "sample_input": describe_tensor(sample)}
    return _Model(specs, sample, (0, 0), info, model, [])


def profile_measured(model: str = "gpt", split: StageSplit = StageSplit(), setup: PipelineSetup = PipelineSetup(),
                     request: MeasureRequest = MeasureRequest(), *, shape: GptShape | None = None,
                     attention: str = "naive", seed: int = 0, name: str | None = None,
                     progress: Progress | None = None, memory_model: str = "torch-runtime") -> Profile | None:
    """Measure the built-in GPT (`model="gpt"`) or a user's `package.module:factory` and build its profile.

    `split.anchored` is set by the model (the GPT's embedding and head stay on the end stages).
    `memory_model`: the accounting plans on it use; by default what torch's runtime holds, which the
    profile measures (core/calibration.py), since a measured profile's schedules run on torch.

    Under torchrun (profiling/distributed.py) every process calls this: ranks 0 and 1 time the link
    between them (unless `setup.link_gbps` is given), then rank 0 measures the layers on its device
    (cuda:LOCAL_RANK on a GPU) and returns the profile; the other ranks return None.
    """
    if model != "gpt" and is_builtin(model):
        raise bad_input(ProfilerError, f"model {model} is estimated only: measuring on torch covers the built-in gpt "
                        f"and your own package.module:factory; estimate {model} from its FLOP counts instead", "model")
    if model != "gpt":
        check_factory_spec(model)
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
    loaded = _load_model(model, shape, attention, seed)
    split = replace(split, anchored=loaded.anchored)
    check_split(len(loaded.specs), split)
    costs = measure_layers(loaded.specs, loaded.sample, replace(request, device=str(dev)), progress)
    costs = apply_layout(costs, loaded.layout)
    info = device_info(dev)
    cuda = dev.type == "cuda"
    if not cuda:
        info["threads"] = request.threads if request.threads is not None else info["threads"]
    setup, origin = _resolve_link(setup, costs, cuda, probed)
    method, timer, order, memory = _measured_method(request, cuda)
    device_name = info["name"]
    if not cuda:
        device_name += f", {info['threads']} torch thread{'s' if info['threads'] != 1 else ''}"
    source = {"kind": "measured", "device": device_name, "date": now_utc(), "method": method,
              "torch": info["torch"], "cuda": info["cuda"], "dtype": request.dtype}
    details = {"model": loaded.info, "dtype": request.dtype, "device": str(dev), "environment": info,
               "timing": {"warmup": request.warmup, "repeats": request.repeats, "statistic": "median",
                          "timer": timer, "order": order},
               "memory_method": memory,
               "torch_runtime_note": "torch's split backward keeps the autograd graph from I until W, so between "
                                     "them it holds about mem_W_torch_runtime per layer (see each layer's details), "
                                     "more than mem_W"}
    dev_tag = "cuda" if cuda else "cpu"
    provenance = Provenance(name=name or f"{loaded.label}-{request.dtype}-{dev_tag}", source=source, details=details,
                            link_origin=origin, capacity_bytes=info.get("capacity_bytes"))
    return replace(build_profile(costs, split, setup, provenance, dtype=dtype), memory_model=memory_model)

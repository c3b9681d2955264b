"""`zbsearch profile`: measure (or estimate) a model's per-layer and per-stage costs and write a profile JSON.

Only parsing, rendering and naming the flags behind a library error live here; the work is
zbsearch.profiling's. The progress bar goes to stderr so that stdout carries only the summary (or, with
--json, the profile itself).
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional, Sequence

import typer
from rich import box
from rich.table import Table

from ..core.errors import ProfilerError, ZbsearchError
from ..core.profile import Profile
from ..profiling.build import profile_estimate, profile_measured
from ..profiling.distributed import reports_here, torchrun_env
from ..profiling.hardware import GPUS
from ..profiling.presets import PRESETS, Preset, Shape, is_builtin, resolve_shape
from ..profiling.request import (DEFAULT_LINK_GBPS, DEFAULT_MFU, DEFAULT_REPEATS, DEFAULT_WARMUP,
    MeasureRequest, PipelineSetup, StageSplit)
from .console import progress_bar, stdout_console
from .levers import DevicesOpt, DpShardOpt, ShardingOpt, as_planned, check_job
from .options import JsonOpt
from .params import IntList, count_list_parser, parse_memory_model
from ..interop.run.calibrate import calibrate as calibrated

MODEL_PANEL = "Model"
MEASURE_PANEL = "Measurement"
STAGES_PANEL = "Stages"
ESTIMATE_PANEL = "Estimate (no GPU needed)"
OUTPUT_PANEL = "Output"

ModelOpt = Annotated[str, typer.Option(
    "--model", metavar="gpt|llama|moe|PRESET|PKG.MODULE:FACTORY", rich_help_panel=MODEL_PANEL,
    help="gpt: the built-in GPT-style decoder (shapes below). llama: a Llama-style decoder (RMSNorm, "
         "grouped-query attention, RoPE, SwiGLU, untied head); moe: the same with dense first blocks and "
         f"mixture-of-experts ones; presets: {', '.join(PRESETS)} (shape flags change them). Each is measured on "
         "torch, or estimated with --estimate. Or your own: a "
         "function, importable from the current directory too, returning (layers, sample_input): the ordered "
         "list of nn.Module layers and the first layer's input tensor for one microbatch.",
)]
LayersOpt = Annotated[Optional[int], typer.Option(
    "--layers", metavar="L", rich_help_panel=MODEL_PANEL, help="Transformer blocks. Default 4.")]
HiddenOpt = Annotated[Optional[int], typer.Option(
    "--hidden", metavar="H", rich_help_panel=MODEL_PANEL, help="Hidden size. Default 256.")]
HeadsOpt = Annotated[Optional[int], typer.Option(
    "--heads", metavar="A", rich_help_panel=MODEL_PANEL, help="Attention heads. Default 4.")]
SeqOpt = Annotated[Optional[int], typer.Option(
    "--seq", metavar="S", rich_help_panel=MODEL_PANEL, help="Sequence length. Default 128.")]
MicroBatchOpt = Annotated[Optional[int], typer.Option(
    "--micro-batch", metavar="B", rich_help_panel=MODEL_PANEL,
    help="Sequences per microbatch. Default 2 for gpt, 1 for llama, moe and the presets.")]
VocabOpt = Annotated[Optional[int], typer.Option(
    "--vocab", metavar="V", rich_help_panel=MODEL_PANEL, help="Vocabulary size. Default 1024.")]
KvHeadsOpt = Annotated[Optional[int], typer.Option(
    "--kv-heads", metavar="K", rich_help_panel=MODEL_PANEL,
    help="llama, moe: key/value heads (grouped-query attention). Default: --heads.")]
FfnOpt = Annotated[Optional[int], typer.Option(
    "--ffn", metavar="F", rich_help_panel=MODEL_PANEL,
    help="llama, moe: SwiGLU inner size (moe: of the dense blocks). Default 8H/3 rounded up to a multiple of 256.")]
HeadDimOpt = Annotated[Optional[int], typer.Option(
    "--head-dim", metavar="D", rich_help_panel=MODEL_PANEL, help="llama, moe: head size. Default H / A.")]
DenseLayersOpt = Annotated[Optional[int], typer.Option(
    "--dense-layers", metavar="N", rich_help_panel=MODEL_PANEL,
    help="moe: the first N blocks have a dense MLP, the rest experts. Default 1.")]
ExpertsOpt = Annotated[Optional[int], typer.Option(
    "--experts", metavar="E", rich_help_panel=MODEL_PANEL,
    help="moe: routed experts per MoE block, all on the block's stage (no expert parallelism). Default 8.")]
TopKOpt = Annotated[Optional[int], typer.Option(
    "--top-k", metavar="K", rich_help_panel=MODEL_PANEL, help="moe: routed experts per token. Default 2.")]
ExpertFfnOpt = Annotated[Optional[int], typer.Option(
    "--expert-ffn", metavar="F", rich_help_panel=MODEL_PANEL,
    help="moe: each expert's SwiGLU inner size. Default --ffn.")]
SharedExpertsOpt = Annotated[Optional[int], typer.Option(
    "--shared-experts", metavar="N", rich_help_panel=MODEL_PANEL,
    help="moe: experts every token passes through, of size --expert-ffn. Default 0.")]
TpOpt = Annotated[int, typer.Option(
    "--tp", metavar="T", rich_help_panel=MODEL_PANEL,
    help="llama, moe and their presets: profile one of T tensor-parallel ranks' share of each layer (heads, "
         "key/value heads, FFN and vocabulary divided by T, as Megatron-LM splits them), measured or estimated "
         "alone: the tensor-parallel collectives are not in its times. Default 1.")]
AttentionOpt = Annotated[Optional[str], typer.Option(
    "--attention", metavar="naive|sdpa", rich_help_panel=MODEL_PANEL,
    help="naive keeps the s x s attention probabilities for backward, as the Zero Bubble paper's memory model "
         "(34h + 5as) assumes; sdpa uses torch's fused scaled_dot_product_attention. Default naive for gpt, "
         "sdpa for llama, moe and the presets.",
)]

StagesOpt = Annotated[Optional[int], typer.Option(
    "-p", "--stages", metavar="P", rich_help_panel=STAGES_PANEL,
    help="Pipeline stages. The layers are split by an exact DP minimizing the slowest stage's F+B+W; the gpt "
         "embedding stays on the first stage, the head and loss on the last.",
)]
LayersPerStageOpt = Annotated[Optional[IntList], typer.Option(
    "--layers-per-stage", metavar="N1,N2,...", rich_help_panel=STAGES_PANEL,
    parser=count_list_parser("layer counts", "3,3,2"),
    help="Force the split instead: layers per stage (gpt: transformer layers; embedding and head are added "
         "to the first and last stage). Sets -p.",
)]
ProfileMicrobatchesOpt = Annotated[Optional[int], typer.Option(
    "-m", "--microbatches", metavar="M", rich_help_panel=STAGES_PANEL,
    help="Microbatches per iteration written into the profile (solve's -m overrides it). Default 2p.",
)]
LinkOpt = Annotated[Optional[float], typer.Option(
    "--link-gbps", metavar="GBIT/S", rich_help_panel=STAGES_PANEL,
    help=f"Stage-to-stage link bandwidth in gigabits per second; comm = boundary activation bytes / bandwidth. "
         f"Default: measured cuda:0 -> cuda:1 when two GPUs are present, else {DEFAULT_LINK_GBPS:g} "
         "(one 200 Gb/s InfiniBand HDR link).",
)]
OptimizerOpt = Annotated[str, typer.Option(
    "--optimizer", metavar="adam|sgd|none", rich_help_panel=STAGES_PANEL,
    help="Optimizer whose state counts in each stage's static bytes (Adam: 16 bytes per parameter).",
)]
TorchStage0Opt = Annotated[bool, typer.Option(
    "--torch-stage0", rich_help_panel=STAGES_PANEL,
    help="Cost stage 0 as torch.distributed.pipelining runs it: no input gradient, so its I is empty (B = 0) "
         "and its W is the whole backward.",
)]

DeviceOpt = Annotated[str, typer.Option(
    "--device", metavar="auto|cpu|cuda[:N]", rich_help_panel=MEASURE_PANEL,
    help="Where to measure. auto: a GPU when there is one.")]
DtypeOpt = Annotated[Optional[str], typer.Option(
    "--dtype", metavar="bf16|fp16|fp32", rich_help_panel=MEASURE_PANEL,
    help="Precision of parameters and activations. Default bf16 on a GPU or with --estimate, fp32 on a CPU.")]
WarmupOpt = Annotated[int, typer.Option(
    "--warmup", metavar="N", rich_help_panel=MEASURE_PANEL, min=0, help="Untimed runs of every pass first.")]
RepeatsOpt = Annotated[int, typer.Option(
    "--repeats", metavar="N", rich_help_panel=MEASURE_PANEL, min=1,
    help="Timed runs of every pass; the median is kept.")]
ProfileMemoryModelOpt = Annotated[Optional[str], typer.Option(
    "--memory-model", metavar="torch-runtime|paper", rich_help_panel=STAGES_PANEL, parser=parse_memory_model,
    help="Memory accounting the solver plans with: torch-runtime (what torch's pipelining runtime holds: measured, "
         "or estimated from what each layer saves; the default) or paper (the Zero Bubble paper's).")]
CalibrateOpt = Annotated[bool, typer.Option(
    "--calibrate", rich_help_panel=MEASURE_PANEL,
    help="Then measure torch's per-action overhead and message times with gloo between -p processes "
         "(zbsearch calibrate) and add them to the profile.")]
ThreadsOpt = Annotated[Optional[int], typer.Option(
    "--threads", metavar="N", rich_help_panel=MEASURE_PANEL, min=1,
    help="CPU threads for torch while measuring (default 1 on a CPU: what each rank of zbsearch run computes "
         "with, so the profile predicts the run).")]
InterleaveOpt = Annotated[bool, typer.Option(
    "--interleave/--layer-by-layer", rich_help_panel=MEASURE_PANEL,
    help="interleave: build every layer, then time them round-robin so drift in the machine's speed hits "
         "all layers alike. layer-by-layer: one layer on the device at a time, for models that do not fit.",
)]
SeedOpt = Annotated[int, typer.Option(
    "--seed", metavar="K", rich_help_panel=MEASURE_PANEL, help="Seed for weights, inputs and targets.")]

EstimateOpt = Annotated[bool, typer.Option(
    "--estimate", rich_help_panel=ESTIMATE_PANEL,
    help="Do not measure: derive the profile from FLOP counts (the Zero Bubble paper's Table 1 and its "
         "conventions) and the GPU's dense peak and memory bandwidth (source: estimated). Needs no torch.",
)]
GpuOpt = Annotated[Optional[str], typer.Option(
    "--gpu", metavar="|".join(GPUS), rich_help_panel=ESTIMATE_PANEL,
    help="GPU for --estimate: a100 (312 bf16 TFLOP/s dense, 80 GB), h100 or h200 (989.4 dense, 80 / 141 GB), "
         "SXM datasheet figures.",
)]
MfuOpt = Annotated[float, typer.Option(
    "--mfu", metavar="X", rich_help_panel=ESTIMATE_PANEL,
    help="With --estimate: fraction of the peak the model's matrix work reaches.")]

OutputOpt = Annotated[Optional[Path], typer.Option(
    "-o", "--output", metavar="PROFILE.json", rich_help_panel=OUTPUT_PANEL,
    help="Write the profile JSON here (atomically).")]
NameOpt = Annotated[Optional[str], typer.Option(
    "--name", metavar="NAME", rich_help_panel=OUTPUT_PANEL, help="Profile name. Default: from model, dtype, device.")]


# The request fields a library error names (its `fields`), as this command's flags.
FLAGS = {
    "model": "--model", "layers": "--layers", "hidden": "--hidden", "heads": "--heads", "seq": "--seq",
    "micro_batch": "--micro-batch", "vocab": "--vocab", "kv_heads": "--kv-heads", "ffn": "--ffn",
    "head_dim": "--head-dim", "dense_layers": "--dense-layers", "experts": "--experts", "top_k": "--top-k",
    "expert_ffn": "--expert-ffn", "shared_experts": "--shared-experts", "attention": "--attention", "stages": "-p",
    "layers_per_stage": "--layers-per-stage", "microbatches": "-m", "link_gbps": "--link-gbps",
    "optimizer": "--optimizer", "device": "--device", "dtype": "--dtype", "warmup": "--warmup",
    "repeats": "--repeats", "threads": "--threads", "gpu": "--gpu", "mfu": "--mfu", "tp": "--tp",
}


@contextmanager
def _naming_flags() -> Iterator[None]:
    """Re-raise a library error about request fields with the flags that set them: `... (option --gpu)`."""
    try:
        yield
    except ZbsearchError as exc:
        flags = [FLAGS[f] for f in getattr(exc, "fields", ()) if f in FLAGS]
        if not flags:
            raise
        word = "option" if len(flags) == 1 else "options"
        raise type(exc)(f"{exc} ({word} {', '.join(flags)})") from exc


def _bytes(x: float | None) -> str:
    """Binary-prefixed size with 3 significant digits: 761K, 12.1G."""
    if x is None:
        return "-"
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.0f}"


def _time(x: float | None, scale: float) -> str:
    if x is None:
        return "-"
    v = x / scale
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.2f}" if v >= 1 else f"{v:.2g}"


def _short(name: str) -> str:
    """A layer's name for the table: emb, l3, out for the built-in models' tok_embeddings, layers.3, output."""
    if name.startswith("layers.") and name[7:].isdigit():
        return "l" + name[7:]
    return {"tok_embeddings": "emb", "output": "out"}.get(name, name)


def _span(names: Sequence[str]) -> str:
    return _short(names[0]) if len(names) == 1 else f"{_short(names[0])}..{_short(names[-1])}"


def summary_table(profile: Profile) -> Table:
    """One row per stage: its layers, F/B/W/fused backward, memory, static bytes and outgoing comm."""
    scale, unit = 1.0, profile.time_unit
    if unit == "us" and max(st.F for st in profile.stages) >= 1000:
        scale, unit = 1000.0, "ms"
    table = Table(title=f"{profile.name}: {profile.num_stages} stages, source {profile.source.get('kind')}",
                  title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 1), pad_edge=False)
    for col in ("#", "layers", "F", "B", "W", "fused", "mem_B", "mem_W", "static", "comm"):
        table.add_column(col, justify="left" if col in ("#", "layers") else "right", no_wrap=True)
    names = profile.stage_split or [["?"]] * profile.num_stages
    for r, st in enumerate(profile.stages):
        comm = _time(profile.comm[r], scale) if r < len(profile.comm) else "-"
        table.add_row(str(r), _span(names[r]), *(_time(v, scale) for v in (st.F, st.B, st.W, st.full_backward)),
                      _bytes(st.mem_B), _bytes(st.mem_W), _bytes(st.static_bytes), comm)
    sharding = ((profile.details.get("static") or {}).get("sharding") or {}).get("what")
    table.caption = (f"times in {unit} per microbatch (fused: B and W in one backward); memory in bytes, "
                     "K/M/G = 2^10/2^20/2^30; static: parameters, gradients, optimizer state"
                     + (f", {sharding}, with the largest layer's gathered weights and gradient" if sharding else ""))
    table.caption_justify = "left"
    return table


def headline(profile: Profile) -> str:
    src = profile.source
    if src.get("kind") == "measured":
        return f"measured on {src.get('device')} ({src.get('dtype')}, torch {src.get('torch')}) at {src.get('date')}"
    return f"estimated for {src.get('gpu')} at MFU {src.get('mfu')}: not measured"


def profile(
    model: ModelOpt = "gpt",
    layers: LayersOpt = None,
    hidden: HiddenOpt = None,
    heads: HeadsOpt = None,
    seq: SeqOpt = None,
    micro_batch: MicroBatchOpt = None,
    vocab: VocabOpt = None,
    kv_heads: KvHeadsOpt = None,
    ffn: FfnOpt = None,
    head_dim: HeadDimOpt = None,
    dense_layers: DenseLayersOpt = None,
    experts: ExpertsOpt = None,
    top_k: TopKOpt = None,
    expert_ffn: ExpertFfnOpt = None,
    shared_experts: SharedExpertsOpt = None,
    tp: TpOpt = 1,
    attention: AttentionOpt = None,
    p: StagesOpt = None,
    layers_per_stage: LayersPerStageOpt = None,
    m: ProfileMicrobatchesOpt = None,
    link_gbps: LinkOpt = None,
    optimizer: OptimizerOpt = "adam",
    dp_shard: DpShardOpt = None,
    sharding: ShardingOpt = "fsdp",
    devices: DevicesOpt = None,
    torch_stage0: TorchStage0Opt = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    warmup: WarmupOpt = DEFAULT_WARMUP,
    repeats: RepeatsOpt = DEFAULT_REPEATS,
    threads: ThreadsOpt = None,
    interleave: InterleaveOpt = True,
    memory_model: ProfileMemoryModelOpt = None,
    calibrate: CalibrateOpt = False,
    seed: SeedOpt = 0,
    estimate: EstimateOpt = False,
    gpu: GpuOpt = None,
    mfu: MfuOpt = DEFAULT_MFU,
    output: OutputOpt = None,
    name: NameOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Measure a model's per-layer F, B, W, memory and communication (or estimate them) into a profile.

    Each layer is timed alone: forward, backward for inputs (torch's I) and backward for weights (W) as
    separate passes, warm-up runs then the median of the repeats; the profile lists every layer and
    their split into -p stages. Feed the result to `zbsearch solve --profile PROFILE.json`.
    """
    shape_args = {"layers": layers, "hidden": hidden, "heads": heads, "seq": seq, "micro_batch": micro_batch,
                  "vocab": vocab, "kv_heads": kv_heads, "ffn": ffn, "head_dim": head_dim,
                  "dense_layers": dense_layers, "experts": experts, "top_k": top_k, "expert_ffn": expert_ffn,
                  "shared_experts": shared_experts}
    given = {k: v for k, v in shape_args.items() if v is not None}
    if gpu is not None and not estimate:
        raise ProfilerError(f"--gpu {gpu} goes with --estimate; to measure, run on the GPU with --device cuda")
    check_job(devices, p, dp_shard)  # before measuring (again after, once the stage count is known)
    split = StageSplit(stages=p, layers_per_stage=layers_per_stage)
    setup = PipelineSetup(microbatches=m, link_gbps=link_gbps, optimizer=optimizer, torch_stage0=torch_stage0)
    with _naming_flags():
        shape, preset = _shape(model, given)  # attention None: the library's default (naive for gpt, else sdpa)
        if estimate:
            result: Profile | None = _estimate(model, shape, preset, gpu, split, setup, mfu=mfu, dtype=dtype or "bf16",
                                               attention=attention, name=name, tp=tp)
        else:
            request = MeasureRequest(device=device, dtype=dtype, warmup=warmup, repeats=repeats, threads=threads,
                                     interleave=interleave)
            result = _measure(model, split, setup, request, shape=shape, attention=attention, seed=seed, name=name,
                              calibrate=calibrate, tp=tp)
        if result is None:  # a torchrun rank other than 0: it timed the link, rank 0 measures and writes
            return
        result = as_planned(result, dp_shard, sharding, memory_model, devices=devices)  # --memory-model: over the default
        if calibrate:
            result = calibrated(result)
    if output is not None:
        result.save(output)
    if json_out:
        sys.stdout.write(json.dumps(result.to_dict(), indent=1) + "\n")
        return
    _print_summary(result, output)


def _shape(model: str, given: dict[str, Any]) -> tuple[Shape | None, Preset | None]:
    """The built-in shape `model` names with the given shape flags, or (None, None) for a factory."""
    if not is_builtin(model):
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise ProfilerError(f"{flags} shape the built-in models; --model {model} builds its own layers "
                                "(drop those flags or use --model gpt, llama, moe or a preset)")
        return None, None
    return resolve_shape(model, given)


def _estimate(model: str, shape: Shape | None, preset: Preset | None, gpu: Optional[str], split: StageSplit,
              setup: PipelineSetup, **options: Any) -> Profile:
    if shape is None:
        raise ProfilerError(f"--estimate counts the FLOPs of the built-in models (gpt, llama, moe and the presets); "
                            f"measure {model} instead")
    if gpu is None:
        raise ProfilerError(f"--estimate needs --gpu {'|'.join(GPUS)}, e.g. --estimate --gpu h100 --mfu 0.4")
    return profile_estimate(shape, gpu.lower(), split, setup, preset=preset, **options)


def _measure(model: str, split: StageSplit, setup: PipelineSetup, request: MeasureRequest, *, calibrate: bool,
             **options: Any) -> Profile | None:
    """The measured profile (None on a torchrun rank other than 0: it only timed the link)."""
    if calibrate and torchrun_env() is not None:
        raise ProfilerError("--calibrate runs its own processes: under torchrun, write the profile first, then run "
                            "zbsearch calibrate PROFILE.json -o OUT.json under torchrun")
    with progress_bar("profiling", enabled=reports_here()) as bar:
        return profile_measured(model, split, setup, request, progress=bar, **options)


def _print_summary(result: Profile, output: Optional[Path]) -> None:
    out = stdout_console()
    out.print(summary_table(result))
    out.print(headline(result))
    for note in result.details.get("notes", []):
        out.print(f"note: {note}")
    if output is not None:
        out.print(f"wrote {output}; next: zbsearch solve --profile {output} --mem-limit 2p -o schedule.json")


def register(app: typer.Typer) -> None:
    """Add `zbsearch profile` to the CLI."""
    app.command("profile")(profile)

"""`zbsearch configure`: plan a whole training run on N GPUs (tensor, pipeline and data-parallel degrees,
sharding, microbatch size and count) with the schedule, split and recompute, and a certificate.

Parsing and naming the flags behind a library error live here; the work is
zbsearch.plan.wholerun.configure's and the tables configure_table.py's. The progress bar goes to stderr.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional

import typer

from ..core.errors import PlanError, ScheduleError
from ..core.memory import size_bytes
from ..interop.formats.torchtitan import resolve_version
from ..plan.wholerun.chosen import ChosenPlan, chosen_plan
from ..plan.wholerun.cluster import Cluster, make_cluster
from ..plan.wholerun.cost import PlanChoices
from ..plan.wholerun.exports import export_chosen
from ..plan.wholerun.outcome import Outcome
from ..plan.wholerun.shape import SHARDINGS, RunShape, Space
from ..plan.wholerun.shape_result import ShapeResult
from ..plan.wholerun.workload import DEFAULT_RUN_MFU, Workload
from ..profiling.hardware import GPUS
from ..profiling.presets import PRESETS, resolve_shape
from ..profiling.request import GptShape
from .configure_page import HtmlRunOpt, write_run_html
from .configure_table import progress_printer, render_outcome, write_chosen
from .console import print_error, stdout_console
from .options import JsonOpt, SeedOpt, flags_for
from .params import IntList, count_list_parser
from .profiling import (DenseLayersOpt, ExpertFfnOpt, ExpertsOpt, FfnOpt, HeadDimOpt, HeadsOpt, HiddenOpt,
    KvHeadsOpt, LayersOpt, SeqOpt, SharedExpertsOpt, TopKOpt, VocabOpt)

MODEL_PANEL, CLUSTER_PANEL, SPACE_PANEL, PLAN_PANEL = "Model and batch", "Cluster", "Shapes searched", "Plan"
SEARCH_PANEL, OUTPUT_PANEL = "Search", "Output"
# The flag each library error subject of whole-run planning comes from (cli/options.py's SUBJECT_FLAGS).
FLAGS = {"model": "--model", "global_batch": "--global-batch", "gpu": "--gpu", "gpus": "--gpus",
         "gpus_per_node": "--gpus-per-node", "intra_gbps": "--intra-gbps", "inter_gbps": "--inter-gbps",
         "link_efficiency": "--link-efficiency", "gpu_memory": "--gpu-memory", "mfu": "--mfu", "tp": "--tp",
         "pp": "--pp", "micro_batch": "--micro-batch", "sharding": "--sharding", "ep": "--ep", "current": "--current",
         "shape": "--current", "fixed": "--current", "results": "--results", "ray_address": "--ray",
         "workers": "--jobs", "min_share": "--time-limit", "dtype": "--dtype", "optimizer": "--optimizer",
         "export_dir": "--export-dir", "torchtitan": "--torchtitan", "schedules": "--schedules",
         "placement": "--placement", "recompute": "--recompute"}

ModelOpt = Annotated[str, typer.Option(
    "--model", metavar="llama|moe|PRESET", rich_help_panel=MODEL_PANEL,
    help=f"The model: llama or moe with the shape flags, or a preset ({', '.join(n for n in PRESETS if n != 'gpt3-2.7b')}); "
         "shape flags change a preset. Costs are estimated from FLOP counts at --mfu.")]
GlobalBatchOpt = Annotated[int, typer.Option(
    "--global-batch", metavar="B", rich_help_panel=MODEL_PANEL, min=1,
    help="Sequences per optimizer step over all replicas: B = m x b x d.")]
MfuOpt = Annotated[float, typer.Option(
    "--mfu", metavar="FRACTION", rich_help_panel=MODEL_PANEL,
    help=f"Share of the GPU's dense peak the matrix work runs at. Default {DEFAULT_RUN_MFU}: calibrated against "
         "torchtitan's Llama 3.1 8B, FSDP on 8 H100, 5,762 tokens/s/GPU (results/calibrate_mfu.md); "
         "results/h200_block_mfu.md measures it per block.")]
GpuOpt = Annotated[str, typer.Option(
    "--gpu", metavar="|".join(GPUS), rich_help_panel=CLUSTER_PANEL, help="GPU kind (datasheet peak, memory, links).")]
GpusOpt = Annotated[int, typer.Option(
    "--gpus", metavar="N", rich_help_panel=CLUSTER_PANEL, help="GPUs the run uses: N = t x p x d.")]
PerNodeOpt = Annotated[int, typer.Option(
    "--gpus-per-node", metavar="G", rich_help_panel=CLUSTER_PANEL, help="GPUs a node holds (tensor parallelism stays inside one).")]
IntraOpt = Annotated[Optional[float], typer.Option(
    "--intra-gbps", metavar="Gb/s", rich_help_panel=CLUSTER_PANEL,
    help="Link inside a node, each way per GPU. Default: the GPU's NVLink (3600 for NVLink 4's 450 GB/s).")]
InterOpt = Annotated[Optional[float], typer.Option(
    "--inter-gbps", metavar="Gb/s", rich_help_panel=CLUSTER_PANEL,
    help="Link between nodes, each way per GPU. Default 400 (H100, H200), 200 (A100).")]
EfficiencyOpt = Annotated[Optional[float], typer.Option(
    "--link-efficiency", metavar="SHARE", rich_help_panel=CLUSTER_PANEL,
    help="Share of a link's datasheet bandwidth collectives reach. Default 0.8 (assumed, not measured).")]
GpuMemoryOpt = Annotated[Optional[str], typer.Option(
    "--gpu-memory", metavar="SIZE", rich_help_panel=CLUSTER_PANEL, help="Memory per GPU (80GB, 96GiB). Default: the datasheet's.")]
TpOpt = Annotated[Optional[IntList], typer.Option(
    "--tp", metavar="T[,T..]", rich_help_panel=SPACE_PANEL, parser=count_list_parser("tensor-parallel degrees", "8 or 4,8"),
    help="Tensor-parallel degrees to try. Default: every degree that splits the heads inside a node.")]
PpOpt = Annotated[Optional[IntList], typer.Option(
    "--pp", metavar="P[,P..]", rich_help_panel=SPACE_PANEL, parser=count_list_parser("pipeline degrees", "4 or 2,4,8"),
    help="Pipeline degrees to try (1: no pipeline). Default: 1 up to the blocks.")]
MicroBatchOpt = Annotated[Optional[IntList], typer.Option(
    "--micro-batch", metavar="b[,b..]", rich_help_panel=SPACE_PANEL, parser=count_list_parser("microbatch sizes", "1 or 1,2"),
    help="Sequences per microbatch to try. Default 1, 2, 4, 8.")]
ShardingListOpt = Annotated[Optional[str], typer.Option(
    "--sharding", metavar="|".join(SHARDINGS), rich_help_panel=SPACE_PANEL,
    help="Data-parallel shardings to try, comma-separated (docs/whole-run.md). Default: all.")]
EpOpt = Annotated[Optional[IntList], typer.Option(
    "--ep", metavar="E[,E..]", rich_help_panel=SPACE_PANEL, parser=count_list_parser("expert-parallel degrees", "8"),
    help="moe: expert-parallel degrees to try. Default: every degree dividing d and the experts.")]
CurrentOpt = Annotated[Optional[str], typer.Option(
    "--current", metavar="'tp8 pp4 fsdp b1'", rich_help_panel=SPACE_PANEL,
    help="The configuration you run today, evaluated beside the best: tpT ppP \\[dpD] SHARDING bB \\[epE].")]
PlacementOpt = Annotated[str, typer.Option(
    "--placement", rich_help_panel=PLAN_PANEL, help="Placement for every shape's joint search (auto: it chooses).")]
RecomputeOpt = Annotated[str, typer.Option(
    "--recompute", rich_help_panel=PLAN_PANEL, help="Recompute for every shape: auto-layers (searched), none, full.")]
SchedulesOpt = Annotated[str, typer.Option(
    "--schedules", metavar="all|1f1b-family", rich_help_panel=PLAN_PANEL,
    help="Schedules each shape may use: all (the joint search) or 1f1b-family (1F1B and interleaved 1F1B at an "
         "even or balanced split, recompute none or full: what Mist- and Megatron-style planners search).")]
TimeLimitOpt = Annotated[float, typer.Option(
    "--time-limit", metavar="SECONDS", rich_help_panel=SEARCH_PANEL, min=0.0,
    help="Joint-search time of the most promising shape; others get less, in proportion to their bound.")]
JobsOpt = Annotated[int, typer.Option(
    "--jobs", metavar="N", rich_help_panel=SEARCH_PANEL, help="Shapes solved at once (local processes or Ray tasks).")]
WorkersOpt = Annotated[int, typer.Option(
    "--workers", metavar="N", rich_help_panel=SEARCH_PANEL, min=1, help="CP-SAT worker threads per shape.")]
RayOpt = Annotated[Optional[str], typer.Option(
    "--ray", metavar="ADDRESS|auto", rich_help_panel=SEARCH_PANEL,
    help="Run the shapes as tasks on this running Ray cluster (pip install 'zbsearch\\[ray]').")]
ResultsOpt = Annotated[Optional[Path], typer.Option(
    "--results", metavar="FILE.jsonl", rich_help_panel=SEARCH_PANEL,
    help="Append each finished shape here; a rerun with the same arguments reuses them.")]
MeasuredOpt = Annotated[Optional[list[Path]], typer.Option(
    "--measured", metavar="PROFILE.json", rich_help_panel=MODEL_PANEL,
    help="A profile measured on the cluster's GPU kind (zbsearch profile --tp T --micro-batch b on a GPU); a shape "
         "whose share it measured uses its layer costs instead of the estimate. Repeat for several.")]
TopOpt = Annotated[int, typer.Option(
    "--top", metavar="N", rich_help_panel=OUTPUT_PANEL, min=1, help="Rows of the ranked table.")]
PlanOutOpt = Annotated[Optional[Path], typer.Option(
    "-o", "--output", metavar="PLAN.json", rich_help_panel=OUTPUT_PANEL,
    help="Write the chosen plan's schedule JSON here (validated; atomically).")]

ExportDirOpt = Annotated[Optional[Path], typer.Option(
    "--export-dir", metavar="DIR", rich_help_panel=OUTPUT_PANEL,
    help="Write the chosen plan for its trainers into DIR, all files or none: torchtitan_config.py (apply_plan), "
         "schedule.csv and schedule.json (p > 1), megatron_args.txt, plan.json. A trainer that cannot run the plan "
         "as planned gets one line saying why instead of its files (docs/whole-run.md).")]
TitanVersionOpt = Annotated[Optional[str], typer.Option(
    "--torchtitan", metavar="main|0.3", rich_help_panel=OUTPUT_PANEL,
    help="With --export-dir, the torchtitan to write for. Default: the torchtitan installed here, else main.")]

_CURRENT_WORD = re.compile(r"^(tp|pp|dp|ep|b|m)(\d+)$")


def parse_current(text: str, workload: Workload, gpus: int) -> RunShape:
    """`tp8 pp4 fsdp b1` (dp and m derived from the GPUs and the batch) as a shape."""
    values: dict[str, Any] = {"tp": 1, "pp": 1, "ep": 1, "b": 1}
    for word in text.replace(",", " ").split():
        match = _CURRENT_WORD.match(word.lower())
        if match:
            values[match.group(1)] = int(match.group(2))
        elif word.lower() in SHARDINGS:
            values["sharding"] = word.lower()
        else:
            raise PlanError(f"configuration word {word!r} is none of tpT ppP dpD bB mM epE or a sharding "
                            f"({', '.join(SHARDINGS)}): write e.g. 'tp8 pp4 fsdp b1'", subject="current")
    t, p, b = values["tp"], values["pp"], values["b"]
    d = values.get("dp", gpus // (t * p) if t * p and gpus % (t * p) == 0 else 0)
    if d < 1 or t * p * d != gpus:
        raise PlanError(f"configuration {text!r} does not use the {gpus} GPUs: give tp and pp with tp x pp dividing "
                        f"{gpus}", subject="current")
    if workload.global_batch % (d * b):
        raise PlanError(f"configuration {text!r}: the global batch {workload.global_batch} is not m x b x d for b {b}, "
                        f"d {d}: give a microbatch size that divides {workload.global_batch // d if workload.global_batch >= d else 1}",
                        subject="current")
    m = values.get("m", workload.global_batch // (d * b))
    return RunShape(t, p, d, b, m, values.get("sharding", "fsdp" if d > 1 else "ddp"), values["ep"])


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler's kill, `timeout`) stops the search as Ctrl-C does, so that its pool's worker
    processes are ended too and the finished shapes stay in the results file."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _workload(model: str, given: dict[str, Any], global_batch: int, mfu: float,
              measured: tuple[str, ...] = ()) -> Workload:
    shape, preset = resolve_shape(model, {k: v for k, v in given.items() if v is not None})
    if isinstance(shape, GptShape):
        raise PlanError("whole-run planning models llama and moe shapes (tensor parallelism splits their heads): use "
                        "--model llama, moe or a preset such as llama3-8b", subject="model")
    return Workload(shape, global_batch, mfu=mfu, preset=preset.name if preset else None, measured=measured).check()


def _space(tp: Optional[IntList], pp: Optional[IntList], micro_batch: Optional[IntList], sharding: Optional[str],
           ep: Optional[IntList]) -> Space:
    shardings = None if sharding is None else tuple(s.strip().lower() for s in sharding.split(",") if s.strip())
    return Space(tuple(tp) if tp else None, tuple(pp) if pp else None, tuple(micro_batch) if micro_batch else None,
                 shardings, tuple(ep) if ep else None).check()


def _gpu_memory(text: Optional[str]) -> float | None:
    if text is None:
        return None
    sized = size_bytes(text)
    if sized is None:
        raise PlanError(f"GPU memory {text!r} is not a size: write e.g. 80GB or 96GiB", subject="gpu_memory")
    return sized[0]


def _chosen(result: ShapeResult | None, workload: Workload, cluster: Cluster,
            choices: PlanChoices) -> ChosenPlan | None:
    """The chosen plan rebuilt and validated once for every file the run writes (None: no shape gave one).
    A plan the search chose that does not validate is a bug, not a user error: exit 3, nothing written."""
    if result is None:
        return None
    try:
        return chosen_plan(result, workload, cluster, choices)
    except ScheduleError as exc:
        print(f"internal error: {exc}", file=sys.stderr)
        raise SystemExit(3) from None


def _write_outputs(plan: ChosenPlan | None, outcome: Outcome[ShapeResult], workload: Workload, cluster: Cluster,
                   output: Optional[Path], html: Optional[Path], export_dir: Optional[Path],
                   torchtitan: Optional[str]) -> None:
    """The files asked for, in order: the schedule (-o), the page (--html), the trainers' (--export-dir)."""
    if output is not None:
        write_chosen(plan, output)
    write_run_html(html, outcome, workload, cluster, plan)
    if export_dir is not None:  # every line of it on stderr: stdout is the table or the JSON
        exported = export_chosen(plan, export_dir, workload, cluster, torchtitan)
        print("\n".join(exported.lines(export_dir)), file=sys.stderr)


def register(app: typer.Typer) -> None:
    app.command("configure")(configure_command)


def configure_command(
    model: ModelOpt, global_batch: GlobalBatchOpt, gpus: GpusOpt, gpu: GpuOpt = "h100", gpus_per_node: PerNodeOpt = 8,
    layers: LayersOpt = None, hidden: HiddenOpt = None, heads: HeadsOpt = None, kv_heads: KvHeadsOpt = None,
    ffn: FfnOpt = None, head_dim: HeadDimOpt = None, seq: SeqOpt = None, vocab: VocabOpt = None,
    dense_layers: DenseLayersOpt = None, experts: ExpertsOpt = None, top_k: TopKOpt = None,
    expert_ffn: ExpertFfnOpt = None, shared_experts: SharedExpertsOpt = None, mfu: MfuOpt = DEFAULT_RUN_MFU,
    measured: MeasuredOpt = None,
    intra_gbps: IntraOpt = None, inter_gbps: InterOpt = None, link_efficiency: EfficiencyOpt = None,
    gpu_memory: GpuMemoryOpt = None, tp: TpOpt = None, pp: PpOpt = None, micro_batch: MicroBatchOpt = None,
    sharding: ShardingListOpt = None, ep: EpOpt = None, current: CurrentOpt = None, placement: PlacementOpt = "auto",
    recompute: RecomputeOpt = "auto-layers", schedules: SchedulesOpt = "all", time_limit: TimeLimitOpt = 20.0,
    jobs: JobsOpt = 1, workers: WorkersOpt = 2, seed: SeedOpt = 0, ray: RayOpt = None, results: ResultsOpt = None,
    top: TopOpt = 10, as_json: JsonOpt = False, output: PlanOutOpt = None, html: HtmlRunOpt = None,
    export_dir: ExportDirOpt = None, torchtitan: TitanVersionOpt = None,
) -> None:
    """Plan a training run on N GPUs: tensor, pipeline and data-parallel degrees, sharding, microbatch size
    and count, with the schedule, split and recompute of each; a ranked table and a certificate.

    Branch and bound across shapes: every shape gets a lower bound on its step time, the promising ones are
    solved best bound first with the joint search, the rest are pruned against the best plan, so the report
    can say how far any shape of the space could be from the chosen plan (under the cost model:
    docs/whole-run.md).
    """
    # defers the search (OR-Tools) until the flags are read
    from ..plan.wholerun.configure import configure
    # defers the search (OR-Tools), as above
    from ..plan.wholerun.search import Settings
    # defers the search (OR-Tools), as above
    from ..search.options import SearchOptions

    given = {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "ffn": ffn,
             "head_dim": head_dim, "seq": seq, "vocab": vocab, "dense_layers": dense_layers, "experts": experts,
             "top_k": top_k, "expert_ffn": expert_ffn, "shared_experts": shared_experts}
    with flags_for(FLAGS):
        workload = _workload(model, given, global_batch, mfu, tuple(str(p) for p in measured or ()))
        cluster = make_cluster(gpu, gpus, gpus_per_node, intra_gbps=intra_gbps, inter_gbps=inter_gbps,
                               efficiency=link_efficiency, memory_bytes=_gpu_memory(gpu_memory))
        space = _space(tp, pp, micro_batch, sharding, ep)
        fixed = None if current is None else parse_current(current, workload, gpus)
        if torchtitan is not None:
            resolve_version(torchtitan)  # an unknown version fails before the search, not after it
        choices = PlanChoices(placement=placement, recompute=recompute, schedules=schedules.strip().lower())
        if output is not None and output.is_dir():
            raise PlanError(f"output {output} is a folder: give a file path for the plan JSON", subject="output")
        with progress_printer(enabled=not as_json) as progress, _terminate_as_interrupt():
            settings = Settings(workers=jobs, ray_address=ray, results=results, fixed=fixed, progress=progress)
            try:
                outcome = configure(workload, cluster, space, choices,
                                    SearchOptions(time_limit=time_limit, workers=workers, seed=seed), settings)
            except KeyboardInterrupt:
                kept = f"the shapes finished so far are in {results}: run the same command to go on" if results \
                    else "nothing was kept: give --results FILE to keep finished shapes across runs"
                print_error(f"interrupted; {kept}")
                raise typer.Exit(130) from None
        if output is not None or html is not None or export_dir is not None:
            plan = _chosen(outcome.chosen, workload, cluster, choices)
            _write_outputs(plan, outcome, workload, cluster, output, html, export_dir, torchtitan)
    if as_json:
        print(json.dumps(outcome.table(), allow_nan=False))
        return
    render_outcome(stdout_console(), outcome, workload, cluster, top)

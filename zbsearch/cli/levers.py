"""The memory levers on the command line: --memory-model, --dp-shard / --sharding and --recompute applied
to a profile (core/sharding.py, core/recompute_choice.py), and the warnings for plans that torch's
runtime will run with more memory, or without the recompute they were made with."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Optional

import typer

from ..core.errors import ZbsearchError
from ..core.ir import Schedule
from ..core.profile import Profile
from ..core.recompute_choice import levels_for_every_microbatch, parse_recompute, with_recompute
from ..core.sharding import Sharding, check_devices, shard_profile
from .console import print_warning
from .options import PROBLEM_PANEL, naming_subjects
from .params import parse_memory_model

AUTO_RECOMPUTE = ("auto", "auto-layers")  # the search chooses (search/partition/recompute.py)
MemoryModelOpt = Annotated[Optional[str], typer.Option(
    "--memory-model", metavar="paper|torch-runtime", rich_help_panel=PROBLEM_PANEL, parser=parse_memory_model,
    help="Memory accounting plans use: torch-runtime (what torch's pipelining runtime holds, measured by the "
         "profiler) or paper (the Zero Bubble paper's). Default: keep the profile's.")]
RecomputeOpt = Annotated[Optional[str], typer.Option(
    "--recompute", metavar="none|auto|auto-layers|full|selective|fixed:NAME[=LEVEL],...",
    rich_help_panel=PROBLEM_PANEL, show_default=False,
    help="Activation recompute, from the profile's per-layer options: auto (the search chooses which layers each "
         "rank recomputes, with the split and the schedule, and which microbatches need it), auto-layers (the "
         "same on every microbatch: what torchtitan and Megatron run), full or selective on every layer that "
         "lists it, or fixed: the named layers (first..last ranges; =full, the default, or =selective). "
         "Default: none.",
)]
DpShardOpt = Annotated[Optional[int], typer.Option(
    "--dp-shard", metavar="N", rich_help_panel=PROBLEM_PANEL, show_default=False,
    help="Data-parallel ranks that share each pipeline rank's static bytes (--sharding says which): rescales the "
         "profile's per-layer static bytes and adds the largest layer's gathered weights and gradient (FSDP). "
         "Default: no sharding.",
)]
DevicesOpt = Annotated[Optional[int], typer.Option(
    "--devices", metavar="N", rich_help_panel=PROBLEM_PANEL, show_default=False,
    help="GPUs in the training job: checks that the pipeline's stages times --dp-shard divide it (tensor, "
         "context and replicated data parallelism take the rest). Default: not checked.",
)]
ShardingOpt = Annotated[str, typer.Option(
    "--sharding", metavar="fsdp|zero1|zero2", rich_help_panel=PROBLEM_PANEL,
    help="With --dp-shard: fsdp (ZeRO-3: parameters, gradients and optimizer state; torchtitan's default), zero1 "
         "(optimizer state) or zero2 (optimizer state and gradients).",
)]


def check_job(devices: int | None, stages: int | None, dp_shard: int | None) -> None:
    """--devices against the pipeline's stages and --dp-shard (core/sharding.check_devices); nothing to
    check without --devices or before the stage count is known."""
    if devices is not None and stages is not None:
        with naming_subjects({"--devices": "device count"}):
            check_devices(devices, stages, dp_shard or 1)


def as_planned(prof: Profile, dp_shard: int | None, sharding: str, memory_model: str | None = None,
               recompute: str | None = None, devices: int | None = None, stages: int | None = None) -> Profile:
    """The profile with --memory-model, --dp-shard / --sharding (core/sharding.py) and --recompute
    (core/recompute_choice.py) applied, --devices checked against the pipeline's `stages` (default: the
    profile's); unchanged without them."""
    check_job(devices, stages or prof.num_stages, dp_shard)
    if memory_model is not None:
        prof = replace(prof, memory_model=memory_model)
    if dp_shard is None and sharding != "fsdp":
        raise ZbsearchError(f"--sharding {sharding} goes with --dp-shard N: give the data-parallel degree too")
    if dp_shard is not None:
        with naming_subjects({"--dp-shard": "data-parallel shard degree", "--sharding": "sharding"}):
            prof = shard_profile(prof, Sharding(dp_shard, sharding.strip().lower()))
    if recompute is None or recompute.strip() == "none":
        return prof
    if recompute.strip() in AUTO_RECOMPUTE and prof.layers is not None:
        return prof  # the search chooses (search/partition/recompute.py)
    if prof.layers is None:
        raise ZbsearchError(f"--recompute chooses among the recompute options of a profile's layers, and profile "
                            f"{prof.label} lists no layers: profile the model with zbsearch profile")
    with naming_subjects({"--recompute": "recompute"}):
        return with_recompute(prof, parse_recompute(recompute, prof.layers))


def warn_paper_accounting(prof: Profile | None, target: str) -> None:
    """Say when a profile plans with the paper's memory accounting for a plan torch's runtime will run,
    which holds more (its split backward keeps the graph from I until W)."""
    if prof is not None and prof.memory_model == "paper" and prof.memory_unit == "bytes":
        print_warning(f"profile {prof.label} plans with the Zero Bubble paper's memory accounting, but {target} runs "
                      "on torch's runtime, which holds more (its split backward keeps the graph from I until W): "
                      "plan with --memory-model torch-runtime")


def warn_every_microbatch(schedule: Schedule, what: str) -> None:
    """Say when a plan recomputes only some microbatches of a chunk, which `what` (a trainer that recomputes
    a layer for every microbatch) cannot express."""
    _, partial = levels_for_every_microbatch(schedule.meta, schedule.name, schedule.placement.num_chunks,
                                             schedule.num_microbatches)
    if partial:
        print_warning(f"schedule {schedule.name!r} recomputes only some microbatches on chunk(s) "
                      f"{', '.join(map(str, partial))} (meta.partition.recompute_microbatches); {what} recomputes "
                      "every microbatch of those layers: no more memory than the plan, more time")

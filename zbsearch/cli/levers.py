"""The memory levers on the command line: --memory-model, --dp-shard / --sharding and --recompute applied
to a profile (core/sharding.py, core/recompute/levels.py), and the warnings for plans that torch's
runtime will run with more memory, or without the recompute they were made with."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..core.errors import ZbsearchError
from ..core.ir import Schedule
from ..core.profile import Profile
from ..core.sharding import check_devices
from ..search.entry.request import PlanRequest, planned_profile
from .console import print_warning
from .options import PROBLEM_PANEL
from .params import parse_memory_model

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
    "--sharding", metavar="fsdp|zero1|zero2|fsdp-whole-grads", rich_help_panel=PROBLEM_PANEL,
    help="With --dp-shard: fsdp (ZeRO-3: parameters, gradients and optimizer state; torchtitan's default), zero1 "
         "(optimizer state), zero2 (optimizer state and gradients) or fsdp-whole-grads (parameters and optimizer "
         "state, gradients whole until the step's sync, as torch's pipelining stage accumulates them).",
)]


def check_job(devices: int | None, stages: int | None, dp_shard: int | None) -> None:
    """--devices against the pipeline's stages and --dp-shard (core/sharding.check_devices); nothing to
    check without --devices or before the stage count is known."""
    if devices is not None and stages is not None:
        check_devices(devices, stages, dp_shard or 1)


def as_planned(prof: Profile, dp_shard: int | None, sharding: str, memory_model: str | None = None,
               recompute: str | None = None, devices: int | None = None, stages: int | None = None) -> Profile:
    """The profile with --memory-model, --dp-shard / --sharding and --recompute applied, --devices checked
    against the pipeline's `stages` (default: the profile's): search.entry.planned_profile, the same the
    library's find_plan applies; unchanged without them."""
    if dp_shard is None and sharding != "fsdp":
        raise ZbsearchError(f"--sharding {sharding} goes with --dp-shard N: give the data-parallel degree too")
    return planned_profile(prof, PlanRequest(None, stages=stages, memory_model=memory_model, recompute=recompute,
                                             dp_shard=dp_shard, sharding=sharding, devices=devices))


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
    _, partial = schedule.plan.levels_for_every_microbatch(schedule.num_microbatches)
    if partial:
        print_warning(f"schedule {schedule.name!r} recomputes only some microbatches on chunk(s) "
                      f"{', '.join(map(str, partial))} (plan.recompute_microbatches); {what} recomputes "
                      "every microbatch of those layers: no more memory than the plan, more time")

"""torchtitan's side of an export: the config that runs a schedule's CSV with its layer split and
everything else the plan fixes (torchtitan_plan.py), written for the torchtitan a user has.

Three versions, each checked against its source (pytorch/torchtitan):
- "0.2": tag v0.2.2 (73a0e697, 2026-02-20). A TOML job config (`--job.config_file`); the `[parallelism]`
  keys pipeline_parallel_degree, pipeline_parallel_schedule, pipeline_parallel_schedule_csv and
  module_fqns_per_model_part (config/job_config.py, class Parallelism); microbatches are
  training.local_batch_size / parallelism.pipeline_parallel_microbatch_size. The head module is `output`.
- "0.3": 0.3.0 from PyPI (2026-09), installed and run by tests/interop/formats/test_torchtitan_run.py.
  Python configs (`Trainer.Config`, `--module M --config FN`), head `lm_head`, and the microbatches of
  0.2: training.local_batch_size / parallelism.pipeline_parallel_microbatch_size (no num_pp_microbatches).
- "main": main at b5bcd76c (2026-08-21), read, not run. Configs are Python functions returning a
  `Trainer.Config` (since 9810191b, 2026-02-23); the pipeline fields live on `config.parallelism`
  (config/configs.py, ParallelismConfig), the microbatch count is `parallelism.num_pp_microbatches` and
  its size `training.num_tokens_per_microbatch_per_dp_rank` (since 73aed7f6, 2026-08-20). The head module
  is `lm_head` (since 786e26f8, 2026-04-27; models/common/decoder.py).

Every version: the decoder models (Llama 3, Qwen3, DeepSeek-V3) have the top-level modules
tok_embeddings, layers (keys "0".."L-1", module paths layers.<i>), norm and the head. Splitting
(`pipeline_module_split` on 0.2, `_split_module` later) keeps in each stage the modules listed for it
and sets every other top-level module to None without an error, so a module no part lists silently
vanishes from the model: the export refuses such a split. The stages a rank builds follow
pipeline_parallel_schedule even when a CSV gives the order (the runtime is then
_PipelineScheduleRuntime whatever the name): ZBVZeroBubble and DualPipeV build r and 2p-1-r on rank r,
every other name r, r+p, ...
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Mapping

from ...core.errors import PartitionError, ZbsearchError
from ...core.ir import Schedule
from ...core.plan_record import Split
from ...core.profile import Profile
from .torchtitan_plan import TitanPlan, titan_plan
from .torchtitan_python import torchtitan_python
from .trainers import TORCHTITAN_V, torchtitan_schedule_name

VERSIONS = ("main", "0.3", "0.2")
CHECKED = {"main": "main at b5bcd76c (2026-08-21)", "0.3": "0.3.0", "0.2": "v0.2.2"}
HEAD = {"main": "lm_head", "0.3": "lm_head", "0.2": "output"}
CONFIG_SUFFIX = {"main": ".py", "0.3": ".py", "0.2": ".toml"}
_LAYER = re.compile(r"layers\.(\d+)")


def installed_version() -> str | None:
    """The version of the torchtitan installed here, told by its files (a main checkout's own version
    string is not its version): "0.2" where config/job_config.py exists, "main" where config/configs.py
    names num_pp_microbatches, "0.3" where it does not; None when torchtitan is not installed. Nothing is
    imported."""
    try:
        spec = importlib.util.find_spec("torchtitan")
    except (ImportError, ValueError):
        return None
    folders = list(spec.submodule_search_locations or ()) if spec is not None else []
    for folder in map(Path, folders):
        if (folder / "config" / "job_config.py").exists():
            return "0.2"
        configs = folder / "config" / "configs.py"
        if configs.exists():
            return "main" if "num_pp_microbatches" in configs.read_text(errors="replace") else "0.3"
    return None


def resolve_version(requested: str | None) -> tuple[str, str]:
    """The torchtitan version to write for and why: the one asked for, else the installed one, else main."""
    if requested is not None:
        if requested not in VERSIONS:
            raise ZbsearchError(f"torchtitan version {requested!r} is not known: use main or 0.3 (Python configs, "
                                "head lm_head) or 0.2 (TOML configs, head output)", subject="torchtitan")
        return requested, "as asked"
    found = installed_version()
    return (found, "the torchtitan installed here") if found else ("main", "the default: no torchtitan installed here")


def _modules_in_version(split: Split, version: str) -> tuple[tuple[str, ...], ...]:
    """The split's module paths with the head named as `version` names it."""
    rename = {"output": HEAD[version], "lm_head": HEAD[version]}
    return tuple(tuple(rename.get(m, m) for m in chunk) for chunk in split.modules)


def _stages_of(parts: tuple[tuple[str, ...], ...]) -> dict[str, list[int]]:
    where: dict[str, list[int]] = {}
    for c, chunk in enumerate(parts):
        for module in chunk:
            where.setdefault(module, []).append(c)
    return where


def torchtitan_parts(split: Split, version: str) -> list[list[str]]:
    """module_fqns_per_model_part for `version`: the split's modules with the head renamed, checked to
    name every top-level module of torchtitan's decoder models exactly once.

    Raises
    ------
    PartitionError
        A module that is not one of them, one listed twice, one left out, or MTP layers (which
        torchtitan does not pipeline).
    """
    if any("mtp" in kinds for kinds in split.kinds):
        raise PartitionError("the split has MTP layers: torchtitan does not pipeline them (main raises "
                             "NotImplementedError for MTP with pipeline parallelism); solve without them")
    parts = _modules_in_version(split, version)
    head, where = HEAD[version], _stages_of(parts)
    known = f"tok_embeddings, layers.<i>, norm and {head}"
    for module, stages in where.items():
        if module not in ("tok_embeddings", "norm", head) and not _LAYER.fullmatch(module):
            raise PartitionError(f"module {module!r} (stage {stages[0]}) is not a module of torchtitan's decoder "
                                 f"models ({known}): torchtitan builds the model itself and splits it by these names; "
                                 "solve on a profile whose layers carry them (an estimated llama, moe or preset "
                                 "profile), or hand your trainer the split yourself")
        if len(stages) > 1:
            raise PartitionError(f"module {module!r} is listed in stages {stages[0]} and {stages[1]}: torchtitan builds "
                                 "each module in one stage; give every module to exactly one stage")
    blocks = [int(found.group(1)) for m in where if (found := _LAYER.fullmatch(m))]
    expected = ["tok_embeddings", *(f"layers.{i}" for i in range(max(blocks, default=-1) + 1)), "norm", head]
    missing = [m for m in expected if m not in where]
    if missing:
        raise PartitionError(f"the split leaves module {missing[0]!r} in no stage: torchtitan ({CHECKED[version]}) "
                             "would drop it without an error (it sets unlisted modules to None); give every one of "
                             f"{known} a stage")
    return [list(chunk) for chunk in parts]


def layout_words(schedule: Schedule, name: str) -> str:
    n, p = schedule.placement.num_chunks, schedule.num_ranks
    if name == TORCHTITAN_V:
        return "rank r builds stages r and 2p-1-r"
    return "rank r builds stage r" if n == p else "rank r builds stages r + k*p for k = 0, 1, ..."


def _header(schedule: Schedule, version: str) -> str:
    p, n, m = schedule.num_ranks, schedule.placement.num_chunks, schedule.num_microbatches
    return (f"torchtitan {CHECKED[version]}: zbsearch schedule {schedule.name!r} as planned (placement "
            f"{schedule.placement.name}: {p} ranks, {n} stages, {m} microbatches).")


def _toml_tables(plan: TitanPlan) -> list[str]:
    """The [training] and [activation_checkpoint] tables of 0.2 (the [parallelism] one is above them)."""
    return ["", "[training]", f"local_batch_size = {plan.microbatches * plan.micro_batch}",
            f"seq_len = {plan.seq}", "", "[activation_checkpoint]",
            f"mode = {json.dumps('full' if plan.recompute_mode == 'full' else 'none')}"]


def torchtitan_toml(schedule: Schedule, plan: TitanPlan) -> str:
    """torchtitan 0.2's tables that run `plan`: [parallelism], [training] and [activation_checkpoint]."""
    rows = "".join(f"    [{', '.join(json.dumps(x, ensure_ascii=False) for x in row)}],\n" for row in plan.parts)
    shard = [] if plan.shard_degree is None else [
        f"data_parallel_shard_degree = {plan.shard_degree}", "data_parallel_replicate_degree = 1",
        f"fsdp_reshard_after_forward = {json.dumps(plan.reshard)}"]
    return "\n".join([
        "# " + _header(schedule, "0.2"),
        "# Merge these tables into the job's TOML config (--job.config_file). For torchtitan 0.3 or main",
        "# (Python configs, head lm_head) export with --torchtitan 0.3 or --torchtitan main.",
        f"# Part i is torch's stage i; {layout_words(schedule, plan.schedule)}. Leave pipeline_parallel_layers_per_stage unset.",
        f"# {plan.microbatches} microbatches of {plan.micro_batch} x {plan.seq} tokens (local_batch_size / microbatch size);",
        "# keep a model flavor without FlexAttention (0.2's default flavors use SDPA).",
        "[parallelism]",
        f"pipeline_parallel_degree = {plan.degree}",
        f"pipeline_parallel_schedule = {json.dumps(plan.schedule)}",
        # json.dumps of a str (ensure_ascii off) is a valid TOML basic string: same quotes and escapes.
        f"pipeline_parallel_schedule_csv = {json.dumps(plan.csv, ensure_ascii=False)}",
        f"pipeline_parallel_microbatch_size = {plan.micro_batch}",
        f"module_fqns_per_model_part = [\n{rows}]",
        *shard,
    ] + _toml_tables(plan)) + "\n"


def torchtitan_config(schedule: Schedule, split: Split, csv_path: str, version: str,
                      levels: Mapping[str, str] | None = None, profile: Profile | None = None) -> str:
    """The config file for `version` (TOML for 0.2, Python for 0.3 and main): the split checked first,
    then everything else the plan fixes (torchtitan_plan.titan_plan), with the plan's recompute `levels`
    and the microbatch of `profile`.

    Raises
    ------
    PartitionError, ScheduleError, ProfileError, ZbsearchError
        A split torchtitan would not build, one rank, no recorded microbatch, recompute torchtitan cannot
        apply (or, on 0.2, some blocks but not all: its TOML applies one mode to every block), ZeRO-1.
    """
    parts = torchtitan_parts(split, version)  # refuses a split that does not name every module once
    plan = titan_plan(schedule, split, parts, csv_path, torchtitan_schedule_name(schedule), profile, levels or {})
    if version != "0.2":
        return torchtitan_python(plan, version, _header(schedule, version), layout_words(schedule, plan.schedule))
    if plan.recompute_mode == "planned":
        raise PartitionError(f"the plan recomputes blocks {plan.recompute} (per part) and not the others: torchtitan "
                             "0.2 applies one activation-checkpointing mode to every block; export for torchtitan "
                             "0.3 or main (their Python config wraps just these blocks), or plan full or no recompute")
    return torchtitan_toml(schedule, plan)

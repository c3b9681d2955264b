"""torchtitan's side of an export: the config that runs a schedule's CSV with its layer split, written for
the torchtitan a user has.

Two versions, each checked against its source (pytorch/torchtitan):
- "0.2": tag v0.2.2 (73a0e697, 2026-02-20). A TOML job config (`--job.config_file`); the `[parallelism]`
  keys pipeline_parallel_degree, pipeline_parallel_schedule, pipeline_parallel_schedule_csv and
  module_fqns_per_model_part (config/job_config.py, class Parallelism); microbatches are
  training.local_batch_size / parallelism.pipeline_parallel_microbatch_size. The head module is `output`.
- "main": main at b5bcd76c (2026-08-21). Configs are Python functions returning a `Trainer.Config`
  (since 9810191b, 2026-02-23), chosen with `--module M --config FN`; the same four fields live on
  `config.parallelism` (config/configs.py, ParallelismConfig), and the microbatch count is
  `parallelism.num_pp_microbatches` (since 73aed7f6, 2026-08-20). The head module is `lm_head` (since
  786e26f8, 2026-04-27; models/common/decoder.py).

Both versions: the decoder models (Llama 3, Qwen3, DeepSeek-V3) have the top-level modules
tok_embeddings, layers (keys "0".."L-1", module paths layers.<i>), norm and the head. Splitting
(`pipeline_module_split` on 0.2, `_split_module` on main) keeps in each stage the modules listed for it
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
from .trainers import TORCHTITAN_V, torchtitan_schedule_name

VERSIONS = ("main", "0.2")
CHECKED = {"main": "main at b5bcd76c (2026-08-21)", "0.2": "v0.2.2"}
HEAD = {"main": "lm_head", "0.2": "output"}
CONFIG_SUFFIX = {"main": ".py", "0.2": ".toml"}
_LAYER = re.compile(r"layers\.(\d+)")


def installed_version() -> str | None:
    """The version of the torchtitan installed here, told by its files (its own version string says 0.2.2
    on main too): "0.2" where config/job_config.py exists, "main" where config/configs.py does; None when
    torchtitan is not installed. Nothing is imported."""
    try:
        spec = importlib.util.find_spec("torchtitan")
    except (ImportError, ValueError):
        return None
    folders = list(spec.submodule_search_locations or ()) if spec is not None else []
    for folder in map(Path, folders):
        if (folder / "config" / "job_config.py").exists():
            return "0.2"
        if (folder / "config" / "configs.py").exists():
            return "main"
    return None


def resolve_version(requested: str | None) -> tuple[str, str]:
    """The torchtitan version to write for and why: the one asked for, else the installed one, else main."""
    if requested is not None:
        if requested not in VERSIONS:
            raise ZbsearchError(f"torchtitan version {requested!r} is not known: use main (Python configs, head "
                                "lm_head) or 0.2 (TOML configs, head output)", subject="torchtitan")
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


def _layout_words(schedule: Schedule, name: str) -> str:
    n, p = schedule.placement.num_chunks, schedule.num_ranks
    if name == TORCHTITAN_V:
        return "rank r builds stages r and 2p-1-r"
    return "rank r builds stage r" if n == p else "rank r builds stages r + k*p for k = 0, 1, ..."


def _header(schedule: Schedule, version: str, comment: str) -> list[str]:
    p, n, m = schedule.num_ranks, schedule.placement.num_chunks, schedule.num_microbatches
    return [f"{comment}torchtitan {CHECKED[version]}: stages and order of zbsearch schedule {schedule.name!r} "
            f"(placement {schedule.placement.name}: {p} ranks, {n} stages, {m} microbatches)."]


def torchtitan_toml(schedule: Schedule, split: Split, csv_path: str) -> str:
    """torchtitan 0.2's `[parallelism]` table that runs `schedule` (its CSV at `csv_path`) with `split`'s
    stages; the split is rendered as given (see torchtitan_parts for the checked one)."""
    name, m = torchtitan_schedule_name(schedule), schedule.num_microbatches
    parts = _modules_in_version(split, "0.2")
    rows = "".join(f"    [{', '.join(json.dumps(x, ensure_ascii=False) for x in row)}],\n" for row in parts)
    return "\n".join(_header(schedule, "0.2", "# ") + [
        "# Merge this table into the job's TOML config (--job.config_file). For torchtitan's main branch",
        "# (Python configs, head lm_head) export with --torchtitan main.",
        f"# Part i is torch's stage i; {_layout_words(schedule, name)}. Leave pipeline_parallel_layers_per_stage unset.",
        f"# Microbatches must be {m}: training.local_batch_size / parallelism.pipeline_parallel_microbatch_size.",
        "[parallelism]",
        f"pipeline_parallel_degree = {schedule.num_ranks}",
        f"pipeline_parallel_schedule = {json.dumps(name)}",
        # json.dumps of a str (ensure_ascii off) is a valid TOML basic string: same quotes and escapes.
        f"pipeline_parallel_schedule_csv = {json.dumps(csv_path, ensure_ascii=False)}",
        f"module_fqns_per_model_part = [\n{rows}]",
    ]) + "\n"


def torchtitan_python(schedule: Schedule, split: Split, csv_path: str) -> str:
    """A Python module for torchtitan main: `apply_pipeline(config)` sets the fields on a Trainer.Config
    that run `schedule` (its CSV at `csv_path`) with `split`'s stages."""
    name, m, p = torchtitan_schedule_name(schedule), schedule.num_microbatches, schedule.num_ranks
    parts = _modules_in_version(split, "main")
    rows = "".join(f"    {list(row)!r},\n" for row in parts)
    doc = _header(schedule, "main", "") + [
        "",
        "Call apply_pipeline on the Trainer.Config your config function returns, for example in your own",
        "config module (run torchtitan with --module that_module --config llama3_8b_zbsearch):",
        "",
        "    from torchtitan.models.llama3.config_registry import llama3_8b",
        "    from this_file import apply_pipeline",
        "",
        "    def llama3_8b_zbsearch():",
        "        return apply_pipeline(llama3_8b())",
        "",
        f"Part i is torch's stage i; {_layout_words(schedule, name)}. For torchtitan 0.2 (TOML configs, head",
        "output) export with --torchtitan 0.2; torchtitan main before 2026-08-20 sets the microbatches as",
        "training.local_batch_size / parallelism.pipeline_parallel_microbatch_size instead of num_pp_microbatches.",
    ]
    return "\n".join([f'"""{doc[0]}', *doc[1:], '"""', "",
                      f"SCHEDULE_CSV = {csv_path!r}", f"MODULE_FQNS_PER_MODEL_PART = [\n{rows}]", "", "",
                      "def apply_pipeline(config):",
                      '    """Set the pipeline fields of a torchtitan Trainer.Config; returns it."""',
                      f"    config.parallelism.pipeline_parallel_degree = {p}",
                      f"    config.parallelism.pipeline_parallel_schedule = {name!r}",
                      "    config.parallelism.pipeline_parallel_schedule_csv = SCHEDULE_CSV",
                      "    config.parallelism.module_fqns_per_model_part = [list(part) for part in "
                      "MODULE_FQNS_PER_MODEL_PART]",
                      "    config.parallelism.pipeline_parallel_layers_per_stage = None  # the parts above decide",
                      f"    config.parallelism.num_pp_microbatches = {m}  # the CSV's microbatch count",
                      "    return config", ""])


def recompute_parts(split: Split, levels: Mapping[str, str]) -> list[list[str]]:
    """Per model part, the decoder blocks the plan recomputes in full (their module paths).

    Raises
    ------
    PartitionError
        A block recomputed at another level (selective: the attention core alone), which torchtitan
        cannot wrap by module.
    """
    other = sorted(name for name, level in levels.items() if level != "full")
    if other:
        raise PartitionError(f"the plan recomputes {other[0]!r} at {levels[other[0]]} (the attention core alone), "
                             "which torchtitan cannot wrap by module: plan full recompute for torchtitan")
    return [[name for name in chunk if name in levels] for chunk in split.chunks]


RECOMPUTE_HELPER = [
    "",
    "",
    "def apply_recompute(model_part):",
    '    """Wrap the decoder blocks this plan recomputes, in one model part (a torchtitan decoder whose blocks',
    "    are model_part.layers[<i>]), in torch's activation checkpointing; returns the part. It replaces",
    "    torchtitan's own activation checkpointing, which applies one config to every block of every part:",
    "    set config.activation_checkpoint = None and call this on each model part where torchtitan's",
    "    parallelize would apply its own (before FSDP wraps the blocks). torch's split backward may run the",
    '    recompute again in W (pytorch#166536), up to twice the extra time the plan counts."""',
    "    # torch is imported here, when torchtitan calls this, not when the config is read",
    "    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper",
    "",
    "    chosen = {name for part in RECOMPUTE_FQNS_PER_MODEL_PART for name in part}",
    "    for key in list(model_part.layers.keys()):",
    '        if f"layers.{key}" in chosen:',
    "            model_part.layers[key] = checkpoint_wrapper(model_part.layers[key], preserve_rng_state=False)",
    "    return model_part",
    "",
]


def _recompute_comment(parts: list[list[str]]) -> list[str]:
    """The 0.2 TOML's note on the blocks the plan recomputes (TOML has no room for a helper)."""
    return ["# The plan recomputes these blocks in full, per part (one list per stage):",
            f"#   {json.dumps(parts)}",
            "# torchtitan 0.2 applies one [activation_checkpoint] config to every part: set its mode to \"none\" and",
            "# wrap just these with torch.distributed.algorithms._checkpoint.checkpoint_wrapper (docs/torch.md)."]


def torchtitan_config(schedule: Schedule, split: Split, csv_path: str, version: str,
                      levels: Mapping[str, str] | None = None) -> str:
    """The config file for `version` (TOML for 0.2, Python for main), its split checked first; with the
    plan's recompute `levels`, the blocks it recomputes per part (and, for main, `apply_recompute`)."""
    torchtitan_parts(split, version)  # refuses a split that does not name every module once
    parts = recompute_parts(split, levels or {})
    if version == "0.2":
        text = torchtitan_toml(schedule, split, csv_path)
        return text if not levels else "\n".join(_recompute_comment(parts)) + "\n" + text
    text = torchtitan_python(schedule, split, csv_path)
    if not levels:
        return text
    rows = "".join(f"    {row!r},\n" for row in parts)
    return text + "\n" + f"RECOMPUTE_FQNS_PER_MODEL_PART = [\n{rows}]" + "\n".join(RECOMPUTE_HELPER)

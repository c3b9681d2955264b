"""Exports of a whole run's chosen plan (plan/wholerun/exports.py, trainer_fit.py): a tiny llama configured and
exported holds its degrees for torchtitan and Megatron-LM, names every module once and lays the split out as
planned; without a pipeline there is no CSV; a trainer that cannot run the plan as planned is one line and the
other's files are still written; a folder that cannot be written gets nothing. The `titan` test loads the
exported configs in torchtitan 0.3.0 itself (ConfigManager, as `--module M --config FN` does)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from zbsearch.core.errors import FileError, PlanError, ScheduleError
from zbsearch.core.ir import Schedule
from zbsearch.interop.formats.trainers import expand
from zbsearch.plan.wholerun.chosen import chosen_plan
from zbsearch.plan.wholerun.cluster import make_cluster
from zbsearch.plan.wholerun.configure import configure
from zbsearch.plan.wholerun.cost import PlanChoices
from zbsearch.plan.wholerun.evaluate import evaluate_shape
from zbsearch.plan.wholerun.exports import (MEGATRON_ARGS, PLAN_JSON, SCHEDULE_CSV, SCHEDULE_JSON, TITAN_CONFIG,
    export_plan, render_exports, write_exports)
from zbsearch.plan.wholerun.search import Settings
from zbsearch.plan.wholerun.shape import RunShape, Space
from zbsearch.plan.wholerun.shape_result import ShapeResult
from zbsearch.plan.wholerun.trainer_fit import megatron_own_order
from zbsearch.plan.wholerun.workload import Workload
from zbsearch.profiling.request import LlamaShape, MoeShape
from zbsearch.search.options import SearchOptions

LLAMA = LlamaShape(layers=4, hidden=256, heads=4, seq=128, vocab=1024)
WORKLOAD = Workload(LLAMA, 8)
CLUSTER = make_cluster("h100", 4, 4)
QUICK = SearchOptions(time_limit=0.5, workers=1)
MODULES = ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "lm_head"]


@pytest.fixture(scope="module")
def chosen() -> ShapeResult:
    outcome = configure(WORKLOAD, CLUSTER, Space(micro_batch=(1, 2)), PlanChoices(), QUICK, Settings())
    assert outcome.chosen is not None
    return outcome.chosen


def _evaluated(shape: RunShape, choices: PlanChoices = PlanChoices(), workload: Workload = WORKLOAD,
               cluster: Any = CLUSTER) -> ShapeResult:
    result = evaluate_shape(workload, cluster, shape, QUICK, choices)
    assert result.status == "solved", result.reason
    return result


def titan_constants(text: str) -> dict[str, Any]:
    """The exported config's module-level names (it imports torchtitan only inside its functions)."""
    names: dict[str, Any] = {}
    exec(compile(text, TITAN_CONFIG, "exec"), names)
    return names


def megatron(text: str) -> dict[str, str]:
    assert text.endswith("\n") and text.count("\n") == 1
    words, args = shlex.split(text), {}
    for k, word in enumerate(words):
        if word.startswith("--"):
            value = words[k + 1] if k + 1 < len(words) and not words[k + 1].startswith("--") else ""
            assert word not in args, word
            args[word] = value
    return args


def test_the_chosen_plan_exports_its_degrees_modules_and_split_for_both_trainers(chosen: ShapeResult,
                                                                                  tmp_path: Path) -> None:
    exports = export_plan(chosen, tmp_path / "run", WORKLOAD, CLUSTER, torchtitan="main")
    shape = chosen.shape
    assert shape.p > 1 and not exports.refused  # the tiny llama's best plan pipelines, in a shape both run
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(
        [TITAN_CONFIG, SCHEDULE_CSV, MEGATRON_ARGS, PLAN_JSON, SCHEDULE_JSON])
    titan = titan_constants((tmp_path / "run" / TITAN_CONFIG).read_text())
    assert (titan["DEGREE"], titan["TENSOR_PARALLEL_DEGREE"], titan["EXPERT_PARALLEL_DEGREE"]) == (shape.p, shape.t, 1)
    assert titan["SHARD_DEGREE"] * titan["REPLICATE_DEGREE"] == shape.d
    assert (titan["MICROBATCHES"], titan["MICROBATCH_SIZE"], titan["GLOBAL_BATCH"]) == (shape.m, shape.b, 8)
    assert titan["SCHEDULE_CSV"] == SCHEDULE_CSV and callable(titan["apply_plan"])
    named = [module for part in titan["MODULE_FQNS_PER_MODEL_PART"] for module in part]
    assert sorted(named) == sorted(MODULES) and len(named) == len(set(named))  # every module once
    schedule = Schedule.load(tmp_path / "run" / SCHEDULE_JSON)
    assert schedule.to_dict() == chosen.plan
    rows = (tmp_path / "run" / SCHEDULE_CSV).read_text().splitlines()
    assert rows == [",".join(str(a) for a in rank) for rank in schedule.ranks]
    args = megatron((tmp_path / "run" / MEGATRON_ARGS).read_text())
    assert args["--tensor-model-parallel-size"] == str(shape.t)
    assert args["--pipeline-model-parallel-size"] == str(shape.p)
    assert (args["--micro-batch-size"], args["--global-batch-size"]) == (str(shape.b), "8")
    assert ("--use-distributed-optimizer" in args) == (shape.sharding in ("zero1", "fsdp"))
    assert ("--sequence-parallel" in args) == (shape.t > 1)
    stages = expand(args["--pipeline-model-parallel-layout"])
    assert [len(s) for s in stages] == [len(c) for c in chosen.split]  # the layout is the split, stage by stage
    assert "".join(stages) == "E" + "t" * 4 + "L"
    record = json.loads((tmp_path / "run" / PLAN_JSON).read_text())
    assert record["shape"] == shape.to_dict() and record["exports"]["refused"] == {}
    # Megatron runs its own 1F1B: where the plan's order is another, a note gives that order's time
    own = megatron_own_order(schedule)
    noted = [n for n in exports.notes if n.startswith(f"Megatron-LM: it runs its own {own.name} order")]
    assert len(noted) == (0 if own.ranks == schedule.ranks else 1)


def test_the_chosen_plan_is_validated_once_at_the_limit_it_records(chosen: ShapeResult) -> None:
    """chosen_plan keeps the timeline and the limit it validated at (the plan's own), fails one line where the
    plan breaks its limit, and refuses a result without a plan."""
    plan = chosen_plan(chosen, WORKLOAD, CLUSTER, PlanChoices())
    recorded = Schedule.from_dict(chosen.plan or {}).plan.mem_limit
    assert plan.timeline is not None and plan.limit is not None and plan.limit.text == recorded
    assert plan.planned is plan.timeline.profile and plan.timeline.schedule.to_dict() == chosen.plan
    record = dict(chosen.plan or {})
    record["plan"] = {**record["plan"], "mem_limit": "0.01p"}
    with pytest.raises(ScheduleError) as caught:
        chosen_plan(replace(chosen, plan=record), WORKLOAD, CLUSTER, PlanChoices())
    assert "0.01p" in str(caught.value) and "\n" not in str(caught.value) and caught.value.subject == "export_dir"
    with pytest.raises(PlanError):
        chosen_plan(replace(chosen, status="refused", reason="it does not fit"), WORKLOAD, CLUSTER, PlanChoices())


def test_a_shape_without_a_pipeline_gives_no_csv_and_no_pipeline_fields(tmp_path: Path) -> None:
    shape = RunShape(1, 1, 4, 1, 2, "fsdp")
    exports = export_plan(_evaluated(shape, PlanChoices(recompute="full")), tmp_path, WORKLOAD, CLUSTER,
                          PlanChoices(recompute="full"), torchtitan="main")
    assert sorted(exports.files) == sorted([TITAN_CONFIG, MEGATRON_ARGS, PLAN_JSON])
    text = exports.files[TITAN_CONFIG]
    titan = titan_constants(text)
    assert "DEGREE" not in titan and "MODULE_FQNS_PER_MODEL_PART" not in titan and "apply_pipeline" not in titan
    assert "par.pipeline_parallel_degree = 1" in text and "pipeline_parallel_schedule" not in text
    assert (titan["SHARD_DEGREE"], titan["RESHARD_AFTER_FORWARD"], titan["RECOMPUTE_MODE"]) == (4, "never", "full")
    args = megatron(exports.files[MEGATRON_ARGS])
    assert args["--pipeline-model-parallel-size"] == "1" and "--pipeline-model-parallel-layout" not in args
    assert args["--recompute-granularity"] == "full" and args["--num-layers"] == "4"
    # torchtitan accumulates gradients syncing on every microbatch: a note, not a refusal
    assert [n for n in exports.notes if n.startswith("torchtitan: ")] and "\n" not in "".join(exports.notes)


def test_a_shape_a_trainer_cannot_run_is_one_line_and_the_other_is_still_written() -> None:
    # V-shape: torchtitan builds it (ZBVZeroBubble), Megatron-LM's layout cannot place it
    v = render_exports(_evaluated(RunShape(1, 2, 2, 1, 4, "fsdp"), PlanChoices(placement="v")), WORKLOAD, CLUSTER,
                       PlanChoices(placement="v"), torchtitan="main")
    assert list(v.refused) == ["Megatron-LM"] and "V-shape" in v.refused["Megatron-LM"]
    assert TITAN_CONFIG in v.files and SCHEDULE_CSV in v.files and MEGATRON_ARGS not in v.files
    assert titan_constants(v.files[TITAN_CONFIG])["SCHEDULE"] == "ZBVZeroBubble"
    # zero2 under pipelining: torch's stage keeps gradients whole, Megatron does not shard them: both refused
    zero2 = render_exports(_evaluated(RunShape(1, 2, 2, 1, 4, "zero2")), WORKLOAD, CLUSTER, torchtitan="main")
    assert sorted(zero2.refused) == ["Megatron-LM", "torchtitan"]
    assert sorted(zero2.files) == [PLAN_JSON, SCHEDULE_JSON]
    lines = zero2.lines("out")
    assert [line.split(":")[0] for line in lines[1:]] == ["torchtitan", "Megatron-LM"]
    assert all("\n" not in line for line in lines)
    assert json.loads(zero2.files[PLAN_JSON])["exports"]["refused"] == zero2.refused


def test_tensor_and_expert_parallel_degrees_reach_both_trainers() -> None:
    tp = render_exports(_evaluated(RunShape(2, 2, 1, 1, 8, "ddp"), PlanChoices(placement="linear")), WORKLOAD,
                        CLUSTER, PlanChoices(placement="linear"), torchtitan="main")
    assert titan_constants(tp.files[TITAN_CONFIG])["TENSOR_PARALLEL_DEGREE"] == 2
    args = megatron(tp.files[MEGATRON_ARGS])
    assert args["--tensor-model-parallel-size"] == "2" and "--sequence-parallel" in args
    moe = MoeShape(layers=3, hidden=256, heads=4, kv_heads=2, seq=128, vocab=1024, dense_layers=1, experts=4,
                   top_k=2, expert_ffn=256)
    workload, cluster = Workload(moe, 8), make_cluster("h100", 8, 4)
    ep = render_exports(_evaluated(RunShape(1, 2, 4, 1, 2, "zero1", 2), PlanChoices(placement="linear"), workload,
                                   cluster), workload, cluster, PlanChoices(placement="linear"), torchtitan="0.3")
    titan = titan_constants(ep.files[TITAN_CONFIG])
    assert (titan["EXPERT_PARALLEL_DEGREE"], titan["SHARD_DEGREE"], titan["RESHARD_AFTER_FORWARD"]) == (2, 4, "never")
    assert megatron(ep.files[MEGATRON_ARGS])["--expert-model-parallel-size"] == "2"


def test_a_folder_that_cannot_be_written_gets_nothing_and_an_earlier_export_is_replaced_whole(
        chosen: ShapeResult, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(FileError) as caught:
        export_plan(chosen, blocker / "run", WORKLOAD, CLUSTER)
    assert caught.value.subject == "export_dir" and "\n" not in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    with pytest.raises(PlanError):
        export_plan(None, tmp_path / "none", WORKLOAD, CLUSTER)
    assert not (tmp_path / "none").exists()
    folder = tmp_path / "run"
    export_plan(chosen, folder, WORKLOAD, CLUSTER)
    assert (folder / SCHEDULE_CSV).exists()
    single = render_exports(_evaluated(RunShape(1, 1, 4, 2, 1, "ddp")), WORKLOAD, CLUSTER)
    write_exports(single, folder)  # no pipeline now: the earlier CSV and schedule go, nothing is left half
    assert sorted(p.name for p in folder.iterdir()) == sorted(single.files)


TITAN_LOAD = '''
import json, sys
sys.path.insert(0, sys.argv[1])
from torchtitan.config.manager import ConfigManager
out = {}
for module in sys.argv[2:]:
    try:
        config = ConfigManager().parse_args(["--module", module, "--config", "planned"])
    except Exception as exc:
        out[module] = {"error": str(exc)}
        continue
    par, training = config.parallelism, config.training
    out[module] = {name: getattr(par, name) for name in (
        "pipeline_parallel_degree", "tensor_parallel_degree", "data_parallel_shard_degree",
        "data_parallel_replicate_degree", "expert_parallel_degree", "fsdp_reshard_after_forward",
        "enable_sequence_parallel", "module_fqns_per_model_part", "pipeline_parallel_schedule_csv",
        "pipeline_parallel_microbatch_size")}
    out[module].update(local_batch_size=training.local_batch_size, global_batch_size=training.global_batch_size,
                       seq_len=training.seq_len)
print(json.dumps(out))
'''
WRAPPER = '''from torchtitan.models.llama3.config_registry import llama3_debugmodel
from {name} import apply_plan


def planned():
    return apply_plan(llama3_debugmodel())
'''


@pytest.mark.torch
@pytest.mark.titan
@pytest.mark.slow
def test_torchtitan_0_3_loads_the_exported_configs(chosen: ShapeResult, tmp_path: Path) -> None:
    """torchtitan 0.3.0's own ConfigManager loads the 0.3 exports (pipelined and not) and reads the plan's
    degrees and batch back; the main export refuses itself there with the version to export for."""
    single = _evaluated(RunShape(1, 1, 4, 1, 2, "fsdp"))
    for name, result, version in (("pp", chosen, "0.3"), ("nopp", single, "0.3"), ("main", chosen, "main")):
        write_exports(render_exports(result, WORKLOAD, CLUSTER, torchtitan=version), tmp_path / name)
        (tmp_path / f"{name}_plan.py").write_text((tmp_path / name / TITAN_CONFIG).read_text())
        (tmp_path / f"{name}_wrap.py").write_text(WRAPPER.format(name=f"{name}_plan"))
    python = os.environ.get("ZBSEARCH_TITAN_PYTHON", sys.executable)
    done = subprocess.run([python, "-c", TITAN_LOAD, str(tmp_path), "pp_wrap", "nopp_wrap", "main_wrap"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    shape = chosen.shape
    pp = loaded["pp_wrap"]
    assert (pp["pipeline_parallel_degree"], pp["tensor_parallel_degree"], pp["expert_parallel_degree"]) == (
        shape.p, shape.t, 1)
    assert pp["data_parallel_shard_degree"] * pp["data_parallel_replicate_degree"] == shape.d
    assert pp["pipeline_parallel_schedule_csv"] == SCHEDULE_CSV and pp["enable_sequence_parallel"]
    assert sorted(m for part in pp["module_fqns_per_model_part"] for m in part) == sorted(MODULES)
    assert (pp["pipeline_parallel_microbatch_size"], pp["local_batch_size"], pp["global_batch_size"],
            pp["seq_len"]) == (shape.b, shape.m * shape.b, 8, 128)
    nopp = loaded["nopp_wrap"]
    assert (nopp["pipeline_parallel_degree"], nopp["data_parallel_shard_degree"]) == (1, 4)
    assert (nopp["fsdp_reshard_after_forward"], nopp["local_batch_size"], nopp["global_batch_size"]) == ("never", 1, 8)
    assert "--torchtitan 0.3" in loaded["main_wrap"]["error"]

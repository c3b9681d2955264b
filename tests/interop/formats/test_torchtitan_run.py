"""The torchtitan export run inside torchtitan 0.3.0 itself (issue 40): an exported plan applied to
torchtitan's own Llama 3 debug model configuration (llama3_debugmodel), parsed by torchtitan's
ConfigManager (tyro, as `--module M --config FN` is), then built by torchtitan's pipeline_llm on two
ranks (CPU, gloo), which runs one forward and backward step of the schedule (titan_ranks.py says what of
the Trainer it leaves out). What torchtitan built is compared with the plan: the stages of each rank,
their modules, the schedule class and its order, the microbatch count and shape, the checkpointed blocks,
the attention, CUDA graphs off.

torchtitan 0.3.0 comes with the `titan` extra (torch 2.13.0 CPU, torchtitan 0.3.0 and the triton it
imports); CI installs it (.ci/run). ZBSEARCH_TITAN_PYTHON names another interpreter that has it (a
separate venv), else this one runs the ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.ir import Schedule

runner = CliRunner()
RANKS = Path(__file__).with_name("titan_ranks.py")
CONFIG = '''from torchtitan.models.llama3.config_registry import llama3_debugmodel
from plan import apply_pipeline


def llama3_debugmodel_zbsearch():
    return apply_pipeline(llama3_debugmodel())
'''


def zbsearch(*args: object) -> None:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.stderr


@pytest.mark.torch
@pytest.mark.titan
@pytest.mark.multiprocess
@pytest.mark.slow
def test_torchtitan_builds_and_steps_the_plan_as_planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the CSV's path in the config is relative to where torchtitan runs
    # torchtitan's debug model: 6 blocks of width 256, 16 heads, vocabulary 2048; microbatch 2 x 128 tokens.
    zbsearch("profile", "--estimate", "--gpu", "h100", "--model", "llama", "--layers", "6", "--hidden", "256",
             "--heads", "16", "--seq", "128", "--micro-batch", "2", "--vocab", "2048", "-p", "2", "-m", "4",
             "-o", tmp_path / "llama.json")
    zbsearch("solve", "--profile", tmp_path / "llama.json", "--mem-limit", "2p", "--placement", "v", "--partition",
             "auto", "--time-limit", "3", "--recompute", "fixed:layers.1,layers.4", "-o", tmp_path / "plan.json")
    zbsearch("export", tmp_path / "plan.json", "--format", "torchtitan", "--torchtitan", "0.3", "--profile",
             tmp_path / "llama.json", "-o", "plan.csv")
    (tmp_path / "zbsearch_config.py").write_text(CONFIG)
    python = os.environ.get("ZBSEARCH_TITAN_PYTHON", sys.executable)
    out = tmp_path / "built.json"
    done = subprocess.run([python, str(RANKS), str(tmp_path), "zbsearch_config", "llama3_debugmodel_zbsearch", "2",
                           str(out)], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    built = json.loads(out.read_text())

    plan = Schedule.load(tmp_path / "plan.json")
    split = plan.plan.split
    assert split is not None
    chunk_to_rank = plan.placement.chunk_to_rank
    recomputed = set(plan.plan.levels)
    rows = (tmp_path / "plan.csv").read_text().splitlines()
    for rank in built:
        r = rank["rank"]
        assert rank["schedule"] == "_PipelineScheduleRuntime" and rank["microbatches"] == plan.num_microbatches
        assert [s["stage"] for s in rank["stages"]] == [c for c, owner in enumerate(chunk_to_rank) if owner == r]
        for stage in rank["stages"]:
            modules = ["lm_head" if m == "output" else m for m in split.modules[stage["stage"]]]
            assert stage["modules"] == modules
            assert stage["checkpointed"] == [m for m in split.chunks[stage["stage"]] if m in recomputed]
            assert stage["attention"] == ["ScaledDotProductAttention"]  # the backward is split: no FlexAttention
        assert rank["order"][r] == rows[r].split(",")  # the CSV's order, as torch loaded it
        assert rank["batch"] == [8, 128] and rank["cuda_graphs_disabled"] and rank["ac_config"] == "NoneType"
        assert rank["all_grads"]
    first = next(rank for rank in built if 0 in [s["stage"] for s in rank["stages"]])
    # Every microbatch the first stage took was the profiled one: 2 sequences of 128 tokens (one more
    # forward than m: torch's shape inference in the first step).
    assert first["microbatch_shapes"] and {tuple(s) for s in first["microbatch_shapes"]} == {(2, 128)}
    last = next(rank for rank in built if len(chunk_to_rank) - 1 in [s["stage"] for s in rank["stages"]])
    assert len(last["losses"]) == plan.num_microbatches and all(0 < x < 20 for x in last["losses"])
    assert recomputed == {"layers.1", "layers.4"}

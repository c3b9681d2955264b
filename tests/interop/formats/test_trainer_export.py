"""The layer split handed to trainers: torchtitan's module_fqns_per_model_part (TOML beside the CSV) and
Megatron-LM's pipeline layout string (issue 12, item 4). Exact files for small hand-made splits, a TOML
round trip, Megatron's own DeepSeek-V3 example, and the refusals (no split, V-shape for Megatron, a
split that does not fit the schedule), none of which leaves a file behind.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.errors import PartitionError, ScheduleError, ZbsearchError
from zbsearch.core.ir import Schedule, build, interleaved
from zbsearch.core.partition import partition_profile, plan_of
from zbsearch.core.profile import Profile, load_profile
from zbsearch.interop.formats.export import export, export_files, render
from zbsearch.interop.formats.layer_split import Split, split_of
from zbsearch.interop.formats.torchtitan import torchtitan_toml
from zbsearch.interop.formats.torchtitan_plan import TitanPlan
from zbsearch.interop.formats.trainers import compress, expand, megatron_args
from zbsearch.schedules import generate

from plans import with_legacy_plan

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[3]
GiB = 2**30


def toy_profile(n_blocks: int = 6) -> Profile:
    """tok_embeddings, layers.0 .. layers.<n-1>, and the head (norm + output): n_blocks + 2 layers."""
    def layer(name: str, kind: str, **extra) -> dict:
        return {"name": name, "kind": kind, "F": 1.0, "B": 1.0, "W": 1.0, "mem_B": GiB, "mem_W": GiB / 2, **extra}

    layers = [layer("tok_embeddings", "embedding")] + [layer(f"layers.{i}", "decoder") for i in range(n_blocks)]
    layers.append(layer("output", "output", modules=["norm", "output"]))
    return Profile.from_dict({
        "name": "toy", "num_stages": 2, "microbatches": 4, "time_unit": "us", "memory_unit": "bytes", "comm": 0.0,
        "stages": [{"F": 1, "B": 1, "W": 1, "mem_B": GiB, "mem_W": GiB / 2}] * 2, "layers": layers,
        "source": {"kind": "estimated", "method": "hand-made for tests"},
        "details": {"model": {"micro_batch": 1, "seq": 8192}}})


def with_split(name: str, p: int, m: int, counts: list[int]) -> Schedule:
    """A handcrafted schedule carrying the split `counts` (layers per chunk, route order) of toy_profile."""
    schedule = generate(name, p, m)
    return replace(schedule, plan=plan_of(partition_profile(toy_profile(), schedule.placement, counts)))


LINEAR_TOML = '''\
# torchtitan v0.2.2: zbsearch schedule '1f1b' as planned (placement linear: 2 ranks, 2 stages, 4 microbatches).
# Merge these tables into the job's TOML config (--job.config_file). For torchtitan 0.3 or main
# (Python configs, head lm_head) export with --torchtitan 0.3 or --torchtitan main.
# Part i is torch's stage i; rank r builds stage r. Leave pipeline_parallel_layers_per_stage unset.
# 4 microbatches of 1 x 8192 tokens (local_batch_size / microbatch size);
# keep a model flavor without FlexAttention (0.2's default flavors use SDPA).
[parallelism]
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "1F1B"
pipeline_parallel_schedule_csv = "{csv}"
pipeline_parallel_microbatch_size = 1
module_fqns_per_model_part = [
    ["tok_embeddings", "layers.0", "layers.1"],
    ["layers.2", "layers.3", "layers.4", "layers.5", "norm", "output"],
]

[training]
local_batch_size = 4
seq_len = 8192

[activation_checkpoint]
mode = "none"
'''


def test_plan_of_is_the_split_the_solver_attaches():
    prof = partition_profile(toy_profile(), generate("1f1b", 2, 4).placement, [3, 5])
    assert plan_of(prof).split.to_json() == {
        "chunks": [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3", "layers.4", "layers.5", "output"]],
        "modules": [["tok_embeddings", "layers.0", "layers.1"],
                    ["layers.2", "layers.3", "layers.4", "layers.5", "norm", "output"]],
        "kinds": [["embedding", "decoder", "decoder"], ["decoder"] * 4 + ["output"]],
    }
    assert plan_of(toy_profile()).split is None  # a profile that is not a split of per-layer costs has none


def test_torchtitan_linear_writes_the_csv_and_the_exact_toml(tmp_path):
    schedule = with_split("1f1b", 2, 4, [3, 5])
    csv = tmp_path / "linear.csv"
    assert export_files(schedule, "torchtitan", csv, toy_profile(), torchtitan="0.2") == [csv, tmp_path / "linear.toml"]
    assert csv.read_text() == render(schedule, "torch-csv")
    assert (tmp_path / "linear.toml").read_text() == LINEAR_TOML.format(csv=csv)


@pytest.mark.parametrize("name,counts,torch_name,parts", [
    ("interleaved-1f1b", [2, 2, 2, 2], "Interleaved1F1B",
     [["tok_embeddings", "layers.0"], ["layers.1", "layers.2"], ["layers.3", "layers.4"], ["layers.5", "norm", "output"]]),
    ("zb-v", [1, 3, 3, 1], "ZBVZeroBubble",
     [["tok_embeddings"], ["layers.0", "layers.1", "layers.2"], ["layers.3", "layers.4", "layers.5"], ["norm", "output"]]),
])
def test_torchtitan_toml_round_trips_through_tomllib(tmp_path, name, counts, torch_name, parts):
    schedule = with_split(name, 2, 4, counts)
    export(schedule, "torchtitan", tmp_path / "s.csv", toy_profile(), torchtitan="0.2")
    table = tomllib.loads((tmp_path / "s.toml").read_text())["parallelism"]
    assert table == {"pipeline_parallel_degree": 2, "pipeline_parallel_schedule": torch_name,
                     "pipeline_parallel_schedule_csv": str(tmp_path / "s.csv"), "module_fqns_per_model_part": parts,
                     "pipeline_parallel_microbatch_size": 1}


def test_odd_module_names_stay_valid_toml(tmp_path):
    odd = ['a "quoted" \\ name', "ünïcode.0"]
    split = Split(((odd[0],), (odd[1],)), ((odd[0],), (odd[1],)), (("other",), ("other",)))
    plan = TitanPlan(2, "1F1B", "s.csv", [list(c) for c in split.modules], 4, 1, 8, [[], []], "none", False, None,
                     None)
    text = torchtitan_toml(generate("1f1b", 2, 4), plan)
    assert tomllib.loads(text)["parallelism"]["module_fqns_per_model_part"] == [[odd[0]], [odd[1]]]


@pytest.mark.parametrize("name,counts,expect", [
    ("1f1b", [3, 5], "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Ett|t*4L' --num-layers 6\n"),
    ("interleaved-1f1b", [2, 2, 2, 2],
     "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et|tt|tt|tL' --num-layers 6\n"),
])
def test_megatron_layout_exact(tmp_path, name, counts, expect):
    path = export(with_split(name, 2, 4, counts), "megatron-layout", tmp_path / "pp.args")
    assert path.read_text() == expect


def test_megatron_grammar_on_their_deepseek_v3_example():
    """Their docs: 61 decoder layers and one MTP layer on PP16 x VPP2 is "Et*3|(tt|)*29,m|L"."""
    kinds = [["embedding", "decoder", "decoder", "decoder"]] + [["decoder", "decoder"]] * 29 + [["mtp"], ["output"]]
    names = [[f"l{c}.{i}" for i in range(len(k))] for c, k in enumerate(kinds)]
    split = Split(tuple(map(tuple, names)), tuple(map(tuple, names)), tuple(map(tuple, kinds)))
    schedule = build("deepseek", interleaved(16, 2), 1, [[] for _ in range(16)])
    assert megatron_args(schedule, split) == ("--pipeline-model-parallel-size 16 --pipeline-model-parallel-layout "
                                              "'Et*3|(tt|)*29,m|L' --num-layers 61 --mtp-num-layers 1\n")
    assert expand("Et*3|(tt|)*29,m|L") == ["Ettt"] + ["tt"] * 29 + ["m", "L"]
    assert expand("E|(t|)*3,m|m||L") == ["E", "t", "t", "t", "m", "m", "", "L"]  # their --help example
    assert compress(["Ettt", "t" * 12, "t" * 12, "ttL"]) == "Et*3|t*12|t*12|ttL"


def test_the_profile_split_serves_a_linear_schedule(tmp_path):
    """cpu-gpt-small.json records its split (details.partition.layers_per_stage) of zbsearch's GPT."""
    prof = load_profile(ROOT / "profiles" / "cpu-gpt-small.json")
    schedule = generate("1f1b", 4, 8)
    split = split_of(schedule, prof)
    assert split.modules[0] == ("embedding", "block0", "block1") and split.kinds[-1] == ("decoder", "decoder", "output")
    assert render(schedule, "megatron-layout", prof) == (
        "--pipeline-model-parallel-size 4 --pipeline-model-parallel-layout 'Ett|tt|tt|ttL' --num-layers 8\n")
    with pytest.raises(PartitionError) as err:
        split_of(generate("interleaved-1f1b", 4, 8), prof)
    assert str(err.value).startswith(f"profile {prof.label}'s split has 4 stages but schedule 'interleaved-1f1b' "
                                     "(placement 'interleaved') has 8:")


def refused(schedule: Schedule, fmt: str, tmp_path: Path, error: type, profile: Profile | None = None) -> str:
    with pytest.raises(error) as err:
        export(schedule, fmt, tmp_path / "out.csv", profile)
    assert list(tmp_path.iterdir()) == [] and "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("fmt", ["torchtitan", "megatron-layout"])
def test_no_split_says_how_to_get_one(tmp_path, fmt):
    message = refused(generate("1f1b", 2, 4), fmt, tmp_path, PartitionError)
    assert message == ("schedule '1f1b' carries no layer split: solve it on a profile with per-layer costs (layers), "
                       "so that the schedule carries its split, or give the profile whose stages the schedule was "
                       "made for")
    assert "nor does profile 'toy' record one" in refused(generate("1f1b", 2, 4), fmt, tmp_path, PartitionError,
                                                          toy_profile())


def test_v_shape_is_refused_for_megatron_naming_why_and_what_to_use(tmp_path):
    message = refused(with_split("zb-v", 2, 4, [2, 2, 2, 2]), "megatron-layout", tmp_path, ScheduleError)
    assert message == ("schedule 'zb-v' has placement 'v' (V-shape: rank r holds stages r and 2p-1-r): Megatron-LM's "
                       "layout puts virtual stage i on rank i mod p, one chain of stages, and has no V-shape; solve on "
                       "a linear or interleaved placement for Megatron-LM, or export this one for torchtitan")
    assert "dualpipev" in refused(generate("dualpipe", 2, 4), "torchtitan", tmp_path, ScheduleError)


@pytest.mark.parametrize("fmt", ["torchtitan", "megatron-layout"])
def test_a_split_that_does_not_fit_the_schedule_is_refused(tmp_path, fmt):
    split = with_split("interleaved-1f1b", 2, 4, [2, 2, 2, 2]).plan.split.to_json()
    split["chunks"].pop()
    with pytest.raises(PartitionError) as err:  # a file stating such a split is refused as it loads
        with_legacy_plan(generate("interleaved-1f1b", 2, 4), split)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("schedule 'interleaved-1f1b': meta.partition lists 3 chunks of layers but 4 of modules")
    for key in ("modules", "kinds"):
        split[key].pop()
    schedule = with_legacy_plan(generate("interleaved-1f1b", 2, 4), split)
    message = refused(schedule, fmt, tmp_path, PartitionError)
    assert message.startswith("the schedule's split has 3 stages but schedule 'interleaved-1f1b' (placement "
                              "'interleaved') has 4:")
    other = with_split("1f1b", 2, 4, [3, 5])
    with_profile = toy_profile(7)  # one more layer than the split names
    assert refused(other, fmt, tmp_path, PartitionError, with_profile) == (
        "schedule '1f1b''s split does not fit profile 'toy' (layers per chunk 3,5 add up to 8 but the model has 9 "
        "layers (every entry of the profile's layers list, the embedding and the head included): make them add "
        "up to 9): use the profile the schedule was solved on")


@pytest.mark.parametrize("kinds,match", [
    ([["other", "decoder"], ["decoder", "output"]], "layer 'a0' has kind 'other': Megatron-LM's layout names"),
    ([["decoder", "embedding"], ["decoder", "output"]], "needs exactly one embedding layer, first"),
    ([["embedding", "mtp"], ["decoder", "output"]], "decoder layer 'a2' comes after an MTP layer"),
    ([["embedding", "decoder"], ["output", "decoder"]], "one output layer, last"),
])
def test_megatron_rules_are_checked_before_writing(tmp_path, kinds, match):
    schedule = with_legacy_plan(generate("1f1b", 2, 4), {"chunks": [["a0", "a1"], ["a2", "a3"]], "kinds": kinds})
    assert match in refused(schedule, "megatron-layout", tmp_path, PartitionError)


def test_mtp_layers_must_share_one_stage(tmp_path):
    kinds = [["embedding", "decoder"], ["decoder"], ["mtp"], ["mtp", "output"]]
    schedule = with_legacy_plan(generate("interleaved-1f1b", 2, 4), {
        "chunks": [[f"a{c}.{i}" for i in range(len(k))] for c, k in enumerate(kinds)], "kinds": kinds})
    assert refused(schedule, "megatron-layout", tmp_path, PartitionError) == (
        "the MTP layers sit on stages [2, 3]: Megatron-LM needs them all on one stage, the last virtual stage of its "
        "rank (stages 2..3 here)")


@pytest.mark.parametrize("version, name", [("0.2", "x.toml"), ("main", "x.py")])
def test_a_csv_named_like_its_config_would_overwrite_itself(tmp_path, version, name):
    with pytest.raises(ZbsearchError, match="name the CSV file with another suffix"):
        export(with_split("1f1b", 2, 4, [3, 5]), "torchtitan", tmp_path / name, toy_profile(), torchtitan=version)
    assert list(tmp_path.iterdir()) == []


# -- the command line ------------------------------------------------------------------------------

def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})


def test_cli_export_torchtitan_and_megatron(tmp_path):
    sched, prof = tmp_path / "s.json", tmp_path / "toy.json"
    with_split("interleaved-1f1b", 2, 4, [2, 2, 2, 2]).save(sched)
    prof.write_text(json.dumps(toy_profile().to_dict()))
    result = invoke("export", sched, "--format", "torchtitan", "--torchtitan", "0.2", "--profile", prof,
                    "-o", tmp_path / "s.csv")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"wrote {tmp_path / 's.csv'} (torch-csv: 2 ranks, 4 stages, 4 microbatches, 32 actions)",
        f"wrote {tmp_path / 's.toml'} (torchtitan v0.2.2, as asked: TOML tables with module_fqns_per_model_part "
        "for 4 stages, the CSV's path, degree, stage layout, microbatch count and size, the plan's recompute and "
        "sharding)"]
    result = invoke("export", sched, "--format", "torchtitan", "--torchtitan", "0.4", "-o", tmp_path / "t.csv")
    assert result.exit_code == 1 and result.stderr.splitlines() == [
        "error: --torchtitan: torchtitan version '0.4' is not known: use main or 0.3 (Python configs, head lm_head) "
        "or 0.2 (TOML configs, head output)"]
    result = invoke("export", sched, "--format", "torch-csv", "--torchtitan", "main", "-o", tmp_path / "t.csv")
    assert result.exit_code == 1 and "--torchtitan main goes with --format torchtitan" in result.stderr
    assert not (tmp_path / "t.csv").exists()
    result = invoke("export", sched, "--format", "megatron-layout", "-o", tmp_path / "s.args")
    assert result.exit_code == 0, result.stderr
    assert "Megatron-LM arguments: --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et|tt|tt|tL' " \
           "--num-layers 6" in result.stdout
    assert "Megatron derives 2 virtual stage(s) per rank from the layout" in result.stdout


def test_cli_split_errors_are_one_line_and_write_nothing(tmp_path):
    sched = tmp_path / "s.json"
    generate("zb-v", 2, 4).save(sched)
    out = tmp_path / "out"
    out.mkdir()
    result = invoke("export", sched, "-f", "torchtitan", "-o", out / "x.csv")
    assert result.exit_code == 1 and result.stderr.startswith("error: schedule 'zb-v' carries no layer split: ")
    assert len(result.stderr.splitlines()) == 1
    result = invoke("export", sched, "-f", "megatron-layout", "-o", out / "x.args", "--uniform", "1,1,1")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == ["error: --format megatron-layout needs a layer split, which --uniform does "
                                          "not have: give the split's --profile PROFILE.json, or a schedule solved "
                                          "on a layer profile"]
    prof = tmp_path / "toy.json"
    toy_profile().save(prof)
    with_split("zb-v", 2, 4, [2, 2, 2, 2]).save(sched)
    result = invoke("export", sched, "-f", "megatron-layout", "-o", out / "x.args", "--profile", prof)
    assert result.exit_code == 1 and "has no V-shape" in result.stderr
    assert list(out.iterdir()) == []
    assert json.loads(sched.read_text())["plan"]["split"]["chunks"][0] == ["tok_embeddings", "layers.0"]

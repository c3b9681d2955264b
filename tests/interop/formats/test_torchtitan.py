"""The torchtitan export for the torchtitan a user has (issue 29): main (a Python config) and 0.2 (TOML),
checked against the field names of each version's source; every module of torchtitan's model named
exactly once, or the export refused; the installed version detected from its files."""

from __future__ import annotations

import ast
import importlib.util
import json
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.errors import PartitionError, ScheduleError
from zbsearch.core.ir import Schedule
from zbsearch.core.profile import load_profile
from zbsearch.interop.formats import torchtitan
from zbsearch.interop.formats.export import export_files
from zbsearch.interop.formats.layer_split import Split
from zbsearch.schedules import generate

from plans import with_legacy_plan

runner = CliRunner()

# Facts from pytorch/torchtitan's sources (names only).
# v0.2.2 (73a0e697), torchtitan/config/job_config.py, class Parallelism: its pipeline fields and types.
PARALLELISM_0_2 = {
    "pipeline_parallel_degree": int, "module_fqns_per_model_part": list, "pipeline_parallel_first_stage_less_layers": int,
    "pipeline_parallel_last_stage_less_layers": int, "pipeline_parallel_layers_per_stage": int,
    "pipeline_parallel_schedule": str, "pipeline_parallel_schedule_csv": str, "pipeline_parallel_microbatch_size": int,
    "pipeline_parallel_expert_parallel_overlap": bool,
}
# main at b5bcd76c (2026-08-21), torchtitan/config/configs.py, class ParallelismConfig: its pipeline fields.
PARALLELISM_MAIN = {
    "pipeline_parallel_degree", "module_fqns_per_model_part", "pipeline_parallel_first_stage_less_layers",
    "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
    "pipeline_parallel_schedule_csv", "num_pp_microbatches",
}
# The decoder models' top-level modules (models/llama3/model/model.py on 0.2.2, models/common/decoder.py on main).
HEAD = {"0.2": "output", "main": "lm_head"}


def llama_modules(blocks: int, version: str) -> list[str]:
    return ["tok_embeddings", *(f"layers.{i}" for i in range(blocks)), "norm", HEAD[version]]


def estimate_llama(folder: Path) -> str:
    """A Llama-style profile of 6 blocks estimated on an H100 (p=2, m=4), written in `folder`."""
    result = runner.invoke(app, ["profile", "--estimate", "--gpu", "h100", "--model", "llama", "--layers", "6",
                                 "--hidden", "256", "--heads", "4", "--kv-heads", "2", "--seq", "128", "-p", "2",
                                 "-m", "4", "-o", str(folder / "llama.json")])
    assert result.exit_code == 0, result.stderr
    return str(folder / "llama.json")


@pytest.fixture(scope="module")
def llama_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama-style plan: 6 blocks estimated on an H100, p=2, m=4, split and V-shape order solved together."""
    folder = tmp_path_factory.mktemp("llama")
    result = runner.invoke(app, ["solve", "--profile", estimate_llama(folder), "--mem-limit", "2p",
                                 "--placement", "v", "--partition", "auto", "--time-limit", "5",
                                 "-o", str(folder / "plan.json")])
    assert result.exit_code == 0, result.stderr
    return folder / "plan.json"


def exported(plan: Path, version: str) -> tuple[Schedule, Path]:
    schedule = Schedule.load(plan)
    csv, config = export_files(schedule, "torchtitan", plan.with_name(f"plan-{version}.csv"),
                               load_profile(plan.with_name("llama.json")), torchtitan=version)
    assert csv.suffix == ".csv" and csv.read_text()
    return schedule, config


def test_the_0_2_toml_names_every_module_once_with_its_fields(llama_plan: Path) -> None:
    schedule, config = exported(llama_plan, "0.2")
    assert config.suffix == ".toml"
    table = tomllib.loads(config.read_text())["parallelism"]
    assert set(table) <= set(PARALLELISM_0_2)
    assert all(isinstance(value, PARALLELISM_0_2[key]) for key, value in table.items())
    parts = table["module_fqns_per_model_part"]
    assert sorted(m for part in parts for m in part) == sorted(llama_modules(6, "0.2"))
    assert len(parts) == 4 and table["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    assert table["pipeline_parallel_degree"] == 2
    assert parts == [list(c) for c in torchtitan.torchtitan_parts(schedule.plan.split, "0.2")]


# main's TrainingConfig fields the file sets (b5bcd76c; seq_len is set through _set_sequence_length).
TRAINING_MAIN = {"num_tokens_per_microbatch_per_dp_rank", "disable_cuda_graphs"}


def assigned(source: str, name: str) -> list[str]:
    """The attributes of `name` that the source assigns (`par.x = ...`)."""
    return [node.targets[0].attr for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Attribute) and ast.unparse(node.targets[0].value) == name]


def test_the_main_config_sets_known_fields_and_names_every_module_once(llama_plan: Path) -> None:
    """main is read, not run (the 0.3 config is run inside torchtitan: test_torchtitan_run.py)."""
    schedule, config = exported(llama_plan, "main")
    assert config.suffix == ".py"
    source = config.read_text()
    fields = assigned(source, "par")
    assert set(fields) <= PARALLELISM_MAIN | {"data_parallel_shard_degree", "data_parallel_replicate_degree",
                                              "fsdp_reshard_after_forward"}
    assert set(assigned(source, "training")) == TRAINING_MAIN
    module = {}
    exec(compile(source, str(config), "exec"), module)  # the constants; apply_pipeline needs torchtitan
    assert module["MICROBATCHES"] == schedule.num_microbatches == 4 and module["SCHEDULE"] == "ZBVZeroBubble"
    assert (module["MICROBATCH_SIZE"], module["SEQ_LEN"]) == (1, 128)  # estimate_llama's shape
    assert module["SCHEDULE_CSV"] == str(config.with_suffix(".csv"))
    assert module["SPLIT_BACKWARD"] is True and module["RECOMPUTE_MODE"] == "none"
    parts = module["MODULE_FQNS_PER_MODEL_PART"]
    assert sorted(m for part in parts for m in part) == sorted(llama_modules(6, "main"))
    assert "lm_head" in parts[-1] and "output" not in json.dumps(parts)


def split_of_modules(parts: list[list[str]], kinds: list[list[str]] | None = None) -> Split:
    chunks = tuple(tuple(p) for p in parts)
    return Split(chunks, chunks, tuple(tuple(k) for k in kinds) if kinds else tuple(("other",) * len(c) for c in parts))


@pytest.mark.parametrize("parts, message", [
    ([["tok_embeddings", "layers.0"], ["layers.1", "output"]],
     "the split leaves module 'norm' in no stage: torchtitan (main at b5bcd76c (2026-08-21)) would drop it"),
    ([["tok_embeddings", "layers.0"], ["layers.2", "norm", "output"]], "the split leaves module 'layers.1' in no stage"),
    ([["tok_embeddings", "layers.0"], ["layers.0", "norm", "output"]], "module 'layers.0' is listed in stages 0 and 1"),
    ([["embedding", "block0"], ["block1", "head"]], "module 'embedding' (stage 0) is not a module of torchtitan's "
                                                    "decoder models (tok_embeddings, layers.<i>, norm and lm_head)"),
])
def test_a_split_that_does_not_name_every_module_once_is_refused(parts, message) -> None:
    with pytest.raises(PartitionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        torchtitan.torchtitan_parts(split_of_modules(parts), "main")


def test_mtp_layers_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    parts = [["tok_embeddings", "layers.0"], ["mtp_layers.0", "norm", "output"]]
    schedule = with_legacy_plan(generate("1f1b", 2, 4),
                                {"chunks": parts, "kinds": [["embedding", "decoder"], ["mtp", "other", "output"]]})
    with pytest.raises(PartitionError, match="torchtitan does not pipeline them"):
        export_files(schedule, "torchtitan", tmp_path / "s.csv", torchtitan="0.2")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("files, version", [
    ({"config/job_config.py": ""}, "0.2"), ({"config/configs.py": "num_pp_microbatches: int = 1"}, "main"),
    ({"config/configs.py": "pipeline_parallel_microbatch_size: int = 1"}, "0.3"), ({}, None)])
def test_the_installed_torchtitan_is_told_by_its_files(tmp_path, monkeypatch, files, version) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    spec = SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(torchtitan.importlib.util, "find_spec", lambda name: spec)
    assert torchtitan.installed_version() == version
    expected = (version, "the torchtitan installed here") if version else ("main", "the default: no torchtitan "
                                                                                  "installed here")
    assert torchtitan.resolve_version(None) == expected
    assert torchtitan.resolve_version("0.2") == ("0.2", "as asked")


@pytest.fixture(scope="module")
def recompute_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama-style plan that recomputes layers.1 and layers.4 in full (p=2, linear)."""
    folder = tmp_path_factory.mktemp("recompute")
    result = runner.invoke(app, ["solve", "--profile", estimate_llama(folder), "--mem-limit", "2p",
                                 "--placement", "linear", "--partition", "fixed:4,4", "--time-limit", "2",
                                 "--recompute", "fixed:layers.1,layers.4", "-o", str(folder / "plan.json")])
    assert result.exit_code == 0, result.stderr
    return folder / "plan.json"


def test_the_blocks_a_plan_recomputes_go_to_torchtitan_per_part(recompute_plan: Path) -> None:
    """0.3 and main get the blocks per part (wrapped inside torchtitan: test_torchtitan_run.py); 0.2's TOML
    has one mode for every block, so a plan that recomputes some is refused there, nothing written."""
    for version in ("0.3", "main"):
        _, config = exported(recompute_plan, version)
        module: dict = {}
        exec(compile(config.read_text(), str(config), "exec"), module)
        assert module["RECOMPUTE_FQNS_PER_MODEL_PART"] == [["layers.1"], ["layers.4"]]
        assert module["RECOMPUTE_MODE"] == "planned"
    with pytest.raises(PartitionError, match="torchtitan 0.2 applies one activation-checkpointing mode to every"):
        exported(recompute_plan, "0.2")
    assert not recompute_plan.with_name("plan-0.2.toml").exists()


def test_selective_recompute_is_refused_for_torchtitan() -> None:
    schedule = generate("1f1b", 2, 4)
    parts = [["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]]
    split = split_of_modules(parts)
    with pytest.raises(PartitionError, match="recomputes 'layers.1' at selective .* torchtitan cannot wrap by module"):
        torchtitan.torchtitan_config(schedule, split, "s.csv", "main", {"layers.1": "selective"})
    with pytest.raises(PartitionError, match="recomputes 'norm', which is not a decoder block"):
        torchtitan.torchtitan_config(schedule, split, "s.csv", "main", {"norm": "full"})


def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, llama_plan: Path) -> None:
    """-p 1, a profile without the microbatch, no profile, an unknown version: one line each, no file."""
    profile = llama_plan.with_name("llama.json")
    one = tmp_path / "one.json"
    with_legacy_plan(generate("1f1b", 1, 4), {"chunks": [llama_modules(2, "main")]}).save(one)
    raw = json.loads(profile.read_text())
    del raw["details"]["model"]["micro_batch"]
    (tmp_path / "bare.json").write_text(json.dumps(raw))
    with pytest.raises(ScheduleError, match="turns pipelining off at pipeline_parallel_degree 1") as err:
        torchtitan.torchtitan_config(Schedule.load(one), Schedule.load(one).plan.split, "x.csv", "0.3", {},
                                     load_profile(profile))
    assert "\n" not in str(err.value)
    cases = [([llama_plan, "--profile", tmp_path / "bare.json"], "does not record the microbatch it was made for"),
             ([llama_plan], "error: --profile: the torchtitan export needs the profile the plan was made on"),
             ([llama_plan, "--profile", profile, "--torchtitan", "0.9"], "torchtitan version '0.9' is not known")]
    for args, message in cases:
        result = runner.invoke(app, ["export", *map(str, args), "-f", "torchtitan", "-o", str(tmp_path / "x.csv")])
        assert result.exit_code == 1 and len(result.stderr.splitlines()) == 1 and message in result.stderr, args
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare.json", "one.json"]

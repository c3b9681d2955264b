"""A plan's recompute in the Megatron-LM export (issue 28, deliverable 5): the recompute flags where the plan
is one Megatron setting, and otherwise no flags and a statement naming the first stage that differs and the
nearest uniform setting, which holds at least as little memory as the plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.errors import PartitionError, ScheduleError
from zbsearch.core.ir import Schedule
from zbsearch.core.partition import counts_of, partition_profile
from zbsearch.core.profile import load_profile
from zbsearch.core.recompute.levels import with_recompute
from zbsearch.interop.formats.layer_split import split_of
from zbsearch.interop.formats.megatron_recompute import block, megatron_recompute, spans
from zbsearch.interop.formats.trainers import megatron_args
from zbsearch.schedules import generate
from zbsearch.sim.simulate import simulate

from plans import with_legacy_plan

runner = CliRunner()
LINEAR = ([["emb", "l0", "l1", "l2"], ["l3", "l4", "l5", "out"]],
          [["embedding", "decoder", "decoder", "decoder"], ["decoder", "decoder", "decoder", "output"]])
# Uneven stages, interleaved over 2 ranks: 1, 3, 2 and 1 decoder layers.
INTERLEAVED = ([["emb", "l0"], ["l1", "l2", "l3"], ["l4", "l5"], ["l6", "out"]],
               [["embedding", "decoder"], ["decoder"] * 3, ["decoder"] * 2, ["decoder", "output"]])
MTP = ([["emb", "l0", "l1"], ["l2", "l3", "m0", "out"]],
       [["embedding", "decoder", "decoder"], ["decoder", "decoder", "mtp", "output"]])
FULL = ("--recompute-granularity", "full")


def plan(split: tuple[list, list], levels: dict[str, str], microbatches: list | None = None) -> Schedule:
    name = "interleaved-1f1b" if len(split[0]) == 4 else "1f1b"
    partition = {"chunks": split[0], "kinds": split[1], "recompute": levels}
    if microbatches is not None:
        partition["recompute_microbatches"] = microbatches
    return with_legacy_plan(generate(name, 2, 4), partition)


def exported(schedule: Schedule) -> tuple[str, tuple[str, ...], str | None]:
    split = split_of(schedule)
    recompute = megatron_recompute(schedule, split)
    return megatron_args(schedule, split), recompute.flags, recompute.statement


def every(names: str, level: str = "full") -> dict[str, str]:
    return {name: level for name in names.split()}


@pytest.mark.parametrize("split,levels,flags", [
    (LINEAR, every("l0 l3"), block(1)),
    (LINEAR, every("l0 l1 l3 l4"), block(2)),
    (LINEAR, every("l0 l1 l2 l3 l4 l5"), block(3)),
    # Block counts per virtual stage; one of fewer decoder layers recomputes all of its own.
    (INTERLEAVED, every("l0 l1 l2 l4 l5 l6"), block(2)),
    (INTERLEAVED, every("l0 l1 l4 l6"), block(1)),
    (LINEAR, every("l0 l1 l2 l3 l4 l5", "selective"), ("--recompute-granularity", "selective", "--recompute-modules",
                                                       "core_attn")),
    # MTP layers are recomputed by the uniform method only.
    (MTP, every("l0 l1 l2 l3 m0"), (*FULL, "--recompute-method", "uniform", "--recompute-num-layers", "1")),
    (MTP, every("l0 l2"), block(1)),
])
def test_a_plan_uniform_over_stages_gives_exactly_the_flags(split, levels, flags) -> None:
    args, got, statement = exported(plan(split, levels))
    assert (got, statement) == (flags, None)
    assert args.endswith(" " + " ".join(flags) + "\n") and args.count("--recompute-") == len(flags) // 2


def test_no_recompute_gives_no_flags_and_no_statement() -> None:
    args, flags, statement = exported(plan(LINEAR, {}))
    assert (flags, statement) == ((), None) and "--recompute" not in args


@pytest.mark.parametrize("split,levels,reason,nearest", [
    (LINEAR, every("l0 l1 l3"), "stage 1 recomputes its first 1 of 3 decoder layers, stage 0 its first 2",
     block(2)),
    (LINEAR, every("l0 l4"), "stage 1 recomputes 'l4' but not 'l3' before it", block(2)),
    (INTERLEAVED, every("l0 l1 l4"), "stage 3 recomputes none of its 1 decoder layers, stage 0 its first 1",
     block(1)),
    (INTERLEAVED, every("l0 l1 l3"), "stage 1 recomputes 'l3' but not 'l2' before it", block(3)),
    (LINEAR, every("l0 l1", "selective"), "stage 0 leaves 'l2' without recompute", ("--recompute-granularity",
                                                                                   "selective", "--recompute-modules",
                                                                                   "core_attn")),
    (LINEAR, {"l0": "full", "l3": "selective"}, "stage 0 recomputes 'l0' at full and stage 1 'l3' at selective",
     block(1)),
    (MTP, every("l0 m0"), "stage 0 leaves decoder layer 'l1' without recompute while MTP layer 'm0' is recomputed",
     (*FULL, "--recompute-method", "uniform", "--recompute-num-layers", "1")),
])
def test_a_plan_megatron_cannot_express_gets_a_statement_and_no_flags(split, levels, reason, nearest) -> None:
    args, flags, statement = exported(plan(split, levels))
    assert flags == () and "--recompute" not in args
    assert statement.startswith(f"Megatron-LM cannot express this plan's recompute: {reason};")
    assert statement.endswith("Nearest uniform setting that holds at least as little memory, not the plan (it "
                              f"recomputes more, so iterations take longer than planned): {' '.join(nearest)}")
    assert "\n" not in statement


def test_layers_outside_the_transformer_block_have_no_setting() -> None:
    _, flags, statement = exported(plan(LINEAR, every("emb l0 l3")))
    assert flags == ()
    assert "stage 0 recomputes embedding layer 'emb'; Megatron recomputes decoder and MTP layers only" in statement
    assert statement.endswith("No Megatron setting holds as little memory as the plan, as none recomputes 'emb'; "
                              f"the nearest, not the plan: {' '.join(block(1))}")


@pytest.mark.parametrize("microbatches,partial", [
    ([[0, 1], None], "stage 0 recomputes on microbatches 0-1 of 0-3 only"),
    # A stage on which no microbatch recomputes recomputes nothing: then the stages differ in layers.
    ([None, []], "stage 1 recomputes none of its 3 decoder layers, stage 0 its first 1"),
    ([None, None], None),
    ([[3, 2, 1, 0], None], None),
    ([None, [0]], "stage 1 recomputes on microbatch 0 of 0-3 only"),
])
def test_per_microbatch_choices_are_not_megatrons(microbatches, partial) -> None:
    _, flags, statement = exported(plan(LINEAR, every("l0 l3"), microbatches))
    if partial is None:
        assert (flags, statement) == (block(1), None)
    else:
        assert flags == () and partial in statement
        assert statement.endswith(" ".join(block(1)))


def test_only_stages_that_recompute_are_held_to_every_microbatch() -> None:
    head_alone = ([["emb", "l0", "l1"], ["l2", "l3"], ["l4", "l5"], ["out"]],
                  [["embedding", "decoder", "decoder"], ["decoder"] * 2, ["decoder"] * 2, ["output"]])
    _, flags, statement = exported(plan(head_alone, every("l0 l2 l4"), [None, None, None, [0]]))
    assert (flags, statement) == (block(1), None)  # stage 3 recomputes nothing
    _, flags, statement = exported(plan(head_alone, every("l0 l2 l4"), [None, None, [0], None]))
    assert flags == () and "stage 2 recomputes on microbatch 0 of 0-3 only" in statement


# A field out of form is refused as the plan loads (ScheduleError, naming the file's field); a layer the split
# does not hold, as the export checks the levels against the split (PartitionError).
@pytest.mark.parametrize("field,value,error,message", [
    ("recompute", {"nope": "full"}, PartitionError, "plan.recompute names layer 'nope', which plan.split.chunks "
                                                    "does not list"),
    ("recompute", {"l0": "half"}, ScheduleError, "meta.partition.recompute gives layer 'l0' level 'half': use full "
                                                 "or selective"),
    ("recompute_microbatches", [None], ScheduleError, "meta.partition.recompute_microbatches must list one entry per "
                                                      "chunk (2)"),
    ("recompute_microbatches", [[4], None], ScheduleError, "meta.partition.recompute_microbatches[0] must list "
                                                           "microbatch indices from 0 to 3, each once"),
])
def test_malformed_recompute_fields_are_one_line_errors(field, value, error, message) -> None:
    with pytest.raises(error) as err:
        exported(with_legacy_plan(plan(LINEAR, every("l0 l3")), {field: value}))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_spans() -> None:
    assert (spans([5, 0, 2, 1]), spans([]), spans([3])) == ("0-2, 5", "", "3")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama-style profile of 6 blocks estimated on an H100 (p=2, m=4), naive attention so that its blocks
    list selective recompute too."""
    path = tmp_path_factory.mktemp("megatron") / "llama.json"
    result = runner.invoke(app, ["profile", "--estimate", "--gpu", "h100", "--model", "llama", "--layers", "6",
                                 "--hidden", "256", "--heads", "4", "--kv-heads", "2", "--seq", "128", "-p", "2",
                                 "-m", "4", "--attention", "naive", "-o", str(path)])
    assert result.exit_code == 0, result.stderr
    return path


def solved(profile: Path, recompute: str) -> tuple[Path, Schedule]:
    """The profile's plan split 4 + 4 layers (tok_embeddings, layers.0-2 | layers.3-5, head) on a linear
    placement, recomputing `recompute`."""
    plan = profile.with_name(f"plan-{recompute.replace(':', '-').replace(',', '-')}.json")
    result = runner.invoke(app, ["solve", "--profile", str(profile), "--mem-limit", "2p", "--placement", "linear",
                                 "--partition", "fixed:4,4", "--time-limit", "2", "--recompute", recompute,
                                 "-o", str(plan)])
    assert result.exit_code == 0, result.stderr
    return plan, Schedule.load(plan)


def export_megatron(plan: Path, profile: Path):
    result = runner.invoke(app, ["export", str(plan), "-f", "megatron-layout", "--profile", str(profile),
                                 "-o", str(plan.with_suffix(".args"))], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.stderr
    return result, plan.with_suffix(".args").read_text()


@pytest.mark.parametrize("recompute,flags", [
    ("fixed:layers.0,layers.3", block(1)),
    ("full", block(3)),
    ("selective", ("--recompute-granularity", "selective", "--recompute-modules", "core_attn")),
])
def test_a_solved_plan_uniform_over_stages_exports_its_flags(llama: Path, recompute: str, flags) -> None:
    plan, schedule = solved(llama, recompute)
    assert set(json.loads(plan.read_text())["plan"]["recompute"].values()) == {flags[1]}
    result, args = export_megatron(plan, llama)
    assert args == ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*3|t*3L' --num-layers 6 "
                    f"{' '.join(flags)}\n")
    assert result.stderr == "" and args.strip() in result.stdout


def peaks(schedule: Schedule, profile: Path, levels: dict[str, str]) -> list[float]:
    """Each rank's peak activation memory for the plan's split with these layers recomputed."""
    prof = with_recompute(load_profile(profile), levels, restage=False)
    counts = counts_of(schedule.plan.split.chunks, prof.layers, schedule.placement)
    timeline = simulate(schedule, partition_profile(prof, schedule.placement, counts))
    return [timeline.peak_memory(r) for r in range(schedule.num_ranks)]


def test_a_solved_plan_megatron_cannot_express_names_a_setting_holding_no_more(llama: Path) -> None:
    plan, schedule = solved(llama, "fixed:layers.1,layers.4")
    result, args = export_megatron(plan, llama)
    assert "--recompute" not in args
    statement = result.stderr.removeprefix("warning: ").strip()
    assert statement.startswith("Megatron-LM cannot express this plan's recompute: stage 0 recomputes 'layers.1' "
                                "but not 'layers.0' before it")
    assert statement.endswith(" ".join(block(2)))
    # block 2 recomputes the first two blocks of each stage: every rank holds no more than the plan.
    chunks = schedule.plan.split.chunks
    nearest = {name: "full" for chunk in chunks for name in [n for n in chunk if n.startswith("layers.")][:2]}
    assert nearest == {"layers.0": "full", "layers.1": "full", "layers.3": "full", "layers.4": "full"}
    planned = peaks(schedule, llama, schedule.plan.levels)
    # (Some solves peak on rank 1 while its blocks hold from I until W, which full recompute does not lower.)
    held = list(zip(peaks(schedule, llama, nearest), planned))
    assert all(a <= b for a, b in held) and any(a < b for a, b in held)
    plain = list(zip(peaks(schedule, llama, {}), planned))  # the plan's recompute saves memory
    assert all(a >= b for a, b in plain) and any(a > b for a, b in plain)

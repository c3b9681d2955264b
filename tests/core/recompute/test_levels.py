"""Recompute chosen for a profile's layers (issue 28): a layer at a level, the --recompute values, a
profile with its levels applied, and what the split report says per rank."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.errors import ProfileError
from zbsearch.core.ir import vshape
from zbsearch.core.partition import partition_profile, plan_of
from zbsearch.core.planned_profile import for_plan
from zbsearch.core.recompute.levels import parse_recompute, recomputed, with_recompute
from zbsearch.profiling.build import profile_estimate
from zbsearch.profiling.request import LlamaShape, PipelineSetup, StageSplit
from zbsearch.schedules import generate
from zbsearch.sim.simulate import simulate

from plans import with_legacy_plan, with_plan

runner = CliRunner()
SHAPE = LlamaShape(layers=4, hidden=256, heads=4, kv_heads=2, seq=128, vocab=1024)


@pytest.fixture(scope="module")
def naive():
    return profile_estimate(SHAPE, "h100", StageSplit(stages=2), PipelineSetup(microbatches=4), attention="naive")


def test_a_recomputed_layer_pays_in_i_and_holds_less_until_i(naive) -> None:
    block = naive.layers[1]
    full = recomputed(block, "full")
    option = block.recompute[-1]
    assert (full.F, full.B, full.W) == (block.F, block.B + option.time, block.W)
    assert full.BW == pytest.approx(block.BW + option.time)
    assert (full.mem_B_torch, full.mem_W_torch) == (option.mem_B, option.mem_W)
    assert (full.mem_B, full.mem_W) == (option.mem_B, block.mem_W)  # the paper's: W's needs held from I
    assert full.recompute == () and full.details["recomputed"]["level"] == "full"
    assert full.details["recomputed"]["saved_from_f"] == block.mem_B - option.mem_B
    assert recomputed(block, "none") is block and recomputed(naive.layers[0], "full") is naive.layers[0]


def test_a_recomputed_layer_keeps_nothing_after_w_off_the_loss_chunk(naive) -> None:
    """The recompute-once wrapper frees a layer's rebuilt activations with its graph (measured on ZB-V's
    middle chunks, tests/interop/run/test_run_recompute.py); unmeasured stays unmeasured."""
    block = replace(naive.layers[1], mem_kept_torch=2113536.0, mem_kept_loss_torch=4734976.0)
    full = recomputed(block, "full")
    assert full.mem_kept_torch == 0.0 and full.mem_kept_loss_torch == block.mem_kept_loss_torch
    assert recomputed(replace(block, mem_kept_torch=None), "full").mem_kept_torch is None


def test_recompute_values_name_levels_per_layer(naive) -> None:
    layers = naive.layers
    assert parse_recompute("none", layers) == {}
    assert parse_recompute("full", layers) == {f"layers.{i}": "full" for i in range(4)}
    assert parse_recompute("fixed:layers.0..layers.1=selective,layers.3", layers) == {
        "layers.0": "selective", "layers.1": "selective", "layers.3": "full"}
    for value, message in [("auto2", "recompute 'auto2' is not known"),
                           ("fixed:layers.9", "names layer 'layers.9', which the profile does not list"),
                           ("fixed:output", "asks layer 'output' for full, which it does not list as an option"),
                           ("fixed:layers.1=half", "asks for level 'half': use full or selective")]:
        with pytest.raises(ProfileError, match=message):
            parse_recompute(value, layers)
    # A level no layer lists is refused, not planned as no recompute at all (sdpa keeps no s x s to drop).
    fused = [replace(x, recompute=tuple(o for o in x.recompute if o.level != "selective")) for x in layers]
    assert parse_recompute("full", fused) == parse_recompute("full", layers)
    with pytest.raises(ProfileError, match="recompute selective: no layer of the profile lists a selective option"):
        parse_recompute("selective", fused)
    with pytest.raises(ProfileError, match="no layer of the profile lists a full option"):
        parse_recompute("full", layers[:1])


def test_full_recompute_lowers_the_peak_and_lengthens_the_iteration(naive) -> None:
    full = with_recompute(naive, parse_recompute("full", naive.layers))
    schedule = generate("1f1b", 2, 4)
    before, after = simulate(schedule, naive), simulate(schedule, full)
    assert after.makespan > before.makespan
    assert all(after.peak_memory(r) < before.peak_memory(r) for r in range(2))
    assert with_recompute(naive, {}) is naive
    with pytest.raises(Exception, match="does not record which layers each stage holds"):
        with_recompute(replace(naive, details={}), {"layers.0": "full"})


@pytest.mark.parametrize("placement", ["linear", "v"])
def test_a_multiple_of_p_caps_the_same_bytes_whatever_is_recomputed(naive, placement) -> None:
    """`1p` is p stages' activations as profiled: recompute lowers what a plan holds, not its limit (it
    once shrank the cap with the levels, and `--recompute full` under 1p ran one microbatch at a time)."""
    from zbsearch.core.memory import parse_mem_limit
    from zbsearch.core.partition import partition_profile
    from zbsearch.core.placement import parse_placement

    where = parse_placement(placement, 2)
    counts = (3, 3) if placement == "linear" else (2, 1, 1, 2)  # 6 layers: the embedding, 4 blocks, the head
    plain = partition_profile(naive, where, counts)
    full = partition_profile(with_recompute(naive, parse_recompute("full", naive.layers), restage=False), where, counts)
    assert parse_mem_limit("1p", full, where).per_rank == pytest.approx(parse_mem_limit("1p", plain, where).per_rank)
    assert all(full.stages[r].mem_B < plain.stages[r].mem_B for r in range(2))  # recompute does hold less
    restaged = with_recompute(naive, parse_recompute("full", naive.layers))  # the profile's own split
    assert parse_mem_limit("1p", restaged).per_rank == pytest.approx(parse_mem_limit("1p", naive).per_rank)

def test_solve_reports_what_recompute_does_per_rank(naive, tmp_path: Path) -> None:
    naive.save(tmp_path / "p.json")
    args = ["solve", "--profile", str(tmp_path / "p.json"), "--partition", "even", "--placement", "linear",
            "--mem-limit", "2p",
            "--time-limit", "2", "--json"]
    ranks = json.loads(runner.invoke(app, [*args, "--recompute", "fixed:layers.0,layers.3=selective"]).stdout)
    ranks = ranks["partition"]["ranks"]
    chosen = {entry["layer"]: entry["level"] for row in ranks for entry in row.get("recomputed", [])}
    assert chosen == {"layers.0": "full", "layers.3": "selective"}
    assert all(row["recompute_time"] > 0 and row["recompute_saved_bytes"] > 0 for row in ranks)
    plain = json.loads(runner.invoke(app, args).stdout)["partition"]["ranks"]
    assert not any("recomputed" in row for row in plain)
    # Under the paper's accounting too: what W needs is held from I until W, more than F kept.
    paper = json.loads(runner.invoke(app, [*args, "--recompute", "full", "--memory-model", "paper"]).stdout)
    assert paper["memory_model"] == "paper" and all(row.get("recomputed") for row in paper["partition"]["ranks"])


def _per_microbatch(schedule, entries, legacy: bool = True):
    """The schedule as loaded from a file stating these entries (meta.partition or, not `legacy`, plan)."""
    return (with_legacy_plan if legacy else with_plan)(schedule, {"recompute_microbatches": entries})


def test_a_plan_may_recompute_only_some_microbatches(naive) -> None:
    """Each microbatch is costed as it runs: with recompute on the chunks and microbatches the plan lists,
    as profiled on the others; recomputing none is the plan without recompute, all the plan with it."""
    full = with_recompute(naive, {"layers.0": "full", "layers.3": "full"})
    schedule = generate("1f1b", 2, 4)
    every, none = simulate(schedule, full), simulate(schedule, naive)
    assert simulate(_per_microbatch(schedule, [None, None]), full).makespan == every.makespan
    kept = simulate(_per_microbatch(schedule, [[], []]), full)
    assert kept.makespan == pytest.approx(none.makespan)
    assert [kept.peak_memory(r) for r in range(2)] == pytest.approx([none.peak_memory(r) for r in range(2)])
    some = simulate(_per_microbatch(schedule, [[0, 1], None]), full)
    assert none.makespan < some.makespan < every.makespan
    assert every.peak_memory(0) < some.peak_memory(0) <= none.peak_memory(0)
    assert some.peak_memory(1) == pytest.approx(every.peak_memory(1))


@pytest.mark.parametrize("entries, message", [
    ([None], " must list one entry per chunk (2)"),
    ("all", " must list one entry per chunk (2)"),
    ([[4], None], "[0] must list microbatch indices from 0 to 3, each once"),
    ([None, [1, 1]], "[1] must list microbatch indices from 0 to 3, each once"),
    ([None, [True]], "[1] must list microbatch indices from 0 to 3, each once"),
])
@pytest.mark.parametrize("legacy, field", [(True, "meta.partition"), (False, "plan")])
def test_a_malformed_per_microbatch_choice_is_one_line_error(naive, entries, message, legacy, field) -> None:
    from zbsearch.core.errors import ScheduleError
    with pytest.raises(ScheduleError) as err:  # refused as the plan loads
        simulate(_per_microbatch(generate("1f1b", 2, 4), entries, legacy), naive)
    assert f"schedule '1f1b' {field}.recompute_microbatches{message}" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_plan_names_only_the_levels_some_microbatch_recomputes(naive) -> None:
    # issue 38: a level whose chunk recomputes no microbatch stayed in the plan record.
    prof = with_recompute(naive, parse_recompute("full", naive.layers), restage=False)
    split = partition_profile(prof, vshape(2), [2, 1, 1, 2])
    names = split.partition
    every = plan_of(split).levels
    assert set(every) == {n for chunk in names for n in chunk if n.startswith("layers.")}
    plan = plan_of(split, "2p", (frozenset({0}), frozenset(), None, frozenset()))
    idle = {n for c in (1, 3) for n in names[c]}
    assert set(plan.levels) == set(every) - idle and plan.recompute_microbatches[1] == frozenset()
    # the chunk without recompute costs the same either way: the simulator and for_plan agree
    chosen = replace(generate("zb-v", 2, 4), plan=plan)
    assert simulate(chosen, split).makespan == pytest.approx(simulate(chosen, for_plan(naive, chosen)).makespan)

"""`zbsearch run` with activation recompute (issue 28, deliverable 4): the plan's recomputed layers run
through the recompute-once wrapper (profiling/recompute_once.py), per microbatch where the plan says so,
with exact gradients; on the profiler's GPT the measured peak activation memory per rank is within 10% of
the plan's. Two short gloo runs; the refusals start no process. The iteration time against the plan's is
bench/run_recompute_timing.py's (results/run_recompute_timing.md): on a machine that other work shares a
test cannot time it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plans import with_legacy_plan, with_plan
from zbsearch.cli.app import app
from zbsearch.core.errors import RunError, ScheduleError
from zbsearch.profiling.build import profile_gpt_estimate, profile_measured
from zbsearch.profiling.request import GptShape, MeasureRequest, PipelineSetup, StageSplit
from zbsearch.schedules import generate
from zbsearch.sim.simulate import simulate

pytest.importorskip("torch")

from zbsearch.interop.run.launcher import run  # noqa: E402
from zbsearch.interop.run.model import plan_profiled_model, predicted_profile  # noqa: E402

pytestmark = pytest.mark.torch

# The model of results/fidelity.md (profiles/cpu-gpt-fidelity.json), measured afresh so that its times are
# this machine's now: fewer repeats than a profile for planning, it only has to be as noisy as the run.
SHAPE = GptShape(layers=4, hidden=256, heads=4, seq=128, micro_batch=4, vocab=2048)
BLOCKS = ["layers.0", "layers.1", "layers.2", "layers.3"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_plan_that_recomputes_every_block_runs_with_the_plans_memory() -> None:
    profile = profile_measured("gpt", StageSplit(stages=2), PipelineSetup(microbatches=4, torch_stage0=True),
                               MeasureRequest(device="cpu", warmup=1, repeats=5), shape=SHAPE)
    assert all({o.level for o in layer.recompute} == {"full", "selective"} for layer in profile.layers[1:5])
    schedule = with_legacy_plan(generate("zb-v", 2, 4),  # the split backward, and two chunks per rank
                                {"chunks": [["tok_embeddings", "layers.0"], ["layers.1"], ["layers.2"],
                                            ["layers.3", "output"]], "recompute": {name: "full" for name in BLOCKS}})
    plan = plan_profiled_model(schedule, profile)
    predicted = simulate(schedule, predicted_profile(schedule, profile, plan)[0])
    plain = simulate(schedule, predicted_profile(schedule, profile, replace(plan, recompute=()))[0])

    result = run(schedule, profile=profile, steps=3, warmup=1, track_memory=True, pin_cpu=True)
    assert result.ok and result.checked and result.max_grad_rel_error < 1e-4, result.problems
    # one forward again per recomputed block and microbatch in 5 steps (warm-up, 3 timed, memory), and once
    # for each block past chunk 0 in torch's first-step inference of the input gradients' shapes
    assert result.details["recompute"]["forwards_run_again"] == [2 * 4 * 5 + 1, 2 * 4 * 5 + 2]
    want = [predicted.peak_memory(r) for r in range(2)]
    assert all(w < 0.9 * plain.peak_memory(r) for r, w in enumerate(want))
    # Within 10% per rank; the plan counts the tensor handed from chunk 1 to chunk 2 on rank 1 twice (as
    # chunk 1's output and chunk 2's input), 4.3% of rank 1's peak here (3.5% without recompute).
    errors = [got / w - 1 for got, w in zip(result.memory_peak_bytes, want)]
    print(f"peak memory per rank: measured {result.memory_peak_bytes}, plan {want}; step seconds "
          f"{result.step_seconds}, plan {result.profile_step_seconds}")
    assert all(abs(e) <= 0.10 for e in errors), (result.memory_peak_bytes, want)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_per_microbatch_choices_recompute_only_the_microbatches_listed(tmp_path: Path) -> None:
    profile = profile_gpt_estimate(GptShape(layers=2, hidden=32, heads=2, seq=8, micro_batch=2, vocab=64), "h100",
                                   StageSplit(stages=2), PipelineSetup(microbatches=4), dtype="fp32")
    schedule = with_plan(generate("zb-h1", 2, 4),
                         {"split": {"chunks": [["tok_embeddings", "layers.0"], ["layers.1", "output"]]},
                          "recompute": {"layers.0": "full", "layers.1": "selective"},
                          "recompute_microbatches": [[0, 2], None]})
    profile.save(tmp_path / "p.json")
    schedule.save(tmp_path / "s.json")
    result = CliRunner().invoke(app, ["run", str(tmp_path / "s.json"), "--profile", str(tmp_path / "p.json"),
                                      "--steps", "1", "--warmup", "0"])
    assert result.exit_code == 0 and result.stderr == "", result.output  # gradients checked, no warning
    # rank 0: microbatches 0 and 2 only; rank 1: all 4, and once in torch's shape inference, as above
    assert ("recompute: 2 layer(s) (layers.0 full, layers.1 selective), forwards run again per rank [2, 5], only the "
            "microbatches the plan lists.") in result.stdout


@pytest.mark.parametrize("meta, message", [
    ({"recompute": {"layers.0": "half"}},
     "schedule 'zb-h1' meta.partition.recompute gives layer 'layers.0' level 'half': use full or selective"),
    ({"recompute": {"layers.9": "full"}},
     "schedule 'zb-h1' plan.recompute names layer 'layers.9', which no chunk of the run holds: name the "
     "layers of plan.split.chunks"),
    ({"recompute": {"output": "selective"}},
     "schedule 'zb-h1' plan.recompute gives layer 'output' level selective, but only the built-in GPT's "
     "blocks with naive attention have an attention core the run can recompute alone: use full"),
    ({"recompute": {"layers.0": "full"}, "recompute_microbatches": [[0]]},
     "schedule 'zb-h1' meta.partition.recompute_microbatches must list one entry per chunk (2): each a list of "
     "microbatch indices that recompute, or null for all of them"),
    ({"recompute": {"layers.0": "full"}, "recompute_microbatches": [[0, 4], None]},
     "schedule 'zb-h1' meta.partition.recompute_microbatches[0] must list microbatch indices from 0 to 3, each once "
     "(or be null for all of them)"),
], ids=["level", "layer", "selective-head", "microbatch-entries", "microbatch-index"])
def test_a_recompute_the_run_cannot_execute_is_refused_before_any_process_starts(meta, message) -> None:
    profile = profile_gpt_estimate(GptShape(layers=2, hidden=32, heads=2, seq=8, micro_batch=2, vocab=64), "h100",
                                   StageSplit(stages=2), PipelineSetup(microbatches=4), dtype="fp32")
    with pytest.raises((RunError, ScheduleError)) as err:  # the plan's own fields fail as the file loads
        schedule = with_legacy_plan(generate("zb-h1", 2, 4),
                                    {"chunks": [["tok_embeddings", "layers.0"], ["layers.1", "output"]], **meta})
        run(schedule, profile=profile)
    assert str(err.value) == message


def test_only_a_run_of_a_small_test_model_warns_that_it_does_not_recompute(monkeypatch) -> None:
    from zbsearch.cli import run as cli_run

    said: list[str] = []
    monkeypatch.setattr(cli_run, "print_warning", said.append)
    profile = profile_gpt_estimate(GptShape(layers=2, hidden=32, heads=2, seq=8, micro_batch=2, vocab=64), "h100",
                                   StageSplit(stages=2), PipelineSetup(microbatches=4), dtype="fp32")
    schedule = with_legacy_plan(generate("zb-h1", 2, 4), {"chunks": [["tok_embeddings", "layers.0"],
                                                                     ["layers.1", "output"]],
                                                          "recompute": {"layers.0": "full"}})
    cli_run.warn_test_model_recompute(schedule, profile, None)
    cli_run.warn_test_model_recompute(schedule, profile, "profile")
    assert said == []
    cli_run.warn_test_model_recompute(schedule, profile, "mlp")
    cli_run.warn_test_model_recompute(schedule, None, None)
    assert len(said) == 2 and all("runs without recompute" in x for x in said)
    cli_run.warn_test_model_recompute(generate("zb-h1", 2, 4), None, "mlp")
    assert len(said) == 2

"""`zbsearch run` with activation recompute (issue 28, deliverable 4): the plan's recomputed layers run
through the recompute-once wrapper (profiling/recompute_once.py), per microbatch where the plan says so,
with exact gradients; on the profiler's GPT the measured peak activation memory per rank is within 10% of
the plan's and the iteration time within 25%. Two short gloo runs; the refusals start no process."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from zbsearch.core.errors import RunError
from zbsearch.core.profile import Profile, load_profile
from zbsearch.profiling.build import profile_gpt_estimate
from zbsearch.profiling.request import GptShape, PipelineSetup, StageSplit
from zbsearch.schedules import generate
from zbsearch.sim.simulate import simulate

pytest.importorskip("torch")

from zbsearch.interop.run.launcher import run  # noqa: E402
from zbsearch.interop.run.model import plan_profiled_model, predicted_profile  # noqa: E402

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[3]
BLOCKS = ["layers.0", "layers.1", "layers.2", "layers.3"]


def with_full_options(profile: Profile) -> Profile:
    """The CPU-measured GPT profile (profiles/cpu-gpt-fidelity.json, written before the profiler measured
    recompute options) with each block's `full` option as profile --estimate states it from the block's
    own measured numbers: its forward again in I, its input kept from F, what torch holds without
    recompute from I until W. test_profiler checks the profiler measures these same bytes."""
    data, layers = profile.to_dict(), profile.layers
    for k, layer in enumerate(layers):
        if layer.name in BLOCKS:
            data["layers"][k]["recompute"] = [{"level": "full", "time": layer.F, "pays": "I",
                                               "mem_B": layers[k - 1].out_bytes, "mem_W": layer.mem_W_torch,
                                               "peak": layer.mem_W_torch}]
    return Profile.from_dict(data)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_plan_that_recomputes_every_block_runs_with_the_plans_memory_and_time() -> None:
    profile = with_full_options(load_profile(ROOT / "profiles" / "cpu-gpt-fidelity.json"))
    schedule = generate("zb-h1", 2, 4)
    schedule.meta["partition"] = {"chunks": profile.details["partition"]["layers_per_stage"],
                                  "recompute": {name: "full" for name in BLOCKS}}
    plan = plan_profiled_model(schedule, profile)
    predicted = simulate(schedule, predicted_profile(schedule, profile, plan)[0])
    plain = simulate(schedule, predicted_profile(schedule, profile, replace(plan, recompute=()))[0])

    result = run(schedule, profile=profile, steps=2, warmup=1, track_memory=True, pin_cpu=True)
    assert result.ok and result.checked and result.max_grad_rel_error < 1e-4, result.problems
    # one forward again per recomputed block and microbatch, in 4 steps (warm-up, 2 timed, memory); rank 1
    # also once in torch's first-step shape inference of the input gradient
    assert result.details["recompute"]["forwards_run_again"] == [4 * 4 * 2, 4 * 4 * 2 + 2]
    want = [predicted.peak_memory(r) for r in range(2)]
    # Recompute lowers what is held from F until I (rank 0 holds 4 microbatches), not from I until W, which is
    # the peak of ZB-H1's last rank (its W passes wait): 3.7 MB against 39.4 MB, and 108.2 MB either way.
    assert want[0] < 0.2 * plain.peak_memory(0) and want[1] == plain.peak_memory(1)
    errors = [got / w - 1 for got, w in zip(result.memory_peak_bytes, want)]
    assert all(abs(e) <= 0.10 for e in errors), (result.memory_peak_bytes, want)
    ratio = result.measured_step_seconds / result.profile_step_seconds
    assert 0.75 <= ratio <= 1.25, (result.measured_step_seconds, result.profile_step_seconds)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_per_microbatch_choices_recompute_only_the_microbatches_listed() -> None:
    profile = profile_gpt_estimate(GptShape(layers=2, hidden=32, heads=2, seq=8, micro_batch=2, vocab=64), "h100",
                                   StageSplit(stages=2), PipelineSetup(microbatches=4), dtype="fp32")
    schedule = generate("zb-h1", 2, 4)
    schedule.meta["partition"] = {"chunks": [["tok_embeddings", "layers.0"], ["layers.1", "output"]],
                                  "recompute": {"layers.0": "full", "layers.1": "selective"},
                                  "recompute_microbatches": [[0, 2], None]}
    result = run(schedule, profile=profile, steps=1, warmup=0)
    assert result.ok and result.checked, result.problems
    assert result.details["recompute"]["microbatches"] == [[0, 2], None]
    rank0, rank1 = result.details["recompute"]["forwards_run_again"]
    assert rank0 == 2 and rank1 in (4, 5)  # rank 1: plus torch's shape inference, as above


@pytest.mark.parametrize("meta, message", [
    ({"recompute": {"layers.0": "half"}},
     "schedule 'zb-h1' meta.partition.recompute gives layer 'layers.0' level 'half': use full or selective"),
    ({"recompute": {"layers.9": "full"}},
     "schedule 'zb-h1' meta.partition.recompute names layer 'layers.9', which no chunk of the run holds: name the "
     "layers of meta.partition.chunks"),
    ({"recompute": {"output": "selective"}},
     "schedule 'zb-h1' meta.partition.recompute gives layer 'output' level selective, but only the built-in GPT's "
     "blocks with naive attention have an attention core the run can recompute alone: use full"),
    ({"recompute": {"layers.0": "full"}, "recompute_microbatches": [[0]]},
     "schedule 'zb-h1' meta.partition.recompute_microbatches must list 2 entries, one per chunk: give one list of "
     "microbatch indices (0..3) or null per chunk"),
    ({"recompute": {"layers.0": "full"}, "recompute_microbatches": [[0, 4], None]},
     "schedule 'zb-h1' meta.partition.recompute_microbatches[0] is [0, 4]: give one list of microbatch indices "
     "(0..3) or null per chunk"),
], ids=["level", "layer", "selective-head", "microbatch-entries", "microbatch-index"])
def test_a_recompute_the_run_cannot_execute_is_refused_before_any_process_starts(meta, message) -> None:
    profile = profile_gpt_estimate(GptShape(layers=2, hidden=32, heads=2, seq=8, micro_batch=2, vocab=64), "h100",
                                   StageSplit(stages=2), PipelineSetup(microbatches=4), dtype="fp32")
    schedule = generate("zb-h1", 2, 4)
    schedule.meta["partition"] = {"chunks": [["tok_embeddings", "layers.0"], ["layers.1", "output"]], **meta}
    with pytest.raises(RunError) as err:
        run(schedule, profile=profile)
    assert str(err.value) == message

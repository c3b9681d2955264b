"""`zbsearch run --profile`: the model a profile was made from, cut by its partition (or the split of the
schedule's plan record), run on torch and compared with the profile. Few processes: two short gloo runs and one
that must time out; every refused request is refused before any process starts."""

from __future__ import annotations

import json
import multiprocessing
import os
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.errors import RunError
from zbsearch.core.profile import Profile, uniform_profile
from zbsearch.profiling.build import profile_gpt_estimate
from zbsearch.profiling.request import GptShape, PipelineSetup, StageSplit
from zbsearch.schedules import generate

pytest.importorskip("torch")

from zbsearch.interop.run.model import cut_chunks, plan_profiled_model, predicted_profile  # noqa: E402
from zbsearch.interop.run.launcher import _cause, run  # noqa: E402

from plans import with_legacy_plan  # noqa: E402

pytestmark = pytest.mark.torch

TINY = GptShape(layers=2, hidden=32, heads=2, seq=8, micro_batch=2, vocab=64)


def tiny_gpt(stages: int = 2, blocks: int = 2) -> Profile:
    """An estimated profile of a small GPT (2 blocks: 4 layers, embedding, block0, block1, head), in fp32."""
    shape = replace(TINY, layers=blocks)
    return profile_gpt_estimate(shape, "h100", StageSplit(stages=stages), PipelineSetup(microbatches=4), dtype="fp32")


def factory_profile(spec: str, stages: list[list[str]]) -> Profile:
    """A uniform 2-stage profile that says it was measured from the factory `spec` with this split."""
    data = uniform_profile(1, 1, 1, p=len(stages), m=4).to_dict()
    data["details"] = {"model": {"model": spec}, "dtype": "fp32", "partition": {"layers_per_stage": stages}}
    data["time_unit"], data["name"] = "us", "factory"
    return Profile.from_dict(data)


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module with three factories: a good one, one that raises, one that hangs in the workers."""
    (tmp_path / "run_factories.py").write_text(f"PIDS = {str(tmp_path / 'pids')!r}\n" + textwrap.dedent("""
        import os, time
        import torch

        def good():
            return [torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4)], torch.randn(2, 4)

        def broken():
            raise ValueError("no weights here")

        def hangs():
            if torch.distributed.is_initialized():  # only in the workers
                with open(PIDS, "a") as fh:
                    fh.write(f"{os.getpid()}\\n")
                time.sleep(120)
            return good()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_profiled_gpt_runs_1f1b_with_checked_gradients_and_per_pass_times(tmp_path: Path) -> None:
    profile_path, schedule_path, out = tmp_path / "gpt.json", tmp_path / "1f1b.json", tmp_path / "result.json"
    tiny_gpt().save(profile_path)
    generate("1f1b", 2, 4).save(schedule_path)
    args = ["run", str(schedule_path), "--profile", str(profile_path), "--steps", "2", "--warmup", "1"]
    result = CliRunner().invoke(app, [*args, "--json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got == json.loads(out.read_text())
    assert got["ok"] and got["checked"] and got["dtype"] == "fp32" and got["max_grad_rel_error"] < 1e-4
    assert got["model"] == TINY.label() and got["partition"] == [["tok_embeddings", "layers.0"], ["layers.1", "output"]]
    assert len(got["step_seconds"]) == 2 and got["profile_step_seconds"] > 0
    rows = got["passes"]
    assert {(r["rank"], r["kind"]) for r in rows} == {(0, "F"), (0, "B"), (1, "F"), (1, "B")}
    assert all(r["count"] == 8 and r["mean_s"] > 0 and r["profile_s"] > 0 for r in rows)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_v_schedule_runs_the_chunks_its_plan_split_names() -> None:
    schedule = with_legacy_plan(generate("zb-v", 2, 4),
                                {"chunks": [["tok_embeddings", "layers.0"], ["layers.1"], [], ["output"]]})
    with pytest.raises(RunError, match="chunk 2 has no layers"):
        plan_profiled_model(schedule, tiny_gpt())
    schedule = with_legacy_plan(generate("zb-v", 2, 4),
                                {"chunks": [["tok_embeddings"], ["layers.0"], ["layers.1"], ["output"]]})
    result = run(schedule, profile=tiny_gpt(), steps=1, warmup=0)
    assert result.ok and result.checked and result.partition == [list(c) for c in schedule.plan.split.chunks]
    assert result.details["stages_per_rank"] == [[0, 3], [1, 2]]
    assert {(r.rank, r.chunk) for r in result.passes} == {(0, 0), (0, 3), (1, 1), (1, 2)}
    assert result.details["prediction"].startswith("sums of the profile's per-layer costs")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_run_that_hangs_times_out_and_leaves_no_process(factories: Path) -> None:
    pids = factories / "pids"
    profile = factory_profile("run_factories:hangs", [["0", "1"], ["2"]])
    with pytest.raises(RunError, match=r"^running '1f1b' on torch did not finish within the timeout of 4 s"):
        run(generate("1f1b", 2, 4), profile=profile, timeout_s=4)
    assert multiprocessing.active_children() == []
    started = [int(x) for x in pids.read_text().split()] if pids.exists() else []  # those that got that far
    for pid in started:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_chunked_placements_cut_the_profile_layers_into_chunks() -> None:
    chunks, how = cut_chunks(generate("interleaved-1f1b", 2, 4, 2), tiny_gpt())
    assert chunks == [["tok_embeddings"], ["layers.0"], ["layers.1"], ["output"]] and "linear-partition DP" in how
    plan = plan_profiled_model(generate("1f1b", 2, 4), tiny_gpt())
    assert plan.chunks == (("tok_embeddings", "layers.0"), ("layers.1", "output")) and plan.check and plan.dtype == "fp32"
    assert predicted_profile(generate("1f1b", 2, 4), tiny_gpt(), plan)[1] == "the profile's stages"


@pytest.mark.parametrize("schedule, profile, message", [
    (lambda: generate("1f1b", 2, 4), lambda: tiny_gpt(stages=3, blocks=3),
     "profile 'gpt-3l-h32-s8-b2-h100-estimated' details.partition.layers_per_stage has 3 stages but schedule '1f1b' "
     "has 2 ranks: profile the model with 2 stages, or run a schedule for 3 ranks"),
    (lambda: generate("interleaved-1f1b", 2, 4, 4), tiny_gpt,
     "profile 'gpt-2l-h32-s8-b2-h100-estimated' partition has 4 layers but schedule 'interleaved-1f1b' has 8 chunks: "
     "every chunk needs at least one layer; run a schedule with at most 4 chunks, or profile a model with more layers"),
    (lambda: generate("1f1b", 2, 4), lambda: factory_profile("no_such_module_zb:build", [["0"], ["1"]]),
     "profile 'factory' details.model: model factory no_such_module_zb:build: cannot import 'no_such_module_zb' "
     "(ModuleNotFoundError: No module named 'no_such_module_zb'); run from the folder that holds its module, or put "
     "that folder on PYTHONPATH"),
    (lambda: generate("1f1b", 2, 4), lambda: factory_profile("run_factories:broken", [["0"], ["1"]]),
     "profile 'factory' details.model: model factory run_factories:broken: the factory raised ValueError: no weights "
     "here; fix the factory so that it builds the model"),
    (lambda: generate("1f1b", 2, 4), lambda: factory_profile("run_factories:good", [["0"], ["2"]]),
     "profile 'factory' details.partition: the chunks list 2 layers but model run_factories:good has 3 (0 ... "
     "2): list every layer once, in model order"),
], ids=["stages-vs-ranks", "fewer-layers-than-chunks", "factory-import", "factory-raises", "layer-missing"])
def test_a_profile_that_cannot_be_run_is_refused_before_any_process_starts(factories, schedule, profile,
                                                                          message) -> None:
    with pytest.raises(RunError) as err:
        run(schedule(), profile=profile())
    assert str(err.value) == message


@pytest.mark.parametrize("schedule, profile, args, message", [
    ("1f1b", tiny_gpt, ["--device", "tpu"],
     "--device: device 'tpu' is not known: use cpu (with gloo) or cuda (with nccl, one GPU per rank)"),
    ("1f1b", tiny_gpt, ["--device", "cuda"],
     "--device: device cuda does not go with backend gloo: use gloo on the cpu, or nccl on cuda"),
    ("1f1b", tiny_gpt, ["--backend", "mpi"], "--backend: backend 'mpi' is not known: use gloo (CPU) or nccl (GPUs)"),
    ("1f1b", tiny_gpt, ["--warmup", "-1"], "--warmup: warm-up step count -1 is negative: use 0 or more"),
    ("1f1b", tiny_gpt, ["--timeout", "0"], "--timeout: timeout 0.0 s is not positive: allow the run some seconds, "
                                           "e.g. 300"),
    ("1f1b", lambda: tiny_gpt(stages=3, blocks=3), [],
     "profile '{dir}/p.json' has 3 stages but schedule '{dir}/s.json' has 2 ranks: use a profile with one stage per "
     "rank (or --uniform F,B,W, whose -p defaults to 2)"),
    ("interleaved-1f1b", tiny_gpt, [],
     "profile '{dir}/p.json' partition has 4 layers but schedule 'interleaved-1f1b' has 8 chunks: every chunk needs "
     "at least one layer; run a schedule with at most 4 chunks, or profile a model with more layers"),
    ("1f1b", lambda: factory_profile("no_such_module_zb:build", [["0"], ["1"]]), [],
     "profile '{dir}/p.json' details.model: model factory no_such_module_zb:build: cannot import 'no_such_module_zb' "
     "(ModuleNotFoundError: No module named 'no_such_module_zb'); run from the folder that holds its module, or put "
     "that folder on PYTHONPATH"),
], ids=["device", "device-backend", "backend", "warmup", "timeout", "stages-vs-ranks", "fewer-layers", "factory"])
def test_the_command_line_refuses_in_one_line_and_writes_no_result(schedule, profile, args, message,
                                                                   tmp_path: Path) -> None:
    schedule_path, profile_path, out = tmp_path / "s.json", tmp_path / "p.json", tmp_path / "result.json"
    generate(schedule, 2, 4, 4 if schedule.startswith("interleaved") else None).save(schedule_path)
    profile().save(profile_path)
    result = CliRunner().invoke(app, ["run", str(schedule_path), "--profile", str(profile_path), *args,
                                      "-o", str(out)])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"error: {message.format(dir=tmp_path)}"]
    assert not out.exists()


def test_a_worker_failure_is_reported_by_its_cause_not_by_the_ranks_it_took_down() -> None:
    chained = ("Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: Can't detach views "
               "in-place. Use detach() instead.\n\nThe above exception was the direct cause of the following "
               "exception:\n\nRuntimeError: \n        Failed to run stage backward input:\n        Input: ['Tensor']\n")
    assert _cause(chained) == "RuntimeError: Can't detach views in-place. Use detach() instead."
    assert _cause("zbsearch.core.errors.RunError: model 'x'") == "RunError: model 'x'"

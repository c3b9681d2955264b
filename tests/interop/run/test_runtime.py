"""Run exported schedules for real: torch's _PipelineScheduleRuntime on gloo processes, gradients
checked against a single-process reference. Kept few and small (each run forks its workers from one
fork server that imported torch once)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.errors import DependencyError, RunError
from zbsearch.search.options import SearchOptions
from zbsearch.search.problem import make_problem
from zbsearch.core.profile import uniform_profile
from zbsearch.schedules import generate
from zbsearch.search.solve.driver import solve

pytest.importorskip("torch")

from zbsearch.interop.run.launcher import run  # noqa: E402

pytestmark = pytest.mark.torch


def solver_schedule():
    problem = make_problem(uniform_profile(1, 2, 1, p=4, m=4), "1p", "makespan", "linear")
    return solve(problem, SearchOptions(time_limit=5, workers=1)).schedule


def check(result, schedule, steps: int, kinds: set[str]) -> None:
    assert result.ok, result.problems
    assert result.max_grad_diff < 1e-9
    assert result.loss == pytest.approx(result.reference_loss, rel=1e-9)
    timed = steps
    for r, measured in enumerate(result.measured):
        own = {k: sum(1 for a in schedule.passes(r) if a.kind.value == k) * timed for k in ("F", "I", "W", "B")}
        assert {k: v["count"] for k, v in measured.items()} == {k: n for k, n in own.items() if n}
    assert kinds == {k for rank in result.measured for k in rank}
    assert result.predicted_step_seconds > 0 and len(result.step_seconds) == timed


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("make, model, kinds", [
    (solver_schedule, "mlp", {"F", "I", "W"}),                                     # 4 ranks, split I/W
    (lambda: generate("zb-v", 2, 4), "gpt-tiny", {"F", "I", "W"}),                 # V-shape
    (lambda: generate("interleaved-1f1b", 2, 4, 2), "mlp", {"F", "B"}),            # looped, full backward
    (lambda: generate("dualpipev", 2, 4), "mlp", {"F", "I", "W", "B"}),            # overlapped F&B pairs
], ids=["solver-linear-p4", "zb-v-p2-gpt", "interleaved-p2-full-backward", "dualpipev-p2-overlap"])
def test_schedule_runs_on_torch_with_reference_gradients(make, model: str, kinds: set[str]) -> None:
    schedule = make()
    result = run(schedule, backend="gloo", model=model, steps=1, warmup=1)
    check(result, schedule, 1, kinds)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_lowered_comms_csv_runs_unchanged() -> None:
    schedule = generate("zb-v", 2, 4)
    result = run(schedule, model="mlp", steps=1, warmup=0, comms=True)
    assert result.details["csv"] == "torch-csv-comms"
    check(result, schedule, 1, {"F", "I", "W"})


@pytest.mark.multiprocess
@pytest.mark.slow
def test_cli_run_shows_measurements_next_to_the_plan(tmp_path: Path) -> None:
    path = tmp_path / "zbh1.json"
    generate("zb-h1", 2, 4).save(path)
    result = CliRunner().invoke(app, ["run", str(path), "--steps", "1", "--uniform", "1,1,1", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["ok"] and out["planned"][0]["F"] == 1.0 and out["plan_seconds_per_unit"] > 0
    table = CliRunner().invoke(app, ["run", str(path), "--steps", "1", "--warmup", "0", "--uniform", "1,1,1"])
    assert table.exit_code == 0, table.output
    assert "plan (unit)" in table.stdout and "match the single-process reference" in table.stdout


def test_the_gradient_check_catches_a_wrong_gradient() -> None:
    """The comparison itself: an m-times-too-large gradient (a lost REDUCE_GRAD) and a missing one."""
    import torch

    from zbsearch.interop.run.small_models import build_chunks, loss_function, make_batch
    from zbsearch.interop.run.worker import compare_grads, reference

    chunks = build_chunks("mlp", 2, seed=0)
    x, y = make_batch("mlp", 4, 2, seed=0)
    expected, _ = reference(torch, chunks, x, y, 4, loss_function("mlp"))
    for c, r in zip(chunks, expected):
        for p, q in zip(c.parameters(), r.parameters()):
            p.grad = q.grad.clone()
    problems: list[str] = []
    assert compare_grads(torch, chunks[0], expected[0], "stage 0", problems) == (0.0, 2, 0.0) and not problems
    chunks[1][0].weight.grad *= 4
    chunks[1][0].bias.grad = None
    compare_grads(torch, chunks[1], expected[1], "stage 1", problems)
    assert [p.split(" parameter ")[1].split()[0] for p in problems] == ["0.weight", "0.bias"]
    # Against a float64 reference, a low-precision run allows a relative error; 4x is still caught.
    low: list[str] = []
    assert compare_grads(torch, chunks[1].float(), expected[1], "stage 1", low, tolerance=0.05)[2] == pytest.approx(3)
    assert [p.split(" parameter ")[1].split()[0] for p in low] == ["0.weight", "0.bias"]


@pytest.mark.parametrize("kwargs, error, message", [
    ({"backend": "mpi"}, RunError, "backend 'mpi' is not known: use gloo (CPU) or nccl (GPUs)"),
    ({"model": "bert"}, RunError, "model 'bert' is not known: use one of profile, mlp, gpt-tiny"),
    ({"steps": 0}, RunError, "step count 0 is too small: run at least 1 step"),
    ({"nproc": 3}, RunError, "process count 3 does not match schedule 'zb-h1', which has 2 ranks: start 2 processes, "
                             "one per rank"),
])
def test_a_request_that_cannot_run_is_refused_before_any_process_starts(kwargs, error, message) -> None:
    with pytest.raises(error) as err:
        run(generate("zb-h1", 2, 4), **kwargs)
    assert str(err.value) == message


@pytest.mark.parametrize("args, message", [
    (["--backend", "mpi"], "--backend: backend 'mpi' is not known: use gloo (CPU) or nccl (GPUs)"),
    (["--model", "bert"], "--model: model 'bert' is not known: use one of profile, mlp, gpt-tiny"),
    (["--steps", "0"], "--steps: step count 0 is too small: run at least 1 step"),
    (["--nproc", "3", "--steps", "3"],
     "--nproc: process count 3 does not match schedule 'zb-h1', which has 2 ranks: start 2 processes, one per rank"),
])
def test_the_command_line_names_the_option_of_a_refused_request(args, message, tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    generate("zb-h1", 2, 4).save(path)
    result = CliRunner().invoke(app, ["run", str(path), *args])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"error: {message}"]


def test_without_torch_the_run_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(DependencyError, match=r"^zbsearch run needs torch, which is not installed: pip install "):
        run(generate("zb-h1", 2, 4))


def test_the_worker_refuses_an_unknown_model() -> None:
    from zbsearch.interop.run.small_models import build_chunks

    with pytest.raises(RunError) as err:
        build_chunks("bert", 2, seed=0)
    assert str(err.value) == "model 'bert' is not known: use one of mlp, gpt-tiny"

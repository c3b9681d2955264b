"""The fidelity study: a profile measured on torch carries what torch's runtime holds; the study and
calibration refuse what cannot run before any process starts; one short multi-process run (2 ranks, a
tiny GPT, 1 step) calibrates, solves, runs and writes the report, and torch's runtime memory matches
the torch-runtime accounting there."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.profile import Profile, load_profile, uniform_profile

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from zbsearch.profiling.build import profile_measured  # noqa: E402
from zbsearch.profiling.request import GptShape, MeasureRequest, PipelineSetup, StageSplit  # noqa: E402

pytestmark = pytest.mark.torch

TINY = GptShape(layers=2, hidden=32, heads=2, seq=8, micro_batch=2, vocab=64)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT measured on the CPU for 2 ranks, as torch runs stage 0."""
    prof = profile_measured("gpt", StageSplit(stages=2), PipelineSetup(microbatches=4, torch_stage0=True),
                            MeasureRequest(device="cpu", warmup=1, repeats=2, threads=1), shape=TINY)
    path = tmp_path_factory.mktemp("fidelity") / "gpt.json"
    prof.save(path)
    return path


def test_a_measured_profile_plans_with_what_torchs_runtime_holds(measured: Path) -> None:
    prof = load_profile(measured)
    assert prof.memory_model == "torch-runtime"
    first, last = prof.stages
    # stage 0: torch's I does nothing, so its graph stays whole and the received gradient comes on top
    assert first.mem_W_torch == first.mem_B_torch + prof.layers[1].out_bytes and first.mem_kept_torch == 0
    assert last.mem_W_torch > last.mem_B_torch and last.mem_kept_torch > 0  # I keeps the graph; the loss stays
    blocks = [layer for layer in prof.layers if layer.kind == "decoder"]
    assert all(b.mem_W_torch > b.mem_B_torch and b.mem_kept_torch is not None for b in blocks)
    data = json.loads(measured.read_text())
    assert {"mem_B_torch", "mem_W_torch", "mem_kept_torch", "mem_kept_loss_torch"} <= set(data["layers"][2])
    assert Profile.from_dict(data) == prof


@pytest.mark.parametrize("args, message", [
    (["calibrate", "{one}", "-o", "{out}"], "calibrating needs at least 2 ranks"),
    (["fidelity", "{uniform}", "-o", "{out}", "--no-calibrate"], "records no model (details.model)"),
])
def test_requests_that_cannot_run_fail_in_one_line_before_any_process(args, message, tmp_path: Path) -> None:
    one, two = uniform_profile(1, 1, 1, p=1, m=2), uniform_profile(1, 1, 1, p=2, m=4)
    one.save(tmp_path / "one.json")
    two.save(tmp_path / "uniform.json")
    paths = {"one": tmp_path / "one.json", "uniform": tmp_path / "uniform.json", "out": tmp_path / "res" / "out.json"}
    result = CliRunner().invoke(app, [a.format(**paths) for a in args])
    assert result.exit_code == 1 and len(result.stderr.splitlines()) == 1 and message in result.stderr
    assert "Traceback" not in result.output and not (tmp_path / "res" / "out.json").exists()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_short_study_calibrates_solves_runs_and_writes_the_table(measured: Path, tmp_path: Path) -> None:
    out = tmp_path / "study" / "fidelity"
    args = ["fidelity", str(measured), "-o", str(out), "--steps", "1", "--warmup", "1", "--repeats", "1",
            "--solve-seconds", "2", "--mem-limits", "2p", "--schedules", "1f1b,zb-h1", "--torch-orders",
            "ZBVZeroBubble"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    md = out.with_suffix(".md").read_text()
    assert "| schedule | placement | predicted raw ms | predicted calibrated ms |" in md
    for label in ("1f1b", "zb-h1", "torch:ZBVZeroBubble", "zbsearch raw 2p", "zbsearch calibrated 2p"):
        assert f"| {label} |" in md
    rows = list(csv.DictReader(out.with_suffix(".csv").open()))
    assert {r["schedule"] for r in rows} >= {"1f1b", "zb-h1", "torch:ZBVZeroBubble"}
    assert all(float(r["measured_median_s"]) > 0 and float(r["predicted_calibrated_s"]) > 0 for r in rows)
    assert out.with_suffix(".png").stat().st_size > 0
    cal = load_profile(Path(f"{out}-profile.json"))
    assert cal.action_overhead >= 0 and cal.comm_table and cal.memory_model == "torch-runtime"
    for r in rows:  # torch's runtime holds what the torch-runtime accounting predicts (same machine-independent bytes)
        predicted = [float(x) for x in r["peak_torch_runtime_bytes"].split(";")]
        held = [float(x) for x in r["measured_peak_bytes"].split(";")]
        assert all(abs(p / h - 1) <= 0.10 for p, h in zip(predicted, held)), r["schedule"]

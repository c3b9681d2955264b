"""Recompute options in profiles (issue 28, deliverable 2): what estimates list per layer, that they
survive the profile file, and the one-line errors for options that cannot be true."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.errors import ProfileError
from zbsearch.core.profile import Profile, load_profile
from zbsearch.profiling.build import profile_estimate
from zbsearch.profiling.request import GptShape, LlamaShape, PipelineSetup, StageSplit

runner = CliRunner()
SHAPE = LlamaShape(layers=4, hidden=256, heads=4, kv_heads=2, seq=128, vocab=1024)


def estimate(shape, attention: str) -> Profile:
    return profile_estimate(shape, "h100", StageSplit(stages=2), PipelineSetup(microbatches=4), attention=attention)


def test_a_llama_block_with_naive_attention_lists_selective_and_full() -> None:
    block = estimate(SHAPE, "naive").layers[1]
    selective, full = block.recompute
    tokens, d = SHAPE.micro_batch * SHAPE.seq, 2
    assert (selective.level, full.level) == ("selective", "full")
    assert full.mem_B == tokens * SHAPE.hidden * d  # only the block's input
    assert full.time == pytest.approx(block.F, rel=1e-6) and full.pays == "I"
    assert selective.mem_B == block.mem_B - tokens * SHAPE.heads * SHAPE.seq * d  # no softmax probabilities
    assert 0 < selective.time < full.time
    # I rebuilds what was dropped and keeps it for W: recompute lowers F -> I only.
    assert selective.mem_W == full.mem_W == block.mem_W_torch


def test_fused_attention_has_no_attention_core_to_recompute() -> None:
    profile = estimate(SHAPE, "sdpa")
    assert [[o.level for o in layer.recompute] for layer in profile.layers] == [[], ["full"] * 1, ["full"], ["full"],
                                                                              ["full"], []]


def test_the_gpt_block_drops_korthikantis_attention_term() -> None:
    """Korthikanti et al. 2022: s*b*h*(34 + 5as/h) bytes per layer in 16-bit; selective keeps the 34."""
    shape = GptShape(layers=2, hidden=256, heads=4, seq=128, micro_batch=2)
    block = estimate(shape, "naive").layers[1]
    sbh = shape.seq * shape.micro_batch * shape.hidden
    assert block.mem_B == sbh * (34 + 5 * shape.heads * shape.seq / shape.hidden)
    assert block.recompute[0].mem_B == sbh * 34 and block.recompute[1].mem_B == 2 * sbh


def test_options_survive_the_profile_file(tmp_path: Path) -> None:
    profile = estimate(SHAPE, "naive")
    profile.save(tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json").layers == profile.layers


def _with_option(profile: Profile, layer: int, **change) -> dict:
    data = copy.deepcopy(profile.to_dict())
    data["layers"][layer]["recompute"][-1].update(change)
    return data


@pytest.mark.parametrize("layer, change, message", [
    (1, {"mem_B": 1e15}, r"field layers\[1\].recompute\[1\].mem_B \(1e\+15\) is more than the layer holds without "
                         r"recompute"),
    (1, {"time": -1.0}, r"field layers\[1\].recompute\[1\].time is -1.0; it must be >= 0"),
    (1, {"time": float("nan")}, r"field layers\[1\].recompute\[1\].time is nan; give a finite number"),
    (1, {"level": "selective"}, r"field layers\[1\].recompute\[1\].level lists 'selective' a second time"),
    (1, {"level": "none"}, r"field layers\[1\].recompute\[1\].level is 'none'"),
])
def test_options_that_cannot_be_true_are_refused(layer, change, message) -> None:
    with pytest.raises(ProfileError, match=message):
        Profile.from_dict(_with_option(estimate(SHAPE, "naive"), layer, **change))


def test_selective_on_a_layer_without_attention_is_refused_in_one_line(tmp_path: Path) -> None:
    data = estimate(SHAPE, "naive").to_dict()
    data["layers"][0]["recompute"] = [{"level": "selective", "time": 1.0, "mem_B": 0.0, "mem_W": 0.0}]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    result = runner.invoke(app, ["solve", "--profile", str(tmp_path / "bad.json"), "--mem-limit", "2p"])
    assert result.exit_code == 1 and len(result.stderr.splitlines()) == 1
    assert "field layers[0].recompute[0].level is 'selective' on a layer of kind 'embedding', which has no " \
           "attention core to recompute" in result.stderr

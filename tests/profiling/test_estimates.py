"""Estimated layer-level profiles: the GPT, Llama-style and dense-then-MoE shapes, the presets, the layers
list the profiler writes next to the stages, and the CLI (no torch)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.errors import ProfilerError
from zbsearch.core.ir import linear
from zbsearch.core.partition import partition_profile
from zbsearch.core.profile import Profile, load_profile
from zbsearch.profiling.build import optimizer_bytes_per_param, profile_estimate
from zbsearch.profiling.hardware import GPUS
from zbsearch.profiling.presets import PRESETS, resolve_shape
from zbsearch.profiling.request import GptShape, LlamaShape, MoeShape, PipelineSetup, StageSplit
from zbsearch.profiling.estimate import estimate_layers
from zbsearch.profiling.transformer import kept_for_W, per_token, saved_for_B, stored_for_W

runner = CliRunner()


def estimated(shape, p: int = 8, **options) -> Profile:
    return profile_estimate(shape, "h100", StageSplit(stages=p), PipelineSetup(microbatches=2 * p), **options)


def stage_groups(profile: Profile) -> list[list]:
    by_name = {layer.name: layer for layer in profile.layers}
    return [[by_name[n] for n in names] for names in profile.details["partition"]["layers_per_stage"]]


@pytest.mark.parametrize("shape, p", [("llama3-8b", 8), ("gpt3-2.7b", 8), ("gemma2-2b", 8), ("deepseek-v2-lite", 8),
                                      (GptShape(layers=6, hidden=512, heads=8, seq=256, vocab=5000), 4)])
def test_layers_sum_to_the_stages_of_the_profilers_split(shape, p: int) -> None:
    profile = estimated(shape, p)
    groups = stage_groups(profile)
    assert [layer for group in groups for layer in group] == list(profile.layers) and len(groups) == p
    for st, group in zip(profile.stages, groups):
        for key in ("F", "B", "W", "BW", "mem_B", "mem_W", "static_bytes"):
            assert getattr(st, key) == math.fsum(getattr(layer, key) for layer in group), key
    per_param = optimizer_bytes_per_param("adam", "bf16")
    assert all(layer.static_bytes == layer.params * per_param for layer in profile.layers)
    assert all(layer.F > 0 and layer.mem_W <= layer.mem_B for layer in profile.layers)
    assert profile.link_bandwidth == 200e9 / 8 / 1e6  # the default 200 Gb/s, in bytes per microsecond
    assert profile.source["kind"] == "estimated" and "not measured" in profile.source["method"]


@pytest.mark.parametrize("shape", ["llama3-8b", "deepseek-v2-lite"])
def test_the_profilers_stages_are_core_partitions_split_of_its_layers(shape) -> None:
    profile = profile_estimate(shape, "h100", StageSplit(stages=8), PipelineSetup(microbatches=16, link_gbps=400.0))
    counts = [len(names) for names in profile.details["partition"]["layers_per_stage"]]
    again = partition_profile(profile, linear(8), counts)
    assert again.stages == profile.stages and again.comm == profile.comm
    assert profile.link_bandwidth == 400e9 / 8 / 1e6


@pytest.mark.parametrize("shape, first_modules", [("llama3-8b", ()), ("gpt3-2.7b", ("tok_embeddings", "pos_embeddings"))])
def test_layers_are_named_by_module_path(shape, first_modules) -> None:
    layers = estimated(shape).layers
    assert [layer.name for layer in layers] == ["tok_embeddings", *(f"layers.{i}" for i in range(32)), "output"]
    assert [layer.kind for layer in layers] == ["embedding"] + ["decoder"] * 32 + ["output"]
    assert layers[0].modules == first_modules and layers[-1].module_paths == ("norm", "output")


def test_the_embedding_is_a_memory_bound_gather_and_scatter_add() -> None:
    layer = estimated("llama3-8b").layers[0]
    b, s, h, d = 1, 8192, 4096, 2
    bandwidth = GPUS["h100"].memory_bandwidth / 1e6  # bytes per microsecond
    assert layer.F == pytest.approx((8 * b * s + 2 * b * s * h * d) / bandwidth, rel=1e-8)
    assert layer.W == pytest.approx((8 * b * s + 3 * b * s * h * d) / bandwidth, rel=1e-8)
    assert layer.B == 0 and layer.details["flops"]["F"] == 0
    assert "HBM bandwidth" in estimated("llama3-8b").source["method"]


def test_llama3_8b_like_has_the_published_parameter_count() -> None:
    shape = PRESETS["llama3-8b"].shape
    assert sum(shape.layer_params()) == pytest.approx(8.03e9, rel=0.01)
    profile = estimated("llama3-8b")
    assert sum(layer.params for layer in profile.layers) == sum(shape.layer_params())
    assert profile.details["model"]["params"] == 8_030_261_248
    assert "arXiv:2407.21783" in profile.source["shape"] and profile.name == "llama3-8b-h100-estimated"


@pytest.mark.parametrize("name, published, citation", [("llama3-70b", 70.6e9, "arXiv:2407.21783"),
                                                       ("mixtral-8x7b", 46.7e9, "arXiv:2401.04088")])
def test_the_large_presets_have_their_published_parameter_counts(name: str, published: float, citation: str) -> None:
    # Mixtral's 46.7B counts all 8 experts in all 32 blocks: a dense-first preset would miss by 5.6B.
    assert sum(PRESETS[name].shape.layer_params()) == pytest.approx(published, rel=0.002)
    assert citation in PRESETS[name].citation


def test_llama_block_flops_follow_the_paper_convention() -> None:
    shape = PRESETS["llama3-8b"].shape
    block = estimated("llama3-8b").layers[1]
    b, s, h, kv, f = 1, 8192, 4096, 1024, 14336
    P = 2 * h * h + 2 * h * kv + 3 * h * f  # q, o; k, v; gate, up, down
    assert block.details["flops"] == {"F": 2 * b * s * P + 4 * b * s * s * h, "B": 2 * b * s * P + 8 * b * s * s * h,
                                      "W": 2 * b * s * P}
    assert block.params == P + 2 * h == shape.block_params()
    # fused attention keeps no s x s matrix: the saved bytes per token do not grow with s
    assert per_token(saved_for_B(shape, 0, 2, "sdpa")) == 2 * (4 * h + 2 * h + 2 * kv + 3 * f) + 4 + 4 + 4 * 32
    assert per_token(kept_for_W(shape, 0, 2)) == 2 * (4 * h + 2 * h + 2 * kv + 3 * f)
    assert block.mem_B == b * s * per_token(saved_for_B(shape, 0, 2, "sdpa"))


def test_gemma2_2b_like_head_costs_several_blocks() -> None:
    layers = estimated("gemma2-2b").layers
    h, V, s, q, kv, f = 2304, 256000, 4096, 8 * 256, 4 * 256, 9216
    ratio = (2 * h * V) / (2 * (h * (2 * q + 2 * kv) + 3 * h * f) + 4 * s * q)
    assert layers[-1].F / layers[1].F == pytest.approx(ratio)
    # About six blocks at s = 4096 (5.3 at s = 8192): the vocabulary projection of 256000 dominates.
    assert 5 < layers[-1].F / layers[1].F < 7


def test_moe_first_block_dense_later_blocks_carry_every_expert() -> None:
    profile = estimated("deepseek-v2-lite")
    layers, shape = profile.layers, PRESETS["deepseek-v2-lite"].shape
    dense, moe = layers[1], layers[2]
    assert dense.details["mlp"] == "dense" and all(layer.details["mlp"] == "MoE" for layer in layers[2:-1])
    assert moe.static_bytes > 6 * dense.static_bytes  # 64 experts' parameters on the block's stage
    h = 2048
    active = 4 * h * h + h * 64 + 3 * h * 1408 * (6 + 2)  # attention, router, top-6 and 2 shared experts
    assert moe.details["flops"]["W"] == 2 * 4096 * active
    assert moe.params == 4 * h * h + h * 64 + 3 * h * 1408 * (64 + 2) + 2 * h
    assert sum(shape.layer_params()) == pytest.approx(15.7e9, rel=0.01)  # MLA counted as multi-head attention
    assert "MLA" in profile.source["shape"] and moe.mem_B > dense.mem_B
    assert set(profile.details["estimate"]["activation_bytes_per_token"]) == {"dense block", "MoE block"}


def test_layer_profiles_round_trip_through_json(tmp_path: Path) -> None:
    profile = estimated("deepseek-v2-lite", p=4)
    path = tmp_path / "moe.json"
    profile.save(path)
    again = load_profile(path)
    assert again.layers == profile.layers and again.link_bandwidth == profile.link_bandwidth
    assert again.stages == profile.stages and again.comm == profile.comm
    assert [layer.details for layer in again.layers] == [layer.details for layer in profile.layers]
    assert json.loads(path.read_text())["layers"][2]["params"] == profile.layers[2].params


def test_cli_estimates_a_preset_and_writes_layers(tmp_path: Path) -> None:
    path = tmp_path / "llama.json"
    result = runner.invoke(app, ["profile", "--estimate", "--model", "llama3-8b", "--gpu", "h100", "-p", "8",
                                 "-o", str(path)])
    assert result.exit_code == 0, result.output
    data = json.loads(path.read_text())
    assert len(data["layers"]) == 34 and data["layers"][-1]["name"] == "output" and data["num_stages"] == 8
    assert data["source"]["kind"] == "estimated" and data["details"]["model"]["preset"] == "llama3-8b"
    assert "emb..l" in result.stdout and "estimated for NVIDIA H100" in result.stdout


def test_cli_custom_llama_and_moe_shapes(tmp_path: Path) -> None:
    common = ["profile", "--estimate", "--gpu", "a100", "-p", "2", "--layers", "4", "--hidden", "512", "--heads", "8",
              "--vocab", "32000", "--json"]
    llama = json.loads(runner.invoke(app, [*common, "--model", "llama", "--kv-heads", "2", "--ffn", "1536"]).stdout)
    assert llama["details"]["model"] | {"kv_heads": 2, "ffn": 1536, "micro_batch": 1} == llama["details"]["model"]
    moe = runner.invoke(app, [*common, "--model", "moe", "--dense-layers", "2", "--experts", "16", "--top-k", "4",
                              "--expert-ffn", "256", "--shared-experts", "1"])
    assert moe.exit_code == 0, moe.output
    layers = json.loads(moe.stdout)["layers"]
    assert [layer["details"]["mlp"] for layer in layers[1:-1]] == ["dense", "dense", "MoE", "MoE"]
    changed = runner.invoke(app, ["profile", "--estimate", "--gpu", "h100", "-p", "8", "--model", "llama3-8b",
                                  "--seq", "4096", "--json"])
    data = json.loads(changed.stdout)
    assert data["details"]["model"]["seq"] == 4096 and "changed here: seq 4096" in data["source"]["shape"]
    assert data["name"] == "llama-32l-h4096-s4096-b1-h100-estimated"


@pytest.mark.parametrize("args, line", [
    (["--model", "llama", "--heads", "32", "--kv-heads", "5"],
     "32 attention heads are not divisible by 5 key/value heads: each key/value head serves a whole group of query "
     "heads, e.g. 32 heads with 8 (options --heads, --kv-heads)"),
    (["--model", "llama", "--ffn", "0"], "llama ffn 0: give a positive whole number (option --ffn)"),
    (["--model", "moe", "--top-k", "9"],
     "each token picks 9 of 8 experts: the top-k must not exceed the number of routed experts "
     "(options --top-k, --experts)"),
    (["--model", "moe", "--dense-layers", "5"],
     "5 dense blocks are more than the model's 4 blocks: give at most as many dense blocks as blocks "
     "(options --dense-layers, --layers)"),
    (["--model", "moe", "--shared-experts", "-1"], "moe shared experts -1: give a non-negative whole number "
     "(option --shared-experts)"),
    (["--model", "llama", "--experts", "8"],
     "experts do not shape a llama model (model llama): drop them, or pick a model they shape "
     "(options --experts, --model)"),
    (["--model", "gpt", "--kv-heads", "2"],
     "kv heads do not shape a gpt model (model gpt): drop them, or pick a model they shape "
     "(options --kv-heads, --model)"),
    (["--model", "llama3-8b", "--hidden", "4100"],
     "hidden size 4100 is not divisible by 32 heads: give the head size, or a hidden size that heads divide "
     "(options --hidden, --heads)"),
])
def test_bad_shapes_are_one_line_errors_naming_the_flag(args: list[str], line: str) -> None:
    result = runner.invoke(app, ["profile", "--estimate", "--gpu", "h100", "-p", "2", *args])
    assert result.exit_code == 1, result.output
    lines = [text for text in result.stderr.splitlines() if text.strip()]
    assert lines == [f"error: {line}"]


@pytest.mark.parametrize("call, fields", [
    (lambda: LlamaShape(heads=6, kv_heads=4).check(), ("heads", "kv_heads")),
    (lambda: MoeShape(top_k=3, experts=2).check(), ("top_k", "experts")),
    (lambda: resolve_shape("llama2", {}), ("model",)),
    (lambda: resolve_shape("moe", {"vocabulary": 3}), ("vocabulary", "model")),
    (lambda: profile_estimate(LlamaShape(micro_batch=0), "h100", StageSplit(stages=2)), ("micro_batch",)),
])
def test_shape_errors_speak_in_domain_terms(call, fields) -> None:
    with pytest.raises(ProfilerError) as caught:
        call()
    assert "--" not in str(caught.value) and caught.value.fields == fields


def test_estimates_need_no_torch_for_any_shape() -> None:
    import subprocess
    import sys
    code = ("import sys; sys.modules['torch'] = None\n"
            "from zbsearch.profiling.build import profile_estimate\n"
            "from zbsearch.profiling.request import StageSplit\n"
            "for name in ('llama3-8b', 'deepseek-v2-lite'):\n"
            "    print(len(profile_estimate(name, 'a100', StageSplit(stages=4)).layers))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["34", "29"]


def test_torchs_held_memory_from_i_to_w_is_what_the_cpu_measured():
    """Issue 28: from I until W torch's split backward holds everything saved for B plus each weight-bearing
    op's output gradient. Measured on a CPU (fp32, per token): the profiler's GPT block 11h (its shipped
    profile), a Llama-style block (h 256, 4 heads, 2 kv heads, SwiGLU 688) 11,648 bytes."""
    assert per_token(stored_for_W(LlamaShape(hidden=256, heads=4, kv_heads=2, ffn=688), 0, 4)) == 11648
    measured = load_profile(Path(__file__).resolve().parents[2] / "profiles" / "cpu-gpt-fidelity.json")
    shape = GptShape(**{k: measured.details["model"][k] for k in ("layers", "hidden", "heads", "seq", "micro_batch",
                                                                  "vocab")})
    block = estimate_layers(shape, "h100", dtype="fp32")[1]
    layer = measured.layers[1]
    assert block.extra["mem_W_torch_runtime"] - block.mem_B == layer.mem_W_torch - layer.mem_B_torch

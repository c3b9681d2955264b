"""The Llama-style and MoE decoders measured on torch (profiling/decoder_models.py), against the estimate of
the same shape, and one tensor-parallel rank's share (--tp) measured and estimated.

Tiny shapes in fp32 on one CPU thread, one timed run each: the tests compare names, parameters and bytes,
never times.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.errors import ProfilerError
from zbsearch.core.profile import Profile, load_profile
from zbsearch.profiling.build import profile_estimate, profile_measured
from zbsearch.profiling.request import LlamaShape, MeasureRequest, MoeShape, PipelineSetup, StageSplit

runner = CliRunner()

LLAMA = LlamaShape(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, seq=32, micro_batch=2, vocab=128)
MOE = MoeShape(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, seq=32, micro_batch=2, vocab=128,
               dense_layers=1, experts=4, top_k=2, expert_ffn=32, shared_experts=1)
QUICK = MeasureRequest(device="cpu", warmup=0, repeats=1)
D = 4  # fp32 bytes per element on the CPU


def measure(shape, attention: str = "sdpa", tp: int = 1) -> Profile:
    pytest.importorskip("torch")
    profile = profile_measured(shape.model, StageSplit(stages=2), PipelineSetup(microbatches=4), QUICK, shape=shape,
                               attention=attention, tp=tp)
    assert profile is not None
    return profile


def estimate(shape, attention: str = "sdpa", tp: int = 1) -> Profile:
    return profile_estimate(shape, "h100", StageSplit(stages=2), PipelineSetup(microbatches=4), dtype="fp32",
                            attention=attention, tp=tp)


@pytest.fixture(scope="module")
def llama() -> Profile:
    return measure(LLAMA)


@pytest.fixture(scope="module")
def moe() -> Profile:
    return measure(MOE)


@pytest.mark.torch
@pytest.mark.parametrize("which, shape", [("llama", LLAMA), ("moe", MOE)])
def test_measured_layers_are_the_estimates_layers(which: str, shape, request: pytest.FixtureRequest) -> None:
    measured: Profile = request.getfixturevalue(which)
    estimated = estimate(shape)
    assert [layer.name for layer in measured.layers] == ["tok_embeddings", "layers.0", "layers.1", "output"]
    for key in ("name", "kind", "module_paths", "params", "static_bytes", "out_bytes"):
        assert [getattr(layer, key) for layer in measured.layers] == [getattr(layer, key) for layer in estimated.layers]
    assert measured.details["partition"] == {**estimated.details["partition"],
                                             "stage_compute_us": measured.details["partition"]["stage_compute_us"]}
    assert measured.source["kind"] == "measured" and "tensor_parallel" not in measured.details
    assert measured.details["model"] == {**shape.describe(), "attention": "sdpa"}
    assert all(layer.F > 0 and layer.W > 0 for layer in measured.layers)
    blocks = measured.layers[1:-1]
    assert {layer.details["module"] for layer in blocks} == {"DecoderBlock"}
    assert all(layer.details["attention_kernel"].startswith("ScaledDotProduct") for layer in blocks)


@pytest.mark.torch
def test_sdpa_block_saves_what_the_estimate_counts_but_silu_and_the_norms(llama: Profile) -> None:
    """The known difference, per token: plain SwiGLU keeps silu's output (f*d), which the estimate does not
    count; nn.RMSNorm's composite form (the CPU's) keeps each norm's normalized input again for its weight
    (h*d twice), its fused CUDA kernel does not. Everything else, q/k/v at the key/value heads (sdpa takes
    the groups as they are), the attention output, the log-sum-exp, is counted exactly. The gradients
    torch's I stores for W are exactly the estimate's."""
    tokens, h, f = LLAMA.micro_batch * LLAMA.seq, LLAMA.hidden, LLAMA.ffn_size
    estimated = estimate(LLAMA)
    for measured, counted in zip(llama.layers[1:-1], estimated.layers[1:-1]):
        extra = measured.mem_B_torch - counted.mem_B_torch
        assert extra in (tokens * f * D, tokens * (f + 2 * h) * D), extra / tokens
        assert measured.mem_W_torch - measured.mem_B_torch == counted.mem_W_torch - counted.mem_B_torch
    embedding = llama.layers[0]
    assert embedding.mem_B == estimated.layers[0].mem_B == 8 * tokens  # the token ids


@pytest.mark.torch
def test_moe_block_saves_what_the_estimate_counts_but_silu_norms_and_dispatch_order() -> None:
    """Per token beyond the estimate: silu's outputs of the k routed and the shared experts ((k + n) * f_e * d),
    the norms' normalized inputs where RMSNorm is composite (2h*d), and two int64 dispatch indices (2k * 8)."""
    measured, estimated = measure(MOE), estimate(MOE)
    tokens, h, k, f, n = MOE.micro_batch * MOE.seq, MOE.hidden, MOE.top_k, MOE.expert_size, MOE.shared_experts
    block, counted = measured.layers[2], estimated.layers[2]
    assert block.details["attention_kernel"] and counted.details["mlp"] == "MoE"
    silu_and_indices = (k + n) * f * D + 2 * k * 8
    assert block.mem_B_torch - counted.mem_B_torch in (tokens * silu_and_indices, tokens * (silu_and_indices + 2 * h * D))


@pytest.mark.torch
def test_naive_llama_attention_recomputes_its_core_at_selective() -> None:
    """With naive attention the block keeps the softmax probabilities (s per head and token) and the key/value
    heads repeated to every query head; selective recompute drops exactly those."""
    profile = measure(LLAMA, attention="naive")
    tokens, s, a, kv, dh = LLAMA.micro_batch * LLAMA.seq, LLAMA.seq, LLAMA.heads, LLAMA.kv, LLAMA.dh
    for block in profile.layers[1:-1]:
        options = {option.level: option for option in block.recompute}
        assert set(options) == {"selective", "full"} and "attention_kernel" not in block.details
        dropped = block.mem_B_torch - options["selective"].mem_B
        assert dropped == tokens * (a * s + 2 * (a - kv) * dh) * D
        assert options["full"].mem_B == tokens * LLAMA.hidden * D  # the block's input


def test_tensor_parallel_estimate_records_the_share_and_leaves_t1_as_it_was() -> None:
    whole, half = estimate(LLAMA), estimate(LLAMA, tp=2)
    assert "tensor_parallel" not in whole.details and "tensor parallelism" not in whole.source["method"]
    assert half.details["tensor_parallel"] == 2 and half.details["whole_model"] == LLAMA.describe()
    assert half.details["model"]["heads"] == 2 and half.details["model"]["kv_heads"] == 1
    assert "are NOT in these times" in half.source["method"] and half.name == "llama-2l-h64-s32-b2-tp2-h100-estimated"
    norms = 2 * LLAMA.hidden
    assert half.layers[1].params - norms == (whole.layers[1].params - norms) // 2
    assert half.layers[1].details["flops"]["W"] == whole.layers[1].details["flops"]["W"] / 2


@pytest.mark.torch
def test_tensor_parallel_measure_halves_a_blocks_weights_and_says_so(llama: Profile) -> None:
    half = measure(LLAMA, tp=2)
    norms = 2 * LLAMA.hidden
    assert half.layers[1].params - norms == (llama.layers[1].params - norms) // 2
    assert half.layers[-1].params - LLAMA.hidden == (llama.layers[-1].params - LLAMA.hidden) // 2  # vocabulary
    assert half.details["tensor_parallel"] == 2 and half.details["model"]["vocab"] == LLAMA.vocab // 2
    assert "collectives" in half.source["method"] and half.name.startswith("llama-2l-h64-s32-b2-tp2-fp32-cpu")
    assert [layer.params for layer in half.layers] == [layer.params for layer in estimate(LLAMA, tp=2).layers]


def one_line_error(args: list[str]) -> str:
    result = runner.invoke(app, ["profile", *args])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


DEGREES = ("error: tensor-parallel degree 3 does not split 32 heads, 8 key/value heads and FFN 14336 whole: use one "
           "of 1, 2, 4, 8 (option --tp)")


@pytest.mark.parametrize("args, line", [
    (["--model", "llama3-8b", "--tp", "3", "--estimate", "--gpu", "h200"], DEGREES),
    (["--model", "llama3-8b", "--tp", "3", "--device", "cpu"], DEGREES),  # refused before anything is built
    (["--model", "llama", "--tp", "0", "--estimate", "--gpu", "h200"],
     "error: tensor-parallel degree 0: give a whole number >= 1 (option --tp)"),
    (["--tp", "2", "--estimate", "--gpu", "h200"],
     "error: tensor parallelism is modelled for llama and moe shapes, not gpt: use the llama or moe model (or a "
     "preset of theirs) (option --tp)"),
    (["--model", "zb_no_such_module_x:build", "--tp", "2", "--device", "cpu"],
     "error: tensor parallelism shards the built-in llama and moe shapes; model zb_no_such_module_x:build builds "
     "its own layers: measure one rank's share of them yourself (option --tp)"),
])
def test_bad_tensor_parallel_degree_is_one_line_naming_tp(args: list[str], line: str) -> None:
    assert one_line_error(["-p", "4", *args]) == line


def test_tp_share_errors_name_their_field() -> None:
    with pytest.raises(ProfilerError) as caught:
        estimate(LLAMA, tp=3)
    assert caught.value.fields == ("tp",) and "--" not in str(caught.value)


def test_cli_estimates_one_ranks_share(tmp_path: Path) -> None:
    path = tmp_path / "tp8.json"
    result = runner.invoke(app, ["profile", "--model", "llama3-8b", "--tp", "8", "--estimate", "--gpu", "h200",
                                 "-p", "4", "-o", str(path)])
    assert result.exit_code == 0, result.output
    data = json.loads(path.read_text())
    assert data["details"]["tensor_parallel"] == 8 and data["name"] == "llama3-8b-tp8-h200-estimated"
    assert (data["details"]["model"]["heads"], data["details"]["model"]["ffn"]) == (4, 1792)
    assert load_profile(path).layers[1].params == (4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336) // 8 + 2 * 4096

"""Named model shapes for estimates, and turning a model name plus given fields into a shape record.

Each preset is "-like": the published model's shape as a GPT, Llama-style or MoE record, with what the
record leaves out said in its `note` and where the numbers come from in its `citation`; both go into the
profile's source. Micro-batch size 1.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Union

from ..core.errors import ProfilerError
from .request import GptShape, LlamaShape, MoeShape, bad_input

Shape = Union[GptShape, LlamaShape, MoeShape]


@dataclass(frozen=True)
class Preset:
    name: str
    shape: Shape
    citation: str  # where the shape's numbers come from
    note: str  # what the record leaves out or assumes


_PRESETS = (
    Preset(
        "llama3-8b",
        LlamaShape(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, seq=8192, micro_batch=1, vocab=128256),
        "Meta Llama 3 8B (Grattafiori et al., The Llama 3 Herd of Models, arXiv:2407.21783, Table 3; "
        "meta-llama/Meta-Llama-3-8B config.json): 32 layers, hidden 4096, 32 heads, 8 key/value heads, "
        "FFN 14336, vocabulary 128256 (128,000 in the paper's table), 8.03B parameters",
        "sequence 8192, the pre-training context length; RoPE, RMSNorm, SwiGLU, untied output projection as "
        "published",
    ),
    Preset(
        "llama3-70b",
        LlamaShape(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, seq=8192, micro_batch=1, vocab=128256),
        "Meta Llama 3 70B (Grattafiori et al., The Llama 3 Herd of Models, arXiv:2407.21783, Table 3; "
        "meta-llama/Meta-Llama-3-70B config.json): 80 layers, hidden 8192, 64 heads, 8 key/value heads, "
        "FFN 28672, vocabulary 128256 (128,000 in the paper's table), 70.6B parameters",
        "sequence 8192, the pre-training context length; RoPE, RMSNorm, SwiGLU, untied output projection as "
        "published",
    ),
    Preset(
        "mixtral-8x7b",
        MoeShape(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, seq=4096, micro_batch=1, vocab=32000,
                 dense_layers=0, experts=8, top_k=2, expert_ffn=14336, shared_experts=0),
        "Mixtral 8x7B (Jiang et al., Mixtral of Experts, arXiv:2401.04088, Table 1): 32 layers, dim 4096, "
        "32 heads of 128, 8 key/value heads, 8 experts of hidden size 14336 with 2 per token in every block, "
        "vocabulary 32000, 46.7B parameters (12.9B active)",
        "sequence 4096 (the published context is 32768); sliding-window attention is treated as full causal "
        "attention; the router is a linear layer with top-2 softmax gating as published",
    ),
    Preset(
        "gpt3-2.7b",
        GptShape(layers=32, hidden=2560, heads=32, seq=2048, micro_batch=1, vocab=50257),
        "GPT-3 2.7B (Brown et al., Language Models are Few-Shot Learners, arXiv:2005.14165, Table 2.1): "
        "32 layers, d_model 2560, 32 heads of 80, context 2048; GPT-2's BPE vocabulary of 50257",
        "the built-in GPT: learned positions, pre-LN, 4h GELU MLP with biases; GPT-3's alternating locally "
        "banded sparse attention is treated as dense; the output projection is its own matrix (the last "
        "stage holds a copy even when tied)",
    ),
    Preset(
        "gemma2-2b",
        LlamaShape(layers=26, hidden=2304, heads=8, kv_heads=4, ffn=9216, seq=4096, micro_batch=1, vocab=256000,
                   head_dim=256),
        "Gemma 2 2B (Gemma Team, Gemma 2: Improving Open Language Models at a Practical Size, "
        "arXiv:2408.00118, Table 1; google/gemma-2-2b config.json): 26 layers, d_model 2304, 8 heads of 256, "
        "4 key/value heads, FFN 9216 (GeGLU, 18432 for gate and up together), vocabulary 256000 (256128 in the "
        "paper's table)",
        "sequence 4096, Gemma 2's sliding window, so its local and global layers cost the same; GeGLU costs as "
        "SwiGLU; 2 norms per block instead of Gemma's 4 and no logit soft-capping; the output projection is "
        "counted as its own matrix (tied to the embedding in Gemma, but a pipeline's last stage holds a copy), "
        "so the total is 3.20B rather than the published 2.61B",
    ),
    Preset(
        "deepseek-v2-lite",
        MoeShape(layers=27, hidden=2048, heads=16, ffn=10944, seq=4096, micro_batch=1, vocab=102400,
                 dense_layers=1, experts=64, top_k=6, expert_ffn=1408, shared_experts=2),
        "DeepSeek-V2-Lite (DeepSeek-AI, DeepSeek-V2, arXiv:2405.04434, appendix B; deepseek-ai/DeepSeek-V2-Lite "
        "config.json): 27 layers, hidden 2048, 16 heads, first layer dense with FFN 10944, then 64 routed "
        "experts (top-6) of FFN 1408 and 2 shared experts, vocabulary 102400, 15.7B parameters (2.4B active)",
        "sequence 4096; its multi-head latent attention (MLA) is treated as standard multi-head attention "
        "(head size 128), so the total is 15.8B; no expert parallelism, so every expert's parameters sit on "
        "its block's stage",
    ),
)
PRESETS: dict[str, Preset] = {preset.name: preset for preset in _PRESETS}

MODELS = ("gpt", "llama", "moe")  # the built-in shapes, besides the presets
_RECORDS: dict[str, type[Shape]] = {"gpt": GptShape, "llama": LlamaShape, "moe": MoeShape}


def is_builtin(model: str) -> bool:
    """Whether `model` names a built-in shape or a preset (else it is a package.module:factory)."""
    return model in _RECORDS or model in PRESETS


def resolve_shape(model: str, given: dict[str, Any]) -> tuple[Shape, Preset | None]:
    """The shape record `model` names (gpt, llama, moe or a preset) with the `given` fields set on it.

    Raises
    ------
    ProfilerError
        The model is none of those, or a given field does not shape that kind of model.
    """
    preset = PRESETS.get(model)
    if preset is None and model not in _RECORDS:
        raise bad_input(ProfilerError, f"model {model!r} is not a built-in shape: use one of "
                        f"{', '.join(MODELS + tuple(PRESETS))}, or package.module:factory", "model")
    record = type(preset.shape) if preset else _RECORDS[model]
    known = {f.name for f in fields(record)}
    extra = [key for key in given if key not in known]
    if extra:
        kind = record.model
        raise bad_input(ProfilerError, f"{', '.join(k.replace('_', ' ') for k in extra)} do not shape a {kind} "
                        f"model (model {model}): drop them, or pick a model they shape", *extra, "model")
    shape = replace(preset.shape, **given) if preset else record(**given)
    return shape.check(), preset

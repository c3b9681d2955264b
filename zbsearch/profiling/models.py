"""The models the profiler measures: the built-in GPT, or a user's `package.module:factory` (the
Llama-style and MoE decoders are decoder_models.py's).

Either way a model is an ordered list of `LayerSpec`s, (name, build the nn.Module), plus a sample
input for the first layer: one microbatch. Layers are built when their turn comes, so a model larger
than the device still profiles one layer at a time. Importing this module needs torch.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from ..core.errors import ProfilerError
from .costs import decoder_layout
from .hardware import one_line
from .request import ATTENTIONS, GptShape, check_choice, check_factory_spec

LayerSpec = tuple[str, Callable[[], nn.Module]]  # (name, build the nn.Module)


class Embedding(nn.Module):
    """Token plus learned position embedding: ids (b, s) -> activations (b, s, h)."""

    positions: torch.Tensor  # a buffer

    def __init__(self, vocab: int, hidden: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.register_buffer("positions", torch.arange(seq), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids) + self.pos(self.positions[: ids.shape[1]])


class Block(nn.Module):
    """Pre-LN decoder block: causal multi-head attention and a 4h GELU MLP, no dropout."""

    causal: torch.Tensor  # a buffer

    def __init__(self, hidden: int, heads: int, seq: int, attention: str) -> None:
        super().__init__()
        self.heads, self.attention = heads, attention
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)
        self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).tril(), persistent=False)
        # Set by recompute_once.recompute_core: runs `attend` with selective recompute.
        self.core_wrapper: Callable[..., torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(h, dim=-1))
        o = self.attend(q, k, v) if self.core_wrapper is None else self.core_wrapper(self.attend, q, k, v)
        x = x + self.proj(o.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention core (Korthikanti et al.'s: scores, softmax, value product), what selective
        recompute runs again (recompute_once.py)."""
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # the paper's (Megatron's) unfused attention: the s x s probabilities are kept for B
        s = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        return scores.masked_fill(~self.causal[:s, :s], float("-inf")).softmax(-1) @ v


class Head(nn.Module):
    """Final LayerNorm, LM head and cross-entropy loss (in fp32) against fixed random targets."""

    targets: torch.Tensor  # a buffer

    def __init__(self, vocab: int, hidden: int, targets: torch.Tensor) -> None:
        super().__init__()
        self.ln, self.out = nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)
        self.register_buffer("targets", targets, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.out(self.ln(x))
        return F.cross_entropy(logits.float().flatten(0, 1), self.targets.flatten())


def _given(module: nn.Module) -> Callable[[], nn.Module]:
    """A builder that returns `module` itself (a factory's layers are built already)."""
    return lambda: module


def seeded(seed: int, make: Callable[[], nn.Module], device: torch.device | None = None) -> Callable[[], nn.Module]:
    """`make`, building its weights from `seed` whenever it is called (on `device` when given)."""
    def build() -> nn.Module:
        torch.manual_seed(seed)
        if device is None:
            return make()
        with device:
            return make()
    return build


def gpt_layers(shape: GptShape, attention: str = "naive", seed: int = 0) -> tuple[list[LayerSpec], torch.Tensor]:
    """The built-in GPT as lazily built layers (embedding, blocks, head) and a sample batch of token ids.

    The layers are named by their module paths in the model (costs.decoder_layout): tok_embeddings
    (token and position embeddings), layers.{i}, output (final norm, LM head and loss).
    """
    shape.check()
    check_choice(attention, ATTENTIONS, "attention", "attention")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(shape.vocab, (shape.micro_batch, shape.seq), generator=gen)
    targets = torch.randint(shape.vocab, (shape.micro_batch, shape.seq), generator=gen)
    names = [name for name, _, _ in decoder_layout(shape.layers, positions=True)]
    specs: list[LayerSpec] = [(names[0], seeded(seed, lambda: Embedding(shape.vocab, shape.hidden, shape.seq)))]
    for i in range(shape.layers):
        specs.append((names[i + 1],
                      seeded(seed + i + 1, lambda: Block(shape.hidden, shape.heads, shape.seq, attention))))
    specs.append((names[-1], seeded(seed + shape.layers + 1, lambda: Head(shape.vocab, shape.hidden, targets))))
    return specs, ids


def _find_factory(spec: str) -> Callable[[], Any]:
    """Import the factory function `spec` names; the current directory is searched too."""
    module_name, attr = check_factory_spec(spec)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an ImportError, or anything the module raises while importing
        raise ProfilerError(f"model factory {spec}: cannot import {module_name!r} ({one_line(exc)})") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ProfilerError(f"model factory {spec}: module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ProfilerError(f"model factory {spec}: {attr!r} is a {type(obj).__name__}, not a function returning "
                            "(layers, sample_input)")
    return obj


def load_factory(spec: str) -> tuple[list[LayerSpec], torch.Tensor]:
    """Import `package.module:factory`, call it, and check it returned (ordered layers, sample input).

    The current directory is searched too, so a factory in ./my_model.py is `my_model:build`. Each layer
    is named by its module path: its key in an nn.Sequential or nn.ModuleList, else its index in the list.

    Raises
    ------
    ProfilerError
        The spec is malformed, the import or the call fails, or the result is not a pair of a list of
        torch.nn.Module layers and a tensor.
    """
    factory = _find_factory(spec)
    try:
        result = factory()
    except Exception as exc:
        raise ProfilerError(f"model factory {spec}: the factory raised {one_line(exc)}") from None
    layers, sample = check_factory_result(result, spec)
    keys = list(getattr(result[0], "_modules", None) or ())
    names = keys if isinstance(result[0], nn.Module) and len(keys) == len(layers) else list(map(str, range(len(layers))))
    return [(name, _given(m)) for name, m in zip(names, layers)], sample


def check_factory_result(result: Any, spec: str = "factory") -> tuple[list[nn.Module], torch.Tensor]:
    """(layers, sample_input) with layers an ordered list of nn.Modules and sample_input a tensor."""
    fix = ("a factory must return (layers, sample_input): the ordered list of nn.Module layers and the first "
           "layer's input tensor")
    where = f"model factory {spec}"
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise ProfilerError(f"{where}: the factory returned {type(result).__name__}; {fix}")
    layers, sample = result
    if isinstance(layers, (nn.Sequential, nn.ModuleList)):
        layers = list(layers)
    elif isinstance(layers, nn.Module):
        raise ProfilerError(f"{where}: the factory returned one {type(layers).__name__} module, not a list "
                            "of layers; return e.g. list(model.children()) in pipeline order")
    if not isinstance(layers, (list, tuple)):
        raise ProfilerError(f"{where}: the layers are a {type(layers).__name__}; {fix}")
    if not layers:
        raise ProfilerError(f"{where}: the layer list is empty; {fix}")
    for i, layer in enumerate(layers):
        if not isinstance(layer, nn.Module):
            raise ProfilerError(f"{where}: layer {i} is a {type(layer).__name__}, not a torch.nn.Module; {fix}")
    if not isinstance(sample, torch.Tensor):
        raise ProfilerError(f"{where}: the sample input is a {type(sample).__name__}, not a torch.Tensor; {fix}")
    return list(layers), sample


def describe_tensor(x: Any) -> str:
    """`float32 tensor of shape 2x5`, for messages and provenance."""
    shape = "x".join(str(d) for d in getattr(x, "shape", ())) or "scalar"
    return f"{str(getattr(x, 'dtype', type(x).__name__)).replace('torch.', '')} tensor of shape {shape}"

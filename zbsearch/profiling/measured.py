"""The parts of the measured flow (build.profile_measured) around the measurement itself: which model a
request names (the built-in GPT, a Llama-style or MoE shape, a preset, or a user's factory; one
tensor-parallel rank's share of it), its layers ready to measure, the link, and the `source` and
`details` that say how the numbers were taken. torch is imported only by `load_model`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Sequence, Union

from ..core.errors import ProfilerError
from .costs import LayerCost, Layout, decoder_layout
from .hardware import import_torch, measure_link_gbps
from .presets import PRESETS, Preset, is_builtin, resolve_shape
from .request import (DEFAULT_LINK_GBPS, GptShape, LlamaShape, MeasureRequest, MoeShape, PipelineSetup, bad_input,
    check_factory_spec)
from .tensor_parallel import tp_details, tp_label, tp_shard, tp_words

if TYPE_CHECKING:
    import torch

    from .models import LayerSpec

DECODER_ANCHORS = (1, 1)  # a built-in decoder's embedding stays on the first stage, its head and loss on the last
Shape = Union[GptShape, LlamaShape, MoeShape]
DEFAULT_LINK = f"default {DEFAULT_LINK_GBPS} Gb/s"


@dataclass(frozen=True)
class Request:
    """What a measured profile is of: the model's name, its shape (None for a factory) as measured (one
    rank's share under tensor parallelism), the preset it comes from, the degree, the whole shape."""

    model: str
    shape: Shape | None
    preset: Preset | None
    tp: int
    whole: Shape | None

    def label(self) -> str:
        """The start of the profile's default name: the shape's (with its share), else the factory's."""
        return self.model if self.shape is None else tp_label(self.shape.label(), self.tp)

    def details(self, attention: str) -> dict[str, Any]:
        """The profile's details.model (and, for one rank's share, details.tensor_parallel and whole_model)."""
        if self.shape is None or self.whole is None:
            return {}
        model: dict[str, Any] = {**self.shape.describe(), "attention": attention}
        if self.preset is not None:
            model["preset"] = self.preset.name
        return {"model": model, **tp_details(self.whole, self.tp)}


def measured_request(model: str, shape: Shape | None = None, tp: int = 1) -> Request:
    """The request for `model` (gpt, llama, moe, a preset or package.module:factory) with `shape` its record
    when given (else the model's defaults), as one of `tp` tensor-parallel ranks' share."""
    if not is_builtin(model):
        check_factory_spec(model)
        if tp != 1:
            raise bad_input(ProfilerError, f"tensor parallelism shards the built-in llama and moe shapes; model {model} "
                            "builds its own layers: measure one rank's share of them yourself", "tp")
        return Request(model, None, None, 1, None)
    preset = PRESETS.get(model)
    if shape is None:
        shape, preset = resolve_shape(model, {})
    whole = shape.check()
    return Request(model, tp_shard(whole, tp) if tp != 1 else whole, preset, tp, whole)


@dataclass(frozen=True)
class MeasuredModel:
    specs: list[LayerSpec]
    sample: torch.Tensor  # the first layer's input
    anchored: tuple[int, int]
    info: dict[str, Any]  # the profile's details.model
    layout: Layout  # kind and modules of the named layers


def load_model(request: Request, attention: str, seed: int, device: torch.device) -> MeasuredModel:
    """The built-in GPT's, a Llama-style or MoE shape's, or a factory's layers, ready to measure; a decoder's
    layers are built on `device`."""
    torch = import_torch()
    # defers torch (import_torch above says how to install it)
    from .decoder_models import decoder_layers
    from .models import describe_tensor, gpt_layers, load_factory

    shape = request.shape
    if shape is None:
        torch.manual_seed(seed)
        specs, sample = load_factory(request.model)
        info = {"model": request.model, "layers": len(specs), "sample_input": describe_tensor(sample)}
        return MeasuredModel(specs, sample, (0, 0), info, [])
    gpt = isinstance(shape, GptShape)
    specs, sample = gpt_layers(shape, attention, seed) if isinstance(shape, GptShape) else \
        decoder_layers(shape, attention, seed, device)
    return MeasuredModel(specs, sample, DECODER_ANCHORS, request.details(attention)["model"],
                         decoder_layout(shape.layers, positions=gpt))


def measured_method(request: MeasureRequest, cuda: bool, tp: int = 1) -> tuple[str, str, str, str]:
    """(method, timer, order, memory method): how a measured profile's numbers were taken, in words."""
    timer = "CUDA events" if cuda else "time.perf_counter"
    order = ("round-robin over all layers, one run of each per round" if request.interleave else
             "one layer at a time")
    memory = ("M_B: torch.cuda.memory_allocated delta over F (minus the output, plus the input when saved); "
              if cuda else
              "M_B: bytes of the distinct non-parameter tensors saved for backward (saved-tensor hooks); ")
    memory += ("M_W: bytes of the tensors the weight-gradient step still needs after B (saved inputs of the "
               "parameter-using autograd nodes plus the output gradients stored for them)")
    method = (f"zbsearch profile: each layer measured alone on its real input; F forward, B = torch's "
              f"stage_backward_input (the runtime's I), W = stage_backward_weight (the runtime's W), and the fused "
              f"backward (stage_backward); {request.warmup} warm-up runs, median of {request.repeats} ({timer}, "
              f"{order}); {memory}")
    if tp != 1:
        method += f"; {tp_words(tp)}"
    return method, timer, order, memory


def resolve_link(setup: PipelineSetup, costs: Sequence[LayerCost], cuda: bool,
                 probed: tuple[float, str] | None = None) -> tuple[PipelineSetup, str]:
    """The link bandwidth given, else the one probed between torchrun's ranks, else measured between two
    GPUs, else the default; with its origin."""
    if setup.link_gbps is not None:
        return setup, "--link-gbps"
    if probed is not None:
        return replace(setup, link_gbps=probed[0]), probed[1]
    biggest = max(c.out_bytes for c in costs)
    measured = measure_link_gbps(biggest) if cuda else None
    if measured is not None:
        return replace(setup, link_gbps=measured), f"measured cuda:0 -> cuda:1 copy of {biggest} bytes"
    return replace(setup, link_gbps=DEFAULT_LINK_GBPS), DEFAULT_LINK

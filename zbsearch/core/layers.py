"""Layer-level costs: one entry per layer of the model, in model order, so that the split into stages
(and into the chunks of a V-shape or interleaved placement) can be chosen after profiling.

A `Layer` carries what a split needs to know about one layer for one microbatch: its F, B, W times;
the activation memory it holds from F until B (`mem_B`) and from B until W (`mem_W`); its static bytes
(parameters, gradients and optimizer state); and the bytes of its output activation, which is what the
hop to the next stage carries when a boundary falls after it. `name` is the layer's module path in the
model (`tok_embeddings`, `layers.3`, `output`) so that exported splits need no renaming; `modules`
lists every module path the entry covers when it is more than one (the final norm travels with the
output head). `kind` says what the layer is, for trainers whose split format names layer types
(Megatron-LM's layout string: embedding, decoder, mtp, output).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from .errors import ProfileError
from .recompute.options import RecomputeOption, parse_options

LAYER_KINDS = ("embedding", "decoder", "mtp", "output", "other")


@dataclass(frozen=True)
class Layer:
    """One layer's cost for one microbatch, in the profile's time and memory units."""

    name: str
    F: float
    B: float
    W: float
    mem_B: float = 0.0
    mem_W: float = 0.0
    static_bytes: float = 0.0
    out_bytes: float = 0.0
    full_backward: float | None = None
    modules: tuple[str, ...] = ()
    kind: str = "other"
    params: int | None = None  # informative
    mem_W_torch: float | None = None  # what torch's split backward keeps from I until W (may exceed mem_B)
    mem_B_torch: float | None = None  # the bytes autograd saves (mem_B may have been raised to mem_W)
    mem_kept_torch: float | None = None  # what stays after W while the output (its send) is referenced
    mem_kept_loss_torch: float | None = None  # the same on the loss chunk (a share of a suffix's, measured)
    gather_bytes: float = 0.0  # gathered while it computes beyond its static bytes (FSDP; core/sharding.py)
    recompute: tuple[RecomputeOption, ...] = ()  # the ways to rebuild its activations in the backward
    # Anything else about the layer (FLOP counts, measured extras); never read by the solver.
    details: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    # A layer run at a recompute level (core/recompute/levels.recomputed): the layer as profiled, what a
    # microbatch that keeps its activations costs (per-microbatch recompute). Never written.
    as_profiled: "Layer | None" = field(default=None, compare=False, hash=False, repr=False)

    @property
    def BW(self) -> float:
        return self.full_backward if self.full_backward is not None else self.B + self.W

    @property
    def work(self) -> float:
        """Time of one microbatch's passes through this layer (F + B + W)."""
        return self.F + self.B + self.W

    @property
    def module_paths(self) -> tuple[str, ...]:
        return self.modules or (self.name,)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "F": self.F, "B": self.B, "W": self.W,
                               "mem_B": self.mem_B, "mem_W": self.mem_W, "static_bytes": self.static_bytes,
                               "out_bytes": self.out_bytes}
        if self.full_backward is not None:
            out["full_backward"] = self.full_backward
        if self.modules:
            out["modules"] = list(self.modules)
        if self.params is not None:
            out["params"] = self.params
        if self.mem_W_torch is not None:
            out["mem_W_torch"] = self.mem_W_torch
        if self.mem_B_torch is not None:
            out["mem_B_torch"] = self.mem_B_torch
        if self.mem_kept_torch is not None:
            out["mem_kept_torch"] = self.mem_kept_torch
        if self.mem_kept_loss_torch is not None:
            out["mem_kept_loss_torch"] = self.mem_kept_loss_torch
        if self.gather_bytes:
            out["gather_bytes"] = self.gather_bytes
        if self.recompute:
            out["recompute"] = [option.to_dict() for option in self.recompute]
        if self.details:
            out["details"] = self.details
        return out


def parse_layers(origin: str, raw: Sequence[dict[str, Any]]) -> tuple[Layer, ...]:
    """Layers from a profile's (schema-checked) `layers` list, with the rules the schema cannot state:
    at least one layer, names and module paths unique, mem_W <= mem_B."""
    if not raw:
        raise ProfileError(f"{origin}: field layers is empty; list one object per layer in model order, or leave "
                           "layers out")
    _check_given_everywhere(origin, raw)
    layers = tuple(_layer(origin, i, entry) for i, entry in enumerate(raw))
    seen: dict[str, int] = {}
    for i, layer in enumerate(layers):
        for path in dict.fromkeys((layer.name,) + layer.modules):
            if path in seen and seen[path] != i:
                raise ProfileError(f"{origin}: field layers[{i}] names {path!r}, already named by layers[{seen[path]}]; "
                                   "give every layer its own module path")
            seen[path] = i
        if layer.mem_W > layer.mem_B:
            raise ProfileError(f"{origin}: field layers[{i}].mem_W ({layer.mem_W}) exceeds mem_B ({layer.mem_B}); "
                               "B frees mem_B - mem_W and W frees mem_W, so mem_W must be <= mem_B")
    return layers


# Fields that are all or nothing: a layer left without one would count it as 0 (no activations held, no
# parameters) while its neighbours count theirs, and every plan would be wrong on that layer's rank.
ALL_OR_NONE = ("mem_B", "mem_W", "static_bytes")


def _check_given_everywhere(origin: str, raw: Sequence[dict[str, Any]]) -> None:
    """A field of ALL_OR_NONE that some layers give and others miss is an error naming the first missing."""
    for key in ALL_OR_NONE:
        given = [i for i, entry in enumerate(raw) if entry.get(key) is not None]
        if given and len(given) < len(raw):
            missing = next(i for i, entry in enumerate(raw) if entry.get(key) is None)
            raise ProfileError(f"{origin}: field layers[{missing}].{key} is missing, while layers[{given[0]}] gives "
                               f"it: give {key} for every layer (0 where the layer has none), or for none")


def _layer(origin: str, i: int, entry: dict[str, Any]) -> Layer:
    def number(key: str, default: float = 0.0) -> float:
        value = entry.get(key)
        return default if value is None else float(value)

    fb, params, details = entry.get("full_backward"), entry.get("params"), dict(entry.get("details") or {})
    # Profiles written before mem_W_torch was a field keep the measured figure in the layer's details.
    torch_w = entry.get("mem_W_torch", details.get("mem_W_torch_runtime"))
    torch_w = torch_w if isinstance(torch_w, (int, float)) and not isinstance(torch_w, bool) else None
    kind = str(entry.get("kind") or "other")
    held = number("mem_B_torch", number("mem_B"))
    options = parse_options(origin, f"layers[{i}]", entry.get("recompute") or (), kind, held)
    return Layer(str(entry["name"]), number("F"), number("B"), number("W"), number("mem_B"), number("mem_W"),
                 number("static_bytes"), number("out_bytes"), None if fb is None else float(fb),
                 tuple(str(m) for m in entry.get("modules") or ()), kind,
                 None if params is None else int(params), None if torch_w is None else float(torch_w),
                 None if entry.get("mem_B_torch") is None else float(entry["mem_B_torch"]),
                 None if entry.get("mem_kept_torch") is None else float(entry["mem_kept_torch"]),
                 None if entry.get("mem_kept_loss_torch") is None else float(entry["mem_kept_loss_torch"]),
                 number("gather_bytes"), options, details)


def total_work(layers: Sequence[Layer]) -> float:
    return math.fsum(layer.work for layer in layers)

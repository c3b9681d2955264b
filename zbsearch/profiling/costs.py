"""What the profiler produces per layer, measured or estimated: `LayerCost`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence


Layout = list[tuple[str, str, tuple[str, ...]]]  # (name, kind, modules) of each layer, in model order


def decoder_layout(n_blocks: int, positions: bool = False) -> Layout:
    """The built-in decoders' layers by module path: the token embedding (with the GPT's learned positions),
    the blocks `layers.{i}`, and the output head, which holds the final norm.

    >>> [name for name, _, _ in decoder_layout(2)]
    ['tok_embeddings', 'layers.0', 'layers.1', 'output']
    """
    embedding = ("tok_embeddings", "embedding", ("tok_embeddings", "pos_embeddings") if positions else ())
    blocks = [(f"layers.{i}", "decoder", ()) for i in range(n_blocks)]
    return [embedding, *blocks, ("output", "output", ("norm", "output"))]


def sig9(x: float) -> float:
    """`x` to 9 significant digits: plenty for a time, and short in the JSON."""
    return float(f"{x:.9g}")


@dataclass
class LayerCost:
    """One layer's cost for one microbatch: times in microseconds, memory in bytes.

    `name` is the layer's module path in the model (`tok_embeddings`, `layers.3`, `output`); `modules`
    every path it covers when that is more than its name (the output head carries the final norm);
    `kind` one of core.layers.LAYER_KINDS; `extra` goes into the profile's entry for the layer as its
    `details` (FLOP counts, bytes moved, measured extras).
    """

    name: str
    F: float
    B: float
    W: float
    full_backward: float
    mem_B: float
    mem_W: float
    params: int
    out_bytes: int  # bytes of the activation this layer hands to the next one
    extra: dict[str, Any] = field(default_factory=dict)
    kind: str = "other"
    modules: tuple[str, ...] = ()

    @property
    def compute(self) -> float:
        return self.F + self.B + self.W

    def entry(self, bytes_per_param: int) -> dict[str, Any]:
        """The layer as an entry of a profile's `layers` list (see core/profile.schema.json)."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.modules:
            out["modules"] = list(self.modules)
        out.update({key: sig9(getattr(self, key)) for key in ("F", "B", "W")})
        if self.full_backward > 0:
            out["full_backward"] = sig9(self.full_backward)
        out.update(mem_B=float(self.mem_B), mem_W=float(self.mem_W),
                   static_bytes=float(self.params * bytes_per_param), out_bytes=float(self.out_bytes),
                   params=int(self.params))
        if "mem_W_torch_runtime" in self.extra:  # measured on torch: what its runtime holds (core/calibration.py)
            out["mem_B_torch"] = float(self.extra.get("mem_B_torch", self.mem_B))
            out["mem_W_torch"] = float(self.extra["mem_W_torch_runtime"])
            for key in ("mem_kept_torch", "mem_kept_loss_torch"):
                if key in self.extra:
                    out[key] = float(self.extra[key])
        if "recompute" in self.extra:
            out["recompute"] = self.extra["recompute"]
        if self.extra:
            out["details"] = {k: v for k, v in self.extra.items()
                              if k not in ("mem_B_torch", "mem_kept_torch", "mem_kept_loss_torch", "recompute")}
        return out


def apply_layout(costs: Sequence[LayerCost], layout: Layout) -> list[LayerCost]:
    """The costs with the layout's kind and modules (matched by name) set on them."""
    found = {name: (kind, modules) for name, kind, modules in layout}
    for c in costs:
        c.kind, c.modules = found.get(c.name, (c.kind, c.modules))
    return list(costs)

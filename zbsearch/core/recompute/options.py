"""Activation recompute options of a layer: what a layer costs when its activations are rebuilt in the
backward instead of kept from the forward.

A layer's own fields are the option `none`. A profile may list, per layer, the others:

- `selective`: the attention core (scores, softmax and the value product; Korthikanti et al., "Reducing
  Activation Recomputation in Large Transformer Models", MLSys 2023) is recomputed; the rest of the
  layer's activations are kept. Only layers with attention have it. With a fused attention (sdpa,
  flash) the core keeps no s x s matrix, so there is nothing for it to save and estimates do not list it.
  torchtitan's `selective` (a per-op policy over the whole layer) is a different policy, not this one.
- `full`: only the layer's input is kept from F; the backward runs the layer's forward again first.

Each option says what it adds and what it holds, per microbatch, in the profile's units:
`time` the extra time and `pays` the pass that runs it (I: under torch's split backward the
recompute happens when I reaches the layer); `mem_B` what stays from F until I; `mem_W` what stays
from I until W under torch's runtime (I rebuilds the activations and, keeping its graph for W, holds
them until W: recompute lowers what is held from F to I, not from I to W); `peak` the most the layer
holds while the recomputing pass runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import ProfileError

LEVELS = ("none", "selective", "full")
PASSES = ("I", "W")
WITH_ATTENTION = ("decoder", "mtp")  # layer kinds that have an attention core


@dataclass(frozen=True)
class RecomputeOption:
    """One way to run a layer with its activations rebuilt in the backward (see the module)."""

    level: str
    time: float
    mem_B: float
    mem_W: float
    peak: float
    pays: str = "I"

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "time": self.time, "pays": self.pays, "mem_B": self.mem_B, "mem_W": self.mem_W,
                "peak": self.peak}


def parse_options(origin: str, where: str, raw: Sequence[dict[str, Any]], kind: str,
                  held_from_f: float) -> tuple[RecomputeOption, ...]:
    """A layer's (schema-checked) `recompute` list, with the rules the schema cannot state: each level
    once, `selective` only on layers with attention, and no option holding more from F until I than
    the layer without recompute (`held_from_f`)."""
    options = tuple(RecomputeOption(str(o["level"]), float(o["time"]), float(o["mem_B"]), float(o["mem_W"]),
                                    float(o.get("peak", max(float(o["mem_B"]), float(o["mem_W"])))),
                                    str(o.get("pays", "I"))) for o in raw)
    seen: set[str] = set()
    for k, option in enumerate(options):
        field = f"{where}.recompute[{k}]"
        if option.level in seen:
            raise ProfileError(f"{origin}: field {field}.level lists {option.level!r} a second time: give each level once")
        seen.add(option.level)
        if option.level == "selective" and kind not in WITH_ATTENTION:
            raise ProfileError(f"{origin}: field {field}.level is 'selective' on a layer of kind {kind!r}, which has no attention "
                               "core to recompute: drop the option, or give the layer kind decoder")
        if option.mem_B > held_from_f:
            raise ProfileError(f"{origin}: field {field}.mem_B ({option.mem_B:g}) is more than the layer holds without "
                               f"recompute ({held_from_f:g}): a {option.level} recompute keeps less from F until I; "
                               "fix the option or drop it")
    return options


"""What the profiler produces per layer, measured or estimated: `LayerCost`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class LayerCost:
    """One layer's cost for one microbatch: times in microseconds, memory in bytes."""

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

    @property
    def compute(self) -> float:
        return self.F + self.B + self.W

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        for k in ("F", "B", "W", "full_backward"):
            d[k] = round(d[k], 3)
        d.update(extra)
        return d

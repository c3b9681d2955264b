"""What the per-shape entry points return: `ShapeBound` (bound_shape) and `ShapeResult` (evaluate_shape), plain
JSON-able records (to_dict / from_dict; an infinite time is written null) that pickle as they are.
Times in microseconds unless a name says seconds; memory in bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from .shape import RunShape
from .step import StepTime

STATUSES = ("solved", "refused", "failed")


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isinf(x) else x


@dataclass(frozen=True)
class ShapeBound:
    """A lower bound on the shape's step (`step_bound_us`) from the pipeline's bound over every split
    (`pipeline_bound_us`), and `tokens_per_s_per_gpu_bound`, the most any plan of it can reach; or
    `refused`, why no plan fits, with `least_bytes`, the least memory per GPU the best split needs (static
    bytes and one microbatch)."""

    shape: RunShape
    step_bound_us: float
    pipeline_bound_us: float
    tokens_per_s_per_gpu_bound: float
    refused: str | None = None
    least_bytes: float | None = None
    seconds: float = 0.0

    @property
    def bound(self) -> float:
        """The step bound in microseconds (what the search across shapes orders and prunes by)."""
        return self.step_bound_us

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.shape.to_dict(), "step_bound_us": _finite(self.step_bound_us),
                "pipeline_bound_us": _finite(self.pipeline_bound_us),
                "tokens_per_s_per_gpu_bound": self.tokens_per_s_per_gpu_bound, "refused": self.refused,
                "least_bytes": self.least_bytes, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ShapeBound":
        inf = math.inf
        return cls(RunShape.from_dict(data["shape"]), data["step_bound_us"] if data["step_bound_us"] is not None
                   else inf, data["pipeline_bound_us"] if data["pipeline_bound_us"] is not None else inf,
                   data["tokens_per_s_per_gpu_bound"], data.get("refused"), data.get("least_bytes"),
                   data.get("seconds", 0.0))


@dataclass(frozen=True)
class ShapeResult:
    """One shape's plan and what it costs, or why there is none.

    `status`: solved, refused (the shape cannot run: it does not fit the GPU, or the model does not split
    so) or failed (the search raised); `reason` says why in one line. A solved result has its `step` (its
    terms), the `step_bound_us` over every plan of the shape, tokens/s/GPU (global batch x sequence /
    (step x GPUs)), MFU (the model FLOPs of a step, forward and backward without recompute, over GPUs x
    dense peak x step), the pipeline's bubble fraction (idle share of its ranks over the makespan), each
    rank's peak bytes (static + activations) against the GPU's capacity, the placement, schedule name,
    layers per chunk (route order) and their names, the recompute levels and the plan itself
    (`Schedule.to_dict()`; None without pipelining, p = 1)."""

    shape: RunShape
    status: str
    reason: str | None = None
    timing: StepTime | None = None
    step_bound_us: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    bubble_fraction: float | None = None
    peak_bytes: tuple[float, ...] = ()
    capacity_bytes: float | None = None
    placement: str | None = None
    schedule_name: str | None = None
    layers_per_chunk: tuple[int, ...] = ()
    split: tuple[tuple[str, ...], ...] = ()
    recompute: dict[str, str] = field(default_factory=dict)
    plan: dict[str, Any] | None = None
    solver_status: str | None = None
    seconds: float = 0.0
    # Refused after a search that tried every plan it could give (the 1F1B family, enumerated whole): no
    # plan of it runs on the shape, so its bound is infinite.
    no_plan_proven: bool = False

    @property
    def step_seconds(self) -> float | None:
        return None if self.timing is None else self.timing.step_seconds

    @property
    def step(self) -> float:
        """The step in microseconds; infinite where no plan was found (what the search across shapes ranks)."""
        return math.inf if self.timing is None else self.timing.step_us

    @property
    def bound(self) -> float:
        """The lower bound on the shape's step its solve proved (0 where none was proved; infinite where it
        proved no plan runs)."""
        if self.no_plan_proven:
            return math.inf
        return 0.0 if self.step_bound_us is None else self.step_bound_us

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(shape=self.shape.to_dict(), timing=None if self.timing is None else self.timing.to_dict(),
                   step_bound_us=_finite(self.step_bound_us), peak_bytes=list(self.peak_bytes),
                   layers_per_chunk=list(self.layers_per_chunk), split=[list(c) for c in self.split],
                   recompute=dict(self.recompute), step_seconds=self.step_seconds)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ShapeResult":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values.update(shape=RunShape.from_dict(data["shape"]),
                      timing=None if data.get("timing") is None else StepTime.from_dict(data["timing"]),
                      peak_bytes=tuple(data.get("peak_bytes") or ()),
                      layers_per_chunk=tuple(data.get("layers_per_chunk") or ()),
                      split=tuple(tuple(c) for c in data.get("split") or ()))
        return cls(**values)

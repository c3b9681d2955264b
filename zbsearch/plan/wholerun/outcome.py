"""What a branch and bound across shapes reads from the per-shape entry points (two Protocols) and what it
hands back: the chosen plan, the ranked table, the pruned, failed and refused shapes, and the certificate."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from .shape import Refused, RunShape


class BoundLike(Protocol):
    """A shape's cheap lower bound on its step time (microseconds), or `refused` with the reason it cannot
    run at all (memory, say); `to_dict` is its JSON for the results file."""

    @property
    def shape(self) -> RunShape: ...

    @property
    def bound(self) -> float: ...

    @property
    def refused(self) -> str | None: ...

    def to_dict(self) -> dict[str, Any]: ...


class ResultLike(Protocol):
    """A solved shape: its `status`, its `step` time (microseconds; not finite where no plan was found) and
    the lower `bound` the solve proved on it; `to_dict` is its JSON for the results file."""

    @property
    def shape(self) -> RunShape: ...

    @property
    def status(self) -> str: ...

    @property
    def step(self) -> float: ...

    @property
    def bound(self) -> float: ...

    def to_dict(self) -> dict[str, Any]: ...


ResultT = TypeVar("ResultT", bound=ResultLike)


@dataclass(frozen=True)
class Failed:
    """A shape whose bound or solve raised a ZbsearchError: the one-line reason (the search goes on)."""

    shape: RunShape
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.shape.to_dict(), "label": self.shape.label(), "failed": self.reason}


@dataclass(frozen=True)
class Pruned:
    """A shape not solved because its bound is no better than the chosen plan's step."""

    shape: RunShape
    bound: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.shape.to_dict(), "label": self.shape.label(), "bound": self.bound,
                "reason": self.reason}


@dataclass(frozen=True)
class Certificate:
    """`bound`: a lower bound on the step time of every shape of the space the search did not refuse;
    `step`: the chosen plan's; `gap` = step / bound - 1."""

    bound: float
    step: float
    gap: float
    shapes: int

    def sentence(self) -> str:
        """
        >>> Certificate(100.0, 104.0, 0.04, 12).sentence()
        'under this cost model no shape in the space (12 shapes) is more than 4.0% faster than the chosen plan'
        """
        return (f"under this cost model no shape in the space ({self.shapes} shapes) is more than {self.gap:.1%} "
                "faster than the chosen plan")

    def to_dict(self) -> dict[str, Any]:
        return {"bound": self.bound, "step": self.step, "gap": self.gap, "shapes": self.shapes,
                "sentence": self.sentence()}


def certificate_of(step: float, bounds: list[float]) -> Certificate | None:
    """The certificate of a plan of `step` over shapes whose lower bounds are `bounds`; None without a plan
    or a positive bound."""
    lowest = min(bounds, default=math.inf)
    if not math.isfinite(step) or not (math.isfinite(lowest) and lowest > 0):
        return None
    return Certificate(lowest, step, step / lowest - 1, len(bounds))


@dataclass(frozen=True)
class SearchProgress:
    """One progress event: the phase ("bound", "solve"), shapes done (bounded, or solved or reused), pruned
    and left; the incumbent shape and step; the certificate so far (None before a plan)."""

    phase: str
    done: int
    pruned: int
    left: int
    incumbent: RunShape | None
    step: float | None
    certificate: Certificate | None


@dataclass(frozen=True)
class Outcome(Generic[ResultT]):
    """What a search hands back. `chosen`: the least step (ties: the shape enumerated first); `ranked`: every
    shape solved whose bound is below the chosen step, by step; `failed`, `pruned`, `refused`: with their
    reasons; `certificate`; `fixed`: the user's configuration, solved even where pruned (None where none was
    given). `ran`: jobs this call ran (bounds and solves; those read back from the results file are not
    counted), which differs from run to run and is not part of the table."""

    chosen: ResultT | None
    ranked: tuple[ResultT, ...]
    failed: tuple[Failed, ...]
    pruned: tuple[Pruned, ...]
    refused: tuple[Refused, ...]
    certificate: Certificate | None
    fixed: ResultT | Failed | Refused | None
    ran: int

    def table(self) -> dict[str, Any]:
        """The JSON of everything but `ran`: identical across runs of deterministic entry points."""
        fixed = self.fixed.to_dict() if self.fixed is not None else None
        return {"chosen": self.chosen.to_dict() if self.chosen is not None else None,
                "ranked": [r.to_dict() for r in self.ranked], "failed": [f.to_dict() for f in self.failed],
                "pruned": [p.to_dict() for p in self.pruned], "refused": [r.to_dict() for r in self.refused],
                "certificate": self.certificate.to_dict() if self.certificate is not None else None,
                "fixed": fixed}

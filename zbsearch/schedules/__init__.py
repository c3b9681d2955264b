"""Handcrafted schedules, each a generator `(p, m[, chunks]) -> Schedule` in its own module, each
described by one `ScheduleSpec` record (spec.py) that the module defines next to its generator.

Generators are pure: they return per-rank action lists and never look at a profile. The registry
below collects every module's records, in the order `zbsearch list` and the planner show them:
adding a schedule means writing its module (generator and record) and, for a new module, adding it
to `_MODULES`.
"""

from __future__ import annotations

from ..core.errors import PreconditionError
from ..core.ir import Schedule
from . import chimera, dualpipe, gpipe, interleaved, one_f_one_b, vshape, zbv, zero_bubble
from .spec import MicrobatchRule, PassTimes, ScheduleSpec

_MODULES = (gpipe, one_f_one_b, interleaved, zero_bubble, zbv, dualpipe, chimera, vshape)

REGISTRY: dict[str, ScheduleSpec] = {spec.name: spec for module in _MODULES for spec in module.SPECS}

def names() -> list[str]:
    return list(REGISTRY)


def get(name: str) -> ScheduleSpec:
    try:
        return REGISTRY[name.lower()]
    except KeyError:
        raise PreconditionError(f"unknown schedule {name!r}: choose one of {', '.join(REGISTRY)}") from None


def generate(name: str, p: int, m: int, chunks: int | None = None) -> Schedule:
    """Build the named handcrafted schedule for p ranks and m microbatches."""
    spec = get(name)
    if not isinstance(p, int) or p < 1:
        raise PreconditionError(f"{spec.name} needs p >= 1 ranks, got {p!r}")
    if not isinstance(m, int) or m < 1:
        raise PreconditionError(f"{spec.name} needs m >= 1 microbatches, got {m!r}")
    if spec.takes_chunks:
        return spec.generator(p, m, chunks if chunks is not None else spec.default_chunks)
    if chunks not in (None, spec.default_chunks):
        chosen = ", ".join(s.name for s in REGISTRY.values() if s.takes_chunks)
        raise PreconditionError(f"chunk count {chunks} does not apply to {spec.name}, which has a fixed placement: "
                                f"only {chosen} takes one", subject="chunks")
    return spec.generator(p, m)


__all__ = ["REGISTRY", "MicrobatchRule", "PassTimes", "ScheduleSpec", "generate", "get", "names"]

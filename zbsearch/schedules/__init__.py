"""Handcrafted schedules, each a generator `(p, m[, chunks]) -> Schedule` in its own module.

Generators are pure: they return per-rank action lists and never look at a profile. The registry
imports a generator's module only when it is asked for, so a user asking for 1F1B never pays for
the others.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..core.errors import PreconditionError
from ..core.ir import Schedule


@dataclass(frozen=True)
class Generator:
    name: str
    module: str
    function: str
    summary: str
    takes_chunks: bool = False
    default_chunks: int | None = None
    # Name of the placement its schedules use (Placement.name), so a search on one placement can
    # skip the others without generating them; interleaved-1f1b with one chunk is linear.
    placement: str = "linear"


REGISTRY: dict[str, Generator] = {g.name: g for g in (
    Generator("gpipe", "gpipe", "gpipe", "all forwards, then all full backwards"),
    Generator("1f1b", "one_f_one_b", "one_f_one_b", "PipeDream-Flush: warm-up forwards, then one forward / one full backward"),
    Generator("interleaved-1f1b", "interleaved", "interleaved_1f1b", "Megatron's interleaved 1F1B with V chunks per rank (looped)", True, 2, "interleaved"),
    Generator("zb-h1", "zero_bubble", "zb_h1", "Zero Bubble H1: 1F1B with B/W split, W deferred into the drain; 1F1B memory"),
    Generator("zb-h2", "zero_bubble", "zb_h2", "Zero Bubble H2: extra warm-up forwards, W fills the drain; ~2p memory"),
    Generator("zb-v", "zbv", "zb_v", "Zero Bubble V: V-shape, 2 chunks per rank, 1F1B memory", placement="v"),
    Generator("dualpipe", "dualpipe", "dualpipe", "DeepSeek DualPipe: two directions, overlapped F&B pairs; p even", placement="dualpipe"),
    Generator("dualpipev", "dualpipe", "dualpipev", "DualPipeV: DualPipe cut in half on a V-shape placement", placement="v"),
    Generator("v-half", "vshape", "v_half", "V-Half: V-shape with about half of 1F1B's activation memory", placement="v"),
    Generator("v-min", "vshape", "v_min", "V-Min: V-shape with about a third of 1F1B's activation memory", placement="v"),
)}


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str) -> Generator:
    try:
        return REGISTRY[name.lower()]
    except KeyError:
        raise PreconditionError(f"unknown schedule {name!r}: choose one of {', '.join(REGISTRY)}") from None


def generate(name: str, p: int, m: int, chunks: int | None = None) -> Schedule:
    """Build the named handcrafted schedule for p ranks and m microbatches."""
    gen = get(name)
    if not isinstance(p, int) or p < 1:
        raise PreconditionError(f"{gen.name} needs p >= 1 ranks, got {p!r}")
    if not isinstance(m, int) or m < 1:
        raise PreconditionError(f"{gen.name} needs m >= 1 microbatches, got {m!r}")
    func = getattr(importlib.import_module(f"{__name__}.{gen.module}"), gen.function)
    if gen.takes_chunks:
        return func(p, m, chunks if chunks is not None else gen.default_chunks)
    if chunks not in (None, gen.default_chunks):
        raise PreconditionError(f"chunk count {chunks} does not apply to {gen.name}, which has a fixed placement: "
                                "only interleaved-1f1b takes one")
    return func(p, m)

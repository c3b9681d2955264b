"""Placements by the names users type: `linear`, `interleaved:V`, `v` and `dualpipe` (core/ir.py builds
them), with the one rule a placement itself imposes on the rank count (DualPipe's even p)."""

from __future__ import annotations

from .errors import PreconditionError, ZbsearchError
from .ir import Placement, dualpipe, interleaved, linear, vshape

PLACEMENT_NAMES = "linear, interleaved:V, v, dualpipe, auto"
# What `auto` tries, and what it adds when the user allows a second parameter copy per rank.
AUTO_PLACEMENTS = ("linear", "v")
PARAM_COPY_PLACEMENTS = ("dualpipe",)


def even_ranks(p: int) -> str | None:
    """What p lacks for a placement of two directions (DualPipe's, Chimera's), or None.

    >>> even_ranks(4) is None, even_ranks(3)
    (True, 'p even (half the ranks lead each direction)')
    """
    return None if p % 2 == 0 else "p even (half the ranks lead each direction)"


def parse_placement(text: str, p: int) -> Placement:
    """`linear`, `interleaved:V` (V chunks per rank, looped), `v` (V-shape, 2 chunks per rank) or
    `dualpipe` (two model copies in opposite directions, 2 chunks per rank; p even)."""
    t = text.strip().lower()
    if t == "linear":
        return linear(p)
    if t in ("v", "v-shape", "vshape"):
        return vshape(p)
    if t == "dualpipe":
        need = even_ranks(p)
        if need:
            raise PreconditionError(f"placement 'dualpipe' needs {need}; got p={p}", subject="placement")
        return dualpipe(p)
    if t == "interleaved" or t.startswith("interleaved:"):
        _, _, v = t.partition(":")
        try:
            chunks = int(v) if v else 2
        except ValueError:
            chunks = 0
        if chunks < 1:
            raise ZbsearchError(f"placement {text!r} needs V >= 1 chunks per rank: write interleaved:V, "
                                "e.g. interleaved:2", subject="placement")
        return interleaved(p, chunks)
    raise ZbsearchError(f"placement {text!r} is not known: use one of {PLACEMENT_NAMES}", subject="placement")

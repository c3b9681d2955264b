"""GPipe: every rank runs all m forwards, then all m full backwards (in microbatch order).

Peak activation memory is m microbatches on every rank; the bubble is (p-1)(F + B + W) per rank.
"""

from __future__ import annotations

from ..core.ir import BW, F, Schedule, build, linear


def gpipe(p: int, m: int) -> Schedule:
    ranks = [[F(r, i) for i in range(m)] + [BW(r, i) for i in range(m)] for r in range(p)]
    return build("gpipe", linear(p), m, ranks)

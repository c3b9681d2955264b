"""1F1B (PipeDream-Flush, Megatron's non-interleaved schedule), with the backward not split.

Rank r: warm-up of min(p-r-1, m) forwards; steady state of alternating (F, full backward) pairs; drain of
the remaining full backwards. At most p-r microbatches are in flight on rank r, so peak activation
memory is p (on rank 0); the bubble is (p-1)(F + B + W) under uniform stages.
"""

from __future__ import annotations

from ..core.ir import BW, F, Schedule, build, linear


def one_f_one_b(p: int, m: int) -> Schedule:
    ranks = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        order = [F(r, i) for i in range(warmup)]                 # phase 1: warm-up forwards
        for i in range(m - warmup):                              # phase 2: one F, one full backward
            order += [F(r, warmup + i), BW(r, i)]
        order += [BW(r, i) for i in range(m - warmup, m)]        # phase 3: drain
        ranks.append(order)
    return build("1f1b", linear(p), m, ranks)

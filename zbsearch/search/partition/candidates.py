"""Candidate splits of a model's layers over the chunks of a placement: the named rules users know
(even, balanced) and the cheap variations the partition search starts from.

A split is `counts`: layers per route position (see core/partition.py). Every function here is pure
arithmetic on the layers' costs; scoring a split with real schedules is partition/search.py's job.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

from ...core.errors import PartitionError
from ...core.ir import Placement
from ...core.layers import Layer
from ...core.partition import check_chunk_counts, route_length
from ...profiling.partition import linear_partition

RULES = ("auto", "even", "balanced")


def even_counts(layers: Sequence[Layer], k: int) -> tuple[int, ...]:
    """The split users write by hand: the decoder blocks spread evenly over the k chunks (earlier
    chunks take the remainder), leading non-block layers (the embedding) with the first chunk and
    trailing ones (norm, head) with the last. Without kinds, all layers spread evenly."""
    lead = 0
    while lead < len(layers) and layers[lead].kind == "embedding":
        lead += 1
    tail = 0
    while tail < len(layers) - lead and layers[len(layers) - 1 - tail].kind == "output":
        tail += 1
    blocks = len(layers) - lead - tail
    if blocks < k:
        lead, tail, blocks = 0, 0, len(layers)
    base, extra = divmod(blocks, k)
    counts = [base + (1 if i < extra else 0) for i in range(k)]
    counts[0] += lead
    counts[-1] += tail
    return tuple(counts)


def balanced_counts(layers: Sequence[Layer], k: int) -> tuple[int, ...]:
    """The split that minimizes the heaviest chunk's F + B + W (exact DP): the profiler's rule."""
    return tuple(linear_partition([layer.work for layer in layers], k))


def rank_work(layers: Sequence[Layer], counts: Sequence[int], placement: Placement) -> list[float]:
    """F + B + W of one microbatch on each rank under a split (a rank's chunks on one route)."""
    prefix = [0.0]
    for layer in layers:
        prefix.append(prefix[-1] + layer.work)
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    route = placement.routes[0]
    work = [0.0] * placement.num_ranks
    for k, chunk in enumerate(route):
        work[placement.chunk_to_rank[chunk]] += prefix[bounds[k + 1]] - prefix[bounds[k]]
    return work


def neighbours(counts: Sequence[int]) -> list[tuple[int, ...]]:
    """Every split one boundary layer away: the last layer of a chunk moves to the next, or the
    first layer of a chunk to the previous, keeping every chunk non-empty."""
    out = []
    for i in range(len(counts) - 1):
        for delta in (-1, 1):
            moved = list(counts)
            moved[i] += delta
            moved[i + 1] -= delta
            if moved[i] >= 1 and moved[i + 1] >= 1:
                out.append(tuple(moved))
    return out


def transfers(counts: Sequence[int]) -> list[tuple[int, ...]]:
    """Every split one layer away along the route: one layer fewer in chunk i and one more in chunk
    j, every boundary between them shifted by one (between neighbours, a boundary move)."""
    out = []
    for i, j in itertools.permutations(range(len(counts)), 2):
        if counts[i] >= 2:
            moved = list(counts)
            moved[i] -= 1
            moved[j] += 1
            out.append(tuple(moved))
    return out


def rank_balanced(layers: Sequence[Layer], counts: Sequence[int], placement: Placement,
                  max_steps: int = 500) -> tuple[int, ...]:
    """Boundary moves that lower the heaviest rank's work (then the sum of squares), from `counts`:
    on a V or interleaved placement a rank's load is several chunks, which the chunk DP cannot see."""
    def key(c: Sequence[int]) -> tuple[float, float]:
        work = rank_work(layers, c, placement)
        return max(work), math.fsum(w * w for w in work)

    best, best_key = tuple(counts), key(counts)
    for _ in range(max_steps):
        moved = min(neighbours(best), key=key, default=None)
        if moved is None or key(moved) >= best_key:
            break
        best, best_key = moved, key(moved)
    return best


def memory_capped_counts(layers: Sequence[Layer], placement: Placement, caps: Sequence[float],
                         in_flight: Sequence[int]) -> tuple[int, ...] | None:
    """The split with the lightest heaviest chunk among those where every chunk's static bytes plus
    `in_flight[k]` microbatches of its activations fit `caps[k]` (exact DP); None when none does.
    The in-flight counts stand for a schedule family (1F1B holds p - r microbatches on rank r)."""
    n, k = len(layers), len(in_flight)
    work, static, mem = ([0.0] for _ in range(3))
    for layer in layers:
        work.append(work[-1] + layer.work)
        static.append(static[-1] + layer.static_bytes)
        mem.append(mem[-1] + layer.mem_B)

    def cost(pos: int, i: int, j: int) -> float:
        need = static[j] - static[i] + in_flight[pos] * (mem[j] - mem[i])
        return work[j] - work[i] if need <= caps[pos] else math.inf

    best = [[math.inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for pos in range(k):
        for j in range(pos + 1, n - (k - pos - 1) + 1):
            for i in range(pos, j):
                if best[pos][i] < math.inf:
                    val = max(best[pos][i], cost(pos, i, j))
                    if val < best[pos + 1][j]:
                        best[pos + 1][j], cut[pos + 1][j] = val, i
    if math.isinf(best[k][n]):
        return None
    counts, j = [], n
    for pos in range(k, 0, -1):
        i = cut[pos][j]
        counts.append(j - i)
        j = i
    return tuple(reversed(counts))


def parse_rule(text: str, layers: Sequence[Layer], placement: Placement) -> tuple[str, tuple[int, ...] | None]:
    """(rule, counts) from `auto`, `even`, `balanced` or `fixed:N1,N2,...` (layers per chunk in route
    order); counts is None for auto."""
    t = text.strip().lower()
    k = route_length(placement)
    if t == "auto":
        return "auto", None
    if t == "even":
        return "even", check_chunk_counts(even_counts(layers, k), len(layers), placement)
    if t == "balanced":
        if len(layers) < k:
            check_chunk_counts([1] * k, len(layers), placement)  # raises: more chunks than layers
        return "balanced", balanced_counts(layers, k)
    if t.startswith("fixed:"):
        try:
            counts = [int(x) for x in t[len("fixed:"):].split(",")]
        except ValueError:
            raise PartitionError(f"partition {text!r}: write fixed: and whole numbers of layers per chunk in route "
                                 "order, e.g. fixed:5,4,4,5", subject="partition") from None
        return "fixed", check_chunk_counts(counts, len(layers), placement)
    raise PartitionError(f"partition {text!r} is not known: use auto, even, balanced or fixed:N1,N2,...",
                         subject="partition")

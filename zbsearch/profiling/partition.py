"""Split a chain of layers into contiguous pipeline stages: the linear partition problem.

Given per-layer costs c_0..c_{n-1} and p stages, choose p non-empty contiguous groups that minimize
the largest group cost (the slowest stage sets the pipeline's pace). Optional fixed extras are added to
the first and the last group: the profiler uses them to pin the embedding to the first stage and the
output layer and loss to the last, while the DP places the transformer blocks.

The solution is exact: dynamic programming over prefixes, O(p n^2) time, which is instant for any
real layer count. Among equally good splits the first one found is kept, so the answer is deterministic.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..core.errors import PartitionError
from .request import bad_input


def stage_costs(costs: Sequence[float], counts: Sequence[int], first_extra: float = 0.0,
                last_extra: float = 0.0) -> list[float]:
    """Cost of each stage when the layers are split into groups of `counts` layers, in order."""
    out: list[float] = []
    start = 0
    for k, c in enumerate(counts):
        out.append(float(sum(costs[start:start + c])))
        start += c
    if out:
        out[0] += first_extra
        out[-1] += last_extra
    return out


def check_stage_counts(counts: Sequence[int], n: int, p: int | None = None) -> list[int]:
    """Validate a forced split: positive counts adding up to n (and p of them when p is given).

    Raises
    ------
    PartitionError
        A count is not a positive integer, the counts do not add up to n, or there are not p of them.

    Examples
    --------
    >>> check_stage_counts([3, 3, 2], 8)
    [3, 3, 2]
    """
    counts = list(counts)
    given = ",".join(map(str, counts))
    if not counts or any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in counts):
        raise bad_input(PartitionError, f"layers per stage {given}: every stage needs a positive whole number "
                        "of layers, e.g. 3,3,2", "layers_per_stage")
    if sum(counts) != n:
        raise bad_input(PartitionError, f"layers per stage {given} add up to {sum(counts)} layers but the model "
                        f"has {n}: make the counts add up to {n}", "layers_per_stage")
    if p is not None and len(counts) != p:
        raise bad_input(PartitionError, f"layers per stage {given} make {len(counts)} stages but {p} stages were "
                        f"asked for: give {p} counts, or no stage count", "layers_per_stage", "stages")
    return counts


def linear_partition(costs: Sequence[float], p: int, first_extra: float = 0.0,
                     last_extra: float = 0.0) -> list[int]:
    """Layers per stage minimizing the largest stage cost, exactly.

    Parameters
    ----------
    costs
        Non-negative cost of each layer, in chain order.
    p
        Number of stages; every stage gets at least one layer, so 1 <= p <= len(costs).
    first_extra, last_extra
        Fixed costs added to the first and the last stage (with p = 1, both to the only stage).

    Returns
    -------
    list[int]
        p positive counts adding up to len(costs).

    Raises
    ------
    PartitionError
        p is out of range or a cost is negative or not finite.

    Examples
    --------
    >>> linear_partition([1, 1, 1, 1, 4], 2)
    [4, 1]
    >>> linear_partition([3, 1, 1, 1], 2, first_extra=2)
    [1, 3]
    """
    n = len(costs)
    if not isinstance(p, int) or isinstance(p, bool) or not 1 <= p <= n:
        raise PartitionError(f"cannot split {n} layers into {p} stages: every stage needs at least one layer, "
                            f"so use 1 <= p <= {n}")
    if any(not math.isfinite(c) or c < 0 for c in costs):
        raise PartitionError("layer costs must be finite and non-negative")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))

    def group(i: int, j: int) -> float:  # layers i..j-1
        return prefix[j] - prefix[i]

    # best[k][j]: the smallest possible largest stage cost when the first j layers form stages 0..k
    # (stage 0 carries first_extra; the last stage's extra is added when the final stage closes).
    inf = math.inf
    best = [[inf] * (n + 1) for _ in range(p)]
    cut = [[0] * (n + 1) for _ in range(p)]
    for j in range(1, n + 1):
        best[0][j] = first_extra + group(0, j)
    for k in range(1, p):
        last = k == p - 1
        for j in range(k + 1, n + 1):
            if last and j != n:
                continue
            extra = last_extra if last else 0.0
            for i in range(k, j):  # stage k holds layers i..j-1
                val = max(best[k - 1][i], group(i, j) + extra)
                if val < best[k][j]:
                    best[k][j], cut[k][j] = val, i
    counts: list[int] = []
    j = n
    for k in range(p - 1, 0, -1):
        i = cut[k][j]
        counts.append(j - i)
        j = i
    counts.append(j)
    counts.reverse()
    return counts


def max_stage_cost(costs: Sequence[float], counts: Sequence[int], first_extra: float = 0.0,
                   last_extra: float = 0.0) -> float:
    """The largest stage cost of a split (with p = 1 both extras land on the single stage)."""
    return max(stage_costs(costs, counts, first_extra, last_extra))

"""Time of the collectives a run's parallel groups perform, over a `cluster.Link`: the alpha-beta model.

A collective over n GPUs on a ring takes some number of steps, each paying the link's start-up latency
(alpha, `Link.latency_us`), and moves a volume of bytes per GPU at the link's achieved bandwidth (beta,
`Link.bytes_per_us`). The ring algorithms and their volumes per GPU are Thakur, Rabenseifner and Gropp,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), 2005, section 4 (ring
all-gather: n - 1 steps, each GPU sends (n - 1)/n of the gathered bytes; reduce-scatter the same;
all-reduce as a reduce-scatter then an all-gather, 2(n - 1) steps and 2(n - 1)/n of the bytes). NCCL
states the same factors as the ratio of bus to algorithm bandwidth (nccl-tests, doc/PERFORMANCE.md:
busBw = algBw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather, reduce-scatter and all-to-all), so a
link's bandwidth here is a bus bandwidth. An all-to-all moves (n - 1)/n of each GPU's buffer (the share
it keeps stays), in n - 1 pairwise steps. A point-to-point message is one step: latency + bytes / bandwidth.

`nbytes` is the whole tensor: the gathered output of an all-gather, the input of a reduce-scatter or
all-reduce, the send buffer of an all-to-all. One GPU (n = 1) or no bytes cost nothing (no collective is
issued). Times in microseconds.
"""

from __future__ import annotations

import math

from ...core.errors import PlanError
from .cluster import Link

CITATION = ("ring collectives: Thakur, Rabenseifner and Gropp, IJHPCA 2005, section 4; bus-bandwidth factors: "
            "nccl-tests doc/PERFORMANCE.md")


def _steps_and_volume(n: int, nbytes: float, factor: float, what: str) -> tuple[int, float]:
    """(n - 1, factor x (n - 1)/n x nbytes), checked: n a whole number of GPUs, bytes not negative."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise PlanError(f"{what} over {n!r} GPUs: give a whole number of GPUs >= 1")
    if not (math.isfinite(nbytes) and nbytes >= 0):
        raise PlanError(f"{what} of {nbytes!r} bytes: give a non-negative size")
    return n - 1, factor * (n - 1) / n * nbytes


def _time(link: Link, steps: int, volume: float) -> float:
    """Nothing to move (one GPU, or no bytes) is no collective at all."""
    return steps * link.latency_us + volume / link.bytes_per_us if steps and volume else 0.0


def all_reduce(nbytes: float, n: int, link: Link) -> float:
    """Ring all-reduce: 2(n - 1) steps, 2(n - 1)/n x nbytes per GPU.

    >>> from .cluster import NVLINK4
    >>> all_reduce(1e6, 1, NVLINK4), round(all_reduce(1e6, 2, NVLINK4), 3)
    (0.0, 22.778)
    """
    steps, volume = _steps_and_volume(n, nbytes, 2.0, "all-reduce")
    return _time(link, 2 * steps, volume)


def all_gather(nbytes: float, n: int, link: Link) -> float:
    """Ring all-gather of a tensor of `nbytes` (gathered): n - 1 steps, (n - 1)/n x nbytes per GPU."""
    steps, volume = _steps_and_volume(n, nbytes, 1.0, "all-gather")
    return _time(link, steps, volume)


def reduce_scatter(nbytes: float, n: int, link: Link) -> float:
    """Ring reduce-scatter of a tensor of `nbytes` (before scattering): as an all-gather."""
    steps, volume = _steps_and_volume(n, nbytes, 1.0, "reduce-scatter")
    return _time(link, steps, volume)


def all_to_all(nbytes: float, n: int, link: Link) -> float:
    """All-to-all of a send buffer of `nbytes` per GPU: n - 1 pairwise steps, (n - 1)/n x nbytes leave it."""
    steps, volume = _steps_and_volume(n, nbytes, 1.0, "all-to-all")
    return _time(link, steps, volume)


def point_to_point(nbytes: float, link: Link) -> float:
    """One message: the link's latency + nbytes / its bandwidth."""
    _, volume = _steps_and_volume(2, nbytes, 2.0, "message")  # (2 - 1)/2 x 2: the bytes themselves
    return _time(link, 1, volume)

"""partition/leaf.py: a split's own bound rank by rank (RankCache). Asking again costs no problem build; a
split whose ranks were all bounded in other splits costs none either and gets its whole problem's bound;
hops that follow the cut, or two routes, turn the cache off; a split with no schedule is inf.
hops_uniform decides whether hops depend on the cut."""

from __future__ import annotations

import math
import random
from typing import Any, Sequence

import pytest

from zbsearch.core.errors import InfeasibleError
from zbsearch.core.ir import Placement, dualpipe, linear, vshape
from zbsearch.core.memory import DEFAULT_HEADROOM, parse_mem_limit
from zbsearch.core.partition import partition_profile
from zbsearch.core.profile import Profile
from zbsearch.search.bounds.analytic import objective_bound, rank_bounds
from zbsearch.search.bounds.relaxations import bound_passes
from zbsearch.search.partition.leaf import RankCache, hops_uniform
from zbsearch.search.problem import Problem

GiB = 2.0**30


def _profile(n: int, seed: int, *, out_bytes: Sequence[float] | None = None, **extra: Any) -> Profile:
    rng = random.Random(seed)
    layers = [{"name": f"layers.{i}", "F": rng.randint(1, 3), "B": rng.randint(1, 4), "W": rng.randint(1, 2),
               "mem_B": rng.choice([1, 2]) * GiB, "mem_W": GiB / 2, "static_bytes": rng.choice([1, 2]) * GiB,
               "out_bytes": 1.0 if out_bytes is None else out_bytes[i]} for i in range(n)]
    stages = [{"F": 1, "B": 1, "W": 1, "mem_B": GiB, "mem_W": GiB}] * 2  # two stages: the comm is one hop
    return Profile.from_dict({"name": "toy", "stages": stages, "microbatches": 4, "memory_unit": "bytes",
                              "comm": 0.5, "layers": layers, **extra,
                              "source": {"kind": "estimated", "method": "leaf tests"}})


class Builds:
    """The problem of a split, as the partition search builds it, counting the builds."""

    def __init__(self, profile: Profile, mem_limit: str | None, objective: str = "makespan") -> None:
        self.profile, self.mem_limit, self.objective, self.calls = profile, mem_limit, objective, 0

    def __call__(self, placement: Placement, counts: Sequence[int]) -> Problem:
        self.calls += 1
        prof = partition_profile(self.profile, placement, counts)
        limit = parse_mem_limit(self.mem_limit, prof, placement, headroom=DEFAULT_HEADROOM)
        return Problem(prof, placement, self.profile.microbatches, limit, self.objective)

    def whole(self, placement: Placement, counts: Sequence[int]) -> float:
        """The split's bound from its whole problem, without the chain walk and the nesting."""
        problem = self(placement, counts)
        return objective_bound(rank_bounds(problem, bound_passes(problem), chains=False, nesting=False),
                               problem.objective)


@pytest.mark.parametrize("out_bytes,bandwidth,uniform", [
    ([1.0, 2.0, 3.0, 4.0], None, True),  # no bandwidth: the profile's comm, whatever the cut
    ([2.0, 2.0, 2.0, 9.0], 2.0, True),  # every cut carries 2 bytes (the last layer's output crosses none)
    ([1.0, 2.0, 2.0, 2.0], 2.0, False),  # a cut after layer 0 is cheaper than the others
])
def test_hops_are_uniform_when_every_cut_costs_the_same(out_bytes: list[float], bandwidth: float | None,
                                                       uniform: bool) -> None:
    extra = {} if bandwidth is None else {"link_bandwidth": bandwidth}
    assert hops_uniform(_profile(4, 0, out_bytes=out_bytes, **extra)) is uniform


@pytest.mark.parametrize("placement,counts", [(linear(3), (2, 2, 2)), (vshape(2), (1, 2, 2, 1))], ids=["linear", "v"])
def test_a_split_asked_again_costs_no_build(placement: Placement, counts: tuple[int, ...]) -> None:
    builds = Builds(_profile(6, 1), "24GiB")
    cache = RankCache(builds.profile, builds)
    first = cache.bound(placement, counts, False)
    assert builds.calls == 1
    assert cache.bound(placement, counts, False) == first and builds.calls == 1
    assert first == pytest.approx(builds.whole(placement, counts))


@pytest.mark.parametrize("limit", ["24GiB", None])
@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_a_split_made_of_ranks_seen_in_other_splits_is_a_lookup(limit: str | None, objective: str) -> None:
    # Linear on 4 ranks, 6 layers. (1, 2, 1, 2) has ranks 0-1 on layers 0 and 1-2; (2, 1, 2, 1) ranks 2-3
    # on layers 3-4 and 5. (1, 2, 2, 1) is those four ranks: no build, and its whole problem's bound.
    builds = Builds(_profile(6, 2), limit, objective)
    cache = RankCache(builds.profile, builds)
    for counts in ((1, 2, 1, 2), (2, 1, 2, 1)):
        cache.bound(linear(4), counts, False)
    assert builds.calls == 2
    assembled = cache.bound(linear(4), (1, 2, 2, 1), False)
    assert builds.calls == 2
    assert assembled == pytest.approx(builds.whole(linear(4), (1, 2, 2, 1)), rel=1e-12)
    # With the chain walk the ranks are not walked yet (one chunk each: walked means bounded with it):
    # the split is bounded whole once, then looked up.
    calls = builds.calls
    walked = cache.bound(linear(4), (1, 2, 2, 1), True)
    assert builds.calls == calls + 1 and walked >= assembled * (1 - 1e-12)
    assert cache.bound(linear(4), (1, 2, 2, 1), True) == walked and builds.calls == calls + 1


def test_hops_that_follow_the_cut_build_every_split_every_time() -> None:
    builds = Builds(_profile(5, 3, out_bytes=[1.0, 2.0, 3.0, 4.0, 5.0], link_bandwidth=2.0), None)
    cache = RankCache(builds.profile, builds)
    assert not cache.exact
    first = cache.bound(linear(2), (2, 3), False)
    assert cache.bound(linear(2), (2, 3), False) == first and builds.calls == 2
    assert not cache.ranks


def test_two_routes_build_every_split_every_time() -> None:
    builds = Builds(_profile(5, 4), "2p")
    cache = RankCache(builds.profile, builds)
    assert cache.exact  # the hops are uniform, but DualPipe's ranks each hold a chunk of both routes
    first = cache.bound(dualpipe(2), (2, 3), False)
    assert cache.bound(dualpipe(2), (2, 3), False) == first and builds.calls == 2
    assert first == pytest.approx(builds.whole(dualpipe(2), (2, 3)))


def test_a_split_with_no_schedule_is_inf() -> None:
    # Under 6 GiB a rank holding 3 layers carries at least 3 GiB of static bytes and 3 GiB of mem_B.
    builds = Builds(_profile(6, 5), "6GiB")
    cache = RankCache(builds.profile, builds)
    assert cache.bound(linear(2), (3, 3), False) == math.inf
    assert any(math.isinf(entry.plain) for entry in cache.ranks.values())  # the short rank is remembered
    assert cache.bound(linear(3), (2, 2, 2), False) < math.inf

    def refuse(placement: Placement, counts: Sequence[int]) -> Problem:
        raise InfeasibleError("no room for the static bytes")

    assert RankCache(builds.profile, refuse).bound(linear(2), (3, 3), True) == math.inf


def test_a_ranks_bound_is_the_same_whichever_split_first_met_it() -> None:
    """The cache's order does not matter: every split of V on 2 ranks bounded in one order and in the
    reverse order gives the same bounds."""
    builds = Builds(_profile(6, 6), "12GiB")  # some splits fit, some do not
    splits = [(a, b, c, 6 - a - b - c) for a in range(1, 4) for b in range(1, 4) for c in range(1, 4) if a + b + c < 6]
    one, other = RankCache(builds.profile, builds), RankCache(builds.profile, builds)
    ahead = {c: one.bound(vshape(2), c, False) for c in splits}
    behind = {c: other.bound(vshape(2), c, False) for c in reversed(splits)}
    assert ahead == pytest.approx(behind)
    assert any(math.isinf(b) for b in ahead.values()) and any(b < math.inf for b in ahead.values())

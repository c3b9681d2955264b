"""Property tests: on random profiles, every registered generator validates and the simulator's
timeline respects every dependency, every rank's program order and the profile's pass costs."""

from __future__ import annotations

import math

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zbsearch.core.errors import PreconditionError
from zbsearch.core.ir import Kind
from zbsearch.core.profile import Profile
from zbsearch.schedules import REGISTRY, generate
from zbsearch.sim.validate import dependency_graph, validate

EPS = 1e-7

# Every registered schedule: a generator whose module is missing fails here instead of dropping out.
SCHEDULES = sorted(REGISTRY)

time = st.floats(0.05, 5.0, allow_nan=False, allow_infinity=False)


@st.composite
def stage(draw):
    F, B, W = draw(time), draw(time), draw(st.one_of(st.just(0.0), time))
    mem_B = draw(st.floats(0.1, 4.0))
    raw = {"F": F, "B": B, "W": W, "mem_B": mem_B, "mem_W": mem_B * draw(st.floats(0.0, 1.0))}
    if draw(st.booleans()):
        raw["full_backward"] = draw(time)          # a fused backward that is not just B + W
    return raw


@st.composite
def cases(draw, dualpipe_sizes: bool = False):
    if dualpipe_sizes:
        # DualPipe needs p even and m even with m >= 2p.
        p = draw(st.sampled_from([2, 4, 6]))
        m = draw(st.sampled_from([x for x in range(2 * p, 13) if x % 2 == 0]))
    else:
        p = draw(st.integers(1, 6))
        # Often m = 2p when that fits: DualPipeV needs m >= 2p.
        m = draw(st.one_of(st.integers(1, 12), st.just(min(2 * p, 12))))
    data = {
        "name": "random",
        "stages": [draw(stage()) for _ in range(p)],
        "comm": [draw(st.floats(0.0, 2.0)) for _ in range(p - 1)],
        "source": {"kind": "estimated", "method": "hypothesis"},
    }
    if draw(st.booleans()):
        # Per-chunk costs for the 2-chunks-per-rank placements (V-shape, DualPipe, interleaved v=2).
        data["chunks"] = [draw(stage()) for _ in range(2 * p)]
    chunks = draw(st.integers(1, 3))               # for interleaved-1f1b
    return p, m, Profile.from_dict(data), chunks


def expected_cost(profile: Profile, placement, action) -> float:
    """A pass's time straight from the profile: the chunk's own entry when the profile has one per
    chunk of this placement, else the rank's stage split over the rank's chunks on the same route."""
    if action.kind is Kind.OVERLAP:
        return sum(expected_cost(profile, placement, a) for a in action.pair)
    c = action.chunk
    if profile.chunks is not None and len(profile.chunks) == placement.num_chunks:
        cost, share = profile.chunks[c], 1.0
    else:
        rank = placement.chunk_to_rank[c]
        route = next(r for r in placement.routes if c in r)
        share = 1.0 / sum(1 for x in route if placement.chunk_to_rank[x] == rank)
        cost = profile.stages[rank]
    full = cost.full_backward if cost.full_backward is not None else cost.B + cost.W
    return share * {Kind.F: cost.F, Kind.B: cost.B, Kind.W: cost.W, Kind.FULL_B: full}[action.kind]


def check_timeline(sched, profile: Profile) -> None:
    tl = validate(sched, profile)
    p = sched.num_ranks
    slot = {}
    for r in range(p):
        slots = tl.slots[r]
        # Every action runs once, in program order, without overlapping the one before.
        assert [s.action for s in slots] == list(sched.ranks[r])
        assert [s.index for s in slots] == list(range(len(sched.ranks[r])))
        for prev, cur in zip(slots, slots[1:]):
            assert cur.start >= prev.end - EPS
        work = 0.0
        for s in slots:
            assert s.rank == r and s.start >= 0
            cost = expected_cost(profile, sched.placement, s.action)
            assert s.end - s.start == pytest.approx(cost, rel=1e-9, abs=1e-9)
            work += cost
            slot[(r, s.index)] = s
        assert tl.work(r) == pytest.approx(work, rel=1e-9, abs=1e-9)

    # Every data dependency is respected, with its hop time.
    g = dependency_graph(sched, profile)
    assert set(g.nodes) == set(slot)
    n_data = 0
    for u, v, d in g.edges(data=True):
        if d["kind"] == "data":
            n_data += 1
            assert slot[v].start >= slot[u].end + d["weight"] - EPS, (slot[u], slot[v], d)
            assert d["weight"] >= 0
        else:
            assert u[0] == v[0] and v[1] == u[1] + 1
            assert slot[v].start >= slot[u].end - EPS
    # Each backward and W pass has at least its own chunk's F (or B) as an input.
    assert n_data >= sum(1 for r in range(p) for a in sched.passes(r) if a.kind is not Kind.F)

    # As soon as possible: each pass starts exactly at its earliest time on the graph.
    earliest = {}
    for v in nx.topological_sort(g):
        earliest[v] = max((earliest[u] + (slot[u].end - slot[u].start) + d["weight"]
                           for u, _, d in g.in_edges(v, data=True)), default=0.0)
        assert slot[v].start == pytest.approx(earliest[v], rel=1e-9, abs=1e-9)

    # Summary numbers are consistent.
    assert tl.makespan == pytest.approx(max(s.end for s in slot.values()))
    assert tl.span <= tl.makespan + EPS
    assert -EPS <= tl.bubble_rate_makespan < 1
    assert -EPS <= tl.bubble_rate_span <= tl.bubble_rate_makespan + EPS

    # Memory: never negative, all freed at the end, never above everything the rank ever allocates.
    for r in range(p):
        levels = [lvl for _, lvl, _ in tl.memory[r]]
        allocated = sum(
            (profile.chunk_cost(sched.placement, a.chunk).mem_B for a in sched.passes(r) if a.kind is Kind.F), 0.0)
        assert min(levels, default=0.0) >= -1e-9
        assert levels[-1] == pytest.approx(0.0, abs=1e-9)
        assert tl.peak_memory(r) <= allocated + 1e-9
        times = [t for t, _, _ in tl.memory[r]]
        assert times == sorted(times)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(cases(), cases(dualpipe_sizes=True)))
def test_generators_validate_and_timing_respects_dependencies(case):
    p, m, profile, chunks = case
    ran = 0
    for name in SCHEDULES:
        try:
            if REGISTRY[name].takes_chunks:
                sched = generate(name, p, m, chunks)
            else:
                sched = generate(name, p, m)
        except PreconditionError:
            continue
        assert sched.num_ranks == p and sched.num_microbatches == m
        check_timeline(sched, profile)
        ran += 1
    # GPipe and 1F1B are defined for every p and m.
    assert ran >= 2


@settings(max_examples=25, deadline=None)
@given(cases())
def test_rank_work_is_m_stages_without_chunk_costs(case):
    """Without per-chunk costs each rank does m whole stages of work whatever the placement: every
    microbatch visits the rank's chunks on its route, which split the stage between them."""
    p, m, profile, chunks = case
    if profile.chunks is not None:
        profile = Profile.from_dict({**profile.to_dict(), "chunks": None})
    for name in SCHEDULES:
        try:
            sched = generate(name, p, m, chunks) if REGISTRY[name].takes_chunks else generate(name, p, m)
        except PreconditionError:
            continue
        tl = validate(sched, profile)
        for r in range(p):
            st_ = profile.stages[r]
            full = st_.full_backward if st_.full_backward is not None else st_.B + st_.W
            share_full = sum(sched.placement.share(a.chunk) for a in sched.passes(r) if a.kind is Kind.FULL_B)
            expect = m * (st_.F + st_.B + st_.W) + share_full * (full - st_.B - st_.W)
            assert tl.work(r) == pytest.approx(expect, rel=1e-9), (name, r)
            # And the memory every rank allocates over the iteration is m whole-stage M_B.
            alloc = sum(sched.placement.share(a.chunk) for a in sched.passes(r) if a.kind is Kind.F)
            assert alloc == pytest.approx(m), (name, r)
        assert not math.isnan(tl.makespan)

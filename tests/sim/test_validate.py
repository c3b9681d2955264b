"""The validator: every registered generator passes it, and each kind of broken schedule is refused
with a message that names the problem."""

from __future__ import annotations

import pytest

from zbsearch.core.errors import PreconditionError, ScheduleError
from zbsearch.core.ir import BW, Action, B, F, Kind, W, build, dualpipe, linear, overlap, vshape
from zbsearch.core.memory import MemoryLimit, parse_mem_limit
from zbsearch.core.profile import Profile, uniform_profile
from zbsearch.schedules import REGISTRY, generate
from zbsearch.sim.simulate import simulate
from zbsearch.sim.validate import check, check_structure, dependency_graph, validate

# (p, m) pairs tried in order until the generator accepts one.
CANDIDATES = [(4, 8), (4, 16), (2, 8), (4, 12), (6, 12), (8, 16), (3, 9), (2, 4)]

# Published peak activation memory on the rank that needs the most, in whole-stage M_B, uniform stages
# (schedules.md, zb-paper.md). Only the closed forms stated exactly are checked.
EXACT_PEAK = {
    "gpipe": lambda p, m: m,
    "1f1b": lambda p, m: p,
    "zb-h1": lambda p, m: p,
    "zb-h2": lambda p, m: 2 * p - 1,
}


def _generate_any(name: str):
    refused = []
    for p, m in CANDIDATES:
        try:
            return generate(name, p, m), p, m
        except PreconditionError as exc:
            refused.append(f"(p={p}, m={m}): {exc}")
    pytest.fail(f"{name} accepts none of {CANDIDATES}: " + "; ".join(refused))


def _uneven(p: int) -> Profile:
    return Profile.from_dict({
        "name": "uneven",
        "stages": [{"F": 1 + 0.25 * s, "B": 1.5 + 0.5 * (s % 2), "W": 0.75 + 0.125 * s,
                    "mem_B": 1 + s, "mem_W": 0.5 + 0.25 * s} for s in range(p)],
        "comm": [0.1 * (s + 1) for s in range(p - 1)],
        "source": {"kind": "estimated", "method": "test"},
    })


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_generator_validates(name):
    sched, p, m = _generate_any(name)
    assert sched.num_ranks == p and sched.num_microbatches == m
    assert check_structure(sched) == []
    assert validate(sched) is None                       # structure and acyclicity only
    for prof in (uniform_profile(1, 1, 1, p=p, m=m), uniform_profile(1, 2, 0.5, 0.1, p=p, m=m), _uneven(p)):
        tl = validate(sched, prof)
        assert tl is not None and tl.makespan > 0
        # Within the schedule's own peak, the memory check passes too.
        peaks = tuple(tl.peak_memory(r) for r in range(p))
        assert validate(sched, prof, MemoryLimit("peak", peaks)) is not None
        # Every activation allocated is freed by the end.
        for r in range(p):
            assert tl.memory[r][-1][1] == pytest.approx(0, abs=1e-9)
    if name in EXACT_PEAK:
        tl = validate(sched, uniform_profile(1, 1, 1, p=p, m=m))
        peak = max(tl.peak_memory(r) for r in range(p))
        assert peak == pytest.approx(EXACT_PEAK[name](p, m))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_generators_validate_on_small_cases(name):
    tried = 0
    for p in (1, 2, 3, 4):
        for m in (1, 2, 3, 4, 5, 8):
            try:
                sched = generate(name, p, m)
            except PreconditionError:
                continue
            tried += 1
            validate(sched, _uneven(p))
    assert tried, f"{name} accepted no (p, m) with p <= 4 and m <= 8"


# -- mutations of a known-good schedule ---------------------------------------------------------

P, M = 4, 8


def split_1f1b(p: int = P, m: int = M) -> list[list[Action]]:
    """1F1B with every full backward split into I then W: a valid split-backward schedule."""
    out = []
    for rank in generate("1f1b", p, m).ranks:
        order = []
        for a in rank:
            order += [B(a.chunk, a.microbatch), W(a.chunk, a.microbatch)] if a.kind is Kind.FULL_B else [a]
        out.append(order)
    return out


def sched(ranks, m: int = M, placement=None):
    return build("mutant", placement or linear(len(ranks)), m, ranks)


PROFILE = uniform_profile(1, 1, 1, p=P, m=M)


def refused(schedule, profile=PROFILE, limit=None) -> str:
    report = check(schedule, profile, limit)
    assert not report.ok
    with pytest.raises(ScheduleError) as info:
        validate(schedule, profile, limit)
    msg = str(info.value)
    assert msg.startswith("schedule 'mutant' is invalid: ")
    return msg


def test_base_schedule_is_valid():
    tl = validate(sched(split_1f1b()), PROFILE)
    assert tl.peak_memory(0) == pytest.approx(P)


def test_dropped_w_is_refused():
    ranks = split_1f1b()
    ranks[2].remove(W(2, 5))
    msg = refused(sched(ranks))
    assert "chunk 2 microbatch 5 has 1 input backwards (I) and 0 weight backwards (W)" in msg


def test_duplicated_f_is_refused():
    ranks = split_1f1b()
    ranks[1].insert(3, F(1, 0))
    msg = refused(sched(ranks))
    assert "chunk 1 microbatch 0 has 2 forwards (F)" in msg


def test_missing_f_is_refused():
    ranks = split_1f1b()
    ranks[3].remove(F(3, 7))
    assert "chunk 3 microbatch 7 has 0 forwards (F)" in refused(sched(ranks))


def test_full_backward_mixed_with_split_is_refused():
    ranks = split_1f1b()
    ranks[0].append(BW(0, 4))
    msg = refused(sched(ranks))
    assert "chunk 0 microbatch 4 has 1 full backwards (B) and 1 I, 1 W" in msg


def test_backward_before_its_own_forward_is_refused():
    ranks = split_1f1b()
    last = ranks[P - 1]
    assert last[:2] == [F(3, 0), B(3, 0)]
    last[0], last[1] = last[1], last[0]
    msg = refused(sched(ranks))
    assert "rank 3 runs a pass before its own input" in msg
    assert "3I0 (rank 3, step 0)" in msg and "3F0 (rank 3, step 1)" in msg


def test_w_before_its_b_is_refused():
    ranks = split_1f1b()
    i, j = ranks[1].index(B(1, 2)), ranks[1].index(W(1, 2))
    ranks[1][i], ranks[1][j] = ranks[1][j], ranks[1][i]
    msg = refused(sched(ranks))
    assert "rank 1 runs a pass before its own input" in msg and "1W2" in msg and "1I2" in msg


def test_action_on_the_wrong_rank_is_refused():
    ranks = split_1f1b()
    ranks[1].remove(W(1, 0))
    ranks[0].append(W(1, 0))
    msg = refused(sched(ranks))
    assert "1W0 (rank 0, step" in msg and "runs chunk 1, which lives on rank 1" in msg


def test_cross_rank_cycle_is_a_deadlock():
    # Rank 0 asks for 0I0 (which needs 1I0) before it sends 0F1; rank 1 runs 1I0 only after 1F1,
    # which needs 0F1: rank 0 waits on rank 1, which waits on rank 0.
    ranks = split_1f1b()
    ranks[0].remove(B(0, 0))
    ranks[0].insert(1, B(0, 0))
    msg = refused(sched(ranks))
    assert "deadlock" in msg
    assert "(rank 0, step" in msg and "(rank 1, step" in msg
    assert "0I0 (rank 0, step 1)" in msg or "0F1 (rank 0, step 2)" in msg
    # The simulator agrees, and names where each rank is stuck.
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(sched(ranks), PROFILE)


def test_cycle_is_found_without_a_profile():
    ranks = split_1f1b()
    ranks[0].remove(B(0, 0))
    ranks[0].insert(1, B(0, 0))
    report = check(sched(ranks))
    assert not report.ok and "deadlock" in report.problems[0] and report.timeline is None


def test_memory_limit_exceeded_names_rank_time_and_action():
    msg = refused(sched(split_1f1b()), PROFILE, parse_mem_limit("0.99p", PROFILE))
    # Rank 0 holds 4 microbatches once 0F3 starts at time 3; the limit is 3.96.
    assert "rank 0 holds 4 x its stage M_B at time 3 after 0F3" in msg
    assert "0.99p" in msg
    # Ranks 1..3 peak at 3, 2.5 (3 + W releases), ... all under 3.96: only rank 0 is named.
    assert "rank 1" not in msg


def test_memory_limit_exactly_at_the_peak_is_accepted_just_below_refused():
    # mem_B = 0.1 makes the running sums inexact in binary: the check must still accept the exact peak.
    prof = uniform_profile(1, 1, 1, p=P, m=M, mem_B=0.1, mem_W=0.03)
    s = sched(split_1f1b())
    tl = validate(s, prof)
    peaks = [tl.peak_memory(r) for r in range(P)]
    assert peaks[0] == pytest.approx(0.4)
    assert validate(s, prof, parse_mem_limit("1p", prof)) is not None
    assert validate(s, prof, MemoryLimit("peak", tuple(peaks))) is not None
    for r in range(P):
        below = list(peaks)
        below[r] = peaks[r] * (1 - 1e-6)
        msg = refused(s, prof, MemoryLimit("below", tuple(below)))
        assert f"rank {r} holds" in msg
        assert sum(f"rank {q} holds" in msg for q in range(P)) == 1


def test_memory_limit_per_rank_on_uneven_profile():
    prof = _uneven(P)
    s = sched(split_1f1b())
    tl = validate(s, prof)
    # Rank r holds p - r microbatches of its own mem_B at most: exactly 1p on rank 0.
    for r in range(P):
        assert tl.peak_memory(r) == pytest.approx((P - r) * (1 + r))
    validate(s, prof, parse_mem_limit("1p", prof))
    msg = refused(s, prof, parse_mem_limit("0.7p", prof))
    assert "rank 0 holds 3 x its stage M_B at time 2 after 0F2" in msg
    assert "rank 2" not in msg and "rank 3" not in msg
    assert "rank 1 holds 3 x its stage M_B" in msg and "after 1F2" in msg


@pytest.mark.parametrize("bad, text", [
    (F(0, M), f"0F{M} (rank 0, step 24) names microbatch {M}; microbatches are 0..{M - 1}"),
    (Action(0, Kind.F, -1), "names microbatch -1"),
    (W(0, 100), "names microbatch 100"),
    (F(9, 0), "names chunk 9; chunks are 0..3"),
])
def test_out_of_range_is_refused(bad, text):
    ranks = split_1f1b()
    ranks[0].append(bad)
    assert text in refused(sched(ranks))


def test_chunk_off_the_microbatch_route_is_refused():
    # DualPipe p=2, m=2: microbatch 0 takes chunks 0, 1; microbatch 1 takes chunks 2, 3.
    good = [
        [F(0, 0), overlap(F(3, 1), B(0, 0)), B(3, 1), W(0, 0), W(3, 1)],
        [F(2, 1), F(1, 0), B(1, 0), B(2, 1), W(1, 0), W(2, 1)],
    ]
    validate(build("mutant", dualpipe(2), 2, good), uniform_profile(1, 1, 1, p=2, m=2))
    bad = [list(r) for r in good]
    bad[1].append(F(2, 0))
    assert "microbatch 0 never visits chunk 2" in refused(build("mutant", dualpipe(2), 2, bad),
                                                          uniform_profile(1, 1, 1, p=2, m=2))


def test_wrong_rank_count_is_refused():
    ranks = split_1f1b()
    s = build("mutant", linear(P + 1), M, ranks)
    assert "it lists 4 ranks but its placement has 5" in refused(s, None)


def test_many_problems_are_summarised():
    ranks = split_1f1b()
    for i in range(M):
        ranks[2].remove(W(2, i))
    msg = refused(sched(ranks))
    assert msg.count("weight backwards (W)") == 5
    assert msg.endswith("; and 3 more")


def test_overlap_pair_needing_its_own_forward_is_refused():
    # (3F0;3I0) on a V-shape's loss chunk: the I needs the F that runs in the same pair, so the pair
    # can never start. The validator must report it, not raise from inside check().
    pl = vshape(2)
    ranks = [
        [F(0, 0), overlap(F(3, 0), B(3, 0)), W(3, 0), B(0, 0), W(0, 0)],
        [F(1, 0), F(2, 0), B(2, 0), B(1, 0), W(2, 0), W(1, 0)],
    ]
    s = build("mutant", pl, 1, ranks)
    report = check(s, uniform_profile(1, 1, 1, p=2, m=1))
    assert not report.ok
    assert "(3F0;3I0)OVERLAP_F_B (rank 0, step 1) pairs a backward with the forward it needs" in report.problems[0]
    assert report.timeline is None
    assert not check(s).ok                  # without a profile too
    with pytest.raises(ScheduleError, match="pairs a backward with the forward it needs"):
        validate(s)


def test_dependency_graph_edges():
    s = build("g", linear(2), 1, [[F(0, 0), B(0, 0), W(0, 0)], [F(1, 0), B(1, 0), W(1, 0)]])
    prof = Profile.from_dict({"stages": [{"F": 1, "B": 1, "W": 1}] * 2, "comm": [0.5],
                              "source": {"kind": "estimated", "method": "test"}})
    g = dependency_graph(s, prof)
    data = {(u, v): d["weight"] for u, v, d in g.edges(data=True) if d["kind"] == "data"}
    order = {(u, v) for u, v, d in g.edges(data=True) if d["kind"] == "order"}
    assert data == {((0, 0), (1, 0)): 0.5,          # 0F0 -> 1F0 over the link
                    ((1, 0), (1, 1)): 0.0,          # 1F0 -> 1I0 (loss)
                    ((1, 1), (0, 1)): 0.5,          # 1I0 -> 0I0 over the link
                    ((0, 0), (0, 1)): 0.0,          # 0F0 -> 0I0
                    ((0, 1), (0, 2)): 0.0,          # 0I0 -> 0W0
                    ((1, 1), (1, 2)): 0.0}          # 1I0 -> 1W0
    assert order == {((0, 0), (0, 1)), ((0, 1), (0, 2)), ((1, 0), (1, 1)), ((1, 1), (1, 2))} - set(data)
    assert g.nodes[(1, 1)]["action"] == B(1, 0)

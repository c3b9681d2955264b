"""The two-chunk handcrafted schedules: ZB-V, DualPipe, DualPipeV, V-Half and V-Min.

Each must give a complete, deadlock-free schedule for every p, m it accepts, hold the peak activation
memory its paper states (in whole-stage M_B, a chunk-microbatch of a V-shape counting 1/2), reach its
closed-form bubble under uniform stages with no communication, and refuse what it does not define
with a PreconditionError that says what is needed.
"""

from __future__ import annotations

import pytest

from zbsearch.core.errors import PreconditionError
from zbsearch.core.ir import Kind, Schedule
from zbsearch.core.profile import uniform_profile
from zbsearch.sim.summary import summarize
from zbsearch.schedules import generate
from zbsearch.schedules.dualpipe import dualpipe, dualpipev
from zbsearch.schedules.vshape import v_half, v_min
from zbsearch.schedules.zbv import zb_v
from zbsearch.sim.simulate import Timeline, simulate
from zbsearch.sim.validate import validate

# Edge cases first: one rank, one microbatch, fewer microbatches than the pipeline holds.
ZBV_PM = [(1, 1), (1, 3), (2, 1), (2, 3), (2, 4), (3, 2), (3, 5), (3, 7), (4, 3), (4, 7), (4, 8), (4, 11),
          (5, 10), (8, 16)]
VSHAPE_PM = [(1, 1), (1, 4), (2, 1), (2, 5), (3, 2), (3, 6), (4, 3), (4, 8), (4, 13), (5, 10), (6, 12),
             (7, 14), (8, 16)]
DUALPIPEV_PM = [(1, 2), (1, 5), (2, 4), (2, 7), (3, 6), (3, 9), (4, 8), (4, 11), (5, 10), (8, 16)]
DUALPIPE_PM = [(2, 4), (2, 6), (4, 8), (4, 10), (4, 14), (6, 12), (6, 16), (8, 16)]

GENERATORS = {"zb-v": zb_v, "dualpipe": dualpipe, "dualpipev": dualpipev, "v-half": v_half, "v-min": v_min}
TABLE = ([("zb-v", p, m) for p, m in ZBV_PM] + [("dualpipev", p, m) for p, m in DUALPIPEV_PM]
         + [("dualpipe", p, m) for p, m in DUALPIPE_PM]
         + [(name, p, m) for name in ("v-half", "v-min") for p, m in VSHAPE_PM])


def _uniform(p: int, m: int, F: float = 1.0, B: float = 1.0, W: float = 1.0, comm: float = 0.0):
    return uniform_profile(F, B, W, comm, p=p, m=m)


def _run(name: str, p: int, m: int, times: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> Timeline:
    return simulate(GENERATORS[name](p, m), _uniform(p, m, *times))


def _peaks(timeline: Timeline) -> list[float]:
    return summarize(timeline).peak_memory_per_rank


def _idle(timeline: Timeline) -> list[float]:
    return summarize(timeline).idle_per_rank


def _count(schedule: Schedule, rank: int, kind: Kind) -> int:
    return sum(1 for a in schedule.ranks[rank] if a.kind is kind)


@pytest.mark.parametrize("name,p,m", TABLE)
def test_validates_with_and_without_comm(name: str, p: int, m: int) -> None:
    schedule = generate(name, p, m)
    assert schedule.name == name
    for comm in (0.0, 0.5):
        timeline = validate(schedule, _uniform(p, m, 1.0, 1.0, 1.0, comm))
        assert timeline is not None
    chunks = schedule.placement.num_chunks
    assert chunks == 2 * p
    # Per (chunk, microbatch): one F, and one I with one W or one full backward; validate checked which.
    passes = [a for r in range(p) for a in schedule.passes(r)]
    assert sum(a.kind is Kind.F for a in passes) == p * m * (1 if name == "dualpipe" else 2)


@pytest.mark.parametrize("name,p,m", TABLE)
def test_peak_memory_never_exceeds_the_stated_value(name: str, p: int, m: int) -> None:
    stated = {"zb-v": p, "dualpipe": p + 1, "dualpipev": p + 0.5,
              "v-half": p // 2 + 1, "v-min": ((2 * (p + 3)) // 3) / 2}[name]
    assert max(_peaks(_run(name, p, m))) <= stated + 1e-9


# -- ZB-V --------------------------------------------------------------------------------------

@pytest.mark.parametrize("p,m", [(1, 4), (2, 3), (2, 4), (3, 5), (3, 6), (4, 7), (4, 8), (4, 16), (6, 12), (8, 16)])
@pytest.mark.parametrize("t", [1.0, 2.5])
def test_zbv_has_no_span_bubble_and_1f1b_memory(p: int, m: int, t: float) -> None:
    # m >= 2p-1: the pipeline fills, so every rank works without a gap from its first F to its last W.
    timeline = _run("zb-v", p, m, (t, t, t))
    report = summarize(timeline)
    assert report.span == pytest.approx(3 * m * t)
    assert report.bubble_rate_span == pytest.approx(0.0, abs=1e-12)
    # Rank r starts r half-stage forwards after rank 0, so the makespan adds (p-1) chunk forwards.
    assert report.makespan == pytest.approx(3 * m * t + (p - 1) * t / 2)
    assert _peaks(timeline) == pytest.approx([float(p)] * p)


def test_zbv_with_few_microbatches_drops_the_missing_ones() -> None:
    # p=4, m=3: laid out for 7 microbatches; ranks hold fewer and idle more.
    timeline = _run("zb-v", 4, 3)
    assert _peaks(timeline) == pytest.approx([2.0, 2.5, 3.0, 3.0])
    assert summarize(timeline).span == pytest.approx(13.0)


def test_zbv_phases() -> None:
    p, m = 4, 8
    schedule = zb_v(p, m)
    for r in range(p):
        c0, c1 = r, 2 * p - 1 - r
        head = schedule.ranks[r][: 2 * (p - r) - 1]
        assert [str(a) for a in head] == [f"{c0}F{i}" for i in range(2 * (p - r) - 1)]
        # Every backward is split, and each of the rank's 2m I has its W.
        assert _count(schedule, r, Kind.B) == _count(schedule, r, Kind.W) == 2 * m
        assert schedule.placement.chunks_on(r) == (c0, c1)


# -- DualPipe and DualPipeV ----------------------------------------------------------------------

def _deepseek_bubble(stages: int, F: float, B: float, W: float) -> float:
    """DeepSeek's (PP/2 - 1)(F&B + B - 3W) with PP the stages one direction flows through and B the
    FULL backward of one chunk; the simulator's F&B is F + full backward."""
    full = B + W
    return (stages / 2 - 1) * ((F + full) + full - 3 * W)


# The formula is drawn for F = B (the paper's input backward) and W <= F; there it is exact.
DEEPSEEK_TIMES = [(1.0, 1.0, 1.0), (2.0, 2.0, 1.0), (1.0, 1.0, 0.5), (1.0, 1.0, 0.25), (3.0, 3.0, 3.0)]


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 12), (6, 12), (8, 16), (8, 24)])
@pytest.mark.parametrize("times", DEEPSEEK_TIMES)
def test_dualpipe_bubble_matches_deepseek(p: int, m: int, times: tuple[float, float, float]) -> None:
    # Each DualPipe chunk is a whole stage of its model copy; one direction has p stages.
    expected = _deepseek_bubble(p, *times)
    assert _idle(_run("dualpipe", p, m, times)) == pytest.approx([expected] * p)


@pytest.mark.parametrize("p,m", [(1, 2), (2, 4), (3, 6), (4, 8), (4, 9), (6, 12), (8, 16)])
@pytest.mark.parametrize("times", DEEPSEEK_TIMES)
def test_dualpipev_bubble_matches_deepseek(p: int, m: int, times: tuple[float, float, float]) -> None:
    # DualPipeV is DualPipe on 2p stages folded onto p ranks: chunks are half stages.
    F, B, W = times
    expected = _deepseek_bubble(2 * p, F / 2, B / 2, W / 2)
    assert _idle(_run("dualpipev", p, m, times)) == pytest.approx([expected] * p)


def test_dualpipe_uniform_figures() -> None:
    # F = B = W = 1: idle p-2 per rank for DualPipe, p-1 for DualPipeV; memory p+1 and p+1/2.
    for p, m in [(4, 8), (8, 32)]:
        dp, dpv = _run("dualpipe", p, m), _run("dualpipev", p, m)
        assert _idle(dp) == pytest.approx([p - 2.0] * p)
        assert _idle(dpv) == pytest.approx([p - 1.0] * p)
        assert _peaks(dp) == pytest.approx([p + 1.0] * p)
        assert _peaks(dpv) == pytest.approx([p + 0.5] * p)


@pytest.mark.parametrize("name,p,m", [("dualpipev", p, m) for p, m in DUALPIPEV_PM]
                         + [("dualpipe", p, m) for p, m in DUALPIPE_PM])
def test_dualpipe_phase_counts(name: str, p: int, m: int) -> None:
    schedule = GENERATORS[name](p, m)
    P, M = (p, m) if name == "dualpipev" else (p // 2, m // 2)
    for r in range(p):
        h = r if name == "dualpipev" else min(r, p - 1 - r)
        # Phase 4 pairs twice per round (the meeting rank runs its first pair apart), phase 5 once.
        pairs = 2 * (M - 2 * P + h + 1) + (P - h - 1) - (1 if h == P - 1 else 0)
        assert _count(schedule, r, Kind.OVERLAP) == pairs
        # Split backwards: phases 3 and 7 (P-h-1 each) and the last h+1 of phase 6; each has one W.
        split = 2 * (P - h - 1) + h + 1
        assert _count(schedule, r, Kind.B) == _count(schedule, r, Kind.W) == split


def test_dualpipe_rank_chunks_follow_deepseek() -> None:
    # A rank's chunk 0 is the copy whose microbatches reach it first: its first action is that F.
    p, m = 4, 8
    schedule = dualpipe(p, m)
    assert [str(schedule.ranks[r][0]) for r in range(p)] == ["0F0", "1F0", "5F4", "4F4"]
    placement = schedule.placement
    assert placement.route(0, m) == (0, 1, 2, 3) and placement.route(m - 1, m) == (4, 5, 6, 7)


# -- V-Half and V-Min ----------------------------------------------------------------------------

@pytest.mark.parametrize("p", [2, 3, 4, 5, 6, 7, 8, 9, 12])
def test_vshape_memory_is_a_half_and_a_third_of_1f1b(p: int) -> None:
    m = 2 * p
    half, third = max(_peaks(_run("v-half", p, m))), max(_peaks(_run("v-min", p, m)))
    assert half == p // 2 + 1
    assert third == ((2 * (p + 3)) // 3) / 2
    assert half <= p / 2 + 1 and third <= p / 3 + 1


# Span minus work under F = B = W = 1, comm 0 (1F1B's is 3(p-1)): the measured figures, pinned.
VSHAPE_IDLE = {("v-half", 4, 16): 3.0, ("v-half", 6, 24): 6.0, ("v-half", 8, 32): 8.5,
               ("v-min", 4, 16): 5.5, ("v-min", 6, 24): 8.5, ("v-min", 8, 32): 13.0}


@pytest.mark.parametrize("name,p,m", list(VSHAPE_IDLE))
def test_vshape_bubble(name: str, p: int, m: int) -> None:
    report = summarize(_run(name, p, m))
    idle = report.span - 3 * m
    assert idle == pytest.approx(VSHAPE_IDLE[(name, p, m)])
    # about half (V-Half) and two thirds (V-Min) of 1F1B's bubble
    assert idle <= {"v-half": 0.5, "v-min": 0.7}[name] * 3 * (p - 1)


# -- preconditions -------------------------------------------------------------------------------

@pytest.mark.parametrize("name,p,m,need", [
    ("dualpipe", 3, 12, "p even"),
    ("dualpipe", 1, 4, "p even"),
    ("dualpipe", 4, 9, "m even"),
    ("dualpipe", 4, 6, "m >= 2p"),
    ("dualpipev", 4, 7, "m >= 2p"),
    ("dualpipev", 1, 1, "m >= 2p"),
])
def test_preconditions(name: str, p: int, m: int, need: str) -> None:
    with pytest.raises(PreconditionError, match=need) as info:
        generate(name, p, m)
    assert f"p={p}, m={m}" in str(info.value)

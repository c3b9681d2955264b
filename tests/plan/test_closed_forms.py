"""The planner's closed forms against the simulator, the microbatch count a target needs, the
recommendation rules, and `zbsearch plan` through typer's CliRunner. tests/schedules/test_spec.py
checks every record's forms, peak memory, P2P hops and copies over a grid of p and m; here, the
figures the docs quote and the conditions each form states.

Where a closed form is exact (its stated conditions hold) it must equal the simulator to rounding,
under both cost conventions, for several p, m and pass times. Where it is not (V-Half, V-Min, or a
condition fails), the difference is pinned here so that the report stays honest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.core.errors import PlanError
from zbsearch.plan.closed_forms import (CLOSED_FORM, SIMULATOR, Estimate, PassTimes, bubble_fraction,
    bubble_ratio, bubble_time, closed_form, estimate, m_problem, next_valid_m, peak_activation_memory,
    previous_valid_m, profile_for, simulated)
from zbsearch.plan.microbatches import TargetM, below, microbatches_for_target, min_microbatches
from zbsearch.plan.planner import PlanRow, microbatches_from_batch, plan, recommend
from zbsearch.cli.app import app
from zbsearch.core.memory import parse_mem_limit
from zbsearch.core.profile import load_profile
from zbsearch.schedules import generate
from zbsearch.sim.simulate import simulate

runner = CliRunner()

# (F, B, W, comm) under which each closed form's conditions hold.
LINEAR_TIMES = [(1.0, 1.0, 1.0, 0.0), (3.0, 2.0, 1.0, 0.0), (2.0, 3.0, 1.5, 0.0), (1.0, 2.0, 0.5, 0.0)]
EXACT = {
    "gpipe": (LINEAR_TIMES + [(1.0, 2.0, 1.0, 0.3), (2.0, 1.0, 1.0, 10.0)], [(2, 1), (3, 5), (4, 16), (6, 9)]),
    "1f1b": (LINEAR_TIMES + [(1.0, 3.0, 2.0, 0.0)], [(2, 1), (3, 2), (4, 16), (6, 9)]),
    "interleaved-1f1b": (LINEAR_TIMES, [(2, 2), (3, 6), (4, 8), (4, 16)]),
    "zb-h1": (LINEAR_TIMES, [(2, 2), (3, 3), (4, 9), (6, 12)]),
    "zb-h2": (LINEAR_TIMES + [(1.0, 1.0, 1.0, 0.1), (3.0, 2.0, 1.0, 2.5), (1.0, 2.0, 0.5, 0.3)],
              [(2, 3), (3, 5), (4, 8), (5, 16)]),
    "zb-v": ([(1.0, 1.0, 1.0, 0.0), (2.5, 2.5, 2.5, 0.0)], [(2, 3), (3, 5), (4, 7), (4, 16), (6, 12)]),
    "dualpipe": ([(1.0, 1.0, 1.0, 0.0), (2.0, 2.0, 1.0, 0.0), (1.0, 1.0, 0.25, 0.0)], [(2, 4), (4, 8), (4, 14), (6, 12)]),
    "dualpipev": ([(1.0, 1.0, 1.0, 0.0), (2.0, 2.0, 1.0, 0.0), (1.0, 1.0, 0.25, 0.0)], [(2, 4), (3, 7), (4, 8), (6, 12)]),
}
EXACT_CASES = [(name, p, m, t) for name, (times, pms) in EXACT.items() for p, m in pms for t in times]


def _sim(name: str, p: int, m: int, t: tuple[float, ...], v: int | None = None, mem_W: float = 0.5):
    times = PassTimes(*t)
    profile = profile_for(times, p, m, mem_W=mem_W)
    return times, simulate(generate(name, p, m, v), profile)


# -- the figures the issue names --------------------------------------------------------------------

def test_gpipe_and_1f1b_p4_m16_give_3_over_19():
    for name in ("gpipe", "1f1b"):
        assert bubble_fraction(name, 4, 16) == pytest.approx(3 / 19)
        _, timeline = _sim(name, 4, 16, (1.0, 2.0, 1.0))
        assert timeline.bubble_rate_makespan == pytest.approx(3 / 19)   # the simulator's bubble rate
        assert bubble_ratio(name, 4, 16) == pytest.approx(3 / 16)          # Megatron's (p-1)/m


def test_interleaved_p8_m32_v4_gives_the_relative_figure():
    est = closed_form("interleaved-1f1b", 8, 32, v=4)
    assert est.exact
    assert est.bubble_ratio == pytest.approx(7 / (4 * 32))                 # (p-1)/(v m)
    assert est.bubble_fraction == pytest.approx(7 / (4 * 32 + 7))
    _, timeline = _sim("interleaved-1f1b", 8, 32, (1.0, 1.0, 1.0), v=4)
    work = timeline.work(0)
    assert (timeline.makespan - work) / work == pytest.approx(7 / 128)


def test_min_microbatches_1f1b_p8_target_10_percent():
    m = min_microbatches("1f1b", 8, 0.1)
    assert m == 64
    assert below(bubble_fraction("1f1b", 8, m), 0.1)
    assert not below(bubble_fraction("1f1b", 8, m - 1), 0.1)             # 7/70 is 0.1 exactly: not below
    # The simulator agrees at the boundary.
    for mm, ok in ((m, True), (m - 1, False)):
        _, timeline = _sim("1f1b", 8, mm, (1.0, 2.0, 1.0))
        assert below(timeline.bubble_rate_makespan, 0.1) is ok


# -- closed forms against the simulator ----------------------------------------------------------

@pytest.mark.parametrize("name,p,m,t", EXACT_CASES)
def test_closed_form_equals_simulator_where_exact(name, p, m, t):
    v = 2 if name == "interleaved-1f1b" else None
    times, timeline = _sim(name, p, m, t, v)
    work = timeline.work(0)
    for objective, cost in (("makespan", timeline.makespan), ("span", timeline.span)):
        est = closed_form(name, p, m, times, v or 1, objective)
        assert est.exact, est.note
        assert est.source == CLOSED_FORM
        assert est.ideal == pytest.approx(work)
        assert est.bubble == pytest.approx(cost - work, abs=1e-9)
        assert est.bubble_fraction == pytest.approx(timeline.bubble_rate(cost), abs=1e-12)
    assert est.peak_memory == pytest.approx(max(timeline.peak_memory(r) for r in range(p)))


# Where the formula is not exact: (schedule, p, m, times, objective) -> (formula, simulator), measured.
DIFFERENCES = {
    ("v-half", 4, 16, (1, 1, 1, 0), "makespan"): (4.5, 3.0),
    ("v-half", 8, 32, (1, 1, 1, 0), "makespan"): (10.5, 8.5),
    ("v-min", 4, 16, (1, 1, 1, 0), "makespan"): (6.0, 5.5),
    ("v-min", 8, 32, (1, 1, 1, 0), "makespan"): (14.0, 13.0),
    ("zb-v", 4, 16, (2, 1, 1, 0), "span"): (0.0, 3.0),                   # F, B, W not all equal
    ("dualpipe", 4, 16, (1, 2, 1, 0), "makespan"): (4.0, 3.0),           # F != B
    ("dualpipev", 4, 16, (1, 2, 1, 0), "makespan"): (6.0, 5.5),          # F != B
    ("zb-h1", 4, 16, (1, 1, 2, 0), "makespan"): (0.0, 3.0),              # W > min(F, B)
    ("zb-h1", 4, 16, (1, 1, 1, 0.05), "makespan"): (3.0, 3.6),           # comm: measured (p-1)(F+B-W+4c)
    ("1f1b", 4, 16, (1, 1, 1, 0.1), "makespan"): (9.0, 11.8),            # comm: grows with m
    ("zb-h2", 4, 8, (1, 1, 1, 0), "span"): (0.0, 0.0),                   # m = 2p: exact (control)
    ("zb-h2", 4, 5, (1, 1, 1, 0), "span"): (0.0, 2.0),                   # m < 2p-1
}


@pytest.mark.parametrize("key", list(DIFFERENCES))
def test_difference_where_the_closed_form_is_not_exact(key):
    name, p, m, t, objective = key
    formula, measured = DIFFERENCES[key]
    times = PassTimes(*t)
    est = closed_form(name, p, m, times, 1, objective)
    sim = simulated(name, profile_for(times, p, m), m, 1, objective)
    assert est.bubble == pytest.approx(formula)
    assert sim.bubble == pytest.approx(measured)
    assert est.exact is (formula == measured and name not in ("v-half", "v-min"))
    if not est.exact:
        assert est.note                                                    # says which condition fails
        chosen = estimate(name, profile_for(times, p, m), m, 1, objective)
        assert chosen.source == SIMULATOR and chosen.bubble == pytest.approx(measured)
        assert chosen.note.startswith("closed form not exact")


def test_vshape_peak_memory_is_measured_not_closed():
    for name, p, peak in (("v-half", 8, 5.0), ("v-min", 8, 3.5), ("v-half", 6, 4.0), ("v-min", 6, 3.0)):
        value, exact = peak_activation_memory(name, p, 2 * p)
        assert value == peak and not exact
        assert simulated(name, profile_for(PassTimes(), p, 2 * p), 2 * p).peak_memory == pytest.approx(peak)


def test_estimate_uses_the_closed_form_when_exact_and_says_so():
    profile = profile_for(PassTimes(1, 2, 1), 4, 8)
    assert estimate("zb-h1", profile, 8).source == CLOSED_FORM
    assert estimate("zb-v", profile, 8).source == SIMULATOR              # F, B, W differ


def test_bubble_time_conventions():
    # ZB-H2 and ZB-V differ between the two conventions; the others do not.
    assert bubble_time("zb-h2", 4, 8, PassTimes(2, 1, 1), objective="span") == pytest.approx(3.0)
    assert bubble_time("zb-h2", 4, 8, PassTimes(2, 1, 1), objective="makespan") == pytest.approx(6.0)
    assert bubble_time("zb-v", 4, 8, objective="makespan") == pytest.approx(1.5)
    assert bubble_time("1f1b", 4, 8, objective="span") == bubble_time("1f1b", 4, 8, objective="makespan")
    with pytest.raises(PlanError) as info:
        bubble_time("1f1b", 4, 8, objective="wall")
    assert str(info.value) == "objective 'wall' is not a cost convention: use makespan or span"


# -- microbatches for a target ------------------------------------------------------------------

@pytest.mark.parametrize("name,p,v", [("interleaved-1f1b", 4, 2), ("interleaved-1f1b", 8, 4), ("dualpipe", 4, 1),
                                      ("dualpipev", 4, 1), ("zb-h1", 6, 1), ("zb-v", 4, 1)])
@pytest.mark.parametrize("target", [0.05, 0.2, 0.4])
def test_min_microbatches_respects_rules_and_is_smallest(name, p, v, target):
    times = PassTimes(1.0, 1.0, 1.0)
    found = microbatches_for_target(name, p, target, v, times=times)
    m = found.m
    assert m is not None and m_problem(name, p, m, v) is None
    profile = profile_for(times, p, m)
    assert below(estimate(name, profile, m, v).bubble_fraction, target)
    prev = previous_valid_m(name, p, m, v)
    if prev is not None:
        assert not below(estimate(name, profile, prev, v).bubble_fraction, target)
    if name == "dualpipe":
        assert m % 2 == 0 and m >= 2 * p
    if name == "interleaved-1f1b":
        assert m % p == 0


def test_min_microbatches_with_the_simulator_finds_the_boundary():
    # comm > 0: no closed form for ZB-H1; the search simulates and the boundary holds by simulation.
    times = PassTimes(1.0, 1.0, 1.0, 0.05)
    found = microbatches_for_target("zb-h1", 4, 0.1, times=times)
    assert found.source == SIMULATOR and found.m is not None
    profile = profile_for(times, 4, 1)
    assert below(simulated("zb-h1", profile, found.m).bubble_fraction, 0.1)
    assert not below(simulated("zb-h1", profile, found.m - 1).bubble_fraction, 0.1)


def test_unreachable_target_is_none_with_the_reason():
    # V-Half's fixed block assumes equal passes; with B = 2F its bubble grows as fast as the work.
    found = microbatches_for_target("v-half", 4, 0.05, times=PassTimes(1.0, 2.0, 1.0))
    assert found.m is None and "never below" in found.note
    assert min_microbatches("1f1b", 8, 0.001, max_m=1000) is None


def test_target_and_batch_checks():
    for bad in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(PlanError) as info:
            min_microbatches("1f1b", 4, bad)
        assert str(info.value) == f"bubble target {bad} is not a fraction in (0, 1): write e.g. 0.05 for 5%"
    assert microbatches_from_batch(512, 16, 1) == 32
    with pytest.raises(PlanError) as info:
        microbatches_from_batch(1000, 16, 3)
    assert str(info.value) == ("global batch 1000 is not divisible by dp x micro-batch = 16 x 3 = 48: use a multiple "
                               "of 48 (e.g. 960 or 1008) or change dp or the micro-batch size")
    for args, message in (((0, 16, 1), "global batch 0"), ((64, 0, 1), "data-parallel degree 0"),
                          ((64, 16, True), "micro-batch size True")):
        with pytest.raises(PlanError) as info:
            microbatches_from_batch(*args)
        assert str(info.value) == f"{message} is not a count: give a whole number >= 1"
    assert next_valid_m("dualpipe", 4, 9) == 10 and next_valid_m("interleaved-1f1b", 4, 9, 2) == 12


# -- the recommendation --------------------------------------------------------------------------

def _row(name: str, fraction: float, peak: float, p2p: float = 1.0, fits: bool = True, copies: int = 1) -> PlanRow:
    est = Estimate(schedule=name, p=4, m=8, chunks_per_rank=1, objective="makespan", bubble=fraction,
                   ideal=1 - fraction, peak_memory=peak, p2p_relative=p2p, param_copies=copies, source=CLOSED_FORM)
    return PlanRow(est, fits, TargetM(8, CLOSED_FORM))


def test_recommendation_never_exceeds_the_limit():
    rows = [_row("a", 0.01, 9, fits=False), _row("b", 0.2, 4), _row("c", 0.1, 4)]
    chosen, reason = recommend(rows, "1p")
    assert chosen.schedule == "c"
    assert "over the limit: a" in reason


def test_recommendation_ties_go_to_less_memory_then_less_communication():
    chosen, reason = recommend([_row("a", 0.1, 5, 1.0), _row("b", 0.1, 4, 2.0), _row("c", 0.3, 1)])
    assert chosen.schedule == "b" and "less activation memory" in reason
    chosen, reason = recommend([_row("a", 0.1, 4, 2.0), _row("b", 0.1, 4, 1.0)])
    assert chosen.schedule == "b" and "less P2P communication" in reason
    chosen, _ = recommend([_row("a", 0.1, 4, 1.0, copies=2), _row("b", 0.1, 4, 1.0)])
    assert chosen.schedule == "b"


def test_nothing_fits():
    chosen, reason = recommend([_row("a", 0.1, 5, fits=False), _row("b", 0.2, 3, fits=False)], "0.5p")
    assert chosen is None and "no schedule fits --mem-limit 0.5p" in reason and "b" in reason


@pytest.mark.parametrize("limit", ["none", "0.5p", "1p", "1.2p", "2p"])
@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_plan_recommends_the_smallest_bubble_that_fits(limit, objective):
    profile = profile_for(PassTimes(1, 1, 1), 4, 8)
    result = plan(profile, 8, limit=parse_mem_limit(limit, profile), objective=objective)
    fitting = [row for row in result.rows if row.fits]
    cap = None if limit == "none" else float(limit[:-1]) * 4
    for row in result.rows:
        assert row.fits is (cap is None or row.estimate.peak_memory <= cap + 1e-9)
    best = next(row for row in result.rows if row.schedule == result.recommendation)
    assert best.fits
    assert best.estimate.bubble_fraction == pytest.approx(min(r.estimate.bubble_fraction for r in fitting))
    ties = [r for r in fitting if r.estimate.bubble_fraction == pytest.approx(best.estimate.bubble_fraction)]
    assert best.estimate.peak_memory == min(r.estimate.peak_memory for r in ties)


def test_plan_leaves_out_what_does_not_apply():
    profile = profile_for(PassTimes(), 5, 6)
    result = plan(profile, 6)
    skipped = {s.schedule: s for s in result.skipped}
    assert "p even" in skipped["dualpipe"].reason and skipped["dualpipe"].target is None
    assert "multiple of p" in skipped["interleaved-1f1b"].reason
    assert skipped["dualpipev"].target.m >= 10
    with pytest.raises(PlanError) as info:
        plan(profile_for(PassTimes(), 1, 4), 4)
    assert str(info.value) == "pipelining needs at least 2 ranks, got p=1: use 2 or more (one rank has no bubble)"
    with pytest.raises(PlanError) as info:
        plan(profile, 6, v=0)
    assert str(info.value) == "chunk count 0 is too small: interleaved-1f1b needs 2 or more chunks per rank"


# -- the command line ------------------------------------------------------------------------------

def invoke(*args: object):
    return runner.invoke(app, ["plan", *[str(a) for a in args]])


def test_cli_json():
    result = invoke("--uniform", "1,1,1", "-p", 4, "-m", 16, "--mem-limit", "1p", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert "(p-1)/(m+p-1)" in data["bubble_fraction_convention"]
    rows = {row["schedule"]: row for row in data["schedules"]}
    assert rows["1f1b"]["bubble_fraction"] == pytest.approx(3 / 19)
    assert rows["1f1b"]["source"] == CLOSED_FORM and rows["v-min"]["source"] == SIMULATOR
    assert rows["gpipe"]["fits_mem_limit"] is False
    assert data["recommendation"] == "zb-v" and rows["zb-v"]["fits_mem_limit"]
    assert {"p2p_relative", "param_copies", "peak_memory", "microbatches_for_target", "bubble_ratio"} <= set(rows["1f1b"])


def test_cli_global_batch_and_table():
    result = invoke("--uniform", "1,2,1", "-p", 4, "--global-batch", 512, "--dp", 16, "--micro-batch", 2,
                    "--target-bubble", 0.1)
    assert result.exit_code == 0, result.output
    assert "m=16" in result.stdout and "--global-batch 512" in result.stdout
    assert "bubble / (ideal + bubble)" in result.stdout and "recommend: " in result.stdout
    assert "cost measured as makespan" in result.stdout


UNIFORM4 = ["--uniform", "1,1,1", "-p", 4]
NOT_A_COUNT = "is not a count: give a whole number >= 1"


@pytest.mark.parametrize("args,expect", [
    (["--uniform", "1,1,1", "-p", 1, "-m", 4],
     "pipelining needs at least 2 ranks, got -p 1: use -p 2 or more (one rank has no bubble)"),
    ([*UNIFORM4, "--global-batch", 1000, "--dp", 16, "--micro-batch", 3],
     "--global-batch: global batch 1000 is not divisible by dp x micro-batch = 16 x 3 = 48: use a multiple of 48 "
     "(e.g. 960 or 1008) or change dp or the micro-batch size"),
    ([*UNIFORM4, "--global-batch", 0, "--dp", 2, "--micro-batch", 2], f"--global-batch: global batch 0 {NOT_A_COUNT}"),
    ([*UNIFORM4, "--global-batch", 64, "--dp", 0, "--micro-batch", 2], f"--dp: data-parallel degree 0 {NOT_A_COUNT}"),
    ([*UNIFORM4, "--global-batch", 64, "--dp", 2, "--micro-batch", 0],
     f"--micro-batch: micro-batch size 0 {NOT_A_COUNT}"),
    ([*UNIFORM4, "-m", 8, "--target-bubble", 1.5],
     "--target-bubble: bubble target 1.5 is not a fraction in (0, 1): write e.g. 0.05 for 5%"),
    ([*UNIFORM4, "-m", 8, "--target-bubble", 0],
     "--target-bubble: bubble target 0.0 is not a fraction in (0, 1): write e.g. 0.05 for 5%"),
    ([*UNIFORM4, "-m", 8, "--global-batch", 64, "--dp", 2, "--micro-batch", 2],
     "give either -m M or --global-batch B --dp D --micro-batch b, not both"),
    ([*UNIFORM4, "--global-batch", 64],
     "--global-batch 64 needs --dp D and --micro-batch b to give m = global batch / (dp x micro-batch)"),
    ([*UNIFORM4, "-m", 8, "--dp", 2], "--dp and --micro-batch go with --global-batch B (m = B / (dp x micro-batch)); "
                                      "or give -m M"),
    ([*UNIFORM4, "-m", 8, "--objective", "wall"],
     "--objective: objective 'wall' is not a cost convention: use makespan or span"),
    ([*UNIFORM4, "-m", 8, "--mem-limit", "lots"],
     "--mem-limit: memory limit 'lots' is not understood: use a multiple of p (1p, 2p, 1.5p), a size (48GiB, 40GB, "
     "1000000000), auto or none"),
])
def test_cli_bad_input_is_one_line(args, expect):
    """Every message names the option and the fix, on one line, with exit code 1."""
    result = runner.invoke(app, ["plan", *[str(a) for a in args]], env={"COLUMNS": "400"})
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {expect}"]


def test_published_profile_matches_the_paper():
    # Zero Bubble paper, Table 5, 1.5B with m = 24: 1F1B .2431 and ZB-H1 .1585 (makespan), ZB-H2 .1083
    # (span, where the closed form (p-1)(F+B+2c-2W) is exact on this uniform profile).
    profile = load_profile(Path(__file__).resolve().parents[2] / "profiles" / "zb-paper-1.5b-m24.json")
    assert estimate("1f1b", profile, 24).bubble_fraction == pytest.approx(0.2431, abs=5e-5)
    assert estimate("zb-h1", profile, 24).bubble_fraction == pytest.approx(0.1585, abs=5e-5)
    zb_h2 = estimate("zb-h2", profile, 24, objective="span")
    assert zb_h2.source == CLOSED_FORM and zb_h2.bubble_fraction == pytest.approx(0.1083, abs=5e-5)

"""The HTML report's data (report/html_data.py), quality figures (report/quality.py) and page (report/html.py)."""

from __future__ import annotations

import json
import re

import pytest

from zbsearch.core.ir import Kind
from zbsearch.core.memory import parse_mem_limit
from zbsearch.core.objective import Objective
from zbsearch.core.profile import uniform_profile
from zbsearch.report.html import page
from zbsearch.report.html_data import boxes, critical_path, memory, waits
from zbsearch.report.quality import Quality, handcrafted, quality_of
from zbsearch.schedules import generate
from zbsearch.sim.simulate import dependencies, simulate


def _timeline(name: str, p: int, m: int, comm: float = 0.05):
    schedule = generate(name, p, m)
    return simulate(schedule, uniform_profile(1.0, 1.1, 0.9, comm, p=p, m=m))


@pytest.mark.parametrize("name, p, m", [("zb-h1", 4, 8), ("zb-v", 4, 8), ("dualpipe", 4, 8), ("interleaved-1f1b", 4, 8)])
def test_one_box_per_pass_with_its_slot_times(name: str, p: int, m: int) -> None:
    tl = _timeline(name, p, m)
    drawn = boxes(tl)
    slots = list(tl.iter_slots())
    assert len(drawn) == tl.schedule.count() == len(slots)
    for box, slot in zip(drawn, slots):
        assert box[0] == slot.rank and box[1] == pytest.approx(slot.start) and box[2] == pytest.approx(slot.end)
    if name == "dualpipe":  # DualPipe runs overlapped pairs: one box each, named by both halves
        pairs = [b for b, s in zip(drawn, slots) if s.action.kind is Kind.OVERLAP]
        assert pairs and all(b[3] == "FB" and "&" in b[5] for b in pairs)


@pytest.mark.parametrize("name", ["zb-h1", "zb-v", "dualpipe"])
def test_critical_path_runs_from_time_zero_to_the_makespan_without_gaps(name: str) -> None:
    tl = _timeline(name, 4, 8)
    slots = list(tl.iter_slots())
    path = critical_path(tl)
    assert slots[path[-1]].end == pytest.approx(tl.makespan)
    assert slots[path[0]].start == pytest.approx(0.0)
    bound_by = waits(tl)
    for before, after in zip(path, path[1:]):
        assert bound_by[after][0] == before
        # Each link is what bound the start: the producer's end plus its hop, or the rank's previous pass.
        hops = [hop for a in slots[after].action.passes() for _, hop in dependencies(tl.schedule, tl.profile, a)]
        gap = slots[after].start - slots[before].end
        assert gap == pytest.approx(0.0) or any(gap == pytest.approx(h) for h in hops)
    # The path's work and hops add up to the makespan.
    assert sum(slots[k].end - slots[k].start for k in path) <= tl.makespan + 1e-9


def test_a_pass_waits_for_its_rank_or_its_last_input() -> None:
    tl = _timeline("1f1b", 3, 4)
    slots = list(tl.iter_slots())
    bound_by = waits(tl)
    assert bound_by[0] == (-1, "start")  # rank 0's first forward needs nothing
    first_on_rank1 = next(k for k, s in enumerate(slots) if s.rank == 1)
    who, why = bound_by[first_on_rank1]
    assert why == "input" and str(slots[who].action) == "0F0"


def test_memory_peaks_are_the_timelines_in_stage_units_and_the_cap_is_the_limit() -> None:
    tl = _timeline("zb-h2", 4, 8)
    limit = parse_mem_limit("2p", tl.profile)
    curves = memory(tl, limit)
    for r, curve in enumerate(curves):
        assert curve["peak"] == pytest.approx(tl.peak_memory(r) / tl.profile.stage_mem_B(r))
        assert max(level for _, level in curve["points"]) == pytest.approx(curve["peak"])
        assert curve["cap"] == pytest.approx(8.0)
        assert curve["points"][-1][1] == pytest.approx(0.0)


def test_page_is_self_contained_and_embeds_the_data() -> None:
    tl = _timeline("zb-v", 4, 8)
    html = page(tl, None)
    # Nothing is fetched: no external script, style, image or font (the SVG namespace is a name, not a request).
    assert re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html) is None
    assert "<link" not in html and "@import" not in html and "url(http" not in html
    blob = re.search(r'<script id="plan-data" type="application/json">(.*?)</script>', html, re.S)
    assert blob is not None
    data = json.loads(blob.group(1))
    assert len(data["boxes"]) == tl.schedule.count() and data["makespan"] == pytest.approx(tl.makespan)
    assert 'role="img"' in html and "<title" in html and "@media print" in html


def test_a_p8_m64_v_plan_page_is_at_most_2_mb() -> None:
    tl = _timeline("zb-v", 8, 64)
    # The quality section as a plan file's (its searches' figures stated, not run: they add no size).
    quality = Quality("makespan", tl.makespan, tl.makespan * 0.99, "a search", "feasible", tl.makespan * 0.98,
                      "a search", handcrafted(tl.profile, tl.schedule, None, Objective.MAKESPAN))
    size = len(page(tl, None, quality).encode())
    assert size <= 2 * 2**20, size


def test_handcrafted_schedules_at_the_limit_keep_to_the_plans_placement_or_linear() -> None:
    tl = _timeline("zb-v", 4, 8)
    rows = handcrafted(tl.profile, tl.schedule, parse_mem_limit("1p", tl.profile), Objective.MAKESPAN)
    names = {h.name for h in rows}
    assert "zb-v" in names and "1f1b" in names and "interleaved-1f1b" not in names
    assert {h.placement for h in rows} <= {"v", "linear"}
    fits = [h.fits for h in rows]
    assert fits == sorted(fits, reverse=True)  # the ones that fit first


def test_quality_of_a_plan_file_bounds_it_and_states_where_each_figure_comes_from() -> None:
    tl = _timeline("zb-h1", 4, 8)
    limit = parse_mem_limit("1p", tl.profile)
    q = quality_of(tl, limit, Objective.MAKESPAN, 1.0)
    assert q.value == pytest.approx(tl.makespan)
    assert q.lower_bound is not None and q.lower_bound <= q.value + 1e-9
    assert q.uncapped is not None and q.uncapped <= q.value + 1e-9
    assert "search at the same limit" in q.bound_source and "without a memory limit" in q.uncapped_source

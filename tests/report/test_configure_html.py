"""The whole-run page's data (report/configure_data.py) and page (report/configure_html.py), on a search's
table built from the plan layer's own records (Outcome.table(), what `configure --json` prints)."""

from __future__ import annotations

import json
import re

import pytest

from zbsearch.core.profile import uniform_profile
from zbsearch.plan.wholerun.outcome import Failed, Outcome, Pruned, certificate_of
from zbsearch.plan.wholerun.shape import Refused, RunShape
from zbsearch.plan.wholerun.shape_result import ShapeResult
from zbsearch.plan.wholerun.step import StepTime
from zbsearch.report.configure_data import GIB, RunFacts, fixed_line, not_solved, run_data, shape_label
from zbsearch.report.configure_html import ChosenPlan, run_page
from zbsearch.schedules import generate
from zbsearch.sim.simulate import simulate

FACTS = RunFacts("llama3-8b, 32 layers, hidden 4096", 128, 8192, 16, "h100")
CHOSEN, SECOND = RunShape(1, 2, 8, 1, 16, "fsdp"), RunShape(1, 2, 8, 2, 8, "zero1")
SINGLE = RunShape(1, 1, 16, 1, 8, "ddp")
YOURS, PRUNED = RunShape(2, 2, 4, 1, 32, "zero2"), RunShape(1, 4, 4, 1, 32, "fsdp")


def _solved(shape: RunShape, step: float, bound: float, peak_gib: float) -> ShapeResult:
    pipeline = shape.p > 1
    return ShapeResult(shape, "solved", timing=StepTime(step, 0.0, 0.0, 0.0, ()), step_bound_us=bound,
                       tokens_per_s_per_gpu=FACTS.tokens_per_gpu_step / (step / 1e6), mfu=0.4, bubble_fraction=0.1,
                       peak_bytes=(peak_gib * GIB, peak_gib * 0.9 * GIB), capacity_bytes=80e9,
                       placement="v" if pipeline else None, schedule_name="zb-v" if pipeline else None)


def _outcome(fixed: bool = True) -> Outcome[ShapeResult]:
    chosen = _solved(CHOSEN, 9.79e6, 9.6e6, 63.7)
    refused_by_solve = ShapeResult(RunShape(8, 2, 1, 1, 128, "ddp"), "refused", "no split fits 74.5 GiB")
    ranked = (chosen, _solved(SECOND, 11.4e6, 11.0e6, 62.3), _solved(SINGLE, 12.0e6, 12.0e6, 70.1), refused_by_solve)
    pruned = (Pruned(PRUNED, 1.0e7, "bound 10 s >= plan 9.79 s"), Pruned(YOURS, 1.2e7, "bound 12 s >= plan 9.79 s"))
    return Outcome(chosen, ranked, (Failed(RunShape(4, 4, 1, 1, 128, "ddp"), "the search raised: out of time"),),
                   pruned, (Refused("tp1 pp16 dp1", "sharding over one data-parallel rank is none (ddp)"),),
                   certificate_of(9.79e6, [9.6e6, 11.0e6, 12.0e6, 1.0e7, 1.2e7]),
                   _solved(YOURS, 15.0e6, 12.5e6, 40.0) if fixed else None, ran=6)


def test_every_solved_shape_once_the_chosen_and_yours_marked_and_the_pruned_apart() -> None:
    data = run_data(_outcome().table(), FACTS)
    labels = [s["label"] for s in data["shapes"]]
    # The ranked shapes with a plan, fastest first, then yours: solved although its bound pruned it.
    assert labels == [CHOSEN.label(), SECOND.label(), SINGLE.label(), YOURS.label()]
    assert [s["chosen"] for s in data["shapes"]] == [1, 0, 0, 0] and data["chosen"] == CHOSEN.label()
    assert [s["fixed"] for s in data["shapes"]] == [0, 0, 0, 1]
    first = data["shapes"][0]
    assert first["step_s"] == pytest.approx(9.79) and first["peak_gib"] == pytest.approx(63.7)
    assert first["cap_gib"] == pytest.approx(80e9 / GIB) == data["cap_gib"]
    assert first["gap"] == pytest.approx(9.79 / 9.6 - 1, rel=1e-5)
    assert data["shapes"][2]["placement"] is None  # p = 1: no schedule
    # Pruned: only those never solved, at the throughput their bound allows, none above the chosen plan's.
    assert [p["label"] for p in data["pruned"]] == [PRUNED.label()]
    bound = data["pruned"][0]
    assert bound["tps_bound"] == pytest.approx(128 * 8192 / 16 / 10.0, rel=1e-5) and bound["bound_s"] == 10.0
    assert bound["tps_bound"] <= first["tps"]


def test_shapes_without_a_plan_are_listed_with_their_reasons_and_yours_against_the_chosen() -> None:
    table = _outcome().table()
    rows = not_solved(table)
    assert ("tp1 pp16 dp1", "refused", "sharding over one data-parallel rank is none (ddp)") in rows
    assert ("tp8 pp2 dp1 ddp b1 m128", "refused", "no split fits 74.5 GiB") in rows
    assert ("tp4 pp4 dp1 ddp b1 m128", "failed", "the search raised: out of time") in rows
    assert fixed_line(table) == f"Your configuration {YOURS.label()}: step 15 s; the chosen plan is 53.2% faster."


@pytest.mark.parametrize("shape", [CHOSEN, RunShape(8, 4, 2, 1, 16, "fsdp-reshard", ep=2)])
def test_labels_are_the_plan_layers(shape: RunShape) -> None:
    assert shape_label(shape.to_dict()) == shape.label()


def _embedded(page: str, element: str) -> dict:
    found = re.search(rf'<script id="{element}" type="application/json">(.*?)</script>', page, re.S)
    assert found is not None
    return json.loads(found.group(1).replace("<\\/", "</"))


def test_the_page_embeds_the_data_and_says_the_certificate() -> None:
    table = _outcome().table()
    page = run_page(FACTS, table)
    assert _embedded(page, "run-data") == run_data(table, FACTS)
    assert "no shape in the space (5 shapes) is more than 2.0% faster than the chosen plan" in page
    assert page.count('<tr><td><strong>chosen</strong></td>') == 1 and "<strong>yours</strong>" in page
    assert "1 shape pruned" in page and "out of time" in page
    assert 'id="timeline"' not in page and 'id="plan-data"' not in page  # no plan given: no plan sections
    assert re.search(r'(src|href)="(?!#)', page) is None  # nothing to fetch: links only within the page


def test_the_page_holds_the_chosen_plans_sections_and_its_script_marks_it_ready() -> None:
    timeline = simulate(generate("zb-v", 2, 4), uniform_profile(1.0, 1.0, 1.0, 0.05, p=2, m=4))
    page = run_page(FACTS, _outcome(fixed=False).table(), ChosenPlan(timeline, None, None))
    assert _embedded(page, "run-data")["plan"] is True
    assert len(_embedded(page, "plan-data")["boxes"]) == timeline.schedule.count()
    # The scatter's script runs first; the plan's, which marks the page ready, last.
    assert page.index('id="run-data"') < page.index('id="plan-data"')
    assert 'id="timeline"' in page and 'id="chosen-h"' in page and "Your configuration" not in page


def test_a_search_without_a_plan_still_has_a_page_with_its_reasons() -> None:
    nothing = Outcome(None, (), (), (), (Refused("tp1 pp1 dp16", "does not fit: needs 128 GiB per GPU"),), None,
                      None, ran=1)
    table = nothing.table()
    data = run_data(table, FACTS)
    assert data["shapes"] == [] and data["pruned"] == [] and data["certificate"] is None and not data["plan"]
    page = run_page(FACTS, table)
    assert "no shape gave a plan" in page and "needs 128 GiB per GPU" in page and 'id="chosen-h"' not in page

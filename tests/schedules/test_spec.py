"""The one record per schedule (zbsearch.schedules.spec.ScheduleSpec) against the registry, the
generators and the simulator.

Every test loops over the registry, so a new schedule is checked as soon as its module registers
its record: its name, its rules on p and m against what its generator accepts, and every closed form
that claims to be exact against the simulator on uniform stages.
"""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path

import pytest

import zbsearch.schedules as schedules
from zbsearch.core.errors import PreconditionError
from zbsearch.plan.closed_forms import closed_form, profile_for
from zbsearch.schedules import REGISTRY, ScheduleSpec, generate
from zbsearch.schedules.spec import PassTimes
from zbsearch.sim.simulate import simulate

NAMES = list(REGISTRY)
# Uniform stage times: equal passes, B/W split unevenly, a slow forward, comm, a fused backward that is
# not B + W. Each closed form is checked under those where it says it is exact.
TIMES = [PassTimes(), PassTimes(1.0, 1.0, 0.25), PassTimes(2.0, 2.0, 1.0), PassTimes(3.0, 2.0, 1.0),
         PassTimes(1.0, 2.0, 0.5), PassTimes(1.0, 1.0, 1.0, 0.1), PassTimes(2.0, 1.0, 1.0, 0.3, 1.5)]


def _chunk_options(spec: ScheduleSpec) -> list[int]:
    return [1, 2, 3] if spec.takes_chunks else [1]


def _generate(spec: ScheduleSpec, p: int, m: int, v: int):
    return generate(spec.name, p, m, v if spec.takes_chunks else None)


def _accepted(spec: ScheduleSpec, p_values, m_values):
    for p in p_values:
        for m in m_values(p):
            for v in _chunk_options(spec):
                if spec.problem(p, m, v) is None:
                    yield p, m, v


def test_record_keys_equal_the_registry_names() -> None:
    records = [spec for module in schedules._MODULES for spec in module.SPECS]
    assert [spec.name for spec in records] == NAMES
    assert all(REGISTRY[name].name == name and isinstance(REGISTRY[name], ScheduleSpec) for name in NAMES)
    # Every schedule module in the package registers its records: none is left out of the registry.
    modules = {info.name for info in pkgutil.iter_modules(schedules.__path__)} - {"spec"}
    assert modules == {module.__name__.rsplit(".", 1)[1] for module in schedules._MODULES}


def test_the_readme_lists_the_registry_in_its_order() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.split("## Schedules")[1].split("\n\n")[1]
    assert re.findall(r"^\| `([\w-]+)` \|", table, re.M) == list(REGISTRY)


@pytest.mark.parametrize("name", NAMES)
def test_accepts_agrees_with_the_generator(name: str) -> None:
    spec = REGISTRY[name]
    for p in range(1, 9):
        for m in range(1, 3 * p + 3):
            for v in _chunk_options(spec):
                need = spec.problem(p, m, v)
                if need is None:
                    sched = _generate(spec, p, m, v)
                    assert sched.num_ranks == p and sched.num_microbatches == m
                    continue
                with pytest.raises(PreconditionError) as info:
                    _generate(spec, p, m, v)
                # The generator refuses with the record's words, so the rule is written once.
                assert str(info.value).startswith(f"{name} needs {need}") and f"p={p}, m={m}" in str(info.value)


@pytest.mark.parametrize("name", NAMES)
def test_placement_chunks_hops_and_copies_match_the_generated_schedule(name: str) -> None:
    spec = REGISTRY[name]
    for p, m, v in _accepted(spec, (2, 3, 4, 6), lambda p: (2 * p, 4 * p)):
        placement = _generate(spec, p, m, v).placement
        assert placement.name == (spec.placement if v > 1 or not spec.takes_chunks else "linear")
        assert spec.chunks_per_rank(v) == placement.chunks_per_rank
        assert spec.param_copies == len(placement.routes)
        hops = sum(sum(placement.chunk_to_rank[a] != placement.chunk_to_rank[b] for a, b in zip(route, route[1:]))
                   for route in (placement.route(i, m) for i in range(m)))
        assert spec.p2p_hops(p, v) * m == hops, (p, m, v)
        assert spec.p2p_relative(p, v) == pytest.approx(hops / (m * (p - 1)))


@pytest.mark.parametrize("name", NAMES)
def test_exact_closed_forms_equal_the_simulator(name: str) -> None:
    spec = REGISTRY[name]
    checked = 0
    for p, m, v in _accepted(spec, (2, 3, 4, 5, 6), lambda p: sorted({1, 2, p - 1, p, 2 * p - 1, 2 * p, 3 * p + 1})):
        for times in TIMES:
            forms = {objective: closed_form(name, p, m, times, v, objective) for objective in ("makespan", "span")}
            if not any(form.exact for form in forms.values()):
                continue
            timeline = simulate(_generate(spec, p, m, v), profile_for(times, p, m))
            work = timeline.work(0)
            for objective, cost in (("makespan", timeline.makespan), ("span", timeline.span)):
                form = forms[objective]
                if form.exact:
                    assert form.ideal == pytest.approx(work), (p, m, v, times)
                    assert form.bubble == pytest.approx(cost - work, abs=1e-9), (objective, p, m, v, times)
                    checked += 1
    # The approximate forms (V-Half, V-Min) never claim exactness; every other one holds somewhere.
    assert (checked == 0) is (spec.bubble(4, 16, 1, PassTimes(), "makespan").approximate), checked


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mem_W", [0.0, 0.5, 1.0])
def test_peak_memory_equals_the_simulator_where_exact(name: str, mem_W: float) -> None:
    spec = REGISTRY[name]
    for p, m, v in _accepted(spec, (2, 3, 4, 6), lambda p: range(1, 3 * p + 1)):
        timeline = simulate(_generate(spec, p, m, v), profile_for(PassTimes(), p, m, mem_W=mem_W))
        peak = max(timeline.peak_memory(r) for r in range(p))
        if spec.peak_memory_exact:
            assert spec.peak_memory(p, m, v) == pytest.approx(peak), (p, m, v)
        elif mem_W == 0.5 and m >= 2 * p:
            # Measured, not closed: pinned at M_W = M_B/2 and m >= 2p, where it was measured.
            assert spec.peak_memory(p, m, v) == pytest.approx(peak), (p, m, v)

"""Branch and bound across shapes on deterministic fake entry points: the chosen plan is the least step over
the whole space, pruning is sound, the certificate is its formula, and the table is the same with 1 or 2
workers, in any finishing order, and after an interrupted run is resumed (finished shapes are not run again)."""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import pytest
from wholerun_fakes import FAKE_JOBS, FakeResult, fake_cheap_bound, fake_crash, fake_step, tiny_setup

from zbsearch.core.errors import PlanError
from zbsearch.plan.wholerun import search
from zbsearch.plan.wholerun.jobs import Done, Job, call_job
from zbsearch.plan.wholerun.outcome import Failed
from zbsearch.plan.wholerun.search import Settings, ShapeJobs, search_shapes, time_share
from zbsearch.plan.wholerun.shape import Refused, RunShape, Space, enumerate_shapes
from zbsearch.search.options import SearchOptions

OPTIONS = SearchOptions(time_limit=8.0)
FAILING_SOLVE = RunShape(1, 4, 4, 1, 8, "ddp")  # fake_evaluate raises a PlanError on it
FAILING_BOUND = RunShape(4, 4, 1, 2, 16, "ddp")  # fake_bound raises one on it


def run(space: Space = Space(), **settings) -> search.Outcome:
    workload, cluster = tiny_setup()
    return search_shapes(workload, cluster, space, FAKE_JOBS, OPTIONS, Settings(**settings))


@pytest.fixture(scope="module")
def reference():
    """The whole tiny space solved with one worker and no results file."""
    return run()


def expected_min(shapes: list[RunShape]) -> RunShape:
    order = {s: i for i, s in enumerate(shapes)}
    return min((s for s in shapes if s != FAILING_SOLVE), key=lambda s: (fake_step(s), order[s]))


def test_the_chosen_plan_is_the_least_step_over_every_shape(reference):
    shapes = list(enumerate_shapes(*tiny_setup(), Space()).shapes)
    bounded = [s for s in shapes if not (s.t == 1 and s.b == 8) and s != FAILING_BOUND]  # fake_bound's refusals
    best = expected_min(bounded)
    chosen = reference.chosen
    assert (chosen.shape, chosen.step) == (best, fake_step(best))
    assert reference.ranked[0] == chosen and [r.step for r in reference.ranked] == sorted(r.step for r in
                                                                                         reference.ranked)
    # Every shape is ranked, pruned or refused, once.
    listed = [r.shape for r in reference.ranked] + [p.shape for p in reference.pruned] + \
        [f.shape for f in reference.failed]
    assert sorted(listed) == sorted(bounded)
    # Pruning is sound: no pruned shape could have beaten (or tied ahead of) the chosen plan.
    assert reference.pruned and all(p.bound >= chosen.step for p in reference.pruned)
    assert all(p.reason == f"bound {p.bound / 1e6:.4g} s >= plan {chosen.step / 1e6:.4g} s of {chosen.shape.label()}"
               for p in reference.pruned)
    assert all(fake_cheap_bound(r.shape) <= chosen.step for r in reference.ranked)


def test_refused_and_failed_shapes_carry_their_reasons(reference):
    lines = [r.line() for r in reference.refused]
    assert "tp1 pp1 dp16 b4: m = 32/(16*4) = 0.5 is not whole" in lines
    assert "tp1 pp4 dp4 ddp b8 m1: activations of b8 do not fit 80 GB" in lines
    assert f"{FAILING_BOUND.label()}: its bound failed: fake bound: no split of 8 blocks over 4 stages fits" in lines
    assert fake_cheap_bound(FAILING_SOLVE) < reference.chosen.step
    assert reference.failed == (Failed(FAILING_SOLVE, "fake solve: no schedule fits the memory limit"),)


def test_the_certificate_is_its_formula(reference):
    chosen, certificate = reference.chosen, reference.certificate
    ranked = {r.shape: r for r in reference.ranked}
    lows = [max(fake_cheap_bound(s), ranked[s].bound) if s in ranked else fake_cheap_bound(s)
            for s in [*ranked, *(p.shape for p in reference.pruned), *(f.shape for f in reference.failed)]]
    assert certificate.bound == min(lows) and certificate.step == chosen.step
    assert certificate.gap == chosen.step / min(lows) - 1 >= 0
    assert certificate.shapes == len(lows)
    assert certificate.sentence().startswith(f"under this cost model no shape in the space ({len(lows)} shapes) "
                                             "is more than ")


def test_each_shape_gets_time_in_proportion_to_its_promise(reference):
    best = min([fake_cheap_bound(r.shape) for r in reference.ranked] + [p.bound for p in reference.pruned])
    for result in reference.ranked:
        share = min(1.0, max(0.25, best / fake_cheap_bound(result.shape)))
        assert result.limit == pytest.approx(OPTIONS.time_limit * share)
    assert time_share(400.0, 100.0, 0.5) == 0.5 and time_share(100.0, 100.0, 0.5) == 1.0


def test_two_workers_give_the_table_of_one(reference):
    assert run(workers=2).table() == reference.table()


class ShuffledRunner:
    """Runs each job in this process when asked for one, picking which in-flight job ends at random."""

    def __init__(self, seed: int) -> None:
        self.rng, self.jobs = random.Random(seed), {}

    @property
    def in_flight(self) -> int:
        return len(self.jobs)

    def submit(self, key: int, job: Job) -> None:
        self.jobs[key] = job

    def next_done(self) -> Done:
        key = self.rng.choice(sorted(self.jobs))
        value, error = call_job(*self.jobs.pop(key))
        return Done(key, value, error)

    def close(self, abort: bool) -> None:
        self.jobs.clear()


@pytest.mark.parametrize("seed", range(4))
def test_any_finishing_order_gives_the_same_table(reference, monkeypatch, seed):
    monkeypatch.setattr(search, "open_runner", lambda workers, address: ShuffledRunner(seed))
    outcome = run(workers=60)
    assert outcome.table() == reference.table()
    # 60 in flight start shapes before any incumbent prunes them: this run solved shapes the reference pruned.
    assert outcome.ran > reference.ran


def entries(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()[1:]]


class StopAfter:
    def __init__(self, phase: str, count: int) -> None:
        self.phase, self.count = phase, count

    def __call__(self, event: search.SearchProgress) -> None:
        if event.phase == self.phase and event.done >= self.count:
            raise KeyboardInterrupt


@pytest.mark.parametrize("phase, count", [("bound", 40), ("solve", 5)])
def test_an_interrupted_search_resumes_without_running_finished_shapes_again(reference, tmp_path, phase, count):
    path = tmp_path / "results.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run(workers=2, results=path, progress=StopAfter(phase, count))
    first = entries(path)
    assert count <= len(first) < reference.ran
    with open(path, "a") as fh:
        fh.write('{"kind": "result", "sha')  # and the kill tore a line
    resumed = run(workers=2, results=path)
    assert resumed.table() == reference.table()
    lines = entries(path)
    assert lines[:len(first)] == first and resumed.ran == len(lines) - len(first)
    assert max(Counter((e["kind"], json.dumps(e["shape"], sort_keys=True)) for e in lines).values()) == 1
    again = run(workers=1, results=path)
    assert (again.table(), again.ran, entries(path)) == (reference.table(), 0, lines)


def test_a_results_file_of_another_search_is_refused(tmp_path):
    path = tmp_path / "results.jsonl"
    run(space=Space(tp=(8,)), results=path)
    with pytest.raises(PlanError, match=f"^results file {path} was written by a search with other arguments"):
        run(space=Space(tp=(4,)), results=path)


def test_the_fixed_configuration_is_solved_even_where_pruned(reference):
    pruned = reference.pruned[-1].shape
    outcome = run(fixed=pruned)
    assert outcome.table()["ranked"] == reference.table()["ranked"]
    assert isinstance(outcome.fixed, FakeResult) and outcome.fixed.step == fake_step(pruned)
    outside = run(space=Space(sharding=("fsdp",)), fixed=RunShape(8, 2, 1, 1, 32, "ddp"))
    assert outside.fixed.shape == RunShape(8, 2, 1, 1, 32, "ddp")
    assert RunShape(8, 2, 1, 1, 32, "ddp") not in [r.shape for r in outside.ranked] + \
        [p.shape for p in outside.pruned]
    refused = run(space=Space(tp=(1,), pp=(4,)), fixed=RunShape(1, 4, 4, 8, 1, "fsdp"))
    assert refused.fixed == Refused("tp1 pp4 dp4 fsdp b8 m1", "activations of b8 do not fit 80 GB")


def test_a_fixed_configuration_of_another_run_is_refused():
    with pytest.raises(PlanError) as caught:
        run(fixed=RunShape(8, 2, 1, 1, 16, "ddp"))
    assert caught.value.subject == "fixed"
    assert str(caught.value) == ("configuration tp8 pp2 dp1 ddp b1 m16 uses 16 GPUs and a global batch of 16, not 16 "
                                 "and 32: give t x p x d = the GPUs and m x b x d = the global batch")


def test_progress_reports_the_incumbent_and_the_certificate_so_far(reference):
    events = []
    run(space=Space(tp=(2,)), progress=events.append)
    bounds = [e for e in events if e.phase == "bound"]
    solves = [e for e in events if e.phase == "solve"]
    assert [e.done for e in bounds] == list(range(1, len(bounds) + 1)) and bounds[-1].left == 0
    assert solves[-1].left == 0 and solves[-1].pruned > 0
    steps = [e.step for e in solves if e.step is not None]
    assert steps == sorted(steps, reverse=True)
    gaps = [e.certificate.gap for e in solves if e.certificate is not None]
    assert all(g >= 0 for g in gaps) and math.isclose(gaps[-1], run(space=Space(tp=(2,))).certificate.gap)


def test_a_bug_in_an_entry_point_propagates():
    with pytest.raises(ValueError, match="a bug in the entry point"):
        search_shapes(*tiny_setup(), Space(tp=(8,)), ShapeJobs(fake_crash, FAKE_JOBS.evaluate, FAKE_JOBS.load_bound,
                                                               FAKE_JOBS.load_result), OPTIONS)

"""Branch and bound against every shape of a small space solved one by one with the real entry points: every
shape's bound holds for its plan, the chosen plan is the fastest the search solved, every pruned shape's bound
is no better than it, and the certificate's bound is below every plan of the space."""

from __future__ import annotations

import math

from zbsearch.plan.wholerun.cluster import make_cluster
from zbsearch.plan.wholerun.configure import configure
from zbsearch.plan.wholerun.evaluate import bound_shape, evaluate_shape
from zbsearch.plan.wholerun.shape import Space, enumerate_shapes
from zbsearch.plan.wholerun.workload import Workload
from zbsearch.profiling.request import LlamaShape
from zbsearch.search.options import SearchOptions

WORKLOAD = Workload(LlamaShape(layers=4, hidden=256, heads=4, seq=128, vocab=1024), 8)
CLUSTER = make_cluster("h100", 4, 4)
SPACE = Space(micro_batch=(1, 2), sharding=("fsdp",))
OPTIONS = SearchOptions(time_limit=0.5)


def test_bounds_hold_and_the_search_keeps_its_promises_over_a_small_space() -> None:
    outcome = configure(WORKLOAD, CLUSTER, SPACE, options=OPTIONS)
    assert outcome.chosen is not None and outcome.certificate is not None
    shapes = enumerate_shapes(WORKLOAD, CLUSTER, SPACE).shapes
    assert len(shapes) >= 6
    steps = []
    for shape in shapes:
        bound = bound_shape(WORKLOAD, CLUSTER, shape, OPTIONS)
        result = evaluate_shape(WORKLOAD, CLUSTER, shape, OPTIONS)
        if bound.refused is not None:
            assert result.status == "refused"
            continue
        assert result.status == "solved", result.reason
        assert bound.bound <= result.step * (1 + 1e-9), shape.label()  # the bound holds for this plan
        assert result.bound <= result.step * (1 + 1e-9)
        steps.append(result.step)
    # no plan of any shape, solved here on its own, beats the certificate's bound
    assert outcome.certificate.bound <= min(steps) * (1 + 1e-9)
    assert all(outcome.chosen.step <= r.step for r in outcome.ranked)
    assert all(p.bound >= outcome.chosen.step for p in outcome.pruned)
    assert math.isclose(outcome.certificate.gap, outcome.chosen.step / outcome.certificate.bound - 1)

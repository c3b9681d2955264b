"""partition/report.py: a plan's split rank by rank. rank_totals (static bytes plus peak activations),
layer_range, and split_facts: layers per chunk in route order, each chunk's layers by chunk index,
and per rank its chunks, static, peak and total bytes, the cap as written (byte limits only) and
whether its activations fit."""

from __future__ import annotations

from typing import Sequence

import pytest

from zbsearch.core.ir import Placement, dualpipe, linear, vshape
from zbsearch.core.memory import parse_mem_limit
from zbsearch.core.objective import Status
from zbsearch.core.partition import partition_profile
from zbsearch.core.profile import Profile
from zbsearch.schedules import generate
from zbsearch.search.partition.report import layer_range, rank_totals, split_facts
from zbsearch.search.problem import Problem
from zbsearch.search.solve.report import SolveResult
from zbsearch.search.solve.starts import heuristic_start
from zbsearch.sim.simulate import simulate

GiB = 2.0**30
SOURCE = {"kind": "estimated", "method": "split report tests"}


def _layered(n: int) -> Profile:
    # Layer i: mem_B (i % 2 + 1) GiB and static (i + 1) GiB.
    layers = [{"name": f"layers.{i}", "F": 1, "B": 1, "W": 1, "mem_B": (i % 2 + 1) * GiB, "mem_W": GiB / 2,
               "static_bytes": (i + 1) * GiB, "out_bytes": 1.0} for i in range(n)]
    return Profile.from_dict({"name": "toy", "stages": [{"F": 1, "B": 1, "W": 1, "mem_B": GiB, "mem_W": GiB}] * 2,
                              "microbatches": 4, "memory_unit": "bytes", "comm": 0.5, "layers": layers,
                              "source": SOURCE})


def _result(placement: Placement, counts: Sequence[int], limit: str) -> SolveResult:
    """The heuristic start on the split, as a result (the facts read only the problem and the timeline)."""
    base = _layered(sum(counts))
    prof = partition_profile(base, placement, counts)
    problem = Problem(prof, placement, 4, parse_mem_limit(limit, prof, placement), "makespan")
    start = heuristic_start(problem)
    return SolveResult(problem, start.schedule, start.timeline, start.objective, start.objective, Status.FEASIBLE, 0.0,
                       start.name, start.objective)


@pytest.mark.parametrize("names,text", [
    (("layers.3",), "layers.3"),
    (("tok_embeddings", "layers.0", "layers.1", "layers.3"), "tok_embeddings..layers.3"),
    (("a", "b"), "a..b"),
])
def test_layer_range_names_the_first_and_last_layer(names: tuple[str, ...], text: str) -> None:
    assert layer_range(names) == text


def test_rank_totals_add_static_bytes_to_the_peak() -> None:
    # 1F1B on 2 ranks, 2 microbatches: rank 0 runs both forwards before its first backward (peak 2 x 1.0),
    # rank 1 runs F, fused B, F, fused B (peak 1.0); static 5 and 7.
    stages = [{"F": 1, "B": 1, "W": 1, "mem_B": 1.0, "mem_W": 0.5, "static_bytes": s} for s in (5.0, 7.0)]
    prof = Profile.from_dict({"stages": stages, "microbatches": 2, "source": SOURCE})
    assert rank_totals(simulate(generate("1f1b", 2, 2), prof)) == pytest.approx([7.0, 8.0])
    plain = Profile.from_dict({"stages": [dict(s, static_bytes=None) for s in stages], "microbatches": 2,
                               "source": SOURCE})
    assert rank_totals(simulate(generate("1f1b", 2, 2), plain)) == pytest.approx([2.0, 1.0])


def test_split_facts_on_the_v_shape_under_a_byte_cap() -> None:
    # V on 2 ranks, (1, 2, 2, 1): rank 0 holds chunk 0 (layer 0) and chunk 3 (layer 5); rank 1 chunk 1
    # (layers 1-2) and chunk 2 (layers 3-4). Static bytes: 1 + 6 = 7 GiB and 2 + 3 + 4 + 5 = 14 GiB.
    result = _result(vshape(2), (1, 2, 2, 1), "40GiB")
    facts = split_facts(result, "auto").to_dict()
    assert list(facts) == ["rule", "layers_per_chunk", "chunks", "ranks"]
    assert facts["rule"] == "auto" and facts["layers_per_chunk"] == [1, 2, 2, 1]
    assert facts["chunks"] == [["layers.0"], ["layers.1", "layers.2"], ["layers.3", "layers.4"], ["layers.5"]]
    ranks = facts["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["chunks"] == [{"chunk": 0, "layers": ["layers.0"]}, {"chunk": 3, "layers": ["layers.5"]}]
    assert ranks[1]["chunks"] == [{"chunk": 1, "layers": ["layers.1", "layers.2"]},
                                  {"chunk": 2, "layers": ["layers.3", "layers.4"]}]
    assert [r["static_bytes"] for r in ranks] == pytest.approx([7 * GiB, 14 * GiB])
    for r, rank in enumerate(ranks):
        assert rank["peak_activation_bytes"] == pytest.approx(result.timeline.peak_memory(r))
        assert rank["total_bytes"] == pytest.approx(rank["static_bytes"] + rank["peak_activation_bytes"])
        assert rank["cap_bytes"] == pytest.approx(40 * GiB)  # the cap as written: static + activations
        assert rank["fits"] is True and rank["total_bytes"] <= 40 * GiB


def test_split_facts_give_no_byte_cap_for_a_multiple_of_p() -> None:
    facts = split_facts(_result(linear(2), (2, 3), "2p"), "even").to_dict()
    assert facts["rule"] == "even" and facts["layers_per_chunk"] == [2, 3]
    assert all(rank["cap_bytes"] is None and rank["fits"] for rank in facts["ranks"])
    assert [len(rank["chunks"]) for rank in facts["ranks"]] == [1, 1]


def test_split_facts_count_layers_along_one_route_on_dualpipe() -> None:
    # DualPipe's two routes (chunks 0, 1 and 2, 3) carry the same split: two counts, four chunks.
    facts = split_facts(_result(dualpipe(2), (2, 3), "2p"), "auto").to_dict()
    assert facts["layers_per_chunk"] == [2, 3]
    assert facts["chunks"][0] == facts["chunks"][2] == ["layers.0", "layers.1"]
    assert facts["chunks"][1] == facts["chunks"][3] == ["layers.2", "layers.3", "layers.4"]


def test_a_rank_over_its_limit_does_not_fit() -> None:
    # GPipe holds every microbatch's forwards before any backward: rank 0 (layers 0-1, 3 GiB each
    # microbatch) peaks at 4 x 3 = 12 GiB of activations, above 1p (2 x 3 GiB).
    base = _layered(5)
    prof = partition_profile(base, linear(2), (2, 3))
    problem = Problem(prof, linear(2), 4, parse_mem_limit("1p", prof, linear(2)), "makespan")
    schedule = generate("gpipe", 2, 4)
    tl = simulate(schedule, prof)
    result = SolveResult(problem, schedule, tl, tl.makespan, 0.0, Status.FEASIBLE, 0.0, "gpipe", tl.makespan)
    ranks = split_facts(result, "fixed").to_dict()["ranks"]
    assert ranks[0]["peak_activation_bytes"] == pytest.approx(12 * GiB)
    assert ranks[0]["fits"] is False

"""bounds/relaxations.py: the passes a bound reads, relaxed for fused backwards (fusion_saves,
fusion_relaxation) and F&B pairs (overlap_relaxation), and bound_passes applying what the profile
asks for. A relaxation may only make a pass shorter or lighter, never longer or heavier."""

from __future__ import annotations

from typing import Any, Sequence

import pytest

from zbsearch.core.ir import Kind, Placement, interleaved, linear, vshape
from zbsearch.core.memory import parse_mem_limit
from zbsearch.core.profile import Profile, uniform_profile
from zbsearch.core.stage_cost import StageCost
from zbsearch.search.bounds.relaxations import bound_passes, fusion_relaxation, fusion_saves, overlap_relaxation
from zbsearch.search.problem import Pass, Problem

SOURCE = {"kind": "estimated", "method": "relaxation tests"}


def _profile(stages: list[dict[str, Any]], m: int = 2, **extra: Any) -> Profile:
    return Profile.from_dict({"stages": stages, "comm": 0.5, "microbatches": m, "source": SOURCE, **extra})


def _problem(prof: Profile, placement: Placement | None = None) -> Problem:
    pl = placement or linear(prof.num_stages)
    return Problem(prof, pl, prof.microbatches, parse_mem_limit("2p", prof, pl), "makespan")


def _levels(passes: Sequence[Pass]) -> dict[tuple[int, int], list[float]]:
    """Per (chunk, microbatch): the memory it holds after each start and each end of its F, B, W in turn."""
    out: dict[tuple[int, int], list[float]] = {}
    for kind in (Kind.F, Kind.B, Kind.W):
        for ps in passes:
            if ps.action.kind is kind:
                levels = out.setdefault((ps.action.chunk, ps.action.microbatch), [0.0])
                levels += [levels[-1] + ps.alloc, levels[-1] + ps.alloc - ps.free]
    return out


def _never_longer_or_heavier(relaxed: Sequence[Pass], own: Sequence[Pass]) -> None:
    assert [ps.action for ps in relaxed] == [ps.action for ps in own]
    for r, o in zip(relaxed, own):
        assert (r.rank, r.inputs, r.alloc) == (o.rank, o.inputs, o.alloc)
        assert 0.0 <= r.duration <= o.duration + 1e-12, r.action
    own_levels = _levels(own)
    for key, levels in _levels(relaxed).items():
        assert all(a <= b + 1e-12 for a, b in zip(levels, own_levels[key])), key


# Torch's runtime memory: B raises what is held (mem_W_torch 1.4 > mem_B 1.0) and W leaves 0.2 held to the end.
TORCH = {"F": 2, "B": 2, "W": 1, "full_backward": 2.5, "mem_B": 1.0, "mem_W": 0.5, "mem_B_torch": 1.0,
         "mem_W_torch": 1.4, "mem_kept_torch": 0.2}


@pytest.mark.parametrize("costs,saves", [
    ([], False),
    ([StageCost(1, 1, 1)], False),  # no full backward given: it costs B + W and holds what B and W hold
    ([StageCost(1, 1, 1, full_backward=2.0)], False),  # a measured one equal to B + W saves nothing
    ([StageCost(1, 1, 1, full_backward=2.0 * (1 - 1e-14))], False),  # round-off is not a saving
    ([StageCost(1, 1, 1, full_backward=2.5)], False),  # dearer than apart
    ([StageCost(1, 1, 1), StageCost(1, 1, 1, full_backward=1.5)], True),  # one chunk is enough
    ([StageCost(1, 1, 1, mem_B=1.0, mem_W=1.2)], True),  # split backward holds more after B than F did
    ([StageCost(1, 1, 1, mem_B=1.0, mem_W=1.0)], False),  # holds the same: no saving
    ([StageCost(1, 1, 1, mem_kept=0.1)], True),  # split backward keeps some until the iteration ends
    ([StageCost(1, 1, 1, mem_kept=0.0)], False),
])
def test_fusion_saves_only_where_a_fused_backward_is_cheaper_or_lighter(costs: list[StageCost], saves: bool) -> None:
    assert fusion_saves(costs) is saves


def test_fusion_relaxation_shortens_w_to_what_a_fused_backward_leaves_after_b() -> None:
    # Chunk 0: full backward 2.5 after B 2 leaves 0.5 < W 1. Chunk 1: 1.5 is below B itself: W takes 0.
    # Chunk 2: 3.5 is dearer than B + W, so W keeps its own 1. F and B keep their times.
    prof = _profile([{"F": 2, "B": 2, "W": 1, "full_backward": fb} for fb in (2.5, 1.5, 3.5)])
    problem = _problem(prof)
    relaxed = fusion_relaxation(problem)
    want = {(0, Kind.F): 2, (0, Kind.B): 2, (0, Kind.W): 0.5, (1, Kind.W): 0.0, (2, Kind.W): 1.0, (1, Kind.B): 2}
    for ps in relaxed:
        if (ps.action.chunk, ps.action.kind) in want:
            assert ps.duration == pytest.approx(want[(ps.action.chunk, ps.action.kind)])
    # The paper's memory (mem_W <= mem_B): B and W free what they freed before.
    assert [(ps.alloc, ps.free) for ps in relaxed] == [(ps.alloc, ps.free) for ps in problem.passes]
    _never_longer_or_heavier(relaxed, problem.passes)


def test_fusion_relaxation_frees_everything_where_b_would_raise_memory() -> None:
    # Levels after each start and end of F, B, W. Own passes (torch's runtime): F takes 1.0, B raises it
    # to 1.4, W frees down to the 0.2 kept. Relaxed as a fused backward: B frees nothing, W all of mem_B.
    problem = _problem(_profile([TORCH, dict(TORCH, F=3)], memory_model="torch-runtime"))
    own, relaxed = _levels(problem.passes), _levels(fusion_relaxation(problem))
    assert own[(0, 0)] == pytest.approx([0.0, 1.0, 1.0, 1.0, 1.4, 1.4, 0.2])
    assert relaxed[(0, 0)] == pytest.approx([0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    _never_longer_or_heavier(fusion_relaxation(problem), problem.passes)


def test_overlap_relaxation_scales_every_pass_by_its_chunks_pair_ratio() -> None:
    # Pair time 2.25 over F + full backward 3: every pass of that chunk costs 0.75 of its time; the
    # chunk whose stage gives no pair time keeps its own (ratio 1).
    prof = _profile([{"F": 1, "B": 1, "W": 1, "overlap_f_b": 2.25}, {"F": 2, "B": 2, "W": 2}])
    problem = _problem(prof)
    relaxed = overlap_relaxation(problem)
    for r, o in zip(relaxed, problem.passes):
        assert r.duration == pytest.approx(o.duration * (0.75 if o.action.chunk == 0 else 1.0))
        assert (r.action, r.alloc, r.free) == (o.action, o.alloc, o.free)
    # Given other passes, it scales those rather than the problem's own.
    halved = [Pass(ps.action, ps.rank, ps.duration / 2, ps.inputs, ps.alloc, ps.free) for ps in problem.passes]
    scaled = [ps.duration for ps in overlap_relaxation(problem, halved)]
    assert scaled == pytest.approx([r.duration / 2 for r in relaxed])


def test_bound_passes_are_the_problems_own_when_nothing_is_relaxed() -> None:
    problem = _problem(uniform_profile(1, 2, 1, 0.5, p=3, m=3))
    assert bound_passes(problem) is problem.passes


@pytest.mark.parametrize("stages,placement,extra", [
    ([{"F": 2, "B": 2, "W": 1, "full_backward": 2.5}] * 2, linear(2), {}),
    ([{"F": 1, "B": 1, "W": 1, "overlap_f_b": 2.25}] * 2, vshape(2), {}),
    ([{"F": 1, "B": 2, "W": 1, "full_backward": 2.5, "overlap_f_b": 3.0}, {"F": 2, "B": 1, "W": 1}], interleaved(2, 2),
     {}),
    ([TORCH, dict(TORCH, F=3, overlap_f_b=4.0)], linear(2), {"memory_model": "torch-runtime"}),
])
def test_bound_passes_apply_both_relaxations_and_only_shorten_or_lighten(stages: list[dict[str, Any]],
                                                                         placement: Placement,
                                                                         extra: dict[str, Any]) -> None:
    problem = _problem(_profile(stages, m=3, **extra), placement)
    passes = bound_passes(problem)
    _never_longer_or_heavier(passes, problem.passes)
    expected = problem.passes
    if fusion_saves(problem.chunk_costs):
        expected = fusion_relaxation(problem, expected)
    if problem.profile.gives_overlap:
        expected = overlap_relaxation(problem, expected)
    assert passes == expected
    assert passes != problem.passes  # every case here relaxes something

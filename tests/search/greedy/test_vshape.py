"""The Zero Bubble authors' adaptive V, round by round (zbsearch/search/greedy/vshape.py): `is_vshape`
reads the placement's structure (not its name), `run_v` refuses any other placement and returns the best
of its approval re-runs, and its switches do what their docstring says: `w_defer` bounds the W held back,
`warmup` the chunk-0 microbatches in flight, `safe_admit` keeps room at the smallest limit."""

from __future__ import annotations


import pytest

from zbsearch.core.errors import PreconditionError
from zbsearch.core.ir import Kind, Placement, dualpipe, interleaved, linear, vshape
from zbsearch.core.memory import MemoryLimit, min_feasible_limit, no_limit
from zbsearch.core.profile import Profile, uniform_profile
from zbsearch.search.greedy.candidates import engine_schedule
from zbsearch.search.greedy.options import CannotFit, EngineResult, fits
from zbsearch.search.greedy.vshape import VOptions, VRounds, is_vshape, run_v
from zbsearch.search.problem import Problem
from zbsearch.sim.validate import validate
from random_pipelines import uneven_stages


def _scaled(profile: Profile, factor: float) -> MemoryLimit:
    """`factor` times the smallest feasible limit of each rank on the V."""
    p = profile.num_stages
    return MemoryLimit(f"{factor}x", tuple(factor * x for x in min_feasible_limit(profile, vshape(p))))


@pytest.mark.parametrize("p", [1, 2, 3, 6])
def test_the_v_shape_is_recognised_at_every_p(p: int) -> None:
    assert is_vshape(vshape(p))


@pytest.mark.parametrize("placement", [
    linear(4), interleaved(4, 2), interleaved(3, 3),
    dualpipe(4),                                          # the same chunks on each rank, but two routes
    Placement("v", 3, vshape(3).chunk_to_rank, (tuple(reversed(range(6))),)),     # the loss on rank 0's far end
    Placement("v", 2, (0, 1, 0, 1), ((0, 1, 2, 3),)),     # named v, laid out looped
], ids=["linear", "interleaved", "interleaved-3", "dualpipe", "reversed-route", "looped-named-v"])
def test_anything_else_is_not_a_v_whatever_its_name(placement: Placement) -> None:
    assert not is_vshape(placement)


def test_the_structure_decides_not_the_name() -> None:
    v = vshape(3)
    assert is_vshape(Placement("imported-from-torch", 3, v.chunk_to_rank, v.routes))
    # One rank with two chunks on one route is both the V and interleaving.
    assert is_vshape(interleaved(1, 2))


@pytest.mark.parametrize("placement", [linear(4), interleaved(4, 2), dualpipe(4)], ids=["linear", "interleaved",
                                                                                       "dualpipe"])
def test_run_v_refuses_other_placements_naming_the_chunked_engine(placement: Placement) -> None:
    profile = uniform_profile(1, 1, 1, p=4, m=8)
    with pytest.raises(PreconditionError) as err:
        run_v(Problem(profile, placement, 8, no_limit(profile)), VOptions())
    assert f"not {placement.name!r}" in str(err.value) and "engine 'chunked'" in str(err.value)


OPTIONS = [VOptions(), VOptions(b_first=False, fill_b=False), VOptions(safe_admit=True, w_defer=1),
           VOptions(warmup=1.0, fill_f=False)]


@pytest.mark.parametrize("seed,p,m", [(0, 2, 5), (1, 3, 6), (2, 4, 9)])
@pytest.mark.parametrize("factor", [1.5, 4.0])
@pytest.mark.parametrize("options", OPTIONS, ids=[o.label for o in OPTIONS])
def test_run_v_is_valid_timed_as_simulated_and_no_worse_than_its_first_run(seed: int, p: int, m: int, factor: float,
                                                                           options: VOptions) -> None:
    profile = uneven_stages(seed, p, m)
    problem = Problem(profile, vshape(p), m, _scaled(profile, factor))
    res = run_v(problem, options)
    tl = validate(engine_schedule(res, problem, options), profile, problem.limit)   # type: ignore[arg-type]
    assert tl is not None
    assert res.cost("span") == pytest.approx(tl.span, rel=1e-12)
    assert res.cost("makespan") == pytest.approx(tl.makespan, rel=1e-12)
    assert all(fits(tl.peak_memory(r), problem.limit.per_rank[r]) for r in range(p))
    # The re-runs with the bubbles approved are kept only while they shorten the span.
    assert res.cost("span") <= VRounds(problem, options).run().cost("span")


def _most_held(res: EngineResult, kind: Kind, chunk: int | None = None) -> list[int]:
    """Per rank, the most passes of one chunk (or of any) waiting for `kind` along the rank's order:
    B after F for kind B, W after B for kind W."""
    before = Kind.F if kind is Kind.B else Kind.B
    out = []
    for order in res.order:
        most = now = 0
        for step in order:
            if chunk is not None and step.chunk != chunk:
                continue
            now += 1 if step.kind is before else -1 if step.kind is kind else 0
            most = max(most, now)
        out.append(most)
    return out


@pytest.mark.parametrize("k", [0, 1, 3])
def test_w_defer_holds_back_at_most_k_weight_passes(k: int) -> None:
    # A B that makes k + 1 held is followed at once by the oldest held W: before every F and B, at most
    # k are held on the rank.
    profile = uneven_stages(3, 3, 8)
    problem = Problem(profile, vshape(3), 8, no_limit(profile))
    res = run_v(problem, VOptions(w_defer=k))
    for order in res.order:
        held = 0
        for step, after in zip(order, order[1:] + [None]):
            if step.kind is not Kind.W:
                assert held <= k
            held += 1 if step.kind is Kind.B else -1 if step.kind is Kind.W else 0
            if held > k:
                assert after is not None and after.kind is Kind.W
    if k == 0:                                           # each B is followed at once by its own W
        for order in res.order:
            for step, after in zip(order, order[1:]):
                if step.kind is Kind.B:
                    assert (after.kind, after.chunk, after.microbatch) == (Kind.W, step.chunk, step.microbatch)


def test_the_warm_up_factor_caps_chunk_0_in_flight() -> None:
    # p = 2, F = B = W = 1 per stage, so 0.5 per chunk, no hops. Round trip from rank r's chunk-0 position
    # r to the end of the V and back: (4 - r) chunks of F + B = 1 each; each rank works 2 x 1.5 = 3 per
    # microbatch. Caps: ceil(4/3) = 2 on rank 0, ceil(3/3) = 1 on rank 1. Rank 0's warm-up reaches its cap:
    # microbatch 0's chunk-1 forward there has its input at 1.5, and chunk-0 forwards end at 0.5, 1.0
    # (and 1.5 uncapped, a third one in flight).
    profile = uniform_profile(1, 1, 1, p=2, m=8)
    problem = Problem(profile, vshape(2), 8, no_limit(profile))
    capped = run_v(problem, VOptions(warmup=1.0))
    assert [_most_held(capped, Kind.B, chunk=r)[r] for r in range(2)] == [2, 1]
    # Without the cap and without a limit, rank 0 runs more chunk-0 forwards ahead.
    free = run_v(problem, VOptions())
    assert _most_held(free, Kind.B, chunk=0)[0] > 2


def test_safe_admission_finishes_at_the_smallest_limit_where_the_papers_jams() -> None:
    # Room for one microbatch's two chunks per rank; with the warm-up capped, admitting whenever a chunk-0
    # forward fits fills a rank and leaves no room for a chunk-1 forward: the run jams.
    profile = uniform_profile(1, 1, 1, p=2, m=4)
    problem = Problem(profile, vshape(2), 4, _scaled(profile, 1.0))
    assert problem.limit.per_rank == (1.0, 1.0)
    with pytest.raises(CannotFit):
        run_v(problem, VOptions(warmup=1.0))
    options = VOptions(warmup=1.0, safe_admit=True)
    res = run_v(problem, options)
    tl = validate(engine_schedule(res, problem, options), profile, problem.limit)   # type: ignore[arg-type]
    assert tl is not None and max(tl.peak_memory(r) for r in range(2)) <= 1.0


@pytest.mark.parametrize("options,label", [
    (VOptions(), "v-rounds,b-first,fill-b,fill-f"),
    (VOptions(fill_b=False, fill_f=False, b_first=False), "v-rounds,f-first,fit-b,fit-f"),
    (VOptions(safe_admit=True, w_defer=2, warmup=1.5),
     "v-rounds,b-first,fill-b,fill-f,safe-admit,w-defer=2,warmup=1.5"),
    (VOptions(warmup=2.0), "v-rounds,b-first,fill-b,fill-f,warmup=2"),
])
def test_label_names_every_switch(options: VOptions, label: str) -> None:
    assert options.label == label

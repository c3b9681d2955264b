"""solve/incumbent.py: an incumbent's backwards written split into B and W (with_backwards_split, pairs
too) or fused again (with_backwards_fused), and fuse_if_faster, which fuses only where that is faster
and still valid."""

from __future__ import annotations

from typing import Any

import pytest

from zbsearch.core.ir import Action, Kind, Schedule, build, linear
from zbsearch.core.memory import parse_mem_limit
from zbsearch.core.plan_record import PlanRecord
from zbsearch.core.profile import Profile
from zbsearch.schedules import generate
from zbsearch.search.problem import Problem
from zbsearch.search.solve.incumbent import fuse_if_faster, with_backwards_fused, with_backwards_split
from zbsearch.search.solve.starts import Start, valid_start
from zbsearch.sim.simulate import simulate
from zbsearch.sim.validate import check

SOURCE = {"kind": "estimated", "method": "incumbent tests"}
# A plan record on two chunks, kept by the rewrites as the meta is.
PLAN = PlanRecord(recompute=(("layers.0", "full"),), recompute_microbatches=(frozenset({0}), None),
                  memory_model="torch-runtime", mem_limit="2p")


def _a(chunk: int, kind: Kind, mb: int) -> Action:
    return Action(chunk, kind, mb)


def _profile(full_backward: float | None, p: int = 2, m: int = 4) -> Profile:
    stage: dict[str, Any] = {"F": 1, "B": 1, "W": 1, "mem_B": 1.0, "mem_W": 0.5}
    if full_backward is not None:
        stage["full_backward"] = full_backward
    return Profile.from_dict({"stages": [stage] * p, "comm": 0.25, "microbatches": m, "source": SOURCE})


def _start(prof: Profile, schedule: Schedule, objective: str = "makespan") -> tuple[Problem, Start]:
    problem = Problem(prof, schedule.placement, schedule.num_microbatches, parse_mem_limit("2p", prof), objective)
    start = valid_start(problem, schedule)
    assert start is not None
    return problem, start


def test_split_writes_each_full_backward_as_b_then_w_in_place_and_keeps_name_meta_and_plan() -> None:
    base = generate("1f1b", 2, 3)
    schedule = build(base.name, base.placement, 3, base.ranks, plan=PLAN, note="kept")
    split = with_backwards_split(schedule)
    assert split.name == schedule.name and split.meta == {"note": "kept"} and split.placement == schedule.placement
    assert split.plan == PLAN
    for own, out in zip(schedule.ranks, split.ranks):
        expected = []
        for a in own:
            expected += [_a(a.chunk, Kind.B, a.microbatch), _a(a.chunk, Kind.W, a.microbatch)] \
                if a.kind is Kind.FULL_B else [a]
        assert list(out) == expected


def test_split_takes_overlapped_pairs_apart_into_their_passes() -> None:
    schedule = generate("dualpipe", 4, 8)
    assert any(a.kind is Kind.OVERLAP for rank in schedule.ranks for a in rank)  # the premise
    split = with_backwards_split(schedule)
    kinds = {a.kind for rank in split.ranks for a in rank}
    assert kinds <= {Kind.F, Kind.B, Kind.W}
    # Every pass appears once: each chunk has m of each kind, the pair's forward before its backward.
    for rank_own, rank_split in zip(schedule.ranks, split.ranks):
        flat = [(p.chunk, p.kind, p.microbatch) for a in rank_own for p in a.passes()]
        assert len(rank_split) == len(flat) + sum(kind is Kind.FULL_B for _, kind, _ in flat)
    assert check(split).ok


def test_split_never_delays_a_schedule() -> None:
    # Apart, B hands its gradient on at its end instead of after W too: nothing starts later.
    prof = _profile(None)
    for name in ("1f1b", "gpipe"):
        schedule = generate(name, 2, 4)
        assert simulate(with_backwards_split(schedule), prof).makespan <= simulate(schedule, prof).makespan + 1e-9


def test_fused_joins_only_a_b_directly_followed_by_its_own_w() -> None:
    F, B, W = Kind.F, Kind.B, Kind.W
    rank0 = [_a(0, F, 0), _a(0, F, 1), _a(0, B, 0), _a(0, W, 0), _a(0, B, 1), _a(0, F, 2), _a(0, W, 1), _a(0, B, 2),
             _a(0, W, 2)]
    rank1 = [_a(1, F, 0), _a(1, B, 0), _a(1, F, 1), _a(1, B, 1), _a(1, W, 0), _a(1, F, 2), _a(1, B, 2), _a(1, W, 1),
             _a(1, W, 2)]
    schedule = build("hand", linear(2), 3, [rank0, rank1], plan=PLAN, origin="test")
    fused = with_backwards_fused(schedule)
    BW = Kind.FULL_B
    # Rank 0: B0 W0 adjacent, B1 then F2 then W1 (not adjacent), B2 W2 adjacent.
    assert list(fused.ranks[0]) == [_a(0, F, 0), _a(0, F, 1), _a(0, BW, 0), _a(0, B, 1), _a(0, F, 2), _a(0, W, 1),
                                    _a(0, BW, 2)]
    # Rank 1: B1 is followed by W0 (another microbatch), and B2 by W1: nothing is fused.
    assert fused.ranks[1] == schedule.ranks[1]
    assert fused.name == "hand" and fused.meta == {"origin": "test"} and fused.plan == PLAN


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "zb-h1", "zb-h2"])
def test_split_and_fused_undo_each_other(name: str) -> None:
    schedule = generate(name, 3, 6)
    split = with_backwards_split(schedule)
    # Fusing a split schedule only joins pairs that splitting made or that were adjacent already.
    assert with_backwards_split(with_backwards_fused(split)).ranks == split.ranks
    if all(a.kind is not Kind.B for rank in schedule.ranks for a in rank):  # fused backwards only
        assert with_backwards_fused(split).ranks == schedule.ranks


@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_fuse_if_faster_fuses_every_adjacent_pair_when_that_is_faster(objective: str) -> None:
    prof = _profile(1.5)  # a fused backward costs 1.5 against B + W = 2
    problem, start = _start(prof, with_backwards_split(generate("1f1b", 2, 4)), objective)
    fused, count = fuse_if_faster(problem, start)
    assert count == 2 * 4  # every backward of 1F1B, split, sits right before its W
    assert fused.schedule.ranks == generate("1f1b", 2, 4).ranks and fused.name == start.name
    tl = simulate(fused.schedule, prof)
    assert fused.objective == pytest.approx(tl.makespan if objective == "makespan" else tl.span)
    assert fused.objective < start.objective
    assert check(fused.schedule, prof, problem.limit).ok


@pytest.mark.parametrize("full_backward", [None, 2.0, 2.5])
def test_fuse_if_faster_keeps_the_start_when_fusing_saves_nothing(full_backward: float | None) -> None:
    # Fused costs B + W or more: B's gradient leaves later, so nothing finishes sooner.
    problem, start = _start(_profile(full_backward), with_backwards_split(generate("1f1b", 2, 4)))
    kept, count = fuse_if_faster(problem, start)
    assert kept is start and count is None


def test_fuse_if_faster_keeps_a_start_with_nothing_to_fuse() -> None:
    # Every forward, every B, every W: no B is right before its own W (B3 precedes W0).
    F, B, W = Kind.F, Kind.B, Kind.W
    ranks = [[_a(c, k, i) for k in (F, B, W) for i in range(4)] for c in range(2)]
    problem, start = _start(_profile(1.0), build("phases", linear(2), 4, ranks))
    kept, count = fuse_if_faster(problem, start)
    assert kept is start and count is None

"""The 1F1B family of handcrafted schedules: GPipe, 1F1B, ZB-H1, ZB-H2 and Megatron's interleaved 1F1B.

Every generator must give a complete, deadlock-free schedule for any p, m it accepts (edge cases
included), reproduce its closed-form bubble and peak memory under uniform stages, and refuse what it
does not define with a PreconditionError that says what is needed.
"""

from __future__ import annotations

import pytest

from zbsearch.core.errors import PreconditionError
from zbsearch.core.ir import Kind
from zbsearch.core.profile import uniform_profile
from zbsearch.schedules import generate
from zbsearch.schedules.interleaved import interleaved_1f1b
from zbsearch.schedules.zero_bubble import zb_h1, zb_h2
from zbsearch.sim.simulate import Timeline, simulate
from zbsearch.sim.validate import validate

LINEAR = ["gpipe", "1f1b", "zb-h1", "zb-h2"]
CHUNKS = [2, 3, 4]

# Edge cases first: one rank, one microbatch, fewer microbatches than warm-up forwards.
LINEAR_PM = [(1, 1), (1, 4), (2, 1), (2, 2), (2, 5), (3, 1), (3, 2), (4, 3), (4, 4), (4, 7), (4, 9),
             (5, 6), (6, 13)]
# Interleaved needs m a multiple of p.
INTERLEAVED_PM = [(1, 1), (1, 3), (2, 2), (2, 6), (3, 3), (4, 4), (4, 8), (3, 12)]

# (F, B, W) under which the ZB closed forms hold (W <= F, W <= B, 2W <= F + B), and plain ones.
TIMES = [(1.0, 1.0, 1.0), (3.0, 2.0, 1.0), (2.0, 3.0, 1.5), (1.0, 2.0, 0.5)]
CLOSED_FORM_PM = [(2, 4), (3, 6), (4, 8), (5, 9), (8, 16)]


def _run(name: str, p: int, m: int, chunks: int | None = None,
         times: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> Timeline:
    """Simulate on a uniform profile with comm 0 (the validity tests below run the validator)."""
    return simulate(generate(name, p, m, chunks), uniform_profile(*times, p=p, m=m))


def _validated(name: str, p: int, m: int, chunks: int | None = None) -> Timeline:
    timeline = validate(generate(name, p, m, chunks), uniform_profile(1.0, 1.0, 1.0, 0.5, p=p, m=m))
    assert timeline is not None
    return timeline


def _counts(timeline: Timeline) -> dict[Kind, int]:
    counts = {k: 0 for k in Kind}
    for slot in timeline.iter_slots():
        counts[slot.action.kind] += 1
    return counts


@pytest.mark.parametrize("p,m", LINEAR_PM)
@pytest.mark.parametrize("name", LINEAR)
def test_linear_schedules_validate(name: str, p: int, m: int) -> None:
    counts = _counts(_validated(name, p, m))
    assert counts[Kind.F] == p * m
    if name.startswith("zb"):
        assert counts[Kind.B] == counts[Kind.W] == p * m and counts[Kind.FULL_B] == 0
    else:
        assert counts[Kind.FULL_B] == p * m and counts[Kind.B] == counts[Kind.W] == 0


@pytest.mark.parametrize("p,m", INTERLEAVED_PM)
@pytest.mark.parametrize("v", CHUNKS)
def test_interleaved_validates(v: int, p: int, m: int) -> None:
    schedule = generate("interleaved-1f1b", p, m, v)
    assert schedule.placement.num_chunks == p * v
    assert schedule.placement.chunks_on(0) == tuple(range(0, p * v, p))
    counts = _counts(_validated("interleaved-1f1b", p, m, v))
    assert counts[Kind.F] == counts[Kind.FULL_B] == p * v * m


@pytest.mark.parametrize("p,m", [(1, 1), (2, 3), (4, 4), (4, 9), (3, 7)])
def test_interleaved_with_one_chunk_is_1f1b(p: int, m: int) -> None:
    # One chunk per rank has no groups to keep together, so m need not be a multiple of p.
    assert generate("interleaved-1f1b", p, m, 1).ranks == generate("1f1b", p, m).ranks


def test_interleaved_follows_megatron_order() -> None:
    # p=2, v=2, m=4: groups of 2 microbatches, chunk by chunk; rank 0 warms up with 2*1 + 1*2 = 4.
    rank0 = [str(a) for a in interleaved_1f1b(2, 4, 2).ranks[0]]
    assert rank0[:4] == ["0F0", "0F1", "2F0", "2F1"]
    assert rank0[4:8] == ["0F2", "2B0", "0F3", "2B1"]
    backwards = [a for a in rank0 if a.endswith(("B0", "B1", "B2", "B3"))]
    assert backwards == ["2B0", "2B1", "0B0", "0B1", "2B2", "2B3", "0B2", "0B3"]
    # The last rank starts its backwards after the (v-1)*p = 2 warm-up forwards.
    rank1 = [str(a) for a in interleaved_1f1b(2, 4, 2).ranks[1]]
    assert rank1[:4] == ["1F0", "1F1", "3F0", "3B0"]


@pytest.mark.parametrize("times", TIMES)
@pytest.mark.parametrize("p,m", CLOSED_FORM_PM)
def test_closed_form_bubbles(p: int, m: int, times: tuple[float, float, float]) -> None:
    F, B, W = times
    work = m * (F + B + W)
    assert _run("gpipe", p, m, times=times).makespan - work == pytest.approx((p - 1) * (F + B + W))
    assert _run("1f1b", p, m, times=times).makespan - work == pytest.approx((p - 1) * (F + B + W))
    # ZB-H1 (makespan): needs W <= min(F, B) and m >= p.
    assert _run("zb-h1", p, m, times=times).makespan - work == pytest.approx((p - 1) * (F + B - W))
    # ZB-H2 (span): needs W <= F, 2W <= F + B and m >= 2p - 1.
    if m >= 2 * p - 1:
        assert _run("zb-h2", p, m, times=times).span - work == pytest.approx((p - 1) * (F + B - 2 * W))
    for v in CHUNKS:
        if m % p == 0:
            bubble = _run("interleaved-1f1b", p, m, v, times).makespan - work
            assert bubble == pytest.approx((p - 1) * (F + B + W) / v)


def test_zb_h2_is_zero_bubble_when_2w_is_f_plus_b() -> None:
    tl = _run("zb-h2", 4, 10, times=(2.0, 1.0, 1.5))
    assert tl.span == pytest.approx(10 * 4.5)
    assert tl.bubble_rate_span == pytest.approx(0.0, abs=1e-12)


def test_closed_forms_fail_outside_their_conditions() -> None:
    # Guards the stated conditions: with W > F, ZB-H1 cannot hide (p-1)W of its bubble.
    p, m, (F, B, W) = 4, 8, (1.0, 2.0, 1.5)
    assert _run("zb-h1", p, m, times=(F, B, W)).makespan - m * (F + B + W) > (p - 1) * (F + B - W)


@pytest.mark.parametrize("p,m", [(1, 3), (2, 4), (4, 8), (5, 15)])
def test_peak_memory(p: int, m: int) -> None:
    def peaks(name: str, chunks: int | None = None) -> list[float]:
        tl = _run(name, p, m, chunks)
        return [tl.peak_memory(r) for r in range(p)]

    assert peaks("gpipe") == pytest.approx([m] * p)
    assert max(peaks("1f1b")) == pytest.approx(p) == peaks("1f1b")[0]
    assert max(peaks("zb-h1")) == pytest.approx(p) == peaks("zb-h1")[0]
    assert max(peaks("zb-h2")) == pytest.approx(min(2 * p - 1, m)) == peaks("zb-h2")[0]
    for v in CHUNKS:
        # Rank 0 holds its 2(p-1) + (v-1)p warm-up chunk-forwards plus one, each 1/v of a stage.
        assert max(peaks("interleaved-1f1b", v)) == pytest.approx(p + (p - 1) / v)


def test_small_m_caps_the_warm_up() -> None:
    # m below the warm-up count: every microbatch is in flight at once, no more.
    tl = _run("zb-h2", 4, 3)
    assert [tl.peak_memory(r) for r in range(4)][0] == pytest.approx(3)


@pytest.mark.parametrize("p,m,v,needs", [
    (4, 6, 2, "m a multiple of p"),
    (3, 4, 3, "m a multiple of p"),
    (2, 4, 0, "v >= 1"),
])
def test_interleaved_preconditions(p: int, m: int, v: int, needs: str) -> None:
    with pytest.raises(PreconditionError, match=needs) as info:
        generate("interleaved-1f1b", p, m, v)
    assert f"p={p}, m={m}" in str(info.value)


@pytest.mark.parametrize("func", [zb_h1, zb_h2])
def test_zero_bubble_preconditions(func) -> None:
    with pytest.raises(PreconditionError, match="m >= 1"):
        func(4, 0)
    with pytest.raises(PreconditionError, match="p >= 1"):
        func(0, 4)


def test_registry_rejects_chunks_for_fixed_placements() -> None:
    with pytest.raises(PreconditionError, match="interleaved-1f1b"):
        generate("zb-h1", 4, 8, 3)

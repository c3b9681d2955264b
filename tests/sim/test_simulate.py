"""The simulator against timelines worked out by hand on tiny cases.

Every expected number below was computed by hand from the rules in simulate.py's docstring (a pass
starts when its rank is free and its inputs have arrived; cross-rank hops pay comm, same-rank hand-offs
are free; F allocates mem_B at its start, I frees mem_B - mem_W and W frees mem_W at their ends, a full
backward frees mem_B at its end). The derivations are in the comments.
"""

from __future__ import annotations

import pytest

from zbsearch.core.errors import ScheduleError
from zbsearch.core.ir import BW, B, F, W, Kind, build, dualpipe, interleaved, linear, overlap, vshape
from zbsearch.core.profile import Profile
from zbsearch.sim.summary import summarize
from zbsearch.schedules import generate
from zbsearch.sim import simulate as simulate_module
from zbsearch.sim.rank_state import ChunkProgress, RankClock, memory_delta
from zbsearch.sim.simulate import chunk_costs, pass_cost, simulate


def profile(stages, comm, **extra) -> Profile:
    data = {
        "name": "hand", "stages": stages, "comm": comm,
        "source": {"kind": "estimated", "method": "hand-written test numbers"},
    }
    data.update(extra)
    return Profile.from_dict(data)


def times(tl, rank):
    return [(str(s.action), s.start, s.end) for s in tl.slots[rank]]


def curve(tl, rank):
    return [(t, level, str(a)) for t, level, a in tl.memory[rank]]


def approx_rows(rows):
    return [(name, pytest.approx(a), pytest.approx(b)) for name, a, b in rows]


# -- 1. linear, p=2, m=2, split backward ---------------------------------------------------------

P2 = [
    {"F": 1, "B": 2, "W": 1.5, "mem_B": 4, "mem_W": 1},
    {"F": 2, "B": 3, "W": 4, "mem_B": 6, "mem_W": 2},
]


def split_p2():
    ranks = [
        [F(0, 0), F(0, 1), B(0, 0), W(0, 0), B(0, 1), W(0, 1)],
        [F(1, 0), B(1, 0), F(1, 1), B(1, 1), W(1, 0), W(1, 1)],
    ]
    return build("split", linear(2), 2, ranks)


def test_linear_split_timeline():
    tl = simulate(split_p2(), profile(P2, [0.5]))
    # rank 0: 0F0 [0,1], 0F1 [1,2]
    # rank 1: 1F0 waits for 0F0 (1) + comm 0.5 -> [1.5,3.5]; 1I0 is on the loss chunk -> [3.5,6.5];
    #         1F1 (input at 2.5) waits for the rank -> [6.5,8.5]; 1I1 [8.5,11.5]; 1W0 [11.5,15.5]; 1W1 [15.5,19.5]
    # rank 0: 0I0 needs 1I0 (6.5) + 0.5 -> [7,9]; 0W0 [9,10.5]; 0I1 needs 1I1 (11.5) + 0.5 -> [12,14]; 0W1 [14,15.5]
    assert times(tl, 0) == approx_rows([
        ("0F0", 0, 1), ("0F1", 1, 2), ("0I0", 7, 9), ("0W0", 9, 10.5), ("0I1", 12, 14), ("0W1", 14, 15.5)])
    assert times(tl, 1) == approx_rows([
        ("1F0", 1.5, 3.5), ("1I0", 3.5, 6.5), ("1F1", 6.5, 8.5), ("1I1", 8.5, 11.5),
        ("1W0", 11.5, 15.5), ("1W1", 15.5, 19.5)])
    assert [s.index for s in tl.slots[1]] == list(range(6))
    assert all(s.rank == 1 for s in tl.slots[1])


def test_linear_split_metrics():
    tl = simulate(split_p2(), profile(P2, [0.5]))
    assert tl.makespan == pytest.approx(19.5)                  # rank 1's last W
    assert tl.span_of(0) == pytest.approx(15.5)
    assert tl.span_of(1) == pytest.approx(19.5 - 1.5)
    assert tl.span == pytest.approx(18)
    assert tl.first_start(1) == pytest.approx(1.5) and tl.last_end(0) == pytest.approx(15.5)
    assert tl.work(0) == pytest.approx(2 * (1 + 2 + 1.5))     # 9
    assert tl.work(1) == pytest.approx(2 * (2 + 3 + 4))       # 18
    # 1 - 27 / (2 * 19.5) and 1 - 27 / (2 * 18)
    assert tl.bubble_rate_makespan == pytest.approx(12 / 39)
    assert tl.bubble_rate_span == pytest.approx(0.25)
    assert tl.bubble_rate(27 / 2) == pytest.approx(0.0)
    rep = summarize(tl)
    assert rep.makespan == pytest.approx(19.5) and rep.span == pytest.approx(18)
    assert rep.idle_per_rank == pytest.approx([10.5, 1.5])
    assert rep.work_per_rank == pytest.approx([9, 18])
    assert rep.span_per_rank == pytest.approx([15.5, 18])
    assert rep.bubble_rate_makespan == pytest.approx(12 / 39)


def test_linear_split_memory():
    tl = simulate(split_p2(), profile(P2, [0.5]))
    # rank 0, mem_B 4, mem_W 1: F +4 at start, I -3 and W -1 at end
    assert curve(tl, 0) == [
        (0, 4, "0F0"), (1, 8, "0F1"), (9, 5, "0I0"), (10.5, 4, "0W0"), (14, 1, "0I1"), (15.5, 0, "0W1")]
    # rank 1, mem_B 6, mem_W 2: at 6.5 1I0's release comes before 1F1's allocation
    assert curve(tl, 1) == [
        (1.5, 6, "1F0"), (6.5, 2, "1I0"), (6.5, 8, "1F1"), (11.5, 4, "1I1"), (15.5, 2, "1W0"), (19.5, 0, "1W1")]
    assert tl.peak_memory(0) == 8 and tl.peak_memory(1) == 8
    rep = summarize(tl)
    assert rep.peak_memory_per_rank == pytest.approx([8 / 4, 8 / 6])
    assert rep.peak_memory_bytes_per_rank is None


def test_comm_zero_and_no_comm_links():
    # With comm 0, 1F0 starts right at 0F0's end and 0I0 right at 1I0's end.
    tl = simulate(split_p2(), profile(P2, 0))
    assert tl.slots[1][0].start == pytest.approx(1)
    assert tl.slots[0][2].start == pytest.approx(tl.slots[1][1].end)


# -- 2. full backward with its own time ----------------------------------------------------------

def test_full_backward_uses_profile_time_and_frees_mem_B():
    prof = profile([
        {"F": 1, "B": 2, "W": 1, "full_backward": 2.5, "mem_B": 3, "mem_W": 1},
        {"F": 2, "B": 3, "W": 2, "full_backward": 4, "mem_B": 5, "mem_W": 1},
    ], [0.25])
    tl = simulate(generate("1f1b", 2, 2), prof)
    # rank 0: 0F0 0F1 0B0 0B1; rank 1: 1F0 1B0 1F1 1B1
    # 1F0 [1.25,3.25]; 1B0 [3.25,7.25]; 1F1 [7.25,9.25]; 1B1 [9.25,13.25]
    # 0B0 needs 1B0 + 0.25 -> [7.5,10]; 0B1 needs 1B1 + 0.25 -> [13.5,16]
    assert times(tl, 0) == approx_rows([("0F0", 0, 1), ("0F1", 1, 2), ("0B0", 7.5, 10), ("0B1", 13.5, 16)])
    assert times(tl, 1) == approx_rows([
        ("1F0", 1.25, 3.25), ("1B0", 3.25, 7.25), ("1F1", 7.25, 9.25), ("1B1", 9.25, 13.25)])
    assert tl.makespan == pytest.approx(16)
    assert curve(tl, 0) == [(0, 3, "0F0"), (1, 6, "0F1"), (10, 3, "0B0"), (16, 0, "0B1")]
    assert curve(tl, 1) == [(1.25, 5, "1F0"), (7.25, 0, "1B0"), (7.25, 5, "1F1"), (13.25, 0, "1B1")]
    assert tl.peak_memory(0) == 6 and tl.peak_memory(1) == 5


def test_full_backward_defaults_to_B_plus_W():
    prof = profile([{"F": 1, "B": 2, "W": 1}, {"F": 2, "B": 3, "W": 2}], 0)
    tl = simulate(generate("1f1b", 2, 2), prof)
    assert [s.end - s.start for s in tl.slots[1]] == pytest.approx([2, 5, 2, 5])
    assert [s.end - s.start for s in tl.slots[0]] == pytest.approx([1, 1, 3, 3])


# -- 3. interleaved: the wrap-around hop pays comm -------------------------------------------------

def test_interleaved_wraparound_hop_pays_comm():
    # p=3, v=2: rank r holds chunks r and r+3; each chunk does half its rank's stage.
    # chunk costs: rank 0 F=1 BW=3, rank 1 F=2 BW=4, rank 2 F=3 BW=6.
    # hops: 0->1 comm[0]=1, 1->2 comm[1]=0.5, the wrap 2->0 pays the slowest link, 1.
    prof = profile([
        {"F": 2, "B": 4, "W": 2}, {"F": 4, "B": 6, "W": 2}, {"F": 6, "B": 8, "W": 4},
    ], [1, 0.5])
    pl = interleaved(3, 2)
    ranks = [[F(c, 0), F(c, 1), F(c + 3, 0), F(c + 3, 1), BW(c + 3, 0), BW(c + 3, 1), BW(c, 0), BW(c, 1)]
             for c in range(3)]
    tl = simulate(build("interleaved-gpipe", pl, 2, ranks), prof)
    assert times(tl, 0) == approx_rows([
        ("0F0", 0, 1), ("0F1", 1, 2),
        ("3F0", 8.5, 9.5),        # 2F0 ends 7.5, + wrap hop 1
        ("3F1", 11.5, 12.5),      # 2F1 ends 10.5, + 1
        ("3B0", 30.5, 33.5),      # 4B0 ends 29.5, + 1
        ("3B1", 36.5, 39.5),      # 4B1 ends 35.5, + 1
        ("0B0", 46, 49),          # 1B0 ends 45, + 1
        ("0B1", 52, 55),          # 1B1 ends 51, + 1
    ])
    assert times(tl, 1) == approx_rows([
        ("1F0", 2, 4), ("1F1", 4, 6), ("4F0", 10.5, 12.5), ("4F1", 13.5, 15.5),
        ("4B0", 25.5, 29.5), ("4B1", 31.5, 35.5), ("1B0", 41, 45), ("1B1", 47, 51),
    ])
    assert times(tl, 2) == approx_rows([
        ("2F0", 4.5, 7.5), ("2F1", 7.5, 10.5), ("5F0", 13, 16), ("5F1", 16, 19),
        ("5B0", 19, 25), ("5B1", 25, 31),
        ("2B0", 34.5, 40.5),      # 3B0 ends 33.5, + the wrap hop back (rank 0 -> rank 2) 1
        ("2B1", 40.5, 46.5),
    ])
    assert tl.makespan == pytest.approx(55)
    # Each chunk-F allocates half the stage's default mem_B (1.0): rank 0 holds 4 halves at most.
    assert tl.peak_memory(0) == pytest.approx(2.0)
    assert summarize(tl).peak_memory_per_rank == pytest.approx([2.0, 2.0, 2.0])
    assert all(level == pytest.approx(0) for level in (tl.memory[r][-1][1] for r in range(3)))


# -- 4. V-shape: the same-rank hand-off is free -------------------------------------------------

V_STAGES = [
    {"F": 2, "B": 4, "W": 2, "mem_B": 4, "mem_W": 2},   # chunks 0 and 3: F=1 I=2 W=1, mem_B 2, mem_W 1
    {"F": 4, "B": 6, "W": 4, "mem_B": 8, "mem_W": 4},   # chunks 1 and 2: F=2 I=3 W=2, mem_B 4, mem_W 2
]


def v_schedule():
    r0 = [F(0, 0), F(0, 1), F(3, 0), B(3, 0), F(3, 1), B(3, 1), W(3, 0), W(3, 1), B(0, 0), B(0, 1), W(0, 0), W(0, 1)]
    r1 = [F(1, 0), F(2, 0), F(1, 1), F(2, 1), B(2, 0), B(1, 0), B(2, 1), B(1, 1), W(2, 0), W(1, 0), W(2, 1), W(1, 1)]
    return build("v", vshape(2), 2, [r0, r1])


def test_vshape_same_rank_handoff_is_free():
    tl = simulate(v_schedule(), profile(V_STAGES, [0.5]))
    assert times(tl, 0) == approx_rows([
        ("0F0", 0, 1), ("0F1", 1, 2),
        ("3F0", 6, 7),            # 2F0 ends 5.5, + comm 0.5
        ("3I0", 7, 9),            # loss chunk: right after its own F
        ("3F1", 10, 11),          # 2F1 ends 9.5, + 0.5
        ("3I1", 11, 13), ("3W0", 13, 14), ("3W1", 14, 15),
        ("0I0", 16, 18),          # 1I0 ends 15.5, + 0.5
        ("0I1", 22, 24),          # 1I1 ends 21.5, + 0.5
        ("0W0", 24, 25), ("0W1", 25, 26),
    ])
    assert times(tl, 1) == approx_rows([
        ("1F0", 1.5, 3.5),
        ("2F0", 3.5, 5.5),        # chunk 1 -> chunk 2 stays on rank 1: no comm
        ("1F1", 5.5, 7.5), ("2F1", 7.5, 9.5),
        ("2I0", 9.5, 12.5),       # 3I0 ends 9, + 0.5
        ("1I0", 12.5, 15.5),      # 2I0 -> 1I0 on the same rank: no comm
        ("2I1", 15.5, 18.5), ("1I1", 18.5, 21.5),
        ("2W0", 21.5, 23.5), ("1W0", 23.5, 25.5), ("2W1", 25.5, 27.5), ("1W1", 27.5, 29.5),
    ])
    assert tl.makespan == pytest.approx(29.5)
    assert tl.span == pytest.approx(28)            # rank 1: 1.5 .. 29.5
    assert tl.work(0) == pytest.approx(2 * (1 + 2 + 1) * 2)
    assert tl.work(1) == pytest.approx(2 * (2 + 3 + 2) * 2)


def test_vshape_memory_counts_half_stages():
    tl = simulate(v_schedule(), profile(V_STAGES, [0.5]))
    assert curve(tl, 0) == [
        (0, 2, "0F0"), (1, 4, "0F1"), (6, 6, "3F0"), (9, 5, "3I0"), (10, 7, "3F1"), (13, 6, "3I1"),
        (14, 5, "3W0"), (15, 4, "3W1"), (18, 3, "0I0"), (24, 2, "0I1"), (25, 1, "0W0"), (26, 0, "0W1")]
    assert curve(tl, 1) == [
        (1.5, 4, "1F0"), (3.5, 8, "2F0"), (5.5, 12, "1F1"), (7.5, 16, "2F1"),
        (12.5, 14, "2I0"), (15.5, 12, "1I0"), (18.5, 10, "2I1"), (21.5, 8, "1I1"),
        (23.5, 6, "2W0"), (25.5, 4, "1W0"), (27.5, 2, "2W1"), (29.5, 0, "1W1")]
    rep = summarize(tl)
    assert rep.peak_memory_per_rank == pytest.approx([7 / 4, 16 / 8])


def test_per_chunk_profile_costs_are_used():
    chunks = [
        {"F": 1, "B": 1, "W": 1, "mem_B": 1, "mem_W": 0.5},    # chunk 0, rank 0
        {"F": 5, "B": 1, "W": 1, "mem_B": 3, "mem_W": 1},      # chunk 1, rank 1
        {"F": 0.5, "B": 1, "W": 1, "mem_B": 2, "mem_W": 1},    # chunk 2, rank 1
        {"F": 2, "B": 7, "W": 1, "mem_B": 1, "mem_W": 0.5},    # chunk 3, rank 0
    ]
    prof = profile(V_STAGES, [0.5], chunks=chunks)
    sched = build("v1", vshape(2), 1, [
        [F(0, 0), F(3, 0), B(3, 0), W(3, 0), B(0, 0), W(0, 0)],
        [F(1, 0), F(2, 0), B(2, 0), B(1, 0), W(2, 0), W(1, 0)],
    ])
    tl = simulate(sched, prof)
    # 0F0 [0,1]; 1F0 [1.5,6.5]; 2F0 [6.5,7]; 3F0 [7.5,9.5]; 3I0 [9.5,16.5]; 3W0 [16.5,17.5]
    # 2I0 [17,18]; 1I0 [18,19]; 2W0 [19,20]; 1W0 [20,21]; 0I0 [19.5,20.5]; 0W0 [20.5,21.5]
    assert times(tl, 0) == approx_rows([
        ("0F0", 0, 1), ("3F0", 7.5, 9.5), ("3I0", 9.5, 16.5), ("3W0", 16.5, 17.5),
        ("0I0", 19.5, 20.5), ("0W0", 20.5, 21.5)])
    assert times(tl, 1) == approx_rows([
        ("1F0", 1.5, 6.5), ("2F0", 6.5, 7), ("2I0", 17, 18), ("1I0", 18, 19), ("2W0", 19, 20), ("1W0", 20, 21)])
    assert tl.peak_memory(1) == pytest.approx(5)         # 3 + 2 from the chunk entries
    assert tl.peak_memory(0) == pytest.approx(2)
    assert pass_cost(chunk_costs(sched, prof), F(1, 0)) == 5
    # A chunk list of the wrong length for this placement is ignored: the stage split applies.
    lin = profile(V_STAGES, [0.5], chunks=chunks)
    sched_lin = build("lin", linear(2), 1, [[F(0, 0), BW(0, 0)], [F(1, 0), BW(1, 0)]])
    assert pass_cost(chunk_costs(sched_lin, lin), F(1, 0)) == 4


# -- 5. DualPipe: two routes and an overlapped pair ---------------------------------------------

def test_dualpipe_overlapped_pair_takes_the_sum():
    prof = profile([
        {"F": 1, "B": 2, "W": 1, "mem_B": 2, "mem_W": 1},
        {"F": 2, "B": 3, "W": 1, "mem_B": 4, "mem_W": 2},
    ], [0.5])
    # microbatch 0 takes chunks 0 (rank 0) -> 1 (rank 1); microbatch 1 takes chunks 2 (rank 1) -> 3 (rank 0).
    sched = build("dp", dualpipe(2), 2, [
        [F(0, 0), overlap(F(3, 1), B(0, 0)), B(3, 1), W(0, 0), W(3, 1)],
        [F(2, 1), F(1, 0), B(1, 0), B(2, 1), W(1, 0), W(2, 1)],
    ])
    tl = simulate(sched, prof)
    # rank 1: 2F1 enters at rank 1 at time 0 -> [0,2]; 1F0 needs 0F0 (1) + 0.5, rank free at 2 -> [2,4]; 1I0 [4,7]
    # rank 0: the pair needs 2F1 (2) + 0.5 and 1I0 (7) + 0.5 -> [7.5, 7.5 + 1 + 2]; 3I1 (loss of copy 1)
    #         [10.5,12.5]; 0W0 [12.5,13.5]; 3W1 [13.5,14.5]
    # rank 1: 2I1 needs 3I1 (12.5) + 0.5 -> [13,16]; 1W0 [16,17]; 2W1 [17,18]
    assert times(tl, 0) == approx_rows([
        ("0F0", 0, 1), ("(3F1;0I0)OVERLAP_F_B", 7.5, 10.5), ("3I1", 10.5, 12.5), ("0W0", 12.5, 13.5),
        ("3W1", 13.5, 14.5)])
    assert times(tl, 1) == approx_rows([
        ("2F1", 0, 2), ("1F0", 2, 4), ("1I0", 4, 7), ("2I1", 13, 16), ("1W0", 16, 17), ("2W1", 17, 18)])
    assert tl.makespan == pytest.approx(18)
    # The pair allocates its F at its start and frees its I at its end.
    assert curve(tl, 0) == [
        (0, 2, "0F0"), (7.5, 4, "3F1"), (10.5, 3, "0I0"), (12.5, 2, "3I1"), (13.5, 1, "0W0"), (14.5, 0, "3W1")]
    assert tl.peak_memory(0) == 4


# -- 6. failures ----------------------------------------------------------------------------------

def test_cross_rank_deadlock_names_the_stuck_ranks():
    # rank 0 waits for 1I0 before it sends 0F1; rank 1 waits for 0F1 before it runs 1F0.
    sched = build("stuck", linear(2), 2, [
        [F(0, 0), B(0, 0), F(0, 1), W(0, 0), B(0, 1), W(0, 1)],
        [F(1, 1), F(1, 0), B(1, 0), B(1, 1), W(1, 0), W(1, 1)],
    ])
    with pytest.raises(ScheduleError) as info:
        simulate(sched, profile(P2, [0.5]))
    msg = str(info.value)
    assert "deadlock" in msg
    assert "rank 0 at step 1 (0I0)" in msg
    assert "rank 1 at step 0 (1F1)" in msg


def test_deadlock_names_every_stuck_rank():
    # rank 0 opens with 0I0, which needs 0F0 later on its own list: nobody can ever start.
    sched = build("stuck3", linear(3), 1, [
        [B(0, 0), F(0, 0), W(0, 0)],
        [F(1, 0), B(1, 0), W(1, 0)],
        [F(2, 0), B(2, 0), W(2, 0)],
    ])
    prof = profile([{"F": 1, "B": 1, "W": 1}] * 3, 0)
    with pytest.raises(ScheduleError) as info:
        simulate(sched, prof)
    msg = str(info.value)
    assert "rank 0 at step 0 (0I0)" in msg and "rank 1 at step 0 (1F0)" in msg and "rank 2 at step 0 (2F0)" in msg


def test_missing_producer_is_reported_as_stuck():
    # 0F0 is missing: rank 1 can never start. Rank 0 finishes nothing either (its I needs rank 1).
    sched = build("missing", linear(2), 1, [[B(0, 0), W(0, 0)], [F(1, 0), B(1, 0), W(1, 0)]])
    with pytest.raises(ScheduleError, match=r"rank 1 at step 0 \(1F0\)"):
        simulate(sched, profile(P2, 0))


def test_partial_progress_before_deadlock_is_not_reported():
    # rank 1 runs 1F0 and 1I0, then waits forever for 1F1, whose input 0F1 never comes.
    sched = build("half", linear(2), 2, [
        [F(0, 0), B(0, 0), W(0, 0)],
        [F(1, 0), B(1, 0), F(1, 1), B(1, 1), W(1, 0), W(1, 1)],
    ])
    with pytest.raises(ScheduleError) as info:
        simulate(sched, profile(P2, 0))
    msg = str(info.value)
    assert "rank 1 at step 2 (1F1)" in msg
    assert "rank 0" not in msg


def test_profile_with_wrong_stage_count_is_refused():
    with pytest.raises(ScheduleError, match="3 stages"):
        simulate(split_p2(), profile([{"F": 1, "B": 1, "W": 1}] * 3, 0))


# -- the shared per-rank rule (rank_state), which the greedy engines advance too ------------------

def test_rank_clock_starts_when_free_and_ready_and_counts_idle_after_the_first_pass():
    clock = RankClock()
    assert clock.run(2.0, 3.0) == (2.0, 5.0)        # waits for its input: no idle before the first pass
    assert (clock.first_start, clock.idle) == (2.0, 0.0)
    assert clock.run(4.0, 1.0) == (5.0, 6.0)        # input already there: starts when the rank is free
    assert clock.run(10.0, 1.0) == (10.0, 11.0)     # 4 idle between 6 and 10
    assert (clock.first_start, clock.free, clock.idle) == (2.0, 11.0, 4.0)


def test_chunk_progress_counts_memory_as_the_simulator_levels_it():
    # Rank 1 of split_p2 (mem_B 6, mem_W 2): F0 B0 F1 B1 W0 W1. After each pass the count-based level
    # equals the simulator's curve: 6, 2, 8, 4, 2, 0.
    prof = profile(P2, [0.5])
    tl = simulate(split_p2(), prof)
    chunk = ChunkProgress(prof.stages[1], 2)
    levels = []
    for slot in tl.slots[1]:
        a = slot.action
        assert chunk.record(a.kind, slot.end) == a.microbatch
        assert chunk.duration(a.kind) == slot.end - slot.start
        levels.append(chunk.held())
    assert levels == [6, 2, 8, 4, 2, 0] == [lvl for _, lvl, _ in tl.memory[1]]
    assert chunk.f_end == [3.5, 8.5] and chunk.b_end == [6.5, 11.5]
    assert (chunk.forwards, chunk.backwards, chunk.weights) == (2, 2, 2)
    # what-if levels: one more F (+6), one W fewer held (-2)
    chunk.weights = 1
    assert (chunk.held(), chunk.held(more_forwards=1), chunk.held(fewer_weights=1)) == (2, 8, 0)


def test_memory_delta_is_the_one_rule():
    cost = profile(P2, [0.5]).stages[0]
    assert simulate_module.memory_delta is memory_delta
    assert [memory_delta(cost, k) for k in (Kind.F, Kind.B, Kind.W, Kind.FULL_B)] == [
        (4, 0), (0, 3), (0, 1), (0, 4)]

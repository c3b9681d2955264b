"""The IR: action strings (torch's format), placements and schedule files."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zbsearch.core.errors import ScheduleError, ZbsearchError
from zbsearch.core.ir import (BW, Action, B, F, Kind, Placement, Schedule, W, build, dualpipe, interleaved,
    linear, overlap, vshape)

# -- actions -----------------------------------------------------------------------------------

SIMPLE = [
    ("0F1", Action(0, Kind.F, 1)),
    ("1I0", Action(1, Kind.B, 0)),
    ("2W3", Action(2, Kind.W, 3)),
    ("3B0", Action(3, Kind.FULL_B, 0)),
    ("12F345", Action(12, Kind.F, 345)),
    ("107I99", Action(107, Kind.B, 99)),
    ("40W1000", Action(40, Kind.W, 1000)),
    ("9B10", Action(9, Kind.FULL_B, 10)),
]


@pytest.mark.parametrize("text, action", SIMPLE)
def test_simple_action_round_trip(text, action):
    assert Action.parse(text) == action
    assert str(action) == text
    assert str(Action.parse(text)) == text
    assert Action.parse(str(action)) == action


def test_kind_letters_follow_torch_not_the_paper():
    # The paper's B (input gradient) is torch's I; torch's B is the fused backward.
    assert str(B(0, 0)) == "0I0" and B(0, 0).kind is Kind.B
    assert str(BW(0, 0)) == "0B0" and BW(0, 0).kind is Kind.FULL_B
    assert str(F(1, 2)) == "1F2" and str(W(3, 4)) == "3W4"
    assert [k.label for k in (Kind.F, Kind.B, Kind.W, Kind.FULL_B, Kind.OVERLAP)] == ["F", "B", "W", "BW", "F&B"]


OVERLAPS = [
    "(0F3;3B1)OVERLAP_F_B",
    "(0F3;3I1)OVERLAP_F_B",
    "(11F20;4I17)OVERLAP_F_B",
    "(5F0;5B123)OVERLAP_F_B",
]


@pytest.mark.parametrize("text", OVERLAPS)
def test_overlap_round_trip(text):
    a = Action.parse(text)
    assert a.kind is Kind.OVERLAP
    assert len(a.pair) == 2 and a.pair[0].kind is Kind.F and a.pair[1].kind in (Kind.B, Kind.FULL_B)
    assert a.passes() == a.pair
    assert str(a) == text
    assert Action.parse(str(a)) == a


def test_overlap_parts_are_parsed_exactly():
    a = Action.parse("(11F20;4I17)OVERLAP_F_B")
    assert a == overlap(F(11, 20), B(4, 17))
    assert a.pair == (Action(11, Kind.F, 20), Action(4, Kind.B, 17))
    assert a != overlap(F(11, 20), BW(4, 17))
    assert F(0, 0).passes() == (F(0, 0),)


def test_whitespace_is_tolerated_but_printing_is_canonical():
    assert Action.parse(" 3 W 4 ") == W(3, 4)
    assert str(Action.parse(" ( 0F3 ; 3B1 ) OVERLAP_F_B ")) == "(0F3;3B1)OVERLAP_F_B"


GARBAGE = [
    "", " ", "F", "0F", "F0", "0X1", "0f1", "0i1", "-1F0", "0F-1", "1.5F0", "0FF1", "0F1x", "x0F1",
    "0 F 1 2 F", "(0F3;3B1)", "(0F3;3B1)OVERLAP", "(0F3)OVERLAP_F_B", "(0F3;3B1;2W0)OVERLAP_F_B",
    "((0F3;3B1)OVERLAP_F_B;3B1)OVERLAP_F_B", "0F3;3B1", "OVERLAP_F_B",
    # An overlap pair must be (forward; backward):
    "(3B1;0F3)OVERLAP_F_B", "(0F3;1F2)OVERLAP_F_B", "(0F3;3W1)OVERLAP_F_B", "(0I3;3I1)OVERLAP_F_B",
]


@pytest.mark.parametrize("text", GARBAGE)
def test_garbage_action_strings_raise_schedule_error(text):
    with pytest.raises(ScheduleError) as info:
        Action.parse(text)
    # The message quotes what to write.
    msg = str(info.value)
    assert "0F1" in msg or "OVERLAP_F_B" in msg or "overlap" in msg


def test_overlap_constructor_refuses_wrong_order():
    with pytest.raises(ScheduleError, match="put the F first"):
        overlap(B(0, 1), F(0, 2))
    with pytest.raises(ScheduleError):
        overlap(F(0, 1), W(0, 2))


simple_actions = st.builds(
    Action, st.integers(0, 10_000), st.sampled_from([Kind.F, Kind.B, Kind.W, Kind.FULL_B]), st.integers(0, 10_000),
)
any_action = st.one_of(
    simple_actions,
    st.builds(
        overlap,
        st.builds(F, st.integers(0, 500), st.integers(0, 500)),
        st.one_of(st.builds(B, st.integers(0, 500), st.integers(0, 500)),
                  st.builds(BW, st.integers(0, 500), st.integers(0, 500))),
    ),
)


@settings(max_examples=200, deadline=None)
@given(any_action)
def test_round_trip_property(action):
    text = str(action)
    assert Action.parse(text) == action
    assert str(Action.parse(text)) == text


# -- placements --------------------------------------------------------------------------------

def test_linear_placement():
    pl = linear(4)
    assert pl.name == "linear" and pl.num_ranks == 4 and pl.num_chunks == 4 and pl.chunks_per_rank == 1
    assert pl.chunk_to_rank == (0, 1, 2, 3)
    assert pl.routes == ((0, 1, 2, 3),)
    assert [pl.chunks_on(r) for r in range(4)] == [(0,), (1,), (2,), (3,)]
    assert [pl.share(c) for c in range(4)] == [1.0] * 4
    assert {pl.route_index(i, 5) for i in range(5)} == {0}
    assert pl.position(2) == (0, 2)
    pl.check()


def test_interleaved_placement():
    pl = interleaved(3, 2)
    assert pl.name == "interleaved" and pl.num_chunks == 6 and pl.chunks_per_rank == 2
    assert pl.chunk_to_rank == (0, 1, 2, 0, 1, 2)
    assert pl.routes == ((0, 1, 2, 3, 4, 5),)
    assert pl.chunks_on(0) == (0, 3) and pl.chunks_on(2) == (2, 5)
    assert [pl.share(c) for c in range(6)] == [0.5] * 6
    assert interleaved(2, 3).chunk_to_rank == (0, 1, 0, 1, 0, 1)
    assert interleaved(2, 3).share(4) == pytest.approx(1 / 3)
    # v = 1 is the linear placement.
    assert interleaved(4, 1) == linear(4)
    pl.check()


def test_vshape_placement():
    pl = vshape(3)
    assert pl.name == "v" and pl.num_chunks == 6 and pl.chunks_per_rank == 2
    assert pl.chunk_to_rank == (0, 1, 2, 2, 1, 0)
    assert pl.routes == ((0, 1, 2, 3, 4, 5),)
    assert [pl.chunks_on(r) for r in range(3)] == [(0, 5), (1, 4), (2, 3)]
    assert [pl.share(c) for c in range(6)] == [0.5] * 6
    # The loss (last chunk of the route) is on rank 0.
    assert pl.chunk_to_rank[pl.routes[0][-1]] == 0
    assert pl.position(5) == (0, 5)
    pl.check()


def test_dualpipe_placement():
    pl = dualpipe(4)
    assert pl.name == "dualpipe" and pl.num_chunks == 8 and pl.chunks_per_rank == 2
    assert pl.chunk_to_rank == (0, 1, 2, 3, 3, 2, 1, 0)
    assert pl.routes == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert [pl.chunks_on(r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    # Each chunk is a whole stage of its model copy.
    assert [pl.share(c) for c in range(8)] == [1.0] * 8
    # Copy 1 enters at rank p-1.
    assert pl.chunk_to_rank[pl.routes[1][0]] == 3
    assert pl.position(4) == (1, 0) and pl.position(7) == (1, 3) and pl.position(2) == (0, 2)
    pl.check()


@pytest.mark.parametrize("m, first_half", [
    (1, [0]),
    (2, [0, 1]),
    (4, [0, 0, 1, 1]),
    (8, [0] * 4 + [1] * 4),
    (3, [0, 0, 1]),          # odd m: route 0 gets ceil(m/2)
    (5, [0, 0, 0, 1, 1]),
    (7, [0] * 4 + [1] * 3),
])
def test_dualpipe_route_index(m, first_half):
    pl = dualpipe(2)
    assert [pl.route_index(i, m) for i in range(m)] == first_half
    assert [pl.route(i, m) for i in range(m)] == [pl.routes[k] for k in first_half]


@pytest.mark.parametrize("make", [linear, lambda p: interleaved(p, 2), vshape])
@pytest.mark.parametrize("m", [1, 2, 7, 8])
def test_single_route_placements_send_everyone_down_route_0(make, m):
    pl = make(3)
    assert [pl.route_index(i, m) for i in range(m)] == [0] * m


def test_position_of_unknown_chunk_raises():
    with pytest.raises(ScheduleError, match="chunk 9"):
        linear(3).position(9)


def test_placement_dict_round_trip():
    for pl in (linear(1), linear(5), interleaved(3, 2), interleaved(2, 4), vshape(4), dualpipe(4), dualpipe(1)):
        d = pl.to_dict()
        assert json.loads(json.dumps(d)) == d
        assert Placement.from_dict(d) == pl


@pytest.mark.parametrize("data, field", [
    ({"num_ranks": 2, "chunk_to_rank": [0, 1], "routes": [[0, 1]]}, "placement"),
    ({"name": "x", "chunk_to_rank": [0, 1], "routes": [[0, 1]]}, "placement"),
    ({"name": "x", "num_ranks": 2, "routes": [[0, 1]]}, "placement"),
    ({"name": "x", "num_ranks": 2, "chunk_to_rank": [0, 1]}, "placement"),
    ({"name": "x", "num_ranks": "two", "chunk_to_rank": [0, 1], "routes": [[0, 1]]}, "placement"),
    ({"name": "x", "num_ranks": 2, "chunk_to_rank": 7, "routes": [[0, 1]]}, "placement"),
    ({"name": "x", "num_ranks": 2, "chunk_to_rank": [0, 1], "routes": [0, 1]}, "placement"),
    ({"name": "x", "num_ranks": 2, "chunk_to_rank": [0, "a"], "routes": [[0, 1]]}, "placement"),
    ([0, 1], "placement"),
    ("linear", "placement"),
    (None, "placement"),
    ({"name": "x", "num_ranks": 0, "chunk_to_rank": [], "routes": [[]]}, "num_ranks"),
    ({"name": "x", "num_ranks": 2, "chunk_to_rank": [0, 2], "routes": [[0, 1]]}, "rank 2"),
    ({"name": "x", "num_ranks": 2, "chunk_to_rank": [0, -1], "routes": [[0, 1]]}, "rank -1"),
    ({"name": "x", "num_ranks": 2, "chunk_to_rank": [0, 1], "routes": [[0, 0]]}, "routes"),
    ({"name": "x", "num_ranks": 2, "chunk_to_rank": [0, 1], "routes": [[0]]}, "routes"),
    ({"name": "x", "num_ranks": 2, "chunk_to_rank": [0, 1], "routes": [[0, 1, 2]]}, "routes"),
    ({"name": "x", "num_ranks": 2, "chunk_to_rank": [0, 1], "routes": [[0, 1], [0]]}, "routes"),
    ({"name": "x", "num_ranks": 2, "chunk_to_rank": [0, 1], "routes": [[0, 1], []]}, "route"),
    ({"name": "x", "num_ranks": 2, "chunk_to_rank": [0, 1], "routes": []}, "route"),
])
def test_bad_placement_raises_naming_the_field(data, field):
    with pytest.raises(ScheduleError) as info:
        Placement.from_dict(data)
    assert field in str(info.value)
    assert "placement" in str(info.value)


# -- schedules ---------------------------------------------------------------------------------

def _sample_schedule() -> Schedule:
    """A small split-backward schedule on a V-shape with an overlapped pair and multi-digit indices."""
    pl = vshape(2)
    r0 = [F(0, 0), F(0, 1), F(3, 0), overlap(F(3, 1), B(3, 0)), B(3, 1), W(3, 0), W(3, 1), B(0, 0), B(0, 1),
          W(0, 0), W(0, 1)]
    r1 = [F(1, 0), F(2, 0), F(1, 1), F(2, 1), B(2, 0), B(1, 0), B(2, 1), B(1, 1), BW(2, 10), W(2, 0), W(1, 0),
          W(2, 1), W(1, 1)]
    return build("sample", pl, 12, [r0, r1], source="test", flags=[1, 2])


def test_schedule_dict_round_trip():
    s = _sample_schedule()
    d = s.to_dict()
    assert d["format"] == "zbsearch-schedule/1"
    assert d["actions"][0][3] == "(3F1;3I0)OVERLAP_F_B"
    assert d["actions"][1][8] == "2B10"
    back = Schedule.from_dict(json.loads(json.dumps(d)))
    assert back == s
    assert back.meta == {"source": "test", "flags": [1, 2]}
    assert back.ranks == s.ranks and back.placement == s.placement and back.num_microbatches == 12


def test_schedule_save_load_round_trip(tmp_path):
    s = _sample_schedule()
    path = tmp_path / "s.json"
    s.save(path)
    assert json.loads(path.read_text())["name"] == "sample"
    back = Schedule.load(path)
    assert back == s and back.meta == s.meta
    # No temporary file is left beside the result.
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


def test_schedule_helpers():
    s = _sample_schedule()
    assert s.num_ranks == 2
    assert s.count() == 11 + 13
    # The overlapped pair contributes its two passes.
    assert len(list(s.passes(0))) == 12
    assert list(s.passes(0))[3:5] == [F(3, 1), B(3, 0)]


def test_empty_strings_in_rank_lists_are_skipped():
    d = _sample_schedule().to_dict()
    d["actions"][0] = [""] + d["actions"][0] + [None]
    assert Schedule.from_dict(d) == _sample_schedule()


def _good_dict() -> dict:
    return build("tiny", linear(2), 1, [[F(0, 0), BW(0, 0)], [F(1, 0), BW(1, 0)]]).to_dict()


@pytest.mark.parametrize("key", ["name", "num_microbatches", "placement", "actions"])
def test_missing_schedule_key_is_named(key):
    d = _good_dict()
    del d[key]
    with pytest.raises(ScheduleError, match=repr(key)):
        Schedule.from_dict(d)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(actions=[["0F0", "0B0"]]), "actions"),                          # 1 rank for 2
    (lambda d: d.update(actions=[["0F0"], ["1F0"], ["1B0"]]), "actions"),               # 3 ranks for 2
    (lambda d: d.update(actions="0F0 0B0"), "actions"),
    (lambda d: d.update(actions={"0": ["0F0"]}), "actions"),
    (lambda d: d.update(num_microbatches=0), "num_microbatches"),
    (lambda d: d.update(num_microbatches="2"), "num_microbatches"),
    (lambda d: d.update(num_microbatches=1.5), "num_microbatches"),
    (lambda d: d["placement"].update(num_ranks=3), "actions"),                          # 2 rank lists for 3
    (lambda d: d["placement"].update(chunk_to_rank=[0, 5]), "placement"),
    (lambda d: d["placement"].update(routes=[[1, 0, 2]]), "placement"),
    (lambda d: d["placement"].pop("routes"), "placement"),
    (lambda d: d.update(placement="linear"), "placement"),
])
def test_malformed_schedule_names_the_field(mutate, field):
    d = _good_dict()
    mutate(d)
    with pytest.raises(ScheduleError) as info:
        Schedule.from_dict(d)
    assert field in str(info.value)


def test_wrong_rank_count_message_gives_expected_count():
    d = _good_dict()
    d["actions"] = [["0F0", "0B0"]]
    with pytest.raises(ScheduleError, match="list of 2 per-rank lists"):
        Schedule.from_dict(d)


def test_bad_action_in_file_raises_schedule_error():
    d = _good_dict()
    d["actions"][1][1] = "1Q0"
    with pytest.raises(ScheduleError, match="1Q0"):
        Schedule.from_dict(d)


@pytest.mark.parametrize("data", [None, [], "schedule", 3])
def test_schedule_must_be_an_object(data):
    with pytest.raises(ScheduleError, match="JSON object"):
        Schedule.from_dict(data)


def test_load_errors_are_one_line(tmp_path):
    with pytest.raises(ZbsearchError, match="does not exist"):
        Schedule.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ZbsearchError, match="not valid JSON"):
        Schedule.load(bad)
    nan = tmp_path / "nan.json"
    nan.write_text('{"name": NaN}')
    with pytest.raises(ZbsearchError, match="not valid JSON"):
        Schedule.load(nan)


# -- regressions: malformed input must raise ScheduleError, never a bare TypeError ---------------

@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(actions=[5, 6]), "actions"),                     # ranks that are not lists
    (lambda d: d.update(actions=[["0F0", "0B0"], "1F0"]), "actions"),     # a string is not a rank list
    (lambda d: d.update(meta="abc"), "meta"),
    (lambda d: d.update(meta=[1, 2]), "meta"),
    (lambda d: d.update(num_microbatches=True), "num_microbatches"),
    (lambda d: d["placement"].update(num_ranks=2.7), "placement"),        # no silent truncation
    (lambda d: d["placement"].update(chunk_to_rank=[0, 1.9]), "placement"),
    (lambda d: d["placement"].update(routes=[[0, 1.5]]), "placement"),
    (lambda d: d["placement"].update(num_ranks=True), "placement"),
])
def test_malformed_schedule_regressions(mutate, field):
    d = _good_dict()
    mutate(d)
    with pytest.raises(ScheduleError) as info:
        Schedule.from_dict(d)
    assert field in str(info.value)


@pytest.mark.parametrize("text", ["\u0663F1", "0F\u0661", "\uff10F1", "(\u0660F3;3B1)OVERLAP_F_B"])
def test_non_ascii_digits_are_refused(text):
    # '\u0663' is ARABIC-INDIC DIGIT THREE: accepting it would print back as '3F1', breaking the round trip.
    with pytest.raises(ScheduleError):
        Action.parse(text)

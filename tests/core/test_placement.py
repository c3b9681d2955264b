"""Placements by the names users type (zbsearch/core/placement.py): `parse_placement` builds each named
placement (case and spaces aside), refuses unknown names, a bad chunk count and DualPipe on an odd p
with a message naming the fix, and `even_ranks` says what an odd p lacks."""

from __future__ import annotations

import re

import pytest

from zbsearch.core.errors import PreconditionError, ZbsearchError
from zbsearch.core.ir import Placement, dualpipe, interleaved, linear, vshape
from zbsearch.core.placement import PLACEMENT_NAMES, even_ranks, parse_placement


@pytest.mark.parametrize("text,expected", [
    ("linear", linear(4)),
    ("  Linear ", linear(4)),
    ("v", vshape(4)),
    ("V-Shape", vshape(4)),
    ("vshape", vshape(4)),
    ("dualpipe", dualpipe(4)),
    ("DUALPIPE", dualpipe(4)),
    ("interleaved", interleaved(4, 2)),          # V defaults to 2
    ("interleaved:3", interleaved(4, 3)),
    ("Interleaved:4 ", interleaved(4, 4)),
])
def test_each_name_gives_its_placement(text: str, expected: Placement) -> None:
    got = parse_placement(text, 4)
    assert got == expected
    got.check()


@pytest.mark.parametrize("text,chunk_to_rank,routes", [
    # By hand from the docstrings of core/ir.py, p = 2.
    ("linear", (0, 1), ((0, 1),)),
    ("v", (0, 1, 1, 0), ((0, 1, 2, 3),)),                                  # rank r holds r and 2p-1-r
    ("interleaved:3", (0, 1, 0, 1, 0, 1), ((0, 1, 2, 3, 4, 5),)),           # rank r holds r, r+p, r+2p
    ("dualpipe", (0, 1, 1, 0), ((0, 1), (2, 3))),                           # copy 1 enters at rank p-1
])
def test_the_placements_hold_the_chunks_the_names_promise(text: str, chunk_to_rank: tuple[int, ...],
                                                         routes: tuple[tuple[int, ...], ...]) -> None:
    got = parse_placement(text, 2)
    assert got.num_ranks == 2
    assert got.chunk_to_rank == chunk_to_rank
    assert got.routes == routes


def test_one_chunk_per_rank_interleaved_is_linear() -> None:
    assert parse_placement("interleaved:1", 3) == linear(3)


@pytest.mark.parametrize("p", [1, 3, 5])
def test_dualpipe_on_an_odd_p_says_it_needs_an_even_one(p: int) -> None:
    with pytest.raises(PreconditionError) as err:
        parse_placement("dualpipe", p)
    assert str(err.value) == f"placement 'dualpipe' needs p even (half the ranks lead each direction); got p={p}"


@pytest.mark.parametrize("text", ["interleaved:0", "interleaved:-2", "interleaved:two", "interleaved:1.5"])
def test_interleaved_needs_a_whole_positive_chunk_count(text: str) -> None:
    with pytest.raises(ZbsearchError) as err:
        parse_placement(text, 4)
    assert str(err.value) == (f"placement {text!r} needs V >= 1 chunks per rank: write interleaved:V, "
                              "e.g. interleaved:2")


@pytest.mark.parametrize("text", ["ring", "", "zb-v", "1f1b", "linear:2"])
def test_an_unknown_name_lists_the_known_ones(text: str) -> None:
    with pytest.raises(ZbsearchError) as err:
        parse_placement(text, 4)
    assert not isinstance(err.value, PreconditionError)
    assert str(err.value) == f"placement {text!r} is not known: use one of {PLACEMENT_NAMES}"
    for name in ("linear", "interleaved:V", "v", "dualpipe"):
        assert name in PLACEMENT_NAMES


@pytest.mark.parametrize("p,lack", [
    (1, "p even (half the ranks lead each direction)"),
    (2, None),
    (3, "p even (half the ranks lead each direction)"),
    (4, None),
    (7, "p even (half the ranks lead each direction)"),
    (32, None),
])
def test_even_ranks_says_what_an_odd_p_lacks(p: int, lack: str | None) -> None:
    assert even_ranks(p) == lack


@pytest.mark.parametrize("p", [2, 4, 6])
def test_dualpipe_is_accepted_exactly_where_even_ranks_has_nothing_to_say(p: int) -> None:
    assert even_ranks(p) is None
    assert parse_placement("dualpipe", p) == dualpipe(p)
    assert even_ranks(p + 1) is not None
    with pytest.raises(PreconditionError, match=re.escape(str(even_ranks(p + 1)))):
        parse_placement("dualpipe", p + 1)


@pytest.mark.parametrize("text", ["interleaved3", "interleaved-4", "interleavedfoo"])
def test_a_misspelt_interleaved_is_refused_not_read_as_two_chunks(text: str) -> None:
    with pytest.raises(ZbsearchError):
        parse_placement(text, 4)

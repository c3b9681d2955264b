"""What a schedule is scored by and how a search ended (zbsearch/core/objective.py): `Objective.parse`
takes the word or the member and names the choices otherwise, `Objective.of` reads the right figure,
and both enums print, format, compare and serialise as the word users type."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from zbsearch.core.errors import PreconditionError
from zbsearch.core.ir import Action, Kind, build, linear
from zbsearch.core.objective import OBJECTIVES, Objective, Status
from zbsearch.core.profile import Profile
from zbsearch.sim.simulate import simulate


@pytest.mark.parametrize("value,member", [
    ("makespan", Objective.MAKESPAN),
    ("span", Objective.SPAN),
    (Objective.MAKESPAN, Objective.MAKESPAN),
    (Objective.SPAN, Objective.SPAN),
])
def test_parse_takes_the_word_or_the_member(value: str | Objective, member: Objective) -> None:
    assert Objective.parse(value) is member


@pytest.mark.parametrize("value", ["bubble", "", "make span", "optimal", None])
def test_parse_refuses_anything_else_naming_the_choices(value: str | None) -> None:
    with pytest.raises(PreconditionError) as err:
        Objective.parse(value)  # type: ignore[arg-type]
    assert str(err.value) == f"objective {value!r} is not known: use one of makespan, span"


def test_the_choices_are_the_two_words_in_order() -> None:
    assert OBJECTIVES == ("makespan", "span")
    assert [o.value for o in Objective] == list(OBJECTIVES)


def test_of_reads_the_makespan_or_the_span_of_anything_that_has_both() -> None:
    timed = SimpleNamespace(makespan=13.0, span=12.0)
    assert Objective.MAKESPAN.of(timed) == 13.0
    assert Objective.SPAN.of(timed) == 12.0


def test_of_reads_a_simulated_timeline() -> None:
    # p=2, m=1, stage 1's W takes 10. By hand: rank 0 runs F [0,1]; rank 1 F [1,2], B [2,3], W [3,13];
    # rank 0 B [3,4], W [4,5]. Makespan 13 (rank 1's end); span max(5 - 0, 13 - 1) = 12.
    profile = Profile.from_dict({
        "stages": [{"F": 1, "B": 1, "W": 1}, {"F": 1, "B": 1, "W": 10}], "comm": 0, "microbatches": 1,
        "source": {"kind": "estimated", "method": "test fixture"},
    })
    ranks = [[Action(r, kind, 0) for kind in (Kind.F, Kind.B, Kind.W)] for r in range(2)]
    tl = simulate(build("by-hand", linear(2), 1, ranks), profile)
    assert (tl.makespan, tl.span) == (13.0, 12.0)
    assert Objective.MAKESPAN.of(tl) == 13.0
    assert Objective.SPAN.of(tl) == 12.0


@pytest.mark.parametrize("member,word", [
    (Objective.MAKESPAN, "makespan"), (Objective.SPAN, "span"),
    (Status.OPTIMAL, "optimal"), (Status.FEASIBLE, "feasible"),
    (Status.INFEASIBLE, "infeasible"), (Status.UNKNOWN, "unknown"),
])
def test_a_member_prints_and_formats_as_its_word(member: Objective | Status, word: str) -> None:
    assert str(member) == word
    assert f"{member}" == word
    assert "{}".format(member) == word
    assert "%s" % member == word
    assert f"{member:>12}" == word.rjust(12)
    assert f"[{member:<10}]" == f"[{word:<10}]"


@pytest.mark.parametrize("member,word", [(Objective.SPAN, "span"), (Status.OPTIMAL, "optimal")])
def test_a_member_compares_hashes_and_serialises_as_its_word(member: Objective | Status, word: str) -> None:
    assert member == word and word == member
    assert {word: 1}[member] == 1               # a dict keyed by the word finds the member
    assert json.dumps(member) == json.dumps(word)
    assert json.loads(json.dumps({"objective": member, member: 2})) == {"objective": word, word: 2}


def test_status_is_read_back_from_its_word() -> None:
    assert [Status(s.value) for s in Status] == [Status.OPTIMAL, Status.FEASIBLE, Status.INFEASIBLE, Status.UNKNOWN]
    assert Status("optimal") is Status.OPTIMAL
    # The two vocabularies do not overlap: a status is no objective.
    with pytest.raises(PreconditionError):
        Objective.parse(Status.OPTIMAL)

"""Memory-limit strings: multiples of p, absolute sizes, auto and none."""

from __future__ import annotations

import math
import re

import pytest

from zbsearch.core.errors import InfeasibleError, MemoryLimitError
from zbsearch.core.ir import linear, vshape
from zbsearch.core.memory import DEFAULT_HEADROOM, check_feasible, parse_mem_limit
from zbsearch.core.profile import Profile, load_profile, uniform_profile

GiB = 2**30


def relative(p: int = 4) -> Profile:
    return uniform_profile(1, 1, 1, p=p, m=8, mem_B=2.0, mem_W=1.0)


def in_bytes(capacity: float | None = 80 * GiB, static: bool = True) -> Profile:
    stage = {"F": 1, "B": 1, "W": 1, "mem_B": 3 * GiB, "mem_W": GiB}
    if static:
        stage["static_bytes"] = 20 * GiB
    data = {
        "num_stages": 2, "memory_unit": "bytes", "stages": [dict(stage), dict(stage, mem_B=1 * GiB)],
        "source": {"kind": "estimated", "method": "test numbers"},
    }
    if capacity is not None:
        data["device_capacity_bytes"] = capacity
    return Profile.from_dict(data)


@pytest.mark.parametrize("text,factor", [("1p", 1.0), ("2p", 2.0), ("1.5p", 1.5), ("p", 1.0), (" 2P ", 2.0), (".5p", 0.5)])
def test_multiples_of_p(text, factor):
    prof = relative(p=4)
    limit = parse_mem_limit(text, prof)
    assert limit.per_rank == pytest.approx((factor * 4 * 2.0,) * 4)
    assert limit.in_stage_units(prof) == pytest.approx((factor * 4,) * 4)
    assert not limit.unlimited


def test_multiples_of_p_use_each_rank_own_mem_B():
    limit = parse_mem_limit("2p", in_bytes())
    assert limit.per_rank == (2 * 2 * 3 * GiB, 2 * 2 * 1 * GiB)


@pytest.mark.parametrize("text,size", [
    ("48GiB", 48 * GiB), ("48 gib", 48 * GiB), ("40GB", 40e9), ("512MiB", 512 * 2**20),
    ("1000000000", 1e9), ("1e9", 1e9), ("2048b", 2048.0),
])
def test_absolute_sizes(text, size):
    limit = parse_mem_limit(text, in_bytes())
    assert limit.per_rank == (size, size)


def test_auto_is_capacity_less_headroom_minus_static_bytes():
    # in_bytes(): 80 GiB devices, 20 GiB static on each rank.
    limit = parse_mem_limit("auto", in_bytes())
    assert limit.per_rank == pytest.approx((80 * GiB * (1 - DEFAULT_HEADROOM) - 20 * GiB,) * 2)
    assert limit.text == "auto" and not limit.includes_static  # a stage-level profile: activations only
    assert parse_mem_limit("auto", in_bytes(), headroom=0.0).per_rank == (60 * GiB, 60 * GiB)
    assert parse_mem_limit("auto", in_bytes(), headroom=0.25).per_rank == (40 * GiB, 40 * GiB)


def test_auto_with_no_room_left_names_the_rank_and_the_sizes():
    with pytest.raises(MemoryLimitError, match=r"^memory limit auto leaves no room on rank 0: its static bytes "
                       r"\(20 GiB\) exceed the usable device memory \(20 GiB after a 75% headroom\)$"):
        parse_mem_limit("auto", in_bytes(), headroom=0.75)
    with pytest.raises(MemoryLimitError, match="headroom 1.5 is not a share"):
        parse_mem_limit("auto", in_bytes(), headroom=1.5)


@pytest.mark.parametrize("text", [None, "none", "", "  ", "NONE", "inf", "unlimited"])
def test_none(text):
    limit = parse_mem_limit(text, relative())
    assert limit.unlimited
    assert all(math.isinf(x) for x in limit.per_rank)


UNIFORM = "'uniform F=1 B=1 W=1 comm=0 p=4'"
ABSOLUTE = (f"is an absolute size, but profile {UNIFORM} gives memory in relative units: use a multiple of p "
            "such as 1p or 2p")
NO_AUTO = ("memory limit auto needs the profile to give device_capacity_bytes and every stage's static_bytes in bytes; "
           "profile {} does not: use e.g. 2p or 48GiB")
UNKNOWN = "is not understood: use a multiple of p (1p, 2p, 1.5p), a size (48GiB, 40GB, 1000000000), auto or none"


@pytest.mark.parametrize("text,prof,message", [
    ("48GiB", relative(), f"memory limit '48GiB' {ABSOLUTE}"),
    ("40GB", relative(), f"memory limit '40GB' {ABSOLUTE}"),
    ("1000000000", relative(), f"memory limit '1000000000' {ABSOLUTE}"),
    ("auto", relative(), NO_AUTO.format(UNIFORM)),
    ("auto", in_bytes(capacity=None), NO_AUTO.format("'profile'")),
    ("auto", in_bytes(static=False), NO_AUTO.format("'profile'")),
    ("auto", in_bytes(capacity=10 * GiB),
     "memory limit auto leaves no room on rank 0: its static bytes (20 GiB) exceed the usable device memory "
     "(9.2 GiB after a 8% headroom)"),
    ("0p", relative(), "memory limit '0p' must be positive, e.g. 1p or 2p"),
    ("0GiB", in_bytes(), "memory limit '0GiB' must be positive"),
    ("lots", relative(), f"memory limit 'lots' {UNKNOWN}"),
    ("2q", relative(), f"memory limit '2q' {UNKNOWN}"),
    ("-1p", relative(), f"memory limit '-1p' {UNKNOWN}"),
    ("48XB", in_bytes(), f"memory limit '48XB' {UNKNOWN}"),
])
def test_errors_say_what_to_write(text, prof, message):
    """In domain terms (the CLI puts --mem-limit in front): what is wrong, and what to write instead."""
    with pytest.raises(MemoryLimitError) as err:
        parse_mem_limit(text, prof)
    assert str(err.value) == message


# -- the minimum feasible limit, said in the user's unit ------------------------------------------

def ranked(mem_B: list[float], unit: str = "bytes", **extra) -> Profile:
    stages = [dict({"F": 1, "B": 1, "W": 1, "mem_B": b, "mem_W": b / 4}, **extra.get("stage", {})) for b in mem_B]
    for stage, static in zip(stages, extra.get("static", [])):
        stage["static_bytes"] = static
    data = {"memory_unit": unit, "stages": stages, "source": {"kind": "estimated", "method": "test numbers"}}
    if "capacity" in extra:
        data["device_capacity_bytes"] = extra["capacity"]
    return Profile.from_dict(data)


# The issue's case: rank 0 needs 2.85216e9 bytes, rank 7 4.06 GiB; every limit below that must name rank 7.
ISSUE = ranked([2.85216e9] + [2 * GiB] * 6 + [4.0599 * GiB])


def infeasible(profile: Profile, text: str, placement=None) -> str:
    with pytest.raises(InfeasibleError) as err:
        check_feasible(profile, placement or linear(profile.num_stages), parse_mem_limit(text, profile))
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("text,gives", [("1GiB", "1 GiB"), ("3GiB", "3 GiB"), ("4.05GiB", "4.05 GiB")])
def test_a_byte_limit_names_the_rank_that_needs_the_most_in_gib(text: str, gives: str) -> None:
    assert infeasible(ISSUE, text) == (
        f"memory limit {text} is infeasible: one microbatch in flight needs at least 4.06 GiB on rank 7 (the most "
        f"of any rank), but the limit gives it {gives}; the minimum is 4.06 GiB per rank (the smallest feasible "
        "limit): raise the limit to at least that")


def test_the_stated_minimum_fits() -> None:
    check_feasible(ISSUE, linear(8), parse_mem_limit("4.06GiB", ISSUE))


@pytest.mark.parametrize("text,minimum", [
    ("1000000000", "4359284432 bytes"),   # plain bytes stay whole bytes, rounded up
    ("2048b", "4359284432 bytes"),
    ("1GB", "4.36 GB"),
    ("512MiB", "4158 MiB"),
    ("0.001TiB", "0.00397 TiB"),
    ("1p", None),
])
def test_the_minimum_is_in_the_unit_the_limit_was_written_in(text: str, minimum: str | None) -> None:
    if minimum is None:  # 1p always fits one microbatch: nothing to say
        check_feasible(ISSUE, linear(8), parse_mem_limit(text, ISSUE))
        return
    message = infeasible(ISSUE, text)
    assert f"the minimum is {minimum} per rank (the smallest feasible limit)" in message and "on rank 7" in message
    check_feasible(ISSUE, linear(8), parse_mem_limit(minimum.replace(" bytes", ""), ISSUE))


@pytest.mark.parametrize("p,text,minimum", [(4, "0.2p", "0.25p"), (3, "0.3p", "0.3334p"), (8, "0.1p", "0.125p")])
def test_multiples_of_p_give_the_minimum_in_p_rounded_up(p: int, text: str, minimum: str) -> None:
    prof = uniform_profile(1, 1, 1, p=p, m=8, mem_B=2.0, mem_W=1.0)
    message = infeasible(prof, text)
    assert message.endswith(f"the minimum is {minimum} per rank (the smallest feasible limit): raise the limit to at "
                            "least that")
    assert f"needs at least {minimum} on rank 0 (the most of any rank)" in message
    check_feasible(prof, linear(p), parse_mem_limit(minimum, prof))
    if minimum == "0.3334p":  # what %g would have said does not fit
        infeasible(prof, "0.3333p")


def test_a_limit_short_on_one_rank_names_it_and_the_rank_that_needs_the_most() -> None:
    prof = ranked([3 * GiB, 1 * GiB], capacity=12 * GiB / (1 - DEFAULT_HEADROOM), static=[5 * GiB, 11.5 * GiB])
    assert infeasible(prof, "auto") == (
        "memory limit auto is infeasible: one microbatch in flight needs at least 1 GiB on rank 1 (rank 0 needs the "
        "most), but the limit gives it 0.5 GiB; the minimum is 3 GiB per rank (the smallest feasible limit): raise the "
        "limit to at least that")


def test_a_v_shape_rank_needs_both_its_chunks() -> None:
    prof = ranked([1 * GiB, 2 * GiB, 1 * GiB, 1 * GiB])
    message = infeasible(prof, "1GiB", vshape(4))
    assert "needs at least 2 GiB on rank 1 (the most of any rank)" in message


@pytest.mark.parametrize("text,unit", [("2p", "p"), ("48 gib", "GiB"), ("40GB", "GB"), ("1e9", "bytes"),
                                       ("2048B", "bytes"), ("auto", "GiB"), ("512kib", "KiB")])
def test_a_limit_remembers_its_unit(text: str, unit: str) -> None:
    assert parse_mem_limit(text, in_bytes()).unit == unit


def test_messages_name_the_profile_file(tmp_path) -> None:
    path = tmp_path / "rel.json"
    relative().save(path)
    with pytest.raises(MemoryLimitError, match=re.escape(f"profile '{path}' gives memory in relative units")):
        parse_mem_limit("48GiB", load_profile(path))

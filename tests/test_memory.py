"""Memory-limit strings: multiples of p, absolute sizes, auto and none."""

from __future__ import annotations

import math

import pytest

from zbsearch.core.errors import MemoryLimitError
from zbsearch.core.memory import parse_mem_limit
from zbsearch.core.profile import Profile, uniform_profile

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


def test_auto_is_capacity_minus_static_bytes():
    limit = parse_mem_limit("auto", in_bytes())
    assert limit.per_rank == (60 * GiB, 60 * GiB)
    assert limit.text == "auto"


@pytest.mark.parametrize("text", [None, "none", "", "  ", "NONE", "inf", "unlimited"])
def test_none(text):
    limit = parse_mem_limit(text, relative())
    assert limit.unlimited
    assert all(math.isinf(x) for x in limit.per_rank)


@pytest.mark.parametrize("text,prof,match", [
    ("48GiB", relative(), "relative units"),
    ("40GB", relative(), "relative units"),
    ("1000000000", relative(), "relative units"),
    ("auto", relative(), "device_capacity_bytes"),
    ("auto", in_bytes(capacity=None), "device_capacity_bytes"),
    ("auto", in_bytes(static=False), "static_bytes"),
    ("auto", in_bytes(capacity=10 * GiB), "no room on rank 0"),
    ("0p", relative(), "positive"),
    ("0GiB", in_bytes(), "positive"),
    ("lots", relative(), "not a limit"),
    ("2q", relative(), "not a limit"),
    ("-1p", relative(), "not a limit"),
    ("48XB", in_bytes(), "not a limit"),
])
def test_errors_say_what_to_write(text, prof, match):
    with pytest.raises(MemoryLimitError, match=match) as err:
        parse_mem_limit(text, prof)
    assert "\n" not in str(err.value)

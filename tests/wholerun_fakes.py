"""Deterministic stand-ins for whole-run planning's jobs, for the tests of the process pool and Ray runners:
top-level, so both can pickle them."""

from __future__ import annotations

import time

from zbsearch.core.errors import PlanError


def square(x: int) -> int:
    return x * x


def square_even(x: int) -> int:
    if x % 2:
        raise PlanError(f"odd number {x}:\n give an even one", subject="x")
    return x * x


def crash(x: int) -> int:
    raise ValueError(f"a bug at {x}")


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds

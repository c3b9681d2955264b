"""Parsers for option values that are more than one token: comma lists and counts in a range.

Each is given to typer as `parser=`, so a value that does not parse is a usage error like `-p four`:
typer prints it under the usage line, naming the option ("Invalid value for '-m' / '--microbatches':
..."), and exits 2. Whether a well-formed value makes sense for the profile (a memory limit, a schedule
name) is the library's question, answered with exit 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import typer

from ..core.profile import MAX_MICROBATCHES, MAX_STAGES
from ..core.calibration import MEMORY_MODELS

FIGURE_FORMATS = ("png", "svg")


class IntList(tuple):
    """Integers from a comma list (a class of its own, so typer does not take it for several values)."""


class StrList(tuple):
    """Non-empty items of a comma list."""


class Numbers(tuple):
    """Finite numbers from a comma list; `text` is the list as typed, for messages."""

    text: str

    def __new__(cls, values: list[float], text: str) -> "Numbers":
        numbers = super().__new__(cls, values)
        numbers.text = text
        return numbers


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _count(text: str, what: str, most: int | None) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or (most is not None and value > most):
        allowed = f"from 1 to {most}" if most is not None else "of 1 or more"
        raise typer.BadParameter(f"{text!r} is not a number of {what}: use an integer {allowed}")
    return value


def count_parser(what: str, most: int | None = None) -> Callable[[str], int]:
    """A parser for one count from 1 to `most` (no upper end when None); `what` names the unit."""
    def parse(text: str) -> int:
        return _count(text, what, most)

    return parse


parse_stages = count_parser("stages", MAX_STAGES)
parse_microbatches = count_parser("microbatches", MAX_MICROBATCHES)
parse_chunks = count_parser("chunks per rank")


def count_list_parser(what: str, example: str, most: int | None = None) -> Callable[[str], IntList]:
    """A parser for a comma list of counts from 1 to `most`, e.g. 'microbatch counts' written '24,32'."""
    def parse(text: str) -> IntList:
        try:
            counts = IntList(_count(item, what, most) for item in _items(text))
        except typer.BadParameter:
            counts = IntList()
        if not counts:
            allowed = f" from 1 to {most}" if most is not None else ""
            raise typer.BadParameter(f"{text!r} is not a list of {what}{allowed}: write e.g. {example}")
        return counts

    return parse


parse_microbatch_list = count_list_parser("microbatch counts", "24 or 24,32,64", MAX_MICROBATCHES)


def parse_memory_model(value: str) -> str:
    """A --memory-model value, or a usage error naming the choices."""

    if value not in MEMORY_MODELS:
        raise typer.BadParameter(f"{value!r} is not a memory model: use one of {', '.join(MEMORY_MODELS)}")
    return value


def parse_str_list(text: str) -> StrList:
    """'1p, 2p' -> ('1p', '2p'); at least one item."""
    items = _items(text)
    if not items:
        raise typer.BadParameter(f"{text!r} is empty: give at least one value, e.g. 1p,2p")
    return StrList(items)


def parse_figure_formats(text: str) -> StrList:
    """'png,svg' -> ('png', 'svg'); 'none' -> (); duplicates dropped, order kept."""
    items = [item.lower() for item in _items(text)]
    if items == ["none"]:
        return StrList()
    if not items or any(item not in FIGURE_FORMATS for item in items):
        raise typer.BadParameter(f"{text!r} is not a list of figure formats: use png, svg, png,svg or none")
    return StrList(dict.fromkeys(items))


def numbers_parser(counts: tuple[int, ...], example: str) -> Callable[[str], Numbers]:
    """A parser for `len in counts` comma-separated finite numbers, e.g. --uniform's F,B,W[,COMM]."""
    def parse(text: str) -> Numbers:
        try:
            values = [float(item) for item in text.split(",")]
        except ValueError:
            values = []
        if len(values) not in counts or not all(math.isfinite(v) for v in values):
            allowed = " or ".join(str(c) for c in counts)
            raise typer.BadParameter(f"{text!r} is not {allowed} comma-separated numbers: write e.g. {example}")
        return Numbers(values, text)

    return parse


parse_uniform_times = numbers_parser((3, 4), "1,1,1")
parse_uniform_memory = numbers_parser((2,), "1,0.5")

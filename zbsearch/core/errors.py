"""One exception family for zbsearch.

The library raises these with messages that say where the fault is and how to fix it; only the CLI
catches them, prints the message on one line and exits non-zero. Anything else escaping is a bug.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


class ZbsearchError(Exception):
    """Base class: a user-facing error whose message names the field (or action) and the fix.

    `subject` is the request field the error is about (`mem_limit`, `placement`, ...; the names of
    search.entry.PlanRequest), None when it is about the profile or no one field: a caller names the
    field in its own spelling (the CLI's flag) from it, never from the message's wording."""

    def __init__(self, message: str = "", *, subject: str | None = None) -> None:
        super().__init__(message)
        self.subject = subject


@contextmanager
def about(subject: str, *, overriding: bool = False) -> Iterator[None]:
    """Errors raised inside are about `subject` unless they already name one. `overriding`: about
    `subject` even so, for a step whose inputs the caller did not give field by field (a plan's split
    checked against a profile is about the profile, though the check speaks of the split)."""
    try:
        yield
    except ZbsearchError as exc:
        if exc.subject is None or overriding:
            exc.subject = subject
        raise


class ProfileError(ZbsearchError):
    """A profile file or uniform shorthand is malformed or out of range."""


class MemoryLimitError(ZbsearchError):
    """A memory limit string cannot be parsed or does not apply to this profile."""


class ScheduleError(ZbsearchError):
    """A schedule is malformed, incomplete, deadlocks, or breaks a memory limit."""


class PreconditionError(ZbsearchError):
    """A handcrafted schedule is not defined for these p and m (or chunk count)."""


class InfeasibleError(ZbsearchError):
    """No schedule fits the request (e.g. the memory limit is below the smallest feasible one)."""


class PlanError(ZbsearchError):
    """A planning input is out of range: p < 2, a target outside (0, 1), a batch that does not divide."""


class FileError(ZbsearchError):
    """An input file cannot be read or parsed, or an output file cannot be written."""


class DependencyError(ZbsearchError):
    """An optional extra (torch, matplotlib) is needed for this request and is not installed."""


class ProfilerError(ZbsearchError):
    """A model cannot be built, measured or estimated as asked (bad shape, unknown device, bad factory)."""


class PartitionError(ZbsearchError):
    """Layers cannot be split into stages as asked (too few layers, counts that do not add up)."""


class RunError(ZbsearchError):
    """A schedule cannot be executed on torch's runtime as asked (processes, backend, a worker failed)."""

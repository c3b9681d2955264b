"""What a schedule is scored by, and how a search ended: one vocabulary for every step.

Both are string enums, so a value prints, compares and serialises as the word users type
("makespan", "optimal") while code reads the member (`Objective.SPAN`, `Status.OPTIMAL`).
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from .errors import PreconditionError


class _Timed(Protocol):
    """Anything with a makespan and a span, read-only (a Timeline's are properties, a Summary's frozen
    fields, a QuickCost's tuple fields)."""

    @property
    def makespan(self) -> float: ...

    @property
    def span(self) -> float: ...


class _Word(str, Enum):
    """A member that formats as its value, in f-strings and str() alike, on every Python."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Objective(_Word):
    """One iteration's makespan (the optimizer step synchronises ranks), or the largest per-rank span
    (the Zero Bubble paper's post-validation setting)."""

    MAKESPAN = "makespan"
    SPAN = "span"

    @classmethod
    def parse(cls, value: "str | Objective") -> "Objective":
        """The member named `value`; a PreconditionError naming the choices otherwise.

        >>> Objective.parse("span"), Objective.parse(Objective.MAKESPAN) is Objective.MAKESPAN
        (<Objective.SPAN: 'span'>, True)
        """
        try:
            return cls(value)
        except ValueError:
            raise PreconditionError(f"objective {value!r} is not known: use one of {', '.join(OBJECTIVES)}",
                                    subject="objective") from None

    def of(self, timed: _Timed) -> float:
        """The makespan or the span of anything that has both (a Timeline, a Summary)."""
        return timed.makespan if self is Objective.MAKESPAN else timed.span


OBJECTIVES = tuple(o.value for o in Objective)


class Status(_Word):
    """How a search (or one CP-SAT call) ended: its answer proven optimal, feasible (valid, not proven),
    infeasible (no answer exists) or unknown (none found in the time)."""

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    UNKNOWN = "unknown"


# Relative tolerance under which a value counts as equal to its lower bound (proven optimal).
OPTIMAL_RTOL = 1e-9


def status_for(value: float, bound: float) -> Status:
    """Optimal where `value` meets the proven lower `bound` (within OPTIMAL_RTOL), else feasible.

    >>> status_for(10.0, 10.0), status_for(10.0, 9.0)
    (<Status.OPTIMAL: 'optimal'>, <Status.FEASIBLE: 'feasible'>)
    """
    return Status.OPTIMAL if value <= bound * (1 + OPTIMAL_RTOL) else Status.FEASIBLE


def settled(value: float) -> float:
    """`value` to 12 significant digits, for ordering: the same pass times summed in another order differ
    in the last bits, and without this which schedule wins such a tie would depend on which the search
    happened to reach (under a deadline, on the machine's speed) rather than on the order tried.

    >>> settled(2176180.1227999963) == settled(2176180.1227999968)
    True
    """
    return float(f"{value:.12g}")

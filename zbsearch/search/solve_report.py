"""What `zbsearch solve` reports: the schedule's summary plus how good the search proved it to be.

`SolveReport.to_dict()` is the object `zbsearch solve --json` prints: the summary's keys, then the
search's (schedule_share last: the objective's bubble less the stage imbalance), then the solver's
diagnostics (cpsat_status, grid_step, grid_rounds, placements, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..sim.summary import Summary


@dataclass(frozen=True)
class SolveReport:
    """Times in the profile's time unit, like the summary's."""

    summary: Summary
    objective: str  # makespan or span
    objective_value: float
    lower_bound: float
    bubble_rate_lower_bound: float  # the bubble rate no schedule can beat under the objective
    gap: float  # (objective_value - lower_bound) / objective_value
    status: str  # optimal (the incumbent meets a proven bound) or feasible
    solve_seconds: float
    start_heuristic: str
    heuristic_objective: float
    # The solver's diagnostics, JSON-ready, in the order it recorded them; their keys never collide
    # with the fields above.
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def bubble_rate(self) -> float:
        """The schedule's bubble rate under the objective it was solved for."""
        return self.summary.bubble_rate(self.objective)

    @property
    def schedule_share(self) -> float:
        """The bubble rate under the objective less the stage imbalance: what the schedule adds."""
        return self.summary.schedule_share(self.objective)

    @property
    def cpsat_status(self) -> str | None:
        return self.details.get("cpsat_status")

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary.to_dict(),
            "objective": self.objective,
            "objective_value": self.objective_value,
            "lower_bound": self.lower_bound,
            "bubble_rate_lower_bound": self.bubble_rate_lower_bound,
            "gap": self.gap,
            "status": self.status,
            "solve_seconds": self.solve_seconds,
            "start_heuristic": self.start_heuristic,
            "heuristic_objective": self.heuristic_objective,
            "schedule_share": self.schedule_share,
            **self.details,
        }

"""What the large-neighbourhood search (exact/lns.py) hands back: the incumbent it ends with and its counts."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.ir import Schedule
from ...sim.simulate import Timeline


@dataclass
class LnsStats:
    """The windows solved, the answers accepted (shorter, or as short with a smaller sum of rank spans),
    those that were shorter, and the re-timed orders the exact check rejected; filled in as it goes."""

    windows: int = 0
    accepted: int = 0
    improved: int = 0
    rejected: int = 0
    settled: bool = False  # the last window held every pass and was solved to optimality
    history: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {f"lns_{k}": getattr(self, k) for k in ("windows", "accepted", "improved", "rejected")}


@dataclass(frozen=True)
class LnsResult:
    """The best schedule the windows found (or the one they started from), its validated timeline and
    objective, and the search's counts."""

    schedule: Schedule
    timeline: Timeline
    objective: float
    stats: LnsStats

"""zbsearch: pipeline-parallel schedule search.

The flow is profile -> problem -> (heuristics | CP-SAT) -> schedule -> validate -> simulate/report ->
export/run; each step is a module, and a `Schedule` (ir.py) is the plain data they all read.
"""

from .errors import (
    InfeasibleError, MemoryLimitError, PlanError, PreconditionError, ProfileError, ScheduleError, ZbsearchError,
)
from .ir import Action, Kind, Placement, Schedule
from .memory import MemoryLimit, parse_mem_limit
from .profile import Profile, StageCost, load_profile, parse_uniform, uniform_profile
from .report import summarize
from .schedules import generate
from .simulate import Timeline, simulate
from .validate import check, validate

__version__ = "0.1.0"

__all__ = [
    "Action", "InfeasibleError", "Kind", "MemoryLimit", "MemoryLimitError", "Placement", "PlanError", "PreconditionError",
    "Profile", "ProfileError", "Schedule", "ScheduleError", "StageCost", "Timeline", "ZbsearchError",
    "check", "generate", "load_profile", "parse_mem_limit", "parse_uniform", "simulate", "summarize",
    "uniform_profile", "validate",
]

"""zbsearch: pipeline-parallel schedule search.

The flow is profile -> problem -> (heuristics | CP-SAT) -> schedule -> validate -> simulate/report ->
export/run; each step is a module, and a `Schedule` (ir.py) is the plain data they all read.
"""

from .core.errors import (
    DependencyError, FileError, InfeasibleError, MemoryLimitError, PartitionError, PlanError, PreconditionError,
    ProfileError, ProfilerError, RunError, ScheduleError, ZbsearchError,
)
from .core.ir import Action, Kind, Placement, Schedule
from .core.memory import MemoryLimit, parse_mem_limit
from .core.profile import Profile, StageCost, load_profile, uniform_profile
from .sim.summary import summarize
from .schedules import generate
from .sim.simulate import Timeline, simulate
from .sim.validate import check, validate

__version__ = "0.1.0"

__all__ = [
    "Action", "DependencyError", "FileError", "InfeasibleError", "PartitionError", "ProfilerError", "RunError", "Kind", "MemoryLimit", "MemoryLimitError", "Placement", "PlanError", "PreconditionError",
    "Profile", "ProfileError", "Schedule", "ScheduleError", "StageCost", "Timeline", "ZbsearchError",
    "check", "generate", "load_profile", "parse_mem_limit", "simulate", "summarize",
    "uniform_profile", "validate",
]

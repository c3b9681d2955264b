"""zbsearch: pipeline-parallel schedule search.

The flow is profile -> problem -> (heuristics | CP-SAT) -> schedule -> validate -> simulate/report ->
export/run; each step is a subpackage, and a `Schedule` (core/ir.py) is the plain data they all read.
docs/architecture.md describes the layout and this API.
"""

from __future__ import annotations

import importlib
from typing import Any

from .core.errors import (DependencyError, FileError, InfeasibleError, MemoryLimitError, PartitionError,
    PlanError, PreconditionError, ProfileError, ProfilerError, RunError, ScheduleError, ZbsearchError)
from .core.ir import Action, Kind, Placement, Schedule
from .core.plan_record import PlanRecord
from .core.memory import MemoryLimit, parse_mem_limit
from .core.profile import Profile, load_profile, uniform_profile
from .core.stage_cost import StageCost
from .schedules import REGISTRY, ScheduleSpec, generate
from .sim.simulate import Timeline, simulate
from .sim.summary import Summary, summarize
from .sim.validate import check, validate

__version__ = "0.1.0"

# Names loaded on first use: the search pulls in OR-Tools, which `import zbsearch` should not pay for.
_LAZY = {
    "Problem": "search.problem", "make_problems": "search.problem", "SearchOptions": "search.options",
    "solve": "search.solve.driver", "solve_placements": "search.solve.driver", "SolveResult": "search.solve.driver",
    "SolveReport": "search.solve.report",
    "find_plan": "search.entry.find_plan", "PlanRequest": "search.entry.request",
    "export": "interop.formats.export", "import_torch_csv": "interop.formats.torch_import",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'zbsearch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Action", "DependencyError", "FileError", "InfeasibleError", "Kind", "MemoryLimit", "MemoryLimitError",
    "PartitionError", "Placement", "PlanError", "PlanRecord", "PlanRequest", "PreconditionError", "Problem",
    "Profile", "ProfileError", "ProfilerError", "REGISTRY", "RunError", "Schedule", "ScheduleError", "ScheduleSpec",
    "SearchOptions", "SolveReport", "SolveResult", "StageCost", "Summary", "Timeline", "ZbsearchError", "check",
    "export", "find_plan", "generate",
    "import_torch_csv", "load_profile", "make_problems", "parse_mem_limit", "simulate",
    "solve", "solve_placements", "summarize", "uniform_profile", "validate",
]

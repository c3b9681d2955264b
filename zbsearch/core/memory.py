"""Per-rank activation memory limits from the strings users type.

`2p`, `1p`, `1.5p`: that many times p times the rank's own per-microbatch stage activation memory
(mem_B), the Zero Bubble paper's ZB-1p / ZB-2p convention. `48GiB`, `40GB`, `1e9`: an absolute size in
bytes (needs a profile whose memory_unit is bytes). `auto`: device capacity minus the stage's static
bytes. `none`: no limit. Limits count activations only, the way the paper's limits do.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .errors import InfeasibleError, MemoryLimitError
from .ir import Placement
from .profile import Profile

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_P_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)?\s*p\s*$", re.I)
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?(?:e\d+)?|\.\d+)\s*([kmgt]i?b|b)?\s*$", re.I)


@dataclass(frozen=True)
class MemoryLimit:
    """Activation limit per rank, in the profile's memory unit. `per_rank[r]` is inf for no limit."""

    text: str
    per_rank: tuple[float, ...]

    @property
    def unlimited(self) -> bool:
        return all(math.isinf(x) for x in self.per_rank)

    def in_stage_units(self, profile: Profile) -> tuple[float, ...]:
        """The limit of each rank in multiples of that rank's stage mem_B."""
        return tuple(x / profile.stage_mem_B(r) for r, x in enumerate(self.per_rank))


def no_limit(profile: Profile) -> MemoryLimit:
    return MemoryLimit("none", (math.inf,) * profile.num_stages)


def parse_mem_limit(text: str | None, profile: Profile) -> MemoryLimit:
    """Parse a limit string against a profile; raise MemoryLimitError saying what to write instead."""
    if text is None or text.strip().lower() in ("", "none", "inf", "unlimited"):
        return no_limit(profile)
    p = profile.num_stages
    s = text.strip()
    m = _P_RE.match(s)
    if m:
        factor = float(m.group(1)) if m.group(1) else 1.0
        if factor <= 0:
            raise MemoryLimitError(f"--mem-limit {text!r} must be positive, e.g. 1p or 2p")
        return MemoryLimit(s, tuple(factor * p * profile.stage_mem_B(r) for r in range(p)))
    if s.lower() == "auto":
        missing = [r for r in range(p) if profile.stages[r].static_bytes is None]
        if profile.device_capacity_bytes is None or missing or profile.memory_unit != "bytes":
            raise MemoryLimitError(
                f"--mem-limit auto needs the profile to give device_capacity_bytes and every stage's "
                f"static_bytes in bytes; profile {profile.name!r} does not: use e.g. 2p or 48GiB"
            )
        per = tuple(profile.device_capacity_bytes - profile.stages[r].static_bytes for r in range(p))
        if min(per) <= 0:
            r = per.index(min(per))
            raise MemoryLimitError(
                f"--mem-limit auto leaves no room on rank {r}: its static bytes exceed the device capacity"
            )
        return MemoryLimit("auto", per)
    m = _SIZE_RE.match(s)
    if m:
        size = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
        if size <= 0:
            raise MemoryLimitError(f"--mem-limit {text!r} must be positive")
        if profile.memory_unit != "bytes":
            raise MemoryLimitError(
                f"--mem-limit {text!r} is an absolute size, but profile {profile.name!r} gives memory in "
                "relative units: use a multiple of p such as 1p or 2p"
            )
        return MemoryLimit(s, (size,) * p)
    raise MemoryLimitError(
        f"--mem-limit {text!r} is not a limit: write a multiple of p (1p, 2p, 1.5p), a size "
        "(48GiB, 40GB, 1000000000), auto or none"
    )


def min_feasible_limit(profile: Profile, placement: Placement) -> tuple[float, ...]:
    """Per rank, the smallest activation limit any schedule can meet.

    Necessary: on each rank a microbatch's forwards all come before its backwards there (the loss is
    at the end of its route), so the mem_B of all the rank's chunks on that route are held at once.
    Enough: run the microbatches one at a time, each W right after its B.
    """
    need = [0.0] * placement.num_ranks
    for route in placement.routes:
        per = [0.0] * placement.num_ranks
        for c in route:
            per[placement.chunk_to_rank[c]] += profile.chunk_cost(placement, c).mem_B
        need = [max(a, b) for a, b in zip(need, per)]
    return tuple(need)


def check_feasible(profile: Profile, placement: Placement, limit: MemoryLimit) -> None:
    """Raise InfeasibleError stating the smallest feasible limit when `limit` is below it."""
    need = min_feasible_limit(profile, placement)
    p = placement.num_ranks
    for r, (cap, n) in enumerate(zip(limit.per_rank, need)):
        if cap < n * (1 - 1e-9):
            unit = profile.stage_mem_B(r)
            smallest = max(x / profile.stage_mem_B(q) for q, x in enumerate(need)) / p
            raise InfeasibleError(
                f"memory limit {limit.text} is infeasible: it gives rank {r} {cap:g} ({cap / unit:.4g} x its stage "
                f"M_B) but one microbatch in flight needs {n:g} ({n / unit:.4g} x M_B); the minimum is "
                f"{smallest:.4g}p (the smallest feasible limit): raise --mem-limit to at least that"
            )

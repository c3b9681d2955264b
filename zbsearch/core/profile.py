"""Profiles: the measured (or published, or estimated) cost of each pipeline stage.

A profile describes one pipeline of `num_stages` stages (one per rank in a linear placement):
per-stage times of F (forward), B (backward for inputs), W (backward for weights) and optionally the
fused full backward; the communication time between adjacent stages; the activation memory a
microbatch holds on each stage from its F until its B (`mem_B`) and from its B until its W (`mem_W`);
optional static bytes (parameters, optimizer state) and device capacity; and where the numbers come
from. Times are in `time_unit` (any unit, used consistently). Memory is in bytes when `memory_unit` is
"bytes", or in arbitrary relative units (only the ratios matter) when it is "relative".

Chunked placements split a rank's stage evenly over the chunks it holds unless the profile lists
per-chunk costs in `chunks` (one entry per global chunk index).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from .errors import ProfileError
from .fileio import finite, read_json, write_atomic
from .ir import Placement

SOURCE_KINDS = {
    "measured": ("device", "date"),
    "published": ("citation",),
    "estimated": ("method",),
}
MEMORY_UNITS = ("bytes", "relative")
MAX_STAGES = 1024
MAX_MICROBATCHES = 100_000


@dataclass(frozen=True)
class StageCost:
    """Cost of one stage (or one chunk) for one microbatch."""

    F: float
    B: float
    W: float
    mem_B: float = 1.0
    mem_W: float = 0.5
    full_backward: float | None = None
    static_bytes: float | None = None

    @property
    def BW(self) -> float:
        """Time of the fused backward: the profile's own figure, else B + W."""
        return self.full_backward if self.full_backward is not None else self.B + self.W

    def scaled(self, share: float) -> "StageCost":
        return StageCost(
            self.F * share, self.B * share, self.W * share, self.mem_B * share, self.mem_W * share,
            None if self.full_backward is None else self.full_backward * share,
            None if self.static_bytes is None else self.static_bytes * share,
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Profile:
    """One pipeline's costs. Build with `load_profile`, `Profile.from_dict` or `uniform_profile`."""

    name: str
    stages: tuple[StageCost, ...]
    comm: tuple[float, ...]
    microbatches: int
    source: dict[str, Any]
    time_unit: str = "us"
    memory_unit: str = "relative"
    device_capacity_bytes: float | None = None
    chunks: tuple[StageCost, ...] | None = None
    details: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    # -- costs under a placement -------------------------------------------------------------
    def chunk_cost(self, placement: Placement, chunk: int) -> StageCost:
        """Per-microbatch cost of one chunk: the profile's per-chunk entry when it has one for this
        chunk count, else the holding rank's stage split evenly over its chunks of the same route."""
        if self.chunks is not None and len(self.chunks) == placement.num_chunks:
            return self.chunks[chunk]
        return self.stages[placement.chunk_to_rank[chunk]].scaled(placement.share(chunk))

    def hop(self, placement: Placement, src_chunk: int, dst_chunk: int) -> float:
        """Time for an activation (or its gradient) to move from one chunk to the next.

        Same-rank hand-offs are free. Adjacent ranks r, r+1 pay comm[r]. Any other hop (the
        interleaved wrap from rank p-1 back to rank 0) pays the slowest link's time.
        """
        a, b = placement.chunk_to_rank[src_chunk], placement.chunk_to_rank[dst_chunk]
        if a == b or not self.comm:
            return 0.0
        if abs(a - b) == 1:
            return self.comm[min(a, b)]
        return max(self.comm)

    def stage_mem_B(self, rank: int) -> float:
        """One whole stage's activation memory per microbatch on this rank (the unit of `Np` limits)."""
        return self.stages[rank].mem_B

    def with_microbatches(self, m: int) -> "Profile":
        check_microbatches(m)
        return replace(self, microbatches=m)

    # -- serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": "zbsearch-profile/1",
            "name": self.name,
            "num_stages": self.num_stages,
            "microbatches": self.microbatches,
            "time_unit": self.time_unit,
            "memory_unit": self.memory_unit,
            "stages": [s.to_dict() for s in self.stages],
            "comm": list(self.comm),
            "source": self.source,
        }
        if self.device_capacity_bytes is not None:
            out["device_capacity_bytes"] = self.device_capacity_bytes
        if self.chunks is not None:
            out["chunks"] = [c.to_dict() for c in self.chunks]
        if self.details:
            out["details"] = self.details
        return out

    def save(self, path: str | Path) -> None:
        write_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, data: Any, origin: str = "profile") -> "Profile":
        return _parse_profile(data, origin)


# -- validation ------------------------------------------------------------------------------

def _err(origin: str, where: str, problem: str, fix: str) -> ProfileError:
    return ProfileError(f"{origin}: field {where} {problem}; {fix}")


def _number(origin: str, where: str, value: Any, *, positive: bool = False, optional: bool = False) -> float | None:
    if value is None:
        if optional:
            return None
        raise _err(origin, where, "is missing", "give a number")
    if not finite(value):
        raise _err(origin, where, f"is {value!r}", "give a finite number (no NaN, no infinity, no string)")
    if value < 0 or (positive and value == 0):
        need = "> 0" if positive else ">= 0"
        raise _err(origin, where, f"is {value}", f"it must be {need}")
    return float(value)


def _parse_stage(origin: str, where: str, raw: Any, memory_required: bool) -> StageCost:
    if not isinstance(raw, dict):
        raise _err(origin, where, "is not an object", 'write {"F": ..., "B": ..., "W": ..., "mem_B": ..., "mem_W": ...}')
    known = {"F", "B", "W", "mem_B", "mem_W", "full_backward", "static_bytes"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise _err(origin, f"{where}.{unknown[0]}", "is not a stage field", f"stage fields are {sorted(known)}")
    F = _number(origin, f"{where}.F", raw.get("F"), positive=True)
    B = _number(origin, f"{where}.B", raw.get("B"))
    W = _number(origin, f"{where}.W", raw.get("W"))
    if B + W == 0:
        raise _err(origin, f"{where}.B", "and W are both 0", "a stage needs some backward time")
    mem_B = _number(origin, f"{where}.mem_B", raw.get("mem_B", None if memory_required else 1.0), positive=True)
    mem_W = _number(origin, f"{where}.mem_W", raw.get("mem_W", None if memory_required else mem_B / 2))
    if mem_W > mem_B:
        raise _err(origin, f"{where}.mem_W", f"({mem_W}) exceeds mem_B ({mem_B})",
                   "B frees mem_B - mem_W and W frees mem_W, so mem_W must be <= mem_B")
    full = _number(origin, f"{where}.full_backward", raw.get("full_backward"), positive=True, optional=True)
    static = _number(origin, f"{where}.static_bytes", raw.get("static_bytes"), optional=True)
    return StageCost(F, B, W, mem_B, mem_W, full, static)


def check_stages(p: Any) -> int:
    if not isinstance(p, int) or isinstance(p, bool) or not 1 <= p <= MAX_STAGES:
        raise ProfileError(f"number of stages p is {p!r}: it must be an integer from 1 to {MAX_STAGES}")
    return p


def check_microbatches(m: Any) -> int:
    if not isinstance(m, int) or isinstance(m, bool) or not 1 <= m <= MAX_MICROBATCHES:
        raise ProfileError(f"number of microbatches m is {m!r}: it must be an integer from 1 to {MAX_MICROBATCHES}")
    return m


def _parse_profile(data: Any, origin: str) -> Profile:
    if not isinstance(data, dict):
        raise ProfileError(f"{origin}: a profile must be a JSON object (see zbsearch's profile schema)")
    fmt = data.get("format", "zbsearch-profile/1")
    if fmt != "zbsearch-profile/1":
        raise _err(origin, "format", f"is {fmt!r}", "this zbsearch reads 'zbsearch-profile/1'")
    raw_stages = data.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise _err(origin, "stages", "is missing or empty", "list one object per stage with F, B, W, mem_B, mem_W")
    p = data.get("num_stages", len(raw_stages))
    try:
        check_stages(p)
    except ProfileError as exc:
        raise _err(origin, "num_stages", f"is {p!r}", f"it must be an integer from 1 to {MAX_STAGES}") from exc
    if len(raw_stages) != p:
        raise _err(origin, "stages", f"has {len(raw_stages)} entries but num_stages is {p}", "give one entry per stage")
    memory_unit = data.get("memory_unit", "relative")
    if memory_unit not in MEMORY_UNITS:
        raise _err(origin, "memory_unit", f"is {memory_unit!r}", f"use one of {list(MEMORY_UNITS)}")
    stages = tuple(_parse_stage(origin, f"stages[{i}]", s, memory_unit == "bytes") for i, s in enumerate(raw_stages))
    comm_raw = data.get("comm", 0.0)
    if isinstance(comm_raw, list):
        if len(comm_raw) != p - 1:
            raise _err(origin, "comm", f"has {len(comm_raw)} entries for {p} stages",
                       f"give one number per boundary ({p - 1}) or a single number")
        comm = tuple(_number(origin, f"comm[{i}]", c) for i, c in enumerate(comm_raw))
    else:
        comm = (_number(origin, "comm", comm_raw),) * (p - 1)
    m = data.get("microbatches", 1)
    try:
        check_microbatches(m)
    except ProfileError:
        raise _err(origin, "microbatches", f"is {m!r}", f"it must be an integer from 1 to {MAX_MICROBATCHES}") from None
    source = data.get("source")
    if not isinstance(source, dict) or source.get("kind") not in SOURCE_KINDS:
        raise _err(origin, "source.kind", f"is {None if not isinstance(source, dict) else source.get('kind')!r}",
                   "say where the numbers come from: measured (with device, date), published (with citation) "
                   "or estimated (with method)")
    for need in SOURCE_KINDS[source["kind"]]:
        if not source.get(need):
            raise _err(origin, f"source.{need}", "is missing", f"a {source['kind']} profile must state its {need}")
    capacity = _number(origin, "device_capacity_bytes", data.get("device_capacity_bytes"), positive=True, optional=True)
    chunks = None
    if data.get("chunks") is not None:
        if not isinstance(data["chunks"], list) or not data["chunks"]:
            raise _err(origin, "chunks", "is not a list", "list one cost object per global chunk, or leave it out")
        chunks = tuple(_parse_stage(origin, f"chunks[{i}]", c, memory_unit == "bytes") for i, c in enumerate(data["chunks"]))
    for key in ("name", "time_unit"):
        if key in data and not isinstance(data[key], str):
            raise _err(origin, key, f"is {data[key]!r}", "give a string")
    details = data.get("details") or {}
    if not isinstance(details, dict):
        raise _err(origin, "details", "is not an object", "give an object or leave it out")
    return Profile(
        name=data.get("name", origin), stages=stages, comm=comm, microbatches=m, source=dict(source),
        time_unit=data.get("time_unit", "us"), memory_unit=memory_unit, device_capacity_bytes=capacity,
        chunks=chunks, details=dict(details),
    )


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile JSON file."""
    return Profile.from_dict(read_json(path, what="profile"), origin=str(path))


def uniform_profile(
    F: float, B: float, W: float, comm: float = 0.0, *, p: int, m: int,
    mem_B: float = 1.0, mem_W: float = 0.5,
) -> Profile:
    """The research shorthand: p identical stages with these whole-stage times and memory."""
    check_stages(p)
    check_microbatches(m)
    data = {
        "name": f"uniform F={F:g} B={B:g} W={W:g} comm={comm:g} p={p}",
        "num_stages": p, "microbatches": m, "time_unit": "unit", "memory_unit": "relative",
        "stages": [{"F": F, "B": B, "W": W, "mem_B": mem_B, "mem_W": mem_W}] * p,
        "comm": comm,
        "source": {"kind": "estimated", "method": "uniform shorthand: identical stages given on the command line"},
    }
    return Profile.from_dict(data, origin="--uniform")


def parse_uniform(text: str, p: int, m: int, memory: str | None = None) -> Profile:
    """Parse the CLI's `F,B,W[,COMM]` and `M_B,M_W` strings."""
    def numbers(s: str, flag: str, counts: Sequence[int]) -> list[float]:
        try:
            vals = [float(x) for x in s.split(",")]
        except ValueError:
            vals = []
        if len(vals) not in counts or not all(math.isfinite(v) for v in vals):
            raise ProfileError(f"{flag} {s!r} is not {' or '.join(str(c) for c in counts)} comma-separated numbers; "
                               f"write e.g. {flag} {'1,1,1' if flag == '--uniform' else '1,0.5'}")
        return vals

    t = numbers(text, "--uniform", (3, 4))
    mem = numbers(memory, "--uniform-memory", (2,)) if memory else [1.0, 0.5]
    return uniform_profile(*t, p=p, m=m, mem_B=mem[0], mem_W=mem[1])


PROFILE_SCHEMA_PATH = Path(__file__).with_name("profile.schema.json")


def profile_schema() -> dict[str, Any]:
    """The published JSON Schema of the profile format."""
    return json.loads(PROFILE_SCHEMA_PATH.read_text())

"""Profiles: the measured (or published, or estimated) cost of each pipeline stage.

A profile describes one pipeline of `num_stages` stages (one per rank in a linear placement):
per-stage times of F (forward), B (backward for inputs), W (backward for weights) and optionally of the
fused full backward and of an overlapped F&B pair (DualPipe's); the communication time between adjacent
stages; the activation memory a microbatch holds on each stage from its F until its B (`mem_B`) and
from its B until its W (`mem_W`);
optional static bytes (parameters, optimizer state) and device capacity; and where the numbers come
from. Times are in `time_unit` (any unit, used consistently). Memory is in bytes when `memory_unit` is
"bytes", or in arbitrary relative units (only the ratios matter) when it is "relative".

Chunked placements split a rank's stage evenly over the chunks it holds unless the profile lists
per-chunk costs in `chunks` (one entry per global chunk index). Stage r is rank r's work: on DualPipe's
placement each of its two chunks (one per model copy) costs a whole stage r, parameters included.
A profile may also list its `layers` (see layers.py): then the split of layers into stages and chunks
can be chosen (core/partition.py builds the stage-level profile of one split, and remembers the split
in `partition`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .calibration import CommTable, check_memory_model, comm_time, parse_comm_table, running_cost
from .errors import ProfileError, about
from .fileio import read_json, write_atomic
from .ir import Placement
from .layers import Layer, parse_layers
from .sharding import Sharding
from .profile_validation import (PROFILE_SCHEMA_PATH, check_memory_order, check_overlap, check_profile_data,
    profile_schema)
from .stage_cost import StageCost

__all__ = [
    "MAX_MICROBATCHES", "MAX_STAGES", "PROFILE_SCHEMA_PATH", "Profile", "check_microbatches",
    "check_stages", "load_profile", "profile_schema", "uniform_profile",
]

MAX_STAGES = 1024
MAX_MICROBATCHES = 100_000


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
    layers: tuple[Layer, ...] | None = None
    link_bandwidth: float | None = None  # bytes per time_unit, for hops computed from layers' out_bytes
    # Calibration (core/calibration.py): the runtime's cost per action (time_unit), measured message
    # times by size, and which memory accounting plans are made with.
    action_overhead: float = 0.0
    comm_table: CommTable | None = None
    memory_model: str = "paper"
    # Layer names per global chunk index when the stages and chunks are one split of `layers`
    # (core/partition.py); not written by to_dict, which writes the profile the user gave.
    partition: tuple[tuple[str, ...], ...] | None = field(default=None, compare=False, hash=False, repr=False)
    # The file it was read from, for messages ("name" is often the same in every file); None when built
    # in memory. Not part of the profile's identity, and never written.
    path: str | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def gives_overlap(self) -> bool:
        """Whether the profile gives an F&B pair time anywhere (then pairing passes can save time)."""
        return any(s.overlap_f_b is not None for s in self.stages + (self.chunks or ()))

    @property
    def sharding(self) -> Sharding | None:
        """The data-parallel sharding its static bytes are under (details.static.sharding, written by
        core/static_bytes.shard_profile), None when unsharded."""
        recorded = (self.details.get("static") or {}).get("sharding")
        return Sharding(int(recorded["degree"]), str(recorded["how"])) if isinstance(recorded, dict) else None

    @property
    def stage_split(self) -> tuple[tuple[str, ...], ...] | None:
        """The layer names of each of the profile's own stages, as the profiler split them
        (details.partition.layers_per_stage); None when the profile does not record them.

        Raises
        ------
        ProfileError
            The field is there but is not a list of lists of layer names.
        """
        names = (self.details.get("partition") or {}).get("layers_per_stage")
        if names is None:
            return None
        if not isinstance(names, list) or not all(isinstance(s, list) and all(isinstance(n, str) for n in s)
                                                  for s in names):
            raise ProfileError(f"profile {self.label}: field details.partition.layers_per_stage must list the layer "
                               "names of each stage")
        return tuple(tuple(s) for s in names)

    @property
    def label(self) -> str:
        """How messages name this profile: its file's path when read from one, else its name."""
        return repr(self.path if self.path is not None else self.name)

    # -- costs under a placement -------------------------------------------------------------
    def chunk_cost(self, placement: Placement, chunk: int) -> StageCost:
        """Per-microbatch cost of one chunk as it runs: the profile's per-chunk entry when it has one for
        this chunk count, else the holding rank's stage split evenly over its chunks of the same route;
        then the action overhead added to each pass and the memory of the profile's memory model
        (core/calibration.py). Everything that times or sizes a pass reads it here."""
        if self.chunks is not None and len(self.chunks) == placement.num_chunks:
            cost = self.chunks[chunk]
        else:
            cost = self.stages[placement.chunk_to_rank[chunk]].scaled(placement.share(chunk))
        return running_cost(cost, self.action_overhead, self.memory_model)

    @property
    def calibrated(self) -> bool:
        """Whether the profile adds anything the runtime measured: an action overhead or message times."""
        return self.action_overhead > 0 or self.comm_table is not None

    def message_time(self, nbytes: float) -> float | None:
        """A hop's time for a message of `nbytes`: from the measured comm_table, else over the
        link_bandwidth, else None (the profile's comm is used as given)."""
        if self.comm_table is not None:
            return comm_time(self.comm_table, nbytes)
        return None if self.link_bandwidth is None else nbytes / self.link_bandwidth

    def uncalibrated(self) -> "Profile":
        """The same costs without the action overhead and message table, under the paper's memory model."""
        return replace(self, action_overhead=0.0, comm_table=None, memory_model="paper")

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

    def static_bytes_per_rank(self, placement: Placement) -> tuple[float, ...] | None:
        """Static bytes (parameters, gradients, optimizer state) each rank holds under a placement: the sum
        over its chunks, so a placement with two model copies (DualPipe's) counts both. None when some
        chunk's static bytes are not given."""
        per = [0.0] * placement.num_ranks
        for c in range(placement.num_chunks):
            static = self.chunk_cost(placement, c).static_bytes
            if static is None:
                return None
            per[placement.chunk_to_rank[c]] += static
        return tuple(per)

    def stage_mem_B(self, rank: int) -> float:
        """One whole stage's activation memory per microbatch on this rank (the unit of `Np` limits), as
        profiled: a recompute choice lowers what a plan holds, never the limit it is held to."""
        return self.stages[rank].for_microbatch(False).mem_B

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
        if self.layers is not None:
            out["layers"] = [layer.to_dict() for layer in self.layers]
        if self.link_bandwidth is not None:
            out["link_bandwidth"] = self.link_bandwidth
        if self.action_overhead:
            out["action_overhead"] = self.action_overhead
        if self.comm_table is not None:
            out["comm_table"] = [{"bytes": b, "time": t} for b, t in self.comm_table]
        if self.memory_model != "paper":
            out["memory_model"] = self.memory_model
        if self.details:
            out["details"] = self.details
        return out

    def save(self, path: str | Path) -> None:
        write_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, data: Any, origin: str = "profile") -> "Profile":
        return _parse_profile(data, origin)


# -- reading -----------------------------------------------------------------------------------

def check_stages(p: Any) -> int:
    if not isinstance(p, int) or isinstance(p, bool) or not 1 <= p <= MAX_STAGES:
        raise ProfileError(f"number of stages p is {p!r}: it must be an integer from 1 to {MAX_STAGES}")
    return p


def check_microbatches(m: Any) -> int:
    if not isinstance(m, int) or isinstance(m, bool) or not 1 <= m <= MAX_MICROBATCHES:
        raise ProfileError(f"number of microbatches m is {m!r}: it must be an integer from 1 to {MAX_MICROBATCHES}")
    return m


def _optional(value: Any) -> float | None:
    return None if value is None else float(value)


def _stage(origin: str, field: str, raw: dict[str, Any]) -> StageCost:
    """A checked stage object with the relative-memory defaults filled in (mem_B 1, mem_W mem_B / 2)."""
    mem_B = float(raw.get("mem_B", 1.0))
    mem_W = float(raw.get("mem_W", mem_B / 2))
    check_memory_order(origin, field, mem_B, mem_W)
    cost = StageCost(float(raw["F"]), float(raw["B"]), float(raw["W"]), mem_B, mem_W,
                     _optional(raw.get("full_backward")), _optional(raw.get("static_bytes")),
                     _optional(raw.get("overlap_f_b")), _optional(raw.get("mem_B_torch")),
                     _optional(raw.get("mem_W_torch")), _optional(raw.get("mem_kept_torch")))
    check_overlap(origin, field, cost.F, cost.BW, cost.overlap_f_b)
    return cost


def _parse_profile(data: Any, origin: str) -> Profile:
    check_profile_data(data, origin)
    stages = tuple(_stage(origin, f"stages[{i}]", s) for i, s in enumerate(data["stages"]))
    p = len(stages)
    comm_raw = data.get("comm", 0.0)
    comm = tuple(float(c) for c in comm_raw) if isinstance(comm_raw, list) else (float(comm_raw),) * (p - 1)
    chunks = None
    if data.get("chunks") is not None:
        chunks = tuple(_stage(origin, f"chunks[{i}]", c) for i, c in enumerate(data["chunks"]))
    return Profile(
        name=data.get("name", origin), stages=stages, comm=comm, microbatches=data.get("microbatches", 1),
        source=dict(data["source"]), time_unit=data.get("time_unit", "us"),
        memory_unit=data.get("memory_unit", "relative"),
        device_capacity_bytes=_optional(data.get("device_capacity_bytes")), chunks=chunks,
        details=dict(data.get("details") or {}),
        layers=None if data.get("layers") is None else parse_layers(origin, data["layers"]),
        link_bandwidth=_optional(data.get("link_bandwidth")),
        action_overhead=float(data.get("action_overhead") or 0.0),
        comm_table=None if data.get("comm_table") is None else parse_comm_table(origin, data["comm_table"]),
        memory_model=check_memory_model(origin, data.get("memory_model", "paper")),
    )


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile JSON file; errors and reports name the file's path."""
    return replace(Profile.from_dict(read_json(path, what="profile"), origin=str(path)), path=str(path))


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
    with about("uniform"):  # the numbers of the shorthand are the only input that can be wrong here
        return Profile.from_dict(data, origin="uniform profile")

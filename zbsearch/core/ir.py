"""The schedule IR: pass kinds, actions, placements and schedules, all plain frozen data.

An action's string form is exactly torch.distributed.pipelining's (`0F1`, `1I0`, `2W3`, `3B0`,
`(0F3;3B1)OVERLAP_F_B`), so export and import are a join and a split. Mind the names: the Zero Bubble
paper's "B" (gradient with respect to the input) is torch's `I`; torch's `B` is the full backward.
Here `Kind.B` is the paper's B and prints as `I`; `Kind.FULL_B` is the fused backward and prints as `B`.

Chunks are global model-piece indices (torch's "stage" index). A placement says which rank holds each
chunk and the order of chunks a microbatch flows through (its route). Every placement has one route
except DualPipe's, which has two: the first half of the microbatches flow through one model copy from
rank 0 down, the second half through the other copy from rank p-1 up.
"""

from __future__ import annotations

import json
import operator
import re
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Iterator

from .errors import ScheduleError
from .fileio import write_atomic
from .fileio import read_json
from .plan_record import Choice, PlanRecord, plan_from_json


class Kind(str, Enum):
    """Pass kinds. The value is torch's action letter."""

    F = "F"  # forward
    B = "I"  # backward for inputs (the paper's B)
    W = "W"  # backward for weights
    FULL_B = "B"  # B and W fused
    OVERLAP = "OVERLAP_F_B"  # a forward and a backward of two microbatches run as one pair (DualPipe)

    @property
    def label(self) -> str:
        """The name used in reports and figures (paper's letters)."""
        return {"F": "F", "I": "B", "W": "W", "B": "BW", "OVERLAP_F_B": "F&B"}[self.value]


BACKWARD_KINDS = (Kind.B, Kind.FULL_B)
COMPUTE_KINDS = (Kind.F, Kind.B, Kind.W, Kind.FULL_B)

# ASCII only: a non-ASCII digit (e.g. U+0663) would parse but print back differently.
_SIMPLE_RE = re.compile(r"^\s*(\d+)\s*([FIWB])\s*(\d+)\s*$", re.ASCII)
_OVERLAP_RE = re.compile(r"^\s*\(([^;()]+);([^;()]+)\)\s*OVERLAP_F_B\s*$", re.ASCII)


@dataclass(frozen=True, order=True)
class Action:
    """One pass: `kind` of `chunk` on `microbatch`. An overlap pair has chunk = microbatch = -1 and
    its forward and backward in `pair`."""

    chunk: int
    kind: Kind
    microbatch: int
    pair: tuple["Action", ...] = field(default=(), compare=True)

    def __str__(self) -> str:
        if self.kind is Kind.OVERLAP:
            return f"({self.pair[0]};{self.pair[1]})OVERLAP_F_B"
        return f"{self.chunk}{self.kind.value}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        """Inverse of str(): parse a torch action string."""
        m = _OVERLAP_RE.match(text)
        if m:
            first, second = cls.parse(m.group(1)), cls.parse(m.group(2))
            return overlap(first, second)
        m = _SIMPLE_RE.match(text)
        if not m:
            raise ScheduleError(
                f"cannot parse action {text!r}: expected '<chunk><F|I|W|B><microbatch>' such as '0F1', "
                "or '(0F3;3B1)OVERLAP_F_B'"
            )
        return cls(int(m.group(1)), Kind(m.group(2)), int(m.group(3)))

    def passes(self) -> tuple["Action", ...]:
        """The compute passes this action performs (the pair's two, or itself)."""
        return self.pair if self.kind is Kind.OVERLAP else (self,)


def F(chunk: int, mb: int) -> Action:
    return Action(chunk, Kind.F, mb)


def B(chunk: int, mb: int) -> Action:
    return Action(chunk, Kind.B, mb)


def W(chunk: int, mb: int) -> Action:
    return Action(chunk, Kind.W, mb)


def BW(chunk: int, mb: int) -> Action:
    return Action(chunk, Kind.FULL_B, mb)


def overlap(forward: Action, backward: Action) -> Action:
    """A DualPipe F&B pair: one forward and one backward (input-only or full) run together."""
    if forward.kind is not Kind.F or backward.kind not in BACKWARD_KINDS:
        raise ScheduleError(
            f"an overlap pair is (forward; backward), got ({forward};{backward}): put the F first and "
            "make the second an I or B"
        )
    return Action(-1, Kind.OVERLAP, -1, (forward, backward))


@dataclass(frozen=True)
class Placement:
    """Which rank holds each chunk, and the chunk order (route) each microbatch flows through.

    `name` is one of linear, interleaved, v, dualpipe (free text is allowed for imported schedules).
    Microbatch i of m takes route i * len(routes) // m: with one route every microbatch takes it; with
    DualPipe's two, the first half of the microbatches take route 0 and the second half route 1.
    """

    name: str
    num_ranks: int
    chunk_to_rank: tuple[int, ...]
    routes: tuple[tuple[int, ...], ...]

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_to_rank)

    @property
    def chunks_per_rank(self) -> int:
        return self.num_chunks // self.num_ranks

    @property
    def param_copies(self) -> int:
        """Model replicas the placement keeps: one per route (DualPipe's placement has two, so every rank
        holds a stage of each and its parameters twice)."""
        return len(self.routes)

    def chunks_on(self, rank: int) -> tuple[int, ...]:
        return tuple(c for c, r in enumerate(self.chunk_to_rank) if r == rank)

    def route_index(self, microbatch: int, num_microbatches: int) -> int:
        return microbatch * len(self.routes) // num_microbatches

    def route(self, microbatch: int, num_microbatches: int) -> tuple[int, ...]:
        return self.routes[self.route_index(microbatch, num_microbatches)]

    def position(self, chunk: int) -> tuple[int, int]:
        """(route index, position in that route) of a chunk; a chunk belongs to exactly one route."""
        for ri, route in enumerate(self.routes):
            if chunk in route:
                return ri, route.index(chunk)
        raise ScheduleError(f"chunk {chunk} is on no route of placement {self.name!r}")

    def share(self, chunk: int) -> float:
        """Fraction of its rank's stage work this chunk does: the rank's stage is split evenly over
        the chunks it holds on the same route (two V-shape chunks do half each; DualPipe's two chunks
        belong to two model copies, so each does a whole stage)."""
        ri, _ = self.position(chunk)
        rank = self.chunk_to_rank[chunk]
        same = sum(1 for c in self.routes[ri] if self.chunk_to_rank[c] == rank)
        return 1.0 / same

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "num_ranks": self.num_ranks,
            "chunk_to_rank": list(self.chunk_to_rank),
            "routes": [list(r) for r in self.routes],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Placement":
        try:
            placement = cls(
                name=str(data["name"]),
                num_ranks=_integer(data["num_ranks"]),
                chunk_to_rank=tuple(_integer(r) for r in data["chunk_to_rank"]),
                routes=tuple(tuple(_integer(c) for c in route) for route in data["routes"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ScheduleError(
                f"schedule field 'placement' is malformed ({exc!r}): it needs name, num_ranks, "
                "chunk_to_rank and routes"
            ) from None
        placement.check()
        return placement

    def check(self) -> None:
        """Raise ScheduleError unless the placement is internally consistent."""
        if self.num_ranks < 1:
            raise ScheduleError(f"placement num_ranks is {self.num_ranks}: it must be >= 1")
        for c, r in enumerate(self.chunk_to_rank):
            if not 0 <= r < self.num_ranks:
                raise ScheduleError(
                    f"placement puts chunk {c} on rank {r}: ranks are 0..{self.num_ranks - 1}"
                )
        seen = [c for route in self.routes for c in route]
        if sorted(seen) != list(range(self.num_chunks)):
            raise ScheduleError(
                "placement routes must visit every chunk exactly once over all routes; "
                f"got {[list(r) for r in self.routes]} for {self.num_chunks} chunks"
            )
        if not self.routes or any(len(r) == 0 for r in self.routes):
            raise ScheduleError("placement needs at least one non-empty route")


def _integer(value: Any) -> int:
    """An integer from a file: refuse bools, floats and strings rather than silently truncating."""
    if isinstance(value, bool):
        raise TypeError(f"{value!r} is not an integer")
    return operator.index(value)


def linear(p: int) -> Placement:
    """One stage per rank: chunk s on rank s."""
    return Placement("linear", p, tuple(range(p)), (tuple(range(p)),))


def interleaved(p: int, v: int) -> Placement:
    """Looped placement with v chunks per rank: rank r holds r, r+p, r+2p, ..."""
    return Placement(
        "interleaved" if v > 1 else "linear", p, tuple(c % p for c in range(v * p)),
        (tuple(range(v * p)),),
    )


def vshape(p: int) -> Placement:
    """V-shape with 2 chunks per rank: rank r holds chunks r and 2p-1-r; the loss is on rank 0."""
    return Placement("v", p, tuple(c if c < p else 2 * p - 1 - c for c in range(2 * p)), (tuple(range(2 * p)),))


def dualpipe(p: int) -> Placement:
    """DualPipe: two model copies. Copy 0 (chunks 0..p-1) has stage s on rank s; copy 1 (chunks
    p..2p-1) has stage s on rank p-1-s, so microbatches of copy 1 enter at rank p-1."""
    return Placement(
        "dualpipe", p, tuple(range(p)) + tuple(p - 1 - s for s in range(p)),
        (tuple(range(p)), tuple(range(p, 2 * p))),
    )


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered actions plus their placement: what every step of zbsearch reads."""

    name: str
    placement: Placement
    num_microbatches: int
    ranks: tuple[tuple[Action, ...], ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # The split, recompute, memory accounting, sharding and limit the plan was made under (core/plan_record.py).
    plan: PlanRecord = field(default_factory=PlanRecord, compare=False, hash=False)

    @property
    def num_ranks(self) -> int:
        return self.placement.num_ranks

    def passes(self, rank: int) -> Iterator[Action]:
        for action in self.ranks[rank]:
            yield from action.passes()

    def count(self) -> int:
        return sum(len(r) for r in self.ranks)

    def with_choice(self, chosen: Choice | None) -> "Schedule":
        """The schedule recording which microbatches recompute on each chunk (an empty set: none does, and
        the chunk runs as profiled; exports read it so: PlanRecord.levels_for_every_microbatch)."""
        return replace(self, plan=self.plan.with_choice(chosen))

    def to_dict(self) -> dict[str, Any]:
        out = {
            "format": "zbsearch-schedule/1",
            "name": self.name,
            "num_microbatches": self.num_microbatches,
            "placement": self.placement.to_dict(),
            "actions": [[str(a) for a in rank] for rank in self.ranks],
            "meta": self.meta,
        }
        plan = self.plan.to_json()
        return {**out, "plan": plan} if plan else out

    @classmethod
    def from_dict(cls, data: Any) -> "Schedule":
        if not isinstance(data, dict):
            raise ScheduleError("a schedule file must hold a JSON object with 'placement' and 'actions'")
        for key in ("name", "num_microbatches", "placement", "actions"):
            if key not in data:
                raise ScheduleError(f"schedule field {key!r} is missing: write zbsearch's schedule JSON "
                                    "(zbsearch baseline ... -o FILE shows the format)")
        placement = Placement.from_dict(data["placement"])
        actions = data["actions"]
        if (not isinstance(actions, list) or len(actions) != placement.num_ranks
                or not all(isinstance(rank, list) for rank in actions)):
            raise ScheduleError(
                f"schedule field 'actions' must be a list of {placement.num_ranks} per-rank lists"
            )
        m = data["num_microbatches"]
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ScheduleError(f"schedule field 'num_microbatches' is {m!r}: it must be an integer >= 1")
        ranks = tuple(
            tuple(Action.parse(str(a)) for a in rank if a not in (None, ""))
            for rank in actions
        )
        meta = data.get("meta") or {}
        if not isinstance(meta, dict):
            raise ScheduleError(f"schedule field 'meta' is {meta!r}: it must be a JSON object (or left out)")
        name, meta = str(data["name"]), dict(meta)
        legacy = "plan" not in data and "partition" in meta  # a file from before the plan record (its docstring)
        raw = meta.pop("partition") if legacy else data.get("plan")
        plan = PlanRecord() if raw is None else plan_from_json(raw, name, placement.num_chunks, m, legacy)
        return cls(name, placement, m, ranks, meta, plan)

    def save(self, path: str | Path) -> None:

        write_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Schedule":

        return cls.from_dict(read_json(path, what="schedule"))


def build(name: str, placement: Placement, m: int, ranks: Iterable[Iterable[Action]], *, plan: PlanRecord | None = None,
          **meta: Any) -> Schedule:
    """Freeze per-rank lists into a Schedule."""
    return Schedule(name, placement, m, tuple(tuple(r) for r in ranks), dict(meta), plan or PlanRecord())

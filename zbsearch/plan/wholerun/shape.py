"""The shape of a run: tensor, pipeline and data-parallel degrees, sharding, microbatch size and count,
expert-parallel degree; the space of shapes a search ranges over and its enumeration, each shape left out
with its reason."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from ...core.errors import PlanError
from ...profiling.request import MoeShape
from ...profiling.tensor_parallel import tp_degrees
from .cluster import Cluster
from .workload import Model, Workload

# How the data-parallel ranks share a pipeline rank's static bytes and sync its gradients (docs/whole-run.md).
SHARDINGS = ("ddp", "zero1", "zero2", "fsdp", "fsdp-reshard")


@dataclass(frozen=True, order=True)
class RunShape:
    """t x p x d GPUs; m microbatches of b sequences per pipeline per step (global batch = m b d); `ep`: the
    expert-parallel degree, drawn from the d data-parallel ranks (1 for a dense model)."""

    t: int
    p: int
    d: int
    b: int
    m: int
    sharding: str
    ep: int = 1

    @property
    def gpus(self) -> int:
        return self.t * self.p * self.d

    def label(self) -> str:
        """tp8 pp4 dp8 fsdp b1 m16 (ep when above 1)."""
        ep = f" ep{self.ep}" if self.ep > 1 else ""
        return f"tp{self.t} pp{self.p} dp{self.d} {self.sharding} b{self.b} m{self.m}{ep}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunShape":
        return cls(**{k: data[k] for k in ("t", "p", "d", "b", "m", "sharding", "ep")})


# Microbatch sizes tried unless the space names its own: powers of two, as trainers' local batch sizes are.
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)
# The choices of a space, in the order they are enumerated (outermost first) and diagnosed.
CHOICES = ("tp", "pp", "micro_batch", "sharding", "ep")
_WHAT = {"tp": "tensor-parallel degree", "pp": "pipeline degree", "micro_batch": "micro batch",
         "sharding": "sharding", "ep": "expert-parallel degree"}


@dataclass(frozen=True)
class Space:
    """The values each choice may take; a fixed choice is a one-value tuple, None every value that makes sense:
    tp the degrees that split the model's heads inside a node, pp 1 up to the model's blocks, micro_batch
    DEFAULT_MICRO_BATCHES, sharding every one of SHARDINGS, ep (MoE) the degrees dividing d and the experts."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    sharding: tuple[str, ...] | None = None
    ep: tuple[int, ...] | None = None

    def given(self) -> list[str]:
        """The choices the space restricts, in CHOICES order."""
        return [name for name in CHOICES if getattr(self, name) is not None]

    def check(self) -> "Space":
        for name in CHOICES:
            values = getattr(self, name)
            if values is None:
                continue
            if not isinstance(values, tuple) or not values:
                raise PlanError(f"{_WHAT[name]} choices {values!r} are not a list of values: give at least one, or "
                                "none to search every value", subject=name)
            for value in values:
                _check_value(name, value)
        return self

    def to_dict(self) -> dict[str, list[int] | list[str] | None]:
        return {name: None if getattr(self, name) is None else list(getattr(self, name)) for name in CHOICES}


def _check_value(name: str, value: object) -> None:
    if name == "sharding":
        if value not in SHARDINGS:
            raise PlanError(f"sharding {value!r} is not known: use one of {', '.join(SHARDINGS)}", subject=name)
    elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{_WHAT[name]} {value!r} is not a count: give a whole number >= 1", subject=name)


@dataclass(frozen=True)
class Refused:
    """A shape, or a family of shapes (`what`: the labels of the choices made so far), left out, and why."""

    what: str
    reason: str

    def line(self) -> str:
        return f"{self.what}: {self.reason}"

    def to_dict(self) -> dict[str, str]:
        return {"what": self.what, "reason": self.reason}


@dataclass(frozen=True)
class Enumerated:
    """The shapes of a space in enumeration order (t, p, b, sharding, ep ascending; sharding in SHARDINGS
    order), and the ones left out with their reasons."""

    shapes: tuple[RunShape, ...]
    refused: tuple[Refused, ...]


def enumerate_shapes(workload: Workload, cluster: Cluster, space: Space) -> Enumerated:
    """Every shape of `space` that divides the cluster's GPUs and the global batch.

    t x p x d = N with t splitting the heads inside a node, p at most the model's blocks, m = B / (d b)
    whole, ep dividing d and the routed experts (1 for a dense model); with d = 1 only ddp (sharding over
    one rank is nothing).

    Raises
    ------
    PlanError
        Where no shape is left: about the fixed choice that leaves none (naming the values that would
        work), else about the global batch (naming the batch sizes that would).
    """
    space.check()
    found = _walk(workload, cluster, space)
    if not found.shapes:
        raise _nothing_left(workload, cluster, space, found.refused)
    return found


class _Walk:
    """One enumeration: the shapes kept and the refusals, each refusal once."""

    def __init__(self, workload: Workload, cluster: Cluster, space: Space) -> None:
        self.model, self.batch, self.space = workload.model, workload.global_batch, space
        self.gpus, self.node = cluster.gpus, cluster.gpus_per_node
        self.shapes: list[RunShape] = []
        self.refused: dict[str, Refused] = {}

    def refuse(self, what: str, reason: str) -> None:
        self.refused.setdefault(what, Refused(what, reason))

    def run(self) -> Enumerated:
        for t in self.space.tp or _divisors(math.gcd(self.gpus, self.node)):
            if self._tp_fits(t):
                for p in self.space.pp or _divisors(self.gpus // t):
                    if self._pp_fits(t, p):
                        self._add_pipelines(t, p, self.gpus // (t * p))
        return Enumerated(tuple(self.shapes), tuple(self.refused.values()))

    def _tp_fits(self, t: int) -> bool:
        reason = _tp_refusal(self.model, t, self.gpus, self.node)
        if reason:
            self.refuse(f"tp{t}", reason)
        return not reason

    def _pp_fits(self, t: int, p: int) -> bool:
        left = self.gpus // t
        if left % p:
            self.refuse(f"tp{t} pp{p}", f"does not divide the {left} GPUs tp{t} leaves")
        elif p > self.model.layers:
            self.refuse(f"tp{t} pp{p}", f"more stages than the model's {self.model.layers} blocks")
        return not left % p and p <= self.model.layers

    def _add_pipelines(self, t: int, p: int, d: int) -> None:
        shardings = self.space.sharding or SHARDINGS
        if d == 1 and any(s != "ddp" for s in shardings):
            self.refuse(f"tp{t} pp{p} dp1", f"{', '.join(s for s in shardings if s != 'ddp')}: sharding over one "
                        "data-parallel rank is none (ddp)")
            shardings = tuple(s for s in shardings if s == "ddp")
        eps = self._ep_values(t, p, d)
        for b in self.space.micro_batch or DEFAULT_MICRO_BATCHES:
            if self.batch % (d * b):
                self.refuse(f"tp{t} pp{p} dp{d} b{b}", f"m = {self.batch}/({d}*{b}) = {self.batch / (d * b):g} is "
                            "not whole")
                continue
            self.shapes += [RunShape(t, p, d, b, self.batch // (d * b), s, ep) for s in shardings for ep in eps]

    def _ep_values(self, t: int, p: int, d: int) -> list[int]:
        experts = self.model.experts if isinstance(self.model, MoeShape) else 1
        kept = []
        for ep in self.space.ep or _divisors(math.gcd(d, experts)):
            if ep > 1 and not isinstance(self.model, MoeShape):
                self.refuse(f"ep{ep}", "the model has no experts (dense): only ep1")
            elif d % ep:
                self.refuse(f"tp{t} pp{p} dp{d} ep{ep}", f"does not divide dp {d}")
            elif experts % ep:
                self.refuse(f"ep{ep}", f"does not divide the {experts} routed experts")
            else:
                kept.append(ep)
        return kept


def _walk(workload: Workload, cluster: Cluster, space: Space) -> Enumerated:
    return _Walk(workload, cluster, space).run()


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _tp_refusal(model: Model, t: int, gpus: int, node: int) -> str:
    """Why t tensor-parallel ranks do not fit, or '' where they do."""
    if t > node:
        return f"more than the {node} GPUs of a node: tensor parallelism stays inside a node"
    if gpus % t:
        return f"does not divide {gpus} GPUs"
    if min(gpus, node) % t:
        return f"does not divide a node's {node} GPUs, so its groups would straddle nodes"
    if t in tp_degrees(model, t):
        return ""
    parts = [(model.heads, "heads"), (model.kv, "key/value heads"), (model.ffn_size, "FFN")]
    if isinstance(model, MoeShape):
        parts.append((model.expert_size, "expert FFN"))
    return "does not split " + ", ".join(f"{what} {n}" if what.endswith("FFN") else f"{n} {what}"
                                         for n, what in parts if n % t)


def _nothing_left(workload: Workload, cluster: Cluster, space: Space, refused: tuple[Refused, ...]) -> PlanError:
    """The one-line error for a space with no shape: the fixed choice that empties it (with the values that
    would work), else the global batch (with the batch sizes that would)."""
    why = f" ({refused[0].line()})" if refused else ""
    for name in space.given():
        relaxed = _walk(workload, cluster, replace(space, **{name: None})).shapes
        if relaxed:
            works = ", ".join(str(v) for v in dict.fromkeys(_value_of(s, name) for s in relaxed))
            given = ", ".join(str(v) for v in getattr(space, name))
            return PlanError(f"{_WHAT[name]} {given} leaves no shape of {cluster.gpus} GPUs for this model and "
                             f"batch{why}: use one of {works}", subject=name)
    names = space.given()
    if names and _walk(workload, cluster, Space()).shapes:
        fixed = "; ".join(f"{_WHAT[n]} {', '.join(str(v) for v in getattr(space, n))}" for n in names)
        return PlanError(f"no shape of {cluster.gpus} GPUs has {fixed}{why}: fix fewer of these choices, or "
                         "others that fit together", subject=names[0])
    return _batch_error(workload, cluster, space)


def _value_of(shape: RunShape, name: str) -> int | str:
    value: int | str = getattr(shape, {"tp": "t", "pp": "p", "micro_batch": "b"}.get(name, name))
    return value


def _batch_error(workload: Workload, cluster: Cluster, space: Space) -> PlanError:
    """No d x b divides the global batch: name the products and the nearest batches some product divides."""
    batch = workload.global_batch
    # A batch every d x b divides (d divides the GPUs), to list the products.
    unbounded = replace(workload, global_batch=cluster.gpus * math.lcm(*DEFAULT_MICRO_BATCHES,
                                                                       *(space.micro_batch or ())))
    per_step = sorted({s.d * s.b for s in _walk(unbounded, cluster, space).shapes}
                      or {s.d * s.b for s in _walk(unbounded, cluster, Space()).shapes})
    near = sorted({q * k for q in per_step for k in (batch // q, batch // q + 1) if k >= 1},
                  key=lambda n: (abs(n - batch), n))[:2]
    return PlanError(f"global batch {batch} is not divisible by data-parallel degree x micro batch of any shape on "
                     f"{cluster.gpus} GPUs (d x b in {', '.join(map(str, per_step[:12]))}"
                     f"{', ...' if len(per_step) > 12 else ''}): use a batch one of them divides, e.g. "
                     f"{' or '.join(map(str, sorted(near)))}", subject="global_batch")

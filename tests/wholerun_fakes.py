"""Deterministic stand-ins for whole-run planning's jobs: the per-shape entry points (bound_shape,
evaluate_shape) for the branch and bound's tests, each bound provably at most its shape's step
(FakeBound.bound <= FakeResult.bound <= FakeResult.step, by construction below), and plain jobs for the
runners' tests. Top-level, so the process pool and Ray can pickle them."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from zbsearch.core.errors import PlanError
from zbsearch.plan.wholerun.cluster import Cluster, make_cluster
from zbsearch.plan.wholerun.search import ShapeJobs
from zbsearch.plan.wholerun.shape import RunShape
from zbsearch.plan.wholerun.workload import Workload
from zbsearch.profiling.request import LlamaShape
from zbsearch.search.options import SearchOptions

SHARDING_COST = {"ddp": 40.0, "zero1": 30.0, "zero2": 45.0, "fsdp": 30.0, "fsdp-reshard": 90.0}  # zero1 = fsdp: a tie


@dataclass(frozen=True)
class FakeBound:
    shape: RunShape
    bound: float
    refused: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.shape.to_dict(), "bound": self.bound, "refused": self.refused}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FakeBound":
        return cls(RunShape.from_dict(data["shape"]), data["bound"], data["refused"])


@dataclass(frozen=True)
class FakeResult:
    shape: RunShape
    status: str
    step: float
    bound: float
    limit: float  # the time limit the search gave this shape

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "shape": self.shape.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FakeResult":
        return cls(**{**data, "shape": RunShape.from_dict(data["shape"])})


def fake_step(shape: RunShape) -> float:
    """A step time with a pipeline bubble, tensor-parallel and sharding overheads, and ties."""
    work = 64000.0 / shape.gpus * (1 + 0.25 * (shape.t - 1)) * shape.m * shape.b * shape.d / 32
    bubble = work * (shape.p - 1) / max(shape.m, 1) / shape.p
    sync = SHARDING_COST[shape.sharding] * (shape.d > 1)
    return round(work + bubble + sync + 5.0 * shape.b, 3)


def fake_cheap_bound(shape: RunShape) -> float:
    """At most the step; equal to it on some shapes (ties between bounds and steps are tested too)."""
    return round(fake_step(shape) * (0.6, 0.8, 1.0)[(shape.t + shape.p + shape.b) % 3], 3)


def fake_bound(workload: Workload, cluster: Cluster, shape: RunShape, options: SearchOptions) -> FakeBound:
    if shape.t == 1 and shape.b == 8:
        return FakeBound(shape, 0.0, "activations of b8 do not fit 80 GB")
    if shape.t == 4 and shape.p == 4 and shape.b == 2:
        raise PlanError("fake bound: no split of 8 blocks over 4 stages fits", subject="pp")
    return FakeBound(shape, fake_cheap_bound(shape))


def fake_evaluate(workload: Workload, cluster: Cluster, shape: RunShape, options: SearchOptions) -> FakeResult:
    if shape.t == 1 and shape.p == 4 and shape.b == 1 and shape.sharding == "ddp":
        raise PlanError("fake solve: no schedule fits the memory limit", subject="mem_limit")
    step = fake_step(shape)
    return FakeResult(shape, "optimal" if step == fake_cheap_bound(shape) else "feasible", step,
                      round((fake_cheap_bound(shape) + step) / 2, 3), options.time_limit)


def fake_crash(workload: Workload, cluster: Cluster, shape: RunShape, options: SearchOptions) -> FakeBound:
    raise ValueError("a bug in the entry point")


FAKE_JOBS = ShapeJobs(fake_bound, fake_evaluate, FakeBound.from_dict, FakeResult.from_dict)
TINY = LlamaShape(layers=8, hidden=64, heads=8)  # the tiny llama of the tests: 8 heads, 8 blocks


def tiny_setup(batch: int = 32, gpus: int = 16) -> tuple[Workload, Cluster]:
    """16 GPUs, 8 to a node, the tiny llama at a global batch of 32."""
    return Workload(TINY, batch), make_cluster("h100", gpus)


def square(x: int) -> int:
    return x * x


def square_even(x: int) -> int:
    if x % 2:
        raise PlanError(f"odd number {x}:\n give an even one", subject="x")
    return x * x


def crash(x: int) -> int:
    raise ValueError(f"a bug at {x}")


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def die(code: int) -> int:
    os._exit(code)  # a worker killed in the middle of a job


def tiny_cpsat(n: int) -> int:
    """The largest x <= n, found by CP-SAT on two threads: a job that runs OR-Tools' threads in a worker."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    x = model.NewIntVar(0, n, "x")
    model.Maximize(x)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 2
    solver.Solve(model)
    return int(solver.Value(x))

"""Shared by the tests: random pipelines (stage times and memory drawn from one distribution), and
CP-SAT proving optima without the bounds it would otherwise be told."""

from __future__ import annotations

import random

from zbsearch.core.profile import Profile


def random_stages(rng: random.Random, p: int, m: int) -> Profile:
    """p stages with F and B in 1-3, W in 0.2-2, mem_B in 0.5-1.5, mem_W in 0.1-0.4 and one comm time in
    0-0.5, m microbatches; drawn from `rng` in that order, so a seed always gives the same pipeline."""
    stages = [{"F": rng.uniform(1, 3), "B": rng.uniform(1, 3), "W": rng.uniform(0.2, 2), "mem_B": rng.uniform(0.5, 1.5),
               "mem_W": rng.uniform(0.1, 0.4)} for _ in range(p)]
    return Profile.from_dict({"stages": stages, "comm": rng.uniform(0, 0.5), "microbatches": m,
                              "source": {"kind": "estimated", "method": "random test"}})


def uneven_stages(seed: int, p: int, m: int) -> Profile:
    """Stages that differ in every figure (as random_stages), with a link time of its own per boundary."""
    rng = random.Random(seed)
    stages = [{"F": rng.uniform(1, 3), "B": rng.uniform(1, 3), "W": rng.uniform(0.2, 2),
               "mem_B": rng.uniform(0.5, 1.5), "mem_W": rng.uniform(0.1, 0.4)} for _ in range(p)]
    return Profile.from_dict({"stages": stages, "comm": [rng.uniform(0, 0.5) for _ in range(p - 1)],
                              "microbatches": m, "source": {"kind": "estimated", "method": "random test"}})


def integer_stages(seed: int, p: int, m: int) -> Profile:
    """Stages scaled by one random factor each, with whole-number times and link times."""
    rng = random.Random(seed)
    stages = []
    for _ in range(p):
        k = rng.uniform(0.7, 1.5)
        mem = round(k * rng.uniform(0.8, 1.2), 3)
        stages.append({"F": round(100 * k), "B": round(100 * k * rng.uniform(0.9, 1.3)),
                       "W": round(100 * k * rng.uniform(0.5, 1.0)), "mem_B": mem, "mem_W": round(mem * 0.4, 3)})
    return Profile.from_dict({"name": f"random-{seed}", "num_stages": p, "microbatches": m, "time_unit": "unit",
                              "stages": stages, "comm": [rng.randint(0, 10) for _ in range(p - 1)],
                              "source": {"kind": "estimated", "method": "random (tests)"}})


def tell_cpsat_no_bounds(monkeypatch) -> None:
    """CP-SAT and solve() then know only each rank's head (the longest path to its first pass): their
    optimum is proven without the analytic bounds, so it can check them."""
    import zbsearch.search.exact.cpsat as cpsat_module
    import zbsearch.search.solve.driver as solve_module
    from zbsearch.search.bounds.analytic import RankBound, rank_bounds

    def nothing(problem, passes, chains=True, nesting=True, deadline=None, budget=None):
        return [RankBound(b.rank, b.head, 0.0, 0.0, 0.0, False) for b in rank_bounds(problem, passes, chains=False)]

    monkeypatch.setattr(cpsat_module, "rank_bounds", nothing)
    monkeypatch.setattr(solve_module, "rank_bounds", nothing)

"""The seeded instance families of bench/solve_bench.py: random heterogeneous pipelines (hetero-random)
and the V-shape at 1p on the Zero Bubble paper's large models (v-large)."""

from __future__ import annotations

import random
from pathlib import Path

from zbsearch.core.profile import Profile, load_profile

ROOT = Path(__file__).resolve().parent.parent
HETERO_SEED = 14
HETERO_LIMITS = ("0.75p", "1p", "1.5p", "2p")


def random_hetero_profile(rng: random.Random, p: int, m: int, name: str) -> Profile:
    """Per-stage times 0.7x-1.5x of F = 100 (B 0.9-1.3x and W 0.5-1.0x of the stage's F), comm 0-10%
    of F, M_B scaling with the stage (0.8-1.2 x its time factor), M_W 30-50% of M_B; integer times."""
    stages = []
    for _ in range(p):
        k = rng.uniform(0.7, 1.5)
        F = round(100 * k)
        mem_B = round(k * rng.uniform(0.8, 1.2), 3)
        stages.append({"F": F, "B": round(F * rng.uniform(0.9, 1.3)), "W": round(F * rng.uniform(0.5, 1.0)),
                       "mem_B": mem_B, "mem_W": round(mem_B * rng.uniform(0.3, 0.5), 3)})
    comm = [round(rng.uniform(0.0, 10.0)) for _ in range(p - 1)]
    return Profile.from_dict({
        "name": name, "num_stages": p, "microbatches": m, "time_unit": "unit", "stages": stages, "comm": comm,
        "source": {"kind": "estimated", "method": f"random heterogeneous stages (bench/bench_instances.py, "
                                                  f"seed {HETERO_SEED})"},
    })


def hetero_random(count: int = 24, seed: int = HETERO_SEED) -> list[tuple[Profile, str]]:
    """`count` (profile, limit) pairs: half at p=4, half at p=8, m drawn from 2p..4p, the limits
    0.75p, 1p, 1.5p and 2p in turn. The same seed gives the same instances."""
    rng = random.Random(seed)
    out = []
    for n in range(count):
        p = 4 if n < count // 2 else 8
        m = rng.randint(2 * p, 4 * p)
        limit = HETERO_LIMITS[n % len(HETERO_LIMITS)]
        out.append((random_hetero_profile(rng, p, m, f"hetero-random #{n} p={p}"), limit))
    return out


# (model, p, m): the paper's stage times (its first profiled m) at p = 16 and 32, m from 3p to 8p.
V_LARGE = (("14.6b", 16, 48), ("14.6b", 16, 128), ("28.3b", 32, 96), ("28.3b", 32, 256),
           ("6.2b", 16, 48), ("6.2b", 32, 96))
V_LARGE_FILES = {"6.2b": "zb-paper-6.2b-m24.json", "14.6b": "zb-paper-14.6b-m48.json",
                 "28.3b": "zb-paper-28.3b-m96.json"}


def v_large() -> list[Profile]:
    """The paper's profiled stage (uniform stages, its times, comm and memory ratio) at each (p, m)."""
    from dataclasses import replace

    out = []
    for model, p, m in V_LARGE:
        base = load_profile(ROOT / "profiles" / V_LARGE_FILES[model])
        stage, comm = base.stages[0], base.comm[0] if base.comm else 0.0
        out.append(replace(base, name=f"zb-paper-{model} p={p}", stages=(stage,) * p, comm=(comm,) * (p - 1),
                           microbatches=m))
    return out


def scale_64() -> Profile:
    """The largest scale instance (issue 14): the paper's 28.3B stage at p=64, m=512."""
    from dataclasses import replace

    base = load_profile(ROOT / "profiles" / V_LARGE_FILES["28.3b"])
    comm = base.comm[0] if base.comm else 0.0
    return replace(base, name="zb-paper-28.3b p=64", stages=(base.stages[0],) * 64, comm=(comm,) * 63,
                   microbatches=512)

"""A shape without pipelining (p = 1): no schedule to search. Each microbatch runs its forward and then its
fused backward (torch runs a lone stage's whole backward at once), one microbatch at a time, so the
makespan is m x (F + fused backward) of the whole model and the rank holds its static bytes plus one
microbatch's activations (what the layers keep from F until their backward, as the profile's memory
model counts them). Where that does not fit and the request searches recompute, whole layers are
recomputed (their `full` option), most bytes saved per microsecond first, until it fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...core.errors import InfeasibleError
from ...core.ir import linear
from ...core.memory import min_feasible_limit
from ...core.partition import partition_profile
from ...core.profile import Profile
from ...core.recompute.levels import held_from_f, option_of, with_recompute
from ...search.entry.request import SEARCHED_RECOMPUTE, planned_profile
from .cost import ShapeCosts
from .step import StepTime, combined, rank_step

GIB = 2**30


@dataclass(frozen=True)
class SingleRank:
    """The one-rank plan: recompute `levels`, the makespan and the end of the first backward (microseconds),
    and the bytes held: static and at most one microbatch's activations."""

    makespan_us: float
    first_gradient_us: float
    static_bytes: float
    activation_bytes: float
    levels: dict[str, str] = field(default_factory=dict)

    @property
    def peak_bytes(self) -> float:
        return self.static_bytes + self.activation_bytes


def _run(profile: Profile, m: int, levels: dict[str, str]) -> SingleRank:
    whole = partition_profile(with_recompute(profile, levels), linear(1), [len(profile.layers or ())])
    cost = whole.chunk_cost(linear(1), 0)
    return SingleRank(m * (cost.F + cost.BW), cost.F + cost.BW, whole.stages[0].static_bytes or 0.0,
                      min_feasible_limit(whole, linear(1))[0], levels)


def _savings(profile: Profile) -> list[str]:
    """Layers with a full recompute option, most bytes saved from F until I per microsecond first."""
    def rate(name: str) -> float:
        layer = by_name[name]
        option = option_of(layer, "full")
        assert option is not None
        return (held_from_f(layer) - option.mem_B) / max(option.time, 1e-9)

    by_name = {layer.name: layer for layer in profile.layers or ()}
    names = [name for name, layer in by_name.items() if option_of(layer, "full") is not None]
    return sorted(names, key=rate, reverse=True)


def best_single(costs: ShapeCosts) -> SingleRank:
    """The plan of a p = 1 shape (see the module): without recompute where it fits or recompute is not
    searched, else with the fewest layers recomputed that fit (all of them where none do)."""
    profile = planned_profile(costs.profile, costs.request)
    m, usable = costs.shape.m, costs.usable_bytes
    plan = _run(profile, m, {})
    if (costs.request.recompute or "").strip() not in SEARCHED_RECOMPUTE:  # the levels asked, applied already
        given = {layer.name: str(layer.details["recomputed"]["level"]) for layer in profile.layers or ()
                 if "recomputed" in layer.details}
        return replace(plan, levels=given)
    if plan.peak_bytes <= usable:
        return plan
    levels: dict[str, str] = {}
    for name in _savings(profile):
        levels[name] = "full"
        plan = _run(profile, m, dict(levels))
        if plan.peak_bytes <= usable:
            break
    return plan


def single_rank(costs: ShapeCosts) -> SingleRank:
    """best_single, where it fits the GPU's usable memory.

    Raises
    ------
    InfeasibleError
        Not even with every layer recomputed do static bytes and one microbatch fit; the message names the
        least memory.
    """
    plan, usable = best_single(costs), costs.usable_bytes
    if plan.peak_bytes <= usable:
        return plan
    what = " with every layer recomputed" if plan.levels else ""
    raise InfeasibleError(
        f"shape {costs.shape.label()} does not fit{what}: one GPU holding the whole pipeline needs at least "
        f"{plan.peak_bytes / GIB:.3g} GiB (static bytes {plan.static_bytes / GIB:.3g} GiB and one microbatch's "
        f"activations {plan.activation_bytes / GIB:.3g} GiB), but the GPU has {usable / GIB:.3g} GiB usable",
        subject="shape")


def single_step(costs: ShapeCosts, plan: SingleRank) -> StepTime:
    """The step of a one-rank plan: its makespan and the data-parallel terms of the whole model, which starts
    at once (its whole start gather is exposed) and ends at the makespan (its whole final sync is)."""
    names = [layer.name for layer in costs.profile.layers or ()]
    rank = rank_step(0, 0.0, plan.first_gradient_us, plan.makespan_us, plan.makespan_us, costs.traffic(names))
    return combined(plan.makespan_us, [rank])

"""A profile as a plan is made on it, and as a plan file says it was: the memory accounting, the
data-parallel sharding and the recompute levels applied to the profile the user gave, then (for a plan
on a split of the layers) its split.

`solve` plans on `as_planned(profile, ...)`; `show`, `validate`, `plot`, the exports and `run` cost a plan
file on `for_plan(profile, schedule)`, so that both see the same stages, static bytes and memory.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from .errors import ProfileError, about
from .ir import Schedule
from .partition import counts_of, partition_profile
from .profile import Profile
from .recompute.levels import with_recompute
from .sharding import Sharding
from .static_bytes import shard_profile


def as_planned(profile: Profile, memory_model: str | None = None, sharding: Sharding | None = None,
               levels: Mapping[str, str] | None = None, restage: bool = True) -> Profile:
    """`profile` under another memory accounting (None: its own), its static bytes sharded (None or a
    degree of 1: as profiled) and its layers run at `levels` (with `restage`, its own stages summed again
    from them)."""
    if memory_model is not None:
        profile = replace(profile, memory_model=memory_model)
    if sharding is not None and profile.sharding != sharding:
        profile = shard_profile(profile, sharding)
    return with_recompute(profile, levels or {}, restage=restage)


# Every error is about the profile given for the plan, the split's count checks included: the plan
# itself was checked when it was made (and when its file loaded).
@about("profile", overriding=True)
def for_plan(profile: Profile, schedule: Schedule) -> Profile:
    """The profile `schedule` was planned on, from the one it was planned from: its record's memory
    accounting, sharding and levels applied, and on a split of the layers that split. A profile without
    layers takes only the accounting: its stages are what the plan is costed on.

    Raises
    ------
    ProfileError
        The profile is sharded otherwise than the plan, or lacks what the plan applies (layers, the
        dtype and optimizer sharding reads, the layers the plan names).
    PartitionError
        The plan's split does not name the profile's layers in order.
    """
    plan = schedule.plan
    own = profile.sharding
    if plan.sharding is not None and own is not None and own != plan.sharding:
        raise ProfileError(f"profile {profile.label} is sharded over {own.degree} ({own.how}) but schedule "
                           f"{schedule.name!r} was planned sharded over {plan.sharding.degree} ({plan.sharding.how}): "
                           "give the unsharded profile")
    if profile.layers is None:  # stage-level costs (--uniform, a paper profile): nothing to shard or recompute
        return as_planned(profile, plan.memory_model)
    split = plan.split
    planned = as_planned(profile, plan.memory_model, plan.sharding, plan.levels, restage=split is None)
    if split is None or planned.layers is None:
        return planned
    counts = counts_of(split.chunks, planned.layers, schedule.placement)
    return partition_profile(planned, schedule.placement, counts)

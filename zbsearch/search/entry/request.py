"""What a user asks a plan for (`PlanRequest`), and the profile as the request's memory levers leave it.

Kept apart from find_plan.py, which loads the search (OR-Tools), so that the command line applies the
same levers without it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.errors import ZbsearchError, about
from ...core.memory import DEFAULT_HEADROOM
from ...core.placement import AUTO_PLACEMENTS, PARAM_COPY_PLACEMENTS
from ...core.planned_profile import as_planned
from ...core.profile import Profile
from ...core.recompute.levels import parse_recompute
from ...core.sharding import Sharding, check_devices

SEARCHED_RECOMPUTE = ("auto", "auto-layers")  # the search chooses the levels (search/recompute/search.py)


@dataclass(frozen=True)
class PlanRequest:
    """What to plan, as a user asks for it. None leaves a choice to the profile or to `find_plan`.

    `partition`: None (the split `balanced` where the profile lists its layers, else its own stages),
    `auto`, `even`, `balanced` or `fixed:N1,N2,...`. `stages`: the pipeline's ranks for a split of the
    layers (default: the profile's stages). `recompute`: none, auto, auto-layers, full, selective or
    fixed:NAME[=LEVEL],... `dp_shard` and `sharding`: the data-parallel group sharing each rank's static
    bytes. `devices`: the job's GPUs, checked against stages x dp_shard."""

    mem_limit: str | None  # required by find_plan: `none` for no limit
    objective: str = "makespan"
    placement: str | None = None  # None: linear on the profile's stages, auto on a split of its layers
    allow_param_copies: bool = False
    partition: str | None = None
    stages: int | None = None
    headroom: float = DEFAULT_HEADROOM
    memory_model: str | None = None
    recompute: str | None = None
    dp_shard: int | None = None
    sharding: str = "fsdp"
    devices: int | None = None

    @property
    def auto_placements(self) -> tuple[str, ...]:
        return AUTO_PLACEMENTS + (PARAM_COPY_PLACEMENTS if self.allow_param_copies else ())

    def partition_rule(self, profile: Profile) -> str | None:
        """The split rule the request implies: its own, or `balanced` where the profile lists layers."""
        return "balanced" if self.partition is None and profile.layers is not None else self.partition


def planned_profile(profile: Profile, request: PlanRequest) -> Profile:
    """`profile` under the request's memory accounting, sharding and fixed recompute levels (a searched
    recompute is applied by the search), checked against its devices."""
    stages = request.stages or profile.num_stages
    if request.devices is not None:
        check_devices(request.devices, stages, request.dp_shard or 1)
    if request.dp_shard is None and request.sharding != "fsdp":
        raise ZbsearchError(f"sharding {request.sharding} goes with a data-parallel shard degree (dp_shard): give it "
                            "too", subject="sharding")
    sharding = None if request.dp_shard is None else Sharding(request.dp_shard, request.sharding.strip().lower()).check()
    return as_planned(profile, request.memory_model, sharding, fixed_levels(profile, request.recompute))


def fixed_levels(profile: Profile, recompute: str | None) -> dict[str, str]:
    """The recompute levels `recompute` fixes on the profile's layers (none where it is searched or none)."""
    text = (recompute or "none").strip()
    if text == "none" or (text in SEARCHED_RECOMPUTE and profile.layers is not None):
        return {}
    if profile.layers is None:
        raise ZbsearchError(f"recompute chooses among the recompute options of a profile's layers, and profile "
                            f"{profile.label} lists no layers: profile the model with zbsearch profile",
                            subject="recompute")
    with about("recompute"):
        return parse_recompute(text, profile.layers)

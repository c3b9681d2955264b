"""The split of a model's layers over a schedule's stages: what a trainer needs besides the order.

A split lists, per global chunk index (torch's stage index, Megatron-LM's virtual-stage index on
linear and interleaved placements), the layer names of that chunk, the module paths they cover and
the kind of each layer. A schedule solved on a layer-level profile carries it in its plan record
(`schedule.plan.split`, core/plan_record.py; a schedule file's `plan.split`):

    {"chunks":  [["tok_embeddings", "layers.0"], ["layers.1", "norm+output"]],   # layer names
     "modules": [["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]], # module paths
     "kinds":   [["embedding", "decoder"], ["decoder", "output"]]}               # one per layer

`split_of(schedule, profile)` reads it, or falls back on the split a profile was measured with
(`details.partition.layers_per_stage`, one stage per rank).
"""

from __future__ import annotations

import re
from ...core.errors import PartitionError
from ...core.ir import Schedule
from ...core.partition import counts_of, split_from_layers
from ...core.plan_record import Split
from ...core.profile import Profile

NO_SPLIT_FIX = ("solve it on a profile with per-layer costs (layers), so that the schedule carries its split, "
                "or give the profile whose stages the schedule was made for")


# zbsearch's built-in GPT (profiling/models.py) names its layers embedding, block<i> and head.
_BUILTIN_GPT_KINDS = ((re.compile(r"embedding"), "embedding"), (re.compile(r"block\d+"), "decoder"),
                      (re.compile(r"head"), "output"))


def _builtin_kind(name: str) -> str:
    return next((kind for pattern, kind in _BUILTIN_GPT_KINDS if pattern.fullmatch(name)), "other")


def _from_profile(profile: Profile) -> Split | None:
    names = profile.stage_split
    if not names:
        return None
    if not all(names):
        raise PartitionError(f"profile {profile.label}: field details.partition.layers_per_stage must list the layer "
                             "names of each stage")
    if profile.layers is not None:
        return split_from_layers(names, profile.layers)
    chunks = tuple(tuple(str(n) for n in c) for c in names)
    builtin = (profile.details.get("model") or {}).get("model") == "gpt"
    kinds = tuple(tuple(_builtin_kind(n) if builtin else "other" for n in c) for c in chunks)
    return Split(chunks, chunks, kinds)


def split_of(schedule: Schedule, profile: Profile | None = None) -> Split:
    """The layer split to hand a trainer with `schedule`: the one it carries (`schedule.plan.split`),
    else the one `profile` was measured with (`details.partition.layers_per_stage`).

    Raises
    ------
    PartitionError
        No split is known; the split's chunk count is not the schedule's stage count; the split does
        not name the profile's layers in order.
    """
    n = schedule.placement.num_chunks
    if schedule.plan.split is not None:
        split, source = schedule.plan.split, "the schedule's split"
        if profile is not None and profile.layers is not None and split.num_chunks == n:
            try:  # the names follow the profile's layers
                counts_of(split.chunks, profile.layers, schedule.placement)
            except PartitionError as exc:
                raise PartitionError(f"schedule {schedule.name!r}'s split does not fit profile {profile.label} "
                                     f"({exc}): use the profile the schedule was solved on") from None
    else:
        found = None if profile is None else _from_profile(profile)
        if found is None:
            where = "" if profile is None else f", nor does profile {profile.label} record one"
            raise PartitionError(f"schedule {schedule.name!r} carries no layer split{where}: {NO_SPLIT_FIX}")
        split, source = found, f"profile {profile.label}'s split"  # type: ignore[union-attr]
    if split.num_chunks != n:
        raise PartitionError(f"{source} has {split.num_chunks} stages but schedule {schedule.name!r} (placement "
                             f"{schedule.placement.name!r}) has {n}: {NO_SPLIT_FIX}")
    empty = [c for c, names in enumerate(split.chunks) if not names]
    if empty:
        raise PartitionError(f"{source} gives stage {empty[0]} no layer: every stage needs at least one")
    return split

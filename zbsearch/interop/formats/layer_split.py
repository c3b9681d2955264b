"""The split of a model's layers over a schedule's stages: what a trainer needs besides the order.

A split lists, per global chunk index (torch's stage index, Megatron-LM's virtual-stage index on
linear and interleaved placements), the layer names of that chunk, the module paths they cover and
the kind of each layer. A schedule solved on a layer-level profile carries it as
`schedule.meta["partition"]`:

    {"chunks":  [["tok_embeddings", "layers.0"], ["layers.1", "norm+output"]],   # layer names
     "modules": [["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]], # module paths
     "kinds":   [["embedding", "decoder"], ["decoder", "output"]]}               # one per layer

`split_meta(profile)` builds that dict from a split profile (core/partition.py's `partition_profile`);
`split_of(schedule, profile)` reads it back, or falls back on the split a profile was measured with
(`details.partition.layers_per_stage`, one stage per rank).
"""

from __future__ import annotations

import re
from typing import Any

from ...core.errors import PartitionError
from ...core.ir import Schedule
from ...core.layers import LAYER_KINDS
from ...core.partition import Split, counts_of, split_from_layers, split_meta  # noqa: F401 (split_meta re-exported)
from ...core.profile import Profile

NO_SPLIT_FIX = ("solve it on a profile with per-layer costs (layers), so that the schedule carries its split, "
                "or give the profile whose stages the schedule was made for")


def _lists(raw: Any, what: str, origin: str) -> tuple[tuple[str, ...], ...]:
    if not isinstance(raw, list) or not all(isinstance(c, list) and all(isinstance(x, str) for x in c) for c in raw):
        raise PartitionError(f"{origin}: field meta.partition.{what} must be a list of lists of strings, one list per "
                             "stage")
    return tuple(tuple(c) for c in raw)


def from_meta(raw: Any, origin: str) -> Split:
    """The split a schedule carries (`meta["partition"]`), checked. `modules` defaults to the layer
    names and `kinds` to "other" when left out."""
    if not isinstance(raw, dict) or "chunks" not in raw:
        raise PartitionError(f"{origin}: field meta.partition must be an object with chunks (layer names per "
                             "stage), modules and kinds")
    chunks = _lists(raw["chunks"], "chunks", origin)
    modules = _lists(raw["modules"], "modules", origin) if "modules" in raw else chunks
    kinds = _lists(raw["kinds"], "kinds", origin) if "kinds" in raw else tuple(("other",) * len(c) for c in chunks)
    if len(modules) != len(chunks) or len(kinds) != len(chunks):
        raise PartitionError(f"{origin}: meta.partition lists {len(chunks)} chunks of layers but {len(modules)} of "
                             f"modules and {len(kinds)} of kinds: give one entry per stage in each")
    for c, (names, ks) in enumerate(zip(chunks, kinds)):
        if len(ks) != len(names):
            raise PartitionError(f"{origin}: meta.partition chunk {c} has {len(names)} layers but {len(ks)} kinds: "
                                 "give one kind per layer")
        bad = [k for k in ks if k not in LAYER_KINDS]
        if bad:
            raise PartitionError(f"{origin}: meta.partition chunk {c} has layer kind {bad[0]!r}: use one of "
                                 f"{', '.join(LAYER_KINDS)}")
    return Split(chunks, modules, kinds)


# zbsearch's built-in GPT (profiling/models.py) names its layers embedding, block<i> and head.
_BUILTIN_GPT_KINDS = ((re.compile(r"embedding"), "embedding"), (re.compile(r"block\d+"), "decoder"),
                      (re.compile(r"head"), "output"))


def _builtin_kind(name: str) -> str:
    return next((kind for pattern, kind in _BUILTIN_GPT_KINDS if pattern.fullmatch(name)), "other")


def _from_profile(profile: Profile) -> Split | None:
    names = (profile.details.get("partition") or {}).get("layers_per_stage")
    if not names:
        return None
    if not isinstance(names, list) or not all(isinstance(c, list) and c for c in names):
        raise PartitionError(f"profile {profile.label}: field details.partition.layers_per_stage must list the layer "
                             "names of each stage")
    if profile.layers is not None:
        return split_from_layers(names, profile.layers)
    chunks = tuple(tuple(str(n) for n in c) for c in names)
    builtin = (profile.details.get("model") or {}).get("model") == "gpt"
    kinds = tuple(tuple(_builtin_kind(n) if builtin else "other" for n in c) for c in chunks)
    return Split(chunks, chunks, kinds)


def split_of(schedule: Schedule, profile: Profile | None = None) -> Split:
    """The layer split to hand a trainer with `schedule`: the one it carries (`meta["partition"]`),
    else the one `profile` was measured with (`details.partition.layers_per_stage`).

    Raises
    ------
    PartitionError
        No split is known; the split's chunk count is not the schedule's stage count; the split does
        not name the profile's layers in order.
    """
    n = schedule.placement.num_chunks
    if "partition" in schedule.meta:
        split, source = from_meta(schedule.meta["partition"], f"schedule {schedule.name!r}"), "the schedule's split"
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

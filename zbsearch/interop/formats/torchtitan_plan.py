"""What a plan fixes in a torchtitan run, whatever the version writes it as: one record, checked.

`titan_plan` reads the schedule, its split, its plan record and the profile it was made on, and refuses
what torchtitan would not run as planned:

- one rank (`pipeline_parallel_degree` 1 turns pipelining off: torchtitan ignores the schedule and its CSV);
- a profile that does not record the microbatch (details.model.micro_batch and seq, written by
  `zbsearch profile`): torchtitan sizes a microbatch itself, and a plan's activation memory is for its
  microbatch only;
- recompute torchtitan cannot apply by module: a level other than full (torchtitan wraps a whole block),
  or a layer that is not a decoder block (its activation checkpointing wraps `layers.<i>` only);
- ZeRO-1 sharding (torchtitan's data parallelism is FSDP: it shards the gradients too).

The record says how the recompute is expressed: "none" (torchtitan's activation checkpointing off),
"full" (every decoder block: torchtitan's own full AC) or "planned" (the blocks listed, by a hook in the
config file), and whether the schedule splits the backward (then FlexAttention must go, see
torchtitan_python.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from ...core.errors import PartitionError, ProfileError, ScheduleError, ZbsearchError
from ...core.ir import Kind, Schedule
from ...core.plan_record import Split
from ...core.profile import Profile

_BLOCK = re.compile(r"layers\.\d+")
# FSDP's reshard_after_forward per zbsearch sharding: fsdp frees a layer's gathered weights after its
# forward (core/sharding.py counts one gathered layer per chunk), zero2 keeps them whole.
RESHARD = {"fsdp": "always", "zero2": "never"}


@dataclass(frozen=True)
class TitanPlan:
    """The fields of a torchtitan run that a zbsearch plan fixes."""

    degree: int
    schedule: str  # pipeline_parallel_schedule: picks the stage layout
    csv: str
    parts: list[list[str]]  # module_fqns_per_model_part
    microbatches: int
    micro_batch: int  # sequences per microbatch, as profiled
    seq: int
    recompute: list[list[str]]  # per part, the decoder blocks recomputed in full
    recompute_mode: str  # none, full or planned
    split_backward: bool  # the schedule runs I and W apart
    shard_degree: int | None  # data_parallel_shard_degree the plan assumed (None: it assumed none)
    reshard: str | None  # fsdp_reshard_after_forward

    @property
    def tokens(self) -> int:
        """Tokens per microbatch and data-parallel rank."""
        return self.micro_batch * self.seq


def microbatch_shape(profile: Profile | None) -> tuple[int, int]:
    """(sequences per microbatch, sequence length) from the profile's details.model.

    Raises
    ------
    ProfileError
        No profile, or one that does not record them.
    """
    if profile is None:
        raise ProfileError("the torchtitan export needs the profile the plan was made on: torchtitan sizes each "
                           "microbatch from the config, and the plan holds the activations of the profiled one "
                           "(details.model.micro_batch x seq tokens); give that profile", subject="profile")
    model = profile.details.get("model") or {}
    micro_batch, seq = model.get("micro_batch"), model.get("seq")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (micro_batch, seq)):
        raise ProfileError(f"profile {profile.label} does not record the microbatch it was made for (fields "
                           "details.model.micro_batch and details.model.seq, positive integers): torchtitan would "
                           "size the microbatch itself; profile or estimate the model with zbsearch profile, "
                           "which records them", subject="profile")
    return int(micro_batch), int(seq)  # type: ignore[arg-type]  # checked just above


def recompute_parts(split: Split, levels: Mapping[str, str]) -> list[list[str]]:
    """Per model part, the decoder blocks the plan recomputes in full (their module paths).

    Raises
    ------
    PartitionError
        A layer recomputed at another level (selective: the attention core alone), or one that is not a
        decoder block: torchtitan wraps whole blocks only.
    """
    other = sorted(name for name, level in levels.items() if level != "full")
    if other:
        raise PartitionError(f"the plan recomputes {other[0]!r} at {levels[other[0]]} (the attention core alone), "
                             "which torchtitan cannot wrap by module: plan full recompute for torchtitan")
    outside = sorted(name for name in levels if not _BLOCK.fullmatch(name))
    if outside:
        raise PartitionError(f"the plan recomputes {outside[0]!r}, which is not a decoder block: torchtitan's "
                             "activation checkpointing wraps the blocks layers.<i> only; plan recompute on the "
                             "decoder blocks for torchtitan (recompute auto-layers, or a fixed list of blocks)")
    return [[name for name in chunk if name in levels] for chunk in split.chunks]


def _mode(split: Split, parts: list[list[str]]) -> str:
    chosen = sum(len(part) for part in parts)
    blocks = sum(1 for chunk in split.chunks for name in chunk if _BLOCK.fullmatch(name))
    return "none" if chosen == 0 else "full" if chosen == blocks else "planned"


def _sharding(schedule: Schedule) -> tuple[int | None, str | None]:
    sharding = schedule.plan.sharding
    if sharding is None or sharding.degree == 1:
        return None, None
    if sharding.how not in RESHARD:
        raise ZbsearchError(f"the plan was made under {sharding.how} sharding over {sharding.degree} ranks, which "
                            "torchtitan does not run: its data parallelism is FSDP (weights, gradients and optimizer "
                            "state sharded); plan with fsdp or zero2 sharding for torchtitan")
    return sharding.degree, RESHARD[sharding.how]


def titan_single(split: Split, microbatches: int, profile: Profile | None, levels: Mapping[str, str]) -> TitanPlan:
    """The record of a run without pipelining (one model part: no schedule, no CSV, no module parts):
    `microbatches` of the profile's microbatch accumulated per step, the recompute `levels`, no sharding
    (the caller sets it).

    Raises
    ------
    ProfileError, PartitionError
        As titan_plan's.
    """
    recompute = recompute_parts(split, levels)
    micro_batch, seq = microbatch_shape(profile)
    return TitanPlan(1, "", "", [], microbatches, micro_batch, seq, recompute, _mode(split, recompute), False, None,
                     None)


@dataclass(frozen=True)
class TitanDegrees:
    """What a whole run fixes in torchtitan beside the pipeline and the sharding (TitanPlan's): the tensor-,
    replicate- and expert-parallel degrees and the global batch in sequences."""

    tensor: int
    replicate: int
    expert: int
    global_batch: int


def titan_plan(schedule: Schedule, split: Split, parts: list[list[str]], csv_path: str, name: str,
               profile: Profile | None, levels: Mapping[str, str]) -> TitanPlan:
    """The record for `schedule` run with `split` (its module names already checked as `parts`) and the
    schedule name `name`, the CSV at `csv_path`, the microbatch of `profile`, the recompute `levels`.

    Raises
    ------
    ScheduleError, ProfileError, PartitionError, ZbsearchError
        As the module docstring lists.
    """
    if schedule.num_ranks < 2:
        raise ScheduleError(f"schedule {schedule.name!r} runs on one rank: torchtitan turns pipelining off at "
                            "pipeline_parallel_degree 1 and ignores the schedule and its CSV; solve for two or more "
                            "ranks, or run torchtitan without pipeline parallelism")
    recompute = recompute_parts(split, levels)
    micro_batch, seq = microbatch_shape(profile)
    shard_degree, reshard = _sharding(schedule)
    split_backward = any(a.kind in (Kind.B, Kind.W) for rank in schedule.ranks for action in rank
                         for a in action.passes())
    return TitanPlan(schedule.num_ranks, name, csv_path, parts, schedule.num_microbatches, micro_batch, seq,
                     recompute, _mode(split, recompute), split_backward, shard_degree, reshard)

"""A plan's recompute as Megatron-LM's recompute arguments where Megatron can express it, and a plain
statement of what it cannot express where it cannot, with the nearest uniform setting that holds at least
as little memory (labelled as not the plan).

What Megatron-LM does, read in NVIDIA/Megatron-LM at d98e8a64 (main, 2026-08-22); its flags are made from
TransformerConfig's fields (megatron/training/argument_utils.py, ArgumentGroupFactory):
- `--recompute-granularity full`: whole transformer layers are checkpointed, each keeping only its input
  (megatron/core/recompute.py, checkpointed_forward), with `--recompute-method` and `--recompute-num-layers`
  required (megatron/core/transformer/transformer_config.py). `block N`: in each model chunk (a virtual
  stage: each builds its own TransformerBlock of its decoder layers), the first N decoder layers, each on
  its own input; a chunk with fewer recomputes all of its layers. `uniform N`: groups of N layers keeping
  each group's input; with N = 1, every layer on its own input. Embedding and output are outside the block
  and never recomputed; MTP layers are recomputed by `uniform` only (`block` skips them with a warning,
  megatron/core/transformer/multi_token_prediction.py).
- `--recompute-granularity selective`: the submodules in `--recompute-modules` (default core_attn) of
  every transformer layer, decoder and MTP alike; method and layer count must be left out. core_attn is
  the attention core (scores, softmax, the value product; megatron/core/transformer/attention.py,
  checkpoint_core_attention): Korthikanti et al.'s selective recompute, zbsearch's `selective` level.
  Its other modules (layernorm, mlp, moe_act, ...) are not levels zbsearch plans.
- One setting for every rank, model chunk and microbatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ...core.errors import PartitionError, ScheduleError
from ...core.ir import Schedule
from ...core.recompute.levels import plan_levels
from ...core.plan_record import Split

CHECKED = "NVIDIA/Megatron-LM main at d98e8a64 (2026-08-22)"
TRANSFORMER = ("decoder", "mtp")  # the layer kinds Megatron recomputes
SELECTIVE = ("--recompute-granularity", "selective", "--recompute-modules", "core_attn")
EVERY_LAYER = ("--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1")


def block(n: int) -> tuple[str, ...]:
    """Full recompute of the first `n` decoder layers of every model chunk."""
    return ("--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", str(n))


@dataclass(frozen=True)
class MegatronRecompute:
    """A plan's recompute for Megatron-LM: `flags` when Megatron runs exactly the plan's recompute (empty
    when the plan recomputes nothing, or cannot be expressed), else `statement`, one line saying what
    Megatron cannot express and the nearest uniform setting."""

    flags: tuple[str, ...] = ()
    statement: str | None = None


Chosen = tuple[int, str, str, str]  # stage, layer name, kind, level


def _levels(schedule: Schedule, split: Split) -> dict[str, str]:
    try:
        return plan_levels(schedule.plan, schedule.name, {name for chunk in split.chunks for name in chunk},
                           "plan.split.chunks does not list: use the plan as solved")
    except ScheduleError as exc:
        raise PartitionError(str(exc)) from None


def _partial_microbatches(schedule: Schedule, partial: Mapping[int, list[int]]) -> str | None:
    """Why the plan's per-microbatch choices cannot be Megatron's (PlanRecord.
    levels_for_every_microbatch: `partial` the chunks that recompute only some microbatches, with those),
    or None."""
    if not partial:
        return None
    (c, entry), m = next(iter(partial.items())), schedule.num_microbatches
    return (f"stage {c} recomputes on microbatch{'es' if len(entry) > 1 else ''} {spans(entry)} of 0-{m - 1} only; "
            "Megatron recomputes on every microbatch")


def spans(indices: list[int]) -> str:
    """Sorted indices as runs: `0-2, 5`."""
    runs: list[list[int]] = []
    for i in sorted(set(indices)):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _decoders(split: Split, c: int) -> list[str]:
    return [name for name, kind in zip(split.chunks[c], split.kinds[c]) if kind == "decoder"]


def _cover(split: Split, chosen: list[Chosen]) -> tuple[str, ...]:
    """The least full setting that recomputes every chosen transformer layer (and more where it must)."""
    if any(kind == "mtp" for _, _, kind, _ in chosen):
        return EVERY_LAYER
    names = {name for _, name, _, _ in chosen}
    return block(max(max((i + 1 for i, name in enumerate(_decoders(split, c)) if name in names), default=0)
                     for c in range(split.num_chunks)))


def _full_reason(split: Split, chosen: list[Chosen]) -> str | None:
    """Why full recompute of `chosen` (transformer layers) is no Megatron setting; None where it is."""
    names = {name for _, name, _, _ in chosen}
    mtp = next((name for _, name, kind, _ in chosen if kind == "mtp"), None)
    if mtp is not None:
        left = next(((c, name, kind) for c, (ns, ks) in enumerate(zip(split.chunks, split.kinds))
                     for name, kind in zip(ns, ks) if kind in TRANSFORMER and name not in names), None)
        if left is None:
            return None
        return (f"stage {left[0]} leaves {left[2]} layer {left[1]!r} without recompute while MTP layer {mtp!r} is "
                "recomputed; Megatron recomputes MTP layers only with its uniform method, which recomputes every "
                "decoder and MTP layer (its block method skips MTP layers)")
    counts = []
    for c in range(split.num_chunks):
        decoders = _decoders(split, c)
        chosen_here = [i for i, name in enumerate(decoders) if name in names]
        if chosen_here != list(range(len(chosen_here))):
            gap = next(i for i in range(len(decoders)) if i not in chosen_here)
            return (f"stage {c} recomputes {decoders[chosen_here[-1]]!r} but not {decoders[gap]!r} before it; "
                    "Megatron's block method recomputes the first N decoder layers of every stage")
        counts.append((len(chosen_here), len(decoders)))
    n = max(k for k, _ in counts)
    widest = next(c for c, (k, _) in enumerate(counts) if k == n)
    for c, (k, size) in enumerate(counts):
        if k != min(n, size):
            here = f"its first {k} of {size}" if k else f"none of its {size}"
            return (f"stage {c} recomputes {here} decoder layers, stage {widest} its first {n}; "
                    "Megatron's block method recomputes the same number of first decoder layers in every stage, "
                    "all of them in a stage with fewer")
    return None


def _layer_setting(split: Split, levels: Mapping[str, str]) -> tuple[tuple[str, ...], str | None, str | None]:
    """The least uniform setting that recomputes at least the plan's layers (at full where levels mix),
    why it is not the plan (None where it is), and the first planned layer no setting recomputes."""
    chosen = [(c, name, kind, levels[name]) for c, (names, kinds) in enumerate(zip(split.chunks, split.kinds))
              for name, kind in zip(names, kinds) if name in levels]
    outside = next(((c, name, kind) for c, name, kind, _ in chosen if kind not in TRANSFORMER), None)
    inside = [x for x in chosen if x[2] in TRANSFORMER]
    full = next((x for x in inside if x[3] == "full"), None)
    selective = next((x for x in inside if x[3] == "selective"), None)
    nearest = () if not inside else SELECTIVE if full is None else _cover(split, inside)
    if outside is not None:
        c, name, kind = outside
        return nearest, (f"stage {c} recomputes {kind} layer {name!r}; Megatron recomputes decoder and MTP layers "
                         "only"), name
    if full is not None and selective is not None:
        return nearest, (f"stage {full[0]} recomputes {full[1]!r} at full and stage {selective[0]} {selective[1]!r} "
                         "at selective; Megatron applies one granularity to every layer"), None
    if full is None:
        left = next(((c, name) for c, (ns, ks) in enumerate(zip(split.chunks, split.kinds))
                     for name, kind in zip(ns, ks) if kind in TRANSFORMER and name not in levels), None)
        return nearest, None if left is None else (
            f"stage {left[0]} leaves {left[1]!r} without recompute; Megatron's selective granularity recomputes the "
            "attention core of every decoder and MTP layer"), None
    return nearest, _full_reason(split, inside), None


def megatron_recompute(schedule: Schedule, split: Split) -> MegatronRecompute:
    """The plan's recompute (its record's levels, and recompute_microbatches where it has them) as
    Megatron-LM arguments, or the statement of what Megatron cannot express (see the module).

    Raises
    ------
    PartitionError
        The recompute fields name a layer the split does not list, an unknown level, or microbatches out of
        range.
    """
    _levels(schedule, split)
    # the layers of chunks on which no microbatch recomputes are not recomputed at all
    levels, partial = schedule.plan.levels_for_every_microbatch(schedule.num_microbatches)
    if not levels:
        return MegatronRecompute()
    nearest, why, lost = _layer_setting(split, levels)
    reasons = [r for r in (why, _partial_microbatches(schedule, partial)) if r is not None]
    if not reasons:
        return MegatronRecompute(flags=nearest)
    text = " ".join(nearest)
    if lost is not None:
        near = (f"No Megatron setting holds as little memory as the plan, as none recomputes {lost!r}"
                + (f"; the nearest, not the plan: {text}" if nearest else "."))
    else:
        near = ("Nearest uniform setting that holds at least as little memory, not the plan (it recomputes more, so "
                f"iterations take longer than planned): {text}")
    return MegatronRecompute(statement=f"Megatron-LM cannot express this plan's recompute: {'; and '.join(reasons)}. "
                                       f"Its arguments carry no recompute flags. {near}")

"""A schedule's layer split in the forms trainers take it: the torchtitan schedule name whose stage
layout is the placement (torchtitan.py writes the rest of torchtitan's config) and Megatron-LM's
pipeline layout string.

Megatron-LM (NVIDIA/Megatron-LM, PipelineParallelLayerLayout): stages separated by `|` in virtual-stage
order, virtual stage i on rank i mod p (so only linear and interleaved placements); letters E
(embedding), t (decoder layer), m (MTP layer), L (loss, with the output layer and, without MTP, the
final norm); `x*N` repeats a letter, `(...)*N` a group, commas are cosmetic. The first layer must be E
and the last L, each exactly once; MTP layers come after every decoder layer, all in one stage, the
last virtual stage of its rank. The virtual stage count is the stage count over p.
"""

from __future__ import annotations

import re
import shlex
from typing import Sequence

from ...core.errors import PartitionError, ScheduleError
from ...core.ir import Schedule
from ...core.plan_record import Split
from .megatron_recompute import megatron_recompute

# torchtitan's pipeline_parallel_schedule per stage layout: it decides which stages each rank builds.
TORCHTITAN_LOOP = {True: "1F1B", False: "Interleaved1F1B"}
TORCHTITAN_V = "ZBVZeroBubble"
MEGATRON_LETTERS = {"embedding": "E", "decoder": "t", "mtp": "m", "output": "L"}


def _looped(schedule: Schedule) -> bool:
    pl = schedule.placement
    chain = pl.routes == (tuple(range(pl.num_chunks)),)
    return chain and pl.chunk_to_rank == tuple(c % pl.num_ranks for c in range(pl.num_chunks))


def _v_shaped(schedule: Schedule) -> bool:
    pl, p = schedule.placement, schedule.placement.num_ranks
    chain = pl.routes == (tuple(range(pl.num_chunks)),)
    v = tuple(c if c < p else 2 * p - 1 - c for c in range(2 * p))
    return chain and pl.chunk_to_rank == v


def torchtitan_schedule_name(schedule: Schedule) -> str:
    """The `pipeline_parallel_schedule` whose stage layout is the schedule's placement."""
    if _looped(schedule):
        return TORCHTITAN_LOOP[schedule.placement.num_chunks == schedule.num_ranks]
    if _v_shaped(schedule):
        return TORCHTITAN_V
    pl = schedule.placement
    raise ScheduleError(f"schedule {schedule.name!r} puts its stages on ranks {list(pl.chunk_to_rank)} (placement "
                        f"{pl.name!r}): torchtitan builds stages r, r+p, ... on rank r, or r and 2p-1-r for V-shape "
                        "schedules; export a linear, interleaved or V-shape schedule")


def _letters(schedule: Schedule, split: Split) -> list[str]:
    """Per stage, the Megatron letters of its layers, after Megatron's own rules are checked."""
    flat = [(c, name, kind) for c, (names, kinds) in enumerate(zip(split.chunks, split.kinds))
            for name, kind in zip(names, kinds)]
    unknown = [(name, kind) for _, name, kind in flat if kind not in MEGATRON_LETTERS]
    if unknown:
        raise PartitionError(f"layer {unknown[0][0]!r} has kind {unknown[0][1]!r}: Megatron-LM's layout names "
                             "embedding, decoder, mtp and output layers only; give every layer one of those kinds")
    kinds = [kind for _, _, kind in flat]
    if kinds[0] != "embedding" or kinds[-1] != "output" or kinds.count("embedding") != 1 or kinds.count("output") != 1:
        raise PartitionError("Megatron-LM's layout needs exactly one embedding layer, first, and one output layer, "
                             f"last; this split's layers are {kinds[0]} ... {kinds[-1]} with "
                             f"{kinds.count('embedding')} embedding and {kinds.count('output')} output: give the "
                             "layers those kinds")
    _check_mtp(schedule, flat)
    return ["".join(MEGATRON_LETTERS[k] for k in ks) for ks in split.kinds]


def _check_mtp(schedule: Schedule, flat: list[tuple[int, str, str]]) -> None:
    mtp = [(c, name) for c, name, kind in flat if kind == "mtp"]
    if not mtp:
        return
    first = next(i for i, (_, _, kind) in enumerate(flat) if kind == "mtp")
    late = [name for _, name, kind in flat[first:] if kind == "decoder"]
    stages = sorted({c for c, _ in mtp})
    p, n = schedule.num_ranks, schedule.placement.num_chunks
    if late:
        raise PartitionError(f"decoder layer {late[0]!r} comes after an MTP layer: Megatron-LM needs every MTP "
                             "layer after the decoder layers")
    if len(stages) > 1 or stages[0] < n - p:
        raise PartitionError(f"the MTP layers sit on stages {stages}: Megatron-LM needs them all on one stage, the "
                             f"last virtual stage of its rank (stages {n - p}..{n - 1} here)")


def _runs(items: Sequence[str]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for x in items:
        if out and out[-1][0] == x:
            out[-1] = (x, out[-1][1] + 1)
        else:
            out.append((x, 1))
    return out


def compress(stages: Sequence[str]) -> str:
    """Megatron's layout string for per-stage letters: three or more equal letters as `x*N`, three or
    more equal stages in a row as `(...|)*N` followed by a cosmetic comma.

    >>> compress(["Ettt"] + ["tt"] * 29 + ["m", "L"])
    'Et*3|(tt|)*29,m|L'
    """
    def stage(letters: str) -> str:
        return "".join(f"{x}*{k}" if k >= 3 else x * k for x, k in _runs(letters))

    parts = []
    for text, k in _runs([stage(s) for s in stages]):
        parts.append(f"({text}|)*{k}," if k >= 3 else "|".join([text] * k) + "|")
    return "".join(parts).rstrip("|")


_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_REPEAT = re.compile(r"([A-Za-z])\*(\d+)")


def expand(layout: str) -> list[str]:
    """Per stage, the letters of a layout string (the grammar above; no nested groups)."""
    text = layout.replace(",", "")
    text = _GROUP.sub(lambda g: g.group(1) * int(g.group(2)), text)
    return _REPEAT.sub(lambda g: g.group(1) * int(g.group(2)), text).split("|")


def check_megatron_placement(schedule: Schedule) -> None:
    """Raise ScheduleError unless Megatron-LM can place the schedule's stages: virtual stage i on rank
    i mod p, one chain (linear or interleaved)."""
    pl = schedule.placement
    if not _looped(schedule):
        if _v_shaped(schedule):
            why, other = "V-shape: rank r holds stages r and 2p-1-r", ", or export this one for torchtitan"
        else:
            why, other = f"ranks {list(pl.chunk_to_rank)}, routes {[list(r) for r in pl.routes]}", ""
        raise ScheduleError(f"schedule {schedule.name!r} has placement {pl.name!r} ({why}): Megatron-LM's layout puts "
                            "virtual stage i on rank i mod p, one chain of stages, and has no V-shape; solve on a "
                            f"linear or interleaved placement for Megatron-LM{other}")


def megatron_layout(schedule: Schedule, split: Split) -> str:
    """`split` as Megatron-LM's pipeline layout string (virtual stage i on rank i mod p)."""
    check_megatron_placement(schedule)
    stages = _letters(schedule, split)
    layout = compress(stages)
    assert expand(layout) == stages, (layout, stages)
    return layout


def megatron_args(schedule: Schedule, split: Split) -> str:
    """The Megatron-LM arguments for `split`, shell-quoted on one line: pipeline size, layout, decoder
    layer count (and MTP layer count), and the plan's recompute where Megatron can express it
    (megatron_recompute.py; where it cannot, its statement says so and no recompute flag is written).
    Megatron derives the virtual stages per rank from the layout."""
    return shell_line(megatron_arg_list(schedule, split))


def shell_line(args: Sequence[str]) -> str:
    """Arguments shell-quoted on one line."""
    return " ".join(shlex.quote(a) for a in args) + "\n"


def megatron_arg_list(schedule: Schedule, split: Split) -> list[str]:
    """megatron_args' arguments, unquoted."""
    layout = megatron_layout(schedule, split)
    kinds = [k for ks in split.kinds for k in ks]
    args = ["--pipeline-model-parallel-size", str(schedule.num_ranks), "--pipeline-model-parallel-layout", layout,
            "--num-layers", str(kinds.count("decoder"))]
    if "mtp" in kinds:
        args += ["--mtp-num-layers", str(kinds.count("mtp"))]
    return args + list(megatron_recompute(schedule, split).flags)

"""One split of a profile's layers over the chunks of a placement, as the stage-level profile the
simulator, the heuristics and the solver read.

A split is written as layers per chunk in route order (`counts`): the first counts[0] layers form the
route's first chunk, the next counts[1] its second, and so on, so the embedding always sits on the
route's first chunk and the head on its last. Every route of a placement has the same length; on
DualPipe's two routes (two model copies) the chunk at position k of either route gets the same layers.

Each chunk's costs are the sums over its layers. A rank's stage (the unit of `Np` memory limits) is its
chunks on the route that loads it most; its static bytes are those of every chunk it holds, so a rank
holding two model copies pays for both. A hop's time is that of a message of the out_bytes of the last
layer before the boundary: read off the profile's measured `comm_table`, else over its `link_bandwidth`;
without either the profile's `comm` is kept.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from .calibration import kept_after_w, torch_chunk_memory
from .errors import PartitionError, ProfileError
from .ir import Placement
from .layers import Layer
from .plan_record import Choice, PlanRecord, Split
from .profile import Profile
from .stage_cost import StageCost

# A chunk whose layers hold no activation (an embedding alone) still counts one byte, so that limits
# written as multiples of a stage's memory stay defined.
MIN_MEM = 1.0


def route_length(placement: Placement) -> int:
    lengths = {len(route) for route in placement.routes}
    if len(lengths) != 1:
        raise PartitionError(f"placement {placement.name!r} has routes of different lengths: a layer split needs "
                             "every route to visit the same number of chunks")
    return lengths.pop()


def check_chunk_counts(counts: Sequence[int], n_layers: int, placement: Placement) -> tuple[int, ...]:
    """Layers per chunk, checked: one positive count per chunk of the route, adding up to the layers.

    >>> from zbsearch.core.ir import vshape
    >>> check_chunk_counts([1, 2, 2, 1], 6, vshape(2))
    (1, 2, 2, 1)
    """
    k = route_length(placement)
    given = ",".join(map(str, counts))
    if n_layers < k:
        raise PartitionError(f"the model has {n_layers} layers but placement {placement.name!r} on "
                             f"{placement.num_ranks} ranks has {k} chunks: every chunk needs at least one layer, so "
                             "use fewer ranks or fewer chunks per rank", subject="placement")
    if len(counts) != k:
        raise PartitionError(f"layers per chunk {given} give {len(counts)} chunks but placement "
                             f"{placement.name!r} on {placement.num_ranks} ranks has {k}: give {k} counts in route order"
                             f"{_placement_hint(len(counts), placement.num_ranks)}", subject="partition")
    if any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in counts):
        raise PartitionError(f"layers per chunk {given}: every chunk needs a positive whole number of layers",
                             subject="partition")
    if sum(counts) != n_layers:
        raise PartitionError(f"layers per chunk {given} add up to {sum(counts)} but the model has {n_layers} "
                             f"layers (every entry of the profile's layers list, the embedding and the head "
                             f"included): make them add up to {n_layers}", subject="partition")
    return tuple(counts)


def _placement_hint(chunks: int, p: int) -> str:
    """Which placement on p ranks has `chunks` chunks on its route, as a clause; empty when none does."""
    if chunks == p:
        return f", or use placement linear ({p} chunks)"
    if chunks == 2 * p:
        return f", or use placement v ({2 * p} chunks)"
    if chunks % p == 0:
        return f", or use placement interleaved:{chunks // p} ({chunks} chunks)"
    return ""


def layers_by_stage(profile: Profile, layers: Sequence[Layer], why: str) -> list[list[Layer]]:
    """`layers` (the profile's, changed) grouped as the profile's own stages, by the names its split
    records (details.partition.layers_per_stage).

    Raises
    ------
    ProfileError
        The profile does not record its split, or names layers `layers` does not have; `why` says what
        needs the stages summed again.
    """
    names = profile.stage_split
    by_name = {layer.name: layer for layer in layers}
    if names is None or len(names) != profile.num_stages or not all(n in by_name for stage in names for n in stage):
        raise ProfileError(f"profile {profile.label} does not record which layers each stage holds (field "
                           f"details.partition.layers_per_stage): {why}; profile the model again")
    return [[by_name[n] for n in stage] for stage in names]


def groups(layers: Sequence[Layer], counts: Sequence[int]) -> list[tuple[Layer, ...]]:
    """The layers of each route position."""
    out, start = [], 0
    for c in counts:
        out.append(tuple(layers[start:start + c]))
        start += c
    return out


def chunk_static(group: Sequence[Layer]) -> float:
    """The static bytes of a chunk of these layers: theirs, plus the largest buffer one of them gathers
    while it computes (FSDP gathers one layer at a time; core/sharding.py)."""
    return math.fsum(layer.static_bytes for layer in group) + max((layer.gather_bytes for layer in group), default=0.0)


def summed(group: Sequence[Layer], loss: bool = False, first: bool = False) -> StageCost:
    """One chunk's cost: the sums over its layers; under torch's runtime, calibration.torch_chunk_memory
    and what it keeps until the iteration ends (calibration.kept_after_w: `loss` for the chunk that
    computes the loss, `first` for the first one)."""
    fused = any(layer.full_backward is not None for layer in group)
    mem_B = math.fsum(layer.mem_B for layer in group)
    mem_W = math.fsum(layer.mem_W for layer in group)
    # Only a recomputed layer holds more from B until W than from F (core/recompute/levels.py); otherwise
    # the sums keep the profile format's mem_W <= mem_B.
    recomputed = any("recomputed" in layer.details for layer in group)
    torch_b = torch_w = kept = None
    if group and all(layer.mem_W_torch is not None for layer in group):  # measured on torch's runtime
        torch_b, torch_w = torch_chunk_memory(
            [layer.mem_B if layer.mem_B_torch is None else layer.mem_B_torch for layer in group],
            [layer.mem_W_torch for layer in group], group[-1].out_bytes)
        torch_b, kept = max(torch_b, MIN_MEM), kept_after_w(group, first, loss)
    return StageCost(
        F=math.fsum(layer.F for layer in group), B=math.fsum(layer.B for layer in group),
        W=math.fsum(layer.W for layer in group), mem_B=max(mem_B, MIN_MEM),
        mem_W=mem_W if recomputed else min(mem_W, max(mem_B, MIN_MEM)),
        full_backward=math.fsum(layer.BW for layer in group) if fused else None,
        static_bytes=chunk_static(group),
        mem_B_torch=torch_b, mem_W_torch=torch_w, mem_kept_torch=kept,
        without_recompute=summed([layer.as_profiled or layer for layer in group], loss, first) if recomputed else None,
    )


def _add(a: StageCost, b: StageCost) -> StageCost:
    fb = None if a.full_backward is None and b.full_backward is None else a.BW + b.BW

    def both(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None else x + y

    kept = None if a.without_recompute is None and b.without_recompute is None else \
        _add(a.for_microbatch(False), b.for_microbatch(False))
    return StageCost(a.F + b.F, a.B + b.B, a.W + b.W, a.mem_B + b.mem_B, a.mem_W + b.mem_W, fb,
                     (a.static_bytes or 0.0) + (b.static_bytes or 0.0), None,
                     both(a.mem_B_torch, b.mem_B_torch), both(a.mem_W_torch, b.mem_W_torch),
                     without_recompute=kept)


def _rank_stages(chunks: Sequence[StageCost], placement: Placement) -> tuple[StageCost, ...]:
    stages = []
    for rank in range(placement.num_ranks):
        per_route = []
        for route in placement.routes:
            mine = [chunks[c] for c in route if placement.chunk_to_rank[c] == rank]
            if mine:
                total = mine[0]
                for cost in mine[1:]:
                    total = _add(total, cost)
                per_route.append(total)
        stage = max(per_route, key=lambda s: (s.for_microbatch(False).mem_B, s.F + s.B + s.W))
        static = math.fsum(chunks[c].static_bytes or 0.0 for c in placement.chunks_on(rank))
        stages.append(replace(stage, static_bytes=static))
    return tuple(stages)


def _comm(profile: Profile, placement: Placement, position_groups: list[tuple[Layer, ...]]) -> tuple[float, ...]:
    p = placement.num_ranks
    if profile.message_time(0.0) is None:
        if len(profile.comm) == p - 1:
            return profile.comm
        if len(set(profile.comm)) <= 1:
            return (profile.comm[0] if profile.comm else 0.0,) * (p - 1)
        raise PartitionError(f"profile {profile.label} gives a different comm per boundary for "
                             f"{profile.num_stages} stages, not for {p}: give its link_bandwidth (bytes per "
                             f"{profile.time_unit}) so that hops follow from the layers' out_bytes")
    comm = [0.0] * (p - 1)
    for route in placement.routes:
        for k in range(len(route) - 1):
            a, b = placement.chunk_to_rank[route[k]], placement.chunk_to_rank[route[k + 1]]
            if a != b:
                link = min(a, b) if abs(a - b) == 1 else None
                hop = profile.message_time(position_groups[k][-1].out_bytes) or 0.0
                for r in ([link] if link is not None else range(p - 1)):
                    comm[r] = max(comm[r], hop)
    return tuple(comm)


def partition_profile(profile: Profile, placement: Placement, counts: Sequence[int]) -> Profile:
    """The stage-level profile of `profile`'s layers split `counts` per chunk on `placement`.

    Raises
    ------
    PartitionError
        The profile has no layers, or `counts` is not a split of them over the placement's chunks.
    """
    if profile.layers is None:
        raise PartitionError(f"profile {profile.label} has no per-layer costs (layers), so its split is fixed: "
                             "profile the model again with a zbsearch that writes layers")
    counts = check_chunk_counts(counts, len(profile.layers), placement)
    by_position = groups(profile.layers, counts)
    position = {c: k for route in placement.routes for k, c in enumerate(route)}
    last = len(counts) - 1
    chunks = tuple(summed(by_position[position[c]], position[c] == last, position[c] == 0)
                   for c in range(placement.num_chunks))
    names = tuple(tuple(layer.name for layer in by_position[position[c]]) for c in range(placement.num_chunks))
    return replace(profile, stages=_rank_stages(chunks, placement), chunks=chunks,
                   comm=_comm(profile, placement, by_position), partition=names)


def counts_of(names: Sequence[Sequence[str]], layers: Sequence[Layer], placement: Placement) -> tuple[int, ...]:
    """Layers per route position from layer names per global chunk (a saved schedule's partition),
    checked against the profile's layers."""
    route = placement.routes[0]
    counts = tuple(len(names[c]) for c in route) if len(names) == placement.num_chunks else ()
    check_chunk_counts(counts, len(layers), placement)
    expected = [tuple(layer.name for layer in g) for g in groups(layers, counts)]
    for k, c in enumerate(route):
        if tuple(names[c]) != expected[k]:
            raise PartitionError(f"the split names layers {list(names[c])} for chunk {c}, but in the profile's "
                                 f"layer order that chunk holds {list(expected[k])}: use the profile the split was "
                                 "made for")
    return counts


def split_from_layers(names: Sequence[Sequence[str]], layers: Sequence[Layer]) -> Split:
    by_name = {layer.name: layer for layer in layers}
    missing = [n for chunk in names for n in chunk if n not in by_name]
    if missing:
        raise PartitionError(f"the split names layer {missing[0]!r}, which the profile's layers do not list: use the "
                             "profile the split was made for")
    chunks = tuple(tuple(chunk) for chunk in names)
    return Split(chunks, tuple(tuple(m for n in chunk for m in by_name[n].module_paths) for chunk in chunks),
                 tuple(tuple(by_name[n].kind for n in chunk) for chunk in chunks))


def plan_of(profile: Profile, mem_limit: str | None = None,
            chosen: Choice | None = None) -> PlanRecord:
    """The plan record of a schedule made on `profile` under the limit written `mem_limit` with the
    per-microbatch recompute `chosen`: on a split of per-layer costs (`partition_profile`) its layer
    names, module paths and kinds per global chunk and the recompute levels its layers run at; always the
    memory accounting and the sharding the profile states.

    >>> from zbsearch.core.ir import linear
    >>> layers = [{"name": n, "kind": k, "F": 1, "B": 1, "W": 1} for n, k in
    ...           [("tok_embeddings", "embedding"), ("layers.0", "decoder"), ("output", "output")]]
    >>> layers[2]["modules"] = ["norm", "output"]
    >>> prof = Profile.from_dict({"name": "toy", "num_stages": 2, "microbatches": 2, "comm": 0,
    ...     "stages": [{"F": 1, "B": 1, "W": 1, "mem_B": 1, "mem_W": 1}] * 2, "layers": layers,
    ...     "source": {"kind": "estimated", "method": "doctest"}})
    >>> plan_of(partition_profile(prof, linear(2), [2, 1])).split.modules
    (('tok_embeddings', 'layers.0'), ('norm', 'output'))
    """
    split, levels = None, tuple[tuple[str, str], ...]()
    if profile.partition is not None and profile.layers is not None:
        split = split_from_layers(profile.partition, profile.layers)
        levels = tuple((layer.name, str(layer.details["recomputed"]["level"])) for layer in profile.layers
                       if "recomputed" in layer.details)
    return PlanRecord(split, levels, chosen, profile.memory_model, profile.sharding, mem_limit)

"""What a plan's split looks like, rank by rank: the layers of each chunk, static bytes, peak
activation bytes and their sum against the cap. One record (solve/report.py's SplitFacts) for the terminal,
JSON and the study."""

from __future__ import annotations

from ...core.recompute.levels import recompute_facts
from ...sim.simulate import Timeline
from ..solve.report import RankFacts, SolveResult, SplitFacts


def rank_totals(timeline: Timeline) -> list[float]:
    """Each rank's whole memory at its peak: static bytes plus peak activations."""
    stages = timeline.profile.stages
    return [(stages[r].static_bytes or 0.0) + timeline.peak_memory(r) for r in range(timeline.num_ranks)]


def layer_range(names: tuple[str, ...]) -> str:
    """`tok_embeddings..layers.3` for a chunk's layers (one name when it has one)."""
    return names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"


def split_facts(result: SolveResult, rule: str) -> SplitFacts:
    """The split of a result on a layer-level profile (see core/partition.py), chosen by `rule`."""
    problem = result.problem
    prof, pl, limit = problem.profile, problem.placement, problem.limit
    assert prof.partition is not None
    by_name = {layer.name: layer for layer in prof.layers or ()}
    ranks = []
    for r in range(pl.num_ranks):
        static = prof.stages[r].static_bytes or 0.0
        peak = result.timeline.peak_memory(r)
        cap = limit.per_rank[r] + (static if limit.includes_static else 0.0)
        mine = [[by_name[name] for name in prof.partition[c] if name in by_name] for c in pl.chunks_on(r)]
        chosen = problem.recompute_microbatches
        counts = [problem.num_microbatches if chosen is None or (mbs := chosen[c]) is None else len(mbs)
                  for c in pl.chunks_on(r)]
        facts = recompute_facts(mine, counts)
        ranks.append(RankFacts(r, tuple((c, tuple(prof.partition[c])) for c in pl.chunks_on(r)), static, peak,
                               static + peak, cap if limit.includes_static else None,
                               peak <= limit.per_rank[r] * (1 + 1e-9), facts if facts["recomputed"] else {}))
    route = pl.routes[0]
    return SplitFacts(rule, tuple(len(prof.partition[c]) for c in route),
                      tuple(tuple(prof.partition[c]) for c in range(pl.num_chunks)), tuple(ranks))

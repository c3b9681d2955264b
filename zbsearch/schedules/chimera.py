"""Chimera (Li & Hoefler, SC'21, arXiv 2107.06925): two pipelines in opposite directions, each rank holding a
stage of both model replicas.

Placement `ir.dualpipe(p)`, p even: the down pipeline (route 0, chunks 0..p-1) has stage s on rank s, the
up pipeline (route 1, chunks p..2p-1) has stage s on rank p-1-s; the first m/2 microbatches go down, the
other m/2 up. Backwards are full (not split), as in the paper.

The order is the authors' step schedule (their reference scheduler, chimera_pipeline_rank.py): time runs
in steps in which a microbatch moves one stage, forward or backward, so a forward and a backward each take
one step. A basic unit holds p microbatches, p/2 per direction; a direction injects one every two steps,
each goes down its p stages, turns on the last one at once and comes back up. Because p is even, the two
directions never want the same rank in the same step (a rank's forwards of one direction and backwards of
the other fall on steps of one parity, and those two groups never overlap in time). For m > p the units
are directly concatenated: unit k of a direction starts at step 2pk, when unit k-1's first microbatch
has finished, so its forwards fill the previous unit's trailing bubbles. Each rank runs its passes in
step order; the simulator then times them with the profile's costs.

Closed forms (identical stages, comm 0, m = Kp; BW the full backward, hi/lo the larger/smaller of F and
BW): the bubble per rank is (p-2)(hi + (K-1)(hi - lo)). With F = BW that is the paper's (p-2)F, a
bubble fraction of (p-2)/(2m+p-2) for every K; when BW != F the concatenated units leave (p-2)(hi - lo)
of intermediate bubbles each, as the paper notes for direct concatenation. Peak activation memory:
rank r holds p/2 + 1 + min(r, p-1-r) microbatches, p on the middle ranks (the paper's range
[(D/2+1) M_a, D M_a]); each rank keeps two parameter copies.
"""

from __future__ import annotations

from ..core.ir import BW, Action, F, Schedule, build, dualpipe
from ..core.placement import even_ranks
from .spec import BubbleForm, MicrobatchRule, PassTimes, ScheduleSpec, no_comm


def _steps(p: int, m: int) -> dict[tuple[int, int], Action]:
    """Every pass keyed by (rank, step) in the step model; a clash would be a bug (asserted)."""
    half, per_unit = m // 2, p // 2
    slots: dict[tuple[int, int], Action] = {}
    for route in (0, 1):
        for i in range(half):
            start = 2 * p * (i // per_unit) + 2 * (i % per_unit)
            mb = route * half + i
            for j in range(p):
                for step, stage, make in ((start + j, j, F), (start + p + j, p - 1 - j, BW)):
                    rank = stage if route == 0 else p - 1 - stage
                    if (rank, step) in slots:
                        raise AssertionError(f"Chimera steps clash on rank {rank} at step {step} (p={p}, m={m})")
                    slots[(rank, step)] = make(route * p + stage, mb)
    return slots


def chimera(p: int, m: int) -> Schedule:
    """Chimera with direct concatenation: p even ranks, m a multiple of p microbatches (m/2 per direction)."""
    SPEC.require(p, m)
    ranks: list[list[Action]] = [[] for _ in range(p)]
    for (rank, _), action in sorted(_steps(p, m).items()):
        ranks[rank].append(action)
    return build("chimera", dualpipe(p), m, ranks)


def _bubble(p: int, m: int, v: int, t: PassTimes, objective: str) -> BubbleForm:
    failed: list[str] = []
    no_comm(t, failed)
    hi, lo = max(t.F, t.BW), min(t.F, t.BW)
    units = m // p
    return BubbleForm((p - 2) * (hi + (units - 1) * (hi - lo)), "(p-2)(hi + (m/p-1)(hi-lo)), hi/lo = max/min(F, BW)",
                      "identical stages, comm 0; m a multiple of p (direct concatenation of m/p basic units)",
                      failed, p)


SPEC = ScheduleSpec(
    "chimera", "Chimera: two replicas in opposite directions, 1F1B-like steps, full backward; p even",
    chimera, _bubble, peak_memory=lambda p, m, v: float(p), placement="dualpipe", fixed_chunks=2,
    fused_backward=True, param_copies=2, ranks_rule=even_ranks,
    microbatch_rule=lambda p, v: MicrobatchRule(p, p, "m a multiple of p",
                                                "whole basic units of p microbatches, p/2 per direction"),
)
SPECS = (SPEC,)

"""What of a whole-run shape torchtitan and Megatron-LM run as planned, in their own settings, and why not
where they do not (exports.py writes the files). Facts from the trainers' sources, read at:

torchtitan main b5bcd76c (2026-08-21) and 0.3.0 (PyPI; tests/plan/wholerun/test_exports.py loads the config):
- torchtitan/config/configs.py, ParallelismConfig: tensor_parallel_degree, enable_sequence_parallel
  (default True), data_parallel_replicate_degree, data_parallel_shard_degree, fsdp_reshard_after_forward
  ("default", "always", "never"), expert_parallel_degree, context_parallel_degree; TrainingConfig: main
  num_tokens_per_microbatch_per_dp_rank and num_tokens_per_train_step, 0.3 local_batch_size and
  global_batch_size; trainer.py derives the gradient-accumulation steps from them and checks that a
  microbatch's tokens (main) or seq_len (0.3) divide by t under sequence parallelism.
- Data parallelism is FSDP2 alone: models/llama3/parallelize.py applies fully_shard over (dp_replicate,
  fsdp) whatever the degrees, so replicate d with shard 1 is plain replication (ddp);
  distributed/fsdp.py: "default" is "never" under pipelining, "always" without.
- Under pipelining torch's stage (torch/distributed/pipelining/stage.py, torch 2.13,
  backward_maybe_with_nosync) calls set_requires_gradient_sync(False) and set_reshard_after_backward(False)
  until the last backward: gradients stay whole and gathered weights stay gathered between microbatches.
  So fsdp and zero1 are both FSDP2 with "never" (full weights and gradients held, optimizer state sharded,
  one gather and one reduce-scatter a step: docs/whole-run.md costs them alike); zero2 (gradients sharded
  every microbatch) and fsdp-reshard (weights freed after every backward) need more memory there than
  planned: refused. Without pipelining torchtitan's train_step accumulates gradients without no_sync:
  FSDP2 reduces (and, sharded, regathers) on every microbatch: zero2 is "never", fsdp-reshard "always",
  and with m > 1 a note says the data-parallel traffic is m times the plan's (no more memory).
- parallel_dims.py: expert_parallel_degree must divide dp_shard x cp x tp, and EP borrows the
  tensor-parallel ranks: routed experts are sharded over ep whole, not split by t
  (models/common/MOE_SHARDING.md). The plan splits them by t and draws ep from the data-parallel ranks,
  so ep > 1 exports with t = 1 and a sharded data parallelism only.

Megatron-LM main d98e8a64 (2026-08-22):
- --tensor-model-parallel-size, --pipeline-model-parallel-size, --sequence-parallel (store_true),
  --expert-model-parallel-size: megatron/core/model_parallel_config.py's fields, made flags by
  megatron/training/argument_utils.py (ArgumentGroupFactory); expert_tensor_parallel_size defaults to the
  tensor-parallel size, so experts are split by t as planned. --pipeline-model-parallel-layout and
  --use-distributed-optimizer: megatron/training/arguments.py (_add_distributed_args); --micro-batch-size
  and --global-batch-size: megatron/training/config/training_config.py (TrainingConfig).
- ddp is Megatron's DDP (no flag); zero1 and fsdp are --use-distributed-optimizer (optimizer state and
  master weights sharded, gradients whole until one reduce-scatter, weights gathered after the step: what
  both plan); Megatron's own data parallelism shards neither gradients nor weights (that is Megatron-FSDP,
  --use-megatron-fsdp, not checked here): zero2 and fsdp-reshard refused.
- Its order is its own (megatron/core/pipeline_parallel/schedules.py, get_forward_backward_func: 1F1B
  without virtual stages, interleaved 1F1B with them, forward_backward_no_pipelining at p = 1), with
  no_sync until the last microbatch. Where the plan's order is another, Megatron's (zbsearch's 1f1b and
  interleaved-1f1b generators) is simulated on the plan's costs: refused where a rank would need more
  memory than the GPU has, else a note gives its pipeline time against the plan's.
"""

from __future__ import annotations

from dataclasses import replace

from ...core.errors import ScheduleError, ZbsearchError
from ...core.ir import Schedule
from ...core.plan_record import Split
from ...core.planned_profile import for_plan
from ...core.profile import Profile
from ...interop.formats.megatron_recompute import megatron_recompute
from ...interop.formats.torchtitan_plan import TitanDegrees
from ...interop.formats.trainers import check_megatron_placement, megatron_arg_list, shell_line
from ...schedules import generate
from ...sim.validate import check
from .shape import RunShape
from .workload import Workload

GIB = 2**30
# zbsearch's sharding -> torchtitan's fsdp_reshard_after_forward, with a pipeline and without.
TITAN_RESHARD = {True: {"fsdp": "never", "zero1": "never"},
                 False: {"fsdp": "never", "zero1": "never", "zero2": "never", "fsdp-reshard": "always"}}
TITAN_REFUSED = {
    "zero2": "zero2 shards gradients every microbatch, but under pipelining torch's stage syncs them on the last "
             "backward only (set_requires_gradient_sync(False) before it), so torchtitan holds them whole: more "
             "memory than planned; plan fsdp or zero1 for torchtitan",
    "fsdp-reshard": "fsdp-reshard frees the gathered weights after every backward, but under pipelining torch's "
                    "stage keeps them gathered until the last backward (set_reshard_after_backward(False)), so "
                    "torchtitan holds them between microbatches: more memory than planned; plan fsdp for torchtitan",
}
MEGATRON_SHARDING = {"ddp": (), "zero1": ("--use-distributed-optimizer",), "fsdp": ("--use-distributed-optimizer",)}


def titan_degrees(shape: RunShape, workload: Workload) -> tuple[int, str, TitanDegrees]:
    """torchtitan's data_parallel_shard_degree, fsdp_reshard_after_forward and the other degrees for `shape`.

    Raises
    ------
    ZbsearchError
        torchtitan cannot run the shape as planned (see the module).
    """
    pipelined, d, t = shape.p > 1, shape.d, shape.t
    if d == 1 or shape.sharding == "ddp":
        shard, replicate, reshard = 1, d, "default"
    elif shape.sharding in TITAN_RESHARD[pipelined]:
        shard, replicate, reshard = d, 1, TITAN_RESHARD[pipelined][shape.sharding]
    else:
        raise ZbsearchError(TITAN_REFUSED[shape.sharding])
    if t > 1 and workload.seq % t:
        raise ZbsearchError(f"torchtitan's sequence parallelism needs the sequence length {workload.seq} to divide by "
                            f"the tensor-parallel degree {t} (trainer.py); plan another t")
    if shape.ep > 1 and t > 1:
        raise ZbsearchError(f"torchtitan's expert parallelism borrows the tensor-parallel ranks and shards routed "
                            f"experts whole (models/common/MOE_SHARDING.md), but the plan splits them by t = {t} "
                            f"over ep = {shape.ep} data-parallel ranks; plan t = 1 or ep = 1 for torchtitan")
    if shape.ep > 1 and shard == 1:
        raise ZbsearchError(f"torchtitan's expert_parallel_degree must divide data_parallel_shard_degree x tp "
                            f"(parallel_dims.py), 1 under ddp's plain replication; plan a sharded data "
                            f"parallelism for ep = {shape.ep}")
    return shard, reshard, TitanDegrees(t, replicate, shape.ep, workload.global_batch)


def titan_notes(shape: RunShape, partial: dict[int, list[int]]) -> list[str]:
    """Where torchtitan runs the plan within its memory but otherwise than costed, one line each."""
    notes = []
    if shape.p == 1 and shape.m > 1 and shape.d > 1:
        notes.append(f"without a pipeline it accumulates gradients over the {shape.m} microbatches and its FSDP2 "
                     "syncs them (and regathers sharded weights) on every one (trainer.py: no no_sync), not once "
                     "per step as planned: more data-parallel traffic than planned, no more memory")
    if partial:
        notes.append(f"the plan recomputes only some microbatches on stage(s) {', '.join(map(str, partial))}; "
                     "torchtitan recomputes every microbatch of those layers: more time, no more memory")
    return notes


def megatron_own_order(schedule: Schedule) -> Schedule:
    """The order Megatron-LM runs on the schedule's placement: 1F1B, or interleaved 1F1B with v stages a rank,
    with the schedule's plan record (split, recompute, sharding)."""
    p, m = schedule.num_ranks, schedule.num_microbatches
    v = schedule.placement.num_chunks // p
    own = generate("1f1b", p, m) if v == 1 else generate("interleaved-1f1b", p, m, chunks=v)
    return replace(own, plan=schedule.plan)


def _order_note(schedule: Schedule, profile: Profile, usable: float) -> str | None:
    """None where the plan's order is Megatron's; a note with Megatron's own order's time where it fits.

    Raises
    ------
    ScheduleError
        Megatron's own order needs more memory on some rank than the GPU has.
    """
    try:
        own = megatron_own_order(schedule)
    except ZbsearchError as exc:
        return f"it runs its own order, which zbsearch cannot build here ({exc}); the step may differ from the plan"
    if [list(r) for r in own.ranks] == [list(r) for r in schedule.ranks]:
        return None
    planned, theirs = check(schedule, for_plan(profile, schedule)), check(own, for_plan(profile, own))
    if not theirs.ok or theirs.timeline is None or planned.timeline is None:
        problem = "; ".join(theirs.problems) or "no timeline"
        return f"it runs its own {own.name} order, which does not simulate on the plan's costs ({problem})"
    costed = for_plan(profile, own)
    static = costed.static_bytes_per_rank(own.placement) or (0.0,) * own.num_ranks
    peaks = [static[r] + theirs.timeline.peak_memory(r) for r in range(own.num_ranks)]
    worst = max(range(len(peaks)), key=peaks.__getitem__)
    if peaks[worst] > usable:
        raise ScheduleError(f"Megatron-LM runs its own {own.name} order, not the plan's ({schedule.name!r}), and on "
                            f"this split and recompute it needs {peaks[worst] / GIB:.3g} GiB on rank {worst}, more "
                            f"than the {usable / GIB:.3g} GiB usable; plan a 1F1B-family schedule for Megatron-LM")
    ratio = theirs.timeline.makespan / planned.timeline.makespan - 1
    return (f"it runs its own {own.name} order, not the plan's ({schedule.name!r}): on the plan's costs its "
            f"pipeline takes {abs(ratio):.1%} {'longer' if ratio >= 0 else 'less'} than the plan's, within memory "
            f"({peaks[worst] / GIB:.3g} of {usable / GIB:.3g} GiB usable)")


def megatron_line(shape: RunShape, workload: Workload, schedule: Schedule, split: Split, profile: Profile,
                  usable: float, pipelined: bool) -> tuple[str, list[str]]:
    """Megatron-LM's arguments for the plan on one shell-quoted line, and its notes (see the module).
    `schedule`: the plan's, or without a pipeline a one-rank schedule recording the recompute.

    Raises
    ------
    ZbsearchError
        Megatron-LM cannot run the plan as planned.
    """
    if shape.d > 1 and shape.sharding not in MEGATRON_SHARDING:
        raise ZbsearchError(f"{shape.sharding} shards {'gradients' if shape.sharding == 'zero2' else 'weights'} "
                            "over the data-parallel ranks, which Megatron-LM's own data parallelism never does "
                            "(its distributed optimizer shards optimizer state only; Megatron-FSDP is not checked "
                            "here); plan ddp, zero1 or fsdp for Megatron-LM")
    args = ["--tensor-model-parallel-size", str(shape.t)] + (["--sequence-parallel"] if shape.t > 1 else [])
    notes = []
    if pipelined:
        check_megatron_placement(schedule)  # refuses V-shape and two-copy placements
        args += megatron_arg_list(schedule, split)
        order = _order_note(schedule, profile, usable)
        notes += [order] if order is not None else []
    else:
        decoders = sum(kinds.count("decoder") for kinds in split.kinds)
        args += ["--pipeline-model-parallel-size", "1", "--num-layers", str(decoders),
                 *megatron_recompute(schedule, split).flags]
    args += ["--micro-batch-size", str(shape.b), "--global-batch-size", str(workload.global_batch)]
    args += list(MEGATRON_SHARDING.get(shape.sharding, ())) if shape.d > 1 else []
    args += ["--expert-model-parallel-size", str(shape.ep)] if shape.ep > 1 else []
    statement = megatron_recompute(schedule, split).statement
    notes += [statement] if statement is not None else []
    return shell_line(args), notes

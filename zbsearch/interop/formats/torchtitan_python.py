"""The Python config module for torchtitan 0.3 and main: `apply_pipeline(config)` sets on a
`Trainer.Config` everything a plan fixes (torchtitan_plan.TitanPlan).

Per version (0.3.0 from PyPI, read and run in tests/interop/formats/test_torchtitan_run.py; main at
b5bcd76c read, not run):
- 0.3: microbatches are training.local_batch_size / parallelism.pipeline_parallel_microbatch_size (its
  Trainer.__init__); the sequence length is training.seq_len.
- main: parallelism.num_pp_microbatches and training.num_tokens_per_microbatch_per_dp_rank (since
  73aed7f6); the sequence length is training.seq_len, renamed max_context_length later (the file sets
  whichever the config has).
- Both: training.disable_cuda_graphs (the trainer refuses CUDA graphs with pipeline parallelism);
  activation_checkpoint is one policy for every block (None, SelectiveAC.Config, FullAC.Config): the
  file sets None, FullAC.Config (every block recomputed) or None plus a parallelize function that wraps
  the planned blocks with FullAC's own wrapper where torchtitan's parallelize applies its policy; a
  schedule with a split backward swaps FlexAttention (Llama 3's default) for SDPA; the plan's sharding
  sets data_parallel_shard_degree and fsdp_reshard_after_forward.

A whole run (`torchtitan_run_python`, for zbsearch configure's exports, plan/wholerun/exports.py) adds
`apply_plan(config)`: tensor_parallel_degree with enable_sequence_parallel, data_parallel_replicate_degree,
expert_parallel_degree, context_parallel_degree 1 and the global batch (0.3: training.global_batch_size,
sequences; main: training.num_tokens_per_train_step, tokens), after apply_pipeline where the plan pipelines;
without a pipeline it sets pipeline_parallel_degree 1, the microbatch (0.3: training.local_batch_size; main:
training.num_tokens_per_microbatch_per_dp_rank; torchtitan accumulates the gradients of the rest), the
recompute and the sharding, and no pipeline field. Fields read in config/configs.py and trainer.py of both.
"""

from __future__ import annotations

from typing import Sequence

from .torchtitan_plan import TitanDegrees, TitanPlan

# Per version: the lines that set the microbatch, and the field the file checks for first.
_MICROBATCH = {
    "0.3": ["    par.pipeline_parallel_microbatch_size = MICROBATCH_SIZE",
            "    training.local_batch_size = MICROBATCHES * MICROBATCH_SIZE  # one pipeline iteration per rank",
            "    training.seq_len = SEQ_LEN"],
    "main": ["    par.num_pp_microbatches = MICROBATCHES",
             "    training.num_tokens_per_microbatch_per_dp_rank = MICROBATCH_SIZE * SEQ_LEN",
             "    _set_sequence_length(training)"],
}
VERSION_FIELD = {"0.3": "pipeline_parallel_microbatch_size", "main": "num_pp_microbatches"}
_OTHER = {"0.3": "main", "main": "0.3"}

_HELPERS = '''

def _check_version(config):
    if not hasattr(config.parallelism, {field!r}):
        raise ValueError("this config was exported for torchtitan {version}, whose parallelism config has "
                         "{field}; this torchtitan has none: export again with {command} "
                         "--torchtitan {other}")


def _set_sequence_length(training):
    for name in ("seq_len", "max_context_length"):  # main renamed seq_len after b5bcd76c
        if hasattr(training, name):
            setattr(training, name, SEQ_LEN)
            return
    raise ValueError("this torchtitan's training config has neither seq_len nor max_context_length")


def _apply_recompute(config):
    """torchtitan applies one activation-checkpointing policy to every block; run the plan's instead,
    with torchtitan's own wrapper (FullAC) and the wrapper arguments of the config's policy."""
    # torchtitan is imported here, when torchtitan calls apply_pipeline, not when this file is read
    from torchtitan.distributed.activation_checkpoint import FullAC

    previous = config.activation_checkpoint
    same = {{name: getattr(previous, name) for name in ("preserve_rng_state", "determinism_check", "debug")
            if previous is not None and hasattr(previous, name)}}
    full = FullAC.Config(**same)
    config.activation_checkpoint = full if RECOMPUTE_MODE == "full" else None
    if RECOMPUTE_MODE == "planned":
        config.model_spec = _with_planned_recompute(config.model_spec, FullAC(full))


class _PlannedRecompute:
    """An activation-checkpointing config for torchtitan's parallelize: wraps the planned blocks only."""

    def __init__(self, policy):
        self.policy = policy

    def build(self, **kwargs):
        return self

    def apply(self, model):
        chosen = {{name for part in RECOMPUTE_FQNS_PER_MODEL_PART for name in part}}
        layers = model.get_submodule("layers")
        for key, block in list(layers.named_children()):
            if f"layers.{{key}}" in chosen:
                layers.register_module(key, self.policy._wrap_block(block, base_fqn=f"layers.{{key}}"))


def _with_planned_recompute(spec, policy):
    """The model spec whose parallelize function gets _PlannedRecompute as its activation checkpointing:
    torchtitan applies it where it applies its own (after tensor parallelism, before compile and FSDP)."""
    import dataclasses

    parallelize = spec.parallelize_fn

    def parallelize_with_plan(model, **kwargs):
        return parallelize(model, **dict(kwargs, ac_config=_PlannedRecompute(policy)))

    return dataclasses.replace(spec, parallelize_fn=parallelize_with_plan)


def _apply_attention(config):
    """torch's split backward (I, then W) fails on FlexAttention's block mask: torchtitan disables its
    own custom-CSV, ZBV and zero-bubble tests with it. Attention becomes SDPA, causal over the whole
    sequence (packed documents see each other, as in the profile's sdpa attention)."""
    if not SPLIT_BACKWARD:
        return
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention

    for _, _, parent, key in list(config.model_spec.model.traverse(FlexAttention.Config)):
        if isinstance(parent, list):
            parent[key] = ScaledDotProductAttention.Config()
        else:
            setattr(parent, key, ScaledDotProductAttention.Config())


def _apply_sharding(par):
    if SHARD_DEGREE is None:  # the plan assumed no sharded data parallelism: yours stays as it is
        return
    par.data_parallel_shard_degree = SHARD_DEGREE
    par.data_parallel_replicate_degree = 1
    par.fsdp_reshard_after_forward = RESHARD_AFTER_FORWARD
'''


def _rows(parts: list[list[str]]) -> str:
    return "[\n" + "".join(f"    {list(row)!r},\n" for row in parts) + "]"


def _doc(plan: TitanPlan, version: str, header: str, layout: str) -> list[str]:
    return [f'"""{header}', "",
            "Call apply_pipeline on the Trainer.Config your config function returns, in your own config",
            "module, and run torchtitan with --module that_module --config llama3_8b_zbsearch:", "",
            "    from torchtitan.models.llama3.config_registry import llama3_8b",
            "    from this_file import apply_pipeline", "",
            "    def llama3_8b_zbsearch():",
            "        return apply_pipeline(llama3_8b())", "",
            f"Part i is torch's stage i; {layout}. It sets the microbatch the plan was made for",
            f"({plan.micro_batch} x {plan.seq} tokens), {plan.microbatches} microbatches, CUDA graphs off, the "
            "plan's recompute",
            "and nothing else, SDPA attention when the backward is split, and the plan's sharding. For torchtitan",
            f"{_OTHER[version]} export with --torchtitan {_OTHER[version]}, for 0.2 (TOML) with --torchtitan 0.2.",
            '"""']


def _pipeline_constants(plan: TitanPlan) -> list[str]:
    return [f"DEGREE = {plan.degree}", f"SCHEDULE = {plan.schedule!r}  # picks the stages each rank builds; the order "
            "is the CSV's", f"SCHEDULE_CSV = {plan.csv!r}", f"MODULE_FQNS_PER_MODEL_PART = {_rows(plan.parts)}"]


def _constants(plan: TitanPlan, microbatches: str = "") -> list[str]:
    return [
        f"MICROBATCHES = {plan.microbatches}{microbatches}",
        f"MICROBATCH_SIZE = {plan.micro_batch}  # sequences per microbatch, as profiled",
        f"SEQ_LEN = {plan.seq}",
        f"RECOMPUTE_MODE = {plan.recompute_mode!r}  # none, full (every block) or planned (the blocks below)",
        f"RECOMPUTE_FQNS_PER_MODEL_PART = {_rows(plan.recompute)}",
        f"SPLIT_BACKWARD = {plan.split_backward}  # the CSV runs I and W apart",
        f"SHARD_DEGREE = {plan.shard_degree}", f"RESHARD_AFTER_FORWARD = {plan.reshard!r}",
    ]


def _pipeline_body(version: str) -> list[str]:
    return ["", "", "def apply_pipeline(config):",
            '    """Set on a torchtitan Trainer.Config what the plan fixes; returns it."""',
            "    _check_version(config)",
            "    par, training = config.parallelism, config.training",
            "    par.pipeline_parallel_degree = DEGREE",
            "    par.pipeline_parallel_schedule = SCHEDULE",
            "    par.pipeline_parallel_schedule_csv = SCHEDULE_CSV",
            "    par.module_fqns_per_model_part = [list(part) for part in MODULE_FQNS_PER_MODEL_PART]",
            "    par.pipeline_parallel_layers_per_stage = None  # the parts above decide",
            *_MICROBATCH[version],
            "    training.disable_cuda_graphs = True  # torchtitan refuses CUDA graphs with pipeline parallelism",
            "    _apply_recompute(config)", "    _apply_attention(config)", "    _apply_sharding(par)",
            "    return config"]


def torchtitan_python(plan: TitanPlan, version: str, header: str, layout: str) -> str:
    """The config module for torchtitan `version` ("0.3" or "main")."""
    constants = _pipeline_constants(plan) + _constants(plan)
    helpers = _HELPERS.format(field=VERSION_FIELD[version], version=version, other=_OTHER[version],
                              command="zbsearch export")
    return "\n".join(_doc(plan, version, header, layout) + [""] + constants + _pipeline_body(version)) + "\n" + helpers


# A whole run (torchtitan_run_python), per version: a microbatch without pipelining (torchtitan then
# accumulates gradients over GLOBAL_BATCH / (MICROBATCH_SIZE x data-parallel degree) microbatches: 0.3's
# Trainer.__init__ from global_batch_size and local_batch_size, main's from num_tokens_per_train_step and
# num_tokens_per_microbatch_per_dp_rank), and the global batch.
_SINGLE = {
    "0.3": ["    training.local_batch_size = MICROBATCH_SIZE  # one microbatch per gradient-accumulation step",
            "    training.seq_len = SEQ_LEN"],
    "main": ["    training.num_tokens_per_microbatch_per_dp_rank = MICROBATCH_SIZE * SEQ_LEN",
             "    _set_sequence_length(training)"],
}
_GLOBAL = {"0.3": "    training.global_batch_size = GLOBAL_BATCH",
           "main": "    training.num_tokens_per_train_step = GLOBAL_BATCH * SEQ_LEN"}


def _run_doc(plan: TitanPlan, degrees: TitanDegrees, header: str, layout: str | None, notes: Sequence[str]) -> list[str]:
    pipelined = plan.degree > 1
    stages = [f"Part i is torch's stage i; {layout}."] if pipelined and layout else []
    many = f"{plan.microbatches} {'microbatch' if plan.microbatches == 1 else 'microbatches'} per step"
    steps = f"{many} ({'pipelined' if pipelined else 'gradient accumulation; no pipeline'})"
    extra = ", CUDA graphs off, SDPA attention when the backward is split" if pipelined else ""
    sp = " with sequence parallelism" if degrees.tensor > 1 else ""
    return [f'"""{header}', "",
            "Call apply_plan on the Trainer.Config your config function returns, in your own config module,",
            "and run torchtitan with --module that_module --config llama3_8b_zbsearch:", "",
            "    from torchtitan.models.llama3.config_registry import llama3_8b",
            "    from this_file import apply_plan", "",
            "    def llama3_8b_zbsearch():",
            "        return apply_plan(llama3_8b())", "",
            *stages,
            f"It sets the degrees (tensor {degrees.tensor}{sp}, pipeline {plan.degree}, "
            f"data-parallel shard {plan.shard_degree} x replicate {degrees.replicate}, expert {degrees.expert}),",
            f"the microbatch the plan was made for ({plan.micro_batch} x {plan.seq} tokens), {steps},",
            f"the global batch ({degrees.global_batch} sequences), the plan's recompute and sharding{extra}; nothing else.",
            *notes, '"""']


def _run_body(plan: TitanPlan, version: str) -> list[str]:
    if plan.degree > 1:
        start = ["    apply_pipeline(config)", "    par, training = config.parallelism, config.training"]
    else:
        start = ["    _check_version(config)", "    par, training = config.parallelism, config.training",
                 "    par.pipeline_parallel_degree = 1  # no pipeline", *_SINGLE[version],
                 "    _apply_recompute(config)", "    _apply_sharding(par)"]
    return ["", "", "def apply_plan(config):",
            '    """Set on a torchtitan Trainer.Config everything the plan fixes; returns it."""', *start,
            "    par.data_parallel_replicate_degree = REPLICATE_DEGREE",
            "    par.tensor_parallel_degree = TENSOR_PARALLEL_DEGREE",
            "    par.enable_sequence_parallel = True  # the plan's tensor-parallel costs are sequence-parallel",
            "    par.expert_parallel_degree = EXPERT_PARALLEL_DEGREE",
            "    par.context_parallel_degree = 1",
            _GLOBAL[version], "    return config"]


def torchtitan_run_python(plan: TitanPlan, degrees: TitanDegrees, version: str, header: str, layout: str | None,
                          notes: Sequence[str] = ()) -> str:
    """The config module of a whole run for torchtitan `version` ("0.3" or "main"): `apply_plan(config)`
    sets the degrees, the global batch and, through `apply_pipeline` where `plan` pipelines (degree > 1),
    everything torchtitan_python sets; without pipelining, the microbatch, recompute and sharding alone.
    `notes`: lines for the module's docstring."""
    pipelined = plan.degree > 1
    constants = (_pipeline_constants(plan) if pipelined else []) + _constants(
        plan, "" if pipelined else "  # gradient-accumulation steps") + [
        f"TENSOR_PARALLEL_DEGREE = {degrees.tensor}", f"REPLICATE_DEGREE = {degrees.replicate}",
        f"EXPERT_PARALLEL_DEGREE = {degrees.expert}",
        f"GLOBAL_BATCH = {degrees.global_batch}  # sequences per optimizer step"]
    body = (_pipeline_body(version) if pipelined else []) + _run_body(plan, version)
    helpers = _HELPERS.format(field=VERSION_FIELD[version], version=version, other=_OTHER[version],
                              command="zbsearch configure ... --export-dir DIR")
    return "\n".join(_run_doc(plan, degrees, header, layout, notes) + [""] + constants + body) + "\n" + helpers

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
"""

from __future__ import annotations

from .torchtitan_plan import TitanPlan

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
                         "{field}; this torchtitan has none: export again with zbsearch export "
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


def torchtitan_python(plan: TitanPlan, version: str, header: str, layout: str) -> str:
    """The config module for torchtitan `version` ("0.3" or "main")."""
    constants = [
        f"DEGREE = {plan.degree}", f"SCHEDULE = {plan.schedule!r}  # picks the stages each rank builds; the order "
        "is the CSV's",
        f"SCHEDULE_CSV = {plan.csv!r}", f"MODULE_FQNS_PER_MODEL_PART = {_rows(plan.parts)}",
        f"MICROBATCHES = {plan.microbatches}",
        f"MICROBATCH_SIZE = {plan.micro_batch}  # sequences per microbatch, as profiled",
        f"SEQ_LEN = {plan.seq}",
        f"RECOMPUTE_MODE = {plan.recompute_mode!r}  # none, full (every block) or planned (the blocks below)",
        f"RECOMPUTE_FQNS_PER_MODEL_PART = {_rows(plan.recompute)}",
        f"SPLIT_BACKWARD = {plan.split_backward}  # the CSV runs I and W apart",
        f"SHARD_DEGREE = {plan.shard_degree}", f"RESHARD_AFTER_FORWARD = {plan.reshard!r}",
    ]
    body = ["", "", "def apply_pipeline(config):",
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
    helpers = _HELPERS.format(field=VERSION_FIELD[version], version=version, other=_OTHER[version])
    return "\n".join(_doc(plan, version, header, layout) + [""] + constants + body) + "\n" + helpers

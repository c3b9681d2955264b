"""Run an exported torchtitan config inside torchtitan itself (0.3.0), one process per pipeline rank on
the CPU with gloo, and write what torchtitan built to a JSON file: the test (test_torchtitan_run.py)
compares it with the plan.

    python titan_ranks.py CONFIG_FOLDER CONFIG_MODULE CONFIG_FUNCTION WORLD_SIZE OUT.json

torchtitan's own code does the work: ConfigManager.parse_args (tyro, as `--module M --config FN` does),
Trainer.Config's checks, the model spec's config and build, pipeline_llm (stages per rank, the split,
parallelize_llama with its activation checkpointing and FSDP wrapping, the schedule and its CSV). What
the Trainer adds and this does not run: its dataloader and tokenizer (random tokens instead), the
loss wrapper (plain cross-entropy instead), the optimizer step, and CUDA (torchtitan takes "cuda" as its
device type when no accelerator is found; it is set to "cpu" here before anything else is imported).
Imports are inside the functions: pytest collects this file's doctests (it has none) without torch.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _built(schedule, model_parts, stages) -> dict:
    """What one rank built: its stages with their modules, checkpointed blocks and attention."""
    out = []
    for stage, part in zip(stages, model_parts):
        names = [n for n, m in part.named_children() if m is not None and n != "layers"]
        layers = part.get_submodule("layers")
        blocks = [f"layers.{k}" for k in layers.keys()]
        # FSDP's fully_shard subclasses each block it wraps (FSDPCheckpointWrapper): look along the classes
        wrapped = [f"layers.{k}" for k, b in layers.items()
                   if any(c.__name__ == "CheckpointWrapper" for c in type(b).__mro__)]
        attention = sorted({type(m).__name__ for m in part.modules()
                            if type(m).__name__ in ("FlexAttention", "ScaledDotProductAttention", "VarlenAttention")})
        head = [n for n in names if n != "tok_embeddings"]
        modules = [n for n in names if n == "tok_embeddings"] + blocks + head
        out.append({"stage": stage.stage_index, "modules": modules, "checkpointed": wrapped, "attention": attention})
    return {"schedule": type(schedule).__name__, "microbatches": schedule._n_microbatches, "stages": out,
            "order": [[str(a) for a in row if a is not None] for row in
                      [schedule.pipeline_order.get(r, []) for r in range(len(schedule.pipeline_order))]]}


def _rank(rank: int, world: int, port: int, folder: str, module: str, function: str, out_path: str) -> None:
    import torchtitan.tools.utils as titan_utils
    titan_utils.device_type = "cpu"  # torchtitan assumes cuda when it finds no accelerator
    import torchtitan.distributed.parallel_dims as pd
    pd.device_type = "cpu"

    import torch
    import torch.distributed as dist
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.pipeline_parallel import pipeline_llm

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    sys.path.insert(0, folder)
    os.chdir(folder)  # the CSV path is relative to where torchtitan runs
    dist.init_process_group("gloo", rank=rank, world_size=world)
    config = ConfigManager().parse_args(["--module", module, "--config", function])
    config.training.mixed_precision_param = "float32"  # the CPU: not the plan's business
    config._validate_cuda_graphs()
    dims = ParallelDims.from_config(config.parallelism, world)
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    with torch.device("meta"):
        model = model_config.build()
    seen: list[list[int]] = []

    def loss_fn(pred, labels):
        return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten()), None

    schedule, parts, first, last = pipeline_llm(
        model, parallel_dims=dims, training=config.training, parallelism=config.parallelism,
        compile_config=config.compile, ac_config=config.activation_checkpoint, dump_folder=folder,
        device=torch.device("cpu"), model_config=model_config, parallelize_fn=config.model_spec.parallelize_fn,
        loss_fn=loss_fn)
    for part in parts:
        part.to_empty(device="cpu")
        with torch.no_grad():
            part.init_weights(buffer_device=None)
        part.train()
        if part.tok_embeddings is not None:
            part.tok_embeddings.register_forward_pre_hook(lambda m, args: seen.append(list(args[0].shape)))
    stages = schedule._stages
    built = _built(schedule, parts, stages)
    batch = config.training.local_batch_size
    torch.manual_seed(0)
    tokens = torch.randint(0, model_config.vocab_size, (batch, config.training.seq_len))
    losses: list = []
    kwargs = {"target": torch.roll(tokens, -1, 1), "losses": losses} if last else {}
    schedule.step(*((tokens,) if first else ()), **kwargs)
    grads = [p.grad is not None and bool(torch.isfinite(p.grad).all()) for part in parts for p in part.parameters()]
    built.update(rank=rank, microbatch_shapes=seen, losses=[float(x) for x in losses], all_grads=all(grads),
                 batch=[batch, config.training.seq_len], cuda_graphs_disabled=config.training.disable_cuda_graphs,
                 ac_config=type(config.activation_checkpoint).__name__)
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump(built, f)
    dist.destroy_process_group()


def main(argv: list[str]) -> None:
    import torch.multiprocessing as mp
    folder, module, function, world, out_path = argv
    mp.spawn(_rank, args=(int(world), _free_port(), folder, module, function, out_path), nprocs=int(world))
    ranks = []
    for r in range(int(world)):
        with open(f"{out_path}.{r}") as f:
            ranks.append(json.load(f))
    with open(out_path, "w") as f:
        json.dump(ranks, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])

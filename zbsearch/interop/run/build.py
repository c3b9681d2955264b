"""Build the profiled model in a worker process of `zbsearch run`: the chunks a `ModelPlan` names, the
batch of one iteration and the loss. Every process builds the same weights from one seed: the GPT's layers
are seeded one by one (as the profiler builds them), a factory is called after `torch.manual_seed(seed)`.
torch is imported only when a function runs.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Callable, Sequence

from .model import ModelPlan
from ...profiling.request import GptShape

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from ...profiling.recompute_once import Frames, Switch


def _dtype(torch: ModuleType, name: str) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _layers(plan: ModelPlan, seed: int) -> tuple[dict[str, Callable[[], torch.nn.Module]], torch.Tensor]:
    """Builders of the model's layers by name, and the sample input of one microbatch."""
    import torch

    # defers torch: a run without it fails with the install hint first
    from ...profiling.models import gpt_layers, load_factory

    if plan.kind == "gpt":
        shape = GptShape(**{k: v for k, v in plan.spec.items() if k != "attention"})
        specs, sample = gpt_layers(shape, plan.spec.get("attention", "naive"), seed)
    else:
        sys.path.extend(x for x in plan.sys_path if x not in sys.path)
        torch.manual_seed(seed)
        specs, sample = load_factory(plan.spec)
    return dict(specs), sample


def build_profiled(plan: ModelPlan, m: int, seed: int, device: torch.device, wanted: set[int]
                   ) -> tuple[list[torch.nn.Module | None], torch.Tensor, torch.Tensor,
                              Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """(chunks, inputs, targets, loss_fn): the chunks in `wanted` as nn.Sequentials on `device` in the
    plan's dtype (None for the others, which are never built), the inputs of m microbatches, placeholder
    targets (the loss needs none) and the loss.

    The loss is the last layer's output when it is one number (the GPT's head computes its cross-entropy
    itself), else the mean square of that output in float32.
    """
    import torch

    builders, sample = _layers(plan, seed)
    dtype = _dtype(torch, plan.dtype)
    chunks: list[torch.nn.Module | None] = []
    for c, names in enumerate(plan.chunks):
        if c not in wanted:
            chunks.append(None)
            continue
        layers = [builders[x]() for x in names]
        if c == len(plan.chunks) - 1:
            layers.append(_at_least_1d())
        chunks.append(torch.nn.Sequential(*layers).to(device=device, dtype=dtype))
    x = make_inputs(torch, sample, m, seed).to(device)
    if x.is_floating_point():
        x = x.to(dtype)
    return chunks, x, torch.zeros(m, device=device), loss_of_output


def recompute_layers(plan: ModelPlan, chunks: Sequence[torch.nn.Module | None],
                     mine: Sequence[int]) -> tuple[dict[int, Switch], Frames]:
    """Wrap the layers the plan recomputes in this rank's chunks (`mine`) in place, each at its level
    (profiling/recompute_once.py). Returns one switch per chunk that has recomputed layers, for the caller
    to set before each forward, and the frames, which hold what they keep (for the memory probe)."""
    import torch

    # defers torch: a run without it fails with the install hint first
    from ...profiling.recompute_once import Frames, Switch, wrap

    levels, frames = dict(plan.recompute), Frames()
    switches: dict[int, Switch] = {}
    for c in mine:
        chunk = chunks[c]
        assert isinstance(chunk, torch.nn.Sequential)  # build_profiled builds each of this rank's chunks as one
        for i, name in enumerate(plan.chunks[c]):
            if name in levels:
                switch = switches.setdefault(c, Switch())
                chunk[i] = wrap(chunk[i], name, levels[name], switch, frames)
    return switches, frames


def _at_least_1d() -> torch.nn.Module:
    import torch

    class AtLeast1d(torch.nn.Module):
        """A scalar output (a loss) as shape (1,): torch's runtime concatenates the last stage's outputs."""

        def forward(self, x: Tensor) -> Tensor:
            return x.reshape(1) if x.dim() == 0 else x

    return AtLeast1d()


def make_inputs(torch: ModuleType, sample: torch.Tensor, m: int, seed: int) -> torch.Tensor:
    """m microbatches shaped like `sample` (batch on dim 0), identical in every process: integer ids
    drawn from the sample's range, floats from a normal distribution, anything else repeated."""
    g = torch.Generator().manual_seed(seed + 1)
    shape = (m * sample.shape[0], *sample.shape[1:]) if sample.dim() else (m,)
    if sample.is_floating_point():
        return torch.randn(shape, generator=g, dtype=sample.dtype)
    if sample.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8) and sample.numel():
        low, high = int(sample.min()), int(sample.max()) + 1
        return torch.randint(low, high, shape, generator=g, dtype=sample.dtype)
    return torch.cat([sample.reshape(-1, *sample.shape[1:])] * m) if sample.dim() else sample.repeat(m)


def loss_of_output(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The loss of one microbatch (the target is a placeholder)."""
    if output.numel() == 1:
        return output.sum()  # a new tensor: torch detaches the loss in place, which a view refuses
    return output.float().pow(2).mean()

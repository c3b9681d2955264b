"""What the profiler's measurements share: torch's split backward (the functions its pipeline runtime runs
for I and W) and one layer prepared on the device (measure.py times it, measure_kept.py and
measure_recompute.py measure more of it). Importing this module needs torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch
from torch import nn

PASSES = ("F", "B", "W", "full_backward")
Grads = tuple[torch.Tensor | None, ...]  # one gradient per input or parameter, None where it got none
ParamGroups = list[dict[str, Any]]  # torch's own records of I's intermediates, handed back to W as they are


class SplitBackward(NamedTuple):
    """torch's split backward: the code paths its pipeline runtime runs for the fused backward, I and W."""

    full: Callable[..., Grads]
    input: Callable[..., tuple[Grads, ParamGroups]]
    weight: Callable[..., Grads]


@dataclass
class LayerRun:
    """One layer on the device with its real input: everything needed to measure it again and again."""

    name: str
    mod: nn.Module
    x: torch.Tensor
    params: list[torch.nn.Parameter]
    out_grads: list[torch.Tensor | None]  # the gradient arriving from the next layer
    next_input: torch.Tensor
    memory: dict[str, float] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in PASSES})
    recompute: list[dict[str, Any]] = field(default_factory=list)  # its options (measure_recompute.py)

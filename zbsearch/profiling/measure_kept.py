"""What torch's pipeline runtime keeps after W on the chunk that computes the loss.

torch.distributed.pipelining keeps every microbatch's loss until the step ends (and every other stage's
output, through its send), and with it the part of the chunk's autograd graph that its weight step
(stage_backward_weight) does not free: the saved tensors of nodes on the input-gradient path only. On
the loss chunk how much that is depends on the whole chunk's graph, not on each layer alone, so it is
measured on chains: for every i >= 1, layers i..n-1 run as one chunk (F, I and W as the runtime runs
them, the loss kept), and the bytes the graph still holds after W are kept(i). Layer i's
`mem_kept_loss_torch` is kept(i) - kept(i + 1), so that a loss chunk of layers i..n-1, any such suffix,
keeps exactly the sum over its layers. Layer 0 gets 0: a chunk that starts with it has no input
gradient, and torch runs its whole backward at once. On a CPU only (saved-tensor hooks); needs every
layer resident. Importing this module needs torch.
"""

from __future__ import annotations

import weakref
from typing import Sequence

import torch

from .layer_run import LayerRun, SplitBackward


class _Held:
    """A saved tensor as the autograd graph keeps it: alive exactly as long as the graph holds it."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _loss(out: torch.Tensor) -> torch.Tensor:
    """The loss as zbsearch run computes it from a chunk's output (run_build.loss_of_output)."""
    return out.reshape(1).sum() if out.numel() == 1 else out.float().pow(2).mean()


def _kept_after_w(runs: Sequence[LayerRun], backward: SplitBackward) -> float:
    """Bytes the graph of one chain (runs[0]'s input through the last layer, then the loss) still holds
    after I and W, with the loss still referenced."""
    static = {p.untyped_storage().data_ptr() for run in runs for p in list(run.mod.parameters()) + list(run.mod.buffers())}
    sizes: dict[int, int] = {}
    refs: dict[int, list[weakref.ref[_Held]]] = {}

    def pack(t: torch.Tensor) -> _Held:
        held = _Held(t)
        storage = t.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in static:
            sizes[storage.data_ptr()] = storage.nbytes()
            refs.setdefault(storage.data_ptr(), []).append(weakref.ref(held))
        return held

    x = runs[0].x.detach().requires_grad_(True)
    params = [p for run in runs for p in run.params]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda held: held.tensor):
        out = x
        for run in runs:
            out = run.mod(out)
        loss = _loss(out)
    del out
    _, groups = backward.input([loss], [None], [x], iter(params))
    backward.weight(iter(params), groups)
    del groups
    kept = sum(sizes[p] for p, rs in refs.items() if any(r() is not None for r in rs))
    del loss
    for p in params:
        p.grad = None
    return float(kept)


def measure_kept(prepared: Sequence[LayerRun], backward: SplitBackward) -> None:
    """Set `memory["mem_kept_loss_torch"]` on every prepared layer run (measure.LayerRun), in model order."""
    n = len(prepared)
    kept = [0.0] * (n + 1)
    for i in range(n - 1, 0, -1):
        if prepared[i].x.is_floating_point():
            kept[i] = _kept_after_w(prepared[i:], backward)
    for i, run in enumerate(prepared):
        run.memory["mem_kept_loss_torch"] = 0.0 if i == 0 else max(0.0, kept[i] - kept[i + 1])

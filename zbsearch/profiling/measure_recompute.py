"""Measure a layer's recompute options on torch, with the recompute-once wrapper the run executes
(recompute_once.py): `full` (only the layer's input kept) on every layer whose input takes a gradient,
and `selective` (the attention core) on the built-in decoders' blocks (the GPT's, decoder_models') with naive
attention.

Per option, as core/recompute/options.py defines them: `mem_B`, the bytes held from F until I (the kept inputs
plus, for selective, what the rest of the layer saves); `mem_W`, the bytes held from I until W under
torch's split backward (the rebuilt activations I keeps for W plus the output gradients it stores for
W); `time`, what I pays extra (the median I with the option less the layer's median I, at least 0; W
does not recompute again); `peak`, the most held while I recomputes: on a GPU the allocator's peak over
I, on a CPU (no allocator to ask) `mem_W`, which I builds up to. On a CPU the bytes are distinct
non-parameter storages (saved-tensor hooks and the wrapper's frames); on a GPU the allocator's growth
over the layer's input. Units: microseconds and bytes. Importing this module needs torch.
"""

from __future__ import annotations

import statistics
import weakref
from typing import Any, Callable, Protocol, TypeVar

import torch

from ..core.errors import RunError
from .graph_memory import needed_for_W, storage_key
from .layer_run import LayerRun, SplitBackward
from .recompute_once import Frames, Switch, wrap

R = TypeVar("R")


class Timer(Protocol):
    """measure.py's timer: the elapsed microseconds of a call, and what it returned."""

    def __call__(self, fn: Callable[[], R]) -> tuple[float, R]: ...


def levels_of(mod: torch.nn.Module, x: torch.Tensor) -> list[str]:
    """The recompute levels a layer can be measured at: none for a layer whose input takes no gradient
    (the first, on token ids: torch runs its whole backward in W)."""
    if not x.requires_grad:
        return []
    naive = callable(getattr(mod, "attend", None)) and getattr(mod, "attention", None) == "naive"
    return ["selective", "full"] if naive else ["full"]


class _Held:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _cuda_now(device: torch.device) -> int:
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


def _memory(run: LayerRun, level: str, backward: SplitBackward, device: torch.device) -> dict[str, float]:
    """mem_B, mem_W and peak of one option (see the module docstring)."""
    mod, x = run.mod, run.x
    static = {storage_key(t)[0] for t in list(mod.parameters()) + list(mod.buffers())}
    frames, refs = Frames(), []  # refs: (storage, weak reference to what the graph keeps) per saved tensor
    layer = wrap(mod, run.name, level, Switch(), frames)

    def pack(t: torch.Tensor) -> _Held:  # what the layer saves outside the recomputed part (selective)
        held = _Held(t)
        refs.append((storage_key(t), weakref.ref(held)))
        return held

    def held(extra: dict[int, int]) -> float:
        keys = [key for key, r in refs if r() is not None] + [storage_key(t) for t in frames.tensors()]
        found = {**extra, **{ptr: nbytes for ptr, nbytes in keys if nbytes and ptr not in static}}
        return float(sum(found.values()))

    cuda = device.type == "cuda"
    try:
        before = _cuda_now(device) if cuda else 0
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda h: h.tensor):
            out = layer(x)
        # on a GPU: the growth over F, less the output (handed on), plus the input, allocated before F but
        # held for the backward (the full wrapper keeps it; a block's first norm saves it)
        grown = _cuda_now(device) - before - storage_key(out)[1] + storage_key(x)[1] if cuda else 0
        result = {"mem_B": float(max(grown, 0)) if cuda else held({})}
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        _, groups = backward.input([out], run.out_grads, [x], iter(run.params))
        _, grads = needed_for_W(groups, static)
        if cuda:
            result["mem_W"] = float(max(_cuda_now(device) - before, 0))
            result["peak"] = float(max(torch.cuda.max_memory_allocated(device) - before, 0))
        else:
            result["mem_W"] = result["peak"] = held(grads)
        backward.weight(iter(run.params), groups)
        del groups, out
    finally:
        if level == "selective":
            setattr(mod, "core_wrapper", None)  # setattr: an attribute of the block's own, not of nn.Module
        for p in run.params:
            p.grad = None
        x.grad = None
    return result


def _extra_time(run: LayerRun, level: str, timer: Timer, backward: SplitBackward, warmup: int, runs: int) -> float:
    """The median I with the option, less the layer's median I (never below 0)."""
    layer = wrap(run.mod, run.name, level, Switch())
    times: list[float] = []
    try:
        for i in range(runs):
            out = layer(run.x)
            t_i, (_, groups) = timer(lambda: backward.input([out], run.out_grads, [run.x], iter(run.params)))
            backward.weight(iter(run.params), groups)
            del groups, out  # free the graph
            run.x.grad = None
            if i >= warmup:
                times.append(t_i)
    finally:
        if level == "selective":
            setattr(run.mod, "core_wrapper", None)  # setattr: an attribute of the block's own, not of nn.Module
        for p in run.params:
            p.grad = None
    return max(0.0, statistics.median(times) - statistics.median(run.samples["B"]))


def measure_options(run: LayerRun, timer: Timer, backward: SplitBackward, device: torch.device, warmup: int,
                    runs: int) -> list[dict[str, Any]]:
    """The recompute options of one measured layer (measure.LayerRun, its passes already timed), as a
    profile's `recompute` list; only options that hold less from F until I than the layer does, and none
    for a layer whose recompute does not save what its forward saved (data-dependent control flow)."""
    options = []
    for level in levels_of(run.mod, run.x):
        try:
            memory = _memory(run, level, backward, device)
        except (RunError, RuntimeError) as exc:  # torch's I wraps what its hooks raise in a RuntimeError
            if not isinstance(exc, RunError) and not isinstance(exc.__cause__, RunError):
                raise
            continue  # its recompute saves other tensors than its forward: the layer cannot be recomputed
        if memory["mem_B"] >= run.memory["mem_B"]:
            continue
        time = _extra_time(run, level, timer, backward, warmup, runs)
        options.append({"level": level, "time": time, "pays": "I", **memory})
    return options

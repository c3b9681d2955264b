"""What a worker of `zbsearch run` can measure besides pass times: the activation memory torch's runtime
holds (the message ping-pong is profiling/distributed.py's, shared with the profiler).

Memory, on a CPU: the bytes of the distinct tensors (by storage) that the runtime keeps for backward
passes still to come, sampled after every action of one untimed step: the tensors autograd saved
(saved-tensor hooks) while the graph still holds them (each is packed into a holder object whose
lifetime is the graph's, so a tensor that something else keeps alive, such as a receive buffer the
runtime reuses, stops counting when its graph lets it go), the stage's forward cache (its inputs and outputs kept for
the backward) and its backward state (what I keeps for W: the stage output, the gradients it received
and the intermediate gradients stored for the weight step). Parameters and buffers are left out. On a
GPU: the allocator's peak over the step (torch.cuda.max_memory_allocated) above what was allocated
when it started, so transients inside a pass are included there.

torch is passed in by the worker; nothing here imports it at module level.
"""

from __future__ import annotations

import weakref
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

if TYPE_CHECKING:
    import torch
    from torch.distributed.pipelining import PipelineStage


def _tensors(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Every tensor inside nested tuples, lists and dicts (a stage's caches), a few levels deep."""
    if depth > 6:
        return
    if hasattr(value, "untyped_storage"):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v, depth + 1)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v, depth + 1)


class _Held:
    """A saved tensor as the autograd graph keeps it: alive exactly as long as the graph holds it."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _key(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


class MemoryProbe:
    """Tracks the activation bytes one rank's stages hold, as a peak over the samples (see the module
    docstring). Use `hooks()` around the step and call `sample()` after every action."""

    def __init__(self, torch: ModuleType, stages: Sequence[PipelineStage], device: torch.device,
                 recomputed: Callable[[], Iterable[torch.Tensor]] | None = None) -> None:
        self.torch, self.stages, self.cuda = torch, list(stages), device.type == "cuda"
        # recomputed layers keep their tensors away from autograd's saved-tensor hooks (a probe's hooks
        # do not see inside theirs): what they hold, asked at every sample
        self.recomputed = recomputed
        self.static = {_key(t)[0] for st in self.stages for t in list(st.submod.parameters()) + list(st.submod.buffers())}
        self.saved: dict[int, tuple[int, list[weakref.ref[_Held]]]] = {}
        self.peak = 0.0
        self.start = 0.0

    def _pack(self, t: torch.Tensor) -> _Held:
        held = _Held(t)
        ptr, nbytes = _key(t)
        if nbytes and ptr not in self.static:
            refs = self.saved.setdefault(ptr, (nbytes, []))[1]
            refs.append(weakref.ref(held))
        return held

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
            self.start = float(self.torch.cuda.memory_allocated())
        return self.torch.autograd.graph.saved_tensors_hooks(self._pack, lambda held: held.tensor)

    def held(self) -> float:
        """Bytes held now: saved tensors still alive plus the stages' caches, each storage once."""
        found: dict[int, int] = {}
        for ptr, (nbytes, refs) in list(self.saved.items()):
            alive = [r for r in refs if r() is not None]
            if alive:
                found[ptr] = nbytes
                refs[:] = alive
            else:
                del self.saved[ptr]
        caches = [t for st in self.stages for cache in (st.fwd_cache, st.backward_state) for t in _tensors(cache)]
        for t in caches + list(self.recomputed() if self.recomputed is not None else ()):
            ptr, nbytes = _key(t)
            if nbytes and ptr not in self.static:
                found[ptr] = nbytes
        return float(sum(found.values()))

    def sample(self) -> None:
        if not self.cuda:
            self.peak = max(self.peak, self.held())

    def finish(self) -> float:
        """The step's peak in bytes."""
        if self.cuda:
            self.torch.cuda.synchronize()
            self.peak = float(self.torch.cuda.max_memory_allocated()) - self.start
        return self.peak

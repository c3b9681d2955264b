"""Activation recompute that runs a layer's forward again once per microbatch, also under torch's split
backward.

torch.utils.checkpoint (non-reentrant) recomputes once per distinct backward call (pytorch#166536): torch's
pipelining runtime runs I (`stage_backward_input`, which keeps the graph for W) and W
(`stage_backward_weight`) as two calls, so a checkpointed layer would run its forward in I and again in W.
Here the forward keeps only the layer's inputs; every tensor autograd would save is replaced by a small
handle (saved-tensor hooks). The first time a backward needs one of them, the layer's forward runs again
(same RNG state) with its own saved-tensor hooks capturing what it saves, in order; each rebuilt tensor
then lives as long as its handle, which autograd frees with the saved variable that holds it (W frees
those of the nodes it runs; the nodes only I runs keep theirs until the graph goes, as without
recompute). So I rebuilds them, W reuses them, and the layer holds its input from F until I and its
rebuilt activations from I until W, as the profile's `full` option says (core/recompute/options.py).

`full` wraps a whole layer (`RecomputeOnce`); `selective` wraps the attention core of a built-in decoder's
block (models.Block.attend, decoder_models.DecoderBlock.attend) with the same mechanism. A `Switch` per chunk says whether the forward running
now recomputes, so a run can recompute some microbatches and not others. Autocast is not recorded: the
recompute runs under the autocast state of the backward (runs here convert the model to its dtype instead).
Importing this module needs torch.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterator, TypeVar

import torch
from torch import nn

from ..core.errors import RunError

LEVELS = ("full", "selective")
R = TypeVar("R")


class Switch:
    """Whether the forwards of one chunk recompute now (set per microbatch by whoever runs the chunk)."""

    __slots__ = ("on",)

    def __init__(self, on: bool = True) -> None:
        self.on = on


class Frames:
    """The frames of one set of wrapped layers still alive (their graph not freed), for a memory probe."""

    def __init__(self) -> None:
        self.alive: weakref.WeakSet[_Frame] = weakref.WeakSet()
        self.recomputes = 0  # forwards run again, all frames together

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor the live frames hold: the kept inputs until the recompute, then the rebuilt
        activations whose handles autograd still holds."""
        for frame in list(self.alive):
            yield from (t for t in frame.inputs if isinstance(t, torch.Tensor))
            yield from (t for t in frame.rebuilt or () if t is not None)


class _Frame:
    """One forward of a wrapped function: its inputs, RNG state and what its recompute rebuilds."""

    __slots__ = ("fn", "name", "inputs", "grads", "rng", "shapes", "rebuilt", "dropped", "frames", "__weakref__")

    def __init__(self, fn: Callable[..., Any], name: str, args: tuple[Any, ...], frames: Frames | None) -> None:
        self.fn, self.name, self.frames = fn, name, frames
        self.inputs = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
        self.grads = tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        cuda = sorted({a.device.index or 0 for a in args if isinstance(a, torch.Tensor) and a.is_cuda})
        self.rng = (torch.get_rng_state(), [(d, torch.cuda.get_rng_state(d)) for d in cuda])
        self.shapes: list[tuple[torch.Size, torch.dtype]] = []  # (shape, dtype) of every tensor the forward saved, in order
        self.rebuilt: list[torch.Tensor | None] | None = None
        self.dropped: set[int] = set()  # saved tensors whose handle autograd has freed
        if frames is not None:
            frames.alive.add(self)

    def pack(self, t: torch.Tensor) -> _Handle:
        self.shapes.append((t.shape, t.dtype))
        return _Handle(self, len(self.shapes) - 1)

    def drop(self, index: int) -> None:
        self.dropped.add(index)
        if self.rebuilt is not None:
            self.rebuilt[index] = None

    def unpack(self, index: int) -> torch.Tensor:
        if self.rebuilt is None:
            rebuilt: list[torch.Tensor | None] = list(self.rebuild())
            for k in self.dropped:
                rebuilt[k] = None
            self.rebuilt, self.inputs = rebuilt, ()  # the inputs served their purpose
        t = self.rebuilt[index]
        assert t is not None, "autograd unpacked a saved tensor whose handle it had freed"
        return t

    def rebuild(self) -> list[torch.Tensor]:
        """Run the forward again (same RNG state, grad enabled) and capture what it saves, in order."""
        out: list[torch.Tensor] = []

        def capture(t: torch.Tensor) -> int:
            out.append(t.detach())
            return len(out) - 1

        cpu, cuda = self.rng
        args = [a.detach().requires_grad_(g) if isinstance(a, torch.Tensor) else a
                for a, g in zip(self.inputs, self.grads)]
        with torch.random.fork_rng(devices=[d for d, _ in cuda]), torch.enable_grad(), \
                torch.autograd.graph.saved_tensors_hooks(capture, out.__getitem__):
            torch.set_rng_state(cpu)
            for d, state in cuda:
                torch.cuda.set_rng_state(state, d)
            self.fn(*args)
        got = [(t.shape, t.dtype) for t in out]
        if got != self.shapes:
            first = next((k for k, (a, b) in enumerate(zip(got, self.shapes)) if a != b), min(len(got), len(self.shapes)))
            raise RunError(f"recomputing {self.name}: its forward saved {len(self.shapes)} tensors for the backward but "
                           f"its recompute saved {len(got)}, differing from tensor {first} on: the layer does not "
                           "save the same tensors each time it runs (data-dependent control flow?); run it without "
                           "recompute")
        if self.frames is not None:
            self.frames.recomputes += 1
        return out


class _Handle:
    """What autograd keeps instead of a saved tensor: freed with the saved variable that holds it."""

    __slots__ = ("frame", "index")

    def __init__(self, frame: _Frame, index: int) -> None:
        self.frame, self.index = frame, index

    def __del__(self) -> None:
        self.frame.drop(self.index)


def _unpack(handle: _Handle) -> torch.Tensor:
    return handle.frame.unpack(handle.index)


def once(fn: Callable[..., R], *args: Any, name: str = "a layer", frames: Frames | None = None) -> R:
    """`fn(*args)`, keeping only `args` for the backward: the first backward that needs a saved tensor
    runs `fn` again and every later one reuses what that recompute saved (see the module docstring).
    Without grad mode it is `fn(*args)`."""
    if not torch.is_grad_enabled():
        return fn(*args)
    frame = _Frame(fn, name, args, frames)
    with torch.autograd.graph.saved_tensors_hooks(frame.pack, _unpack):
        return fn(*args)


class RecomputeOnce(nn.Module):
    """A layer at `full` recompute: its forward through `once` while its switch is on."""

    def __init__(self, layer: nn.Module, name: str, switch: Switch, frames: Frames | None = None) -> None:
        super().__init__()
        self.layer, self.name, self.switch, self.frames = layer, name, switch, frames

    def forward(self, *args: Any) -> Any:
        if not self.switch.on:
            return self.layer(*args)
        return once(self.layer, *args, name=self.name, frames=self.frames)


def recompute_core(block: nn.Module, name: str, switch: Switch, frames: Frames | None = None) -> None:
    """The block at `selective` recompute: its attention core (models.Block.attend) through `once` while
    the switch is on; the rest of the block keeps its activations."""
    def run(attend: Callable[..., Any], *args: Any) -> Any:
        if not switch.on:
            return attend(*args)
        return once(attend, *args, name=f"{name} (attention core)", frames=frames)

    # setattr: `block` is any module with an attention core (models.Block's core_wrapper), not a type
    setattr(block, "core_wrapper", run)


def wrap(layer: nn.Module, name: str, level: str, switch: Switch, frames: Frames | None = None) -> nn.Module:
    """`layer` recomputed at `level` (full: the whole layer; selective: the attention core of a block that
    has one, `attend`); the module to put in its place.

    Raises
    ------
    RunError
        `level` is not full or selective, or selective on a layer without an attention core to wrap.
    """
    if level == "full":
        return RecomputeOnce(layer, name, switch, frames)
    if level != "selective":
        raise RunError(f"recompute level {level!r} of layer {name} is not known: use one of {', '.join(LEVELS)}")
    if not hasattr(layer, "attend") or getattr(layer, "attention", "naive") != "naive":
        raise RunError(f"layer {name} ({type(layer).__name__}) has no unfused attention core to recompute at "
                       "selective (only the built-in decoders' blocks with naive attention have one): use full")
    recompute_core(layer, name, switch, frames)
    return layer

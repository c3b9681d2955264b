"""Measure every layer of a torch model on a device: F, B (torch's I), W, the fused backward, M_B and M_W.

Per layer, F (forward), B (gradient with respect to the layer's input, torch's I) and W (gradient with
respect to its parameters) run as separate passes, through the same functions torch's pipeline runtime
uses for I and W (`stage_backward_input`, `stage_backward_weight`), and the fused full backward runs
as a check. Each pass runs `warmup` times untimed, then `repeats` times; the median is kept. Timing
uses CUDA events on a GPU and `time.perf_counter` on a CPU.

Memory: M_B, the activation bytes a microbatch holds from F until B, and M_W, the bytes still needed
from B until W (the inputs of the parameter-using operations plus the output gradients B stored for W).

Units: times in microseconds, memory in bytes. Importing this module needs torch.
"""

from __future__ import annotations

import statistics
import time
import weakref
from typing import Callable, Sequence, TypeVar

import torch
from torch import nn

from ..core.errors import DependencyError, ProfilerError
from .costs import LayerCost
from .hardware import default_dtype, one_line, resolve_device, torch_dtype
from .layer_run import PASSES, LayerRun, SplitBackward
from .models import LayerSpec, describe_tensor
from .request import MeasureRequest, Progress
from .graph_memory import needed_for_W, storage_key
from .measure_kept import measure_kept
from .measure_recompute import measure_options

R = TypeVar("R")


def torch_backward_functions() -> SplitBackward:
    """torch.distributed.pipelining's backward functions, or a DependencyError when this torch lacks them."""
    try:
        from torch.distributed.pipelining._backward import (
            stage_backward, stage_backward_input, stage_backward_weight,
        )
    except ImportError as exc:
        raise DependencyError(f"this torch build lacks torch.distributed.pipelining ({one_line(exc)}); "
                              "install torch 2.4 or newer with distributed support") from None
    return SplitBackward(stage_backward, stage_backward_input, stage_backward_weight)


class _Timer:
    """Elapsed microseconds of one call: CUDA events on a GPU, perf_counter on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], R]) -> tuple[float, R]:
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1000.0, out
        t0 = time.perf_counter()
        out = fn()
        return (time.perf_counter() - t0) * 1e6, out


def _clear(params: Sequence[torch.Tensor], x: torch.Tensor) -> None:
    for prm in params:
        prm.grad = None
    if getattr(x, "grad", None) is not None:
        x.grad = None


def _cuda_allocated(device: torch.device) -> int:
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


class _Held:
    """A saved tensor as the autograd graph keeps it: alive exactly as long as the graph holds it."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def measure_memory(run: LayerRun, device: torch.device, backward: SplitBackward) -> dict[str, float]:
    """M_B, M_W, what torch's own split keeps from I to W, and what stays after W while the layer's
    output is still referenced, of one layer, in bytes.

    On a CPU, M_B is the bytes of the distinct non-parameter tensors saved for backward; on a GPU, the
    allocator's growth over F, less the output (handed on), plus the input when it is saved.
    """
    mod, x = run.mod, run.x
    static = {storage_key(t)[0] for t in list(mod.parameters()) + list(mod.buffers())}
    saved: dict[int, list[weakref.ref[_Held]]] = {}
    sizes: dict[int, int] = {}

    def pack(t: torch.Tensor) -> _Held:
        held = _Held(t)
        ptr, nbytes = storage_key(t)
        if nbytes and ptr not in static:
            sizes[ptr] = nbytes
            saved.setdefault(ptr, []).append(weakref.ref(held))
        return held

    def alive() -> dict[int, int]:
        return {ptr: sizes[ptr] for ptr, refs in saved.items() if any(r() is not None for r in refs)}

    cuda = device.type == "cuda"
    before = _cuda_allocated(device) if cuda else 0
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda held: held.tensor):
        out = mod(x)
    result: dict[str, float] = {"mem_B": float(sum(sizes.values()))}
    if cuda:
        delta = _cuda_allocated(device) - before
        out_ptr, out_bytes = storage_key(out)
        if out_ptr not in sizes:
            delta -= out_bytes  # the output is handed on, not held for this layer's backward
        x_ptr, x_bytes = storage_key(x)
        if x_ptr in sizes:
            delta += x_bytes  # the saved input was allocated before F but is held for B all the same
        result = {"mem_B_saved_tensors": result["mem_B"], "mem_B": float(max(delta, 0))}
    if not out.requires_grad:
        result["mem_W"] = 0.0
        return result
    if not x.requires_grad:  # nothing to send back: the whole backward is W, everything is held until then
        result["mem_W"] = result["mem_W_torch_runtime"] = result["mem_B"]
        result["mem_kept_torch"] = 0.0  # torch runs the first stage's whole backward at once: all freed
        return result
    _, groups = backward.input([out], run.out_grads, [x], iter(run.params))
    needed, grads = needed_for_W(groups, static)
    result["mem_W"] = float(sum({**needed, **grads}.values()))
    result["mem_W_torch_runtime"] = float(sum({**alive(), **grads}.values()))
    if cuda:
        result["mem_W_torch_runtime"] = float(max(_cuda_allocated(device) - before, 0))
    backward.weight(iter(run.params), groups)
    del groups
    # torch's runtime keeps each stage output referenced (its send) until the step ends, and with it what
    # of the graph W did not free: the layer's share of that, measured alone (measure_kept.py: the loss chunk)
    result["mem_kept_torch"] = float(sum(alive().values()))
    if cuda:
        result["mem_kept_torch"] = float(max(_cuda_allocated(device) - before - storage_key(out)[1], 0))
    del out
    return result


def _prepare(name: str, mod: nn.Module, x: torch.Tensor, device: torch.device, backward: SplitBackward) -> LayerRun:
    """Check the layer runs on x, then size its memory; its output is the next layer's input."""
    x = x.detach()
    if x.is_floating_point():
        x.requires_grad_(True)
    params = [prm for prm in mod.parameters() if prm.requires_grad]
    try:
        out = mod(x)
    except Exception as exc:
        raise ProfilerError(f"layer {name} ({type(mod).__name__}) failed on its input, a {describe_tensor(x)}: "
                            f"{one_line(exc)}; the sample input (or the previous layer's output) must be "
                            "what this layer takes") from None
    if not isinstance(out, torch.Tensor):
        raise ProfilerError(f"layer {name} ({type(mod).__name__}) returned a {type(out).__name__}, not a tensor: "
                            "each layer must take one tensor and return one tensor")
    # the gradient arriving from the next layer: random for an activation, implicit (ones) for a scalar loss
    out_grads = [torch.randn_like(out) if out.numel() > 1 and out.is_floating_point() else None]
    run = LayerRun(name, mod, x, params, out_grads, next_input=out.detach())
    del out
    _clear(params, x)
    run.memory = measure_memory(run, device, backward)
    _clear(params, x)
    return run


def _run_once(run: LayerRun, timer: _Timer, backward: SplitBackward, record: bool) -> None:
    """One timed F, B (I), W and fused backward of one layer.

    Parameter gradients accumulate across runs, as they do across the microbatches of an iteration;
    the input's gradient is fresh each time, as each microbatch's input is.
    """
    mod, x, params, out_grads = run.mod, run.x, run.params, run.out_grads
    _clear((), x)
    t_f, out = timer(lambda: mod(x))
    t_b = t_w = t_full = 0.0
    if out.requires_grad:
        if x.requires_grad:
            t_b, (_, groups) = timer(lambda: backward.input([out], out_grads, [x], iter(params)))
            t_w, _ = timer(lambda: backward.weight(iter(params), groups))
            del groups
        else:  # as torch's runtime does on its first stage: no I, and W is the whole backward
            t_w, _ = timer(lambda: backward.full([out], out_grads, [x]))
        out = None  # free the graph
        _clear((), x)
        out = mod(x)
        t_full, _ = timer(lambda: backward.full([out], out_grads, [x]))
    out = None  # free the graph
    if record:
        for key, value in zip(PASSES, (t_f, t_b, t_w, t_full)):
            run.samples[key].append(value)


def _finish(run: LayerRun) -> LayerCost:
    """The layer's medians and memory; drops its gradients."""
    _clear(run.params, run.x)
    med = {k: statistics.median(v) for k, v in run.samples.items()}
    extra = {"module": type(run.mod).__name__, **{k: v for k, v in run.memory.items() if k not in ("mem_B", "mem_W")}}
    if run.recompute:
        extra["recompute"] = run.recompute
    kernel = getattr(run.mod, "attention_kernel", None)  # decoder_models.DecoderBlock's: which sdpa kernel ran
    if isinstance(kernel, str):
        extra["attention_kernel"] = kernel
    return LayerCost(
        name=run.name, F=med["F"], B=med["B"], W=med["W"], full_backward=med["full_backward"],
        mem_B=run.memory["mem_B"], mem_W=run.memory["mem_W"], params=sum(prm.numel() for prm in run.mod.parameters()),
        out_bytes=run.next_input.numel() * run.next_input.element_size(), extra=extra,
    )


class _Session:
    """One measurement: the device, dtype, timer and progress count shared by every layer."""

    def __init__(self, request: MeasureRequest, n_layers: int, progress: Progress | None) -> None:
        request.check()
        self.backward = torch_backward_functions()
        self.device = resolve_device(request.device)
        self.tdtype = torch_dtype(request.dtype or default_dtype(self.device))
        self.timer = _Timer(self.device)
        self.warmup, self.runs = request.warmup, request.warmup + request.repeats
        self.total, self.done, self.progress = n_layers * (self.runs + 1), 0, progress

    def tick(self, what: str) -> None:
        self.done += 1
        if self.progress:
            self.progress(self.done, self.total, what)

    def place(self, mod: nn.Module) -> nn.Module:
        mod.to(device=self.device, dtype=self.tdtype)
        mod.train()
        return mod

    def first_input(self, sample: torch.Tensor) -> torch.Tensor:
        x = sample.to(self.device)
        return x.to(self.tdtype) if x.is_floating_point() else x

    def prepare(self, name: str, mod: nn.Module, x: torch.Tensor) -> LayerRun:
        run = _prepare(name, self.place(mod), x, self.device, self.backward)
        self.tick(name)
        return run

    def run_once(self, run: LayerRun, i: int) -> None:
        _run_once(run, self.timer, self.backward, record=i >= self.warmup)
        self.tick(run.name)

    def options(self, run: LayerRun) -> None:
        """The layer's recompute options, once its own passes are timed."""
        run.recompute = measure_options(run, self.timer, self.backward, self.device, self.warmup, self.runs)


def _measure_interleaved(session: _Session, layers: Sequence[LayerSpec], x: torch.Tensor) -> list[LayerCost]:
    # Every layer resident; each round times every layer once, so a machine that speeds up or slows
    # down while measuring (other work, clocks) shifts all layers alike.
    prepared: list[LayerRun] = []
    for name, build in layers:
        prepared.append(session.prepare(name, build(), x))
        x = prepared[-1].next_input
    for i in range(session.runs):
        for run in prepared:
            session.run_once(run, i)
    for run in prepared:
        session.options(run)
    if session.device.type == "cpu":
        measure_kept(prepared, session.backward)
    return [_finish(run) for run in prepared]


def _measure_one_by_one(session: _Session, layers: Sequence[LayerSpec], x: torch.Tensor) -> list[LayerCost]:
    costs: list[LayerCost] = []
    for name, build in layers:  # one layer on the device at a time
        mod = build()
        try:
            run = session.prepare(name, mod, x)
            for i in range(session.runs):
                session.run_once(run, i)
            session.options(run)
            costs.append(_finish(run))
            x = run.next_input
            del run
        finally:
            if session.device.type == "cuda":
                mod.to("cpu")
                torch.cuda.empty_cache()
    return costs


def measure_layers(layers: Sequence[LayerSpec], sample_input: torch.Tensor, request: MeasureRequest = MeasureRequest(),
                   progress: Progress | None = None) -> list[LayerCost]:
    """Measure every layer in chain order; each layer's input is the previous layer's real output.

    Parameters
    ----------
    layers
        (name, build) pairs; `build()` returns the layer's nn.Module (built or moved when its turn comes).
    sample_input
        The first layer's input for one microbatch (token ids for the GPT).
    request
        Device, dtype, warm-up and timed runs, CPU threads (restored afterwards) and the order: with
        `interleave`, every layer is built, then timed round-robin so drift in the machine's speed
        spreads over all layers; without, one layer at a time, for models that do not fit at once.
    progress
        Called as progress(done, total, layer name) after every run.

    Returns
    -------
    list[LayerCost]
        One per layer: median F, B, W and fused backward in microseconds, M_B and M_W in bytes.

    Raises
    ------
    ProfilerError
        A setting is out of range, or a layer fails on its input or returns a non-tensor.
    DependencyError
        This torch build lacks torch.distributed.pipelining.
    """
    if not layers:
        raise ProfilerError("the model has no layers to measure")
    session = _Session(request, len(layers), progress)
    x = session.first_input(sample_input)
    saved_threads = torch.get_num_threads()
    if request.threads is not None:
        torch.set_num_threads(request.threads)
    if session.device.type == "cuda":  # CUDA events and allocator statistics follow the current device
        torch.cuda.set_device(session.device)
    try:
        if request.interleave:
            return _measure_interleaved(session, layers, x)
        return _measure_one_by_one(session, layers, x)
    finally:
        torch.set_num_threads(saved_threads)

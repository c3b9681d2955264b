"""Measure (or estimate) what a model's pipeline stages cost, and write a zbsearch profile.

Two ways to get the numbers:

* measured (`measure_layers`): every layer of a torch model runs on the device, one layer at a time.
  Per layer: F (forward), B (gradient with respect to the layer's input, torch's I) and W (gradient
  with respect to its parameters) as separate passes, through the same functions torch's pipeline
  runtime uses for I and W (`stage_backward_input`, `stage_backward_weight`), and the fused full
  backward as a check. Each pass runs `warmup` times untimed, then `repeats` times; the median is kept.
  Timing uses CUDA events on a GPU and `time.perf_counter` on a CPU. Memory: M_B, the activation bytes
  a microbatch holds from F until B, and M_W, the bytes still needed from B until W (the inputs of the
  parameter-using operations plus the output gradients B stored for W).
* estimated (`estimate_gpt`): FLOP counts of the Zero Bubble paper's Table 1 (arXiv 2401.10241) divided
  by a GPU's dense peak times a model FLOPs utilization (MFU). No torch needed.

Both give per-layer `LayerCost`s; `build_profile` splits the layers into p contiguous stages (exact
linear-partition DP, or a forced split), adds communication times from the bytes crossing each stage
boundary and a link bandwidth, and returns a validated `Profile` with provenance.

Units: times in microseconds, memory in bytes. torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import math
import os
import platform
import statistics
import sys
import time
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from ..core.errors import ProfilerError, ZbsearchError
from .partition import check_counts, linear_partition, stage_costs
from ..core.profile import Profile, check_microbatches, check_stages

PAPER = "Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, arXiv:2401.10241"
DTYPES = ("bf16", "fp16", "fp32")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
ATTENTIONS = ("naive", "sdpa")
OPTIMIZERS = ("adam", "sgd", "none")
DEFAULT_LINK_GBPS = 200.0  # one 200 Gb/s InfiniBand HDR link per GPU, a common inter-node pipeline link
DEFAULT_MFU = 0.4
DEFAULT_WARMUP = 2
DEFAULT_REPEATS = 10

Progress = Callable[[int, int, str], None]  # (done, total, what is running)


# -- GPUs for --estimate ----------------------------------------------------------------------

@dataclass(frozen=True)
class GpuSpec:
    """A GPU's dense (no 2:4 sparsity) peak TFLOP/s per dtype and its memory, from the vendor's datasheet."""

    name: str
    peak_tflops: dict[str, float]
    memory_bytes: float
    source: str


GPUS: dict[str, GpuSpec] = {
    "a100": GpuSpec(
        "NVIDIA A100 SXM4 80GB", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}, 80e9,
        "NVIDIA A100 Tensor Core GPU datasheet: BF16/FP16 Tensor Core 312 TFLOPS dense (624 with sparsity), "
        "FP32 19.5 TFLOPS, 80 GB HBM2e",
    ),
    "h100": GpuSpec(
        "NVIDIA H100 SXM5 80GB", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}, 80e9,
        "NVIDIA H100 Tensor Core GPU datasheet, SXM5: BF16/FP16 Tensor Core 1,979 TFLOPS with sparsity, "
        "so 989.4 dense; FP32 67 TFLOPS; 80 GB HBM3",
    ),
    "h200": GpuSpec(
        "NVIDIA H200 SXM 141GB", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}, 141e9,
        "NVIDIA H200 Tensor Core GPU datasheet, SXM: the H100's GH100 compute (BF16/FP16 1,979 TFLOPS with "
        "sparsity, 989.4 dense; FP32 67 TFLOPS) with 141 GB HBM3e",
    ),
}


# -- what the profiler produces per layer -----------------------------------------------------

@dataclass
class LayerCost:
    """One layer's cost for one microbatch: times in microseconds, memory in bytes."""

    name: str
    F: float
    B: float
    W: float
    full_backward: float
    mem_B: float
    mem_W: float
    params: int
    out_bytes: int  # bytes of the activation this layer hands to the next one
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def compute(self) -> float:
        return self.F + self.B + self.W

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        for k in ("F", "B", "W", "full_backward"):
            d[k] = round(d[k], 3)
        d.update(extra)
        return d


@dataclass(frozen=True)
class GptShape:
    """The built-in GPT-style decoder: embedding, `layers` pre-LN blocks, final norm + LM head + loss."""

    layers: int = 4
    hidden: int = 256
    heads: int = 4
    seq: int = 128
    micro_batch: int = 2
    vocab: int = 1024

    def check(self) -> "GptShape":
        for key, value in asdict(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                flag = "--" + key.replace("_", "-")
                raise ProfilerError(f"{flag} {value!r}: give a positive whole number")
        if self.hidden % self.heads:
            raise ProfilerError(f"--hidden {self.hidden} is not a multiple of --heads {self.heads}: "
                                "each head gets hidden / heads channels, e.g. --hidden 256 --heads 4")
        return self

    def block_params(self) -> int:
        h = self.hidden
        return 12 * h * h + 13 * h  # qkv, proj, fc1, fc2 with biases, two LayerNorms

    def describe(self) -> dict[str, Any]:
        return {"model": "gpt", **asdict(self)}


# -- small helpers ----------------------------------------------------------------------------

def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def _import_torch():
    try:
        import torch
    except ImportError:
        raise ProfilerError("measuring needs torch: pip install 'zbsearch[torch]' (or use --estimate, "
                            "which needs no torch)") from None
    return torch


def _pipelining_backward():
    """torch's split backward, the code paths its pipeline runtime uses for I, W and the fused backward."""
    try:
        from torch.distributed.pipelining._backward import (
            stage_backward, stage_backward_input, stage_backward_weight,
        )
    except ImportError as exc:
        raise ProfilerError(f"this torch build lacks torch.distributed.pipelining ({_one_line(exc)}); "
                            "install torch 2.4 or newer with distributed support") from None
    return stage_backward, stage_backward_input, stage_backward_weight


def torch_dtype(name: str):
    torch = _import_torch()
    if name not in DTYPES:
        raise ProfilerError(f"--dtype {name!r}: use one of {', '.join(DTYPES)}")
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def resolve_device(name: str = "auto"):
    """`auto` (a GPU when there is one), `cpu`, `cuda` or `cuda:N`, as a torch.device."""
    torch = _import_torch()
    text = (name or "auto").strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(text)
    except RuntimeError:
        raise ProfilerError(f"--device {name!r}: use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ProfilerError(f"--device {name}: this machine has no CUDA GPU (or torch is a CPU build); use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise ProfilerError(f"--device {name!r}: the profiler times cpu and cuda devices only")
    return dev


def default_dtype(device) -> str:
    """bf16 on a GPU (what training uses), fp32 on a CPU (where bf16 kernels are often not representative)."""
    return "bf16" if device.type == "cuda" else "fp32"


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (or the platform), with the logical CPU count."""
    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    return f"{model} ({os.cpu_count()} logical CPUs)"


def _cpu_memory_bytes() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def device_info(device) -> dict[str, Any]:
    """Name, capacity and software versions of the device the profile is measured on."""
    torch = _import_torch()
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                            "python": platform.python_version()}
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        info.update(name=torch.cuda.get_device_name(index), capacity_bytes=float(props.total_memory),
                    device_count=torch.cuda.device_count())
    else:
        info.update(name=f"CPU: {cpu_name()}", capacity_bytes=_cpu_memory_bytes(),
                    threads=torch.get_num_threads())
        if hasattr(os, "getloadavg"):  # other work on a shared machine inflates CPU timings
            info["load_average_1_5_15min"] = [round(x, 2) for x in os.getloadavg()]
    return info


def optimizer_bytes_per_param(optimizer: str, dtype: str) -> int:
    """Parameter, gradient and optimizer-state bytes per parameter.

    Mixed precision (bf16/fp16 weights) keeps an fp32 master copy. Adam keeps two fp32 moments, SGD
    with momentum one, `none` only the weight and its gradient. Adam gives the usual 16 bytes per
    parameter in both mixed precision (2 + 2 + 4 + 4 + 4) and fp32 (4 + 4 + 4 + 4).
    """
    if optimizer not in OPTIMIZERS:
        raise ProfilerError(f"--optimizer {optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
    w = DTYPE_BYTES[dtype]
    if optimizer == "none":
        return 2 * w
    master = 4 if w < 4 else 0
    states = {"adam": 8, "sgd": 4}[optimizer]
    return 2 * w + master + states


# -- the built-in GPT -------------------------------------------------------------------------

_GPT_CLASSES: dict[str, Any] = {}


def _gpt_classes() -> dict[str, Any]:
    """nn.Module classes of the built-in GPT, defined on first use so that importing needs no torch."""
    if _GPT_CLASSES:
        return _GPT_CLASSES
    torch = _import_torch()
    nn = torch.nn
    F = torch.nn.functional

    class Embedding(nn.Module):
        """Token plus learned position embedding: ids (b, s) -> activations (b, s, h)."""

        def __init__(self, vocab: int, hidden: int, seq: int) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, hidden)
            self.pos = nn.Embedding(seq, hidden)
            self.register_buffer("positions", torch.arange(seq), persistent=False)

        def forward(self, ids):
            return self.tok(ids) + self.pos(self.positions[: ids.shape[1]])

    class Block(nn.Module):
        """Pre-LN decoder block: causal multi-head attention and a 4h GELU MLP, no dropout."""

        def __init__(self, hidden: int, heads: int, seq: int, attention: str) -> None:
            super().__init__()
            self.heads, self.attention = heads, attention
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)
            self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).tril(), persistent=False)

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2)
                       for t in self.qkv(self.ln1(x)).split(h, dim=-1))
            if self.attention == "sdpa":
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # the paper's (Megatron's) unfused attention: the s x s probabilities are kept for B
                scores = (q @ k.transpose(-2, -1)) * (h // self.heads) ** -0.5
                o = scores.masked_fill(~self.causal[:s, :s], float("-inf")).softmax(-1) @ v
            x = x + self.proj(o.transpose(1, 2).reshape(b, s, h))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Head(nn.Module):
        """Final LayerNorm, LM head and cross-entropy loss (in fp32) against fixed random targets."""

        def __init__(self, vocab: int, hidden: int, targets) -> None:
            super().__init__()
            self.ln, self.out = nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)
            self.register_buffer("targets", targets, persistent=False)

        def forward(self, x):
            logits = self.out(self.ln(x))
            return F.cross_entropy(logits.float().flatten(0, 1), self.targets.flatten())

    _GPT_CLASSES.update(Embedding=Embedding, Block=Block, Head=Head)
    return _GPT_CLASSES


LayerSpec = tuple[str, Callable[[], Any]]  # (name, build the nn.Module)


def gpt_layers(shape: GptShape, attention: str = "naive", seed: int = 0) -> tuple[list[LayerSpec], Any]:
    """The built-in GPT as lazily built layers (embedding, blocks, head) and a sample batch of token ids.

    Layers are built one at a time while measuring, so a model larger than the device still profiles.
    """
    torch = _import_torch()
    shape.check()
    if attention not in ATTENTIONS:
        raise ProfilerError(f"--attention {attention!r}: use one of {', '.join(ATTENTIONS)}")
    classes = _gpt_classes()
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(shape.vocab, (shape.micro_batch, shape.seq), generator=gen)
    targets = torch.randint(shape.vocab, (shape.micro_batch, shape.seq), generator=gen)

    def seeded(i: int, make: Callable[[], Any]) -> Callable[[], Any]:
        def build():
            torch.manual_seed(seed + i)
            return make()
        return build

    specs: list[LayerSpec] = [("embedding", seeded(0, lambda: classes["Embedding"](shape.vocab, shape.hidden, shape.seq)))]
    for i in range(shape.layers):
        specs.append((f"block{i}", seeded(i + 1, lambda: classes["Block"](shape.hidden, shape.heads, shape.seq, attention))))
    specs.append(("head", seeded(shape.layers + 1, lambda: classes["Head"](shape.vocab, shape.hidden, targets))))
    return specs, ids


# -- a user's model ---------------------------------------------------------------------------

def load_factory(spec: str) -> tuple[list[LayerSpec], Any]:
    """Import `package.module:factory`, call it, and check it returned (ordered layers, sample input).

    The current directory is searched too, so a factory in ./my_model.py is `my_model:build`.

    Raises
    ------
    ProfilerError
        The spec is malformed, the import or the call fails, or the result is not a pair of a list of
        torch.nn.Module layers and a tensor.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise ProfilerError(f"--model {spec!r}: write gpt or package.module:factory, e.g. --model my_models:build")
    _import_torch()
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name.strip())
    except Exception as exc:  # an ImportError, or anything the module raises while importing
        raise ProfilerError(f"--model {spec}: cannot import {module_name!r} ({_one_line(exc)})") from None
    obj: Any = module
    for part in attr.strip().split("."):
        if not hasattr(obj, part):
            raise ProfilerError(f"--model {spec}: module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ProfilerError(f"--model {spec}: {attr!r} is a {type(obj).__name__}, not a function returning "
                            "(layers, sample_input)")
    try:
        result = obj()
    except Exception as exc:
        raise ProfilerError(f"--model {spec}: the factory raised {_one_line(exc)}") from None
    layers, sample = check_factory_result(result, spec)
    return [(f"{i}:{type(m).__name__}", (lambda m=m: m)) for i, m in enumerate(layers)], sample


def check_factory_result(result: Any, spec: str = "factory") -> tuple[list[Any], Any]:
    """(layers, sample_input) with layers an ordered list of nn.Modules and sample_input a tensor."""
    torch = _import_torch()
    nn = torch.nn
    fix = "a factory must return (layers, sample_input): the ordered list of nn.Module layers and the first layer's input tensor"
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise ProfilerError(f"--model {spec}: the factory returned {type(result).__name__}; {fix}")
    layers, sample = result
    if isinstance(layers, (nn.Sequential, nn.ModuleList)):
        layers = list(layers)
    elif isinstance(layers, nn.Module):
        raise ProfilerError(f"--model {spec}: the factory returned one {type(layers).__name__} module, not a list "
                            "of layers; return e.g. list(model.children()) in pipeline order")
    if not isinstance(layers, (list, tuple)):
        raise ProfilerError(f"--model {spec}: the layers are a {type(layers).__name__}; {fix}")
    if not layers:
        raise ProfilerError(f"--model {spec}: the layer list is empty; {fix}")
    for i, layer in enumerate(layers):
        if not isinstance(layer, nn.Module):
            raise ProfilerError(f"--model {spec}: layer {i} is a {type(layer).__name__}, not a torch.nn.Module; {fix}")
    if not isinstance(sample, torch.Tensor):
        raise ProfilerError(f"--model {spec}: the sample input is a {type(sample).__name__}, not a torch.Tensor; {fix}")
    return list(layers), sample


# -- measuring --------------------------------------------------------------------------------

class _Timer:
    """Elapsed microseconds of one call: CUDA events on a GPU, perf_counter on a CPU."""

    def __init__(self, torch, device) -> None:
        self.torch, self.cuda = torch, device.type == "cuda"
        self.kind = "CUDA events" if self.cuda else "time.perf_counter"

    def __call__(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        if self.cuda:
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1000.0, out
        t0 = time.perf_counter()
        out = fn()
        return (time.perf_counter() - t0) * 1e6, out


def _storage_key(t) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def _tensors(value: Any):
    torch = _import_torch()
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)


def _describe(x: Any) -> str:
    shape = "x".join(str(d) for d in getattr(x, "shape", ())) or "scalar"
    return f"{str(getattr(x, 'dtype', type(x).__name__)).replace('torch.', '')} tensor of shape {shape}"


def _clear(params: Sequence[Any], x: Any) -> None:
    for prm in params:
        prm.grad = None
    if getattr(x, "grad", None) is not None:
        x.grad = None


def _measure_memory(mod, x, out_grads, params, device, torch, split) -> dict[str, float]:
    """M_B, M_W (and what torch's own split keeps from I to W) of one layer, in bytes."""
    _, stage_backward_input, stage_backward_weight = split
    static = {_storage_key(t)[0] for t in list(mod.parameters()) + list(mod.buffers())}
    saved: dict[int, list[Any]] = {}
    sizes: dict[int, int] = {}

    def pack(t):
        ptr, nbytes = _storage_key(t)
        if nbytes and ptr not in static:
            sizes[ptr] = nbytes
            saved.setdefault(ptr, []).append(weakref.ref(t))
        return t

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = mod(x)
    mem_B = float(sum(sizes.values()))
    result: dict[str, float] = {}
    if cuda:
        torch.cuda.synchronize(device)
        delta = torch.cuda.memory_allocated(device) - before
        out_ptr, out_bytes = _storage_key(out)
        if out_ptr not in sizes:
            delta -= out_bytes  # the output is handed on, not held for this layer's backward
        x_ptr, x_bytes = _storage_key(x)
        if x_ptr in sizes:
            delta += x_bytes  # the saved input was allocated before F but is held for B all the same
        result["mem_B_saved_tensors"] = mem_B
        mem_B = float(max(delta, 0))
    result["mem_B"] = mem_B
    if not out.requires_grad:
        result["mem_W"] = 0.0
        return result
    if not x.requires_grad:  # nothing to send back: the whole backward is W, everything is held until then
        result["mem_W"] = result["mem_W_torch_runtime"] = mem_B
        del out
        return result
    _, groups = stage_backward_input([out], out_grads, [x], iter(params))
    del out
    needed: dict[int, int] = {}
    grads: dict[int, int] = {}
    for group in groups:
        for node in group.get("intermediates", ()):
            for attr in dir(node):
                if not attr.startswith("_saved_"):
                    continue
                try:
                    value = getattr(node, attr)
                except RuntimeError:
                    continue
                for t in _tensors(value):
                    ptr, nbytes = _storage_key(t)
                    if nbytes and ptr not in static:
                        needed[ptr] = nbytes
        for grad_tuple in group.get("grads", None) or ():
            for t in _tensors(grad_tuple):
                ptr, nbytes = _storage_key(t)
                if nbytes:
                    grads[ptr] = nbytes
    result["mem_W"] = float(sum({**needed, **grads}.values()))
    alive = {ptr: sizes[ptr] for ptr, refs in saved.items() if any(r() is not None for r in refs)}
    result["mem_W_torch_runtime"] = float(sum({**alive, **grads}.values()))
    if cuda:
        torch.cuda.synchronize(device)
        result["mem_W_torch_runtime"] = float(max(torch.cuda.memory_allocated(device) - before, 0))
    stage_backward_weight(iter(params), groups)
    return result


@dataclass
class _LayerRun:
    """Everything needed to time one layer again and again."""

    name: str
    mod: Any
    x: Any
    params: list[Any]
    out_grads: list[Any]
    next_input: Any
    memory: dict[str, float]
    samples: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in ("F", "B", "W", "full_backward")})


def _prepare(name: str, mod: Any, x: Any, *, device: Any, torch: Any, split: Any) -> _LayerRun:
    """Check the layer runs on x, then size its memory; its output is the next layer's input."""
    x = x.detach()
    if x.is_floating_point():
        x.requires_grad_(True)
    params = [prm for prm in mod.parameters() if prm.requires_grad]
    try:
        out = mod(x)
    except Exception as exc:
        raise ProfilerError(f"layer {name} ({type(mod).__name__}) failed on its input, a {_describe(x)}: "
                            f"{_one_line(exc)}; the sample input (or the previous layer's output) must be "
                            "what this layer takes") from None
    if not isinstance(out, torch.Tensor):
        raise ProfilerError(f"layer {name} ({type(mod).__name__}) returned a {type(out).__name__}, not a tensor: "
                            "each layer must take one tensor and return one tensor")
    # the gradient arriving from the next layer: random for an activation, implicit (ones) for a scalar loss
    out_grads = [torch.randn_like(out) if out.numel() > 1 and out.is_floating_point() else None]
    next_input = out.detach()
    del out
    _clear(params, x)
    memory = _measure_memory(mod, x, out_grads, params, device, torch, split)
    _clear(params, x)
    return _LayerRun(name, mod, x, params, out_grads, next_input, memory)


def _run_once(run: _LayerRun, timer: _Timer, split: Any, record: bool) -> None:
    """One timed F, B (I), W and fused backward of one layer.

    Parameter gradients accumulate across runs, as they do across the microbatches of an iteration;
    the input's gradient is fresh each time, as each microbatch's input is.
    """
    stage_backward, stage_backward_input, stage_backward_weight = split
    mod, x, params, out_grads = run.mod, run.x, run.params, run.out_grads
    _clear((), x)
    t_f, out = timer(lambda: mod(x))
    t_b = t_w = t_full = 0.0
    if out.requires_grad:
        if x.requires_grad:
            t_b, (_, groups) = timer(lambda: stage_backward_input([out], out_grads, [x], iter(params)))
            t_w, _ = timer(lambda: stage_backward_weight(iter(params), groups))
            del groups
        else:  # as torch's runtime does on its first stage: no I, and W is the whole backward
            t_w, _ = timer(lambda: stage_backward([out], out_grads, [x]))
        out = None  # free the graph
        _clear((), x)
        out = mod(x)
        t_full, _ = timer(lambda: stage_backward([out], out_grads, [x]))
    out = None  # free the graph
    if record:
        for key, value in zip(("F", "B", "W", "full_backward"), (t_f, t_b, t_w, t_full)):
            run.samples[key].append(value)


def _finish(run: _LayerRun) -> LayerCost:
    """The layer's medians and memory; drops its gradients."""
    _clear(run.params, run.x)
    med = {k: statistics.median(v) for k, v in run.samples.items()}
    extra = {k: v for k, v in run.memory.items() if k not in ("mem_B", "mem_W")}
    return LayerCost(
        name=run.name, F=med["F"], B=med["B"], W=med["W"], full_backward=med["full_backward"],
        mem_B=run.memory["mem_B"], mem_W=run.memory["mem_W"], params=sum(prm.numel() for prm in run.mod.parameters()),
        out_bytes=run.next_input.numel() * run.next_input.element_size(), extra=extra,
    )


def _place(mod: Any, dev: Any, tdtype: Any) -> Any:
    mod.to(device=dev, dtype=tdtype)
    mod.train()
    return mod


def measure_layers(
    layers: Sequence[LayerSpec], sample_input: Any, *, device: Any = "auto", dtype: str | None = None,
    warmup: int = DEFAULT_WARMUP, repeats: int = DEFAULT_REPEATS, progress: Progress | None = None,
    threads: int | None = None, interleave: bool = True,
) -> list[LayerCost]:
    """Measure every layer in chain order; each layer's input is the previous layer's real output.

    Parameters
    ----------
    layers
        (name, build) pairs; `build()` returns the layer's nn.Module (built or moved when its turn comes).
    sample_input
        The first layer's input for one microbatch (token ids for the GPT).
    device, dtype
        Where and in what precision to run: `resolve_device` names; dtype one of bf16, fp16, fp32
        (default bf16 on a GPU, fp32 on a CPU). Floating parameters and inputs are converted.
    warmup, repeats
        Untimed runs, then timed runs of every pass; the median of the timed runs is kept.
    progress
        Called as progress(done, total, layer name) after every run.
    threads
        CPU threads torch may use while measuring (torch's default when None); restored afterwards.
        One thread gives the steadiest numbers on a shared machine.
    interleave
        True: build every layer, then time them round-robin, one run of each per round, so drift in
        the machine's speed spreads over all layers. False: one layer at a time, built, timed and
        released before the next, for models that do not fit on the device at once.

    Returns
    -------
    list[LayerCost]
        One per layer: median F, B, W and fused backward in microseconds, M_B and M_W in bytes.

    Raises
    ------
    ProfilerError
        torch is missing, an option is out of range, or a layer fails on its input or returns a non-tensor.
    """
    torch = _import_torch()
    split = _pipelining_backward()
    dev = device if not isinstance(device, str) else resolve_device(device)
    dtype = dtype or default_dtype(dev)
    tdtype = torch_dtype(dtype)
    if warmup < 0 or repeats < 1:
        raise ProfilerError(f"--warmup {warmup} --repeats {repeats}: need warmup >= 0 and repeats >= 1")
    if not layers:
        raise ProfilerError("the model has no layers to measure")
    timer = _Timer(torch, dev)
    total = len(layers) * (warmup + repeats + 1)
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total, what)

    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ProfilerError(f"--threads {threads}: give a positive number of CPU threads, e.g. --threads 1")
    x = sample_input.to(dev)
    if x.is_floating_point():
        x = x.to(tdtype)
    saved_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    if dev.type == "cuda":  # CUDA events and allocator statistics follow the current device
        torch.cuda.set_device(dev)
    runs = warmup + repeats
    try:
        if interleave:
            # Every layer resident; each round times every layer once, so a machine that speeds up
            # or slows down while measuring (other work, clocks) shifts all layers alike.
            prepared: list[_LayerRun] = []
            for name, build in layers:
                prepared.append(_prepare(name, _place(build(), dev, tdtype), x, device=dev, torch=torch, split=split))
                x = prepared[-1].next_input
                tick(name)
            for i in range(runs):
                for run in prepared:
                    _run_once(run, timer, split, record=i >= warmup)
                    tick(run.name)
            return [_finish(run) for run in prepared]
        costs: list[LayerCost] = []
        for name, build in layers:  # one layer on the device at a time
            mod = _place(build(), dev, tdtype)
            try:
                run = _prepare(name, mod, x, device=dev, torch=torch, split=split)
                tick(name)
                for i in range(runs):
                    _run_once(run, timer, split, record=i >= warmup)
                    tick(name)
                costs.append(_finish(run))
                x = run.next_input
                del run
            finally:
                if dev.type == "cuda":
                    mod.to("cpu")
                    torch.cuda.empty_cache()
        return costs
    finally:
        torch.set_num_threads(saved_threads)


def measure_link_gbps(nbytes: int, repeats: int = 10) -> float | None:
    """Point-to-point bandwidth cuda:0 -> cuda:1 for a message of nbytes, in Gb/s; None without 2 GPUs."""
    torch = _import_torch()
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return None
    src = torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device="cuda:0")
    times = []
    for i in range(repeats + 2):
        torch.cuda.synchronize("cuda:0")
        torch.cuda.synchronize("cuda:1")
        t0 = time.perf_counter()
        src.to("cuda:1")
        torch.cuda.synchronize("cuda:1")
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return src.numel() * 8 / statistics.median(times) / 1e9


# -- estimating -------------------------------------------------------------------------------

ESTIMATE_FORMULAS = (
    "per transformer layer, the Zero Bubble paper's Table 1: F = b*s*h*(24h + 4s), B = b*s*h*(24h + 8s), "
    "W = b*s*h*24h FLOPs; M_B = b*s*(34h + 5as) and M_W = 32*b*s*h bytes for 16-bit activations (twice that "
    "for fp32), with the 5as attention-matrix term dropped for fused (flash, --attention sdpa) attention, which "
    "keeps no s x s matrix. LM head (not in Table 1): 2*b*s*h*V FLOPs for each of F, B, W; M_B = b*s*(2dh + dV + 4V) bytes "
    "(norm input and output, logits, fp32 log-softmax), M_W = b*s*(dh + dV) bytes (head input, logits gradient), "
    "d = bytes per element. Embedding: no FLOPs; it holds the token ids, 8*b*s bytes"
)


def estimate_gpt(shape: GptShape, gpu: str, *, dtype: str = "bf16", mfu: float = DEFAULT_MFU,
                 attention: str = "naive") -> list[LayerCost]:
    """Per-layer costs of the built-in GPT from FLOP counts and a GPU's peak; no torch, nothing runs.

    time = FLOPs / (peak TFLOP/s of the dtype * mfu). See ESTIMATE_FORMULAS for the counts used.
    """
    shape.check()
    if attention not in ATTENTIONS:
        raise ProfilerError(f"--attention {attention!r}: use one of {', '.join(ATTENTIONS)}")
    if gpu not in GPUS:
        raise ProfilerError(f"--gpu {gpu!r}: use one of {', '.join(GPUS)}")
    if dtype not in DTYPES:
        raise ProfilerError(f"--dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    if not (isinstance(mfu, (int, float)) and 0 < mfu <= 1):
        raise ProfilerError(f"--mfu {mfu}: give the fraction of peak the model reaches, 0 < mfu <= 1, e.g. 0.4")
    b, s, h, a, V = shape.micro_batch, shape.seq, shape.hidden, shape.heads, shape.vocab
    rate = GPUS[gpu].peak_tflops[dtype] * 1e12 * mfu / 1e6  # FLOPs per microsecond
    act = DTYPE_BYTES[dtype] / 2  # the paper's byte counts assume 16-bit activations
    out_bytes = b * s * h * DTYPE_BYTES[dtype]
    layers = [LayerCost("embedding", 0.0, 0.0, 0.0, 0.0, 8.0 * b * s, 8.0 * b * s,
                        params=V * h + s * h, out_bytes=out_bytes, extra={"flops_F": 0})]
    f, bi, w = b * s * h * (24 * h + 4 * s), b * s * h * (24 * h + 8 * s), b * s * h * 24 * h
    for i in range(shape.layers):
        layers.append(LayerCost(
            f"block{i}", f / rate, bi / rate, w / rate, (bi + w) / rate,
            act * b * s * (34 * h + (5 * a * s if attention == "naive" else 0)), act * 32 * b * s * h,
            params=shape.block_params(),
            out_bytes=out_bytes, extra={"flops_F": f, "flops_B": bi, "flops_W": w},
        ))
    head, d = 2 * b * s * h * V, DTYPE_BYTES[dtype]
    layers.append(LayerCost(
        "head", head / rate, head / rate, head / rate, 2 * head / rate,
        float(b * s * (2 * d * h + d * V + 4 * V)), float(b * s * (d * h + d * V)), params=V * h + 2 * h,
        out_bytes=4, extra={"flops_F": head, "flops_B": head, "flops_W": head},
    ))
    return layers


# -- stages -----------------------------------------------------------------------------------

def check_split(n_layers: int, p: int | None, layers_per_stage: Sequence[int] | None = None,
                anchored: tuple[int, int] = (0, 0)) -> None:
    """Check -p and --layers-per-stage against the model before anything is measured."""
    movable = n_layers - sum(anchored)
    what = "transformer layers" if any(anchored) else "layers"
    if layers_per_stage:
        check_counts(list(layers_per_stage), movable, p)
        return
    if p is None:
        raise ProfilerError("say how many pipeline stages: -p P, or --layers-per-stage N1,N2,...")
    check_stages(p)
    if p > movable:
        raise ProfilerError(f"-p {p} is more stages than the model's {movable} {what}: every stage needs "
                            f"at least one, so use -p {movable} or fewer")


def split_layers(costs: Sequence[LayerCost], p: int | None, layers_per_stage: Sequence[int] | None = None,
                 anchored: tuple[int, int] = (0, 0)) -> list[int]:
    """Layers per stage (counting every layer, anchored ones included).

    `anchored` = (a, z): the first a layers always sit on the first stage and the last z on the last
    stage (the GPT's embedding and head); the DP, or `layers_per_stage`, places the layers between.
    """
    first, last = anchored
    middle = list(costs[first:len(costs) - last])
    extra_first = sum(c.compute for c in costs[:first])
    extra_last = sum(c.compute for c in costs[len(costs) - last:])
    check_split(len(costs), p, layers_per_stage, anchored)
    if layers_per_stage:
        counts = list(layers_per_stage)
    else:
        counts = linear_partition([c.compute for c in middle], p, extra_first, extra_last)
    counts = list(counts)
    counts[0] += first
    counts[-1] += last
    return counts


def build_profile(
    costs: Sequence[LayerCost], *, p: int | None = None, layers_per_stage: Sequence[int] | None = None,
    anchored: tuple[int, int] = (0, 0), link_gbps: float = DEFAULT_LINK_GBPS, link_origin: str = "default",
    microbatches: int | None = None, dtype: str = "fp32", optimizer: str = "adam", name: str = "profile",
    source: dict[str, Any], capacity_bytes: float | None = None, torch_stage0: bool = False,
    details: dict[str, Any] | None = None,
) -> Profile:
    """Group layer costs into stages and return a validated profile (times in us, memory in bytes).

    A stage's F, B, W, fused backward, M_B and M_W are the sums over its layers; its static bytes are its
    parameters times `optimizer_bytes_per_param`; the time of boundary k is the bytes of the activation
    leaving stage k divided by the link bandwidth (latency ignored). When a stage needs more from B to W
    than from F to B (small attention, large output gradients), its mem_B is raised to its mem_W: the
    profile format needs mem_W <= mem_B, and raising mem_B never under-counts memory.

    With `torch_stage0`, stage 0 is costed as torch.distributed.pipelining runs it: it has no input
    gradient to compute, so its I does nothing (B = 0) and its W runs the fused backward, holding mem_B.
    """
    if not (isinstance(link_gbps, (int, float)) and math.isfinite(link_gbps) and link_gbps > 0):
        raise ProfilerError(f"--link-gbps {link_gbps}: give the link bandwidth in Gb/s, a positive number, e.g. 200")
    counts = split_layers(costs, p, layers_per_stage, anchored)
    p = len(counts)
    m = check_microbatches(microbatches if microbatches is not None else 2 * p)
    per_param = optimizer_bytes_per_param(optimizer, dtype)
    stages: list[dict[str, Any]] = []
    names: list[list[str]] = []
    boundary_bytes: list[int] = []
    notes: list[str] = []
    start = 0
    for k, count in enumerate(counts):
        group = list(costs[start:start + count])
        start += count
        names.append([c.name for c in group])
        st = {key: float(sum(getattr(c, key) for c in group)) for key in ("F", "B", "W", "full_backward", "mem_B", "mem_W")}
        for key in ("F", "B", "W", "full_backward"):  # 9 significant digits are plenty
            st[key] = float(f"{st[key]:.9g}")
        if st["mem_W"] > st["mem_B"]:
            notes.append(f"stage {k}: mem_B raised from {st['mem_B']:.0f} to mem_W {st['mem_W']:.0f} bytes")
            st["mem_B"] = st["mem_W"]
        if st["mem_B"] <= 0:
            notes.append(f"stage {k}: no saved activations measured; mem_B set to 1 byte")
            st["mem_B"], st["mem_W"] = 1.0, min(st["mem_W"], 1.0)
        if k == 0 and torch_stage0:
            st["B"], st["W"], st["mem_W"] = 0.0, st["full_backward"] or st["B"] + st["W"], st["mem_B"]
        if st["B"] + st["W"] <= 0:
            raise ProfilerError(f"stage {k} ({', '.join(names[-1])}) has no backward work: its layers have no "
                                "parameters and pass no gradient; put them on a stage with trainable layers")
        if st["full_backward"] <= 0:
            del st["full_backward"]
        st["static_bytes"] = float(sum(c.params for c in group) * per_param)
        stages.append(st)
        if k < len(counts) - 1:
            boundary_bytes.append(group[-1].out_bytes)
    comm = [float(f"{nbytes * 8 / (link_gbps * 1e9) * 1e6:.9g}") for nbytes in boundary_bytes]
    info = dict(details or {})
    info.update({
        "partition": {
            "layers_per_stage": names,
            "method": ("forced by --layers-per-stage" if layers_per_stage else
                       "exact linear-partition DP minimizing the largest stage F + B + W"
                       + (", embedding pinned to the first stage and head + loss to the last" if anchored != (0, 0) else "")),
            "stage_compute_us": [round(x, 3) for x in stage_costs([c.compute for c in costs], counts)],
        },
        "boundary_bytes": boundary_bytes,
        "link": {"gbps": link_gbps, "origin": link_origin, "model": "time = bytes / bandwidth, latency ignored"},
        "static": {"optimizer": optimizer, "bytes_per_param": per_param,
                   "what": "parameters + gradients + optimizer state (+ fp32 master weights in mixed precision)"},
        "torch_stage0": torch_stage0,
        "layers": [c.to_dict() for c in costs],
    })
    if notes:
        info["notes"] = notes
    data = {
        "format": "zbsearch-profile/1", "name": name, "num_stages": p, "microbatches": m,
        "time_unit": "us", "memory_unit": "bytes",
        "stages": stages, "comm": comm, "source": source, "details": info,
    }
    if capacity_bytes:
        data["device_capacity_bytes"] = float(capacity_bytes)
    return Profile.from_dict(data, origin=name)


# -- the whole flow ---------------------------------------------------------------------------

def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def profile_gpt_estimate(
    shape: GptShape, *, gpu: str, mfu: float = DEFAULT_MFU, dtype: str = "bf16", p: int | None = None,
    layers_per_stage: Sequence[int] | None = None, link_gbps: float | None = None,
    microbatches: int | None = None, optimizer: str = "adam", name: str | None = None, torch_stage0: bool = False,
    attention: str = "naive",
) -> Profile:
    """The estimated profile of the built-in GPT on a GPU (`--estimate`); needs no torch."""
    costs = estimate_gpt(shape, gpu, dtype=dtype, mfu=mfu, attention=attention)
    spec = GPUS[gpu]
    method = (f"estimated from FLOP counts, not measured: time = FLOPs / ({spec.peak_tflops[dtype]} TFLOP/s "
              f"dense {dtype} peak of the {spec.name} * MFU {mfu}); attention {attention}; {ESTIMATE_FORMULAS}")
    source = {"kind": "estimated", "method": method, "citation": f"{PAPER}, Table 1 (FLOPs and activation memory)",
              "gpu": spec.name, "peak_source": spec.source, "mfu": mfu, "date": now_utc()}
    link = link_gbps if link_gbps is not None else DEFAULT_LINK_GBPS
    details = {"model": {**shape.describe(), "attention": attention}, "dtype": dtype, "gpu": gpu, "mfu": mfu,
               "peak_tflops": spec.peak_tflops[dtype]}
    label = name or f"gpt-{shape.layers}l-h{shape.hidden}-s{shape.seq}-b{shape.micro_batch}-{gpu}-estimated"
    return build_profile(costs, p=p, layers_per_stage=layers_per_stage, anchored=(1, 1), link_gbps=link,
                         link_origin="--link-gbps" if link_gbps is not None else f"default {DEFAULT_LINK_GBPS} Gb/s",
                         microbatches=microbatches, dtype=dtype, optimizer=optimizer, name=label, source=source,
                         capacity_bytes=spec.memory_bytes, torch_stage0=torch_stage0, details=details)


def profile_measured(
    model: str = "gpt", *, shape: GptShape | None = None, attention: str = "naive", device: str = "auto",
    dtype: str | None = None, p: int | None = None, layers_per_stage: Sequence[int] | None = None,
    link_gbps: float | None = None, microbatches: int | None = None, optimizer: str = "adam",
    warmup: int = DEFAULT_WARMUP, repeats: int = DEFAULT_REPEATS, seed: int = 0, torch_stage0: bool = False,
    name: str | None = None, progress: Progress | None = None, threads: int | None = None, interleave: bool = True,
) -> Profile:
    """Measure the built-in GPT (`model="gpt"`) or a user's `package.module:factory` and build its profile."""
    if model != "gpt" and (model.count(":") != 1 or not all(part.strip() for part in model.split(":"))):
        raise ProfilerError(f"--model {model!r}: write gpt or package.module:factory, e.g. --model my_models:build")
    torch = _import_torch()
    dev = resolve_device(device)
    dtype = dtype or default_dtype(dev)
    torch_dtype(dtype)
    if p is not None:
        check_stages(p)
    if microbatches is not None:
        check_microbatches(microbatches)
    if model == "gpt":
        shape = (shape or GptShape()).check()
        specs, sample = gpt_layers(shape, attention, seed)
        anchored = (1, 1)
        model_info: dict[str, Any] = {**shape.describe(), "attention": attention}
    else:
        torch.manual_seed(seed)
        specs, sample = load_factory(model)
        anchored = (0, 0)
        model_info = {"model": model, "layers": len(specs), "sample_input": _describe(sample)}
    check_split(len(specs), p, layers_per_stage, anchored)
    costs = measure_layers(specs, sample, device=dev, dtype=dtype, warmup=warmup, repeats=repeats,
                           progress=progress, threads=threads, interleave=interleave)
    info = device_info(dev)
    if dev.type == "cpu":
        info["threads"] = threads if threads is not None else info["threads"]
    origin = "--link-gbps"
    if link_gbps is None:
        biggest = max(c.out_bytes for c in costs)
        measured = measure_link_gbps(biggest) if dev.type == "cuda" else None
        if measured is not None:
            link_gbps, origin = measured, f"measured cuda:0 -> cuda:1 copy of {biggest} bytes"
        else:
            link_gbps, origin = DEFAULT_LINK_GBPS, f"default {DEFAULT_LINK_GBPS} Gb/s"
    timer = "CUDA events" if dev.type == "cuda" else "time.perf_counter"
    order = ("round-robin over all layers, one run of each per round" if interleave else
             "one layer at a time")
    memory = ("M_B: torch.cuda.memory_allocated delta over F (minus the output, plus the input when saved); "
              if dev.type == "cuda" else
              "M_B: bytes of the distinct non-parameter tensors saved for backward (saved-tensor hooks); ")
    memory += ("M_W: bytes of the tensors the weight-gradient step still needs after B (saved inputs of the "
               "parameter-using autograd nodes plus the output gradients stored for them)")
    method = (f"zbsearch profile: each layer measured alone on its real input; F forward, B = torch's "
              f"stage_backward_input (the runtime's I), W = stage_backward_weight (the runtime's W), and the fused "
              f"backward (stage_backward); {warmup} warm-up runs, median of {repeats} ({timer}, {order}); {memory}")
    device_name = info["name"]
    if dev.type == "cpu":
        device_name += f", {info['threads']} torch thread{'s' if info['threads'] != 1 else ''}"
    source = {"kind": "measured", "device": device_name, "date": now_utc(), "method": method,
              "torch": info["torch"], "cuda": info["cuda"], "dtype": dtype}
    details = {"model": model_info, "dtype": dtype, "device": str(dev), "environment": info,
               "timing": {"warmup": warmup, "repeats": repeats, "statistic": "median", "timer": timer,
                          "order": order},
               "memory_method": memory,
               "torch_runtime_note": "torch's split backward keeps the autograd graph from I until W, so between "
                                     "them it holds about mem_W_torch_runtime per layer (see layers), more than mem_W"}
    dev_tag = "cuda" if dev.type == "cuda" else "cpu"
    if model == "gpt":
        label = name or f"gpt-{shape.layers}l-h{shape.hidden}-s{shape.seq}-b{shape.micro_batch}-{dtype}-{dev_tag}"
    else:
        label = name or f"{model}-{dtype}-{dev_tag}"
    return build_profile(costs, p=p, layers_per_stage=layers_per_stage, anchored=anchored, link_gbps=link_gbps,
                         link_origin=origin, microbatches=microbatches, dtype=dtype, optimizer=optimizer, name=label,
                         source=source, capacity_bytes=info.get("capacity_bytes"), torch_stage0=torch_stage0,
                         details=details)


def parse_layers_per_stage(text: str | None) -> list[int] | None:
    """`--layers-per-stage 3,3,2` as a list of ints (None when not given)."""
    if text is None:
        return None
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise ProfilerError(f"--layers-per-stage {text!r}: write comma-separated layer counts, e.g. 3,3,2") from None
    return counts

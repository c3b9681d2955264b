"""The hardware a profile is measured on or estimated for.

The GPU datasheet table (dense peaks per dtype, memory and its bandwidth, for estimates; no torch needed), and the
probes of the machine that measures: torch itself, the device and its dtype, the CPU or GPU's name and
capacity, software versions, and the link bandwidth between two GPUs. torch is imported only inside the
functions that need it.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..core.errors import DependencyError, ProfilerError
from .request import DTYPES, bad_input, check_choice

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class GpuSpec:
    """A GPU's dense (no 2:4 sparsity) peak TFLOP/s per dtype, its memory and its memory (HBM) bandwidth,
    from the vendor's datasheet."""

    name: str
    peak_tflops: dict[str, float]
    memory_bytes: float
    memory_bandwidth: float  # bytes per second, decimal (the datasheet's GB/s or TB/s)
    source: str


GPUS: dict[str, GpuSpec] = {
    "a100": GpuSpec(
        "NVIDIA A100 SXM4 80GB", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}, 80e9, 2039e9,
        "NVIDIA A100 Tensor Core GPU datasheet: BF16/FP16 Tensor Core 312 TFLOPS dense (624 with sparsity), "
        "FP32 19.5 TFLOPS, 80 GB HBM2e at 2,039 GB/s (A100 80GB SXM)",
    ),
    "h100": GpuSpec(
        "NVIDIA H100 SXM5 80GB", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}, 80e9, 3.35e12,
        "NVIDIA H100 Tensor Core GPU datasheet, SXM5: BF16/FP16 Tensor Core 1,979 TFLOPS with sparsity, "
        "so 989.4 dense; FP32 67 TFLOPS; 80 GB HBM3 at 3.35 TB/s",
    ),
    "h200": GpuSpec(
        "NVIDIA H200 SXM 141GB", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}, 141e9, 4.8e12,
        "NVIDIA H200 Tensor Core GPU datasheet, SXM: the H100's GH100 compute (BF16/FP16 1,979 TFLOPS with "
        "sparsity, 989.4 dense; FP32 67 TFLOPS) with 141 GB HBM3e at 4.8 TB/s",
    ),
}


def gpu_spec(gpu: str) -> GpuSpec:
    """The datasheet entry of `gpu` (a key of GPUS)."""
    if gpu not in GPUS:
        raise bad_input(ProfilerError, f"GPU {gpu!r} has no datasheet entry: use one of {', '.join(GPUS)}", "gpu")
    return GPUS[gpu]


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as `Type: message` on one line, cut at `limit` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def import_torch() -> ModuleType:
    """The torch module, or a DependencyError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise DependencyError("measuring needs torch: pip install 'zbsearch[torch]' (or estimate from FLOP "
                              "counts, which needs no torch)") from None
    return torch


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of bf16, fp16 or fp32."""
    torch = import_torch()
    check_choice(name, DTYPES, "dtype", "dtype")
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def resolve_device(name: str = "auto") -> torch.device:
    """`auto` (a GPU when there is one), `cpu`, `cuda` or `cuda:N`, as a torch.device."""
    torch = import_torch()
    text = (name or "auto").strip().lower()
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(text)
    except RuntimeError:
        raise bad_input(ProfilerError, f"device {name!r} is not a device name: use auto, cpu, cuda or cuda:N",
                        "device") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise bad_input(ProfilerError, f"device {name}: this machine has no CUDA GPU (or torch is a CPU build); "
                        "measure on the cpu", "device")
    if dev.type not in ("cpu", "cuda"):
        raise bad_input(ProfilerError, f"device {name!r}: the profiler times cpu and cuda devices only", "device")
    # torch.cuda.set_device and the allocator's statistics want an index: plain "cuda" is the current GPU.
    return torch.device("cuda", torch.cuda.current_device()) if dev.type == "cuda" and dev.index is None else dev


def default_dtype(device: torch.device) -> str:
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


def device_info(device: torch.device) -> dict[str, Any]:
    """Name, capacity and software versions of the device the profile is measured on."""
    torch = import_torch()
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


def measure_link_gbps(nbytes: int, repeats: int = 10) -> float | None:
    """Point-to-point bandwidth cuda:0 -> cuda:1 for a message of nbytes, in Gb/s; None without 2 GPUs."""
    torch = import_torch()
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

"""The cluster a run is planned for: the GPU kind and count, GPUs per node, and the two links.

Bandwidths are per GPU and each way, from datasheets; `efficiency` is the share of it a large collective
reaches. That share is an input with a stated default, not a measurement: NCCL's achieved bus bandwidth is
below the datasheet's figure (NCCL's own performance notes, nccl-tests' PERFORMANCE.md, define bus bandwidth
against which the hardware peak is compared), and how far below depends on the machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...core.errors import PlanError
from ...profiling.hardware import GPUS, gpu_spec

DEFAULT_EFFICIENCY = 0.8  # assumed, not measured: the share of the datasheet bandwidth collectives reach


@dataclass(frozen=True)
class Link:
    """A link between two GPUs: `gbytes_per_s` each way per GPU (datasheet), the share `efficiency` of it a
    collective reaches, and a start-up `latency_us` per message or collective step."""

    name: str
    gbytes_per_s: float
    latency_us: float
    source: str
    efficiency: float = DEFAULT_EFFICIENCY

    @property
    def bytes_per_us(self) -> float:
        """Achieved bytes per microsecond: GB/s x 1e9 / 1e6 x efficiency."""
        return self.gbytes_per_s * 1e3 * self.efficiency

    def check(self, field: str) -> "Link":
        for what, value, name in (("bandwidth", self.gbytes_per_s, f"{field}_gbps"),
                                  ("efficiency", self.efficiency, "link_efficiency")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise PlanError(f"{self.name} {what} {value!r} is not a positive number: give a positive finite "
                                f"{'number of Gb/s, e.g. 400' if what == 'bandwidth' else 'share, e.g. 0.8'}",
                                subject=name)
        if self.efficiency > 1:
            raise PlanError(f"link efficiency {self.efficiency} is above 1: give the share of the datasheet bandwidth "
                            "collectives reach, 0 < share <= 1, e.g. 0.8", subject="link_efficiency")
        if not (math.isfinite(self.latency_us) and self.latency_us >= 0):
            raise PlanError(f"{self.name} latency {self.latency_us!r} us is not a non-negative number: give e.g. 10",
                            subject=f"{field}_latency")
        return self


NVLINK4 = Link("NVLink 4", 450.0, 10.0, "NVIDIA H100 datasheet: fourth-generation NVLink, 900 GB/s per GPU "
               "bidirectional, so 450 GB/s each way; latency assumed 10 us per collective step")
NVLINK3 = Link("NVLink 3", 300.0, 10.0, "NVIDIA A100 datasheet: third-generation NVLink, 600 GB/s per GPU "
               "bidirectional, so 300 GB/s each way; latency assumed 10 us per collective step")
NDR400 = Link("InfiniBand NDR 400 Gb/s", 50.0, 20.0, "one 400 Gb/s ConnectX-7 NIC per GPU (DGX H100, and "
              "torchtitan's benchmark hosts), 50 GB/s each way; latency assumed 20 us per collective step")
HDR200 = Link("InfiniBand HDR 200 Gb/s", 25.0, 20.0, "one 200 Gb/s ConnectX-6 NIC per GPU (DGX A100), 25 GB/s "
              "each way; latency assumed 20 us per collective step")
# The links a GPU kind's usual server has, inside a node and between nodes.
DEFAULT_LINKS: dict[str, tuple[Link, Link]] = {"h100": (NVLINK4, NDR400), "h200": (NVLINK4, NDR400),
                                               "a100": (NVLINK3, HDR200)}


@dataclass(frozen=True)
class Cluster:
    """`gpus` GPUs of kind `gpu` (a key of profiling.hardware.GPUS), `gpus_per_node` to a node; `intra` joins the
    GPUs of a node, `inter` the nodes; `memory_bytes`: what a GPU holds (None: the datasheet's)."""

    gpu: str
    gpus: int
    gpus_per_node: int
    intra: Link
    inter: Link
    memory_bytes: float | None = None

    @property
    def capacity(self) -> float:
        return self.memory_bytes if self.memory_bytes is not None else gpu_spec(self.gpu).memory_bytes

    def link_for(self, span: int) -> Link:
        """The link a group of GPUs `span` consecutive GPU indices wide crosses: inside a node when it fits in one
        (groups are aligned to their span, so a span that divides the node never straddles two)."""
        return self.intra if span <= self.gpus_per_node else self.inter

    def check(self) -> "Cluster":
        gpu_spec(self.gpu)
        for what, value, field in (("GPU count", self.gpus, "gpus"), ("GPUs per node", self.gpus_per_node,
                                                                     "gpus_per_node")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"{what} {value!r} is not a count: give a whole number >= 1", subject=field)
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise PlanError(f"{self.gpus} GPUs do not fill whole nodes of {self.gpus_per_node}: give a multiple of "
                            f"{self.gpus_per_node} (e.g. {self.gpus // self.gpus_per_node * self.gpus_per_node or self.gpus_per_node}), "
                            "or the GPUs per node your machines have", subject="gpus")
        self.intra.check("intra")
        self.inter.check("inter")
        if self.memory_bytes is not None and not (math.isfinite(self.memory_bytes) and self.memory_bytes > 0):
            raise PlanError(f"GPU memory {self.memory_bytes!r} bytes is not positive: give e.g. 80GB",
                            subject="gpu_memory")
        return self


def make_cluster(gpu: str, gpus: int, gpus_per_node: int = 8, *, intra_gbps: float | None = None,
                 inter_gbps: float | None = None, efficiency: float | None = None,
                 memory_bytes: float | None = None) -> Cluster:
    """A checked cluster with the GPU kind's usual links, overridden where given. Bandwidths in Gb/s each way
    per GPU (so 400 for a 400 Gb/s NIC, 3600 for NVLink 4's 450 GB/s).

    >>> c = make_cluster("h100", 64)
    >>> c.intra.name, c.inter.gbytes_per_s, c.link_for(8).name, c.link_for(16).name
    ('NVLink 4', 50.0, 'NVLink 4', 'InfiniBand NDR 400 Gb/s')
    """
    kind = gpu.strip().lower()
    if kind not in GPUS:
        raise PlanError(f"GPU {gpu!r} has no datasheet entry: use one of {', '.join(GPUS)}", subject="gpu")
    intra, inter = DEFAULT_LINKS[kind]
    if intra_gbps is not None:
        intra = replace(intra, name="link inside a node",
                        gbytes_per_s=_gbytes(intra_gbps, "intra_gbps", "link inside a node"),
                        source=f"given: {intra_gbps} Gb/s each way per GPU")
    if inter_gbps is not None:
        inter = replace(inter, name="link between nodes",
                        gbytes_per_s=_gbytes(inter_gbps, "inter_gbps", "link between nodes"),
                        source=f"given: {inter_gbps} Gb/s each way per GPU")
    if efficiency is not None:
        intra, inter = replace(intra, efficiency=efficiency), replace(inter, efficiency=efficiency)
    return Cluster(kind, gpus, gpus_per_node, intra, inter, memory_bytes).check()


def _gbytes(gbps: float, field: str, what: str) -> float:
    """Gb/s as GB/s, once it is a positive finite number (checked here, in the unit the user wrote)."""
    if isinstance(gbps, bool) or not isinstance(gbps, (int, float)) or not math.isfinite(gbps) or gbps <= 0:
        raise PlanError(f"{what} bandwidth {gbps!r} Gb/s is not a positive number: give a positive finite number of "
                        "Gb/s each way per GPU, e.g. 400", subject=field)
    return gbps / 8

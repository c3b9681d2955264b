"""Data parallelism under pipelining: what each of the five shardings keeps of a pipeline rank's static bytes,
the traffic it puts on the data-parallel link in a step, and the optimizer step's time.

torch's pipelining stage syncs gradients on the last microbatch's backward only
(torch/distributed/pipelining/stage.py, `backward_maybe_with_nosync`: DDP runs the other backwards under
`no_sync`; FSDP gets `set_requires_gradient_sync(False)` and `set_reshard_after_backward(False)` until the last
one), so gradients accumulate whole through the step under every sharding but zero2. Per parameter (core's
`ParamBytes`: weights w, gradients g, mixed precision's master copy and the optimizer state):

| sharding | memory (core.sharding kind) | traffic per step |
| --- | --- | --- |
| ddp | everything whole (unsharded) | all-reduce of the gradients after the last pass |
| zero1 | optimizer state and master / d (zero1) | reduce-scatter of the gradients; all-gather of the updated weights |
| zero2 | gradients too / d (zero2) | a reduce-scatter of the gradients every microbatch; the all-gather |
| fsdp | as zero1 (zero1): weights gathered once and kept (torchtitan under pipelining does not reshard after forward, torchtitan/distributed/fsdp.py) | all-gather of the weights at the step's start; reduce-scatter of the gradients |
| fsdp-reshard | weights and optimizer state / d, gradients whole, the layer in use gathered (fsdp-whole-grads) | a layer's weights gathered for every forward and every input backward (2m per step), overlapping the previous layer's pass; the reduce-scatter |

Gradients travel in the weights' dtype (Megatron-LM's default; torchtitan reduces in fp32 by default, twice
the bytes). Routed experts' parameters sync over the d / ep ranks that hold the same experts, the rest over
all d. The d ranks have stride t in the mesh (pp, dp, tp), so the group spans t*d GPUs: the link inside a
node while t*d fits in one. The optimizer step is memory-bound: it reads and writes every byte of its shard
(Adam in mixed precision: the master weight, gradient and two moments read, the master, moments and bf16
weight written: 28 bytes per parameter) at the GPU's HBM bandwidth (datasheet).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Sequence

from ...core.layers import Layer
from ...core.sharding import ParamBytes, Sharding
from .cluster import Link
from .collectives import all_gather, all_reduce, reduce_scatter
from .parallel_layers import LayerParams

# Each whole-run sharding's memory, as a core.sharding kind (None: unsharded).
CORE_KIND: dict[str, str | None] = {"ddp": None, "zero1": "zero1", "zero2": "zero2", "fsdp": "zero1",
                                    "fsdp-reshard": "fsdp-whole-grads"}
Collective = Callable[[float, int, Link], float]


def core_sharding(sharding: str, d: int) -> Sharding | None:
    """The core sharding whose memory `sharding` has over d ranks (None: nothing sharded)."""
    kind = CORE_KIND[sharding]
    return None if kind is None or d == 1 else Sharding(d, kind).check()


def optimizer_bytes(parts: ParamBytes) -> int:
    """Bytes the optimizer step reads and writes per parameter: the weight it updates (the master copy
    where there is one), the gradient and the state read; the weight and the state written, and the
    weights' own copy too where a master copy is kept.

    >>> from zbsearch.core.sharding import param_bytes
    >>> optimizer_bytes(param_bytes(2, "adam")), optimizer_bytes(param_bytes(4, "sgd"))
    (28, 20)
    """
    updated = parts.master or parts.weights
    return updated + parts.grads + parts.state + updated + parts.state + (parts.weights if parts.master else 0)


@dataclass(frozen=True)
class RankTraffic:
    """One pipeline rank's data-parallel terms for a step (microseconds): `start`, the weights' gather its
    first forward waits for (fsdp: at the step's start; zero1, zero2: after the previous optimizer step);
    `mid`, the gradient syncs that may run during the step (zero2's first m - 1 reduce-scatters); `final`,
    the sync after its last pass; `optimizer`, its optimizer step."""

    start: float = 0.0
    mid: float = 0.0
    final: float = 0.0
    optimizer: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class DataParallel:
    """The data-parallel group of a shape: `sharding` over `d` ranks (routed experts over d / ep), `m`
    microbatches, over `link`; bytes per parameter `parts`; HBM bytes per microsecond for the optimizer."""

    sharding: str
    d: int
    ep: int
    m: int
    link: Link
    parts: ParamBytes
    hbm_bytes_per_us: float

    def _both(self, op: Collective, per_param: float, dense: float, expert: float) -> float:
        """`op` over the d ranks for the dense parameters, and over d / ep for the routed experts'."""
        return op(dense * per_param, self.d, self.link) + op(expert * per_param, self.d // self.ep, self.link)

    def traffic(self, dense: float, expert: float) -> RankTraffic:
        """The terms of a rank holding these parameters (see the module's table)."""
        w, g = self.parts.weights, self.parts.grads
        shard = dense + expert if self.sharding == "ddp" else dense / self.d + expert / (self.d // self.ep)
        optimizer = shard * optimizer_bytes(self.parts) / self.hbm_bytes_per_us
        if self.sharding == "ddp":
            return RankTraffic(final=self._both(all_reduce, g, dense, expert), optimizer=optimizer)
        sync = self._both(reduce_scatter, g, dense, expert)
        start = 0.0 if self.sharding == "fsdp-reshard" else self._both(all_gather, w, dense, expert)
        mid = (self.m - 1) * sync if self.sharding == "zero2" else 0.0
        return RankTraffic(start, mid, sync, optimizer)

    def layer_gather(self, params: LayerParams) -> float:
        """One gather of a layer's weights (fsdp-reshard, per pass)."""
        return self._both(all_gather, self.parts.weights, params.dense, params.expert)


def sharded_layers(layers: Sequence[Layer], params: Sequence[LayerParams], dp: DataParallel) -> tuple[Layer, ...]:
    """The layers with their static bytes as the sharding leaves them on one GPU (dense parameters over d,
    routed experts over d / ep; core.sharding's bytes per parameter) and the buffer a layer gathers while it
    computes (fsdp-whole-grads)."""
    kind = CORE_KIND[dp.sharding] or "zero1"  # zero1 over one rank keeps everything: ddp
    dense_share = Sharding(dp.d if CORE_KIND[dp.sharding] else 1, kind)
    expert_share = Sharding(dp.d // dp.ep if CORE_KIND[dp.sharding] else 1, kind)
    out = []
    for layer, own in zip(layers, params):
        static = own.dense * dense_share.per_param(dp.parts) + own.expert * expert_share.per_param(dp.parts)
        gather = own.dense * dense_share.gathered_per_param(dp.parts) + \
            own.expert * expert_share.gathered_per_param(dp.parts)
        out.append(replace(layer, static_bytes=static, gather_bytes=gather, params=round(own.dense + own.expert)))
    return tuple(out)


def reshard_gathers(layers: Sequence[Layer], params: Sequence[LayerParams], dp: DataParallel) -> tuple[Layer, ...]:
    """fsdp-reshard: each layer's weights are gathered for its forward and for its input backward, the
    gather prefetched while the previous layer of that pass runs (the layer before it in F, after it in I);
    what the gather takes beyond that pass is added to the layer's pass. The embedding's backward needs no
    weights (a scatter-add into its gradient). Other shardings: the layers unchanged."""
    if dp.sharding != "fsdp-reshard" or dp.d == 1:
        return tuple(layers)
    gathers = [dp.layer_gather(own) for own in params]
    out = []
    for k, layer in enumerate(layers):
        before = layers[k - 1].F if k > 0 else 0.0
        after = layers[k + 1].B if k + 1 < len(layers) else 0.0
        extra_f = max(0.0, gathers[k] - before)
        extra_b = max(0.0, gathers[k] - after) if layer.B > 0 else 0.0
        fused = None if layer.full_backward is None else layer.full_backward + extra_b
        out.append(replace(layer, F=layer.F + extra_f, B=layer.B + extra_b, full_backward=fused,
                           details={**layer.details, "gather_exposed_us": {"F": extra_f, "I": extra_b}}))
    return tuple(out)


def sharding_record(dp: DataParallel) -> dict[str, Any] | None:
    """What the profile's details.static.sharding says (core.profile.Profile.sharding reads degree and how),
    None when nothing is sharded."""
    core = core_sharding(dp.sharding, dp.d)
    if core is None:
        return None
    experts = f"; routed experts over {dp.d // dp.ep}" if dp.ep > 1 else ""
    return {"degree": core.degree, "how": core.how, "what": f"{dp.sharding}: {core.describe()}{experts}",
            "bytes_per_param": core.per_param(dp.parts), "gathered_bytes_per_param": core.gathered_per_param(dp.parts)}

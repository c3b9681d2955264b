"""One tensor-parallel rank's layers as a shape runs them: the estimate of its share (profiling's `tp_shard`)
with what joins the ranks added: the tensor-parallel and expert-parallel collectives in the passes, the
sequence split of the hidden-wide activations, each expert-parallel rank's share of the routed experts, and
the pipeline hop over the link two neighbouring stages share.

- Tensor parallelism with sequence parallelism (Shoeybi et al., Megatron-LM, arXiv:1909.08053; Korthikanti
  et al., "Reducing Activation Recomputation in Large Transformer Models", MLSys 2023, section 4.2.2): each
  of a block's two tensor-parallel regions (attention, MLP) opens with an all-gather of the b*s*h activation
  (sequence shards to whole) and closes with a reduce-scatter of the same size, and the backward does the
  conjugate pair, so F and I (torch's input backward, our B) each add 2 all-gathers + 2 reduce-scatters of
  b*s*h elements over the link inside the node. They are exposed (no asynchronous tensor parallelism). The
  re-gather of the sequence-sharded linear inputs for the weight gradient, which Megatron overlaps with the
  input-gradient matrix multiply (Korthikanti et al. 4.2.2), is left out. The vocabulary-parallel embedding
  reduce-scatters its b*s*h output in F and all-gathers its output gradient in its backward (W: it has no
  I); the output head all-gathers its input in F and reduce-scatters the input gradient in I.
- Sequence parallelism shards the hidden-wide activations over the t ranks (Korthikanti et al., their
  34/t): of the inventory profiling/transformer.py counts, a block's saved tensors SP_SAVED, W's inputs
  SP_KEPT and the norm output gradients torch's I stores, SP_STORED, are divided by t, as are the block's
  full-recompute input and its output (the stage's send). The head's and embedding's own tensors are left
  whole (they over-count the head's norm input and output by (1 - 1/t) x 2*b*s*h bytes).
- Expert parallelism (MoE blocks; ep ranks drawn from the data-parallel ranks): each rank holds
  experts / ep of the routed experts, and F and I each add a dispatch and a combine all-to-all of
  b*s*top_k*h elements (Lepikhin et al., GShard, arXiv:2006.16668; the DeepSeek-V3 report's dispatch and
  combine) over the link the ep group spans.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from ...core.errors import PlanError
from ...core.layers import Layer
from ...core.recompute.levels import held_from_f
from ...core.recompute.options import RecomputeOption
from ...profiling.request import DTYPE_BYTES, LlamaShape, MoeShape
from ...profiling.transformer import Tensor, saved_for_B, stored_for_W, kept_for_W
from .cluster import Cluster
from .collectives import all_gather, all_to_all, point_to_point, reduce_scatter
from .shape import RunShape
from .workload import Workload

# Hidden-wide tensors sequence parallelism divides by t, by their names in profiling/transformer.py.
SP_SAVED = ("attention norm input", "attention norm 1/rms (fp32)", "q, k, v projection input (normed)",
            "MLP norm input", "MLP norm 1/rms (fp32)", "MLP input (normed)")
SP_KEPT = ("q, k, v projection input", "MLP input (normed)")
SP_STORED = ("attention norm output gradient", "MLP norm output gradient")


@dataclass(frozen=True)
class LayerParams:
    """A layer's parameters on one GPU: `dense`, synced over the d data-parallel ranks, and `expert`, its
    share of the routed experts, synced over the d / ep ranks that hold the same experts."""

    name: str
    dense: float
    expert: float = 0.0


@dataclass(frozen=True)
class BlockComm:
    """What the collectives add to one pass of a layer, per microbatch (microseconds)."""

    forward: float = 0.0
    backward: float = 0.0  # torch's I (our B)
    weight: float = 0.0  # W (the embedding's backward)


def tp_block_comm(shape: RunShape, model: LlamaShape, dtype: str, cluster: Cluster) -> float:
    """A block's tensor-parallel collectives in one pass (F, or I): 2 all-gathers and 2 reduce-scatters of
    b*s*h elements over the link the t ranks share."""
    nbytes = shape.b * model.seq * model.hidden * DTYPE_BYTES[dtype]
    link = cluster.link_for(shape.t)
    return 2 * (all_gather(nbytes, shape.t, link) + reduce_scatter(nbytes, shape.t, link))


def ep_block_comm(shape: RunShape, model: LlamaShape, dtype: str, cluster: Cluster) -> float:
    """A MoE block's dispatch and combine all-to-alls in one pass (F, or I): b*s*top_k*h elements each over
    the link the ep group spans (stride t: it spans t*ep GPUs)."""
    if not isinstance(model, MoeShape):
        return 0.0
    nbytes = shape.b * model.seq * model.top_k * model.hidden * DTYPE_BYTES[dtype]
    return 2 * all_to_all(nbytes, shape.ep, cluster.link_for(shape.t * shape.ep))


def hop_times(shape: RunShape, model: LlamaShape, dtype: str, cluster: Cluster) -> tuple[float, ...]:
    """Each pipeline boundary's hop: the b*s*h activation, / t under sequence parallelism, as one message
    over the link stages k and k + 1 share. Mesh order pp, dp, tp (tp innermost, as torchtitan's): stage k
    holds GPUs k*t*d .. (k+1)*t*d - 1 and a GPU's neighbour is t*d further, so boundary k stays in a node
    when GPUs k*t*d .. (k+2)*t*d - 1 do."""
    nbytes = shape.b * model.seq * model.hidden * DTYPE_BYTES[dtype] / shape.t
    width, node = shape.t * shape.d, cluster.gpus_per_node
    links = [cluster.intra if (k * width) // node == ((k + 2) * width - 1) // node else cluster.inter
             for k in range(shape.p - 1)]
    return tuple(point_to_point(nbytes, link) for link in links)


def _named(tensors: list[Tensor], names: Sequence[str]) -> float:
    """Bytes per token of the named tensors (every name must be in the inventory)."""
    found = dict(tensors)
    missing = [name for name in names if name not in found]
    if missing:
        raise PlanError(f"the activation inventory no longer lists {missing[0]!r}, which sequence parallelism "
                        "divides: update plan/wholerun/parallel_layers.py's names", subject="model")
    return float(sum(found[name] for name in names))


def sequence_split(model: LlamaShape, i: int, t: int, dtype: str, attention: str) -> tuple[float, float, float]:
    """Bytes sequence parallelism takes off block i per microbatch: (saved for I, kept for W, stored by
    torch's I for W), (1 - 1/t) of the SP_* tensors. `model` is the tensor-parallel share at b sequences."""
    d, tokens, share = DTYPE_BYTES[dtype], model.micro_batch * model.seq, 1 - 1 / t
    return (tokens * share * _named(saved_for_B(model, i, d, attention), SP_SAVED),
            tokens * share * _named(kept_for_W(model, i, d), SP_KEPT),
            tokens * share * _named(stored_for_W(model, i, d), SP_STORED))


def _option(option: RecomputeOption, comm: float, cut: tuple[float, float, float], t: int) -> RecomputeOption:
    """A block's recompute option under the shape: full recompute keeps the block's input (sequence-sharded,
    / t) and reruns the forward with its collectives; every option holds what I rebuilds less the split."""
    held_cut = cut[0] + cut[2]
    if option.level == "full":
        return replace(option, time=option.time + comm, mem_B=option.mem_B / t, mem_W=option.mem_W - held_cut,
                       peak=option.peak - held_cut)
    return replace(option, mem_B=option.mem_B - cut[0], mem_W=option.mem_W - held_cut, peak=option.peak - held_cut)


def _block(layer: Layer, comm: BlockComm, cut: tuple[float, float, float], t: int) -> Layer:
    """A block with its collectives in F and I and its activations sequence-sharded (cut: sequence_split)."""
    saved, kept = held_from_f(layer) - cut[0], layer.mem_W - cut[1]
    held_w = None if layer.mem_W_torch is None else layer.mem_W_torch - cut[0] - cut[2]
    return replace(_with_comm(layer, comm), mem_B=max(saved, kept), mem_W=kept, mem_B_torch=saved,
                   mem_W_torch=held_w, out_bytes=layer.out_bytes / t,
                   recompute=tuple(_option(o, comm.forward, cut, t) for o in layer.recompute))


def _with_comm(layer: Layer, comm: BlockComm) -> Layer:
    fused = None if layer.full_backward is None else layer.full_backward + comm.backward + comm.weight
    return replace(layer, F=layer.F + comm.forward, B=layer.B + comm.backward, W=layer.W + comm.weight,
                   full_backward=fused, details={**layer.details, "collectives_us": {
                       "F": comm.forward, "I": comm.backward, "W": comm.weight}})


def routed_expert_params(model: LlamaShape, i: int) -> float:
    """Block i's routed experts' weights in the tensor-parallel share `model` (0 for a dense block)."""
    if not isinstance(model, MoeShape) or not model.is_moe(i):
        return 0.0
    return 3.0 * model.hidden * model.expert_size * model.experts


def shape_layers(layers: Sequence[Layer], workload: Workload, shape: RunShape, share: LlamaShape,
                 cluster: Cluster) -> tuple[tuple[Layer, ...], tuple[LayerParams, ...]]:
    """The estimated layers of the tensor-parallel share `share` (at b sequences) as the shape runs them, and
    each layer's parameters on one GPU (see the module). Static bytes are left to data-parallel sharding."""
    dtype, t = workload.dtype, shape.t
    edge = _edge_comm(shape, share, dtype, cluster)
    tp = tp_block_comm(shape, share, dtype, cluster)
    ep = ep_block_comm(shape, share, dtype, cluster)
    out, params = [], []
    for layer in layers:
        total = float(layer.params if layer.params is not None else 0)
        if layer.kind != "decoder":
            out.append(_with_comm(replace(layer, out_bytes=layer.out_bytes / t if layer.kind == "embedding"
                                          else layer.out_bytes), edge[layer.kind]))
            params.append(LayerParams(layer.name, total))
            continue
        i = int(layer.name.rsplit(".", 1)[1])
        routed = routed_expert_params(share, i)
        moe = ep if routed else 0.0
        cut = sequence_split(share, i, t, dtype, workload.attention) if t > 1 else (0.0, 0.0, 0.0)
        out.append(_block(layer, BlockComm(tp + moe, tp + moe), cut, t))
        params.append(LayerParams(layer.name, total - routed, routed / shape.ep))
    return tuple(out), tuple(params)


def _edge_comm(shape: RunShape, model: LlamaShape, dtype: str, cluster: Cluster) -> dict[str, BlockComm]:
    """The embedding's and the head's tensor-parallel collectives (see the module)."""
    nbytes = shape.b * model.seq * model.hidden * DTYPE_BYTES[dtype]
    link = cluster.link_for(shape.t)
    gather, scatter = all_gather(nbytes, shape.t, link), reduce_scatter(nbytes, shape.t, link)
    return {"embedding": BlockComm(forward=scatter, weight=gather), "output": BlockComm(gather, scatter),
            "other": BlockComm(), "mtp": BlockComm()}

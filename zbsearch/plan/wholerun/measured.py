"""Measured layer costs in place of the estimate's, where the user measured the shape's share on the cluster's GPU.

A profile from `zbsearch profile --model M --tp T --micro-batch B` (on a GPU, with CUDA events) records the
share it measured (details.model: the shard's heads, FFN, vocabulary, sequence, microbatch; details.
tensor_parallel) and the device it ran on. A shape of tensor-parallel degree t and microbatch size b uses such a
profile when its share is the shard `tp_shard(model at b, t)` exactly, its dtype is the workload's and its
device is the cluster's GPU kind: then every layer's times, activation bytes and recompute options are the
measured ones, layer by layer by name; the whole-run costs (collectives, sequence split, sharding) are added to
them as to an estimate. Blocks measured on a shorter model (4 of 32, say) do not match: a shape uses a
measurement of its whole share or none.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Sequence

from ...core.errors import PlanError, about
from ...core.profile import Profile, load_profile
from ...profiling.request import LlamaShape

SHAPE_KEYS = ("model", "layers", "hidden", "heads", "kv_heads", "ffn", "seq", "micro_batch", "vocab", "head_dim",
              "dense_layers", "experts", "top_k", "expert_ffn", "shared_experts")
# What a measured layer brings; the estimate keeps its name, kind, static bytes and FLOP details.
MEASURED_FIELDS = ("F", "B", "W", "full_backward", "mem_B", "mem_W", "mem_B_torch", "mem_W_torch", "mem_kept_torch",
                   "recompute", "out_bytes")


@lru_cache(maxsize=64)
def load_measured(path: str) -> Profile:
    """A measured profile, read once per process (the pool's workers each read it once)."""
    with about("measured"):
        profile = load_profile(path)
    if profile.source.get("kind") != "measured" or not profile.layers:
        raise PlanError(f"profile {path} is not a measured profile that lists its layers (source.kind "
                        f"{profile.source.get('kind')!r}): give profiles written by zbsearch profile on a GPU",
                        subject="measured")
    return profile


def matches(profile: Profile, share: LlamaShape, dtype: str, gpu: str) -> bool:
    """Whether `profile` measured exactly `share` in `dtype` on a GPU of kind `gpu`."""
    model = profile.details.get("model") or {}
    want = share.describe()
    same_shape = all(model.get(k) == want.get(k) for k in SHAPE_KEYS if k in want or k in model)
    device = str(profile.source.get("device", "")).lower()  # torch's name of the GPU: "NVIDIA H200"
    return same_shape and profile.details.get("dtype") == dtype and gpu.lower() in device


def with_measured(estimated: Profile, measured: Sequence[str], share: LlamaShape, dtype: str,
                  gpu: str) -> tuple[Profile, Profile | None]:
    """The estimated profile with the first matching measurement's layer costs in it (and that measurement),
    or the estimate unchanged (and None)."""
    for path in measured:
        profile = load_measured(path)
        if matches(profile, share, dtype, gpu):
            by_name = {layer.name: layer for layer in profile.layers or ()}
            layers = tuple(replace(layer, **{f: getattr(by_name[layer.name], f) for f in MEASURED_FIELDS})
                           for layer in estimated.layers or ())
            return replace(estimated, layers=layers), profile
    return estimated, None


def measured_method(profile: Profile) -> str:
    """What the profile's source says of the measurement the layers came from."""
    return (f"layer times, activation bytes and recompute options measured, not estimated: profile {profile.name} "
            f"({profile.source.get('device', '?')}, {profile.source.get('date', '?')}), replacing the estimate layer "
            "by layer; FLOP counts (for MFU) stay the estimator's")

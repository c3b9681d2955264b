"""A profile's static bytes under data-parallel sharding (core/sharding.py says what each sharding keeps):
every layer's static bytes rescaled, its FSDP gather buffer added, and its stages summed again.

A layer's `static_bytes` is the one source of its static memory: the parameters sharding divides are
`static_bytes / bytes_per_param` (details.static.bytes_per_param, from the weights' dtype and the
optimizer). A layer's `params` is informative only; a profile whose static bytes were scaled by hand (to
emulate tensor parallelism, say) shards what it states.
"""

from __future__ import annotations

from dataclasses import replace

from .errors import ProfileError
from .layers import Layer
from .partition import chunk_static, layers_by_stage
from .profile import Profile
from .sharding import DTYPE_BYTES, OPTIMIZER_STATE_BYTES, ParamBytes, Sharding, param_bytes
from .stage_cost import StageCost


def _parts(profile: Profile) -> ParamBytes:
    """The profile's bytes per parameter by holder, from what it records (details.dtype and
    details.static.optimizer, as zbsearch profile writes them)."""
    static = profile.details.get("static") or {}
    dtype, optimizer = profile.details.get("dtype"), static.get("optimizer")
    if dtype not in DTYPE_BYTES or optimizer not in OPTIMIZER_STATE_BYTES:
        raise ProfileError(f"profile {profile.label} does not record its weights' dtype and optimizer (fields "
                           "details.dtype and details.static.optimizer, as zbsearch profile writes them): sharding "
                           "needs them to split its static bytes; profile the model again, or add them")
    parts = param_bytes(DTYPE_BYTES[dtype], optimizer)
    recorded = static.get("bytes_per_param")
    if recorded is not None and recorded != parts.total:
        raise ProfileError(f"profile {profile.label} records {recorded} bytes per parameter but {dtype} weights with "
                           f"{optimizer} make {parts.total}: fix details.static.bytes_per_param or details.dtype")
    return parts


def _params(profile: Profile, parts: ParamBytes) -> list[float]:
    layers = profile.layers or ()
    if not layers:
        raise ProfileError(f"profile {profile.label} lists no layers: sharding rescales each layer's static bytes "
                           "and adds the largest layer's gathered ones; use a profile with layers (zbsearch profile "
                           "writes them)")
    # static_bytes, not params: the one source of a layer's static memory (see the module docstring).
    return [layer.static_bytes / parts.total for layer in layers]


def shard_profile(profile: Profile, sharding: Sharding) -> Profile:
    """`profile` with every layer's static bytes as `sharding` leaves them on a pipeline rank, its FSDP
    gather buffer (`gather_bytes`), its stages' static bytes from their layers (details.partition), and
    `details.static.sharding` saying how. A degree of 1 returns the profile unchanged.

    Raises
    ------
    ProfileError
        The sharding is out of range; the profile is sharded already, lists no layers, or does not
        record its dtype, optimizer or stage split.
    """
    sharding.check()
    if sharding.degree == 1:
        return profile
    static = dict(profile.details.get("static") or {})
    if "sharding" in static:
        raise ProfileError(f"profile {profile.label} is {static['sharding'].get('what', 'sharded')} already: shard "
                           "the unsharded profile once")
    parts = _parts(profile)
    keep, gather = sharding.per_param(parts), sharding.gathered_per_param(parts)
    layers = tuple(replace(layer, static_bytes=n * keep, gather_bytes=n * gather)
                   for layer, n in zip(profile.layers or (), _params(profile, parts)))
    static["sharding"] = {"degree": sharding.degree, "how": sharding.how, "bytes_per_param": keep,
                          "gathered_bytes_per_param": gather, "what": sharding.describe()}
    return replace(profile, layers=layers, stages=_stages(profile, layers),
                   details={**profile.details, "static": static})


def _stages(profile: Profile, layers: tuple[Layer, ...]) -> tuple[StageCost, ...]:
    """The profile's stages with static bytes summed from their (sharded) layers, plus their largest
    gather buffer."""
    grouped = layers_by_stage(profile, layers, "sharding sums each stage's static bytes from its layers")
    return tuple(replace(stage, static_bytes=chunk_static(group)) for stage, group in zip(profile.stages, grouped))

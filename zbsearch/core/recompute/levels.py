"""Recompute chosen for a profile's layers: a layer run at a recompute level (core/recompute/options.py says what
the options are), the `--recompute` values that choose levels, and a profile with its layers' levels
applied, its stages summed again from them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from ..errors import ProfileError, ScheduleError
from ..partition import layers_by_stage, summed
from ..plan_record import PlanRecord
from ..profile import Profile
from .options import LEVELS, RecomputeOption


def option_of(layer: Any, level: str) -> RecomputeOption | None:
    """The layer's option at `level` (core.layers.Layer), None where it has none."""
    return next((o for o in layer.recompute if o.level == level), None)


def recomputed(layer: Any, level: str) -> Any:
    """The layer (core.layers.Layer) run at `level`: its pass that pays the recompute takes the extra
    time (its fused backward too), it holds the option's bytes from F until I and from I until W under
    torch's runtime, and it lists no options any more (they apply to the layer as profiled). Unchanged at
    none, or where the layer has no such option."""
    option = option_of(layer, level) if level != "none" else None
    if option is None:
        return layer
    extra_b, extra_w = (option.time, 0.0) if option.pays == "I" else (0.0, option.time)
    # Under the paper's accounting what W needs (mem_W) is held from I until W whatever F kept: with
    # recompute that can be more than F holds, and B's end then adds the difference.
    # After W a recomputed layer keeps nothing on a chunk that does not compute the loss: its rebuilt
    # activations hang on handles that reference no autograd node (profiling/recompute_once.py), so the
    # nodes only I ran go with the graph. Without recompute, what a layer keeps there (mem_kept_torch)
    # is held where a node saves its own output and the measuring saved-tensor hooks (probe.py, the
    # profiler) hold that output with its node: a cycle. Measured: ZB-V p=2 m=4, rank 1, every block
    # recomputed, 46.7 MB held against 59.4 MB predicted with the kept bytes, 48.8 MB without.
    kept = None if layer.mem_kept_torch is None else 0.0
    return replace(layer, B=layer.B + extra_b, W=layer.W + extra_w,
                   full_backward=None if layer.full_backward is None else layer.full_backward + option.time,
                   mem_B=option.mem_B, mem_W=layer.mem_W, mem_B_torch=option.mem_B,
                   mem_W_torch=option.mem_W, mem_kept_torch=kept, recompute=(), as_profiled=layer,
                   details={**layer.details, "recomputed": {"level": level, "time": option.time,
                                                            "saved_from_f": held_from_f(layer) - option.mem_B}})


def held_from_f(layer: Any) -> float:
    """What a layer holds from F until I as profiled (torch's figure where measured)."""
    return layer.mem_B_torch if layer.mem_B_torch is not None else layer.mem_B


def recompute_facts(chunks: Sequence[Sequence[Any]], recomputing: Sequence[int]) -> dict[str, Any]:
    """What recompute does on a rank: the layers of its chunks recomputed (with their level), how many
    microbatches recompute on each chunk (`recomputing`, one count per chunk; a plan may recompute only
    some), the time it adds per iteration, and the bytes it saves from F until I per recomputed microbatch."""
    chosen = [[(layer.name, layer.details["recomputed"]) for layer in layers if "recomputed" in layer.details]
              if count else [] for layers, count in zip(chunks, recomputing)]
    return {"recomputed": [{"layer": name, "level": info["level"]} for mine in chosen for name, info in mine],
            "recomputed_microbatches": [count if mine else 0 for mine, count in zip(chosen, recomputing)],
            "recompute_time": sum(count * info["time"] for mine, count in zip(chosen, recomputing) for _, info in mine),
            "recompute_saved_bytes": sum(info["saved_from_f"] for mine in chosen for _, info in mine)}


def plan_levels(plan: PlanRecord, name: str, layers: set[str], fix: str) -> dict[str, str]:
    """A plan's recompute levels (layer name to full or selective), checked against the layers its chunks
    hold; `fix` ends the error for a layer it does not hold.

    Raises
    ------
    ScheduleError
        The plan names a layer outside `layers`.
    """
    for layer in plan.levels:
        if layer not in layers:
            raise ScheduleError(f"schedule {name!r} plan.recompute names layer {layer!r}, which {fix}")
    return plan.levels


def parse_recompute(text: str, layers: Sequence[Any]) -> dict[str, str]:
    """The level of every layer a `--recompute` value asks for, by layer name (layers left out run at
    none): `none`; `full` or `selective` on every layer that lists that option; `fixed:SPEC`, SPEC a
    comma list of layer names or ranges `first..last`, each with `=full` (the default) or `=selective`.

    >>> from types import SimpleNamespace as L
    >>> layers = [L(name=f"layers.{i}", recompute=(L(level="full"),)) for i in range(4)]
    >>> parse_recompute("fixed:layers.1..layers.2,layers.3=full", layers)
    {'layers.1': 'full', 'layers.2': 'full', 'layers.3': 'full'}
    """
    value = text.strip()
    if value == "none":
        return {}
    if value in LEVELS:
        chosen = {x.name: value for x in layers if option_of(x, value) is not None}
        if not chosen:  # recomputing nothing would plan as if the flag were not given
            why = " (estimates list it only for naive attention, which keeps the s x s probabilities)" \
                if value == "selective" else ""
            raise ProfileError(f"recompute {value}: no layer of the profile lists a {value} option{why}; "
                               "use full, auto or fixed:NAME=LEVEL with the levels its layers list")
        return chosen
    if not value.startswith("fixed:") or not value[len("fixed:"):].strip():
        raise ProfileError(f"recompute {text!r} is not known: use none, auto, auto-layers, full, selective or fixed:NAME[=LEVEL],... "
                           "(layer names or first..last ranges, level full or selective)")
    names = [x.name for x in layers]
    chosen = {}
    for item in value[len("fixed:"):].split(","):
        span, _, level = item.strip().partition("=")
        level = level.strip() or "full"
        if level not in ("full", "selective"):
            raise ProfileError(f"recompute fixed:{item.strip()} asks for level {level!r}: use full or selective")
        first, _, last = span.partition("..")
        for name in (first.strip(), last.strip() or first.strip()):
            if name not in names:
                raise ProfileError(f"recompute fixed:{item.strip()} names layer {name!r}, which the profile does not "
                                   f"list: use its layer names ({names[0]} ... {names[-1]})")
        i, j = names.index(first.strip()), names.index(last.strip() or first.strip())
        for layer in layers[min(i, j):max(i, j) + 1]:
            if option_of(layer, level) is None:
                raise ProfileError(f"recompute fixed:{item.strip()} asks layer {layer.name!r} for {level}, which it "
                                   "does not list as an option: choose another level or leave the layer out")
            chosen[layer.name] = level
    return chosen


def with_recompute(profile: Profile, levels: Mapping[str, str], restage: bool = True) -> Profile:
    """`profile` with each layer named in `levels` run at its level (`recomputed`), and (with `restage`)
    its stages (the profile's own split, details.partition.layers_per_stage) summed again from its
    layers. Unchanged when `levels` is empty.

    Raises
    ------
    ProfileError
        `levels` names a layer the profile does not list, or a level that layer has no option for.
    """
    if not levels:
        return profile
    layers = tuple(recomputed(layer, levels.get(layer.name, "none")) for layer in profile.layers or ())
    missing = set(levels) - {layer.name for layer in layers if "recomputed" in layer.details}
    if missing:
        name = sorted(missing)[0]
        raise ProfileError(f"recompute names layer {name!r} at {levels[name]}, which profile {profile.label} does not "
                           "list with that option: use the profile the plan was made on")
    if not restage:
        return replace(profile, layers=layers)
    grouped = layers_by_stage(profile, layers, "recompute sums its stages from their layers")
    stages = tuple(summed(group, k == len(grouped) - 1, k == 0) for k, group in enumerate(grouped))
    return replace(profile, layers=layers, stages=stages)

"""What a plan was made under besides its order of passes: one frozen record a `Schedule` carries.

A plan made on a layer-level profile fixes the split of the layers over its chunks (names, module paths
and kinds per global chunk), the recompute level of each layer it recomputes and, where only some
microbatches recompute, which ones on each chunk. Every plan records the memory accounting and the
data-parallel sharding it was made under, and the memory limit, so that a plan file shown, validated,
plotted or exported later is costed as `solve` costed it. The simulator, the Problem, the validator, the
exports and `run` read this record; only the schedule format (core/ir.py) turns it into JSON and back:

    "plan": {"split": {"chunks": [["tok_embeddings", "layers.0"], ["layers.1", "norm+output"]],
                       "modules": [...], "kinds": [...]},
             "recompute": {"layers.1": "full"}, "recompute_microbatches": [[], [0, 3]],
             "memory_model": "torch-runtime", "sharding": {"degree": 8, "how": "fsdp"}, "mem_limit": "42GiB"}

Files written before the record existed kept the split, levels and choice in `meta.partition` (the same
keys, the split's flat); they load into the same record.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from .errors import PartitionError, ProfileError, ScheduleError
from .layers import LAYER_KINDS
from .sharding import Sharding

# Per chunk, the microbatches that run its recomputed layers with recompute (None: all of them); the
# others keep their activations. A plan without such a choice recomputes every microbatch.
Choice = tuple[frozenset[int] | None, ...]
LEGACY_FIELD = "meta.partition"


def choice_recomputes(chosen: Choice | None, chunk: int, microbatch: int) -> bool:
    """Whether, under the choice `chosen`, the microbatch runs the chunk's recomputed layers with recompute."""
    entry = None if chosen is None else chosen[chunk]
    return entry is None or microbatch in entry


@dataclass(frozen=True)
class Split:
    """Per global chunk: layer names, the module paths they cover, and each layer's kind."""

    chunks: tuple[tuple[str, ...], ...]
    modules: tuple[tuple[str, ...], ...]
    kinds: tuple[tuple[str, ...], ...]

    @property
    def num_chunks(self) -> int:
        return len(self.chunks)

    def to_json(self) -> dict[str, list[list[str]]]:
        return {"chunks": [list(c) for c in self.chunks], "modules": [list(m) for m in self.modules],
                "kinds": [list(k) for k in self.kinds]}


@dataclass(frozen=True)
class PlanRecord:
    """The split, recompute, memory accounting, sharding and limit a plan was made under (None: not
    recorded; a plan on a stage-level profile has no split and recomputes nothing)."""

    split: Split | None = None
    recompute: tuple[tuple[str, str], ...] = ()  # (layer name, full or selective), in the split's order
    recompute_microbatches: Choice | None = None
    memory_model: str | None = None
    sharding: Sharding | None = None
    mem_limit: str | None = None

    @property
    def levels(self) -> dict[str, str]:
        """The recompute level of every layer the plan recomputes, by layer name: those of `recompute` that
        some microbatch recomputes (a layer every chunk holding it runs with an empty choice costs as
        profiled there, so the plan does not recompute it; `recompute` keeps it, for a choice that may
        change)."""
        idle = self._idle_layers()
        return {name: level for name, level in self.recompute if name not in idle}

    def _idle_layers(self) -> set[str]:
        chosen = self.recompute_microbatches
        if chosen is None or self.split is None or len(chosen) != self.split.num_chunks:
            return set()
        chunks = self.split.chunks
        busy = {name for c, names in enumerate(chunks) if chosen[c] is None or chosen[c] for name in names}
        return {name for c, names in enumerate(chunks) if chosen[c] is not None and not chosen[c]
                for name in names} - busy

    def with_choice(self, chosen: Choice | None) -> "PlanRecord":
        return replace(self, recompute_microbatches=chosen)

    def recomputes(self, chunk: int, microbatch: int) -> bool:
        """Whether the microbatch runs the chunk's recomputed layers with recompute."""
        return choice_recomputes(self.recompute_microbatches, chunk, microbatch)

    def levels_for_every_microbatch(self, microbatches: int) -> tuple[dict[str, str], dict[int, list[int]]]:
        """What a trainer that recomputes a layer for every microbatch (torchtitan, Megatron) runs of the
        plan: its levels less the layers of chunks on which no microbatch recomputes, and the chunks that
        recompute only some microbatches, each with them (sorted). There such a trainer recomputes them
        all: more time than the plan, no more memory."""
        levels, chosen = self.levels, self.recompute_microbatches
        if chosen is None or self.split is None or self.split.num_chunks != len(chosen):
            return levels, {}
        chunks = self.split.chunks
        idle = {layer for c, entry in enumerate(chosen) if entry is not None and not entry for layer in chunks[c]}
        partial = {c: sorted(entry) for c, entry in enumerate(chosen)
                   if entry and len(entry) < microbatches and any(layer in levels for layer in chunks[c])}
        return {layer: level for layer, level in levels.items() if layer not in idle}, partial

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.split is not None:
            out["split"] = self.split.to_json()
        if self.levels:
            out["recompute"] = self.levels
        if self.recompute_microbatches is not None:
            out["recompute_microbatches"] = [None if e is None else sorted(e) for e in self.recompute_microbatches]
        if self.memory_model is not None:
            out["memory_model"] = self.memory_model
        if self.sharding is not None:
            out["sharding"] = {"degree": self.sharding.degree, "how": self.sharding.how}
        if self.mem_limit is not None:
            out["mem_limit"] = self.mem_limit
        return out


def plan_from_json(raw: Any, name: str, num_chunks: int, microbatches: int, legacy: bool = False) -> PlanRecord:
    """The record a schedule file of `num_chunks` chunks and `microbatches` states: its `plan` object, or
    (`legacy`) the `meta.partition` object of a file written before the record existed.

    Raises
    ------
    ScheduleError
        A field is not of its form; the message names the field as the file spells it.
    """
    where = LEGACY_FIELD if legacy else "plan"
    if not isinstance(raw, dict):
        raise ScheduleError(f"schedule {name!r} field {where} must be a JSON object")
    split_raw = raw if legacy else raw.get("split")
    has_split = split_raw is not None and (not legacy or "chunks" in raw)
    split = _split(split_raw, f"schedule {name!r}", LEGACY_FIELD if legacy else "plan.split") if has_split else None
    return PlanRecord(split, _levels(raw.get("recompute"), name, where),
                      _choice(raw.get("recompute_microbatches"), f"schedule {name!r} {where}.recompute_microbatches",
                              num_chunks, microbatches),
                      _word(raw, "memory_model", name, where), _sharding(raw.get("sharding"), name, where),
                      _word(raw, "mem_limit", name, where))


def _lists(raw: Any, field: str, origin: str) -> tuple[tuple[str, ...], ...]:
    if not isinstance(raw, list) or not all(isinstance(c, list) and all(isinstance(x, str) for x in c) for c in raw):
        raise PartitionError(f"{origin}: field {field} must be a list of lists of strings, one list per stage")
    return tuple(tuple(c) for c in raw)


def _split(raw: Any, origin: str, where: str) -> Split:
    """A split, checked. `modules` defaults to the layer names and `kinds` to "other" when left out."""
    if not isinstance(raw, dict) or "chunks" not in raw:
        raise PartitionError(f"{origin}: field {where} must be an object with chunks (layer names per stage), modules "
                            "and kinds")
    chunks = _lists(raw["chunks"], f"{where}.chunks", origin)
    modules = _lists(raw["modules"], f"{where}.modules", origin) if "modules" in raw else chunks
    kinds = _lists(raw["kinds"], f"{where}.kinds", origin) if "kinds" in raw else \
        tuple(("other",) * len(c) for c in chunks)
    if len(modules) != len(chunks) or len(kinds) != len(chunks):
        raise PartitionError(f"{origin}: {where} lists {len(chunks)} chunks of layers but {len(modules)} of modules "
                            f"and {len(kinds)} of kinds: give one entry per stage in each")
    for c, (names, ks) in enumerate(zip(chunks, kinds)):
        if len(ks) != len(names):
            raise PartitionError(f"{origin}: {where} chunk {c} has {len(names)} layers but {len(ks)} kinds: give one "
                                "kind per layer")
        bad = [k for k in ks if k not in LAYER_KINDS]
        if bad:
            raise PartitionError(f"{origin}: {where} chunk {c} has layer kind {bad[0]!r}: use one of "
                                f"{', '.join(LAYER_KINDS)}")
    return Split(chunks, modules, kinds)


def _levels(raw: Any, name: str, where: str) -> tuple[tuple[str, str], ...]:
    field = f"schedule {name!r} {where}.recompute"  # no "field": the wording plan readers have always used
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ScheduleError(f"{field} must map layer names to full or selective: give {{\"layers.3\": \"full\"}}")
    for layer, level in raw.items():
        if level not in ("full", "selective"):
            raise ScheduleError(f"{field} gives layer {layer!r} level {level!r}: use full or selective")
    return tuple((str(layer), str(level)) for layer, level in raw.items())


def _choice(raw: Any, field: str, num_chunks: int, microbatches: int) -> Choice | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != num_chunks:
        raise ScheduleError(f"{field} must list one entry per chunk ({num_chunks}): each a list of microbatch "
                            "indices that recompute, or null for all of them")
    out: list[frozenset[int] | None] = []
    for c, entry in enumerate(raw):
        if entry is None:
            out.append(None)
            continue
        ok = isinstance(entry, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in entry)
        if not ok or len(set(entry)) != len(entry) or any(not 0 <= i < microbatches for i in entry):
            raise ScheduleError(f"{field}[{c}] must list microbatch indices from 0 to {microbatches - 1}, each "
                                "once (or be null for all of them)")
        out.append(frozenset(entry))
    return tuple(out)


def _word(raw: Mapping[str, Any], key: str, name: str, where: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise ScheduleError(f"schedule {name!r} field {where}.{key} must be a string")
    return value


def _sharding(raw: Any, name: str, where: str) -> Sharding | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or "degree" not in raw:
        raise ScheduleError(f"schedule {name!r} field {where}.sharding must be an object with degree and how, e.g. "
                            "{\"degree\": 8, \"how\": \"fsdp\"}")
    try:
        return Sharding(raw["degree"], str(raw.get("how", "fsdp"))).check()
    except ProfileError as exc:
        raise ScheduleError(f"schedule {name!r} field {where}.sharding: {exc}") from None


def levels_in_order(levels: Mapping[str, str], order: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """`levels` as a record's pairs, in the order of the layer names `order` (then any others)."""
    known = [(n, levels[n]) for n in order if n in levels]
    return tuple(known + sorted((n, lv) for n, lv in levels.items() if n not in set(order)))

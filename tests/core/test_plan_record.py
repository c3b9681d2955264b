"""The plan record a schedule carries (core/plan_record.py): written as a file's top-level `plan` object and
read back field by field; a file written before the record (its facts in `meta.partition`) loads into the
same record; a malformed field is refused as the file loads, in one line naming the field as the file
spells it."""

from __future__ import annotations

import copy
import json
from dataclasses import fields, replace

import pytest

from zbsearch.core.errors import PartitionError, ScheduleError
from zbsearch.core.ir import Schedule
from zbsearch.core.plan_record import PlanRecord, Split
from zbsearch.core.sharding import Sharding
from zbsearch.schedules import generate

from plans import with_legacy_plan, with_plan

SPLIT = Split(chunks=(("tok_embeddings", "layers.0"), ("layers.1",), ("layers.2",), ("layers.3", "output")),
              modules=(("tok_embeddings", "layers.0"), ("layers.1",), ("layers.2",), ("layers.3", "norm", "output")),
              kinds=(("embedding", "decoder"), ("decoder",), ("decoder",), ("decoder", "output")))
FULL = PlanRecord(SPLIT, (("layers.1", "full"), ("layers.0", "selective")),
                  (frozenset({0, 2}), None, frozenset(), frozenset({1, 2, 3})),
                  "torch-runtime", Sharding(8, "zero2"), "42GiB")
PLAN_JSON = {
    "split": {"chunks": [["tok_embeddings", "layers.0"], ["layers.1"], ["layers.2"], ["layers.3", "output"]],
              "modules": [["tok_embeddings", "layers.0"], ["layers.1"], ["layers.2"], ["layers.3", "norm", "output"]],
              "kinds": [["embedding", "decoder"], ["decoder"], ["decoder"], ["decoder", "output"]]},
    "recompute": {"layers.1": "full", "layers.0": "selective"},
    "recompute_microbatches": [[0, 2], None, [], [1, 2, 3]],
    "memory_model": "torch-runtime", "sharding": {"degree": 8, "how": "zero2"}, "mem_limit": "42GiB",
}


def planned() -> Schedule:
    """An interleaved plan (2 ranks, 4 chunks, 4 microbatches) carrying every field of the record."""
    schedule = generate("interleaved-1f1b", 2, 4)
    return replace(schedule, meta={**schedule.meta, "note": "kept"}, plan=FULL)


def test_a_full_record_round_trips_field_by_field(tmp_path) -> None:
    schedule = planned()
    data = schedule.to_dict()
    assert data["plan"] == PLAN_JSON and "partition" not in data["meta"]
    back = Schedule.from_dict(json.loads(json.dumps(data)))
    for f in fields(PlanRecord):
        assert getattr(back.plan, f.name) == getattr(FULL, f.name), f.name
    assert back.plan == FULL and list(back.plan.levels) == ["layers.1", "layers.0"]  # the order as written
    assert back.meta == schedule.meta and back == schedule
    schedule.save(tmp_path / "plan.json")
    assert Schedule.load(tmp_path / "plan.json").plan == FULL
    assert json.loads((tmp_path / "plan.json").read_text())["plan"] == PLAN_JSON


def test_a_record_writes_only_the_fields_it_has() -> None:
    bare = generate("1f1b", 2, 4)
    assert bare.plan == PlanRecord() and "plan" not in bare.to_dict()
    assert Schedule.from_dict(bare.to_dict()).plan == PlanRecord()
    limited = replace(bare, plan=PlanRecord(memory_model="paper", mem_limit="2p"))
    assert limited.to_dict()["plan"] == {"memory_model": "paper", "mem_limit": "2p"}
    assert Schedule.from_dict(limited.to_dict()).plan == limited.plan


def test_with_choice_replaces_only_the_microbatches_that_recompute() -> None:
    schedule = planned()
    chosen = (None, frozenset({3}), None, None)
    changed = schedule.with_choice(chosen)
    assert changed.plan == replace(FULL, recompute_microbatches=chosen) and changed.ranks == schedule.ranks
    assert schedule.plan == FULL  # the schedule is frozen: a new one is returned
    assert Schedule.from_dict(changed.to_dict()).plan.recompute_microbatches == chosen


def test_a_legacy_file_loads_into_the_record_the_new_format_states() -> None:
    schedule = planned()
    new = Schedule.from_dict(schedule.to_dict())
    data = generate("interleaved-1f1b", 2, 4).to_dict()
    flat = {**copy.deepcopy(PLAN_JSON["split"]), **{k: v for k, v in PLAN_JSON.items() if k != "split"}}
    legacy = Schedule.from_dict({**data, "meta": {**data["meta"], "note": "kept", "partition": flat}})
    for f in fields(PlanRecord):
        assert getattr(legacy.plan, f.name) == getattr(new.plan, f.name), f.name
    assert legacy.plan == FULL
    assert "partition" not in legacy.meta and legacy.meta == new.meta  # moved out of meta into the record
    again = legacy.to_dict()  # written again: the new format
    assert again["plan"] == PLAN_JSON and "partition" not in again["meta"]
    # The helper the other tests use reads the same way; a partition without chunks has no split.
    assert with_legacy_plan(generate("interleaved-1f1b", 2, 4), flat).plan == FULL
    levels_only = with_legacy_plan(generate("interleaved-1f1b", 2, 4), {"recompute": {"layers.1": "full"}})
    assert levels_only.plan == PlanRecord(recompute=(("layers.1", "full"),))


def test_levels_for_every_microbatch_leave_out_idle_chunks_and_name_partial_ones() -> None:
    # Chunk 2 (layers.2) recomputes no microbatch: its levels go; chunk 0 recomputes 0 and 2 of 4 and holds a
    # recomputed layer; chunk 3 recomputes 1-3 but holds none of the plan's levels.
    plan = replace(FULL, recompute=(("layers.1", "full"), ("layers.0", "selective"), ("layers.2", "full")))
    levels, partial = plan.levels_for_every_microbatch(4)
    assert levels == {"layers.1": "full", "layers.0": "selective"} and partial == {0: [0, 2]}
    assert FULL.with_choice(None).levels_for_every_microbatch(4) == (FULL.levels, {})
    assert replace(FULL, split=None).levels_for_every_microbatch(4) == (FULL.levels, {})


def _set(path: str, value):
    """A change to a plan object: the value at a dotted path (None deletes it)."""
    def change(plan: dict) -> dict:
        *above, last = path.split(".")
        here = plan
        for key in above:
            here = here[key]
        if value is None:
            del here[last]
        else:
            here[last] = value
        return plan
    return change


@pytest.mark.parametrize("change, error, message", [
    (_set("split", []), PartitionError, "schedule 'interleaved-1f1b': field plan.split must be an object with chunks"),
    (_set("split.chunks", "layers"), PartitionError, "schedule 'interleaved-1f1b': field plan.split.chunks must be a "
                                                     "list of lists of strings"),
    (_set("split.modules", [["a"]] * 3), PartitionError, "schedule 'interleaved-1f1b': plan.split lists 4 chunks of "
                                                         "layers but 3 of modules and 4 of kinds"),
    (_set("split.kinds", [["embedding"], ["decoder"], ["decoder"], ["decoder", "output"]]), PartitionError,
     "schedule 'interleaved-1f1b': plan.split chunk 0 has 2 layers but 1 kinds"),
    (_set("split.kinds", [["embedding", "block"], ["decoder"], ["decoder"], ["decoder", "output"]]), PartitionError,
     "schedule 'interleaved-1f1b': plan.split chunk 0 has layer kind 'block'"),
    (_set("recompute", ["layers.1"]), ScheduleError, "schedule 'interleaved-1f1b' plan.recompute must map layer "
                                                     "names to full or selective"),
    (_set("recompute", {"layers.1": "half"}), ScheduleError, "schedule 'interleaved-1f1b' plan.recompute gives "
                                                             "layer 'layers.1' level 'half': use full or selective"),
    (_set("recompute_microbatches", [None]), ScheduleError, "schedule 'interleaved-1f1b' "
                                                            "plan.recompute_microbatches must list one entry per "
                                                            "chunk (4)"),
    (_set("recompute_microbatches", [[4], None, None, None]), ScheduleError, "schedule 'interleaved-1f1b' "
     "plan.recompute_microbatches[0] must list microbatch indices from 0 to 3, each once"),
    (_set("memory_model", 3), ScheduleError, "schedule 'interleaved-1f1b' field plan.memory_model must be a string"),
    (_set("mem_limit", 42), ScheduleError, "schedule 'interleaved-1f1b' field plan.mem_limit must be a string"),
    (_set("sharding", 8), ScheduleError, "schedule 'interleaved-1f1b' field plan.sharding must be an object with "
                                         "degree and how"),
    (_set("sharding", {"degree": 0, "how": "fsdp"}), ScheduleError, "schedule 'interleaved-1f1b' field "
                                                                    "plan.sharding: data-parallel shard degree 0 is "
                                                                    "out of range"),
    (_set("sharding", {"degree": 8, "how": "zero9"}), ScheduleError, "schedule 'interleaved-1f1b' field "
                                                                     "plan.sharding: sharding 'zero9' is not known"),
])
def test_a_malformed_plan_field_is_a_one_line_error_naming_it(change, error, message) -> None:
    data = planned().to_dict()
    data["plan"] = change(copy.deepcopy(data["plan"]))
    with pytest.raises(error) as err:
        Schedule.from_dict(data)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_plan_that_is_not_an_object_is_refused() -> None:
    data = generate("1f1b", 2, 4).to_dict()
    with pytest.raises(ScheduleError) as err:
        Schedule.from_dict({**data, "plan": "abc"})
    assert str(err.value) == "schedule '1f1b' field plan must be a JSON object"
    with pytest.raises(ScheduleError) as err:
        Schedule.from_dict({**data, "meta": {"partition": ["abc"]}})
    assert str(err.value) == "schedule '1f1b' field meta.partition must be a JSON object"


@pytest.mark.parametrize("partition, error, message", [
    ({"chunks": "layers"}, PartitionError, "schedule '1f1b': field meta.partition.chunks must be a list of lists"),
    ({"chunks": [["a"], ["b"]], "modules": [["a"]]}, PartitionError, "schedule '1f1b': meta.partition lists 2 chunks "
                                                                     "of layers but 1 of modules"),
    ({"recompute": {"a": "half"}}, ScheduleError, "schedule '1f1b' meta.partition.recompute gives layer 'a' level "
                                                  "'half'"),
    ({"recompute_microbatches": [[0, 0], None]}, ScheduleError, "schedule '1f1b' "
                                                                "meta.partition.recompute_microbatches[0] must list"),
])
def test_a_malformed_legacy_field_names_meta_partition(partition, error, message) -> None:
    with pytest.raises(error) as err:
        with_legacy_plan(generate("1f1b", 2, 4), partition)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_with_plan_states_the_new_format() -> None:
    schedule = with_plan(generate("interleaved-1f1b", 2, 4), PLAN_JSON)
    assert schedule.plan == FULL
    assert with_plan(schedule, {"mem_limit": "2p"}).plan == replace(FULL, mem_limit="2p")

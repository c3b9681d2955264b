"""Plans for tests: a schedule carrying a plan record as a file would state it.

`with_legacy_plan` states it the way files written before the plan record did (`meta.partition`: the
split's chunks, modules and kinds flat, beside recompute and recompute_microbatches) and loads it
through `Schedule.from_dict`, so every test that builds a plan this way exercises the legacy reader,
and any error it has comes at load, as it would for such a file. `with_plan` states it as a file does
now (a top-level `plan` object). Both keep what the schedule's record already held, the given fields
replacing it. Importable from every test folder (pytest's pythonpath includes tests/).
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from zbsearch.core.ir import Schedule


def _flat(plan: Mapping[str, Any]) -> dict[str, Any]:
    """A plan object as meta.partition stated it: the split's keys at the top."""
    out = {k: v for k, v in plan.items() if k != "split"}
    return {**(plan.get("split") or {}), **out}


def with_legacy_plan(schedule: Schedule, partition: Mapping[str, Any]) -> Schedule:
    """`schedule` as loaded from a file whose `meta.partition` is its record's fields overridden by
    `partition` (chunks, modules, kinds, recompute, recompute_microbatches, ...)."""
    data = schedule.to_dict()
    own = _flat(data.pop("plan", {}))
    data["meta"] = {**schedule.meta, "partition": {**own, **copy.deepcopy(dict(partition))}}
    return Schedule.from_dict(data)


def with_plan(schedule: Schedule, plan: Mapping[str, Any]) -> Schedule:
    """`schedule` as loaded from a file whose `plan` object is its record's fields overridden by `plan`."""
    data = schedule.to_dict()
    data["plan"] = {**data.get("plan", {}), **copy.deepcopy(dict(plan))}
    return Schedule.from_dict(data)

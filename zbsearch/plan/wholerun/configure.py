"""`configure`: plan a whole training run, as one library call (docs/whole-run.md).

It binds the per-shape entry points (evaluate.py) to what the user fixed of the plan itself (`PlanChoices`:
placement, split, recompute) and runs the branch and bound across shapes (search.py). `zbsearch configure`
is a thin layer over it.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from functools import partial
from pathlib import Path

from ...search.options import SearchOptions
from .cluster import Cluster
from .cost import PlanChoices
from .evaluate import bound_shape, evaluate_shape
from .family import check_schedules
from .outcome import Outcome
from .search import Settings, ShapeJobs, search_shapes
from .shape import Space
from .shape_result import ShapeBound, ShapeResult
from .workload import Workload

DEFAULT_SHAPE_SECONDS = 20.0  # the joint search's time on the most promising shape (search.py's TIME RULE)
# Goes into the results file's fingerprint: raise it when a shape's evaluation changes, so that results files
# written by the older code are refused rather than mixed in (2: every schedule keeps the 1F1B family's plan;
# 3: the step bound counts zero2's per-microbatch syncs, step.sync_bound; 4: each rank's gather, work and sync
# together, step.average_rank_bound).
COST_MODEL_VERSION = 4


def shape_jobs(choices: PlanChoices = PlanChoices()) -> ShapeJobs[ShapeBound, ShapeResult]:
    """The per-shape entry points with `choices` bound in (partials of top-level functions pickle)."""
    return ShapeJobs(partial(bound_shape, choices=choices), partial(evaluate_shape, choices=choices),
                     ShapeBound.from_dict, ShapeResult.from_dict)


def configure(workload: Workload, cluster: Cluster, space: Space = Space(), choices: PlanChoices = PlanChoices(),
              options: SearchOptions = SearchOptions(time_limit=DEFAULT_SHAPE_SECONDS),
              settings: Settings = Settings()) -> Outcome[ShapeResult]:
    """The best plan found for `workload` on `cluster` over the shapes of `space` (every shape's plan from the
    schedules `choices.schedules` allows: all, or the 1F1B family alone, family.py), with every shape's fate
    (solved, pruned, refused, failed) and the certificate: under the cost model no shape of the space is more
    than `certificate.gap` faster than the chosen plan. `options.time_limit` is the most promising shape's
    joint-search time (others get less, search.py's TIME RULE); `settings`: workers, Ray, the results file,
    the user's own configuration to evaluate beside it.

    Raises
    ------
    PlanError
        A workload, cluster or space no shape fits (the message names the field and the fix), a schedule set
        other than all and 1f1b-family (or a placement or recompute outside the family), a results file of
        other arguments, an unreachable Ray address.
    """
    workload.check()
    cluster.check()
    space.check()
    check_schedules(choices.schedules, choices.placement, choices.recompute)
    # A measured profile is named by its path in the workload: its content goes into the results file's
    # fingerprint too, so a file remeasured under the same name never reuses the old results.
    contents = {path: hashlib.sha256(Path(path).read_bytes()).hexdigest() for path in workload.measured}
    settings = replace(settings, arguments={**settings.arguments, "measured": contents,
                                            "cost_model_version": COST_MODEL_VERSION})
    return search_shapes(workload, cluster, space, shape_jobs(choices), options, settings)

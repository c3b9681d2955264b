"""What `zbsearch configure` prints: the ranked shapes, the chosen plan, the user's configuration beside it,
the pruned and refused shapes with their reasons and the certificate; the progress line; the chosen plan's
file."""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from rich import box
from rich.console import Console
from rich.table import Table

from ..core.errors import ScheduleError
from ..plan.wholerun.chosen import ChosenPlan
from ..plan.wholerun.cluster import Cluster
from ..plan.wholerun.outcome import Failed, Outcome, SearchProgress
from ..plan.wholerun.shape import Refused
from ..plan.wholerun.shape_result import ShapeResult
from ..plan.wholerun.workload import Workload

GIB = 2**30


@contextmanager
def progress_printer(enabled: bool = True) -> Iterator[Callable[[SearchProgress], None]]:
    """A one-line progress display on stderr (a terminal only): shapes done, pruned, left, the incumbent and
    the certificate so far."""
    console = Console(stderr=True)
    live = enabled and console.is_terminal
    with console.status("bounding shapes", spinner="dots") if live else _nothing() as status:
        def tell(event: SearchProgress) -> None:
            if status is None:
                return
            best = "" if event.incumbent is None or event.step is None else \
                f"; best {event.incumbent.label()} {event.step / 1e6:.3f} s"
            cert = "" if event.certificate is None else f"; within {event.certificate.gap:.1%} of any shape"
            status.update(f"{event.phase}: {event.done} done, {event.pruned} pruned, {event.left} left{best}{cert}")
        yield tell


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def _seconds(us: float) -> str:
    """Seconds to 4 significant figures (a toy model's step is microseconds)."""
    return f"{us / 1e6:.4g}"


def _gap(result: ShapeResult) -> str:
    return "-" if result.bound <= 0 or not math.isfinite(result.step) else f"{result.step / result.bound - 1:.1%}"


def _peak(result: ShapeResult) -> str:
    peak = max(result.peak_bytes, default=0.0)
    cap = result.capacity_bytes or 0.0
    return f"{peak / GIB:.1f}/{cap / GIB:.0f}"


def _row(table: Table, result: ShapeResult, mark: str) -> None:
    s = result.shape
    sched = f"{result.schedule_name or '-'} ({result.placement or '-'})"
    table.add_row(mark, str(s.t), str(s.p), str(s.d), s.sharding, str(s.b), str(s.m), sched,
                  _seconds(result.step), f"{result.tokens_per_s_per_gpu or 0:,.0f}", f"{result.mfu or 0:.1%}",
                  f"{result.bubble_fraction or 0:.1%}", _peak(result), _gap(result))


def ranked_table(outcome: Outcome[ShapeResult], top: int) -> Table:
    table = Table(title="shapes solved, fastest first", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("", "tp", "pp", "dp", "sharding", "b", "m", "schedule (placement)", "step s", "tok/s/GPU",
                 "MFU", "bubble", "peak/cap GiB", "gap"):
        table.add_column(name, justify="left" if name in ("", "sharding", "schedule (placement)") else "right")
    for result in outcome.ranked[:top]:
        _row(table, result, "*" if result is outcome.chosen else "")
    fixed = outcome.fixed
    if isinstance(fixed, ShapeResult) and fixed not in outcome.ranked[:top]:
        _row(table, fixed, "now")
    return table


def _reasons(outcome: Outcome[ShapeResult]) -> list[str]:
    lines = []
    if outcome.pruned:
        lines.append(f"pruned {len(outcome.pruned)} shapes whose bound is no better than the chosen plan, e.g. "
                     f"{outcome.pruned[0].shape.label()}: {outcome.pruned[0].reason}")
    for refused in outcome.refused[:8]:
        lines.append(f"refused {refused.line()}")
    if len(outcome.refused) > 8:
        lines.append(f"... and {len(outcome.refused) - 8} more refused (--json lists them all)")
    lines += [f"failed {f.shape.label()}: {f.reason}" for f in outcome.failed]
    return lines


def render_outcome(console: Console, outcome: Outcome[ShapeResult], workload: Workload, cluster: Cluster,
                   top: int) -> None:
    """The table, the chosen plan in one line, the user's configuration against it, the reasons, the
    certificate."""
    console.print(ranked_table(outcome, top))
    chosen = outcome.chosen
    if chosen is None:
        console.print("no shape gave a plan: see the refused and failed shapes below")
    else:
        console.print(f"chosen: {chosen.shape.label()}, {chosen.schedule_name} on {chosen.placement}, "
                      f"step {_seconds(chosen.step)} s, {chosen.tokens_per_s_per_gpu or 0:,.0f} tokens/s/GPU, MFU "
                      f"{chosen.mfu or 0:.1%} ({workload.global_batch} x {workload.seq} tokens on {cluster.gpus} "
                      f"{cluster.gpu.upper()})")
    fixed = outcome.fixed
    if isinstance(fixed, ShapeResult) and chosen is not None and math.isfinite(fixed.step):
        console.print(f"your configuration {fixed.shape.label()}: step {_seconds(fixed.step)} s; the chosen plan is "
                      f"{fixed.step / chosen.step - 1:.1%} faster")
    elif isinstance(fixed, (Failed, Refused)):
        console.print(f"your configuration: {fixed.reason}")
    for line in _reasons(outcome):
        console.print(line, highlight=False)
    if outcome.certificate is not None:
        console.print(f"certificate: {outcome.certificate.sentence()}")


def write_chosen(plan: ChosenPlan | None, path: Path) -> None:
    """The chosen plan's schedule JSON; `plan` was validated on its shape's profile when it was rebuilt
    (chosen.chosen_plan), once for every file the run writes."""
    if plan is None:
        raise ScheduleError("no shape gave a plan, so there is no plan file to write", subject="output")
    if plan.schedule is None:
        raise ScheduleError(f"the chosen plan {plan.result.shape.label()} runs without a pipeline, so there is no "
                            "schedule file to write", subject="output")
    plan.schedule.save(path)

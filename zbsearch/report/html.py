"""A plan as one self-contained HTML page: timeline, memory, split and levers, quality.

The page works from disk with no network: its style (html_page.css), script (html_page.js, vanilla, no
library) and data (html_data.page_data, JSON in a non-executed script element) are inlined, nothing
is fetched. The tables (quality, split, levers) are written here as HTML, so they read without the
script, print, and reach a screen reader as tables; the script draws the two charts as inline SVG
(zoom, pan, hover and keyboard stepping through the passes).

Pure: `page(timeline, limit, quality)` returns the text; writing it (atomically, after validation) is
the caller's business (cli/report.py). Its parts (`document`, `plan_sections`, `plan_script`, `table`) also
build the whole-run page (configure_html.py), which holds the chosen plan's sections.
"""

from __future__ import annotations

import json
from html import escape
from importlib import resources
from typing import Any, Iterable, Sequence

from ..core.memory import MemoryLimit
from ..core.plan_record import PlanRecord
from ..sim.simulate import Timeline
from .html_data import memory_scale, page_data
from .quality import Quality
from .render import fmt_bytes, fmt_number


def asset(name: str) -> str:
    """A package data file of zbsearch.report (pyproject's package-data ships it)."""
    return resources.files("zbsearch.report").joinpath(name).read_text(encoding="utf-8")


def table(caption: str, head: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> str:
    """An HTML table; cells are escaped, except values wrapped as Raw (already HTML)."""
    def cell(x: Any) -> str:
        return x.html if isinstance(x, Raw) else escape(str(x))
    body = "".join("<tr>" + "".join(f"<td>{cell(x)}</td>" for x in row) + "</tr>" for row in rows)
    th = "".join(f'<th scope="col">{escape(h)}</th>' for h in head)
    return (f'<table class="{cls}"><caption>{escape(caption)}</caption><thead><tr>{th}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


class Raw:
    """HTML that `table` puts in a cell as it is."""

    def __init__(self, html: str) -> None:
        self.html = html


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2%}"


def _num(x: float | None) -> str:
    return "n/a" if x is None else fmt_number(x)


def _quality(q: Quality | None, unit: str) -> str:
    if q is None:
        return "<p>No quality figures were asked for.</p>"
    facts = [("objective", q.objective), (f"{q.objective} ({unit})", _num(q.value)),
             ("lower bound", f"{_num(q.lower_bound)} (from {q.bound_source})"), ("gap", _pct(q.gap)),
             ("status", q.status or "n/a"),
             (f"without the memory cap ({unit})", f"{_num(q.uncapped)} (from {q.uncapped_source})")]
    dl = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in facts)
    rows = [(h.name, h.placement, _num(h.value), _pct(h.bubble), f"{h.peak:.3g}",
             "yes" if h.fits else f"no: {h.reason}") for h in q.handcrafted]
    hand = table(f"Handcrafted schedules on the same profile and limit ({q.objective}, {unit})",
                 ["schedule", "placement", q.objective, "bubble", "busiest peak (stage M_B)", "within the limit"],
                 rows, "handcrafted") if rows else "<p>No handcrafted schedule applies to this p and m.</p>"
    return f'<dl class="facts">{dl}</dl>{hand}'


def _ranges(mbs: frozenset[int] | None, m: int) -> str:
    """Microbatches as ranges: all, none, 0-3, 7."""
    if mbs is None or len(mbs) == m:
        return "all"
    if not mbs:
        return "none"
    out: list[list[int]] = []
    run: list[int] = []
    for i in sorted(mbs):
        if run and i != run[-1] + 1:
            out.append(run)
            run = []
        run.append(i)
    out.append(run)
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in out)


def _chunk_rows(timeline: Timeline, plan: PlanRecord) -> list[tuple[Any, ...]]:
    pl, m = timeline.schedule.placement, timeline.schedule.num_microbatches
    levels = plan.levels
    rows = []
    for c in range(pl.num_chunks):
        names = plan.split.chunks[c] if plan.split is not None and c < plan.split.num_chunks else ()
        layers = (names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}") if names else "stage-level costs"
        recomputed = [f"{n}: {levels[n]}" for n in names if n in levels]
        chosen = None if plan.recompute_microbatches is None else plan.recompute_microbatches[c]
        rc = (", ".join(recomputed) + f" (microbatches {_ranges(chosen, m)})") if recomputed else "none"
        rows.append((c, pl.chunk_to_rank[c], len(names) if names else "", layers, rc))
    return rows


def _rank_rows(timeline: Timeline, limit: MemoryLimit | None) -> list[tuple[Any, ...]]:
    prof, pl = timeline.profile, timeline.schedule.placement
    static = prof.static_bytes_per_rank(pl)
    divisor, unit = memory_scale(timeline)
    rows = []
    for r in range(timeline.num_ranks):
        scale = divisor if unit == "GiB" else prof.stage_mem_B(r)
        cap = "none" if limit is None or limit.unlimited else f"{limit.per_rank[r] / scale:.4g}"
        rows.append((r, ", ".join(map(str, pl.chunks_on(r))), "n/a" if static is None else fmt_bytes(static[r]),
                     f"{timeline.peak_memory(r) / scale:.4g}", cap,
                     fmt_number(timeline.work(r)), fmt_number(timeline.makespan - timeline.work(r))))
    return rows


def _split(timeline: Timeline, limit: MemoryLimit | None) -> str:
    plan = timeline.schedule.plan
    _, unit = memory_scale(timeline)
    t = timeline.profile.time_unit
    levers = [("memory accounting", plan.memory_model or timeline.profile.memory_model),
              ("sharding", "none" if plan.sharding is None else f"{plan.sharding.how} over {plan.sharding.degree}"),
              ("memory limit", "none" if limit is None else limit.text
               + (" (static bytes plus activations)" if limit.includes_static else " (activations)")),
              ("placement", f"{timeline.schedule.placement.name}: chunk c runs on the rank in the table below"),
              ("parameter copies per rank", str(timeline.schedule.placement.param_copies))]
    dl = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in levers)
    chunks = table("Chunks: layers and recompute", ["chunk", "rank", "layers", "which layers", "recompute"],
                   _chunk_rows(timeline, plan), "chunks")
    ranks = table(f"Ranks: static bytes, peak activations and cap ({unit}), work and idle ({t})",
                  ["rank", "chunks", "static bytes", "peak activations", "activation cap", "work", "idle"],
                  _rank_rows(timeline, limit), "ranks")
    return f'<dl class="facts">{dl}</dl>{chunks}{ranks}'


_HELP = ("Hover or click a pass for its details. Keyboard: focus the chart, then Left/Right step through a "
         "rank's passes, Up/Down change rank, C jumps along the critical path, + and - zoom, 0 resets. "
         "Drag or scroll sideways to pan; Ctrl+scroll zooms.")
# The links to plan_sections' headings, for a page's nav.
PLAN_NAV = ('<a href="#timeline-h">Timeline</a> <a href="#memory-h">Memory</a> <a href="#quality-h">Quality</a> '
            '<a href="#split-h">Split and levers</a>')


def data_script(element_id: str, data: Any) -> str:
    """JSON in a script element the browser does not run (the page's script reads it)."""
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return f'<script id="{element_id}" type="application/json">{blob}</script>'


def plan_sections(timeline: Timeline, limit: MemoryLimit | None, quality: Quality | None) -> str:
    """The plan's four sections (timeline, memory, quality, split and levers); html_page.js draws the two
    charts from plan_script's data."""
    name, t = escape(timeline.schedule.name), escape(timeline.profile.time_unit)
    _, unit = memory_scale(timeline)
    return f"""<section aria-labelledby="timeline-h"><h2 id="timeline-h">Timeline</h2>
<p class="help">{escape(_HELP)}</p>
<div class="controls" role="toolbar" aria-label="timeline zoom"><button type="button" id="zoom-in">Zoom in</button>
<button type="button" id="zoom-out">Zoom out</button><button type="button" id="zoom-reset">Whole plan</button></div>
<div id="legend" class="legend"></div>
<div class="chart"><svg id="timeline" tabindex="0" role="img" aria-labelledby="timeline-title timeline-desc"
xmlns="http://www.w3.org/2000/svg"><title id="timeline-title">Timeline of plan {name}</title>
<desc id="timeline-desc">One row per rank, one box per pass, time in {t} to the right; the critical path is
outlined.</desc></svg></div>
<div id="details" class="details" role="status" aria-live="polite">No pass selected.</div>
<div id="tip" class="tip" role="tooltip" hidden></div></section>
<section aria-labelledby="memory-h"><h2 id="memory-h">Memory</h2>
<p class="help">Activation memory of each rank over time ({escape(unit)}, under the plan's
accounting) against its cap (dashed); the dot marks the peak.</p>
<div class="chart"><svg id="memory" role="img" aria-labelledby="memory-title" xmlns="http://www.w3.org/2000/svg">
<title id="memory-title">Activation memory per rank over time</title></svg></div></section>
<section aria-labelledby="quality-h"><h2 id="quality-h">Quality</h2>{_quality(quality, timeline.profile.time_unit)}</section>
<section aria-labelledby="split-h"><h2 id="split-h">Split and levers</h2>{_split(timeline, limit)}</section>"""


def plan_script(timeline: Timeline, limit: MemoryLimit | None) -> str:
    """The plan's data and the script that draws plan_sections' charts from it (it marks the page ready)."""
    return f'{data_script("plan-data", page_data(timeline, limit))}\n<script>{asset("html_page.js")}</script>'


def document(title: str, header: str, main: str, footer: str, scripts: str) -> str:
    """A whole page: the style inline, then `header` and `main` (HTML), `footer` (text), `scripts` (HTML)."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title><style>{asset("html_page.css")}</style></head>
<body><header>{header}</header>
<main>
{main}
</main>
<footer><p>{escape(footer)}</p></footer>
{scripts}</body></html>
"""


def page(timeline: Timeline, limit: MemoryLimit | None, quality: Quality | None = None) -> str:
    """The whole page as one string. `timeline` is a validated plan's (every schedule that leaves zbsearch
    has passed the validator: the caller checks), `limit` the one it was checked at."""
    name, t = escape(timeline.schedule.name), escape(timeline.profile.time_unit)
    sched = timeline.schedule
    headline = (f"{escape(sched.placement.name)} placement, {sched.num_ranks} ranks, {sched.num_microbatches} "
                f"microbatches, {sched.count()} passes; makespan {fmt_number(timeline.makespan)} {t}, bubble "
                f"{timeline.bubble_rate_makespan:.2%}; profile {escape(timeline.profile.name)}")
    header = f'<h1>Plan {name}</h1><p>{headline}</p><nav aria-label="sections">{PLAN_NAV}</nav>'
    return document(f"zbsearch plan {timeline.schedule.name}", header, plan_sections(timeline, limit, quality),
                    "Written by zbsearch report; every pass as simulated on the profile after validation.",
                    plan_script(timeline, limit))

"""A whole-run plan (`zbsearch configure`) as one self-contained HTML page, in the look of the plan report
(html.py): the ranked shapes, a throughput-against-memory scatter (the solved shapes, the chosen one and the
user's configuration marked, the pruned ones apart at the most their bound allows), the shapes refused and
failed with their reasons, the certificate, and the chosen plan's own sections (timeline, memory, quality,
split and levers) where it has a pipeline.

As html.py's page: style, scripts (html_configure.js draws the scatter; html_page.js the plan's charts) and
data (configure_data.run_data, html_data.page_data) inline, nothing fetched; the tables are HTML, so they
read without the script, print and reach a screen reader as tables. Pure: `run_page` returns the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any, Mapping, Sequence

from ..core.memory import MemoryLimit
from ..sim.simulate import Timeline
from .configure_data import RunFacts, Table, fixed_line, not_solved, run_data, shape_label
from .html import PLAN_NAV, Raw, asset, data_script, document, plan_script, plan_sections, table
from .quality import Quality

_SCATTER_HELP = (
    "Each solved shape at its tokens/s per GPU against its busiest GPU's peak memory, coloured by pipeline "
    "degree p; the dashed line is the GPU's memory. Pruned shapes were never solved: each is drawn in the "
    "band on the right at the most its step bound allows, since its memory was not computed. Hover or click a "
    "mark for its figures; keyboard: focus the chart, Left/Right step through the shapes, Home goes to the "
    "chosen one.")


@dataclass(frozen=True)
class ChosenPlan:
    """The chosen plan's validated timeline on its shape's profile, the limit it was checked at and its
    quality figures: what html.py's plan sections draw."""

    timeline: Timeline
    limit: MemoryLimit | None
    quality: Quality | None


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _fig(x: float | None, spec: str = ".4g") -> str:
    return "n/a" if x is None else format(x, spec)


def _ranked(points: Sequence[Mapping[str, Any]]) -> str:
    """The solved shapes, fastest first: shape, plan and figures; the chosen row and the user's marked."""
    with_ep = any(s["ep"] > 1 for s in points)
    head = ["", "tp", "pp", "dp", "sharding", "b", "m"] + (["ep"] if with_ep else []) + [
        "placement", "schedule", "step (s)", "tokens/s/GPU", "MFU", "bubble", "peak / GPU memory (GiB)",
        "gap to its bound"]
    rows = []
    for s in points:
        mark = " ".join(w for w, on in (("chosen", s["chosen"]), ("yours", s["fixed"])) if on)
        rows.append([Raw(f"<strong>{mark}</strong>") if mark else "", s["t"], s["p"], s["d"], s["sharding"], s["b"],
                     s["m"]] + ([s["ep"]] if with_ep else []) + [
            s["placement"] or "none (p = 1)", s["schedule"] or "none (p = 1)", _fig(s["step_s"]),
            _fig(s["tps"], ",.0f"), _pct(s["mfu"]), _pct(s["bubble"]),
            f"{_fig(s['peak_gib'], '.1f')} / {_fig(s['cap_gib'], '.1f')}", _pct(s["gap"])])
    return table("Shapes solved, fastest first (step: the pipeline plus what data parallelism and the optimizer "
                 "add; gap: the step above the bound its solve proved)", head, rows, "ranked")


def _shapes(table_: Table, points: Sequence[Mapping[str, Any]]) -> str:
    cert = table_.get("certificate")
    lines = [f'<p class="cert"><strong>Certificate:</strong> {escape(cert["sentence"])} (its step bound '
             f'{cert["bound"] / 1e6:.4g} s against the plan\'s {cert["step"] / 1e6:.4g} s).</p>'
             if cert else "<p class=\"cert\">No certificate: no shape gave a plan.</p>"]
    mine = fixed_line(table_)
    if mine is not None:
        lines.append(f"<p>{escape(mine)}</p>")
    body = _ranked(points) if points else "<p>No shape was solved.</p>"
    return f'<section aria-labelledby="shapes-h"><h2 id="shapes-h">Shapes</h2>{"".join(lines)}{body}</section>'


def _scatter(solved: int, pruned: int) -> str:
    return f"""<section aria-labelledby="scatter-h"><h2 id="scatter-h">Throughput against memory</h2>
<p class="help">{escape(_SCATTER_HELP)}</p><div id="scatter-legend" class="legend"></div>
<div class="chart"><svg id="scatter" tabindex="0" role="img" aria-labelledby="scatter-title scatter-desc"
xmlns="http://www.w3.org/2000/svg"><title id="scatter-title">Tokens/s per GPU against peak memory per GPU</title>
<desc id="scatter-desc">{solved} solved shapes as filled dots; {pruned} pruned shapes as open triangles at the
throughput their bound allows, apart on the right.</desc></svg></div>
<div id="shape-details" class="details" role="status" aria-live="polite">No shape selected.</div>
<div id="shape-tip" class="tip" role="tooltip" hidden></div></section>"""


def _not_solved(table_: Table, pruned: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    if pruned:
        bounds = [(p["label"], _fig(p["bound_s"]), _fig(p["tps_bound"], ",.0f"), p["reason"]) for p in pruned]
        shapes = "1 shape" if len(pruned) == 1 else f"{len(pruned)} shapes"
        parts.append(f"<details><summary>{shapes} pruned: their step bound is no better than the chosen plan's "
                     "step, so none of them can beat it (the certificate)</summary>"
                     + table("Pruned shapes: not solved", ["shape", "step bound (s)", "tokens/s/GPU at most", "why"],
                             bounds, "pruned") + "</details>")
    rows = not_solved(table_)
    parts.append(table("Shapes refused or failed, with the reason", ["shape", "fate", "why"], rows, "refused")
                 if rows else "<p>No shape was refused or failed.</p>")
    return (f'<section aria-labelledby="unsolved-h"><h2 id="unsolved-h">Pruned, refused and failed</h2>'
            f'{"".join(parts)}</section>')


def _chosen(table_: Table, plan: ChosenPlan | None) -> str:
    chosen = table_.get("chosen")
    if not chosen or chosen.get("timing") is None:
        return ""
    label = escape(shape_label(chosen["shape"]))
    if plan is None:
        intro = (f"The chosen shape {label} has no pipeline (p = 1): each GPU runs every layer, so there is no "
                 "schedule to draw.")
    else:
        intro = (f"The pipeline of the chosen shape {label}: {escape(plan.timeline.schedule.name)} on the "
                 f"{escape(plan.timeline.schedule.placement.name)} placement, on its shape's profile, as zbsearch "
                 f"report draws a plan; times in {escape(plan.timeline.profile.time_unit)}, the pipeline alone (the "
                 "step adds what data parallelism and the optimizer cost).")
    sections = "" if plan is None else plan_sections(plan.timeline, plan.limit, plan.quality)
    return (f'<section aria-labelledby="chosen-h"><h2 id="chosen-h">The chosen plan</h2><p>{intro}</p></section>'
            f"{sections}")


def _headline(facts: RunFacts, table_: Table) -> str:
    chosen = table_.get("chosen")
    run = (f"{facts.global_batch} sequences of {facts.seq} tokens a step on {facts.gpus} {facts.gpu.upper()} GPUs")
    if not chosen or chosen.get("timing") is None:
        return f"{escape(run)}; no shape gave a plan."
    return escape(f"{run}; chosen {shape_label(chosen['shape'])}, {chosen.get('schedule_name') or 'no pipeline'}"
                  f"{' on ' + chosen['placement'] if chosen.get('placement') else ''}: step "
                  f"{chosen['timing']['step_us'] / 1e6:.4g} s, {chosen.get('tokens_per_s_per_gpu') or 0:,.0f} "
                  f"tokens/s/GPU, MFU {_pct(chosen.get('mfu'))}.")


def run_page(facts: RunFacts, table_: Table, plan: ChosenPlan | None = None) -> str:
    """The whole page as one string. `table_`: the search's Outcome.table(); `plan`: the chosen plan's
    validated timeline (None where it has no pipeline or no shape gave a plan)."""
    data = run_data(table_, facts, plan is not None)
    nav = ('<a href="#shapes-h">Shapes</a> <a href="#scatter-h">Throughput against memory</a> '
           '<a href="#unsolved-h">Pruned, refused and failed</a>')
    if table_.get("chosen"):
        nav += ' <a href="#chosen-h">The chosen plan</a>' + (" " + PLAN_NAV if plan is not None else "")
    header = (f"<h1>Whole-run plan: {escape(facts.model)}</h1><p>{_headline(facts, table_)}</p>"
              f'<nav aria-label="sections">{nav}</nav>')
    main = (_shapes(table_, data["shapes"]) + _scatter(len(data["shapes"]), len(data["pruned"]))
            + _not_solved(table_, data["pruned"]) + _chosen(table_, plan))
    scripts = data_script("run-data", data) + f"\n<script>{asset('html_configure.js')}</script>"
    if plan is not None:
        scripts += "\n" + plan_script(plan.timeline, plan.limit)
    return document(f"zbsearch whole-run plan: {facts.model}", header, main,
                    "Written by zbsearch configure; every figure under the whole-run cost model (docs/whole-run.md), "
                    "the chosen plan validated on its shape's profile.", scripts)

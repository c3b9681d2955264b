"""`zbsearch compare` and `zbsearch plot`: the three outputs, rows equal to baseline/solve --json, and
figures that are real PNG / SVG files."""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.studies import compare as cmp
from zbsearch.cli.app import app
from zbsearch.core.profile import uniform_profile
from zbsearch.schedules import REGISTRY

runner = CliRunner()

# Small and uniform: every solve ends at once on a proven bound, so zbsearch's rows are deterministic.
UNIFORM = ["--uniform", "1,2,1,0.1", "-p", "4", "-m", "8"]
LIMITS = ("1p", "2p")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(result) -> str:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR" and len(data) > 1000, path


def assert_svg(path: Path) -> None:
    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag
    assert len(list(root.iter())) > 20, path


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One compare run for the tests below (no figures: they have their own test)."""
    prefix = tmp_path_factory.mktemp("compare") / "results" / "small"
    result = invoke("compare", *UNIFORM, "--mem-limits", ",".join(LIMITS), "--schedules", "handcrafted",
                    "--time-limit", 5, "--figures", "none", "-o", prefix)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return prefix


def _csv(prefix: Path) -> list[dict[str, str]]:
    with open(prefix.with_name(prefix.name + ".csv"), newline="") as fh:
        return list(csv.DictReader(fh))


def test_compare_writes_table_and_csv_with_the_same_rows(compared: Path) -> None:
    md = compared.with_name("small.md").read_text()
    rows = _csv(compared)
    assert md.startswith("# Schedule comparison") and "Regenerate" not in md.splitlines()[1:2]
    # Every handcrafted schedule defined for p=4, m=8 and zbsearch, at each limit.
    assert {r["mem_limit"] for r in rows} == set(LIMITS)
    for limit in LIMITS:
        names = {r["schedule"] for r in rows if r["mem_limit"] == limit}
        assert "zbsearch" in names and "zb-h1" in names and "interleaved-1f1b (v=2)" in names
        assert len(names) == len(REGISTRY) + 1
    table_lines = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| schedule")]
    assert len(table_lines) == len(rows)
    for line, row in zip(table_lines, rows):  # same order, same numbers
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1].startswith(row["mem_limit"])
        assert cells[2] == f"{100 * float(row['bubble_rate']):.2f}%"
        assert ("**over**" in cells[1]) == (row["within_limit"] == "False")
    assert "| schedule | memory limit | bubble rate | makespan (unit) | peak memory per rank (x M_B) | solve time | gap |" in md


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipe", "v-min", "interleaved-1f1b"])
@pytest.mark.parametrize("limit", LIMITS)
def test_handcrafted_rows_equal_baseline_json(compared: Path, name: str, limit: str) -> None:
    result = invoke("baseline", name, *UNIFORM, "--mem-limit", limit, "--json")
    summary = json.loads(result.stdout)
    assert result.exit_code == (0 if summary["valid"] else 1)
    shown = cmp.display_name(name)
    (row,) = [r for r in _csv(compared) if r["schedule"] == shown and r["mem_limit"] == limit]
    assert float(row["bubble_rate"]) == summary["bubble_rate_makespan"]
    assert float(row["makespan"]) == summary["makespan"]
    assert float(row["span"]) == summary["span"]
    assert [float(x) for x in row["peak_memory_per_rank"].split()] == pytest.approx(summary["peak_memory_per_rank"], rel=1e-5)
    assert (row["within_limit"] == "True") == summary["valid"]
    assert row["placement"] == summary["placement"]


@pytest.mark.parametrize("limit", LIMITS)
def test_zbsearch_rows_equal_solve_json(compared: Path, limit: str) -> None:
    result = invoke("solve", *UNIFORM, "--mem-limit", limit, "--time-limit", 5, "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    (row,) = [r for r in _csv(compared) if r["schedule"] == "zbsearch" and r["mem_limit"] == limit]
    assert float(row["bubble_rate"]) == summary["bubble_rate_makespan"]
    assert float(row["makespan"]) == summary["makespan"]
    assert float(row["gap"]) == summary["gap"]
    assert row["status"] == summary["status"]
    assert float(row["bubble_rate_lower_bound"]) == summary["bubble_rate_lower_bound"]
    assert [float(x) for x in row["peak_memory_per_rank"].split()] == pytest.approx(summary["peak_memory_per_rank"], rel=1e-5)
    assert float(row["solve_seconds"]) > 0


def test_span_objective_ranks_by_span() -> None:
    comp = cmp.compare(uniform_profile(1, 1, 1, p=4, m=8), limits=["2p"], schedules="zb-h2,1f1b", objective="span",
                       solve=False)
    by_name = {r.schedule: r for r in comp.rows}
    assert by_name["zb-h2"].bubble_rate == by_name["zb-h2"].bubble_rate_span == pytest.approx(0.0, abs=1e-12)
    assert [r.schedule for r in cmp.sorted_rows(comp.rows)] == ["zb-h2", "1f1b"]


def test_precondition_failures_are_listed_not_fatal() -> None:
    comp = cmp.compare(uniform_profile(1, 1, 1, p=3, m=4), limits=["1p"], schedules="dualpipe,1f1b", solve=False)
    assert [r.schedule for r in comp.rows] == ["1f1b"]
    assert comp.skipped and comp.skipped[0].schedule == "dualpipe"
    assert "dualpipe" in cmp.to_markdown(comp).split("## Not in the tables")[1]


@pytest.mark.parametrize("args,needle", [
    (["--schedules", "zb-h9"], "unknown schedule 'zb-h9'"),
    (["-m", "8,x"], "Invalid value for '-m' / '--microbatches': '8,x'"),
    (["--mem-limits", "1q"], "--mem-limits: memory limit '1q' is not understood: use a multiple of p (1p, 2p, 1.5p), "
                             "a size (48GiB, 40GB, 1000000000), auto or none"),
    (["--objective", "speed"], "--objective: objective 'speed': use one of makespan, span"),
    (["--figures", "gif"], "Invalid value for '--figures': 'gif'"),
])
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    base = {"--schedules": "1f1b", "-m": "8", "--mem-limits": "1p", "--figures": "none"}
    base.update(dict(zip(args[::2], args[1::2])))
    flat = [x for kv in base.items() for x in kv]
    result = invoke("compare", "--uniform", "1,1,1", "-p", "4", *flat, "-o", tmp_path / "x")
    if needle.startswith("Invalid value"):  # a malformed list is a usage error, as a malformed number is
        assert result.exit_code == 2 and needle in " ".join(result.stderr.split())
    else:
        assert needle in assert_one_line_error(result)
    assert not list(tmp_path.iterdir())


def test_figures_are_valid_png_and_svg(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    prefix = tmp_path / "fig"
    result = invoke("compare", *UNIFORM, "--mem-limits", "1p,2p", "--schedules", "zb-h1,zb-v,dualpipe,v-half",
                    "--time-limit", 3, "--figures", "png,svg", "-o", prefix)
    assert result.exit_code == 0, result.stderr
    for kind in ("gantt", "pareto"):
        assert_png(tmp_path / f"fig_{kind}.png")
        assert_svg(tmp_path / f"fig_{kind}.svg")
    assert (tmp_path / "fig.md").exists() and (tmp_path / "fig.csv").exists()
    assert "wrote" in result.stdout


def test_plot_command_draws_any_schedule(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    sched = tmp_path / "dp.json"
    assert invoke("baseline", "dualpipe", "--uniform", "1,1,1", "-p", "4", "-m", "8", "-o", sched).exit_code == 0
    for suffix in ("png", "svg"):
        out = tmp_path / f"dp.{suffix}"
        result = invoke("plot", sched, "--uniform", "1,1,1", "-o", out)
        assert result.exit_code == 0, result.stderr
        (assert_png if suffix == "png" else assert_svg)(out)
    assert "end the name in .png or .svg" in assert_one_line_error(
        invoke("plot", sched, "--uniform", "1,1,1", "-o", tmp_path / "dp.pdf"))
    assert "has 4 ranks" in assert_one_line_error(invoke("plot", sched, "--uniform", "1,1,1", "-p", "3", "-o",
                                                         tmp_path / "x.png"))


def test_gantt_scales_to_16_ranks(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from zbsearch.report.plot import gantt_figure
    from zbsearch.schedules import generate
    from zbsearch.sim.simulate import simulate

    tl = simulate(generate("zb-h1", 16, 24), uniform_profile(1, 1, 1, p=16, m=24))
    fig = gantt_figure(tl)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [f"rank {r}" for r in range(16)]
    # Every rank row is inside the figure and every cell of the chart carries its microbatch number.
    assert len(ax.texts) == sum(len(r) for r in tl.slots)
    bbox = ax.get_position()
    assert 0 < bbox.y0 < bbox.y1 < 1 and 0 < bbox.x0 < bbox.x1 < 1


def test_missing_matplotlib_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    result = invoke("compare", "--uniform", "1,1,1", "-p", "4", "--schedules", "1f1b", "-o", tmp_path / "x")
    assert "zbsearch[plot]" in assert_one_line_error(result)
    assert not list(tmp_path.iterdir())


def test_pareto_points_share_markers_when_they_coincide() -> None:
    from zbsearch.report.plot import ParetoPoint, group_points

    pts = [ParetoPoint("zb-v", 4.0, 0.05), ParetoPoint("torch:ZBVZeroBubble", 4.0, 0.05), ParetoPoint("zb-h1", 4.0, 0.1)]
    assert [[q.label for q in g] for g in group_points(pts)] == [["zb-v", "torch:ZBVZeroBubble"], ["zb-h1"]]


@pytest.mark.torch
def test_torch_builtins_are_rows_when_torch_is_installed() -> None:
    pytest.importorskip("torch")
    assert cmp.torch_available()
    comp = cmp.compare(uniform_profile(1, 1, 1, p=4, m=8), limits=["1p"], schedules="torch", solve=False)
    names = {r.schedule for r in comp.rows}
    assert names == {f"torch:{n}" for n in cmp.TORCH_BUILTINS}
    assert all(r.source == "torch" for r in comp.rows)


def test_a_solved_row_beaten_on_its_own_placement_says_so_plainly() -> None:
    comp = cmp.compare(uniform_profile(1, 1, 1, p=4, m=8), limits=["1p"], schedules="zb-h1", solve=False)
    (fixed,) = comp.rows
    fields = {k: getattr(fixed, k) for k in cmp.Row.__dataclass_fields__}
    worse = cmp.Row(**{**fields, "schedule": "zbsearch", "source": "zbsearch", "makespan": fixed.makespan + 1,
                       "note": "same as one-at-a-time"})
    cmp.note_if_beaten(worse, comp.rows)
    assert worse.beaten_by == "zb-h1"
    assert worse.note == "same as one-at-a-time; zb-h1 on the same placement does better within this limit"
    equal = cmp.Row(**{**fields, "note": "same as zb-h1"})
    cmp.note_if_beaten(equal, comp.rows)
    assert equal.note == "same as zb-h1" and equal.beaten_by is None
    other_placement = cmp.Row(**{**fields, "source": "zbsearch", "placement": "v", "makespan": fixed.makespan + 1})
    cmp.note_if_beaten(other_placement, comp.rows)
    assert other_placement.beaten_by is None


@pytest.mark.parametrize("kwargs,parameter,message", [
    ({"objective": "speed"}, "objective", "objective 'speed': use one of makespan, span"),
    ({"limits": []}, "limits", "limits is empty: give at least one memory limit, e.g. 1p,2p"),
    ({"schedules": "zb-h9"}, "schedules", "schedules: unknown schedule 'zb-h9': use all, handcrafted, torch, none, "
                                          "or names from"),
])
def test_library_errors_name_the_parameter_not_a_flag(kwargs: dict, parameter: str, message: str) -> None:
    with pytest.raises(cmp.CompareInputError) as info:
        cmp.compare(uniform_profile(1, 1, 1, p=4, m=8), solve=False, **kwargs)
    assert info.value.parameter == parameter
    assert str(info.value).startswith(message) and "--" not in str(info.value)


def test_skipped_schedules_are_typed() -> None:
    comp = cmp.compare(uniform_profile(1, 1, 1, p=3, m=4), limits=["1p"], schedules="dualpipe", solve=False)
    (skip,) = comp.skipped
    assert (skip.microbatches, skip.schedule) == (4, "dualpipe") and skip.reason


def _step_value(line, x: float) -> float:
    """The value a where='post' step line takes at x."""
    xs, ys = line.get_xdata(), line.get_ydata()
    return [y for xi, y in zip(xs, ys) if xi <= x][-1]


def test_pareto_frontier_is_the_best_at_or_below_each_memory() -> None:
    """A schedule solved under a larger limit can peak lower than one solved under a smaller limit,
    and be better: from its peak on, the frontier must show it (the issue's 16.70% drawn up to 19 M_B
    while a 16.09% schedule sat at 14.4 M_B)."""
    pytest.importorskip("matplotlib")
    from zbsearch.report.plot import ParetoPoint, frontier, pareto_figure

    s = "zbsearch, linear placement"
    points = [ParetoPoint("zbsearch at 1p", 8.0, 0.30, "zbsearch", 8.0, 0.25, s),
              ParetoPoint("zbsearch at 2p", 16.0, 0.1670, "zbsearch", 16.0, 0.15, s),
              ParetoPoint("zbsearch at 3p", 14.4, 0.1609, "zbsearch", 24.0, 0.15, s),
              ParetoPoint("zb-h1", 8.0, 0.1585)]
    assert frontier(points[:3]) == ([8.0, 14.4], [0.30, 0.1609])
    fig = pareto_figure(points, title="t", objective="makespan", p=8)
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == f"{s}: best found at or below each limit"]
    assert _step_value(line, 8.0) == 0.30
    assert _step_value(line, 14.4) == _step_value(line, 19.0) == _step_value(line, 24.0) == 0.1609
    assert line.get_xdata()[-1] == pytest.approx(24.0 * 1.08)


@pytest.mark.parametrize("placement,says", [("linear", ", on the linear placement only"),
                                            ("auto", ", on the linear and V-shape placements only")])
def test_a_bound_line_says_which_placements_it_holds_on(placement: str, says: str) -> None:
    """Issue 29, defect 7: the linear placement's bound line sat above ZB-V's point, as if ZB-V beat a
    proven bound; the legend now says which placements the bound covers."""
    pytest.importorskip("matplotlib")
    from zbsearch.report.plot import ParetoPoint, pareto_figure
    from zbsearch.studies.figures import placement_words

    over = placement_words(placement)
    points = [ParetoPoint("zbsearch at 1p", 8.0, 0.30, "zbsearch", 8.0, 0.25, "zbsearch", over),
              ParetoPoint("zb-v", 8.0, 0.20)]
    fig = pareto_figure(points, title="t", objective="makespan", p=8)
    labels = [ln.get_label() for ln in fig.axes[0].get_lines()]
    assert f"zbsearch: proven lower bound at that limit{says}" in labels

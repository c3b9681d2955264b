"""`zbsearch configure --html`: the page is written after the search, holds every solved shape and the chosen
plan's passes; a path that cannot be written is one line, before the search, and leaves no file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.ir import Schedule
from zbsearch.report.configure_data import shape_label, solved

runner = CliRunner()
TINY = ["--model", "llama", "--layers", "4", "--hidden", "256", "--heads", "4", "--seq", "128", "--vocab", "1024",
        "--global-batch", "8", "--gpus", "4", "--gpus-per-node", "4", "--micro-batch", "1,2", "--time-limit", "0.5"]


def invoke(*args: object):
    return runner.invoke(app, ["configure", *[str(a) for a in args]], env={"COLUMNS": "300"})


def _embedded(page: str, element: str) -> dict:
    found = re.search(rf'<script id="{element}" type="application/json">(.*?)</script>', page, re.S)
    assert found is not None
    return json.loads(found.group(1).replace("<\\/", "</"))


def test_configure_writes_the_whole_run_page_with_the_chosen_plan(tmp_path: Path) -> None:
    page = tmp_path / "run.html"
    result = invoke(*TINY, "--current", "tp2 pp2 ddp b1", "--html", page, "--json")
    assert result.exit_code == 0, result.stderr
    table = json.loads(result.stdout)  # stdout stays the JSON alone
    text = page.read_text()
    data = _embedded(text, "run-data")
    labels = [shape_label(r["shape"]) for r in solved(table)]
    assert [s["label"] for s in data["shapes"]] == labels and sum(s["chosen"] for s in data["shapes"]) == 1
    # Your configuration was pruned, yet solved: a solved mark, not a pruned one.
    assert [s["label"] for s in data["shapes"] if s["fixed"]] == ["tp2 pp2 dp1 ddp b1 m8"]
    assert [p["label"] for p in data["pruned"]] == [p["label"] for p in table["pruned"] if p["label"] not in labels]
    assert table["certificate"]["sentence"] in text
    chosen = Schedule.from_dict(table["chosen"]["plan"])
    assert len(_embedded(text, "plan-data")["boxes"]) == chosen.count()
    assert [p.name for p in tmp_path.iterdir()] == ["run.html"]  # no temporary file left beside it


@pytest.mark.parametrize("where, says", [("missing/run.html", "does not exist"), (".", "it is a folder")])
def test_an_unwritable_page_is_one_line_before_the_search(tmp_path: Path, where: str, says: str) -> None:
    results = tmp_path / "shapes.jsonl"
    result = invoke(*TINY, "--results", results, "--html", tmp_path / where)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot write ") and says in lines[0], result.stderr
    assert list(tmp_path.iterdir()) == []  # no page, and no shape was searched (no results file)

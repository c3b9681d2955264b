"""The whole-run page (`zbsearch configure --html`) in headless Chromium (tests/browser.py): one test, on the
page of a real (tiny) search, since each starts a browser and a search."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from browser import Page
from zbsearch.cli.app import app
from zbsearch.core.ir import Schedule
from zbsearch.report.configure_data import shape_label, solved

pytestmark = pytest.mark.browser

TINY = ["--model", "llama", "--layers", "4", "--hidden", "256", "--heads", "4", "--seq", "128", "--vocab", "1024",
        "--global-batch", "8", "--gpus", "4", "--gpus-per-node", "4", "--micro-batch", "1,2", "--time-limit", "0.5"]


def test_the_whole_run_page_opens_from_disk_and_draws_every_shape(tmp_path: Path) -> None:
    from matplotlib import image  # defers matplotlib (a test extra) to the one test that decodes a PNG

    path = tmp_path / "run.html"
    result = CliRunner().invoke(app, ["configure", *TINY, "--current", "tp2 pp2 ddp b1", "--html", str(path), "--json"])
    assert result.exit_code == 0, result.stderr
    table = json.loads(result.stdout)
    shapes = solved(table)
    pruned = [p for p in table["pruned"] if p["label"] not in {shape_label(r["shape"]) for r in shapes}]
    assert shapes and pruned
    with Page() as browser:
        browser.open(path)
        assert browser.console_errors() == []
        assert browser.requests() == [path.resolve().as_uri()]  # the page itself, nothing else
        count = "document.querySelectorAll('%s').length"
        assert browser.evaluate(count % "#scatter .shape-pt") == len(shapes)
        assert browser.evaluate(count % "#scatter .pruned-pt") == len(pruned)
        chosen = shape_label(table["chosen"]["shape"])
        assert browser.evaluate("document.querySelector('#scatter .shape-pt.chosen title').textContent"
                                ).startswith(chosen + ":")
        assert browser.evaluate(count % "#scatter .chosen-ring") == 1
        assert browser.evaluate(count % "#timeline rect.box") == Schedule.from_dict(table["chosen"]["plan"]).count()
        # Keyboard: Home on the focused chart selects the chosen shape.
        browser.evaluate("document.getElementById('scatter').focus()")
        for kind in ("keyDown", "keyUp"):
            browser.call("Input.dispatchKeyEvent", {"type": kind, "key": "Home", "code": "Home"}, session=True)
        assert browser.evaluate("document.getElementById('shape-details').textContent").startswith(chosen + ":")
        assert browser.console_errors() == []
        pixels = image.imread(io.BytesIO(browser.screenshot()), format="png")
    assert pixels.shape[0] > 500 and pixels.shape[1] > 800
    rgb = (pixels[..., :3] * 255).astype(np.uint32)
    assert len(np.unique(rgb[..., 0] << 16 | rgb[..., 1] << 8 | rgb[..., 2])) > 50

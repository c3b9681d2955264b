"""The HTML report in a real browser: headless Chromium opens the page from disk (tests/browser.py).

Few on purpose (each starts a browser): one page of a DualPipe plan, which draws every kind of box
(F, B, W and overlapped pairs), checked for console errors, network requests, one box per pass, a hover,
keyboard stepping and a screenshot that is not blank.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from browser import Page
from zbsearch.core.profile import uniform_profile
from zbsearch.report.html import page as html_page
from zbsearch.report.html_data import boxes
from zbsearch.schedules import generate
from zbsearch.sim.simulate import simulate

pytestmark = pytest.mark.browser

P, M = 4, 8


@pytest.fixture(scope="module")
def timeline():
    return simulate(generate("dualpipe", P, M), uniform_profile(1.0, 1.2, 0.8, 0.05, p=P, m=M))


@pytest.fixture(scope="module")
def opened(timeline, tmp_path_factory) -> Iterator[tuple[Page, Path]]:
    path = tmp_path_factory.mktemp("html") / "dualpipe.html"
    path.write_text(html_page(timeline, None))
    with Page() as browser:
        browser.open(path)
        yield browser, path


def _centre(page: Page, i: int) -> tuple[float, float]:
    x, y = page.evaluate(f"""(function () {{
        var r = document.querySelector('#timeline rect.box[data-i="{i}"]').getBoundingClientRect();
        return [r.x + r.width / 2, r.y + r.height / 2]; }})()""")
    return x, y


def test_page_loads_from_disk_without_errors_or_requests_and_draws_every_pass(opened, timeline) -> None:
    browser, path = opened
    assert browser.console_errors() == []
    assert browser.requests() == [path.resolve().as_uri()]  # the page itself, nothing else
    assert browser.evaluate("document.querySelectorAll('#timeline rect.box').length") == timeline.schedule.count()
    assert browser.evaluate("document.querySelectorAll('#memory path.mem-curve').length") == P


def test_hover_shows_the_pass_under_the_pointer(opened, timeline) -> None:
    browser, _ = opened
    drawn = boxes(timeline)
    pair = next(i for i, b in enumerate(drawn) if b[3] == "FB")
    for i in (0, pair, len(drawn) - 1):
        rank, _, _, _, kind, chunk, mb = drawn[i][:7]
        browser.mouse_move(*_centre(browser, i))
        tip = browser.evaluate("document.getElementById('tip').hidden ? '' : document.getElementById('tip').textContent")
        assert tip.startswith(f"chunk {chunk}, kind {kind}, microbatch {mb}, rank {rank}; start "), tip
        assert "waited for " in tip


def test_keyboard_steps_through_a_ranks_passes(opened, timeline) -> None:
    browser, _ = opened
    browser.evaluate("document.getElementById('timeline').focus()")
    first, second = timeline.slots[0][0].action, timeline.slots[0][1].action
    for key, action in (("ArrowRight", first), ("ArrowRight", second)):
        for kind in ("keyDown", "keyUp"):
            browser.call("Input.dispatchKeyEvent", {"type": kind, "key": key, "code": key}, session=True)
        text = browser.evaluate("document.getElementById('details').textContent")
        assert text.startswith(f"chunk {action.chunk}, kind {action.kind.label}, microbatch {action.microbatch}, "
                               "rank 0"), text
    assert browser.console_errors() == []


def test_screenshot_is_not_blank(opened) -> None:
    from matplotlib import image  # defers matplotlib (a test extra) to the one test that decodes a PNG

    browser, _ = opened
    pixels = image.imread(io.BytesIO(browser.screenshot()), format="png")
    assert pixels.shape[0] > 500 and pixels.shape[1] > 800
    rgb = (pixels[..., :3] * 255).astype(np.uint32)
    colours = np.unique(rgb[..., 0] << 16 | rgb[..., 1] << 8 | rgb[..., 2])
    assert len(colours) > 50, len(colours)

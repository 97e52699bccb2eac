"""The HTML report in a real browser, offline: ``herdscope report`` on a sample, opened as a file in
Debian's Chromium (headless, through Playwright; never a downloaded browser) with every network request
aborted, every chart drawn with a size, and a full-page screenshot that is not blank.

Skipped when Chromium or Python Playwright is missing. The screenshot is kept under the test's
tmp_path (the test prints its path).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from analyzer.cli import main
from report_doc import read

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "tcp-incast.pcap"  # a population, an incident (its swim lanes), 5 charts
CHROMIUM = os.environ.get("HERDSCOPE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
WHITE_LEVEL = 245  # a pixel whose every channel is above this counts as white (anti-aliasing stays "white")
MIN_INK_SHARE = 0.03  # the page: at least this share of non-white pixels (text, tables, charts)
MIN_STDDEV = 20.0  # the page's grey levels: a blank (or one-colour) page has about 0
MIN_CHART_INK_SHARE = 0.01  # each chart's box: at least this share (axes, marks, labels)

sync_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is not installed")
Image = pytest.importorskip("PIL.Image", reason="Pillow is not installed")
ImageStat = pytest.importorskip("PIL.ImageStat", reason="Pillow is not installed")
pytestmark = pytest.mark.skipif(not CHROMIUM, reason="Debian's chromium is not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def report_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["report", str(SAMPLE), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def page_of(report_file):
    """The report opened in Chromium with every request but the file itself aborted; yields
    (page, requests attempted other than the file)."""
    url = report_file.as_uri()
    attempted: list[str] = []  # every URL other than the file's, once, whether the route or the event saw it

    def note(other: str) -> None:
        if other != url and other not in attempted:
            attempted.append(other)

    def guard(route):
        if route.request.url == url:
            route.continue_()
        else:
            note(route.request.url)
            route.abort()

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("request", lambda r: note(r.url))
        page.route("**/*", guard)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(url, wait_until="load")
        yield page, attempted, errors
        browser.close()


def test_nothing_is_fetched_and_every_chart_has_a_size(page_of, report_file):
    page, attempted, errors = page_of
    assert attempted == [] and errors == []
    doc = read(report_file.read_text())
    expected = len(doc.named("svg"))
    charted = [s for s in doc.findings() if s.attrs["data-charted"] == "yes"]
    assert expected >= len(charted) + 1 >= 2  # a proof chart per charted finding and the timeline
    boxes = [page.locator("figure.chart > svg").nth(k).bounding_box() for k in range(expected)]
    assert page.locator("svg").count() == expected
    assert all(b and b["width"] > 100 and b["height"] > 50 for b in boxes), boxes
    assert page.locator("#timeline svg").count() == 1
    assert page.locator("#incidents article.incident figure.chart svg").count() >= 1  # the swim lanes
    for s in charted:
        assert page.locator(f"#finding-{s.attrs['data-finding-id']} figure.chart svg").count() >= 1


def test_the_guard_would_catch_a_fetch(page_of):
    """The route guard sees what the page asks for: an image added by hand is attempted and aborted
    (so an empty list above means nothing asked, not that nothing was watched)."""
    page, attempted, _ = page_of
    before = len(attempted)
    page.evaluate("""() => new Promise(done => { const img = new Image(); img.onerror = img.onload = done;
                     img.src = 'http://127.0.0.1:9/probe.png'; })""")
    assert attempted[before:] == ["http://127.0.0.1:9/probe.png"]


def test_screenshot_is_not_blank_and_charts_are_drawn(page_of, tmp_path):
    page, _, _ = page_of
    path = tmp_path / "report.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    image = Image.open(path).convert("L")
    scroll_y = page.evaluate("window.scrollY")
    assert scroll_y == 0  # full-page screenshot coordinates are the document's

    def ink_share(box=None) -> float:
        region = image.crop(box) if box else image
        histogram = region.histogram()
        return sum(histogram[:WHITE_LEVEL]) / max(sum(histogram), 1)

    assert ink_share() > MIN_INK_SHARE
    assert ImageStat.Stat(image).stddev[0] > MIN_STDDEV  # not one flat colour
    svgs = page.locator("figure.chart > svg")
    assert svgs.count() >= 2
    for k in range(svgs.count()):
        b = svgs.nth(k).bounding_box()
        box = (int(b["x"]), int(b["y"]), int(b["x"] + b["width"]), int(b["y"] + b["height"]))
        assert ink_share(box) > MIN_CHART_INK_SHARE, (k, box)

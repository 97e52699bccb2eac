"""The dashboard in a real browser: ``herdscope dashboard`` on a sample, Debian's Chromium headless
through Playwright (never a downloaded browser), the findings rendered, a timeline bar clicked into
its detail, screenshots kept as test artifacts.

Skipped when Chromium or Python Playwright is missing. Screenshots go to ``tests/artifacts/`` (the
test prints the paths); with ``HERDSCOPE_UPDATE_SCREENSHOT=1`` the finding's page is also copied to
``dashboards/screenshot.png``, the picture the README shows.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import detectors
from analyzer import open_capture

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "dns-ttl-herd.pcap"
ARTIFACTS = ROOT / "tests" / "artifacts"
README_SCREENSHOT = ROOT / "dashboards" / "screenshot.png"
CHROMIUM = os.environ.get("HERDSCOPE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
# Headless, and nothing that phones home or updates itself.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]

sync_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is not installed")
pytestmark = pytest.mark.skipif(not CHROMIUM, reason="Debian's chromium is not installed (apt-get install chromium)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    """`python -m analyzer dashboard SAMPLE --port P` (what `herdscope dashboard` runs), up and healthy."""
    port = free_port()
    log = tmp_path_factory.mktemp("dashboard") / "server.log"
    env = dict(os.environ, STREAMLIT_SERVER_HEADLESS="true", PYTHONPATH=str(ROOT))
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "analyzer", "dashboard", str(SAMPLE), "--port", str(port)],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "_stcore/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail(f"the dashboard did not start:\n{log.read_text()}")
                time.sleep(0.3)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


def shot(page, name: str, path: Path | None = None, max_height: int = 6000) -> Path:
    """Screenshot of the whole page: Streamlit scrolls inside its main section, so the window is made
    as tall as that section's content first (at most 6,000 px)."""
    height = page.evaluate("""() => {
        const main = document.querySelector('[data-testid="stMain"]') || document.body;
        return Math.max(main.scrollHeight, document.body.scrollHeight); }""")
    width = page.viewport_size["width"]
    page.set_viewport_size({"width": width, "height": min(max(int(height), 600), max_height)})
    settle(page)
    if path is None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / name
    page.screenshot(path=str(path))
    print(f"screenshot: {path}")
    page.set_viewport_size({"width": width, "height": 1100})
    return path


def settle(page) -> None:
    """Wait until Streamlit has finished the current script run."""
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=60_000)


def test_findings_render_and_a_bar_opens_its_detail(dashboard, browser):
    with open_capture(SAMPLE) as cap:
        expected = detectors.run(cap)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.set_default_timeout(60_000)
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(dashboard)

    page.get_by_role("heading", name="Overview — dns-ttl-herd.pcap").wait_for()
    page.locator("[data-testid='stMetricValue']", has_text="616").wait_for()
    if expected.height == 0:
        page.get_by_text("No findings").wait_for()
        shot(page, "dashboard-overview.png")
        pytest.skip("no detector reports anything on this sample yet: nothing to click")
    timeline = page.locator("[data-testid='stVegaLiteChart']").first
    timeline.locator("svg text", has_text=f"Findings timeline ({expected.height})").wait_for()
    bars = timeline.locator("g.mark-rect path")
    assert bars.count() == expected.height
    settle(page)
    body = page.locator("body").inner_text()
    assert "Click a bar to open that finding" in body
    assert "Transactions per protocol" in body and "dns" in body
    shot(page, "dashboard-overview.png")

    # click the second bar: the Findings page opens on that finding
    label = bars.nth(1).get_attribute("aria-label") or ""
    bars.nth(1).click()
    page.get_by_role("heading", name="Findings — dns-ttl-herd.pcap").wait_for()
    page.get_by_role("heading", name="Evidence frames").wait_for()
    settle(page)
    picked = next(r for r in expected.iter_rows(named=True) if r["finding_id"] in label)
    explanation = page.locator("[data-testid='stAlert']", has_text=picked["explanation"][:40]).first
    # the whole sentence, as the detector wrote it (Streamlit's Markdown draws "->" as an arrow)
    assert " ".join(explanation.text_content().split()) == " ".join(picked["explanation"].replace("->", "→").split())
    line = " ".join(page.locator("code", has_text="wireshark -r").first.text_content().split())
    assert line.startswith(f"wireshark -r {SAMPLE} -Y 'frame.number in {{"), line
    if picked["detector"] == "herd":
        page.locator("svg text", has_text="Herd on api.corp.example").wait_for()
    if shutil.which("tshark"):
        page.get_by_text(f"Frame {picked['evidence_frames'][0]} — DNS").first.wait_for()
    assert not page.locator("[data-testid='stException']").count()
    shot(page, "dashboard-finding.png")
    if os.environ.get("HERDSCOPE_UPDATE_SCREENSHOT") == "1":
        shot(page, "", path=README_SCREENSHOT, max_height=1650)  # down to the proof chart
    assert not errors, errors


def test_transactions_page_renders_its_charts(dashboard, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.set_default_timeout(60_000)
    page.goto(dashboard)
    page.get_by_role("heading", name="Overview — dns-ttl-herd.pcap").wait_for()
    page.locator("[data-testid='stSidebar']").get_by_text("Transactions", exact=True).click()
    page.get_by_role("heading", name="Transactions — dns-ttl-herd.pcap").wait_for()
    page.locator("svg text", has_text="Latency distribution").wait_for()
    page.locator("svg text", has_text="Latency over time").wait_for()
    settle(page)
    assert "Service response time" in page.locator("body").inner_text()
    assert not page.locator("[data-testid='stException']").count()
    shot(page, "dashboard-transactions.png")

"""The viewer page in a real browser: headless Chromium draws a slide with OpenSeadragon over IIIF.

OpenSeadragon is installed from the npm registry into a temporary folder (the
release the server pins) and passed as ``--viewer-js PATH``; it is never part of
wsitool.  Skips with the reason when npm, the package, Chromium, chromedriver or
Selenium is missing.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from wsitool.serve.config import OPENSEADRAGON_VERSION

# serve_slides: a fixture of serve_helpers (registered by tests/conftest.py)
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

REPO = Path(__file__).resolve().parents[2]
SAMPLES_SHARED = Path(os.environ.get("WSITOOL_SHARED", REPO.parent / "shared")) / "samples"
TISSUE = SAMPLES_SHARED / "aperio-cmu1-small-region-jpeg.svs"


def _which(*names):
    for n in names:
        path = shutil.which(n)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def openseadragon_js(tmp_path_factory):
    npm = _which("npm")
    if npm is None:
        pytest.skip("npm is not installed (needed to fetch OpenSeadragon from the npm registry)")
    folder = tmp_path_factory.mktemp("osd")
    res = subprocess.run([npm, "install", "--no-save", "--no-audit", "--no-fund", "--prefix", str(folder),
                          f"openseadragon@{OPENSEADRAGON_VERSION}"], capture_output=True, text=True,
                         timeout=180)
    js = folder / "node_modules" / "openseadragon" / "build" / "openseadragon" / "openseadragon.min.js"
    if res.returncode != 0 or not js.exists():
        pytest.skip(f"npm could not install openseadragon@{OPENSEADRAGON_VERSION}: {res.stderr[-300:]}")
    return js


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    chromium = _which("chromium", "chromium-browser", "google-chrome")
    driver_path = _which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip("Chromium and chromedriver are not installed (Debian: apt-get install chromium "
                    "chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--disable-background-networking", "--window-size=700,600", "--disable-extensions",
                "--no-first-run"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver, script: str, timeout: float = 30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if driver.execute_script(script):
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for: {script}")


FULLY_LOADED = ("return window.viewer && viewer.world.getItemCount() > 0 && "
                "viewer.world.getItemAt(0).getFullyLoaded() && viewer.viewport.getZoom() === "
                "viewer.viewport.getZoom(true);")


def test_openseadragon_draws_the_slide(openseadragon_js, browser, serve_slides):
    if not TISSUE.exists():
        pytest.skip(f"real slide {TISSUE} is absent")
    from PIL import Image

    with serve_slides([TISSUE], threads=2, cache_mb=64, viewer_js=str(openseadragon_js),
                      tile_size=256) as (url, state):
        browser.get(f"{url}/view/{TISSUE.name}")
        _wait(browser, FULLY_LOADED)
        counts = [state.counters.by_kind["iiif"]]
        for _ in range(2):  # zoom in twice, around the centre
            browser.execute_script("viewer.viewport.zoomBy(2.5); viewer.viewport.applyConstraints();")
            _wait(browser, FULLY_LOADED)
            counts.append(state.counters.by_kind["iiif"])
        assert counts[0] > 0 and counts[1] > counts[0] and counts[2] > counts[1], counts
        assert state.counters.by_status.get(200, 0) >= counts[2]
        assert not any(code >= 400 for code in state.counters.by_status), state.counters.by_status
        assert browser.execute_script("return window.wsitoolTiles;") > 0
        assert state.cache.stats().misses > 0
        assert "MPP" in browser.page_source and "0.499" in browser.page_source
        rect = browser.find_element("id", "viewer").rect
        shot = np.asarray(Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("RGB"))
    cx, cy = int(rect["x"] + rect["width"] / 2), int(rect["y"] + rect["height"] / 2)
    centre = shot[cy - 20:cy + 20, cx - 20:cx + 20].astype(float)
    # tissue (H&E: pink / purple), not the page's dark background nor a white gap
    assert 40 < centre.mean() < 235, centre.mean(axis=(0, 1))
    assert centre[..., 0].mean() > centre[..., 1].mean() + 10, centre.mean(axis=(0, 1))


def test_an_unreachable_viewer_script_shows_a_message(browser, serve_slides):
    """Offline (the CDN unreachable: here a closed local port): the pane says why and names
    --viewer-js instead of staying blank.  Needs no npm and no network."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/openseadragon.min.js"  # nothing listens there
    slide = REPO / "samples" / "sample-aperio-jpeg.svs"
    with serve_slides([slide], threads=1, cache_mb=0, viewer_js=dead) as (url, _state):
        browser.get(f"{url}/view/{slide.name}")
        _wait(browser, "var m = document.getElementById('viewer-missing');"
                       "return m !== null && !m.hidden;")
        message = browser.find_element("id", "viewer-missing")
        assert message.is_displayed()
        text = message.text
        assert "--viewer-js" in text and "could not be loaded" in text and dead in text, text
        assert f"openseadragon@{OPENSEADRAGON_VERSION}" in text, text
        rect = message.rect
        assert rect["width"] > 100 and rect["height"] > 30, rect
        assert browser.execute_script("return typeof OpenSeadragon;") == "undefined"

"""The live panel as a room sees it: `python -m simlib live` (Voilà) in headless Chromium at 1280x720 and 1920x1080.

Asserts from the page's own bounding boxes that the figure, every control, Play and Export lie
inside the window with no sideways scrolling, that projector mode sets control text to >= 24 px,
and that no request leaves the machine. Screenshots go to a folder outside the source tree
($SIMLIB_TEST_ARTIFACTS, default <tmp>/simlib-test-artifacts).
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from test_browser_live import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, _alive, _children, _descendants

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("SIMLIB_TEST_ARTIFACTS", Path(tempfile.gettempdir()) / "simlib-test-artifacts"))

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")
pytest.importorskip("voila", reason="Voilà is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def voila(tmp_path_factory) -> Iterator[str]:
    """The server `python -m simlib live` starts (Voilà on 127.0.0.1); yields its base URL."""
    from simlib.app import serve

    tmp = tmp_path_factory.mktemp("voila")
    port = _free_port()
    cmd = serve.build_command(argparse.Namespace(port=port, server="voila", notebook=None, no_browser=True))
    env = serve.server_env(dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), JUPYTER_CONFIG_DIR=str(tmp / "config"),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    log = open(tmp / "voila.log", "wb")
    server = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    kernels: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:  # a TCP connection, not a page: every page load starts a kernel
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("Voilà did not start:\n" + (tmp / "voila.log").read_text()[-3000:])
                time.sleep(0.3)
        yield base, server.pid
    finally:
        kernels.update(_descendants(server.pid))
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        for pid in kernels:
            if _alive(pid):
                os.kill(pid, 9)
        log.close()


# Boxes of what a lecturer must reach, read from the page: name -> [left, top, right, bottom].
BOXES_JS = """() => {
  const out = {};
  const box = (name, el) => { if (!el) { out[name] = null; return; }
    const r = el.getBoundingClientRect(); out[name] = [r.left, r.top, r.right, r.bottom]; };
  box('figure', document.querySelector('.simlib-live img.simlib-figure'));
  box('play', document.querySelector('.simlib-live .widget-play'));
  const buttons = [...document.querySelectorAll('.simlib-live button')];
  box('export', buttons.find(b => b.textContent.includes('Export')));
  [...document.querySelectorAll('.simlib-live .simlib-controls > *')].forEach((el, i) => box('control ' + i + ' '
    + el.textContent.trim().slice(0, 20), el));
  out.scroll = [document.documentElement.scrollWidth, document.documentElement.scrollHeight];
  return out;
}"""

FONTS_JS = """() => [...document.querySelectorAll('.simlib-live .simlib-controls .widget-label, '
  + '.simlib-live .widget-readout, .simlib-live button, .simlib-live select, .simlib-live h2, '
  + '.simlib-live .widget-html-content b')]
  .filter(el => el.getBoundingClientRect().width > 0)
  .map(el => [el.textContent.trim().slice(0, 20), parseFloat(getComputedStyle(el).fontSize)])"""


def _open_panel(page, base: str) -> None:
    page.goto(base + "/")
    page.wait_for_selector(".simlib-live-status [data-redraws='1']", timeout=TIMEOUT_MS)
    page.wait_for_function("() => { const i = document.querySelector('.simlib-live img.simlib-figure');"
                           " return i && i.complete && i.naturalWidth > 0; }", timeout=TIMEOUT_MS)


def _assert_inside(boxes: dict, width: int, height: int) -> None:
    assert boxes["scroll"][0] <= width, f"the page scrolls sideways: {boxes['scroll']}"
    for name, b in boxes.items():
        if name == "scroll":
            continue
        assert b is not None, f"{name} is missing"
        left, top, right, bottom = b
        assert right - left > 0 and bottom - top > 0, f"{name} is not shown: {b}"
        assert left >= 0 and top >= 0 and right <= width + 0.5 and bottom <= height + 0.5, \
            f"{name} {b} is outside the {width}x{height} window"


@pytest.mark.parametrize("width, height", [(1280, 720), (1920, 1080)])
def test_panel_fits_the_window_and_projector_mode_is_readable(voila, width, height):
    voila, _ = voila
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    outside: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(TIMEOUT_MS)
            page.on("request", lambda r: outside.append(r.url)
                    if urlparse(r.url).hostname not in ("127.0.0.1", "localhost", None) else None)
            _open_panel(page, voila)
            page.screenshot(path=str(ARTIFACTS / f"live-{width}x{height}.png"))
            _assert_inside(page.evaluate(BOXES_JS), width, height)
            text = page.inner_text("body")
            assert "Run this cell" not in text and "Presentation Mode" not in text
            assert text.count("Live: BSP, SSP and async") == 1
            assert page.locator(".simlib-live button", has_text="SSP(1)").count() == 1  # shows the current s

            if width == 1920:
                page.locator(".simlib-live button", has_text="projector mode").click()
                page.wait_for_selector(".simlib-live.simlib-projector", timeout=TIMEOUT_MS)
                page.wait_for_timeout(1500)  # the sharper figure arrives after the class
                page.screenshot(path=str(ARTIFACTS / f"live-{width}x{height}-projector.png"))
                _assert_inside(page.evaluate(BOXES_JS), width, height)
                fonts = page.evaluate(FONTS_JS)
                assert len(fonts) > 20
                small = [f for f in fonts if f[1] < 24]
                assert not small, f"text under 24 px in projector mode: {small}"
        finally:
            browser.close()
    assert not outside, f"requests left the machine: {outside}"


def _kernels(server_pid: int) -> list[int]:
    """Kernel processes under the server (their command lines name ipykernel)."""
    out = []
    for pid in _children(server_pid):
        try:
            if b"ipykernel" in Path(f"/proc/{pid}/cmdline").read_bytes() and _alive(pid):
                out.append(pid)
        except OSError:
            pass
    return out


def test_reloading_the_page_leaves_at_most_one_kernel(voila):
    base, server_pid = voila
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.set_default_timeout(TIMEOUT_MS)
            for _ in range(3):
                _open_panel(page, base)
            assert len(_kernels(server_pid)) >= 2  # the reloads did start kernels
            deadline = time.monotonic() + 90  # the server culls unconnected idle kernels
            while len(_kernels(server_pid)) > 1 and time.monotonic() < deadline:
                time.sleep(2)
            assert len(_kernels(server_pid)) <= 1, f"kernels left running: {_kernels(server_pid)}"
        finally:
            browser.close()

"""The live notebook in a real browser: JupyterLab on 127.0.0.1, headless Chromium driven by Playwright.

Opens lessons/live.ipynb, runs it, moves the straggler-severity slider and checks that the panel
re-ran (its status line counts redraws) and that the figure's pixels changed, then presses Play
and checks that simulated time advances on screen, with no error or warning printed by any cell. Screenshots go to $SIMLIB_TEST_ARTIFACTS (default <tmp>/simlib-test-artifacts). Needs Debian's chromium
(apt-get install chromium) and the playwright Python package; no browser is downloaded.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("SIMLIB_TEST_ARTIFACTS", Path(tempfile.gettempdir()) / "simlib-test-artifacts"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
TIMEOUT_MS = 60_000

if not os.path.exists(CHROMIUM):
    pytest.skip("Chromium is not installed (apt-get install -y --no-install-recommends chromium)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")
pytest.importorskip("jupyterlab", reason="JupyterLab is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _descendants(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        for c in _children(todo.pop()):
            seen.append(c)
            todo.append(c)
    return seen


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """JupyterLab serving a copy of lessons/live.ipynb on 127.0.0.1; yields (base url, token)."""
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(REPO / "lessons" / "live.ipynb", root / "live.ipynb")
    # User settings in a private folder: start the default kernel without the "Select Kernel" dialog,
    # and no news toast over the screenshots.
    settings = tmp_path / "lab-settings"
    (settings / "@jupyterlab" / "notebook-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        json.dumps({"autoStartDefaultKernel": True}))
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
           f"--port={port}", f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={token}",
           "--LabApp.expose_app_in_browser=True", "--ServerApp.open_browser=False"]
    log = open(tmp_path / "lab.log", "wb")
    server = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    kernels: set[int] = set()
    try:
        deadline = time.monotonic() + 180  # JupyterLab's start, which a loaded machine stretches to a minute or more
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n" + (tmp_path / "lab.log").read_text()[-3000:])
                time.sleep(0.3)
        yield base, token
    finally:
        # Kernels run in their own sessions, so remember them before asking the server to stop them all.
        kernels.update(_descendants(server.pid))
        try:
            req = urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST")
            urllib.request.urlopen(req, timeout=5).close()
        except OSError:
            server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        for pid in kernels:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        log.close()
        deadline = time.monotonic() + 30  # a SIGKILLed process is gone once the kernel has reaped it
        while [p for p in kernels if _alive(p)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in kernels if _alive(p)], "a kernel outlived the server"


def _canvas_png(page) -> bytes:
    return page.locator(".simlib-live img.simlib-figure").first.screenshot()


def _redraws(page) -> int:
    value = page.locator(".simlib-live-status [data-redraws]").first.get_attribute("data-redraws")
    return int(value or 0)


def test_live_notebook_runs_and_redraws_when_a_slider_moves(lab):
    base, token = lab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1920, "height": 1200})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(f"{base}/lab/tree/live.ipynb?token={token}")
            page.wait_for_function(
                "() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                " && window.jupyterapp.shell.currentWidget.sessionContext", timeout=TIMEOUT_MS)
            # Wait on the document, then the session, then a kernel that answers (the status bar lies early).
            page.evaluate("""async () => {
                const nb = window.jupyterapp.shell.currentWidget;
                await nb.context.ready;
                await nb.sessionContext.ready;
                await nb.sessionContext.session.kernel.info;
            }""")
            # Fire and forget: run-all resolves only when every cell is done, and evaluate has no timeout.
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            page.wait_for_selector(".simlib-live img.simlib-figure", timeout=TIMEOUT_MS)
            page.wait_for_selector(".simlib-live-status [data-redraws='1']", timeout=TIMEOUT_MS)
            page.wait_for_function(  # the first image has arrived (an empty image widget has no width)
                "() => document.querySelector('.simlib-live img.simlib-figure').naturalWidth > 0", timeout=TIMEOUT_MS)
            before = _canvas_png(page)
            page.screenshot(path=str(ARTIFACTS / "live-before.png"))
            (ARTIFACTS / "live-canvas-before.png").write_bytes(before)

            slider = page.locator(".widget-slider", has=page.locator("label", has_text="severity")).first
            handle = slider.locator(".noUi-handle").first
            handle.focus()
            for _ in range(6):  # 3.0 -> 6.0 in steps of 0.5: twice the jitter
                handle.press("ArrowRight")
            page.wait_for_function(
                "() => Number(document.querySelector('.simlib-live-status [data-redraws]')"
                ".getAttribute('data-redraws')) >= 2", timeout=TIMEOUT_MS)
            after = before
            deadline = time.monotonic() + 60
            while after == before and time.monotonic() < deadline:  # the new image arrives after the status
                time.sleep(0.25)
                after = _canvas_png(page)
            page.screenshot(path=str(ARTIFACTS / "live-after.png"))
            (ARTIFACTS / "live-canvas-after.png").write_bytes(after)

            assert _redraws(page) >= 2
            assert after != before, "the figure did not change after the slider moved"
            status = page.locator(".simlib-live-status").first.inner_text()
            assert "BSP" in status and "cannot run" not in status
            readout = slider.locator(".widget-readout").first.inner_text()
            assert float(readout) > 3.0
            # Play mode: the time slider runs from 0 and the revealed figure differs from the full one.
            time_slider = page.locator(".widget-slider", has=page.locator("label", has_text="time (%)")).first
            page.locator(".simlib-live button", has_text="Play").first.click()
            seen: set[float] = set()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(seen) < 3:
                seen.add(float(time_slider.locator(".widget-readout").first.inner_text()))
                time.sleep(0.2)
            playing = _canvas_png(page)
            page.screenshot(path=str(ARTIFACTS / "live-playing.png"))
            assert len(seen) >= 3 and min(seen) < 100, f"the time slider did not advance: {sorted(seen)}"
            assert playing != after

            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            assert errors.count() == 0, errors.first.inner_text()
        finally:
            browser.close()

"""The live panel as a room sees it: `python -m simlib live` (Voilà) in headless Chromium at 1280x720 and 1920x1080.

Asserts from the page's own bounding boxes that the figure, every control, Play, Stop and Export
lie inside the window with no sideways scrolling and no control text cut off, that projector mode
fits a 1280x720 window without scrolling and gives the figure most of it, with every text in the
figure at >= 20 px on screen (its PNG records its smallest text; the page gives its scale), and
sets control text to >= 24 px where the window has room for it; that during Play the figure on screen (its PNG names its frame)
and the time slider agree, and Stop shows the whole run again; that the exported animation
downloads, plays by itself offline, fits a laptop window and uses only glyphs stock fonts have;
that reloads leave one kernel (4, or 10 with --heavy); and that no request leaves the machine. Screenshots go to a
folder outside the source tree ($SIMLIB_TEST_ARTIFACTS, default <tmp>/simlib-test-artifacts).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
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
        deadline = time.monotonic() + 180  # Voilà's start, which a loaded machine stretches to a minute or more
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


def _outside(requests: list[str]) -> list[str]:
    """URLs of ``requests`` that would leave this machine (not loopback, a file, or in-page data)."""
    return [u for u in requests if urlparse(u).scheme not in ("data", "blob", "file")
            and urlparse(u).hostname not in ("127.0.0.1", "localhost")]


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def panel_page(voila, browser):
    """One panel page (one kernel) for the layout, play and export tests; yields (page, requests made)."""
    base, _ = voila
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    requests: list[str] = []
    context.on("request", lambda r: requests.append(r.url))
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    _open_panel(page, base)
    yield page, requests
    context.close()
    assert not _outside(requests), f"requests left the machine: {_outside(requests)}"


# Boxes of what a lecturer must reach, read from the page: name -> [left, top, right, bottom].
BOXES_JS = """() => {
  const out = {};
  const box = (name, el) => { if (!el) { out[name] = null; return; }
    const r = el.getBoundingClientRect(); out[name] = [r.left, r.top, r.right, r.bottom]; };
  box('figure', document.querySelector('.simlib-live img.simlib-figure'));
  const buttons = [...document.querySelectorAll('.simlib-live button')];
  box('play', buttons.find(b => b.textContent.trim() === 'Play'));
  box('stop', buttons.find(b => b.textContent.trim() === 'Stop'));
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

# Every piece of control text whose box is narrower than its text (cut off, or an ellipsis), or that
# sticks out of the panel or the controls column: [text, why, needed px, available px]. A <select> shows its option's text,
# which scrollWidth does not see, so that text is measured with the select's own font.
CLIPPED_JS = """() => {
  const out = [];
  const ctx = document.createElement('canvas').getContext('2d');
  const panel = document.querySelector('.simlib-live').getBoundingClientRect();
  const sel = ['.widget-label', '.widget-readout', 'button', '.widget-html-content', 'select', '.widget-inline-hbox']
    .map(s => '.simlib-live ' + s).join(', ');
  for (const el of document.querySelectorAll(sel)) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    const isSelect = el.tagName === 'SELECT';
    const text = (isSelect ? el.options[el.selectedIndex].text : el.textContent).trim();
    let need = el.scrollWidth;
    if (isSelect) {
      const cs = getComputedStyle(el);
      ctx.font = cs.font;
      need = ctx.measureText(text).width + parseFloat(cs.paddingLeft) + parseFloat(cs.paddingRight);
    }
    const name = text.slice(0, 30) || el.className;
    if (need > el.clientWidth + 1) out.push([name, 'clipped', Math.round(need), el.clientWidth]);
    if (r.left < panel.left - 1 || r.right > panel.right + 1) out.push([name, 'outside the panel', r.left, r.right]);
    // The controls column hides what sticks out of it (a row's 2 px margin there hides no text).
    const column = el.closest('.simlib-controls');
    if (column && r.right > column.getBoundingClientRect().right + 3) out.push([name, 'outside the controls', r.right,
      column.getBoundingClientRect().right]);
  }
  return out;
}"""


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


def _set_projector(page, on: bool) -> None:
    if page.evaluate("() => document.querySelector('.simlib-live').classList.contains('simlib-projector')") != on:
        page.locator(".simlib-live button", has_text="projector mode").click()
        page.wait_for_function("on => document.querySelector('.simlib-live').classList.contains('simlib-projector')"
                               " === on", arg=on, timeout=TIMEOUT_MS)
    page.wait_for_timeout(1500)  # the figure drawn at the new size arrives after the class


def test_panel_fits_the_window_no_label_is_clipped_and_projector_mode_is_readable(panel_page):
    page, _ = panel_page
    text = page.inner_text("body")
    assert "Run this cell" not in text and "Presentation Mode" not in text
    assert text.count("Live: BSP, SSP and async") == 1
    for name in ("SSP(1)", "ESSP(1)"):  # each shows the current s
        assert page.locator(".simlib-live button", has_text=re.compile("^" + re.escape(name) + "$")).count() == 1
    # Laptop, then projector: the window first, then projector mode on and off, as a lecturer would.
    for width, height, modes in [(1280, 720, (False, True)), (1920, 1080, (True, False))]:
        page.set_viewport_size({"width": width, "height": height})
        for projector in modes:
            _set_projector(page, projector)
            name = f"live-{width}x{height}" + ("-projector" if projector else "")
            page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
            clipped = page.evaluate(CLIPPED_JS)
            assert not clipped, f"{name}: control text cut off or outside the panel: {clipped}"
            _assert_inside(page.evaluate(BOXES_JS), width, height)
            if projector and width == 1920:
                fonts = page.evaluate(FONTS_JS)
                assert len(fonts) > 20
                small = [f for f in fonts if f[1] < 24]
                assert not small, f"text under 24 px in projector mode: {small}"
    page.set_viewport_size({"width": 1280, "height": 720})


# The figure as the page shows it: its box, the scale it is drawn at (an <img> with object-fit:
# contain draws its PNG at the smaller of the two ratios), the PNG's text chunks (the panel records
# the height of the figure's smallest text in the PNG's pixels), the per-run summary's box and the
# page's scroll size. Null while the image is loading.
FIGURE_JS = """async () => {
  const img = document.querySelector('.simlib-live img.simlib-figure');
  if (!img || !img.complete || !img.naturalWidth) return null;
  const src = img.src;
  const bytes = new Uint8Array(await (await fetch(src)).arrayBuffer());
  if (img.src !== src) return null;
  const text = {};
  const view = new DataView(bytes.buffer);
  for (let at = 8; at + 8 <= bytes.length; ) {
    const len = view.getUint32(at), type = String.fromCharCode(...bytes.slice(at + 4, at + 8));
    if (type === 'tEXt') {
      const body = bytes.slice(at + 8, at + 8 + len), nul = body.indexOf(0);
      text[String.fromCharCode(...body.slice(0, nul))] = String.fromCharCode(...body.slice(nul + 1));
    }
    at += 12 + len;
  }
  const r = img.getBoundingClientRect(), s = document.querySelector('.simlib-live-status').getBoundingClientRect();
  // Voilà's page scrolls inside a container, not the document: every element that could scroll and does.
  const scrolls = [...document.querySelectorAll('*')].filter(el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowY)
    && el.scrollHeight > el.clientHeight + 1).map(el => [el.className.toString().slice(0, 40), el.scrollHeight, el.clientHeight]);
  const scale = Math.min(r.width / img.naturalWidth, r.height / img.naturalHeight);
  return {box: [r.left, r.top, r.right, r.bottom], scale: scale,
          shown: [img.naturalWidth * scale, img.naturalHeight * scale],
          text_px: text['simlib:text-px'] === undefined ? null : Number(text['simlib:text-px']) * scale,
          status: [s.left, s.top, s.right, s.bottom],
          scroll: [document.documentElement.scrollWidth, document.documentElement.scrollHeight], scrolls: scrolls,
          panel: document.querySelector('.simlib-live').getBoundingClientRect().bottom};
}"""


def _figure_on_screen(page) -> dict:
    deadline = time.monotonic() + 60  # a loaded machine takes seconds to draw it; the bound only ends a hang
    while time.monotonic() < deadline:
        got = page.evaluate(FIGURE_JS)
        if got is not None:
            return got
        page.wait_for_timeout(250)
    raise AssertionError("the figure never finished loading")


def test_projector_mode_gives_the_figure_most_of_the_window_with_large_text_and_no_scrolling(panel_page):
    page, _ = panel_page
    for width, height in [(1280, 720), (1920, 1080)]:
        page.set_viewport_size({"width": width, "height": height})
        _set_projector(page, True)
        fig = _figure_on_screen(page)
        page.screenshot(path=str(ARTIFACTS / f"live-{width}x{height}-projector-figure.png"))
        where = f"projector mode at {width}x{height}"
        assert fig["scroll"][0] <= width and fig["scroll"][1] <= height, f"{where}: the page scrolls: {fig['scroll']}"
        assert not fig["scrolls"] and fig["panel"] <= height + 0.5, f"{where}: the panel scrolls: {fig}"
        _assert_inside(page.evaluate(BOXES_JS), width, height)
        left, top, right, bottom = fig["status"]
        assert bottom <= height + 0.5 and right <= width + 0.5, f"{where}: the per-run summary is cut off: {fig}"
        # Every text in the figure (title, tick labels, legends, axis labels) as the back row sees it.
        assert fig["text_px"] is not None, f"{where}: the figure's PNG does not record its text size"
        assert fig["text_px"] >= 20, f"{where}: the figure's smallest text is {fig['text_px']:.1f} px on screen"
        shown_w, shown_h = fig["shown"]
        assert shown_w * shown_h >= 0.5 * width * height, f"{where}: the figure has {shown_w:.0f}x{shown_h:.0f} px"
    _set_projector(page, False)
    page.set_viewport_size({"width": 1280, "height": 720})


# The time slider's value and what the figure on screen says it shows (the PNG's text chunks,
# read from the very image the page displays); null while either is changing.
SAMPLE_JS = """async () => {
  const img = document.querySelector('.simlib-live img.simlib-figure');
  const slider = [...document.querySelectorAll('.simlib-live .widget-slider')]
    .find(s => s.querySelector('label') && s.querySelector('label').textContent.includes('time (%)'));
  const readout = () => slider.querySelector('.widget-readout').textContent.trim();
  const src = img.src, value = readout();
  let bytes;
  try { bytes = new Uint8Array(await (await fetch(src)).arrayBuffer()); } catch (e) { return null; }
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  if (img.src !== src || readout() !== value) return null;
  const text = {};
  const view = new DataView(bytes.buffer);
  for (let at = 8; at + 8 <= bytes.length; ) {
    const len = view.getUint32(at), type = String.fromCharCode(...bytes.slice(at + 4, at + 8));
    if (type === 'tEXt') {
      const body = bytes.slice(at + 8, at + 8 + len), nul = body.indexOf(0);
      text[String.fromCharCode(...body.slice(0, nul))] = String.fromCharCode(...body.slice(nul + 1));
    }
    at += 12 + len;
  }
  return {slider: Number(value), frame: Number(text['simlib:frame']), time: Number(text['simlib:time']),
          bytes: Array.from(bytes.slice(-4096))};
}"""


def _sample(page) -> dict:
    for _ in range(20):
        got = page.evaluate(SAMPLE_JS)
        if got is not None:
            return got
    raise AssertionError("the figure and the slider never held still for two frames")


def test_play_moves_figure_and_slider_together_and_stop_keeps_the_figure(panel_page):
    page, _ = panel_page
    whole = _sample(page)
    assert whole["slider"] == whole["frame"] == 100
    page.locator(".simlib-live button", has_text="Play").click()
    page.wait_for_function("() => [...document.querySelectorAll('.simlib-live button')]"
                           ".some(b => b.textContent.trim() === 'Pause')", timeout=TIMEOUT_MS)
    seen = [_sample(page)]
    deadline = time.monotonic() + 90
    while seen[-1]["frame"] == 100 and time.monotonic() < deadline:  # Play starts over from 0
        seen = [_sample(page)]
    while len(seen) < 8 and time.monotonic() < deadline:
        page.wait_for_timeout(400)
        seen.append(_sample(page))
    pairs = [(s["slider"], s["frame"]) for s in seen]
    assert len({p[0] for p in pairs}) >= 4, f"Play did not advance: {pairs}"
    # The kernel sends the figure, then the slider (never a moment the figure has not reached). On a
    # busy machine a look can fall between the two messages: the slider may trail, never lead, and
    # nearly every look agrees.
    assert all(slider <= frame for slider, frame in pairs), f"the slider ran ahead of the figure: {pairs}"
    agree = sum(abs(slider - frame) <= 1 for slider, frame in pairs)
    assert agree >= len(pairs) - 1, f"slider and figure disagree: {pairs}"
    times = [s["time"] for s in seen]
    assert times == sorted(times) and times[0] < times[-1]
    page.locator(".simlib-live button", has_text="Stop").click()
    page.wait_for_function("() => [...document.querySelectorAll('.simlib-live button')]"
                           ".some(b => b.textContent.trim() === 'Play')", timeout=TIMEOUT_MS)
    deadline = time.monotonic() + 60
    stopped = _sample(page)
    while stopped["frame"] != 100 and time.monotonic() < deadline:
        page.wait_for_timeout(200)
        stopped = _sample(page)
    # Stop shows the whole run again: the very figure shown before Play, not blank axes.
    assert stopped["slider"] == stopped["frame"] == 100 and stopped["bytes"] == whole["bytes"]
    page.screenshot(path=str(ARTIFACTS / "live-after-stop.png"))


# What the exported player shows: its frame, the controls' text and width, the page's width.
PLAYER_JS = """() => ({
  frame: document.querySelector('img').src.slice(-200),
  label: document.getElementById('label').textContent,
  controls: [...document.querySelectorAll('button, span, label')].map(el => [el.textContent,
    el.getBoundingClientRect().width, el.scrollWidth <= el.clientWidth || el.clientWidth === 0]),
  image: (r => [r.left, r.top, r.right, r.bottom])(document.querySelector('img').getBoundingClientRect()),
  scroll: [document.documentElement.scrollWidth, document.documentElement.scrollHeight],
})"""


@pytest.mark.slow
def test_export_is_a_download_that_plays_offline_and_fits_a_laptop(panel_page, browser, tmp_path):
    page, _ = panel_page
    page.locator(".simlib-live button", has_text="Export HTML").click()
    link = page.locator(".simlib-live a.simlib-export-link")
    link.wait_for(timeout=120_000)
    note = page.locator(".simlib-live a.simlib-export-link").locator("xpath=..").inner_text()
    assert str(REPO) not in note  # written outside the checkout
    saved = Path(re.search(r"saved as (\S+)\)", note).group(1))
    if saved.parent.name.startswith("simlib-live-export-"):  # the kernel's fresh temporary folder
        shutil.rmtree(saved.parent, ignore_errors=True)
    with page.expect_download() as dl:
        link.click()
    path = tmp_path / dl.value.suggested_filename
    dl.value.save_as(path)
    assert path.suffix == ".html" and 0 < path.stat().st_size < 3e6

    # Opened from disk, offline: every request is recorded and any that is not the file itself fails.
    context = browser.new_context(viewport={"width": 1280, "height": 720}, offline=True)
    requests: list[str] = []
    context.on("request", lambda r: requests.append(r.url))
    context.route(lambda url: not url.startswith(("file:", "data:", "blob:")), lambda route: route.abort())
    try:
        player = context.new_page()
        player.goto(path.as_uri())
        player.wait_for_function("() => document.querySelector('img').complete"
                                 " && document.querySelector('img').naturalWidth > 0", timeout=TIMEOUT_MS)
        first = player.evaluate(PLAYER_JS)
        player.wait_for_function(  # no input: it must play by itself (the bound only ends a page that does not)
            "f => document.getElementById('label').textContent !== f", arg=first["label"], timeout=TIMEOUT_MS)
        later = player.evaluate(PLAYER_JS)
        player.screenshot(path=str(ARTIFACTS / "live-export-1280x720.png"))
    finally:
        context.close()
    assert later["frame"] != first["frame"] and later["label"] != first["label"], "the exported page does not play"
    assert later["scroll"][0] <= 1280, f"the exported page scrolls sideways: {later['scroll']}"
    left, top, right, bottom = later["image"]
    assert left >= 0 and right <= 1280 and bottom <= 720 and right - left > 600
    assert len(later["controls"]) >= 2
    for text, width, fits in later["controls"]:
        # Printable ASCII only: every stock font (DejaVu on Debian, Arial or Segoe UI on Windows) has it.
        assert text.strip() and width > 0 and fits, f"player control {text!r} is empty or cut off"
        assert all(" " <= ch <= "~" for ch in text), f"player control {text!r} needs a glyph stock fonts may lack"
    assert not _outside(requests) and all(u.startswith(("file:", "data:")) for u in requests), requests


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


@pytest.mark.slow
def test_reloading_leaves_one_kernel_and_nothing_leaves_the_machine(voila, browser, request):
    """Each reload starts a kernel and the unloaded page's kernel is shut down: 4 reloads by default, 10 with
    --heavy (each costs about 3 s of a kernel's start)."""
    base, server_pid = voila
    reloads = 10 if request.config.getoption("--heavy") else 4
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    requests: list[str] = []
    context.on("request", lambda r: requests.append(r.url))
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    before = set(_kernels(server_pid))  # the other tests' page may still be open
    started: set[int] = set()
    try:
        page.goto(base + "/")
        page.wait_for_selector(".simlib-live", timeout=TIMEOUT_MS)
        running = []
        for _ in range(reloads):
            page.reload()
            page.wait_for_selector(".simlib-live", timeout=TIMEOUT_MS)  # the new page's kernel ran the panel
            started |= set(_kernels(server_pid)) - before
            # The page that unloaded asked the server to shut its kernel down. The idle culler, the
            # fallback, waits for 20 s of idleness: far longer than this wait.
            deadline = time.monotonic() + 15  # under the culler's 20 s, so only the page's own request passes
            while len(set(_kernels(server_pid)) - before) > 1 and time.monotonic() < deadline:
                time.sleep(0.25)
            running.append(len(set(_kernels(server_pid)) - before))
        assert len(started) >= reloads  # every load started a kernel
        assert max(running) <= 1, f"kernels running after each of {reloads} reloads: {running}"
    finally:
        context.close()
    assert not _outside(requests), f"requests left the machine: {_outside(requests)}"

"""What the room waits for: from an input event in the browser to the new figure's pixels, per control.

Starts the server ``python -m simlib live`` starts (Voilà on 127.0.0.1), opens the panel in
headless Chromium and measures, in the page's own clock (performance.now):

- page load -> first figure decoded and painted: the server's first page, then the median of
  ``--reps`` reloads (each a new kernel, as a reload in the room is);
- for each control (SSP toggle, one staleness step, one workers step), the key press or click ->
  the next figure decoded and painted (the image's load event, then two animation frames),
  next to the kernel-side time the panel reports ("redraw #N in X s").

Prints medians and the load average (the machine may be busy). Needs chromium and playwright.

    python benchmarks/live_latency.py            # 5 repetitions per control
    python benchmarks/live_latency.py --reps 3
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from simlib.app import serve  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

# Time of the last input event, and of the first paint after the figure's image changes.
PROBE_JS = """() => {
  window.__input = 0; window.__painted = [];
  for (const kind of ['keydown', 'mousedown']) document.addEventListener(kind, () => { window.__input = performance.now(); }, true);
  const img = document.querySelector('.simlib-live img.simlib-figure');
  img.addEventListener('load', () => requestAnimationFrame(() => requestAnimationFrame(() =>
    window.__painted.push(performance.now()))));
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kernel_s(page) -> float:
    text = page.inner_text(".simlib-live-status")
    return float(re.search(r"redraw #\d+ in ([0-9.]+) s", text).group(1))


def _redraws(page) -> int:
    return int(page.get_attribute(".simlib-live-status [data-redraws]", "data-redraws") or 0)


def _measure(page, act) -> tuple[float, float]:
    """Seconds from the input event to the new figure's paint, and the kernel's own time for it."""
    n = _redraws(page)
    page.evaluate("() => { window.__painted = []; }")
    act()
    page.wait_for_function(f"() => Number(document.querySelector('.simlib-live-status [data-redraws]')"
                           f".getAttribute('data-redraws')) > {n}", timeout=120_000)
    page.wait_for_function("() => window.__painted.length > 0", timeout=120_000)
    browser_s = (page.evaluate("() => window.__painted[window.__painted.length - 1]") -
                 page.evaluate("() => window.__input")) / 1e3
    return browser_s, _kernel_s(page)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    port = _free_port()
    cmd = serve.build_command(argparse.Namespace(port=port, server="voila", notebook=None, no_browser=True))
    tmp = tempfile.mkdtemp(prefix="simlib-latency-")
    env = serve.server_env(dict(os.environ, JUPYTER_RUNTIME_DIR=tmp, PYTHONPATH=str(REPO)))
    server = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                break
            except OSError:
                time.sleep(0.3)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1920, "height": 1080})
            page.set_default_timeout(120_000)
            loads = []  # the server's first page, then reloads (each starts a new kernel)
            for _ in range(1 + args.reps):
                t0 = time.perf_counter()
                page.goto(f"http://127.0.0.1:{port}/")
                page.wait_for_function("() => { const i = document.querySelector('.simlib-live img.simlib-figure');"
                                       " return i && i.complete && i.naturalWidth > 0; }", timeout=180_000)
                loads.append((time.perf_counter() - t0, _kernel_s(page)))
            page.evaluate(PROBE_JS)

            def slider(label: str, key: str):
                handle = page.locator(".widget-slider", has=page.locator("label", has_text=label)).first \
                    .locator(".noUi-handle").first
                return lambda: (handle.focus(), handle.press(key))

            ssp = page.locator(".simlib-live button", has_text="SSP(").first
            controls = {
                "protocol toggle (SSP)": lambda: ssp.click(),
                "staleness +1": slider("staleness", "ArrowRight"),
                "staleness -1": slider("staleness", "ArrowLeft"),
                "workers +1": slider("workers", "ArrowRight"),
            }
            rows = []
            for name, act in controls.items():
                print("measuring", name, flush=True)
                pairs = [_measure(page, act) for _ in range(args.reps)]
                if name.startswith("protocol") and args.reps % 2:
                    _measure(page, act)  # SSP back on: the staleness slider is disabled without it
                rows.append((name, statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)))
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores; {args.reps} reps, medians")
    print(f"{'first page -> first figure':28s} {loads[0][0]:6.2f} s   (kernel: {loads[0][1]:.2f} s)")
    print(f"{'reload -> first figure':28s} {statistics.median(l[0] for l in loads[1:]):6.2f} s   "
          f"(kernel: {statistics.median(l[1] for l in loads[1:]):.2f} s)")
    for name, b, k in rows:
        print(f"{name:28s} {b:6.2f} s   (kernel: {k:.2f} s)")


if __name__ == "__main__":
    main()

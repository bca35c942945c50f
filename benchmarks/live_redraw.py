"""Redraw latency of the live lecture panel: what a lecturer waits for after moving a slider.

One redraw = simulate every chosen protocol (BSP, SSP(3), async; 16 workers x 100 steps by
default, in the panel's process pool) + the panel's draw: lay the runs out side by side and encode
the figure as the PNG the browser is sent (``LivePanel._draw``). Each repetition moves the
straggler-severity slider to a new value, so nothing comes from the panel's cache. Compared in the
same run with (a) the same runs simulated in one process and (b) the plain way to get the same
picture: a fresh constrained-layout figure from ``compare_figure``, saved as a PNG.

    python benchmarks/live_redraw.py            # 16 workers x 100 steps, 7 repetitions
    python benchmarks/live_redraw.py --quick    # 3 repetitions
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import time

import matplotlib

matplotlib.use("Agg")

from simlib.viz import compare_figure  # noqa: E402
from simlib.app.live import LivePanel  # noqa: E402
from simlib.app.scenario import LiveSettings, Runner, shutdown_pool  # noqa: E402
from record import record  # noqa: E402

BUDGET_S = 0.5


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=16, help="simulated workers (default 16)")
    ap.add_argument("--steps", type=int, default=100, help="steps per worker (default 100)")
    ap.add_argument("--repeats", type=int, default=7, help="slider moves timed (default 7)")
    ap.add_argument("--quick", action="store_true", help="3 repetitions")
    args = ap.parse_args()
    repeats = 3 if args.quick else args.repeats

    panel = LivePanel(LiveSettings(n_workers=args.workers, steps=args.steps))
    serial = Runner(panel.runner.problem, processes=1)
    stages: dict[str, list[float]] = {"simulate": [], "draw (lay out + PNG)": [], "of which PNG": [], "total": [],
                                      "simulate in 1 process": [],
                                      "cached (slider moved back)": [], "peer: fresh compare_figure": []}
    for r in range(repeats):
        severity = 3.5 + 0.5 * r  # a value not simulated before: a real re-run
        panel.settings = LiveSettings(**{**panel.settings_dict(), "severity": severity})
        cfgs = panel.settings.configs(panel.runner.nnz_per_row)
        t0 = time.perf_counter()
        traces = panel.runner.run(cfgs)
        t1 = time.perf_counter()
        panel.traces = traces
        panel._draw()  # ends by sending the PNG of the frame the time slider shows
        t2 = time.perf_counter()
        panel._show(panel.time_slider.value)  # the same encoding again, timed alone
        stages["of which PNG"].append(time.perf_counter() - t2)
        stages["simulate"].append(t1 - t0)
        stages["draw (lay out + PNG)"].append(t2 - t1)
        stages["total"].append(t2 - t0)

        # The same runs in one process (a severity no run used), for the pool's gain in this run.
        one = LiveSettings(**{**panel.settings_dict(), "severity": severity + 0.25})
        t6 = time.perf_counter()
        serial.run(one.configs(panel.runner.nnz_per_row))
        stages["simulate in 1 process"].append(time.perf_counter() - t6)

        t4 = time.perf_counter()
        panel.traces = panel.runner.run(cfgs)  # all three hit the cache
        panel._draw()
        stages["cached (slider moved back)"].append(time.perf_counter() - t4)

        t5 = time.perf_counter()
        compare_figure(traces).savefig(io.BytesIO(), format="png")
        stages["peer: fresh compare_figure"].append(time.perf_counter() - t5 + (t1 - t0))
    panel.close()
    shutdown_pool()

    runs = ", ".join(t.label for t in panel.traces)
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cores, 1-minute load average {load:.1f} at the end (timings are wall clock)")
    print(f"live panel redraw, {args.workers} workers x {args.steps} steps, runs: {runs}; median of {repeats};"
          f" simulator runs in {panel.runner.processes} processes")
    print(f"{'stage':<30}{'median s':>10}{'min s':>10}{'vs budget':>12}")
    for name, xs in stages.items():
        med = statistics.median(xs)
        print(f"{name:<30}{med:>10.3f}{min(xs):>10.3f}{med / BUDGET_S:>11.2f}x")
    total = statistics.median(stages["total"])
    peer = statistics.median(stages["peer: fresh compare_figure"])
    gain = statistics.median(stages["simulate in 1 process"]) / statistics.median(stages["simulate"])
    print(f"\nredraw {total:.3f} s against a {BUDGET_S} s budget; the plain fresh figure takes {peer / total:.2f}x"
          f" as long; simulating in {panel.runner.processes} processes is {gain:.2f}x faster than in one")
    record(__file__, "the lecture panel's redraw", "a fresh compare_figure saved as a PNG", peer / total, "time",
           headline=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

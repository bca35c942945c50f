"""Command line: ``python -m simlib compare`` (the main job) and ``python -m simlib live``.

Configuration errors print one line naming the field and exit with status 2, no traceback.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any, Sequence

from simlib.sim.config import COST_UNITS, JITTERS, TOPOLOGIES, SimConfig, Stragglers
from simlib.sim.experiments import DEFAULT_PROTOCOLS, DEFAULT_TARGET, compare, default_cluster, summary_rows


def _compare_parser(sub: Any) -> None:
    d = default_cluster()
    st = d.stragglers
    p = sub.add_parser(
        "compare",
        help="simulate BSP, SSP and async on one cluster; print a table and write a figure",
        description="Simulate the same training job under several protocols on one cluster (same seed, so "
        "the same straggler draws), print time to a target loss, time per step, waiting and bytes, "
        "and write the timelines and loss curves to a PNG.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--protocols", default=",".join(DEFAULT_PROTOCOLS),
                   help="comma-separated runs: bsp, ssp:S (staleness bound S), async")
    p.add_argument("--target", type=float, default=DEFAULT_TARGET, help="target loss for 'time to target'")
    p.add_argument("--out", default=os.path.join("simlib_out", "compare.png"), help="figure path (PNG, SVG or PDF)")
    p.add_argument("--no-plot", action="store_true", help="skip the figure")
    g = p.add_argument_group("cluster")
    g.add_argument("--workers", type=int, default=d.n_workers, help="number of workers")
    g.add_argument("--steps", type=int, default=d.steps, help="steps (clocks) per worker")
    g.add_argument("--batch-size", type=int, default=d.batch_size, help="rows per mini-batch")
    g.add_argument("--lr", type=float, default=d.lr, help="learning rate")
    g.add_argument("--staleness-aware-lr", action="store_true", help="divide the learning rate by an update's staleness")
    g.add_argument("--topology", choices=TOPOLOGIES, default=d.topology, help="parameter server or ring all-reduce (BSP only)")
    g.add_argument("--servers", type=int, default=d.n_servers, help="parameter-server shards")
    g.add_argument("--summation-nodes", type=int, default=d.n_summation, help="BytePS-style extra summation nodes")
    g.add_argument("--latency", type=float, default=d.latency, help="seconds per message")
    g.add_argument("--bandwidth", type=float, default=d.bandwidth, help="bytes per second per link")
    g.add_argument("--compute-per-unit", type=float, default=d.compute_per_unit, help="seconds per nonzero (or sample)")
    g.add_argument("--compute-overhead", type=float, default=d.compute_overhead, help="fixed seconds per step")
    g.add_argument("--cost-unit", choices=COST_UNITS, default=d.cost_unit, help="what compute is charged per")
    g.add_argument("--backup-workers", type=int, default=d.backup_workers, help="drop the slowest b gradients per step")
    g.add_argument("--timeout", type=float, default=None, help="drop gradients later than this many seconds")
    g.add_argument("--compression", default=None, help="gradient compressor, e.g. topk:0.01, qsgd, onebit")
    g.add_argument("--seed", type=int, default=d.seed, help="seed of the whole run")
    s = p.add_argument_group("stragglers")
    s.add_argument("--jitter", choices=JITTERS, default=st.jitter, help="per-step compute noise")
    s.add_argument("--jitter-sigma", type=float, default=st.jitter_sigma, help="sigma of the lognormal jitter")
    s.add_argument("--slow-workers", type=int, default=st.slow_workers, help="how many workers are persistently slow")
    s.add_argument("--slow-factor", type=float, default=st.slow_factor, help="how much slower they are")
    s.add_argument("--pause-prob", type=float, default=st.pause_prob, help="probability of a pause per step")
    s.add_argument("--pause-time", type=float, default=st.pause_time, help="seconds a pause lasts")
    s.add_argument("--fail-worker", type=int, default=None, help="a worker that fails ...")
    s.add_argument("--fail-time", type=float, default=None, help="... at this simulated time")
    s.add_argument("--restart-after", type=float, default=None, help="... and comes back this much later")


def _config_from(args: argparse.Namespace) -> SimConfig:
    stragglers = Stragglers(
        jitter=args.jitter, jitter_sigma=args.jitter_sigma, slow_workers=args.slow_workers,
        slow_factor=args.slow_factor, pause_prob=args.pause_prob, pause_time=args.pause_time,
        fail_worker=args.fail_worker, fail_time=args.fail_time, restart_after=args.restart_after,
    )
    return SimConfig(
        n_workers=args.workers, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        staleness_aware_lr=args.staleness_aware_lr, topology=args.topology, n_servers=args.servers,
        n_summation=args.summation_nodes, latency=args.latency, bandwidth=args.bandwidth,
        compute_per_unit=args.compute_per_unit, compute_overhead=args.compute_overhead,
        cost_unit=args.cost_unit, stragglers=stragglers, backup_workers=args.backup_workers,
        timeout=args.timeout, compression=args.compression, seed=args.seed,
    )


class _Progress:
    """A one-line progress bar on stderr, shown only once a run has taken more than two seconds."""

    def __init__(self, labels: Sequence[str]):
        self.labels = list(labels)
        self.t0 = time.monotonic()
        self.shown = False

    def __call__(self, run: int, fraction: float) -> None:
        if time.monotonic() - self.t0 < 2.0:
            return
        self.shown = True
        done = (run + fraction) / len(self.labels)
        bar = "#" * int(30 * done)
        print(f"\r[{bar:<30}] {100 * done:5.1f}%  {self.labels[run]}", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.shown:
            print(file=sys.stderr)


def _fmt(v: Any, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "never"
    if unit == "ms":
        return f"{1e3 * v:.2f}"
    if unit == "%":
        return f"{100 * v:.0f}%"
    if unit == "MB":
        return f"{v / 1e6:.2f}"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def format_table(rows: list[dict[str, Any]], target: float) -> str:
    """The comparison as a fixed-width text table."""
    cols = [
        ("run", "run", ""), (f"time to {target:g} (ms)", "time_to_target", "ms"),
        ("rounds to target", "rounds_to_target", ""), ("time/step (ms)", "time_per_step", "ms"),
        ("waiting", "wait_fraction", "%"), ("MB moved", "bytes_moved", "MB"),
        ("mean stale", "mean_staleness", ""), ("final loss", "final_loss", ""),
    ]
    cells = [[h for h, _, _ in cols]] + [[_fmt(r[k], u) for _, k, u in cols] for r in rows]
    widths = [max(len(row[j]) for row in cells) for j in range(len(cols))]
    lines = ["  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_compare(args: argparse.Namespace) -> int:
    """The main job: simulate each protocol, print the table, write the figure."""
    base = _config_from(args)
    protocols = [p for p in args.protocols.split(",") if p.strip()]
    if not protocols:
        raise ValueError("protocols must name at least one run, e.g. 'bsp,ssp:3,async'")
    progress = _Progress(protocols)
    traces = compare(protocols, base, progress=progress)
    progress.close()
    print(f"{base.n_workers} workers x {base.steps} steps, stragglers: {base.stragglers.describe()}, "
          f"latency {base.latency * 1e3:g} ms, bandwidth {base.bandwidth / 1e6:g} MB/s (simulated time)")
    print(format_table(summary_rows(traces, args.target), args.target))
    for t in traces:
        if t.meta.get("stall_reason"):
            print(f"{t.label} stalled: {t.meta['stall_reason']}")
    if not args.no_plot:
        from simlib.viz import compare_figure, save_figure

        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        save_figure(compare_figure(traces, target=args.target), args.out)
        print(f"figure written to {args.out}")
    return 0


def _live_parser(sub: Any) -> None:
    try:
        from simlib.app import serve
    except ImportError:  # pragma: no cover - the live panel's extras are not installed
        return
    serve.add_parser(sub)


_FLAGS = {
    "n_workers": "--workers", "n_servers": "--servers", "n_summation": "--summation-nodes",
    "stragglers.jitter_sigma": "--jitter-sigma", "stragglers.slow_workers": "--slow-workers",
    "stragglers.slow_factor": "--slow-factor", "stragglers.pause_prob": "--pause-prob",
    "stragglers.pause_time": "--pause-time", "stragglers.fail_worker": "--fail-worker",
    "stragglers.fail_time": "--fail-time", "stragglers.restart_after": "--restart-after",
}


def _with_flag(message: str) -> str:
    """Add the command-line flag to an error that names a configuration field."""
    field = message.split(" ", 1)[0].rstrip(":")
    flag = _FLAGS.get(field, "--" + field.replace("_", "-") if field.isidentifier() else None)
    return f"{message} (flag {flag})" if flag else message


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m simlib``."""
    parser = argparse.ArgumentParser(prog="python -m simlib", description="simlib: distributed ML you can run and measure")
    sub = parser.add_subparsers(dest="command", required=True)
    _compare_parser(sub)
    _live_parser(sub)
    args = parser.parse_args(argv)
    try:
        if args.command == "compare":
            return run_compare(args)
        from simlib.app import serve

        return serve.run(args)
    except ValueError as exc:
        print(f"error: {_with_flag(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

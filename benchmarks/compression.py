"""Compressors on a slow network: bytes per step, time to target loss and final loss.

The default simulated cluster (8 workers, BSP, one parameter server, the default sparse logistic
problem) with 10 MB/s links, where pushing updates is the bottleneck. The peer is the same run
without compression; ratios are against it. Run::

    python benchmarks/compression.py            # all compressors, 100 steps
    python benchmarks/compression.py --quick    # fewer compressors, 60 steps
"""
from __future__ import annotations

import argparse
import time

import simlib
from simlib.compress import make_compressor
from simlib.sim import default_problem
from record import record

SPECS = ["none", "sparse", "onebit", "onebit-ef", "qsgd", "qsgd:4", "topk:0.1", "topk-noef:0.1", "topk:0.01", "budget:512"]
QUICK = ["none", "onebit", "qsgd", "topk:0.1", "topk-noef:0.1", "budget:512"]


def main() -> None:
    """Print one table: bytes per push, time to target and final loss for each compressor."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer compressors and steps")
    ap.add_argument("--bandwidth", type=float, default=1e7, help="bytes/second per link (default 1e7)")
    ap.add_argument("--steps", type=int, default=None, help="steps per worker (default 100, quick 60)")
    ap.add_argument("--target", type=float, default=None, help="target loss (default: uncompressed final + 0.01)")
    args = ap.parse_args()
    steps = args.steps or (60 if args.quick else 100)
    problem, base = default_problem(), dict(n_workers=8, steps=steps, bandwidth=args.bandwidth)
    specs = QUICK if args.quick else SPECS
    rows = []
    for spec in specs:
        t0 = time.perf_counter()
        trace = simlib.run(problem, "bsp", substrate="sim", **base, compression=None if spec == "none" else spec).trace
        rows.append((spec, trace, time.perf_counter() - t0))
    peer = rows[0][1]
    target = args.target if args.target is not None else peer.quality[-1].value + 0.01
    peer_bytes = peer.summary()["bytes_sent"] / len(peer.updates)
    peer_time = peer.time_to(target)
    n_params = 10_000
    print(f"8 workers, BSP, 1 server, bandwidth {args.bandwidth:g} B/s, {steps} steps; target loss {target:.4f}")
    print(f"{'compressor':<14} {'wire format':<66} {'B/push':>7} {'x less':>6} {'t->target s':>11} {'speed-up':>8} {'final loss':>10} {'wall s':>6}")
    for spec, trace, wall in rows:
        s = trace.summary()
        per = s["bytes_sent"] / len(trace.updates)
        tt = trace.time_to(target)
        fmt = make_compressor(spec, n_params, None).wire_format  # type: ignore[arg-type]
        speed = f"{peer_time / tt:.2f}x" if tt and peer_time else "-"
        if tt and peer_time and spec != "none":
            record(__file__, f"compression {spec}, {args.bandwidth / 1e6:g} MB/s links", "no compression",
                   peer_time / tt, "time to target", headline=spec == "topk:0.1")
        print(
            f"{spec:<14} {fmt:<66} {per:7.0f} {peer_bytes / per:6.1f} "
            f"{(f'{tt:.4f}' if tt else 'never'):>11} {speed:>8} {s['final_loss']:10.4f} {wall:6.2f}"
        )


if __name__ == "__main__":
    main()

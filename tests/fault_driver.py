"""A child process that runs one algorithm on real processes again and again, for fault tests.

Started by :mod:`faultkit` as ``python fault_driver.py ALGORITHM MARKER`` (the marker makes this
process and its forked workers easy to find in /proc). It builds a small problem, does one short
run to load the compiled kernels, prints ``{"event": "ready", ...}``, then for every ``go`` line on
stdin prints ``{"event": "started"}``, runs until the run ends (the runs are long: a fault ends
them) and prints ``{"event": "ended", "error": <exception class or null>, ...}`` with what the run
left behind: child processes, this process's /dev/shm segments and its threads.

SIGUSR1 raises an exception in whichever process receives it; forked workers inherit the handler,
so the test injects "an exception inside a worker" at a random moment by signalling a worker.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any, Callable

import numpy as np

LONG = 10**6  # sweeps / epochs / steps: the run lasts until a fault (or the timeout) ends it
TIMEOUT = 60.0


class InjectedFault(RuntimeError):
    """The exception SIGUSR1 raises."""


def _raise_injected(signum: int, frame: Any) -> None:
    raise InjectedFault(f"injected fault in process {os.getpid()}")


def children() -> list[int]:
    """Live child processes of this process, less multiprocessing's resource tracker."""
    pids: list[int] = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids += [int(p) for p in f.read().split()]
        except OSError:
            pass
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"resource_tracker" in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # a zombie has released everything; only its exit status is left
        except OSError:
            continue
        out.append(pid)
    return out


def segments() -> list[str]:
    """This process's shared-memory segments still in /dev/shm."""
    from simlib.parallel.shm import PREFIX

    mine = f"{PREFIX}{os.getpid()}_"
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(mine))


def build(algorithm: str) -> Callable[[int], Any]:
    """A function run(n) that trains ``algorithm`` for n sweeps / epochs / steps."""
    if algorithm == "hogwild":
        from simlib.parallel.hogwild import train
        from simlib.problems.logistic import make_sparse_classification

        data = make_sparse_classification(n_rows=4_000, n_features=2_000, nnz_per_row=10, seed=0)
        return lambda n: train(data, "hogwild", n_workers=2, epochs=n, chunk_rows=500, eval_rows=200,
                               monitor_every=0.05, timeout=TIMEOUT)
    if algorithm in ("lda-shm", "lda-pipe"):
        from simlib.parallel.lda import train_parallel
        from simlib.problems.lda import make_synthetic_corpus

        corpus, _, _ = make_synthetic_corpus(n_docs=100, n_words=2_000, doc_length=50, seed=0)
        transport = algorithm.split("-")[1]
        return lambda n: train_parallel(corpus, 32, n_sweeps=n, n_workers=2, protocol="ssp", staleness=1,
                                        transport=transport, timeout=TIMEOUT, record_every=0.05)
    if algorithm.startswith("glove"):
        from simlib.parallel.glove import train_parallel
        from simlib.problems.glove import GloveConfig, count_cooccurrences

        rng = np.random.default_rng(0)
        ids = rng.integers(0, 300, 20_000).astype(np.int32)
        offsets = np.arange(0, 20_001, 100, dtype=np.int64)
        cooc = count_cooccurrences(ids, offsets, 300, window=3)
        mode = algorithm.split("-")[1]
        return lambda n: train_parallel(cooc, GloveConfig(dim=16, epochs=n), n_workers=2, mode=mode,
                                        batch=1024, timeout=TIMEOUT)
    if algorithm.startswith("run-"):
        import simlib
        from simlib.problems.logistic import LogisticProblem, make_sparse_classification

        problem = LogisticProblem(make_sparse_classification(2_000, 500, 10, seed=0), eval_rows=200)
        substrate = algorithm.split("-", 1)[1]
        return lambda n: simlib.run(problem, "ssp:1", substrate=substrate, n_workers=2, steps=n, batch_size=16,
                                    eval_every=50, timeout=TIMEOUT)
    raise SystemExit(f"unknown algorithm {algorithm!r}")


def say(**event: Any) -> None:
    """One JSON line to the test."""
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def one_run(run: Callable[[int], Any]) -> None:
    """Run until a fault ends the run; report how it ended and what it left behind."""
    error, message = None, ""
    try:
        say(event="started", t=time.time())
        run(LONG)
    except BaseException as exc:  # noqa: BLE001 - what ended the run is the test's subject
        error, message = type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""
    say(event="ended", t=time.time(), error=error, message=message, children=children(), segments=segments(),
        threads=sorted(t.name for t in threading.enumerate()))


def main() -> None:
    import faulthandler

    faulthandler.register(signal.SIGUSR2, all_threads=True)  # the test asks for stacks when a run hangs
    algorithm = sys.argv[1]
    run = build(algorithm)
    run(2)  # compile or load every kernel and start the logging thread before any fault
    signal.signal(signal.SIGUSR1, _raise_injected)
    say(event="ready", pid=os.getpid(), threads=sorted(t.name for t in threading.enumerate()))
    for line in sys.stdin:
        if line.strip() == "go":
            one_run(run)


if __name__ == "__main__":
    main()

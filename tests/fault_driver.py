"""A child process that runs one algorithm on real processes again and again, for fault tests.

Started by :mod:`faultkit` as ``python fault_driver.py ALGORITHM MARKER [TIMEOUT]`` (the marker, in the command
line and in the environment, makes this process and every process it starts -- forked workers, Ray's
raylet and actors -- easy to find in /proc). It builds a small problem, does one short run to load
the compiled kernels, prints ``{"event": "ready", ...}``, then for every ``go [MODE]`` line on stdin
prints ``{"event": "started", "children": ...}``, runs until the run ends (the runs are long: a fault
ends them) and prints ``{"event": "ended", "error": <exception class or null>, ...}`` with what the
run left behind: child processes, this process's /dev/shm segments and its threads.

SIGUSR1 raises an exception in whichever process receives it (inside a weakref callback or a
``__del__``, where Python would drop it, a timer raises it a moment later); forked workers inherit
the handler, and Ray's worker processes install it at start-up, so the test injects "an exception
inside a worker" at a random moment by signalling a worker.

Ray (``run-ray``) has two modes, named on the ``go`` line: ``attached`` runs on a local Ray this
driver started once and keeps (a user's own ``ray.init``; the run must kill its actors), ``owned``
lets :func:`simlib.run` start and stop a local Ray of its own (the run must stop every Ray process).
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
TIMEOUT = 60.0  # the runs' timeout= (main takes another from its command line: a stopped worker meets it)


class InjectedFault(RuntimeError):
    """The exception SIGUSR1 raises."""


# Where Python prints an exception as "Exception ignored" and drops it. (A child's after-fork
# callbacks drop them too, but the kit signals only workers past their start-up: faultkit.started.)
# numba's type registry removes a type from a weakref callback (abstract.py's _on_type_disposal): an exception
# landing there was dropped and a Hogwild worker hung in the exception-worker fault, once in a run of the matrix.
_DROPPING = {("weakref.py", None), ("_weakrefset.py", None),  # WeakSet._remove: a weakref callback too
             ("abstract.py", "_on_type_disposal")}


def _in_dropping_context(frame: Any) -> bool:
    """Whether ``frame`` runs inside code whose exceptions Python drops (the code under test never
    raises there: only an asynchronous signal can)."""
    while frame is not None:
        code = frame.f_code
        name = os.path.basename(code.co_filename)
        if code.co_name == "__del__" or (name, None) in _DROPPING or (name, code.co_name) in _DROPPING:
            return True
        frame = frame.f_back
    return False


def _raise_injected(signum: int, frame: Any) -> None:
    """Raise where the process is; inside a callback whose exceptions are dropped, try again 5 ms
    later (a timer, not a signal to itself: that would re-enter this handler before it returns)."""
    if _in_dropping_context(frame):
        previous = signal.getsignal(signal.SIGALRM)

        def retry(_signum: int, later: Any) -> None:
            signal.signal(signal.SIGALRM, previous)
            _raise_injected(signum, later)

        signal.signal(signal.SIGALRM, retry)
        signal.setitimer(signal.ITIMER_REAL, 0.005)
        return
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


def _install_raising_usr1() -> None:
    """In every Ray worker process: SIGUSR1 raises (Ray's ``worker_process_setup_hook``)."""
    signal.signal(signal.SIGUSR1, _raise_injected)


def _ray_mode(mode: str) -> None:
    """Be attached to this driver's own local Ray, or to none (so that the run starts its own)."""
    import logging

    import ray

    if mode == "owned" and ray.is_initialized():
        ray.shutdown()
    elif mode == "attached" and not ray.is_initialized():
        for attempt in range(3):  # a busy machine can miss the raylet's start-up deadline (simlib.substrates.ray.connect)
            try:
                ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING,
                         log_to_driver=False, runtime_env={"worker_process_setup_hook": _install_raising_usr1})
                return
            except Exception:
                ray.shutdown()
                if attempt == 2:
                    raise


def build(algorithm: str) -> Callable[..., Any]:
    """A function run(n, mode) that trains ``algorithm`` for n sweeps / epochs / steps (repetitions for counting)."""
    if algorithm == "hogwild":
        import simlib
        from simlib.problems.logistic import LogisticProblem, make_sparse_classification

        data = make_sparse_classification(n_rows=4_000, n_features=2_000, nnz_per_row=10, seed=0)
        problem = LogisticProblem(data, l2=1e-5, eval_rows=200)  # 'touched': a run until a fault has no decay bound
        return lambda n, *_: simlib.run(problem, "async", substrate="shm", n_workers=2, batch_size=1, chunk=500,
                                        steps=min(n * problem.epoch_steps(2, 1), 10**9), monitor_every=0.05,
                                        timeout=TIMEOUT)
    if algorithm in ("lda-shm-mh", "lda-shm-alias"):  # the Metropolis-Hastings samplers, under the block locks
        import simlib
        from simlib.problems.lda import make_synthetic_corpus
        from simlib.problems.lda_table import LDAProblem

        corpus, _, _ = make_synthetic_corpus(n_docs=100, n_words=2_000, doc_length=50, seed=0)
        problem = LDAProblem(corpus, 32, kernel=algorithm.rsplit("-", 1)[1])
        return lambda n, *_: simlib.run(problem, "ssp:1", substrate="shm", n_workers=2, steps=n, timeout=TIMEOUT,
                                        monitor_every=0.05)
    if algorithm in ("lda-shm", "lda-pipe"):
        from simlib.problems.lda import make_synthetic_corpus

        corpus, _, _ = make_synthetic_corpus(n_docs=100, n_words=2_000, doc_length=50, seed=0)
        if algorithm == "lda-pipe":  # the contract's pipe server running LDA's word-topic table
            import simlib
            from simlib.problems.lda_table import LDAProblem

            problem = LDAProblem(corpus, 32)
            return lambda n, *_: simlib.run(problem, "ssp:1", substrate="pipes", n_workers=2, steps=n,
                                            timeout=TIMEOUT)
        import simlib
        from simlib.problems.lda_table import LDAProblem

        problem = LDAProblem(corpus, 32)  # AD-LDA on the contract's shared-memory table
        return lambda n, *_: simlib.run(problem, "ssp:1", substrate="shm", n_workers=2, steps=n, timeout=TIMEOUT,
                                        monitor_every=0.05)
    if algorithm == "glove-count":
        from simlib.parallel.glove_count import count_parallel

        rng = np.random.default_rng(0)
        # A worker counts for about 1-2 s, longer than the kit's 0.4 s window after the workers
        # appear: a worker fault lands in the work, not after the worker has reported (the run then
        # rightly stands, and the next count of the loop would start as if nothing had happened).
        ids = rng.integers(0, 5_000, 2_000_000).astype(np.int32)
        offsets = np.arange(0, 2_000_001, 500, dtype=np.int64)

        def count(n: int, *_: Any) -> None:
            for _ in range(n):  # a fault ends the loop
                count_parallel(ids, offsets, 5_000, window=10, n_workers=2)
        return count
    if algorithm.startswith("glove"):
        import simlib
        from simlib.problems.glove import GloveConfig, count_cooccurrences
        from simlib.problems.glove_slices import GloveSlices
        from simlib.problems.glove_table import GloveProblem

        rng = np.random.default_rng(0)
        ids = rng.integers(0, 300, 20_000).astype(np.int32)
        offsets = np.arange(0, 20_001, 100, dtype=np.int64)
        cooc = count_cooccurrences(ids, offsets, 300, window=3)
        if algorithm == "glove-model":  # model parallelism: the dimensions split, two steps per batch under BSP
            split = GloveSlices(cooc, GloveConfig(dim=16), max_batch=1024)
            return lambda n, *_: simlib.run(split, "bsp", substrate="shm", n_workers=2, batch_size=1024,
                                            steps=min(n * split.epoch_steps(2, 1024), 10**9), monitor_every=0.05,
                                            timeout=TIMEOUT)
        problem = GloveProblem(cooc, GloveConfig(dim=16))  # glove-hogwild: async; glove-sync: BSP, 512 entries a step
        protocol, batch = ("async", 1) if algorithm == "glove-hogwild" else ("bsp", 512)
        return lambda n, *_: simlib.run(problem, protocol, substrate="shm", n_workers=2, batch_size=batch,
                                        steps=min(n * problem.epoch_steps(2, batch), 10**9), monitor_every=0.05,
                                        timeout=TIMEOUT)
    if algorithm.startswith("allreduce-"):  # replicas summing buckets: shm's spinning barrier or the ring of pipes
        import simlib
        from simlib.problems.mlp import MLPProblem

        problem = MLPProblem(hidden=(32, 32))
        return lambda n, *_: simlib.run(problem, "allreduce", substrate=algorithm.split("-")[1], n_workers=2,
                                        steps=n, batch_size=16, bucket_bytes=4_096, overlap=True, timeout=TIMEOUT)
    if algorithm == "pipeline":  # model parallelism: an MLP's layers as two stages, 1F1B over channels
        from simlib.modelpar import run_pipeline
        from simlib.problems.mlp import MLPProblem

        problem = MLPProblem(hidden=(32, 32))
        return lambda n, *_: run_pipeline(problem, np.arange(64), stages=2, microbatches=4, steps=n, timeout=TIMEOUT)
    if algorithm.startswith("run-"):
        import simlib
        from simlib.problems.logistic import LogisticProblem, make_sparse_classification

        problem = LogisticProblem(make_sparse_classification(2_000, 500, 10, seed=0), eval_rows=200)
        substrate = algorithm.split("-", 1)[1]
        if substrate == "ray":
            def on_ray(n: int, mode: str | None = None) -> Any:
                _ray_mode(mode or "attached")
                return simlib.run(problem, "ssp:1", substrate="ray", n_workers=2, steps=n, batch_size=16,
                                  eval_every=50, timeout=TIMEOUT, num_cpus=2)
            return on_ray
        managed = {"clock_batches": 4, "managed_bandwidth": 1e5} if substrate == "pipes-managed" else {}
        per_step = managed.get("clock_batches", 1)  # mini-batches per step: LONG of them in all
        return lambda n, *_: simlib.run(problem, "ssp:1", substrate=substrate.split("-")[0], n_workers=2,
                                        steps=max(1, n // per_step), batch_size=16, eval_every=50, timeout=TIMEOUT,
                                        **managed)
    raise SystemExit(f"unknown algorithm {algorithm!r}")


def say(**event: Any) -> None:
    """One JSON line to the test."""
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def one_run(run: Callable[..., Any], mode: str | None) -> str | None:
    """Run until a fault ends the run; report how it ended and what it left behind; the error's class name."""
    error, message = None, ""
    try:
        if mode is not None:
            _ray_mode(mode)  # outside the run: starting this driver's own Ray is not the run's work
        say(event="started", t=time.time(), children=children(), threads=sorted(t.name for t in threading.enumerate()))
        run(LONG, mode)
    except BaseException as exc:  # noqa: BLE001 - what ended the run is the test's subject
        error, message = type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""
    say(event="ended", t=time.time(), error=error, message=message, children=children(), segments=segments(),
        threads=sorted(t.name for t in threading.enumerate()))
    return error


def main() -> None:
    import faulthandler

    faulthandler.register(signal.SIGUSR2, all_threads=True)  # the test asks for stacks when a run hangs
    global TIMEOUT
    algorithm = sys.argv[1]
    TIMEOUT = float(sys.argv[3]) if len(sys.argv) > 3 else TIMEOUT
    run = build(algorithm)
    if algorithm == "run-ray":
        import ray  # noqa: F401 - each run starts its actors (and an owned run its Ray): nothing more to warm up
    else:
        run(2)  # compile or load every kernel and start the logging thread before any fault
    signal.signal(signal.SIGUSR1, _raise_injected)
    say(event="ready", pid=os.getpid(), threads=sorted(t.name for t in threading.enumerate()))
    for line in sys.stdin:
        words = line.split()
        if words and words[0] == "go":
            error = one_run(run, words[1] if len(words) > 1 else None)
            if error == "SystemExit" and algorithm == "run-ray":
                # A program told to terminate exits; and Ray cannot start again in a process that took a
                # SIGTERM (a second ray.init aborts it). The test starts a fresh driver.
                break


if __name__ == "__main__":
    main()

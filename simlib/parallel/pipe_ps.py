"""A parameter server over pipes: BSP workers pull rows, compute gradients and push them back.

Processes: one server and N workers (a :class:`~simlib.parallel.WorkerGroup` of N + 1; the
server is group member 0). Each worker owns one counted :class:`~simlib.parallel.Channel` to
the server and runs, for every step c:

    pull   send the keys its mini-batch touches (int32);  receive w[keys] (float64)
    compute  the problem's real sparse gradient on the values it read
    push   send one record array of (key int32, gradient float64) per touched key

The server answers a pull for step c only once every worker's push for step c - 1 has been
applied (BSP), so the gating is the simulator's (``simlib.sim.clocks``) and the byte counts are
the simulator's with ``key_bytes=4, value_bytes=8``: a like-for-like pair for calibration.

Example::

    >>> from simlib.problems.logistic import LogisticProblem, make_sparse_classification
    >>> prob = LogisticProblem(make_sparse_classification(2_000, 500, 10, seed=0), eval_rows=500)
    >>> res = run_pipe_ps(prob, n_workers=2, steps=5, batch_size=16)
    >>> len(res.trace.updates), res.trace.quality[-1].value < res.trace.quality[0].value
    (10, True)
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.parallel.channel import Channel
from simlib.parallel.group import WorkerGroup
from simlib.parallel.worker import current
from simlib.trace import Trace

PUSH_DTYPE = np.dtype([("key", "<i4"), ("grad", "<f8")])  # 12 bytes per touched key


class DenseKeys:
    """A problem whose every step pulls and pushes all parameters (a dense model on the wire)."""

    def __init__(self, problem: Any):
        self.inner = problem
        self.n_params = problem.n_params
        self.metric = getattr(problem, "metric", "loss")
        self.lower_is_better = getattr(problem, "lower_is_better", True)
        self._all = np.arange(problem.n_params, dtype=np.int32)

    def keys(self, batch: np.ndarray) -> np.ndarray:
        """Every parameter id, whatever the batch."""
        return self._all

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def pull_keys(problem: Any, batch: np.ndarray) -> np.ndarray:
    """The keys a mini-batch pulls, as int32 (4 bytes each on the wire)."""
    return problem.keys(batch).astype(np.int32, copy=False)


def push_message(problem: Any, values: np.ndarray, batch: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The worker's compute: the gradient on the values read, packed as (key, grad) records."""
    keys, g = problem.gradient(values, batch, keys)
    msg = np.empty(len(keys), PUSH_DTYPE)
    msg["key"] = keys
    msg["grad"] = g
    return msg


def warm_up(problem: Any) -> None:
    """One step in this process before workers fork, off the clock."""
    # NOTE: the first np.unique in a freshly forked child took 0.4 s here (a lazy set-up that
    # fork does not share unless the parent has run it); one call in the parent removes that.
    batch = problem.batch(problem.shards(1)[0], 0, 2)
    keys = pull_keys(problem, batch)
    push_message(problem, np.zeros(len(keys)), batch, keys)
    problem.loss(problem.init_params())


@dataclass
class PipePSResult:
    """Final weights, the workers' trace (server spans left out) and the run's wall seconds."""

    w: np.ndarray
    trace: Trace
    wall_seconds: float  # the whole call: process start, training, result collection

    @property
    def worker_seconds(self) -> float:
        """From the group's start to the last worker span's end (process start included)."""
        return max((s.end for s in self.trace.spans), default=0.0)


def run_pipe_ps(
    problem: Any,
    n_workers: int = 2,
    steps: int = 50,
    batch_size: int = 32,
    lr: float = 0.5,
    eval_every: int = 0,
    start_method: str | None = None,
    timeout: float | None = 120.0,
) -> PipePSResult:
    """Train ``problem`` with BSP through a pipe-based parameter server; returns weights and trace.

    ``problem`` follows the parameter-server contract of :mod:`simlib.problems.logistic`
    (``init_params``, ``shards``, ``batch``, ``keys``, ``gradient``, ``loss``). The server
    records the loss every ``eval_every`` rounds (0: only at the start and the end).
    """
    check.positive_int("n_workers", n_workers)
    check.positive_int("steps", steps)
    check.positive_int("batch_size", batch_size)
    check.positive("lr", lr)
    check.non_negative_int("eval_every", eval_every)
    for name in ("init_params", "shards", "batch", "keys", "gradient", "loss"):
        if not callable(getattr(problem, name, None)):
            raise ValueError(f"problem must provide {name}() (the parameter-server contract)")
    shards = problem.shards(n_workers)  # raises ValueError naming n_workers if too many
    warm_up(problem)
    started = time.perf_counter()
    with WorkerGroup(n_workers + 1, start_method, label="pipe PS") as group:
        pairs = [group.channel_pair() for _ in range(n_workers)]
        server_ends = tuple(a for a, _ in pairs)
        worker_args = [(None, server_ends)] + [(b, None) for _, b in pairs]
        out = group.run(_member, problem, shards, steps, batch_size, lr, eval_every,
                        worker_args=worker_args, timeout=timeout)
        raw = group.trace
    wall = time.perf_counter() - started
    w, quality = out[0]
    trace = Trace(label=f"pipe PS, {n_workers} worker{'s' if n_workers > 1 else ''}", substrate="parallel",
                  n_workers=n_workers, metric=getattr(problem, "metric", "loss"),
                  lower_is_better=getattr(problem, "lower_is_better", True))
    for s in raw.spans:  # member 0 is the server; workers become 0 .. N-1 as in the simulator
        if s.worker > 0:
            trace.span(s.worker - 1, s.kind, s.start, s.end, s.nbytes, s.step)
    for u in raw.updates:
        if u.worker > 0:
            trace.update(u.time, u.worker - 1, u.step, u.staleness, u.applied)
    for t, step, value in quality:
        trace.record_quality(t, step, value)
    trace.meta.update(substrate_detail="pipe parameter server", protocol="bsp", steps=steps,
                      batch_size=batch_size, lr=lr, wall_seconds=wall, start_method=group.start_method)
    return PipePSResult(w, trace, wall)


def _member(member: int, n_members: int, problem: Any, shards: list, steps: int, batch_size: int, lr: float,
            eval_every: int, mine: Channel | None, server_ends: tuple[Channel, ...] | None) -> Any:
    """Group entry point: member 0 serves, the others are workers 0 .. N-1."""
    if member == 0:
        assert server_ends is not None
        return _serve(problem, list(server_ends), steps, lr, eval_every)
    assert mine is not None
    _work(member - 1, problem, shards[member - 1], mine, steps, batch_size)
    return None


def _work(i: int, problem: Any, shard: tuple[int, int], ch: Channel, steps: int, batch_size: int) -> None:
    """One worker: pull, compute, push, ``steps`` times (the channel records send/recv spans)."""
    ctx = current()
    for c in range(steps):
        batch = problem.batch(shard, c, batch_size)
        keys = pull_keys(problem, batch)
        ch.send_array(keys)
        values = ch.recv_array()  # the server holds this reply until step c - 1 is complete
        s = time.perf_counter()
        msg = push_message(problem, values, batch, keys)
        e = time.perf_counter()
        ch.send_array(msg)
        if ctx is not None:
            ctx.span("compute", s, e, step=c)
            ctx.update(c, staleness=0)


def _serve(problem: Any, chans: list[Channel], steps: int, lr: float, eval_every: int) -> tuple[np.ndarray, list]:
    """The server: answer pulls for step c once step c - 1 is complete; apply every push at once."""
    ctx = current()
    n = len(chans)
    w = problem.init_params()
    clock = [0] * n  # the step each worker's next pull belongs to
    pushes = [0] * (steps + 1)  # pushes received per step
    completed = 0  # steps 0 .. completed-1 have all n pushes
    deferred: list[tuple[int, np.ndarray]] = []  # (worker, keys) pulls waiting for the barrier
    now = ctx.now if ctx is not None else time.perf_counter
    quality = [(now(), 0, float(problem.loss(w)))]
    expecting_push = [False] * n
    while completed < steps:
        for ch in wait(chans):
            i = chans.index(ch)  # type: ignore[arg-type]
            msg = ch.recv_array()
            if expecting_push[i]:
                step = clock[i] - 1
                rec = msg.view(PUSH_DTYPE)  # a record dtype travels as raw 'V12' bytes
                w[rec["key"]] -= lr * rec["grad"]
                expecting_push[i] = False
                pushes[step] += 1
                if pushes[step] == n:
                    completed += 1
                    if eval_every and completed % eval_every == 0 and completed < steps:
                        quality.append((now(), completed * n, float(problem.loss(w))))
                    ready = [(j, k) for j, k in deferred if clock[j] - 1 <= completed]
                    deferred = [(j, k) for j, k in deferred if clock[j] - 1 > completed]
                    for j, k in ready:
                        chans[j].send_array(w[k])
            else:
                clock[i] += 1
                expecting_push[i] = True
                if clock[i] - 1 <= completed:
                    ch.send_array(w[msg])
                else:
                    deferred.append((i, msg))
    quality.append((now(), steps * n, float(problem.loss(w))))
    return w, quality

"""What a Ray actor call costs on the machine at hand, as the simulator's latency, bandwidth and server time.

A ping-pong between actors (placed as the Ray substrate places workers and a server) replays the
substrate's two calls: a **pull** (int64 keys in, float64 values out) and a **push** (keys and
float64 deltas in, a small tuple out), at a few key counts, all below Ray's 100 KB limit for
arguments passed inline (larger arrays take the object store, a different and slower path). A
round trip moving ``x`` bytes (request + reply: 16 bytes a key for either call) costs

    round trip(x) = 2 * latency + server_time + x / bandwidth.

The **server time** ``S`` is what the server spends on each call (receiving, handling, replying:
Ray's machinery, not the handler, is almost all of it); its event loop handles one call at a time,
so N workers' calls queue for it. It is measured two ways and the larger is kept: the server
actor's CPU seconds per call (its process's CPU clock), and, with N callers at once, the round trip
at zero bytes divided by N: a server kept busy answers each of N callers once every N service
times, and on a busy machine that wall time exceeds its CPU time. With one caller the line's
intercept less ``S`` gives the one-way ``latency`` (the caller's side and the transport). Means, not
medians: a run's wall time is a sum of calls, and a loaded machine's slow calls count in it.

:func:`step_cost` times one worker's local work per step (batch, keys, the problem's step) as
``compute_per_unit`` per unit of ``problem.work`` plus ``compute_overhead``. :func:`sim_options`
turns both into the options of a ``simlib.run(..., substrate="sim")`` that predicts a Ray run:
the simulator's server serves requests one at a time for ``server_time`` each, so the queueing of
N workers at the coordinator is simulated, not measured into the latency.

Example (needs a connected Ray)::

    >>> cost = ray_message_cost(keys=(1, 1_024), calls=20)  # doctest: +SKIP
    >>> cost.latency > 0 and cost.bandwidth > 0 and cost.server_time > 0  # doctest: +SKIP
    True
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from simlib import _validate as check
from simlib.calibration.calibrate import fit_line

INLINE_LIMIT = 100 * 1024  # bytes: Ray passes smaller arguments inline (max_direct_call_object_size)
WIRE_BYTES = 8  # per key and per value: the substrate ships int64 keys and float64 values
BYTES_PER_KEY = 2 * WIRE_BYTES  # a pull moves a key out and a value back; a push a key and a delta


@dataclass(frozen=True)
class RayMessageCost:
    """One-way latency (s), bandwidth (bytes/s) and server time per call (s), with the round trips they fit.

    ``round_trips`` are mean seconds of a pull or push moving ``sizes[k]`` bytes, with ``callers``
    callers at once; ``server_cpu`` the server's CPU seconds per call.
    """

    latency: float
    bandwidth: float
    server_time: float
    server_cpu: float
    callers: int
    sizes: tuple[int, ...]
    round_trips: tuple[float, ...]


class _Server:
    """The server side: an asynchronous actor with the substrate's pull and push, over a table of zeros."""

    def __init__(self, n_keys: int):
        self.w = np.zeros(n_keys)

    async def pull(self, worker: int, clock: int, keys: np.ndarray) -> tuple[np.ndarray, tuple]:
        """(table[keys], a small tuple): the shape of the substrate's pull reply."""
        return self.w[keys], (0, 0, 0, 0.0)

    async def push(self, worker: int, clock: int, keys: np.ndarray, deltas: np.ndarray, version: int) -> tuple:
        """table[keys] += deltas; the shape of the substrate's push reply (applied, tau, seq, completed)."""
        self.w[keys] += deltas
        return True, 0, 0, clock

    def cpu(self) -> float:
        """CPU seconds this process (every thread of it) has used so far."""
        return time.process_time()


class _Pinger:
    """The worker side: times pulls and pushes to the server actor."""

    def __init__(self, server: Any):
        self.server = server

    def time(self, key_counts: list[int], calls: int) -> list[float]:
        """Mean seconds of a pull or a push at each key count (``calls`` of each; counts interleaved)."""
        import ray

        keys = [np.arange(n, dtype=np.int64) for n in key_counts]
        times: list[list[float]] = [[] for _ in key_counts]
        for c in range(calls):
            for k, ks in enumerate(keys):
                s = time.perf_counter()
                values, _ = ray.get(self.server.pull.remote(0, c, ks))
                pulled = time.perf_counter()
                ray.get(self.server.push.remote(0, c, ks, values + 1.0, 0))
                times[k] += [pulled - s, time.perf_counter() - pulled]
        return [statistics.fmean(t) for t in times]


def ray_message_cost(keys: Sequence[int] = (1, 512, 2_048, 4_096), calls: int = 50, callers: int = 1,
                     placement: str = "auto") -> RayMessageCost:
    """Pulls and pushes of ``keys`` keys from ``callers`` actors at once to one server actor; fit the line.

    With one caller the round trips are uncontended and give the latency and bandwidth; with N
    callers they include queueing at the server, which is what their ``server_time`` is for
    (:func:`sim_options` takes each from the right ping-pong).
    """
    import ray

    from simlib.substrates.ray import _kill, _resources

    check.positive_int("calls", calls)
    check.positive_int("callers", callers)
    counts = [int(n) for n in keys]
    if len(counts) < 2:
        raise ValueError(f"keys must hold at least two key counts to fit a line, got {counts}")
    limit = INLINE_LIMIT // WIRE_BYTES
    if not all(0 < n <= limit for n in counts):
        raise ValueError(f"keys must be key counts in [1, {limit}] (arrays Ray passes inline, as the substrate's "
                         f"are), got {counts}")
    server_res, worker_res = _resources(placement)
    server = ray.remote(_Server).options(num_cpus=0, resources=server_res).remote(max(counts))
    pingers = [ray.remote(_Pinger).options(num_cpus=0, resources=worker_res).remote(server) for _ in range(callers)]
    try:
        ray.get([p.time.remote(counts, 2) for p in pingers])  # the first calls set up the connections
        cpu0 = ray.get(server.cpu.remote())
        per_caller = ray.get([p.time.remote(counts, calls) for p in pingers])
        cpu1 = ray.get(server.cpu.remote())
    finally:
        _kill(ray, [*pingers, server])
    sizes = [BYTES_PER_KEY * n for n in counts]
    rts = [statistics.fmean(col) for col in zip(*per_caller)]
    server_cpu = (cpu1 - cpu0) / (callers * calls * 2 * len(counts))
    intercept, slope = fit_line([float(x) for x in sizes], rts)
    server_time = max(server_cpu, intercept / callers) if callers > 1 else server_cpu
    latency = max((intercept - server_time) / 2, 1e-7)
    bandwidth = 1 / slope if slope > 0 else 1e12  # a flat line: bytes cost nothing measurable
    return RayMessageCost(latency, bandwidth, server_time, server_cpu, callers, tuple(sizes), tuple(rts))


def step_cost(problem: Any, batch_size: int, steps: int = 200, lr: float = 0.5) -> tuple[float, float]:
    """(compute_per_unit, compute_overhead): seconds per unit of work and per step of a worker's local work."""
    check.positive_int("steps", steps)
    shard = problem.shards(1)[0]
    w = np.asarray(problem.init_params(), dtype=np.float64)
    units, secs = [], []
    for c in range(steps + 5):
        s = time.perf_counter()
        batch = problem.batch(shard, c, batch_size)
        keys = problem.keys(batch)
        problem.step(w[keys], batch, keys, lr)
        if c >= 5:  # the first calls load compiled kernels
            secs.append(time.perf_counter() - s)
            units.append(float(problem.work(batch)))
    if max(units) > min(units):
        overhead, per_unit = fit_line(units, secs)
        if per_unit > 0 and overhead > 0:
            return per_unit, overhead
    return statistics.median(secs) / statistics.median(units), 0.0


def sim_options(one: RayMessageCost, compute_per_unit: float, compute_overhead: float,
                busy: RayMessageCost | None = None) -> dict[str, float]:
    """The ``simlib.run(..., substrate="sim")`` options that model a Ray run.

    Latency and bandwidth come from ``one``, a ping-pong with one caller; the server time from
    ``busy``, the ping-pong with as many callers as the run has workers (default: ``one``). The
    simulator's push is one way (latency + bytes / bandwidth); a Ray push waits for its reply, so
    the reply's latency is charged to every step's ``compute_overhead``. Keys and values cross as
    8 bytes each (int64, float64), as the substrate ships them.
    """
    if one.callers != 1:
        raise ValueError(f"one must be a ping-pong with callers=1 (uncontended round trips), got callers={one.callers}")
    busy = one if busy is None else busy
    return {"latency": one.latency, "bandwidth": one.bandwidth, "server_time": busy.server_time,
            "compute_per_unit": compute_per_unit, "compute_overhead": compute_overhead + one.latency,
            "key_bytes": WIRE_BYTES, "value_bytes": WIRE_BYTES}

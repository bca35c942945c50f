"""What a Ray actor call costs on the machine at hand, as the simulator's latency and bandwidth.

A ping-pong between two actors (placed as the Ray substrate places a worker and a server) times
round trips carrying a float64 NumPy array of a few sizes; a line through them,

    round trip(n bytes) = 2 * latency + 2 * n / bandwidth,

gives the simulator's one-way ``latency`` and ``bandwidth``. :func:`step_cost` times one worker's
local work per step (batch, keys, the problem's step) as ``compute_per_unit`` per unit of
``problem.work`` plus ``compute_overhead``. :func:`sim_options` turns both into the options of a
``simlib.run(..., substrate="sim")`` that predicts a Ray run.

Example (needs a connected Ray)::

    >>> cost = ray_message_cost(sizes=(8, 8_192), calls=20)  # doctest: +SKIP
    >>> cost.latency > 0 and cost.bandwidth > 0  # doctest: +SKIP
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


@dataclass(frozen=True)
class RayMessageCost:
    """One-way latency (s) and bandwidth (bytes/s) of an actor call, with the round trips they fit."""

    latency: float
    bandwidth: float
    sizes: tuple[int, ...]
    round_trips: tuple[float, ...]  # median seconds per round trip at each size

    def round_trip(self, nbytes: float) -> float:
        """2 * latency + 2 * nbytes / bandwidth."""
        return 2 * self.latency + 2 * nbytes / self.bandwidth


class _Echo:
    """The server side of the ping-pong: an asynchronous actor, as the substrate's server shards are."""

    async def echo(self, worker: int, clock: int, a: np.ndarray) -> tuple[np.ndarray, tuple]:
        """(a, a small tuple): the shape of the substrate's pull reply (values, (version, lag, seq, held))."""
        return a, (worker, clock, 0, 0.0)


class _Pinger:
    """The worker side: times round trips to an echo actor."""

    def __init__(self, echo: Any):
        self.echo = echo

    def time(self, sizes: list[int], calls: int) -> list[float]:
        """Median seconds of ``calls`` round trips at each size (sizes interleaved, so load drifts hit all alike)."""
        import ray

        arrays = [np.zeros(max(n // 8, 1)) for n in sizes]
        for a in arrays:  # the first calls set up the connection
            ray.get(self.echo.echo.remote(0, 0, a))
        times: list[list[float]] = [[] for _ in sizes]
        for _ in range(calls):
            for k, a in enumerate(arrays):
                s = time.perf_counter()
                ray.get(self.echo.echo.remote(0, 0, a))
                times[k].append(time.perf_counter() - s)
        return [statistics.median(t) for t in times]


def ray_message_cost(sizes: Sequence[int] = (8, 8_192, 65_536, 524_288), calls: int = 100, callers: int = 1,
                     placement: str = "auto") -> RayMessageCost:
    """Ping-pong from ``callers`` actors at once to one echo actor (placed as workers and a server); fit the line.

    With several callers the echo actor serves them in turn, as a server shard serves its workers,
    so the fitted latency includes that queueing: calibrate with as many callers as the run has workers.
    """
    import ray

    from simlib.ray_ps import _resources

    check.positive_int("calls", calls)
    check.positive_int("callers", callers)
    if len(sizes) < 2:
        raise ValueError(f"sizes must hold at least two message sizes to fit a line, got {list(sizes)}")
    server_res, worker_res = _resources(placement)
    echo = ray.remote(_Echo).options(num_cpus=0, resources=server_res).remote()
    pingers = [ray.remote(_Pinger).options(num_cpus=0, resources=worker_res).remote(echo) for _ in range(callers)]
    try:
        per_caller = ray.get([p.time.remote([int(n) for n in sizes], calls) for p in pingers])
        rts = [statistics.median(col) for col in zip(*per_caller)]
    finally:
        for a in (*pingers, echo):
            ray.kill(a)
    intercept, slope = fit_line([float(n) for n in sizes], rts)
    latency = max(intercept / 2, 1e-7)
    bandwidth = 2 / slope if slope > 0 else 1e12  # a flat line: bytes cost nothing measurable
    return RayMessageCost(latency, bandwidth, tuple(int(n) for n in sizes), tuple(rts))


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


def sim_options(cost: RayMessageCost, compute_per_unit: float, compute_overhead: float) -> dict[str, float]:
    """The ``simlib.run(..., substrate="sim")`` options that model a Ray run.

    The simulator's push is one way (latency + bytes / bandwidth); a Ray push waits for its reply,
    so the reply's latency is charged to every step's ``compute_overhead``.
    """
    return {"latency": cost.latency, "bandwidth": cost.bandwidth, "compute_per_unit": compute_per_unit,
            "compute_overhead": compute_overhead + cost.latency}

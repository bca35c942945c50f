"""Compute time of one step: the cost model times straggler noise, from each worker's own stream."""
from __future__ import annotations

from typing import Callable

import numpy as np

from simlib.sim.config import SimConfig

_BLOCK = 64  # draws taken from a worker's generator at once


class ComputeModel:
    """time = (overhead + units * per_unit) * slow_factor * jitter + pause.

    Each worker draws from its own generators (one for jitter, one for pauses), spawned from the
    run's seed, so two protocols run with the same seed see the same straggler realisations
    (common random numbers): differences between them come from the protocol alone.

    NOTE: the generators exist only for the noise the config has, and each draws a block of
    ``_BLOCK`` values at a time (the same numbers, in the same order, as one draw a step; the
    lognormal factors exp(sigma z - sigma^2 / 2) computed as one array give the same bits too);
    at 10,000 workers building 20,000 unused generators took 1 s and one draw a step 0.6 us.
    """

    def __init__(self, cfg: SimConfig, seed_seq: np.random.SeedSequence):
        self.cfg = cfg
        st = cfg.stragglers
        n = cfg.n_workers
        # The children seed_seq.spawn(2n) would give, built only where used: jitter i <- child i, pause i <- n + i.
        def child(k: int) -> np.random.Generator:
            return np.random.default_rng(np.random.SeedSequence(seed_seq.entropy, spawn_key=seed_seq.spawn_key + (k,),
                                                                pool_size=seed_seq.pool_size))

        self._jitter = [child(i) for i in range(n)] if st.jitter != "none" else None
        self._pause = [child(n + i) for i in range(n)] if st.pause_prob else None
        self._factors: list[list[float]] = [[] for _ in range(n)] if self._jitter else []
        self._pauses: list[list[float]] = [[] for _ in range(n)] if self._pause else []
        self._slow = st.slow_workers
        self._slow_factor = st.slow_factor

    def base(self, units: int) -> float:
        """The cost model without noise: overhead + units * per_unit."""
        return self.cfg.compute_overhead + units * self.cfg.compute_per_unit

    def _jitter_factor(self, worker: int) -> float:
        """The worker's next jitter factor (mean 1)."""
        buf = self._factors[worker]
        if not buf:
            st = self.cfg.stragglers
            rng = self._jitter[worker]
            if st.jitter == "lognormal":
                sigma = st.jitter_sigma
                buf.extend(np.exp(sigma * rng.standard_normal(_BLOCK) - 0.5 * sigma * sigma)[::-1].tolist())
            else:
                buf.extend(rng.exponential(size=_BLOCK)[::-1].tolist())
        return buf.pop()

    def _pause_draw(self, worker: int) -> float:
        """The worker's next uniform pause draw (it pauses when the draw < pause_prob)."""
        buf = self._pauses[worker]
        if not buf:
            buf.extend(self._pause[worker].random(_BLOCK)[::-1].tolist())
        return buf.pop()

    def predrawn(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """(jitter factors, pause draws), each (workers, steps): the values the next ``steps`` calls of
        :meth:`time` would use, row by row ((workers, 0) where the config has no such noise)."""
        n = self.cfg.n_workers

        def rows(draw: Callable[[int], float]) -> np.ndarray:
            return np.array([[draw(i) for _ in range(steps)] for i in range(n)], dtype=np.float64)

        return (np.empty((n, 0)) if self._jitter is None else rows(self._jitter_factor),
                np.empty((n, 0)) if self._pause is None else rows(self._pause_draw))

    def time(self, worker: int, units: int) -> float:
        """One step's compute time for ``worker`` processing ``units`` (nonzeros or samples)."""
        t = self.base(units) * (self._slow_factor if worker < self._slow else 1.0)
        if self._jitter is not None:
            t *= self._jitter_factor(worker)
        if self._pause is not None and self._pause_draw(worker) < self.cfg.stragglers.pause_prob:
            t += self.cfg.stragglers.pause_time
        return t

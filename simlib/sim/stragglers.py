"""Compute time of one step: the cost model times straggler noise, from each worker's own stream."""
from __future__ import annotations

import numpy as np

from simlib.sim.config import SimConfig


class ComputeModel:
    """time = (overhead + units * per_unit) * slow_factor * jitter + pause.

    Each worker draws from its own generators (one for jitter, one for pauses), spawned from the
    run's seed, so two protocols run with the same seed see the same straggler realisations
    (common random numbers): differences between them come from the protocol alone.
    """

    def __init__(self, cfg: SimConfig, seed_seq: np.random.SeedSequence):
        self.cfg = cfg
        st = cfg.stragglers
        children = seed_seq.spawn(2 * cfg.n_workers)
        self._jitter = [np.random.default_rng(s) for s in children[: cfg.n_workers]]
        self._pause = [np.random.default_rng(s) for s in children[cfg.n_workers :]]
        self._factor = [st.slow_factor if i < st.slow_workers else 1.0 for i in range(cfg.n_workers)]

    def base(self, units: int) -> float:
        """The cost model without noise: overhead + units * per_unit."""
        return self.cfg.compute_overhead + units * self.cfg.compute_per_unit

    def time(self, worker: int, units: int) -> float:
        """One step's compute time for ``worker`` processing ``units`` (nonzeros or samples)."""
        st = self.cfg.stragglers
        t = self.base(units) * self._factor[worker]
        if st.jitter == "lognormal":
            sigma = st.jitter_sigma
            t *= float(np.exp(sigma * self._jitter[worker].standard_normal() - 0.5 * sigma * sigma))
        elif st.jitter == "exponential":
            t *= float(self._jitter[worker].exponential())
        if st.pause_prob and self._pause[worker].random() < st.pause_prob:
            t += st.pause_time
        return t

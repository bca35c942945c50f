"""The discrete-event simulator: BSP, SSP and async training on a simulated cluster (SimPy).

It trains through :func:`simlib.run` with ``substrate="sim"`` (:mod:`simlib.substrates.sim`)::

    >>> import simlib
    >>> from simlib.sim import Stragglers, default_problem
    >>> bsp = simlib.run(default_problem(), "bsp", substrate="sim", n_workers=4, steps=10,
    ...                  stragglers=Stragglers(jitter="lognormal")).trace
    >>> bsp.summary()["max_clock_lag"]
    0.0

``SimConfig`` holds the whole run (validated on construction); its fields beside the protocol and the
training ones are the sim substrate's options. Modules: ``config`` (fields and checks), ``network`` (message
cost, shared links, ring all-reduce), ``clocks`` (BSP/SSP/async gating, backup workers,
deadlines), ``stragglers`` (compute time model), ``sites`` (sites joined by a WAN, per-site servers,
the significance filter), ``managed`` (clocks of several mini-batches, Bosen's managed communication),
``engine`` (the run), ``kernel`` (SimPy with a fast path for plain delays and a time-bucketed queue),
``fastcost`` (cost-only runs of the plain parameter server, compiled, pinned to the engine's traces).
"""
from typing import Any

from simlib.sim.config import PROTOCOLS, TOPOLOGIES, SimConfig, Stragglers

# The engine (SimPy, NumPy, the problems' compiled kernels) is imported on first use, so that
# reading the configuration -- e.g. for ``python -m simlib compare --help`` -- stays fast.
_LAZY = {"default_problem": "simlib.sim.engine", "message_time": "simlib.sim.network",
         "ring_allreduce_time": "simlib.sim.network"}

__all__ = ["SimConfig", "Stragglers", *_LAZY, "PROTOCOLS", "TOPOLOGIES"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'simlib.sim' has no attribute {name!r}")

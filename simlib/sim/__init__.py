"""The discrete-event substrate: BSP, SSP and async training on a simulated cluster (SimPy).

    >>> from simlib.sim import SimConfig, Stragglers, simulate
    >>> bsp = simulate(SimConfig(n_workers=4, steps=10, stragglers=Stragglers(jitter="lognormal")))
    >>> bsp.summary()["max_clock_lag"]
    0.0

``SimConfig`` holds the whole run (validated on construction); ``simulate`` returns a
:class:`simlib.trace.Trace`. Modules: ``config`` (fields and checks), ``network`` (message
cost, shared links, ring all-reduce), ``clocks`` (BSP/SSP/async gating, backup workers,
deadlines), ``stragglers`` (compute time model), ``engine`` (the run).
"""
from simlib.sim.config import PROTOCOLS, TOPOLOGIES, SimConfig, Stragglers
from simlib.sim.engine import default_problem, simulate
from simlib.sim.network import message_time, ring_allreduce_time

__all__ = [
    "SimConfig",
    "Stragglers",
    "simulate",
    "default_problem",
    "message_time",
    "ring_allreduce_time",
    "PROTOCOLS",
    "TOPOLOGIES",
]

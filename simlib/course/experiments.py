"""Ready-made experiments: the default straggler cluster and a protocol comparison on it.

The default is tuned so that the lectures' qualitative results come out of it (see
``tests/test_cli.py``): with transient stragglers SSP reaches the target loss sooner than BSP
in simulated time, and async has the shortest step but needs more steps than BSP.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Sequence

from simlib.protocol import Protocol
from simlib.sim.config import SimConfig, Stragglers
from simlib.trace import Trace

if TYPE_CHECKING:
    from simlib.problems.logistic import LogisticProblem

DEFAULT_TARGET = 0.44
DEFAULT_PROTOCOLS = ("bsp", "ssp:3", "async")
# The comparison's problem (see compare_problem); the CLI checks sizes against it before building it.
COMPARE_ROWS, COMPARE_FEATURES, COMPARE_NNZ = 20_000, 500, 10


def cluster_options(**changes: Any) -> dict[str, Any]:
    """The default straggler cluster as :func:`simlib.run`'s options (substrate 'sim'), ``changes`` merged in:
    8 workers, 150 steps, lr 3, a 1 Gbit/s network with 0.2 ms latency, and stragglers of every kind."""
    return {"n_workers": 8, "steps": 150, "batch_size": 32, "lr": 3.0, "compute_per_unit": 2e-7,
            "compute_overhead": 2e-4, "latency": 2e-4, "bandwidth": 1.25e8,
            "stragglers": Stragglers(jitter="lognormal", jitter_sigma=1.0, slow_workers=1, slow_factor=4.0,
                                     pause_prob=0.1, pause_time=0.01), **changes}


def default_cluster(**changes: Any) -> SimConfig:
    """The default straggler cluster (:func:`cluster_options`) as a SimConfig, under BSP unless ``changes`` say."""
    return SimConfig(**cluster_options(**changes))


def compare_problem(seed: int = 0) -> "LogisticProblem":
    """20 k rows x 500 features, 10 nonzeros per row: dense enough that stale updates collide (the default problem's
    make, cached with it)."""
    from simlib.sim.engine import default_problem

    return default_problem(COMPARE_ROWS, COMPARE_FEATURES, COMPARE_NNZ, seed)


def with_protocol(base: SimConfig, protocol: "str | Protocol") -> SimConfig:
    """``base`` under another protocol ('bsp', 'ssp:3', 'SSP(3)', 'async' or a Protocol); ValueError names the field."""
    p = Protocol.parse(protocol)
    # A Protocol value carries its backup workers and deadline too; a string names the read rule only.
    return base.replace(protocol=p if isinstance(protocol, Protocol) else p.kind, staleness=p.staleness)


def compare(protocols: Sequence["str | Protocol"] = DEFAULT_PROTOCOLS, base: SimConfig | None = None,
            problem: Any = None, progress: Callable[[int, float], None] | None = None) -> list[Trace]:
    """Run the same cluster under each protocol (same seed, so the same straggler draws).

    ``progress(i, fraction)`` hears of run i at its start (0.0), as it goes where the engine reports it (a
    cost-only run does not), and at its end (1.0).
    """
    import simlib
    from simlib.substrates.sim import run_args

    base = default_cluster() if base is None else base
    configs = [with_protocol(base, p) for p in protocols]  # every one validated before any run
    problem = compare_problem(base.seed) if problem is None else problem
    traces = []
    for i, cfg in enumerate(configs):
        report = None if progress is None else functools.partial(progress, i)
        if report is not None:
            report(0.0)
        traces.append(simlib.run(problem, **run_args(cfg), progress=report).trace)
        if report is not None:
            report(1.0)
    return traces


def summary_rows(traces: Sequence[Trace], target: float) -> list[dict[str, Any]]:
    """One row per run: time and rounds to the target, time per step, waiting, bytes, staleness."""
    rows = []
    for t in traces:
        s = t.summary()
        steps = t.steps_to(target)
        rows.append({
            "run": t.label,
            "time_to_target": t.time_to(target),
            "rounds_to_target": None if steps is None else steps / t.n_workers,
            "time_per_step": s["time_per_step"],
            "wait_fraction": s["wait_fraction"],
            "bytes_moved": s["bytes_sent"] + s["bytes_received"],
            "mean_staleness": s["mean_staleness"],
            "max_staleness": s["max_staleness"],
            "final_loss": s["final_" + t.metric],
        })
    return rows

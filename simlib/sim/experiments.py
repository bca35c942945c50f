"""Ready-made experiments: the default straggler cluster and a protocol comparison on it.

The default is tuned so that the seeds' qualitative results come out of it (see
``tests/test_cli.py``): with transient stragglers SSP reaches the target loss sooner than BSP
in simulated time, and async has the shortest step but needs more steps than BSP.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

from simlib.problems.logistic import LogisticProblem, make_sparse_classification
from simlib.sim.config import SimConfig, Stragglers
from simlib.sim.engine import simulate
from simlib.trace import Trace

DEFAULT_TARGET = 0.44
DEFAULT_PROTOCOLS = ("bsp", "ssp:3", "async")


def default_cluster(**changes: Any) -> SimConfig:
    """8 workers, 150 steps, a 1 Gbit/s network with 0.2 ms latency, and stragglers of every kind."""
    base = SimConfig(
        n_workers=8,
        steps=150,
        batch_size=32,
        lr=3.0,
        compute_per_unit=2e-7,
        compute_overhead=2e-4,
        latency=2e-4,
        bandwidth=1.25e8,
        stragglers=Stragglers(jitter="lognormal", jitter_sigma=1.0, slow_workers=1, slow_factor=4.0,
                              pause_prob=0.1, pause_time=0.01),
    )
    return base.replace(**changes) if changes else base


@functools.lru_cache(maxsize=2)
def compare_problem(seed: int = 0) -> LogisticProblem:
    """20 k rows x 500 features, 10 nonzeros per row: dense enough that stale updates collide."""
    data = make_sparse_classification(20_000, 500, 10, label_noise=0.05, seed=seed)
    return LogisticProblem(data, l2=1e-4, eval_rows=4_000, seed=seed)


def parse_protocol(spec: str) -> dict[str, Any]:
    """'bsp' | 'async' | 'ssp:S' (or 'ssp(S)') -> SimConfig fields; ValueError names 'protocols'."""
    s = spec.strip().lower().replace("(", ":").rstrip(")")
    if s in ("bsp", "async"):
        return {"protocol": s, "staleness": 0}
    if s.startswith("ssp"):
        _, _, bound = s.partition(":")
        if not bound.isdigit():
            raise ValueError(f"protocols: SSP needs a staleness bound such as 'ssp:3', got {spec!r}")
        return {"protocol": "ssp", "staleness": int(bound)}
    raise ValueError(f"protocols: unknown protocol {spec!r}; use 'bsp', 'ssp:S' or 'async'")


def compare(
    protocols: Sequence[str] = DEFAULT_PROTOCOLS,
    base: SimConfig | None = None,
    problem: Any = None,
    progress: Callable[[int, float], None] | None = None,
) -> list[Trace]:
    """Run the same cluster under each protocol (same seed, so the same straggler draws)."""
    base = default_cluster() if base is None else base
    problem = compare_problem(base.seed) if problem is None else problem
    configs = [base.replace(**parse_protocol(p)) for p in protocols]
    traces = []
    for i, cfg in enumerate(configs):
        cb = None if progress is None else (lambda f, i=i: progress(i, f))
        traces.append(simulate(cfg, problem, progress=cb))
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

"""The ``sim`` substrate: :func:`simlib.run` on the discrete-event cluster of :mod:`simlib.sim.engine`.

Options beyond the shared :class:`~simlib.contract.Training` are :class:`~simlib.sim.SimConfig`'s
cluster fields (``latency``, ``bandwidth``, ``stragglers``, ``topology``, ``n_servers``, ...).
"""
from __future__ import annotations

from typing import Any

from simlib import _validate as check
from simlib.contract import Result, Training
from simlib.protocol import Protocol, StepRule
from simlib.sim.config import SimConfig
from simlib.sim.engine import run_config


def config_for(protocol: Protocol, training: Training, **cluster: Any) -> SimConfig:
    """The SimConfig of a contract run: protocol and training fields, plus cluster fields."""
    return SimConfig(protocol=protocol, n_workers=training.n_workers, steps=training.steps,
                     batch_size=training.batch_size, lr=training.lr, eval_every=training.eval_every,
                     seed=training.seed, read_rule=training.read_rule, **_rule_fields(training.rule), **cluster)


def _rule_fields(rule: StepRule) -> dict[str, Any]:
    """SimConfig's rule fields: the built-in rule's switches, or a subclass as it is."""
    if type(rule) is StepRule:
        return {"staleness_aware": rule.staleness_aware, "accumulation": rule.accumulation}
    return {"rule": rule}


def run(problem: Any, protocol: Protocol, training: Training, **cluster: Any) -> Result:
    """Simulate ``problem`` under ``protocol``; ``cluster`` holds SimConfig's other fields."""
    bad = sorted(set(cluster) - set(SimConfig.__dataclass_fields__))
    if bad:
        hint = check.nearest(bad[0], SimConfig.__dataclass_fields__)
        raise ValueError(f"{bad[0]}: not an option of substrate 'sim'{'; ' + hint if hint else ''}"
                         " (its options are simlib.sim.SimConfig's fields)")
    state = run_config(config_for(protocol, training, **cluster), problem)
    return Result(state.trace, state.w, {"simulated_seconds": state.trace.makespan})

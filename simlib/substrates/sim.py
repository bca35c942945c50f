"""The ``sim`` substrate: :func:`simlib.run` on the discrete-event cluster of :mod:`simlib.sim.engine`.

Options beyond the shared :class:`~simlib.contract.Training` are ``progress`` (called with the fraction
of steps done) and :class:`~simlib.sim.SimConfig`'s cluster fields (``latency``, ``bandwidth``,
``stragglers``, ``topology``, ``n_servers``, ...). A whole SimConfig (the CLI's flags, the panel's
controls) runs as ``simlib.run(problem, **run_args(cfg))``. ``Result.measured`` holds
``simulated_seconds``, and with a server per site (``hierarchy='per-site'``) ``site_tables`` (each
site's table, site 0's being ``Result.params``) and ``outboxes`` (what each site summed for the others).
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable

from simlib import _validate as check
from simlib.contract import Result, Training
from simlib.protocol import Protocol, StepRule
from simlib.sim.config import SimConfig
from simlib.sim.engine import run_config

# SimConfig's fields that simlib.run takes as the protocol (kind, bound, backup workers, deadline).
_PROTOCOL_FIELDS = ("protocol", "staleness", "backup_workers", "timeout")


def config_for(protocol: Protocol, training: Training, **cluster: Any) -> SimConfig:
    """The SimConfig of a contract run: protocol and training fields, plus cluster fields."""
    return SimConfig(protocol=protocol, n_workers=training.n_workers, steps=training.steps,
                     batch_size=training.batch_size, lr=training.lr, eval_every=training.eval_every,
                     seed=training.seed, read_rule=training.read_rule, **_rule_fields(training.rule), **cluster)


def run_args(cfg: SimConfig) -> dict[str, Any]:
    """:func:`simlib.run`'s keywords for the run ``cfg`` describes (the inverse of :func:`config_for`).

        >>> from simlib.sim import SimConfig
        >>> args = run_args(SimConfig(n_workers=4, protocol="ssp:2", backup_workers=1))
        >>> args["protocol"].label, args["substrate"], args["n_workers"]
        ('SSP(2) b=1', 'sim', 4)
    """
    skip = {*_PROTOCOL_FIELDS, *(("staleness_aware", "accumulation") if cfg.rule is not None else ("rule",))}
    return {"protocol": cfg.proto, "substrate": "sim",
            **{f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in skip}}


def _rule_fields(rule: StepRule) -> dict[str, Any]:
    """SimConfig's rule fields: the built-in rule's switches, or a subclass as it is."""
    if type(rule) is StepRule:
        return {"staleness_aware": rule.staleness_aware, "accumulation": rule.accumulation}
    return {"rule": rule}


def run(problem: Any, protocol: Protocol, training: Training, *,
        progress: Callable[[float], None] | None = None, **cluster: Any) -> Result:
    """Simulate ``problem`` under ``protocol``; ``progress(fraction of steps done)`` if given; ``cluster`` holds
    SimConfig's other fields."""
    if progress is not None and not callable(progress):
        raise ValueError(f"progress must be a callable taking the fraction of steps done, got "
                         f"{type(progress).__name__}")
    check.known_names(sorted(cluster), ["progress", *SimConfig.__dataclass_fields__], "substrate 'sim'")
    state = run_config(config_for(protocol, training, **cluster), problem, progress)
    measured: dict[str, Any] = {"simulated_seconds": state.trace.makespan}
    if state.outboxes is not None:  # a server per site: each site's table, and what each summed for the others
        measured.update(site_tables=state.tables, outboxes=state.outboxes)
    return Result(state.trace, state.w, measured)

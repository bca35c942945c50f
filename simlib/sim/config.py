"""The simulated cluster's configuration: one validated dataclass, so bad input fails at the boundary."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from simlib import _validate as check
from simlib.protocol import KINDS as PROTOCOLS
from simlib.protocol import Protocol, StepRule
TOPOLOGIES = ("ps", "allreduce")
JITTERS = ("none", "lognormal", "exponential")
COST_UNITS = ("nonzero", "sample")


@dataclass(frozen=True)
class Stragglers:
    """How workers are slower than the cost model says.

    * ``jitter``: per-step multiplicative noise on compute time, mean 1: 'lognormal' with
      ``jitter_sigma``, or 'exponential' (compute time ~ Exp(mean = the model's time)).
    * ``slow_workers`` workers (ids 0, 1, ...) are persistently ``slow_factor`` times slower.
    * each step, with probability ``pause_prob``, a worker stalls for ``pause_time`` seconds.
    * worker ``fail_worker`` fails at ``fail_time`` and, if ``restart_after`` is set, comes
      back that many seconds later and resumes at the clock it had reached.
    """

    jitter: str = "none"
    jitter_sigma: float = 0.5
    slow_workers: int = 0
    slow_factor: float = 3.0
    pause_prob: float = 0.0
    pause_time: float = 0.0
    fail_worker: int | None = None
    fail_time: float | None = None
    restart_after: float | None = None

    def __post_init__(self) -> None:
        check.one_of("stragglers.jitter", self.jitter, JITTERS)
        check.non_negative("stragglers.jitter_sigma", self.jitter_sigma)
        check.non_negative_int("stragglers.slow_workers", self.slow_workers)
        if not (isinstance(self.slow_factor, (int, float)) and math.isfinite(self.slow_factor) and self.slow_factor >= 1):
            raise ValueError(f"stragglers.slow_factor must be a finite number >= 1, got {self.slow_factor!r}")
        check.probability("stragglers.pause_prob", self.pause_prob)
        check.non_negative("stragglers.pause_time", self.pause_time)
        if (self.fail_worker is None) != (self.fail_time is None):
            raise ValueError("stragglers.fail_worker and stragglers.fail_time must be given together")
        if self.fail_worker is not None:
            check.non_negative_int("stragglers.fail_worker", self.fail_worker)
            check.non_negative("stragglers.fail_time", self.fail_time)
        if self.restart_after is not None:
            if self.fail_worker is None:
                raise ValueError("stragglers.restart_after needs stragglers.fail_worker and fail_time")
            check.non_negative("stragglers.restart_after", self.restart_after)

    def describe(self) -> str:
        """A short human label, e.g. 'lognormal(0.5) + 1 worker x3'."""
        parts = []
        if self.jitter == "lognormal":
            parts.append(f"lognormal({self.jitter_sigma:g})")
        elif self.jitter == "exponential":
            parts.append("exponential")
        if self.slow_workers:
            parts.append(f"{self.slow_workers} worker{'s' if self.slow_workers > 1 else ''} x{self.slow_factor:g}")
        if self.pause_prob:
            parts.append(f"pauses p={self.pause_prob:g} of {self.pause_time:g}s")
        if self.fail_worker is not None:
            back = f", back after {self.restart_after:g}s" if self.restart_after is not None else ""
            parts.append(f"worker {self.fail_worker} fails at {self.fail_time:g}s{back}")
        return " + ".join(parts) or "none"


@dataclass(frozen=True)
class SimConfig:
    """A simulated training run: workers, protocol, topology, network, compute model, stragglers.

    Example::

        >>> from simlib.sim import SimConfig, simulate
        >>> cfg = SimConfig(n_workers=4, protocol="ssp", staleness=2, steps=20)
        >>> trace = simulate(cfg)
        >>> trace.summary()["max_clock_lag"] <= 2
        True
    """

    n_workers: int = 8
    protocol: str = "bsp"  # 'bsp', 'ssp' (with staleness) or 'async'; 'ssp:3' / 'SSP(3)' are read too
    staleness: int = 0
    steps: int = 100
    batch_size: int = 32
    lr: float = 0.5
    staleness_aware_lr: bool = False
    accumulation: int | None = None
    topology: str = "ps"
    n_servers: int = 1
    n_summation: int = 0
    latency: float = 1e-4
    bandwidth: float = 1.25e9
    compute_per_unit: float = 5e-8
    compute_overhead: float = 1e-4
    cost_unit: str = "nonzero"
    stragglers: Stragglers = field(default_factory=Stragglers)
    backup_workers: int = 0
    timeout: float | None = None
    compression: "str | Callable[..., Any] | None" = None
    value_bytes: int = 4
    key_bytes: int = 4
    eval_every: int = 1
    seed: int = 0
    # Extension points (assignments plug students' code in here): a read rule replacing the SSP
    # rule (see simlib.protocol.Clocks) and a StepRule subclass replacing the built-in step rule.
    read_rule: "Callable[[int, int, float], bool] | None" = None
    step_rule: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.protocol, Protocol) or (isinstance(self.protocol, str) and self.protocol.lower() not in PROTOCOLS):
            given, p = self.protocol, Protocol.parse(self.protocol)
            if self.staleness not in (0, p.staleness):
                raise ValueError(f"staleness={self.staleness} contradicts protocol {given!r}")
            object.__setattr__(self, "protocol", p.kind)
            object.__setattr__(self, "staleness", p.staleness)
            if isinstance(given, Protocol):
                object.__setattr__(self, "backup_workers", p.backup_workers)
                object.__setattr__(self, "timeout", p.timeout)
        elif isinstance(self.protocol, str):
            object.__setattr__(self, "protocol", self.protocol.lower())
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first field out of its allowed range."""
        check.positive_int("n_workers", self.n_workers)
        check.one_of("protocol", self.protocol, PROTOCOLS)
        check.non_negative_int("staleness", self.staleness)
        if self.protocol == "bsp" and self.staleness != 0:
            raise ValueError("staleness must be 0 for protocol 'bsp' (use protocol 'ssp' for a bound s > 0)")
        if self.protocol != "ssp" and self.staleness:
            raise ValueError(f"staleness applies to protocol 'ssp' only; use protocol='ssp:{self.staleness}'")
        if self.accumulation is not None:
            check.positive_int("accumulation", self.accumulation)
        check.positive_int("steps", self.steps)
        check.positive_int("batch_size", self.batch_size)
        check.positive("lr", self.lr)
        check.one_of("topology", self.topology, TOPOLOGIES)
        if self.topology == "allreduce" and self.protocol != "bsp":
            raise ValueError("topology 'allreduce' runs only with protocol 'bsp' (a ring all-reduce is a barrier)")
        check.positive_int("n_servers", self.n_servers)
        check.non_negative_int("n_summation", self.n_summation)
        if self.topology == "allreduce" and (self.n_servers != 1 or self.n_summation):
            raise ValueError("n_servers and n_summation apply to topology 'ps' only")
        check.non_negative("latency", self.latency)
        check.positive("bandwidth", self.bandwidth)
        check.non_negative("compute_per_unit", self.compute_per_unit)
        check.non_negative("compute_overhead", self.compute_overhead)
        check.one_of("cost_unit", self.cost_unit, COST_UNITS)
        if not isinstance(self.stragglers, Stragglers):
            raise ValueError(f"stragglers must be a Stragglers(...) instance, got {type(self.stragglers).__name__}")
        if self.stragglers.slow_workers > self.n_workers:
            raise ValueError(
                f"stragglers.slow_workers ({self.stragglers.slow_workers}) must be <= n_workers ({self.n_workers})"
            )
        if self.stragglers.fail_worker is not None and self.stragglers.fail_worker >= self.n_workers:
            raise ValueError(f"stragglers.fail_worker must be < n_workers ({self.n_workers})")
        check.non_negative_int("backup_workers", self.backup_workers)
        if self.backup_workers >= self.n_workers:
            raise ValueError(f"backup_workers must be < n_workers ({self.n_workers}), got {self.backup_workers}")
        if self.backup_workers and self.protocol == "async":
            raise ValueError("backup_workers needs a clocked protocol ('bsp' or 'ssp'), not 'async'")
        if self.timeout is not None:
            check.positive("timeout", self.timeout)
            if self.protocol == "async":
                raise ValueError("timeout needs a clocked protocol ('bsp' or 'ssp'), not 'async'")
        if callable(self.compression):
            pass  # a factory (n_params, rng, key_bytes=, value_bytes=) -> compressor, called once per worker
        elif self.compression is not None:
            from simlib.compress import parse_spec  # raises ValueError naming 'compression'

            parse_spec(self.compression)
        if self.read_rule is not None and not callable(self.read_rule):
            raise ValueError(f"read_rule must be a function (clock, completed, bound) -> bool, got {self.read_rule!r}")
        if self.step_rule is not None:
            if not isinstance(self.step_rule, StepRule):
                raise ValueError(f"step_rule must be a StepRule (or subclass) instance, got {type(self.step_rule).__name__}")
        self.proto.check_workers(self.n_workers)  # the bound's range, checked as every substrate checks it
        check.positive_int("value_bytes", self.value_bytes)
        check.positive_int("key_bytes", self.key_bytes)
        check.positive_int("eval_every", self.eval_every)
        check.non_negative_int("seed", self.seed)

    @property
    def proto(self) -> Protocol:
        """The run's :class:`~simlib.protocol.Protocol` (kind, bound, backup workers, deadline)."""
        return Protocol(self.protocol, self.staleness, self.backup_workers, self.timeout)

    @property
    def rule(self) -> StepRule:
        """The server's step rule: staleness-aware or not, and the accumulation factor lambda."""
        if self.step_rule is not None:
            return self.step_rule
        return StepRule(self.staleness_aware_lr, self.accumulation)

    @property
    def bound(self) -> float:
        """The staleness bound the protocol enforces: 0 (BSP), s (SSP), infinity (async)."""
        return self.proto.bound

    @property
    def label(self) -> str:
        """'BSP', 'SSP(3)', 'Async', with mitigation suffixes such as ' b=1'."""
        base = {"bsp": "BSP", "ssp": f"SSP({self.staleness})", "async": "Async"}[self.protocol]
        if self.topology == "allreduce":
            base += " all-reduce"
        if self.backup_workers:
            base += f" b={self.backup_workers}"
        if self.timeout is not None:
            base += f" T={self.timeout:g}s"
        if self.staleness_aware_lr:
            base += " a0/tau"
        if self.compression and self.compression != "none":
            base += f" [{_name(self.compression)}]"
        return base

    def replace(self, **changes: Any) -> "SimConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready) of every field; plugged-in functions and rules by name."""
        out = dataclasses.asdict(dataclasses.replace(self, read_rule=None, step_rule=None, compression=None))
        out.update(compression=None if self.compression is None else _name(self.compression),
                   read_rule=None if self.read_rule is None else _name(self.read_rule),
                   step_rule=None if self.step_rule is None else repr(self.step_rule))
        return out


def _name(obj: Any) -> str:
    """A spec string as is, a plugged-in function or class by its name."""
    return obj if isinstance(obj, str) else getattr(obj, "__name__", type(obj).__name__)

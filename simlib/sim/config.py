"""The simulated cluster's configuration: one validated dataclass, so bad input fails at the boundary."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from simlib import _validate as check
from simlib.options import check_fields
from simlib.protocol import BOUNDED, KIND_LABELS, MAX_BATCH, MAX_BUCKET_BYTES, MAX_STEPS, MAX_WORKERS, Protocol
from simlib.protocol import StepRule
from simlib.protocol import KINDS as PROTOCOLS, check_read_rule

TOPOLOGIES = ("ps", "allreduce")
JITTERS = ("none", "lognormal", "exponential")
COST_UNITS = ("nonzero", "sample")
HIERARCHIES = ("flat", "per-site")
# Network presets (SimConfig.preset): one rack, one data centre, three regions joined by a WAN.
NETWORKS: dict[str, dict[str, Any]] = {
    # 25 Gbit/s top-of-rack switch, 20 us per message.
    "rack": {"sites": 1, "latency": 2e-5, "bandwidth": 3.125e9},
    # 10 Gbit/s across a data centre's fabric, 100 us per message (SimConfig's defaults).
    "datacenter": {"sites": 1, "latency": 1e-4, "bandwidth": 1.25e9},
    # Three regions, a data centre each, joined by 100 Mbit/s WAN links with 50 ms per message.
    "regions": {"sites": 3, "latency": 1e-4, "bandwidth": 1.25e9, "wan_latency": 0.05, "wan_bandwidth": 12.5e6},
}
# Upper bounds keep every simulated time finite (steps x seconds stays far below 1e308) and every
# run within what a laptop holds; the CLI checks memory-dependent sizes against the problem too.
MAX_SECONDS = 1e6
# Memory one worker-step keeps in a trace (spans, update, quality point): about 0.7 kB measured, counted as
# 2 kB so that the estimate errs on the safe side. A cost-only run keeps its spans and updates as columns:
# about 200 bytes a worker-step measured (10^5 workers: 1.13 GB peak at 5 steps, 1.80 GB at 20; 10^6 workers
# x 10 steps: 1.6-2.0 GB), counted as 300.
TRACE_BYTES_PER_STEP, COST_ONLY_TRACE_BYTES_PER_STEP = 2_000, 300


def _f(default: Any, help: str, **meta: Any) -> Any:
    """A dataclass field whose metadata (help, flag, min, max, choices) drives validation, CLI flags and panel
    controls."""
    return field(default=default, metadata={"help": help, **meta})


class _FieldsOnly:
    """Config dataclass base: an unknown keyword is a ValueError naming it (a dataclass raises a bare TypeError)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        check.known_names(kwargs, list(cls.__dataclass_fields__), cls.__name__)  # type: ignore[attr-defined]
        return super().__new__(cls)


@dataclass(frozen=True)
class Stragglers(_FieldsOnly):
    """How workers are slower than the cost model says.

    * ``jitter``: per-step multiplicative noise on compute time, mean 1: 'lognormal' with
      ``jitter_sigma``, or 'exponential' (compute time ~ Exp(mean = the model's time)).
    * ``slow_workers`` workers (ids 0, 1, ...) are persistently ``slow_factor`` times slower.
    * each step, with probability ``pause_prob``, a worker stalls for ``pause_time`` seconds.
    * worker ``fail_worker`` fails at ``fail_time`` and, if ``restart_after`` is set, comes
      back that many seconds later and resumes at the clock it had reached.
    """

    jitter: str = _f("none", "per-step compute noise", choices=JITTERS)
    jitter_sigma: float = _f(0.5, "sigma of the lognormal jitter", min=0, max=5)
    slow_workers: int = _f(0, "how many workers are persistently slow", min=0, max=MAX_WORKERS)
    slow_factor: float = _f(3.0, "how much slower they are", min=1, max=1e6)
    pause_prob: float = _f(0.0, "probability of a pause per step", min=0, max=1)
    pause_time: float = _f(0.0, "how long a pause lasts", unit="s", min=0, max=MAX_SECONDS)
    fail_worker: int | None = _f(None, "a worker that fails ...", min=0, max=MAX_WORKERS)
    fail_time: float | None = _f(None, "... at this simulated time", unit="s", min=0, max=MAX_SECONDS)
    restart_after: float | None = _f(None, "... and comes back this much later", unit="s", min=0, max=MAX_SECONDS)

    def __post_init__(self) -> None:
        check_fields(self, "stragglers.")
        if (self.fail_worker is None) != (self.fail_time is None):
            raise ValueError("stragglers.fail_worker and stragglers.fail_time must be given together")
        if self.restart_after is not None and self.fail_worker is None:
            raise ValueError("stragglers.restart_after needs stragglers.fail_worker and fail_time")

    def describe(self) -> str:
        """A short human label, e.g. 'lognormal(0.5) + 1 worker x3'."""
        parts = []
        if self.jitter != "none":
            parts.append(f"lognormal({self.jitter_sigma:g})" if self.jitter == "lognormal" else self.jitter)
        if self.slow_workers:
            parts.append(f"{self.slow_workers} worker{'s' if self.slow_workers > 1 else ''} x{self.slow_factor:g}")
        if self.pause_prob:
            parts.append(f"pauses p={self.pause_prob:g} of {self.pause_time:g}s")
        if self.fail_worker is not None:
            back = f", back after {self.restart_after:g}s" if self.restart_after is not None else ""
            parts.append(f"worker {self.fail_worker} fails at {self.fail_time:g}s{back}")
        return " + ".join(parts) or "none"


@dataclass(frozen=True)
class SimConfig(_FieldsOnly):
    """A simulated training run: workers, protocol, topology, network, compute model, stragglers.

    Example::

        >>> import simlib
        >>> from simlib.sim import SimConfig, default_problem
        >>> from simlib.substrates.sim import run_args
        >>> cfg = SimConfig(n_workers=4, protocol="ssp", staleness=2, steps=20)
        >>> trace = simlib.run(default_problem(), **run_args(cfg)).trace
        >>> trace.summary()["max_clock_lag"] <= 2
        True
    """

    n_workers: int = _f(8, "number of workers", flag="--workers", min=1, max=MAX_WORKERS)
    # 'bsp', 'ssp' or 'essp' (with staleness) or 'async'; 'ssp:3', 'SSP(3)', 'essp:3' and Protocol values
    # are read too. The CLI takes protocols as one list (--protocols), so these two have no flag of their own.
    protocol: str = _f("bsp", "bsp, ssp or essp (with staleness) or async", flag=None)
    staleness: int | None = _f(None, "the staleness bound s (required for 'ssp' and 'essp')", flag=None, min=0)
    steps: int = _f(100, "steps (clocks) per worker", min=1, max=MAX_STEPS)
    batch_size: int = _f(32, "rows per mini-batch", min=1, max=MAX_BATCH)
    lr: float = _f(0.5, "learning rate (step size)", min=0, min_open=True, max=1e6)
    staleness_aware: bool = _f(False, "scale each update by 1/tau (tau: updates applied since its read)",
                               aliases=("--staleness-aware-lr",))
    accumulation: int | None = _f(None, "lambda: the server averages floor(lambda / workers) pushes per update",
                                  min=1, max=1_000_000)
    topology: str = _f("ps", "parameter server or ring all-reduce (BSP only; protocol 'allreduce' sets it)",
                       choices=TOPOLOGIES)
    bucket_bytes: int | None = _f(None, "ring all-reduce of a layered problem (backward_layers): the gradient goes "
                                        "in buckets of about this many bytes, each its own ring; off: one ring",
                                  min=1, max=MAX_BUCKET_BYTES)
    overlap: bool = _f(True, "with bucket_bytes: each bucket's ring starts while the backward pass goes on (the "
                             "step's compute a third forward, the rest per layer by its parameters); off: each ring "
                             "waited for")
    n_servers: int = _f(1, "parameter-server shards", flag="--servers", min=1, max=1_000_000)
    n_summation: int = _f(0, "BytePS-style extra summation nodes", flag="--summation-nodes", min=0, max=1_000_000)
    latency: float = _f(1e-4, "time per message", unit="s", min=0, max=3600)
    bandwidth: float = _f(1.25e9, "bytes per second per link", unit="B/s", min=1, max=1e30)
    server_time: float = _f(0.0, "time a server shard spends on each request, one at a time", unit="s", min=0,
                            max=3600)
    # Sites (data centres) joined by WAN links: see simlib.sim.sites for the model.
    sites: int = _f(1, "sites (data centres) the workers are spread over evenly", min=1, max=MAX_WORKERS)
    wan_latency: float = _f(0.05, "time per message between two sites", unit="s", min=0, max=3600)
    wan_bandwidth: float = _f(12.5e6, "bytes per second per WAN link (one each way between two sites)", unit="B/s",
                              min=1, max=1e30)
    hierarchy: str = _f("flat", "flat: one parameter server, at site 0; per-site: one per site, the sites "
                                "exchanging updates across the WAN", choices=HIERARCHIES)
    significance: float | None = _f(None, "per-site servers send a key across the WAN only once its accumulated "
                                          "update passes |acc| > significance x |value| (Gaia); off: every update",
                                    min=0, max=1e6)
    mirror_clock: int | None = _f(None, "Gaia's mirror clock (per-site servers): a site's workers start step c only "
                                        "once every other site has announced the end of step c - 1 - mirror_clock and "
                                        "its updates of those steps (the ones it sent) have arrived; bounds how far "
                                        "sites drift apart under async; off: the protocol's bound alone", min=0,
                                  max=MAX_STEPS)
    # Bosen's managed communication (simlib.sim.managed): a clock spans several mini-batches whose updates the
    # worker sums and pushes at the clock's end; with a budget it sends the largest relative changes early.
    clock_batches: int = _f(1, "mini-batches per clock: the worker sums their updates and pushes once per clock, "
                               "at its end (Bosen's clocks span many)", min=1, max=MAX_STEPS)
    managed_bandwidth: float | None = _f(None, "Bosen's managed communication: between clocks each worker sends its "
                                               "pending updates, largest |delta| / |value| first, at most this many "
                                               "bytes per second; the rest goes at the clock's end (needs "
                                               "clock_batches >= 2)", unit="B/s", min=0, min_open=True, max=1e30,
                                         most_field="bandwidth")
    compute_per_unit: float = _f(5e-8, "time per nonzero (or sample)", unit="s", min=0, max=10)
    compute_overhead: float = _f(1e-4, "fixed time per step", unit="s", min=0, max=3600)
    cost_unit: str = _f("nonzero", "what compute is charged per", choices=COST_UNITS)
    stragglers: Stragglers = field(default_factory=Stragglers,
                                   metadata={"help": "how workers are slower than the model"})
    backup_workers: int = _f(0, "drop the slowest b pushes of each step", min=0, max=MAX_WORKERS)
    timeout: float | None = _f(None, "drop pushes later than this after a step opens", unit="s",
                               min=0, min_open=True, max=MAX_SECONDS)
    # Without a cache every step pulls the rows it reads from the servers: the freshest read the bound
    # allows. With one (Petuum's SSP) a row is read from the worker's copy until the bound forces a fetch.
    cache: bool = _f(False, "workers read a cache of the table, fetching a row only when the staleness bound "
                            "forces it (SSP as Petuum runs it; under BSP every read fetches; ESSP always reads one, "
                            "kept fresh by the server's pushes)")
    compression: "str | Callable[..., Any] | None" = _f(None, "gradient compressor, e.g. topk:0.01, qsgd, onebit",
                                                       callable_ok=True)
    value_bytes: int = _f(4, "bytes per parameter value on the wire", flag=None, min=1, max=64)
    key_bytes: int = _f(4, "bytes per key on the wire", flag=None, min=1, max=64)
    eval_every: int = _f(1, "evaluate the metric every this many updates", flag=None, min=1, max=1_000_000)
    # Cost-only runs (as collective simulators such as ASTRA-sim and SimAI run): no math, for when only time
    # and bytes matter. Message sizes come from the problem's batch keys, or from step_keys.
    cost_only: bool = _f(False, "no math: each step costs its modelled compute and communication time and "
                                "nothing else (no gradients, no loss; for time and bytes at scale)")
    step_keys: int | None = _f(None, "cost-only: every step reads and writes this many keys (and is charged this "
                                     "many nonzeros) instead of its batch's; no data needed", min=1,
                               max=1_000_000_000)
    seed: int = _f(0, "seed of the whole run", min=0, max=2**32 - 1)
    # Extension points (assignments plug students' code in here): a read rule replacing the SSP
    # rule (see simlib.protocol.Clocks) and a StepRule subclass replacing the built-in step rule.
    read_rule: "Callable[[int, int, float], bool] | None" = _f(None, "a read rule replacing the SSP rule", option=False)
    rule: Any = _f(None, "a StepRule subclass instance replacing the built-in step rule", option=False)

    def __post_init__(self) -> None:
        spelled = isinstance(self.protocol, str) and self.protocol.lower() not in PROTOCOLS  # 'ssp:3', 'SSP(3)'
        if isinstance(self.protocol, Protocol) or spelled:
            given, p = self.protocol, Protocol.parse(self.protocol)
            if self.staleness not in (None, 0, p.staleness):
                raise ValueError(f"staleness={self.staleness} contradicts protocol {given!r}")
            object.__setattr__(self, "protocol", p.kind)
            object.__setattr__(self, "staleness", p.staleness)
            if isinstance(given, Protocol):  # its backup workers and deadline, merged with any given beside it
                p = p.merged(self.backup_workers, self.timeout)
                object.__setattr__(self, "backup_workers", p.backup_workers)
                object.__setattr__(self, "timeout", p.timeout)
        elif isinstance(self.protocol, str):
            object.__setattr__(self, "protocol", self.protocol.lower())
            if self.staleness is None:
                if self.protocol in BOUNDED:
                    raise ValueError(f"protocol: {self.protocol.upper()} needs a staleness bound: "
                                     f"protocol='{self.protocol}:3', or protocol='{self.protocol}' with staleness=3")
                object.__setattr__(self, "staleness", 0)
        if self.protocol == "allreduce":  # the protocol is the ring's barrier: the topology follows
            object.__setattr__(self, "topology", "allreduce")
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first field out of its allowed range (ranges: the fields' metadata)."""
        check_fields(self)
        # the protocol's own checks (kind, bound, backup workers and deadline), and backup_workers < n_workers
        self.proto.check_workers(self.n_workers)
        if self.cache is True and self.protocol == "async":
            raise ValueError("cache needs a staleness bound (a row is fetched when the bound forces it): under 'async' "
                             "a worker would never fetch; use 'ssp:S' or 'essp:S' (under BSP every read fetches)")
        if self.bucket_bytes is not None and self.topology != "allreduce":
            raise ValueError("bucket_bytes applies to the ring all-reduce only (protocol 'allreduce')")
        if self.bucket_bytes is not None and self.cost_only:
            raise ValueError("bucket_bytes: a cost-only run has no backward pass to cut into buckets")
        if self.topology == "allreduce" and self.protocol not in ("bsp", "allreduce"):
            raise ValueError("topology 'allreduce' runs only with protocol 'bsp' (a ring all-reduce is a barrier)")
        if self.topology == "allreduce" and (self.n_servers != 1 or self.n_summation):
            raise ValueError("n_servers and n_summation apply to topology 'ps' only")
        if not isinstance(self.stragglers, Stragglers):  # before the checks below read its fields
            raise ValueError(f"stragglers must be a Stragglers(...) instance, got {type(self.stragglers).__name__}")
        self._validate_sites()
        self._validate_cost_only()
        self._validate_managed()
        if self.stragglers.slow_workers > self.n_workers:
            raise ValueError(f"stragglers.slow_workers ({self.stragglers.slow_workers}) must be <= n_workers "
                             f"({self.n_workers})")
        if self.stragglers.fail_worker is not None and self.stragglers.fail_worker >= self.n_workers:
            raise ValueError(f"stragglers.fail_worker must be < n_workers ({self.n_workers})")
        # A callable is a factory (n_params, rng, key_bytes=, value_bytes=) -> compressor, called once per worker.
        if self.compression is not None and not callable(self.compression):
            from simlib.compress import parse_spec  # raises ValueError naming 'compression'

            parse_spec(self.compression)
        check_read_rule(self.read_rule)
        if self.rule is not None:
            if not isinstance(self.rule, StepRule):
                raise ValueError(f"rule must be a StepRule (or subclass) instance, got {type(self.rule).__name__}")
            if self.staleness_aware or self.accumulation is not None:
                raise ValueError("staleness_aware, accumulation: give them to the StepRule passed as rule=, not "
                                 "beside it")
        if self.cached and self.step_rule.group_size(self.n_workers) != 1:
            raise ValueError("accumulation: worker caches (ESSP, cache=True) are not modelled with a server that "
                             "averages several pushes into one update; use accumulation < 2 x n_workers (c = 1) or "
                             "no cache")

    def check_trace_memory(self) -> None:
        """Refuse a run whose trace (spans, updates) would not fit in half the memory available, naming steps (the
        simulator asks as a run starts; the CLI first checks its data and rows, which it can name better)."""
        per_step = self.n_workers * (COST_ONLY_TRACE_BYTES_PER_STEP if self.cost_only else TRACE_BYTES_PER_STEP)
        check.fits_memory("steps", self.steps, self.steps * per_step, per_step,
                          f"the trace of {self.n_workers} workers")

    def _validate_cost_only(self) -> None:
        """Cost-only runs refuse what needs the update's values."""
        if self.step_keys is not None and not self.cost_only:
            raise ValueError("step_keys sets a cost-only run's message size: it needs cost_only=True (--cost-only)")
        if not self.cost_only:
            return
        needs_math = [
            ("compression", self.compression not in (None, "none"), "a compressor's output depends on the gradient"),
            ("significance", self.significance is not None, "the filter compares sums with the table's values"),
            ("cache", self.cached, "worker caches (cache=True, ESSP) hold the table's values"),
            ("staleness_aware", self.staleness_aware, "it scales the update's values"),
            ("accumulation", self.accumulation is not None, "it averages the updates' values"),
            ("rule", self.rule is not None, "a step rule acts on the update's values"),
            ("clock_batches", self.clock_batches > 1, "a clock's mini-batches are summed into one update"),
            ("managed_bandwidth", self.managed_bandwidth is not None, "it sends the largest changes first"),
        ]
        for name, on, why in needs_math:
            if on:
                raise ValueError(f"{name}: not available with cost_only=True (no math runs, and {why}); "
                                 f"drop {name} or cost_only")

    def _validate_sites(self) -> None:
        """The combinations of sites, hierarchy and significance that the model covers."""
        if self.sites > self.n_workers:
            raise ValueError(f"sites ({self.sites}) must be <= n_workers ({self.n_workers}): every site needs a worker")
        if self.sites > 1 and self.topology != "ps":
            raise ValueError("sites > 1 runs with topology 'ps' only (a ring all-reduce across sites is not modelled)")
        for name, what in (("mirror_clock", "bounds how far per-site servers drift apart"),
                           ("significance", "filters what per-site servers send each other")):
            if getattr(self, name) is not None and self.hierarchy != "per-site":
                raise ValueError(f"{name} {what}: it needs hierarchy='per-site' (--hierarchy per-site)")
        if self.hierarchy == "per-site":
            if self.topology != "ps":
                raise ValueError("hierarchy 'per-site' needs topology 'ps'")
            if self.cached:
                raise ValueError("hierarchy 'per-site': worker caches (cache=True, ESSP) are not modelled with a "
                                 "server per site; use 'bsp', 'ssp:S' or 'async' without cache")
            if not self.step_rule.plain:
                raise ValueError("hierarchy 'per-site': staleness_aware, accumulation and rule= are not modelled with "
                                 "a server per site (each site's table takes every push as it is)")

    def _validate_managed(self) -> None:
        """clock_batches and managed_bandwidth: what :mod:`simlib.sim.managed` models."""
        if self.clock_batches > 1:
            from simlib.managed import check_clocks  # NumPy: only once clocks of several mini-batches are asked for

            check_clocks(self.steps, self.clock_batches)
            cache = "protocol 'essp:S'" if self.protocol == "essp" else "cache=True"
            for bad, why in ((self.topology != "ps", f"with topology 'ps' only, not {self.topology!r}"),
                             (self.cached, f"without worker caches, and {cache} keeps one per worker; use 'ssp:S' or "
                                           "'async' without cache"),
                             (self.hierarchy != "flat", f"with hierarchy 'flat' only, not {self.hierarchy!r}"),
                             (self.compression not in (None, "none"), "without compression; drop compression")):
                if bad:
                    raise ValueError(f"clock_batches > 1 is modelled {why}")
        if self.managed_bandwidth is None:
            return
        from simlib.managed import check as check_managed  # NumPy: only once managed communication is asked for

        check_managed(self.proto, self.clock_batches, self.managed_bandwidth, self.step_rule.plain, self.bandwidth)
        for bad, name in ((self.sites > 1, "sites > 1"),
                          (self.stragglers.fail_worker is not None, "stragglers.fail_worker")):
            if bad:
                raise ValueError(f"managed_bandwidth: {name} are not modelled with managed communication (early "
                                 f"updates land as they are, once, on one site's servers)")

    @classmethod
    def preset(cls, network: str, **fields: Any) -> "SimConfig":
        """A config on a named network (:data:`NETWORKS`: 'rack', 'datacenter', 'regions'), other fields as given.

            >>> SimConfig.preset("regions", n_workers=9).sites
            3
        """
        check.one_of("network", network, tuple(NETWORKS))
        return cls(**{**NETWORKS[network], **fields})

    @property
    def proto(self) -> Protocol:
        """The run's :class:`~simlib.protocol.Protocol` (kind, bound, backup workers, deadline)."""
        return Protocol(self.protocol, self.staleness, self.backup_workers, self.timeout)

    @property
    def entry_bytes(self) -> int:
        """Bytes one (key, value) pair takes on the wire."""
        return self.key_bytes + self.value_bytes

    @property
    def cached(self) -> bool:
        """Whether workers read a cache of the table (ESSP, or SSP with ``cache=True``) instead of pulling each step."""
        return self.cache is True or self.protocol == "essp"

    @property
    def step_rule(self) -> StepRule:
        """The server's step rule: ``rule``, or the built-in one (staleness-aware or not, accumulation lambda)."""
        return self.rule if self.rule is not None else StepRule(self.staleness_aware, self.accumulation)

    @property
    def bound(self) -> float:
        """The staleness bound the protocol enforces: 0 (BSP), s (SSP), infinity (async)."""
        return self.proto.bound

    @property
    def label(self) -> str:
        """'BSP', 'SSP(3)', 'ESSP(3)', 'Async', with mitigation suffixes such as ' b=1' (' cache': SSP's cache)."""
        per_site = self.hierarchy == "per-site"
        parts = (KIND_LABELS[self.protocol].format(s=self.staleness),
                 "cache" if self.cache is True and self.protocol != "essp" else "",
                 "all-reduce" if self.topology == "allreduce" and self.protocol != "allreduce" else "",
                 f"{self.sites} sites" if self.sites > 1 else "",
                 "per-site" if per_site else "",
                 f"sig={self.significance:g}" if per_site and self.significance is not None else "",
                 f"mirror={self.mirror_clock}" if per_site and self.mirror_clock is not None else "",
                 f"b={self.backup_workers}" if self.backup_workers else "",
                 f"T={self.timeout:g}s" if self.timeout is not None else "",
                 f"{self.clock_batches}/clock" if self.clock_batches > 1 else "",
                 f"managed {self.managed_bandwidth / 1e6:g} MB/s" if self.managed_bandwidth is not None else "",
                 "a0/tau" if self.staleness_aware else "",
                 f"[{_name(self.compression)}]" if self.compression and self.compression != "none" else "",
                 "cost-only" if self.cost_only else "")
        return " ".join(part for part in parts if part)

    def replace(self, **changes: Any) -> "SimConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready) of every field; plugged-in functions and rules by name."""
        out = dataclasses.asdict(dataclasses.replace(self, read_rule=None, rule=None, compression=None))
        out.update(compression=None if self.compression is None else _name(self.compression),
                   read_rule=None if self.read_rule is None else _name(self.read_rule),
                   rule=None if self.rule is None else repr(self.rule))
        return out


def _name(obj: Any) -> str:
    """A spec string as is, a plugged-in function or class by its name."""
    return obj if isinstance(obj, str) else getattr(obj, "__name__", type(obj).__name__)

"""What the live panel's controls stand for, and how its runs are simulated.

:class:`LiveSettings` maps a few lecture-sized knobs (workers, protocols, staleness, a straggler
kind and its severity, latency, bandwidth, topology, compression) onto one
:class:`simlib.sim.SimConfig` per protocol; :class:`Runner` simulates them, caching each trace by
its config and sending independent runs to a per-kernel process pool. Example::

    >>> runner = Runner(processes=1)
    >>> [t.label for t in runner.run(LiveSettings(n_workers=4, steps=10).configs())]
    ['BSP', 'SSP(1)', 'Async']
"""
from __future__ import annotations

import atexit
import concurrent.futures
import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from simlib import _validate as check
from simlib.options import Option, check_fields, options
from simlib.problems.logistic import LogisticProblem, make_sparse_classification
from simlib.sim import SimConfig, Stragglers
from simlib.trace import Trace

PROTOCOLS = ("bsp", "ssp", "essp", "async")  # the panel's toggles
DEFAULT_PROTOCOLS = ("bsp", "ssp", "async")  # the ones switched on at the start
STRAGGLERS = ("none", "slow worker", "jitter", "pauses", "failure")
COMPRESSIONS = ("none", "topk:0.01", "qsgd:4", "onebit-ef")  # specs of simlib.compress the panel offers
# SimConfig fields the panel's own controls set (or the panel derives: eval_every from steps); every other
# option of SimConfig is an extra setting with a control generated from its metadata (extra_options).
PANEL_FIELDS = ("n_workers", "steps", "protocol", "staleness", "topology", "n_servers", "latency", "bandwidth",
                "compression", "stragglers", "seed", "eval_every")
# Options the panel does not offer: it draws loss curves, and a cost-only run computes no loss.
NOT_OFFERED = ("cost_only", "step_keys")
_OWN_CHECK = {"option": False}  # a LiveSettings field __post_init__ checks itself (or SimConfig does)


def _as_in_sim(name: str, default: Any) -> Any:
    """A setting that is SimConfig's field ``name``: checked by that field's metadata (its range or choices)."""
    return field(default=default, metadata=SimConfig.__dataclass_fields__[name].metadata)


@functools.lru_cache(maxsize=1)
def extra_options() -> tuple[Option, ...]:
    """SimConfig's options (from its fields' metadata) that the panel's own controls do not cover, in field order."""
    return tuple(o for o in options(SimConfig) if "." not in o.name and o.name not in PANEL_FIELDS + NOT_OFFERED)


def _extra(given: Any) -> tuple[tuple[str, Any], ...]:
    """Extra settings (a mapping or (name, value) pairs) checked by name against their options; as sorted pairs,
    the ones at their default left out."""
    pairs = dict(given)
    known = {o.name: o for o in extra_options()}
    for name, value in pairs.items():
        if name not in known:
            hint = check.nearest(str(name), [*known, *(f.name for f in fields(LiveSettings))])
            raise ValueError(f"{name}: not a setting of the live panel{'; ' + hint if hint else ''}")
        known[name].check(value)  # the field's own range, named as the config names it
    # An option at SimConfig's default is left out: equal settings have one form (and one cache key).
    at_default = {k for k, v in pairs.items() if v == known[k].default and type(v) is type(known[k].default)}
    return tuple(sorted((k, v) for k, v in pairs.items() if k not in at_default))


@functools.lru_cache(maxsize=1)
def live_problem() -> LogisticProblem:
    """The panel's default workload: sparse logistic regression, 4,000 x 1,000, 20 nonzeros per row.

    Small on purpose: the math per update is then cheap next to the simulation, so 16 workers x
    100 steps of three protocols re-run at slider speed.
    """
    data = make_sparse_classification(n_rows=4_000, n_features=1_000, nnz_per_row=20, label_noise=0.05, seed=0)
    return LogisticProblem(data, l2=1e-4, eval_rows=1_000, seed=0)


@dataclass(frozen=True)
class LiveSettings:
    """What the panel's controls set; :meth:`configs` turns it into one SimConfig per chosen protocol.

    ``severity`` reads per straggler kind: 'slow worker' = worker 0 is ``severity`` times slower;
    'jitter' = lognormal compute noise with sigma 0.25 x severity; 'pauses' = 5% of steps stall
    for ``severity`` step times; 'failure' = worker 0 fails a quarter of the way in and returns
    after 5 x ``severity`` step times.
    """

    n_workers: int = _as_in_sim("n_workers", 16)
    steps: int = _as_in_sim("steps", 100)
    protocols: tuple[str, ...] = field(default=DEFAULT_PROTOCOLS, metadata=_OWN_CHECK)
    # Per-step jitter, not one slow worker: with a persistently slow worker SSP and BSP both end up
    # waiting for it (about 30% each), while jitter lets SSP(1) absorb most of the noise BSP waits for.
    staleness: int = _as_in_sim("staleness", 1)
    straggler: str = field(default="jitter", metadata={"choices": STRAGGLERS})
    severity: float = field(default=3.0, metadata={"min": 1, "max": 100})
    latency: float = _as_in_sim("latency", 1e-4)
    bandwidth: float = _as_in_sim("bandwidth", 1.25e9)
    topology: str = _as_in_sim("topology", "ps")
    n_servers: int = _as_in_sim("n_servers", 1)
    compression: str = field(default="none", metadata=_OWN_CHECK)
    seed: int = _as_in_sim("seed", 0)
    # Any other SimConfig option (extra_options: sites, server_time, backup_workers, ...), as sorted
    # (name, value) pairs; a mapping is accepted. Options left out keep SimConfig's defaults.
    extra: tuple[tuple[str, Any], ...] = field(default=(), metadata=_OWN_CHECK)

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra", _extra(self.extra))
        object.__setattr__(self, "protocols", tuple(self.protocols or ()))  # a list (from a dict) too
        if not self.protocols:
            raise ValueError("protocols must name at least one of 'bsp', 'ssp', 'essp', 'async'")
        for p in self.protocols:
            check.one_of("protocols", p, PROTOCOLS)
        check_fields(self)  # the other fields' metadata: n_workers, steps and n_servers >= 1, severity in [1, 100], ...

    def stragglers(self, nnz_per_row: float = 20.0) -> Stragglers:
        """The straggler model the kind and severity stand for, in units of a step's time without stragglers
        (compute overhead + batch nonzeros x cost + a round trip)."""
        base, s = SimConfig(), self.severity
        step = base.compute_overhead + base.batch_size * nnz_per_row * base.compute_per_unit + 2 * self.latency
        kinds: dict[str, dict[str, Any]] = {
            "none": {},
            "slow worker": dict(slow_workers=1, slow_factor=s),
            "jitter": dict(jitter="lognormal", jitter_sigma=0.25 * s),
            "pauses": dict(pause_prob=0.05, pause_time=s * step),
            "failure": dict(fail_worker=0, fail_time=self.steps / 4 * step, restart_after=5 * s * step),
        }
        return Stragglers(**kinds[self.straggler])

    def runnable(self) -> tuple[str, ...]:
        """The chosen protocols that the topology allows (a ring all-reduce is a barrier: BSP only)."""
        return ("bsp",) if self.topology == "allreduce" else self.protocols

    def configs(self, nnz_per_row: float = 20.0) -> list[SimConfig]:
        """One validated SimConfig per runnable protocol."""
        common = {f: getattr(self, f) for f in ("n_workers", "steps", "topology", "latency", "bandwidth", "seed")}
        # One loss point per two rounds keeps evaluation cheap; curves stay smooth at 100 steps.
        common.update(stragglers=self.stragglers(nnz_per_row), n_servers=self.n_servers if self.topology == "ps" else 1,
                      compression=None if self.compression == "none" else self.compression,
                      eval_every=max(1, self.steps // 50), **dict(self.extra))
        return [SimConfig(protocol=p, staleness=self.staleness if p in ("ssp", "essp") else 0, **common)
                for p in self.runnable()]

    def to_dict(self) -> dict[str, Any]:
        """The settings as one flat dict: the panel's own, then each extra option by its SimConfig name."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**own, "protocols": list(self.protocols), **dict(self.extra)}

    @classmethod
    def from_dict(cls, settings: Mapping[str, Any]) -> "LiveSettings":
        """Settings from :meth:`to_dict`'s form: the panel's own names, any other SimConfig option by name (an
        unknown name is refused by name)."""
        own = {f.name for f in fields(cls)}
        given = {k: v for k, v in settings.items() if k in own}
        extra = {**dict(given.pop("extra", ())), **{k: v for k, v in settings.items() if k not in own}}
        return cls(**given, extra=extra)  # __post_init__ checks the extra settings by name


class Superseded(Exception):
    """Raised inside a run's progress callback when a newer change has made the run pointless."""


# -- simulating in worker processes ------------------------------------------------------------
# The chosen protocols are independent runs, so they go to separate processes: on a machine with
# three free cores three runs take the time of one. The pool lives once per kernel (re-running the
# notebook cell reuses it) and the problem is sent to each worker once, at start-up.
_worker_problem: Any = None
_pool_lock = threading.Lock()
_pool: tuple[int, int, concurrent.futures.ProcessPoolExecutor] | None = None


def _init_worker(problem: Any) -> None:
    """Worker start-up: keep the problem for every run this process will simulate."""
    global _worker_problem
    _worker_problem = problem


def _run_trace(cfg: SimConfig, problem: Any, progress: Callable[[float], None] | None = None) -> Trace:
    """The trace of the run ``cfg`` describes, through :func:`simlib.run`."""
    import simlib
    from simlib.substrates.sim import run_args

    return simlib.run(problem, **run_args(cfg), progress=progress).trace


def _simulate_in_worker(cfg: SimConfig) -> Trace:
    """One run inside a pool worker."""
    return _run_trace(cfg, _worker_problem)


def _warm_worker(hold: float) -> None:
    """Simulate a tiny run (compiling the problem's kernels), then hold the worker so its siblings get the others."""
    _run_trace(SimConfig(n_workers=2, steps=2, eval_every=1), _worker_problem)
    time.sleep(hold)


def process_pool(problem: Any, processes: int) -> concurrent.futures.ProcessPoolExecutor:
    """The kernel's pool of ``processes`` simulator workers for ``problem`` (made on first use)."""
    global _pool
    import multiprocessing

    with _pool_lock:
        if _pool is not None and _pool[0] == id(problem) and _pool[1] == processes:
            return _pool[2]
        if _pool is not None:
            _pool[2].shutdown(wait=False, cancel_futures=True)
        # forkserver, not fork: the kernel has threads (ZMQ, the panel's runner), and forking a
        # threaded process can deadlock the child.
        ctx = multiprocessing.get_context("forkserver")
        executor = concurrent.futures.ProcessPoolExecutor(processes, mp_context=ctx, initializer=_init_worker,
                                                          initargs=(problem,))
        _pool = (id(problem), processes, executor)
        return executor


@atexit.register
def shutdown_pool() -> None:
    """Stop the simulator worker processes (also done at interpreter exit)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool[2].shutdown(wait=True, cancel_futures=True)
            _pool = None


class Runner:
    """Runs SimConfigs on one problem, remembering the last ``capacity`` traces (a slider moved back is instant).

    With ``processes`` > 1, runs that miss the cache are simulated side by side in a process pool.
    """

    def __init__(self, problem: Any = None, capacity: int = 64, processes: int = 1) -> None:
        check.positive_int("processes", processes)
        self.problem = live_problem() if problem is None else problem
        self.capacity = capacity
        self.processes = processes
        self.cache: OrderedDict[SimConfig, Trace] = OrderedDict()
        self.simulated = 0  # runs actually simulated (cache misses)
        self._lock = threading.Lock()
        ip = getattr(getattr(self.problem, "data", None), "indptr", None)
        self.nnz_per_row = float((ip[-1] - ip[0]) / max(len(ip) - 1, 1)) if ip is not None else 20.0

    def warm_up(self) -> None:
        """Start the worker processes now, so the first slider move does not pay for it."""
        if self.processes > 1:
            pool = process_pool(self.problem, self.processes)
            # A tiny run in each worker compiles the problem's kernels there: the first real run in
            # a cold worker took ~3 s longer (measured on 2 busy cores).
            for f in [pool.submit(_warm_worker, 0.05) for _ in range(self.processes)]:
                f.result()
        self.warm = True

    warm = False  # the worker processes have started (set by warm_up)

    def _store(self, cfg: SimConfig, trace: Trace, fresh: dict[SimConfig, Trace]) -> None:
        fresh[cfg] = trace
        with self._lock:
            self.simulated += 1
            self.cache[cfg] = trace
            while len(self.cache) > self.capacity:
                self.cache.popitem(last=False)

    def run(self, configs: Sequence[SimConfig], progress: Callable[[float, str], None] | None = None,
            pool: bool = True) -> list[Trace]:
        """Traces for ``configs`` in order; ``progress(fraction, label)`` may raise :class:`Superseded` to stop.

        ``pool=False`` simulates in this process even when ``processes`` > 1 (before the pool has started).
        """
        with self._lock:
            found = {c: self.cache[c] for c in configs if c in self.cache}
            for c in found:
                self.cache.move_to_end(c)
        missing = list(dict.fromkeys(c for c in configs if c not in found))
        if pool and len(missing) > 1 and self.processes > 1:
            self._run_pool(missing, progress, found)
        else:
            for i, cfg in enumerate(missing):

                def report(frac: float, i: int = i, label: str = cfg.label) -> None:
                    if progress is not None:
                        progress((i + frac) / len(missing), label)

                self._store(cfg, _run_trace(cfg, self.problem, report), found)
        return [found[cfg] for cfg in configs]

    def _run_pool(self, missing: list[SimConfig], progress: Callable[[float, str], None] | None,
                  fresh: dict[SimConfig, Trace]) -> None:
        """Simulate ``missing`` in the process pool, checking every 0.1 s whether the caller gave up."""
        pool = process_pool(self.problem, self.processes)
        futures = {pool.submit(_simulate_in_worker, cfg): cfg for cfg in missing}
        pending = set(futures)
        try:
            while pending:
                done, pending = concurrent.futures.wait(pending, timeout=0.1,
                                                        return_when=concurrent.futures.FIRST_COMPLETED)
                for f in done:
                    self._store(futures[f], f.result(), fresh)
                if progress is not None:
                    progress(1 - len(pending) / len(missing), ", ".join(futures[f].label for f in pending))
        finally:
            for f in pending:
                f.cancel()

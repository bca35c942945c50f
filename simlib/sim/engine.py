"""The discrete-event run: workers, servers and messages on SimPy, with the problem's real math.

Each worker pulls the rows its mini-batch touches, computes the real gradient on the values it
actually read (so a stale read gives a really stale gradient), and pushes it back; the protocol
(``clocks.ClockTable``) decides when reads may happen and which pushes count. Every random choice
comes from generators spawned from the config's seed, and SimPy orders simultaneous events by
creation, so the same config gives the same trace bit for bit.
"""
from __future__ import annotations

import functools
import gc
from typing import Any, Callable

import numpy as np
import simpy

from simlib.contract import ParamServer, check_problem
from simlib.diverged import check_metric
from simlib.problems.logistic import LogisticProblem, make_sparse_classification
from simlib.sim.clocks import ClockTable
from simlib.sim.config import SimConfig
from simlib.sim.network import Node, ring_allreduce_time, transmit
from simlib.sim.stragglers import ComputeModel
from simlib.trace import Trace

Progress = Callable[[float], None]


@functools.lru_cache(maxsize=4)
def default_problem(n_rows: int = 20_000, n_features: int = 10_000, nnz_per_row: int = 20, seed: int = 0) -> LogisticProblem:
    """The default workload: sparse logistic regression, 20 k rows x 10 k features (cached)."""
    data = make_sparse_classification(n_rows, n_features, nnz_per_row, label_noise=0.05, seed=seed)
    return LogisticProblem(data, l2=1e-4, eval_rows=4_000, seed=seed)


def simulate(cfg: SimConfig, problem: Any = None, progress: Progress | None = None) -> Trace:
    """Run one simulated training job and return its trace (``substrate='sim'``).

    ``problem`` is a :class:`simlib.contract.Problem`; None means :func:`default_problem`.
    ``progress``, if given, is called with the fraction of steps done.

    Example::

        >>> from simlib.sim import SimConfig, simulate
        >>> t = simulate(SimConfig(n_workers=2, steps=5))
        >>> len(t.updates)
        10
    """
    if not isinstance(cfg, SimConfig):
        raise ValueError(f"cfg must be a SimConfig, got {type(cfg).__name__}")
    return run_config(cfg, problem, progress).trace


def run_config(cfg: SimConfig, problem: Any = None, progress: Progress | None = None) -> "_Run":
    """Run a simulation and return its state (``.trace``, the final table ``.w``)."""
    problem = default_problem() if problem is None else problem
    check_problem(problem)
    run = _Run(cfg, problem, progress)
    run.execute()
    return run


class _Run:
    """State of one simulation: environment, parameters, clocks, nodes, trace."""

    def __init__(self, cfg: SimConfig, problem: Any, progress: Progress | None):
        self.cfg = cfg
        self.problem = problem
        self.progress = progress
        self.env = simpy.Environment()
        compute_seq, comp_seq = np.random.SeedSequence(cfg.seed).spawn(2)
        self.compute = ComputeModel(cfg, compute_seq)
        self.w = problem.init_params()
        self.shards = problem.shards(cfg.n_workers)
        self.clocks = ClockTable(self.env, cfg.n_workers, cfg.proto, cfg.read_rule)
        self.server = ParamServer(self.w, cfg.n_workers, cfg.proto, cfg.step_rule, clocks=self.clocks)
        self.trace = Trace(
            label=cfg.label,
            substrate="sim",
            n_workers=cfg.n_workers,
            metric=getattr(problem, "metric", "loss"),
            lower_is_better=getattr(problem, "lower_is_better", True),
        )
        self.n_shards = cfg.n_servers + cfg.n_summation
        self.servers = [Node(f"server{k}") for k in range(self.n_shards)]
        self.key_bounds = np.linspace(0, problem.n_params, self.n_shards + 1).astype(np.int64)
        self.compressors = _make_compressors(cfg, problem.n_params, comp_seq)
        self.applied = 0
        self.finished = [False] * cfg.n_workers
        self.eval_period = cfg.eval_every * cfg.n_workers
        self.total_steps = cfg.steps * cfg.n_workers
        self.done_steps = 0
        self.down_since: dict[int, float] = {}

    # -- top level ---------------------------------------------------------------------------
    def execute(self) -> Trace:
        cfg, env = self.cfg, self.env
        self.trace.record_quality(0.0, 0, self.problem.quality(self.w))
        body = self._allreduce_worker if cfg.topology == "allreduce" else self._ps_worker
        if cfg.topology == "allreduce":
            self._ar = _AllReduce(self)
        self.procs = [env.process(body(i)) for i in range(cfg.n_workers)]
        st = cfg.stragglers
        if st.fail_worker is not None:
            env.process(self._failure(st.fail_worker, st.fail_time))
        # NOTE: the run allocates hundreds of thousands of small records; Python's cyclic GC would
        # rescan them all repeatedly (measured: 1.7x slower at 1,000 workers). Nothing here needs
        # cycle collection mid-run, so it is paused and restored, whatever happens.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            env.run()
        finally:
            if gc_was_enabled:
                gc.enable()
        self.server.finish()
        if self.applied % self.eval_period:
            self._evaluate()
        for i, t0 in self.down_since.items():  # a worker that never came back is down to the end
            self.trace.span(i, "down", t0, max(env.now, t0))
        # Stalled: alive but blocked (by a dead worker, at a barrier or the staleness bound).
        stalled = [i for i, f in enumerate(self.finished) if not f and i not in self.down_since]
        self.trace.meta.update(
            config=cfg.to_dict(),
            protocol_label=cfg.label,
            stragglers=cfg.stragglers.describe(),
            barriers=list(self.clocks.barriers) if cfg.bound == 0 else [],
            stalled=stalled,
            failed_workers=sorted(self.down_since),
        )
        if stalled:
            self.trace.meta["stall_reason"] = (
                f"workers {stalled} never finished: failed worker {sorted(self.down_since)} blocks the "
                f"{'barrier' if cfg.bound == 0 else 'staleness bound'} "
                "(add backup workers: backup_workers, --backup-workers; or a deadline: timeout, --timeout)"
            )
        return self.trace

    # -- parameter-server worker -----------------------------------------------------------------
    def _ps_worker(self, i: int):
        cfg, env, trace, p = self.cfg, self.env, self.trace, self.problem
        c = 0
        while c < cfg.steps:
            try:
                t0 = env.now
                gate = self.clocks.gate(c)
                if gate is not None:
                    yield gate
                    trace.span(i, "wait", t0, env.now, step=c)
                self.clocks.open(c)
                lag = self.clocks.rule.clock_lag(c)
                batch = p.batch(self.shards[i], c, cfg.batch_size)
                keys = p.keys(batch)
                # Pull: request keys from each shard, the shard reads w on arrival and replies.
                t_pull = env.now
                values, version, req_bytes, resp_bytes = yield from self._pull(keys)
                trace.span(i, "recv", t_pull, env.now, nbytes=req_bytes + resp_bytes, step=c)
                # Compute the real gradient on the values read.
                t_comp = env.now
                units = p.work(batch) if cfg.cost_unit == "nonzero" else len(batch)
                yield env.timeout(self.compute.time(i, units))
                keys, g = p.step(values, batch, keys, cfg.lr)
                trace.span(i, "compute", t_comp, env.now, step=c)
                keys, g, nbytes = self._encode(i, keys, g)
                # Push: the update travels to each shard; it is applied when all of it has arrived.
                t_push = env.now
                yield from self._push(keys, nbytes)
                trace.span(i, "send", t_push, env.now, nbytes=nbytes, step=c)
                applied, tau = self.server.push(c, keys, g, version)
                trace.update(env.now, i, c, tau, applied, clock_lag=lag)
                self._count_step(applied)
                # A dropped worker (backup workers, deadline) abandons the steps the others have
                # already completed and rejoins at the current one, as in synchronous SGD with
                # backup workers; otherwise it would keep computing gradients nobody will use.
                nxt = c + 1 if applied else max(c + 1, self.clocks.completed)
                self.done_steps += nxt - (c + 1)
                c = min(nxt, cfg.steps)
            except simpy.Interrupt:
                restarted = yield from self._down(i)
                if not restarted:
                    return
        self.finished[i] = True

    def _pull(self, keys: np.ndarray):
        cfg, env = self.cfg, self.env
        parts = self._split(keys)
        req_bytes = len(keys) * cfg.key_bytes
        resp_bytes = len(keys) * cfg.value_bytes
        if len(parts) == 1:
            k, sel = parts[0]
            yield from transmit(env, self.servers[k].inlink, req_bytes, cfg.latency, cfg.bandwidth, cfg.server_time)
            values, version = self.server.pull(keys)
            yield from transmit(env, self.servers[k].outlink, resp_bytes, cfg.latency, cfg.bandwidth)
            return values, version, req_bytes, resp_bytes
        values = np.empty(len(keys), dtype=self.w.dtype)
        versions: list[int] = []
        procs = [env.process(self._pull_shard(k, keys, sel, values, versions)) for k, sel in parts]
        yield env.all_of(procs)
        return values, min(versions), req_bytes, resp_bytes

    def _pull_shard(self, k: int, keys: np.ndarray, sel: slice, out: np.ndarray, versions: list[int]):
        cfg, env = self.cfg, self.env
        n = sel.stop - sel.start
        yield from transmit(env, self.servers[k].inlink, n * cfg.key_bytes, cfg.latency, cfg.bandwidth,
                            cfg.server_time)
        out[sel], v = self.server.pull(keys[sel])
        versions.append(v)  # the push's tau counts from the earliest shard read
        yield from transmit(env, self.servers[k].outlink, n * cfg.value_bytes, cfg.latency, cfg.bandwidth)

    def _push(self, keys: np.ndarray, nbytes: int):
        cfg, env = self.cfg, self.env
        parts = self._split(keys)
        total = max(len(keys), 1)
        if len(parts) == 1:
            yield from transmit(env, self.servers[parts[0][0]].inlink, nbytes, cfg.latency, cfg.bandwidth,
                                cfg.server_time)
            return
        # Encoded bytes are split across shards in proportion to the keys each one receives.
        procs = [
            env.process(transmit(env, self.servers[k].inlink, nbytes * (sel.stop - sel.start) / total, cfg.latency,
                                 cfg.bandwidth, cfg.server_time))
            for k, sel in parts
        ]
        yield env.all_of(procs)

    def _split(self, keys: np.ndarray) -> list[tuple[int, slice]]:
        """Shards that own some of the (sorted) keys, with the slice of keys each owns."""
        if self.n_shards == 1:
            return [(0, slice(0, len(keys)))]
        cuts = np.searchsorted(keys, self.key_bounds)
        return [(k, slice(int(cuts[k]), int(cuts[k + 1]))) for k in range(self.n_shards) if cuts[k + 1] > cuts[k]]

    def _encode(self, i: int, keys: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """Apply the worker's compressor; without one a sparse update costs key + value bytes per entry."""
        if self.compressors is None:
            return keys, g, len(keys) * (self.cfg.key_bytes + self.cfg.value_bytes)
        k2, g2, nbytes = self.compressors[i](keys, g)
        return np.asarray(k2), np.asarray(g2, dtype=np.float64), int(nbytes)

    # -- all-reduce worker -----------------------------------------------------------------------
    def _allreduce_worker(self, i: int):
        cfg, env, trace, p = self.cfg, self.env, self.trace, self.problem
        c = 0
        while c < cfg.steps:
            try:
                batch = p.batch(self.shards[i], c, cfg.batch_size)
                keys = p.keys(batch)
                t_comp = env.now
                units = p.work(batch) if cfg.cost_unit == "nonzero" else len(batch)
                yield env.timeout(self.compute.time(i, units))
                keys, g = p.step(self.w[keys], batch, keys, cfg.lr)
                trace.span(i, "compute", t_comp, env.now, step=c)
                t_arrive = env.now
                done = self._ar.arrive(i, c, keys, g)
                yield done
                t_start, nbytes = done.value
                trace.span(i, "wait", t_arrive, t_start, step=c)
                trace.span(i, "send", t_start, env.now, nbytes=nbytes, step=c)
                trace.update(env.now, i, c, 0, True)
                self._count_step(True)
                c += 1
            except simpy.Interrupt:
                restarted = yield from self._down(i)
                if not restarted:
                    return
        self.finished[i] = True

    # -- failures, bookkeeping -------------------------------------------------------------------
    def _failure(self, worker: int, at: float):
        yield self.env.timeout(at)
        proc = self.procs[worker]
        if proc.is_alive:
            proc.interrupt("failure")

    def _down(self, i: int):
        """The worker is down: record it, and come back after restart_after if configured."""
        st, env = self.cfg.stragglers, self.env
        t0 = env.now
        if st.restart_after is None:
            self.down_since[i] = t0
            return False
        yield env.timeout(st.restart_after)
        self.trace.span(i, "down", t0, env.now)
        return True

    def _count_step(self, applied: bool) -> None:
        self.done_steps += 1
        if applied:
            self.applied += 1
            if self.applied % self.eval_period == 0:
                self._evaluate()
        if self.progress is not None and self.done_steps % self.eval_period == 0:
            self.progress(self.done_steps / self.total_steps)

    def _evaluate(self) -> None:
        value = self.problem.quality(self.w)
        self.trace.record_quality(self.env.now, self.applied, value)
        check_metric(value, self.applied, self.problem, self.cfg.lr)


class _AllReduce:
    """A ring all-reduce per step: starts when every worker has its gradient, costs the ring formula.

    With a compressor, the summed gradient is compressed once (worker 0's compressor) and its
    encoded size is what travels the ring: a model of compressed all-reduce, not of per-worker
    compression before the reduction.
    """

    def __init__(self, run: _Run):
        self.run = run
        self.pending: dict[int, list] = {}

    def arrive(self, i: int, c: int, keys: np.ndarray, g: np.ndarray) -> simpy.Event:
        cfg, env = self.run.cfg, self.run.env
        entry = self.pending.setdefault(c, [env.event(), []])
        entry[1].append((keys, g))
        if len(entry[1]) == cfg.n_workers:
            env.process(self._reduce(c, entry))
        return entry[0]

    def _reduce(self, c: int, entry: list):
        run, cfg, env = self.run, self.run.cfg, self.run.env
        t_start = env.now
        dense = np.zeros_like(run.w)
        for keys, g in entry[1]:
            dense[keys] += g
        size = run.w.size * cfg.value_bytes
        if run.compressors is not None:
            k_dec, v_dec, size = run.compressors[0](np.arange(run.w.size), dense)
            dense = np.zeros_like(run.w)
            dense[np.asarray(k_dec)] = np.asarray(v_dec, dtype=np.float64)  # a sparse compressor keeps a subset
        yield env.timeout(ring_allreduce_time(cfg.n_workers, size, cfg.latency, cfg.bandwidth))
        run.w += dense
        run.clocks.barriers.append(t_start)
        sent = int(round(2 * (cfg.n_workers - 1) / cfg.n_workers * size)) if cfg.n_workers > 1 else 0
        del self.pending[c]
        entry[0].succeed((t_start, sent))


def _make_compressors(cfg: SimConfig, n_params: int, seed_seq: np.random.SeedSequence) -> list | None:
    """One compressor per worker (each may keep an error-feedback residual), or None."""
    if cfg.compression is None or cfg.compression == "none":
        return None
    from simlib.compress import make_compressor

    # A callable compression is a factory with make_compressor's signature minus the spec.
    make = (lambda spec, *a, **kw: cfg.compression(*a, **kw)) if callable(cfg.compression) else make_compressor
    return [make(cfg.compression, n_params, np.random.default_rng(s), key_bytes=cfg.key_bytes,
                 value_bytes=cfg.value_bytes) for s in seed_seq.spawn(cfg.n_workers)]

"""The discrete-event run: workers, servers and messages on SimPy, with the problem's real math.

Each worker pulls the rows its mini-batch touches, computes the real gradient on the values it
actually read (so a stale read gives a really stale gradient), and pushes it back; the protocol
(``clocks.ClockTable``) decides when reads may happen and which pushes count. Every random choice
comes from generators spawned from the config's seed, and SimPy orders simultaneous events by
creation, so the same config gives the same trace bit for bit.

Without a cache a worker pulls the rows it reads every step, so under SSP it reads the server's
values as they are when its pull arrives. With one (``SimConfig.cache``, and always under ESSP) it
reads its own copy (:class:`_Cache`) and fetches only the rows the bound no longer lets it read as
they are; under ESSP the server also sends every update it applies to every other worker's copy,
over the same links, so reads are fresher and the network carries more.

With ``SimConfig.sites`` > 1 the job spans sites joined by WAN links; with ``hierarchy='per-site'`` each
site has its own servers and table, synced across the WAN once per site step (the sums of its workers' pushes,
all of them or Gaia's significant ones), optionally bounded by Gaia's mirror clock: see :mod:`simlib.sim.sites`.
"""
from __future__ import annotations

import bisect
from types import GeneratorType
import functools
import gc
from collections import Counter
from typing import Any, Callable

import numpy as np
import simpy

from simlib.contract import ParamServer, check_problem, key_bounds, record_metric, record_start
from simlib.problems.logistic import LogisticProblem, make_sparse_classification
from simlib.sim import fastcost
from simlib.sim.clocks import ClockTable, wake_ready
from simlib.sim.config import SimConfig
from simlib.sim.network import Link, Node, ring_allreduce_time, transmit
from simlib.sim.sites import Outbox, site_of
from simlib.sim.stragglers import ComputeModel
from simlib.sim.kernel import Environment
from simlib.trace import SPAN_KINDS, SpanLog, Trace, UpdateLog
from simlib.worker import AllReduce, Bucket, Compute, Early, Gate, Plan, Pull, Push, Reduced
from simlib.worker import allreduce_worker, ps_worker

COMPUTE, SEND, RECV, WAIT = (SPAN_KINDS.index(k) for k in ("compute", "send", "recv", "wait"))

Progress = Callable[[float], None]


@functools.lru_cache(maxsize=4)
def default_problem(n_rows: int = 20_000, n_features: int = 10_000, nnz_per_row: int = 20,
                    seed: int = 0) -> LogisticProblem:
    """The default workload: sparse logistic regression, 20 k rows x 10 k features (cached)."""
    data = make_sparse_classification(n_rows, n_features, nnz_per_row, label_noise=0.05, seed=seed)
    return LogisticProblem(data, l2=1e-4, eval_rows=4_000, seed=seed)


def run_config(cfg: SimConfig, problem: Any = None, progress: Progress | None = None) -> "_Run":
    """Run a simulation and return its state (``.trace``, the final table ``.w``); ``problem`` None is
    :func:`default_problem`, ``progress`` is called with the fraction of steps done. Internal: the simulator
    trains through ``simlib.run(problem, protocol, substrate="sim", ...)``."""
    problem = default_problem() if problem is None else problem
    check_problem(problem)
    cfg.check_trace_memory()
    run = _Run(cfg, problem, progress)
    run.execute()
    return run


class _Run:
    """State of one simulation: environment, parameters, clocks, nodes, trace."""

    def __init__(self, cfg: SimConfig, problem: Any, progress: Progress | None):
        self.cfg = cfg
        self.problem = problem
        self.progress = progress
        self.env = Environment()
        compute_seq, comp_seq = np.random.SeedSequence(cfg.seed).spawn(2)
        self.compute = ComputeModel(cfg, compute_seq)
        self.w = problem.init_params()
        self.shards = problem.shards(cfg.n_workers) if cfg.step_keys is None else None
        if cfg.step_keys is not None:  # cost-only, a fixed step: step_keys keys spread evenly over the table
            if cfg.step_keys > problem.n_params:
                raise ValueError(f"step_keys ({cfg.step_keys}) must be <= the problem's parameters "
                                 f"({problem.n_params})")
            self.fixed_keys = np.linspace(0, problem.n_params, cfg.step_keys, endpoint=False).astype(np.int64)
            self.fixed_units = cfg.step_keys if cfg.cost_unit == "nonzero" else cfg.batch_size
        self.clocks = ClockTable(self.env, cfg.n_workers, cfg.proto, cfg.read_rule)
        self.server = ParamServer(self.w, cfg.n_workers, cfg.proto, cfg.step_rule, clocks=self.clocks)
        self.trace = Trace(
            label=cfg.label,
            substrate="sim",
            n_workers=cfg.n_workers,
            metric=getattr(problem, "metric", "loss"),
            lower_is_better=getattr(problem, "lower_is_better", True),
            spans=SpanLog(),
            updates=UpdateLog(),
        )
        self.n_shards = cfg.n_servers + cfg.n_summation
        self._init_sites(cfg)
        self.key_bounds = key_bounds(problem.n_params, self.n_shards)
        self.compressors = _make_compressors(cfg, problem.n_params, comp_seq)
        self.applied = 0
        self.finished = [False] * cfg.n_workers
        self.eval_period = cfg.eval_every * cfg.n_workers
        self.total_steps = cfg.steps * cfg.n_workers
        self.done_steps = 0
        self.down_since: dict[int, float] = {}
        self.caches: list[_Cache] | None = None
        self.eager = cfg.proto.eager
        if cfg.cached:
            self.caches = [_Cache(self.w, self.n_shards) for _ in range(cfg.n_workers)]
            self.shard_of = np.repeat(np.arange(self.n_shards), np.diff(self.key_bounds))  # key -> its server shard
            self.cache_stats = {"fetches": 0, "fetched_keys": 0, "pushes": 0, "pushed_bytes": 0}

    # -- top level ---------------------------------------------------------------------------
    def execute(self) -> Trace:
        cfg, env = self.cfg, self.env
        if not cfg.cost_only:
            record_start(self.trace, self.problem, self.w)
        # all-reduce: per step (or per (step, bucket)), its ring's end and the gradients
        self.rings: dict[Any, tuple[simpy.Event, list]] = {}
        self.ring_free = 0.0  # when the links are free of the last ring started: rings take turns
        self.span_columns, self.update_columns = self.trace.spans.appenders(), self.trace.updates.appenders()
        # NOTE: the run allocates hundreds of thousands of small records; Python's cyclic GC would
        # rescan them all repeatedly (measured: 1.7x slower at 1,000 workers; starting 100,000 worker
        # processes with it on took 16 % of a cost-only run). Nothing here needs cycle collection
        # mid-run, so it is paused and restored, whatever happens.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            if fastcost.eligible(self):  # the plain cost-only server, compiled (the same events: see fastcost)
                self.procs = []
                fastcost.run(self)
            else:
                self.procs = [env.process(self._worker(i)) for i in range(cfg.n_workers)]
                st = cfg.stragglers
                if st.fail_worker is not None:
                    env.process(self._failure(st.fail_worker, st.fail_time))
                env.run()
        finally:
            if gc_was_enabled:
                gc.enable()
        if self.per_site and not self.flushed:  # stalled workers: flush what is left now
            self._flush()
            env.run()
        self.server.finish()
        if self.applied % self.eval_period or self.per_site:  # per site: the WAN's last arrivals changed the table
            self._evaluate()
        if cfg.cost_only:
            self.trace.meta["math"] = ("none: cost-only run, each step charged its modelled compute and "
                                       "communication time; no gradient computed, no quality recorded")
        for i, t0 in self.down_since.items():  # a worker that never came back is down to the end
            self.trace.span(i, "down", t0, max(env.now, t0))
        # Stalled: alive but blocked (by a dead worker, at a barrier or the staleness bound).
        stalled = [i for i, f in enumerate(self.finished) if not f and i not in self.down_since]
        self.trace.meta.update(
            config=cfg.to_dict(),
            protocol_label=cfg.label,
            stragglers=cfg.stragglers.describe(),
            barriers=list(self.clocks.barriers) if cfg.proto.rounds else [],
            stalled=stalled,
            failed_workers=sorted(self.down_since),
        )
        if self.caches is not None:
            self.trace.meta["cache"] = dict(self.cache_stats)
        if self.wan_links is not None:
            self.trace.meta.update(site_of=list(self.site_of), wan_bytes=self.wan_bytes, lan_bytes=self.lan_bytes,
                                   wan_messages=len(self.wan_log), wan=self.wan_log)
        if stalled:
            self.trace.meta["stall_reason"] = (
                f"workers {stalled} never finished: failed worker {sorted(self.down_since)} blocks the "
                f"{'barrier' if cfg.proto.rounds else 'staleness bound'} "
                "(add backup workers: backup_workers, --backup-workers; or a deadline: timeout, --timeout)"
            )
        return self.trace

    # -- the worker ---------------------------------------------------------------------------
    def _worker(self, i: int):
        """Worker i: the worker program (:func:`simlib.worker.ps_worker`, or :func:`~simlib.worker.allreduce_worker`
        on a ring) on this cluster's transport; a failure retries the step it cut short once the worker is back, or
        ends the worker for good."""
        cfg, p = self.cfg, self.problem
        transport = _Worker(self, i)
        shard = None if self.shards is None else self.shards[i]
        comp = None if self.compressors is None else self.compressors[i]
        ring = cfg.topology == "allreduce"
        perform = _RING_EFFECTS if ring else _PS_EFFECTS  # effect -> transport method (unbound: no per-worker dict)
        # NOTE: on the plain path (one shard at the worker's site, no cache, compression or clocks) a pull's, a
        # compute's and a push's delays are taken right here (the same delays, in the same order, as the transport's
        # methods), without a generator per effect: 10^4 workers x 100 BSP steps cost 1.4x the hand-written loop's
        # CPU seconds through the methods alone.
        plain = transport.direct and self.compressors is None and transport.managed is None and not ring
        # a bucketed backward pass: its Computes charged layer by layer (_Worker.layer), not at the first
        layered = ring and cfg.bucket_bytes is not None and callable(getattr(p, "backward_layers", None))
        per_site, clocks, rule, steps = self.per_site, self.clocks, self.clocks.rule, cfg.steps
        ut, uw, uc, us, ua, ul = self.update_columns
        deadline = cfg.timeout is not None or transport.managed is not None
        env, (sw, sk, ss, se, sn, sc) = self.env, self.span_columns
        work, queued, cost_only = self.compute.time, transport.units, cfg.cost_only
        inlink, outlink, latency, bandwidth = transport.inlink, transport.outlink, cfg.latency, cfg.bandwidth
        server_time, key_bytes, value_bytes, server = cfg.server_time, cfg.key_bytes, cfg.value_bytes, transport.server
        c = 0
        while c < cfg.steps:
            plan = Plan(cfg.steps, cfg.batch_size, cfg.lr, clock_batches=cfg.clock_batches, first=c,
                        entry_bytes=cfg.entry_bytes)
            send = (allreduce_worker(p, shard, plan, transport.source, cfg.bucket_bytes) if ring
                    else ps_worker(p, shard, plan, comp, transport.source)).send
            value = None
            try:
                # NOTE: the interpreter loop inlined here, not a generic driver's yield from: one generator level
                # less on every event of every worker.
                while True:
                    try:
                        effect = send(value)
                    except StopIteration:
                        break
                    kind = effect.__class__
                    if kind is Gate:  # wait until the read rule lets step c read (across sites: and the WAN)
                        c = transport.step = effect[0]
                        # NOTE: a closed gate wakes this process's own wake, not a new event (the same order, through
                        # the kernel's fast path): 2,000 workers x 100 BSP steps, 5.2 -> 4.6 CPU s.
                        gate = clocks.gate(c, env._active_proc.wake)
                        if gate is not None:
                            t0 = env._now
                            yield gate
                            now = env._now
                            if now > t0:  # span(i, WAIT, t0, now, 0, c)
                                sw(i); sk(WAIT); ss(t0); se(now); sn(0); sc(c)  # noqa: E702
                        if per_site and not self._wan_ready(self.site_of[i], c):  # woken by _site_message
                            t0, arrived = env._now, env.event()
                            self.wan_waiters[self.site_of[i]].append((c, arrived))
                            yield arrived
                            self.trace.spans.add(i, WAIT, t0, env._now, 0, c)
                        if deadline:  # the step's opening arms its deadline
                            clocks.open(c)
                        lag = c - rule.completed
                        transport.lag = lag if lag > 0 else 0
                        value = 1
                        continue
                    if kind is Compute and not layered:  # charge the batch's work, then the math on the values read
                        t0 = env._now
                        yield work(i, queued.pop(0))
                        value = (effect[3][2], None) if cost_only else effect[2](*effect[3])
                        now = env._now
                        if now > t0:  # span(i, COMPUTE, t0, now, 0, c)
                            sw(i); sk(COMPUTE); ss(t0); se(now); sn(0); sc(effect[0])  # noqa: E702
                        continue
                    if plain and kind is Pull:  # inlink.reserve(now, req_bytes, bandwidth, server_time), inlined
                        t0, n = env._now, len(effect[1])
                        req_bytes, resp_bytes = n * key_bytes, n * value_bytes
                        self.lan_bytes += req_bytes
                        free = inlink.free_at
                        done = (t0 if t0 >= free else free) + (server_time + req_bytes / bandwidth)
                        inlink.free_at = done
                        yield done - t0 + latency
                        value = (None, server.version) if cost_only else server.pull(effect[1])
                        now, free = env._now, outlink.free_at
                        done = (now if now >= free else free) + resp_bytes / bandwidth
                        outlink.free_at = done
                        yield done - now + latency
                        self.lan_bytes += resp_bytes
                        now = env._now
                        if now > t0:  # span(i, RECV, t0, now, req_bytes + resp_bytes, c)
                            sw(i); sk(RECV); ss(t0); se(now); sn(req_bytes + resp_bytes); sc(effect[0])  # noqa: E702
                        continue
                    if plain and kind is Push:
                        t0, nbytes = env._now, effect[4]
                        self.lan_bytes += nbytes
                        free = inlink.free_at
                        done = (t0 if t0 >= free else free) + (server_time + nbytes / bandwidth)
                        inlink.free_at = done
                        yield done - t0 + latency
                        # transport.landed(effect, t0), inlined for this path (no sites, cache or clocks)
                        now, c = env._now, effect[0]
                        if now > t0:  # span(i, SEND, t0, now, nbytes, c)
                            sw(i); sk(SEND); ss(t0); se(now); sn(nbytes); sc(c)  # noqa: E702
                        applied, tau = server.push(c, effect[1], effect[2], effect[3])
                        ut(now); uw(i); uc(c); us(tau); ua(applied); ul(transport.lag)  # noqa: E702
                        self._count_step(applied)
                        completed = clocks.rule.completed
                        if not applied:  # its skipped steps count as done (see landed)
                            self.done_steps += min(max(c + 1, completed), steps) - (c + 1)
                        value = applied, completed
                        continue
                    value = perform[kind](transport, effect)
                    if value.__class__ is GeneratorType:  # the effect takes simulated time (a plain value: none)
                        value = yield from value
                c = cfg.steps
            except simpy.Interrupt:
                if not (yield from self._down(i)):  # down for good
                    return
                c = transport.step
                queued.clear()  # the cut step's work is charged again when it is retried
        self.finished[i] = True
        if self.per_site and all(self.finished):
            self._flush()

    def _step_input(self, i: int, c: int) -> tuple[Any, np.ndarray, int]:
        """Worker i's step c: (mini-batch, the keys it reads, its units of compute work)."""
        if self.shards is None:  # cost-only with a fixed step: the same keys and work every step
            return None, self.fixed_keys, self.fixed_units
        p = self.problem
        batch = p.batch(self.shards[i], c, self.cfg.batch_size)
        return batch, p.keys(batch), p.work(batch) if self.cfg.cost_unit == "nonzero" else len(batch)

    def _pull(self, i: int, keys: np.ndarray, stamps: dict[int, tuple[int, int, int]] | None = None):
        """Worker i pulls ``keys`` from their shards; ``stamps``, if given, receives each shard's :meth:`_stamp` at
        its read."""
        parts = self._split(keys)
        server = self.site_server[self.site_of[i]] if self.per_site else self.server
        values = np.empty(len(keys), dtype=self.w.dtype)
        versions: list[int] = []
        yield from self._each([self._pull_shard(i, server, k, keys, sel, values, versions, stamps) for k, sel in parts])
        return values, min(versions), len(keys) * self.cfg.key_bytes, len(keys) * self.cfg.value_bytes

    def _pull_shard(self, i: int, server: ParamServer, k: int, keys: np.ndarray, sel: slice, out: np.ndarray,
                    versions: list[int], stamps: dict[int, tuple[int, int, int]] | None = None):
        cfg = self.cfg
        n = sel.stop - sel.start
        yield from self._to_server(i, k, n * cfg.key_bytes, cfg.server_time)
        out[sel], v = server.pull(keys[sel])
        versions.append(v)  # the push's tau counts from the earliest shard read
        if stamps is not None:
            stamps[k] = self._stamp()
        yield from self._to_worker(i, k, n * cfg.value_bytes)

    def _push(self, i: int, keys: np.ndarray, nbytes: int):
        parts = self._split(keys)
        # Encoded bytes are split across shards in proportion to the keys each one receives.
        sizes = [nbytes] if len(parts) == 1 else [nbytes * (sel.stop - sel.start) / len(keys) for _, sel in parts]
        yield from self._each([self._to_server(i, k, n, self.cfg.server_time) for (k, _), n in zip(parts, sizes)])

    def _each(self, messages: list[Any]):
        """Send the messages (generators): one in this process, several as processes at once (to overlap them)."""
        if len(messages) == 1:
            yield from messages[0]
        else:
            yield self.env.all_of([self.env.process(m) for m in messages])

    # -- sites and the WAN (simlib.sim.sites) ----------------------------------------------------
    def _init_sites(self, cfg: SimConfig) -> None:
        """Sites, WAN links, per-site servers and tables, significance filters (all off on one flat site)."""
        self.site_of = site_of(cfg.n_workers, cfg.sites)
        self.per_site = cfg.hierarchy == "per-site"
        self.lan_bytes = self.wan_bytes = 0
        self.wan_log: list[list[float]] = []
        self.wan_links = ([[Link() for _ in range(cfg.sites)] for _ in range(cfg.sites)]
                          if cfg.sites > 1 or self.per_site else None)
        # The flat servers sit at site 0; per site, site s has its own nodes, table and server.
        self.nodes = [[Node() for _ in range(self.n_shards)] for _ in range(cfg.sites if self.per_site else 1)]
        self.outboxes: list[Outbox] | None = None
        self.flushed = False
        # Per receiving site: {step: messages from other sites' updates of that step still on the WAN}, and the
        # workers waiting for them (the protocol's bound holds across the WAN too: see simlib.sim.sites).
        self.wan_pending: list[Counter[int]] = [Counter() for _ in range(cfg.sites)]
        self.wan_waiters: list[list[tuple[int, simpy.Event]]] = [[] for _ in range(cfg.sites)]
        # Gaia's mirror clock: heard[r][s] is the last end of a step of site s that site r has heard of.
        self.mirror = cfg.mirror_clock if self.per_site else None
        self.cross_bound = cfg.bound if self.mirror is None else min(cfg.bound, self.mirror)
        self.heard = [[cfg.steps if s == r else 0 for s in range(cfg.sites)] for r in range(cfg.sites)]
        if self.per_site:
            self.tables = [self.w] + [self.w.copy() for _ in range(1, cfg.sites)]
            self.site_server = [self.server] + [ParamServer(t, cfg.n_workers, cfg.proto, cfg.step_rule,
                                                            clocks=self.clocks) for t in self.tables[1:]]
            # One update counter for the job: tau counts the updates applied at any site between a read and
            # its push (the plain step rule, the only one allowed per site, uses nothing else of it).
            for server in self.site_server[1:]:
                server.acc = self.server.acc
            self.outboxes = [Outbox(t, cfg.significance) for t in self.tables]
            # A site's step is complete once each of its workers has moved past it (or is down for good).
            self.next_step = [0] * cfg.n_workers
            self.site_step = [0] * cfg.sites
            self.site_workers = [[i for i in range(cfg.n_workers) if self.site_of[i] == s] for s in range(cfg.sites)]

    def _remote(self, i: int) -> bool:
        """Whether worker i's servers are at another site (a flat PS, the worker away from site 0)."""
        return not self.per_site and self.site_of[i] != 0

    def _to_server(self, i: int, k: int, nbytes: float, service: float = 0.0):
        """Worker i's message to shard k of its servers: across the WAN first if they are at another site."""
        if self._remote(i):
            yield from self._wan(self.site_of[i], 0, nbytes)
        else:
            self.lan_bytes += nbytes
        node = self.nodes[self.site_of[i] if self.per_site else 0][k]
        yield from transmit(self.env, node.inlink, nbytes, self.cfg.latency, self.cfg.bandwidth, service)

    def _to_worker(self, i: int, k: int, nbytes: float):
        """Shard k's message to worker i: its out-link, then the WAN if the worker is at another site."""
        node = self.nodes[self.site_of[i] if self.per_site else 0][k]
        yield from transmit(self.env, node.outlink, nbytes, self.cfg.latency, self.cfg.bandwidth)
        if self._remote(i):
            yield from self._wan(0, self.site_of[i], nbytes)
        else:
            self.lan_bytes += nbytes

    def _wan(self, a: int, b: int, nbytes: float):
        """A message from site a to site b: it queues on their WAN link, then travels for wan_latency."""
        cfg, env = self.cfg, self.env
        t0 = env.now
        yield from transmit(env, self.wan_links[a][b], nbytes, cfg.wan_latency, cfg.wan_bandwidth)
        self.wan_bytes += nbytes
        self.wan_log.append([t0, env.now, nbytes, a, b])

    def _site_step(self, i: int, c: int) -> None:
        """Worker i moved on to step c: once its site's step is complete, the site server sends its sums (one
        message to each other site), all of them or, filtered, the significant ones."""
        self.next_step[i] = c
        s = self.site_of[i]
        done = min(self.next_step[j] for j in self.site_workers[s])
        if done > self.site_step[s]:
            self.site_step[s] = done
            keys, sums, first = self.outboxes[s].take(self.tables[s])
            clock = None if self.mirror is None else done  # with the mirror clock, every step's end is announced
            self._send_sites(s, done if first is None else first, keys, sums, clock)

    def _send_sites(self, s: int, c: int, keys: np.ndarray, deltas: np.ndarray | None,
                    clock: int | None = None) -> None:
        """Site s sends ``keys`` (sums of its steps >= c) to every other site, with its clock if one is given (a
        clock costs one key's bytes; alone when no key is sent)."""
        if not len(keys) and clock is None:
            return
        nbytes = len(keys) * self.cfg.entry_bytes + (0 if clock is None else self.cfg.key_bytes)
        for r in range(self.cfg.sites):
            if r != s:
                if len(keys):
                    self.wan_pending[r][c] += 1
                self.env.process(self._site_message(s, r, c, keys, deltas, nbytes, clock))

    def _site_message(self, s: int, r: int, c: int, keys: np.ndarray, deltas: np.ndarray | None, nbytes: int,
                      clock: int | None):
        yield from self._wan(s, r, nbytes)
        if len(keys):
            if deltas is not None:  # None: cost-only
                self.tables[r][keys] += deltas
            pending = self.wan_pending[r]
            pending[c] -= 1
            if not pending[c]:  # a step none of whose messages is left drops out
                del pending[c]
        if clock is not None:  # the link is FIFO: every message site s sent before this one has arrived
            self.heard[r][s] = max(self.heard[r][s], clock)
        if self.wan_waiters[r]:
            self.wan_waiters[r] = wake_ready(self.wan_waiters[r], functools.partial(self._wan_ready, r))

    def _wan_ready(self, r: int, c: int) -> bool:
        """Whether site r holds every update of the other sites that the bound lets a step-c read not see: those of
        steps <= c - 1 - bound (of them, with a filter, the ones sent: significant sums). With the mirror clock m the
        bound is at most m, and site r must also have heard that every other site ended its steps <= c - 1 - m."""
        if min(self.wan_pending[r], default=c) <= c - 1 - self.cross_bound:
            return False
        return self.mirror is None or min(self.heard[r]) >= c - self.mirror

    def _flush(self) -> None:
        """The workers are done: every site sends all it still holds back, so every update reaches every site."""
        self.flushed = True
        for s, box in enumerate(self.outboxes):
            self._send_sites(s, self.cfg.steps, *box.rest())

    # -- worker caches (SSP with cache=True, ESSP) -----------------------------------------------
    def _stamp(self) -> tuple[int, int, int]:
        """What the table holds now: (updates applied, the server's version, complete steps)."""
        return self.server.acc.version, self.server.version, self.clocks.completed

    def _read_cache(self, i: int, c: int, keys: np.ndarray):
        """Worker i at clock c reads ``keys`` from its copy, first fetching the rows the read rule refuses as they are.

        Returns (values, read version, clock lag, request bytes, reply bytes). The read's version is the
        oldest its rows hold, plus the worker's own updates since (its copy has them: tau does not count them).
        """
        cache = self.caches[i]
        held = cache.held(keys, self.shard_of)
        old = [h for h in np.unique(held[2]) if h < 0 or not self.clocks.rule.may_read_from(c, int(h))]
        req_bytes = resp_bytes = 0
        if old:
            stale = keys[np.isin(held[2], old)]
            stamps: dict[int, tuple[int, int, int]] = {}
            values, _, req_bytes, resp_bytes = yield from self._pull(i, stale, stamps)
            for k, sel in self._split(stale):
                cache.fill(stale[sel], values[sel], stamps[k])
            self.cache_stats["fetches"] += 1
            self.cache_stats["fetched_keys"] += len(stale)
            held = cache.held(keys, self.shard_of)
        updates, version, complete = (int(x) for x in held.min(axis=1))
        # Under BSP the version counts rounds, not updates, and every read is a fresh fetch: nothing to add.
        own = 0 if self.cfg.proto.rounds else len(cache.own) - bisect.bisect_right(cache.own, updates)
        return cache.values[keys], version + own, max(c - complete, 0), req_bytes, resp_bytes

    def _share(self, i: int, c: int, keys: np.ndarray, deltas: np.ndarray) -> None:
        """An update from worker i was applied: into its own copy now; under ESSP, sent to every other worker's."""
        update = self.server.acc.version
        cache = self.caches[i]
        cache.add(keys, deltas, update)
        cache.own.append(update)
        if not self.eager:
            return
        stamp = self._stamp()
        parts = self._split(keys)
        for k, _ in parts:
            # With nothing from shard k on its way to it, worker i's copy of k's rows holds every update so far.
            if cache.inflight[k] == 0:
                cache.pushed[:, k] = np.maximum(cache.pushed[:, k], stamp)
        for j in range(self.cfg.n_workers):
            if j != i:
                for k, sel in parts:
                    self.caches[j].inflight[k] += 1
                    self.env.process(self._send_update(j, k, keys[sel], deltas[sel], stamp, c))

    def _send_update(self, j: int, k: int, keys: np.ndarray, deltas: np.ndarray, stamp: tuple[int, int, int],
                     step: int):
        """Shard k sends an applied update to worker j's copy: it queues on the shard's out-link like a pull reply."""
        cfg, env = self.cfg, self.env
        t0, nbytes = env.now, len(keys) * cfg.entry_bytes
        yield from self._to_worker(j, k, nbytes)
        cache = self.caches[j]
        cache.add(keys, deltas, stamp[0])
        cache.pushed[:, k] = np.maximum(cache.pushed[:, k], stamp)
        cache.inflight[k] -= 1
        self.cache_stats["pushes"] += 1
        self.cache_stats["pushed_bytes"] += nbytes
        # Received while the worker computes or waits: the span overlaps its others (its link, not its time).
        self.trace.span(j, "recv", t0, env.now, nbytes=nbytes, step=step)

    def _split(self, keys: np.ndarray) -> list[tuple[int, slice]]:
        """Shards that own some of the (sorted) keys, with the slice of keys each owns."""
        if self.n_shards == 1:
            return [(0, slice(0, len(keys)))]
        cuts = np.searchsorted(keys, self.key_bounds)
        return [(k, slice(int(cuts[k]), int(cuts[k + 1]))) for k in range(self.n_shards) if cuts[k + 1] > cuts[k]]

    # -- all-reduce worker -----------------------------------------------------------------------
    def _ring(self, key: Any, done: simpy.Event, grads: list[tuple[Any, np.ndarray | None]], span: slice = slice(None)):
        """A ring all-reduce of every worker's gradient on ``self.w[span]`` (the whole table, or one bucket), costed by
        the ring formula; ``done`` fires at its end with (its start, bytes each worker sent).

        With a compressor, the summed gradient is compressed once (worker 0's compressor) and its
        encoded size is what travels the ring: a model of compressed all-reduce, not of per-worker
        compression before the reduction.
        """
        cfg, env = self.cfg, self.env
        t_start = env.now
        part = self.w[span]
        size = part.size * cfg.value_bytes
        dense = None
        if not cfg.cost_only:
            dense = np.zeros_like(part)
            for keys, g in grads:
                dense[keys] += g
        if self.compressors is not None:
            k_dec, v_dec, size = self.compressors[0](np.arange(self.w.size), dense)
            dense = np.zeros_like(self.w)
            dense[np.asarray(k_dec)] = np.asarray(v_dec, dtype=np.float64)  # a sparse compressor keeps a subset
        t_start = max(t_start, self.ring_free)
        self.ring_free = t_start + ring_allreduce_time(cfg.n_workers, size, cfg.latency, cfg.bandwidth)
        yield env.timeout(self.ring_free - env.now)
        if dense is not None:
            part += dense
        if not isinstance(key, tuple) or key[1] == 0:  # one barrier per step: its first ring
            self.clocks.barriers.append(t_start)
        sent = int(round(2 * (cfg.n_workers - 1) / cfg.n_workers * size)) if cfg.n_workers > 1 else 0
        del self.rings[key]
        done.succeed((t_start, sent))

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
            if self.per_site:  # its site's steps no longer wait for it
                self._site_step(i, self.cfg.steps)
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
        if self.cfg.cost_only:  # no math ran: there is no metric to evaluate
            return
        record_metric(self.trace, self.problem, self.env.now, self.applied, self.w, self.cfg.lr)


class _Worker:
    """Worker i's transport on the simulated cluster: each effect of the worker program as SimPy delays and events.

    Pulls and pushes cross the links to the server shards (or the worker's cache, the WAN); compute is
    charged by the compute model before the problem's real math runs on the values read; the trace's spans,
    tau and clock lag are recorded here, per effect.
    """

    # NOTE: slots: 10^4 workers each holding a dict made every step reach colder memory.
    __slots__ = ("run", "i", "env", "cfg", "clocks", "per_site", "cached", "direct", "inlink", "outlink", "server",
                 "step", "lag", "units", "managed", "pending", "step_time")

    def __init__(self, run: "_Run", i: int):
        cfg = run.cfg
        self.run, self.i, self.env, self.cfg = run, i, run.env, cfg
        self.clocks = run.clocks
        self.per_site, self.cached = run.per_site, run.caches is not None
        # NOTE: one shard, the servers at the worker's own site, no cache: the pull and push inlined (the
        # same delays, taken in the same order, as _pull / _push, without three generators per message).
        self.direct = run.n_shards == 1 and not self.per_site and not self.cached and not run._remote(i)
        self.inlink, self.outlink = run.nodes[0][0].inlink, run.nodes[0][0].outlink
        self.server = run.site_server[run.site_of[i]] if self.per_site else run.server  # per site: its site's servers
        self.step = self.lag = 0
        self.units: list[float] = []  # the work of each mini-batch sourced and not yet computed
        self.pending: list = []  # all-reduce with overlap: the step's rings still running
        self.step_time = 0.0  # a bucketed backward pass: the step's compute time, drawn at its first layer
        self.managed = None
        if cfg.clock_batches > 1:  # Bosen's clocks; a budget spends the Early effects (simlib.sim.managed)
            from simlib.sim.managed import Sender

            self.managed = Sender(run, i)

    def source(self, j: int) -> tuple[Any, np.ndarray]:
        """Mini-batch j and its keys (cost-only with a fixed step: no batch, the fixed keys); its units of work are
        queued for the compute that follows."""
        batch, keys, units = self.run._step_input(self.i, j)
        # NOTE: the work counted here, beside keys(), where the problem's cache of the last batch answers it: at
        # the compute, after other workers' steps, it cost a lookup of the batch's rows (2-3 us a step).
        self.units.append(units)
        return batch, keys

    def pull(self, effect: Pull):
        """Request the keys from each shard (or the worker's copy); each shard reads the table on arrival and replies
        (the plain path's pull is inlined in :meth:`_Run._worker`)."""
        env, run, keys = self.env, self.run, effect.keys
        t_pull = env._now
        if self.managed is not None:
            self.managed.read()
        if not self.cached:
            values, version, req_bytes, resp_bytes = yield from run._pull(self.i, keys)
        else:  # the read's version and clock lag are what its copy holds, not the server's
            values, version, self.lag, req_bytes, resp_bytes = yield from run._read_cache(self.i, effect.step, keys)
        run.trace.spans.add(self.i, RECV, t_pull, env._now, req_bytes + resp_bytes, effect.step)
        return values, version

    def early(self, effect: Early) -> None:
        self.managed.early(effect.step, effect.pending)

    def replica(self, effect: Pull) -> tuple[Any, int]:
        """All-reduce: the worker's replica is the table (every replica is the same at a step's start)."""
        self.step = effect.step  # a failure retries this step
        return self.run.w[effect.keys], 0

    def all_reduce(self, effect: AllReduce):
        """Wait for every worker's gradient of the step; the step's ring all-reduce (:meth:`_Run._ring`) starts with
        the last one and ends with the sum in the table."""
        yield from self._join(effect.step, effect.step, (effect.keys, effect.deltas), slice(None))

    def bucket(self, effect: Bucket):
        """Bucket k of the step: its own ring over its keys, started with the last worker's bucket once the links are
        free; with ``overlap`` the worker goes on with its backward pass meanwhile, else it waits for the ring."""
        join = self._join((effect.step, effect.index), effect.step, (slice(None), effect.deltas), effect.keys,
                          not self.cfg.overlap)
        if self.cfg.overlap:
            self.pending.append(self.env.process(join))
        else:
            yield from join

    def layer(self, effect: Compute):
        """One Compute of a bucketed backward pass: at the step's first, its compute time T is drawn; the forward pass
        is charged T / 3 there, and each layer 2T / 3 times its share of the parameters, after its real math."""
        env, i, c = self.env, self.i, effect.step
        t0 = env._now
        forward = 0.0
        if self.units:
            self.step_time = self.run.compute.time(i, self.units.pop(0))
            forward = self.step_time / 3
        out = effect.fn(*effect.args)
        share = 0.0 if out is None else (out[0].stop - out[0].start) / self.run.w.size
        if forward + share > 0:
            yield env.timeout(forward + 2 * self.step_time / 3 * share)
            self.run.trace.span(i, "compute", t0, env._now, step=c)
        return out

    def _join(self, key: Any, c: int, grad: tuple, span: slice, waits: bool = True):
        """Add this worker's gradient to the ring ``key``; wait for its end; record the ring's span (and the wait for
        its start, where the worker waits: ``waits``)."""
        env, run, i = self.env, self.run, self.i
        t_arrive = env.now
        done, grads = run.rings.setdefault(key, (env.event(), []))
        grads.append(grad)
        if len(grads) == self.cfg.n_workers:  # the last gradient: the ring starts
            env.process(run._ring(key, done, grads, span))
        yield done
        t_start, nbytes = done.value
        if waits:
            run.trace.span(i, "wait", t_arrive, t_start, step=c)
        run.trace.span(i, "send", t_start, env.now, nbytes=nbytes, step=c)

    def reduced(self, effect: Reduced):
        """Wait for the step's rings still running (overlap); then one update per worker and step."""
        if self.pending:
            t0 = self.env.now
            yield self.env.all_of(self.pending)
            self.pending = []
            if self.env.now > t0:
                self.run.trace.span(self.i, "wait", t0, self.env.now, step=effect.step)
        self.run.trace.update(self.env.now, self.i, effect.step, 0, True)
        self.run._count_step(True)

    def push(self, effect: Push):
        """The update travels to each shard; it is applied (through the step rule) when all of it has arrived."""
        t0 = self.env._now
        if self.managed is not None:
            yield from self.managed.push(effect.step, effect.keys, effect.deltas, effect.nbytes)
        else:
            yield from self.run._push(self.i, effect.keys, effect.nbytes)
        return self.landed(effect, t0)

    def landed(self, effect: Push, t_push: float) -> tuple[bool, int]:
        """The push (sent at ``t_push``) has arrived: the server applies it; its span and update are recorded."""
        env, run, cfg, i, c = self.env, self.run, self.cfg, self.i, effect.step
        keys, g, nbytes = effect.keys, effect.deltas, effect.nbytes
        now = env._now
        run.trace.spans.add(i, SEND, t_push, now, nbytes, c)
        applied, tau = self.server.push(c, keys, g, effect.version)
        if self.managed is not None:
            self.managed.landed(g)
        if self.per_site and applied:
            run.outboxes[run.site_of[i]].add(c, keys, g)  # summed into what goes to the other sites
        if applied and self.cached:
            run._share(i, c, keys, cfg.step_rule.scaled(g, tau))  # the update as the table took it
        for append, value in zip(run.update_columns, (now, i, c, tau, applied, self.lag)):
            append(value)
        run._count_step(applied)
        # A dropped worker (backup workers, deadline) abandons the steps the others have already completed and
        # rejoins at the current one (the worker program's rule); its skipped steps count as done.
        completed = self.clocks.completed
        nxt = c + 1 if applied else min(max(c + 1, completed), cfg.steps)
        run.done_steps += nxt - (c + 1)
        if self.per_site:
            run._site_step(i, nxt)
        return applied, completed


_PS_EFFECTS = {Pull: _Worker.pull, Push: _Worker.push, Early: _Worker.early}
_RING_EFFECTS = {Pull: _Worker.replica, AllReduce: _Worker.all_reduce, Bucket: _Worker.bucket, Reduced: _Worker.reduced,
                 Compute: _Worker.layer}


class _Cache:
    """One worker's copy of the table (SSP with ``cache=True``, ESSP), empty until its rows are fetched.

    Each stamp is (updates applied, server version, complete steps) of the table at one moment. Per key,
    ``fetched`` is the stamp its last fetch read (-1: never fetched); per server shard, ``pushed`` is the
    stamp of the newest ESSP update received from it (or of its own, when nothing from the shard is on its
    way: ``inflight`` counts those). A shard's link delivers its updates in the order they were applied,
    so a fetched row holds every update up to the later of the two. ``own`` lists the updates this
    worker's own pushes made, which its copy holds from the moment they are applied.
    """

    def __init__(self, w: np.ndarray, n_shards: int):
        self.values = w.copy()
        self.fetched = np.full((3, len(w)), -1, dtype=np.int64)
        self.pushed = np.zeros((3, n_shards), dtype=np.int64)
        self.inflight = np.zeros(n_shards, dtype=np.int64)
        self.own: list[int] = []

    def held(self, keys: np.ndarray, shard_of: np.ndarray) -> np.ndarray:
        """(3, len(keys)): the stamp each key's cached value holds; -1 for a row never fetched."""
        out = np.maximum(self.fetched[:, keys], self.pushed[:, shard_of[keys]])
        out[:, self.fetched[0, keys] < 0] = -1
        return out

    def fill(self, keys: np.ndarray, values: np.ndarray, stamp: tuple[int, int, int]) -> None:
        """A fetch's reply: the server's values of ``keys`` when the table was at ``stamp``."""
        self.values[keys] = values
        self.fetched[:, keys] = np.array(stamp, dtype=np.int64)[:, None]

    def add(self, keys: np.ndarray, deltas: np.ndarray, update: int) -> None:
        """Add update number ``update`` to the rows whose fetched value does not hold it yet."""
        new = self.fetched[0, keys] < update
        self.values[keys[new]] += deltas[new]


def _make_compressors(cfg: SimConfig, n_params: int, seed_seq: np.random.SeedSequence) -> list | None:
    """One compressor per worker (each may keep an error-feedback residual), or None."""
    if cfg.compression is None or cfg.compression == "none":
        return None
    from simlib.compress import make_compressor

    # A callable compression is a factory with make_compressor's signature minus the spec.
    make = (lambda spec, *a, **kw: cfg.compression(*a, **kw)) if callable(cfg.compression) else make_compressor
    return [make(cfg.compression, n_params, np.random.default_rng(s), key_bytes=cfg.key_bytes,
                 value_bytes=cfg.value_bytes) for s in seed_seq.spawn(cfg.n_workers)]

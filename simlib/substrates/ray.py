"""The ``ray`` substrate: parameter-server shards and workers as Ray actors, on one machine or many.

Actors (all asynchronous servers, synchronous workers):

* **shard 0, the coordinator** -- a :class:`simlib.contract.ParamServer` over keys [0, b1): it owns
  the protocol's :class:`~simlib.protocol.Clocks` (BSP, SSP(s), async, backup workers, deadlines),
  the step rule and the table's version, so it gates every read and measures every push's tau
  (updates applied between the read and the push). It records the updates and the quality.
* **shards 1 .. S-1** -- key ranges [b_k, b_k+1) of the table (``n_servers=S``). They apply a
  push's part with the coordinator's decision (applied or dropped, scaled by ``rule.scale(tau)``),
  and serve a read only once every push the coordinator had decided at the read's gate has reached
  them, so the SSP bound holds on every shard, not only on the coordinator's.
* **workers 0 .. N-1** -- for every step c: pull the keys the mini-batch touches (the coordinator
  holds the reply until ``may_read(c)``), compute :meth:`Problem.step` on the values read, push
  the deltas with the version they read. Spans: ``wait`` (the read held back by the protocol, as
  timed by the coordinator), ``recv`` (the pull, keys 4 B + values 8 B per key), ``compute``,
  ``send`` (the push, 12 B per key, or the compressor's wire size with ``compression=``).

Under protocol ``'allreduce'`` a :class:`RayReducer` actor takes the servers' place: each worker keeps a
replica and sends each bucket of its gradient as the backward pass makes it; the reducer returns every
worker the bucket's sum once all have sent theirs (through the object store), and keeps a replica of its
own whose quality it records.

Cluster: with no ``address`` the run starts a local Ray (``ray.init``, no dashboard, quiet logs)
and shuts it down at the end; ``address="host:port"`` (or ``"auto"``) joins a cluster started with
``ray start --head`` / ``ray start --address=host:port`` and leaves it running. An already
connected driver (``ray.is_initialized()``) is used as it is. Placement: if the cluster's nodes
carry the custom resources ``server`` and ``worker`` (``ray start --resources='{"server": 1}'``),
server actors go to ``server`` nodes and workers to ``worker`` nodes (``placement="auto"``, the
default; ``"resources"`` insists on them, ``"any"`` lets Ray choose). Each actor asks for
0.001 of its resource, so the resource marks a node rather than counting actors; actors take no CPU
reservation, so N workers fit on any cluster. Every node must be able to ``import simlib``
(``pip install -e .`` on each, or a shared checkout on ``PYTHONPATH``).

Faults: a worker actor that dies mid-run fails the run at once with a RuntimeError naming the
worker (no restart: its step would have to be replayed from a table that already moved on);
a server shard that dies fails it with a RuntimeError naming the shard (the table is lost);
Ctrl-C or ``timeout`` (which counts from the actors' start) kills every actor of the run before the
exception leaves :func:`run`; however a run ends (Diverged included), its actors' processes on this machine have
ended by then, on a cluster the driver keeps as on its own. A run that starts its own Ray also starts a watchdog
of the driver's pid (:func:`watch_driver`): if the driver is killed outright, the Ray processes it started go within
a second.
Times in the trace are wall seconds since the start, read on each actor's machine (``time.time``),
so across machines they are as good as the nodes' clock synchronisation.

Example::

    >>> import simlib
    >>> from simlib.problems.logistic import LogisticProblem, make_sparse_classification
    >>> prob = LogisticProblem(make_sparse_classification(2_000, 200, 10, seed=0), eval_rows=500)
    >>> res = simlib.run(prob, "ssp:1", substrate="ray", n_workers=2, steps=5)  # doctest: +SKIP
    >>> res.trace.summary()["max_clock_lag"] <= 1  # doctest: +SKIP
    True
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import glob
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from simlib import _validate as check
from simlib import signals
from simlib.compress import worker_compressor
from simlib.contract import ParamServer, Result, ServerRecord, Training, key_bounds, local_result, new_trace
from simlib.contract import served_trace
from simlib.diverged import Diverged
from simlib.protocol import Protocol, StepRule
from simlib.trace import Trace
from simlib.worker import AllReduce, Bucket, Plan, Pull, Push, Reduced, Timed, WorkerOptions
from simlib.worker import allreduce_worker, dense_bucket, drive, ps_worker

KEY_BYTES, VALUE_BYTES = 4, 8  # on the wire, as the pipes substrate and the simulator count them
ACTOR_SHARE = 0.001  # of a node's 'server' / 'worker' resource per actor: a label, not a quota
PLACEMENTS = ("auto", "resources", "any")
WATCH_S = 1.0  # seconds between pings of each server shard while the workers run
READY_TIMEOUT = 120.0  # a busy 2-core laptop starts one actor process (Python, NumPy, numba) at a time
# NOTE: a raylet gives its metrics agent a fixed 15 s to start and exits otherwise; on a busy
# 2-core machine that happens to about one start in three, so a local start is tried again.
START_ATTEMPTS = 3  # local starts tried before the run is refused
_SESSION = re.compile(rb"session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_\d+")  # a Ray start's session name
WATCHDOG_EVERY = 0.25  # seconds between the watchdog's looks at the Ray processes of the driver (see watch_driver)
COORDINATOR = "server shard 0 (the coordinator)"  # as errors name shard 0
KILL_WAIT = 10.0  # seconds a killed actor's process on this machine has to end before it is sent SIGKILL


def owners(keys: np.ndarray, bounds: np.ndarray) -> list[np.ndarray]:
    """For each shard, the positions in ``keys`` of the keys it owns (keys in any order)."""
    owner = np.searchsorted(bounds, keys, side="right") - 1
    return [np.flatnonzero(owner == k) for k in range(len(bounds) - 1)]


def _whereabouts(_actor: Any = None) -> tuple[int, str]:
    """(process id, Ray node id) of the calling actor (an actor's ``ping`` as well)."""
    import ray

    return os.getpid(), ray.get_runtime_context().get_node_id()


class _Changed:
    """Wakes every coroutine waiting for the state to change (usable from plain callbacks)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        """Wake all current waiters."""
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def until(self, ready: Any) -> None:
        """Return once ``ready()`` is true, re-checking after every change."""
        while not ready():
            await self._event.wait()


class _Recorder:
    """The actor that records the run (the coordinator, or the reducer) through a
    :class:`~simlib.contract.ServerRecord`, as the pipes server does; the whole table is :meth:`_table`."""

    def __init__(self, problem: Any, training: Training, evaluate: bool, label: str):
        self.record = ServerRecord(problem, training, evaluate, label, "ray")
        self.t0 = 0.0

    ping = _whereabouts

    async def start(self) -> float:
        """The initial quality, off the clock (the first call loads compiled kernels) and recorded at time 0; then
        the run's clock starts: its wall time t0, returned."""
        await self._metric(at=0.0)
        self.t0 = time.time()
        return self.t0

    async def _record(self, worker: int, c: int, tau: int, applied: bool, lag: int) -> int:
        """One update now, and the quality where it is due (Diverged, which ends the run, if it is not finite);
        returns the update's sequence number."""
        seq = len(self.record.served.updates)
        if self.record.update(time.time() - self.t0, worker, c, tau, applied, lag):
            await self._metric()
        return seq

    async def _metric(self, at: float | None = None) -> np.ndarray:
        """Record the quality of the whole table at run time ``at`` (default: now); returns the table."""
        table = await self._table()
        self.record.metric(time.time() - self.t0 if at is None else at, table)
        return table

    async def _table(self) -> np.ndarray:
        raise NotImplementedError

    async def finish(self) -> tuple[np.ndarray, Trace]:
        """(the whole table, a trace of the updates and the quality points)."""
        return await self._metric(), self.record.served


class RayPSCoordinator(_Recorder):
    """Shard 0: a ParamServer over keys [0, b1) plus the run's clocks, version and records."""

    def __init__(self, params: np.ndarray, problem: Any, protocol: Protocol, training: Training, others: list,
                 evaluate: bool):
        super().__init__(problem, training, evaluate, "ray coordinator")
        n = training.n_workers
        # Arrays arrive as read-only views of Ray's object store: the table needs its own copy.
        self.server = ParamServer(np.array(params), n, protocol, training.rule, read_rule=training.read_rule)
        self.others, self.lag = others, [0] * n
        # NOTE: an asyncio.Event binds to the loop that first waits on it (Python >= 3.10), so it can be made here.
        self._changed = _Changed()

    async def pull(self, worker: int, c: int, keys: np.ndarray) -> tuple[np.ndarray, tuple]:
        """Held until the protocol lets step ``c`` read; (values, (version, lag, decided, held s))."""
        held = 0.0
        if not self.server.may_read(c):
            start = time.perf_counter()
            await self._changed.until(lambda: self.server.may_read(c))
            held = time.perf_counter() - start
        deadline = self.server.clocks.open(c, time.monotonic())
        if deadline is not None:
            asyncio.get_running_loop().call_later(deadline - time.monotonic(), self._expire, c)
        values, version = self.server.pull(keys)
        self.lag[worker] = self.server.clocks.clock_lag(c)
        return values, (version, self.lag[worker], len(self.record.served.updates), held)

    def add_early(self, keys: np.ndarray, deltas: np.ndarray) -> None:
        """Part of a clock's push sent before its end (managed communication): into the table as it is."""
        self.server.add_early(keys, deltas)

    def _expire(self, c: int) -> None:
        if self.server.clocks.expire(c):
            self._changed.notify()

    async def push(self, worker: int, c: int, keys: np.ndarray, deltas: np.ndarray,
                   read_version: int) -> tuple[bool, int, int, int]:
        """Apply (or drop) a push: (applied, tau, its sequence number, complete steps)."""
        applied, tau = self.server.push(c, keys, deltas, read_version)
        self._changed.notify()
        seq = await self._record(worker, c, tau, applied, self.lag[worker])
        return applied, tau, seq, self.server.clocks.completed

    async def _table(self) -> np.ndarray:
        """The whole table: this shard's range followed by the others'."""
        parts = await asyncio.gather(*[s.values.remote() for s in self.others])
        return np.concatenate([self.server.params, *parts])

    async def finish(self) -> tuple[np.ndarray, Trace]:
        """Apply what the step rule still holds; (the table, a trace of the updates and the quality points)."""
        self.server.finish()
        return await super().finish()


class RayPSShard:
    """Shard k >= 1: keys [lo, hi); applies pushes the coordinator decided, serves reads in order."""

    def __init__(self, values: np.ndarray, lo: int, rule: StepRule):
        self.w, self.lo, self.rule = np.array(values), lo, rule
        self.upto = 0  # every push with sequence number < upto has arrived here
        self._seen: set[int] = set()
        self._changed = _Changed()

    ping = _whereabouts

    def values(self) -> np.ndarray:
        """This shard's range of the table."""
        return self.w

    async def pull(self, keys: np.ndarray, meta: tuple) -> np.ndarray:
        """table[keys] once every push decided before the read's gate (``meta[2]``) has arrived."""
        await self._changed.until(lambda: self.upto >= meta[2])
        return self.w[keys - self.lo]

    def add_early(self, keys: np.ndarray, deltas: np.ndarray) -> None:
        """Part of a clock's push sent before its end: into this shard's range as it is."""
        self.w[keys - self.lo] += deltas

    async def add(self, decision: tuple, keys: np.ndarray, deltas: np.ndarray) -> None:
        """table[keys] += rule.scaled(deltas, tau) if the coordinator applied the push (decision)."""
        applied, tau, seq, _ = decision
        if applied and len(keys):
            self.rule.land(self.w, keys - self.lo, deltas, tau)
        self._seen.add(seq)
        while self.upto in self._seen:
            self._seen.discard(self.upto)
            self.upto += 1
        self._changed.notify()


class RayPSWorker(Timed):
    """Worker i: pull, compute the problem's step on the values read, push; records its spans."""

    clock = staticmethod(time.time)  # read on each actor's machine: as good as the nodes' clock synchronisation

    def __init__(self, index: int, problem: Any, shard: Any, coordinator: Any, shards: list, bounds: np.ndarray,
                 training: Training, opts: WorkerOptions):
        super().__init__(index, budget=opts.managed_bandwidth)
        # The shard arrives as read-only views of the object store; worker-local state must be writable.
        self.problem, self.shard, self.training, self.opts = problem, copy.deepcopy(shard), training, opts
        self.coordinator, self.servers, self.bounds = coordinator, [coordinator, *shards], bounds
        self.compressor = worker_compressor(opts.compression, problem.n_params, training.seed, index, KEY_BYTES,
                                            VALUE_BYTES)
        self.early_refs: list = []  # managed communication: early adds the clock's push waits for

    def ready(self) -> tuple[int, str]:
        """One step on the initial table, off the clock (compiled kernels load here); (pid, node id)."""
        # A copy: a step may change worker-local state (LDA's assignments), which the run must not see.
        # The initial values, not zeros: GloVe's AdaGrad divides by its accumulators, which start at 1.
        batch = self.problem.batch(copy.deepcopy(self.shard), 0, self.training.batch_size)
        keys = self.problem.keys(batch)
        values = np.asarray(self.problem.init_params(), dtype=np.float64)[keys]
        self.problem.step(values, batch, keys, self.training.lr)
        return _whereabouts()

    def run(self, t0: float) -> tuple[list[tuple], Any]:
        """All steps of the worker program, this actor its transport; returns the spans (kind, start, end, bytes,
        step) in run seconds and the worker's :func:`~simlib.contract.local_result`."""
        self._start(t0)
        tr = self.training
        plan = Plan(tr.steps, tr.batch_size, tr.lr, clock_batches=self.opts.clock_batches,
                    entry_bytes=KEY_BYTES + VALUE_BYTES)
        drive(ps_worker(self.problem, self.shard, plan, self.compressor), self)
        return self.spans, local_result(self.problem, self.shard)

    def _start(self, t0: float) -> None:
        """The run starts at wall time ``t0``: no spans yet."""
        import ray

        self.ray, self.t0, self.spans = ray, t0, []

    def span(self, kind: str, start: float, end: float, nbytes: int, step: int) -> None:
        self.spans.append((kind, start - self.t0, end - self.t0, nbytes, step))

    def pull(self, effect: Pull) -> tuple[np.ndarray, int]:
        """The coordinator gates; the other shards answer once its reply (an object ref) is ready."""
        start, keys, parts = self.clock(), effect.keys, owners(effect.keys, self.bounds)
        coord, *shards = self.servers
        values_ref, meta_ref = coord.pull.options(num_returns=2).remote(self.i, effect.step, keys[parts[0]])
        refs = [s.pull.remote(keys[part], meta_ref) for s, part in zip(shards, parts[1:])]
        got = self.ray.get([values_ref, meta_ref, *refs])
        values = np.empty(len(keys))
        values[np.concatenate(parts)] = np.concatenate([got[0], *got[2:]])  # the coordinator's range, then each shard's
        version, _, _, held = got[1]
        self.mark = self.clock()
        self.span("wait", start, start + held, 0, effect.step)
        self.span("recv", start + held, self.mark, (KEY_BYTES + VALUE_BYTES) * len(keys), effect.step)
        return values, version

    def send_early(self, step: int, keys: np.ndarray, deltas: np.ndarray, now: float) -> int:
        """Managed communication: the largest pending changes go to their servers, added there as they are (the
        clock's push completes the clock)."""
        # not waited for here (they overlap the next mini-batch); the clock's push waits for them first, so they
        # land before it, as on a FIFO link (an async actor may run one caller's calls out of order)
        self.early_refs += [server.add_early.remote(keys[part], deltas[part])
                            for server, part in zip(self.servers, owners(keys, self.bounds)) if len(part)]
        nbytes = len(keys) * (KEY_BYTES + VALUE_BYTES)
        self.span("send", now, now + 1e-6, nbytes, step)
        return nbytes

    def push(self, effect: Push) -> tuple[bool, int]:
        """The coordinator decides (applied, tau); the other shards apply their part with that decision."""
        if self.early_refs:
            self.ray.get(self.early_refs)
            self.early_refs = []
        keys, deltas = np.asarray(effect.keys), np.asarray(effect.deltas, dtype=np.float64)
        parts = owners(keys, self.bounds)
        coord, *shards = self.servers
        decision = coord.push.remote(self.i, effect.step, keys[parts[0]], deltas[parts[0]], effect.version)
        adds = [s.add.remote(decision, keys[part], deltas[part]) for s, part in zip(shards, parts[1:])]
        applied, _, _, completed = self.ray.get([decision, *adds])[0]
        self.span("send", self.mark, self.clock(), effect.nbytes, effect.step)
        return applied, completed


class RayReducer(_Recorder):
    """Protocol 'allreduce': where the workers meet. Bucket k of step c is summed over the n workers and every one
    gets the sum back (a direct all-reduce through the object store); the sum is added to this actor's replica,
    whose quality it records."""

    def __init__(self, params: np.ndarray, problem: Any, training: Training, evaluate: bool):
        super().__init__(problem, training, evaluate, "ray reducer")
        self.w, self.n = np.array(params), training.n_workers
        self.sums: dict[tuple[int, int], list] = {}  # (step, bucket) -> [sum, contributions, takers, summed event]

    async def reduce(self, c: int, k: int, keys: Any, x: np.ndarray) -> np.ndarray:
        """The sum of bucket k of step c over every worker, once all n have sent theirs."""
        entry = self.sums.get((c, k))
        if entry is None:
            entry = self.sums[(c, k)] = [np.array(x), 1, 0, asyncio.Event()]
        else:
            entry[0] += x
            entry[1] += 1
        if entry[1] == self.n:
            self.w[keys] += entry[0]
            entry[3].set()
        await entry[3].wait()
        entry[2] += 1
        if entry[2] == self.n:
            del self.sums[(c, k)]
        return entry[0]

    async def done(self, worker: int, c: int) -> None:
        """Worker ``worker`` has step c's sums in its replica: one update (tau 0), the quality where it is due."""
        await self._record(worker, c, 0, True, 0)

    async def _table(self) -> np.ndarray:
        """The replica."""
        return self.w


class RayReplicaWorker(RayPSWorker):
    """Worker i under all-reduce: its own replica; each bucket goes to the reducer as soon as the backward pass has
    it (with ``overlap`` the pass goes on meanwhile), and the sums are added to the replica at the step's end."""

    def run(self, t0: float) -> tuple[list[tuple], Any]:
        """All steps of the all-reduce worker program; returns the spans (kind, start, end, bytes, step) and the
        worker's :func:`~simlib.contract.local_result`."""
        self._start(t0)
        self.pending, self.done = [], []
        self.w = np.array(self.problem.init_params(), dtype=np.float64)
        tr = self.training
        drive(allreduce_worker(self.problem, self.shard, Plan(tr.steps, tr.batch_size, tr.lr),
                               bucket_bytes=self.opts.bucket_bytes), self)
        self.ray.get(self.done)  # every update recorded before the driver asks for the trace
        return self.spans, local_result(self.problem, self.shard)

    def pull(self, effect: Pull) -> tuple[np.ndarray, int]:
        return self.w[effect.keys], 0

    def all_reduce(self, effect: AllReduce) -> None:
        self.bucket(dense_bucket(effect, len(self.w)))

    def bucket(self, effect: Bucket) -> None:
        x = np.asarray(effect.deltas, dtype=np.float64)
        self.pending.append((effect, self.coordinator.reduce.remote(effect.step, effect.index, effect.keys, x),
                             self.clock()))
        if not self.opts.overlap:
            self._land()

    def reduced(self, effect: Reduced) -> None:
        self._land()
        self.done.append(self.coordinator.done.remote(self.i, effect.step))

    def _land(self) -> None:
        """Each pending bucket's sum, in order, into the replica; its all-reduce recorded as one send span."""
        for bucket, ref, start in self.pending:
            self.w[bucket.keys] += self.ray.get(ref)
            self.span("send", start, self.clock(), int(bucket.deltas.nbytes), bucket.step)
        self.pending = []


def connect(address: str | None, num_cpus: int | None) -> bool:
    """Connect to Ray; True if this call started a local instance (to be shut down after the run)."""
    import ray

    named = address is not None and address != "auto" and "://" not in address  # RayOptions checked its form
    host, _, port = (address or "").rpartition(":")
    if ray.is_initialized():
        here = ray.get_runtime_context().gcs_address
        if named and not _same_endpoint(here, address, {ray.util.get_node_ip_address()}):
            raise ValueError(f"address: this process is already connected to the Ray cluster at {here}, not "
                             f"{address}; call ray.shutdown() first, or leave address out to run there")
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address is not None:
        if named:
            _check_reachable(host, port)
        with _interruptible_start():
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        return False
    began = time.monotonic()
    for attempt in range(START_ATTEMPTS):
        before = _children()
        try:
            with _interruptible_start():
                ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False,
                         logging_level=logging.WARNING, log_to_driver=False, ignore_reinit_error=True)
            return True
        except BaseException as exc:  # a bare Exception when the node was slow to start; or Ctrl-C, SIGTERM
            _stop_local(before)
            if not isinstance(exc, Exception):
                raise
            if attempt == START_ATTEMPTS - 1:
                # NOTE: Ray gives a raylet a fixed 30 s to register; a machine busy far past its cores
                # (load average 12 on 2 cores in a loaded test run) misses it every time.
                raise RuntimeError(
                    f"ray: a local Ray did not start in {START_ATTEMPTS} tries ({time.monotonic() - began:.0f} s; "
                    f"the last said: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); this machine's "
                    f"load average is {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: run again when it is less "
                    "busy, or pass address= of a running cluster") from exc
    return True


def _same_endpoint(a: str, b: str, local: set[str]) -> bool:
    """Whether 'host:port' ``a`` and ``b`` name one listener: the same port, and hosts that share an address
    or both belong to this machine (loopback, its host name's addresses, or ``local``: Ray reports the
    node's IP where a user may write 127.0.0.1)."""
    (host_a, _, port_a), (host_b, _, port_b) = a.rpartition(":"), b.rpartition(":")
    if port_a != port_b:
        return False
    ips_a, ips_b = _addresses(host_a), _addresses(host_b)
    here = local | _addresses(socket.gethostname())
    return bool(ips_a & ips_b) or all(ip.startswith("127.") or ip == "::1" or ip in here for ip in ips_a | ips_b)


def _addresses(host: str) -> set[str]:
    """The IP addresses ``host`` resolves to (itself if it does not resolve)."""
    try:
        return {info[4][0] for info in socket.getaddrinfo(host.strip("[]"), None)}
    except OSError:
        return {host}


def _check_reachable(host: str, port: str, wait: float = 5.0) -> None:
    """Refuse an address no process listens on: Ray itself retries such an address for minutes, in C,
    deaf to Ctrl-C and SIGTERM meanwhile."""
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=wait).close()
    except OSError as e:
        raise ConnectionError(f"ray: no Ray cluster answers at {host}:{port} ({e.strerror or e}); start one there "
                              f"with 'ray start --head --port={port}', or check the address") from None


@contextmanager
def _interruptible_start() -> Iterator[None]:
    """``ray.init`` that Ctrl-C and SIGTERM end cleanly, whenever they land.

    NOTE (Ray 2.60): ``ray.init`` has two places a signal must not reach. Starting the node's
    programs runs this process's fork hooks, where Python drops a KeyboardInterrupt (the Ctrl-C
    was lost and the run went on); :func:`simlib.signals.guard_forks` sends it again after the
    fork. And the driver's core worker calls back into Python while its C++ constructor runs
    (``ray._private.worker.connect``, about 2 s of a 7 s start on a 2-core machine): a
    KeyboardInterrupt raised there leaves it half built, and the interpreter crashes on its way
    out (SIGSEGV, or SIGABRT "terminate called without an active exception"). So the connection is
    made inside :func:`simlib.signals.held`: a signal that lands then ends the run once it is made.
    """
    from ray._private import utils, worker

    make, set_handler = worker.connect, utils.set_sigterm_handler

    def connect_held(*args: Any, **kwargs: Any) -> Any:
        with signals.held():
            return make(*args, **kwargs)

    worker.connect = connect_held
    # instead of Ray's, and behind the fork guard: raised inside a fork hook (logging's lock release runs there) the
    # exit was dropped and the run went on (1 start in 4 took a SIGTERM that way, and ran until killed)
    utils.set_sigterm_handler = lambda handler: signals.install(signal.SIGTERM, _on_sigterm)
    try:
        with signals.guard_forks():
            yield
    finally:
        worker.connect, utils.set_sigterm_handler = make, set_handler


_terminated = False  # a SIGTERM reached this driver during a run


def _on_sigterm(signum: int, frame: Any) -> None:
    """The driver's SIGTERM: exit with status 128 + 15, as the other real substrates do.

    NOTE: Ray's own handler exits with status 15, and an exit raised while Ray waits (ray.get,
    ray.wait) comes out of the wait as SystemExit(1); so the signal is remembered, and :func:`run`
    turns whatever Ray made of it back into SystemExit(143).
    """
    global _terminated
    _terminated = True
    raise SystemExit(128 + signum)


def _read(path: str) -> bytes:
    """The contents of a /proc file; empty if it cannot be read (its process is gone)."""
    with contextlib.suppress(OSError), open(path, "rb") as f:
        return f.read()
    return b""


def _children(pid: int | str = "self") -> set[int]:
    """Pids of a process's live children (Linux /proc; empty where there is none)."""
    return {int(p) for path in glob.glob(f"/proc/{pid}/task/*/children") for p in _read(path).split()}


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants, parents first."""
    return [pid, *(p for child in _children(pid) for p in _tree(child))]


def _stop_local(before: set[int]) -> None:
    """Shut down the local Ray this process started, with every process it had started."""
    import ray

    ray.shutdown()
    # NOTE: a start cut short (Ctrl-C, SIGTERM, the raylet's start-up timeout) leaves the GCS, the
    # dashboard and the monitor running, unknown to ray.shutdown(): the node object that would stop
    # them was never returned. And a raylet killed before its workers and agents orphans them. So
    # every new child whose command line is Ray's goes, with all its descendants, gathered first.
    home = os.path.dirname(ray.__file__).encode()
    strays = [p for pid in _children() - before if home in _read(f"/proc/{pid}/cmdline") for p in _tree(pid)]
    for pid in strays:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    for pid in strays:  # reap this process's own children, so no zombie is left either
        with contextlib.suppress(ChildProcessError):  # not our child (a descendant): its own parent or init reaps it
            while not os.waitpid(pid, os.WNOHANG)[0] and time.monotonic() < deadline:
                time.sleep(0.01)


def _started(pid: int) -> bytes:
    """Process ``pid``'s start time (clock ticks since boot, /proc/<pid>/stat field 22); empty once it is gone."""
    fields = _read(f"/proc/{pid}/stat").rsplit(b")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else b""


def _watchdog() -> subprocess.Popen:
    """A process that kills the Ray processes this driver starts if the driver dies without stopping them (kill -9).

    Its own session, so a terminal's Ctrl-C leaves it to the driver, which stops it after stopping its Ray.
    """
    import ray

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout, above simlib/
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    code = "import sys; from simlib.substrates.ray import watch_driver; watch_driver(int(sys.argv[1]), sys.argv[2])"
    return subprocess.Popen([sys.executable, "-c", code, str(os.getpid()), os.path.dirname(ray.__file__)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def watch_driver(driver: int, home: str, every: float = WATCHDOG_EVERY) -> None:
    """The watchdog (its own process): note every ``every`` s the Ray processes ``driver`` started (its children
    running code under Ray's ``home``, and all their descendants); once the driver has ended, kill those still running.

    NOTE: the GCS and the raylet end with the driver, but the raylet's agents (ray::DashboardAgent,
    ray::RuntimeEnvAgent), orphaned, outlived a driver killed with SIGKILL by 60-66 s. They are noted while the
    driver lives because once it (and the raylet) has died they are no longer anyone's descendants here.
    """
    from simlib.signals import watch

    ended, me, seen, sessions = watch(driver), os.getpid(), {}, set()
    while not ended(every):
        for child in _children(driver) - {me}:
            if home.encode() in _read(f"/proc/{child}/cmdline"):
                for p in _tree(child):
                    if p not in seen:
                        seen[p] = _started(p)
                        sessions.update(_SESSION.findall(_read(f"/proc/{p}/cmdline")))
    # NOTE: an agent the raylet started within the last look was never seen; every Ray process of this start names
    # its session (its logs' folder) in its command line, and no other start's does, so those are swept up too.
    for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
        if pid not in seen and pid != me and any(name in _read(f"/proc/{pid}/cmdline") for name in sessions):
            seen[pid] = _started(pid)
    for pid, start in seen.items():
        if start and _started(pid) == start:  # the same process, not a later one given its pid
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _resources(placement: str) -> tuple[dict, dict]:
    """Custom resources for server and worker actors under ``placement``."""
    import ray

    have = ray.cluster_resources()
    marked = "server" in have and "worker" in have
    if placement == "resources" and not marked:
        raise ValueError("placement='resources' needs nodes started with the custom resources 'server' and 'worker' "
                         "(ray start --resources='{\"server\": 1}'); this cluster has "
                         f"{sorted(k for k in have if not k.startswith('node:'))}")
    if placement == "any" or not marked:
        return {}, {}
    return {"server": ACTOR_SHARE}, {"worker": ACTOR_SHARE}


@dataclass(frozen=True)
class RayOptions(WorkerOptions):
    """The substrate's own options, ``simlib.run(..., substrate="ray", **options)``, beside the worker program's."""

    address: str | None = None  # a Ray cluster to join (None: a local Ray for this run)
    n_servers: int = 1  # server shards (key ranges)
    placement: str = "auto"  # 'auto' | 'resources' | 'any' (module docstring)
    # seconds from the actors' placement to the run's end, their start included (TimeoutError); a local Ray's own
    # start comes before and is not counted (its tries bound it: it took 100 s at load 12 on 2 cores)
    timeout: float | None = 120.0
    evaluate: bool = True  # False: the metric at the start and the end only
    num_cpus: int | None = None  # the local Ray's CPUs (default: the machine's)

    def __post_init__(self) -> None:
        super().__post_init__()
        check.positive_int("n_servers", self.n_servers)
        check.one_of("placement", self.placement, PLACEMENTS)
        if self.timeout is not None:
            check.positive("timeout", self.timeout)
        host, sep, port = str(self.address).rpartition(":")
        if self.address is not None and not (isinstance(self.address, str) and (
                self.address == "auto" or "://" in self.address or sep and host and port.isdigit()
                and 0 < int(port) < 65536)):
            raise ValueError(f"address must be 'host:port' of a Ray head node (e.g. '10.0.0.1:6379') or 'auto', "
                             f"got {self.address!r}")
        check.boolean("evaluate", self.evaluate)
        if self.num_cpus is not None:  # Ray took -1 and "2" and failed three starts later, blaming the machine's load
            check.positive_int("num_cpus", self.num_cpus)

    def check_run(self, problem: Any, protocol: Protocol, training: Training) -> None:
        """ValueError naming the option that cannot run this problem under this protocol and training."""
        if self.n_servers > problem.n_params:
            raise ValueError(f"n_servers must be <= the table's {problem.n_params} keys, got {self.n_servers}")
        if self.n_servers > 1 and training.rule.group_size(training.n_workers) != 1:
            raise ValueError("accumulation: averaging pushes over several server shards is not supported; "
                             "use n_servers=1")
        if protocol.kind == "allreduce" and self.n_servers > 1:
            raise ValueError("n_servers: protocol 'allreduce' has no server shards (one reducer actor); "
                             "use n_servers=1")


def run(problem: Any, protocol: Protocol, training: Training, **options: Any) -> Result:
    """The substrate entry point (``simlib.run(..., substrate="ray")``); ``options``: :class:`RayOptions`."""
    opts = check.options(RayOptions, options, "substrate 'ray'")
    opts.check_run(problem, protocol, training)
    ring = protocol.kind == "allreduce"  # a reducer actor and replica workers instead of server shards
    n = training.n_workers
    data_shards = problem.shards(n)  # raises ValueError naming n_workers if too many
    import ray

    # Decided before connecting: a Ctrl-C that lands just after a local Ray came up still shuts it down.
    started_here = opts.address is None and not ray.is_initialized()
    if started_here and opts.placement == "resources":  # named before a start (25-100 s on a busy machine) in vain
        raise ValueError("placement='resources' needs a cluster whose nodes carry the custom resources 'server' and "
                         "'worker' (address= of one started with ray start --resources=...); the local Ray a run "
                         "starts has none")
    before = _children()
    watchdog = _watchdog() if started_here else None
    actors: list = []
    global _terminated
    _terminated = False
    try:
        connect(opts.address, opts.num_cpus)
        server_res, worker_res = _resources(opts.placement)
        bounds = key_bounds(problem.n_params, opts.n_servers)
        table = np.asarray(problem.init_params(), dtype=np.float64)
        prob_ref = ray.put(problem)

        def actor(cls: type, resources: dict) -> Any:  # no CPU reservation, no restart (module docstring)
            return ray.remote(cls).options(num_cpus=0, resources=resources, max_restarts=0)

        shard_cls = actor(RayPSShard, server_res)
        shards = [shard_cls.remote(table[bounds[k]:bounds[k + 1]], int(bounds[k]), training.rule)
                  for k in range(1, opts.n_servers)]
        actors += shards
        coord = (actor(RayReducer, server_res).remote(table, prob_ref, training, opts.evaluate) if ring else
                 actor(RayPSCoordinator, server_res).remote(table[:bounds[1]], prob_ref, protocol, training, shards,
                                                            opts.evaluate))
        actors.append(coord)
        worker_cls = actor(RayReplicaWorker if ring else RayPSWorker, worker_res)
        workers = [worker_cls.remote(i, prob_ref, data_shards[i], coord, shards, bounds, training, opts)
                   for i in range(n)]
        actors += workers
        servers, names = [coord, *shards], [COORDINATOR, *(f"server shard {k}" for k in range(1, opts.n_servers))]
        placing = time.monotonic()  # timeout= bounds the run from here: its actors' start included
        pids, local = _ready(ray, servers, names, workers, placing, opts.timeout)
        setup = time.monotonic() - placing
        t0 = _call(ray, coord.start.remote(), COORDINATOR, servers)
        started = time.monotonic()
        out = _wait(ray, [w.run.remote(t0) for w in workers], [f"worker {i}" for i in range(n)],
                    None if opts.timeout is None else placing + opts.timeout, servers, local,
                    f"did not finish within timeout={opts.timeout} s")
        params, served = _call(ray, coord.finish.remote(), COORDINATOR, servers)
        wall = time.monotonic() - started
    except BaseException:
        if _terminated:
            raise SystemExit(128 + signal.SIGTERM) from None
        raise
    finally:
        _kill(ray, actors)
        if started_here:
            _stop_local(before)
            watchdog.kill()
            watchdog.wait()
    trace = new_trace(problem, protocol, training, "ray", "on Ray", n_servers=opts.n_servers, wall_seconds=wall,
                      substrate_detail="Ray actors: parameter-server shards and workers")
    # a diverged run fails as on every substrate, at its first non-finite quality point
    worker_seconds = served_trace(trace, ((i, *s) for i, (spans, _) in enumerate(out) for s in spans), served,
                                  problem, training.lr)
    return Result(trace, params, {"wall_seconds": wall, "actors": pids, "setup_seconds": setup,
                                  "worker_seconds": worker_seconds, "local": [local for _, local in out]})


run.options = RayOptions  # type: ignore[attr-defined]  # simlib.run checks the option names against its fields


def _kill(ray: Any, actors: list, within: float = KILL_WAIT) -> None:
    """Kill every actor of the run, even if Ray already lost some of them; the processes of those on this machine
    have ended when it returns (SIGKILL for any still there ``within`` s after ray.kill).

    NOTE: ray.kill only asks: right after it the processes still ran (they ended 50 ms later), so a run that
    raised (Diverged) left them running for the caller, whose own Ray nothing else stops.
    """
    from ray._private.state import actors as table  # the cluster's record of each actor: its machine and pid

    if not actors:  # the run failed before it made any (Ray may not even be connected)
        return
    here, running = ray.util.get_node_ip_address(), {}
    for a in actors:
        with contextlib.suppress(Exception):  # an actor Ray cannot reach is gone with its node; kill the rest
            ray.kill(a, no_restart=True)
        with contextlib.suppress(Exception):  # (the record keeps the pid of an actor killed)
            where = table(a._actor_id.hex())
            if where["Address"]["IPAddress"] == here and where["Pid"] > 0:
                running[where["Pid"]] = _started(where["Pid"])

    def left() -> list[int]:  # the same processes (not later ones given their pids), not yet ended
        return [p for p, t in running.items() if t and _started(p) == t and not _gone(p)]

    deadline = time.monotonic() + within
    while left() and time.monotonic() < deadline:
        time.sleep(0.01)
    for pid in left():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _ready(ray: Any, servers: list, names: list[str], workers: list, placing: float,
           timeout: float | None) -> tuple[dict[str, list], dict[int, str]]:
    """Wait, up to ``timeout`` s from ``placing`` (None: READY_TIMEOUT), for every actor to be placed and warmed up:
    their (pid, node id) by role, and the actors on this machine (the driver's node) as pid -> the name an error
    gives it."""
    names = [*names, *(f"worker {i}" for i in range(len(workers)))]
    within = f"{READY_TIMEOUT:g} s" if timeout is None else f"timeout={timeout:g} s"
    pids = _wait(ray, [s.ping.remote() for s in servers] + [w.ready.remote() for w in workers], names,
                 placing + (READY_TIMEOUT if timeout is None else timeout), [], {},
                 f"not placed and started within {within}; does the cluster have the resources placement asks for? "
                 "(ray.cluster_resources())")
    here = ray.get_runtime_context().get_node_id()
    local = {pid: name for name, (pid, node) in zip(["server shard 0", *names[1:]], pids) if node == here}
    return {"servers": pids[:len(servers)], "workers": pids[len(servers):]}, local


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (no longer listed, or a zombie waiting for its parent)."""
    state = _read(f"/proc/{pid}/stat").rsplit(b")", 1)[-1].split()[:1]
    return state in ([], [b"Z"])


def _wait(ray: Any, refs: list, names: list[str], deadline: float | None, servers: list, local: dict[int, str],
          late: str) -> list:
    """The answers to ``refs`` (``names[k]`` answers the k-th), looked at one at a time, so that the first actor
    that died or raised fails the run at once, naming it; past ``deadline`` (time.monotonic(); None: none) a
    TimeoutError naming those not done, ``late``.

    The ``servers`` are pinged every WATCH_S seconds as well: a worker blocked on a dead server learns of
    the death only as fast as Ray tells it (seconds on a busy machine), and the run should not wait.
    The actor processes on this machine (``local``: pid -> name) are looked at as often: on a loaded
    machine Ray took up to 15 s to report an actor killed by a signal, a look at /proc takes none.
    """
    got: dict[Any, Any] = {}
    pings: dict[Any, int] = {}  # an unanswered ping -> the server shard it went to
    due = [0.0] * len(servers)  # when each shard is pinged next
    pending = list(refs)
    while pending:
        now = time.monotonic()
        for k, s in enumerate(servers):
            if due[k] <= now and k not in pings.values():
                pings[s.ping.remote()] = k
                due[k] = now + WATCH_S
        left = float("inf") if deadline is None else deadline - now
        if left <= 0:
            raise TimeoutError(f"ray: {', '.join(names[refs.index(r)] for r in pending)} {late}")
        for pid, name in local.items():
            if _gone(pid):
                raise _died(name, f" (its actor process {pid} ended)")
        done, _ = ray.wait(pending + list(pings), num_returns=1, timeout=min(left, WATCH_S))
        for ref in done:
            if ref in pings:
                k = pings.pop(ref)
                try:
                    # ActorUnavailableError: unreachable for now, not dead (Ray says which): ask again at the next ping
                    with contextlib.suppress(ray.exceptions.ActorUnavailableError):
                        ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    raise _died(f"server shard {k}") from e
            else:
                pending.remove(ref)
                got[ref] = _call(ray, ref, names[refs.index(ref)], servers)
    return [got[r] for r in refs]


def _died(name: str, how: str = "") -> RuntimeError:
    """The error for actor ``name`` (a server shard or a worker) that died mid-run: why the run cannot go on."""
    why = ("its part of the table is lost, so the run cannot continue" if name.startswith("server") else
           "the run fails fast rather than replay its step on a table that moved on")
    return RuntimeError(f"ray: {name} died mid-run{how}; {why}")


def _call(ray: Any, ref: Any, who: str, servers: list = ()) -> Any:
    """ray.get that names ``who`` if its actor died or raised; where it raised, a dead one of ``servers`` (called by
    a worker) is named instead."""
    try:
        return ray.get(ref)
    # NOTE: first, as Ray raises an actor's error as a subclass of both RayTaskError and its cause: a worker whose
    # server died raised an ActorDiedError, a RayActorError too, and was named as the one that died
    except ray.exceptions.RayTaskError as e:  # the actor ran and raised: a server it called died, or the problem failed
        diverged = _diverged(e)
        if diverged is not None:  # the run's result, as on every substrate: the recorder's Diverged, unwrapped
            raise diverged from None
        for k, s in enumerate(servers):
            try:
                ray.get(s.ping.remote(), timeout=10)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                raise _died(f"server shard {k}") from e
        raise RuntimeError(f"ray: {who} failed: {_cause(e)}\n{e}") from e
    except ray.exceptions.RayActorError as e:
        raise _died(who, " (its actor process ended)") from e


def _diverged(error: Any) -> Diverged | None:
    """The Diverged that ``error`` carries (an actor's error wraps the one it got from the recorder), or None."""
    while error is not None and type(error) is not Diverged:
        error = getattr(error, "cause", None)
    return None if error is None else Diverged(*error.args)


def _cause(error: Any) -> str:
    """'Class: message' of the exception an actor raised (Ray's own text is a traceback in colour)."""
    cause = getattr(error, "cause", None) or error
    return f"{type(cause).__name__}: {cause}".splitlines()[0]


"""A group of worker processes that fails fast and leaves nothing behind.

:meth:`WorkerGroup.run` starts N processes, calls a top-level ``fn(worker_id, n_workers, *args)``
in each and returns their results in worker order. The parent waits on every worker's result
pipe and process sentinel at once (``multiprocessing.connection.wait``), so:

* a worker that raises stops the run: the others are terminated, then killed if they linger,
  and the parent raises :class:`WorkerError` with the worker's id, role (``roles``: what a user
  calls each member, such as 'parameter server'; 'worker i' by default) and traceback text;
* a worker that dies without a word (SIGKILL, segfault, ``os._exit``) is noticed as soon as its
  sentinel fires (well within a second) and reported as :class:`WorkerDied` with its exit code;
* Ctrl-C (KeyboardInterrupt) or SIGTERM in the parent does the same clean-up and re-raises;
* after any failure, every shared array the group made is unlinked.

Workers are daemon processes, ignore SIGINT (the parent decides), and on Linux ask the kernel to
kill them if the parent dies (``PR_SET_PDEATHSIG``), so no worker outlives its parent.
"""
from __future__ import annotations

import ast
import contextlib
import ctypes
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from simlib import _validate as check
from simlib.backend import one_blas_thread
from simlib.diverged import Diverged
from simlib.parallel import log as _log
from simlib import signals as _signals
from simlib.parallel import worker as _worker
from simlib.parallel.channel import Channel, channel_pair
from simlib.parallel.shm import SharedArray
from simlib.trace import Trace

_RESEND = 0.05  # seconds between SIGTERMs to a worker that has not yet stopped
# NOTE: processes a group may start, per CPU of this machine (os.cpu_count(): the machine's, not its load). Past a few
# per CPU more processes only queue for the cores, each a start and its memory: on 2 busy cores 1,000 workers did not
# finish 3 steps of logistic regression in 25 s, and shm's all-reduce took 2.4 s for 32 workers, 11.5-15.8 s for 64.
PROCESSES_PER_CPU = 16
START_METHODS = tuple(m for m in ("fork", "spawn", "forkserver") if m in multiprocessing.get_all_start_methods())


class WorkerError(RuntimeError):
    """A worker failed; ``worker_id`` (its place in the group), ``role``, ``exitcode`` and ``traceback_text`` say how."""

    def __init__(self, worker_id: int, message: str, traceback_text: str = "", exitcode: int | None = None,
                 role: str | None = None):
        self.worker_id = worker_id
        self.role = role or f"worker {worker_id}"
        self.exitcode = exitcode
        self.traceback_text = traceback_text
        detail = f"\n--- traceback in {self.role} ---\n{traceback_text}" if traceback_text else ""
        super().__init__(f"{self.role} failed: {message}{detail}")


class WorkerDied(WorkerError):
    """A worker process ended without reporting a result (killed, crashed, exited early)."""


def _set_parent_death_signal() -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies (no orphans)."""
    with contextlib.suppress(OSError, AttributeError):  # no prctl (not Linux), or an exotic libc
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


class _Launch(NamedTuple):
    """What every worker of one :meth:`WorkerGroup.run` is started with."""

    fn: Callable[..., Any]
    n_workers: int
    t0: float  # the group's clock origin (perf_counter)
    parent_pid: int
    log_queue: Any
    verbose: bool
    args: tuple[Any, ...]  # the arguments every worker gets, before its own


class _Later:
    """Stands in a spawned worker's arguments for one sent after it started (they come in the order they stand)."""


class _NoHandles(ForkingPickler):
    """Refuses connections and sockets: pickled outside a spawn they hand a file descriptor to a sharer thread
    that waits for a process to collect it, which a value kept for spawn time never does."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (Connection, socket.socket)):
            raise TypeError(f"{type(obj).__name__}: passed at spawn time")
        return NotImplemented


def _defer(values: tuple[Any, ...], blobs: list[bytes]) -> tuple[Any, ...]:
    """``values`` with each one that pickles here replaced by a _Later, its bytes added to ``blobs``.

    Why: spawn writes a new process's pickled arguments down a pipe whose reading end the parent
    holds until the write ends, so a worker that dies before reading them (its copy of the main
    file raising, say) left the parent blocked in start() forever once they passed the pipe's
    64 KB. Sent after the start, from a thread, a dead worker is seen by the run's wait as usual.
    Values that only pickle while a process is being spawned (queues, locks) stay where they were.
    """
    out = []
    for value in values:
        try:
            blobs.append(bytes(_NoHandles.dumps(value)))
            value = _Later()
        except Exception:  # noqa: BLE001 - inheritance-only, or unpicklable: start() raises or passes it
            pass
        out.append(value)
    return tuple(out)


def _send_later(conn: Connection, blobs: list[bytes]) -> None:
    """The sending thread: ``blobs`` down ``conn`` in order, then close it; a worker gone first ends it quietly."""
    with conn, contextlib.suppress(OSError):  # OSError: the worker died or was stopped, which the run reports
        for blob in blobs:
            conn.send_bytes(blob)


def _take_later(inbox: Connection, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values`` with every _Later replaced by the next value read from ``inbox``."""
    return tuple(ForkingPickler.loads(inbox.recv_bytes()) if isinstance(v, _Later) else v for v in values)


def _bootstrap(launch: _Launch, worker_id: int, conn: Connection, own_args: tuple[Any, ...],
               inbox: Connection | None = None) -> None:
    """Entry point of every worker: run ``fn`` and send ("ok", result, records) or ("error", ...).

    ``inbox``: under spawn, where the arguments that pickle come once the worker is running (see :func:`_defer`).
    """
    fn, n_workers, t0, parent_pid, log_queue, verbose, args = launch
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # _exit_on_sigterm's last resort
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # not the parent's handlers, inherited under fork
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _CHILD_SIGNALS)  # blocked around the fork: one sent since arrives now
    _signals.forked()
    _set_parent_death_signal()
    if os.getppid() != parent_pid:  # a forkserver's worker: its parent is the server, which outlives the group
        _exit_with(parent_pid)
    if inbox is not None:
        args, own_args = _take_later(inbox, args), _take_later(inbox, own_args)
        inbox.close()
    _log.worker_setup(log_queue, verbose)
    ctx = _worker.WorkerContext(worker_id, n_workers, t0)
    _worker._install(ctx)
    try:
        message: tuple[Any, ...] = ("ok", fn(worker_id, n_workers, *args, *own_args), ctx.records())
    except BaseException as exc:  # noqa: BLE001 - everything is reported to the parent
        # Divergence is the run's result, not a crash: the parent raises the same Diverged.
        message = ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(),
                   exc if isinstance(exc, Diverged) else None)
    _log.worker_flush(log_queue)
    try:
        conn.send(message)
    except Exception as exc:  # the result could not be pickled
        conn.send(("error", f"could not send the result back: {type(exc).__name__}: {exc}", traceback.format_exc()))
    conn.close()


def _exit_with(pid: int) -> None:
    """End this worker when process ``pid`` ends (at once if it has): the parent-death signal covers only a
    worker's own parent, and a forkserver worker's parent is the server, not the group's process."""
    ended = _signals.watch(pid)

    def wait_for_it() -> None:
        ended(None)
        os._exit(1)

    threading.Thread(target=wait_for_it, name="group-watch", daemon=True).start()


def check_processes(n: int, who: str, name: str = "n_workers") -> None:
    """ValueError naming ``name`` where ``who`` (a substrate, a group) would start ``n`` processes, more than
    PROCESSES_PER_CPU per CPU of this machine."""
    cpus = os.cpu_count() or 1
    if n > PROCESSES_PER_CPU * cpus:
        raise ValueError(f"{name}: {who} would start {n} processes, more than {PROCESSES_PER_CPU * cpus} "
                         f"({PROCESSES_PER_CPU} per CPU, {cpus} CPUs here), which only queue for the CPUs; "
                         "the simulator (substrate 'sim') takes up to 1,000,000 workers")


class WorkerGroup:
    """N worker processes plus the shared state they use; a context manager that cleans up.

    Example (functions run in workers must be importable, i.e. defined at module top level)::

        with WorkerGroup(2, start_method="spawn") as group:
            w = group.zeros(1000)                      # shared float64 array, unlinked at exit
            results = group.run(fit_shard, w, 0.1)     # fit_shard(worker_id, n_workers, w, 0.1)
            group.trace.summary()
    """

    def __init__(self, n_workers: int, start_method: str | None = None, *, verbose: bool = False,
                 label: str = "parallel", poll_interval: float = 0.05, grace: float = 1.0,
                 roles: Sequence[str] | None = None):
        check.positive_int("n_workers", n_workers)
        check_processes(n_workers, f"a {label!r} group")
        if roles is not None and len(roles) != n_workers:
            raise ValueError(f"roles must name each of the {n_workers} members, got {len(roles)}")
        if start_method is not None:
            check.one_of("start_method", start_method, START_METHODS)
        check.positive("poll_interval", poll_interval)
        check.positive("grace", grace)
        self.n_workers = int(n_workers)
        self.roles = list(roles) if roles is not None else [f"worker {i}" for i in range(self.n_workers)]  # for errors
        self.ctx = multiprocessing.get_context(start_method)
        self.start_method = self.ctx.get_start_method()
        _check_main_can_be_rerun(self.start_method)
        self.verbose = bool(verbose)
        self.poll_interval = float(poll_interval)
        self.grace = float(grace)
        self.trace = Trace(label, "parallel", self.n_workers, meta={"start_method": self.start_method})
        self.t0: float | None = None
        self._arrays: list[SharedArray] = []
        self._procs: list[BaseProcess] = []

    # -- shared state ----------------------------------------------------------------------
    def zeros(self, shape: int | tuple[int, ...], dtype: Any = np.float64) -> SharedArray:
        """A zero-filled shared array that this group unlinks when it closes or fails."""
        with _signals.held():  # no Ctrl-C between making the segment and owning it
            self._arrays.append(SharedArray.zeros(shape, dtype))
        return self._arrays[-1]

    def copy_of(self, a: np.ndarray) -> SharedArray:
        """A shared copy of ``a`` that this group unlinks when it closes or fails."""
        with _signals.held():
            self._arrays.append(SharedArray.copy_of(a))
        return self._arrays[-1]

    def lock(self) -> Any:
        """A process lock from this group's start-method context."""
        return self.ctx.Lock()

    def barrier(self, parties: int | None = None) -> Any:
        """A barrier for ``parties`` processes (default: all workers)."""
        return self.ctx.Barrier(parties or self.n_workers)

    def channel_pair(self, duplex: bool = True) -> tuple[Channel, Channel]:
        """Two connected byte-counting channels (see :mod:`simlib.parallel.channel`)."""
        return channel_pair(self.ctx, duplex)

    def now(self) -> float:
        """Seconds since this group's first run started (0 before it)."""
        return 0.0 if self.t0 is None else time.perf_counter() - self.t0

    # -- running ---------------------------------------------------------------------------
    # The workers share the cores, so forked ones start with one BLAS thread: the parent holds its BLAS at one for
    # the run (they inherit it). Set inside a forked child instead, OpenBLAS starts a thread pool whose spinning
    # made each step of a 2-worker BSP run on shared memory about 1 ms slower.
    @one_blas_thread()
    def run(self, fn: Callable[..., Any], *args: Any, worker_args: Sequence[tuple[Any, ...]] | None = None,
            monitor: Callable[[float], None] | None = None, monitor_every: float = 0.1,
            timeout: float | None = None) -> list[Any]:
        """Run ``fn(worker_id, n_workers, *args, *worker_args[worker_id])`` in every worker; results in order.

        ``monitor(seconds_since_start)`` is called in the parent about every ``monitor_every``
        seconds while workers run and once after they finish (for example to snapshot shared
        weights). ``timeout`` (seconds) stops the run with TimeoutError.
        """
        if not callable(fn):
            raise ValueError(f"fn must be callable, got {fn!r}")
        if worker_args is not None and len(worker_args) != self.n_workers:
            raise ValueError(f"worker_args must have one tuple per worker ({self.n_workers}), got {len(worker_args)}")
        check.positive("monitor_every", monitor_every)
        if timeout is not None:
            check.positive("timeout", timeout)
        handler = _log.parent_handler(self.ctx)
        _log.set_verbose(self.verbose)
        if self.t0 is None:
            self.t0 = time.perf_counter()
        trap = _Trap()
        readers: list[Connection] = []
        senders: list[threading.Thread] = []
        shared: list[bytes] = []
        spawn = self.start_method == "spawn"
        launch = _Launch(fn, self.n_workers, self.t0, os.getpid(), handler.queue, self.verbose,
                         _defer(args, shared) if spawn else args)
        try:
            for i in range(self.n_workers):
                extra = tuple(worker_args[i]) if worker_args is not None else ()
                blobs = list(shared)
                extra = _defer(extra, blobs) if spawn else extra
                reader, writer = self.ctx.Pipe(duplex=False)
                inbox, outbox = self.ctx.Pipe(duplex=False) if blobs else (None, None)
                proc = self.ctx.Process(target=_bootstrap, args=(launch, i, writer, extra, inbox), name=f"worker-{i}",
                                        daemon=True)
                try:
                    _start_deferring_signals(proc, self._procs)
                finally:
                    writer.close()  # only the child writes; closing ours lets a dead child read as EOF
                    if inbox is not None:
                        inbox.close()  # and the child alone reads: a dead child breaks the sender's pipe
                readers.append(reader)
                if outbox is not None:
                    senders.append(threading.Thread(target=_send_later, args=(outbox, blobs), daemon=True,
                                                    name=f"group-send-{i}"))
                    senders[-1].start()
            _log.logger().info("started %d workers (%s)", self.n_workers, self.start_method)
            results = self._collect(readers, monitor, monitor_every, timeout, trap)
            deadline = time.monotonic() + self.grace
            for p in self._procs:  # let finished workers exit on their own before any terminate
                p.join(max(0.0, deadline - time.monotonic()))
            if monitor is not None:
                monitor(self.now())
            return results
        except BaseException:
            self.close()
            raise
        finally:
            self._stop()
            for r in readers:
                r.close()
            for t in senders:  # the workers are gone, so their pipes are broken and the sends have ended
                t.join(self.grace)
            trap.restore()

    def _collect(self, readers: list[Connection], monitor: Callable[[float], None] | None, monitor_every: float,
                 timeout: float | None, trap: "_Trap") -> list[Any]:
        """Wait for every worker's message, failing fast on an error, a death, a signal or the deadline."""
        results: list[Any] = [None] * self.n_workers
        pending = set(range(self.n_workers))
        start = time.perf_counter()
        next_monitor = start + monitor_every
        procs = self._procs[-self.n_workers :]
        while pending:
            trap.check()
            now = time.perf_counter()
            limit = self.poll_interval if monitor is None else max(0.0, min(self.poll_interval, next_monitor - now))
            ready = set(wait([readers[i] for i in pending] + [procs[i].sentinel for i in pending], timeout=limit))
            for i in sorted(pending):
                if readers[i] not in ready and procs[i].sentinel not in ready:
                    continue
                try:
                    message = readers[i].recv() if readers[i].poll() else None
                except (EOFError, OSError):
                    message = None
                if message is None:
                    procs[i].join(self.grace)
                    code = procs[i].exitcode
                    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                    raise WorkerDied(i, f"process died without reporting a result ({how})", exitcode=code,
                                     role=self.roles[i])
                if message[0] == "error":
                    error = WorkerError(i, message[1], message[2], role=self.roles[i])
                    if len(message) > 3 and message[3] is not None:
                        raise message[3] from error
                    raise error
                results[i] = message[1]
                self._merge(i, message[2])
                pending.discard(i)
            now = time.perf_counter()
            if monitor is not None and now >= next_monitor:
                monitor(self.now())
                next_monitor = now + monitor_every
            if timeout is not None and now - start > timeout:
                late = ", ".join(self.roles[i] for i in sorted(pending))
                raise TimeoutError(f"{late} did not finish within timeout={timeout} s")
        return results

    def _merge(self, worker_id: int, records: tuple[list, list, list]) -> None:
        """Add one worker's spans, updates and quality points to the run's trace."""
        spans, updates, quality = records
        for kind, s, e, nbytes, step in spans:
            self.trace.span(worker_id, kind, s, e, nbytes, step)
        for t, step, staleness, applied, lag in updates:
            self.trace.update(t, worker_id, step, staleness, applied, lag)
        for t, step, value in quality:
            self.trace.record_quality(t, step, value)

    def _stop(self) -> None:
        """Terminate, then kill, then join every process this group started."""
        procs, self._procs = self._procs, []
        for p in procs:
            p.terminate()  # a no-op for one already reaped
        deadline = time.monotonic() + self.grace
        for p in procs:
            while p.is_alive() and time.monotonic() < deadline:
                p.join(min(_RESEND, max(0.0, deadline - time.monotonic())))
                # NOTE: a child that got SIGTERM before it had run since fork() loses it (Python
                # clears signals caught at that point), so the signal is sent again until it sticks.
                p.terminate()
            if p.is_alive():
                p.kill()
                p.join()
            p.close()

    # -- lifecycle -------------------------------------------------------------------------
    def unlink_all(self) -> None:
        """Unlink every shared array this group made."""
        with _signals.held():  # a Ctrl-C midway would leave the rest of the list to no one
            arrays, self._arrays = self._arrays, []
            for a in arrays:
                a.unlink()

    def close(self) -> None:
        """Stop any worker and unlink all shared arrays (idempotent)."""
        try:
            self._stop()
        finally:
            self.unlink_all()

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_main_can_be_rerun(start_method: str) -> None:
    """ValueError where 'spawn' or 'forkserver' workers would run the main script's unguarded code, or cannot run it.

    Such a worker starts by running the caller's main file again (as ``__mp_main__``). Code at its top level that
    starts workers, outside ``if __name__ == "__main__":``, then fails in every worker before the worker reads
    what it was sent, and the parent waited forever on a full pipe (Ctrl-C and the run's timeout included).
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if start_method == "fork" or path is None:  # an interactive session or a notebook: nothing is re-run
        return
    if not os.path.isfile(path):
        raise ValueError(f"start_method {start_method!r} starts each worker by running the main program's file "
                         f"again, and this one has none ({path}): use start_method='fork', or run it from a file")
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:  # not started from the script's top level (a function called from elsewhere)
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        body = ast.parse(f.read()).body
    stmt = next((st for st in body if st.lineno <= frame.f_lineno <= (st.end_lineno or st.lineno)), None)
    test = stmt.test if isinstance(stmt, ast.If) else None
    # ast.unparse writes any spelling of the guard (quotes, parentheses, spacing) as one of these two
    if test is None or ast.unparse(test) not in ("__name__ == '__main__'", "'__main__' == __name__"):
        raise ValueError(f"start_method {start_method!r} starts each worker by running {os.path.basename(path)} "
                         f"again, and line {frame.f_lineno} would start the workers again in every worker: put the "
                         "code that starts them under `if __name__ == \"__main__\":`, or use start_method='fork'")


def _start_deferring_signals(proc: BaseProcess, started: list[BaseProcess]) -> None:
    """Start ``proc`` and add it to ``started``; a SIGINT or SIGTERM that comes meanwhile is raised after."""
    # NOTE: a Ctrl-C that landed while os.fork() ran its Python hooks raised inside logging's
    # after-fork handler, was swallowed there ("Exception ignored in _releaseLock") and left
    # logging's lock held: the run went on and the parent hung on its next log call.
    # NOTE: and a SIGTERM that reaches a forked child before its first Python code runs is lost:
    # CPython clears the signals caught in the child at fork. So the two signals stay blocked in
    # this thread while it forks; the child inherits the mask, and its _bootstrap unblocks them
    # once its own handlers are in place, when a signal sent meanwhile (kept pending) arrives.
    with _signals.held():
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _CHILD_SIGNALS)
        try:
            proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        started.append(proc)


_EXIT_GRACE = 2.0  # seconds a worker told to stop has to report before SIGALRM's default action ends it
_CHILD_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    """In a worker: SIGTERM unwinds like an exception, so the worker reports it and exits."""
    # NOTE: an exception raised by a handler that runs inside a weakref callback or a __del__ is
    # printed ("Exception ignored in ...") and dropped, and the worker would run on. So a second
    # SIGTERM takes the default action, and SIGALRM's default action ends the worker after a grace.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, _EXIT_GRACE)
    raise SystemExit(128 + signum)


class _Trap:
    """While a run is in progress: SIGTERM raises SystemExit, and both it and Ctrl-C are remembered.

    An exception a signal handler raises inside a weakref callback or a ``__del__`` is dropped
    there ("Exception ignored in ..."); the run's loop calls :meth:`check`, which raises it again.
    Handlers someone else installed are left alone (main thread only).
    """

    def __init__(self) -> None:
        self.seen: int | None = None
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, default in ((signal.SIGTERM, signal.SIG_DFL), (signal.SIGINT, signal.default_int_handler)):
            if _signals.handler(signum) is default:
                self._previous[signum] = signal.getsignal(signum)
                signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.seen = signum
        self.check()

    def check(self) -> None:
        """Raise what the signal raises (again, if a callback swallowed it)."""
        if self.seen == signal.SIGTERM:
            raise SystemExit(128 + signal.SIGTERM)
        if self.seen == signal.SIGINT:
            raise KeyboardInterrupt

    def restore(self) -> None:
        for signum, h in self._previous.items():
            signal.signal(signum, h)


def run_workers(fn: Callable[..., Any], n_workers: int, *args: Any, start_method: str | None = None,
                verbose: bool = False, **run_kwargs: Any) -> tuple[list[Any], Trace]:
    """One-shot: a :class:`WorkerGroup` that runs ``fn`` once and closes; returns (results, trace)."""
    with WorkerGroup(n_workers, start_method, verbose=verbose) as group:
        results = group.run(fn, *args, **run_kwargs)
        return results, group.trace

"""Real processes on one machine: shared arrays, a fail-fast worker group, counted pipes, one trace.

The substrate every multi-process lesson (Hogwild!, GloVe, LDA, the parameter server) runs on.

Shared memory (``simlib.parallel.shm``)
    ``SharedArray.zeros(shape, dtype)`` / ``SharedArray.copy_of(ndarray)`` make a segment owned by
    the calling process; ``.array`` is the ndarray view, ``.name`` the segment (``simlib_*``).
    Passing a SharedArray to a worker (or pickling it) attaches by name under fork and spawn;
    only the owner unlinks, exactly once (``.unlink()``, ``with``, garbage collection or exit).
    ``live_segments()`` lists what this process still owns.

Worker group (``simlib.parallel.group``)
    ``WorkerGroup(n_workers, start_method=None, verbose=False)`` is a context manager.
    ``group.zeros(...)`` / ``group.copy_of(...)`` make shared arrays the group unlinks on exit
    or on any failure; ``group.lock()``, ``group.barrier()``, ``group.channel_pair()`` make
    synchronisation objects of the right start-method context.
    ``group.run(fn, *args, worker_args=None, monitor=None, monitor_every=0.1, timeout=None)``
    calls top-level ``fn(worker_id, n_workers, *args, *worker_args[worker_id])`` in each worker
    and returns the results in worker order. A worker that raises -> ``WorkerError`` (with
    ``.worker_id`` and ``.traceback_text``); a worker that dies -> ``WorkerDied`` (with
    ``.exitcode``), noticed within ``poll_interval`` seconds. On any failure, Ctrl-C included,
    workers are terminated, killed if needed, joined, and the group's arrays unlinked.
    ``run_workers(fn, n, *args, start_method=None)`` is the one-shot form: (results, trace).

Inside a worker (``simlib.parallel.worker``)
    ``current()`` gives the ``WorkerContext``: ``worker_id``, ``n_workers``, ``now()``,
    ``span(kind, start, end, nbytes=0, step=-1)`` (perf_counter readings), ``timed(kind)``,
    ``update(step, staleness)``, ``record_quality(step, value)``. Records ride back with the
    result and land in ``group.trace``, a :class:`simlib.trace.Trace` with
    ``substrate="parallel"`` and times in seconds since the run started. The parent adds
    quality points itself with ``group.trace.record_quality(group.now(), step, value)``.

Message passing (``simlib.parallel.channel``)
    ``channel_pair()`` / ``group.channel_pair()`` -> two ``Channel`` ends of a pipe:
    ``send(obj)``, ``recv()``, ``send_array(a)``, ``recv_array()``, ``poll(timeout)``, with
    ``bytes_sent`` / ``bytes_received`` counted; inside a worker each call also records a
    send/recv span. Channels work with ``multiprocessing.connection.wait``.

Logging (``simlib.parallel.log``)
    Workers log to ``logging.getLogger("simlib.parallel")`` (``log.logger()``); lines arrive
    through ``multiprocessing-logging`` in one format naming the process (``worker-3``).
    WARNING and above by default, INFO with ``verbose=True``.

Built on it: the contract's ``shm`` and ``pipes`` substrates (``simlib.run(..., substrate="shm")`` runs
Hogwild!, GloVe, AD-LDA, Shotgun and model-parallel GloVe), co-occurrence counting
(``simlib.parallel.glove_count``, a map-reduce), and pipeline and tensor parallelism (``simlib.modelpar``).

Example (``fill`` must be defined at a module's top level so that spawn can import it)::

    def fill(worker_id, n_workers, out):
        out.array[worker_id::n_workers] = worker_id
        return worker_id

    with WorkerGroup(2) as group:
        out = group.zeros(10)
        assert group.run(fill, out) == [0, 1]
"""
from simlib.parallel.channel import Channel, channel_pair
from simlib.parallel.group import START_METHODS, WorkerDied, WorkerError, WorkerGroup, run_workers
from simlib.parallel.shm import PREFIX, SharedArray, live_segments, unlink_all
from simlib.parallel.worker import WorkerContext, current

__all__ = [
    "Channel",
    "PREFIX",
    "START_METHODS",
    "SharedArray",
    "WorkerContext",
    "WorkerDied",
    "WorkerError",
    "WorkerGroup",
    "channel_pair",
    "current",
    "live_segments",
    "run_workers",
    "unlink_all",
]

"""WorkerGroup: results in order, fail fast with the worker's id, no orphans, no leaked segments."""
from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import threading
import time
import weakref

import numpy as np
import pytest

from simlib.parallel import PREFIX, SharedArray, WorkerDied, WorkerError, WorkerGroup, current, run_workers

METHODS = ["fork", "spawn"]


# -- worker functions (top level, so spawn can import them) --------------------------------
def square(worker_id: int, n_workers: int, base: int, extra: int = 0) -> int:
    """Return a value that depends on the id, so order is visible."""
    return (base + worker_id) ** 2 + extra


def payload_bytes(worker_id: int, n_workers: int, payload: np.ndarray) -> int:
    """The size of what the worker was sent."""
    return payload.nbytes


def all_bytes(worker_id: int, n_workers: int, *values) -> int:
    """How many bytes the worker was sent, its own arguments included."""
    return sum(v.nbytes if isinstance(v, np.ndarray) else len(v) for v in values)


def record_work(worker_id: int, n_workers: int) -> int:
    """Record two compute spans and an update in the worker's context."""
    ctx = current()
    assert ctx is not None and ctx.worker_id == worker_id and ctx.n_workers == n_workers
    for step in range(2):
        with ctx.timed("compute", step=step):
            time.sleep(0.01)
        ctx.update(step, staleness=worker_id)
    ctx.record_quality(2, 0.5)
    return worker_id


def raise_in_one(worker_id: int, n_workers: int, pids: SharedArray) -> None:
    """Worker 1 raises; the others would wait for a minute."""
    pids.array[worker_id] = os.getpid()
    if worker_id == 1:
        time.sleep(0.2)
        raise ZeroDivisionError("the learning rate was 1/0")
    time.sleep(60)


def sleep_forever(worker_id: int, n_workers: int, pids: SharedArray) -> None:
    """Publish the pid, then keep busy until killed."""
    pids.array[worker_id] = os.getpid()
    time.sleep(3600)


def _inside_callbacks(seconds: float) -> None:
    """Spend ``seconds`` almost wholly inside weakref callbacks, where an exception is dropped."""

    class Thing:
        pass

    def callback(_ref) -> None:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.002:
            pass

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        thing = Thing()
        ref = weakref.ref(thing, callback)
        del thing  # the callback runs here; a handler's exception raised in it is only printed
        del ref


def churn_callbacks(worker_id: int, n_workers: int, pids: SharedArray) -> None:
    """Publish the pid, then run weakref callbacks for a minute."""
    pids.array[worker_id] = os.getpid()
    _inside_callbacks(60)


def exit_early(worker_id: int, n_workers: int) -> None:
    """Leave without a result, as a crashing extension would."""
    os._exit(3)


# -- helpers -------------------------------------------------------------------------------
def _children() -> set[int]:
    """Live child pids of this process, read from /proc (no psutil), else from multiprocessing."""
    path = f"/proc/{os.getpid()}/task"
    if not os.path.isdir(path):
        return {p.pid for p in multiprocessing.active_children()}
    pids: set[int] = set()
    for tid in os.listdir(path):
        try:
            with open(f"{path}/{tid}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            pass
    # the resource tracker and forkserver are long-lived helpers of multiprocessing, not workers
    helpers = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            if b"resource_tracker" in cmdline or b"forkserver" in cmdline:
                helpers.add(pid)
        except OSError:
            helpers.add(pid)  # already gone
    return pids - helpers


def _dev_shm() -> set[str]:
    """This process's segments in /dev/shm (other programs on the machine may make their own)."""
    gc.collect()
    mine = f"{PREFIX}{os.getpid()}_"
    return {n for n in os.listdir("/dev/shm") if n.startswith(mine)} if os.path.isdir("/dev/shm") else set()


@pytest.fixture
def clean(request: pytest.FixtureRequest):
    """Assert that the test leaves no child process and no new shared-memory segment behind."""
    before = _dev_shm()
    yield
    assert not multiprocessing.active_children()
    assert not _children()
    assert _dev_shm() == before, f"leaked: {_dev_shm() - before}"


# -- tests ---------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_results_come_back_in_worker_order(method: str, clean: None) -> None:
    with WorkerGroup(3, method) as group:
        assert group.run(square, 10) == [100, 121, 144]
        assert group.run(square, 1, worker_args=[(0,), (5,), (7,)]) == [1, 9, 16]


@pytest.mark.parametrize("method", METHODS)
def test_worker_records_land_in_the_trace(method: str, clean: None) -> None:
    results, trace = run_workers(record_work, 2, start_method=method)
    assert results == [0, 1]
    assert trace.substrate == "parallel" and trace.n_workers == 2
    for w in (0, 1):
        spans = trace.worker_spans(w)
        assert [s.step for s in spans] == [0, 1] and all(s.kind == "compute" for s in spans)
        assert all(0.0 <= s.start < s.end and s.end - s.start >= 0.009 for s in spans)
    assert sorted((u.worker, u.staleness) for u in trace.updates) == [(0, 0), (0, 0), (1, 1), (1, 1)]
    assert len(trace.quality) == 2


@pytest.mark.parametrize("method", METHODS)
def test_exception_in_a_worker_is_reraised_fast_with_its_traceback(method: str, clean: None) -> None:
    with WorkerGroup(3, method) as group:
        pids = group.zeros(3, np.int64)
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            group.run(raise_in_one, pids)
        # The other workers sleep 60 s: ending in half of that means the parent did not wait for them
        # (a bound with room for a loaded machine; the fail-fast latency is measured by the fault suite).
        assert time.monotonic() - start < 30.0
        assert pids.closed  # a failed run unlinks the group's arrays at once
    err = info.value
    assert err.worker_id == 1 and not isinstance(err, WorkerDied)
    assert "ZeroDivisionError: the learning rate was 1/0" in str(err)
    assert "raise_in_one" in err.traceback_text


@pytest.mark.parametrize("method", METHODS)
def test_sigkilled_worker_is_reported_within_five_seconds(method: str, clean: None) -> None:
    with WorkerGroup(2, method) as group:
        pids = group.zeros(2, np.int64)
        killed: list[float] = []

        def kill_worker_1(elapsed: float) -> None:
            if not killed and pids.array[1] > 0:
                os.kill(int(pids.array[1]), signal.SIGKILL)
                killed.append(time.monotonic())

        with pytest.raises(WorkerDied) as info:
            group.run(sleep_forever, pids, monitor=kill_worker_1, monitor_every=0.05, timeout=300)
        assert time.monotonic() - killed[0] < 5.0
    assert info.value.worker_id == 1 and info.value.exitcode == -signal.SIGKILL
    assert "killed by signal 9" in str(info.value)


@pytest.mark.parametrize("method", METHODS)
def test_worker_that_exits_without_a_result_is_reported(method: str, clean: None) -> None:
    with pytest.raises(WorkerDied) as info:
        run_workers(exit_early, 1, start_method=method)
    assert info.value.worker_id == 0 and info.value.exitcode == 3


@pytest.mark.parametrize("method", METHODS)
def test_ctrl_c_in_the_parent_stops_workers_and_unlinks(method: str, clean: None) -> None:
    with WorkerGroup(2, method) as group:
        pids = group.zeros(2, np.int64)

        def press_ctrl_c(elapsed: float) -> None:
            if np.all(pids.array > 0):
                os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT, delivered to this process

        with pytest.raises(KeyboardInterrupt):
            group.run(sleep_forever, pids, monitor=press_ctrl_c, monitor_every=0.05, timeout=300)
        assert pids.closed


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped exception
def test_sigterm_that_lands_in_a_workers_weakref_callback_still_ends_it(clean: None) -> None:
    # The handler's SystemExit is dropped inside the callback; the worker must end all the same.
    with WorkerGroup(2, "fork") as group:
        pids = group.zeros(2, np.int64)
        sent: list[float] = []

        def terminate_worker_0(elapsed: float) -> None:
            if not sent and pids.array[0] > 0:
                time.sleep(0.2)
                os.kill(int(pids.array[0]), signal.SIGTERM)
                sent.append(time.monotonic())

        with pytest.raises(WorkerError) as info:
            group.run(churn_callbacks, pids, monitor=terminate_worker_0, monitor_every=0.05, timeout=60)
        assert time.monotonic() - sent[0] < 20.0, "the worker ran on after its SIGTERM"
    assert info.value.worker_id == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped exception
def test_ctrl_c_that_lands_in_the_parents_weakref_callback_still_stops_the_run(clean: None) -> None:
    with WorkerGroup(2, "fork") as group:
        pids = group.zeros(2, np.int64)
        sent: list[float] = []

        def ctrl_c_inside_callbacks(elapsed: float) -> None:
            if not sent and np.all(pids.array > 0):
                sent.append(time.monotonic())
                threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
                _inside_callbacks(2.0)  # the KeyboardInterrupt is raised (and dropped) in here

        with pytest.raises(KeyboardInterrupt):
            group.run(sleep_forever, pids, monitor=ctrl_c_inside_callbacks, monitor_every=0.05, timeout=300)
        assert time.monotonic() - sent[0] < 20.0, "the run went on after Ctrl-C"
        assert pids.closed


def test_timeout_stops_the_run(clean: None) -> None:
    with WorkerGroup(1, "fork") as group:
        pids = group.zeros(1, np.int64)
        with pytest.raises(TimeoutError, match="timeout=0.3"):
            group.run(sleep_forever, pids, timeout=0.3)


@pytest.mark.parametrize(
    "kwargs, field",
    [({"n_workers": 0}, "n_workers"), ({"n_workers": 2.5}, "n_workers"), ({"n_workers": 2, "start_method": "thread"}, "start_method")],
)
def test_bad_configuration_fails_before_any_process(kwargs: dict, field: str, clean: None) -> None:
    with pytest.raises(ValueError, match=field):
        WorkerGroup(**kwargs)


def test_bad_run_arguments_fail_before_any_process(clean: None) -> None:
    with WorkerGroup(2, "fork") as group:
        with pytest.raises(ValueError, match="worker_args"):
            group.run(square, 1, worker_args=[(1,)])
        with pytest.raises(ValueError, match="fn"):
            group.run("not a function")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout"):
            group.run(square, 1, timeout=0)
        assert group.t0 is None  # nothing was started


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no forkserver here")
def test_forkserver_workers_run_though_their_parent_is_the_server(clean: None) -> None:
    with WorkerGroup(2, "forkserver") as group:  # they used to exit at once: their parent pid is the server's
        assert group.run(square, 10) == [100, 121]


def sleep_noting_pid(worker_id: int, n_workers: int, path: str) -> None:
    """Note the pid in ``path.<worker_id>`` (whole once it exists: written aside, then renamed), then sleep."""
    with open(f"{path}.{worker_id}.part", "w") as f:
        f.write(str(os.getpid()))
    os.replace(f"{path}.{worker_id}.part", f"{path}.{worker_id}")
    time.sleep(60)


_ORPHANED = """
import sys
sys.path.insert(0, {root!r})
from simlib.parallel import WorkerGroup
from tests.test_parallel_group import sleep_noting_pid
if __name__ == "__main__":
    with WorkerGroup(1, "forkserver") as group:
        group.run(sleep_noting_pid, {path!r})
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no forkserver here")
def test_a_forkserver_worker_ends_with_the_process_that_started_it(tmp_path) -> None:
    """Its parent-death signal is armed against the server, which outlives the group's process: it watches that."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "orphaned.py"
    script.write_text(_ORPHANED.format(root=root, path=str(tmp_path / "pid")))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    note, deadline = tmp_path / "pid.0", time.monotonic() + 60
    while not note.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = int(note.read_text())  # the note appears whole, by a rename: no sleep for its write to land
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 60
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(worker), "the worker outlived the process that started it"


_UNGUARDED = """
import os, sys
sys.path.insert(0, {root!r})
from simlib.parallel import WorkerGroup
import numpy as np
from tests.test_parallel_group import payload_bytes
with WorkerGroup(2, {method!r}) as group:
    print(group.run(payload_bytes, np.zeros(1_000_000)))  # 8 MB to send: a dying worker left the parent hung on it
"""


@pytest.mark.parametrize("method", [m for m in ("spawn", "forkserver") if m in multiprocessing.get_all_start_methods()])
def test_a_script_that_starts_workers_unguarded_is_refused_not_hung(tmp_path, method: str) -> None:
    """spawn workers run the main file again: unguarded, each would start workers again and die before reading."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "unguarded.py"
    script.write_text(_UNGUARDED.format(root=root, method=method))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1 and 'if __name__ == "__main__":' in proc.stderr and "line 7 " in proc.stderr
    guarded = tmp_path / "guarded.py"
    body = _UNGUARDED.format(root=root, method=method).split("from tests.test_parallel_group import payload_bytes\n")
    guarded.write_text(body[0] + "from tests.test_parallel_group import payload_bytes\nif __name__ == '__main__':\n"
                       + "".join("    " + line + "\n" for line in body[1].strip().splitlines()))
    proc = subprocess.run([sys.executable, str(guarded)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "[8000000, 8000000]", proc.stderr


_DIES_IN_WORKERS = """
import sys
sys.path.insert(0, {root!r})
if __name__ == "__mp_main__":  # what a spawned worker runs: this copy of the script fails before reading its arguments
    raise RuntimeError("this script cannot run in a worker")
from simlib.parallel import WorkerGroup
import numpy as np
from tests.test_parallel_group import all_bytes
if __name__ == "__main__":
    with WorkerGroup(2, "spawn") as group:
        print(group.run(all_bytes, np.zeros(1_000_000), worker_args=[(np.ones(10_000),), (b"x" * 100_000,)]))
"""


def test_spawned_workers_that_die_before_reading_large_arguments_are_reported_not_hung(tmp_path) -> None:
    """spawn wrote a worker's arguments down a pipe whose reading end the parent held until the write ended: a worker
    that died before reading 8 MB of them left the parent blocked in start(); now they follow the start."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "dies.py"
    script.write_text(_DIES_IN_WORKERS.format(root=root))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1 and "WorkerDied" in proc.stderr and "exit code 1" in proc.stderr, proc.stderr[-2000:]
    # the same script whose workers can run: every large argument arrives whole, shared and per worker alike
    script.write_text(_DIES_IN_WORKERS.format(root=root).replace('raise RuntimeError("this script cannot run in a '
                                                                  'worker")', "pass"))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "[8080000, 8100000]", proc.stderr[-2000:]


def blas_threads(worker_id: int, n_workers: int) -> list[int]:
    """The BLAS thread counts threadpoolctl reports in this worker."""
    from threadpoolctl import threadpool_info

    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def test_forked_workers_inherit_one_blas_thread_and_the_parent_gets_its_own_back(clean: None) -> None:
    """Workers share the cores, so a forked worker starts with one BLAS thread (the parent holds its BLAS at one for
    the run: set inside a forked child instead, OpenBLAS's spinning pool slowed every BSP step); afterwards the
    parent has its 3 again."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=3, user_api="blas"):
        assert set(blas_threads(0, 1)) == {3}
        assert [set(threads) for threads in run_workers(blas_threads, 2, start_method="fork")[0]] == [{1}, {1}]
        assert set(blas_threads(0, 1)) == {3}

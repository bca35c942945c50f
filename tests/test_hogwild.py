"""Hogwild! and its comparison modes: lazy L2 equals the dense update, serial equals scikit-learn,
parallel modes reach the serial loss, bad input fails before any process starts."""
from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest

from simlib.parallel import PREFIX, WorkerDied
from simlib.parallel.hogwild import MODES, train
from simlib.parallel.hogwild_kernels import RESCALE_BELOW, catch_up, sgd_rows
from simlib.problems.logistic import LogisticProblem, make_sparse_classification


@pytest.fixture(scope="module")
def data():
    """4,000 x 2,000, ~20 nonzeros per row: big enough for two workers, small enough to be quick."""
    return make_sparse_classification(4_000, 2_000, 24, zipf=1.0, seed=3)


def dense_sgd(data, lr: float, l2: float, rows: range) -> np.ndarray:
    """The textbook dense step, row by row: w <- (1 - lr*l2) w - lr * (-y sigma(-y x.w)) x."""
    x = data.to_scipy().toarray().astype(np.float64)
    w = np.zeros(data.n_features)
    for i in rows:
        yi = float(data.y[i])  # a Python float, so NumPy 2 does not round the step to float32
        coef = -yi / (1.0 + math.exp(yi * (x[i] @ w)))
        w = (1.0 - lr * l2) * w - lr * coef * x[i]
    return w


@pytest.mark.parametrize("lr, l2, n", [(0.5, 0.01, 7), (0.3, 0.1, 40), (0.9, 1.0, 300)])
def test_lazy_l2_equals_the_dense_update(data, lr: float, l2: float, n: int) -> None:
    small = data.rows(0, n)
    w = np.zeros(small.n_features)
    stamp = np.ones_like(w)
    scale = sgd_rows(small.indptr, small.indices, small.values, small.y, w, stamp, 0, n, 1.0, lr, l2)
    catch_up(w, stamp, scale)
    expected = dense_sgd(small, lr, l2, range(n))
    assert np.count_nonzero(expected) > 10
    np.testing.assert_allclose(w, expected, rtol=1e-11, atol=1e-300)


def test_scale_is_renormalised_before_it_underflows(data) -> None:
    small = data.rows(0, 300)
    w = np.zeros(small.n_features)
    stamp = np.ones_like(w)
    scale = sgd_rows(small.indptr, small.indices, small.values, small.y, w, stamp, 0, 300, 1.0, 0.9, 1.0)
    # keep = 0.1, so 300 steps would reach 1e-300 without the restart
    assert RESCALE_BELOW <= scale <= 1.0 and np.all(stamp >= RESCALE_BELOW)


def test_serial_matches_scikit_learn_constant_rate(data) -> None:
    from sklearn.linear_model import SGDClassifier

    lr, l2, epochs = 0.4, 1e-3, 3
    peer = SGDClassifier(
        loss="log_loss", penalty="l2", alpha=l2, learning_rate="constant", eta0=lr,
        fit_intercept=False, shuffle=False, max_iter=epochs, tol=None,
    ).fit(data.to_scipy().astype(np.float64), data.y)
    for decay in ("lazy", "scaled"):
        ours = train(data, "serial", lr=lr, l2=l2, epochs=epochs, decay=decay)
        np.testing.assert_allclose(ours.w, peer.coef_.ravel(), rtol=1e-9, atol=1e-12)


def test_one_hogwild_worker_is_the_serial_algorithm(data) -> None:
    serial = train(data, "serial", epochs=2)
    one = train(data, "hogwild", n_workers=1, epochs=2, start_method="fork")
    np.testing.assert_allclose(one.w, serial.w, rtol=1e-12)


def test_bsp_with_one_worker_and_batches_of_one_is_serial_sgd(data) -> None:
    small = data.rows(0, 500)
    serial = train(small, "serial", epochs=2)
    bsp = train(small, "bsp", n_workers=1, batch_size=1, epochs=2, start_method="fork")
    np.testing.assert_allclose(bsp.w, serial.w, rtol=1e-10, atol=1e-14)


def test_scaled_decay_with_one_worker_is_the_serial_algorithm(data) -> None:
    serial = train(data, "serial", epochs=2)
    one = train(data, "hogwild", n_workers=1, epochs=2, start_method="fork", decay="scaled")
    np.testing.assert_allclose(one.w, serial.w, rtol=1e-10, atol=1e-14)
    assert one.trace.meta["decay"] == "scaled"


@pytest.mark.parametrize(
    "mode, method, decay",
    [("hogwild", "fork", "lazy"), ("hogwild", "spawn", "lazy"), ("locked", "fork", "lazy"), ("hogwild", "fork", "scaled"), ("locked", "spawn", "scaled")],
)
def test_two_workers_reach_the_serial_loss(data, mode: str, method: str, decay: str) -> None:
    full = LogisticProblem(data, l2=1e-5, eval_rows=None)
    serial = full.loss(train(data, "serial", epochs=3).w)
    res = train(data, mode, n_workers=2, epochs=3, start_method=method, timeout=60, decay=decay)
    assert abs(full.loss(res.w) - serial) < 0.02 * serial
    trace = res.trace
    assert trace.substrate == "parallel" and trace.n_workers == 2 and trace.meta["mode"] == mode
    assert {s.worker for s in trace.spans} == {0, 1}
    assert trace.quality[0].value == pytest.approx(math.log(2)) and trace.quality[-1].value < 0.6
    assert res.nnz == 3 * data.nnz and res.nnz_per_s > 0
    assert 0 < res.cpu_seconds and 0 < res.cores_used <= 2.2  # two processes get at most two cores


def test_bsp_records_barrier_waits_and_learns(data) -> None:
    res = train(data, "bsp", n_workers=2, batch_size=50, epochs=2, start_method="fork", timeout=60)
    steps = -(-2_000 // 50) * 2
    assert len(res.trace.updates) == 2 * steps  # one update per worker per synchronous step
    assert res.trace.busy_time("wait") > 0
    assert res.trace.quality[-1].value < res.trace.quality[0].value


def _broken(data, **changes):
    """A copy of ``data`` with fields replaced after construction (skipping its own checks)."""
    bad = dataclasses.replace(data)
    for k, v in changes.items():
        setattr(bad, k, v)
    return bad


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"n_workers": 0}, "n_workers"),
        ({"lr": 0.0}, "lr"),
        ({"lr": -1.0}, "lr"),
        ({"l2": -1e-3}, "l2"),
        ({"lr": 2.0, "l2": 0.5}, "lr \\* l2"),
        ({"epochs": 0}, "epochs"),
        ({"mode": "async"}, "mode"),
        ({"mode": "serial", "n_workers": 2}, "n_workers"),
        ({"w0": np.zeros(3)}, "w0"),
        ({"w0": np.full(2_000, np.nan)}, "w0"),
        ({"decay": "l1"}, "decay"),
        ({"start_method": "threads"}, "start_method"),
        ({"decay": "scaled", "l2": 0.05, "epochs": 10}, "decay='scaled' needs"),
    ],
)
def test_bad_arguments_fail_before_any_process(data, kwargs: dict, field: str) -> None:
    kwargs = {"mode": "hogwild", "start_method": "spawn", **kwargs}
    before = {p.pid for p in multiprocessing.active_children()}
    with pytest.raises(ValueError, match=field) as raised:
        train(data, **kwargs)
    # Before any process: the error comes from the checks, not from inside a worker group, and no
    # child was started (a behaviour check; a wall-clock bound fails on a loaded machine).
    assert not any("group.py" in str(entry.path) for entry in raised.traceback), raised.traceback
    assert {p.pid for p in multiprocessing.active_children()} <= before


def test_bad_data_fails_before_any_process(data) -> None:
    values = data.values.copy()
    values[5] = np.inf
    with pytest.raises(ValueError, match="finite"):
        train(_broken(data, values=values), start_method="spawn")
    with pytest.raises(ValueError, match="y must have one label per row"):
        train(_broken(data, y=data.y[:-1]), start_method="spawn")
    with pytest.raises(ValueError, match="data must be a SparseDataset"):
        train(data.to_scipy(), start_method="spawn")  # type: ignore[arg-type]


def test_modes_are_the_four_documented_ones() -> None:
    assert MODES == ("serial", "locked", "hogwild", "bsp")


def _worker_children() -> list[int]:
    """Pids of this process's children that are workers (not multiprocessing's resource tracker)."""
    pids = []
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{tid}/children") as f:
                pids += [int(p) for p in f.read().split()]
        except OSError:
            pass
    workers = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"resource_tracker" not in f.read():
                    workers.append(pid)
        except OSError:
            pass
    return workers


def _my_segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"{PREFIX}{os.getpid()}_")}


@pytest.mark.skipif(not os.path.isdir("/proc") or not os.path.isdir("/dev/shm"), reason="reads /proc and /dev/shm")
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_sigkill_of_a_hogwild_worker_fails_fast_and_leaves_nothing(data, method: str) -> None:
    before = _my_segments()
    older = set(_worker_children())  # children an earlier test started are not this run's
    killed: list[tuple[int, float]] = []

    def kill_one_worker() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            workers = [p for p in _worker_children() if p not in older]
            if len(workers) >= 2:
                time.sleep(0.3)  # let it get going
                os.kill(workers[-1], signal.SIGKILL)
                killed.append((workers[-1], time.monotonic()))
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_one_worker, daemon=True)
    killer.start()
    with pytest.raises(WorkerDied) as info:
        train(data, "hogwild", n_workers=2, epochs=1_000_000, start_method=method, timeout=60)
    assert killed and time.monotonic() - killed[0][1] < 5.0
    assert info.value.exitcode == -signal.SIGKILL and "killed by signal 9" in str(info.value)
    killer.join()
    left = [p for p in _worker_children() if p not in older]
    assert not multiprocessing.active_children() and not left, [_cmdline(p) for p in left]
    assert _my_segments() == before


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid} (gone)"

"""SharedArray: attach by name under fork and spawn, one owner, unlinked exactly once."""
from __future__ import annotations

import gc
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from simlib.parallel import PREFIX, SharedArray, WorkerGroup, live_segments
from simlib.parallel.shm import unlink_all

SHM = "/dev/shm"
needs_dev_shm = pytest.mark.skipif(not os.path.isdir(SHM), reason="needs /dev/shm (Linux)")


def _ours() -> set[str]:
    return {n for n in os.listdir(SHM) if n.startswith(PREFIX)} if os.path.isdir(SHM) else set()


def _mine() -> set[str]:
    """Segments this process made (other programs on the machine may make their own)."""
    return {n for n in _ours() if n.startswith(f"{PREFIX}{os.getpid()}_")}


def add_worker_id(worker_id: int, n_workers: int, shared: SharedArray) -> float:
    """Write into the shared array and read what the parent put there."""
    shared.array[worker_id] += 10 * (worker_id + 1)
    return float(shared.array[-1])


def forked_child_drops_its_copy(worker_id: int, n_workers: int, a: SharedArray) -> bool:
    """A forked child holding the parent's owner object must not unlink on release."""
    a.unlink()
    return True


def test_zeros_and_copy_of_hold_the_data() -> None:
    src = np.arange(12, dtype=np.int32).reshape(3, 4)
    with SharedArray.copy_of(src) as a, SharedArray.zeros((2, 5), np.float32) as z:
        assert a.array.dtype == np.int32 and a.shape == (3, 4)
        np.testing.assert_array_equal(a.array, src)
        assert z.array.shape == (2, 5) and not z.array.any()
        assert a.name.startswith(PREFIX)


@needs_dev_shm
def test_unlink_removes_the_segment_once() -> None:
    a = SharedArray.zeros(100)
    assert a.name in _ours() and a.name in live_segments()
    a.unlink()
    a.unlink()  # second call is a no-op, not an error
    assert a.name not in _ours() and a.name not in live_segments()
    assert a.closed


@needs_dev_shm
def test_garbage_collection_unlinks_the_owner() -> None:
    a = SharedArray.zeros(10)
    name = a.name
    del a
    gc.collect()
    assert name not in _ours()


@needs_dev_shm
def test_unlink_while_views_exist_still_removes_the_name() -> None:
    a = SharedArray.zeros(10)
    view = a.array[2:5]
    a.unlink()
    assert a.name not in _ours()
    view[:] = 1.0  # the mapping stays valid while a view holds it
    assert view.sum() == 3.0


def test_pickle_attaches_to_the_same_memory() -> None:
    with SharedArray.zeros(4) as a:
        b = pickle.loads(pickle.dumps(a))
        assert not b.owner and b.name == a.name
        b.array[1] = 7.0
        assert a.array[1] == 7.0
        b.unlink()  # a non-owner only unmaps
        assert a.array[1] == 7.0 and a.name in live_segments()


def test_attach_to_a_missing_segment_is_a_value_error() -> None:
    a = SharedArray.zeros(3)
    name = a.name
    a.unlink()
    with pytest.raises(ValueError, match="no shared segment"):
        SharedArray.attach(name, (3,), "float64")


@pytest.mark.parametrize("shape", [(-1,), (2, 1.5), "x"])
def test_bad_shape_is_a_value_error(shape: object) -> None:
    with pytest.raises(ValueError):
        SharedArray.zeros(shape)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_see_and_write_the_parents_array(method: str) -> None:
    with WorkerGroup(2, method) as group:
        a = group.zeros(3)
        a.array[-1] = 5.0
        seen = group.run(add_worker_id, a)
        assert seen == [5.0, 5.0]
        np.testing.assert_array_equal(a.array, [10.0, 20.0, 5.0])


@needs_dev_shm
def test_forked_child_never_unlinks_the_parents_segment() -> None:
    with WorkerGroup(1, "fork") as group:
        a = group.zeros(3)
        assert group.run(forked_child_drops_its_copy, a) == [True]
        assert a.name in _ours()
    assert a.name not in _ours()


@needs_dev_shm
def test_segment_is_removed_when_the_owner_is_sigkilled() -> None:
    script = textwrap.dedent(
        """
        import os, signal, sys
        from simlib.parallel import SharedArray
        a = SharedArray.zeros(1000)
        print(a.name, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    name = proc.stdout.strip()
    assert name.startswith(PREFIX)
    deadline = time.monotonic() + 60.0  # the tracker, another process, unlinks when it is scheduled
    while name in _ours() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert name not in _ours(), "the resource tracker should unlink a killed owner's segment"


def test_unlink_all_releases_everything_owned() -> None:
    arrays = [SharedArray.zeros(2) for _ in range(3)]
    assert unlink_all() >= 3
    assert all(a.closed for a in arrays)
    assert not live_segments() and not _mine()

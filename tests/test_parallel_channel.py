"""Channel: objects and raw arrays through a pipe, bytes counted on both ends, spans in workers."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from simlib.parallel import Channel, WorkerGroup, channel_pair
from simlib.parallel.worker import WorkerContext, _install


def echo_doubled(worker_id: int, n_workers: int, end: Channel) -> tuple[int, int]:
    """Receive an array, send back twice it; report this end's byte counters."""
    a = end.recv_array()
    end.send_array(2 * a)
    end.send({"worker": worker_id})
    return end.bytes_received, end.bytes_sent


def test_objects_round_trip_and_bytes_match_the_pickle() -> None:
    a, b = channel_pair()
    obj = {"keys": [1, 2, 3], "step": 7}
    n = a.send(obj)
    assert b.recv() == obj
    assert n == len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    assert (a.bytes_sent, a.messages_sent) == (n, 1)
    assert (b.bytes_received, b.messages_received) == (n, 1)
    a.close()
    b.close()


def test_arrays_travel_as_raw_buffers() -> None:
    a, b = channel_pair()
    x = np.arange(1000, dtype=np.float32).reshape(10, 100)[:, ::2]  # not contiguous on purpose
    n = a.send_array(x)
    y = b.recv_array()
    np.testing.assert_array_equal(x, y)
    assert y.dtype == np.float32 and y.shape == (10, 50)
    assert x.nbytes < n < x.nbytes + 200  # the data plus a small header, nothing pickled twice
    assert b.bytes_received == n


def test_one_way_channel_and_poll() -> None:
    recv_end, send_end = channel_pair(duplex=False)
    assert not recv_end.poll(0.0)
    send_end.send(1)
    assert recv_end.poll(1.0) and recv_end.recv() == 1


def test_spans_are_recorded_inside_a_worker_context() -> None:
    a, b = channel_pair()
    ctx = WorkerContext(worker_id=0, n_workers=1, t0=0.0)
    _install(ctx)
    try:
        n = a.send_array(np.ones(64))
        b.recv_array()
    finally:
        _install(None)
    kinds = [(s[0], s[3]) for s in ctx.spans]
    assert sum(nb for k, nb in kinds if k == "send") == n
    assert sum(nb for k, nb in kinds if k == "recv") == n


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_channel_to_a_worker_counts_both_directions(method: str) -> None:
    with WorkerGroup(1, method) as group:
        mine, theirs = group.channel_pair()
        x = np.arange(256, dtype=np.float64)
        mine.send_array(x)

        results = []

        def collect(elapsed: float) -> None:
            if mine.poll(0) and not results:
                results.append(mine.recv_array())
                results.append(mine.recv())

        (received, sent), = group.run(echo_doubled, theirs, monitor=collect, monitor_every=0.01)
        collect(0.0)
    np.testing.assert_array_equal(results[0], 2 * x)
    assert results[1] == {"worker": 0}
    assert received == mine.bytes_sent and sent == mine.bytes_received
    send_bytes = sum(s.nbytes for s in group.trace.spans if s.kind == "send")
    recv_bytes = sum(s.nbytes for s in group.trace.spans if s.kind == "recv")
    assert (recv_bytes, send_bytes) == (received, sent)

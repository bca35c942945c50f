"""The pipe parameter server: real BSP over pipes, exact byte counts, loss goes down, nothing leaks."""
import multiprocessing
import os
import pickle
import signal

import numpy as np
import pytest

import simlib

from simlib.parallel import WorkerDied
from simlib.substrates.pipes import PUSH_DTYPE, DenseKeys


def run_pipe_ps(problem, eval_every=0, **options):
    """BSP over pipes through simlib.run, the metric every ``eval_every`` rounds (0: start and end only)."""
    return simlib.run(problem, "bsp", substrate="pipes", evaluate=eval_every > 0, eval_every=max(eval_every, 1),
                      **options)


def test_bsp_over_pipes_trains_and_counts_bytes(small_problem):
    res = run_pipe_ps(small_problem, n_workers=2, steps=6, batch_size=16, lr=0.5, eval_every=2)
    tr = res.trace
    assert tr.n_workers == 2 and len(tr.updates) == 12
    assert sorted({u.worker for u in tr.updates}) == [0, 1]
    assert tr.quality[-1].value < tr.quality[0].value
    # every push carries 12 bytes per key, as the simulator prices it (key_bytes=4, value_bytes=8)
    pushes = [s for s in tr.spans if s.kind == "send" and s.nbytes % PUSH_DTYPE.itemsize == 0 and s.nbytes > 100]
    assert pushes
    assert not multiprocessing.active_children()


def test_compression_runs_on_pipes_each_worker_encoding_its_push(small_problem):
    """The worker program encodes every push, whatever carries it: top-10% pushes cut what the workers send
    (4-byte keys pulled + 12 bytes a pushed entry: 16 a key uncompressed, 5.2 with top 10%), and still train."""
    def sent(res):
        return sum(s.nbytes for s in res.trace.spans if s.kind == "send")

    full = run_pipe_ps(small_problem, n_workers=2, steps=6, batch_size=16, eval_every=6)
    topk = run_pipe_ps(small_problem, n_workers=2, steps=6, batch_size=16, eval_every=6, compression="topk:0.1")
    assert sent(topk) < 0.5 * sent(full)
    assert topk.trace.quality[-1].value < topk.trace.quality[0].value
    with pytest.raises(ValueError, match="compression"):
        run_pipe_ps(small_problem, compression="zip")


def test_dense_keys_pull_every_parameter(small_problem):
    dense = DenseKeys(small_problem)
    assert len(dense.keys(np.arange(3))) == small_problem.n_params
    res = run_pipe_ps(dense, n_workers=1, steps=2, batch_size=4)
    recv = [s.nbytes for s in res.trace.spans if s.kind == "recv" and s.nbytes >= 8 * small_problem.n_params]
    assert recv and recv[0] == 8 * small_problem.n_params


def test_dense_keys_survive_pickling_as_spawned_workers_receive_them(small_problem):
    """A spawn or forkserver worker gets its problem pickled; unpickling must not recurse into ``__getattr__``."""
    copy = pickle.loads(pickle.dumps(DenseKeys(small_problem)))
    assert copy.n_params == small_problem.n_params and len(copy.keys(np.arange(3))) == small_problem.n_params
    assert copy.l2 == small_problem.l2  # other attributes still come from the wrapped problem


@pytest.mark.parametrize("kwargs, field", [
    ({"n_workers": 0}, "n_workers"), ({"steps": 0}, "steps"), ({"batch_size": -1}, "batch_size"), ({"lr": 0.0}, "lr"),
])
def test_bad_arguments_name_the_field(small_problem, kwargs, field):
    with pytest.raises(ValueError, match=field):
        run_pipe_ps(small_problem, **kwargs)


class _Killed:
    """``small_problem`` whose process SIGKILLs itself: in the server (its first metric) or in worker ``victim``."""

    def __init__(self, problem, victim):
        self.inner, self.victim, self.parent = problem, victim, os.getpid()

    def shards(self, n_workers):
        return list(enumerate(self.inner.shards(n_workers)))

    def batch(self, shard, step, batch_size):
        if shard[0] == self.victim and step == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner.batch(shard[1], step, batch_size)

    def quality(self, params):
        if self.victim == "server" and os.getpid() != self.parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner.quality(params)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("victim, role", [("server", "parameter server"), (2, "worker 2")])
def test_a_killed_member_is_named_by_its_role(small_problem, victim, role):
    with pytest.raises(WorkerDied, match=rf"^{role} failed: .*killed by signal 9"):
        run_pipe_ps(_Killed(small_problem, victim), n_workers=3, steps=4, batch_size=8)
    assert not multiprocessing.active_children()


# -- clocks of several mini-batches, Bosen's managed communication ------------------------------------
# (that every update lands once, with and without a budget, is tests/test_worker.py's, on every substrate)
@pytest.mark.parametrize("budget", [2e4, 2e5])
def test_managed_pipes_keep_to_the_budget(small_problem, budget):
    res = simlib.run(small_problem, "ssp:3", substrate="pipes", n_workers=2, steps=12, batch_size=16, lr=0.5,
                     clock_batches=4, managed_bandwidth=budget, straggler=(1, 0.002), evaluate=False)
    log = np.array(res.trace.meta["managed"]["log"])  # [seconds, bytes the channel sent, worker]
    assert len(log) >= 2
    one_message = log[:, 1].max()
    for width in (1e-3, 1e-2, 5e-2):
        for i in (0, 1):
            mine = log[log[:, 2] == i]
            if len(mine):
                assert np.bincount((mine[:, 0] // width).astype(int), weights=mine[:, 1]).max() <= budget * width + one_message
    assert max(u.clock_lag for u in res.trace.updates) <= 3
    for i in (0, 1):  # the early messages are also the worker's send spans of their clock, as on shm, Ray and sim
        early = [s for s in res.trace.spans if s.worker == i and s.kind == "send" and s.step >= 0]
        assert sum(s.nbytes for s in early) == log[log[:, 2] == i, 1].sum() and {s.step for s in early} <= set(range(12))


@pytest.mark.parametrize("kwargs, words", [
    ({"clock_batches": 0}, "clock_batches"),
    ({"managed_bandwidth": 1e5}, "clock_batches >= 2"),
    ({"clock_batches": 2, "managed_bandwidth": -1.0}, "managed_bandwidth"),
    ({"clock_batches": 2, "managed_bandwidth": 1e5, "protocol": "bsp"}, "stale protocol"),
    ({"clock_batches": 2, "managed_bandwidth": 1e5, "staleness_aware": True}, "managed_bandwidth: staleness_aware"),
])
def test_managed_pipes_refuse_bad_values_by_name(small_problem, kwargs, words):
    kwargs = {"protocol": "ssp:2", **kwargs}
    with pytest.raises(ValueError, match=words):
        simlib.run(small_problem, kwargs.pop("protocol"), substrate="pipes", n_workers=2, steps=2, **kwargs)

"""Adam replicated and sharded (ZeRO-1) on real processes: the math of one process, the state cut n ways."""
import numpy as np
import pytest

from simlib.course.zero import Adam, train_adam
from simlib.parallel.allreduce import ShmAllReduce
from simlib.parallel.group import WorkerGroup
from simlib.parallel.shm import live_segments
from simlib.problems.mlp import MLPProblem

STEPS, BATCH = 6, 16


@pytest.fixture(scope="module")
def mlp():
    return MLPProblem(hidden=(32, 16))


def one_process(prob, n, adam=Adam()):
    """Adam on one process over the global batch: every worker's mini-batch of each step together."""
    w = prob.init_params()
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t in range(1, STEPS + 1):
        rows = np.concatenate([prob.batch(s, t - 1, BATCH) for s in prob.shards(n)])
        adam.step(w, prob.gradient(w, rows), m, v, t)
    return w


@pytest.mark.parametrize("n", [2, 3])
def test_sharded_and_replicated_state_take_one_process_steps_and_the_state_is_cut_n_ways(mlp, n):
    runs = {s: train_adam(mlp, n_workers=n, steps=STEPS, batch_size=BATCH, shard_state=s) for s in (False, True)}
    expected = one_process(mlp, n)
    for run in runs.values():
        np.testing.assert_allclose(run.params, expected, rtol=1e-9, atol=1e-12)
        assert run.spread == 0.0
    assert not np.allclose(expected, mlp.init_params())
    full = 16 * mlp.n_params  # m and v, float64
    assert runs[False].state_bytes == [full] * n
    assert sum(runs[True].state_bytes) == full and max(runs[True].state_bytes) <= 16 * (mlp.n_params // n + 1)
    assert live_segments() == []


def test_sharding_lowers_each_workers_peak_allocation_by_about_the_state_it_drops():
    prob = MLPProblem(hidden=(128, 128))
    full, sharded = (train_adam(prob, n_workers=2, steps=2, batch_size=BATCH, shard_state=s) for s in (False, True))
    dropped = full.state_bytes[0] - sharded.state_bytes[0]
    for a, b in zip(full.peak_bytes, sharded.peak_bytes):
        assert a - b > 0.5 * dropped


def _scatter_gather(i, n, x, coll):
    part = coll.reduce_scatter(x * (i + 1))
    return part, coll.all_gather(part * 10, len(x))


def test_reduce_scatter_gives_each_process_its_part_of_the_sum_and_all_gather_joins_the_parts():
    x = np.arange(10.0)
    with WorkerGroup(3) as group:
        ranks = ShmAllReduce(group, 3, 16).ranks()
        out = group.run(_scatter_gather, x, worker_args=[(r,) for r in ranks], timeout=60)
    parts = [p for p, _ in out]
    np.testing.assert_array_equal(np.concatenate(parts), 6 * x)
    assert [len(p) for p in parts] == [3, 3, 4]
    for _, gathered in out:
        np.testing.assert_array_equal(gathered, 60 * x)


@pytest.mark.parametrize("bad, match", [
    (dict(n_workers=0), "n_workers"), (dict(n_workers=10**6), "n_workers must be an integer in \\[1, 10000\\]"),
    (dict(steps=0), "steps"), (dict(steps=10**12), "steps must be an integer in \\[1, 1000000000\\]"),
    (dict(batch_size=-1), "batch_size"), (dict(batch_size=10**9), "batch_size must be an integer in \\[1, 10000000\\]"),
    (dict(n_workers=1_000), r"^n_workers: train_adam \(a process per worker\) would start 1000 processes"),
    (dict(shard_state="yes"), "shard_state"), (dict(timeout=0), "timeout"), (dict(adam={"lr": 1e-3}), "adam"),
])
def test_bad_options_are_refused_by_name(mlp, bad, match):
    with pytest.raises(ValueError, match=match):
        train_adam(mlp, **bad)


@pytest.mark.parametrize("field, value", [("lr", -1.0), ("lr", float("nan")), ("beta1", 1.0), ("beta2", 2.0),
                                          ("eps", 0.0)])
def test_adams_constants_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        Adam(**{field: value})


def test_a_problem_without_a_gradient_is_refused_by_name():
    class NoGradient:
        n_params = 4

    with pytest.raises(ValueError, match="problem: NoGradient has no gradient"):
        train_adam(NoGradient())

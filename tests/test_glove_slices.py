"""GloveSlices: model-parallel GloVe (each worker owns a slice of the dimensions) through simlib.run on shm."""
import numpy as np
import pytest

import simlib
from glove_reference import train, train_batched
from simlib.data import Vocabulary, load_kjv
from simlib.parallel import live_segments
from simlib.problems.glove import Cooccurrence, GloveConfig, count_cooccurrences
from simlib.problems.glove_slices import DimSlice, GloveSlices
from simlib.protocol import StepRule


@pytest.fixture(scope="module")
def cooc():
    docs = load_kjv().docs[:10]
    vocab = Vocabulary.build(docs, min_count=2)
    ids, offsets = vocab.encode_docs(docs)
    return count_cooccurrences(ids, offsets, len(vocab), window=4)  # 15,065 entries


def run(prob: GloveSlices, n: int, batch: int, epochs: int, **options):
    return simlib.run(prob, "bsp", substrate="shm", n_workers=n, batch_size=batch, lr=prob.config.lr,
                      steps=epochs * prob.epoch_steps(n, batch), **options)


def assert_same_params(got, ref):
    for name in got.ARRAYS:
        np.testing.assert_allclose(getattr(got, name), getattr(ref, name), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("n, batch", [(2, 500), (3, 333)])
def test_processes_compute_the_batched_reference(cooc, n, batch):
    """Every batch's dots read before its updates, on any number of workers: the NumPy reference to float32 rounding."""
    cfg = GloveConfig(dim=8, epochs=3)
    prob = GloveSlices(cooc, cfg, max_workers=n, max_batch=batch)
    res = run(prob, n, batch, cfg.epochs)
    params, costs = train_batched(cooc, cfg, batch)
    assert_same_params(prob.unflatten(res.params), params)
    np.testing.assert_allclose(prob.epoch_costs(res), costs, rtol=1e-7)
    assert res.trace.meta["path"] == "in place" and not live_segments()


def test_workers_record_the_same_costs_and_the_trace_its_quality(cooc):
    cfg = GloveConfig(dim=8, epochs=3)
    prob = GloveSlices(cooc, cfg, max_batch=1024)
    res = run(prob, 2, 1024, cfg.epochs, monitor_every=0.01)
    zero, one = res.measured["local"]
    assert one == {} and sorted(zero) == [0, 1, 2] and all(m == cooc.nnz for _, m in zero.values())
    costs = prob.epoch_costs(res)
    assert all(b < a for a, b in zip(costs, costs[1:])), costs
    quality = [q.value for q in res.trace.quality]
    assert quality[-1] < quality[0] and quality[-1] == pytest.approx(prob.quality(res.params))
    assert any(s.kind == "wait" for s in res.trace.spans)  # at the step barrier


def test_one_worker_batch_one_is_the_c_programs_adagrad(cooc):
    """B = 1: nothing is stale, so the split computes the sequential AdaGrad of the reference C program."""
    cfg = GloveConfig(dim=8, epochs=2)
    prob = GloveSlices(cooc, cfg, max_workers=1, max_batch=1)
    w = prob.init_params().astype(np.float32)
    prob.local_steps(w, prob.shards(1)[0], 0, cfg.epochs * prob.epoch_steps(1, 1), 1, cfg.lr)
    params, costs = train(cooc, cfg)
    assert_same_params(prob.unflatten(w), params)
    record = prob.local_result(prob.shards(1)[0])
    np.testing.assert_allclose([record[p][0] / cooc.nnz for p in range(2)], costs, rtol=1e-6)


def test_shards_are_dimension_slices_and_steps_two_per_batch(cooc):
    prob = GloveSlices(cooc, GloveConfig(dim=10), max_workers=3)
    assert prob.shards(3) == [DimSlice(0, 3, 0, 3), DimSlice(1, 3, 3, 6), DimSlice(2, 3, 6, 10)]
    assert prob.epoch_steps(3, 1000) == 2 * 16  # 15,065 entries: 16 batches
    first, second = prob.batch(prob.shards(3)[1], 0, 1000), prob.batch(prob.shards(3)[1], 1, 1000)
    np.testing.assert_array_equal(first, second)  # both phases of a batch take the same entries
    assert len(prob.batch(prob.shards(3)[0], 31, 1000)) == 65 and prob.n_params == prob.glove.n_params + 3 * 8192


def _tiny() -> Cooccurrence:
    return Cooccurrence(np.array([0, 1, 2], np.int32), np.array([1, 2, 0], np.int32), np.ones(3, np.float32), 3)


@pytest.mark.parametrize("protocol, substrate, options, field", [
    ("async", "shm", {}, "protocol: GloveSlices runs under 'bsp' only"),
    ("ssp:1", "shm", {}, "protocol"),
    ("bsp", "sim", {}, "substrate: GloveSlices runs on substrate 'shm' only"),
    ("bsp", "pipes", {}, "substrate"),
    ("bsp", "gpu", {"xp": "numpy"}, "substrate"),
    ("bsp", "shm", {"n_workers": 5}, "n_workers"),
    ("bsp", "shm", {"batch_size": 9000}, "batch_size"),
    ("bsp", "shm", {"staleness_aware": True}, "staleness_aware"),
    ("bsp", "shm", {"rule": type("Unscaled", (StepRule,), {"scale": lambda self, tau: 1.0})()}, "rule"),
    ("bsp", "shm", {"read_rule": lambda c, done, bound: True}, "read_rule"),
])
def test_runs_it_cannot_take_are_refused_by_name(protocol, substrate, options, field):
    prob = GloveSlices(_tiny(), GloveConfig(dim=4, epochs=1), max_workers=4)
    with pytest.raises(ValueError, match=field):
        simlib.run(prob, protocol, substrate=substrate, **({"n_workers": 2, "steps": 2} | options))


@pytest.mark.parametrize("kwargs, field", [({"max_workers": 5}, "max_workers"), ({"max_workers": 0}, "max_workers"),
                                           ({"max_batch": 0}, "max_batch"), ({"max_batch": 10**13}, "max_batch")])
def test_bad_sizes_are_refused_by_name(kwargs, field):
    with pytest.raises(ValueError, match=field):
        GloveSlices(_tiny(), GloveConfig(dim=4), **kwargs)


def test_get_step_add_and_costs_without_a_run_are_refused():
    prob = GloveSlices(_tiny(), GloveConfig(dim=4))
    batch = prob.batch(prob.shards(1)[0], 0, 2)
    with pytest.raises(ValueError, match="no get / step / add"):
        prob.keys(batch)
    with pytest.raises(ValueError, match="no get / step / add"):
        prob.step(np.zeros(1), batch, np.zeros(1, np.int64), 0.1)
    with pytest.raises(ValueError, match="result"):  # one step: partial dots written, nothing updated
        prob.epoch_costs(simlib.run(prob, "bsp", substrate="shm", n_workers=1, batch_size=2, steps=1))


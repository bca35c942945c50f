"""Tests for simlib.parallel.glove (training) and simlib.parallel.glove_count (counting) on real processes."""
import os
import time
import multiprocessing

import numpy as np
import pytest

from simlib.data import Vocabulary, load_kjv
from simlib.parallel import WorkerDied, live_segments
from simlib.parallel.glove import train_parallel
from simlib.parallel.glove_count import count_parallel, shard_documents
from simlib.problems.glove import GloveConfig, count_cooccurrences, train


@pytest.fixture(scope="module")
def corpus():
    kjv = load_kjv()
    docs = kjv.docs[:120]
    vocab = Vocabulary.build(docs, min_count=3)
    ids, offsets = vocab.encode_docs(docs)
    return vocab, ids, offsets


@pytest.fixture(scope="module")
def cooc(corpus):
    vocab, ids, offsets = corpus
    return count_cooccurrences(ids, offsets, len(vocab), window=6)


def my_segments() -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"simlib_{os.getpid()}_")]


def test_shards_cover_documents_with_balanced_tokens():
    offsets = np.array([0, 10, 20, 30, 40, 100])
    shards = shard_documents(offsets, 2)
    assert shards[0][0] == 0 and shards[-1][1] == 5 and shards[0][1] == shards[1][0]
    assert shard_documents(offsets, 3)[-1] == (4, 5)  # the heavy last document sits alone


def test_parallel_counts_equal_single_process(corpus, cooc):
    vocab, ids, offsets = corpus
    par, trace = count_parallel(ids, offsets, len(vocab), window=6, n_workers=2, buffer_entries=5000)
    np.testing.assert_allclose(par.to_dense(), cooc.to_dense(), rtol=1e-5)
    assert trace.substrate == "parallel" and {s.worker for s in trace.spans} == {0, 1}
    assert not my_segments()


def test_hogwild_one_worker_reproduces_single_process_training(cooc):
    cfg = GloveConfig(dim=16, epochs=3)
    run = train_parallel(cooc, cfg, n_workers=1, mode="hogwild")
    _, costs = train(cooc, cfg)
    np.testing.assert_allclose(run.costs, costs, rtol=1e-6)


@pytest.mark.parametrize("mode", ["hogwild", "model", "sync"])
def test_two_workers_lower_the_cost_and_record_it_per_epoch(cooc, mode):
    cfg = GloveConfig(dim=16, epochs=4)
    run = train_parallel(cooc, cfg, n_workers=2, mode=mode, batch=2048)
    assert all(b < a for a, b in zip(run.costs, run.costs[1:])), run.costs
    assert [q.step for q in run.trace.quality] == [1, 2, 3, 4]
    np.testing.assert_allclose([q.value for q in run.trace.quality], run.costs, rtol=1e-6)
    assert run.trace.substrate == "parallel" and run.updates_per_s > 0
    assert not my_segments() and not live_segments()


@pytest.mark.parametrize("mode", ["hogwild", "model", "sync"])
def test_forked_workers_never_compile_a_kernel(cooc, mode):
    """The parent compiles every kernel a mode's workers call, with their argument types. Two workers
    compiling at once on a fresh checkout (writing numba's cache together) died with SIGSEGV in CI.
    With compiling switched off after the warm-up, forked workers needing a new signature would fail."""
    from numba.core.registry import CPUDispatcher

    import simlib.parallel.glove as pg
    import simlib.problems.glove as problems_glove

    pg._warm_up(mode, 2)
    used = {"hogwild": [pg.adagrad_kernel], "model": [pg.partial_dots_kernel, pg.slice_update_kernel],
            "sync": [pg.batch_gradient_kernel, pg.apply_summed_kernel]}[mode]
    assert all(k.signatures for k in used)  # compiled in this process
    kernels = [k for m in (pg, problems_glove) for k in vars(m).values()
               if isinstance(k, CPUDispatcher) and k.signatures]  # compiled here (the others: never called)
    for k in kernels:
        k.disable_compile()
    try:
        run = train_parallel(cooc, GloveConfig(dim=16, epochs=1), n_workers=2, mode=mode, batch=1000,
                             start_method="fork")  # forked: the switched-off compiler is inherited
    finally:
        for k in kernels:
            k.disable_compile(False)
    assert np.isfinite(run.costs).all()

@pytest.mark.parametrize("mode", ["model", "sync"])
def test_deterministic_modes_do_not_depend_on_worker_count(cooc, mode):
    # Model-parallel splits dimensions and sync sums gradients: the same arithmetic on 1 or 2 workers.
    cfg = GloveConfig(dim=16, epochs=2)
    one = train_parallel(cooc, cfg, n_workers=1, mode=mode, batch=1024)
    two = train_parallel(cooc, cfg, n_workers=2, mode=mode, batch=1024)
    np.testing.assert_allclose(one.costs, two.costs, rtol=1e-4)
    np.testing.assert_allclose(one.params.W, two.params.W, atol=1e-4)


@pytest.mark.parametrize(
    "field, kwargs",
    [("n_workers", {"n_workers": 0}), ("mode", {"mode": "magic"}), ("batch", {"batch": 0}),
     ("n_workers", {"n_workers": 17, "mode": "model"})],
)
def test_bad_configuration_names_the_field(cooc, field, kwargs):
    with pytest.raises(ValueError, match=field):
        train_parallel(cooc, GloveConfig(dim=16, epochs=1), **kwargs)


def test_killed_worker_fails_fast_and_leaks_nothing(cooc, sigkill_a_worker):
    with sigkill_a_worker(delay=0.3) as killed_at, pytest.raises(WorkerDied):
        train_parallel(cooc, GloveConfig(dim=16, epochs=10_000), n_workers=2, mode="hogwild")
    assert killed_at and time.monotonic() - killed_at[0] < 5.0  # the run would go on for minutes
    assert not my_segments() and not live_segments()
    assert not multiprocessing.active_children()

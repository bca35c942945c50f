"""GloVe on real processes: Hogwild and BSP through simlib.run on shared memory, the model-parallel driver
(simlib.parallel.glove), and co-occurrence counting (simlib.parallel.glove_count)."""
import os
import time
import multiprocessing

import numpy as np
import pytest

import simlib
from simlib.data import Vocabulary, load_kjv
from simlib.parallel import WorkerDied, live_segments
from simlib.parallel.glove import train_model_parallel
from simlib.parallel.glove_count import count_parallel, shard_documents
from simlib.problems.glove import GloveConfig, count_cooccurrences
from simlib.problems.glove_table import GloveProblem


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


def on_shm(cooc, protocol: str, epochs: int, **options):
    """``epochs`` passes of GloVe through simlib.run on shared memory, two workers (Hogwild under async)."""
    cfg = GloveConfig(dim=16, epochs=epochs)
    prob = GloveProblem(cooc, cfg)
    batch = 1 if protocol == "async" else 512
    return prob, simlib.run(prob, protocol, substrate="shm", n_workers=2, batch_size=batch, lr=cfg.lr,
                            steps=min(epochs * prob.epoch_steps(2, batch), 10**9), **options)


def test_model_parallel_lowers_the_cost_and_records_it_per_epoch(cooc):
    cfg = GloveConfig(dim=16, epochs=4)
    run = train_model_parallel(cooc, cfg, n_workers=2, batch=2048)
    assert all(b < a for a, b in zip(run.costs, run.costs[1:])), run.costs
    assert [q.step for q in run.trace.quality] == [1, 2, 3, 4]
    np.testing.assert_allclose([q.value for q in run.trace.quality], run.costs, rtol=1e-6)
    assert run.trace.substrate == "parallel" and run.updates_per_s > 0
    assert not my_segments() and not live_segments()
    prob, hogwild = on_shm(cooc, "async", 4)
    assert abs(run.costs[-1] / prob.epoch_costs(hogwild)[-1] - 1) < 0.05  # the same cost as Hogwild's


@pytest.mark.parametrize("how", ["model", "async", "bsp"])
def test_forked_workers_never_compile_a_kernel(cooc, how):
    """The parent compiles every kernel the workers call, with their argument types. Two workers
    compiling at once on a fresh checkout (writing numba's cache together) died with SIGSEGV in CI.
    With compiling switched off after the warm-up, forked workers needing a new signature would fail."""
    from numba.core.registry import CPUDispatcher

    import simlib.parallel.glove as pg
    import simlib.problems.glove as problems_glove
    import simlib.problems.glove_table as glove_table

    if how == "model":
        pg._warm_up(2)
        assert pg.partial_dots_kernel.signatures and pg.slice_update_kernel.signatures  # compiled in this process
    else:
        on_shm(cooc, how, 1)  # the warm-up runs in the parent; this run compiles what it needs there
    kernels = [k for m in (pg, problems_glove, glove_table) for k in vars(m).values()
               if isinstance(k, CPUDispatcher) and k.signatures]  # compiled here (the others: never called)
    for k in kernels:
        k.disable_compile()
    try:
        if how == "model":
            costs = train_model_parallel(cooc, GloveConfig(dim=16, epochs=1), n_workers=2, batch=1000,
                                   start_method="fork").costs  # forked: the switched-off compiler is inherited
        else:
            prob, res = on_shm(cooc, how, 1, start_method="fork")
            costs = prob.epoch_costs(res)
    finally:
        for k in kernels:
            k.disable_compile(False)
    assert np.isfinite(costs).all()


def test_model_parallel_does_not_depend_on_worker_count(cooc):
    # Model-parallel splits dimensions: the same arithmetic on 1 or 2 workers.
    cfg = GloveConfig(dim=16, epochs=2)
    one = train_model_parallel(cooc, cfg, n_workers=1, batch=1024)
    two = train_model_parallel(cooc, cfg, n_workers=2, batch=1024)
    np.testing.assert_allclose(one.costs, two.costs, rtol=1e-4)
    np.testing.assert_allclose(one.params.W, two.params.W, atol=1e-4)


@pytest.mark.parametrize(
    "field, kwargs",
    [("n_workers", {"n_workers": 0}), ("batch", {"batch": 0}), ("n_workers", {"n_workers": 17})],
)
def test_bad_configuration_names_the_field(cooc, field, kwargs):
    with pytest.raises(ValueError, match=field):
        train_model_parallel(cooc, GloveConfig(dim=16, epochs=1), **kwargs)


def test_killed_worker_fails_fast_and_leaks_nothing(cooc, sigkill_a_worker):
    with sigkill_a_worker(delay=0.3) as killed_at, pytest.raises(WorkerDied):
        on_shm(cooc, "async", 10_000)
    assert killed_at and time.monotonic() - killed_at[0] < 5.0  # the run would go on for minutes
    assert not my_segments() and not live_segments()
    assert not multiprocessing.active_children()

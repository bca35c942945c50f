"""The batched (GPU-shaped) LDA sampler: consistent counts, topic recovery, the exact conditional, CuPy twin."""
import numpy as np
import pytest

from simlib.backend import gpu_available
from simlib.gpu.lda import resample_batch, train_batched
from simlib.problems.lda import conditional, count_tables, make_synthetic_corpus, topic_match, topic_word


@pytest.fixture(scope="module")
def synthetic():
    return make_synthetic_corpus(seed=0)


def test_batched_sampler_recovers_the_topics_and_keeps_counts_exact(synthetic):
    corpus, phi, _ = synthetic
    run = train_batched(corpus, 8, alpha=0.5, n_sweeps=60, n_batches=10, xp="numpy", record_every=20)
    n_dk, n_wk, n_k = count_tables(corpus, run.z, 8)
    assert np.array_equal(n_dk, run.n_dk) and np.array_equal(n_wk, run.n_wk) and np.array_equal(n_k, run.n_k)
    assert topic_match(phi, topic_word(run.n_wk, run.n_k, 0.01))[0] >= 0.9
    q = run.trace.quality
    assert run.trace.substrate == "gpu" and q[-1].value > q[0].value and len(run.trace.updates) == 600


def test_one_token_batches_draw_from_the_exact_conditional():
    # A batch of one token is sequential Gibbs: its draws must follow p(z | rest).
    corpus, _, _ = make_synthetic_corpus(n_docs=3, n_topics=3, n_words=6, doc_length=5, seed=1)
    K, a, b = 3, 0.4, 0.2
    z = np.random.default_rng(0).integers(0, K, corpus.n_tokens)
    n_dk, n_wk, n_k = count_tables(corpus, z, K)
    t, d, w = 2, int(corpus.doc_of[2]), int(corpus.words[2])
    ex_dk, ex_wk, ex_k = n_dk[d].copy(), n_wk[w].copy(), n_k.copy()
    ex_dk[z[t]] -= 1
    ex_wk[z[t]] -= 1
    ex_k[z[t]] -= 1
    expected = conditional(ex_dk, ex_wk, ex_k, a, b, corpus.n_words)
    draws = np.zeros(K)
    idx = np.array([t])
    words, docs = corpus.words.astype(np.int64), corpus.doc_of.astype(np.int64)
    for u in (np.arange(4000) + 0.5) / 4000:  # a quasi-random sweep of the unit interval
        zz, dk, wk, k = z.copy(), n_dk.copy(), n_wk.copy(), n_k.copy()
        resample_batch(np, idx, words, docs, zz, dk, wk, k, a, b, np.array([u], np.float32))
        draws[zz[t]] += 1
    assert np.allclose(draws / draws.sum(), expected, atol=2e-3)


def test_bad_input_names_the_field(synthetic):
    corpus, _, _ = synthetic
    with pytest.raises(ValueError, match="n_batches"):
        train_batched(corpus, 8, n_batches=0, xp="numpy")
    with pytest.raises(ValueError, match="n_batches"):
        train_batched(corpus, 8, n_batches=corpus.n_tokens + 1, xp="numpy")
    with pytest.raises(ValueError, match="alpha"):
        train_batched(corpus, 8, alpha=0, xp="numpy")
    with pytest.raises(ValueError, match="kernel"):
        train_batched(corpus, 8, xp="numpy", kernel="fused")
    with pytest.raises(ValueError, match="kernel"):
        train_batched(corpus, 8, xp="numpy", kernel="magic")


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
def test_cupy_path_matches_numpy(synthetic):  # pragma: no cover - needs a GPU
    corpus, phi, _ = synthetic
    gpu = train_batched(corpus, 8, alpha=0.5, n_sweeps=60, n_batches=10, xp="cupy", record_every=60)
    n_dk, n_wk, n_k = count_tables(corpus, gpu.z, 8)
    assert np.array_equal(n_wk, gpu.n_wk) and np.array_equal(n_k, gpu.n_k)
    assert topic_match(phi, topic_word(gpu.n_wk, gpu.n_k, 0.01))[0] >= 0.9


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
def test_fused_kernels_draw_what_the_array_step_draws(synthetic):  # pragma: no cover - needs a GPU
    corpus, phi, _ = synthetic
    # One sweep from the same state with the same uniforms: the same draws, but for the rare
    # token whose u * total falls within rounding of a CDF step (sums in another order).
    arr = train_batched(corpus, 8, alpha=0.5, n_sweeps=1, n_batches=10, xp="cupy", kernel="array")
    fus = train_batched(corpus, 8, alpha=0.5, n_sweeps=1, n_batches=10, xp="cupy", kernel="fused")
    assert fus.trace.meta["kernel"] == "fused" and arr.trace.meta["kernel"] == "array"
    assert np.mean(fus.z == arr.z) > 0.999
    # Many sweeps: the counts stay exactly those of z, and the topics are found.
    run = train_batched(corpus, 8, alpha=0.5, n_sweeps=60, n_batches=10, xp="cupy", kernel="fused", record_every=60)
    n_dk, n_wk, n_k = count_tables(corpus, run.z, 8)
    assert np.array_equal(n_dk, run.n_dk) and np.array_equal(n_wk, run.n_wk) and np.array_equal(n_k, run.n_k)
    assert topic_match(phi, topic_word(run.n_wk, run.n_k, 0.01))[0] >= 0.9

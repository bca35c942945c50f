"""LDA on the gpu substrate: batches of tokens drawn at once, or lock-free per document; consistent counts, topics,
the exact conditional, CuPy."""
import numpy as np
import pytest

import simlib
from simlib.backend import gpu_available
from simlib.problems.lda import conditional, count_tables, make_synthetic_corpus, topic_match, topic_word
from simlib.problems.lda_device import MAX_CHAIN_TOPICS, DeviceShard, chain_sweep, chain_uniform, resample_batch
from simlib.problems.lda_table import LDAProblem


@pytest.fixture(scope="module")
def synthetic():
    return make_synthetic_corpus(seed=0)


def batched(corpus, xp="numpy", kernel="array", n_workers=1, sweeps=60, n_batches=10, protocol="async"):
    """simlib.run on the gpu substrate, each sweep in n_batches batches; (problem, result, z, n_dk, n_wk, n_k)."""
    prob = LDAProblem(corpus, 8, alpha=0.5, beta=0.01)
    prob.device_kernel = kernel
    res = simlib.run(prob, protocol, substrate="gpu", xp=xp, n_workers=n_workers, steps=sweeps,
                     batch_size=-(-corpus.n_tokens // n_workers // n_batches), eval_every=20)
    z = prob.assignments(res)
    return (prob, res, z, *count_tables(corpus, z, 8))


@pytest.mark.parametrize("n_workers, protocol", [(1, "async"), (3, "bsp"), (3, "ssp:1")])
def test_batched_sampler_recovers_the_topics_and_keeps_counts_exact(synthetic, n_workers, protocol):
    corpus, phi, _ = synthetic
    prob, res, z, n_dk, n_wk, n_k = batched(corpus, n_workers=n_workers, protocol=protocol)
    n_wk_table, n_k_table = prob.split(res.params)
    assert np.array_equal(n_wk, n_wk_table) and np.array_equal(n_k, n_k_table)
    assert topic_match(phi, topic_word(n_wk, n_k, 0.01))[0] >= 0.9
    q = res.trace.quality
    assert res.trace.meta["path"] == "in place" and q[-1].value > q[0].value


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
        resample_batch(DeviceShard(np, words, docs, zz, dk), idx, wk, k, a, b, np.array([u], np.float32))
        draws[zz[t]] += 1
    assert np.allclose(draws / draws.sum(), expected, atol=2e-3)


def test_a_bad_device_kernel_is_named(synthetic):
    corpus, _, _ = synthetic
    with pytest.raises(ValueError, match="kernel"):
        batched(corpus, kernel="fused", sweeps=1)
    with pytest.raises(ValueError, match="kernel"):
        batched(corpus, kernel="magic", sweeps=1)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
def test_cupy_path_matches_numpy(synthetic):  # pragma: no cover - needs a GPU
    corpus, phi, _ = synthetic
    *_, z_np, _, _, _ = batched(corpus, kernel="array", sweeps=1)
    *_, z_cp, _, _, _ = batched(corpus, xp="cupy", kernel="array", sweeps=1)
    assert np.mean(z_cp == z_np) > 0.999  # the same stream; float sums may round a rare draw apart
    _, _, _, _, n_wk, n_k = batched(corpus, xp="cupy", kernel="fused")
    assert topic_match(phi, topic_word(n_wk, n_k, 0.01))[0] >= 0.9


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
def test_fused_kernels_draw_what_the_array_step_draws(synthetic):  # pragma: no cover - needs a GPU
    corpus, phi, _ = synthetic
    # One sweep from the same state with the same uniforms: the same draws, but for the rare
    # token whose u * total falls within rounding of a CDF step (sums in another order).
    *_, z_arr, _, _, _ = batched(corpus, xp="cupy", kernel="array", sweeps=1)
    *_, z_fus, _, _, _ = batched(corpus, xp="cupy", kernel="fused", sweeps=1)
    assert np.mean(z_fus == z_arr) > 0.999
    # Many sweeps: the counts stay exactly those of z, and the topics are found.
    prob, res, z, n_dk, n_wk, n_k = batched(corpus, xp="cupy", kernel="fused", n_workers=2, protocol="bsp")
    assert np.array_equal(n_wk, prob.split(res.params)[0]) and np.array_equal(n_k, prob.split(res.params)[1])
    assert topic_match(phi, topic_word(n_wk, n_k, 0.01))[0] >= 0.9


@pytest.mark.parametrize("warps, n_workers, protocol", [(1, 1, "async"), (8, 1, "async"), (32, 3, "bsp")])
def test_lock_free_sweep_recovers_the_topics_and_keeps_counts_exact(synthetic, warps, n_workers, protocol):
    # The kernel's NumPy twin on the gpu substrate: a document's `warps` tokens drawn from one read, then moved.
    corpus, phi, _ = synthetic
    prob = LDAProblem(corpus, 8, alpha=0.5, beta=0.01)
    prob.device_kernel = "hogwild"
    res = simlib.run(prob, protocol, substrate="gpu", xp="numpy", n_workers=n_workers, steps=40, batch_size=warps,
                     eval_every=20)
    z = prob.assignments(res)
    _, n_wk, n_k = count_tables(corpus, z, 8)
    assert np.array_equal(n_wk, prob.split(res.params)[0]) and np.array_equal(n_k, prob.split(res.params)[1])
    assert topic_match(phi, topic_word(n_wk, n_k, 0.01))[0] >= 0.9
    assert res.trace.meta["path"] == "in place"


@pytest.mark.parametrize("kernel", ["dense", "mh", "alias", "word"])
def test_a_cpu_sampler_asked_of_the_gpu_substrate_is_refused_by_name_before_any_work(synthetic, kernel, monkeypatch):
    # the gpu substrate runs its device kernels, never LDAProblem(kernel=...): asking for one is refused, not ignored
    prob = LDAProblem(synthetic[0], 8, alpha=0.5, beta=0.01, kernel=kernel)
    monkeypatch.setattr(prob, "shards", lambda n: pytest.fail("work started before the refusal"))
    with pytest.raises(ValueError, match=rf"^kernel='{kernel}': the gpu substrate does not run the CPU samplers .*"
                                         r"device_kernel 'auto', 'hogwild', 'fused' or 'array'"):
        simlib.run(prob, "bsp", substrate="gpu", xp="numpy", n_workers=1, steps=1)


def test_auto_is_the_lock_free_sweep(synthetic):
    corpus = synthetic[0]
    params = []
    for kernel in ("auto", "hogwild", "array"):
        prob = LDAProblem(corpus, 8, alpha=0.5, beta=0.01)
        prob.device_kernel = kernel
        params.append(simlib.run(prob, "bsp", substrate="gpu", xp="numpy", n_workers=2, steps=3, batch_size=8).params)
    assert np.array_equal(params[0], params[1]) and not np.array_equal(params[0], params[2])


def test_lock_free_sweep_draws_its_first_token_from_the_exact_conditional():
    # The first token of the longest document is drawn before any move: over many sweep seeds, p(z | rest).
    corpus, _, _ = make_synthetic_corpus(n_docs=3, n_topics=3, n_words=6, doc_length=5, seed=1)
    K, a, b = 40, 0.4, 0.2  # 40 topics: two of the kernel's topic slots on the first 8 lanes
    z = np.random.default_rng(0).integers(0, K, corpus.n_tokens)
    n_dk, n_wk, n_k = count_tables(corpus, z, K)
    words = corpus.words.astype(np.int64)
    t, d, w = 0, 0, int(corpus.words[0])
    ex_dk, ex_wk, ex_k = n_dk[d].copy(), n_wk[w].copy(), n_k.copy()
    for counts in (ex_dk, ex_wk, ex_k):
        counts[z[t]] -= 1
    expected = conditional(ex_dk, ex_wk, ex_k, a, b, corpus.n_words)
    draws = np.zeros(K)
    for seed in range(6000):
        dev = DeviceShard(np, words, corpus.doc_of.astype(np.int64), z.astype(np.int64), n_dk.astype(np.int32).copy(),
                          chains=(corpus.offsets.astype(np.int64), np.array([d], np.int32)))
        wk, k = n_wk.astype(np.int32).copy(), n_k.astype(np.int32).copy()
        chain_sweep(dev, wk, k, (a, b), seed, 1)
        draws[dev.z[t]] += 1
    assert np.abs(draws / draws.sum() - expected).max() < 0.025


def test_the_twin_draws_the_kernels_uniforms():
    # The host's hash is the kernel's: splitmix64 of seed + t * golden ratio, its top 24 bits.
    u = np.array([chain_uniform(np.uint64(12345), t) for t in range(20_000)])
    assert 0.0 <= u.min() and u.max() < 1.0 and np.array_equal(u * 2**24, np.floor(u * 2**24))  # 24-bit values
    assert abs(float(u.mean()) - 0.5) < 0.01 and len(np.unique(u)) > 19_950
    x = (12345 + 7 * 0x9E3779B97F4A7C15) % 2**64  # one value by hand, in Python's integers
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
    assert chain_uniform(np.uint64(12345), 7) == np.float32(((x ^ (x >> 31)) >> 40) / 2**24)


def test_lock_free_sweep_names_too_many_topics_and_auto_draws_batches_there():
    corpus, _, _ = make_synthetic_corpus(n_docs=2, n_topics=2, n_words=5, doc_length=3, seed=0)
    prob = LDAProblem(corpus, MAX_CHAIN_TOPICS + 1)
    prob.device_kernel = "hogwild"
    with pytest.raises(ValueError, match="n_topics.*shared memory.*4,000"):
        simlib.run(prob, "bsp", substrate="gpu", xp="numpy", n_workers=1, steps=1, batch_size=4)
    runs = {}
    for kernel in ("auto", "array"):
        prob.device_kernel = kernel
        runs[kernel] = simlib.run(prob, "bsp", substrate="gpu", xp="numpy", n_workers=1, steps=2, batch_size=4).params
    assert np.array_equal(runs["auto"], runs["array"])
    prob.check_counts(runs["auto"])


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("K", [8, 100, 1000])
def test_lock_free_kernel_keeps_counts_exact_and_matches_its_twin(synthetic, K):  # pragma: no cover - needs a GPU
    corpus, phi, _ = synthetic
    lls = {}
    for xp, n_workers in (("numpy", 1), ("cupy", 1), ("cupy", 2)):
        prob = LDAProblem(corpus, K, alpha=0.5 if K == 8 else 0.1, beta=0.01)
        prob.device_kernel = "hogwild"
        res = simlib.run(prob, "bsp", substrate="gpu", xp=xp, n_workers=n_workers, steps=60 if K == 8 else 10,
                         batch_size=4, eval_every=10)
        z = prob.assignments(res)
        _, n_wk, n_k = count_tables(corpus, z, K)
        assert np.array_equal(n_wk, prob.split(res.params)[0]) and np.array_equal(n_k, prob.split(res.params)[1])
        lls[xp, n_workers] = prob.log_likelihood(res.params, z) / corpus.n_tokens
        if K == 8:
            assert topic_match(phi, topic_word(n_wk, n_k, 0.01))[0] >= 0.9, (xp, n_workers)
    if K == 8:  # converged: the same fit as the twin, which draws one document at a time
        assert abs(lls["cupy", 1] - lls["numpy", 1]) < 0.01 * abs(lls["numpy", 1]), lls


def test_lock_free_twin_in_blocks_of_documents_is_the_sweep_in_one_call(synthetic, monkeypatch):
    """The NumPy twin hands its compiled sweep about lda_gibbs.BLOCK tokens of documents a call (Ctrl-C is answered
    between them: on the gpu substrate it runs in the caller's process): the same run to the bit."""
    import simlib.problems.lda_gibbs as gibbs

    def run():
        prob = LDAProblem(synthetic[0], 8, alpha=0.5, beta=0.01)
        prob.device_kernel = "hogwild"
        return simlib.run(prob, "async", substrate="gpu", xp="numpy", n_workers=1, steps=3, batch_size=4).params

    one = run()
    monkeypatch.setattr(gibbs, "BLOCK", 300)
    assert synthetic[0].n_tokens > 20 * gibbs.BLOCK
    np.testing.assert_array_equal(run(), one)

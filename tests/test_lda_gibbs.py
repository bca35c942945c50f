"""The compiled Gibbs sweeps: exact stationary distribution, consistent counts, topic recovery, agreement with `lda`."""
import itertools

import numpy as np
import pytest

from simlib.problems.lda import (
    LDACorpus,
    count_tables,
    log_likelihood,
    make_synthetic_corpus,
    topic_match,
    topic_word,
)
from simlib.problems.lda_gibbs import KERNELS, GibbsState, cpu_per_token, fit


def _exact_posterior(corpus: LDACorpus, K: int, alpha: float, beta: float) -> np.ndarray:
    """p(z | w) for every assignment z, by enumeration (z read as a base-K number, token 0 most significant)."""
    lls = np.array(
        [
            log_likelihood(*count_tables(corpus, np.array(z, np.int32), K), alpha, beta)
            for z in itertools.product(range(K), repeat=corpus.n_tokens)
        ]
    )
    p = np.exp(lls - lls.max())
    return p / p.sum()


@pytest.mark.parametrize("kernel", KERNELS)
def test_chain_samples_the_exact_posterior(kernel):
    corpus = LDACorpus.from_docs([[0, 1, 1], [1, 2]], n_words=3)
    K, alpha, beta = 2, 0.4, 0.3
    exact = _exact_posterior(corpus, K, alpha, beta)
    # The check is sharp enough: doubling alpha moves the posterior by much more than the tolerance.
    assert 0.5 * np.abs(exact - _exact_posterior(corpus, K, 2 * alpha, beta)).sum() > 0.06
    state = GibbsState.init(corpus, K, alpha, beta, seed=0, kernel=kernel)
    weights = K ** np.arange(corpus.n_tokens)[::-1]
    n = 20_000
    seen = np.zeros(len(exact))
    for s in range(n):
        state.sweep(seed=s)
        seen[int(state.z @ weights)] += 1
    assert 0.5 * np.abs(seen / n - exact).sum() < 0.02


@pytest.mark.parametrize("kernel", KERNELS)
def test_tables_stay_equal_to_the_counts_of_z(kernel):
    corpus, _, _ = make_synthetic_corpus(n_docs=80, n_topics=4, n_words=50, doc_length=40, seed=1)
    state = GibbsState.init(corpus, 7, 0.1, 0.01, seed=1, kernel=kernel)
    for s in range(5):
        state.sweep(seed=s)
        state.check_counts()
        assert state.n_wk.min() >= 0 and state.n_dk.min() >= 0
        if kernel in ("sparse", "alias"):  # the per-document topic lists list exactly the non-zero topics
            assert np.array_equal(state.dk_len, (state.n_dk > 0).sum(1))


@pytest.mark.parametrize("kernel", KERNELS)
def test_synthetic_topics_are_recovered(kernel):
    # A random start sometimes settles with two planted topics merged (cosine ~0.86), whatever the
    # kernel: after 50 sweeps in 3 of 40 starts each for sparse, dense and alias, 1 of 40 for mh.
    # So the better of two starts must find them (both failing: under 1% for a sound kernel).
    corpus, phi, _ = make_synthetic_corpus(seed=2)
    scores = []
    for seed in (0, 1):
        state, lls = fit(corpus, 8, alpha=0.5, beta=0.01, n_sweeps=50, seed=seed, kernel=kernel, record_every=25)
        scores.append(topic_match(phi, topic_word(state.n_wk, state.n_k, 0.01))[0])
        assert lls[0] < lls[-1]
    assert max(scores) >= 0.9


def test_log_likelihood_tracks_the_lda_package():
    lda = pytest.importorskip("lda")
    corpus, _, _ = make_synthetic_corpus(n_docs=300, n_topics=10, n_words=400, doc_length=80, seed=5)
    X = np.zeros((corpus.n_docs, corpus.n_words), np.int64)
    np.add.at(X, (corpus.doc_of, corpus.words), 1)
    n = 60
    peer = lda.LDA(n_topics=10, n_iter=n + 1, alpha=0.1, eta=0.01, random_state=0, refresh=20)
    peer.fit(X)
    theirs = np.array(peer.loglikelihoods_)  # after sweeps 0, 20, 40, 60
    ours = np.array(fit(corpus, 10, 0.1, 0.01, n_sweeps=n + 1, seed=0, record_every=20)[1])
    assert np.all(np.abs(ours - theirs[1:]) / np.abs(theirs[1:]) < 0.01)  # theirs[0] is the random start
    # A sampler that ignored the doc-topic counts would be far off: a fresh random start is.
    rand = GibbsState.init(corpus, 10, 0.1, 0.01, seed=9).log_likelihood()
    assert abs(rand - theirs[-1]) / abs(theirs[-1]) > 0.05


@pytest.mark.parametrize("kernel", KERNELS)
def test_memory_counts_the_tables_that_grow_with_k(kernel):
    corpus, _, _ = make_synthetic_corpus(n_docs=30, n_topics=3, n_words=40, doc_length=20, seed=0)
    small, large = (GibbsState.init(corpus, K, kernel=kernel).memory() for K in (5, 50))
    V, D = corpus.n_words, corpus.n_docs
    # n_dk in int16 where the sweep reads it (the documents' lengths fit), int32 where the kernel keeps topic lists
    n_dk_bytes = 4 if kernel in ("sparse", "alias") else 2
    assert large["n_wk, n_k"] == 4 * (V + 1) * 50 and large["n_dk"] == n_dk_bytes * D * 50
    assert ("topic lists" in large) == (kernel in ("sparse", "alias", "word"))
    if kernel in ("sparse", "alias"):  # three D x K int16 tables (K and the documents' lengths fit), int32 lengths
        assert large["topic lists"] == 2 * 3 * D * 50 + 4 * D
    if kernel == "word":  # each word's topics, V x K int16, and their int32 counts
        assert large["topic lists"] == 2 * V * 50 + 4 * V
    assert large["per token"] == small["per token"]  # nothing per token depends on K


def test_the_word_kernel_lists_each_words_topics_again_after_its_counts_change_from_outside():
    """The word kernel keeps each word's topics from sweep to sweep; counts replaced from outside (a read of the
    table, as the get / step / add path does) are listed afresh, and the lists stay the rows' topics."""
    corpus, _, _ = make_synthetic_corpus(n_docs=30, n_topics=3, n_words=40, doc_length=20, seed=0)
    state, other = (GibbsState.init(corpus, 6, kernel="word", seed=s) for s in (0, 1))
    state.sweep(0)
    listed = state._carry[1]
    assert (listed[np.unique(corpus.words)] > 0).all()
    state.check_counts()
    for mine, theirs in ((state.n_wk, other.n_wk), (state.n_k, other.n_k), (state.n_dk, other.n_dk),
                         (state.z_wm, other.z_wm)):
        mine[:] = theirs
    state.counts_changed()
    assert not listed.any()
    state.sweep(1)
    state.check_counts()  # the counts and the lists


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_document_too_long_for_int16_lists_keeps_exact_counts(kernel):
    """The topic lists (sparse, alias) and n_dk (the others) are int16 only where every count fits: a 40,000-token
    document under one topic would wrap."""
    corpus = LDACorpus.from_docs([[0, 1, 2] * 13_334, [1, 2]], n_words=3)
    state = GibbsState(corpus, 2, 0.1, 0.01, np.zeros(corpus.n_tokens, np.int32), kernel=kernel)
    counts = state.dk_cnt if kernel in ("sparse", "alias") else state.n_dk
    assert counts.dtype == np.int32 and counts.max() == 40_002
    state.sweep(seed=0)
    state.check_counts()


def test_cpu_per_token_times_the_sweeps_after_the_first():
    corpus, _, _ = make_synthetic_corpus(n_docs=40, n_topics=3, n_words=30, doc_length=30, seed=1)
    seconds, state = cpu_per_token(corpus, 4, "mh", n_sweeps=2)
    assert 0 < seconds < 1e-3  # CPU seconds per token: well under a millisecond
    ref = GibbsState.init(corpus, 4, kernel="mh")
    for s in range(3):  # the untimed sweep 0, then sweeps 1 and 2
        ref.sweep(seed=s)
    assert np.array_equal(state.z, ref.z)
    with pytest.raises(ValueError, match="n_sweeps"):
        cpu_per_token(corpus, 4, n_sweeps=0)


def test_bad_kernel_names_the_field():
    corpus, _, _ = make_synthetic_corpus(n_docs=5, n_topics=2, n_words=10, doc_length=5, seed=0)
    with pytest.raises(ValueError, match="kernel"):
        GibbsState.init(corpus, 2, kernel="fast")
    with pytest.raises(ValueError, match="n_sweeps"):
        fit(corpus, 2, n_sweeps=0)


def _swept(corpus: LDACorpus, kernel: str, sweeps: int = 3) -> GibbsState:
    state = GibbsState.init(corpus, 6, 0.1, 0.01, seed=0, kernel=kernel)
    for s in range(sweeps):
        state.sweep(seed=s)
    return state


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_sweep_in_blocks_is_the_sweep_in_one_call(monkeypatch, kernel):
    """sweep_words hands its kernel about BLOCK tokens (whole words) a call: the same chain to the bit, the mh and
    alias kernels' stale tables carried from block to block as one call carries them from word to word."""
    import simlib.problems.lda_gibbs as gibbs

    corpus, _, _ = make_synthetic_corpus(n_docs=200, n_topics=6, n_words=150, doc_length=40, seed=3)
    one = _swept(corpus, kernel)
    monkeypatch.setattr(gibbs, "BLOCK", 60)
    assert corpus.n_tokens > 50 * gibbs.BLOCK
    blocks = _swept(corpus, kernel)
    blocks.check_counts()
    for name in ("z", "n_dk", "n_wk", "n_k"):
        assert np.array_equal(getattr(one, name), getattr(blocks, name)), name


def test_ctrl_c_during_a_sweep_is_answered_when_its_block_ends(monkeypatch):
    """A Ctrl-C that arrives while the sweep's first compiled call runs raises KeyboardInterrupt when that call
    returns: the tokens of the words after its block keep their topics (one call per sweep swept them all first)."""
    import signal

    import simlib.problems.lda_gibbs as gibbs

    corpus, _, _ = make_synthetic_corpus(n_docs=200, n_topics=6, n_words=150, doc_length=40, seed=3)
    monkeypatch.setattr(gibbs, "BLOCK", 500)
    kernel, blocks = gibbs._sweep_sparse, []

    def first_block_then_ctrl_c(*args):
        blocks.append(args[4:6])  # the words w_lo, w_hi of this call
        rng = kernel(*args)
        signal.raise_signal(signal.SIGINT)  # Ctrl-C, arriving while the block ran
        return rng

    monkeypatch.setattr(gibbs, "_sweep_sparse", first_block_then_ctrl_c)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    state = GibbsState.init(corpus, 6, 0.1, 0.01, seed=0)
    before = state.z_wm.copy()
    with pytest.raises(KeyboardInterrupt):
        state.sweep(seed=1)
    ((lo, hi),) = blocks
    done = state.word_ptr[hi]
    assert 0 < done < corpus.n_tokens // 10  # a block is a small part of the sweep
    assert np.array_equal(state.z_wm[done:], before[done:]) and not np.array_equal(state.z_wm[:done], before[:done])

"""The LightLDA Metropolis-Hastings kernel ("mh"): exact counts, the exact conditional per token, topic recovery, AD-LDA."""
import numpy as np
import pytest

import simlib
from simlib.problems.lda import (LDACorpus, conditional, count_tables, make_synthetic_corpus, topic_match,
                                topic_word)
from simlib.problems.lda_gibbs import GibbsState, fit, mh_token_draws
from simlib.problems.lda_table import LDAProblem

TINY = LDACorpus.from_docs([[0, 1, 1, 2, 3], [1, 4, 5, 5], [2, 3, 0, 4, 1, 5]], n_words=6)
K, ALPHA, BETA = 3, 0.3, 0.2


def _exact(state: GibbsState, position: int) -> np.ndarray:
    """p(k | every other token) for the token at ``position``, from counts without it."""
    z = state.z
    d, w, s = TINY.doc_of[position], TINY.words[position], z[position]
    n_dk, n_wk, n_k = count_tables(TINY, z, K)
    n_dk[d, s] -= 1
    n_wk[w, s] -= 1
    n_k[s] -= 1
    return conditional(n_dk[d], n_wk[w], n_k, ALPHA, BETA, TINY.n_words)


def _tv(seen: np.ndarray, p: np.ndarray) -> float:
    return 0.5 * float(np.abs(seen / seen.sum() - p).sum())


def test_tables_stay_equal_to_the_counts_of_z():
    corpus, _, _ = make_synthetic_corpus(n_docs=80, n_topics=4, n_words=50, doc_length=40, seed=1)
    state = GibbsState.init(corpus, 7, 0.1, 0.01, seed=1, kernel="mh")
    z0 = state.z
    for s in range(5):
        state.sweep(seed=s)
        state.check_counts()
        assert state.n_wk.min() >= 0 and state.n_dk.min() >= 0
    assert (state.z != z0).mean() > 0.3  # the sweeps moved tokens, so the check above checked moves


def test_same_seed_same_chain():
    corpus, _, _ = make_synthetic_corpus(n_docs=40, n_topics=4, n_words=50, doc_length=30, seed=3)
    a, b, c = (GibbsState.init(corpus, 6, seed=0, kernel="mh") for _ in range(3))
    for s in range(3):
        a.sweep(seed=s)
        b.sweep(seed=s)
        c.sweep(seed=s + 100)
    assert np.array_equal(a.z, b.z) and not np.array_equal(a.z, c.z)


@pytest.mark.parametrize("position", [1, 6, 12])  # a word used 4 times, a once-used word, a 6-token document
def test_one_token_resampled_many_times_follows_the_exact_conditional(position):
    """Tables rebuilt before every draw from counts holding the token, as a sweep builds them."""
    state = GibbsState.init(TINY, K, ALPHA, BETA, seed=4, kernel="mh")
    exact = _exact(state, position)
    seen = mh_token_draws(state, position, 200_000, seed=1)
    assert _tv(seen, exact) < 0.006  # 0.0002-0.0012 measured; sampling noise alone ~0.002
    state.check_counts()


@pytest.mark.parametrize("position", [1, 6, 12])
def test_a_stale_word_table_is_corrected_by_the_acceptance_test(position):
    """A word table built from another assignment: the proposal is far from the target, the chain is not."""
    state = GibbsState.init(TINY, K, ALPHA, BETA, seed=4, kernel="mh")
    exact = _exact(state, position)
    z_old = np.random.default_rng(7).integers(0, K, TINY.n_tokens).astype(np.int32)
    _, wk_old, k_old = count_tables(TINY, z_old, K)
    w = TINY.words[position]
    proposal = (wk_old[w] + BETA) / (k_old + TINY.n_words * BETA)
    assert _tv(proposal, exact) > 0.2  # sampling the proposal itself would fail the check below
    seen = mh_token_draws(state, position, 200_000, seed=2, table=(wk_old[w], k_old, int(z_old[position])))
    assert _tv(seen, exact) < 0.006
    state.check_counts()


def test_a_long_chain_recovers_the_planted_topics_like_the_sparse_sampler():
    # The MH chain mixes more slowly per sweep than exact Gibbs: with 2 cycles per token (LightLDA's
    # default) 2 of 6 random starts on the default 8-topic corpus still had two true topics merged
    # after 100 sweeps (one escaped by sweep 1,350); the kernel runs 4 (lda_gibbs._MH_CYCLES).
    corpus, phi, _ = make_synthetic_corpus(n_docs=300, n_topics=6, n_words=150, doc_length=80, seed=3)
    _, ll_sparse = fit(corpus, 6, alpha=0.5, beta=0.01, n_sweeps=100, seed=0, kernel="sparse", record_every=100)
    state, ll_mh = fit(corpus, 6, alpha=0.5, beta=0.01, n_sweeps=100, seed=0, kernel="mh", record_every=25)
    assert topic_match(phi, topic_word(state.n_wk, state.n_k, 0.01))[0] >= 0.9
    assert abs(ll_mh[-1] - ll_sparse[-1]) < 0.01 * abs(ll_sparse[-1])  # -0.5% to +0.2% over seeds 0-5
    assert ll_mh[0] < ll_mh[-1]


def test_ad_lda_with_the_mh_kernel_on_two_processes_keeps_the_table_exact():
    corpus, _, _ = make_synthetic_corpus(n_docs=120, n_topics=6, n_words=100, doc_length=50, seed=0)
    problem = LDAProblem(corpus, 6, alpha=0.5, beta=0.01, kernel="mh")
    res = simlib.run(problem, "bsp", substrate="shm", n_workers=2, steps=8, timeout=60)
    problem.check_counts(res.params)
    z = problem.assignments(res)
    np.testing.assert_array_equal(problem.split(res.params)[0], count_tables(corpus, z, 6)[1])
    assert res.trace.quality[-1].value > res.trace.quality[0].value


def test_bad_arguments_name_the_field():
    state = GibbsState.init(TINY, K, ALPHA, BETA, seed=0, kernel="mh")
    with pytest.raises(ValueError, match="position"):
        mh_token_draws(state, TINY.n_tokens, 10)
    with pytest.raises(ValueError, match="n_draws"):
        mh_token_draws(state, 0, 0)
    with pytest.raises(ValueError, match="table"):
        mh_token_draws(state, 0, 10, table=(np.zeros(K), np.ones(K), 0))
    with pytest.raises(ValueError, match="kernel"):
        LDAProblem(TINY, K, kernel="lightlda")

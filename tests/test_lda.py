"""LDA math: corpus validation, count tables, the joint log-likelihood, conditional, perplexity, topic matching."""
import numpy as np
import pytest
from scipy.special import gammaln

from simlib.problems.lda import (
    LDACorpus,
    check_hyper,
    conditional,
    count_tables,
    kjv_corpus,
    log_likelihood,
    make_synthetic_corpus,
    perplexity,
    random_assignments,
    text_corpus,
    top_words,
    topic_match,
    topic_word,
)


@pytest.fixture(scope="module")
def tiny():
    return LDACorpus.from_docs([[0, 1, 1], [2, 0], [3, 3, 3, 1]], n_words=4)


def test_bad_hyperparameters_name_the_field():
    with pytest.raises(ValueError, match="n_topics"):
        check_hyper(0, 0.1, 0.01)
    with pytest.raises(ValueError, match="alpha"):
        check_hyper(5, 0.0, 0.01)
    with pytest.raises(ValueError, match="beta"):
        check_hyper(5, 0.1, -1.0)


def test_bad_documents_name_the_field():
    with pytest.raises(ValueError, match="docs must be non-empty; document 1"):
        LDACorpus.from_docs([[0, 1], [], [2]], n_words=3)
    with pytest.raises(ValueError, match=r"word ids must lie in \[0, n_words=3\); document 1 has word id 3"):
        LDACorpus.from_docs([[0, 1], [2, 3]], n_words=3)
    with pytest.raises(ValueError, match="word ids"):
        LDACorpus.from_docs([[-1]], n_words=3)
    with pytest.raises(ValueError, match="docs must hold"):
        LDACorpus.from_docs([], n_words=3)


def test_count_tables_match_a_direct_count(tiny):
    z = np.array([0, 1, 1, 0, 0, 1, 1, 1, 0], dtype=np.int32)
    n_dk, n_wk, n_k = count_tables(tiny, z, 2)
    assert n_dk.tolist() == [[1, 2], [2, 0], [1, 3]]
    assert n_wk[1].tolist() == [1, 2] and n_wk[3].tolist() == [0, 3]
    assert n_k.tolist() == [4, 5]


def test_log_likelihood_equals_the_gamma_function_formula(tiny):
    z = random_assignments(tiny, 3, seed=1)
    n_dk, n_wk, n_k = count_tables(tiny, z, 3)
    a, b, V, K = 0.3, 0.2, 4, 3
    word = sum(
        gammaln(V * b) - gammaln(n_k[k] + V * b) + sum(gammaln(n_wk[w, k] + b) - gammaln(b) for w in range(V))
        for k in range(K)
    )
    doc = sum(
        gammaln(K * a) - gammaln(n_dk[d].sum() + K * a) + sum(gammaln(n_dk[d, k] + a) - gammaln(a) for k in range(K))
        for d in range(3)
    )
    assert log_likelihood(n_dk, n_wk, n_k, a, b) == pytest.approx(word + doc, rel=1e-12)


def test_conditional_is_the_ratio_of_joint_likelihoods(tiny):
    # p(z_i = k | rest) must equal p(w, z with z_i = k) / sum_k' p(w, z with z_i = k').
    K, a, b = 3, 0.5, 0.1
    z = random_assignments(tiny, K, seed=2)
    i, d, w = 4, 1, 0  # token 4 is word 0 in document 1
    joint = []
    for k in range(K):
        z[i] = k
        joint.append(log_likelihood(*count_tables(tiny, z, K), a, b))
    expected = np.exp(np.array(joint) - max(joint))
    expected /= expected.sum()
    n_dk, n_wk, n_k = count_tables(tiny, z, K)
    n_dk[d, z[i]] -= 1
    n_wk[w, z[i]] -= 1
    n_k[z[i]] -= 1
    assert np.allclose(conditional(n_dk[d], n_wk[w], n_k, a, b, 4), expected)


def test_topic_match_scores_a_permutation_as_perfect():
    rng = np.random.default_rng(0)
    phi = rng.dirichlet(np.full(50, 0.1), size=6)
    perm = rng.permutation(6)
    score, match = topic_match(phi, phi[perm])
    assert score == pytest.approx(1.0)
    assert np.array_equal(perm[match], np.arange(6))
    assert topic_match(phi, rng.dirichlet(np.full(50, 0.1), size=6))[0] < 0.5


def test_synthetic_corpus_is_deterministic_and_follows_its_topics():
    c1, phi, theta = make_synthetic_corpus(n_docs=200, n_topics=4, n_words=60, doc_length=80, seed=3)
    c2, _, _ = make_synthetic_corpus(n_docs=200, n_topics=4, n_words=60, doc_length=80, seed=3)
    assert np.array_equal(c1.words, c2.words) and np.array_equal(c1.offsets, c2.offsets)
    # Word frequencies follow the mixture sum_d theta_d phi.
    expected = (theta * np.diff(c1.offsets)[:, None]).sum(0) @ phi
    observed = np.bincount(c1.words, minlength=60)
    assert np.abs(observed - expected).sum() / c1.n_tokens < 0.05


def test_true_topics_give_lower_perplexity_than_uniform_topics():
    corpus, phi, _ = make_synthetic_corpus(n_docs=100, n_topics=5, n_words=80, doc_length=60, seed=4)
    # Counts that encode the true topics almost exactly (a large pseudo-corpus).
    n_wk = np.round(phi.T * 1e6).astype(np.int64)
    good = perplexity(corpus, n_wk, n_wk.sum(0), alpha=0.1, beta=1e-3, n_iter=10)
    flat = perplexity(corpus, np.ones((80, 5), np.int64), np.full(5, 80), alpha=0.1, beta=1e-3, n_iter=10)
    assert flat == pytest.approx(80, rel=1e-6)  # uniform topics: every word has probability 1/V
    assert good < 0.8 * flat


def test_top_words_and_topic_word_agree():
    n_wk = np.array([[5, 0], [1, 7], [3, 2]])
    assert top_words(n_wk, n=2) == [[0, 2], [1, 2]]
    assert top_words(n_wk, n=1, vocab=["a", "b", "c"]) == [["a"], ["b"]]
    phi = topic_word(n_wk, n_wk.sum(0), beta=0.5)
    assert np.allclose(phi.sum(1), 1.0)


def test_kjv_corpus_follows_the_stop_word_rule():
    c = kjv_corpus(max_docs=50)
    assert c.n_docs == 50 and c.titles[0] == "Genesis 1"
    assert "the" not in c.vocab and "lord" not in c.vocab  # among the 100 most frequent
    assert c.n_words > 5000 and c.vocab[0] == "sons"  # the 101st most frequent word


def test_a_text_file_becomes_a_corpus_under_the_same_rule(tmp_path):
    # "a" is the most frequent word (stopped with n_stop=1), "rare" is seen once (dropped at min_count=2)
    lines = ["a cat sat a mat", "", "a dog sat rare", "a cat dog"]
    path = tmp_path / "docs.txt"
    path.write_text("\n".join(lines) + "\n")
    c = text_corpus(str(path), n_stop=1, min_count=2)
    assert c.n_docs == 3 and c.titles == ["line 1", "line 2", "line 3"]  # numbered among the lines with words
    assert "a" not in c.vocab and "rare" not in c.vocab and "mat" not in c.vocab
    assert sorted(c.vocab) == ["cat", "dog", "sat"]
    assert [c.vocab[w] for w in c.words[c.offsets[0]:c.offsets[1]]] == ["cat", "sat"]
    with pytest.raises(ValueError, match="n_stop"):
        text_corpus(str(path), n_stop=10, min_count=2)
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="holds no words"):
        text_corpus(str(tmp_path / "empty.txt"))

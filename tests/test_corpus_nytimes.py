"""The NYTimes-shaped corpus generator (benchmarks/corpus_nytimes.py): its shape, its seed, and its draws' law."""
import numpy as np
import pytest

from benchmarks.corpus_nytimes import NYTIMES, categorical, load_corpus, nytimes_like


def test_a_small_draw_has_nytimes_shape_at_its_scale_and_repeats_for_its_seed():
    c, phi = nytimes_like(scale=1e-3, n_topics=20, seed=1, chunk_tokens=5_000)  # many chunks
    assert (c.n_docs, c.n_words) == (300, 103) and phi.shape == (20, 103)
    assert abs(c.n_tokens / c.n_docs - NYTIMES["tokens"] / NYTIMES["documents"]) < 5  # 332 a document
    again, _ = nytimes_like(scale=1e-3, n_topics=20, seed=1, chunk_tokens=5_000)
    assert np.array_equal(again.words, c.words) and np.array_equal(again.offsets, c.offsets)
    assert not np.array_equal(nytimes_like(scale=1e-3, n_topics=20, seed=2, chunk_tokens=5_000)[0].words, c.words)


def test_categorical_draws_each_rows_law():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(6, 0.5), size=3)
    cdf = np.cumsum(p, axis=1)
    cdf[:, -1] = 1.0
    rows = rng.integers(0, 3, 300_000)
    got = categorical(cdf, rows, rng.random(rows.size))
    for r in range(3):
        seen = np.bincount(got[rows == r], minlength=6) / np.count_nonzero(rows == r)
        assert 0.5 * np.abs(seen - p[r]).sum() < 0.01


def test_with_one_topic_the_words_follow_its_row():
    c, phi = nytimes_like(scale=1e-3, n_topics=1, beta=0.5, seed=3)
    seen = np.bincount(c.words, minlength=c.n_words) / c.n_tokens
    assert 0.5 * np.abs(seen - phi[0]).sum() < 0.02


@pytest.mark.parametrize("field, value", [("scale", 0), ("n_topics", 0), ("alpha", -1.0), ("chunk_tokens", 0)])
def test_bad_input_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        nytimes_like(**{"scale": 1e-3, field: value})


def test_load_corpus_names_the_benchmarks_corpora_and_refuses_a_bad_scale():
    """The LDA benchmarks' --corpus: nytimes:SCALE is the generator's corpus at SCALE (cut to max_docs documents
    where asked); a SCALE that is not a number is an error naming the form."""
    c, name = load_corpus("nytimes:0.001")
    drawn, _ = nytimes_like(0.001)
    np.testing.assert_array_equal(c.words, drawn.words)
    assert "0.001" in name and c.n_words == drawn.n_words and len(set(c.vocab)) == c.n_words  # a name per word
    cut, _ = load_corpus("nytimes:0.001", max_docs=5)
    assert cut.n_docs == 5 and cut.n_words == drawn.n_words
    with pytest.raises(ValueError, match="nytimes:SCALE"):
        load_corpus("nytimes:big")
    with pytest.raises(ValueError, match="scale"):
        load_corpus("nytimes:-1")

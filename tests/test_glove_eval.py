"""Tests for simlib.problems.embedding_eval: neighbours, analogies, similarity, projection."""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np
import pytest

from simlib.data import Vocabulary
from simlib.problems.embedding_eval import (
    KJV_ANALOGIES,
    KJV_SIMILARITY,
    analogy,
    analogy_accuracy,
    load_analogies,
    load_similarity,
    nearest,
    pca_2d,
    plot_projection,
    similarity_score,
)

WORDS = ["king", "queen", "man", "woman", "apple"]
# king = royal + male, queen = royal + female, man = male, woman = female: the analogy holds exactly.
VECS = np.array([[1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 0.1], [0, 0, 1, 0.1], [0, 0, 0, 1.0]])


@pytest.fixture()
def vocab():
    return Vocabulary(WORDS, np.ones(len(WORDS), dtype=np.int64))


def test_nearest_ranks_by_cosine_and_excludes_the_word(vocab):
    out = nearest(VECS, vocab, "king", k=2)
    assert [w for w, _ in out] == ["man", "queen"]
    assert out[0][1] == pytest.approx(1 / np.sqrt(2 * 1.01)) and out[1][1] == pytest.approx(0.5)


def test_analogy_answers_by_3cosadd(vocab):
    assert analogy(VECS, vocab, "man", "woman", "king") == ["queen"]
    sections = {"gender": [("man", "woman", "king", "queen"), ("man", "woman", "king", "apple"),
                           ("man", "woman", "king", "unknownword")]}
    acc = analogy_accuracy(VECS, vocab, sections)
    assert acc["gender"] == {"accuracy": 0.5, "answered": 2, "total": 3}
    assert acc["all"]["accuracy"] == 0.5


def test_shipped_question_files_parse_and_use_the_standard_format():
    sections = load_analogies(KJV_ANALOGIES)
    assert {"gender", "plural", "past-tense", "verb-eth"} <= set(sections)
    assert ("king", "queen", "man", "woman") in sections["gender"]
    pairs = load_similarity(KJV_SIMILARITY)
    assert len(pairs) >= 30 and all(0 <= s <= 10 for _, _, s in pairs)


def test_bad_analogy_line_is_reported_with_its_number(tmp_path: Path):
    p = tmp_path / "q.txt"
    p.write_text(": s\na b c\n")
    with pytest.raises(ValueError, match="line 2"):
        load_analogies(p)


def test_similarity_score_rewards_agreeing_vectors(vocab):
    pairs = [("king", "queen", 8.0), ("man", "woman", 9.0), ("king", "apple", 1.0), ("queen", "apple", 0.5)]
    good = similarity_score(VECS, vocab, pairs)
    assert good["pairs"] == 4 and good["spearman"] > 0.7
    assert similarity_score(VECS, vocab, [(a, b, -s) for a, b, s in pairs])["spearman"] < -0.7


def test_pca_puts_most_variance_on_the_first_axis():
    rng = np.random.default_rng(1)
    pts = rng.normal(size=(200, 5)) * np.array([10.0, 3.0, 0.1, 0.1, 0.1])
    xy = pca_2d(pts)
    assert xy.var(axis=0)[0] > xy.var(axis=0)[1] > 1.0
    assert xy.var(axis=0).sum() == pytest.approx(pts.var(axis=0).sum(), rel=0.05)


def test_plot_projection_labels_points(vocab):
    ax = plot_projection(VECS, vocab, ["king", "queen", "nothere"], title="t")
    assert [t.get_text() for t in ax.texts] == ["king", "queen"] and ax.get_xlabel()
    with pytest.raises(ValueError, match="words"):
        plot_projection(VECS, vocab, ["king"])

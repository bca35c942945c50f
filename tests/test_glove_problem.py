"""Tests for simlib.problems.glove: counting, the loss and its gradient, the AdaGrad kernel, training."""
import numpy as np
import pytest

from simlib.data import Vocabulary, load_kjv
from simlib.problems.embedding_eval import nearest
from simlib.problems.glove import (
    GloveConfig,
    GloveParams,
    adagrad_kernel,
    count_cooccurrences,
    entry_terms,
    loss,
    weight,
)
from glove_reference import train

# Two documents; window 2. Hand count (ordered pairs, both directions, 1/distance):
#   doc 1 "a b a c": a-b d1 (1), a-a d2 (0.5, both orders -> X_aa = 1), b-a d1 (1), b-c d2 (0.5),
#                    a-c d1 (1); a..c at distance 3 is outside the window.
#   doc 2 "c a":     c-a d1 (1). The boundary stops "c | c" (d1) and "c | ... a" (d2).
TINY = [["a", "b", "a", "c"], ["c", "a"]]
EXPECTED = {("a", "b"): 2.0, ("a", "a"): 1.0, ("b", "c"): 0.5, ("a", "c"): 2.0}


def tiny_counts(**kwargs):
    vocab = Vocabulary.build(TINY)
    ids, offsets = vocab.encode_docs(TINY)
    return vocab, count_cooccurrences(ids, offsets, len(vocab), window=2, **kwargs)


@pytest.mark.parametrize("buffer_entries", [1, 4, 1 << 10])  # 1 forces a spill after every token
def test_counts_match_hand_computed_values(buffer_entries):
    vocab, cooc = tiny_counts(buffer_entries=buffer_entries)
    dense = cooc.to_dense()
    expected = np.zeros((3, 3))
    for (u, w), x in EXPECTED.items():
        expected[vocab.id(u), vocab.id(w)] = expected[vocab.id(w), vocab.id(u)] = x
    np.testing.assert_allclose(dense, expected)
    assert cooc.nnz == np.count_nonzero(expected)


def test_counting_spill_gives_same_matrix_on_real_text():
    kjv = load_kjv()
    vocab = Vocabulary.build(kjv.docs[:40], min_count=2)
    ids, offsets = vocab.encode_docs(kjv.docs[:40])
    big = count_cooccurrences(ids, offsets, len(vocab), window=5)
    small = count_cooccurrences(ids, offsets, len(vocab), window=5, buffer_entries=997)
    np.testing.assert_allclose(small.to_dense(), big.to_dense(), rtol=1e-5)
    assert np.allclose(big.to_dense(), big.to_dense().T)


@pytest.mark.parametrize(
    "field, call",
    [
        ("window", lambda ids, off: count_cooccurrences(ids, off, 3, window=0)),
        ("n_words", lambda ids, off: count_cooccurrences(ids[:0] * 0, np.array([0, 0]), 1, window=2)),
        ("ids", lambda ids, off: count_cooccurrences(ids[:0], np.array([0, 0]), 3, window=2)),
    ],
)
def test_bad_counting_input_names_the_field(field, call):
    vocab = Vocabulary.build(TINY)
    ids, offsets = vocab.encode_docs(TINY)
    with pytest.raises(ValueError, match=field):
        call(ids, offsets)


def test_config_validation_names_the_field():
    for field, kwargs in [("dim", {"dim": 0}), ("x_max", {"x_max": -1.0}), ("alpha", {"alpha": 0}),
                          ("lr", {"lr": 0}), ("epochs", {"epochs": 0})]:
        with pytest.raises(ValueError, match=field):
            GloveConfig(**kwargs)


def test_weight_is_capped_power_law():
    x = np.array([1.0, 50.0, 100.0, 1e4])
    np.testing.assert_allclose(weight(x), [0.01 ** 0.75, 0.5 ** 0.75, 1.0, 1.0])


def entry_loss(w, c, bw, bc, x, config):
    """One term of J: f(x) (w . c + bw + bc - log x)^2 (the reference the kernel is checked against)."""
    diff = float(np.dot(w, c)) + bw + bc - np.log(x)
    return float(weight(x, config.x_max, config.alpha) * diff * diff)


def entry_gradient(w, c, bw, bc, x, config):
    """Gradient of one term of J: 2 f diff (c, w, 1, 1) for (w, c, bw, bc)."""
    diff = float(np.dot(w, c)) + bw + bc - np.log(x)
    g = 2.0 * float(weight(x, config.x_max, config.alpha)) * diff
    return g * c, g * w, g, g


def test_entry_gradient_matches_finite_differences():
    rng = np.random.default_rng(3)
    cfg = GloveConfig(dim=6)
    w, c = rng.normal(size=6), rng.normal(size=6)
    bw, bc, x = 0.3, -0.2, 7.5
    gw, gc, gbw, gbc = entry_gradient(w, c, bw, bc, x, cfg)
    h = 1e-6
    for k in range(6):
        e = np.zeros(6)
        e[k] = h
        fd_w = (entry_loss(w + e, c, bw, bc, x, cfg) - entry_loss(w - e, c, bw, bc, x, cfg)) / (2 * h)
        fd_c = (entry_loss(w, c + e, bw, bc, x, cfg) - entry_loss(w, c - e, bw, bc, x, cfg)) / (2 * h)
        assert fd_w == pytest.approx(gw[k], rel=1e-6) and fd_c == pytest.approx(gc[k], rel=1e-6)
    fd_b = (entry_loss(w, c, bw + h, bc, x, cfg) - entry_loss(w, c, bw - h, bc, x, cfg)) / (2 * h)
    assert fd_b == pytest.approx(gbw, rel=1e-6) and fd_b == pytest.approx(gbc, rel=1e-6)


def test_kernel_first_step_is_eta_times_half_gradient():
    # Accumulators start at 1, so the first step is eta * gradient / 2 for vectors and gradient / 2 for
    # biases (the C program's convention: the factor 2 folded in, no learning rate on the biases).
    cfg = GloveConfig(dim=4, lr=0.5)
    p = GloveParams.init(2, cfg)
    before = {k: getattr(p, k).copy() for k in ("W", "C", "bw", "bc")}
    rows, cols, x = np.array([0], np.int32), np.array([1], np.int32), np.array([3.0], np.float32)
    logx, fx = entry_terms(x, cfg)
    adagrad_kernel((rows, cols, logx, fx), np.array([0]), p.arrays(), np.float32(0.5), np.float32(100))
    gw, gc, gbw, gbc = entry_gradient(before["W"][0].astype(float), before["C"][1].astype(float),
                                      float(before["bw"][0]), float(before["bc"][1]), 3.0, cfg)
    np.testing.assert_allclose(before["W"][0] - p.W[0], 0.5 * gw / 2, rtol=1e-3)
    np.testing.assert_allclose(before["C"][1] - p.C[1], 0.5 * gc / 2, rtol=1e-3)
    assert before["bw"][0] - p.bw[0] == pytest.approx(gbw / 2, rel=1e-3)
    np.testing.assert_array_equal(p.W[1], before["W"][1])  # untouched rows stay put


def kjv_small():
    kjv = load_kjv()
    vocab = Vocabulary.build(kjv.docs[:150], min_count=3)
    ids, offsets = vocab.encode_docs(kjv.docs[:150])
    return vocab, count_cooccurrences(ids, offsets, len(vocab), window=8)


def test_training_lowers_loss_epoch_after_epoch():
    _, cooc = kjv_small()
    cfg = GloveConfig(dim=20, epochs=6)
    start = loss(GloveParams.init(cooc.n_words, cfg), cooc, cfg)
    params, costs = train(cooc, cfg)
    assert loss(params, cooc, cfg) < 0.5 * start
    assert all(b < a for a, b in zip(costs, costs[1:])), costs


def test_training_rejects_empty_matrix():
    from simlib.problems.glove_table import GloveProblem

    _, cooc = tiny_counts()
    cooc.values = cooc.values[:0]
    with pytest.raises(ValueError, match="cooc"):
        GloveProblem(cooc, GloveConfig(dim=4))


def test_neighbours_on_kjv_are_sensible():
    kjv = load_kjv()
    vocab = Vocabulary.build(kjv.docs, min_count=5)
    ids, offsets = vocab.encode_docs(kjv.docs)
    cooc = count_cooccurrences(ids, offsets, len(vocab), window=10)
    params, _ = train(cooc, GloveConfig(dim=50, epochs=8))
    vec = params.vectors()
    near_gold = [w for w, _ in nearest(vec, vocab, "gold", 10)]
    near_silver = [w for w, _ in nearest(vec, vocab, "silver", 10)]
    assert "silver" in near_gold and "gold" in near_silver, (near_gold, near_silver)

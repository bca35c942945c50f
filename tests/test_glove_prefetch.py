"""Prefetching changes no value: adagrad_kernel with ``ahead > 0`` makes the updates it makes without (to float32
rounding: fastmath may vectorise the two compiled variants differently), whatever the distance."""
import numpy as np
import pytest

from simlib.problems.glove import GloveConfig, GloveParams, adagrad_kernel, entry_terms, epoch_order
from simlib.problems.glove_prefetch import AHEAD


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ahead", [1, AHEAD, 10_000])
@pytest.mark.parametrize("dim", [1, 16, 50])
def test_prefetching_makes_the_same_updates(cooc, dtype, ahead, dim):
    """Two passes in shuffled order (ahead past the end of the order included), on float32 arrays and on float64
    storage holding float32 values: the same parameters and cost, to float32 rounding."""
    cfg = GloveConfig(dim=dim, seed=5)
    logx, fx = entry_terms(cooc.values, cfg)
    entries = (cooc.rows, cooc.cols, logx, fx)
    plain = tuple(a.astype(dtype) for a in GloveParams.init(cooc.n_words, cfg).arrays())
    fetched = tuple(a.copy() for a in plain)
    eta, clip = np.float32(cfg.lr), np.float32(cfg.grad_clip)
    for p in range(2):
        order = epoch_order(cooc.nnz, cfg.seed, p)
        want = adagrad_kernel(entries, order, plain, eta, clip)
        got = adagrad_kernel(entries, order, fetched, eta, clip, ahead)
        assert got == pytest.approx(want, rel=1e-6)
    for name, a, b in zip(GloveParams.ARRAYS, plain, fetched):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6, err_msg=name)
    assert not np.array_equal(plain[0], GloveParams.init(cooc.n_words, cfg).W)  # the passes did update


def test_an_empty_order_changes_nothing(cooc):
    cfg = GloveConfig(dim=8)
    logx, fx = entry_terms(cooc.values, cfg)
    params = GloveParams.init(cooc.n_words, cfg)
    before = [a.copy() for a in params.arrays()]
    cost = adagrad_kernel((cooc.rows, cooc.cols, logx, fx), np.zeros(0, np.int64), params.arrays(),
                          np.float32(cfg.lr), np.float32(cfg.grad_clip), AHEAD)
    assert cost == 0.0 and all(np.array_equal(a, b) for a, b in zip(before, params.arrays()))

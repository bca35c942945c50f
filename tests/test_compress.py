"""Compressors: exact wire sizes, (un)biasedness, error feedback's conservation, bad specs."""
from __future__ import annotations

import math

import numpy as np
import pytest

from simlib.backend import gpu_available
from simlib.compress import NAMES, make_compressor, parse_spec

N = 1_000


def _sparse_message(rng: np.random.Generator, k: int) -> tuple[np.ndarray, np.ndarray]:
    keys = np.sort(rng.choice(N, k, replace=False)).astype(np.int64)
    return keys, rng.normal(size=k)


def _qsgd_bound(norm: float, n_draws: int, dim: int, delta: float) -> float:
    """Hoeffding + union bound: each draw of Q(v)_i lies in an interval of width ||v||, so
    P(any |mean_i - v_i| > t) <= 2 dim exp(-2 n t^2 / ||v||^2) = delta."""
    return norm * math.sqrt(math.log(2 * dim / delta) / (2 * n_draws))


# -- exact sizes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 7, 8, 9, 333])
def test_byte_counts_match_the_documented_formulas_for_sparse_messages(k: int) -> None:
    rng = np.random.default_rng(k)
    keys, vals = _sparse_message(rng, k)
    vals[0] = 0.0  # one exact zero, which only 'sparse' drops
    nnz = k - 1

    def idx(m: int) -> int:  # a list of 4-byte key ids or a bitmap over N, whichever is smaller
        return min(4 * m, math.ceil(N / 8)) if m else 0

    kk = math.ceil(0.1 * k)
    expected = {
        "none": 4 * k + idx(k),
        "sparse": 4 * nnz + idx(nnz),
        "onebit": math.ceil(k / 8) + 8 + idx(k),
        "qsgd": 4 + math.ceil(2 * k / 8) + idx(k),
        "qsgd:4": 4 + math.ceil(4 * k / 8) + idx(k),  # sign + 3 bits for levels 0..4
        "topk-noef:0.1": 4 * kk + idx(kk),
        "topk-noef:5": 4 * min(5, k) + idx(min(5, k)),
        "budget:100": 4 * min(12, k) + idx(min(12, k)),  # 12 (key, value) pairs fit in 100 bytes
    }
    for spec, nbytes in expected.items():
        out_keys, out_vals, got = make_compressor(spec, N, rng)(keys, vals)
        assert got == nbytes, spec
        assert len(out_keys) == len(out_vals)


def test_large_sparse_messages_switch_to_a_bitmap_index() -> None:
    rng = np.random.default_rng(15)
    keys, vals = _sparse_message(rng, 31)  # 31 key ids (124 bytes) beat a 125-byte bitmap
    assert make_compressor("none", N, rng)(keys, vals)[2] == 4 * 31 + 124
    keys, vals = _sparse_message(rng, 32)  # 128 bytes of ids: the bitmap wins
    assert make_compressor("none", N, rng)(keys, vals)[2] == 4 * 32 + 125
    # A budget large enough for a bitmap packs (B - 125) / 4 values instead of B / 8 pairs.
    keys, vals = _sparse_message(rng, 600)
    k, _, nbytes = make_compressor("budget:1125", N, rng)(keys, vals)
    assert len(k) == 250 and nbytes == 1125


def test_dense_messages_carry_no_indices() -> None:
    rng = np.random.default_rng(1)
    keys, vals = np.arange(N), rng.normal(size=N)
    assert make_compressor("none", N, rng)(keys, vals)[2] == 4 * N
    assert make_compressor("onebit", N, rng)(keys, vals)[2] == N // 8 + 8
    assert make_compressor("qsgd", N, rng)(keys, vals)[2] == 4 + N // 4
    # Sizes follow the configured wire widths (8-byte keys and values here).
    assert make_compressor("topk-noef:10", N, rng, key_bytes=8, value_bytes=8)(keys, vals)[2] == 160


def test_none_and_sparse_are_lossless() -> None:
    rng = np.random.default_rng(2)
    keys, vals = _sparse_message(rng, 50)
    vals[::5] = 0.0
    k0, v0, _ = make_compressor("none", N, rng)(keys, vals)
    np.testing.assert_array_equal(k0, keys)
    np.testing.assert_array_equal(v0, vals)
    k1, v1, _ = make_compressor(None, N, rng)(keys, vals)  # None means 'none'
    np.testing.assert_array_equal(v1, vals)
    ks, vs, _ = make_compressor("sparse", N, rng)(keys, vals)
    np.testing.assert_array_equal(ks, keys[vals != 0])
    np.testing.assert_array_equal(vs, vals[vals != 0])


# -- bias ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["qsgd", "qsgd:4"])
def test_stochastic_quantization_is_unbiased(spec: str) -> None:
    """The mean of n draws lies within the Hoeffding bound of v on every coordinate.

    The bound holds for all coordinates at once with probability >= 1 - 1e-6, so this test
    fails by chance at most once in a million runs (and never, for the fixed seed).
    """
    rng = np.random.default_rng(3)
    keys, v = _sparse_message(rng, 40)
    v *= rng.lognormal(0, 1, size=40)  # mixed magnitudes: large and tiny entries
    comp = make_compressor(spec, N, np.random.default_rng(4))
    n_draws = 20_000
    total = np.zeros_like(v)
    for _ in range(n_draws):
        out_keys, q, _ = comp(keys, v)
        total += q
    np.testing.assert_array_equal(out_keys, keys)
    mean = total / n_draws
    bound = _qsgd_bound(float(np.linalg.norm(v)), n_draws, len(v), delta=1e-6)
    assert np.max(np.abs(mean - v)) <= bound
    # The check has power: the biased 1-bit scheme falls outside the same bound.
    q1 = make_compressor("onebit", N, rng)(keys, v)[1]
    assert np.max(np.abs(q1 - v)) > 10 * bound


def test_stochastic_quantization_draws_are_sign_times_norm_levels() -> None:
    rng = np.random.default_rng(5)
    keys, v = _sparse_message(rng, 100)
    q = make_compressor("qsgd", N, rng)(keys, v)[1]
    norm = np.linalg.norm(v)
    assert set(np.unique(np.abs(q)).round(12)) <= {0.0, round(norm, 12)}
    assert np.all((q == 0) | (np.sign(q) == np.sign(v)))


def test_onebit_decodes_to_per_sign_averages_and_is_biased() -> None:
    v = np.array([10.0, 1.0, -1.0, -3.0])
    _, q, _ = make_compressor("onebit", 4, np.random.default_rng(0))(np.arange(4), v)
    np.testing.assert_array_equal(q, [5.5, 5.5, -2.0, -2.0])
    bias = q - v  # deterministic scheme: E[Q(v)] - v = Q(v) - v
    np.testing.assert_array_equal(bias, [-4.5, 4.5, -1.0, 1.0])
    # Per-sign sums are kept, so the bias sums to zero within each sign group.
    assert bias[:2].sum() == 0 and bias[2:].sum() == 0


def test_onebit_bias_on_minibatch_gradients_is_large_and_qsgd_is_not(small_problem) -> None:
    """Averaged over many mini-batches, 1-bit gradients miss the mean gradient; QSGD's do not."""
    prob = small_problem
    rng = np.random.default_rng(6)
    w = rng.normal(0, 0.5, size=prob.n_params)
    one, qs = make_compressor("onebit", prob.n_params, rng), make_compressor("qsgd", prob.n_params, rng)
    n = prob.n_params
    g_sum, one_sum, qs_sum = np.zeros(n), np.zeros(n), np.zeros(n)
    draws = 400
    for t in range(draws):
        batch = prob.batch((0, prob.data.n_rows), t, 32)
        keys, g = prob.gradient(w[prob.keys(batch)], batch)
        g_sum[keys] += g
        k1, v1, _ = one(keys, g)
        one_sum[k1] += v1
        k2, v2, _ = qs(keys, g)
        qs_sum[k2] += v2
    rel = lambda s: np.linalg.norm(s - g_sum) / np.linalg.norm(g_sum)  # noqa: E731
    assert rel(one_sum) > 0.5  # measured 0.75: the bias does not average out
    assert rel(qs_sum) < rel(one_sum) / 2  # measured 0.17, shrinking as 1/sqrt(draws)


# -- top-k, budget, error feedback ---------------------------------------------------------------
def test_topk_without_feedback_keeps_the_largest_entries() -> None:
    keys = np.array([2, 4, 6, 8, 10])
    vals = np.array([0.1, -5.0, 0.3, 2.0, -0.2])
    k, v, nbytes = make_compressor("topk-noef:2", N, np.random.default_rng(0))(keys, vals)
    np.testing.assert_array_equal(k, [4, 8])
    np.testing.assert_array_equal(v, [-5.0, 2.0])
    assert nbytes == 16


@pytest.mark.parametrize("spec", ["topk:0.05", "topk:3", "budget:64", "onebit-ef", "qsgd-ef"])
def test_error_feedback_conserves_mass(spec: str) -> None:
    """Per key and in total: everything sent plus the residual equals everything pushed."""
    rng = np.random.default_rng(7)
    comp = make_compressor(spec, N, rng)
    pushed, sent = np.zeros(N), np.zeros(N)
    for _ in range(30):
        keys, vals = _sparse_message(rng, 60)
        pushed[keys] += vals
        k, v, _ = comp(keys, vals)
        assert np.all(np.diff(k) > 0)
        sent[k] += v
    np.testing.assert_allclose(sent + comp.residual, pushed, atol=1e-12)
    assert sent.sum() + comp.residual.sum() == pytest.approx(pushed.sum(), abs=1e-9)
    assert np.abs(comp.residual).sum() > 0  # something really was held back


def test_error_feedback_eventually_sends_held_back_mass() -> None:
    comp = make_compressor("topk:1", N, np.random.default_rng(0))
    k, v, _ = comp(np.array([3, 9]), np.array([1.0, 0.5]))
    np.testing.assert_array_equal(k, [3])
    # Key 9 is not in the next message, yet its residual competes and wins.
    k, v, _ = comp(np.array([4]), np.array([0.1]))
    np.testing.assert_array_equal(k, [9])
    np.testing.assert_array_equal(v, [0.5])


def test_budget_never_exceeds_its_bytes_and_sends_largest_first() -> None:
    rng = np.random.default_rng(8)
    comp = make_compressor("budget:50", N, rng)  # 6 pairs of (4-byte key, 4-byte value) fit
    for _ in range(20):
        keys, vals = _sparse_message(rng, 40)
        before = comp.residual.copy() if comp.residual is not None else np.zeros(N)
        acc = before.copy()
        acc[keys] += vals
        k, v, nbytes = comp(keys, vals)
        assert nbytes == 4 * 6 + 24 and len(k) == 6
        assert np.min(np.abs(v)) >= np.max(np.abs(np.delete(acc, k)))


def test_error_feedback_recovers_the_uncompressed_loss_curve(small_problem) -> None:
    """Serial SGD sending the top 5% with error feedback tracks uncompressed SGD's loss within 1%
    at every checkpoint (measured 0.7%); without feedback it stays far behind (measured 20%)."""
    prob = small_problem
    rng = np.random.default_rng(9)

    def run(spec: str) -> list[float]:
        comp = make_compressor(spec, prob.n_params, rng)
        w = prob.init_params()
        losses = []
        for t in range(600):
            batch = prob.batch((0, prob.data.n_rows), t, 32)
            keys, g = prob.gradient(w[prob.keys(batch)], batch)
            k, v, _ = comp(keys, g)
            w[k] -= 2.0 * v
            if t % 100 == 99:
                losses.append(prob.loss(w))
        return losses

    base, ef, noef = run("none"), run("topk:0.05"), run("topk-noef:0.05")
    assert np.all(np.abs(np.array(ef) / np.array(base) - 1) < 0.01)
    assert noef[-1] > base[-1] * 1.05


# -- validation, determinism, GPU ----------------------------------------------------------------
@pytest.mark.parametrize("bad", ["gzip", "topk", "topk:0", "topk:2.5", "budget:-3", "qsgd:0", "none:1", "topk:x", 3])
def test_bad_specs_raise_naming_compression(bad) -> None:
    with pytest.raises(ValueError, match="compression"):
        make_compressor(bad, N, np.random.default_rng(0))


def test_unknown_name_lists_the_allowed_names() -> None:
    with pytest.raises(ValueError) as err:
        parse_spec("gzip")
    for name in NAMES:
        assert repr(name) in str(err.value)


def test_mismatched_lengths_are_rejected() -> None:
    with pytest.raises(ValueError, match="same length"):
        make_compressor("none", N, np.random.default_rng(0))(np.arange(3), np.zeros(2))


def test_stochastic_quantization_is_reproducible_for_a_seed() -> None:
    keys, v = _sparse_message(np.random.default_rng(10), 200)
    a = make_compressor("qsgd", N, np.random.default_rng(11))(keys, v)[1]
    b = make_compressor("qsgd", N, np.random.default_rng(11))(keys, v)[1]
    c = make_compressor("qsgd", N, np.random.default_rng(12))(keys, v)[1]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("spec", ["none", "sparse", "onebit", "qsgd", "topk:0.1", "budget:64", "onebit-ef"])
def test_cupy_path_matches_numpy(spec: str) -> None:
    import cupy as cp

    keys, v = _sparse_message(np.random.default_rng(13), 100)
    ref = make_compressor(spec, N, np.random.default_rng(14))
    dev = make_compressor(spec, N, np.random.default_rng(14))
    for _ in range(3):
        k0, v0, b0 = ref(keys, v)
        k1, v1, b1 = dev(cp.asarray(keys), cp.asarray(v))
        assert isinstance(v1, cp.ndarray) and b1 == b0
        np.testing.assert_array_equal(cp.asnumpy(k1), k0)
        np.testing.assert_allclose(cp.asnumpy(v1), v0, rtol=1e-12)


def test_error_feedback_recovers_the_uncompressed_curve_in_the_simulator(small_problem) -> None:
    """4 workers, BSP, top-10% pushes: with error feedback every point of the loss curve is within
    1% of the uncompressed one (measured 0.46%) at a tenth of the bytes; without it, not (4.6%)."""
    import simlib

    cluster = dict(n_workers=4, steps=80, bandwidth=1e7)
    runs = {s: simlib.run(small_problem, "bsp", substrate="sim", **cluster, compression=s).trace
            for s in (None, "topk:0.1", "topk-noef:0.1")}
    curve = {s: np.array([q.value for q in t.quality]) for s, t in runs.items()}
    gap = lambda s: np.max(np.abs(curve[s] / curve[None] - 1))  # noqa: E731
    assert gap("topk:0.1") < 0.01
    assert gap("topk-noef:0.1") > 0.03
    sent = {s: t.summary()["bytes_sent"] for s, t in runs.items()}
    assert sent["topk:0.1"] < 0.12 * sent[None]


def test_random_budget_sends_as_many_bytes_as_the_budget_but_not_by_size() -> None:
    rng = np.random.default_rng(3)
    keys = np.arange(0, 400, 2)
    vals = np.linspace(-1, 1, keys.size)
    prio = make_compressor("budget:80", 1000, np.random.default_rng(0))
    rand = make_compressor("budget-random:80", 1000, rng)
    kp, vp, bp = prio(keys, vals)
    kr, vr, br = rand(keys, vals)
    assert bp == br <= 80 and len(kp) == len(kr) == 10
    assert np.abs(vp).min() >= np.abs(vals).max() - 0.1  # the largest entries
    assert np.abs(vr).mean() < np.abs(vp).mean()  # a random subset is smaller on average
    assert set(kr.tolist()) <= set(keys.tolist())
    # error feedback: what was not sent stays in the residual
    assert rand.residual.sum() == pytest.approx(vals.sum() - vr.sum())

"""Sparse logistic regression: generator, loss, sparse gradient against finite differences."""
import numpy as np
import pytest

from simlib.problems.logistic import LogisticProblem, SparseDataset, _ranges, make_sparse_classification


def test_generator_is_deterministic_and_well_formed():
    a = make_sparse_classification(500, 200, 8, seed=3)
    b = make_sparse_classification(500, 200, 8, seed=3)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.y, b.y)
    norms = np.sqrt(np.add.reduceat(a.values.astype(np.float64) ** 2, a.indptr[:-1]))
    assert np.allclose(norms, 1.0, atol=1e-5)
    for r in range(a.n_rows):  # sorted, unique ids within each row
        row = a.indices[a.indptr[r] : a.indptr[r + 1]]
        assert np.all(np.diff(row) > 0)


def test_label_noise_flips_about_that_fraction():
    clean = make_sparse_classification(20_000, 300, 8, label_noise=0.0, seed=1)
    noisy = make_sparse_classification(20_000, 300, 8, label_noise=0.2, seed=1)
    assert np.mean(clean.y != noisy.y) == pytest.approx(0.2, abs=0.015)


def test_loss_at_zero_is_log2(small_problem):
    assert small_problem.loss(small_problem.init_params()) == pytest.approx(np.log(2.0))


def test_sparse_gradient_matches_finite_differences(small_problem):
    p = small_problem
    rng = np.random.default_rng(0)
    w = rng.normal(scale=0.3, size=p.n_params)
    batch = p.batch((0, 500), step=2, batch_size=16)
    keys, g = p.gradient(w[p.keys(batch)], batch)

    def batch_loss(wk):
        full = w.copy()
        full[keys] = wk
        d = p.data
        m = np.array([d.values[d.indptr[r] : d.indptr[r + 1]] @ full[d.indices[d.indptr[r] : d.indptr[r + 1]]] for r in batch])
        return np.mean(np.log1p(np.exp(-d.y[batch] * m))) + 0.5 * p.l2 * np.sum(wk**2)

    wk, eps = w[keys].copy(), 1e-6
    fd = np.array([(batch_loss(wk + eps * e) - batch_loss(wk - eps * e)) / (2 * eps) for e in np.eye(len(keys))])
    assert np.allclose(fd, g, atol=1e-7)


def test_sgd_lowers_loss(small_problem):
    p = small_problem
    w = p.init_params()
    for s in range(200):
        b = p.batch((0, p.data.n_rows), s, 20)
        k, g = p.gradient(w[p.keys(b)], b)
        w[k] -= 0.5 * g
    assert p.loss(w) < 0.6 and p.accuracy(w) > 0.7


@pytest.mark.parametrize("starts, lens", [([5, 0, 9, 2], [3, 0, 2, 1]), ([5, 10, 0], [0, 3, 2]), ([4, 4], [0, 0]),
                                          ([7, 1, 3, 8], [0, 0, 1, 2])])
def test_ranges_vectorised_equals_loop(starts, lens):
    loop = [i for s, n in zip(starts, lens) for i in range(s, s + n)]  # empty ranges anywhere, the first included
    assert _ranges(np.array(starts), np.array(lens)).tolist() == loop


def test_a_batch_starting_with_an_empty_row_gets_the_gradient_of_its_rows():
    # row 0 has no nonzeros, and the batch skips row 1: the gathered columns must be row 2's
    data = SparseDataset(np.array([0, 0, 2, 3]), np.array([3, 1, 2]), np.array([1.0, 2.0, 3.0]),
                         np.array([1.0, 1.0, -1.0]), n_features=4)
    p = LogisticProblem(data, l2=0.0, eval_rows=None)
    batch, keys, w = np.array([0, 2]), np.array([2]), np.array([0.5])
    x, y = np.array([3.0]), -1.0  # row 2 on key 2
    expected = -y * x / (1 + np.exp(y * (x @ w))) / 2  # d log(1 + e^(-y x.w)) / dw, mean over the batch's two rows
    for got in (p.gradient_xp(w, batch, keys)[1], p.gradient(w, batch, keys)[1]):  # array code, compiled kernel
        assert np.allclose(got, expected)


def test_shards_cover_rows_exactly(small_problem):
    sh = small_problem.shards(3)
    assert sh[0][0] == 0 and sh[-1][1] == small_problem.data.n_rows
    assert all(a[1] == b[0] for a, b in zip(sh, sh[1:]))
    with pytest.raises(ValueError, match="n_workers"):
        small_problem.shards(0)


@pytest.mark.parametrize(
    "kwargs, field",
    [({"n_rows": 0}, "n_rows"), ({"nnz_per_row": 0}, "nnz_per_row"), ({"label_noise": 1.5}, "label_noise")],
)
def test_bad_generator_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        make_sparse_classification(**kwargs)


def test_bad_dataset_is_rejected():
    with pytest.raises(ValueError, match="finite"):
        SparseDataset(np.array([0, 1]), np.array([0], np.int32), np.array([np.nan], np.float32), np.array([1.0], np.float32), 3)
    with pytest.raises(ValueError, match="indices"):
        SparseDataset(np.array([0, 1]), np.array([7], np.int32), np.array([1.0], np.float32), np.array([1.0], np.float32), 3)


def test_compiled_kernels_equal_the_array_module_code(small_problem):
    p = small_problem
    rng = np.random.default_rng(5)
    w = rng.normal(size=p.n_params)
    for step in range(5):
        batch = p.batch((100, 1900), step, 37)
        ref_keys = np.unique(p.data.to_scipy()[batch].indices)
        keys = p.keys(batch)
        assert np.array_equal(keys, ref_keys)
        _, g = p.gradient(w[keys], batch, keys)
        _, g_ref = p.gradient_xp(w[keys], batch, keys)
        assert np.allclose(g, g_ref, rtol=1e-12, atol=1e-15)


def test_compiled_loss_equals_the_array_module_formula(small_problem):
    p = small_problem
    w = np.random.default_rng(9).normal(scale=0.5, size=p.n_params)
    e = p._eval
    margin = np.bincount(p._eval_row_of, weights=e.values * w[e.indices], minlength=e.n_rows)
    ref = np.mean(np.logaddexp(0.0, -e.y * margin)) + 0.5 * p.l2 * np.dot(w, w)
    assert p.loss(w) == pytest.approx(ref, rel=1e-12)


# -- l2_on='all': the full objective's step on the contract ----------------------------------------------
def _sklearn_weights(data, lr: float, l2: float, epochs: int) -> np.ndarray:
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import SGDClassifier

    peer = SGDClassifier(loss="log_loss", penalty="l2", alpha=l2, learning_rate="constant", eta0=lr,
                         fit_intercept=False, shuffle=False, max_iter=epochs, tol=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        peer.fit(data.to_scipy().astype(np.float64), data.y)
    return peer.coef_.ravel()


@pytest.mark.parametrize("substrate", ["sim", "shm", "pipes"])
def test_full_l2_at_one_row_per_step_computes_scikit_learns_weights(substrate):
    """One worker, one row per step, every weight decayed every step: SGDClassifier's weights, on the
    message path (sim, pipes) and the in-place path (shm) alike; the sparse treatment does not."""
    import simlib

    data = make_sparse_classification(1_500, 300, 8, seed=2)
    full = LogisticProblem(data, l2=1e-3, eval_rows=None, l2_on="all")
    res = simlib.run(full, "bsp", substrate=substrate, n_workers=1, steps=2 * data.n_rows, batch_size=1, lr=0.2)
    ref = _sklearn_weights(data, 0.2, 1e-3, 2)
    np.testing.assert_allclose(full.weights(res.params), ref, rtol=1e-9, atol=1e-12)
    assert res.quality == pytest.approx(full.loss(ref), rel=1e-12)
    touched = LogisticProblem(data, l2=1e-3, eval_rows=None)
    res = simlib.run(touched, "bsp", substrate="sim", n_workers=1, steps=2 * data.n_rows, batch_size=1, lr=0.2)
    assert np.abs(res.params - ref).max() > 1e-3


@pytest.mark.parametrize("batch_size", [1, 8])
def test_full_l2_in_place_chunks_equal_the_serial_replay(batch_size):
    import simlib
    from simlib.contract import serial_reference

    prob = LogisticProblem(make_sparse_classification(800, 100, 6, seed=4), l2=1e-2, eval_rows=None, l2_on="all")
    res = simlib.run(prob, "async", substrate="shm", n_workers=1, steps=500, batch_size=batch_size, lr=0.3, chunk=64)
    ref = serial_reference(prob, 500, batch_size, 0.3)
    np.testing.assert_allclose(prob.weights(res.params), prob.weights(ref), rtol=1e-11, atol=1e-14)
    assert res.params[-1] == pytest.approx(500 * np.log(1 - 0.3 * 1e-2), rel=1e-12)


def test_full_l2_names_its_limits():
    import simlib

    data = make_sparse_classification(200, 50, 4, seed=0)
    with pytest.raises(ValueError, match="l2_on must be one of"):
        LogisticProblem(data, l2_on="every")
    prob = LogisticProblem(data, l2=0.5, eval_rows=None, l2_on="all")
    for substrate in ("sim", "shm"):  # 1,200 steps of log(1 - 0.5 * 0.5) decay the scale past exp(-300)
        with pytest.raises(ValueError, match=r"l2: with l2_on='all' this run would shrink .* to exp\(-345"):
            simlib.run(prob, "bsp", substrate=substrate, n_workers=1, steps=1_200, batch_size=1, lr=0.5)
        with pytest.raises(ValueError, match="lr \\* l2 must be < 1"):
            simlib.run(prob, "bsp", substrate=substrate, n_workers=1, steps=10, batch_size=1, lr=2.0)
    # the table's own guard, for a table that already decayed that far
    with pytest.raises(ValueError, match="the weights' common scale fell below"):
        prob.step(np.array([0.0, -301.0]), np.array([0]), np.array([prob.data.indices[0], 50]), 0.1)


def test_weights_larger_than_memory_are_refused_naming_n_features():
    data = make_sparse_classification(50, 200, 4, seed=0)
    wide = SparseDataset(data.indptr, data.indices, data.values, data.y, n_features=10**13)  # 80 TB of weights
    with pytest.raises(ValueError, match=r"n_features: .* more than half the memory available .* use at most \d+"):
        LogisticProblem(wide)


@pytest.mark.parametrize("l2_on", ["touched", "all"])
def test_a_batchs_keys_are_kept_read_only_and_recomputed_after_the_data_changes(l2_on):
    data = make_sparse_classification(200, 50, 5, seed=3)
    prob = LogisticProblem(data, eval_rows=None, l2_on=l2_on)
    batch = prob.batch((0, 40), 3, 8)
    keys = prob.keys(batch)
    expected = np.unique(data.indices[np.concatenate([np.arange(data.indptr[r], data.indptr[r + 1]) for r in batch])])
    if l2_on == "all":
        expected = np.append(expected, data.n_features)
    np.testing.assert_array_equal(keys, expected)
    assert prob.keys(batch.copy()) is keys  # the same rows again: the kept array
    assert prob.work(batch) == int(np.sum(np.diff(data.indptr)[batch]))
    with pytest.raises(ValueError, match="read-only"):
        keys[0] = 7  # a caller changing it in place would change every later step's keys
    absent = max(set(range(data.n_features)) - set(keys.tolist()))
    data.indices[data.indptr[batch[0]]] = absent  # the data change; validate() forgets what it kept
    prob.validate()
    assert absent in prob.keys(batch)


CHUNKS = {"touched, 8 rows a step": ({}, 8, 0), "all, 1 row a step": ({"l2_on": "all", "l2": 1e-3}, 1, 0),
          "all, 8 rows a step": ({"l2_on": "all", "l2": 1e-3}, 8, 0), "hot keys": ({"l2_on": "all", "l2": 1e-3}, 1, 40)}


def _chunk(kwargs: dict, batch_size: int, hot: int, steps: int = 600) -> np.ndarray:
    """Three in-place chunks of ``steps`` steps from the initial weights (a replica of the ``hot`` keys if any)."""
    prob = LogisticProblem(make_sparse_classification(2_000, 300, 8, seed=5), eval_rows=None, **kwargs)
    w = prob.init_params()
    for c in range(0, 3 * steps, steps):
        prob.local_steps(w, (0, 2_000), c, steps, batch_size, 0.1,
                         **({"replica": prob.replica(hot, batch_size)} if hot else {}))
    return w


@pytest.mark.parametrize("case", CHUNKS)
def test_a_chunk_in_blocks_is_the_chunk_in_one_call(monkeypatch, case):
    """local_steps hands its kernel about BLOCK rows (whole steps) a call: the same weights to the bit, the decay of
    log s (l2_on='all') and the hot keys' replica carried from block to block and landing once, at the chunk's end."""
    import simlib.problems.logistic as logistic

    one = _chunk(*CHUNKS[case])
    monkeypatch.setattr(logistic, "BLOCK", 56)
    np.testing.assert_array_equal(_chunk(*CHUNKS[case]), one)


def test_ctrl_c_during_a_chunk_is_answered_when_its_block_ends(monkeypatch):
    """A Ctrl-C that arrives while a chunk's first compiled call runs raises KeyboardInterrupt when that call returns,
    the steps taken landed whole (their decay of log s included): the weights of that block's steps alone (the gpu
    substrate hands one worker every step up to the next evaluation as one chunk: eval_every=10**8 kept Ctrl-C
    waiting 5 s)."""
    import signal

    import simlib.problems.logistic as logistic

    monkeypatch.setattr(logistic, "BLOCK", 80)  # 10 steps of 8 rows
    kernel, calls = logistic._local_sgd, []

    def first_block_then_ctrl_c(*args):
        calls.append(args[2])
        pending = kernel(*args)
        signal.raise_signal(signal.SIGINT)  # Ctrl-C, arriving while the block ran
        return pending

    prob = LogisticProblem(make_sparse_classification(2_000, 300, 8, seed=5), eval_rows=None, l2_on="all", l2=1e-3)
    ten = prob.init_params()
    prob.local_steps(ten, (0, 2_000), 0, 10, 8, 0.1)
    monkeypatch.setattr(logistic, "_local_sgd", first_block_then_ctrl_c)
    w = prob.init_params()
    with pytest.raises(KeyboardInterrupt):
        prob.local_steps(w, (0, 2_000), 0, 1_000, 8, 0.1)
    assert calls == [(0, 2_000, 0, 10, 8)]
    np.testing.assert_array_equal(w, ten)
    assert w[-1] == pytest.approx(10 * np.log(1 - 0.1 * 1e-3), rel=1e-12)

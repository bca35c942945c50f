"""The multi-layer perceptron: gradients against finite differences, SGD on every substrate learns digits."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import simlib
from simlib.contract import check_problem, serial_reference
from simlib.problems.mlp import DenseDataset, MLPProblem, make_dense_classification

def _fresh_python(code: str) -> subprocess.CompletedProcess:
    """``code`` run by a new interpreter with this checkout on its path: what importing simlib does to a program."""
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


LR, BATCH, STEPS = 0.3, 32, 150  # 2 workers x 150 steps x 32 rows: about 6.7 passes over digits' 1,437 training rows


@pytest.fixture(scope="module")
def digits() -> MLPProblem:
    return MLPProblem()


@pytest.fixture(scope="module")
def small() -> MLPProblem:
    """Two hidden layers on a few rows: three layers of weights to check, each cheap to perturb."""
    return MLPProblem(make_dense_classification(n_rows=60, n_features=6, n_classes=3, seed=1), hidden=(5, 4))


@pytest.fixture(scope="module")
def bar(digits) -> tuple[float, float]:
    """(chance, serial): the share of the commonest class, and the accuracy of one process after as many
    rows as a two-worker run sees. A run must get 80% of the way from chance to perfect, within 0.03 of serial."""
    chance = float(np.bincount(digits.data.y).max() / digits.data.n_rows)
    serial = digits.accuracy(serial_reference(digits, steps=2 * STEPS, batch_size=BATCH, lr=LR))
    return chance, serial


def _numeric_gradient(prob: MLPProblem, params: np.ndarray, batch: np.ndarray, sl: slice, eps: float = 1e-6):
    """Central differences (L(theta + eps e_k) - L(theta - eps e_k)) / 2 eps for every k in ``sl``."""
    g = np.empty(sl.stop - sl.start)
    for i, k in enumerate(range(sl.start, sl.stop)):
        up, down = params.copy(), params.copy()
        up[k] += eps
        down[k] -= eps
        g[i] = (prob.batch_loss(up, batch) - prob.batch_loss(down, batch)) / (2 * eps)
    return g


def test_layout_and_contract(digits, small) -> None:
    for prob in (digits, small):
        check_problem(prob)
        assert isinstance(prob, simlib.contract.Problem)
    assert small.sizes == (6, 5, 4, 3)
    assert [(s.start, s.stop) for s in small.layers] == [(0, 35), (35, 59), (59, 74)]  # 6*5+5, 5*4+4, 4*3+3
    assert small.n_params == 74 and len(small.init_params()) == 74
    np.testing.assert_array_equal(small.keys(small.batch(small.shards(1)[0], 0, 4)), np.arange(74))
    W, b = small.weights(small.init_params(), 1)
    assert W.shape == (5, 4) and b.shape == (4,) and not b.any() and W.std() > 0


def test_backward_pass_matches_finite_differences_per_layer(small) -> None:
    rng = np.random.default_rng(0)
    params = small.init_params() + rng.normal(0.0, 0.1, small.n_params)  # biases off zero too
    batch = small.batch(small.shards(1)[0], 0, 16)
    seen = []
    for sl, grad in small.backward_layers(params, batch):
        seen.append(sl)
        np.testing.assert_allclose(grad, _numeric_gradient(small, params, batch, sl), rtol=1e-5, atol=1e-8)
    assert seen == small.layers[::-1]  # last layer first


def test_layer_gradients_assemble_into_the_step(small, digits) -> None:
    for prob in (small, digits):
        params = prob.init_params()
        batch = prob.batch(prob.shards(2)[1], 3, 8)
        keys, deltas = prob.step(params.copy(), batch, prob.keys(batch), 0.5)
        parts = list(prob.backward_layers(params, batch))
        # the slices, last to first, tile the flat vector with no gap and no overlap
        assert [sl.stop for sl, _ in parts[1:]] == [sl.start for sl, _ in parts[:-1]] and parts[-1][0].start == 0
        assert parts[0][0].stop == prob.n_params
        np.testing.assert_array_equal(keys, np.arange(prob.n_params))
        np.testing.assert_array_equal(deltas, -0.5 * np.concatenate([g for _, g in parts[::-1]]))


def test_one_simulated_worker_is_the_serial_reference(digits) -> None:
    ref = serial_reference(digits, steps=20, batch_size=BATCH, lr=LR)
    res = simlib.run(digits, "bsp", substrate="sim", n_workers=1, steps=20, batch_size=BATCH, lr=LR)
    np.testing.assert_array_equal(res.params, ref)
    assert res.quality == pytest.approx(digits.quality(ref)) and res.quality < res.trace.quality[0].value


@pytest.mark.parametrize("protocol", ["bsp", "ssp:1", "async"])
@pytest.mark.parametrize("substrate", ["sim", "pipes", "shm"])
def test_two_workers_learn_digits(digits, bar, substrate, protocol) -> None:
    chance, serial = bar
    start = digits.accuracy(digits.init_params())
    res = simlib.run(digits, protocol, substrate=substrate, n_workers=2, steps=STEPS, batch_size=BATCH, lr=LR)
    acc = digits.accuracy(res.params)
    assert start < chance + 0.1  # a random network is near chance; the run did the learning
    assert acc >= chance + 0.8 * (1 - chance) and acc >= serial - 0.03, (acc, chance, serial)
    assert res.quality < 0.5 * res.trace.quality[0].value


def test_hidden_layer_beats_a_linear_model_on_the_synthetic_set() -> None:
    data = make_dense_classification(n_rows=2_000, n_features=8, n_classes=4, seed=0)
    acc = {h: MLPProblem(data, hidden=h).accuracy(serial_reference(MLPProblem(data, hidden=h), 600, 32, 0.1))
           for h in ((), (32,))}
    assert acc[(32,)] > acc[()] + 0.1, acc


def test_synthetic_set_is_seeded() -> None:
    a, b, c = (make_dense_classification(100, 5, 3, seed=s) for s in (2, 2, 3))
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.y, b.y)
    assert not np.array_equal(a.X, c.X) and a.X.shape == (100, 5) and set(a.y) == {0, 1, 2}


@pytest.mark.parametrize("make, field", [
    (lambda: MLPProblem(hidden=(0,)), "hidden"),
    (lambda: MLPProblem(hidden=32), "hidden"),
    (lambda: MLPProblem(hidden=(2**40,)), "hidden"),
    (lambda: MLPProblem(eval_fraction=0.0), "eval_fraction"),
    (lambda: MLPProblem(eval_fraction=1.5), "eval_fraction"),
    (lambda: MLPProblem(seed=-1), "seed"),
    (lambda: MLPProblem(data="digits"), "data"),
    (lambda: MLPProblem().shards(10**6), "n_workers"),
    (lambda: DenseDataset(np.full((3, 2), np.nan), np.zeros(3, dtype=int), 2), "X"),
    (lambda: DenseDataset(np.zeros(3), np.zeros(3, dtype=int), 2), "X"),
    (lambda: DenseDataset(np.zeros((3, 2)), np.zeros(2, dtype=int), 2), "y"),
    (lambda: DenseDataset(np.zeros((3, 2)), np.array([0, 1, 2]), 2), "y"),
    (lambda: DenseDataset(np.zeros((3, 2)), np.zeros(3), 2), "y"),
    (lambda: DenseDataset(np.zeros((3, 2)), np.zeros(3, dtype=int), 1), "n_classes"),
    (lambda: make_dense_classification(n_rows=0), "n_rows"),
    (lambda: make_dense_classification(n_features=2, n_classes=10), "n_features"),
    (lambda: make_dense_classification(n_classes=1), "n_classes"),
])
def test_bad_arguments_are_refused_by_name(make, field) -> None:
    with pytest.raises(ValueError, match=field):
        make()


def test_bad_layers_are_refused_before_the_digits_load() -> None:
    """The digits' loader imports scikit-learn (4 s of a refusal on a busy machine): the arguments are named first."""
    code = ("import sys\nfrom simlib.problems.mlp import MLPProblem\n"
            "for bad in ({'hidden': (0,)}, {'hidden': 'wide'}, {'eval_fraction': 2.0}, {'seed': -1}):\n"
            "    try:\n        MLPProblem(**bad)\n    except ValueError as e:\n        print(str(e).split()[0])\n"
            "print('sklearn' in sys.modules)")
    out = _fresh_python(code)
    assert out.stdout.split() == ["hidden", "hidden", "eval_fraction", "seed", "False"], out.stdout + out.stderr


def test_importing_the_mlp_leaves_the_programs_blas_alone() -> None:
    """A program's BLAS threads are its own: importing simlib's MLP and its large-batch trainer keeps them as they were;
    only a scoped one_blas_thread lowers them, and gives them back."""
    code = ("from threadpoolctl import threadpool_info, threadpool_limits\nimport numpy\n"
            "threadpool_limits(limits=3, user_api='blas')\n"
            "blas = lambda: [i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas']\n"
            "before = blas()\nimport simlib\nfrom simlib.problems.mlp import MLPProblem\n"
            "from simlib.backend import one_blas_thread\nimport simlib.course.large_batch\n"
            "with one_blas_thread():\n    inside = blas()\n"
            "print(before, blas(), inside, sep='\\n')")
    out = _fresh_python(code)
    before, after, inside = map(ast.literal_eval, out.stdout.splitlines()) if out.returncode == 0 else (None, None, None)
    assert before and set(before) == {3}, out.stdout + out.stderr
    assert after == before and set(inside) == {1}, out.stdout

"""Full-batch logistic regression over partitions: the sums are right, the methods reach the optimum, rounds are counted."""
import numpy as np
import pytest

from simlib.course.fullbatch import (Objective, gradient_descent, lbfgs, minibatch_sgd, newton, newton_cg,
                                      rounds_to)
from simlib.problems.logistic import LogisticProblem, make_sparse_classification

DATA = make_sparse_classification(1_500, 40, 6, label_noise=0.05, seed=3)
L2 = 1e-3


def objective(n_parts=3):
    return Objective(DATA, n_parts=n_parts, l2=L2)


def test_value_is_the_problems_full_objective():
    w = np.random.default_rng(0).normal(size=DATA.n_features) * 0.3
    peer = LogisticProblem(DATA, l2=L2, eval_rows=None).loss(w)
    assert objective().value(w) == pytest.approx(peer, rel=1e-6)
    assert objective().loss_grad(w)[0] == pytest.approx(peer, rel=1e-6)


def test_gradient_and_hessian_vector_product_match_finite_differences():
    obj, rng = objective(), np.random.default_rng(1)
    w, v = rng.normal(size=obj.d) * 0.2, rng.normal(size=obj.d)
    eps = 1e-6
    _, g = obj.loss_grad(w)
    assert g @ v == pytest.approx((obj.value(w + eps * v) - obj.value(w - eps * v)) / (2 * eps), rel=1e-5)
    hv = obj.hess_vec(w, v)
    fd = (obj.loss_grad(w + eps * v)[1] - obj.loss_grad(w - eps * v)[1]) / (2 * eps)
    np.testing.assert_allclose(hv, fd, rtol=1e-4, atol=1e-8)


def test_partitions_do_not_change_the_sums():
    w = np.full(DATA.n_features, 0.1)
    one, five = Objective(DATA, 1, L2).loss_grad(w), Objective(DATA, 5, L2).loss_grad(w)
    assert one[0] == pytest.approx(five[0])
    np.testing.assert_allclose(one[1], five[1], atol=1e-12)


def test_second_order_methods_reach_scikit_learns_optimum_in_fewer_rounds_than_gradient_descent():
    from sklearn.linear_model import LogisticRegression

    peer = LogisticRegression(C=1 / (DATA.n_rows * L2), fit_intercept=False, tol=1e-10, max_iter=10_000)
    best = objective().value(peer.fit(DATA.to_scipy(), DATA.y).coef_.ravel())
    target = best + 1e-6
    newton, quasi, gd = objective(), objective(), objective()
    histories = {"newton": newton_cg(newton, 15), "lbfgs": lbfgs(quasi, 60), "gd": gradient_descent(gd, 2.0, 300)}
    assert histories["newton"][-1][1] == pytest.approx(best, abs=1e-7)
    assert histories["lbfgs"][-1][1] == pytest.approx(best, abs=1e-7)
    reached = {k: rounds_to(h, target) for k, h in histories.items()}
    assert reached["newton"] is not None and reached["lbfgs"] is not None
    assert reached["gd"] is None or reached["gd"] > max(reached["newton"], reached["lbfgs"])


def test_rounds_are_counted_per_reduce():
    obj = objective()
    assert len(gradient_descent(obj, 1.0, 4)) == 5 and obj.rounds == 5
    obj = objective()
    hist = minibatch_sgd(obj, batch_size=8, lr=1.0, iters=20, eval_every=5)
    assert obj.rounds == 20 and [r for r, _ in hist] == [0, 5, 10, 15, 20]
    assert hist[-1][1] < hist[0][1]


@pytest.mark.parametrize("call, field", [(lambda: Objective(DATA, 0, L2), "n_parts"),
                                         (lambda: Objective(DATA, 2, 0.0), "l2"),
                                         (lambda: gradient_descent(objective(), -1.0, 3), "lr"),
                                         (lambda: newton_cg(objective(), 0), "iters"),
                                         (lambda: lbfgs(objective(), 3, memory=0), "memory")])
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()


def test_explicit_hessian_matches_hessian_vector_products_and_costs_d_squared():
    obj, rng = objective(), np.random.default_rng(2)
    w, v = rng.normal(size=obj.d) * 0.2, rng.normal(size=obj.d)
    np.testing.assert_allclose(obj.hessian(w) @ v, obj.hess_vec(w, v), rtol=1e-10, atol=1e-12)
    assert obj.rounds == 2
    obj = objective()
    hist = newton(obj, 4)
    assert obj.rounds == 1 + 2 * 4 and [r for r, _ in hist] == [1, 3, 5, 7, 9]
    assert hist[-1][1] == pytest.approx(lbfgs(objective(), 60)[-1][1], abs=1e-8)

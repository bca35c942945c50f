"""A graph of operations: lazy evaluation, reverse-mode gradients against finite differences, costs.Op rows."""
import numpy as np
import pytest

from simlib.course.dataflow import Graph


def model(seed=0):
    rng, g = np.random.default_rng(seed), Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    W, b = g.variable("W", rng.normal(size=(4, 3))), g.variable("b", rng.normal(size=(1, 3)))
    v = g.variable("v", rng.normal(size=(3, 1)))
    z = g.matmul(g.tanh(g.add(g.matmul(x, W), b)), v)
    loss = g.mean(g.softplus(g.mul(g.mul(y, g.constant(-1.0)), z)))
    feed = {x: rng.normal(size=(5, 4)), y: np.sign(rng.normal(size=(5, 1)))}
    return g, loss, [W, b, v], feed


def test_gradients_match_finite_differences_for_every_variable_entry():
    g, loss, params, feed = model()
    grads = g.gradients(loss, params, feed)
    eps = 1e-6
    for var, grad in zip(params, grads):
        assert grad.shape == var.value.shape
        for idx in np.ndindex(var.value.shape):
            var.value[idx] += eps
            up = float(g.run(loss, feed))
            var.value[idx] -= 2 * eps
            down = float(g.run(loss, feed))
            var.value[idx] += eps
            assert grad[idx] == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-9)


def test_a_node_used_twice_gets_both_contributions():
    g = Graph()
    w = g.variable("w", np.array([[3.0]]))
    sq = g.mean(g.mul(w, w))
    assert g.gradients(sq, [w], {})[0].item() == pytest.approx(6.0)


def test_run_computes_only_what_the_fetch_needs():
    g = Graph()
    x, unused = g.placeholder("x"), g.placeholder("unused")
    doubled = g.add(x, x)
    np.testing.assert_array_equal(g.run(doubled, {x: np.ones(2)}), [2.0, 2.0])   # 'unused' needs no value
    with pytest.raises(ValueError, match="placeholder 'x'"):
        g.run(doubled, {})
    with pytest.raises(AttributeError, match="no operation 'conv'"):
        g.conv(x)
    assert g.gradients(doubled, [unused], {x: np.ones(2)}) == [None]   # not connected, as TensorFlow says


def test_ops_price_products_and_carry_the_graph_edges():
    g, loss, params, feed = model()
    rows = {o.name: o for o in g.ops(loss, feed)}
    product = next(o for o in rows.values() if o.inputs == ("x", "W"))
    assert product.work == 3 * 2 * 5 * 4 * 3 and product.out_bytes == 2 * 5 * 3 * 8
    assert rows["W"].work == 0 and rows["W"].out_bytes == 2 * 4 * 3 * 8
    assert len(rows) == len(g.nodes)

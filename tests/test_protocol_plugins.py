"""The protocol's extension points: a read rule and a StepRule subclass plugged into simlib.run."""
from __future__ import annotations

import numpy as np
import pytest

import simlib
from simlib.compress import make_compressor
from simlib.problems.logistic import LogisticProblem, make_sparse_classification
from simlib.protocol import Clocks, StepRule, may_read
from simlib.sim.config import SimConfig


def _problem() -> LogisticProblem:
    return LogisticProblem(make_sparse_classification(2_000, 200, 5, seed=0), eval_rows=None)


def test_clocks_use_the_given_read_rule():
    calls = []

    def rule(clock, completed, bound):
        calls.append((clock, completed, bound))
        return clock <= completed  # BSP whatever the protocol says

    c = Clocks(2, "ssp:3", read_rule=rule)
    assert (c.may_read(0), c.may_read(1)) == (True, False)
    assert calls == [(0, 0, 3), (1, 0, 3)]
    assert Clocks(2, "ssp:3").may_read(1)


def test_read_rule_must_be_callable():
    with pytest.raises(ValueError, match="read_rule"):
        Clocks(2, "bsp", read_rule=3)
    with pytest.raises(ValueError, match="read_rule"):
        simlib.run(_problem(), "bsp", n_workers=2, steps=2, read_rule="ssp")


@pytest.mark.parametrize("rule", [lambda clock, completed: True, lambda clock, completed, bound, extra: True])
def test_a_read_rule_of_the_wrong_arity_is_refused_naming_read_rule(rule):
    """It failed inside the run with the lambda's own TypeError."""
    with pytest.raises(ValueError, match=r"^read_rule must take three arguments \(clock, completed, bound\); <lambda>"):
        simlib.run(_problem(), "bsp", n_workers=2, steps=2, read_rule=rule)
    assert simlib.run(_problem(), "bsp", n_workers=2, steps=2, read_rule=lambda *args: True).trace.updates


def test_the_library_rule_plugged_in_gives_the_same_trace():
    prob = _problem()
    a = simlib.run(prob, "ssp:2", n_workers=3, steps=8, stragglers=_slow())
    b = simlib.run(prob, "ssp:2", n_workers=3, steps=8, stragglers=_slow(), read_rule=may_read)
    assert [(u.time, u.worker, u.staleness) for u in a.trace.updates] == \
        [(u.time, u.worker, u.staleness) for u in b.trace.updates]
    np.testing.assert_array_equal(a.params, b.params)


def test_a_stricter_read_rule_binds_in_the_simulator():
    prob = _problem()
    res = simlib.run(prob, "async", n_workers=3, steps=8, stragglers=_slow(),
                     read_rule=lambda clock, completed, bound: clock <= completed)
    assert res.trace.summary()["max_clock_lag"] == 0
    assert simlib.run(prob, "async", n_workers=3, steps=8, stragglers=_slow()).trace.summary()["max_clock_lag"] > 0


class Halve(StepRule):
    def scale(self, tau: int) -> float:
        return 0.5


def test_a_steprule_subclass_scales_every_push():
    prob = _problem()
    half = simlib.run(prob, "bsp", n_workers=1, steps=5, lr=0.4, rule=Halve())
    plain = simlib.run(prob, "bsp", n_workers=1, steps=5, lr=0.2)
    np.testing.assert_allclose(half.params, plain.params, rtol=1e-12, atol=1e-15)


def test_rule_and_its_fields_are_not_given_together():
    with pytest.raises(ValueError, match="staleness_aware"):
        simlib.run(_problem(), "bsp", n_workers=1, steps=2, rule=Halve(), staleness_aware=True)
    with pytest.raises(ValueError, match="rule"):
        simlib.run(_problem(), "bsp", n_workers=1, steps=2, rule="aware")
    # the simulator's config has the same two names and the same refusals
    with pytest.raises(ValueError, match="staleness_aware"):
        SimConfig(rule=Halve(), staleness_aware=True)
    with pytest.raises(ValueError, match="rule must be a StepRule"):
        SimConfig(rule="aware")
    assert SimConfig(rule=Halve()).step_rule.scale(3) == 0.5
    assert SimConfig(staleness_aware=True).step_rule.scale(4) == 0.25


def test_compression_factory_is_called_once_per_worker():
    made = []

    def factory(n_params, rng, key_bytes=4, value_bytes=4):
        made.append(n_params)
        return make_compressor("onebit", n_params, rng, key_bytes=key_bytes, value_bytes=value_bytes)

    prob = _problem()
    a = simlib.run(prob, "bsp", n_workers=2, steps=4, compression=factory)
    b = simlib.run(prob, "bsp", n_workers=2, steps=4, compression="onebit")
    assert made == [prob.n_params] * 2
    np.testing.assert_array_equal(a.params, b.params)
    assert a.trace.meta["config"]["compression"] == "factory"


def _slow():
    from simlib.sim.config import Stragglers
    return Stragglers(slow_workers=1, slow_factor=4.0)

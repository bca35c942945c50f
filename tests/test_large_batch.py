"""Large-batch rules on the MLP: the step-size schedules, LAMB's per-layer step, and where scaling stops."""
import numpy as np
import pytest

from simlib.course.large_batch import Rule, _lamb, epochs_to, step_seconds
from simlib.problems.mlp import MLPProblem
from simlib.sim.network import ring_allreduce_time


@pytest.fixture(scope="module")
def problem():
    return MLPProblem()


@pytest.mark.parametrize("bad, name", [(dict(optimizer="adam"), "optimizer"), (dict(lr=0), "lr"),
                                       (dict(scale="square"), "scale"), (dict(warmup=-1), "warmup"),
                                       (dict(base_batch=0), "base_batch"),
                                       (dict(optimizer="lamb", betas=(1.0, 2.0)), r"betas\[0\] must be a number in \[0, 1\)"),
                                       (dict(betas=(0.9,)), "betas must be a pair"), (dict(eps=0.0), "eps")])
def test_a_bad_rule_is_refused_by_name(bad, name):
    with pytest.raises(ValueError, match=name):
        Rule(**bad)


def test_the_rate_grows_with_the_batch_as_the_rule_says_and_warms_up_linearly():
    assert Rule(lr=0.1, scale="linear").rate(256, 5.0) == pytest.approx(0.8)
    assert Rule(lr=0.1, scale="sqrt").rate(128, 5.0) == pytest.approx(0.2)
    assert Rule(lr=0.1).rate(1024, 0.0) == pytest.approx(0.1)
    warm = Rule(lr=0.1, scale="linear", warmup=2.0)
    assert [warm.rate(64, e) for e in (0.0, 0.5, 2.0, 9.0)] == pytest.approx([0.0, 0.05, 0.2, 0.2])


def test_lamb_moves_every_layer_by_the_step_size_times_its_own_norm(problem):
    theta = problem.init_params()
    before = theta.copy()
    rule = Rule("lamb", lr=0.01)
    state: dict = {}
    for sl, g in list(problem.backward_layers(theta, np.arange(64))):
        _lamb(state, theta, sl, g, rule.lr, rule, t=1)
    for sl in problem.layers:
        moved = np.linalg.norm(theta[sl] - before[sl]) / np.linalg.norm(before[sl])
        assert moved == pytest.approx(0.01, rel=1e-9)


def test_a_fixed_step_size_stops_scaling_while_lamb_keeps_cutting_the_steps(problem):
    fixed = {b: epochs_to(problem, b, Rule("sgd", lr=0.1), 0.95, max_epochs=300) for b in (128, 1024)}
    lamb = {b: epochs_to(problem, b, Rule("lamb", lr=0.02, scale="sqrt", warmup=2), 0.95, max_epochs=300)
            for b in (128, 1024)}
    assert all(r.reached for r in (*fixed.values(), *lamb.values()))
    assert fixed[1024].steps > 0.7 * fixed[128].steps  # 8x the rows a step, not fewer steps
    assert lamb[1024].steps < 0.5 * lamb[128].steps
    assert fixed[1024].epochs == pytest.approx(fixed[1024].steps * 1024 / 1437, rel=0.01)


def test_a_step_size_too_long_for_the_batch_never_reaches_the_target(problem):
    run = epochs_to(problem, 1024, Rule("sgd", lr=0.1, scale="linear"), 0.95, max_epochs=20)
    assert not run.reached and run.epochs == pytest.approx(20, abs=1) and run.accuracy < 0.5


def test_a_batch_larger_than_the_data_is_refused(problem):
    with pytest.raises(ValueError, match="batch"):
        epochs_to(problem, 10_000, Rule(), 0.9)


@pytest.mark.parametrize("bad, message", [
    (dict(evals_per_epoch=0), "evals_per_epoch"),  # was a ZeroDivisionError
    (dict(max_epochs=1e9), r"max_epochs: 1e\+09 epochs of .* steps exceed 1,000,000,000 steps; use at most"),  # ran on
])
def test_bad_epochs_are_refused_by_name_before_training(problem, bad, message):
    with pytest.raises(ValueError, match=message):
        epochs_to(problem, 32, Rule(), 1.0, **bad)


@pytest.mark.parametrize("bad", [dict(repeats=0), dict(bandwidth=0.0), dict(latency=-1.0), dict(batch=0)])
def test_bad_step_costs_are_refused_by_name(problem, bad):
    """repeats=0 returned an infinite compute time, bandwidth=0 raised ZeroDivisionError."""
    args = dict(batch=256, n_workers=8) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        step_seconds(problem, args.pop("batch"), args.pop("n_workers"), **args)


def test_a_step_costs_the_measured_backward_pass_and_the_ring_formula(problem):
    compute, comm = step_seconds(problem, 256, 8, latency=1e-4, bandwidth=1e9, repeats=2)
    assert compute > 0
    assert comm == ring_allreduce_time(8, 8.0 * problem.n_params, 1e-4, 1e9)

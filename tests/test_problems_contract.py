"""Every lesson's Problem on the one contract: shape, one worker = the serial reference, runs on every substrate."""
import numpy as np
import pytest

import simlib
from simlib.contract import check_problem, serial_reference
from simlib.problems.glove import GloveConfig
from simlib.problems.glove_table import GloveProblem
from simlib.problems.lasso import ShotgunProblem, make_lasso, random_schedule
from simlib.problems.lda import make_synthetic_corpus
from simlib.problems.lda_table import LDAProblem
from simlib.problems.logistic import LogisticProblem, make_sparse_classification
from simlib.problems.mlp import MLPProblem

NAMES = ("logistic", "glove", "lda", "lasso", "mlp")
LR = {"logistic": 0.5, "glove": 0.05, "lda": 1.0, "lasso": 1.0, "mlp": 0.3}


@pytest.fixture(scope="module")
def problems(cooc):
    lda_corpus = make_synthetic_corpus(n_docs=40, n_topics=3, n_words=30, doc_length=20, seed=0)[0]
    lasso = make_lasso(n_rows=100, n_features=40, n_nonzero=5, seed=0)
    return {
        "logistic": LogisticProblem(make_sparse_classification(400, 50, 5, seed=0), eval_rows=None),
        "glove": GloveProblem(cooc, GloveConfig(dim=4), eval_entries=2_000),
        "lda": LDAProblem(lda_corpus, 3, alpha=0.5, beta=0.05),
        "lasso": ShotgunProblem(lasso, random_schedule(40, 4, 20, seed=0)),
        "mlp": MLPProblem(),
    }


def _improved(problem, res) -> bool:
    first, last = res.trace.quality[0].value, res.quality
    return last < first if problem.lower_is_better else last > first


@pytest.mark.parametrize("name", NAMES)
def test_is_a_problem(problems, name):
    check_problem(problems[name])
    assert isinstance(problems[name], simlib.contract.Problem)


@pytest.mark.parametrize("name", NAMES)
def test_one_simulated_worker_equals_the_serial_reference(problems, name):
    prob = problems[name]
    ref = serial_reference(prob, steps=6, batch_size=16, lr=LR[name])
    res = simlib.run(prob, "bsp", substrate="sim", n_workers=1, steps=6, batch_size=16, lr=LR[name])
    np.testing.assert_allclose(res.params, ref, rtol=0, atol=1e-12)
    assert _improved(prob, res)


@pytest.mark.parametrize("substrate", ["sim", "pipes", "shm", "gpu"])
@pytest.mark.parametrize("protocol", ["bsp", "ssp:1", "async"])
@pytest.mark.parametrize("name", NAMES)
def test_runs_under_every_protocol(problems, name, protocol, substrate):
    prob = problems[name]
    res = simlib.run(prob, protocol, substrate=substrate, n_workers=2, steps=5, batch_size=16, lr=LR[name])
    trace = res.trace
    assert all(u.applied for u in trace.updates) and {(i, 4) for i in range(2)} <= {(u.worker, u.step) for u in trace.updates}
    chunked = trace.meta.get("update_unit", "one step").startswith("a chunk")  # shm's in-place path: one per chunk
    assert len(trace.updates) == 10 or (chunked and 2 <= len(trace.updates) < 10)
    assert max(u.clock_lag for u in trace.updates) <= simlib.Protocol.parse(protocol).bound
    assert np.isfinite(res.quality) and _improved(prob, res)
    if name == "lda":
        prob.check_counts(res.params)


def test_lda_counts_conserved_and_deterministic_across_workers(problems):
    prob = problems["lda"]
    runs = [simlib.run(prob, "async", substrate="sim", n_workers=3, steps=4, seed=1) for _ in range(2)]
    prob.check_counts(runs[0].params)
    assert np.array_equal(runs[0].params, runs[1].params)
    assert not np.array_equal(runs[0].params, prob.init_params())  # the sweeps moved tokens


def test_shotgun_bad_schedule_and_workers_name_the_field(problems):
    lasso = problems["lasso"].lasso
    with pytest.raises(ValueError, match="schedule"):
        ShotgunProblem(lasso, np.full((3, 2), 100))
    with pytest.raises(ValueError, match="n_workers"):
        problems["lasso"].shards(5)

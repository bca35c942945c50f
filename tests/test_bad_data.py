"""Bad data at every public entry point: a ValueError naming the argument, before any process starts.

Compiled kernels do no bounds checks, so each array they index is validated first; the last test
runs the kernels' callers with out-of-range ids in a separate interpreter and checks that the
error comes from validation (a ValueError and a normal exit), not from a crashed process.
"""
from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fault_driver import children
from simlib.problems.glove import Cooccurrence, GloveConfig
from simlib.problems.lda import make_synthetic_corpus
from simlib.problems.logistic import LogisticProblem, SparseDataset, make_sparse_classification
from simlib.protocol import StepRule

ROOT = Path(__file__).resolve().parent.parent


def _data() -> SparseDataset:
    return make_sparse_classification(n_rows=200, n_features=50, nnz_per_row=5, seed=0)


def _cooc(**change) -> Cooccurrence:
    base = Cooccurrence(rows=np.array([0, 1, 2], np.int32), cols=np.array([1, 2, 0], np.int32),
                        values=np.array([1.0, 2.0, 0.5], np.float32), n_words=3)
    return replace(base, **change)


def _hogwild(**kw):
    """Hogwild! as the lessons run it: full-L2 logistic regression, async, in place on shared memory."""
    import simlib

    def call():
        prob = LogisticProblem(kw.pop("data", _data()), l2=kw.pop("l2", 1e-4), l2_on="all")
        return simlib.run(prob, kw.pop("protocol", "async"), substrate="shm", **({"n_workers": 2, "steps": 5} | kw))
    return call


def _glove(cooc, **kw):
    """GloVe Hogwild as the lessons run it: GloveProblem on the shared-memory substrate."""
    import simlib
    from simlib.problems.glove_table import GloveProblem

    def call():
        return simlib.run(GloveProblem(cooc, GloveConfig(dim=4, epochs=1)), kw.pop("protocol", "async"),
                          substrate="shm", **({"n_workers": 2, "steps": 5} | kw))
    return call


def _glove_split(cooc, changed_after=False, **kw):
    """Model-parallel GloVe as lesson 08 runs it: GloveSlices under BSP on the shared-memory substrate
    (``changed_after``: a row id made out of range once the problem has checked its co-occurrences)."""
    import simlib
    from simlib.problems.glove_slices import GloveSlices

    def call():
        prob = GloveSlices(cooc, GloveConfig(dim=4, epochs=1), max_batch=kw.pop("max_batch", 2))
        if changed_after:
            prob.cooc.rows[1] = 10**6
        return simlib.run(prob, kw.pop("protocol", "bsp"), substrate=kw.pop("substrate", "shm"),
                          **({"n_workers": 2, "batch_size": 2, "steps": 4} | kw))
    return call


def _count(ids, offsets, n_words=5, **kw):
    from simlib.parallel.glove_count import count_parallel

    return lambda: count_parallel(np.asarray(ids, np.int32), np.asarray(offsets, np.int64), n_words, **kw)


def _lda(corpus=None, **kw):
    """AD-LDA as the lessons run it: LDAProblem on the shared-memory substrate."""
    import simlib
    from simlib.problems.lda_table import LDAProblem

    def call():
        data = make_synthetic_corpus(n_docs=10, n_words=20, doc_length=10, seed=0)[0] if corpus is None else corpus()
        problem = LDAProblem(data, kw.pop("n_topics", 4))
        return simlib.run(problem, kw.pop("protocol", "bsp"), **({"substrate": "shm", "n_workers": 2, "steps": 1} | kw))
    return call


def _lda_problem(*args, **kw):
    from simlib.problems.lda_table import LDAProblem

    return LDAProblem(*args, **kw)


def _corpus(**change):
    return replace(make_synthetic_corpus(n_docs=10, n_words=20, doc_length=10, seed=0)[0], **change)


def _changed_corpus():
    """A corpus made valid, then given a word id outside the vocabulary."""
    corpus = make_synthetic_corpus(n_docs=10, n_words=20, doc_length=10, seed=0)[0]
    corpus.words[3] = 10**6
    return corpus


def _changed_data() -> SparseDataset:
    """Logistic data made valid, then given a feature id outside the model."""
    d = _data()
    d.indices[0] = 10**6
    return d


def _logistic_changed_after():
    problem = LogisticProblem(_data(), eval_rows=None)
    problem.data.indices[0] = 10**6
    return problem


def _shotgun(schedule, serial=False):
    from simlib.problems.lasso import make_lasso, shotgun

    lasso = make_lasso(n_rows=50, n_features=20, n_nonzero=3, seed=0)
    if serial:
        return lambda: shotgun(lasso, np.asarray(schedule))
    from simlib.problems.lasso import ShotgunProblem

    return lambda: ShotgunProblem(lasso, np.asarray(schedule))


def _simlib_run(problem, **kw):
    import simlib

    return lambda: simlib.run(problem, kw.pop("protocol", "bsp"), substrate=kw.pop("substrate", "pipes"), **kw)


def _on_sim(problem=None, **options):
    import simlib
    from simlib.sim import default_problem

    return lambda: simlib.run(default_problem() if problem is None else problem, "bsp", substrate="sim", **options)


def _allreduce(substrate, **kw):
    """Protocol 'allreduce' (replicas summing buckets of the gradient) on ``substrate``."""
    import simlib
    from simlib.problems.mlp import MLPProblem

    own = {"xp": "numpy"} if substrate == "gpu" else {}
    return lambda: simlib.run(MLPProblem(hidden=(8,)), "allreduce", substrate=substrate,
                              **({"n_workers": 2, "steps": 2} | own | kw))


ALLREDUCE_BAD = [  # (what, options, the name the error must give)
    ("bucket_bytes 0", {"bucket_bytes": 0}, "bucket_bytes"),
    ("bucket_bytes '4k'", {"bucket_bytes": "4k"}, "bucket_bytes"),
    ("bucket_bytes nan", {"bucket_bytes": float("nan")}, "bucket_bytes"),
    ("bucket_bytes 2**40 + 1", {"bucket_bytes": 2**40 + 1}, "bucket_bytes"),
    ("overlap 'yes'", {"overlap": "yes"}, "overlap"),
    ("n_workers 0", {"n_workers": 0}, "n_workers"), ("n_workers 20,000", {"n_workers": 20_000}, "n_workers"),
    ("steps 10**12", {"steps": 10**12}, "steps"), ("accumulation 4", {"accumulation": 4}, "accumulation"),
]


def _lda_problem_changed_after():
    from simlib.problems.lda_table import LDAProblem

    problem = LDAProblem(make_synthetic_corpus(n_docs=10, n_words=20, doc_length=10, seed=0)[0], 4)
    problem.corpus.words[3] = 10**6
    return problem


def _empty_rows() -> SparseDataset:
    return SparseDataset(np.zeros(11, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32),
                         np.ones(10, np.float32), 5)


CASES = {
    # GloVe training: every array the AdaGrad kernels index
    "glove row id >= n_words": (_glove(_cooc(rows=np.array([0, 1, 3], np.int32))), "cooc.rows"),
    "glove negative col id": (_glove(_cooc(cols=np.array([1, -1, 0], np.int32))), "cooc.cols"),
    "glove value 0": (_glove(_cooc(values=np.array([1.0, 0.0, 0.5], np.float32))), "cooc.values"),
    "glove value NaN": (_glove(_cooc(values=np.array([1.0, np.nan, 0.5], np.float32))), "cooc.values"),
    "glove value inf": (_glove(_cooc(values=np.array([1.0, np.inf, 0.5], np.float32))), "cooc.values"),
    "glove negative value": (_glove(_cooc(values=np.array([1.0, -2.0, 0.5], np.float32))), "cooc.values"),
    "glove lengths differ": (_glove(_cooc(cols=np.array([1, 2], np.int32))), "cooc.rows, cooc.cols"),
    "glove float ids": (_glove(_cooc(rows=np.array([0.0, 1.0, 2.0]))), "cooc.rows"),
    "glove ids as a list": (_glove(_cooc(rows=[0, 1, 2])), "cooc.rows"),
    "glove not a Cooccurrence": (_glove({"rows": [0]}), "cooc"),
    "glove n_workers 0": (_glove(_cooc(), n_workers=0), "n_workers"),
    "glove unknown protocol": (_glove(_cooc(), protocol="ring"), "protocol"),
    # GloVe split by dimension (GloveSlices): the same arrays, and what the two phases need
    "glove split row id >= n_words": (_glove_split(_cooc(rows=np.array([0, 1, 3], np.int32))), "cooc.rows"),
    "glove split value NaN": (_glove_split(_cooc(values=np.array([1.0, np.nan, 0.5], np.float32))), "cooc.values"),
    "glove split row id changed after the check": (_glove_split(_cooc(), changed_after=True), "cooc.rows"),
    "glove split n_workers 0": (_glove_split(_cooc(), n_workers=0), "n_workers"),
    "glove split more workers than dimensions": (_glove_split(_cooc(), n_workers=5), "n_workers"),
    "glove split batch over max_batch": (_glove_split(_cooc(), batch_size=3), "batch_size"),
    "glove split max_batch 0": (_glove_split(_cooc(), max_batch=0), "max_batch"),
    "glove split async": (_glove_split(_cooc(), protocol="async"), "protocol"),
    "glove split on pipes": (_glove_split(_cooc(), substrate="pipes"), "substrate"),
    "glove split on the gpu substrate": (_glove_split(_cooc(), substrate="gpu", xp="numpy"), "substrate"),
    # GloVe counting
    "count decreasing offsets": (_count([0, 1, 2, 3, 4, 0], [0, 4, 2, 6]), "offsets"),
    "count offsets not ending at len(ids)": (_count([0, 1, 2, 3], [0, 2, 3]), "offsets"),
    "count no document of two tokens": (_count([0, 1, 2], [0, 1, 2, 3]), "offsets"),
    "count id >= n_words": (_count([0, 1, 7], [0, 3]), "ids"),
    "count window 0": (_count([0, 1, 2], [0, 3], window=0), "window"),
    "count n_workers 0": (_count([0, 1, 2], [0, 3], n_workers=0), "n_workers"),
    # Hogwild and the logistic data
    "hogwild not a dataset": (_hogwild(data=np.zeros((3, 3))), "data"),
    "hogwild every row empty": (_hogwild(data=_empty_rows()), "data"),
    "hogwild lr 0": (_hogwild(lr=0.0), "lr"),
    "hogwild lr * l2 >= 1": (_hogwild(lr=1e6), "lr \\* l2"),
    "hogwild n_workers 0": (_hogwild(n_workers=0), "n_workers"),
    "hogwild unknown protocol": (_hogwild(protocol="ring"), "protocol"),
    "hogwild decays past what the table holds": (_hogwild(lr=0.5, l2=0.5, steps=1_000), "l2"),
    "logistic indices out of range": (lambda: SparseDataset(np.array([0, 2]), np.array([0, 9], np.int32),
                                                            np.ones(2, np.float32), np.ones(1, np.float32), 5),
                                      "indices"),
    "logistic indices of a wrong type": (lambda: SparseDataset(np.array([0, 1]), "0", np.ones(1, np.float32),
                                                               np.ones(1, np.float32), 5), "indices"),
    "logistic float indices": (lambda: SparseDataset(np.array([0, 1]), np.array([0.5]), np.ones(1, np.float32),
                                                     np.ones(1, np.float32), 5), "indices"),
    "logistic problem with every row empty": (lambda: LogisticProblem(_empty_rows()), "data"),
    # LDA
    "lda one topic": (_lda(n_topics=1), "n_topics"),
    "lda unknown protocol": (_lda(protocol="ssp:x"), "protocol"),
    "lda bsp with a bound": (_lda(protocol="bsp:3"), "only SSP takes a bound"),
    "lda corpus float word ids": (lambda: _corpus(words=np.full(100, 0.5)), "words"),
    "lda corpus ids past int32": (lambda: _corpus(words=np.full(100, 2**32 + 1)), "words"),
    "lda corpus float offsets": (lambda: _corpus(offsets=np.arange(11) * 10.0), "offsets"),
    "lda corpus not an LDACorpus": (_lda(corpus=lambda: [[0, 1]]), "corpus"),
    "lda word id changed after the check": (_lda(corpus=_changed_corpus), "word ids"),
    "lda serial Gibbs, word id changed": (lambda: __import__("simlib.problems.lda_gibbs", fromlist=["x"]).fit(
        _changed_corpus(), 4, n_sweeps=1), "word ids"),
    "lda on the gpu substrate (NumPy), word id changed": (_lda(corpus=_changed_corpus, substrate="gpu", xp="numpy"),
                                                          "word ids"),
    "LDAProblem, word id changed": (lambda: __import__("simlib.problems.lda_table", fromlist=["x"]).LDAProblem(
        _changed_corpus(), 4), "word ids"),
    **{f"lda accumulation on {sub}": (_lda(accumulation=4, substrate=sub), "accumulation")
       for sub in ("sim", "shm", "pipes", "gpu", "ray")},
    "lda rule= of its own": (_lda(rule=type("Halved", (StepRule,), {"scale": lambda self, tau: 0.5})()), "rule"),
    **{f"lda kernel {k} beta below its floor": (lambda k=k: _lda_problem(_corpus(), 4, beta=1e-101, kernel=k),
                                                "beta must be >= 1e-100")
       for k in ("mh", "alias")},
    # Shotgun (Lasso)
    "shotgun schedule id >= n_features": (_shotgun([[0, 25]]), "schedule"),
    "shotgun schedule id < -1": (_shotgun([[0, -3]]), "schedule"),
    "shotgun float schedule": (_shotgun([[0.0, 1.5]]), "schedule"),
    "shotgun 1-D schedule": (_shotgun([0, 1]), "schedule"),
    "serial shotgun schedule id >= n_features": (_shotgun([[0, 25]], serial=True), "schedule"),
    # the contract's entry points
    "simlib.run with no Problem": (_simlib_run(object()), "problem"),
    "simlib.run unknown substrate": (lambda: _simlib_run(LogisticProblem(_data()), substrate="tcp")(), "substrate"),
    "simlib.run lr 0": (lambda: _simlib_run(LogisticProblem(_data()), lr=0.0)(), "lr"),
    "simlib.run sim with no Problem": (_on_sim(object()), "problem"),
    "simlib.run sim lr -1": (_on_sim(lr=-1.0), "lr"),
    "simlib.run shm, data changed after the check": (lambda: _simlib_run(_logistic_changed_after(), substrate="shm",
                                                                        n_workers=2, steps=2)(), "indices"),
    "simlib.run pipes, corpus changed after the check": (
        lambda: _simlib_run(_lda_problem_changed_after(), substrate="pipes", n_workers=2, steps=1)(), "word ids"),
    "simlib.run ray n_servers 0": (lambda: _simlib_run(LogisticProblem(_data()), substrate="ray", n_servers=0)(),
                                   "n_servers"),
    "simlib.run ray unknown placement": (lambda: _simlib_run(LogisticProblem(_data()), substrate="ray",
                                                             placement="far")(), "placement"),
    **{f"simlib.run ray num_cpus {v!r}": (lambda v=v: _simlib_run(LogisticProblem(_data()), substrate="ray",
                                                                  num_cpus=v)(), "num_cpus must be an integer >= 1")
       for v in (-1, 0, "2", 1.5)},
    "simlib.run ray address not a string": (lambda: _simlib_run(LogisticProblem(_data()), substrate="ray",
                                                                address=6379)(), "address must be"),
    **{f"simlib.run {sub} clock_batches a million": (
        lambda sub=sub: _simlib_run(LogisticProblem(_data()), substrate=sub, protocol="ssp:1", steps=50,
                                    clock_batches=1_000_000)(), "clock_batches: steps x clock_batches = 50 x 1,000,000")
       for sub in ("sim", "pipes")},
    "hogwild data changed after the check": (_hogwild(data=_changed_data()), "indices"),
    "pipe PS with no Problem": (lambda: __import__("simlib").run(object(), "bsp", substrate="pipes"), "problem"),
    **{f"allreduce on {sub}, {what}": (_allreduce(sub, **kw), name)
       for sub in ("sim", "shm", "pipes", "gpu", "ray") for what, kw, name in ALLREDUCE_BAD},
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_by_name_before_any_process_starts(case):
    call, field = CASES[case]
    before = set(children())
    with pytest.raises(ValueError, match=field):
        call()
    assert multiprocessing.active_children() == []
    assert set(children()) <= before  # no worker was ever started (nor left)


def test_python_lists_are_converted_for_the_kernels():
    d = _data()
    as_lists = SparseDataset(d.indptr.tolist(), d.indices.tolist(), d.values.tolist(), d.y.tolist(), d.n_features)
    assert as_lists.indices.dtype == np.int32 and np.array_equal(as_lists.indices, d.indices)
    import simlib

    a, b = (simlib.run(LogisticProblem(x, l2_on="all"), "async", substrate="shm", n_workers=1, steps=d.n_rows,
                       batch_size=1).params for x in (as_lists, d))
    np.testing.assert_array_equal(a, b)


def test_divergence_is_reported_with_its_step():
    from simlib.diverged import Diverged

    with pytest.raises(Diverged, match=r"diverged: the loss at step \d+ was (nan|inf)") as info:
        _on_sim(lr=1e6, n_workers=8, steps=100)()
    assert info.value.step > 0 and not np.isfinite(info.value.value)
    assert isinstance(info.value, ValueError)


def test_out_of_range_ids_never_reach_a_compiled_kernel():
    """The kernels' callers, given ids outside their arrays, in a fresh interpreter: validation answers."""
    script = textwrap.dedent('''
        import numpy as np
        from simlib.parallel.glove_count import count_parallel
        from simlib.problems.glove import Cooccurrence, GloveConfig, count_cooccurrences
        from simlib.problems.glove_slices import GloveSlices
        from simlib.problems.glove_table import GloveProblem
        from simlib.problems.logistic import SparseDataset, make_sparse_classification

        import simlib
        from simlib.problems.lasso import ShotgunProblem, make_lasso
        from simlib.problems.lda import make_synthetic_corpus
        from simlib.problems.lda_gibbs import fit
        from simlib.problems.lda_table import LDAProblem
        from simlib.problems.logistic import LogisticProblem

        big = 10**9
        d = make_sparse_classification(n_rows=100, n_features=20, nnz_per_row=4, seed=0)

        def changed_corpus():  # valid when made, then changed: the entry points must check again
            corpus = make_synthetic_corpus(n_docs=10, n_words=20, doc_length=10, seed=0)[0]
            corpus.words[3] = big
            return corpus

        def changed_problem():
            problem = LDAProblem(make_synthetic_corpus(n_docs=10, n_words=20, doc_length=10, seed=0)[0], 4)
            problem.corpus.words[3] = big
            return problem

        def changed_logistic():
            problem = LogisticProblem(make_sparse_classification(n_rows=100, n_features=20, nnz_per_row=4, seed=0))
            problem.data.indices[5] = big
            return problem

        calls = {
            "glove rows": lambda: simlib.run(GloveProblem(Cooccurrence(np.array([0, big], np.int32), np.array([1, 0], np.int32),
                                                                       np.ones(2, np.float32), 3), GloveConfig(dim=4)),
                                             "async", substrate="shm"),
            "glove cols": lambda: simlib.run(GloveSlices(Cooccurrence(np.array([0, 1], np.int32), np.array([1, -big], np.int32),
                                                                      np.ones(2, np.float32), 3), GloveConfig(dim=4)),
                                             "bsp", substrate="shm"),
            "count offsets": lambda: count_parallel(np.zeros(4, np.int32), np.array([0, 4, -big, 4]), 3),
            "count ids": lambda: count_cooccurrences(np.array([0, big], np.int32), np.array([0, 2]), 3),
            "hogwild indices": lambda: simlib.run(LogisticProblem(SparseDataset(d.indptr, d.indices + big, d.values,
                                                                                d.y, 20)), "async", substrate="shm"),
            "hogwild indptr": lambda: simlib.run(LogisticProblem(SparseDataset(d.indptr * big, d.indices, d.values,
                                                                               d.y, 20)), "async", substrate="shm"),
            "lda gibbs words": lambda: fit(changed_corpus(), 4, n_sweeps=1),
            "lda parallel words": lambda: simlib.run(changed_problem(), "bsp", substrate="shm", steps=1),
            "lda problem words": lambda: simlib.run(changed_problem(), "bsp", substrate="sim", steps=1),
            "logistic problem indices": lambda: simlib.run(changed_logistic(), "bsp", substrate="sim", steps=1),
            "shotgun schedule": lambda: ShotgunProblem(make_lasso(50, 20, 3, seed=0), np.array([[0, big]])),
        }
        # what each refusal must name: the error comes from validation, not from somewhere it happened to fail
        fields = {"glove rows": "cooc.rows", "glove cols": "cooc.cols", "count offsets": "offsets", "count ids": "ids",
                  "hogwild indices": "indices", "hogwild indptr": "indptr", "lda gibbs words": "word ids",
                  "lda parallel words": "word ids", "lda problem words": "word ids",
                  "logistic problem indices": "indices", "shotgun schedule": "schedule"}
        for name, call in calls.items():
            try:
                call()
                print(name, "ACCEPTED")
            except ValueError as e:
                print(name, "ValueError" if fields[name] in str(e) else "OTHER", str(e).split(",")[0])
    ''')
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, f"the interpreter died (code {out.returncode}):\n{out.stderr[-2000:]}"
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 11 and all(" ValueError " in line for line in lines), out.stdout


REAL_OPTIONS_BAD = [  # (substrate, options, the name the error must give): each named before the workers' group is made
    ("pipes", {"straggler": (0, 1e9)}, "straggler"),  # a billion seconds' sleep a step: the run waited for its timeout
    ("shm", {"straggler": (1, 1e300)}, "straggler"),  # OverflowError inside the worker's time.sleep
    ("pipes", {"straggler": (np.int64(0), 0.5)}, None),  # a NumPy integer is a worker id like any other
    ("shm", {"monitor_every": 0}, "monitor_every"),  # named by the worker group, after the warm-up
    ("shm", {"timeout": -1}, "timeout"),
    ("pipes", {"timeout": float("nan")}, "timeout"),
    ("pipes", {"evaluate": "no"}, "evaluate"),  # a truthy string: the run evaluated all the same
    ("pipes", {"start_method": "spoon"}, "start_method"),
]


@pytest.mark.parametrize("substrate, options, field", REAL_OPTIONS_BAD)
def test_a_process_substrates_options_are_checked_before_its_workers_are_made(substrate, options, field, monkeypatch):
    """Each option of pipes and shm is named before the warm-up and the worker group (a good one reaches the group)."""
    import simlib

    def no_group(*args, **kwargs):
        raise AssertionError("the worker group was made")

    monkeypatch.setattr(f"simlib.substrates.{substrate}.WorkerGroup", no_group)
    with pytest.raises(ValueError if field else AssertionError, match=field or "the worker group was made"):
        simlib.run(LogisticProblem(_data()), "bsp", substrate=substrate, n_workers=2, steps=2, **options)


def test_placement_resources_without_a_cluster_is_refused_before_ray_starts(monkeypatch):
    """A local Ray of the run's own has no 'server' and 'worker' nodes: it was started (25-100 s at load 9-14) and then
    the run refused."""
    pytest.importorskip("ray")
    import simlib

    def no_start(*args, **kwargs):
        raise AssertionError("a local Ray was started")

    monkeypatch.setattr("simlib.substrates.ray.connect", no_start)
    with pytest.raises(ValueError, match="placement='resources' needs a cluster"):
        simlib.run(LogisticProblem(_data()), "bsp", substrate="ray", placement="resources", n_workers=2, steps=2)

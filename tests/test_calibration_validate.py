"""Predict -> measure -> compare: deterministic predictions, real runs, honest errors, no leaks."""
import dataclasses
import os

import pytest

from simlib.parallel.shm import PREFIX
from simlib.calibration.calibrate import NULL_SHM, Spread, calibrate
from simlib.calibration.validate import (WORKLOADS, Workload, bsp_sync, compare, predict, twin_config,
                                        warmup)


@pytest.fixture(scope="module")
def cal():
    return calibrate(quick=True)


def test_same_calibration_gives_identical_predicted_traces(cal):
    w = Workload("tiny ps", "pipe_ps", n_rows=2_000, n_features=500, nnz_per_row=10, global_batch=16, steps=10)
    t1, tr1 = predict(w, 2, cal)
    t2, tr2 = predict(w, 2, dataclasses.replace(cal))
    assert t1 == t2 and tr1 == tr2
    assert len(tr1.updates) == 20


def test_twin_prices_each_substrate_from_the_calibration(cal):
    ps = twin_config(WORKLOADS["ps compute-bound"], 2, cal)
    assert ps.protocol == "bsp" and ps.topology == "ps" and ps.batch_size == 512
    hog = twin_config(WORKLOADS["hogwild"], 2, cal)
    assert hog.protocol == "async" and hog.latency == 0.0
    assert (hog.steps, hog.batch_size) == (10, 20_000)  # 2 x 100 k one-row steps per worker, one chunk a simulated step
    w = WORKLOADS["bsp shm"]
    bsp1, bsp2 = twin_config(w, 1, cal), twin_config(w, 2, cal)
    # In place: a batch step, then the wait for the slowest; no messages, no barrier, no dense apply.
    for n, cfg in ((1, bsp1), (2, bsp2)):
        assert cfg.protocol == "bsp" and cfg.topology == "ps" and cfg.latency == 0.0
        assert cfg.compute_per_unit == pytest.approx(cal.unit_time("bsp_step", n))
        call = cal.compute_time("bsp_call", w.n_features + 1, n)  # the table holds v and log s
        assert cfg.compute_overhead == pytest.approx(call)
        sync = bsp_sync(cal, n)  # a stall every step, outside the jitter
        assert cfg.stragglers.pause_time == pytest.approx(sync) and cfg.stragglers.pause_prob == float(sync > 0)
    assert bsp1.batch_size == 400 and bsp2.batch_size == 200 and bsp1.steps == bsp2.steps == 300
    # The sync is the null run's step on as many workers (2 for more) less what the kernels price for that step.
    slow = dataclasses.replace(cal, bsp_step={1: Spread(1e-3, 1e-3, 1e-3, 1), 2: Spread(2e-3, 2e-3, 2e-3, 1)})
    for n, step in ((1, 1e-3), (2, 2e-3), (3, 2e-3)):
        priced = cal.unit_time("bsp_step", n) + cal.compute_time("bsp_call", NULL_SHM["features"] + 1, n)
        assert 0 < priced < step and bsp_sync(slow, n) == pytest.approx(step - priced)
    # On 2 workers each step waits for the slower of two steps jittered by the bsp_step kernel's two-process spread.
    assert bsp1.stragglers.jitter == "none"
    assert bsp2.stragglers.jitter == "lognormal"
    assert bsp2.stragglers.jitter_sigma == cal.kernels["bsp_step"].jitter.median > 0
    unmeasured = dataclasses.replace(cal, bsp_step={})
    assert bsp_sync(unmeasured, 1) == 0.0
    assert twin_config(w, 2, slow).stragglers.pause_time == pytest.approx(bsp_sync(slow, 2))
    assert twin_config(w, 2, unmeasured).stragglers.pause_prob == 0.0


def test_compare_runs_real_processes_and_reports_errors(cal):
    mine = f"{PREFIX}{os.getpid()}_"  # segments another program owns on this machine are not this run's
    before = {n for n in os.listdir("/dev/shm") if n.startswith(mine)}
    small = [
        Workload("tiny ps", "pipe_ps", n_rows=2_000, n_features=500, nnz_per_row=10, global_batch=16, steps=10),
        Workload("tiny hogwild", "hogwild", n_rows=4_000, n_features=500, nnz_per_row=10, global_batch=1_000),
    ]
    res = compare(small, workers=(1, 2), repeats=1, cal=cal, load_seconds=0.02)
    assert [(r.workload, r.n_workers) for r in res.rows] == [(w.name, n) for w in small for n in (1, 2)]
    for r in res.rows:
        assert r.measured > 0 and r.predicted > 0
        assert r.error == pytest.approx((r.predicted - r.measured) / r.measured)
        assert res.measured[(r.workload, r.n_workers)].substrate in ("pipes", "shm")
        assert res.predicted[(r.workload, r.n_workers)].substrate == "sim"
    assert "error" in res.table(0.25)
    assert set(res.loads) == {w.name for w in small}
    assert all(line.split(":")[0] in {"calibration", *res.loads} for line in res.load_warnings())
    res.loads["tiny ps"] = {1: Spread(1.0, 1.0, 1.0, 2), 2: Spread(0.3, 0.3, 0.3, 2)}  # as if a neighbour woke up
    assert any(line.startswith("tiny ps: the machine is busy") for line in res.load_warnings())
    assert {n for n in os.listdir("/dev/shm") if n.startswith(mine)} <= before


def test_compare_prices_shared_memory_bsp_with_the_null_run_measured_between_its_runs(cal, monkeypatch):
    from simlib.calibration import validate

    w = Workload("tiny bsp shm", "bsp_shm", n_rows=2_000, n_features=500, nnz_per_row=10, global_batch=100)
    _, steps = validate.shm_steps(w, 1)
    calls = []

    def null_runs():  # as if each step outside its compute span took 1 s now (and 2 s on 2 workers)
        calls.append(1)
        return {1: [1.0], 2: [2.0]}, [0.01]

    monkeypatch.setattr(validate, "measure_null_shm", null_runs)
    res = compare([w], workers=(1,), repeats=2, cal=cal, load_seconds=0.02)
    assert len(calls) == 2  # before each repeat
    assert res.rows[0].predicted == pytest.approx(predict(w, 1, dataclasses.replace(cal, bsp_step={}))[0] + steps,
                                                  rel=0.05)


def test_compare_prices_the_jitter_measured_between_its_runs(cal, monkeypatch):
    from simlib.calibration import validate

    w = Workload("tiny bsp shm", "bsp_shm", n_rows=2_000, n_features=500, nnz_per_row=10, global_batch=100)
    jitters = iter([[0.5, 0.7], [0.9, 1.1]])  # as if two windows each, before each of 2 repeats

    def contention(kinds, quick):
        js = next(jitters)
        return {k: {"slowdown": [1.0] * len(js), "jitter": js} for k in kinds}

    priced = []

    def predict(w, n, c):  # what compare() prices each worker count with
        priced.append(c)
        return 1.0, None

    monkeypatch.setattr(validate, "measure_contention", contention)
    monkeypatch.setattr(validate, "predict", predict)
    compare([w], workers=(1, 2), repeats=2, cal=cal, load_seconds=0.02)
    assert [c.kernels["bsp_step"].jitter.median for c in priced] == [0.8, 0.8]  # the median of the 4 windows


def test_shared_memory_bsp_on_two_workers_waits_for_the_slower_jittered_step(cal):
    w = Workload("tiny bsp shm", "bsp_shm", n_rows=4_000, n_features=500, nnz_per_row=10, global_batch=20)

    def with_sigma(sigma):  # and no stall (the null run unmeasured): each simulated step is all compute
        return dataclasses.replace(cal, bsp_step={}).with_contention({}, {"bsp_step": Spread(sigma, sigma, sigma, 1)})

    quiet, noisy = with_sigma(0.0), with_sigma(1.0)
    assert predict(w, 1, noisy)[0] == predict(w, 1, quiet)[0]  # one worker waits for no one: mean-1 noise is moot
    t_quiet, t_noisy = predict(w, 2, quiet)[0], predict(w, 2, noisy)[0]
    # E[max of two mean-1 lognormals] = 2 Phi(sigma / sqrt 2) = 1.52 at sigma 1: the simulated part grows about so
    start = cal.start_time(2) + warmup(w, cal, 2)
    assert 1.3 < (t_noisy - start) / (t_quiet - start) < 1.75
    assert twin_config(w, 2, with_sigma(50.0)).stragglers.jitter_sigma == 5.0  # the simulator's largest


def test_with_null_replaces_the_named_figures_only(cal):
    fresh = {2: Spread(0.5, 0.5, 0.5, 1)}
    again = cal.with_null(bsp_step=fresh)
    assert again.bsp_step == {**cal.bsp_step, 2: fresh[2]} and again.ps_step == cal.ps_step
    assert cal.with_null(ps_step=fresh).ps_step[2] == fresh[2]
    with pytest.raises(ValueError, match="figure"):
        cal.with_null(bsp_sync=fresh)


@pytest.mark.parametrize("kwargs, field", [
    ({"substrate": "gpu"}, "substrate"),
    ({"global_batch": 0}, "global_batch"),
    ({"global_batch": 3}, "global_batch"),
    ({"substrate": "hogwild", "dense": True}, "dense"),
])
def test_bad_workload_names_the_field(kwargs, field):
    base = dict(name="x", substrate="pipe_ps")
    base.update(kwargs)
    with pytest.raises(ValueError, match=field):
        Workload(**base)


def test_bad_compare_arguments_name_the_field(cal):
    with pytest.raises(ValueError, match="repeats"):
        compare([WORKLOADS["hogwild"]], repeats=0, cal=cal)
    with pytest.raises(ValueError, match="workers"):
        compare([WORKLOADS["hogwild"]], workers=(0,), cal=cal)


def test_pipe_ps_residual_is_what_the_model_leaves_unexplained(cal):
    import dataclasses

    from simlib.calibration.calibrate import Spread
    from simlib.calibration.validate import pipe_ps_residual

    assert set(cal.ps_step) == {1, 2}  # calibration measured the null run on 1 and 2 workers
    assert all(s.n > 0 and s.median > 0 for s in cal.ps_step.values())
    unmeasured = dataclasses.replace(cal, ps_step={})
    assert pipe_ps_residual(unmeasured) == 0.0 == pipe_ps_residual(unmeasured, 2)
    # A null step far slower than the model (1 s, whatever the machine's load): the residual is the
    # difference, to the second.
    slow = dataclasses.replace(cal, ps_step={1: Spread(1.0, 0.0, 0.0, 1), 2: Spread(2.0, 0.0, 0.0, 1)})
    slower = dataclasses.replace(cal, ps_step={1: Spread(1.0001, 0.0, 0.0, 1), 2: Spread(2.0, 0.0, 0.0, 1)})
    assert 0 < pipe_ps_residual(slow) < 1.0 < pipe_ps_residual(slow, 2) < 2.0
    assert pipe_ps_residual(slower) - pipe_ps_residual(slow) == pytest.approx(1e-4, rel=1e-9)
    # Each worker count takes its own null run's residual (3 workers take 2's).
    assert pipe_ps_residual(slower, 3) == pipe_ps_residual(slow, 2)
    # The twin charges the residual to every step.
    w = WORKLOADS["ps latency-bound"]
    assert twin_config(w, 1, slower).compute_overhead == pytest.approx(twin_config(w, 1, unmeasured).compute_overhead + pipe_ps_residual(slower))


def test_pipe_ps_prediction_adds_the_measured_warm_up_once(cal):
    import dataclasses

    from simlib.calibration.calibrate import Spread
    from simlib.calibration.validate import warmup

    assert cal.ps_warmup.n > 0 and cal.ps_warmup.median >= 0
    w = WORKLOADS["ps latency-bound"]
    none = dataclasses.replace(cal, ps_warmup=Spread.unmeasured())
    more = dataclasses.replace(cal, ps_warmup=Spread(0.5, 0.5, 0.5, 1))
    hog = WORKLOADS["hogwild"]
    assert warmup(w, none) == 0.0 and warmup(hog, more, 2) == warmup(hog, none, 2)  # the pipe's warm-up only
    assert predict(w, 2, more)[0] - predict(w, 2, none)[0] == pytest.approx(0.5, rel=1e-9)


def test_shared_memory_prediction_adds_the_first_touch_of_one_shard(cal):
    import dataclasses

    from simlib.calibration.calibrate import Spread
    from simlib.calibration.validate import shm_bytes_per_worker, warmup, workload_problem

    assert cal.shm_first_touch.n > 0 and 0 < cal.shm_first_touch.median < 1e-6  # well under 1 us per byte
    hog, bsp = WORKLOADS["hogwild"], WORKLOADS["bsp shm"]
    data = workload_problem(hog).data
    # One worker reads the whole data set and the weights; two workers read half the rows each.
    assert shm_bytes_per_worker(hog, 1) == data.indices.nbytes + data.values.nbytes + \
        hog.n_rows * (data.indptr.itemsize + data.y.itemsize) + 8 * (hog.n_features + 1)  # the table: v and log s
    assert shm_bytes_per_worker(hog, 2) < 0.6 * shm_bytes_per_worker(hog, 1)
    bsp_data = workload_problem(bsp).data
    assert shm_bytes_per_worker(bsp, 1) == bsp_data.indices.nbytes + bsp_data.values.nbytes + \
        bsp.n_rows * (bsp_data.indptr.itemsize + bsp_data.y.itemsize) + 8 * (bsp.n_features + 1)  # no gradient table
    fixed = dataclasses.replace(cal, shm_first_touch=Spread(1e-9, 1e-9, 1e-9, 1), shm_setup=Spread(0.002, 0.002, 0.002, 1),
                                cpu_share={1: Spread(1.0, 1.0, 1.0, 1)})
    assert warmup(hog, fixed, 1) == pytest.approx(0.002 + shm_bytes_per_worker(hog, 1) * 1e-9)
    unmeasured = dataclasses.replace(fixed, shm_first_touch=Spread.unmeasured())
    assert warmup(hog, unmeasured, 1) == pytest.approx(0.002)  # the set-up alone
    # measured, and sane (bounds that hold on a busy machine: these are checks, not benchmarks)
    assert cal.shm_setup.n > 0 and 0 <= cal.shm_setup.median < 1.0
    assert set(cal.bsp_step) == {1, 2} and all(0 < s.median < 1.0 for s in cal.bsp_step.values())
    assert predict(hog, 1, fixed)[0] - predict(hog, 1, unmeasured)[0] == pytest.approx(shm_bytes_per_worker(hog, 1) * 1e-9, rel=1e-9)

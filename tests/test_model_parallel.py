"""Pipeline and tensor parallelism on processes: the math of one process, the stash the schedule says, the bytes
the formula says, refusals by name, and nothing left behind. Timings are benchmarks/pipeline.py's."""
from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from simlib import costs
from simlib.parallel import WorkerDied, WorkerError, current
from simlib.modelpar import run_pipeline, run_tensor_parallel, split_layers
from simlib.problems.mlp import MLPProblem


@pytest.fixture(scope="module")
def prob() -> MLPProblem:
    return MLPProblem(hidden=(32, 24, 16))


@pytest.fixture(scope="module")
def reference(prob: MLPProblem) -> tuple[float, np.ndarray]:
    theta = prob.init_params()
    return prob.batch_loss(theta, BATCH), prob.gradient(theta, BATCH)


BATCH = np.arange(10, 70)  # 60 rows: micro-batches of unequal sizes for m = 7


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal to 1e-6 relative to the reference's largest entry."""
    return float(np.abs(a - b).max()) <= 1e-6 * float(np.abs(b).max())


@pytest.mark.parametrize("schedule", costs.SCHEDULES)
@pytest.mark.parametrize("stages,m", [(2, 1), (2, 7), (3, 4), (4, 5)])
def test_pipeline_gradient_equals_one_process_and_stash_follows_the_schedule(prob, reference, schedule, stages, m):
    run = run_pipeline(prob, BATCH, stages=stages, microbatches=m, schedule=schedule, steps=2)
    loss, grad = reference
    assert abs(run.loss - loss) <= 1e-6 * abs(loss) and _close(run.gradient, grad)
    assert [s.peak_stash for s in run.stages] == costs.stash_peaks(costs.pipeline_orders(schedule, stages, m))
    assert [s.peak_stash for s in run.stages] == ([m] * stages if schedule == "gpipe" else
                                                 [min(stages - s, m) for s in range(stages)])
    assert [s.layers for s in run.stages] == [tuple(r) for r in split_layers(prob, stages)]


def test_stash_bytes_are_the_stashed_activations(prob):
    """Layer 0 (64 x 32) has as much work as layers 1-3 (2 x 64 x 32 against 3 x (32 x 24 + 24 x 16 + 16 x 10)
    multiply-adds), so it is stage 0 of two; a row stashes its input and z there (64 + 32 values), and its
    inputs and z of layers 1-3 on stage 1 (32 + 24 + 24 + 16 + 16 + 10)."""
    run = run_pipeline(prob, BATCH, stages=2, microbatches=6, schedule="gpipe", steps=1)
    assert [s.layers for s in run.stages] == [(0,), (1, 2, 3)]
    per_row = [(64 + 32) * 8, (32 + 24 + 24 + 16 + 16 + 10) * 8]
    assert [s.peak_stash_bytes for s in run.stages] == [60 * b for b in per_row]  # all 6 micro-batches: the batch
    one = run_pipeline(prob, BATCH, stages=2, microbatches=6, schedule="1f1b", steps=1)
    assert [s.peak_stash_bytes for s in one.stages] == [2 * 10 * per_row[0], 10 * per_row[1]]  # 10 rows each


def test_pipeline_reports_times_that_add_up(prob):
    run = run_pipeline(prob, BATCH, stages=2, microbatches=4, schedule="1f1b", steps=3)
    for s in run.stages:  # a stage's own scheduling delays are neither busy nor idle
        assert 0 < s.busy <= 4 * (s.t_fwd + s.t_bwd) and 0 <= s.delays and s.busy + s.delays < run.step_time
        assert s.idle_share == pytest.approx(1 - s.busy / (run.step_time - s.delays))
        assert s.t_fwd > 0 and s.t_bwd > 0
    assert run.comm >= 0 and run.predicted >= 4 * (run.stages[0].t_fwd + run.stages[0].t_bwd)  # stage 0 runs 4 F, 4 B


def test_a_students_orders_run_and_deadlocking_orders_are_refused(prob, reference):
    own = [[("F", 0), ("F", 1), ("B", 1), ("B", 0)], [("F", 0), ("F", 1), ("B", 1), ("B", 0)]]
    run = run_pipeline(prob, BATCH, stages=2, microbatches=2, schedule=own, steps=1)
    assert _close(run.gradient, reference[1]) and [s.peak_stash for s in run.stages] == [2, 2]
    crossed = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 1), ("B", 1), ("F", 0), ("B", 0)]]
    with pytest.raises(ValueError, match="orders: the stages wait on each other"):
        run_pipeline(prob, BATCH, stages=2, microbatches=2, schedule=crossed)


def test_a_stage_reads_the_micro_batch_it_asks_for_whatever_order_its_neighbour_sent_in(prob, reference):
    """Stage 0 runs F2, F0, F1 and stage 1 reads F0, F1, F2 (then the backwards the other way round): each reads
    its micro-batch's own activations and gradients, so the gradient is still the batch's."""
    sender = [("F", 2), ("F", 0), ("F", 1), ("B", 0), ("B", 1), ("B", 2)]
    reader = [("F", 0), ("F", 1), ("F", 2), ("B", 2), ("B", 1), ("B", 0)]
    run = run_pipeline(prob, BATCH, stages=2, microbatches=3, schedule=[sender, reader], steps=2)
    assert abs(run.loss - reference[0]) <= 1e-6 * abs(reference[0]) and _close(run.gradient, reference[1])


@pytest.mark.parametrize("kwargs,field", [
    (dict(stages=5), "stages must be an integer in \\[1, 4\\]"),
    (dict(stages=0), "stages"),
    (dict(microbatches=0), "microbatches must be an integer in \\[1, 60\\]"),
    (dict(microbatches=61), "microbatches"),
    (dict(schedule="interleaved"), "schedule"),
    (dict(schedule=[[("F", 0), ("B", 0)]]), "schedule: orders must have 2 stages"),
    (dict(steps=0), "steps"),
    (dict(problem=object()), "problem must be an MLPProblem"),
    (dict(params=np.zeros(3)), "params must be a flat vector"),
    (dict(batch=np.array([], dtype=int)), "batch"),
    (dict(batch=np.array([0, 10_000])), "batch"),
    (dict(steps=10**12), "steps must be an integer in \\[1, 1000000000\\]"),
    (dict(params="x"), "params must be a flat vector"),
    (dict(params=np.full(3, np.nan)), "params must be a flat vector"),
    (dict(schedule=3), "schedule"),
    (dict(stages=2, microbatches=1, schedule=[[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]]), "schedule: orders"),
    (dict(timeout=0), "timeout"),
])
def test_pipeline_refuses_bad_input_by_name(prob, kwargs, field):
    args = dict(batch=BATCH) | kwargs
    with pytest.raises(ValueError, match=field):
        run_pipeline(args.pop("problem", prob), args.pop("batch"), **args)
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("n_devices", [1, 2, 3, 4])
@pytest.mark.parametrize("block", [0, 1, 2])
def test_tensor_parallel_equals_one_process_and_counts_the_formulas_bytes(prob, reference, n_devices, block):
    run = run_tensor_parallel(prob, BATCH, n_devices=n_devices, block=block)
    loss, grad = reference
    assert abs(run.loss - loss) <= 1e-6 * abs(loss) and _close(run.gradient, grad)
    width_in, width_out = prob.sizes[block], prob.sizes[block + 2]
    want = costs.tensor_parallel_bytes(len(BATCH), width_in, width_out, n_devices, input_grad=block > 0)
    assert run.predicted_bytes == want
    assert sum(run.bytes_sent) == n_devices * want  # the ring's chunks need not split evenly; the total does
    if (len(BATCH) * width_out) % n_devices == 0 and (len(BATCH) * width_in) % n_devices == 0:
        assert run.bytes_sent == [want] * n_devices


def test_tensor_parallel_bytes_formula():
    """Two ranks, 60 rows, a block from 32 to 16 wide: each sends half of (60 x 16 + 60 x 32) float64 values."""
    assert costs.tensor_parallel_bytes(60, 32, 16, 2) == 60 * 48 * 8
    assert costs.tensor_parallel_bytes(60, 32, 16, 2, input_grad=False) == 60 * 16 * 8
    assert costs.tensor_parallel_bytes(60, 32, 16, 1) == 0


@pytest.mark.parametrize("kwargs,field", [
    (dict(block=3), "block must be in \\[0, 2\\]"),
    (dict(block=-1), "block"),
    (dict(n_devices=0), "n_devices"),
    (dict(block=2, n_devices=17), "n_devices must be an integer in \\[1, 16\\]"),
    (dict(params=None, problem=object()), "problem must be an MLPProblem"),
    (dict(params=np.full(3, np.inf)), "params must be a flat vector"),
])
def test_tensor_parallel_refuses_bad_input_by_name(prob, kwargs, field):
    with pytest.raises(ValueError, match=field):
        run_tensor_parallel(kwargs.pop("problem", prob), BATCH, **kwargs)


def test_more_devices_or_stages_than_processes_a_cpu_can_run_are_refused_by_their_own_names():
    """A process per device or stage (16 per CPU at most): n_devices=1000 was refused naming n_workers, a name the
    call does not take."""
    import os

    from simlib.parallel.group import PROCESSES_PER_CPU

    most = PROCESSES_PER_CPU * os.cpu_count()
    wide = MLPProblem(hidden=(most + 1, most + 1))
    with pytest.raises(ValueError, match=rf"^n_devices: run_tensor_parallel .* {most + 1} processes, more than {most}"):
        run_tensor_parallel(wide, BATCH, n_devices=most + 1)
    deep = MLPProblem(hidden=(2,) * (most + 1))
    with pytest.raises(ValueError, match=rf"^stages: run_pipeline .* {most + 1} processes, more than {most}"):
        run_pipeline(deep, BATCH, stages=most + 1)
    assert multiprocessing.active_children() == []


def test_layers_are_split_by_least_largest_stage_in_polynomial_time():
    """The first of the splits whose largest stage is least (as trying every cut chose it); 41 layers into 20
    stages (C(40, 19) = 1e11 cuts to try) never finished."""
    import itertools

    from simlib.modelpar import _least_largest

    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 9))
        parts, work = int(rng.integers(1, n + 1)), [int(w) for w in rng.choice([0, 1, 2, 3, 5, 8, 100], n)]
        cut = min(itertools.combinations(range(1, n), parts - 1),
                  key=lambda c: max(sum(work[i:j]) for i, j in zip((0, *c), (*c, n))))
        assert _least_largest(work, parts) == [range(i, j) for i, j in zip((0, *cut), (*cut, n))], (work, parts)
    layers = split_layers(MLPProblem(hidden=(4,) * 40), 20)
    assert len(layers) == 20 and layers[0].start == 0 and layers[-1].stop == 41


def test_tensor_parallel_needs_two_layers():
    one_layer = MLPProblem(hidden=())
    with pytest.raises(ValueError, match="problem: tensor parallelism splits two layers"):
        run_tensor_parallel(one_layer, BATCH)


class _FailsOnLastStage(MLPProblem):
    """Labels cannot be read: the last stage (the one that scores) raises on its first forward."""

    def rows(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ctx = current()
        if ctx is not None and ctx.worker_id == ctx.n_workers - 1:
            raise OSError("the labels' disk went away")
        return super().rows(batch)


def test_a_stage_that_raises_stops_the_run_and_leaves_nothing(prob):
    broken = _FailsOnLastStage(hidden=(32, 24, 16))
    with pytest.raises(WorkerError, match="stage 1 failed: OSError: the labels' disk went away"):
        run_pipeline(broken, BATCH, stages=2, microbatches=4, steps=1, timeout=30)
    assert multiprocessing.active_children() == []


def test_a_killed_stage_is_reported_and_its_peers_stopped(sigkill_a_worker):
    big = MLPProblem(hidden=(256, 256, 256))
    with sigkill_a_worker(delay=0.5), pytest.raises(WorkerDied, match="stage"):
        run_pipeline(big, np.arange(1000), stages=2, microbatches=8, steps=10_000, timeout=60)
    assert multiprocessing.active_children() == []

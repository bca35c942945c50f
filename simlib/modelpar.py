"""Model parallelism on real processes: an MLP's layers as pipeline stages, and Megatron's split of an MLP block.

Pipeline (:func:`run_pipeline`): the layers of an :class:`~simlib.problems.mlp.MLPProblem` are cut into p
contiguous stages of near-equal work, one process each. A batch is split into m micro-batches; each stage runs
its forwards ("F", k) and backwards ("B", k) in the order a schedule gives (:func:`simlib.costs.pipeline_orders`:
GPipe or 1F1B, or any valid orders), receiving activations from the stage before and gradients from the stage
after through shared memory (a transfer is a copy into the micro-batch's slot and a raised flag). A micro-batch's
activations are stashed from its forward to its backward and freed there.
Measured per stage: busy seconds, the idle share of the step (its own scheduling delays left out, see
:func:`_run_order`), the peak stash (micro-batches and bytes); the same
orders priced by :func:`simlib.costs.schedule_timeline` with the forward, backward and transfer times measured in
the run give the predicted step time. The gradient is the full batch's, as one process computes it.

Tensor (:func:`run_tensor_parallel`): layers ``block`` and ``block + 1`` are split over t processes, the first
weight by columns and the second by rows, so each process computes relu(a W1[:, c]) W2[c, :] and one ring
all-reduce sums the block's output; in the backward pass one all-reduce sums the block's input gradient.
The bytes each process sends are counted. Example::

    >>> from simlib.problems.mlp import MLPProblem
    >>> prob = MLPProblem(hidden=(32, 32)); batch = np.arange(64)
    >>> run = run_pipeline(prob, batch, stages=2, microbatches=4, schedule="1f1b")
    >>> [s.peak_stash for s in run.stages], bool(np.allclose(run.gradient, prob.gradient(prob.init_params(), batch)))
    ([2, 1], True)
    >>> tp = run_tensor_parallel(prob, batch, n_devices=2)
    >>> tp.bytes_sent == [int(tp.predicted_bytes)] * 2
    True
"""
from __future__ import annotations

import contextlib
import itertools
import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from simlib import _validate as check
from simlib import costs
from simlib.parallel.allreduce import TSO, Ring
from simlib.parallel.channel import Channel
from simlib.parallel.group import WorkerGroup, check_processes
from simlib.protocol import MAX_REAL_STEPS
from simlib.problems.mlp import (MLPProblem, cross_entropy, cross_entropy_backward, dense_backward, dense_forward,
                                 layers_backward, layers_forward, relu, relu_backward)

Weights = list[tuple[np.ndarray, np.ndarray]]


# -- layer math shared by stages and tensor-parallel ranks ----------------------------------------


def _backward(weights: Weights, inputs: list, zs: list, d_out: np.ndarray, relu_out: bool,
              input_grad: bool) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray | None]:
    """([(dW_i, db_i)] in layer order, dL/d inputs_0) of :func:`~simlib.problems.mlp.layers_backward`."""
    steps = list(layers_backward(weights, inputs, zs, d_out, relu_out, input_grad))[::-1]
    return [(dW, db) for _, dW, db, _ in steps], steps[0][3]


def split_layers(problem: MLPProblem, stages: int) -> list[range]:
    """Contiguous layer ranges, one per stage, minimising the largest stage's multiply-adds (forward + backward)."""
    n = len(problem.layers)
    check.positive_int("stages", stages, most=n)
    work = [a * b * (2 if l == 0 else 3) for l, (a, b) in enumerate(zip(problem.sizes, problem.sizes[1:]))]
    return _least_largest(work, stages)


def _least_largest(work: list[int], parts: int) -> list[range]:
    """The cut of ``work`` into ``parts`` non-empty contiguous runs whose largest sum is least; of those, the first
    (cuts as early as they can be). O(n^2 parts); trying every cut was C(n - 1, parts - 1) (41 layers in 20
    stages: 1e11, it never ended)."""
    n, total = len(work), [0, *itertools.accumulate(work)]
    # least[k][i]: the least largest sum of k + 1 non-empty runs over work[i:]
    least = [[total[n] - total[i] if i < n else math.inf for i in range(n + 1)]]
    for k in range(1, parts):
        least.append([min((max(total[c] - total[i], least[k - 1][c]) for c in range(i + 1, n)), default=math.inf)
                      for i in range(n + 1)])
    cuts = [0]
    for k in range(parts - 2, -1, -1):  # each cut as early as the runs after it still fit under the least largest
        i = cuts[-1]
        cuts.append(next(c for c in range(i + 1, n) if max(total[c] - total[i], least[k][c]) <= least[-1][0]))
    return [range(i, j) for i, j in zip(cuts, (*cuts[1:], n))]


def balanced_mlp(width: int) -> MLPProblem:
    """Digits through hidden layers (w1, width, width), w1 = width (3 width + 30) / (3 width + 128): two stages of
    equal multiply-adds (stage 0: 2 * 64 w1 + 3 w1 width; stage 1: 3 width^2 + 3 * 10 width)."""
    check.positive_int("width", width)
    return MLPProblem(hidden=(width * (3 * width + 30) // (3 * width + 128), width, width))


def _check_inputs(problem: MLPProblem, batch: Any, params: Any) -> tuple[np.ndarray, np.ndarray]:
    """(batch as row ids, flat parameters: ``init_params()`` for None); ValueError naming 'problem' unless an
    MLPProblem, 'batch' unless non-empty integers in [0, training rows), 'params' unless n_params finite floats."""
    if not isinstance(problem, MLPProblem):
        raise ValueError(f"problem must be an MLPProblem (its layers are what is split), got {type(problem).__name__}")
    rows = np.asarray(batch)
    n = problem.shards(1)[0][1]
    if rows.ndim != 1 or rows.size == 0 or rows.dtype.kind not in "iu" or rows.min() < 0 or rows.max() >= n:
        raise ValueError(f"batch must be a non-empty 1-D array of training-row ids in [0, {n}), got {batch!r}")
    try:
        theta = problem.init_params() if params is None else np.asarray(params, dtype=np.float64)
    except (TypeError, ValueError):
        theta = np.empty(0)  # not numbers: refused below, by name
    if theta.shape != (problem.n_params,) or not np.isfinite(theta).all():
        raise ValueError(f"params must be a flat vector of {problem.n_params} finite values, got {params!r:.80}")
    return rows, theta


class _Link:
    """The boundary between stages s and s + 1 in shared memory: the batch's activations there (way 0, forwards) and
    their gradients (way 1, backwards), micro-batch k in rows ``bounds[k]:bounds[k + 1]``. A transfer is a copy into
    those rows, a flag raised to the step's number, and a semaphore released for a receiver asleep on it; the receiver
    reads the rows in place. Each slot is written once a step and read within it, and steps start at a barrier, so
    no slot is written while it is read."""

    # NOTE: replaces a pickled header and the raw rows down a pipe, written by a sender thread. On 2 loaded cores a
    # stage waited 1-4 ms per micro-batch after its neighbour had finished it (the thread's turn for the interpreter,
    # the pipe's 64 KB at a time), which put the idle share 0.2-0.35 above the bubble formula at m = 16. A waiting
    # stage sleeps on the semaphore: spinning on the flag measured no faster, and sleeping leaves the core to others.

    def __init__(self, group: WorkerGroup, bounds: Sequence[int], width: int):
        self.bounds = [int(b) for b in bounds]
        self.rows = group.zeros((2, self.bounds[-1], width))
        self.flags = group.zeros((2, len(self.bounds) - 1), np.int64)  # the step whose data the slot holds
        self.sent = group.zeros((2, len(self.bounds) - 1))  # when it was written (perf_counter): the receiver times it
        self.notices = [group.ctx.Semaphore(0), group.ctx.Semaphore(0)]  # one release per slot written, each way
        # x86-64 keeps the copy's stores before the flag's; elsewhere a lock orders them
        self.fence = contextlib.nullcontext() if TSO else group.lock()

    def send(self, way: int, k: int, a: np.ndarray, step: int) -> float:
        """Copy ``a`` into micro-batch k's slot of ``way``, raise its flag to ``step``, wake the receiver; returns when
        the copy was done."""
        self.rows.array[way, self.bounds[k]:self.bounds[k + 1]] = a
        done = self.sent.array[way, k] = time.perf_counter()
        with self.fence:
            self.flags.array[way, k] = step
        self.notices[way].release()
        return done

    def recv(self, way: int, k: int, step: int) -> tuple[np.ndarray, float]:
        """Micro-batch k's slot of ``way`` once its flag shows ``step`` (a view), and when it was written."""
        flags, notices = self.flags.array[way], self.notices[way]

        def ready() -> bool:
            with self.fence:
                return bool(flags[k] == step)

        while not ready():  # a release may be another slot's (orders need not send in the order read): look again
            notices.acquire()
        notices.acquire(False)  # one release taken per slot: those of slots found ready at once do not pile up
        return self.rows.array[way, self.bounds[k]:self.bounds[k + 1]], float(self.sent.array[way, k])


# -- pipeline parallelism --------------------------------------------------------------------------


@dataclass(frozen=True)
class StageReport:
    """One stage, averaged over the measured steps: its layers, busy seconds per step (each operation from its input's
    arrival to its output's copy), its own scheduling delays per step (:func:`_run_order`), idle share
    1 - busy / (step - delays), seconds of one forward and one backward (to the receiver woken), and its peak stash
    (micro-batches, bytes)."""

    layers: tuple[int, ...]
    busy: float
    delays: float
    idle_share: float
    t_fwd: float
    t_bwd: float
    peak_stash: int
    peak_stash_bytes: int


@dataclass(frozen=True)
class PipelineRun:
    """A pipeline step on processes: loss and gradient of the whole batch, each stage's report, measured and
    predicted step time (seconds), ``comm`` (one transfer between stages, seconds: the median of those a
    stage waited for), and the operations' timelines, measured and predicted."""

    orders: list[list[tuple[str, int]]]
    loss: float
    gradient: np.ndarray
    stages: list[StageReport]
    step_time: float
    predicted: float
    comm: float
    timelines: dict[str, dict[str, list[tuple[float, float, str]]]]  # "measured" (the last step), "predicted"

    def rows(self, which: str = "measured", scale: float = 1e3) -> dict[str, list[tuple[float, float, str]]]:
        """Per stage, (start, end, 'F3') of each operation (times x ``scale``: ms) for :func:`simlib.viz.plot_gantt`."""
        check.one_of("which", which, tuple(self.timelines))
        return {stage: [(a * scale, b * scale, op) for a, b, op in ops] for stage, ops in self.timelines[which].items()}

    @property
    def idle_share(self) -> float:
        """Mean over stages of the share of the step each sat idle."""
        return float(np.mean([s.idle_share for s in self.stages]))


class _Stage:
    """Stage s of p: the weights of its ``layers``, gradient accumulators and stash (micro-batch k -> what its
    backward reads). ``micro``: the row ids of each micro-batch, whose loss is weighted |micro| / |B|."""

    def __init__(self, problem: MLPProblem, params: np.ndarray, micro: list[np.ndarray], layers: range, s: int, p: int):
        self.problem, self.micro, self.rows = problem, micro, sum(len(m) for m in micro)
        self.first, self.last = s == 0, s == p - 1
        self.weights = [problem.weights(params, layer) for layer in layers]

    def zero(self) -> None:
        """Start a step: no gradient, no loss, nothing stashed."""
        self.grads = [(np.zeros_like(W), np.zeros_like(b)) for W, b in self.weights]
        self.stash = {}
        self.loss, self.held, self.peak, self.peak_bytes = 0.0, 0, 0, 0

    def forward(self, k: int, a: np.ndarray | None) -> np.ndarray:
        """Run micro-batch k (the first stage, ``a`` None: its rows) through the stage, stash its inputs and z; the
        output (the last stage: logits)."""
        if a is None:
            a = self.problem.rows(self.micro[k])[0]
        inputs, zs, out = layers_forward(self.weights, a, relu_out=not self.last)
        if self.last:
            y = self.problem.rows(self.micro[k])[1]
            self.loss += float(cross_entropy(out, y)) * len(y) / self.rows
        self.stash[k] = (inputs, zs)
        self.held += sum(x.nbytes for x in inputs + zs)
        self.peak, self.peak_bytes = max(self.peak, len(self.stash)), max(self.peak_bytes, self.held)
        return out

    def backward(self, k: int, d_out: np.ndarray | None) -> np.ndarray | None:
        """Backward of micro-batch k from dL/d output (None on the last stage: the loss's), freeing its stash."""
        inputs, zs = self.stash.pop(k)
        self.held -= sum(x.nbytes for x in inputs + zs)
        if self.last:
            y = self.problem.rows(self.micro[k])[1]
            d_out = cross_entropy_backward(zs[-1], y) * (len(y) / self.rows)
        grads, da = _backward(self.weights, inputs, zs, d_out, not self.last, input_grad=not self.first)
        for (gW, gb), (dW, db) in zip(self.grads, grads):
            gW += dW
            gb += db
        return da


def _run_order(stage: _Stage, order: list, left: _Link | None, right: _Link | None,
               step: int) -> tuple[float, float, list[tuple[str, float, float, int]], list[float], float, float]:
    """Step ``step`` of ``order``, the stage's sums zeroed first: (start, end, [(kind, compute seconds, started, k)
    per op], transfers, busy, delays); waits are not compute, the copy into the next stage's slot is. A transfer is
    timed from the copy's end to the arrival, where the receiver was already waiting for it. ``busy`` sums each
    operation from its input's arrival to its output's copy; ``delays`` what is neither the schedule's work nor its
    wait: from a sent input to this process running again, and from its output's copy to its next request (waking
    the receiver, which may take this core a while)."""

    # NOTE: an operation's compute seconds run to after the wake-up, as the cost model prices it; busy and delays
    # split that. Counted as busy, waits for the core after a wake-up (up to 21 ms, 2.5-4.3% of a step at m = 1, load
    # 11-12 on 2 cores) put the idle share at m = 1 at 0.47-0.49 against the formula's 0.50.
    stage.zero()
    ops, transfers, start, busy, delays, done = [], [], time.perf_counter(), 0.0, 0.0, None
    for kind, k in order:  # a forward comes from the left and goes right (way 0), a backward the other way (way 1)
        inbound, outbound, way = (left, right, 0) if kind == "F" else (right, left, 1)
        called = time.perf_counter()
        delays += 0.0 if done is None else called - done
        data, sent = inbound.recv(way, k, step) if inbound is not None else (None, called)
        t = time.perf_counter()
        if called < sent:
            transfers.append(t - sent)
            delays += t - sent
        out = stage.forward(k, data) if kind == "F" else stage.backward(k, data)
        done = outbound.send(way, k, out, step) if outbound is not None else time.perf_counter()
        busy += done - t
        ops.append((kind, time.perf_counter() - t, t, k))
    return start, time.perf_counter(), ops, transfers, busy, delays


def _stage_worker(s: int, p: int, steps: int, barrier: Any, stage: _Stage, order: list, left: _Link | None,
                  right: _Link | None) -> dict[str, Any]:
    """A stage's process: ``steps`` steps of its order, each started at a barrier."""
    runs = []  # one BLAS thread a stage (simlib.problems.mlp keeps it so): two stages' threads would fight for cores
    for j in range(1, steps + 1):
        barrier.wait()
        runs.append(_run_order(stage, order, left, right, j))
    return {"steps": runs, "loss": stage.loss, "peak": (stage.peak, stage.peak_bytes),
            "grads": [np.concatenate([W.ravel(), b]) for W, b in stage.grads]}


def run_pipeline(problem: MLPProblem, batch: Any, params: Any = None, *, stages: int = 2, microbatches: int = 4,
                 schedule: str | list = "1f1b", steps: int = 3, timeout: float = 120.0) -> PipelineRun:
    """One training step's loss and gradient of ``batch`` on ``stages`` processes, run ``steps`` times (the first
    a warm-up when steps > 1, left out of the times reported). ``schedule``: "gpipe", "1f1b" or orders."""
    rows, theta = _check_inputs(problem, batch, params)
    layers = split_layers(problem, stages)
    check_processes(stages, "run_pipeline (a process per stage)", "stages")
    check.positive_int("microbatches", microbatches, most=len(rows))
    check.positive_int("steps", steps, most=MAX_REAL_STEPS)
    check.positive("timeout", timeout)
    orders = _orders(schedule, stages, microbatches)
    micro = np.array_split(rows, microbatches)
    bounds = np.cumsum([0] + [len(k) for k in micro])
    with WorkerGroup(stages, roles=[f"stage {s}" for s in range(stages)], label="pipeline") as group:
        links = [_Link(group, bounds, problem.sizes[layers[s][-1] + 1]) for s in range(stages - 1)]
        each = [(_Stage(problem, theta, micro, layers[s], s, stages), orders[s], links[s - 1] if s else None,
                 links[s] if s < stages - 1 else None) for s in range(stages)]
        results = group.run(_stage_worker, steps, group.barrier(), worker_args=each, timeout=timeout)
    return _report(problem, orders, layers, results)


def _orders(schedule: str | list, stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """Orders named or given; ValueError naming 'schedule' when they do not fit the stages and micro-batches."""
    if isinstance(schedule, str):
        return costs.pipeline_orders(schedule, stages, microbatches)
    try:
        if not isinstance(schedule, (list, tuple)) or len(schedule) != stages \
                or costs.check_orders(schedule) != microbatches:
            raise ValueError(f"orders must have {stages} stages of {microbatches} micro-batches each")
        costs.schedule_timeline(schedule, [1.0] * stages, [1.0] * stages, 0.0)  # ValueError where stages would deadlock
    except ValueError as exc:
        raise ValueError(f"schedule: {exc}") from None
    return [[(str(kind), int(k)) for kind, k in order] for order in schedule]


def _report(problem: MLPProblem, orders: list, layers: list[range], results: list[dict]) -> PipelineRun:
    """Stage reports averaged over the measured steps (all but a warm-up) and the step priced by the cost model."""
    n_steps = len(results[0]["steps"])
    measured = range(min(1, n_steps - 1), n_steps)
    step = np.mean([max(r["steps"][j][1] for r in results) - min(r["steps"][j][0] for r in results) for j in measured])
    reports = []
    for s, r in enumerate(results):
        times = {kind: [t for j in measured for op, t, *_ in r["steps"][j][2] if op == kind] for kind in "FB"}
        busy, delays = (float(np.mean([r["steps"][j][i] for j in measured])) for i in (4, 5))
        reports.append(StageReport(tuple(layers[s]), busy, delays, 1 - busy / (step - delays),
                                   float(np.mean(times["F"])), float(np.mean(times["B"])), *r["peak"]))
    waited = [d for r in results for j in measured for d in r["steps"][j][3]]
    comm = float(np.median(waited)) if waited else 0.0  # no stage ever waited: transfers were off the critical path
    model = costs.schedule_timeline(orders, [s.t_fwd for s in reports], [s.t_bwd for s in reports], comm)
    origin = min(r["steps"][-1][0] for r in results)
    measured_rows = {f"stage {s}": [(t0 - origin, t0 - origin + t, f"{kind}{k}") for kind, t, t0, k in
                                    r["steps"][-1][2]] for s, r in enumerate(results)}
    predicted_rows = {f"stage {s}": [(model.start[n], model.end[n], n.split("@")[0]) for n in model.start
                                     if model.device[n] == s] for s in range(len(results))}
    gradient = np.concatenate([g for r in results for g in r["grads"]])
    return PipelineRun(orders, results[-1]["loss"], gradient, reports, float(step), model.makespan, comm,
                       {"measured": measured_rows, "predicted": predicted_rows})


# -- tensor parallelism ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorParallelRun:
    """A Megatron-split step: loss, gradient, the split layers, and the all-reduce payload bytes each rank sent
    (``predicted_bytes``: :func:`simlib.costs.tensor_parallel_bytes`, per rank)."""

    loss: float
    gradient: np.ndarray
    block: int
    n_devices: int
    bytes_sent: list[int]
    predicted_bytes: float


def _tensor_worker(rank: int, t: int, prob: MLPProblem, params: np.ndarray, batch: np.ndarray, blk: int,
                   inbox: Channel, outbox: Channel) -> dict:
    """One rank: layers before and after the block ``blk`` replicated, the block's columns / rows of this rank."""
    w = [prob.weights(params, layer) for layer in range(len(prob.layers))]
    pre, post = w[:blk], w[blk + 2:]
    X, y = prob.rows(batch)
    cols = np.array_split(np.arange(w[blk][0].shape[1]), t)[rank]
    W1, b1, W2, b2 = w[blk][0][:, cols], w[blk][1][cols], w[blk + 1][0][cols], w[blk + 1][1]
    summed = Ring(rank, t, inbox, outbox)  # sums over the t ranks: reduce-scatter then all-gather
    pre_in, pre_z, a = layers_forward(pre, X, relu_out=True)
    z1 = dense_forward(a, W1, b1)
    h = relu(z1)
    z2 = summed(h @ W2) + b2
    post_in, post_z, logits = layers_forward(post, relu(z2), relu_out=False) if post else ([], [], z2)
    d = cross_entropy_backward(logits, y)
    post_g, d = _backward(post, post_in, post_z, d, False, True) if post else ([], d)
    dz2 = relu_backward(z2, d) if post else d
    dW2, db2, dh = dense_backward(h, W2, dz2)
    dW1, db1, da = dense_backward(a, W1, relu_backward(z1, dh), inputs=blk > 0)
    pre_g = _backward(pre, pre_in, pre_z, summed(da), True, False)[0] if blk > 0 else []
    return {"loss": float(cross_entropy(logits, y)), "cols": cols, "block": (dW1, db1, dW2, db2),
            "replicated": pre_g + post_g, "bytes": summed.sent}


def run_tensor_parallel(problem: MLPProblem, batch: Any, params: Any = None, *, n_devices: int = 2,
                        block: int | None = None, timeout: float = 60.0) -> TensorParallelRun:
    """Loss and gradient of ``batch`` with layers ``block`` and ``block + 1`` (default: the last two) split over
    ``n_devices`` processes, Megatron's way: one all-reduce forward, one backward (none when block = 0)."""
    rows, theta = _check_inputs(problem, batch, params)
    n_layers = len(problem.layers)
    if n_layers < 2:
        raise ValueError("problem: tensor parallelism splits two layers, and this MLP has one (give it hidden layers)")
    block = n_layers - 2 if block is None else block
    check.non_negative_int("block", block)
    if block > n_layers - 2:
        raise ValueError(f"block must be in [0, {n_layers - 2}] (it and the next layer are split), got {block}")
    check.positive_int("n_devices", n_devices, most=problem.sizes[block + 1])
    check_processes(n_devices, "run_tensor_parallel (a process per device)", "n_devices")
    check.positive("timeout", timeout)
    with WorkerGroup(n_devices, roles=[f"rank {r}" for r in range(n_devices)], label="tensor") as group:
        links = [group.channel_pair(duplex=False) for _ in range(n_devices)]  # link r: rank r -> rank r + 1
        ends = [(links[(r - 1) % n_devices][0], links[r][1]) for r in range(n_devices)]
        try:
            results = group.run(_tensor_worker, problem, theta, rows, block, worker_args=ends, timeout=timeout)
        finally:
            for channel in itertools.chain.from_iterable(links):
                channel.close()
    predicted = costs.tensor_parallel_bytes(len(rows), problem.sizes[block], problem.sizes[block + 2], n_devices,
                                            input_grad=block > 0)
    return TensorParallelRun(results[0]["loss"], _assemble(problem, block, results), block, n_devices,
                             [r["bytes"] for r in results], predicted)


def _assemble(problem: MLPProblem, block: int, results: Sequence[dict]) -> np.ndarray:
    """The flat gradient: replicated layers from rank 0, the block's columns and rows from each rank."""
    g = np.zeros(problem.n_params)
    replicated = [layer for layer in range(len(problem.layers)) if layer not in (block, block + 1)]
    for layer, (dW, db) in zip(replicated, results[0]["replicated"]):
        W, b = problem.weights(g, layer)
        W[:], b[:] = dW, db
    for r in results:
        (W1, b1), (W2, b2) = problem.weights(g, block), problem.weights(g, block + 1)
        dW1, db1, dW2, db2 = r["block"]
        W1[:, r["cols"]], b1[r["cols"]], W2[r["cols"]], b2[:] = dW1, db1, dW2, db2
    return g

"""Closed-form cost models of the ways to split training, in seconds and bytes (no simulation).

Every function is the arithmetic of one design, so a lesson can put two designs side by side and
the simulator can be checked against them. A message costs latency + bytes / bandwidth, as in
:mod:`simlib.sim.network`; compute costs work / speed.

* data vs model parallelism: bytes each moves per step (:func:`data_parallel_bytes`,
  :func:`model_parallel_bytes`);
* parameter server vs MapReduce: one PS step against one MapReduce iteration;
* pipeline parallelism: the bubble (p - 1) / (m + p - 1), the schedule that makes it, the GPipe and 1F1B
  orders of forwards and backwards with what each stage stashes and how long a step takes;
* tensor parallelism: an all-reduce of the activations per layer, and the bytes of a Megatron MLP block;
* a dataflow graph placed on devices: list scheduling with transfers between devices;
* hyper-parameter search: independent trials packed on workers.

Example::

    >>> round(pipeline_bubble(stages=4, microbatches=12), 3)   # 3 / 15
    0.2
    >>> ring_allreduce_time(4, 1e6, 0.0, 1e9) * 1e3           # 2 * 3/4 * 1 MB / 1 GB/s, in ms
    1.5
"""
from __future__ import annotations

import graphlib
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from simlib import _validate as check
from simlib.sim.network import message_time, ring_allreduce_time

__all__ = [
    "message_time", "ring_allreduce_time", "data_parallel_bytes", "model_parallel_bytes",
    "ps_step_time", "mapreduce_iteration_time",
    "pipeline_bubble", "pipeline_time", "pipeline_schedule", "SCHEDULES", "pipeline_orders", "check_orders",
    "stash_peaks", "schedule_timeline", "tensor_parallel_step", "tensor_parallel_bytes",
    "Op", "Placement", "place", "hyperparameter_search", "crossover",
]


def crossover(x: Sequence[float], a: Sequence[float], b: Sequence[float]) -> float | None:
    """The first x where a - b changes sign, linearly interpolated; None if it never does."""
    xs, av, bv = (np.asarray(v, dtype=float) for v in (x, a, b))
    if not xs.shape == av.shape == bv.shape:
        raise ValueError(f"x, a and b must have the same length, got {xs.size}, {av.size} and {bv.size}")
    d = av - bv
    for i in range(len(xs) - 1):
        if d[i] == 0:
            return float(xs[i])
        if d[i] * d[i + 1] < 0:
            return float(xs[i] + (xs[i + 1] - xs[i]) * d[i] / (d[i] - d[i + 1]))
    return None


# -- data against model parallelism ------------------------------------------------------------


def data_parallel_bytes(params_touched: float, value_bytes: int = 4) -> float:
    """Bytes a data-parallel step synchronises: the gradient of every parameter the batch touched."""
    check.non_negative("params_touched", params_touched)
    return float(params_touched) * value_bytes


def model_parallel_bytes(batch: float, values_per_example: float = 1, value_bytes: int = 4) -> float:
    """Bytes a model-parallel step exchanges: each example's partial results (e.g. one partial dot)."""
    check.non_negative("batch", batch)
    check.non_negative("values_per_example", values_per_example)
    return float(batch) * values_per_example * value_bytes


# -- parameter server against MapReduce ---------------------------------------------------------


def ps_step_time(keys: int, latency: float, bandwidth: float, compute: float, key_bytes: int = 4,
                 value_bytes: int = 4) -> float:
    """One worker's PS step: pull (keys out, values back), compute, push (key, delta pairs)."""
    check.non_negative_int("keys", keys)
    pull = message_time(keys * key_bytes, latency, bandwidth) + message_time(keys * value_bytes, latency, bandwidth)
    push = message_time(keys * (key_bytes + value_bytes), latency, bandwidth)
    return pull + compute + push


def mapreduce_iteration_time(job_start: float, input_bytes: float, disk_bandwidth: float, compute: float,
                             shuffle_bytes: float, bandwidth: float, model_bytes: float) -> float:
    """One MapReduce iteration: start the job, re-read the input, map, shuffle, write the model out.

    T = job_start + input / disk_bw + compute + shuffle / bw + model / disk_bw (the model is saved
    between stages and read back next iteration).
    """
    check.non_negative("job_start", job_start)
    check.positive("disk_bandwidth", disk_bandwidth)
    check.positive("bandwidth", bandwidth)
    return (job_start + input_bytes / disk_bandwidth + compute + shuffle_bytes / bandwidth
            + 2 * model_bytes / disk_bandwidth)


# -- pipeline and tensor parallelism --------------------------------------------------------------


def _pipeline_slots(stages: int, microbatches: int) -> int:
    """m + p - 1: the slots a GPipe schedule of p stages and m micro-batches takes (both checked)."""
    check.positive_int("stages", stages)
    check.positive_int("microbatches", microbatches)
    return microbatches + stages - 1


def pipeline_bubble(stages: int, microbatches: int) -> float:
    """Idle fraction of a GPipe schedule: (p - 1) / (m + p - 1)."""
    return (stages - 1) / _pipeline_slots(stages, microbatches)


def pipeline_time(stages: int, microbatches: int, stage_time: float) -> float:
    """(m + p - 1) slots of one micro-batch's stage time (forward, or forward + backward)."""
    slots = _pipeline_slots(stages, microbatches)
    check.non_negative("stage_time", stage_time)
    return slots * stage_time


def pipeline_schedule(stages: int, microbatches: int) -> np.ndarray:
    """grid[s, t] = the micro-batch stage s works on in slot t, or -1 when idle (the bubble)."""
    grid = np.full((stages, _pipeline_slots(stages, microbatches)), -1, dtype=np.int64)
    for s in range(stages):
        grid[s, s : s + microbatches] = np.arange(microbatches)
    return grid


SCHEDULES = ("gpipe", "1f1b")
Orders = list[list[tuple[str, int]]]  # orders[s]: stage s's operations in turn, ("F", k) or ("B", k)


def pipeline_orders(schedule: str, stages: int, microbatches: int) -> Orders:
    """Each stage's forwards ("F", k) and backwards ("B", k) in turn. GPipe: all m forwards, then all m backwards.
    1F1B: stage s runs w = min(p - 1 - s, m) forwards, then one forward and the oldest backward in turn, then the
    rest."""
    check.one_of("schedule", schedule, SCHEDULES)
    p, m = stages, microbatches
    _pipeline_slots(p, m)
    if schedule == "gpipe":
        return [[("F", k) for k in range(m)] + [("B", k) for k in range(m)] for _ in range(p)]
    orders = []
    for s in range(p):
        w = min(p - 1 - s, m)
        steady = [op for k in range(w, m) for op in (("F", k), ("B", k - w))]
        orders.append([("F", k) for k in range(w)] + steady + [("B", k) for k in range(m - w, m)])
    return orders


def check_orders(orders: Orders) -> int:
    """The number of micro-batches m; ValueError naming 'orders' unless every stage runs F k then B k once each."""
    if not isinstance(orders, (list, tuple)) or not orders:
        raise ValueError(f"orders must be a non-empty list of stages' orders, got {orders!r}")
    m = len(orders[0]) // 2
    if m < 1:
        raise ValueError(f"orders: each stage must run a forward and a backward of each micro-batch, got {orders!r}")
    want = sorted((kind, k) for kind in "FB" for k in range(m))
    for s, order in enumerate(orders):
        try:
            ops = [(str(kind), int(k)) for kind, k in order]
        except (TypeError, ValueError):
            raise ValueError(f"orders: stage {s} must be a list of (\"F\" or \"B\", micro-batch) pairs") from None
        if sorted(ops) != want:
            raise ValueError(f"orders: stage {s} must run F0..F{m - 1} and B0..B{m - 1} once each, got {ops}")
        if any(ops.index(("B", k)) < ops.index(("F", k)) for k in range(m)):
            raise ValueError(f"orders: stage {s} runs a backward before its forward, got {ops}")
    return m


def stash_peaks(orders: Orders) -> list[int]:
    """Per stage: the most micro-batches held at once, max over its order of (forwards run) - (backwards run)."""
    check_orders(orders)
    return [int(np.max(np.cumsum([1 if kind == "F" else -1 for kind, _ in order]))) for order in orders]


def schedule_timeline(orders: Orders, t_fwd: Sequence[float], t_bwd: Sequence[float], comm: float) -> Placement:
    """The schedule run by :func:`place`: F k on stage s reads F k on s - 1; B k reads F k on s and B k on s + 1;
    each transfer between stages costs ``comm`` seconds; a stage runs its operations in its order."""
    check_orders(orders)
    p = len(orders)
    if len(t_fwd) != p or len(t_bwd) != p:
        raise ValueError(f"t_fwd and t_bwd must give one time per stage ({p}), got {len(t_fwd)} and {len(t_bwd)}")
    check.non_negative("comm", comm)
    inputs, after = {}, {}
    for s, order in enumerate(orders):
        for i, (kind, k) in enumerate(order):
            name = f"{kind}{k}@{s}"
            if kind == "F":  # the activation from the stage before
                inputs[name] = (f"F{k}@{s - 1}",) if s else ()
            else:  # its own forward's stash, and the gradient from the stage after
                inputs[name] = (f"F{k}@{s}",) + ((f"B{k}@{s + 1}",) if s < p - 1 else ())
            after[name] = set(inputs[name]) | ({f"{order[i - 1][0]}{order[i - 1][1]}@{s}"} if i else set())
    try:
        ordered = list(graphlib.TopologicalSorter(after).static_order())
    except graphlib.CycleError as exc:
        raise ValueError(f"orders: the stages wait on each other for ever ({' -> '.join(exc.args[1])})") from None
    stage = {name: int(name.split("@")[1]) for name in ordered}
    graph = [Op(n, (t_fwd if n[0] == "F" else t_bwd)[stage[n]], inputs[n]) for n in ordered]
    return place(graph, stage, [1.0] * p, float(comm), 1.0)


def tensor_parallel_step(layers: int, flops_per_layer: float, n_devices: int, activation_bytes: float,
                         latency: float, bandwidth: float, speed: float, allreduces_per_layer: int = 4) -> float:
    """One training step: each layer's flops (forward and backward) split over t devices, plus its all-reduces.

    T = L (F / (t speed) + a * ring_allreduce(t, activation_bytes)). a = 4 for a Megatron-style transformer
    layer in training: its attention block and its MLP block each sum their partial outputs with one
    all-reduce in the forward pass and their input gradients with one in the backward pass.
    """
    check.positive_int("layers", layers)
    check.positive_int("n_devices", n_devices)
    check.positive("speed", speed)
    check.non_negative_int("allreduces_per_layer", allreduces_per_layer)
    comm = allreduces_per_layer * ring_allreduce_time(n_devices, activation_bytes, latency, bandwidth)
    return layers * (flops_per_layer / (n_devices * speed) + comm)


def tensor_parallel_bytes(rows: int, width_in: int, width_out: int, n_devices: int, value_bytes: int = 8,
                          input_grad: bool = True) -> float:
    """Bytes each of t devices sends in one training step of a Megatron MLP block by ring all-reduce:
    2 (t - 1) / t * rows * (width_out + width_in) * value_bytes: the block's output summed in the forward pass,
    its input gradient in the backward (none where the block's input is the data: ``input_grad`` False)."""
    for name, value in (("rows", rows), ("width_in", width_in), ("width_out", width_out), ("n_devices", n_devices)):
        check.positive_int(name, value)
    values = rows * (width_out + (width_in if input_grad else 0))
    return 2 * (n_devices - 1) / n_devices * values * value_bytes


# -- a dataflow graph placed on devices --------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One node of a dataflow graph: its work, the ops it reads, and the bytes of its output tensor."""

    name: str
    work: float
    inputs: tuple[str, ...] = ()
    out_bytes: float = 0.0


@dataclass(frozen=True)
class Placement:
    """Where and when each op ran: device, start, end; the makespan and the bytes moved between devices."""

    device: dict[str, int]
    start: dict[str, float]
    end: dict[str, float]
    bytes_moved: float

    @property
    def makespan(self) -> float:
        """When the last op finished."""
        return max(self.end.values(), default=0.0)


def place(graph: Sequence[Op], device: Mapping[str, int], speeds: Sequence[float], latency: float,
          bandwidth: float) -> Placement:
    """Run ``graph`` (ops in topological order) on devices: an op starts when its device is free and
    every input has arrived; an input from another device arrives latency + bytes / bandwidth after
    its op ends. Each device runs its ops in the graph's order.
    """
    ends: dict[str, float] = {}
    starts: dict[str, float] = {}
    free = [0.0] * len(speeds)
    by_name = {op.name: op for op in graph}
    moved = 0.0
    for op in graph:
        if op.name not in device:
            raise ValueError(f"device: op {op.name!r} has no device")
        d = device[op.name]
        if not 0 <= d < len(speeds):
            raise ValueError(f"device: op {op.name!r} is on device {d}, but there are {len(speeds)} devices")
        ready = free[d]
        for name in op.inputs:
            if name not in ends:
                raise ValueError(f"graph: op {op.name!r} reads {name!r} before it runs (not topological)")
            arrive = ends[name]
            if device[name] != d:
                arrive += message_time(by_name[name].out_bytes, latency, bandwidth)
                moved += by_name[name].out_bytes
            ready = max(ready, arrive)
        starts[op.name] = ready
        ends[op.name] = ready + op.work / speeds[d]
        free[d] = ends[op.name]
    return Placement(dict(device), starts, ends, moved)


# -- hyper-parameter search ---------------------------------------------------------------------


def hyperparameter_search(trial_times: Sequence[float], n_workers: int) -> float:
    """Makespan of independent trials on N workers, each trial to the worker free first (no communication)."""
    check.positive_int("n_workers", n_workers)
    free = np.zeros(n_workers)
    for t in trial_times:
        check.non_negative("trial_times", t)
        free[np.argmin(free)] += t
    return float(free.max())

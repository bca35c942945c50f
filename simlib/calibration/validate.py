"""Predict, measure, compare: does the calibrated simulator forecast real runs on this machine?

For a :class:`Workload` on a real substrate -- the pipe parameter server
(:mod:`simlib.substrates.pipes`), or ``simlib.run(..., substrate="shm")`` under async (Hogwild!)
or BSP, both on the shared-memory substrate's in-place path -- :func:`predict` builds the simulated twin from a
:class:`~simlib.calibration.calibrate.Calibration` and runs it, :func:`measure` runs the real thing,
and :func:`compare` does both for 1 and 2 workers and reports the relative error of the
predicted wall time, ``(predicted - measured) / measured``.

Wall time, on both sides, runs from the group's start (process start-up included) to the end
of the last worker's last span. The twin is the engine's cluster with these fields composed
from measured costs (the engine has no separate terms for them; each is justified by the error
it removes, see ``benchmarks/calibration.py``):

* process start: ``Calibration.start_time(processes)`` is added to the simulated makespan, and
  so is a one-off warm-up (:func:`warmup`): the pipe PS's slow first steps, or a shared-memory
  worker's first touch of its pages (Hogwild 1 worker: -21% without it);
* two busy processes: with 2 workers every compute cost is multiplied by the kernel's measured
  two-process slowdown (memory bus, or fewer free cores on a busy machine);
* the server's own work per key (apply the push, gather the pull) is folded into the pipe's
  bandwidth, since it is serialised on the server like the bytes: ``1/bw' = 1/bw + c_key / 24``
  (24 bytes cross the server per key: 4 request, 8 reply, 12 push);
* a dense model's per-parameter gradient work goes into ``compute_overhead``;
* shared-memory BSP is the engine's BSP with free messages: each worker computes its batch step
  in place (``bsp_step`` per nonzero, plus ``bsp_call`` per feature of the table for the call
  and its scratch gradient) and waits at the next step for the slowest, each step's compute jittered
  by the kernel's measured two-process spread; what the null run's step costs beyond those prices
  (the worker program's call of the compiled step, its bookkeeping and, with 2 workers, the wait's
  wake-up: :func:`bsp_sync`) is a stall every step (:func:`bsp_stragglers`). There is no barrier and
  no dense apply to price.
* Hogwild is async with free messages (latency 0): workers only read and write shared memory;
  a simulated step is one chunk of ``global_batch`` one-row steps, as the real trace records it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import simlib
from simlib import _validate as check
from simlib.problems.logistic import LogisticProblem, make_sparse_classification
from simlib.calibration.calibrate import (BUSY_SHARE, NULL_PS, Calibration, Spread, busy_note, calibrate,
                                          kernel_problem, measure_contention, measure_load, measure_null_ps,
                                          measure_null_shm, NULL_SHM)
from simlib.substrates.pipes import DenseKeys
from simlib.sim.config import SimConfig, Stragglers
from simlib.substrates.sim import run_args
from simlib.trace import Trace

SUBSTRATES = ("pipe_ps", "hogwild", "bsp_shm")
# The calibrated kernels that price each substrate's compute (their two-process slowdowns are measured again
# between a comparison's real runs).
WORKLOAD_KERNELS = {"pipe_ps": ("ps_step", "ps_apply"), "hogwild": ("hogwild_sgd",), "bsp_shm": ("bsp_step", "bsp_call")}
# The null run's figure that compare() measures again before each repeat (Calibration.with_null).
NULL_FIGURE = {"pipe_ps": "ps_step", "bsp_shm": "bsp_step"}
FREE_BANDWIDTH = 1e18  # bytes/s for messages that do not exist (shared memory)


@dataclass(frozen=True)
class Workload:
    """A training job: data shape, substrate, global batch per step and length.

    ``global_batch`` rows per step are split evenly over the workers (the BSP data-parallel
    convention: more workers, smaller per-worker batches, same number of steps). Hogwild runs
    one row per step: each worker passes over its shard ``epochs`` times, ``global_batch`` steps
    (rows) per chunk. The shared-memory workloads train the full objective (``l2_on='all'``).
    """

    name: str
    substrate: str
    n_rows: int = 20_000
    n_features: int = 10_000
    nnz_per_row: int = 20
    global_batch: int = 256
    steps: int = 50
    epochs: int = 1
    dense: bool = False
    lr: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        check.one_of("substrate", self.substrate, SUBSTRATES)
        for name in ("n_rows", "n_features", "nnz_per_row", "global_batch", "steps", "epochs"):
            check.positive_int(name, getattr(self, name))
        check.positive("lr", self.lr)
        if self.dense and self.substrate != "pipe_ps":
            raise ValueError("dense applies to substrate 'pipe_ps' only")
        if self.global_batch % 2:
            raise ValueError(f"global_batch must be even (split over 1 or 2 workers), got {self.global_batch}")

    def batch_size(self, n_workers: int) -> int:
        """Rows per worker per step: global_batch / n_workers."""
        return max(1, self.global_batch // n_workers)


# The checked set: compute-bound and latency-bound pipes (a second worker makes the latter
# slower), Hogwild (slower on 2 workers too: each shared write steals the other core's cache line)
# and shared-memory BSP with small batches (three epochs, so that 300 steps outweigh the noise of
# process start; a step is ~80 us of arithmetic and, on 2 workers, ~70 us of waiting).
WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("ps compute-bound", "pipe_ps", global_batch=1024, steps=40),
    Workload("ps latency-bound", "pipe_ps", global_batch=4, steps=300),
    Workload("hogwild", "hogwild", n_rows=200_000, n_features=20_000, global_batch=20_000, epochs=2, lr=0.5),
    Workload("bsp shm", "bsp_shm", n_rows=40_000, n_features=20_000, global_batch=400, epochs=3, lr=0.5),
)}
# Workloads the model does not yet explain, kept to be run and studied, not counted as checked.
KNOWN_GAPS: dict[str, Workload] = {w.name: w for w in (
    # A dense 200 k-parameter model through the pipe server: every step moves 1.6 MB pulls and
    # 2.4 MB pushes, and the prediction falls 20-25% short on 1 worker and 40-47% short on 2.
    # The real workers' compute and send spans run 2-4x longer than priced. The step's own
    # arithmetic is bimodal: 0.46 or 1.6 ms in one process, by whether its three megabyte
    # temporaries reuse heap pages or fault in fresh ones (glibc's malloc thresholds move with
    # the allocation history), and calibration sees the fast mode. On 2 workers the server
    # process also competes with the two workers for two cores, which the model has no term for.
    Workload("ps dense 200k", "pipe_ps", n_rows=2_000, n_features=200_000, global_batch=8, steps=25, dense=True),
)}


@functools.lru_cache(maxsize=8)
def workload_problem(w: Workload) -> Any:
    """The workload's data and problem (cached; the same object for the twin and the real run)."""
    data = make_sparse_classification(w.n_rows, w.n_features, w.nnz_per_row, seed=w.seed)
    l2_on = "touched" if w.substrate == "pipe_ps" else "all"
    prob = LogisticProblem(data, l2=1e-4, eval_rows=min(2_000, w.n_rows), seed=w.seed, l2_on=l2_on)
    return DenseKeys(prob) if w.dense else prob


def shm_steps(w: Workload, n_workers: int) -> tuple[int, int]:
    """(batch size, steps per worker) of a shared-memory workload: ``epochs`` passes over the largest shard."""
    b = 1 if w.substrate == "hogwild" else w.batch_size(n_workers)
    return b, w.epochs * workload_problem(w).epoch_steps(n_workers, b)


# -- predict -----------------------------------------------------------------------------------
def twin_config(w: Workload, n_workers: int, cal: Calibration) -> SimConfig:
    """The simulated twin of ``w`` on ``n_workers``, priced by ``cal`` (see the module doc)."""
    check.positive_int("n_workers", n_workers)
    busy = min(n_workers, 2)
    b, prob = w.batch_size(n_workers), workload_problem(w)
    if w.substrate == "pipe_ps":
        push_bytes = 12 * len(prob.keys(prob.batch(prob.shards(n_workers)[0], 0, b)))  # (int32 key, float64 grad)
        cfg = _pipe_ps_config(cal, busy, n_workers, w.steps, b, w.lr, push_bytes)
        overhead = cfg.compute_overhead + pipe_ps_residual(cal, n_workers)
        if w.dense:
            overhead += cal.compute_time("ps_dense", w.n_features, busy)
        return cfg.replace(compute_overhead=overhead)
    b, steps = shm_steps(w, n_workers)
    shm = dict(busy=busy, n_workers=n_workers, lr=w.lr, latency=0.0, bandwidth=FREE_BANDWIDTH)  # free messages
    if w.substrate == "hogwild":
        chunks = -(-steps // w.global_batch)
        return cal.sim_config("hogwild_sgd", protocol="async", steps=chunks, batch_size=w.global_batch,
                              eval_every=chunks, **shm)
    # bsp_shm: the batch step, then the wait for the slowest at the next step's read
    cfg = cal.sim_config("bsp_step", protocol="bsp", steps=steps, batch_size=b, eval_every=steps, **shm)
    return cfg.replace(compute_overhead=cal.compute_time("bsp_call", prob.n_params, busy),
                       stragglers=bsp_stragglers(cal, n_workers))


def bsp_stragglers(cal: Calibration, n_workers: int) -> Stragglers:
    """A shared-memory BSP step beyond its kernels' mean prices, as the simulator's stragglers: a stall of
    :func:`bsp_sync` every step, and on 2 or more workers lognormal jitter (mean 1) of the computed part with the
    ``bsp_step`` kernel's two-process sigma, so that each step waits for the slowest of the workers' jittered steps
    (for two: 2 Phi(sigma / sqrt 2) times the mean). The stall is not jittered: on 2 workers the null run it comes
    from already waited for the slower of two null steps. No jitter on 1 worker, where a mean-1 noise changes
    nothing in expectation, nor where it was not measured."""
    sync = bsp_sync(cal, n_workers)
    sigma = cal.kernels["bsp_step"].jitter.median_or(0.0) if n_workers > 1 else 0.0
    # at most the simulator's largest sigma, which a window whose one call was descheduled for most of it can pass
    most = Stragglers.__dataclass_fields__["jitter_sigma"].metadata["max"]
    noise = dict(jitter="lognormal", jitter_sigma=min(sigma, most)) if sigma > 0 else {}
    stall = dict(pause_prob=1.0, pause_time=sync) if sync > 0 else {}
    return Stragglers(**noise, **stall)


def bsp_sync(cal: Calibration, n_workers: int) -> float:
    """Seconds per step a shared-memory BSP run on ``n_workers`` (2 stands for more) spends beyond the kernels'
    prices: the null run's typical step (:func:`measure_null_shm`) less what the twin prices for that step (one
    nonzero's ``bsp_step`` and a ``bsp_call`` on its table): the worker program's call of the compiled step, clock
    reads, trace records and, on 2 workers, the wait's wake-up. 0 where it was not measured."""
    busy = min(n_workers, 2)
    measured = cal.bsp_step.get(busy, Spread.unmeasured()).median_or(0.0)
    priced = cal.unit_time("bsp_step", busy) + cal.compute_time("bsp_call", NULL_SHM["features"] + 1, busy)
    return max(measured - priced, 0.0) if measured else 0.0


def _pipe_ps_config(cal: Calibration, busy: int, n_workers: int, steps: int, batch_size: int, lr: float,
                    push_bytes: float | None = None) -> SimConfig:
    """The pipe PS priced by messages and kernels alone: ping-pong pipes, server work per key.

    With ``push_bytes`` (a step's push message) the pipe is priced at the bandwidth measured for
    messages of that size, not the line fitted over all sizes.
    """
    pipe_bw = cal.bandwidth_at(push_bytes) if push_bytes else cal.pipe_bandwidth.median
    inv_bw = 1.0 / pipe_bw + cal.unit_time("ps_apply", busy) / 24
    return cal.sim_config("ps_step", busy=busy, n_workers=n_workers, protocol="bsp", steps=steps,
                          batch_size=batch_size, lr=lr, bandwidth=1.0 / inv_bw, eval_every=steps)


def pipe_ps_residual(cal: Calibration, n_workers: int = 1) -> float:
    """Seconds per step the real pipe PS on ``n_workers`` spends beyond its modelled messages and math (0 if none).

    Calibration times the real pipe PS on a null workload (1-row batches) on 1 and on 2 workers;
    where its typical step is longer than the model of that same run, the difference is charged
    to every step of every pipe-PS twin on as many workers (2 stands for more). On 2 workers
    this holds what the model has no term for: three processes (the server and two workers)
    sharing two cores, and the server's wake-ups for two clients. Measured once, not fitted to
    the workloads it is checked on.
    """
    n = min(n_workers, 2)
    measured = cal.ps_step.get(n, Spread.unmeasured()).median_or(math.nan)
    if math.isnan(measured):
        return 0.0
    quick = bool(cal.context.get("quick", False))
    cfg = _pipe_ps_config(cal, n, n_workers=n, lr=0.5, **NULL_PS)
    modelled = last_span_end(simlib.run(kernel_problem(quick), **run_args(cfg)).trace) / NULL_PS["steps"]
    return max(measured - modelled, 0.0)


def warmup(w: Workload, cal: Calibration, n_workers: int = 1) -> float:
    """A run's one-off warm-up: slow first steps (pipe PS, from its null run), or, for shared memory,
    the substrate's set-up (from its null run) and the first touch of the pages.

    A shared-memory worker maps each page of its shard of the data and of the table on first
    use, at the calibrated seconds per byte; the workers do this at the same time, so one shard's
    worth counts. A figure the calibration lacks counts 0.
    """
    if w.substrate == "pipe_ps":
        return cal.ps_warmup.median_or(0.0)
    touch = cal.shm_first_touch.median_or(0.0) * shm_bytes_per_worker(w, n_workers) / cal.share(min(n_workers, 2))
    return cal.shm_setup.median_or(0.0) + touch


def shm_bytes_per_worker(w: Workload, n_workers: int) -> int:
    """Bytes of shared memory one worker of a shared-memory run reads: its shard and the table."""
    prob = workload_problem(w)
    data = prob.data
    rows = w.n_rows // n_workers
    nnz = data.nnz * rows // data.n_rows
    shard = nnz * (data.indices.itemsize + data.values.itemsize) + rows * (data.indptr.itemsize + data.y.itemsize)
    return int(shard + 8 * prob.n_params)


def processes(w: Workload, n_workers: int) -> int:
    """Processes the real run starts: the workers, plus the server for the pipe PS."""
    return n_workers + 1 if w.substrate == "pipe_ps" else n_workers


def predict(w: Workload, n_workers: int, cal: Calibration) -> tuple[float, Trace]:
    """(predicted wall seconds, simulated trace): process start plus the twin's last span end."""
    trace = simlib.run(workload_problem(w), **run_args(twin_config(w, n_workers, cal))).trace
    trace.label = f"{w.name}, {n_workers} worker{'s' if n_workers > 1 else ''} (predicted)"
    return cal.start_time(processes(w, n_workers)) + warmup(w, cal, n_workers) + last_span_end(trace), trace


def last_span_end(trace: Trace) -> float:
    """When the last worker span ends (seconds from the start)."""
    return max((s.end for s in trace.spans), default=0.0)


# -- measure -----------------------------------------------------------------------------------
def measure(w: Workload, n_workers: int) -> tuple[float, Trace]:
    """(measured wall seconds, real trace) of one real run of ``w`` on ``n_workers`` processes."""
    check.positive_int("n_workers", n_workers)
    prob = workload_problem(w)
    if w.substrate == "pipe_ps":
        trace = simlib.run(prob, "bsp", substrate="pipes", n_workers=n_workers, steps=w.steps,
                           batch_size=w.batch_size(n_workers), lr=w.lr, evaluate=False).trace
    else:
        b, steps = shm_steps(w, n_workers)
        hogwild = w.substrate == "hogwild"
        trace = simlib.run(prob, "async" if hogwild else "bsp", substrate="shm", n_workers=n_workers, batch_size=b,
                           steps=steps, lr=w.lr, chunk=w.global_batch if hogwild else None, monitor_every=10.0).trace
    trace.label = f"{w.name}, {n_workers} worker{'s' if n_workers > 1 else ''} (measured)"
    return last_span_end(trace), trace


# -- compare -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One prediction checked: predicted and measured wall seconds (median of repeats), error."""

    workload: str
    substrate: str
    n_workers: int
    predicted: float
    measured: float
    measured_q25: float
    measured_q75: float
    repeats: int

    @property
    def error(self) -> float:
        """Relative error (predicted - measured) / measured."""
        return (self.predicted - self.measured) / self.measured if self.measured > 0 else math.nan


@dataclass
class Comparison:
    """Rows of predictions against measurements, with one predicted and one measured trace each."""

    rows: list[Row]
    calibration: Calibration
    predicted: dict[tuple[str, int], Trace] = field(default_factory=dict)
    measured: dict[tuple[str, int], Trace] = field(default_factory=dict)
    loads: dict[str, dict[int, Spread]] = field(default_factory=dict)  # CPU share around each workload

    def max_error(self) -> float:
        """Largest |relative error| over the rows."""
        return max((abs(r.error) for r in self.rows), default=math.nan)

    def load_warnings(self, threshold: float = BUSY_SHARE) -> list[str]:
        """One line per measurement taken on a busy machine: the calibration, then each workload's runs."""
        notes = [("calibration", self.calibration.busy_note(threshold))]
        notes += [(name, busy_note(share, threshold)) for name, share in self.loads.items()]
        return [f"{name}: {note}" for name, note in notes if note]

    def speedups(self, workload: str) -> dict[str, dict[int, float]]:
        """{'predicted': {n: seconds}, 'measured': {n: seconds}} for plot_speedup."""
        rows = [r for r in self.rows if r.workload == workload]
        return {"predicted": {r.n_workers: r.predicted for r in rows},
                "measured": {r.n_workers: r.measured for r in rows}}

    def table(self, bound: float | None = None) -> str:
        """The rows as a text table; with ``bound``, a column says whether each error is within it."""
        head = f"{'workload':<20} {'substrate':<9} {'workers':>7} {'predicted s':>11} {'measured s':>10} " \
               f"{'IQR s':>8} {'error':>7} {'speed-up pred/meas':>19}"
        lines = [head + ("  ok" if bound is not None else "")]
        for r in self.rows:
            sp = self.speedups(r.workload)
            p1, m1 = sp["predicted"].get(1), sp["measured"].get(1)
            speed = f"{p1 / r.predicted:.2f} / {m1 / r.measured:.2f}" if p1 and m1 else "-"
            line = (f"{r.workload:<20} {r.substrate:<9} {r.n_workers:>7} {r.predicted:>11.4f} {r.measured:>10.4f} "
                    f"{r.measured_q75 - r.measured_q25:>8.4f} {r.error:>+7.1%} {speed:>19}")
            if bound is not None:
                line += "  " + ("yes" if abs(r.error) <= bound else "NO")
            lines.append(line)
        return "\n".join(lines)


def compare(workloads: Sequence[Workload] | None = None, workers: Sequence[int] = (1, 2), repeats: int = 3,
            cal: Calibration | None = None, quick_calibration: bool = False, load_seconds: float = 0.1) -> Comparison:
    """Calibrate (unless ``cal`` is given), then predict and measure each workload on each worker count.

    Real runs of one workload alternate between worker counts (1, 2, 1, 2, ...) so that a change
    in the machine's load hits both counts alike; the measured time is the median of ``repeats``.
    """
    workloads = list(WORKLOADS.values()) if workloads is None else list(workloads)
    if not workloads or not all(isinstance(w, Workload) for w in workloads):
        raise ValueError("workloads must be a non-empty sequence of Workload")
    if not workers:
        raise ValueError("workers must name at least one worker count")
    for n in workers:
        check.positive_int("workers", n)
    check.positive_int("repeats", repeats)
    if cal is None:
        cal = calibrate(quick=quick_calibration)
    out = Comparison(rows=[], calibration=cal)
    for w in workloads:
        workload_problem(w)  # build the data outside every timed region
        times: dict[int, list[tuple[float, Trace]]] = {n: [] for n in workers}
        slow: dict[str, list[float]] = {k: [] for k in WORKLOAD_KERNELS[w.substrate] + ("ps_dense",) * w.dense}
        jitter: dict[str, list[float]] = {k: [] for k in slow}
        null: dict[int, list[float]] = {1: [], 2: []}  # the null run's figure by workers (pipes and BSP shm)
        quick = bool(cal.context.get("quick", False))  # the calibration's own problem sizes
        before = measure_load(load_seconds)
        for _ in range(repeats):
            if max(workers) > 1:
                for kind, measured in measure_contention(slow, quick=quick).items():
                    slow[kind] += measured["slowdown"]
                    jitter[kind] += measured["jitter"]
            if w.substrate in NULL_FIGURE:
                runs = measure_null_ps(kernel_problem(quick)) if w.substrate == "pipe_ps" else measure_null_shm()
                for n, figures in runs[0].items():
                    null[n] += figures
            for n in workers:
                times[n].append(measure(w, n))
        after = measure_load(load_seconds)
        # The machine's free CPU is measured right before and after this workload's runs, and its kernels'
        # two-process slowdowns (and the null run's step of the pipe PS or shared-memory BSP) before each repeat, so
        # a neighbour's burst and the cost of sharing cache lines at the time are priced in (other costs come from
        # the one calibration).
        cal_w = cal.with_load({n: Spread.of([before[n].median, after[n].median]) for n in before})
        cal_w = cal_w.with_contention({kind: Spread.of(r) for kind, r in slow.items() if r},
                                      {kind: Spread.of(j) for kind, j in jitter.items() if j})
        if w.substrate in NULL_FIGURE:
            cal_w = cal_w.with_null(**{NULL_FIGURE[w.substrate]: {n: Spread.of(v) for n, v in null.items() if v}})
        out.loads[w.name] = cal_w.cpu_share
        for n in workers:
            pred, ptrace = predict(w, n, cal_w)
            runs = sorted(times[n], key=lambda x: x[0])
            s = Spread.of([t for t, _ in runs])
            out.rows.append(Row(w.name, w.substrate, n, pred, s.median, s.q25, s.q75, repeats))
            out.predicted[(w.name, n)] = ptrace
            out.measured[(w.name, n)] = runs[len(runs) // 2][1]
    return out


def plot_comparison(result: Comparison, workload: str, n_workers: int = 2) -> Any:
    """Predicted and measured timelines of ``workload`` on ``n_workers``, and both speed-up curves."""
    import matplotlib.pyplot as plt

    from simlib.viz import plot_speedup, plot_timeline

    if (workload, n_workers) not in result.predicted:
        raise ValueError(f"workload {workload!r} with {n_workers} workers is not in this comparison")
    row = next(r for r in result.rows if r.workload == workload and r.n_workers == n_workers)
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.8), gridspec_kw={"width_ratios": [1.3, 1.3, 1.0]})
    pred, meas = result.predicted[(workload, n_workers)], result.measured[(workload, n_workers)]
    start = result.calibration.start_time(processes(Workload(workload, row.substrate), n_workers))
    t_max = max(last_span_end(pred) + start, last_span_end(meas))
    plot_timeline(pred, ax=axes[0], t_max=t_max, arrows=False, legend=False, barriers=False,
                  title=f"predicted: {row.predicted * 1e3:.0f} ms (sim, start-up not drawn)")
    plot_timeline(meas, ax=axes[1], t_max=t_max, arrows=False, barriers=False,
                  title=f"measured: {row.measured * 1e3:.0f} ms ({row.error:+.0%} error)")
    sp = result.speedups(workload)
    plot_speedup(sp, ax=axes[2])
    if 1 in sp["measured"] and n_workers in sp["measured"]:
        axes[2].set_title(f"speed-up on {n_workers}: predicted {sp['predicted'][1] / sp['predicted'][n_workers]:.2f}x, "
                          f"measured {sp['measured'][1] / sp['measured'][n_workers]:.2f}x")
    verdict = "within" if abs(row.error) <= 0.25 else "outside"
    fig.suptitle(f"{workload}: the prediction is {verdict} 25% of the measured wall time on {n_workers} workers")
    fig.tight_layout()
    return fig

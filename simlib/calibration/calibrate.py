"""Measure this machine and turn the numbers into a simulated cluster (``SimConfig``).

What is measured, each in real worker processes and repeated so the spread is known:

* compute per unit of each kernel: the numpy parameter-server step (``batch + keys + gradient``
  of :class:`~simlib.problems.logistic.LogisticProblem`, per nonzero, fitted as
  ``overhead + nnz * per_unit`` over batch sizes), its dense part (per parameter), the server's
  apply (per key), and the compiled local step the shared-memory substrate calls
  (``LogisticProblem.local_steps``): at one row per step (Hogwild!, per nonzero), one batch step
  (BSP, per nonzero) and the per-call cost of a batch step by table size (per feature: its
  scratch gradient). Each is timed alone and then with two processes running it at once: the
  ratio is the *contention* (two cores sharing a memory bus, or fewer than two free cores on a
  busy machine), and the spread of the calls' wall times together is the *jitter*
  (:func:`step_jitter`), which a BSP twin's steps are drawn with;
* process start: seconds from a group's start until its last worker runs user code;
* pipes: one-way time of a ``Channel.send_array`` message by size (half a ping-pong), fitted by
  least squares in relative error as ``latency + size / bandwidth``;
* shared-memory copy bandwidth and a lock's acquire + release;
* shared-memory first touch: seconds per byte for a worker to map the pages of data its parent
  wrote (one page fault per 4 KiB page), which a shared-memory run pays once on its shard;
* the real substrates on null workloads: the pipe PS's typical step and warm-up, and the
  shared-memory substrate's set-up (from process start to its first step) and its BSP step on
  1 and 2 workers (the call of the compiled step through the worker program, clock reads, trace
  records and, with 2 workers, the wait for the other's clock and the wake-up; next to nothing to
  compute).

Every figure is a :class:`Spread` (median, quartiles, count). Example::

    >>> cal = calibrate(quick=True)
    >>> cfg = cal.sim_config(n_workers=2, steps=10)
    >>> cfg.cost_unit, cfg.key_bytes, cfg.value_bytes
    ('nonzero', 4, 8)
    >>> cfg.latency == cal.pipe_latency.median * (cal.pipe_share / cal.share(1))  # stretched by our CPU share
    True
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import time
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Callable, Sequence

import numpy as np

import simlib
from simlib import _validate as check
from simlib.parallel.channel import Channel
from simlib.parallel.group import WorkerGroup
from simlib.substrates.pipes import DenseKeys, pull_keys, push_message, warm_up
from simlib.parallel.shm import SharedArray
from simlib.parallel.worker import current
from simlib.problems.logistic import LogisticProblem, make_sparse_classification
from simlib.sim.config import SimConfig

# The null pipe-PS run whose step time calibration measures (its rows are the kernels' problem).
NULL_PS = {"steps": 200, "batch_size": 1}  # on 1 and on 2 workers
# The null shared-memory run: BSP on substrate 'shm', one-row batches over a few features.
NULL_SHM = {"rows": 400, "features": 64}

KERNEL_UNITS = {
    "ps_step": "nonzero",  # LogisticProblem batch + keys + gradient (numpy)
    "ps_dense": "parameter",  # the same step when every parameter is a key (dense model)
    "ps_apply": "key",  # the server: w[keys] -= lr * g, and the gather w[keys] of a pull
    "hogwild_sgd": "nonzero",  # LogisticProblem.local_steps, one row per step (shm in place under async)
    "bsp_step": "nonzero",  # LogisticProblem.local_steps, one mini-batch step (shm in place under bsp)
    "bsp_call": "feature",  # the same call on a 2-row batch, by table size: its scratch gradient
}
KERNELS = tuple(KERNEL_UNITS)

# Below this CPU share per process (1.0 = a whole core) the machine counts as busy: measurements and
# forecasts then move with what the other programs do, from one second to the next.
BUSY_SHARE = 0.9


# -- a measured quantity ---------------------------------------------------------------------
@dataclass(frozen=True)
class Spread:
    """Repeated measurements summarised: median and quartiles (IQR = q75 - q25) of n samples."""

    median: float
    q25: float
    q75: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Spread":
        """Median and quartiles of ``samples`` (finite values only)."""
        x = np.asarray([s for s in samples if math.isfinite(s)], dtype=np.float64)
        if x.size == 0:
            return cls.unmeasured()
        q25, med, q75 = np.percentile(x, [25, 50, 75])
        return cls(float(med), float(q25), float(q75), int(x.size))

    @classmethod
    def unmeasured(cls) -> "Spread":
        """A quantity this calibration did not measure (n = 0)."""
        return cls(math.nan, math.nan, math.nan, 0)

    def median_or(self, default: float) -> float:
        """The median, or ``default`` when nothing finite was measured."""
        return self.median if self.n and math.isfinite(self.median) else default

    @property
    def iqr(self) -> float:
        """Interquartile range q75 - q25."""
        return self.q75 - self.q25


@dataclass(frozen=True)
class KernelCost:
    """time = overhead + units * per_unit (alone); two processes at once multiply by contention."""

    unit: str
    per_unit: Spread
    overhead: Spread
    contention: Spread  # per-unit time with 2 concurrent processes / alone
    # the spread of a call's wall time with 2 processes at once, one per window (step_jitter)
    jitter: Spread = field(default_factory=Spread.unmeasured)

    def time(self, units: float, busy: int = 1) -> float:
        """CPU seconds for ``units`` (medians), times the two-process slowdown when ``busy`` >= 2."""
        slow = self.contention.median if busy >= 2 else 1.0
        return (self.overhead.median + units * self.per_unit.median) * slow


@dataclass(frozen=True)
class Calibration:
    """This machine's measured costs; ``sim_config()`` turns them into a simulated cluster."""

    kernels: dict[str, KernelCost]
    pipe_latency: Spread
    pipe_bandwidth: Spread
    pipe_sizes: tuple[int, ...]
    pipe_times: tuple[float, ...]  # median one-way seconds per size
    process_start: dict[int, Spread]  # processes in the group -> seconds until the last one runs
    shm_copy_bandwidth: Spread
    lock_cost: Spread
    cpu_share: dict[int, Spread]  # our busy processes -> CPU seconds each gets per wall second
    pipe_share: float  # CPU share of one busy process while the pipes were measured
    context: dict[str, Any] = field(default_factory=dict)  # cores, load average, seconds taken
    # The real pipe PS on a null workload (1-row batches; see NULL_PS): its typical step (median
    # time between the ends of consecutive rounds) by number of workers, and its warm-up on 1
    # worker: how much longer the whole run took than that many typical steps (first touches of
    # pages and caches, lazy set-up in the children).
    ps_step: dict[int, Spread] = field(default_factory=dict)
    ps_warmup: Spread = field(default_factory=Spread.unmeasured)
    shm_first_touch: Spread = field(default_factory=Spread.unmeasured)  # s/byte
    # BSP on substrate 'shm' on NULL_SHM: seconds from process start to its first step (1 worker),
    # and its typical step by number of workers (measure_null_shm).
    shm_setup: Spread = field(default_factory=Spread.unmeasured)
    bsp_step: dict[int, Spread] = field(default_factory=dict)

    # -- into the simulator ------------------------------------------------------------------
    def pipe_time(self, nbytes: float) -> float:
        """Fitted one-way message time as measured: latency + nbytes / bandwidth."""
        return self.pipe_latency.median + nbytes / self.pipe_bandwidth.median

    def measured_pipe_time(self, nbytes: float) -> float:
        """One-way time of an nbytes message, interpolated (log-log) between the measured sizes."""
        check.positive("nbytes", nbytes)
        x, y = np.log(np.asarray(self.pipe_sizes, float)), np.log(np.asarray(self.pipe_times, float))
        lx = math.log(nbytes)
        if lx <= x[0] or lx >= x[-1]:  # outside the measured sizes: extend the nearest segment
            j = 0 if lx <= x[0] else len(x) - 2
            slope = (y[j + 1] - y[j]) / (x[j + 1] - x[j])
            return float(math.exp(y[j] + slope * (lx - x[j])))
        return float(math.exp(np.interp(lx, x, y)))

    def bandwidth_at(self, nbytes: float) -> float:
        """The bandwidth that makes latency + nbytes / bandwidth equal the measured time at nbytes.

        A pipe's cost is not linear in size (above about 1 MiB it copies through caches it no
        longer fits in), so a workload is priced at the bandwidth of the messages it sends.
        """
        spare = self.measured_pipe_time(nbytes) - self.pipe_latency.median
        return nbytes / spare if spare > 0 else self.pipe_bandwidth.median

    def start_time(self, n_processes: int) -> float:
        """Seconds from a group's start until its n-th process runs (linear between measured counts)."""
        check.positive_int("n_processes", n_processes)
        ns = sorted(self.process_start)
        ts = [self.process_start[n].median for n in ns]
        if n_processes in self.process_start:
            return self.process_start[n_processes].median
        if len(ns) == 1:
            return ts[0] * n_processes / ns[0]
        slope = (ts[-1] - ts[0]) / (ns[-1] - ns[0])
        return ts[0] + slope * (n_processes - ns[0])

    def share(self, busy: int) -> float:
        """CPU seconds per wall second each of ``busy`` processes gets (1 on an idle machine with enough cores)."""
        check.positive_int("busy", busy)
        n = min(busy, max(self.cpu_share))
        return self.cpu_share[n].median if n in self.cpu_share else 1.0

    def compute_time(self, kernel: str, units: float, busy: int = 1) -> float:
        """Wall seconds of one kernel call with ``busy`` of our processes running: CPU cost / CPU share."""
        check.one_of("kernel", kernel, tuple(self.kernels))
        return self.kernels[kernel].time(units, busy) / self.share(busy)

    def unit_time(self, kernel: str, busy: int = 1) -> float:
        """Wall seconds per unit of ``kernel`` (no per-call overhead) with ``busy`` processes running."""
        check.one_of("kernel", kernel, tuple(self.kernels))
        k = self.kernels[kernel]
        return k.per_unit.median * (k.contention.median if busy >= 2 else 1.0) / self.share(busy)

    def with_load(self, cpu_share: dict[int, Spread]) -> "Calibration":
        """The same costs on a machine whose free CPU is now ``cpu_share`` (see :func:`measure_load`)."""
        return dataclasses.replace(self, cpu_share=dict(cpu_share))

    def with_contention(self, slowdowns: dict[str, Spread], jitters: dict[str, Spread] | None = None) -> "Calibration":
        """The same costs with the two-process slowdowns (and jitters) of the kernels named measured again."""
        jitters = jitters or {}
        kernels = {k: dataclasses.replace(c, contention=slowdowns.get(k, c.contention), jitter=jitters.get(k, c.jitter))
                   for k, c in self.kernels.items()}
        return dataclasses.replace(self, kernels=kernels)

    def with_null(self, **figures: dict[int, Spread]) -> "Calibration":
        """The same costs with null-run figures by workers measured again: ``ps_step`` (:func:`measure_null_ps`),
        ``bsp_step`` (:func:`measure_null_shm`)."""
        for name in figures:
            check.one_of("figure", name, ("ps_step", "bsp_step"))
        return dataclasses.replace(self, **{name: {**getattr(self, name), **v} for name, v in figures.items()})

    def busy_note(self, threshold: float = BUSY_SHARE) -> str:
        """'' if the CPU share measured during calibration was at least ``threshold``, else why the machine was busy."""
        return busy_note(self.cpu_share, threshold)

    def sim_config(self, kernel: str = "ps_step", busy: int = 1, **overrides: Any) -> SimConfig:
        """A SimConfig priced by this machine: pipe latency/bandwidth, ``kernel``'s cost per nonzero.

        ``busy`` is how many of our processes compute at once: with 2 the cost per unit and the
        overhead are multiplied by the kernel's two-process slowdown; either way they are divided
        by the CPU share each busy process gets. Wire sizes are the pipe PS's (4-byte keys,
        8-byte values); any SimConfig field can be overridden.
        """
        check.one_of("kernel", kernel, tuple(self.kernels))
        check.positive_int("busy", busy)
        k = self.kernels[kernel]
        slow = (k.contention.median if busy >= 2 else 1.0) / self.share(busy)
        # A message is CPU work at both ends (system calls, copies, wake-ups), so it stretches
        # like compute when our processes get less of a core than when the pipes were measured.
        stretch = self.pipe_share / self.share(busy)
        return SimConfig(**(dict(
            latency=self.pipe_latency.median * stretch,
            bandwidth=self.pipe_bandwidth.median / stretch,
            compute_per_unit=k.per_unit.median * slow,
            compute_overhead=k.overhead.median * slow,
            cost_unit="nonzero",
            key_bytes=4,
            value_bytes=8,
        ) | overrides))

    # -- display -----------------------------------------------------------------------------
    def rows(self) -> list[tuple[str, Spread, str]]:
        """(quantity, spread, unit) for every measured figure, in display units."""
        out: list[tuple[str, Spread, str]] = []
        for name, k in self.kernels.items():
            out += [(f"{name}: per {k.unit}", _scaled(k.per_unit, 1e9), "ns"),
                    (f"{name}: overhead per call", _scaled(k.overhead, 1e6), "us"),
                    (f"{name}: 2-process slowdown", k.contention, "x")]
            out += [(f"{name}: 2-process jitter (sigma)", k.jitter, "log")] if k.jitter.n else []
        for label, name, scale, unit in _ROWS:
            value = getattr(self, name)  # a Spread, or one per count of processes or workers
            for n, s in sorted(value.items()) if isinstance(value, dict) else [(1, value)]:
                if s.n:
                    out.append((label.format(n=n, s="s" * (n > 1), es="es" * (n > 1)), _scaled(s, scale), unit))
        return out

    def __str__(self) -> str:
        lines = [f"{'quantity':<34} {'median':>10} {'IQR':>10}  unit"]
        lines += [f"{name:<34} {s.median:>10.4g} {s.iqr:>10.3g}  {unit}" for name, s, unit in self.rows()]
        ctx = self.context
        if ctx:
            lines.append(f"({ctx.get('cpu_count')} cores, load average {ctx.get('load_before')} -> "
                         f"{ctx.get('load_after')}, measured in {ctx.get('seconds', math.nan):.1f} s)")
        lines.append("pipe one-way time by size: " + ", ".join(
            f"{_fmt_bytes(n)} {t * 1e6:.0f} us" for n, t in zip(self.pipe_sizes, self.pipe_times)))
        return "\n".join(lines)


# Calibration.rows after the kernels: (quantity, field, scale to the unit, unit); {n} is the count of a figure
# measured per count of processes or workers.
_ROWS = (("pipe latency (fit)", "pipe_latency", 1e6, "us"), ("pipe bandwidth (fit)", "pipe_bandwidth", 2**-20, "MiB/s"),
         ("process start, {n} process{es}", "process_start", 1e3, "ms"),
         ("shared-memory copy", "shm_copy_bandwidth", 2**-30, "GiB/s"), ("lock acquire + release", "lock_cost", 1e6, "us"),
         ("shared-memory first touch", "shm_first_touch", 1e6 * 2**20, "us/MiB"),
         ("shm set-up, null workload", "shm_setup", 1e3, "ms"), ("shm BSP step, null, {n} worker{s}", "bsp_step", 1e6, "us"),
         ("CPU share, {n} busy process{es}", "cpu_share", 1.0, "cores each"),
         ("pipe PS step, null, {n} worker{s}", "ps_step", 1e6, "us"), ("pipe PS warm-up per run", "ps_warmup", 1e3, "ms"))


def plot_pipe_fit(cal: Calibration, ax: Any = None) -> Any:
    """Measured one-way pipe times by message size (dots) and the fitted latency + size / bandwidth."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 5))
    sizes = np.asarray(cal.pipe_sizes, dtype=np.float64)
    xs = np.geomspace(sizes.min(), sizes.max(), 100)
    ax.loglog(sizes, np.asarray(cal.pipe_times) * 1e6, "o", markersize=9, label="measured (median of repeats)")
    ax.loglog(xs, [cal.pipe_time(x) * 1e6 for x in xs], "-",
              label=f"fit: {cal.pipe_latency.median * 1e6:.0f} us + size / {cal.pipe_bandwidth.median / 2**20:.0f} MiB/s")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("one-way time (microseconds)")
    worst = max(abs(cal.pipe_time(n) - t) / t for n, t in zip(cal.pipe_sizes, cal.pipe_times))
    ax.set_title(f"A pipe message costs latency + size / bandwidth (worst fit error {worst:.0%})")
    ax.legend()
    return ax


def _scaled(s: Spread, k: float) -> Spread:
    return Spread(s.median * k, s.q25 * k, s.q75 * k, s.n)


def _fmt_bytes(n: int) -> str:
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


# -- fitting ---------------------------------------------------------------------------------
def fit_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(intercept a, slope b) of y ~ a + b x minimising sum(((a + b x - y) / y)^2): relative error."""
    x, y = (np.asarray(v, dtype=np.float64) for v in (x, y))
    if x.shape != y.shape or x.size < 2:
        raise ValueError("x and y must be equal-length sequences of at least 2 points")
    if np.any(y <= 0):
        raise ValueError("y must be positive (times)")
    # Dividing each row by y turns relative error into ordinary least squares, so the small
    # messages' times count as much as the large ones' (absolute error would ignore them).
    design = np.column_stack([np.ones_like(x), x]) / y[:, None]
    (a, b), *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
    return float(a), float(b)


# -- measurements run inside worker processes ------------------------------------------------
def _time_calls(fn: Callable[[], Any], calls: int) -> float:
    """CPU seconds of one call of ``fn``, averaged over ``calls`` calls (after one warm-up call)."""
    # CPU time, not wall time: a busy machine preempts us at random, and that share of the
    # machine is measured on its own (cpu_share), close to the run it prices.
    fn()
    s = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - s) / calls


def _kernel_calls(kind: str, cache: dict[str, Any], worker: int, calls: int) -> list[tuple[float, Callable[[], Any]]]:
    """Kernel ``kind`` at several sizes: (units of work, one call to time) each, for this worker's rows."""
    prob: LogisticProblem = cache["problem"]
    d = prob.data
    base = worker * (d.n_rows // 2)  # each worker has its own rows, as in a data-parallel run
    timed: list[tuple[float, Callable[[], Any]]] = []  # (units of work, one call to time)
    if kind in ("ps_step", "ps_dense"):
        # exactly the pipe PS worker's work per step: keys, gradient, packing the push. Each call of ps_step takes
        # the next window of the worker's rows, as a run streams through its shard: the problem keeps the keys of
        # the batches it has seen, so timing one batch again and again left out the keys' sort (a compute-bound
        # pipe PS ran about twice as long as priced).
        half, windows = d.n_rows // 2, cache.setdefault("windows", itertools.count())
        cases = [(prob, b) for b in (16, 256, 1024, 2048)] if kind == "ps_step" else \
            [(dp, 4) for dp in cache["dense_problems"]]
        for p, b in cases:
            def step(p: Any = p, b: int = b) -> None:
                batch = base + (next(windows) * b + np.arange(b)) % half if kind == "ps_step" else np.arange(b)
                keys = pull_keys(p, batch)
                push_message(p, np.zeros(len(keys)), batch, keys)

            timed.append((p.work(base + np.arange(b)) if kind == "ps_step" else p.n_params, step))
    elif kind == "ps_apply":
        w = cache["w_apply"]
        rng = np.random.default_rng(worker)
        for n in (64, 1024, 16384, len(w) // 2):
            keys = np.sort(rng.choice(len(w), n, replace=False)).astype(np.int32)
            g = rng.standard_normal(n)

            def apply(keys: np.ndarray = keys, g: np.ndarray = g) -> None:
                w[keys] -= 0.1 * g
                w[keys].copy()

            timed.append((n, apply))
    elif kind in ("hogwild_sgd", "bsp_step"):
        local: LogisticProblem = cache["local_problem"]
        w = cache["shared_w"].array  # shared by both workers, as the shm substrate's table
        shard = (base, base + d.n_rows // 2)
        for rows in (16, 256, 2048):
            # Each call takes the next window of the worker's rows, as a run streams through its
            # shard (the same rows again and again sit in cache: measured 17 us against 22 us
            # for 400 rows, which left a BSP step 8% short).
            # Window k is the shard's rows local.batch(shard, k, rows), at one row per step or as one step.
            nxt = itertools.cycle(range(calls + 1))
            # Call k: hogwild_sgd runs one-row steps k*rows .. k*rows+rows-1; bsp_step runs step k, a batch of rows.
            stride, steps, batch = (rows, rows, 1) if kind == "hogwild_sgd" else (1, 1, rows)

            def f(stride: int = stride, steps: int = steps, batch: int = batch, nxt: Any = nxt) -> None:
                local.local_steps(w, shard, next(nxt) * stride, steps, batch, 1e-3)

            timed.append((float(np.mean([local.work(local.batch(shard, k, rows)) for k in range(calls + 1)])), f))
    elif kind == "bsp_call":
        # Per feature of the table, not per nonzero: a batch step clears a scratch gradient as long
        # as the table (the call's cost at 2 rows: about 2 us at 1 k features, 11 us at 80 k). The table is
        # shared by both workers, as the shm substrate's (its measured slowdown stayed 1.0-1.13x either way).
        for p, seg in cache["call_problems"]:
            timed.append((p.data.n_features,
                          lambda p=p, tw=seg.array: p.local_steps(tw, (0, p.data.n_rows), 0, 1, 2, 1e-3)))
    else:  # pragma: no cover - guarded by KERNELS
        raise ValueError(f"kernel must be one of {KERNELS}, got {kind!r}")
    return timed


def _kernel_fit(timed: list[tuple[float, Callable[[], Any]]], calls: int) -> tuple[float, float]:
    """(overhead, per_unit): a line fitted by fit_line to the calls' times at their sizes."""
    a, b = fit_line([u for u, _ in timed], [_time_calls(f, calls) for _, f in timed])
    return max(a, 0.0), b


def step_jitter(walls: Sequence[Sequence[float]]) -> float:
    """sigma of the mean-1 lognormal whose expected max of two draws, 2 Phi(sigma / sqrt 2), equals that of two of
    the calls' wall times, each over the mean of its own size's calls (``walls``: one sequence per call size).

    The slower of two workers' steps is what a BSP step waits for. Sizes with fewer than 2 calls are left out
    (NaN when none is left).
    """
    ratios = [np.asarray(w, np.float64) / np.mean(w) for w in walls if len(w) >= 2 and min(w) > 0]
    if not ratios:
        return math.nan
    x = np.sort(np.concatenate(ratios))
    # E[max of two distinct calls]: the k-th smallest is the larger of k pairs
    e_max = float(np.dot(x, np.arange(x.size))) / (x.size * (x.size - 1) / 2)
    return max(math.sqrt(2) * NormalDist().inv_cdf(min(e_max, 2 - 1e-12) / 2), 0.0)


def _kernel_window(timed: list[tuple[float, Callable[[], Any]]], seconds: float) -> tuple[float, float]:
    """(CPU seconds per unit of work, :func:`step_jitter` of the calls' wall times), calling every size in turn
    until ``seconds`` of wall time have passed."""
    # A fixed window, not a fixed number of calls: the two processes' windows then overlap for all
    # but the barrier's wake-up skew (tens of microseconds against 0.1 s), where a few milliseconds
    # of short calls each could run mostly apart and miss the other's cache-line traffic.
    units, cpu, end = 0.0, 0.0, time.perf_counter() + seconds
    walls: list[list[float]] = [[] for _ in timed]
    while time.perf_counter() < end:
        for (u, f), wall in zip(timed, walls):
            s, w0 = time.thread_time(), time.perf_counter()
            f()
            wall.append(time.perf_counter() - w0)
            cpu += time.thread_time() - s
            units += u
    return cpu / units, step_jitter(walls)


def _kernels_member(worker: int, n: int, cache: dict[str, Any], kinds: tuple[str, ...], repeats: int, calls: int,
                    window: float, fit: bool) -> dict:
    """Fit each kernel's line alone (worker 0, the other waits; with ``fit``), then time a window of it alone and
    one with both workers at once: the cost per unit together over alone is the two-process slowdown, and the spread
    of the calls' wall times together is the two-process jitter."""
    out: dict[str, dict[str, list]] = {k: {"fit": [], "alone": [], "together": [], "jitter": []} for k in kinds}
    barrier = cache["barrier"]
    for _ in range(repeats):
        for kind in kinds:
            timed = _kernel_calls(kind, cache, worker, calls)
            barrier.wait()
            if worker == 0:
                if fit:
                    out[kind]["fit"].append(_kernel_fit(timed, calls))
                out[kind]["alone"].append(_kernel_window(timed, window)[0])
            barrier.wait()
            per_unit, jitter = _kernel_window(timed, window)
            out[kind]["together"].append(per_unit)
            out[kind]["jitter"].append(jitter)
    return out


def _slowdowns(raw: list[dict], kind: str) -> list[float]:
    """Each worker's cost per unit in each window together over worker 0's median alone."""
    alone = float(np.median(raw[0][kind]["alone"]))
    return [t / alone for r in raw for t in r[kind]["together"]]


def _jitters(raw: list[dict], kind: str) -> list[float]:
    """Each worker's two-process jitter (:func:`step_jitter`) in each window together."""
    return [j for r in raw for j in r[kind]["jitter"]]


def _kernel_cache(group: WorkerGroup, prob: LogisticProblem, quick: bool) -> dict[str, Any]:
    """What the kernels run on: ``prob`` (the kernel problem), its l2_on='all' twin with a table shared by the
    group, the call problems (shared tables too), the dense problems and the group's barrier. Every numba kernel
    is compiled here, before the workers fork."""
    # The shm workloads' objective (l2_on='all'), on the same rows: what their local step computes.
    local = LogisticProblem(prob.data, l2=prob.l2, eval_rows=None, l2_on="all")
    n_dense = 100_000 if quick else 200_000
    warm_up(prob)
    call_problems = [_call_problem(n) for n in (1_000, 5_000, 20_000, 80_000)]
    for p, tw in [(local, np.zeros(local.n_params))] + call_problems:
        p.local_steps(tw, (0, p.data.n_rows), 0, 1, 1, 1e-3)
        p.local_steps(tw, (0, p.data.n_rows), 0, 1, 2, 1e-3)
    return {
        "problem": prob,
        "local_problem": local,
        "call_problems": [(p, group.zeros(p.n_params)) for p, _ in call_problems],
        "dense_problems": [_dense_problem(n_dense // k) for k in (8, 2, 1)],
        "w_apply": np.zeros(n_dense),
        "shared_w": group.zeros(local.n_params),
        "barrier": group.barrier(),
    }


def measure_contention(kinds: Sequence[str], repeats: int = 2, window: float = 0.05, quick: bool = False,
                       start_method: str | None = None) -> dict[str, dict[str, list[float]]]:
    """Two-process slowdowns and jitters of ``kinds`` measured now (``repeats`` windows each), as :func:`calibrate`
    does: {kind: {"slowdown": [...], "jitter": [...]}}.

    What two cores pay for sharing cache lines changes from minute to minute on a virtual machine (it depends
    on where the host places the two virtual CPUs), so a check of predictions measures it between its real
    runs too (:func:`simlib.calibration.validate.compare`).
    """
    for kind in kinds:
        check.one_of("kernel", kind, KERNELS)
    check.positive_int("repeats", repeats)
    check.positive("window", window)
    with WorkerGroup(2, start_method, label="contention") as group:
        raw = group.run(_kernels_member, _kernel_cache(group, kernel_problem(quick), quick), tuple(kinds), repeats,
                        3, window, False)
    return {kind: {"slowdown": _slowdowns(raw, kind), "jitter": _jitters(raw, kind)} for kind in kinds}


def measure_null_ps(prob: LogisticProblem, repeats: int = 1,
                    start_method: str | None = None) -> tuple[dict[int, list[float]], list[float]]:
    """The real pipe PS on a null workload (NULL_PS: 1-row batches of ``prob``) on 1 and on 2 workers, ``repeats``
    times: ({workers: typical step seconds per run}, one-off warm-up seconds per 1-worker run).

    What the model leaves out of a pipe PS step (:func:`~simlib.calibration.validate.pipe_ps_residual`) is read
    from it; on 2 workers it moves between calibrations (271-421 us a step here), so a check of predictions
    measures it again between its real runs too.
    """
    check.positive_int("repeats", repeats)
    null_steps: dict[int, list[float]] = {1: [], 2: []}
    warmups: list[float] = []
    for _ in range(repeats):
        for n in null_steps:
            run = simlib.run(prob, "bsp", substrate="pipes", n_workers=n, **NULL_PS, start_method=start_method,
                             evaluate=False)
            # A round ends with its last update. The median time between round ends is a typical
            # step, not skewed by one stall (a page-fault storm or a descheduled process can
            # double a short run's total).
            ends: dict[int, float] = {}
            for u in run.trace.updates:
                ends[u.step] = max(ends.get(u.step, 0.0), u.time)
            times = [ends[k] for k in sorted(ends)]
            step = float(np.median(np.diff(times)))
            null_steps[n].append(step)
            if n == 1:
                first = min(sp.start for sp in run.trace.spans)
                warmups.append(max(times[-1] - first - NULL_PS["steps"] * step, 0.0))
    return null_steps, warmups


def _pingpong_member(worker: int, n: int, sizes: tuple[int, ...], repeats: int, calls: int,
                     ch: Channel) -> list[list[float]]:
    """Worker 0 sends and times round trips of each size; worker 1 echoes. Returns one-way times."""
    times: list[list[float]] = []
    for _ in range(repeats):
        row = []
        for size in sizes:
            # NOTE: ones, not zeros: a large np.zeros is untouched pages that all map the kernel's
            # one zero page, so "copying megabytes" from it reads a single cached page (measured:
            # 2 MiB one-way 0.6 ms from zeros, 2.5 ms from real memory, as a PS step sends).
            payload = np.ones(size, np.uint8)
            if worker == 1:
                for _ in range(calls + 1):
                    ch.send_array(ch.recv_array())
                continue
            trips = []
            for _ in range(calls + 1):
                s = time.perf_counter()
                ch.send_array(payload)
                ch.recv_array()
                trips.append(time.perf_counter() - s)
            # NOTE: the median trip, not the mean: on a busy machine one trip in 20 waits out another
            # process's time slice (about 4 ms), which put a mean 8-byte trip at 10x its median.
            # Calibration prices that wait apart, by the CPU share it measures (pipe_share).
            # The first trip is left out: it wakes both sides and touches the pages.
            row.append(float(np.median(trips[1:])) / 2)
        times.append(row)
    return times


def _lock_member(worker: int, n: int, lock: Any, rounds: int) -> float:
    """Seconds per lock acquire + release, uncontended."""
    s = time.perf_counter()
    for _ in range(rounds):
        lock.acquire()
        lock.release()
    return (time.perf_counter() - s) / rounds


def _spin_member(worker: int, n: int, seconds: float, slices: int) -> list[float]:
    """CPU seconds per wall second this process got while spinning, in ``slices`` windows."""
    a = np.ones(256)
    out = []
    for _ in range(slices):
        w0, c0 = time.perf_counter(), time.thread_time()
        while time.perf_counter() - w0 < seconds / slices:
            a.dot(a)
        out.append((time.thread_time() - c0) / (time.perf_counter() - w0))
    return out


def measure_load(seconds: float = 0.1, max_busy: int = 2, start_method: str | None = None) -> dict[int, Spread]:
    """CPU share per process with 1 .. max_busy of our processes spinning for ``seconds`` each."""
    check.positive("seconds", seconds)
    check.positive_int("max_busy", max_busy)
    out = {}
    for n in range(1, max_busy + 1):
        with WorkerGroup(n, start_method, label="calibrate load") as group:
            res = group.run(_spin_member, seconds, 5)
        out[n] = Spread.of([min(x, 1.0) for r in res for x in r])
    return out


def busy_note(cpu_share: dict[int, Spread], threshold: float = BUSY_SHARE) -> str:
    """'' when each of our busy processes got at least ``threshold`` of a core, else a sentence saying how busy.

    ``cpu_share`` is :func:`measure_load`'s result (busy processes -> CPU share each).
    """
    check.probability("threshold", threshold)
    if not cpu_share:
        raise ValueError("cpu_share must hold at least one measurement (see measure_load)")
    short = {n: s.median for n, s in sorted(cpu_share.items()) if s.n and s.median < threshold}
    if not short:
        return ""
    got = ", ".join(f"{n} process{'es' if n > 1 else ''} got {share:.2f} of a core each" for n, share in short.items())
    return f"the machine is busy: {got} (idle: 1.00, threshold {threshold:.2f})"


def _touch_member(worker: int, n: int, seg: SharedArray) -> float:
    """Seconds per byte to read one float64 of every 4 KiB page of ``seg``, newly mapped here."""
    a = seg.array
    s = time.perf_counter()
    float(a[:: 4096 // a.itemsize].sum())
    return (time.perf_counter() - s) / a.nbytes


def _start_member(worker: int, n: int) -> float:
    """Seconds since the group started, read as this worker's first action."""
    ctx = current()
    return ctx.now() if ctx is not None else math.nan


# -- the public entry point ------------------------------------------------------------------
def calibrate(quick: bool = False, repeats: int | None = None, start_method: str | None = None) -> Calibration:
    """Measure this machine (under a minute; ``quick`` a few seconds) and return a Calibration.

    ``repeats`` (default 2 quick, 5 full) is how many times each quantity is measured; the
    Calibration keeps the median and quartiles of the repeats.
    """
    check.boolean("quick", quick)
    if repeats is None:
        repeats = 2 if quick else 5
    check.positive_int("repeats", repeats)
    t_start = time.perf_counter()
    load_before = _loadavg()
    calls = 5 if quick else 15

    # Kernels: a 20 k x 20 k problem (20 nonzeros per row) is the parameter servers' default size.
    prob = kernel_problem(quick)
    with WorkerGroup(2, start_method, label="calibrate") as group:
        raw = group.run(_kernels_member, _kernel_cache(group, prob, quick), KERNELS, repeats, calls,
                        0.03 if quick else 0.1, True)
    # The slowdown compares the cost per unit of the same calls alone and together over fixed windows, not
    # the fitted slopes: a slope from a few sizes carries the noise of each. NOTE: Hogwild's varies from
    # minute to minute on one quiet machine (1.1x to 5.9x in calibrations a few minutes apart, the real
    # 2-worker run's cost per row moving with it): its calls write one shared table, and what a cache line
    # costs to pass between the two virtual CPUs depends on where the host runs them. compare() therefore
    # measures it again between its real runs (measure_contention).
    kernels = {}
    for kind, unit in KERNEL_UNITS.items():
        fits = raw[0][kind]["fit"]
        kernels[kind] = KernelCost(unit, Spread.of([b for _, b in fits]), Spread.of([a for a, _ in fits]),
                                   Spread.of(_slowdowns(raw, kind)), Spread.of(_jitters(raw, kind)))

    # Pipes: half a ping-pong between two workers, by size.
    # Dense above 1 MiB: here a pipe message's cost jumps several-fold between 1 and 2 MiB, and a
    # workload is priced at its own message size (Calibration.bandwidth_at).
    sizes = (8, 1024, 16384, 262144, 2**20, 3 * 2**19, 2**21, 3 * 2**20, 4 * 2**20) if not quick else \
        (8, 4096, 262144, 2**20, 3 * 2**19, 2**21, 3 * 2**20)
    with WorkerGroup(2, start_method, label="calibrate pipes") as group:
        a, b = group.channel_pair()
        res = group.run(_pingpong_member, sizes, repeats + 1, 20 if quick else 40, worker_args=[(a,), (b,)])
    pipe_share = measure_load(0.05 if quick else 0.1, 1, start_method)[1].median
    per_repeat = res[0][1:]  # the first pass pays the page faults (1 MiB: 0.76-0.92 ms against 0.24 ms after)
    # The line is fitted where a pipe is linear (up to 1 MiB); larger messages are priced from the
    # measured times themselves (Calibration.bandwidth_at), past the cliff a line cannot follow.
    linear = [j for j, n in enumerate(sizes) if n <= 2**20]
    fits = [fit_line([sizes[j] for j in linear], [row[j] for j in linear]) for row in per_repeat]
    pipe_times = tuple(float(np.median([row[j] for row in per_repeat])) for j in range(len(sizes)))

    # Process start for groups of 1, 2 and 3 processes.
    starts: dict[int, list[float]] = {1: [], 2: [], 3: []}
    for _ in range(repeats + 1):
        for n in starts:
            with WorkerGroup(n, start_method, label="calibrate start") as group:
                starts[n].append(max(group.run(_start_member)))

    # Shared-memory copy bandwidth.
    nbytes = (16 if quick else 64) * 2**20
    src = np.ones(nbytes // 8)
    copy_bw = []
    with SharedArray.zeros(src.shape) as dst:
        for _ in range(repeats + 1):
            s = time.perf_counter()
            np.copyto(dst.array, src)
            copy_bw.append(nbytes / (time.perf_counter() - s))

    # First touch (a worker reads one value per page of a segment its parent filled) and a lock.
    touch: list[float] = []
    locks: list[float] = []
    with WorkerGroup(1, start_method, label="calibrate first touch and lock") as group:
        for _ in range(repeats):
            with SharedArray.copy_of(np.ones((8 if quick else 32) * 2**20 // 8)) as seg:
                touch.extend(group.run(_touch_member, seg))
            locks.extend(group.run(_lock_member, group.lock(), 1000 if quick else 2000))

    null_steps, warmups = measure_null_ps(prob, repeats, start_method)
    bsp_steps, firsts = measure_null_shm(repeats, start_method)
    process_start = {n: Spread.of(v[1:]) for n, v in starts.items()}  # the first group warms imports

    share = measure_load(0.1 if quick else 0.3, 2, start_method)
    return Calibration(
        kernels=kernels,
        pipe_latency=Spread.of([max(a, 0.0) for a, _ in fits]),
        pipe_bandwidth=Spread.of([1.0 / b if b > 0 else math.inf for _, b in fits]),
        pipe_sizes=tuple(sizes),
        pipe_times=pipe_times,
        process_start=process_start,
        shm_copy_bandwidth=Spread.of(copy_bw[1:]),  # the first copy pays the page faults
        lock_cost=Spread.of(locks),
        cpu_share=share,
        pipe_share=pipe_share,
        context=dict(cpu_count=os.cpu_count(), load_before=load_before, load_after=_loadavg(),
                     seconds=time.perf_counter() - t_start, quick=quick, repeats=repeats),
        ps_step={n: Spread.of(v) for n, v in null_steps.items()},
        ps_warmup=Spread.of(warmups),
        shm_first_touch=Spread.of(touch),
        shm_setup=Spread.of([max(first - process_start[1].median, 0.0) for first in firsts]),
        bsp_step={n: Spread.of(v) for n, v in bsp_steps.items()},
    )


def measure_null_shm(repeats: int = 1, start_method: str | None = None) -> tuple[dict[int, list[float]], list[float]]:
    """BSP on substrate 'shm' on NULL_SHM on 1 and on 2 workers, ``repeats`` times: ({workers: the typical step's
    seconds, per run}, seconds from the group's start to the first step per 1-worker run).

    A null step is the in-place path's fixed cost: the call of the compiled local step (one row of one nonzero)
    through the worker program, clock reads, trace records and, with 2 workers, the wait for the other's clock and
    the wake-up. A shared-memory BSP twin adds what of it the kernels' prices leave out to each step
    (:func:`~simlib.calibration.validate.bsp_sync`). The figure keeps the load it was measured under: a check of
    predictions measures it again between its real runs.
    """
    check.positive_int("repeats", repeats)
    data = make_sparse_classification(NULL_SHM["rows"], NULL_SHM["features"], 1, seed=3)
    null = LogisticProblem(data, l2=1e-4, eval_rows=10, l2_on="all")
    steps: dict[int, list[float]] = {1: [], 2: []}
    firsts: list[float] = []
    for _ in range(repeats):
        for n in steps:
            res = simlib.run(null, "bsp", substrate="shm", n_workers=n, batch_size=1, lr=0.1,
                             steps=null.epoch_steps(n, 1), monitor_every=60.0, start_method=start_method)
            starts: dict[int, float] = {}
            for sp in res.trace.spans:
                if sp.kind == "compute":
                    starts[sp.step] = min(starts.get(sp.step, math.inf), sp.start)
            # A step starts when its first worker starts computing it. NOTE: the mean step over the middle 80% of
            # the run, not the median: on 2 workers the gaps between step starts alternate short and long (the
            # median was 57 or 111 us from one calibration to the next).
            first = sorted(starts.values())
            lo, hi = len(first) // 10, len(first) - 1 - len(first) // 10
            steps[n].append((first[hi] - first[lo]) / (hi - lo))
            if n == 1:
                firsts.append(first[0])
    return steps, firsts


@functools.lru_cache(maxsize=2)
def kernel_problem(quick: bool) -> LogisticProblem:
    """The problem the kernels and the null pipe-PS run are measured on (10 k or 20 k rows x 20 k features)."""
    data = make_sparse_classification(10_000 if quick else 20_000, 20_000, 20, seed=1)
    return LogisticProblem(data, l2=1e-4, eval_rows=500, seed=1)


def _call_problem(n_features: int) -> tuple[LogisticProblem, np.ndarray]:
    """A tiny data set over ``n_features`` features (l2_on='all', as the shm workloads) and its own table."""
    p = LogisticProblem(make_sparse_classification(64, n_features, 20, seed=2), l2=1e-4, eval_rows=None, l2_on="all")
    return p, np.asarray(p.init_params(), dtype=np.float64)


def _dense_problem(n_params: int) -> DenseKeys:
    """A tiny data set over ``n_params`` features: its gradient on all keys costs per parameter."""
    return DenseKeys(LogisticProblem(make_sparse_classification(64, n_params, 20, seed=2), l2=1e-4, eval_rows=None))


def _loadavg() -> float:
    """The 1-minute load average (NaN where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):  # pragma: no cover - Windows
        return math.nan


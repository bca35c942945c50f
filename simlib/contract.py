"""The contract every problem and every substrate shares: Problem, the server, Result.

The lectures' parameter server is a key-value table: workers ``get(keys)`` the rows a mini-batch
touches and ``add(keys, deltas)`` back. A :class:`Problem` is the math on that table (no processes,
no time); a substrate provides the table and the workers (a transport of :mod:`simlib.worker`).
:class:`ParamServer` is the server's logic, written once and free of SimPy: read gating by
:class:`~simlib.protocol.Clocks`, the step rule (staleness-aware, accumulation), and the staleness tau of every
push, which it returns for the trace. :func:`serial_reference` is plain serial SGD on the same contract: what one
worker must equal.

Example::

    >>> from simlib.problems.logistic import LogisticProblem, make_sparse_classification
    >>> prob = LogisticProblem(make_sparse_classification(500, 50, 5, seed=0), eval_rows=None)
    >>> check_problem(prob)
    >>> w = serial_reference(prob, steps=20, batch_size=16, lr=0.5)
    >>> prob.quality(w) < prob.quality(prob.init_params())
    True
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field, make_dataclass
from typing import Any, Callable, Iterable, Protocol as TypingProtocol, runtime_checkable

import numpy as np

from simlib import _validate as check
from simlib.diverged import Diverged, check_metric
from simlib.protocol import MAX_BATCH, MAX_REAL_STEPS, MAX_WORKERS, Accumulator, Clocks, Protocol
from simlib.protocol import ReadRule, StepRule, check_read_rule
from simlib.trace import Trace
from simlib.worker import Plan, run_serial

PROBLEM_METHODS = ("init_params", "shards", "batch", "keys", "step", "quality", "work")


@runtime_checkable
class Problem(TypingProtocol):
    """The math of a lesson in parameter-server shape (see :func:`check_problem`)."""

    n_params: int
    metric: str
    lower_is_better: bool

    def init_params(self) -> Any:
        """The initial table (a 1-D float array of n_params entries)."""

    def shards(self, n_workers: int) -> list[Any]:
        """The data split into one shard per worker."""

    def batch(self, shard: Any, step: int, batch_size: int) -> Any:
        """Mini-batch number ``step`` of a shard."""

    def keys(self, batch: Any) -> np.ndarray:
        """Sorted unique table keys the batch reads and writes."""

    def step(self, values: Any, batch: Any, keys: np.ndarray, lr: float) -> tuple[np.ndarray, Any]:
        """(keys, deltas): the update computed from ``values`` = table[keys], to be added to the table."""

    def quality(self, params: Any) -> float:
        """The metric (loss, cost, log-likelihood) of a whole table."""

    def work(self, batch: Any) -> float:
        """What the simulator's compute model charges for the batch (e.g. nonzeros)."""


class InPlaceSteps(TypingProtocol):
    """A problem whose steps also run straight on a shared table (shm, the gpu substrate's NumPy twin, the serial
    reference): a compiled chunk of steps is one Compute of the worker program."""

    def local_steps(self, table: Any, shard: Any, first: int, count: int, batch_size: int, lr: float,
                    **shared: Any) -> Any:
        """Apply steps first .. first+count-1 of ``shard`` to ``table`` in place, each as get / step / add would."""


class DeviceSteps(TypingProtocol):
    """A problem whose device steps differ from its CPU ones (the gpu substrate prefers ``device_steps``); with
    ``device_kernel`` set, its hook takes CuPy arrays."""

    device_kernel: str

    def device_steps(self, table: Any, shard: Any, first: int, count: int, batch_size: int, lr: float) -> Any:
        """As :meth:`InPlaceSteps.local_steps`, on the device."""


class Guards(TypingProtocol):
    """Refusals a problem makes before anything starts (:func:`simlib.run` calls them)."""

    def validate(self) -> None:
        """Check again the data the compiled kernels index (ValueError naming the field)."""

    def check_run(self, protocol: Any, substrate: str) -> None:
        """Refuse protocols and substrates that cannot run the problem."""

    def check_training(self, training: Any) -> None:
        """Refuse run settings the math cannot take."""


# Every optional hook: (what it must be, its default). The hook table of the docs; capabilities() reads it.
HOOKS: dict[str, tuple[str, Any]] = {
    "local_steps": ("method", None),  # InPlaceSteps: shm's fast path, gpu on NumPy
    "device_steps": ("method", None),  # DeviceSteps: the gpu substrate, preferred to local_steps
    "device_kernel": ("str", None),  # DeviceSteps: which device kernel ('auto', 'fused', 'hogwild', ...)
    "device_reads_apart": ("flag", False),  # the device hook takes read=: a step reads one table, adds to another
    "validate": ("method", None),  # Guards
    "check_run": ("method", None),  # Guards: (protocol, substrate)
    "check_training": ("method", None),  # Guards: (training)
    "exact_deltas": ("flag", False),  # every push applied whole (counts): no backup workers, deadlines, compression
    "linear_step": ("flag", True),  # deltas scale with lr (gradients do; count moves and AdaGrad do not)
    "table_dtype": ("dtype", np.float64),  # the table's type where a substrate keeps it in place (shm, gpu)
    "init_table": ("method", None),  # the initial table in a given dtype, without a float64 copy
    "in_place_chunk": ("count", None),  # shm: the most steps between two looks at the clocks (1: a step is a sweep)
    "in_place_words": ("method", None),  # shm: how many int32 words the in-place steps of n workers share
    "in_place_only": ("flag", False),  # the steps exist only in place (keys and step refuse)
    "replica": ("method", None),  # shm's hot_keys: a private replica of the hot keys
    "miniature": ("method", None),  # the same problem on a few documents, to warm the kernels up cheaply
    "local_result": ("method", None),  # what a worker sends back of its local state (LDA's assignments)
    "lr": ("rate", None),  # the problem's own step size (GloVe's config.lr): simlib.run's lr unless it differs
    "epochs": ("count", None),  # passes over its data (GloVe's config.epochs): simlib.run's steps where none are given
    "backward_layers": ("method", None),  # (params, batch) -> each layer's (slice, gradient), last first: buckets
}


def _in_place(caps: Any) -> Callable | None:
    """The device hook where there is one, else the in-place steps (the gpu substrate's choice)."""
    return caps.device_steps or caps.local_steps


# The optional hooks a problem offers, one field per entry of HOOKS, read and checked once by capabilities().
Capabilities = make_dataclass("Capabilities", list(HOOKS), frozen=True,
                              namespace={"__module__": __name__, "in_place": property(_in_place)})


def capabilities(problem: Any) -> Capabilities:
    """The problem's optional hooks; ValueError naming a hook whose value is not what :data:`HOOKS` says it must be."""
    found = {}
    for name, (kind, default) in HOOKS.items():
        value = getattr(problem, name, default)
        ok = {"method": value is None or callable(value), "flag": isinstance(value, (bool, np.bool_)),
              "str": value is None or isinstance(value, str),
              "count": value is None or (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
                                         and value >= 1),
              "dtype": _is_dtype(value),
              "rate": value is None or (isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
                                        and math.isfinite(value) and value > 0)}[kind]
        if not ok:
            raise ValueError(f"{name}: {type(problem).__name__}.{name} must be a {_KINDS[kind]}, got {value!r} "
                             "(see simlib.contract.HOOKS)")
        found[name] = bool(value) if kind == "flag" else np.dtype(value) if kind == "dtype" else value
    return Capabilities(**found)


_KINDS = {"method": "method", "flag": "bool", "str": "string or None", "count": "positive integer or None",
          "dtype": "NumPy dtype", "rate": "positive finite number or None"}


def _is_dtype(value: Any) -> bool:
    """Whether NumPy reads ``value`` as a dtype."""
    try:
        np.dtype(value)
    except TypeError:
        return False
    return True


def check_problem(problem: Any) -> None:
    """Raise ValueError naming what ``problem`` lacks of the :class:`Problem` contract."""
    missing = [m for m in PROBLEM_METHODS if not callable(getattr(problem, m, None))]
    if not isinstance(getattr(problem, "n_params", None), (int, np.integer)):
        missing.append("n_params")
    if missing:
        raise ValueError(f"problem: a {type(problem).__name__} is not a Problem; it lacks "
                         f"{', '.join(missing)} (see simlib.contract.Problem)")
    # Data may have been changed since the problem checked it; compiled kernels index it unchecked.
    validate = capabilities(problem).validate  # every optional hook checked here, once, before a run starts
    if validate is not None:
        validate()


@dataclass(frozen=True)
class Training:
    """What every substrate's run takes: workers, steps per worker, batch size, step size, step and read rules.

    ``read_rule`` replaces the SSP read rule (:func:`simlib.protocol.may_read`) on every substrate.
    """

    n_workers: int = 2
    steps: int = 50
    batch_size: int = 32
    lr: float = 0.5
    rule: StepRule = field(default_factory=StepRule)
    eval_every: int = 1
    seed: int = 0
    read_rule: ReadRule | None = None

    def __post_init__(self) -> None:
        check.positive_int("n_workers", self.n_workers, most=MAX_WORKERS)
        check.positive_int("steps", self.steps, most=MAX_REAL_STEPS)
        check.positive_int("batch_size", self.batch_size, most=MAX_BATCH)
        check.positive("lr", self.lr)
        if not isinstance(self.rule, StepRule):
            raise ValueError(f"rule must be a StepRule(...), got {type(self.rule).__name__}")
        check.positive_int("eval_every", self.eval_every)
        check.non_negative_int("seed", self.seed)
        check_read_rule(self.read_rule)


def key_bounds(n_params: int, n_servers: int) -> np.ndarray:
    """b_k = floor(k n / S), k = 0..S: server shard k owns the key range [b_k, b_k+1) on every substrate."""
    return (np.arange(n_servers + 1) * n_params) // n_servers


class ParamServer:
    """The server's logic over a table held in ``params``: gate reads, apply pushes, measure tau.

    One object per run (or per server process); the simulator charges time around these calls, the
    real servers call them when messages arrive.
    """

    def __init__(self, params: Any, n_workers: int, protocol: Protocol | str, rule: StepRule = StepRule(),
                 clocks: Any = None, read_rule: ReadRule | None = None):
        self.params = params
        # ``clocks`` may wrap the rule (the simulator's wakes waiting workers on deliver).
        self.clocks = Clocks(n_workers, protocol, read_rule) if clocks is None else clocks
        self.acc = Accumulator(rule, n_workers)
        self._plain = rule.plain  # every push applied as is: the simulator's hot path
        self._rounds = Protocol.parse(protocol).rounds

    @property
    def version(self) -> int:
        """Updates applied to the table so far; under BSP (bound 0) an update is a whole round."""
        return self.clocks.completed if self._rounds else self.acc.version

    def may_read(self, clock: int) -> bool:
        """Whether a worker at ``clock`` may read now."""
        return self.clocks.may_read(clock)

    def pull(self, keys: np.ndarray) -> tuple[Any, int]:
        """(table[keys] copied, the version read)."""
        return self.params[keys], self.version

    def push(self, clock: int, keys: np.ndarray, deltas: Any, read_version: int) -> tuple[bool, int]:
        """Deliver a push for step ``clock``; returns (applied, tau).

        tau = updates applied since the read at ``read_version`` (:attr:`version`). Under BSP every push
        of a round was read with the round's table and lands before the round completes: tau = 0,
        the lectures' hard-synchronous case (all of a round's gradients make one update, none is stale).
        """
        tau = self.version - read_version
        if not self.clocks.deliver(clock):
            return False, tau
        if self._plain:  # NOTE: skips the accumulator's bookkeeping (one list per push) when it does nothing
            self.acc.version += 1
            if deltas is not None:  # None: a cost-only simulation counts the push and applies nothing
                self.params[keys] += deltas
            return True, tau
        for k, d in self.acc.push(keys, deltas, read_version, tau=tau)[1]:  # (tau, the updates now due)
            self.params[k] += d
        return True, tau

    def add_early(self, keys: np.ndarray, deltas: Any) -> None:
        """Part of a push that arrives before its clock ends (Bosen's managed communication, :mod:`simlib.managed`):
        added to the table as it is, counted as no update; its clock completes with the push that follows it."""
        if not self._plain:
            raise ValueError("managed_bandwidth: early updates need the plain step rule (no staleness_aware, "
                             "accumulation or rule=)")
        self.params[keys] += deltas

    def finish(self) -> None:
        """Apply a partial accumulation group left at the end."""
        for k, d in self.acc.flush():
            self.params[k] += d


def serial_reference(problem: Any, steps: int, batch_size: int, lr: float) -> Any:
    """Plain serial SGD on the contract: the worker program on one shard, table[keys] += step(table[keys])."""
    check_problem(problem)
    w = problem.init_params()
    run_serial(problem, problem.shards(1)[0], Plan(steps, batch_size, lr), w)
    return w


def warm_up(problem: Any, keys: Callable[[np.ndarray], np.ndarray] | None = None,
            values: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
    """One step of ``problem`` in this process, off the clock, with the argument types its workers will use.

    NOTE: a substrate calls it before its workers fork. The problem's kernels then compile once, here
    (forked workers compiling them at once on a fresh checkout, numba writing its cache together, can
    crash), and the first np.unique in a forked child no longer costs 0.4 s (a lazy set-up fork shares
    only once the parent has run it). A kernel compiles once per argument type, read-only arrays
    included, so ``keys`` maps a batch to the keys as a worker holds them (``problem.keys`` by
    default) and ``values`` the float64 values read to the array a worker computes on (as read).
    A problem whose one shard is costly to build or step (LDA's: a sweep of the whole corpus) offers
    ``miniature()``, the same problem on a few documents, whose kernels take the same types.
    """
    caps = capabilities(problem)
    if caps.in_place_only:  # no get / step / add to compile; the substrate warms local_steps
        problem.quality(np.asarray(problem.init_params(), dtype=np.float64))
        return
    problem = problem if caps.miniature is None else caps.miniature()
    batch = problem.batch(problem.shards(1)[0], 0, 2)
    k = (problem.keys if keys is None else keys)(batch)
    w = np.asarray(problem.init_params(), dtype=np.float64)
    read = w[k] if values is None else values(w[k])
    problem.step(read, batch, k, 1e-3)  # real values: AdaGrad divides by them; a small lr: any l2 keeps lr * l2 < 1
    problem.quality(w)


def local_result(problem: Any, shard: Any) -> Any:
    """What a worker sends back of its local state at the end: ``problem.local_result(shard)``, or None.

    Real substrates put the workers' answers in ``Result.measured['local']`` (LDA: each shard's topic
    assignments, so the full log p(w, z) and the documents' topics can be computed after a run).
    """
    hook = capabilities(problem).local_result
    return None if hook is None else hook(shard)


def new_trace(problem: Any, protocol: Protocol, training: Training, substrate: str, where: str,
              unit: str = "worker", **meta: Any) -> Trace:
    """A substrate's empty Trace: its label ("ssp(1) over pipes, 2 workers"), the problem's metric,
    and the run's settings (protocol, steps, batch size, lr, and ``meta``) in ``trace.meta``."""
    n = training.n_workers
    trace = Trace(label=f"{protocol.label} {where}, {n} {unit}{'' if n == 1 else 'es' if unit.endswith('ch') else 's'}",
                  substrate=substrate, n_workers=n, metric=getattr(problem, "metric", "loss"),
                  lower_is_better=getattr(problem, "lower_is_better", True))
    trace.meta.update(protocol=protocol.spec, steps=training.steps, batch_size=training.batch_size, lr=training.lr,
                      **meta)
    if protocol.eager:  # ESSP: the server pushes every update to every worker's cache; here there is no cache
        trace.meta["eager"] = ("every read is of the table itself, holding every update applied so far: as fresh "
                               "as ESSP's eager pushes make a worker's cache, under SSP's read rule")
    return trace


def record_start(trace: Trace, problem: Any, params: Any) -> None:
    """The metric of the starting ``params`` as the trace's first point; a ValueError if it is not finite (nothing
    has been trained yet, so it is the data or the initial parameters, not the step size). In-process substrates
    (sim, gpu) call it; a server process reports the same point through :func:`record_metric`."""
    value = float(problem.quality(params))
    if not math.isfinite(value):
        raise ValueError(f"the {getattr(problem, 'metric', 'loss')} of the starting parameters is {value}: the data "
                         "or the initial parameters hold values that are not finite")
    trace.record_quality(0.0, 0, value)


def record_metric(trace: Trace, problem: Any, t: float, step: int, params: Any, lr: float) -> None:
    """The problem's metric of ``params`` into ``trace`` at (t, step); Diverged (which stops the run) if not finite."""
    value = float(problem.quality(params))
    trace.record_quality(t, step, value)
    check_metric(value, step, problem, lr)


class ServerRecord:
    """What a server substrate's server records (pipes and Ray alike): one update per push, its index the push's
    sequence number, and the metric of the whole table at the start, after every ``eval_every`` x n updates and at
    the end; :class:`~simlib.diverged.Diverged` at the first point that is not finite, so a run stops there (and the
    same Diverged at every update after it: a server that goes on serving stops each worker at that step)."""

    def __init__(self, problem: Any, training: Training, evaluate: bool, label: str, substrate: str):
        n = training.n_workers
        self.problem, self.lr, self.total = problem, training.lr, n * training.steps
        self.period = training.eval_every * n if evaluate else 0
        self.served = Trace(label, substrate, n)
        self.diverged: Diverged | None = None

    def update(self, t: float, worker: int, clock: int, tau: int, applied: bool, lag: int) -> bool:
        """One update at time ``t``; whether the metric is due after it (then :meth:`metric` the table)."""
        if self.diverged is not None:
            raise self.diverged
        self.served.update(t, worker, clock, tau, applied, lag)
        done = len(self.served.updates)
        return self.period > 0 and done % self.period == 0 and done < self.total

    def metric(self, t: float, params: Any) -> None:
        """The metric of the whole table ``params`` at time ``t``, after the updates recorded so far."""
        try:
            record_metric(self.served, self.problem, t, len(self.served.updates), params, self.lr)
        except Diverged as e:
            self.diverged = e
            raise


def served_trace(trace: Trace, spans: Iterable[tuple], served: Trace, problem: Any, lr: float) -> float:
    """Fill a server substrate's ``trace``: the workers' ``spans`` (worker, kind, start, end, bytes, step), the
    server's updates and quality points (Diverged at the first non-finite one); returns the last span's end."""
    for span in spans:
        trace.span(*span)
    for point in served.quality:
        check_metric(point.value, point.step, problem, lr)
    trace.updates, trace.quality = served.updates, served.quality
    return max((s.end for s in trace.spans), default=0.0)


@dataclass
class Result:
    """What :func:`simlib.run` returns from every substrate: the trace, the final table, measurements."""

    trace: Trace
    params: Any
    measured: dict[str, Any] = field(default_factory=dict)

    @property
    def quality(self) -> float:
        """The last recorded value of the problem's metric."""
        return self.trace.quality[-1].value if self.trace.quality else float("nan")

    @property
    def seconds(self) -> float:
        """Training seconds: ``measured['train_seconds']`` where the substrate measures it, else the wall time."""
        return float(self.measured.get("train_seconds") or self.measured.get("wall_seconds") or self.trace.makespan)

    @property
    def cores_used(self) -> float:
        """CPU seconds per training second: how many cores the run really got (NaN where not measured)."""
        cpu = self.measured.get("cpu_seconds")
        return cpu / self.seconds if cpu is not None and self.seconds > 0 else float("nan")

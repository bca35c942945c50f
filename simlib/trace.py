"""The trace: what every substrate (simulator, processes, GPU) returns from a run.

One format, so one set of plots and one summary compare a simulated run with a real one.

* ``spans``    -- per worker, what it was doing and when: ``compute``, ``send``, ``recv``, ``wait``
  (and ``down`` while a worker has failed),
  with the bytes moved (send/recv) and the step it belonged to.
* ``updates``  -- one per gradient (or count delta) a worker produced: when, by whom, for which
  step, how stale the parameters it was computed from were, and whether it was applied.
* ``quality``  -- the problem's metric (loss, log-likelihood, ...) over time and steps.

Times are seconds: simulated seconds for ``substrate="sim"``, wall seconds since the run's start
otherwise. Example::

    >>> t = Trace(label="demo", substrate="sim", n_workers=1)
    >>> t.span(0, "compute", 0.0, 1.0, step=0)
    >>> t.update(1.0, worker=0, step=0, staleness=0)
    >>> t.record_quality(1.0, step=1, value=0.5)
    >>> t.summary()["time_per_step"]
    1.0
"""
from __future__ import annotations

import array
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from simlib import _validate as check

SPAN_KINDS = ("compute", "send", "recv", "wait", "down")


class Span(NamedTuple):
    """An interval [start, end) in which ``worker`` did ``kind``, moving ``nbytes``."""

    worker: int
    kind: str
    start: float
    end: float
    nbytes: int = 0
    step: int = -1


class Update(NamedTuple):
    """A push from ``worker`` at its clock ``step``.

    ``staleness`` is tau, the one staleness every substrate records: the number of updates applied
    to the parameters between the worker's read and its push (the lectures' "skipped updates"; 0 for
    serial SGD). ``clock_lag`` is the protocol's view, the worker's clock minus the complete steps
    at its read (-1 where a substrate has no clocks).
    """

    time: float
    worker: int
    step: int
    staleness: int
    applied: bool = True
    clock_lag: int = -1


class QualityPoint(NamedTuple):
    """The metric's ``value`` at ``time`` after ``step`` global steps (or updates)."""

    time: float
    step: int
    value: float


_KIND_CODE = {k: i for i, k in enumerate(SPAN_KINDS)}
_RECORDS = {"spans": Span, "updates": Update, "quality": QualityPoint}  # a trace's record lists and their types
_NUMPY = {"i": "int32", "b": "int8", "d": "float64", "q": "int64"}  # array.array codes -> NumPy dtypes (Linux, macOS)


def _kind_code(kind: str) -> int:
    """The code of a span kind (its place in SPAN_KINDS); ValueError naming the kinds otherwise."""
    check.one_of("span kind", kind, SPAN_KINDS)
    return _KIND_CODE[kind]


class _Log:
    """A list of records kept as columns (``array.array``): read like a list, a sixth of its memory.

    NOTE: a simulated run of 100,000 workers x 100 steps records 40 million spans; as NamedTuples in a
    list they take 248 bytes each (measured: 10 GB), as columns 34 (1.3 GB). Reading yields the same
    NamedTuples, so code that iterates, indexes, compares or saves a trace sees no difference.
    """

    __slots__ = ("_cols",)
    _codes: str = ""

    def __init__(self, rows: Any = ()) -> None:
        self._cols = tuple(array.array(code) for code in self._codes)
        for row in rows:
            self.append(row)

    def __len__(self) -> int:
        return len(self._cols[0])

    def __iter__(self) -> Any:
        return map(self._make, *self._cols)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return list(map(self._make, *(c[index] for c in self._cols)))
        return self._make(*(c[index] for c in self._cols))

    def __eq__(self, other: object) -> bool:
        if type(other) is type(self):
            return self._cols == other._cols
        try:
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))  # type: ignore[arg-type]
        except TypeError:
            return NotImplemented

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} records)"

    @classmethod
    def from_columns(cls, columns: list) -> Any:
        """A log holding these columns (NumPy arrays of the column types, e.g. int32 for 'i'), copied once.

        Each array is dropped from ``columns`` once copied, so a caller holding no other reference to
        them needs the memory of one column more, not of all of them.
        """
        import numpy as np

        log = cls()
        for k, col in enumerate(log._cols):
            col.frombytes(memoryview(np.ascontiguousarray(columns[k], dtype=_NUMPY[col.typecode])).cast("B"))
            columns[k] = None
        return log

    def appenders(self) -> tuple:
        """The columns' ``append`` methods, in field order: a hot loop's way to record without a call per record
        (it passes each field of its type; a span log skips empty spans, as :meth:`SpanLog.add` does)."""
        return tuple(c.append for c in self._cols)

    def append(self, row: Any) -> None:
        """Add one record (a NamedTuple or a tuple of its fields)."""
        for col, value in zip(self._cols, self._encode(row)):
            col.append(value)


class SpanLog(_Log):
    """:class:`Span` records as columns; :meth:`add` is the simulator's fast path (a kind by its code)."""

    __slots__ = ()
    _codes = "ibddqi"  # worker, kind code, start, end, nbytes, step

    @staticmethod
    def _make(worker: int, kind: int, start: float, end: float, nbytes: int, step: int) -> Span:
        return Span(worker, SPAN_KINDS[kind], start, end, nbytes, step)

    @staticmethod
    def _encode(row: Any) -> tuple:
        s = Span(*row)
        return int(s.worker), _kind_code(s.kind), float(s.start), float(s.end), int(s.nbytes), int(s.step)

    def add(self, worker: int, kind: int, start: float, end: float, nbytes: int = 0, step: int = -1) -> None:
        """Record [start, end) of kind ``SPAN_KINDS[kind]`` if it is not empty (as :meth:`Trace.span`)."""
        if end > start:
            w, k, s, e, n, c = self._cols
            w.append(worker)
            k.append(kind)
            s.append(start)
            e.append(end)
            n.append(int(nbytes))
            c.append(step)


class UpdateLog(_Log):
    """:class:`Update` records as columns."""

    __slots__ = ()
    _codes = "diiqbq"  # time, worker, step, staleness, applied, clock lag

    @staticmethod
    def _make(time: float, worker: int, step: int, staleness: int, applied: int, clock_lag: int) -> Update:
        return Update(time, worker, step, staleness, bool(applied), clock_lag)

    @staticmethod
    def _encode(row: Any) -> tuple:
        u = Update(*row)
        return float(u.time), int(u.worker), int(u.step), int(u.staleness), bool(u.applied), int(u.clock_lag)


def _columns(records: Any, log: type[_Log]) -> list[Any]:
    """The fields of spans or updates as NumPy arrays (a span's kind as its code): views of a log's columns (no
    copy: 40 million spans take 1.3 GB), or the columns of a list of records. The caller drops them before the
    log grows again (a column with a view on it cannot be resized)."""
    import numpy as np

    if not isinstance(records, log):
        records = log(records)
    return [np.frombuffer(c, dtype=_NUMPY[c.typecode]) if len(c) else np.zeros(0, _NUMPY[c.typecode])
            for c in records._cols]


def _busy(spans: list[Any], kind: str) -> float:
    """Total length of the spans of ``kind``, from :func:`_columns`, summed left to right as ``sum`` does."""
    import numpy as np

    mine = spans[1] == _kind_code(kind)
    lengths = spans[3][mine] - spans[2][mine]
    return float(np.cumsum(lengths)[-1]) if len(lengths) else 0.0


@dataclass
class Trace:
    """A run's record; equal traces compare equal (``==``), which is how determinism is tested."""

    label: str
    substrate: str
    n_workers: int
    metric: str = "loss"
    lower_is_better: bool = True
    spans: list[Span] = field(default_factory=list)
    updates: list[Update] = field(default_factory=list)
    quality: list[QualityPoint] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    # -- recording -------------------------------------------------------------------------
    def span(self, worker: int, kind: str, start: float, end: float, nbytes: int = 0, step: int = -1) -> None:
        """Record that ``worker`` spent [start, end) on ``kind``."""
        _kind_code(kind)
        if end > start:
            self.spans.append(Span(worker, kind, float(start), float(end), int(nbytes), int(step)))

    def update(self, time: float, worker: int, step: int, staleness: int, applied: bool = True,
               clock_lag: int = -1) -> None:
        """Record one push, its staleness tau and (if the substrate has clocks) its clock lag."""
        self.updates.append(Update(float(time), int(worker), int(step), int(staleness), bool(applied), int(clock_lag)))

    def record_quality(self, time: float, step: int, value: float) -> None:
        """Record the metric at a moment of the run."""
        self.quality.append(QualityPoint(float(time), int(step), float(value)))

    # -- reading ---------------------------------------------------------------------------
    @property
    def makespan(self) -> float:
        """Time from the start to the last recorded event."""
        return self._makespan(_columns(self.spans, SpanLog), _columns(self.updates, UpdateLog))

    def _makespan(self, spans: list[Any], updates: list[Any]) -> float:
        """:attr:`makespan` from the columns of :func:`_columns`."""
        ends = [float(c.max()) for c in (spans[3], updates[0]) if c.size]
        return max(ends + [q.time for q in self.quality], default=0.0)

    def _reached(self, target: float) -> QualityPoint | None:
        """The first quality point at which the metric reaches ``target`` (<= for losses, >= otherwise)."""
        return next((q for q in self.quality if (q.value <= target if self.lower_is_better else q.value >= target)),
                    None)

    def time_to(self, target: float) -> float | None:
        """First time the metric reaches ``target`` (<= for losses, >= otherwise); None if never."""
        return getattr(self._reached(target), "time", None)

    def steps_to(self, target: float) -> int | None:
        """First step count at which the metric reaches ``target``; None if never."""
        return getattr(self._reached(target), "step", None)

    def busy_time(self, kind: str) -> float:
        """Total time all workers spent on spans of ``kind``."""
        return _busy(_columns(self.spans, SpanLog), kind)

    def summary(self) -> dict[str, float]:
        """Headline numbers: time per step, fraction waiting, bytes moved, staleness, final metric."""
        import numpy as np

        # NOTE: on the columns, not record by record: 100,000 simulated workers x 10 steps took 55 s a summary.
        # Every sum runs left to right (np.cumsum), as the loop over the records did, so the figures are the same.
        spans, updates = _columns(self.spans, SpanLog), _columns(self.updates, UpdateLog)
        makespan = self._makespan(spans, updates)
        n = max(self.n_workers, 1)
        time, worker, stale, applied, lags = updates[0], updates[1], updates[3], updates[4], updates[5]
        steps_per_worker = len(time) / n
        # Per worker: time of its last update / its number of updates; async fast workers finish
        # early, so this (not makespan / steps) is what "time per step" means to a reader.
        time_per_step = math.nan
        if len(time):
            ids, first = np.unique(worker, return_index=True)
            ids = ids[np.argsort(first)]  # workers in the order of their first update
            last = np.zeros(int(ids.max()) + 1)
            np.maximum.at(last, worker, time)
            per_worker = last[ids] / np.bincount(worker)[ids]
            time_per_step = float(np.cumsum(per_worker)[-1]) / len(per_worker)
        worker_time = makespan * n
        kinds, nbytes = spans[1], spans[4]
        lags = lags[lags >= 0]
        return {
            "makespan": makespan,
            "steps_per_worker": steps_per_worker,
            "time_per_step": time_per_step,
            "wait_fraction": _busy(spans, "wait") / worker_time if worker_time > 0 else 0.0,
            "compute_fraction": _busy(spans, "compute") / worker_time if worker_time > 0 else 0.0,
            "bytes_sent": float(int(nbytes[kinds == _KIND_CODE["send"]].sum())),
            "bytes_received": float(int(nbytes[kinds == _KIND_CODE["recv"]].sum())),
            "updates_applied": float(int(applied.sum())),
            "updates_dropped": float(len(applied) - int(applied.sum())),
            "max_staleness": float(stale.max()) if len(stale) else 0.0,
            "mean_staleness": int(stale.sum()) / len(stale) if len(stale) else 0.0,
            "max_clock_lag": float(lags.max()) if len(lags) else 0.0,
            "final_" + self.metric: self.quality[-1].value if self.quality else math.nan,
        }

    def network_load(self, bins: int = 1000) -> tuple[Any, Any]:
        """(bin start times, bytes per second on the wire in each bin): every send and recv span's bytes
        spread evenly over its time (:meth:`link_load`), summed over workers. Zero bins are an idle network."""
        check.positive_int("bins", bins)
        makespan = self.makespan
        starts, load = self.link_load(makespan / bins if makespan > 0 else 1.0, ("send", "recv"), bins)
        return starts, load.sum(axis=0)

    def link_load(self, width: float, kinds: tuple[str, ...] = ("send",), bins: int | None = None) -> tuple[Any, Any]:
        """(bin start times, bytes/s on each worker's link per bin, shape (n_workers, bins)): each span of ``kinds``
        spreads its bytes evenly over its duration, bins of ``width`` seconds from 0 to the makespan (or ``bins`` of
        them).

            >>> t = Trace("x", "sim", 1)
            >>> t.span(0, "send", 0.0, 2.0, nbytes=100)
            >>> t.link_load(1.0)[1].tolist()
            [[50.0, 50.0]]
        """
        import numpy as np

        check.positive("width", width)
        bins = bins or max(1, int(np.ceil(self.makespan / width)))
        load = np.zeros((self.n_workers, bins))
        edges = np.arange(bins + 1) * width
        for s in self.spans:
            if s.kind not in kinds or not s.nbytes:
                continue
            a = min(int(s.start // width), bins - 1)
            if s.end - s.start <= 1e-9 * width:  # an instant: all its bytes in its bin
                load[s.worker, a] += s.nbytes
                continue
            b = min(int(-(-s.end // width)), bins)
            overlap = np.minimum(edges[a + 1:b + 1], s.end) - np.maximum(edges[a:b], s.start)
            overlap[overlap < 1e-12 * width] = 0.0  # a span ending on a bin edge, give or take rounding
            load[s.worker, a:b] += s.nbytes * overlap / overlap.sum()
        return edges[:-1], load / width

    def worker_spans(self, worker: int) -> list[Span]:
        """The spans of one worker, in time order."""
        return sorted((s for s in self.spans if s.worker == worker), key=lambda s: (s.start, s.end))

    # -- persistence -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (lists of lists), loss-free for floats."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update({k: [list(x) for x in d[k]] for k in _RECORDS})
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trace":
        """Inverse of :meth:`to_dict`."""
        records = {k: [record(*r) for r in d.get(k, [])] for k, record in _RECORDS.items()}
        return cls(label=d["label"], substrate=d["substrate"], n_workers=int(d["n_workers"]),
                   metric=d.get("metric", "loss"), lower_is_better=bool(d.get("lower_is_better", True)),
                   meta=dict(d.get("meta", {})), **records)

    def save(self, path: str) -> None:
        """Write the trace as JSON."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f)

    @classmethod
    def load(cls, path: str) -> "Trace":
        """Read a trace written by :meth:`save`."""
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

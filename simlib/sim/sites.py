"""Sites joined by a WAN: where workers sit, what crosses the WAN, and Gaia's significance filter.

A job may span ``sites`` data centres. Workers are spread over them in contiguous blocks (8 workers on
3 sites: 3, 3, 2). Inside a site messages cost the LAN's ``latency + bytes / bandwidth``; between two
sites they cost ``wan_latency + bytes / wan_bandwidth`` on a WAN link, one per direction per pair of
sites, shared by everything that crosses it (so WAN traffic queues).

With a flat parameter server (``hierarchy='flat'``) the servers sit at site 0: a worker elsewhere pays
the WAN on every pull (request and reply) and every push. With ``hierarchy='per-site'`` each site has
its own servers and its own copy of the table; workers talk to their site's servers over the LAN, and
each site server sends what its workers applied to every other site. As Gaia's site servers do, it sums
its workers' pushes (:class:`Outbox`) and sends once per step of the site (when each of its workers has
moved past the step), one message to each other site: every key touched (full replication), or, with a
``significance`` threshold (Gaia, Hsieh et al., NSDI 2017), only the keys whose update accumulated since
they were last sent is significant, ``|acc| > significance * |value|`` against the value the site's table
holds; the others keep accumulating. When the workers are done each site sends what it still holds, so
every update reaches every site and the tables agree (up to the order of floating-point additions).

The clocks stay global and the protocol's bound holds across the WAN too: a worker's read at step c
waits until its site holds what the other sites sent for updates of steps up to c - 1 - s (s = 0 for
BSP, the bound for SSP, none for async); a message counts for the earliest step whose pushes it sums.
With the filter that is what they sent, the significant sums: the small ones are the approximation (Gaia's ASP
bounds them only by the threshold). Gaia's mirror clock
(``mirror_clock`` m) bounds the sites against each other whatever the protocol: each site announces the end
of each of its steps to the others (with that step's sums, or alone: one key's bytes), and a read at step c
also waits until its site has heard that every other site ended step c - 1 - m. Without it an async site
runs on its own table at LAN speed and hears from the others only as the WAN delivers. tau counts the
updates applied at any site between a read and its push. The quality is evaluated on site 0's table.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def site_of(n_workers: int, sites: int) -> list[int]:
    """Worker i's site: floor(i * sites / n_workers), contiguous blocks as even as they can be."""
    return [i * sites // n_workers for i in range(n_workers)]


class Outbox:
    """One site server's updates not yet sent across the WAN: its workers' pushes summed per key.

    Gaia's site server aggregates its workers' updates and sends sums, not each push: :meth:`add` sums a
    push in, :meth:`take` (once a step of the site is complete) returns the keys to send, the ones touched
    since the last take (full replication, ``threshold`` None) or, of those, the significant sums
    (``|acc| > threshold * |value|``), and keeps the rest accumulating. Cost-only runs add no deltas:
    the keys alone are counted.

    >>> box = Outbox(np.zeros(3), threshold=0.1)
    >>> box.add(0, np.array([0, 2]), np.array([0.05, 1.0]))
    >>> box.add(0, np.array([0]), np.array([0.02]))   # a second worker's push of the same step
    >>> keys, sums, step = box.take(np.array([1.0, 0.0, 4.0]))
    >>> keys.tolist(), step  # key 0: 0.07 <= 0.1 x 1 waits; key 2: 1.0 > 0.1 x 4 is sent
    ([2], 0)
    >>> box.add(1, np.array([0]), np.array([0.06]))
    >>> keys, sums, step = box.take(np.array([1.0, 0.0, 4.0]))
    >>> keys.tolist(), sums.round(2).tolist(), step  # 0.07 + 0.06 > 0.1 x 1
    ([0], [0.13], 1)
    >>> box.rest()[0].tolist()  # nothing left to flush
    []
    """

    def __init__(self, like: np.ndarray, threshold: float | None = None):
        self.acc = np.zeros_like(like)
        self.threshold = threshold
        self.touched: list[np.ndarray] = []
        self.first: int | None = None  # the earliest step of a push summed in since the last take
        # Per key: how many of the site's takes summed it, and how many of those sent it (what filtering saved).
        self.summed = np.zeros(len(like), dtype=np.int64)
        self.sent = np.zeros(len(like), dtype=np.int64)

    def add(self, step: int, keys: np.ndarray, deltas: np.ndarray | None) -> None:
        """Sum one applied push of ``step`` (unique keys) in."""
        if deltas is not None:
            self.acc[keys] += deltas
        self.touched.append(keys)
        if self.first is None or step < self.first:
            self.first = step

    def take(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, int | None]:
        """(keys, their sums, now reset; the earliest step among the pushes summed since the last take)."""
        first, self.first = self.first, None
        if not self.touched:
            return np.zeros(0, dtype=np.int64), None, None
        keys = self.touched[0] if len(self.touched) == 1 else np.unique(np.concatenate(self.touched))
        self.touched = []
        self.summed[keys] += 1
        acc = self.acc[keys]
        if self.threshold is not None:
            # Gaia's filter: |acc| > threshold * |value| (a key whose value is 0 passes whenever acc != 0)
            sig = np.abs(acc) > self.threshold * np.abs(values[keys])
            keys, acc = keys[sig], acc[sig]
        self.acc[keys] = 0.0
        self.sent[keys] += 1
        return keys, acc, first

    def rest(self) -> tuple[np.ndarray, np.ndarray]:
        """Everything still held (the final flush): the nonzero sums and any key touched since the last take, now
        reset."""
        keys = np.flatnonzero(self.acc)
        if self.touched:
            keys = np.union1d(keys, np.concatenate(self.touched))
        self.touched, self.first = [], None
        out = self.acc[keys]
        self.acc[keys] = 0.0
        return keys, out


def sent_by_frequency(outboxes: list[Outbox],
                      shares: tuple[float, ...] = (0.01, 0.1, 0.5, 1.0)) -> list[dict[str, float]]:
    """What a filter sent, by how often the keys were touched: keys ranked by the site steps that summed them.

    One row per group (the top ``shares[0]`` of the keys ever touched, then up to ``shares[1]``, ...):
    ``keys``, ``share`` (of all the sums the sites took), ``sent`` (the fraction of the group's sums sent)
    and ``per_key`` (the median sums per key per site).
    """
    if not shares or any(not 0 <= a < b for a, b in zip((0.0, *shares), shares)) or shares[-1] != 1.0:
        raise ValueError(f"shares must rise from above 0 to 1.0, got {shares!r}")
    summed = sum(box.summed for box in outboxes)
    sent = sum(box.sent for box in outboxes)
    order = np.argsort(-summed, kind="stable")
    order = order[summed[order] > 0]
    total = max(int(summed.sum()), 1)
    rows, lo = [], 0
    for share in shares:
        hi = int(round(share * len(order)))
        keys = order[lo:hi]
        if len(keys):
            rows.append({"keys": float(len(keys)), "share": float(summed[keys].sum() / total),
                         "sent": float(sent[keys].sum() / summed[keys].sum()),
                         "per_key": float(np.median(summed[keys])) / len(outboxes)})
        lo = hi
    return rows


def against(base: Any, traces: dict[str, Any], target: float) -> dict[str, dict[str, float | None]]:
    """Each trace against ``base`` (say a flat PS): WAN MB and how many times fewer, the time to ``target`` (None:
    never reached) and how many times sooner, the final quality and its relative change."""
    fw, ft, fq = base.meta["wan_bytes"], base.time_to(target), base.quality[-1].value
    rows = {}
    for name, tr in traces.items():
        w, t, q = tr.meta["wan_bytes"], tr.time_to(target), tr.quality[-1].value
        rows[name] = {"wan_mb": w / 1e6, "fewer": fw / w if w else float("inf"), "time": t,
                      "sooner": None if t is None or ft is None else ft / t, "final": q, "change": q / fq - 1}
    return rows


def relative_changes(problem: Any, table: np.ndarray, batch_size: int, lr: float, steps: int = 20) -> np.ndarray:
    """|delta| / |value| of every entry of ``steps`` updates computed on ``table`` (worker 0 of 1's batches).

    What the significance filter compares with its threshold, for one update at a time; a value of 0
    gives inf (such a key always passes).
    """
    shard = problem.shards(1)[0]
    out = []
    with np.errstate(divide="ignore", invalid="ignore"):
        for c in range(steps):
            batch = problem.batch(shard, c, batch_size)
            keys = problem.keys(batch)
            keys, deltas = problem.step(table[keys], batch, keys, lr)
            out.append(np.abs(deltas) / np.abs(table[keys]))
    return np.concatenate(out)

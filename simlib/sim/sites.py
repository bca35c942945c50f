"""Sites joined by a WAN: where workers sit, what crosses the WAN, and Gaia's significance filter.

A job may span ``sites`` data centres. Workers are spread over them in contiguous blocks (8 workers on
3 sites: 3, 3, 2). Inside a site messages cost the LAN's ``latency + bytes / bandwidth``; between two
sites they cost ``wan_latency + bytes / wan_bandwidth`` on a WAN link, one per direction per pair of
sites, shared by everything that crosses it (so WAN traffic queues).

With a flat parameter server (``hierarchy='flat'``) the servers sit at site 0: a worker elsewhere pays
the WAN on every pull (request and reply) and every push. With ``hierarchy='per-site'`` each site has
its own servers and its own copy of the table; workers talk to their site's servers over the LAN, and
each site server sends what its workers applied to every other site: every update as it is (full
replication), or, with a ``significance`` threshold (Gaia, Hsieh et al., NSDI 2017), only the keys whose
update accumulated since they were last sent is significant, ``|acc| > significance * |value|`` against
the value the site's table holds; the others keep accumulating. When the workers are done each site
sends what it still holds, so every update reaches every site and the tables agree (up to the order of
floating-point additions).

The clocks stay global and the protocol's bound holds across the WAN too: a worker's read at step c
waits until its site holds what the other sites sent for updates of steps up to c - 1 - s (s = 0 for
BSP, the bound for SSP, none for async). With the filter that is what they sent, the significant sums:
the small ones are the approximation (Gaia's ASP bounds them only by the threshold). tau counts the
updates applied at any site between a read and its push. The quality is evaluated on site 0's table.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from simlib.sim.config import HIERARCHIES, NETWORKS  # noqa: F401  (re-exported: the presets live with the fields)


def site_of(n_workers: int, sites: int) -> list[int]:
    """Worker i's site: floor(i * sites / n_workers), contiguous blocks as even as they can be."""
    return [i * sites // n_workers for i in range(n_workers)]


def significant(acc: np.ndarray, values: np.ndarray, threshold: float) -> np.ndarray:
    """Gaia's filter: |acc| > threshold * |value| (a key whose value is 0 passes whenever acc != 0)."""
    return np.abs(acc) > threshold * np.abs(values)


class Filter:
    """One site's accumulated, not yet sent updates: add what its workers applied, take what passes.

    >>> f = Filter(np.zeros(3), threshold=0.1)
    >>> keys, sums = f.add(np.array([0, 2]), np.array([0.05, 1.0]), np.array([1.0, 4.0]))
    >>> keys.tolist()  # key 0: 0.05 <= 0.1 x 1 waits; key 2: 1.0 > 0.1 x 4 is sent
    [2]
    >>> keys, sums = f.add(np.array([0]), np.array([0.06]), np.array([1.0]))
    >>> keys.tolist(), sums.round(2).tolist()  # 0.05 + 0.06 > 0.1 x 1
    ([0], [0.11])
    >>> f.rest()[0].tolist()  # nothing left to flush
    []
    """

    def __init__(self, like: np.ndarray, threshold: float):
        self.acc = np.zeros_like(like)
        self.threshold = threshold

    def add(self, keys: np.ndarray, deltas: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Accumulate deltas on (unique) keys; return the keys that pass against ``values`` and their sums, now reset."""
        self.acc[keys] += deltas
        acc = self.acc[keys]
        sig = significant(acc, values, self.threshold)
        out_keys, out = keys[sig], acc[sig]
        self.acc[out_keys] = 0.0
        return out_keys, out

    def rest(self) -> tuple[np.ndarray, np.ndarray]:
        """Everything still held (the final flush), now reset."""
        keys = np.flatnonzero(self.acc)
        out = self.acc[keys]
        self.acc[keys] = 0.0
        return keys, out


def wan_load(trace: Any, bins: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """(bin start times, WAN bytes per second in each bin), from ``trace.meta['wan']`` ([start, end, bytes, from, to]).

    A message's bytes are spread evenly over the time it held its link and travelled; a trace without
    WAN traffic gives zeros.
    """
    if not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive integer, got {bins!r}")
    width = trace.makespan / bins if trace.makespan > 0 else 1.0
    load = np.zeros(bins)
    for start, end, nbytes, *_ in trace.meta.get("wan", []):
        a = min(int(start / width), bins - 1)
        b = max(a + 1, min(-int(-end // width), bins))
        load[a:b] += nbytes / (b - a)
    return np.arange(bins) * width, load / width


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

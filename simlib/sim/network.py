"""Links and message costs: a message costs latency + size / bandwidth, and shared links queue.

In a parameter server the servers' links are the shared resources: every worker's push enters
through a server's in-link, every pull reply leaves through its out-link, so N workers sending
to one server queue up (incast), while k shards give each worker k links in parallel. Worker
NICs carry only their own traffic and are not modelled as contended.
"""
from __future__ import annotations

from typing import Generator

import simpy


def message_time(nbytes: float, latency: float, bandwidth: float) -> float:
    """Uncontended cost of one message: latency + nbytes / bandwidth."""
    return latency + nbytes / bandwidth


def ring_allreduce_time(n_workers: int, nbytes: float, latency: float, bandwidth: float) -> float:
    """Ring all-reduce: 2(N-1) lock-step phases, each moving nbytes/N per link: 2(N-1)/N * B/bw + 2(N-1) * lat."""
    if n_workers <= 1:
        return 0.0
    phases = 2 * (n_workers - 1)
    return phases * (latency + nbytes / n_workers / bandwidth)


class Node:
    """A machine with one in-link and one out-link, each serving one message at a time."""

    __slots__ = ("name", "inlink", "outlink")

    def __init__(self, env: simpy.Environment, name: str):
        self.name = name
        self.inlink = simpy.Resource(env, capacity=1)
        self.outlink = simpy.Resource(env, capacity=1)


def transmit(env: simpy.Environment, link: simpy.Resource, nbytes: float, latency: float, bandwidth: float) -> Generator:
    """Hold ``link`` for nbytes / bandwidth (queueing behind other messages), then propagate for latency."""
    with link.request() as req:
        yield req
        yield env.timeout(nbytes / bandwidth)
    if latency:
        yield env.timeout(latency)

"""Delayed SGD: the analysed model behind the SSP bound, run serially on any Problem.

Every gradient is computed on the parameters as they were ``delay`` updates ago,

    w_{t+1} = w_t + step(w_{t - delay}),

which is exactly a push with staleness tau = delay. The lectures' regret bound for this model grows
like sqrt(tau T) in general, while for i.i.d. data and smooth losses the delay enters only a
lower-order term: small steps hide it, large steps expose it. Example::

    >>> from simlib.problems.logistic import LogisticProblem, make_sparse_classification
    >>> prob = LogisticProblem(make_sparse_classification(500, 50, 5, seed=0), eval_rows=None)
    >>> fresh = delayed_sgd(prob, steps=40, batch_size=16, lr=0.5, delay=0)
    >>> from simlib.contract import serial_reference
    >>> bool((fresh == serial_reference(prob, 40, 16, 0.5)).all())
    True
"""
from __future__ import annotations

from typing import Any

from simlib.contract import check_problem
from simlib.course.averaging import train_on_shard


def delayed_sgd(problem: Any, steps: int, batch_size: int, lr: float, delay: int) -> Any:
    """Serial SGD whose step t reads the table as it was after step t - delay (delay 0: plain SGD)."""
    check_problem(problem)  # before its shards are asked for
    return train_on_shard(problem, problem.shards(1)[0], steps, batch_size, lr, delay=delay)


def loss_against_delay(problem: Any, delays: list[int], steps: int, batch_size: int, lr: float) -> list[float]:
    """The problem's metric after ``steps`` delayed-SGD steps, for each delay."""
    return [float(problem.quality(delayed_sgd(problem, steps, batch_size, lr, d))) for d in delays]

"""Model averaging: train copies on parts of the data, then combine them by averaging.

One-shot averaging (the lectures' "process 0 finds w1 on one half, process 1 finds w2 on the other:
how to combine them?") trains each part to the end and returns mean(w_p). Iterative parameter
mixing, the MapReduce way, averages after every round and restarts each part from the mean:
each round is one map (train on a part) and one reduce (average). Example::

    >>> from simlib.problems.logistic import LogisticProblem, make_sparse_classification
    >>> prob = LogisticProblem(make_sparse_classification(600, 40, 6, seed=0), eval_rows=None)
    >>> w = parameter_mixing(prob, n_parts=2, rounds=1, steps_per_round=20, batch_size=16, lr=0.5)[-1]
    >>> prob.quality(w) < prob.quality(prob.init_params())
    True
"""
from __future__ import annotations

from typing import Any

from simlib import _validate as check
from simlib.contract import check_problem
from simlib.worker import Plan, run_serial


def train_on_shard(problem: Any, shard: Any, steps: int, batch_size: int, lr: float, w0: Any = None,
                   first_step: int = 0, delay: int = 0) -> Any:
    """Serial SGD on one shard from ``w0`` (default: the initial table); batches first_step, first_step + 1, ...;
    each step reads the table as it was ``delay`` updates before (:func:`simlib.course.delayed.delayed_sgd`)."""
    check_problem(problem)
    check.positive_int("steps", steps)
    check.positive_int("batch_size", batch_size)
    check.positive("lr", lr)
    check.non_negative_int("delay", delay)
    w = problem.init_params() if w0 is None else w0.copy()
    run_serial(problem, shard, Plan(first_step + steps, batch_size, lr, first=first_step), w, delay=delay)
    return w

def parameter_mixing(problem: Any, n_parts: int, rounds: int, steps_per_round: int, batch_size: int,
                     lr: float) -> list[Any]:
    """The averaged table after each round: w <- mean over parts p of SGD_p(w) (rounds = 1: one-shot)."""
    check.positive_int("n_parts", n_parts)
    check.positive_int("rounds", rounds)
    shards = problem.shards(n_parts)
    w = problem.init_params()
    out = []
    for r in range(rounds):
        parts = [train_on_shard(problem, s, steps_per_round, batch_size, lr, w, r * steps_per_round) for s in shards]
        w = sum(parts) / n_parts
        out.append(w)
    return out

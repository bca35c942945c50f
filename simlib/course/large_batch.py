"""Large batches: how far synchronous data parallelism can grow the batch before it stops paying.

n workers of b rows each, all-reducing their gradients, take one SGD step on the global batch B = n b.
More workers make a step no longer in wall time but cover more rows, so the step size must follow the
batch, and the question is how many *epochs* a target accuracy then takes. Two rules from the field:

* **linear scaling with warm-up** (Goyal et al.): eta(B) = eta_0 B / B_0, reached linearly over the first
  ``warmup`` epochs (a long step at random weights kills ReLUs before they learn anything);
* **LAMB**: Adam's direction r_l = m_l / (sqrt(v_l) + eps) on each layer l (its W and b), scaled by the
  trust ratio ||theta_l|| / ||r_l||, so every layer moves by the same share of its own norm whatever its
  gradient's scale; its eta grows as sqrt(B / B_0) (You et al.) and warms up the same way.

:func:`epochs_to` trains the global batches on one process: the same math as the synchronous run, whose
step time :func:`step_seconds` prices (the compute of b rows, measured, plus a ring all-reduce of the
gradient). Epochs to the target times steps per epoch times step time is the time to the target.

Example::

    >>> from simlib.problems.mlp import MLPProblem
    >>> run = epochs_to(MLPProblem(), batch=64, rule=Rule("sgd", lr=0.1), target=0.9, max_epochs=10)
    >>> run.reached, run.epochs <= 10
    (True, True)
"""
from __future__ import annotations

import timeit
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from simlib import _validate as check
from simlib.backend import one_blas_thread
from simlib.protocol import MAX_REAL_STEPS
from simlib.sim.network import ring_allreduce_time

OPTIMIZERS = ("sgd", "lamb")
SCALES = {"none": 0.0, "sqrt": 0.5, "linear": 1.0}  # eta grows as (B / B_0) ** power


def check_decay(name: str, value: Any) -> None:
    """ValueError naming ``name`` unless a number in [0, 1): a moment's decay (1 never forgets, and the bias
    correction m / (1 - beta^t) divides by 0; above 1 the moments grow without bound)."""
    if not check._is_number(value) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")


@dataclass(frozen=True)
class Rule:
    """The optimizer ('sgd' or 'lamb'), its step size at ``base_batch`` rows, grown with the batch as ``scale``
    says ('none', 'sqrt' or 'linear') and ramped from 0 over ``warmup`` epochs."""

    optimizer: str = "sgd"
    lr: float = 0.1
    base_batch: int = 32
    scale: str = "none"
    warmup: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6

    def __post_init__(self) -> None:
        check.one_of("optimizer", self.optimizer, OPTIMIZERS)
        check.positive("lr", self.lr)
        check.positive_int("base_batch", self.base_batch)
        check.one_of("scale", self.scale, SCALES)
        check.non_negative("warmup", self.warmup)
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {self.betas!r}")
        for name, value in zip(("betas[0]", "betas[1]"), self.betas):
            check_decay(name, value)
        check.positive("eps", self.eps)

    def rate(self, batch: int, epoch: float) -> float:
        """eta at fractional ``epoch`` of a run at global batch ``batch``."""
        peak = self.lr * (batch / self.base_batch) ** SCALES[self.scale]
        return peak * min(1.0, epoch / self.warmup) if self.warmup else peak


@dataclass
class Run:
    """Epochs (rows seen / training rows) until held-out accuracy first reached the target, or ``max_epochs``."""

    batch: int
    rule: Rule
    reached: bool
    epochs: float
    steps: int
    accuracy: float
    curve: list[tuple[float, float]] = field(default_factory=list)  # (epoch, held-out accuracy)


def adam_direction(g: Any, m: Any, v: Any, t: int, betas: tuple[float, float], eps: float) -> Any:
    """Adam's step direction r = m_hat / (sqrt(v_hat) + eps), the moments m and v updated in place (t counts from 1)."""
    b1, b2 = betas
    m *= b1
    m += (1 - b1) * g
    v *= b2
    v += (1 - b2) * g * g
    return (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)


def lamb_step(theta: Any, g: Any, m: Any, v: Any, t: int, lr: float, betas: tuple[float, float] = (0.9, 0.999),
              eps: float = 1e-6) -> float:
    """theta -= lr (||theta|| / ||r||) r, r Adam's direction (:func:`adam_direction`), in place with the moments m
    and v; returns the trust ratio ||theta|| / ||r|| (1 where either is 0)."""
    r = adam_direction(g, m, v, t, betas, eps)
    w_norm, r_norm = float(np.linalg.norm(theta)), float(np.linalg.norm(r))
    trust = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
    theta -= lr * trust * r
    return trust


def _lamb(state: dict, theta: Any, sl: slice, g: Any, lr: float, rule: Rule, t: int,
          step: Callable[..., Any] = lamb_step) -> None:
    """One LAMB ``step`` on the layer ``sl`` of ``theta`` (a view: updated in place), with the layer's moments."""
    m, v = state.setdefault(sl.start, (np.zeros_like(g), np.zeros_like(g)))
    step(theta[sl], g, m, v, t, lr, rule.betas, rule.eps)


@one_blas_thread()  # one process, small products: see one_blas_thread
def epochs_to(problem: Any, batch: int, rule: Rule, target: float, max_epochs: float = 30,
              evals_per_epoch: int = 4, seed: int = 0, layer_step: Callable[..., Any] = lamb_step) -> Run:
    """Train ``problem`` (an MLPProblem) by ``rule`` on shuffled global batches of ``batch`` rows until the held-out
    accuracy reaches ``target``, evaluating ``evals_per_epoch`` times an epoch; under LAMB each layer is stepped by
    ``layer_step`` (one with :func:`lamb_step`'s signature: a student's own, say)."""
    check.positive_int("batch", batch)
    check.probability("target", target)
    check.positive("max_epochs", max_epochs)
    check.positive_int("evals_per_epoch", evals_per_epoch)
    n_rows = problem.shards(1)[0][1]
    if batch > n_rows:
        raise ValueError(f"batch ({batch}) must be <= the training rows ({n_rows})")
    steps_per_epoch = n_rows / batch
    if max_epochs * steps_per_epoch > MAX_REAL_STEPS:  # a run that long is a typo (simlib.run's bound on steps)
        raise ValueError(f"max_epochs: {max_epochs:g} epochs of {steps_per_epoch:g} steps exceed {MAX_REAL_STEPS:,} "
                         f"steps; use at most {MAX_REAL_STEPS / steps_per_epoch:g}")
    every = max(1, int(steps_per_epoch / evals_per_epoch))
    theta, state = problem.init_params(), {}
    rng, order, acc, curve = np.random.default_rng(seed), np.empty(0, np.int64), 0.0, []
    for t in range(1, int(max_epochs * steps_per_epoch) + 1):
        if len(order) < batch:
            order = np.concatenate([order, rng.permutation(n_rows)])
        rows, order = order[:batch], order[batch:]
        lr = rule.rate(batch, (t - 1) / steps_per_epoch)
        for sl, g in problem.backward_layers(theta, rows):
            if rule.optimizer == "lamb":
                _lamb(state, theta, sl, g, lr, rule, t, layer_step)
            else:
                theta[sl] -= lr * g
        if t % every == 0:
            acc = problem.accuracy(theta)
            curve.append((t / steps_per_epoch, acc))
            if not np.isfinite(theta).all() or acc >= target:
                break
    return Run(batch, rule, acc >= target, t / steps_per_epoch, t, acc, curve)


@one_blas_thread()  # timed as epochs_to trains
def step_seconds(problem: Any, batch: int, n_workers: int, latency: float = 5e-5, bandwidth: float = 1.25e9,
                 repeats: int = 5) -> tuple[float, float]:
    """(compute, all-reduce) seconds of one synchronous step of global batch ``batch`` on ``n_workers``: the
    backward pass of batch / n rows, best of ``repeats`` measured here, and a ring all-reduce of the 8-byte
    gradient priced by the network model (default 10 Gb/s, 50 us)."""
    check.positive_int("batch", batch)
    check.positive_int("n_workers", n_workers)
    check.non_negative("latency", latency)
    check.positive("bandwidth", bandwidth)
    check.positive_int("repeats", repeats)
    theta, rows = problem.init_params(), np.arange(max(1, batch // n_workers))
    best = min(timeit.repeat(lambda: list(problem.backward_layers(theta, rows)), number=1, repeat=repeats))
    return best, ring_allreduce_time(n_workers, 8.0 * problem.n_params, latency, bandwidth)

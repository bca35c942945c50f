"""Full-batch logistic regression over data partitions: gradient descent, Newton-CG and L-BFGS.

Each method sees the data only through sums over partitions, as a cluster would: a partition
returns its part of the loss and gradient, or of a Hessian-vector product, and the parts are
added up, one **round** of a reduce (an all-reduce of d floats). The objective counts its rounds,
so a method's communication is measured, not assumed. Example::

    >>> from simlib.problems.logistic import make_sparse_classification
    >>> obj = Objective(make_sparse_classification(2_000, 50, 5, seed=0), n_parts=4, l2=1e-3)
    >>> gd = gradient_descent(obj, lr=2.0, iters=5)
    >>> obj.rounds, gd[-1][1] < gd[0][1]
    (6, True)
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from simlib import _validate as check
from simlib.problems.logistic import sigmoid

History = list[tuple[int, float]]  # (rounds of communication so far, objective) after each iteration


def part_loss_grad(part: tuple[Any, np.ndarray], w: np.ndarray) -> tuple[float, np.ndarray]:
    """One partition's sums: sum_i log(1 + exp(-y_i x_i.w)) and its gradient -sum_i sigma(-y_i m_i) y_i x_i."""
    X, y = part
    m = y * (X @ w)
    return float(np.logaddexp(0.0, -m).sum()), X.T @ (-y * sigmoid(-m))


def part_hess_vec(part: tuple[Any, np.ndarray], w: np.ndarray, v: np.ndarray) -> np.ndarray:
    """One partition's Hessian-vector product: sum_i s_i (1 - s_i) (x_i.v) x_i, s_i = sigma(x_i.w)."""
    X, _ = part
    s = sigmoid(X @ w)
    return X.T @ (s * (1 - s) * (X @ v))


class Objective:
    """L(w) = mean log-loss + (l2 / 2) ||w||^2 over ``n_parts`` row partitions; every evaluation is one round."""

    def __init__(self, data: Any, n_parts: int, l2: float) -> None:
        check.positive_int("n_parts", n_parts, most=data.n_rows)
        check.positive("l2", l2)
        X = data.to_scipy().astype(np.float64)
        y = np.asarray(data.y, dtype=np.float64)
        self.parts = [(X[a:b], y[a:b]) for a, b in check.even_ranges(n_parts, data.n_rows, "rows")]
        self.n, self.d, self.l2, self.rounds = data.n_rows, data.n_features, float(l2), 0

    def loss_grad(self, w: np.ndarray) -> tuple[float, np.ndarray]:
        """L(w) and its gradient, the partitions' sums reduced (one round of d + 1 floats)."""
        self.rounds += 1
        sums = [part_loss_grad(p, w) for p in self.parts]
        loss = sum(s[0] for s in sums) / self.n + 0.5 * self.l2 * float(w @ w)
        return loss, sum(s[1] for s in sums) / self.n + self.l2 * w

    def hess_vec(self, w: np.ndarray, v: np.ndarray) -> np.ndarray:
        """H(w) v, the partitions' products reduced (one round of d floats)."""
        self.rounds += 1
        return sum(part_hess_vec(p, w, v) for p in self.parts) / self.n + self.l2 * v

    def hessian(self, w: np.ndarray) -> np.ndarray:
        """The d x d Hessian X^T D X / n + l2 I, the partitions' parts reduced (one round of d^2 floats)."""
        self.rounds += 1
        total = np.zeros((self.d, self.d))
        for X, _ in self.parts:
            s = sigmoid(X @ w)
            total += (X.T @ X.multiply((s * (1 - s))[:, None])).toarray()
        return total / self.n + self.l2 * np.eye(self.d)

    def value(self, w: np.ndarray) -> float:
        """L(w), evaluated to draw a curve: not part of any method, so no round is counted."""
        loss = sum(float(np.logaddexp(0.0, -y * (X @ w)).sum()) for X, y in self.parts)
        return loss / self.n + 0.5 * self.l2 * float(w @ w)


def gradient_descent(obj: Objective, lr: float, iters: int) -> History:
    """w <- w - lr * grad L(w): one round per iteration (the lectures' Spark loop)."""
    check.positive("lr", lr)
    check.positive_int("iters", iters)
    return _descend(obj, iters, lambda w, g: lr * g)


def _descend(obj: Objective, iters: int, step: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> History:
    """From w = 0, ``iters`` times w <- w - step(w, grad L(w)), the loss and gradient one round each."""
    w = np.zeros(obj.d)
    loss, g = obj.loss_grad(w)
    out = [(obj.rounds, loss)]
    for _ in range(iters):
        w = w - step(w, g)
        loss, g = obj.loss_grad(w)
        out.append((obj.rounds, loss))
    return out


def minibatch_sgd(obj: Objective, batch_size: int, lr: float, iters: int, eval_every: int, seed: int = 0) -> History:
    """Synchronous mini-batch SGD: each round every partition adds the gradient of ``batch_size`` of its rows
    (sampled with replacement), w <- w - lr * (mean of those gradients + l2 w); one round per step."""
    check.positive_int("batch_size", batch_size)
    check.positive("lr", lr)
    check.positive_int("iters", iters)
    check.positive_int("eval_every", eval_every)
    rng, w = np.random.default_rng(seed), np.zeros(obj.d)
    out = [(obj.rounds, obj.value(w))]
    for t in range(1, iters + 1):
        obj.rounds += 1
        picks = [(X[i], y[i]) for X, y in obj.parts for i in [rng.integers(0, X.shape[0], batch_size)]]
        g = sum(part_loss_grad(p, w)[1] for p in picks) / (batch_size * len(picks))
        w = w - lr * (g + obj.l2 * w)
        if t % eval_every == 0:
            out.append((obj.rounds, obj.value(w)))
    return out


def newton(obj: Objective, iters: int) -> History:
    """w <- w - H^-1 g with the explicit Hessian: two rounds per iteration, one of them d x d floats."""
    check.positive_int("iters", iters)
    return _descend(obj, iters, lambda w, g: np.linalg.solve(obj.hessian(w), g))


def newton_cg(obj: Objective, iters: int, cg_iters: int = 10, tol: float = 0.1) -> History:
    """w <- w - H^-1 g, H^-1 g by at most ``cg_iters`` Hessian-vector rounds (no d x d matrix is moved)."""
    from scipy.sparse.linalg import LinearOperator, cg

    check.positive_int("iters", iters)
    check.positive_int("cg_iters", cg_iters)

    def direction(w: np.ndarray, g: np.ndarray) -> np.ndarray:
        """H^-1 g by conjugate gradient, stopped once ||r|| < tol ||g||: one Hessian-vector round per iteration."""
        hess = LinearOperator((obj.d, obj.d), matvec=lambda v: obj.hess_vec(w, v), dtype=np.float64)
        return cg(hess, g, rtol=tol, maxiter=cg_iters)[0]
    return _descend(obj, iters, direction)


def lbfgs(obj: Objective, iters: int, memory: int = 10) -> History:
    """L-BFGS: a quasi-Newton direction from the last ``memory`` (s, y) pairs, kept on the driver;
    a backtracking (Armijo) line search, one loss-and-gradient round per trial."""
    check.positive_int("iters", iters)
    check.positive_int("memory", memory)
    w = np.zeros(obj.d)
    loss, g = obj.loss_grad(w)
    out, pairs = [(obj.rounds, loss)], []
    for _ in range(iters):
        q, alphas = g.copy(), []
        for s, y in reversed(pairs):  # the two-loop recursion: H^-1 g from the stored pairs
            a = float(s @ q) / float(y @ s)
            q, alphas = q - a * y, [a] + alphas
        gamma = float(pairs[-1][0] @ pairs[-1][1]) / float(pairs[-1][1] @ pairs[-1][1]) if pairs else 1.0
        r = gamma * q
        for (s, y), a in zip(pairs, alphas):
            r = r + s * (a - float(y @ r) / float(y @ s))
        step = 1.0
        while True:
            w_new = w - step * r
            loss_new, g_new = obj.loss_grad(w_new)
            if loss_new <= loss - 1e-4 * step * float(g @ r) or step < 1e-8:
                break
            step /= 2
        pairs = (pairs + [(w_new - w, g_new - g)])[-memory:]
        w, loss, g = w_new, loss_new, g_new
        out.append((obj.rounds, loss))
    return out


def rounds_to(history: History, target: float) -> int | None:
    """The rounds of communication after which the objective first reached ``target``; None if never."""
    return next((r for r, v in history if v <= target), None)

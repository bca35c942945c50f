"""Lasso by (parallel) stochastic coordinate descent: the model-parallel example (Shotgun).

The objective is

    F(x) = 1/2 ||A x - y||^2 + l1 ||x||_1.

Minimising over one coordinate j with the others fixed has a closed form: with the residual
r = A x - y, the gradient of the smooth part g_j = A_j . r and beta_j = ||A_j||^2,

    x_j <- S(x_j - g_j / beta_j, l1 / beta_j),    S(z, t) = sgn(z) max(|z| - t, 0).

Shotgun (Bradley et al., 2011) computes P such updates against the *same* x and applies them
together. Their interference is A_i . A_j: for nearly orthogonal columns the P steps barely
interact and a round does the work of P sequential steps; for strongly correlated columns each
step corrects the same direction, the corrections add up P-fold, and the objective stalls or
diverges. A :class:`CorrelationScheduler` avoids that by never putting two correlated columns in
one round. Columns are normalised (beta_j = 1) by the generators, as in the Shotgun analysis.

Example::

    >>> prob = make_lasso(n_rows=200, n_features=100, n_nonzero=10, seed=0)
    >>> run = shotgun(prob, random_schedule(prob.n_features, p=4, rounds=300, seed=0))
    >>> round(float(run.objective[0]), 2), round(float(run.objective[-1]), 4), round(reference_optimum(prob), 4)
    (25.94, 6.9389, 6.9389)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from simlib import _validate as check
from simlib.backend import array_module, device_copies, to_numpy


def soft_threshold(z: Any, t: Any) -> Any:
    """S(z, t) = sgn(z) max(|z| - t, 0), the proximal map of t |.|."""
    xp = array_module(z)
    return xp.sign(z) * xp.maximum(xp.abs(z) - t, 0.0)


@dataclass
class LassoProblem:
    """min_x 1/2 ||A x - y||^2 + l1 ||x||_1 with A stored column-major as ``At = A.T`` (d x n)."""

    At: Any  # (n_features, n_rows): row j is column A_j, so a round gathers P contiguous rows
    y: Any
    l1: float
    x_true: np.ndarray | None = None
    beta: Any = field(init=False)

    def __post_init__(self) -> None:
        check.non_negative("l1", self.l1)
        if self.At.ndim != 2 or self.y.ndim != 1 or self.At.shape[1] != self.y.shape[0]:
            raise ValueError(f"At must be (n_features, n_rows) and y (n_rows,); got {self.At.shape} and {self.y.shape}")
        xp = array_module(self.At)
        self.beta = xp.einsum("ij,ij->i", self.At, self.At)
        if bool(xp.any(self.beta == 0)):
            raise ValueError("At has an all-zero column; drop it (its coordinate never moves)")

    @property
    def n_features(self) -> int:
        """d, the number of coordinates."""
        return int(self.At.shape[0])

    @property
    def n_rows(self) -> int:
        """n, the number of observations."""
        return int(self.At.shape[1])

    def residual(self, x: Any) -> Any:
        """r = A x - y."""
        return x @ self.At - self.y

    def objective(self, x: Any, r: Any = None) -> float:
        """F(x) = 1/2 ||r||^2 + l1 ||x||_1 (pass r = A x - y to skip the product)."""
        xp = array_module(x)
        r = self.residual(x) if r is None else r
        return float(0.5 * xp.dot(r, r) + self.l1 * xp.sum(xp.abs(x)))

    def deltas(self, x: Any, r: Any, coords: Any) -> Any:
        """delta_j = S(x_j - A_j . r / beta_j, l1 / beta_j) - x_j for each j in ``coords``."""
        b = self.beta[coords]
        xj = x[coords]
        return soft_threshold(xj - (self.At[coords] @ r) / b, self.l1 / b) - xj

    def correlation(self) -> np.ndarray:
        """|A_i . A_j| / (||A_i|| ||A_j||), the interference between two coordinates (d x d)."""
        At = to_numpy(self.At)
        norms = np.sqrt(to_numpy(self.beta))
        return np.abs(At @ At.T) / np.outer(norms, norms)

    def spectral_radius(self) -> float:
        """rho = largest eigenvalue of A^T A (normalised columns): Shotgun is safe for P < d / rho."""
        At, beta = to_numpy(self.At), to_numpy(self.beta)
        return float(np.linalg.eigvalsh((At @ At.T) / np.sqrt(np.outer(beta, beta)))[-1])


def make_lasso(n_rows: int = 1_000, n_features: int = 512, n_nonzero: int = 20, n_correlated: int = 0,
               correlation: float = 0.0, noise: float = 0.1, l1_ratio: float = 0.1, seed: int = 0) -> LassoProblem:
    """A designed Lasso problem: Gaussian features, a sparse truth x*, y = A x* + noise.

    The first ``n_correlated`` columns share one latent factor z, A_j = sqrt(c) z + sqrt(1 - c) e_j,
    so any two of them have corr ~= c = ``correlation``; the other columns are independent
    (|corr| ~ 1 / sqrt(n_rows)). Columns are scaled to unit norm; l1 = l1_ratio * l1_max.
    """
    for name, count in (("n_rows", n_rows), ("n_features", n_features), ("n_nonzero", n_nonzero)):
        check.positive_int(name, count)
    check.non_negative_int("n_correlated", n_correlated)
    check.probability("correlation", correlation)
    check.non_negative("noise", noise)
    check.positive("l1_ratio", l1_ratio)
    for name, n in (("n_nonzero", n_nonzero), ("n_correlated", n_correlated)):
        if n > n_features:
            raise ValueError(f"{name} ({n}) must be <= n_features ({n_features})")
    rng = np.random.default_rng(seed)
    At = rng.standard_normal((n_features, n_rows))
    At[:n_correlated] = np.sqrt(correlation) * rng.standard_normal(n_rows) + np.sqrt(1.0 - correlation) * At[:n_correlated]
    At /= np.linalg.norm(At, axis=1, keepdims=True)
    x_true = np.zeros(n_features)
    support = rng.choice(n_features, n_nonzero, replace=False)
    x_true[support] = rng.choice([-1.0, 1.0], n_nonzero) * rng.uniform(1.0, 3.0, n_nonzero)
    y = x_true @ At + noise * rng.standard_normal(n_rows)
    # l1_max = max_j |A_j . y| is the smallest l1 for which x = 0 is optimal
    return LassoProblem(At, y, l1_ratio * float(np.max(np.abs(At @ y))), x_true=x_true)


def make_uncorrelated_lasso(n_features: int = 512, seed: int = 0, **kw: Any) -> LassoProblem:
    """Independent Gaussian features (|corr| ~ 1 / sqrt(n_rows)): Shotgun's good case."""
    return make_lasso(n_features=n_features, seed=seed, **kw)


def make_correlated_lasso(n_features: int = 512, n_correlated: int = 256, correlation: float = 0.95, seed: int = 0,
                          **kw: Any) -> LassoProblem:
    """Half the features strongly correlated with each other (corr ~ 0.95): Shotgun's bad case."""
    return make_lasso(n_features=n_features, n_correlated=n_correlated, correlation=correlation, seed=seed, **kw)


# -- schedules: which coordinates each round updates ---------------------------------------------
def random_schedule(n_features: int, p: int, rounds: int, seed: int = 0) -> np.ndarray:
    """(rounds, p) coordinates, p distinct ones per round, uniformly at random (plain Shotgun)."""
    for name, count in (("n_features", n_features), ("p", p), ("rounds", rounds)):
        check.positive_int(name, count)
    if p > n_features:
        raise ValueError(f"p ({p}) must be <= n_features ({n_features})")
    rng = np.random.default_rng(seed)
    if p == n_features:
        return np.tile(np.arange(p, dtype=np.int64), (rounds, 1))
    # The p smallest of n_features random keys per row are p distinct uniform ids, for all rounds
    # in one vectorised call (replaces a loop of rounds x rng.choice(replace=False)).
    return np.argpartition(rng.random((rounds, n_features)), p - 1, axis=1)[:, :p].astype(np.int64)


class CorrelationScheduler:
    """Picks nearly independent coordinates: at most one per block of correlated features.

    Blocks are the connected components of the graph joining i and j when
    |corr(A_i, A_j)| > ``threshold``. A round draws min(p, blocks) distinct blocks, with
    probability proportional to their sizes, and one coordinate uniformly within each (p = 1 is
    then uniform over coordinates); a round short of p is padded with -1.
    """

    def __init__(self, problem: LassoProblem, threshold: float = 0.5):
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import connected_components

        check.probability("threshold", threshold)
        self.threshold = float(threshold)
        self.n_blocks, self.block = connected_components(csr_matrix(problem.correlation() > threshold), directed=False)
        self.sizes = np.bincount(self.block, minlength=self.n_blocks)
        self._members = np.argsort(self.block, kind="stable")  # coordinates grouped by block
        self._starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])

    def schedule(self, p: int, rounds: int, seed: int = 0) -> np.ndarray:
        """(rounds, p) coordinates from distinct blocks; -1 where fewer than p blocks exist."""
        check.positive_int("p", p)
        check.positive_int("rounds", rounds)
        rng = np.random.default_rng(seed)
        take = min(p, self.n_blocks)
        # Size-weighted sampling without replacement: the `take` smallest of Exp(1) / size.
        keys = rng.exponential(size=(rounds, self.n_blocks)) / self.sizes
        blocks = np.argpartition(keys, take - 1, axis=1)[:, :take] if take < self.n_blocks else np.tile(np.arange(take), (rounds, 1))
        offset = (rng.random((rounds, take)) * self.sizes[blocks]).astype(np.int64)
        out = np.full((rounds, p), -1, dtype=np.int64)
        out[:, :take] = self._members[self._starts[blocks] + offset]
        return out


# -- the algorithm, serially (the reference the substrates must match) ---------------------------
@dataclass
class ShotgunRun:
    """Objective after every ``record_every`` rounds (entry 0 = start), the final x, divergence flag."""

    rounds: np.ndarray
    objective: np.ndarray
    x: np.ndarray
    diverged: bool

    def rounds_to(self, target: float) -> int | None:
        """First recorded round with F(x) <= target; None if never."""
        hit = np.flatnonzero(self.objective <= target)
        return int(self.rounds[hit[0]]) if len(hit) else None


def check_schedule(schedule: Any, n_features: int) -> np.ndarray:
    """``schedule`` as an int64 (rounds, P) array of ids in [0, n_features) or -1 (an empty slot)."""
    schedule = np.asarray(schedule)
    if schedule.ndim != 2 or schedule.shape[0] < 1 or schedule.shape[1] < 1:
        raise ValueError(f"schedule must be a (rounds, P) array of coordinate ids, got shape {schedule.shape}")
    if schedule.dtype.kind not in "iu":
        raise ValueError(f"schedule must hold integer coordinate ids, got dtype {schedule.dtype}")
    if schedule.max() >= n_features or schedule.min() < -1:
        raise ValueError(f"schedule ids must lie in [0, n_features={n_features}) or be -1")
    return schedule.astype(np.int64)


def shotgun_round(problem: LassoProblem, x: Any, r: Any, coords: Any) -> None:
    """One Shotgun round in place: all deltas from the same (x, r), then x_J += d, r += A_J d."""
    coords = coords[coords >= 0]
    d = problem.deltas(x, r, coords)
    x[coords] += d
    r += d @ problem.At[coords]


def shotgun(problem: LassoProblem, schedule: np.ndarray, record_every: int = 1, blowup: float = 1e6, x0: Any = None,
            stop_below: float | None = None, before_round: Callable[[int], None] | None = None) -> ShotgunRun:
    """Run the rounds of ``schedule`` serially; stop early once F exceeds ``blowup`` x F(start).

    With ``stop_below``, also stop at the first recorded F <= stop_below: ``rounds_to(stop_below)``
    is then the same as for the whole schedule, without the rounds after it. ``before_round(t)`` is
    called before each round t (a simulated clock prices it there: :mod:`simlib.course.shotgun_twin`).
    """
    check.positive_int("record_every", record_every)
    if stop_below is not None and not np.isfinite(stop_below):
        raise ValueError(f"stop_below must be a finite objective value or None, got {stop_below!r}")
    schedule = check_schedule(schedule, problem.n_features)
    xp = array_module(problem.At)
    x = xp.zeros(problem.n_features) if x0 is None else xp.array(x0, dtype=np.float64)
    r = problem.residual(x)
    f0 = problem.objective(x, r)
    rounds, values = [0], [f0]
    diverged = False
    for t in range(len(schedule)):
        if before_round is not None:
            before_round(t)
        shotgun_round(problem, x, r, xp.asarray(schedule[t]))
        if (t + 1) % record_every == 0 or t + 1 == len(schedule):
            f = problem.objective(x, r)
            rounds.append(t + 1)
            values.append(f)
            diverged = not np.isfinite(f) or f > blowup * f0
            if diverged or (stop_below is not None and f <= stop_below):
                break
    return ShotgunRun(np.array(rounds), np.array(values), to_numpy(x), diverged)


class ShotgunProblem:
    """Shotgun on the parameter-server contract: the table is x, round t's coordinates come from a schedule.

    Worker w of N owns the slots w, w + N, ... of every round (as :mod:`simlib.course.shotgun_twin`
    deals them), so one clock of all workers updates the P coordinates of one round. A coordinate
    step needs A_j . r with r = A x - y, which depends on all of x, so every pull reads the whole
    table: n_features values (8 bytes each on the real substrates, ``value_bytes`` in the
    simulator) per worker per round, and the worker rebuilds r from them (n_rows x nnz(x) work,
    which :meth:`work` does not charge: a long-lived worker would keep r up to date with the
    other workers' deltas instead). Pushes carry only the worker's slots. ``lr`` and
    ``batch_size`` are unused: an exact coordinate minimisation has no step size, and the
    schedule fixes P.
    """

    metric = "objective"
    lower_is_better = True
    linear_step = False  # a coordinate minimisation does not scale with a step size

    def __init__(self, lasso: LassoProblem, schedule: np.ndarray):
        self.lasso, self.schedule = lasso, check_schedule(schedule, lasso.n_features)
        self.n_params = lasso.n_features
        self._all = np.arange(lasso.n_features, dtype=np.int64)

    def init_params(self) -> np.ndarray:
        """x = 0."""
        return np.zeros(self.n_params)

    def shards(self, n_workers: int) -> list[tuple[int, int]]:
        """(worker, N): worker w owns slots w, w + N, ... of every round."""
        check.positive_int("n_workers", n_workers)
        if n_workers > self.schedule.shape[1]:
            raise ValueError(f"n_workers ({n_workers}) must be <= P ({self.schedule.shape[1]}), the slots per round")
        return [(w, n_workers) for w in range(n_workers)]

    def batch(self, shard: tuple[int, int], step: int, batch_size: int) -> np.ndarray:
        """The worker's live coordinates in round ``step`` (cycling through the schedule), sorted."""
        w, n = shard
        row = self.schedule[step % len(self.schedule), w::n]
        return np.sort(row[row >= 0])

    def keys(self, batch: np.ndarray) -> np.ndarray:
        """All of x: the residual a coordinate step needs depends on every coordinate."""
        return self._all

    def step(self, values: np.ndarray, batch: np.ndarray, keys: np.ndarray, lr: float) -> tuple[np.ndarray, np.ndarray]:
        """(coords, delta): the exact coordinate minimisations from the x read, r = A x - y rebuilt from it."""
        xp = array_module(values)
        lasso = self._on(xp)
        return batch, lasso.deltas(values, lasso.residual(values), xp.asarray(batch))

    def quality(self, x: np.ndarray) -> float:
        """F(x) = 1/2 ||A x - y||^2 + l1 ||x||_1."""
        return self._on(array_module(x)).objective(x)

    def _on(self, xp: Any) -> LassoProblem:
        """The Lasso with its data on array module ``xp`` (the gpu substrate's table may be CuPy's): copied once."""
        if array_module(self.lasso.At) is xp:
            return self.lasso
        return device_copies(self, xp, lambda m: LassoProblem(m.asarray(to_numpy(self.lasso.At)),
                                                              m.asarray(to_numpy(self.lasso.y)), self.lasso.l1))

    def work(self, batch: np.ndarray) -> int:
        """n_rows per coordinate updated: the dot product A_j . r."""
        return len(batch) * self.lasso.n_rows


def reference_optimum(problem: LassoProblem) -> float:
    """F* from scikit-learn's Lasso (a trusted peer): its alpha is l1 / n_rows, no intercept."""
    from sklearn.linear_model import Lasso

    A, y = to_numpy(problem.At).T, to_numpy(problem.y)
    # NOTE: precompute=True (the Gram matrix, d x d) gives the same F* to every printed digit on the
    # lessons' 1,000 x 512 problems, 2.5-5x faster than iterating over the rows.
    model = Lasso(alpha=problem.l1 / problem.n_rows, fit_intercept=False, tol=1e-12, max_iter=100_000, precompute=True)
    return problem.objective(model.fit(A, y).coef_.astype(np.float64))

"""A multi-layer perceptron on the parameter-server contract: the course's first deep network.

Layers l = 1 .. L map a_{l-1} to z_l = a_{l-1} W_l + b_l, with a_l = relu(z_l) between layers and a
softmax on z_L. The objective of a mini-batch B is the mean cross-entropy

    L(theta) = -(1/|B|) sum_{i in B} log softmax(z_L(x_i))_{y_i}.

The table is one flat float64 vector theta = [W_1 (row-major), b_1, W_2, b_2, ...]; the model is dense,
so every step reads and writes every key. Forward and backward are written per layer in array-module
code (NumPy here, CuPy on the gpu substrate: ``xp`` comes from the parameters), and
:meth:`MLPProblem.backward_layers` hands each layer's gradient out as soon as the backward pass has
made it, last layer first: what a bucketed all-reduce overlaps with the rest of the backward pass.

Example::

    >>> import simlib
    >>> prob = MLPProblem()  # scikit-learn's digits, one hidden layer of 32
    >>> prob.n_params, prob.sizes
    (2410, (64, 32, 10))
    >>> res = simlib.run(prob, "bsp", substrate="sim", n_workers=2, steps=150, batch_size=32, lr=0.3)
    >>> prob.accuracy(prob.init_params()) < 0.2 < 0.9 < prob.accuracy(res.params)
    True
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from simlib import _validate as check
from simlib.backend import array_module, device_copies


@dataclass
class DenseDataset:
    """Rows ``X`` (n_rows x n_features, float64) with class labels ``y`` in [0, n_classes)."""

    X: np.ndarray
    y: np.ndarray
    n_classes: int

    def __post_init__(self) -> None:
        if isinstance(self.X, (np.ndarray, list)):  # lists are converted; the layers need a float64 matrix
            self.X = np.ascontiguousarray(self.X, dtype=np.float64)
        if isinstance(self.y, list):
            self.y = np.asarray(self.y)
        self.validate()

    @property
    def n_rows(self) -> int:
        """Number of examples."""
        return int(self.X.shape[0])

    def validate(self) -> None:
        """Check shapes, labels and finiteness; raise ValueError naming the field."""
        if not isinstance(self.X, np.ndarray) or self.X.ndim != 2 or 0 in self.X.shape:
            raise ValueError(f"X must be a non-empty 2-D array (n_rows x n_features), got "
                             f"{getattr(self.X, 'shape', type(self.X).__name__)}")
        if not np.all(np.isfinite(self.X)):
            raise ValueError("X must be finite (found NaN or inf)")
        check.positive_int("n_classes", self.n_classes)
        if self.n_classes < 2:
            raise ValueError(f"n_classes must be an integer >= 2, got {self.n_classes}")
        if not isinstance(self.y, np.ndarray) or self.y.ndim != 1 or self.y.dtype.kind not in "iu":
            raise ValueError("y must be a 1-D array of integer labels")
        if len(self.y) != self.n_rows:
            raise ValueError(f"y must have one label per row of X ({self.n_rows}), got {len(self.y)}")
        if self.y.min() < 0 or self.y.max() >= self.n_classes:
            raise ValueError(f"y must hold labels in [0, n_classes={self.n_classes})")


def digits_dataset() -> DenseDataset:
    """scikit-learn's 1,797 handwritten digits (8 x 8 pixels, 10 classes), pixels scaled from [0, 16] to [0, 1]."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return DenseDataset(d.data / 16.0, d.target.astype(np.int64), 10)


def make_dense_classification(n_rows: int = 20_000, n_features: int = 64, n_classes: int = 10,
                              seed: int = 0) -> DenseDataset:
    """Classes made of two Gaussian clusters each on a hypercube's vertices (scikit-learn's make_classification):
    not linearly separable, so hidden layers pay."""
    from sklearn.datasets import make_classification

    for name, value in (("n_rows", n_rows), ("n_features", n_features), ("n_classes", n_classes)):
        check.positive_int(name, value)
    check.non_negative_int("seed", seed)
    if n_classes < 2:
        raise ValueError(f"n_classes must be an integer >= 2, got {n_classes}")
    if 2 * n_classes > 2 ** min(n_features, 62):  # two clusters per class, each on its own vertex
        raise ValueError(f"n_features must be >= log2(2 * n_classes) = {np.log2(2 * n_classes):.3g} "
                         f"(a vertex of the hypercube per cluster), got {n_features}")
    check.fits_memory("n_rows", n_rows, 8.0 * n_rows * n_features, 8.0 * n_features, "the float64 rows")
    X, y = make_classification(n_samples=n_rows, n_features=n_features, n_informative=n_features, n_redundant=0,
                               n_classes=n_classes, n_clusters_per_class=2, random_state=seed)
    return DenseDataset(X, y.astype(np.int64), n_classes)


def dense_forward(a: Any, W: Any, b: Any) -> Any:
    """z = a W + b."""
    return a @ W + b


def dense_backward(a: Any, W: Any, dz: Any, inputs: bool = True) -> tuple[Any, Any, Any]:
    """(dW, db, da) = (a^T dz, sum over rows of dz, dz W^T); da is None when ``inputs`` is False (the first layer)."""
    return a.T @ dz, dz.sum(axis=0), dz @ W.T if inputs else None


def relu(z: Any) -> Any:
    """relu(z) = max(z, 0)."""
    return array_module(z).maximum(z, 0.0)


def relu_backward(z: Any, da: Any) -> Any:
    """dz = da * [z > 0]."""
    return da * (z > 0)


def log_softmax(z: Any) -> Any:
    """log softmax(z) per row, z - max - log sum exp(z - max) (no overflow)."""
    xp = array_module(z)
    shifted = z - z.max(axis=1, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))


def cross_entropy(z: Any, y: Any) -> Any:
    """Mean over rows of -log softmax(z)_y."""
    xp = array_module(z)
    return -log_softmax(z)[xp.arange(len(y)), y].mean()


def cross_entropy_backward(z: Any, y: Any) -> Any:
    """dL/dz of the mean cross-entropy: (softmax(z) - onehot(y)) / n_rows."""
    xp = array_module(z)
    dz = xp.exp(log_softmax(z))
    dz[xp.arange(len(y)), y] -= 1.0
    return dz / len(y)


def layers_forward(weights: Sequence[tuple[Any, Any]], a: Any, relu_out: bool = False) -> tuple[list, list, Any]:
    """(inputs, z, out): z_i = inputs_i W_i + b_i, inputs_{i+1} = relu(z_i); out = relu(z_last) if ``relu_out``,
    else z_last."""
    inputs, zs = [], []
    for i, (W, b) in enumerate(weights):
        inputs.append(a)
        zs.append(dense_forward(a, W, b))
        a = relu(zs[-1]) if relu_out or i < len(weights) - 1 else zs[-1]
    return inputs, zs, a


def layers_backward(weights: Sequence[tuple[Any, Any]], inputs: list, zs: list, d_out: Any, relu_out: bool = False,
                    input_grad: bool = False) -> Iterator[tuple[int, Any, Any, Any]]:
    """(i, dW_i, db_i, dL/d inputs_i) from the last layer to the first, each as soon as the backward pass has it,
    from dL/d out of :func:`layers_forward`; dL/d inputs_0 is None unless ``input_grad``."""
    dz = relu_backward(zs[-1], d_out) if relu_out else d_out
    for i in reversed(range(len(weights))):
        dW, db, da = dense_backward(inputs[i], weights[i][0], dz, inputs=i > 0 or input_grad)
        yield i, dW, db, da
        if i:
            dz = relu_backward(zs[i - 1], da)


class MLPProblem:
    """A ReLU multi-layer perceptron with a softmax output, trained by SGD on the contract.

    ``data`` (a :class:`DenseDataset`; scikit-learn's digits by default, :func:`make_dense_classification`
    for a larger synthetic set) is shuffled with ``seed``; ``eval_fraction`` of its rows are held out, and
    :meth:`quality` is the mean cross-entropy on them (lower is better), :meth:`accuracy` the share of them
    classified right. ``hidden`` lists the hidden layers' widths. Workers get contiguous shards of the
    training rows and cycle through them in order; every step reads and writes all ``n_params`` keys.
    """

    metric = "loss"
    lower_is_better = True

    def __init__(self, data: DenseDataset | None = None, hidden: Sequence[int] = (32,), eval_fraction: float = 0.2,
                 seed: int = 0):
        if not isinstance(hidden, (tuple, list)):
            raise ValueError(f"hidden must be a tuple of layer widths, got {type(hidden).__name__}")
        for width in hidden:
            check.positive_int("hidden", width)
        check.probability("eval_fraction", eval_fraction)
        check.non_negative_int("seed", seed)
        # (named before the digits load: scikit-learn's import took 4 s of a refusal on a busy machine)
        data = digits_dataset() if data is None else data
        if not isinstance(data, DenseDataset):
            raise ValueError(f"data must be a DenseDataset (or None for digits), got {type(data).__name__}")
        n_eval = int(round(eval_fraction * data.n_rows))
        if not 1 <= n_eval < data.n_rows:
            raise ValueError(f"eval_fraction must leave at least one row held out and one to train on "
                             f"({data.n_rows} rows), got {eval_fraction}")
        self.data, self.hidden, self.seed = data, tuple(int(h) for h in hidden), seed
        self.sizes = (data.X.shape[1], *self.hidden, data.n_classes)
        pairs = list(zip(self.sizes, self.sizes[1:]))  # each layer's (n_in, n_out)
        # each layer's W (n_in x n_out, row-major) and b, together in the flat vector: the unit of backward_layers
        ends = np.cumsum([n_in * n_out + n_out for n_in, n_out in pairs]).tolist()
        self.layers = [slice(a, b) for a, b in zip([0, *ends], ends)]
        self.n_params, self._macs = ends[-1], sum(a * b for a, b in pairs)
        per_copy = 8.0 * self.n_params
        if per_copy * 8 > check.available_memory() / 2:  # the table, its gradient, workers' copies: a few of each
            raise ValueError(f"hidden: layers {self.sizes} make {self.n_params} parameters "
                             f"({check.gb(per_copy)} each copy), more than this machine's memory holds; "
                             "use narrower layers")
        order = np.random.default_rng(seed).permutation(data.n_rows)
        held, train = order[:n_eval], order[n_eval:]
        self._train = (np.ascontiguousarray(data.X[train]), data.y[train].astype(np.int64))
        self._eval = (np.ascontiguousarray(data.X[held]), data.y[held].astype(np.int64))
        self._all = np.arange(self.n_params, dtype=np.int64)
        self._all.setflags(write=False)  # shared by every step's keys

    def weights(self, params: Any, layer: int) -> tuple[Any, Any]:
        """(W, b) of layer ``layer`` (0-based) as views of the flat vector."""
        sl, n_in, n_out = self.layers[layer], self.sizes[layer], self.sizes[layer + 1]
        flat = params[sl]
        return flat[: n_in * n_out].reshape(n_in, n_out), flat[n_in * n_out:]

    def init_params(self, xp: Any = np) -> Any:
        """He initialisation, W_l ~ N(0, 2 / n_in), b_l = 0, drawn from ``seed`` (the same every call)."""
        rng = np.random.default_rng(self.seed)
        w = np.zeros(self.n_params)
        for layer in range(len(self.layers)):
            W, _ = self.weights(w, layer)
            W[:] = rng.normal(0.0, np.sqrt(2.0 / W.shape[0]), size=W.shape)
        return xp.asarray(w)

    def shards(self, n_workers: int) -> list[tuple[int, int]]:
        """Ranges [start, stop) of the training rows, one contiguous near-equal part per worker."""
        return check.even_ranges(n_workers, len(self._train[1]), "training rows")

    def epoch_steps(self, n_workers: int, batch_size: int) -> int:
        """Steps per worker for one pass over the training rows: ceil(largest shard / batch_size)."""
        return -(-max(b - a for a, b in self.shards(n_workers)) // batch_size)

    def batch(self, shard: tuple[int, int], step: int, batch_size: int) -> np.ndarray:
        """Training-row ids of mini-batch number ``step`` of a shard (cycling through it in order)."""
        start, stop = shard
        return start + (np.arange(batch_size) + step * batch_size) % (stop - start)

    def keys(self, batch: np.ndarray) -> np.ndarray:
        """Every parameter: the model is dense (read-only, shared by all steps)."""
        return self._all

    def work(self, batch: np.ndarray) -> int:
        """Multiply-adds of a step: |B| sum_l n_in n_out forward, twice that backward."""
        return 3 * len(batch) * self._macs

    def _on(self, xp: Any) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
        """(train, eval) rows and labels on array module ``xp``: copied to a device once."""
        if xp is np:
            return self._train, self._eval
        return device_copies(self, xp, lambda m: tuple((m.asarray(X), m.asarray(y)) for X, y in (self._train,
                                                                                                 self._eval)))

    def rows(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(X, y) of training rows ``batch`` (NumPy): what a pipeline's first stage reads and its last stage scores."""
        X, y = self._train
        return X[batch], y[batch]

    def forward(self, params: Any, X: Any) -> tuple[list[Any], list[Any], Any]:
        """(a, z, logits): a[0] = X, z[l] = a[l] W_l + b_l, a[l + 1] = relu(z[l]); the logits are z[-1]."""
        return layers_forward([self.weights(params, layer) for layer in range(len(self.layers))], X)

    def batch_loss(self, params: Any, batch: np.ndarray) -> float:
        """L(theta): the batch's mean cross-entropy, whose gradient :meth:`backward_layers` gives."""
        xp = array_module(params)
        X, y = self._on(xp)[0]
        rows = xp.asarray(batch)
        return float(cross_entropy(self.forward(params, X[rows])[2], y[rows]))

    def backward_layers(self, params: Any, batch: np.ndarray) -> Iterator[tuple[slice, Any]]:
        """(layer's slice of the flat vector, dL/dtheta on it) for the last layer to the first, L the batch's
        mean cross-entropy: each is yielded as soon as the backward pass has it (a bucket may go out then)."""
        xp = array_module(params)
        X, y = self._on(xp)[0]
        rows = xp.asarray(batch)
        weights = [self.weights(params, layer) for layer in range(len(self.layers))]
        a, z, logits = layers_forward(weights, X[rows])
        for layer, dW, db, _ in layers_backward(weights, a, z, cross_entropy_backward(logits, y[rows])):
            yield self.layers[layer], xp.concatenate([dW.ravel(), db])

    def gradient(self, params: Any, batch: np.ndarray) -> Any:
        """dL/dtheta over the whole flat vector, assembled from :meth:`backward_layers`."""
        g = array_module(params).empty_like(params)
        for sl, grad in self.backward_layers(params, batch):
            g[sl] = grad
        return g

    def step(self, values: Any, batch: np.ndarray, keys: np.ndarray, lr: float) -> tuple[np.ndarray, Any]:
        """(keys, -lr * dL/dtheta): plain SGD on the values read (all of theta)."""
        return keys, -lr * self.gradient(values, batch)

    def quality(self, params: Any) -> float:
        """Mean cross-entropy of the held-out rows."""
        X, y = self._on(array_module(params))[1]
        with np.errstate(over="ignore", invalid="ignore"):  # a diverged theta: a loss not finite, named by the run
            return float(cross_entropy(self.forward(params, X)[2], y))

    def accuracy(self, params: Any) -> float:
        """Share of held-out rows whose largest logit is their label."""
        X, y = self._on(array_module(params))[1]
        return float((self.forward(params, X)[2].argmax(axis=1) == y).mean())

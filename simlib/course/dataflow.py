"""TensorFlow's programming model in miniature: a graph of operations on tensors, gradients derived from it.

A :class:`Graph` holds **placeholders** (fed with data at run time), **variables** (persistent tensors the
training changes), constants, and **operations** on them. Nothing is computed while the graph is built;
:meth:`Graph.run` evaluates what a fetch needs from a feed, and :meth:`Graph.gradients` derives the
gradient of a scalar with respect to variables by reverse mode over the same graph (each operation
knows its vector-Jacobian product). (Graph.ops) turns the graph into ``costs.Op`` rows for the
placer of ``simlib.costs``. Example::

    >>> g = Graph()
    >>> x, w = g.placeholder("x"), g.variable("w", np.array([[2.0], [1.0]]))
    >>> loss = g.mean(g.mul(g.matmul(x, w), g.matmul(x, w)))
    >>> feed = {x: np.array([[1.0, 0.0], [0.0, 3.0]])}
    >>> float(g.run(loss, feed)), g.gradients(loss, [w], feed)[0].ravel().tolist()
    (6.5, [2.0, 9.0])
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simlib.backend import one_blas_thread

# kind -> (forward, vector-Jacobian product: (grad of output, output, inputs) -> grads of inputs)
_RULES: dict[str, tuple[Any, Any]] = {
    "matmul": (lambda a, b: a @ b, lambda g, out, a, b: (g @ b.T, a.T @ g)),
    "add": (lambda a, b: a + b, lambda g, out, a, b: (g, g)),
    "mul": (lambda a, b: a * b, lambda g, out, a, b: (g * b, g * a)),
    "tanh": (np.tanh, lambda g, out, a: (g * (1 - out * out),)),
    "softplus": (lambda a: np.logaddexp(0.0, a), lambda g, out, a: (g * np.exp(-np.logaddexp(0.0, -a)),)),
    "mean": (lambda a: np.asarray(a.mean()), lambda g, out, a: (np.full(a.shape, g / a.size),)),
}


@dataclass(eq=False)
class Node:
    """One vertex of the graph: a placeholder, variable or constant (``value``), or an operation on ``inputs``."""

    kind: str
    name: str
    inputs: tuple["Node", ...] = ()
    value: Any = None


def _unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``g`` over the axes NumPy broadcast, so it has the input's ``shape`` again."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    if not shape:
        return g.sum()
    return g.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1), keepdims=True)


class Graph:
    """Operations are recorded, not run; :meth:`run` and :meth:`gradients` evaluate them for a feed."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def _add(self, kind: str, name: str, inputs: tuple[Node, ...] = (), value: Any = None) -> Node:
        self.nodes.append(Node(kind, name or f"{kind}_{len(self.nodes)}", inputs, value))
        return self.nodes[-1]

    def placeholder(self, name: str) -> Node:
        """A tensor fed at run time (the data)."""
        return self._add("placeholder", name)

    def variable(self, name: str, value: np.ndarray) -> Node:
        """A persistent, mutable tensor (the parameters)."""
        return self._add("variable", name, value=np.asarray(value, dtype=np.float64))

    def constant(self, value: Any, name: str = "") -> Node:
        """A fixed tensor."""
        return self._add("constant", name, value=np.asarray(value, dtype=np.float64))

    def __getattr__(self, kind: str) -> Any:
        if kind not in _RULES:
            raise AttributeError(f"no operation {kind!r}; operations: {sorted(_RULES)}")
        return lambda *inputs, name="": self._add(kind, name, tuple(inputs))

    def _forward(self, fetch: Node, feed: dict[Node, Any]) -> dict[Node, np.ndarray]:
        """Values of ``fetch`` and of every node it depends on, and only those (nodes are kept in build order)."""
        needed, stack = set(), [fetch]
        while stack:
            n = stack.pop()
            if n not in needed:
                needed.add(n)
                stack.extend(n.inputs)
        vals: dict[Node, np.ndarray] = {}
        for n in (m for m in self.nodes if m in needed):
            if n.kind == "placeholder":
                if n not in feed:
                    raise ValueError(f"feed: placeholder {n.name!r} has no value")
                vals[n] = np.asarray(feed[n], dtype=np.float64)
            else:
                vals[n] = n.value if n.value is not None else _RULES[n.kind][0](*(vals[i] for i in n.inputs))
        return vals

    def run(self, fetch: Node, feed: dict[Node, Any]) -> np.ndarray:
        """Evaluate ``fetch`` for ``feed`` (placeholder -> array), computing only what it needs."""
        with one_blas_thread():  # small products: see one_blas_thread
            return self._forward(fetch, feed)[fetch]

    def gradients(self, loss: Node, wrt: list[Node], feed: dict[Node, Any]) -> list[np.ndarray | None]:
        """d loss / d x for each x in ``wrt`` (None where loss does not depend on x, as in TensorFlow): one forward
        pass, then the VJPs in reverse build order."""
        with one_blas_thread():  # small products: see one_blas_thread
            return self._backward(loss, wrt, self._forward(loss, feed))

    def _backward(self, loss: Node, wrt: list[Node], vals: dict[Node, np.ndarray]) -> list[np.ndarray | None]:
        """Reverse mode from ``loss`` over the evaluated nodes ``vals``."""
        grads: dict[Node, np.ndarray] = {loss: np.ones_like(vals[loss])}
        for n in reversed([m for m in self.nodes if m in vals and m.inputs]):
            if n in grads:
                for i, gi in zip(n.inputs, _RULES[n.kind][1](grads[n], vals[n], *(vals[i] for i in n.inputs))):
                    gi = _unbroadcast(gi, vals[i].shape)
                    grads[i] = grads[i] + gi if i in grads else gi
        return [grads.get(x) for x in wrt]

    def ops(self, fetch: Node, feed: dict[Node, Any]) -> list[Any]:
        """The graph as ``costs.Op`` rows for a training step: work in flops (a product 2mkn, else one per
        element), tripled for the backward pass; each output's bytes doubled (its gradient comes back)."""
        from simlib.costs import Op

        vals, rows = self._forward(fetch, feed), []
        for n in self.nodes:
            if n in vals:
                ins = [vals[i] for i in n.inputs]
                flops = 2 * ins[0].shape[0] * ins[0].shape[1] * ins[1].shape[1] if n.kind == "matmul" else vals[n].size
                rows.append(Op(n.name, 3.0 * flops if n.inputs else 0.0, tuple(i.name for i in n.inputs),
                               2.0 * vals[n].nbytes))
        return rows

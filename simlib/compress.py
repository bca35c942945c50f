"""Gradient compression: what a worker puts on the wire, what the receiver decodes, and its exact size.

A compressor belongs to one worker (it may keep state, such as an error-feedback residual) and
is called on each message::

    keys_out, values_out, nbytes = comp(keys, values)

``keys`` are sorted unique parameter ids, ``values`` the update on them. ``values_out`` is what
the receiver decodes and applies at ``keys_out`` (a subset of the keys, or, for compressors with
error feedback, keys carried over from earlier messages), and ``nbytes`` is the exact encoded
size. The message is *dense* when its keys are all of ``0 .. n`` - 1 (``n = n_params``); then no
indices are sent. A sparse message names its k entries by a list of key ids or by a bitmap over
all n parameters, whichever is smaller: ``idx = min(K * k, ceil(n / 8))`` (0 for a dense message),
with ``K = key_bytes`` and ``V = value_bytes``. The wire formats are:

==================  ===================================================  ===========================================
spec                sends                                                bytes
==================  ===================================================  ===========================================
``none``            every value as given                                 ``V * k + idx``
``sparse``          the nonzero entries, indexed                         ``V * nnz + idx(nnz)``
``onebit``          a sign bit per entry, then avg+ and avg-             ``ceil(k / 8) + 2 V + idx``
``qsgd[:s]``        ||v||_2, then sign and level (0..s) per entry        ``V + ceil(k (1 + ceil(log2(s + 1))) / 8) + idx``
``topk:f``          the k' largest |entries|, indexed                    ``V * k' + idx(k')``
``budget:B``        the largest |entries| first, as many as fit in B     ``V * m + idx(m) <= B``
``budget-random:B`` as many as fit in B, chosen at random (no priority)  ``V * m + idx(m) <= B``
==================  ===================================================  ===========================================

``onebit`` decodes entry i as avg+ (the mean of the nonnegative entries) if v_i >= 0, else avg-
(the mean of the negative ones): biased, E[Q(v)] != v. ``qsgd`` is stochastic quantization,
Q(v_i) = ||v||_2 sgn(v_i) xi_i with xi_i ~ Bernoulli(|v_i| / ||v||_2) for s = 1 (QSGD's
s-level version rounds s |v_i| / ||v||_2 up or down at random): unbiased, E[Q(v)] = v.
``topk:f`` keeps k' = ceil(f k) entries for a fraction 0 < f < 1, or k' = f for a count f >= 1.

Error feedback (the default for ``topk``, always on for ``budget``, opt-in as ``onebit-ef`` and
``qsgd-ef``; ``topk-noef`` turns it off) adds what earlier messages failed to send before
compressing, and keeps what this one fails to send: residual e, message g, sent C(g + e),
new residual g + e - C(g + e). Nothing is lost, only delayed. ``budget`` is the Bosen-style
magnitude-prioritised synchronisation: under a per-message byte budget the largest changes go
first and the rest wait for a later message. ``budget-random`` is its unprioritised baseline: the same
byte budget and error feedback, but the m entries sent are a uniform random subset.

Arithmetic keeps the input's precision; sizes charge ``value_bytes`` per value (float32 by
default), a rounding that changes results by ~1e-7 relative, far below anything measured here.
Array code is NumPy/CuPy neutral: the array module is taken from ``values``; random draws come
from the worker's NumPy generator (copied to the device when the input lives there).

Example::

    >>> import numpy as np
    >>> comp = make_compressor("onebit", n_params=4, rng=np.random.default_rng(0))
    >>> k, v, nbytes = comp(np.arange(4), np.array([3.0, 1.0, -2.0, -4.0]))
    >>> v.tolist(), nbytes   # avg+ = 2, avg- = -3; 1 byte of signs + two float32 averages
    ([2.0, 2.0, -3.0, -3.0], 9)
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.backend import array_module

NAMES = ("none", "sparse", "onebit", "onebit-ef", "qsgd", "qsgd-ef", "topk", "topk-noef", "budget", "budget-random")
_NEEDS_ARG = ("topk", "topk-noef", "budget", "budget-random")
_TAKES_ARG = _NEEDS_ARG + ("qsgd", "qsgd-ef")

Message = tuple[Any, Any, int]


def parse_spec(spec: str) -> tuple[str, float | None]:
    """Split 'name[:arg]' and check it; ValueError naming 'compression' and the allowed names."""
    if not isinstance(spec, str):
        raise ValueError(f"compression must be a string such as 'topk:0.01'; got {spec!r}")
    name, _, raw = spec.strip().partition(":")
    if name not in NAMES:
        allowed = ", ".join(repr(n) for n in NAMES)
        raise ValueError(
            f"compression must be one of {allowed} (topk, topk-noef and budget take ':arg', "
            f"qsgd optionally ':levels'); got {spec!r}"
        )
    if not raw:
        if name in _NEEDS_ARG:
            raise ValueError(f"compression {name!r} needs an argument, e.g. '{name}:0.01' (topk) or 'budget:4096'")
        return name, None
    if name not in _TAKES_ARG:
        raise ValueError(f"compression {name!r} takes no argument; got {spec!r}")
    try:
        arg = float(raw)
    except ValueError:
        raise ValueError(f"compression argument must be a number; got {spec!r}") from None
    if name.startswith("topk"):
        if not (math.isfinite(arg) and arg > 0 and (arg < 1 or arg == int(arg))):
            raise ValueError(f"compression topk needs a fraction in (0, 1) or an integer count >= 1; got {spec!r}")
    elif not (math.isfinite(arg) and arg >= 1 and arg == int(arg)):  # budget and qsgd: an integer >= 1
        what = "budget needs an integer byte budget" if name.startswith("budget") else "qsgd levels must be an integer"
        raise ValueError(f"compression {what} >= 1; got {spec!r}")
    return name, arg


class Compressor:
    """One worker's encoder: (keys, values) -> (keys the receiver applies, decoded values, bytes)."""

    #: one line describing the wire format, for tables and plots
    wire_format: str = ""

    def __init__(self, spec: str, n_params: int, rng: np.random.Generator, key_bytes: int = 4, value_bytes: int = 4):
        for name, value in (("n_params", n_params), ("key_bytes", key_bytes), ("value_bytes", value_bytes)):
            check.positive_int(name, value)
        self.spec = spec
        self.n_params = int(n_params)
        self.rng = rng
        self.key_bytes = int(key_bytes)
        self.value_bytes = int(value_bytes)

    def __call__(self, keys: Any, values: Any) -> Message:
        """Encode one message; see the module docstring for each wire format."""
        if len(keys) != len(values):
            raise ValueError(f"keys and values must have the same length, got {len(keys)} and {len(values)}")
        return self.encode(keys, values, len(keys))

    def encode(self, keys: Any, values: Any, n_fresh: int) -> Message:
        """Encode (keys, values); ``n_fresh`` is how many entries the caller passed in (for top-k's k)."""
        raise NotImplementedError

    def index_bytes(self, k: int) -> int:
        """idx(k) = 0 for a dense message, else min(K k, ceil(n / 8)): a key list or a bitmap."""
        if k == self.n_params or k == 0:
            return 0
        return min(self.key_bytes * k, -(-self.n_params // 8))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r}, n_params={self.n_params})"


class NoCompression(Compressor):
    """Identity: C(v) = v."""

    wire_format = "V per value + idx"

    def encode(self, keys: Any, values: Any, n_fresh: int) -> Message:
        """C(v) = v, at V * k + idx bytes."""
        k = len(keys)
        return keys, values, self.value_bytes * k + self.index_bytes(k)


class SparseEncoding(Compressor):
    """Lossless sparse encoding: the entries with v_i != 0, indexed."""

    wire_format = "V per nonzero + idx"

    def encode(self, keys: Any, values: Any, n_fresh: int) -> Message:
        """Drop exact zeros; V * nnz + idx(nnz) bytes."""
        xp = array_module(values)
        nz = values != 0
        nnz = int(xp.count_nonzero(nz))
        return keys[nz], values[nz], self.value_bytes * nnz + self.index_bytes(nnz)


class OneBit(Compressor):
    """1-bit quantization: Q(v)_i = avg+ if v_i >= 0 else avg- (biased)."""

    wire_format = "1 bit per entry + avg+ and avg- + idx"

    def encode(self, keys: Any, values: Any, n_fresh: int) -> Message:
        """Q(v)_i = mean{v_j >= 0} if v_i >= 0 else mean{v_j < 0}; ceil(k/8) + 2V + idx bytes."""
        xp = array_module(values)
        k = len(keys)
        if k == 0:
            return keys, values, 0
        pos = values >= 0
        n_pos = int(xp.count_nonzero(pos))
        avg_pos = float(xp.sum(xp.where(pos, values, 0))) / n_pos if n_pos else 0.0
        avg_neg = float(xp.sum(xp.where(pos, 0, values))) / (k - n_pos) if k > n_pos else 0.0
        decoded = xp.where(pos, avg_pos, avg_neg).astype(values.dtype, copy=False)
        return keys, decoded, -(-k // 8) + 2 * self.value_bytes + self.index_bytes(k)


class StochasticQuantization(Compressor):
    """QSGD with s levels: Q(v_i) = ||v||_2 sgn(v_i) l_i / s, E[l_i] = s |v_i| / ||v||_2 (unbiased)."""

    def __init__(self, spec: str, n_params: int, rng: np.random.Generator, levels: int = 1, **kw: int):
        super().__init__(spec, n_params, rng, **kw)
        self.levels = int(levels)
        # A sign bit plus enough bits for a level in 0..s (s = 1: 2 bits per entry).
        self.bits_per_entry = 1 + max(1, math.ceil(math.log2(self.levels + 1)))
        self.wire_format = f"||v|| + {self.bits_per_entry} bits per entry + idx"

    def encode(self, keys: Any, values: Any, n_fresh: int) -> Message:
        """Round s|v_i|/||v|| to a neighbouring integer level at random; V + ceil(k b / 8) + idx bytes."""
        xp = array_module(values)
        k = len(keys)
        if k == 0:
            return keys, values, 0
        norm = float(xp.linalg.norm(values))
        nbytes = self.value_bytes + -(-k * self.bits_per_entry // 8) + self.index_bytes(k)
        if norm == 0.0:
            return keys, xp.zeros_like(values), nbytes
        scaled = xp.abs(values) * (self.levels / norm)
        low = xp.floor(scaled)
        # Random draws come from the worker's NumPy generator so a run is reproducible for its seed.
        u = xp.asarray(self.rng.random(k))
        level = low + (u < scaled - low)
        decoded = (norm / self.levels) * xp.sign(values) * level
        return keys, decoded.astype(values.dtype, copy=False), nbytes


class TopK(Compressor):
    """Top-k sparsification: keep the k' entries of largest |v_i|, indexed."""

    wire_format = "V per kept entry + idx"

    def __init__(self, spec: str, n_params: int, rng: np.random.Generator, k: float = 1, **kw: int):
        super().__init__(spec, n_params, rng, **kw)
        self.k = k

    def n_keep(self, n_fresh: int) -> int:
        """k' = ceil(f * n_fresh) for a fraction f < 1, else the count f."""
        return math.ceil(self.k * n_fresh) if self.k < 1 else int(self.k)

    def encode(self, keys: Any, values: Any, n_fresh: int) -> Message:
        """Keep the largest |v_i|; V * k' + idx(k') bytes."""
        xp = array_module(values)
        keep = min(self.n_keep(n_fresh), len(keys))
        if keep < len(keys):  # else every entry is sent
            pick = self.pick(xp, values, keep) if keep else slice(0, 0)
            keys, values = keys[pick], values[pick]
        return keys, values, self.value_bytes * keep + self.index_bytes(keep)

    def pick(self, xp: Any, values: Any, keep: int) -> Any:
        """Sorted positions of the ``keep`` largest |v_i|."""
        return xp.sort(xp.argpartition(-xp.abs(values), keep - 1)[:keep])


class ByteBudget(TopK):
    """Bosen-style prioritisation: largest |v_i| first, as many indexed entries as fit in B bytes."""

    wire_format = "V per entry + idx, largest first, at most B bytes"

    def __init__(self, spec: str, n_params: int, rng: np.random.Generator, budget: int = 4096, **kw: int):
        super().__init__(spec, n_params, rng, k=1, **kw)
        self.budget = int(budget)

    def n_keep(self, n_fresh: int) -> int:
        """The most entries m with V m + idx(m) <= B (a key list, or a bitmap once m is large)."""
        by_list = self.budget // (self.key_bytes + self.value_bytes)
        by_bitmap = max(0, (self.budget - -(-self.n_params // 8)) // self.value_bytes)
        return min(max(by_list, by_bitmap), self.n_params)


class RandomBudget(ByteBudget):
    """The unprioritised baseline of :class:`ByteBudget`: m entries that fit in B bytes, chosen uniformly."""

    wire_format = "V per entry + idx, random entries, at most B bytes"

    def pick(self, xp: Any, values: Any, keep: int) -> Any:
        """A uniform random sorted m-subset of positions (m as for the budget)."""
        return xp.asarray(np.sort(self.rng.choice(len(values), keep, replace=False)))


class ErrorFeedback(Compressor):
    """Error feedback around a compressor C: send C(g + e), keep e <- g + e - C(g + e)."""

    def __init__(self, inner: Compressor):
        super().__init__(inner.spec, inner.n_params, inner.rng, inner.key_bytes, inner.value_bytes)
        self.inner = inner
        self.wire_format = inner.wire_format + ", residual carried"
        self.residual: Any = None  # dense, allocated on the first message's device

    def encode(self, keys: Any, values: Any, n_fresh: int) -> Message:
        """C(g + e) over the message's keys and every key still holding residual mass."""
        xp = array_module(values)
        if self.residual is None:
            self.residual = xp.zeros(self.n_params, dtype=np.float64)
        r = self.residual
        keys = xp.asarray(keys)
        cand = xp.unique(xp.concatenate([keys, xp.flatnonzero(r).astype(keys.dtype, copy=False)]))
        acc = r[cand]
        acc[xp.searchsorted(cand, keys)] += values
        keys_out, values_out, nbytes = self.inner.encode(cand, acc, n_fresh)
        r[cand] = acc
        r[keys_out] -= values_out
        return keys_out, values_out, nbytes


# The compressor class of each spec name (its '-ef' / '-noef' suffix removed) and its argument's keyword.
_KINDS: dict[str, tuple[type[Compressor], str | None]] = {
    "none": (NoCompression, None), "sparse": (SparseEncoding, None), "onebit": (OneBit, None),
    "qsgd": (StochasticQuantization, "levels"), "topk": (TopK, "k"),
    "budget": (ByteBudget, "budget"), "budget-random": (RandomBudget, "budget"),
}


def worker_compressor(spec: str | None, n_params: int, seed: int, worker: int, key_bytes: int = 4,
                      value_bytes: int = 8) -> Compressor | None:
    """Worker ``worker``'s own compressor for ``spec`` on a real substrate (None: pushes go uncompressed)."""
    if spec is None or spec == "none":
        return None
    return make_compressor(spec, n_params, np.random.default_rng([seed, worker]), key_bytes=key_bytes,
                           value_bytes=value_bytes)


def make_compressor(
    spec: str | None,
    n_params: int,
    rng: np.random.Generator,
    key_bytes: int = 4,
    value_bytes: int = 4,
) -> Compressor:
    """Build one worker's compressor from a spec such as 'none', 'onebit', 'qsgd', 'topk:0.01', 'budget:4096'.

    ``None`` means 'none'. Each worker needs its own instance (error feedback is per worker).
    """
    spec = "none" if spec is None else spec
    name, arg = parse_spec(spec)
    # parse_spec allows an argument only where _KINDS names the keyword it becomes (qsgd: optional).
    cls, arg_name = _KINDS[name.removesuffix("-ef").removesuffix("-noef")]
    extra = {} if arg is None else {arg_name: arg}
    comp = cls(spec, n_params, rng, key_bytes=key_bytes, value_bytes=value_bytes, **extra)
    # Error feedback: opt-in for onebit and qsgd ('-ef'), the default for topk, always on for budget.
    return ErrorFeedback(comp) if name.endswith("-ef") or name in ("topk", "budget", "budget-random") else comp

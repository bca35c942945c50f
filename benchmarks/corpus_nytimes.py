"""A corpus with the shape of NYTimes, drawn from LDA's own generative model: for benchmarks only.

NYTimes (the UCI bag-of-words collection) has 299,752 documents, 102,660 words and 99.5 M tokens,
332 a document. :func:`nytimes_like` draws a corpus of that shape at ``scale`` (documents, words and
tokens each times ``scale``) from LDA itself, with the symmetric priors the samplers assume:

    phi_k ~ Dir(beta) over V words,   theta_d ~ Dir(alpha) over K topics,
    L_d = 1 + Poisson(331),   z ~ theta_d,   w ~ phi_z   for each of the L_d tokens of d.

Seeded (NumPy's PCG64: the same seed and ``chunk_tokens`` give the same corpus), vectorised, and memory-bounded: documents are drawn in chunks of about
``chunk_tokens`` tokens, so beside the corpus itself (4 bytes a token, and the 4 of
:class:`~simlib.problems.lda.LDACorpus`'s document index) it holds phi's K x V cumulative sums
and one chunk (~60 bytes a token). Run::

    python benchmarks/corpus_nytimes.py --scale 0.01      # its shape and how long it took

:func:`load_corpus` gives the LDA benchmarks (``lda.py``, ``gpu.py``) their ``--corpus``: the KJV's chapters, a text
file, or ``nytimes:SCALE``, this corpus at SCALE.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simlib import _validate as check  # noqa: E402
from simlib.problems.lda import LDACorpus, kjv_corpus, text_corpus  # noqa: E402

NYTIMES = {"documents": 299_752, "words": 102_660, "tokens": 99_542_125}


def categorical(cdf: np.ndarray, rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Column j of row rows[i] with cdf[r, j-1] <= u[i] < cdf[r, j] (each row of ``cdf`` a cumulative sum ending at 1).

    One searchsorted over the rows laid end to end, row r shifted by r so the whole is increasing.
    """
    n, m = cdf.shape
    flat = (cdf + np.arange(n)[:, None]).ravel()
    return np.minimum(np.searchsorted(flat, rows + u, side="right") - rows * m, m - 1)


def _cumulative(p: np.ndarray) -> np.ndarray:
    """Each row's cumulative sum, scaled to end at exactly 1."""
    c = np.cumsum(p, axis=1)
    c /= c[:, -1:]
    c[:, -1] = 1.0
    return c


def nytimes_like(scale: float = 1.0, n_topics: int = 100, alpha: float = 0.1, beta: float = 0.01, seed: int = 0,
                 chunk_tokens: int = 1 << 22) -> tuple[LDACorpus, np.ndarray]:
    """(corpus, phi (K, V)): NYTimes' documents, words and mean length at ``scale``, drawn from LDA (module docstring)."""
    check.positive("scale", scale)
    for name, v in (("n_topics", n_topics), ("chunk_tokens", chunk_tokens)):
        check.positive_int(name, v)
    check.positive("alpha", alpha)
    check.positive("beta", beta)
    D, V = (max(1, round(NYTIMES[k] * scale)) for k in ("documents", "words"))
    rng = np.random.default_rng(seed)
    phi = rng.dirichlet(np.full(V, beta), size=n_topics)
    phi_cdf = _cumulative(phi)
    lengths = 1 + rng.poisson(NYTIMES["tokens"] / NYTIMES["documents"] - 1, size=D)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    words = np.empty(offsets[-1], np.int32)
    first = 0
    while first < D:  # documents first..last-1 hold about chunk_tokens tokens
        last = max(first + 1, int(np.searchsorted(offsets, offsets[first] + chunk_tokens, side="right")) - 1)
        last = min(last, D)
        theta_cdf = _cumulative(rng.dirichlet(np.full(n_topics, alpha), size=last - first))
        doc = np.repeat(np.arange(last - first), lengths[first:last])
        z = categorical(theta_cdf, doc, rng.random(doc.size))
        words[offsets[first]:offsets[last]] = categorical(phi_cdf, z, rng.random(doc.size))
        first = last
    return LDACorpus(words, offsets, V), phi


def load_corpus(spec: str | None, max_docs: int | None = None) -> tuple[LDACorpus, str]:
    """(corpus, its name) for a benchmark's ``--corpus``: None for the KJV's chapters, ``nytimes:SCALE`` for
    :func:`nytimes_like` at SCALE (100 topics, seed 0), else a plain or gzipped text file, one document per line
    (:func:`~simlib.problems.lda.text_corpus`); at most ``max_docs`` documents (the first)."""
    if spec is None:
        return kjv_corpus(max_docs=max_docs), "KJV chapters"
    if spec.startswith("nytimes:"):
        try:
            scale = float(spec.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"--corpus: nytimes:SCALE takes a number for SCALE, got {spec!r}") from None
        c, _ = nytimes_like(scale)
        if max_docs is not None and max_docs < c.n_docs:
            c = c.subset(range(max_docs))
        c.vocab = [f"w{i}" for i in range(c.n_words)]  # names for the peers that take words as strings (tomotopy)
        return c, f"NYTimes-shaped corpus, scale {scale:g}, drawn from LDA"
    return text_corpus(spec, max_docs=max_docs), Path(spec).name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of NYTimes' size (default 1: ~100 M tokens)")
    ap.add_argument("--topics", type=int, default=100, help="the topics it is drawn from (default 100)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t = time.perf_counter()
    c, _ = nytimes_like(args.scale, args.topics, seed=args.seed)
    used = np.count_nonzero(np.bincount(c.words, minlength=c.n_words))
    print(f"{c.n_docs:,} documents, {c.n_words:,} words ({used:,} used), {c.n_tokens:,} tokens from "
          f"{args.topics} topics in {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()

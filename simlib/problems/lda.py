"""Latent Dirichlet allocation: the math behind collapsed Gibbs sampling, for every substrate.

The model has K topics, symmetric priors alpha (document-topic) and beta (topic-word) over a
vocabulary of V words. Collapsing theta and phi leaves one topic assignment z per token and
three count tables built from them:

    n_dk[d, k]  tokens of document d assigned to topic k         (D, K)
    n_wk[w, k]  tokens of word w assigned to topic k             (V, K)  <- the parameter server's table
    n_k[k]      tokens assigned to topic k (= n_wk summed over w) (K,)

Gibbs sampling removes a token from the counts and redraws its topic from

    p(z = k | rest) ∝ (n_dk + alpha) (n_wk + beta) / (n_k + V beta).

Documents are int32 word-id arrays, stored flat (``words``, ``offsets``) like CSR rows. Workers
own documents and their assignments; the word-topic table is what they share (see
:mod:`simlib.problems.lda_table`, which runs on every substrate). The fast single-process sampler is in
``simlib.problems.lda_gibbs``.

Example::

    >>> corpus, phi, _ = make_synthetic_corpus(n_docs=50, n_topics=3, n_words=30, doc_length=20, seed=0)
    >>> z = random_assignments(corpus, n_topics=3, seed=0)
    >>> n_dk, n_wk, n_k = count_tables(corpus, z, n_topics=3)
    >>> int(n_k.sum()) == corpus.n_tokens
    True
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from numba import njit
from scipy.optimize import linear_sum_assignment
from scipy.special import gammaln

from simlib import _validate as check
from simlib.backend import array_module, to_numpy
from simlib.data.corpus import shard_documents

#: Stop-word rule for the shipped corpus: drop the most frequent words (function words, and
#: "lord", "god", "israel", which appear in nearly every chapter) and the rare ones.
KJV_N_STOP = 100
KJV_MIN_COUNT = 5


@dataclass
class LDACorpus:
    """Documents as one flat int32 array of word ids: document d is ``words[offsets[d]:offsets[d+1]]``."""

    words: np.ndarray  # int32, all tokens, document after document
    offsets: np.ndarray  # int64, n_docs + 1
    n_words: int  # V, the vocabulary size
    vocab: list[str] | None = None
    titles: list[str] | None = None
    doc_of: np.ndarray = field(init=False, repr=False)  # int32 document of each token

    def __post_init__(self) -> None:
        self.words = _as_ids("words", self.words, np.int32)
        self.offsets = _as_ids("offsets", self.offsets, np.int64)
        self.validate()
        self.doc_of = np.repeat(np.arange(self.n_docs, dtype=np.int32), np.diff(self.offsets))

    def validate(self) -> None:
        """Check shapes, empty documents and word-id range; raise ValueError naming the field."""
        check.positive_int("n_words", self.n_words)
        for name, dtype in (("words", np.int32), ("offsets", np.int64)):
            a = getattr(self, name)
            if not isinstance(a, np.ndarray) or a.dtype != dtype or a.ndim != 1:
                raise ValueError(f"{name} must be a 1-D {np.dtype(dtype).name} array, got "
                                 f"{getattr(a, 'dtype', type(a).__name__)}")
        if len(self.offsets) < 2 or self.offsets[0] != 0:  # 1-D: checked above
            raise ValueError("offsets must be a 1-D array starting at 0 with at least one document")
        empty = np.flatnonzero(np.diff(self.offsets) <= 0)
        if empty.size:
            raise ValueError(f"docs must be non-empty; document {int(empty[0])} has no tokens")
        if self.offsets[-1] != len(self.words):
            raise ValueError(f"offsets[-1] must equal len(words) = {len(self.words)}, got {self.offsets[-1]}")
        _check_word_ids(self.words, self.offsets, self.n_words)
        if self.vocab is not None and len(self.vocab) != self.n_words:
            raise ValueError(f"vocab must have n_words = {self.n_words} entries, got {len(self.vocab)}")
        if self.titles is not None and len(self.titles) != self.n_docs:
            raise ValueError(f"titles must have one entry per document ({self.n_docs}), got {len(self.titles)}")

    @classmethod
    def from_docs(cls, docs: Sequence[Any], n_words: int, vocab: list[str] | None = None,
                  titles: list[str] | None = None) -> "LDACorpus":
        """Build from a list of word-id sequences (validated: non-empty, ids in [0, n_words))."""
        if len(docs) == 0:
            raise ValueError("docs must hold at least one document")
        parts = [np.asarray(d) for d in docs]
        for i, p in enumerate(parts):
            if p.ndim != 1 or (p.size and not np.issubdtype(p.dtype, np.integer)):
                raise ValueError(f"docs must be 1-D integer word-id arrays; document {i} is not")
        offsets = np.concatenate([[0], np.cumsum([p.size for p in parts], dtype=np.int64)])
        words = np.concatenate([p.astype(np.int64) for p in parts])  # to int32 and checked by the constructor
        return cls(words, offsets, n_words, vocab, titles)

    @property
    def n_docs(self) -> int:
        """Number of documents D."""
        return len(self.offsets) - 1

    @property
    def n_tokens(self) -> int:
        """Number of tokens N."""
        return int(self.offsets[-1])

    def doc(self, d: int) -> np.ndarray:
        """Word ids of document d."""
        return self.words[self.offsets[d] : self.offsets[d + 1]]

    def subset(self, docs: np.ndarray | Sequence[int]) -> "LDACorpus":
        """The corpus restricted to the given documents (same vocabulary), e.g. a worker's shard."""
        docs = np.asarray(docs, dtype=np.int64)
        parts = [self.doc(int(d)) for d in docs]
        titles = [self.titles[int(d)] for d in docs] if self.titles is not None else None
        return LDACorpus.from_docs(parts, self.n_words, self.vocab, titles)


def _check_word_ids(words: np.ndarray, offsets: np.ndarray, n_words: int) -> None:
    """ValueError naming the first document with a word id outside [0, n_words)."""
    bad = np.flatnonzero((words < 0) | (words >= n_words))
    if bad.size:
        d = int(np.searchsorted(offsets, bad[0], side="right") - 1)
        raise ValueError(f"word ids must lie in [0, n_words={n_words}); document {d} has word id {int(words[bad[0]])}")


def _as_ids(name: str, a: Any, dtype: Any) -> np.ndarray:
    """``a`` as a contiguous array of ``dtype``, refusing what the cast would change (fractions, overflow)."""
    a = np.asarray(a)
    if a.size and a.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got dtype {a.dtype}")
    out = np.ascontiguousarray(a, dtype=dtype)
    if a.size and not np.array_equal(out, a):
        raise ValueError(f"{name} must fit in {np.dtype(dtype).name}, got values from {a.min()} to {a.max()}")
    return out


def check_corpus(corpus: Any) -> LDACorpus:
    """``corpus`` if it is a valid LDACorpus (checked again: the Gibbs kernels index it unchecked)."""
    if not isinstance(corpus, LDACorpus):
        raise ValueError(f"corpus must be an LDACorpus, got {type(corpus).__name__}")
    corpus.validate()
    return corpus


def deal_documents(corpus: LDACorpus, n_workers: int, pieces: int = 16) -> list[np.ndarray]:
    """Each worker's documents (sorted ids): the corpus cut into ``pieces`` runs a worker of about equal tokens,
    dealt round-robin, so every worker holds some of every part of an ordered corpus, in even shares of tokens."""
    # NOTE: with one contiguous block each, the KJV's two halves at K = 1,000 cost 1.29 and 1.40 CPU s for the
    # same 30 sweeps (the Old and the New Testament's words and topics), and BSP made the first worker wait
    # 8% of the run; dealt in 2 x 16 runs, the two cost the same to 1%.
    check.positive_int("pieces", pieces)
    runs = n_workers * max(1, min(pieces, corpus.n_docs // n_workers))
    bounds = shard_documents(corpus.offsets, runs)
    return [np.concatenate([np.arange(bounds[r], bounds[r + 1]) for r in range(i, runs, n_workers)])
            for i in range(n_workers)]


def check_hyper(n_topics: Any, alpha: Any, beta: Any) -> None:
    """Validate K >= 2, alpha > 0, beta > 0 (ValueError naming the field)."""
    check.positive_int("n_topics", n_topics)
    if n_topics < 2:  # with one topic every token's topic is fixed: nothing to sample or learn
        raise ValueError(f"n_topics must be >= 2 (with K = 1 every token has topic 0 and the sampler learns nothing), "
                         f"got {n_topics}")
    check.positive("alpha", alpha)
    check.positive("beta", beta)


def random_assignments(corpus: LDACorpus, n_topics: int, seed: int = 0) -> np.ndarray:
    """Uniform random initial topics z (int32, one per token)."""
    check.positive_int("n_topics", n_topics)
    return np.random.default_rng(seed).integers(0, n_topics, size=corpus.n_tokens, dtype=np.int32)


def count_tables(corpus: LDACorpus, z: np.ndarray, n_topics: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n_dk, n_wk, n_k) recomputed from the assignments z, as int32 tables."""
    return doc_topic_counts(corpus, z, n_topics), *word_counts(corpus.words, z, corpus.n_words, n_topics)


def word_counts(ids: np.ndarray, z: np.ndarray, n: int, n_topics: int) -> tuple[np.ndarray, np.ndarray]:
    """(n_wk, n_k) of tokens with words ``ids`` in [0, n) and topics z, as int32 tables (n, K) and (K,)."""
    return _count_pairs(ids, z, np.zeros((n, n_topics), np.int32)), np.bincount(z, minlength=n_topics).astype(np.int32)


def doc_topic_counts(corpus: LDACorpus, z: np.ndarray, n_topics: int) -> np.ndarray:
    """n_dk alone, recomputed from the assignments z (int32, D x K)."""
    z = np.asarray(z)
    if z.shape != (corpus.n_tokens,):
        raise ValueError(f"z must have one topic per token ({corpus.n_tokens}), got shape {z.shape}")
    if z.size and (z.min() < 0 or z.max() >= n_topics):
        raise ValueError(f"z must lie in [0, n_topics={n_topics})")
    return _count_pairs(corpus.doc_of, z, np.zeros((corpus.n_docs, n_topics), np.int32))


@njit(cache=True, nogil=True)
def _count_pairs(ids: np.ndarray, z: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[i, k] += the number of tokens with id i and topic k; returns out."""
    # NOTE: replaces np.bincount(ids * K + z, minlength=n * K).reshape(n, K).astype(np.int32), whose int64
    # counts and int32 copy (12 bytes per entry at once) set the peak memory at K = 10,000 on the KJV (1.44 GB);
    # a zeroed int32 table is 4 bytes per entry, and pages no token writes are not touched.
    for i in range(ids.shape[0]):
        out[ids[i], z[i]] += 1
    return out


def conditional(n_dk: Any, n_wk: Any, n_k: Any, alpha: float, beta: float, n_words: int) -> Any:
    """p(z = k | rest) ∝ (n_dk + alpha)(n_wk + beta)/(n_k + V beta), normalised over the last axis.

    Works on one token (rows of length K) or a batch (B, K); NumPy or CuPy. The counts must
    already exclude the token being resampled.
    """
    xp = array_module(n_dk, n_wk, n_k)
    p = (n_dk + alpha) * (n_wk + beta) / (n_k + n_words * beta)
    return p / xp.sum(p, axis=-1, keepdims=True)


def _lgamma_sum(counts: np.ndarray, prior: float) -> float:
    """sum over all entries of lgamma(count + prior), every zero count adding lgamma(prior)."""
    # NOTE: gammaln over the non-zero counts only: at K = 10,000 on the KJV the tables hold 64 M counts,
    # 0.3 M of them non-zero, and gammaln(n_wk + b) over them all built two 418 MB float64 arrays
    # (the peak of a run went from 0.48 to 1.27 GB) and took 2.5 s of CPU.
    nonzero = counts[counts != 0]
    return float(gammaln(nonzero + prior).sum() + (counts.size - nonzero.size) * gammaln(prior))


def _polya_log_likelihood(counts: np.ndarray, totals: np.ndarray, prior: float, M: int) -> float:
    """G[lgamma(M p) - M lgamma(p)] + sum_g [sum_i lgamma(c_gi + p) - lgamma(n_g + M p)]: G groups (``totals``) of
    M counts each."""
    G = totals.size
    return float(G * (gammaln(M * prior) - M * gammaln(prior)) + _lgamma_sum(counts, prior)
                 - gammaln(totals + M * prior).sum())


def word_log_likelihood(n_wk: Any, n_k: Any, beta: float) -> float:
    """log p(w | z) = K[lgamma(V b) - V lgamma(b)] + sum_k [sum_w lgamma(n_wk + b) - lgamma(n_k + V b)]."""
    n_wk = to_numpy(n_wk)
    return _polya_log_likelihood(n_wk, to_numpy(n_k), beta, n_wk.shape[0])


def doc_log_likelihood(n_dk: Any, alpha: float) -> float:
    """log p(z) = D[lgamma(K a) - K lgamma(a)] + sum_d [sum_k lgamma(n_dk + a) - lgamma(n_d + K a)]."""
    n_dk = to_numpy(n_dk)
    return _polya_log_likelihood(n_dk, n_dk.sum(axis=1), alpha, n_dk.shape[1])


def log_likelihood(n_dk: Any, n_wk: Any, n_k: Any, alpha: float, beta: float) -> float:
    """The joint log p(w, z) = log p(w | z) + log p(z), the quantity the `lda` package reports."""
    return word_log_likelihood(n_wk, n_k, beta) + doc_log_likelihood(n_dk, alpha)


def topic_word(n_wk: Any, n_k: Any, beta: float) -> np.ndarray:
    """Posterior-mean topics phi[k, w] = (n_wk + beta) / (n_k + V beta), shape (K, V)."""
    n_wk, n_k = to_numpy(n_wk).astype(np.float64), to_numpy(n_k).astype(np.float64)
    V = n_wk.shape[0]
    return ((n_wk + beta) / (n_k + V * beta)).T


def top_words(n_wk: Any, n: int = 10, vocab: Sequence[str] | None = None) -> list[list[Any]]:
    """For each topic, its n most frequent words (ids, or strings when vocab is given)."""
    check.positive_int("n", n)
    n_wk = to_numpy(n_wk)
    order = np.argsort(-n_wk, axis=0, kind="stable")[:n].T
    return [[vocab[i] for i in row] if vocab is not None else [int(i) for i in row] for row in order]


def topic_match(phi_true: np.ndarray, phi_learned: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cosine similarity of learned to true topics under the best one-to-one (Hungarian) matching.

    Returns (score, match) where ``match[i]`` is the learned topic paired with true topic i.
    """
    a = np.asarray(phi_true, dtype=np.float64)
    b = np.asarray(phi_learned, dtype=np.float64)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"phi_learned must have {a.shape[1]} words per topic, got {b.shape[1]}")
    cos = (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (b / np.linalg.norm(b, axis=1, keepdims=True)).T
    rows, cols = linear_sum_assignment(-cos)
    match = np.full(a.shape[0], -1, dtype=np.int64)
    match[rows] = cols
    return float(cos[rows, cols].mean()), match


def make_synthetic_corpus(n_docs: int = 400, n_topics: int = 8, n_words: int = 200, doc_length: int = 100,
                          alpha: float = 0.5, beta: float = 0.05,
                          seed: int = 0) -> tuple[LDACorpus, np.ndarray, np.ndarray]:
    """Draw a corpus from LDA itself: phi_k ~ Dir(beta), theta_d ~ Dir(alpha), lengths ~ 1 + Poisson(L - 1).

    Returns (corpus, phi (K, V), theta (D, K)) so a sampler's topics can be matched to the truth.
    The defaults are recovered reliably (mean matched cosine >= 0.99 over 18 seeds with alpha =
    0.5): with sparser documents (alpha = 0.1) random-start Gibbs sticks in a mode where two
    true topics share one learned topic in about a third of the runs, scoring ~0.85.
    """
    for name, v in (("n_docs", n_docs), ("n_topics", n_topics), ("n_words", n_words), ("doc_length", doc_length)):
        check.positive_int(name, v)
    check.positive("alpha", alpha)
    check.positive("beta", beta)
    rng = np.random.default_rng(seed)
    phi = rng.dirichlet(np.full(n_words, beta), size=n_topics)
    theta = rng.dirichlet(np.full(n_topics, alpha), size=n_docs)
    lengths = 1 + rng.poisson(doc_length - 1, size=n_docs)
    docs = []
    for d in range(n_docs):
        topics = rng.choice(n_topics, size=lengths[d], p=theta[d])
        # Inverse-CDF draw of each token's word from its topic's row (vectorised per document).
        cdf = np.cumsum(phi[topics], axis=1)
        u = rng.random(lengths[d]) * cdf[:, -1]
        docs.append(np.minimum((cdf < u[:, None]).sum(axis=1), n_words - 1).astype(np.int32))
    return LDACorpus.from_docs(docs, n_words), phi, theta


def kjv_corpus(n_stop: int = KJV_N_STOP, min_count: int = KJV_MIN_COUNT, max_docs: int | None = None) -> LDACorpus:
    """The shipped King James Bible, one document per chapter, with stop words removed.

    Rule: drop the ``n_stop`` most frequent words of the whole text (100 by default: function
    words and the few names in almost every chapter) and every word seen fewer than ``min_count``
    times (5). With the defaults: 1,189 chapters, 5,223 words, about 278 k tokens.
    """
    from simlib.data import load_kjv

    kjv = load_kjv()
    return _stopped_corpus(kjv.docs, kjv.titles, n_stop, min_count, max_docs)


def text_corpus(path: str, n_stop: int = KJV_N_STOP, min_count: int = KJV_MIN_COUNT,
                max_docs: int | None = None) -> LDACorpus:
    """A plain or gzipped text file, one document per line, under :func:`kjv_corpus`'s stop-word rule.

    The documents' titles are their line numbers (from 1, counting the lines that held words).
    """
    from simlib.data import iter_text_file

    docs = list(iter_text_file(path))
    if not docs:
        raise ValueError(f"path: {path} holds no words")
    return _stopped_corpus(docs, [f"line {i + 1}" for i in range(len(docs))], n_stop, min_count, max_docs)


def _stopped_corpus(docs: list, titles: list, n_stop: int, min_count: int, max_docs: int | None) -> LDACorpus:
    """Documents of tokens as an LDACorpus: the ``n_stop`` most frequent words and the rare ones dropped."""
    from simlib.data import Vocabulary

    check.non_negative_int("n_stop", n_stop)  # min_count: checked by Vocabulary.build
    if max_docs is not None:
        check.positive_int("max_docs", max_docs)
    full = Vocabulary.build(docs, min_count=min_count)  # over every document, also past max_docs
    if len(full) <= n_stop:
        raise ValueError(f"n_stop ({n_stop}) must be below the vocabulary's {len(full)} words seen at least "
                         f"{min_count} times")
    vocab = Vocabulary(full.words[n_stop:], full.counts[n_stop:])
    ids = [vocab.encode(d) for d in docs[:max_docs]]
    keep = [i for i, d in enumerate(ids) if d.size]
    return LDACorpus.from_docs([ids[i] for i in keep], len(vocab), vocab.words, [titles[i] for i in keep])


@njit(cache=True, nogil=True)
def _fold_in(words: np.ndarray, offsets: np.ndarray, phi: np.ndarray, alpha: float, n_iter: int,
             seed: int) -> np.ndarray:
    """Gibbs over each document's topics with phi fixed; returns theta averaged over the second half of sweeps."""
    np.random.seed(seed)
    D = len(offsets) - 1
    K = phi.shape[0]
    theta = np.zeros((D, K))
    p = np.empty(K)
    for d in range(D):
        a, b = offsets[d], offsets[d + 1]
        n = np.zeros(K)
        z = np.empty(b - a, np.int64)
        for i in range(a, b):
            k = np.random.randint(K)
            z[i - a] = k
            n[k] += 1
        for it in range(n_iter):
            for i in range(a, b):
                n[z[i - a]] -= 1
                total = 0.0
                for k in range(K):
                    total += (n[k] + alpha) * phi[k, words[i]]
                    p[k] = total
                u = np.random.random() * total
                k = 0
                while k < K - 1 and p[k] <= u:
                    k += 1
                z[i - a] = k
                n[k] += 1
            if it >= n_iter // 2:
                for k in range(K):
                    theta[d, k] += (n[k] + alpha) / (b - a + K * alpha)
        theta[d] /= n_iter - n_iter // 2  # the sweeps kept
    return theta


def perplexity(heldout: LDACorpus, n_wk: Any, n_k: Any, alpha: float, beta: float, n_iter: int = 20,
               seed: int = 0) -> float:
    """Held-out perplexity by document completion: exp(-sum log p(w_odd | theta_d, phi) / N_odd).

    Topics phi come from the trained counts and stay fixed. Each held-out document's
    even-position tokens are folded in (Gibbs over their topics only, ``n_iter`` sweeps, theta
    averaged over the second half); its odd-position tokens are then scored under
    p(w) = sum_k theta_dk phi_kw. Documents of one token contribute nothing to score.
    """
    check.positive_int("n_iter", n_iter)
    phi = topic_word(n_wk, n_k, beta)
    if heldout.n_words != phi.shape[1]:
        raise ValueError(f"heldout.n_words must equal the trained vocabulary size {phi.shape[1]}, "
                         f"got {heldout.n_words}")
    pos = np.arange(heldout.n_tokens) - heldout.offsets[heldout.doc_of]
    seen, scored = pos % 2 == 0, pos % 2 == 1
    seen_offsets = np.concatenate([[0], np.cumsum(np.bincount(heldout.doc_of[seen], minlength=heldout.n_docs))])
    theta = _fold_in(heldout.words[seen], seen_offsets, phi, float(alpha), int(n_iter), int(seed))
    w, d = heldout.words[scored], heldout.doc_of[scored]
    if w.size == 0:
        raise ValueError("heldout must have a document with at least two tokens to score")
    p = np.einsum("nk,kn->n", theta[d], phi[:, w])
    return float(np.exp(-np.log(p).sum() / w.size))


__all__ = ["LDACorpus", "deal_documents", "check_hyper", "random_assignments", "count_tables",
           "word_counts", "doc_topic_counts", "conditional",
           "word_log_likelihood", "doc_log_likelihood", "log_likelihood", "topic_word", "top_words", "topic_match",
           "make_synthetic_corpus", "kjv_corpus", "perplexity", "KJV_N_STOP", "KJV_MIN_COUNT"]

"""A real sparse classification task from the shipped corpus: Old or New Testament?

The King James Bible (``simlib.data.load_kjv``) is cut into passages of ``passage_tokens``
consecutive words within a chapter (about the length of a verse). Each passage becomes a row
of tf-idf weights over its words and word pairs (features seen in at least ``min_count``
passages), normalised to unit length; the label is +1 for a passage from the New Testament
(Matthew 1 onwards) and -1 for the Old. Rows are shuffled once with ``seed``, because SGD that
visits every Old Testament row before any New Testament row learns a very different model.

Example::

    >>> data, features = kjv_testament_dataset(passage_tokens=200, min_count=20)
    >>> data.n_features == len(features), set(data.y.tolist()) == {-1.0, 1.0}
    (True, True)
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from simlib import _validate as check
from simlib.data.corpus import load_kjv
from simlib.problems.logistic import SparseDataset

FIRST_NEW_TESTAMENT_CHAPTER = "Matthew 1"


def passages(passage_tokens: int) -> tuple[list[list[str]], np.ndarray]:
    """KJV chapters cut into runs of ``passage_tokens`` words; returns (passages, label +1 NT / -1 OT)."""
    check.positive_int("passage_tokens", passage_tokens)
    kjv = load_kjv()
    nt_start = kjv.titles.index(FIRST_NEW_TESTAMENT_CHAPTER)
    cut = [(doc[start : start + passage_tokens], 1.0 if k >= nt_start else -1.0)
           for k, doc in enumerate(kjv.docs) for start in range(0, len(doc), passage_tokens)]
    return [text for text, _ in cut], np.array([label for _, label in cut], dtype=np.float32)


def _grams(tokens: list[str], bigrams: bool) -> list[str]:
    """The words of a passage, then (with ``bigrams``) its adjacent word pairs written 'a_b'."""
    return tokens + ([f"{a}_{b}" for a, b in zip(tokens, tokens[1:])] if bigrams else [])


def kjv_testament_dataset(passage_tokens: int = 25, min_count: int = 3, bigrams: bool = True,
                          seed: int = 0) -> tuple[SparseDataset, list[str]]:
    """Passages as unit-norm tf-idf rows, y = +1 (New Testament) or -1 (Old); returns (data, feature names).

    Weights are tf * idf with idf = log(N / df) + 1 over the N passages; a passage's repeated
    words count in tf.
    """
    check.positive_int("min_count", min_count)
    texts, labels = passages(passage_tokens)
    df = Counter(term for tokens in texts for term in set(_grams(tokens, bigrams)))
    features = sorted(t for t, c in df.items() if c >= min_count)
    if not features:
        raise ValueError(f"min_count={min_count} leaves no feature; lower it")
    index = {t: i for i, t in enumerate(features)}
    idf = np.log(len(texts) / np.array([df[t] for t in features], dtype=np.float64)) + 1.0
    order = np.random.default_rng(seed).permutation(len(texts))
    indices: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for r in order:
        counts = Counter(index[term] for term in _grams(texts[r], bigrams) if term in index)
        cols = np.fromiter(sorted(counts), dtype=np.int32, count=len(counts))
        tf = np.array([counts[j] for j in cols], dtype=np.float64)
        v = tf * idf[cols]
        norm = np.sqrt(v @ v)
        indices.append(cols)
        values.append((v / norm if norm > 0 else v).astype(np.float32))
    indptr = np.concatenate([[0], np.cumsum([len(cols) for cols in indices], dtype=np.int64)])
    data = SparseDataset(indptr, np.concatenate(indices), np.concatenate(values), labels[order], len(features))
    return data, features

"""Judging word vectors: nearest neighbours, analogies, word similarity, and a 2-D picture.

All scores use cosine similarity cos(u, v) = u . v / (|u| |v|). An analogy ``a b c d`` (a is
to b as c is to d) is answered by 3CosAdd: the word nearest to v_b - v_a + v_c, excluding a, b
and c. Word similarity is the Spearman rank correlation between the cosine of each pair and a
list of judgements.

    >>> from simlib.problems.embedding_eval import load_analogies, KJV_ANALOGIES
    >>> sections = load_analogies(KJV_ANALOGIES)
    >>> sorted(sections)[:2]
    ['gender', 'past-tense']
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from simlib.data.corpus import Vocabulary

DATA = Path(__file__).resolve().parent.parent / "data"
KJV_ANALOGIES = DATA / "kjv_analogies.txt"
KJV_SIMILARITY = DATA / "kjv_similarity.txt"


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, v / |v| (zero rows stay zero)."""
    v = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return v / np.where(norms == 0, 1.0, norms)


def nearest(vectors: np.ndarray, vocab: Vocabulary, word: str, k: int = 10) -> list[tuple[str, float]]:
    """The ``k`` words of highest cosine similarity to ``word`` (itself excluded), best first."""
    unit = normalize(vectors)
    i = vocab.id(word)
    sims = unit @ unit[i]
    sims[i] = -np.inf
    return [(vocab.words[t], float(sims[t])) for t in np.argsort(-sims, kind="stable")[:k]]


def _data_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, stripped line) of a data file's lines, blank lines and ``#`` comment lines skipped."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip() and not line.lstrip().startswith("#"):
                yield n, line.strip()


def load_analogies(path: str | Path) -> dict[str, list[tuple[str, str, str, str]]]:
    """Read the standard question format: ``: section`` lines, then ``a b c d`` lines (lowercased)."""
    sections: dict[str, list[tuple[str, str, str, str]]] = {}
    current = None
    for n, line in _data_lines(path):
        if line.startswith(":"):
            current = line[1:].strip()
            sections.setdefault(current, [])
            continue
        words = line.lower().split()
        if len(words) != 4 or current is None:
            raise ValueError(f"analogy file line {n} must be ': section' or four words after a section, got {line!r}")
        sections[current].append(tuple(words))
    return sections


def analogy(vectors: np.ndarray, vocab: Vocabulary, a: str, b: str, c: str, k: int = 1) -> list[str]:
    """3CosAdd: the ``k`` words nearest to v_b - v_a + v_c (unit vectors), excluding a, b, c."""
    unit = normalize(vectors)
    ia, ib, ic = vocab.id(a), vocab.id(b), vocab.id(c)
    sims = unit @ (unit[ib] - unit[ia] + unit[ic])
    sims[[ia, ib, ic]] = -np.inf
    return [vocab.words[t] for t in np.argsort(-sims, kind="stable")[:k]]


def analogy_accuracy(vectors: np.ndarray, vocab: Vocabulary,
                     sections: dict[str, list[tuple[str, str, str, str]]]) -> dict[str, dict[str, float]]:
    """Per section (and 'all'): fraction answered correctly among questions whose words are all known."""
    unit = normalize(vectors)
    out: dict[str, dict[str, float]] = {}
    rights = []
    for name, questions in sections.items():
        known = [q for q in questions if all(w in vocab for w in q)]
        right = 0
        if known:
            ids = np.array([[vocab.id(w) for w in q] for q in known])
            # NOTE: one matrix product for all questions of a section instead of one per question.
            targets = unit[ids[:, 1]] - unit[ids[:, 0]] + unit[ids[:, 2]]
            sims = targets @ unit.T
            sims[np.arange(len(known))[:, None], ids[:, :3]] = -np.inf  # a, b and c are not answers
            right = int(np.sum(np.argmax(sims, axis=1) == ids[:, 3]))
        out[name] = _score(right, len(known), len(questions))
        rights.append(right)
    out["all"] = _score(sum(rights), sum(o["answered"] for o in out.values()), sum(o["total"] for o in out.values()))
    return out


def _score(right: int, answered: int, total: int) -> dict[str, float]:
    """An accuracy entry: right / answered (NaN when no question was answered), with both counts."""
    return {"accuracy": right / answered if answered else float("nan"), "answered": answered, "total": total}


def load_similarity(path: str | Path) -> list[tuple[str, str, float]]:
    """Read ``word1 word2 score`` lines (``#`` starts a comment line)."""
    pairs = []
    for n, line in _data_lines(path):
        parts = line.split()
        if len(parts) != 3:
            raise ValueError(f"similarity file line {n} must be 'word1 word2 score', got {line!r}")
        pairs.append((parts[0].lower(), parts[1].lower(), float(parts[2])))
    return pairs


def similarity_score(vectors: np.ndarray, vocab: Vocabulary, pairs: list[tuple[str, str, float]]) -> dict[str, float]:
    """Spearman rho (the Pearson correlation of the ranks, ties at their mean rank) between cos(v_a, v_b) and the
    judged scores, over pairs with both words known."""
    from scipy.stats import spearmanr

    unit = normalize(vectors)
    known = [(a, b, s) for a, b, s in pairs if a in vocab and b in vocab]
    if len(known) < 2:
        return {"spearman": float("nan"), "pairs": len(known)}
    cos = [float(unit[vocab.id(a)] @ unit[vocab.id(b)]) for a, b, _ in known]
    return {"spearman": float(spearmanr(cos, [s for _, _, s in known]).statistic), "pairs": len(known)}


def pca_2d(vectors: np.ndarray) -> np.ndarray:
    """Project rows onto their first two principal components (centred SVD)."""
    v = np.asarray(vectors, dtype=np.float64)
    centred = v - v.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return centred @ vt[:2].T


def plot_projection(vectors: np.ndarray, vocab: Vocabulary, words: Sequence[str], ax: Any = None,
                    title: str | None = None) -> Any:
    """Scatter ``words`` on the first two principal components of their vectors; returns the axes."""
    import matplotlib.pyplot as plt

    known = [w for w in words if w in vocab]
    if len(known) < 2:
        raise ValueError(f"words must include at least two vocabulary words, got {list(words)!r}")
    xy = pca_2d(np.asarray(vectors)[[vocab.id(w) for w in known]])
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 5))
    ax.scatter(xy[:, 0], xy[:, 1], color="#0072B2")
    for (x, y), w in zip(xy, known):
        ax.annotate(w, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=12)
    ax.set(xlabel="principal component 1 (cosine units)", ylabel="principal component 2 (cosine units)",
           title=title or "Words on the first two principal components")
    return ax

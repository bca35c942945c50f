"""Text corpora: the shipped King James Bible, streaming loaders for large files, and a vocabulary.

A corpus here is a sequence of documents, each a list of lowercase word tokens. Documents are
boundaries that co-occurrence windows never cross (a chapter, a line of a text file).

    >>> from simlib.data import load_kjv, Vocabulary
    >>> kjv = load_kjv()
    >>> kjv.titles[0], kjv.docs[0][:4]
    ('Genesis 1', ['in', 'the', 'beginning', 'god'])
    >>> vocab = Vocabulary.build(kjv.docs, min_count=5)
    >>> ids, offsets = vocab.encode_docs(kjv.docs)
"""
from __future__ import annotations

import gzip
import re
import zlib
from collections import Counter
from dataclasses import dataclass
from itertools import chain, repeat
from pathlib import Path
from typing import IO, Iterable, Iterator

import numpy as np

from simlib._validate import positive_int

KJV_PATH = Path(__file__).with_name("kjv.txt.gz")
_TOKEN = re.compile(r"[a-z]+(?:'[a-z]+)*")


def tokenize(text: str) -> list[str]:
    """Lowercase ``text`` and return runs of ASCII letters (inner apostrophes kept: ``abram's``)."""
    return _TOKEN.findall(text.lower())


def shard_documents(offsets: np.ndarray, n_workers: int) -> np.ndarray:
    """Document boundaries (n_workers + 1) giving each worker a contiguous block of at least one document and
    about N / n_workers tokens: each cut at the first document boundary at or after k N / n_workers tokens."""
    n_docs = len(offsets) - 1
    positive_int("n_workers", n_workers, n_docs)  # at most one worker per document
    cuts = np.searchsorted(offsets, offsets[-1] * np.arange(1, n_workers) / n_workers)
    bounds = np.concatenate([[0], cuts, [n_docs]]).astype(np.int64)
    for i in range(1, n_workers):  # at least one document each, even beside a very long one
        bounds[i] = min(max(bounds[i], bounds[i - 1] + 1), n_docs - (n_workers - i))
    return bounds


@dataclass
class Corpus:
    """Documents (token lists) with one title each; ``docs[i]`` is titled ``titles[i]``."""

    docs: list[list[str]]
    titles: list[str]

    def __len__(self) -> int:
        """Number of documents."""
        return len(self.docs)

    @property
    def n_tokens(self) -> int:
        """Total tokens over all documents."""
        return sum(len(d) for d in self.docs)


def load_kjv() -> Corpus:
    """The King James Bible shipped with simlib: 1,189 chapters ('Genesis 1' ... 'Revelation 22')."""
    with gzip.open(KJV_PATH, "rt", encoding="ascii") as f:
        rows = [line.rstrip("\n").partition("\t") for line in f]
    return Corpus(docs=[text.split() for _, _, text in rows], titles=[title for title, _, _ in rows])


def _open_text(path: str | Path) -> IO[str]:
    """Open a plain or gzipped text file for reading as UTF-8 (undecodable bytes replaced)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path must be an existing file, got {str(path)!r}")
    if path.suffix == ".gz":
        with open(path, "rb") as f:
            head = f.read(2)
        if head != b"\x1f\x8b":  # gzip's magic number
            raise ValueError(f"path: {str(path)!r} ends in .gz but is not gzip (it starts with {head!r}); "
                             "compress it with gzip, or drop the .gz suffix")
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def _read(f: IO[str], n: int, path: str | Path) -> str:
    """Up to n characters of f; a damaged gzip stream is a ValueError naming the path."""
    try:
        return f.read(n)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise ValueError(f"path: {str(path)!r} is a damaged gzip file ({type(e).__name__}: {e})") from None


def iter_text_file(path: str | Path, max_doc_tokens: int = 100_000, chunk_chars: int = 1 << 20) -> Iterator[list[str]]:
    """Stream documents from a (possibly gzipped) text file: one per line, cut at ``max_doc_tokens``.

    The file is read ``chunk_chars`` characters at a time, so memory stays bounded even for a file
    that is one enormous line (text8). A word split across two chunks is rejoined. Empty lines
    yield nothing. Tokens follow :func:`tokenize`.
    """
    positive_int("max_doc_tokens", max_doc_tokens)
    positive_int("chunk_chars", chunk_chars)
    doc: list[str] = []
    carry = ""
    with _open_text(path) as f:
        while True:
            chunk = _read(f, chunk_chars, path)
            text = carry + chunk
            if chunk:
                # Hold back a trailing partial word: it may continue in the next chunk.
                cut = max(text.rfind(" "), text.rfind("\n"), text.rfind("\t"))
                text, carry = (text[: cut + 1], text[cut + 1 :]) if cut >= 0 else ("", text)
            for i, line in enumerate(text.split("\n")):
                if i and doc:  # the newline before this line ended the document
                    yield doc
                    doc = []
                for token in tokenize(line):
                    doc.append(token)
                    if len(doc) >= max_doc_tokens:
                        yield doc
                        doc = []
            if not chunk:
                break
    if doc:
        yield doc


def iter_text8(path: str | Path, doc_tokens: int = 10_000) -> Iterator[list[str]]:
    """Stream the text8 format (one line of lowercase words) as documents of ``doc_tokens`` tokens.

    text8 has no document boundaries; cutting it into pieces loses only the window pairs that
    straddle a cut (under 0.1% for the default length and a window of 10).
    """
    return iter_text_file(path, max_doc_tokens=doc_tokens)


class Vocabulary:
    """Words ranked by count (most frequent first, ties alphabetical): ``id(word)`` <-> ``words[id]``."""

    def __init__(self, words: list[str], counts: np.ndarray) -> None:
        """Wrap an already-ranked word list and its counts (use :meth:`build` to count a corpus)."""
        if len(words) != len(counts):
            raise ValueError(f"counts must have one entry per word ({len(words)}), got {len(counts)}")
        self.words = list(words)
        self.counts = np.asarray(counts, dtype=np.int64)
        self.index = {w: i for i, w in enumerate(self.words)}
        if len(self.index) != len(self.words):
            raise ValueError("words must be distinct")

    @classmethod
    def build(cls, docs: Iterable[Iterable[str]], min_count: int = 1, max_size: int | None = None) -> "Vocabulary":
        """Count tokens in one pass over ``docs``; keep words seen >= ``min_count`` times, at most ``max_size``."""
        positive_int("min_count", min_count)
        if max_size is not None:
            positive_int("max_size", max_size)
        counter = Counter(chain.from_iterable(docs))
        ranked = sorted((item for item in counter.items() if item[1] >= min_count), key=lambda wc: (-wc[1], wc[0]))
        ranked = ranked[:max_size]  # None keeps every word
        return cls([w for w, _ in ranked], np.array([c for _, c in ranked], dtype=np.int64))

    def __len__(self) -> int:
        """Number of words."""
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        """Whether ``word`` is in the vocabulary."""
        return word in self.index

    def id(self, word: str) -> int:
        """The id of ``word``; KeyError naming the word if it is not in the vocabulary."""
        try:
            return self.index[word]
        except KeyError:
            raise KeyError(f"word {word!r} is not in the vocabulary") from None

    def count(self, word: str) -> int:
        """How often ``word`` occurred in the corpus the vocabulary was built from."""
        return int(self.counts[self.id(word)])

    def encode(self, doc: Iterable[str], drop_unknown: bool = True) -> np.ndarray:
        """Token ids (int32) of ``doc``; unknown words are dropped, or mapped to -1 if not ``drop_unknown``."""
        ids = np.fromiter(map(self.index.get, doc, repeat(-1)), dtype=np.int32)
        return ids[ids >= 0] if drop_unknown else ids

    def encode_docs(self, docs: Iterable[Iterable[str]], drop_unknown: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Flatten ``docs`` to (ids int32, offsets int64): document k is ``ids[offsets[k]:offsets[k+1]]``."""
        parts = [self.encode(d, drop_unknown) for d in docs]
        offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts], dtype=np.int64)])
        return np.concatenate([np.zeros(0, np.int32), *parts]), offsets

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Words for ``ids``."""
        return [self.words[int(i)] for i in ids]

    def save(self, path: str | Path) -> None:
        """Write ``word count`` lines, most frequent first (the format of GloVe's ``vocab_count``)."""
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(f"{w} {int(c)}\n" for w, c in zip(self.words, self.counts))

    @classmethod
    def load(cls, path: str | Path) -> "Vocabulary":
        """Read a vocabulary written by :meth:`save` (or by GloVe's ``vocab_count``)."""
        with open(path, encoding="utf-8") as f:
            pairs = [line.split() for line in f]
        return cls([w for w, _ in pairs], np.array([int(c) for _, c in pairs], dtype=np.int64))


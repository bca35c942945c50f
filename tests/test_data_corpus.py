"""Tests for simlib.data.corpus: the shipped KJV, streaming loaders, and the vocabulary."""
import gzip
from pathlib import Path

import numpy as np
import pytest

from simlib.data import Vocabulary, iter_text8, iter_text_file, load_kjv, tokenize


def test_kjv_has_every_chapter_in_order():
    kjv = load_kjv()
    assert len(kjv) == 1189
    assert kjv.titles[0] == "Genesis 1" and kjv.titles[-1] == "Revelation 22"
    assert kjv.docs[0][:4] == ["in", "the", "beginning", "god"]
    assert kjv.docs[-1][-4:] == ["with", "you", "all", "amen"]
    assert 780_000 < kjv.n_tokens < 800_000
    assert all(t == t.lower() and t.replace("'", "").isalpha() for d in kjv.docs[:50] for t in d)


def test_kjv_file_is_small_enough_to_ship():
    from simlib.data import KJV_PATH

    assert KJV_PATH.stat().st_size < 2 * 1024 * 1024


def test_tokenize_lowercases_and_keeps_inner_apostrophes():
    assert tokenize("Abram's wife, Sarai; 'Lo!' 12 men") == ["abram's", "wife", "sarai", "lo", "men"]


def test_iter_text_file_streams_lines_as_documents_across_chunk_cuts(tmp_path: Path):
    p = tmp_path / "t.txt"
    p.write_text("Alpha beta gamma\n\nDelta epsilon\nzeta\n")
    # chunk_chars=3 splits every word across chunks: the words must come back whole.
    docs = list(iter_text_file(p, chunk_chars=3))
    assert docs == [["alpha", "beta", "gamma"], ["delta", "epsilon"], ["zeta"]]


def test_iter_text_file_reads_gzip_and_cuts_long_lines(tmp_path: Path):
    p = tmp_path / "t.txt.gz"
    with gzip.open(p, "wt") as f:
        f.write("a b c d e\nf")
    assert list(iter_text_file(p, max_doc_tokens=2)) == [["a", "b"], ["c", "d"], ["e"], ["f"]]


def test_a_gz_file_that_is_not_gzip_or_is_cut_short_is_refused_naming_its_path(tmp_path: Path):
    plain = tmp_path / "plain.txt.gz"
    plain.write_text("a b c\n")
    with pytest.raises(ValueError, match=r"^path: '.*plain\.txt\.gz' ends in .gz but is not gzip"):
        list(iter_text_file(plain))
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(gzip.compress(b"a b c\n" * 1000)[:40])
    with pytest.raises(ValueError, match=r"^path: '.*cut\.txt\.gz' is a damaged gzip file"):
        list(iter_text_file(cut))


def test_iter_text8_splits_one_long_line(tmp_path: Path):
    p = tmp_path / "text8"
    words = [f"w{chr(97 + i % 26)}" for i in range(25)]
    p.write_text(" " + " ".join(words))
    docs = list(iter_text8(p, doc_tokens=10))
    assert [len(d) for d in docs] == [10, 10, 5]
    assert sum(docs, []) == words


def test_loader_rejects_missing_file(tmp_path: Path):
    with pytest.raises(ValueError, match="path"):
        list(iter_text_file(tmp_path / "nope.txt"))


def test_vocabulary_ranks_by_count_and_applies_limits():
    docs = [["b", "a", "b", "c"], ["a", "b", "d", "d"]]
    v = Vocabulary.build(docs)
    assert v.words == ["b", "a", "d", "c"]  # ties broken alphabetically
    assert v.counts.tolist() == [3, 2, 2, 1]
    assert Vocabulary.build(docs, min_count=2).words == ["b", "a", "d"]
    assert Vocabulary.build(docs, max_size=2).words == ["b", "a"]
    assert v.id("d") == 2 and v.count("a") == 2 and "z" not in v
    with pytest.raises(KeyError, match="'z'"):
        v.id("z")


def test_vocabulary_encodes_documents_to_flat_ids_and_offsets():
    v = Vocabulary.build([["x", "x", "y"]])
    ids, offsets = v.encode_docs([["x", "q", "y"], [], ["y"]])
    assert ids.dtype == np.int32 and ids.tolist() == [0, 1, 1]
    assert offsets.tolist() == [0, 2, 2, 3]
    assert v.encode(["x", "q"], drop_unknown=False).tolist() == [0, -1]
    assert v.decode(ids) == ["x", "y", "y"]


def test_vocabulary_save_load_roundtrip(tmp_path: Path):
    v = Vocabulary.build(load_kjv().docs[:3], min_count=2)
    v.save(tmp_path / "vocab.txt")
    w = Vocabulary.load(tmp_path / "vocab.txt")
    assert w.words == v.words and np.array_equal(w.counts, v.counts)


@pytest.mark.parametrize("field, kwargs", [("min_count", {"min_count": 0}), ("max_size", {"max_size": 0})])
def test_vocabulary_rejects_bad_limits(field, kwargs):
    with pytest.raises(ValueError, match=field):
        Vocabulary.build([["a"]], **kwargs)

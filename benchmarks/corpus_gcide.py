"""Build the 5 M-token dictionary corpus from Debian's ``dict-gcide``: one entry per line.

The Collaborative International Dictionary of English (Webster's 1913 with WordNet additions) is
packaged for the ``dictd`` server as ``gcide.dict.dz`` (gzip-compatible text) and ``gcide.index``
(a headword, then the entry's byte offset and length in base 64, per line). This script cuts the
text at the index's entries, keeps each entry once (several headwords can share one), drops the
database's own ``00-database-*`` entries, and writes every entry as one line: a document for
``benchmarks/glove.py FILE`` and ``benchmarks/lda.py --corpus FILE``. Run::

    sudo apt-get install dict-gcide          # Debian and Ubuntu
    python benchmarks/corpus_gcide.py gcide.txt.gz
"""
from __future__ import annotations

import argparse
import gzip
from pathlib import Path

DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"  # dictd's base-64 numbers


def b64_number(text: str) -> int:
    """A dictd index number: base 64, most significant digit first."""
    n = 0
    for ch in text:
        n = 64 * n + DIGITS.index(ch)
    return n


def entries(index: Path, data: bytes) -> list[str]:
    """Every entry of the dictionary once, in the text's order, as one line of words."""
    spans = set()
    with open(index, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 3 and not parts[0].startswith("00-database"):
                spans.add((b64_number(parts[1]), b64_number(parts[2])))
    out = []
    for offset, length in sorted(spans):
        text = " ".join(data[offset:offset + length].decode("utf-8", errors="replace").split())
        if not text.startswith("00-database"):  # the database's own notes, whatever headword points there
            out.append(text)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output", help="the corpus file to write (gzipped if it ends in .gz)")
    ap.add_argument("--dict-dir", default="/usr/share/dictd", help="where dict-gcide put gcide.dict.dz and gcide.index")
    args = ap.parse_args()
    folder = Path(args.dict_dir)
    if not (folder / "gcide.index").is_file():
        ap.error(f"no gcide.index in {folder}: install Debian's dict-gcide, or name its folder with --dict-dir")
    with gzip.open(folder / "gcide.dict.dz", "rb") as f:
        data = f.read()
    docs = entries(folder / "gcide.index", data)
    opener = gzip.open if args.output.endswith(".gz") else open
    with opener(args.output, "wt", encoding="utf-8") as f:
        for doc in docs:
            f.write(doc + "\n")
    words = sum(len(d.split()) for d in docs)
    print(f"{args.output}: {len(docs):,} entries, {words:,} whitespace-separated words")


if __name__ == "__main__":
    main()

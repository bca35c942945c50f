"""Regenerate ``kjv.txt.gz`` from Debian's ``bible-kjv`` package (needs the ``bible`` program).

Run ``python -m simlib.data.make_kjv``. The output is one line per chapter::

    Genesis 1<TAB>in the beginning god created the heaven and the earth and ...

Normalisation (also stated in README.md): lowercase the text, drop verse numbers, keep runs of
ASCII letters with inner apostrophes (``abram's`` stays one token), drop all other characters.
"""
from __future__ import annotations

import gzip
import re
import subprocess

from simlib.data.corpus import KJV_PATH as OUT, tokenize

_HEADER = re.compile(r"^([1-3]?\s?[A-Z][A-Za-z ]*?) (\d+)$")


def split_chapters(raw: str) -> list[tuple[str, str]]:
    """Split the ``bible`` program's output into (title, text) pairs, one per chapter."""
    chapters: list[tuple[str, list[str]]] = []
    previous_blank = True
    for line in raw.splitlines():
        header = _HEADER.match(line)
        # A chapter header is a "Book N" line after a blank line; verse text never starts flush left
        # after a blank line, but may start flush left when wrapped, hence the blank-line test.
        if header and previous_blank:
            chapters.append((f"{header.group(1)} {header.group(2)}", []))
        elif chapters:
            chapters[-1][1].append(line)
        previous_blank = not line.strip()
    return [(title, "\n".join(lines)) for title, lines in chapters]


def main() -> None:
    """Extract the whole Bible with ``bible`` and write the gzipped chapter-per-line corpus."""
    raw = subprocess.run(["bible", "Gen1:1-Rev22:21"], check=True, capture_output=True, text=True).stdout
    chapters = split_chapters(raw)
    if len(chapters) != 1189:
        raise RuntimeError(f"expected 1189 chapters, parsed {len(chapters)}")
    # mtime=0 makes the gzip bytes reproducible, so regenerating does not change the file.
    with open(OUT, "wb") as raw_out, gzip.GzipFile(fileobj=raw_out, mode="wb", mtime=0, compresslevel=9) as gz:
        for title, text in chapters:
            gz.write(f"{title}\t{' '.join(tokenize(text))}\n".encode("ascii"))
    print(f"wrote {OUT.name}: {len(chapters)} chapters")


if __name__ == "__main__":
    main()

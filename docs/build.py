"""Build the course site, offline, from this checkout: ``python docs/build.py`` -> docs/_build/html/index.html.

Sphinx with MyST-NB and the book theme (all from requirements.txt; nothing is fetched at build time).
The lessons are executed by the build, in default mode unless ``--quick`` (SIMLIB_QUICK=1, the
tests' smaller runs), and their outputs cached by jupyter-cache under docs/_build/: a later build
re-runs only a lesson whose code changed. The cache is kept per mode and per version of the library
(a hash of simlib's sources), so a changed library re-runs every lesson; ``--fresh`` empties it anyway.

    python docs/build.py             # the site, lessons in default mode
    python docs/build.py --quick     # smaller runs (what the browser test builds)
    python docs/build.py --fresh     # re-run every lesson
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "docs" / "_build"


def library_hash() -> str:
    """SHA-256 (first 12 hex digits) of every source file of simlib/, by path and content."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "simlib").rglob("*.py")):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def cache_folder(quick: bool) -> Path:
    """Where executed lessons are kept: jupyter-cache keys a notebook by its code only, so the mode and the
    library's version name the folder; the folders of older versions of this mode are removed."""
    mode = "quick" if quick else "full"
    folder = BUILD / f".jupyter_cache_{mode}_{library_hash()}"
    for old in BUILD.glob(f".jupyter_cache_{mode}_*"):
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)
    return folder


def build(out: Path, quick: bool = False, fresh: bool = False) -> int:
    """Run sphinx-build on the repository with docs/conf.py; returns its exit status."""
    cache = cache_folder(quick)
    if fresh:
        shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if quick:
        env["SIMLIB_QUICK"] = "1"
    else:
        env.pop("SIMLIB_QUICK", None)
    env["SIMLIB_DOCS_CACHE"] = str(cache)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(ROOT / "docs"), "-q", "-W", "--keep-going",
           "-d", str(BUILD / ".doctrees" / ("quick" if quick else "full")), str(ROOT), str(out)]
    return subprocess.run(cmd, env=env, cwd=ROOT).returncode


def main(argv: list[str] | None = None) -> int:
    """Build the site; print where its start page is."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="run the lessons in quick mode (SIMLIB_QUICK=1)")
    ap.add_argument("--fresh", action="store_true", help="empty the executed-lesson cache first")
    ap.add_argument("--out", type=Path, default=BUILD / "html", help="output folder (default docs/_build/html)")
    args = ap.parse_args(argv)
    status = build(args.out, args.quick, args.fresh)
    if status == 0:
        print(f"site written: {args.out / 'index.html'}")
    return status


if __name__ == "__main__":
    sys.exit(main())

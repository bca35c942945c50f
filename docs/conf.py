"""Sphinx configuration of the course site: the docs/ pages, the lessons rendered with their outputs, the API.

The source folder is the repository (so ``lessons/*.ipynb`` are pages as they are, never copied);
only the pages named in ``include_patterns`` are read. Build it with ``python docs/build.py``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # autodoc imports this checkout's simlib

project = "simlib"
author = "the simlib authors"
copyright = "the simlib authors"
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
root_doc = "docs/index"
include_patterns = ["docs/*.md", "lessons/[0-9]*.ipynb"]  # live.ipynb is the panel: it needs a kernel to show
exclude_patterns = ["docs/_build", "docs/README.md"]
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "misc.highlighting_failure"]

# The lessons are executed by the build and their outputs cached (jupyter-cache, keyed by each notebook's
# code; build.py names the folder by mode and library version). SIMLIB_DOCS_EXECUTE=off renders them unrun.
nb_execution_mode = os.environ.get("SIMLIB_DOCS_EXECUTE", "cache")
nb_execution_cache_path = os.environ.get("SIMLIB_DOCS_CACHE", str(ROOT / "docs" / "_build" / ".jupyter_cache"))
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

html_theme = "sphinx_book_theme"
html_title = "simlib: distributed ML you can run, measure and grade"
html_theme_options = {"show_toc_level": 2, "home_page_in_toc": True, "use_download_button": True}
html_extra_path = ["_redirect"]  # an index.html at the top that opens docs/index.html
html_show_sourcelink = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"

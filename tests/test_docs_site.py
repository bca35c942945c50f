"""The course site: built from the repository by ``docs/build.py``, every page opened in headless Chromium.

The build executes every lesson (quick mode, as the notebook tests do, which run in every suite), about 4
minutes from a fresh clone, so this module is marked heavy: ``python -m pytest --heavy tests/test_docs_site.py``.
It is skipped, with the reason, where Chromium, Playwright or the Sphinx packages are missing.
"""
from __future__ import annotations

import html.parser
import importlib.util
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.notebook, pytest.mark.heavy]

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted(p.stem for p in (ROOT / "lessons").glob("[0-9]*.ipynb"))

for _package in ("sphinx", "myst_nb", "sphinx_book_theme"):
    if importlib.util.find_spec(_package) is None:
        pytest.skip(f"{_package} is not installed (pip install -r requirements.txt)", allow_module_level=True)
from test_browser_live import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS  # noqa: E402  (skips without Chromium)

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built by the documented command into a fresh folder (lessons from the build's cache)."""
    out = tmp_path_factory.mktemp("site") / "html"
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "build.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def page(site):
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        p = browser.new_page()
        p.set_default_timeout(TIMEOUT_MS)
        errors: list[str] = []
        p.on("pageerror", lambda exc: errors.append(str(exc)))
        p.errors = errors
        yield p
        browser.close()


def _url(path: Path, query: str = "") -> str:
    return path.resolve().as_uri() + query


def test_the_start_page_opens_with_a_path_per_user(site, page):
    page.goto(_url(site / "index.html"))  # the top index opens docs/index.html
    page.wait_for_url("**/docs/index.html")
    assert "simlib" in page.title()
    links = page.eval_on_selector_all("article a", "els => els.map(e => e.getAttribute('href'))")
    for target in ("students.html", "instructors.html", "lecturers.html", "lessons.html", "api.html"):
        assert any(h and h.split("#")[0] == target for h in links), (target, links)
    assert page.errors == []


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_lesson_page_shows_its_figures(site, page, lesson):
    page.goto(_url(site / "lessons" / f"{lesson}.html"))
    page.wait_for_load_state("load")
    sizes = page.eval_on_selector_all(".cell_output img", "els => els.map(e => [e.naturalWidth, e.naturalHeight])")
    assert sizes and all(w > 100 and h > 100 for w, h in sizes), (lesson, sizes)  # figures drawn, not broken images
    assert page.locator(".cell_output .traceback, .cell_output .output.error").count() == 0, lesson
    assert page.errors == []


def test_search_finds_a_lesson_by_a_word_in_it(site, page):
    page.goto(_url(site / "search.html", "?q=Hogwild"))
    page.wait_for_selector("#search-results ul.search li a")
    found = page.eval_on_selector_all("#search-results ul.search li a", "els => els.map(e => e.getAttribute('href'))")
    assert any("lessons/05-hogwild" in h for h in found), found


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and ((tag == "a" and name == "href") or (tag in ("img", "script") and name == "src")):
                self.targets.append(value)


def test_no_internal_link_is_broken(site):
    broken = []
    for page in site.rglob("*.html"):
        if "_static" in page.relative_to(site).parts:  # the theme's template fragments, not pages
            continue
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8"))
        for target in parser.targets:
            parts = urlsplit(target)
            if parts.scheme or parts.netloc or not parts.path:  # another site, or an anchor on this page
                continue
            if not (page.parent / unquote(parts.path)).exists():
                broken.append((str(page.relative_to(site)), target))
    assert broken == []

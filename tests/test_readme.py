"""The README's two commands tell a newcomer what the tests need beyond the requirements."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _section(text: str, heading: str) -> str:
    return text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_test_command_says_how_to_get_chromium_as_ci_does():
    ci = (ROOT / ".ci" / "run").read_text()
    package = re.search(r"apt-get install [^)]*?(\w+)\)", ci).group(1)  # the package CI installs
    assert package == "chromium"
    commands = _section((ROOT / "README.md").read_text(), "Two commands")
    assert re.search(rf"apt-get install -y (--no-install-recommends )?{package}\b", commands), commands
    assert "browser tests" in commands and "skipped" in commands, commands


def test_what_you_will_see_is_what_the_main_command_prints(tmp_path):
    """The README's table is the main job's output today (it once showed a staleness from before tau)."""
    import subprocess
    import sys

    shown = _section((ROOT / "README.md").read_text(), "What you will see").split("```\n", 2)[1]
    out = subprocess.run([sys.executable, "-m", "simlib", "compare"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == shown.splitlines(), out.stdout
    assert (tmp_path / "simlib_out" / "compare.png").stat().st_size > 0


def test_the_readme_is_read_in_two_minutes():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    assert "python -m pytest -q" in _section("\n".join(lines) + "\n", "Two commands")


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # a Markdown link's target, without its anchor


def test_every_relative_link_of_the_readme_and_the_docs_finds_its_file():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = [(page.name, target) for page in pages for target in LINK.findall(page.read_text())
              if "://" not in target and not (page.parent / target).exists()]
    assert broken == []


def test_the_material_moved_out_of_the_readme_is_in_the_docs():
    """The long sections live on their own pages, which the README links."""
    readme = (ROOT / "README.md").read_text()
    for page, words in {"students.md": "Coverage of the course's topics", "instructors.md": "Threat model",
                        "lecturers.md": "Projector mode", "architecture.md": "One staleness",
                        "benchmarks.md": "A larger corpus", "tests.md": "fault matrix", "ray.md": "Placement"}.items():
        assert words in (ROOT / "docs" / page).read_text(), page
        assert f"(docs/{page})" in readme, page


def test_the_coverage_table_is_one_table_with_a_row_for_every_lecture_topic():
    """Every row of the coverage table sits in one block under its header (a blank line once cut two rows off, which
    then rendered as loose text), and Spark, TensorFlow's programming model and second-order methods have rows."""
    coverage = (ROOT / "docs" / "students.md").read_text().split("**Coverage of the course's topics.**", 1)[1]
    table = coverage.split("| topic | lesson(s) |\n", 1)[1].split("\n\n", 1)[0].splitlines()
    rows = [line for line in table[1:] if line.startswith("| ")]
    assert table[0].startswith("|---") and rows == table[1:], table[:2]
    assert [int(row[2:].split(".", 1)[0]) for row in rows] == list(range(1, len(rows) + 1))
    for topic in ("Spark", "TensorFlow's programming model", "Second-order methods"):
        assert any(topic in row for row in rows), topic

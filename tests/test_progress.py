"""Progress is tqdm's everywhere in simlib: a bar on a terminal, nothing drawn by hand, plain lines for a log."""
import io
import re
from pathlib import Path

from simlib.grade.gradebook import Progress

ROOT = Path(__file__).resolve().parents[1]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_grading_progress_is_a_bar_on_a_terminal():
    out = _Terminal()
    p = Progress(3, out)
    for name in ("alice", "bob", "carol"):
        p.step(name, 5, 5, cached=False)
    text = out.getvalue()
    assert "3/3" in text and "100%" in text and "student" in text
    assert "graded" not in text  # the bar, not the log lines


def test_grading_progress_off_a_terminal_is_one_line_per_student():
    out = io.StringIO()
    p = Progress(2, out)
    p.step("alice", 5, 5, cached=False)
    p.step("bob", 3, 5, cached=True)
    assert out.getvalue() == "graded 1/2: alice 5/5\ngraded 2/2: bob 3/5 (cached)\n"


def test_no_progress_bar_is_drawn_by_hand_in_the_library():
    drawn = re.compile(r"""\\r\[|['"]#['"] \*""")  # '\r[' then a bar of '#' * n: a bar drawn by hand
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "simlib").rglob("*.py") if drawn.search(p.read_text())]
    assert found == []

"""Every lesson runs from a fresh kernel without errors, and is committed without outputs."""
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for d in ("lessons", "solutions") for p in (ROOT / d).glob("*.ipynb"))
# The live panel is exercised in a real browser (tests/test_browser_live.py); the master solutions run from fresh
# kernels in the grader's sandbox, where each must also score full marks
# (tests/test_grade.py::test_solution_scores_full_marks_and_student_version_zero).
EXECUTED = [p for p in NOTEBOOKS if p.parent.name == "lessons" and p.name != "live.ipynb"]


def _ids(paths):
    return [f"{p.parent.name}/{p.name}" for p in paths]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_without_outputs(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs") and cell.get("execution_count") is None, f"{path.name} has outputs"


LESSONS = [p for p in NOTEBOOKS if p.parent.name == "lessons" and p.name[:2].isdigit()]


def _numbered(text):
    return [int(n) for n in re.findall(r"^(\d+)\. ", text, re.M)]


@pytest.mark.parametrize("path", LESSONS, ids=_ids(LESSONS))
def test_every_exercise_has_a_worked_answer_in_the_instructors_guide(path):
    """Each lesson's '## Exercises' items 1..k have answers 1..k under the lesson's number in solutions/INSTRUCTORS.md."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    found = re.search(r"^#+ Exercises\s*\n(.*?)(?=^#|\Z)", text, re.S | re.M)
    assert found, f"{path.name} has no Exercises section"
    exercises = _numbered(found.group(1))
    assert exercises == list(range(1, len(exercises) + 1)) and exercises, f"{path.name}: exercises {exercises}"
    guide = (ROOT / "solutions" / "INSTRUCTORS.md").read_text(encoding="utf-8")
    section = re.search(rf"^## {path.name[:2]} · .*?\n(.*?)(?=^## |\Z)", guide, re.S | re.M)
    assert section, f"INSTRUCTORS.md has no section '## {path.name[:2]} · ...'"
    assert _numbered(section.group(1)) == exercises, f"INSTRUCTORS.md answers lesson {path.name[:2]}'s exercises " \
                                                      f"{_numbered(section.group(1))}, the lesson has {exercises}"


@pytest.fixture
def quick_mode(monkeypatch):
    """Lessons shrink their runs (simlib.course.checks.sized) when SIMLIB_QUICK is set; the kernel inherits os.environ."""
    monkeypatch.setenv("SIMLIB_QUICK", "1")


@pytest.mark.notebook
@pytest.mark.parametrize("path", EXECUTED, ids=_ids(EXECUTED))
def test_lesson_runs_from_fresh_kernel(path, tmp_path, quick_mode):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(str(path), as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # the per-cell timeout is the hang guard; lesson times are benchmarks/lessons.py's
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: {errors[0]['ename']}: {errors[0]['evalue']}"
    figures = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
    assert figures >= 1, f"{path.name} shows no figure"

"""Every lesson runs from a fresh kernel without errors, and is committed without outputs."""
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for d in ("lessons", "solutions") for p in (ROOT / d).glob("*.ipynb"))
# The live panel is exercised in a real browser (tests/test_browser_live.py).
EXECUTED = [p for p in NOTEBOOKS if p.name != "live.ipynb"]


def _ids(paths):
    return [f"{p.parent.name}/{p.name}" for p in paths]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_without_outputs(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs") and cell.get("execution_count") is None, f"{path.name} has outputs"


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

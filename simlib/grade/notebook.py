"""nbgrader markup: solution and hidden-test blocks, cell metadata, and the student versions.

A master notebook (``solutions/NN-name.ipynb``) marks cells with nbgrader's metadata
(``metadata.nbgrader``: ``grade``, ``solution``, ``locked``, ``grade_id``, ``points``,
``schema_version: 3``), so nbgrader reads it unchanged:

* an autograded answer (``solution``): code between ``### BEGIN SOLUTION`` and ``### END SOLUTION``
  becomes ``raise NotImplementedError("Assignment N, part K")``;
* autograder tests (``grade``, ``locked``, with ``points``): lines between ``### BEGIN HIDDEN
  TESTS`` and ``### END HIDDEN TESTS`` are removed from the student version;
* a manually graded answer (markdown, ``solution`` and ``grade``): the solution becomes
  "YOUR ANSWER HERE";
* read-only cells (``locked``): set-up and instructions.
"""
from __future__ import annotations

import ast
import copy
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
ANSWER_HERE = "YOUR ANSWER HERE"
_NUMBER = re.compile(r"^(\d+)")


class NotebookError(ValueError):
    """A file that is not a readable notebook (bad JSON, no cells)."""


@dataclass(frozen=True)
class Part:
    """A graded cell: an autograded test cell ('tests') or a hand-graded answer ('manual')."""

    grade_id: str
    points: float
    kind: str


def meta(cell: dict[str, Any]) -> dict[str, Any]:
    """The cell's nbgrader metadata ({} if none)."""
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def source(cell: dict[str, Any]) -> str:
    """The cell's source as one string (nbformat allows a list of lines)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def is_test(cell: dict[str, Any]) -> bool:
    """An autograder test cell: graded code that is not an answer."""
    return cell.get("cell_type") == "code" and bool(meta(cell).get("grade")) and not is_answer(cell)


def is_answer(cell: dict[str, Any]) -> bool:
    """A cell the student writes in (autograded code or a hand-graded answer)."""
    return bool(meta(cell).get("solution"))


def load(path: Path | str) -> dict[str, Any]:
    """Read a notebook's JSON; NotebookError saying what is wrong if it is not one."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise NotebookError(f"not a valid notebook ({path}: {exc.strerror})") from None
    return loads(data)


def loads(data: bytes) -> dict[str, Any]:
    """Parse notebook bytes; NotebookError if they are not a notebook."""
    try:
        nb = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NotebookError(f"not a valid notebook ({type(exc).__name__}: {exc})") from None
    except RecursionError:
        raise NotebookError("not a valid notebook (JSON nested too deeply)") from None
    return check(nb)


CELL_TYPES = ("code", "markdown", "raw")


def check(nb: Any) -> dict[str, Any]:
    """The notebook itself if its cells have the types nbformat 4 gives them, else NotebookError naming the first
    that does not (a list of cells; each a dict with a known cell_type, a source that is a string or a list of
    strings, metadata and nbgrader metadata that are dicts, a grade_id that is a string, points a number)."""
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        raise NotebookError("not a valid notebook (no list of cells)")
    for k, cell in enumerate(cells, 1):
        if not isinstance(cell, dict) or cell.get("cell_type") not in CELL_TYPES:
            raise NotebookError(f"not a valid notebook (cell {k} is not a cell with a cell_type of {', '.join(CELL_TYPES)})")
        src = cell.get("source", "")
        if not (isinstance(src, str) or isinstance(src, list) and all(isinstance(x, str) for x in src)):
            raise NotebookError(f"not a valid notebook (cell {k}: source is neither a string nor a list of strings)")
        md = cell.get("metadata", {})
        if not isinstance(md, dict) or not isinstance(md.get("nbgrader", {}) or {}, dict):
            raise NotebookError(f"not a valid notebook (cell {k}: metadata or its nbgrader entry is not a dictionary)")
        grader = md.get("nbgrader") or {}
        if not isinstance(grader.get("grade_id", ""), str):
            raise NotebookError(f"not a valid notebook (cell {k}: grade_id is not a string)")
        points = grader.get("points", 0)
        if isinstance(points, bool) or not isinstance(points, (int, float)):
            raise NotebookError(f"not a valid notebook (cell {k}: points is not a number)")
    return nb


def dump(nb: dict[str, Any]) -> str:
    """Notebook JSON as Jupyter writes it (indent 1, key order kept, trailing newline)."""
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def parts(nb: dict[str, Any]) -> list[Part]:
    """The graded parts, in notebook order; a graded solution cell is a hand-graded answer."""
    return [Part(str(meta(c)["grade_id"]), float(meta(c).get("points", 0)), "manual" if is_answer(c) else "tests")
            for c in nb["cells"] if meta(c).get("grade")]


# NOTE: CPython 3.11's conversions between source, AST objects and code keep their recursion depth in state shared by
# threads: two grading threads parsing at once raised "SystemError: AST constructor recursion depth mismatch" and
# graded a master 0 (one fresh-clone CI run). Every ast.parse, literal_eval and compile of an AST here takes this lock.
AST_LOCK = threading.Lock()


def _trees(sources: list[str]) -> list[ast.AST]:
    """Each source parsed (those that do not parse, e.g. with IPython magics, left out)."""
    out = []
    for text in sources:
        try:
            with AST_LOCK:
                out.append(ast.parse(text))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            pass
    return out


def _root(node: ast.AST) -> str:
    """The name a call's target starts from ('simlib' for simlib.protocol.run)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
REFERENCES = "_REFERENCES"  # in a hidden-test block: the library's names that answer the part ('simlib.costs.place')


def hidden_tests(master: dict[str, Any]) -> list[tuple[str, str]]:
    """(grade_id, the hidden-test code) of each test cell."""
    return [(str(meta(c)["grade_id"]), split_hidden(source(c))[1]) for c in master["cells"] if is_test(c)]


def declared(master: dict[str, Any]) -> set[str]:
    """The library's names the hidden tests declare answers: ``_REFERENCES = ["simlib.compress.make_compressor"]``."""
    hidden = _trees([code for _, code in hidden_tests(master)])
    with AST_LOCK:
        return {ref for tree in hidden for node in tree.body if isinstance(node, ast.Assign)
                and [getattr(t, "id", "") for t in node.targets] == [REFERENCES] for ref in ast.literal_eval(node.value)}


def references(master: dict[str, Any]) -> set[str]:
    """What the hidden tests take from the library as the answer: the names they import from simlib
    ('simlib.protocol.may_read') or declare (:func:`declared`), and the keywords they pass to simlib's calls
    that no other cell passes ('staleness_aware')."""
    hidden = _trees([code for _, code in hidden_tests(master)])
    shown = _trees([split_hidden(source(c))[0] if is_test(c) else source(c) for c in master["cells"]
                    if c.get("cell_type") == "code"])
    found: set[str] = set(declared(master))
    # the functions a hidden block defines (the grader's checks: simlib.grade.probe) are not the tests' answer
    for node in (n for tree in hidden for top in tree.body if not isinstance(top, _DEFS) for n in ast.walk(top)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "simlib":
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call) and _root(node.func) == "simlib":
            found.update(k.arg for k in node.keywords if k.arg)
    passed = {n.arg for tree in shown for n in ast.walk(tree) if isinstance(n, ast.keyword)}
    return {r for r in found if "." in r or r not in passed}


def uses(text: str, refs: set[str], names: set[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, reference) for each place the code names one of ``refs`` (see :func:`references`): an import of it,
    an attribute or keyword of its name, or its name as a string (getattr); for those in ``names`` (declared:
    never the student's own function's name), its bare name too (taken from the set-up's import). A static
    look: a name built at run time is seen by the sandbox (:func:`simlib.grade.child.know`)."""
    last = {r.rsplit(".", 1)[-1]: r for r in refs}
    hits: set[tuple[int, str]] = set()
    if not refs:
        return []
    nodes = [n for tree in _trees([text]) for n in ast.walk(tree)]
    own = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} | {
        n.arg for n in nodes if isinstance(n, ast.arg)} | {n.name for n in nodes if isinstance(n, _DEFS)}
    names = set(names) - {last[n] for n in own if n in last}  # a variable of the student's own of that name
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            hits.update((node.lineno, f"{node.module}.{a.name}") for a in node.names if f"{node.module}.{a.name}" in refs)
            continue
        name = (node.attr if isinstance(node, ast.Attribute) else node.arg if isinstance(node, ast.keyword)
                else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str)
                else node.id if isinstance(node, ast.Name) and last.get(node.id) in names else None)
        if name in last and hasattr(node, "lineno"):
            hits.add((node.lineno, last[name]))
    return sorted(hits)


def answers(nb: dict[str, Any], grade_ids: set[str]) -> dict[str, str]:
    """grade_id -> the text of the notebook's cell with that id, for the ids asked for."""
    return {str(meta(c)["grade_id"]): source(c) for c in nb["cells"] if meta(c).get("grade_id") in grade_ids}


def assignment_number(path: Path | str) -> int:
    """N from a file named 'NN-name.ipynb'."""
    m = _NUMBER.match(Path(path).name)
    if m is None:
        raise ValueError(f"assignment: a master notebook is named 'NN-name.ipynb', got {Path(path).name!r}")
    return int(m.group(1))


def _blocks(text: str, begin: str, end: str, what: str) -> list[tuple[str, str]]:
    """(line, where) for each line of ``text``: where is 'begin' or 'end' for a marker, 'in' or 'out' of a block."""
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        mark = line.strip()
        where = "begin" if mark == begin else "end" if mark == end else "in" if inside else "out"
        inside = where == "begin" or inside and where != "end"
        out.append((line, where))
    if inside:
        raise ValueError(f"a {what} cell opens '{begin}' without '{end}'")
    return out


def split_hidden(text: str) -> tuple[str, str]:
    """(visible code, hidden code) of a test cell; the hidden blocks' lines, markers dropped."""
    lines = _blocks(text, BEGIN_HIDDEN, END_HIDDEN, "test")
    return "".join(ln for ln, where in lines if where == "out"), "".join(ln for ln, where in lines if where == "in")


def strip_solution(text: str, stub: str) -> str:
    """Replace each solution block by ``stub``, indented like its BEGIN marker."""
    out = []
    for line, where in _blocks(text, BEGIN_SOLUTION, END_SOLUTION, "solution"):
        if where == "begin":
            indent = line[: len(line) - len(line.lstrip())]
            out.extend(indent + s + "\n" for s in stub.splitlines())
        elif where == "out":
            out.append(line)
    return "".join(out).rstrip("\n")


def student_version(master: dict[str, Any], number: int) -> dict[str, Any]:
    """The student notebook: solutions replaced by stubs, hidden tests removed, outputs cleared."""
    nb = copy.deepcopy(master)
    part = 0
    for cell in nb["cells"]:
        text = source(cell)
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
            if is_answer(cell):
                part += 1
                text = strip_solution(text, f'raise NotImplementedError("Assignment {number}, part {part}")')
            elif is_test(cell):
                text = split_hidden(text)[0].rstrip("\n")
        elif is_answer(cell):
            text = strip_solution(text, ANSWER_HERE) if BEGIN_SOLUTION in text else ANSWER_HERE
        cell["source"] = text
    return nb


def _student_files(solutions: Path | str, assignments: Path | str) -> Iterator[tuple[Path, str]]:
    """(assignments/NN-name.ipynb, its student notebook's JSON) for every solutions/NN-name.ipynb."""
    for master_path in sorted(Path(solutions).glob("[0-9]*.ipynb")):
        student = student_version(load(master_path), assignment_number(master_path))
        yield Path(assignments) / master_path.name, dump(student)


def generate_all(solutions: Path | str, assignments: Path | str) -> list[Path]:
    """Write assignments/NN-name.ipynb for every solutions/NN-name.ipynb; returns the files written."""
    written = []
    for target, text in _student_files(solutions, assignments):
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


def out_of_date(solutions: Path | str, assignments: Path | str) -> list[str]:
    """Names of student notebooks missing or differing from what :func:`generate_all` would write."""
    return [target.name for target, text in _student_files(solutions, assignments)
            if not target.exists() or target.read_text(encoding="utf-8") != text]

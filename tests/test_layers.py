"""The import graph points one way: problems and the trace -> substrates -> calibration / viz -> app / CLI.

Reads every module under simlib/ with ``ast`` (nothing is imported), collects its ``simlib.*``
imports (those inside functions too) and checks them against the layers below.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "simlib"

# The first component under simlib/ names the group (two under simlib/substrates/: one group a
# substrate); each group has a rank, lower ranks sit below.
BOTTOM = {"problems", "trace", "protocol", "contract", "backend", "compress", "_validate", "data", "options", "signals",
          "diverged", "managed", "worker"}
# The engines a substrate runs on: the simulator, and the process infrastructure (workers, shared
# arrays, channels). Each substrate may import its own engine; nothing else at rank 1 crosses over.
ENGINES = {"sim", "parallel"}
ENGINE_OF = {"substrates.sim": {"sim"}, "substrates.shm": {"parallel"}, "substrates.pipes": {"parallel"},
             "substrates.gpu": set(), "substrates.ray": set()}
SUBSTRATES = set(ENGINE_OF)
# The registry (simlib.substrates) finds substrates by name (importlib), and the package root reaches
# them through it; the lessons' helpers (course) may run any substrate; model parallelism (modelpar) runs
# the cost model's schedules on the process engine.
ABOVE_SUBSTRATES = {"calibration", "viz", "substrates", "simlib", "costs", "course", "modelpar"}
TOP = {"app", "cli", "__main__", "grade"}
RANK = {**{g: 0 for g in BOTTOM}, **{g: 1 for g in ENGINES | SUBSTRATES}, **{g: 2 for g in ABOVE_SUBSTRATES},
        **{g: 3 for g in TOP}}
VIZ_MAY_IMPORT = BOTTOM | {"viz"}  # viz draws traces: no substrate, no calibration, no registry


def module_name(path: Path) -> str:
    """simlib/sim/engine.py -> simlib.sim.engine; simlib/sim/__init__.py -> simlib.sim."""
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module under simlib/, by dotted name."""
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def is_module(name: str) -> bool:
    """Whether simlib.a.b names a module or package on disk (not an attribute of one)."""
    path = ROOT.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def simlib_imports(name: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every simlib module that module ``name`` (text ``source``) imports, at any depth."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from simlib import _validate` imports the submodule; `from simlib import run` the package
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((node.lineno, sub if is_module(sub) else base))
    found = list(dict.fromkeys(found))  # `from m import a, b` is one import of m
    return [(line, mod) for line, mod in found if mod == "simlib" or mod.startswith("simlib.")]


def group(module: str) -> str:
    """The layer group of a simlib module: its first component under simlib/ ('simlib' for the root)."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "substrates":
        return f"substrates.{parts[2]}"
    return parts[1] if len(parts) > 1 else "simlib"


def violations(name: str, imported: str) -> str | None:
    """Why ``name`` may not import ``imported``, or None if the import points down (or sideways in one group)."""
    src, dst = group(name), group(imported)
    if src == dst:
        return None
    if src not in RANK or dst not in RANK:
        return f"{src if src not in RANK else dst!r} is in no layer: add it to tests/test_layers.py"
    if RANK[dst] > RANK[src]:
        return f"layer {src!r} (rank {RANK[src]}) imports the higher layer {dst!r} (rank {RANK[dst]})"
    side = ENGINES | SUBSTRATES
    if src in side and dst in side and dst not in ENGINE_OF.get(src, set()):
        what = "substrate" if src in SUBSTRATES else "engine"
        return f"{what} {src!r} imports {dst!r}, not its own engine: move what they share below both"
    if src == "viz" and dst not in VIZ_MAY_IMPORT:
        return f"viz imports {dst!r}: viz only draws traces"
    return None


def test_every_module_is_in_a_layer():
    groups = {group(m) for m in modules()}
    assert groups <= set(RANK), f"modules outside every layer: {sorted(groups - set(RANK))}"
    assert {"sim", "parallel", "substrates", "viz", "app", "calibration", "problems", "course"} | SUBSTRATES <= groups


def test_imports_point_down():
    bad = []
    for name, path in modules().items():
        for line, imported in simlib_imports(name, path.read_text(), path.name == "__init__.py"):
            why = violations(name, imported)
            if why:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line}: {name} imports {imported} ({why})")
    assert not bad, "imports that point up or across:\n" + "\n".join(bad)


@pytest.mark.parametrize("name, imported, expected", [
    ("simlib.sim.probe", "simlib.substrates.pipes", "engine 'sim' imports 'substrates.pipes'"),
    ("simlib.substrates.gpu", "simlib.parallel.group", "substrate 'substrates.gpu' imports 'parallel'"),
    ("simlib.substrates.shm", "simlib.substrates.pipes", "substrate 'substrates.shm' imports 'substrates.pipes'"),
    ("simlib.substrates.pipes", "simlib.sim.engine", "substrate 'substrates.pipes' imports 'sim'"),
    ("simlib.parallel.group", "simlib.substrates.shm", "engine 'parallel' imports 'substrates.shm'"),
    ("simlib.substrates.sim", "simlib.substrates", "higher layer"),
    ("simlib.problems.lda", "simlib.course.checks", "higher layer"),
    ("simlib.viz.panel", "simlib.sim", "viz only draws traces"),
    ("simlib.viz.plots", "simlib.calibration.validate", "viz only draws traces"),
    ("simlib.problems.lda", "simlib.parallel.lda", "higher layer"),
    ("simlib.sim.engine", "simlib.viz", "higher layer"),
    ("simlib.calibration.validate", "simlib.app.live", "higher layer"),
    ("simlib.substrates.ray", "simlib.sim.engine", "substrate 'substrates.ray' imports 'sim'"),
])
def test_the_rule_catches_what_it_should(name, imported, expected):
    why = violations(name, imported)
    assert why is not None and expected in why, why


@pytest.mark.parametrize("name, imported", [
    ("simlib.sim.engine", "simlib.problems.logistic"),
    ("simlib.calibration.validate", "simlib.substrates.pipes"),
    ("simlib.calibration.validate", "simlib.viz"),
    ("simlib.app.live", "simlib.viz.anim"),
    ("simlib.cli", "simlib.app.serve"),
    ("simlib.parallel.group", "simlib.parallel.shm"),
    ("simlib.substrates.shm", "simlib.parallel.group"),
    ("simlib.substrates.sim", "simlib.sim.engine"),
    ("simlib.course.glove_twin", "simlib.substrates.sim"),
])
def test_the_rule_allows_imports_that_point_down(name, imported):
    assert violations(name, imported) is None


def test_imports_are_found_inside_functions_and_from_packages():
    source = ("from simlib import _validate as check\nfrom simlib import run\nimport numpy\n"
              "def f():\n    from simlib.parallel.lda import train_parallel\n    import simlib.trace\n"
              "    from ..problems import lda\n    from . import engine\n")
    found = simlib_imports("simlib.sim.probe", source)
    assert found == [(1, "simlib._validate"), (2, "simlib"), (5, "simlib.parallel.lda"), (6, "simlib.trace"),
                     (7, "simlib.problems.lda"), (8, "simlib.sim.engine")]


# -- settings that travel together are one object (docs/architecture.md) ------------------------------
MAX_PARAMETERS = 8


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters of ``fn``, *args and **kwargs included, a method's self or cls not."""
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)] + [p.arg for p in (a.vararg, a.kwarg) if p]
    return len(names) - (names[:1] in (["self"], ["cls"]))


def test_no_function_takes_more_than_eight_parameters():
    wide = [f"{name}.{fn.name} ({parameter_count(fn)})" for name, path in modules().items()
            for fn in ast.walk(ast.parse(path.read_text()))
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and parameter_count(fn) > MAX_PARAMETERS]
    assert wide == [], "group related arguments into one object (a dataclass, or a tuple for a numba kernel)"


@pytest.mark.parametrize("source, expected", [
    ("def f(self, a, b=1, *c, d, **e): pass", 5), ("def f(a, /, b, *, c): pass", 3), ("def f(): pass", 0),
])
def test_the_parameter_count_leaves_out_self_and_counts_the_rest(source, expected):
    assert parameter_count(ast.parse(source).body[0]) == expected

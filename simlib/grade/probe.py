"""Hidden checks outside the student's interpreter: calls chosen by the grader, answered with plain values.

A master's hidden-test block may define ``_probes(rng)``, which returns the calls that check its
part, drawn from ``rng`` (seeded afresh for each grading folder, never shipped with the assignment).
For such a part the grader (trusted; it runs no student code) does not send the hidden tests into the
sandbox at all. It runs ``_probes`` itself, sends only the calls, and the sandboxed notebook answers
each with a plain value (JSON: numbers, strings, booleans, None, lists, string-keyed dicts; NumPy
arrays as lists; never pickle). The same calls go to the master's own sandboxed run, and a part
passes only where the student's values equal the master's (floats to ``rtol`` 1e-9, ``atol`` 1e-12).
Tampering inside the sandbox can then change only the values sent, and only code that computes the
right values on unseen inputs gets the points. nbgrader ignores ``_probes`` and runs the hidden
asserts as before.

A call is ``{"call": "name", "args": [...], "kwargs": {...}, "take": "a.b.c"}``: ``name`` (dotted)
is looked up in the notebook's namespace, then in builtins; an argument that is a dict is itself a
call, or ``{"name": "x"}`` for a value of the namespace (``problem``, the student's ``may_read``);
``take`` reads attributes off the result, from each item of a sequence (``trace.updates.time``).

    >>> same({"t": [1.0, 2.0]}, {"t": [1.0, 2.0 + 1e-13]})
    True
"""
from __future__ import annotations

import ast
import builtins
import json
import math
from typing import Any

import numpy as np

PROBES = "_probes"
MAX_DEPTH = 20
MAX_ITEMS = 100_000  # per list or array in a reply (a reply's frame is capped at 1 MB besides)


class TooLarge(Exception):
    """A reply with more than MAX_ITEMS items in one list."""


def calls(hidden: str, seed: int) -> list[dict[str, Any]] | None:
    """The calls a hidden-test block's ``_probes`` draws with ``seed`` (None if it defines none); trusted code only."""
    tree = ast.parse(hidden)
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == PROBES]
    if not defs:
        return None
    namespace: dict[str, Any] = {"math": math, "np": np}
    exec(compile(ast.Module(body=defs, type_ignores=[]), f"<{PROBES}>", "exec"), namespace)  # the master's code
    drawn = namespace[PROBES](np.random.default_rng(seed))
    if not isinstance(drawn, list) or not all(isinstance(c, dict) and "call" in c for c in drawn):
        raise ValueError(f"{PROBES} must return a list of calls ({{'call': name, ...}}), got {type(drawn).__name__}")
    return json.loads(json.dumps(drawn))  # plain JSON, as the sandbox will read it


# -- the sandbox's side ---------------------------------------------------------------------------
def _lookup(name: str, namespace: dict[str, Any]) -> Any:
    """A dotted name from the notebook's namespace (else builtins)."""
    head, *rest = name.split(".")
    if head not in namespace and not hasattr(builtins, head):
        raise NameError(f"name {head!r} is not defined")
    value = namespace[head] if head in namespace else getattr(builtins, head)
    for attr in rest:
        value = getattr(value, attr)
    return value


def _take(value: Any, path: str) -> Any:
    """value.a.b for path 'a.b'; where the value has no such attribute, it is taken from each of its items."""
    for attr in filter(None, path.split(".")):
        value = getattr(value, attr) if hasattr(value, attr) else [getattr(v, attr) for v in value]
    return value


def evaluate(arg: Any, namespace: dict[str, Any]) -> Any:
    """An argument: a call or a name when it is a dict, else the JSON value itself."""
    if isinstance(arg, dict):
        if "name" in arg:
            return _lookup(arg["name"], namespace)
        fn = _lookup(arg["call"], namespace)
        args = [evaluate(a, namespace) for a in arg.get("args", [])]
        kwargs = {k: evaluate(v, namespace) for k, v in arg.get("kwargs", {}).items()}
        return _take(fn(*args, **kwargs), arg.get("take", ""))
    return [evaluate(a, namespace) for a in arg] if isinstance(arg, list) else arg


def plain(value: Any, depth: int = 0) -> Any:
    """The value as JSON data; TypeError for anything else (objects, functions, pickles)."""
    if depth > MAX_DEPTH:
        raise TypeError("the value is nested too deeply")
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        if value.size > MAX_ITEMS:
            raise TooLarge
        return plain(value.tolist(), depth + 1)
    if type(value) in (list, tuple):
        if len(value) > MAX_ITEMS:
            raise TooLarge
        return [plain(v, depth + 1) for v in value]
    if type(value) is dict and all(type(k) is str for k in value):
        return {k: plain(v, depth + 1) for k, v in value.items()}
    raise TypeError(f"returned a {type(value).__name__}, not a plain value")


def answer(call: dict[str, Any], namespace: dict[str, Any]) -> dict[str, Any]:
    """{'value': plain value} of one call in the notebook's namespace, or {'error': the exception's type}."""
    try:
        return {"value": plain(evaluate(call, namespace))}
    except BaseException as exc:  # noqa: BLE001 - the student's code may raise anything, SystemExit included
        return {"error": type(exc).__name__}


# -- the grader's side ----------------------------------------------------------------------------
def same(got: Any, want: Any, rtol: float = 1e-9, atol: float = 1e-12) -> bool:
    """Whether the student's value equals the master's: numbers to |got - want| <= atol + rtol |want|."""
    if isinstance(want, bool) or isinstance(got, bool) or isinstance(want, str) or want is None:
        return type(got) is type(want) and got == want
    if isinstance(want, (int, float)):
        return (type(got) in (int, float) and (got == want or abs(got - want) <= atol + rtol * abs(want)
                                              or math.isnan(got) and math.isnan(want)))
    if isinstance(want, list):
        return type(got) is list and len(got) == len(want) and all(same(g, w, rtol, atol) for g, w in zip(got, want))
    if isinstance(want, dict):
        return type(got) is dict and got.keys() == want.keys() and all(same(got[k], want[k], rtol, atol) for k in want)
    return False


def _innermost(call: dict[str, Any]) -> str:
    """The name of the call a call wraps first ('may_read' in bool(may_read(...)))."""
    inner = [a for a in call.get("args", []) if isinstance(a, dict) and "call" in a]
    return _innermost(inner[0]) if inner else str(call.get("call"))


def verdict(replies: Any, expected: list[dict[str, Any]], drawn: list[dict[str, Any]]) -> str:
    """'' if every reply has the master's value, else which call differed (by name only: no value is shown)."""
    if not isinstance(replies, list) or len(replies) != len(expected):
        return "the sandbox did not answer every call"
    for k, (got, want, call) in enumerate(zip(replies, expected, drawn), 1):
        where = f"call {k} of {len(drawn)} ({_innermost(call)[:40]})"
        if not isinstance(got, dict) or "value" not in got:
            name = str(got.get("error", "")) if isinstance(got, dict) else ""
            if name == TooLarge.__name__:
                return f"{where} returned more than {MAX_ITEMS} items in one list"
            known = isinstance(getattr(builtins, name, None), type) and issubclass(getattr(builtins, name), BaseException)
            return f"{where} raised {name if known else 'an exception'}"  # a class's name could carry anything
        if not same(got["value"], want.get("value")):
            return f"{where} gave a value that differs from the master's on inputs drawn for this grading"
    return ""

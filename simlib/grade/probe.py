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

A call is ``{"call": "name", "args": [...], "kwargs": {...}, "take": "a.b.c", "as": "$x"}``, or
``{"name": "x", ...}`` for a value without calling it: ``name`` (dotted) is looked up in the notebook's
namespace, then in builtins, or for ``$x`` among the values an earlier call of the same part kept
with ``"as": "$x"`` (a state to call again: a compressor, GloVe's parameters, a worker group; its
reply is None unless it has a ``take``). An argument that is a dict is itself such a call.
``take`` reads attributes off the result, from each item of a sequence (``trace.updates.time``);
a number indexes (``0.dtype``), and a list of paths gives a list. Keys the grader alone reads are
never sent: ``rtol`` and ``atol`` (the tolerance of this call's comparison), ``raises`` (the
exception's type name both must raise) and ``check``: the name of a function of the hidden-test
block (``[name, data...]`` to give it data), run by the grader (trusted) as ``check(student's value,
master's value, call)`` where equal values are not the test (a sampler's draws, Hogwild!'s races): true passes.

    >>> same({"t": [1.0, 2.0]}, {"t": [1.0, 2.0 + 1e-13]})
    True
"""
from __future__ import annotations

import ast
import builtins
import functools
import json
import math
from typing import Any

import numpy as np

from simlib.grade.notebook import AST_LOCK

PROBES = "_probes"
MAX_DEPTH = 20
MAX_ITEMS = 100_000  # per list or array in a reply (a reply's frame is capped at 1 MB besides)


class TooLarge(Exception):
    """A reply with more than MAX_ITEMS items in one list."""


GRADER_KEYS = ("rtol", "atol", "raises", "check")


def functions(hidden: str) -> dict[str, Any]:
    """The functions a hidden-test block defines at its top level (``_probes``, checks), made here: trusted code only."""
    with AST_LOCK:
        defs = [n for n in ast.parse(hidden).body if isinstance(n, ast.FunctionDef)]
        code = compile(ast.Module(body=defs, type_ignores=[]), f"<{PROBES}>", "exec")
    namespace: dict[str, Any] = {"math": math, "np": np}
    exec(code, namespace)  # the master's code
    return {n.name: namespace[n.name] for n in defs}


def calls(hidden: str, seed: int) -> list[dict[str, Any]] | None:
    """The calls a hidden-test block's ``_probes`` draws with ``seed`` (None if it defines none); trusted code only."""
    made = functions(hidden)
    if PROBES not in made:
        return None
    drawn = made[PROBES](np.random.default_rng(seed))
    if not isinstance(drawn, list) or not all(isinstance(c, dict) and ("call" in c or "name" in c) for c in drawn):
        raise ValueError(f"{PROBES} must return a list of calls ({{'call': name, ...}}), got {type(drawn).__name__}")
    missing = {check_name(c) for c in drawn if "check" in c} - set(made)
    if missing:
        raise ValueError(f"{PROBES}: the hidden tests define no check named {', '.join(sorted(missing))}")
    return json.loads(json.dumps(drawn))  # plain JSON, as the sandbox will read it


def check_name(call: dict[str, Any]) -> str:
    """The name of a call's check: ``"check": name``, or ``[name, data for it...]``."""
    check = call["check"]
    return str(check[0] if isinstance(check, list) else check)


def sent(drawn: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls as the sandbox gets them: without the keys only the grader reads."""
    return [{k: v for k, v in call.items() if k not in GRADER_KEYS} for call in drawn]


# -- the sandbox's side ---------------------------------------------------------------------------
def _lookup(name: str, namespace: dict[str, Any], kept: dict[str, Any]) -> Any:
    """A dotted name from the values kept ('$x'), else the notebook's namespace, else builtins."""
    head, *rest = name.split(".")
    scope = kept if head.startswith("$") else namespace
    if head not in scope and (scope is kept or not hasattr(builtins, head)):
        raise NameError(f"name {head!r} is not defined")
    return functools.reduce(getattr, rest, scope[head] if head in scope else getattr(builtins, head))


def _take(value: Any, path: str | list[str]) -> Any:
    """value.a.b for path 'a.b' (value[0] for '0'); where the value has no such attribute, it is taken from each
    of its items; a list of paths gives the list of what each takes."""
    if isinstance(path, list):
        return [_take(value, p) for p in path]
    for attr in filter(None, path.split(".")):
        if attr.isdigit():
            value = value[int(attr)]
        else:
            value = getattr(value, attr) if hasattr(value, attr) else [getattr(v, attr) for v in value]
    return value


def evaluate(arg: Any, namespace: dict[str, Any], kept: dict[str, Any]) -> Any:
    """An argument: a call or a name when it is a dict (kept as its 'as' says), else the JSON value itself."""
    if isinstance(arg, dict):
        value = _lookup(arg["name"] if "name" in arg else arg["call"], namespace, kept)
        if "name" not in arg:
            value = value(*[evaluate(a, namespace, kept) for a in arg.get("args", [])],
                          **{k: evaluate(v, namespace, kept) for k, v in arg.get("kwargs", {}).items()})
        if str(arg.get("as", "")).startswith("$"):
            kept[arg["as"]] = value
        return _take(value, arg.get("take", ""))
    return [evaluate(a, namespace, kept) for a in arg] if isinstance(arg, list) else arg


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


def answer(call: dict[str, Any], namespace: dict[str, Any], kept: dict[str, Any]) -> dict[str, Any]:
    """{'value': plain value} of one call in the notebook's namespace (None for a value kept with no take),
    or {'error': the exception's type}."""
    try:
        value = evaluate(call, namespace, kept)
        return {"value": None if "as" in call and "take" not in call else plain(value)}
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
    """The name of the call, or of the first call a builtin wraps ('may_read' in bool(may_read(...)))."""
    name = str(call.get("call", call.get("name")))
    args = [b for a in call.get("args", []) for b in (a if isinstance(a, list) else [a])]  # list([f(1), f(2)]): f
    inner = [a for a in args if isinstance(a, dict) and "call" in a]
    return _innermost(inner[0]) if inner and hasattr(builtins, name.split(".")[0]) else name


def _passes(got: dict[str, Any], want: dict[str, Any], call: dict[str, Any], checks: dict[str, Any]) -> bool:
    """Whether a reply passes: the error the call says both raise, the master's value within the call's tolerance,
    or its check (trusted code of the master's) saying so; a check that fails on the student's value says no."""
    if "raises" in call:
        return got.get("error") == call["raises"] == want.get("error")
    if "check" not in call:
        return same(got["value"], want.get("value"), call.get("rtol", 1e-9), call.get("atol", 1e-12))
    try:
        return bool(checks[check_name(call)](got["value"], want.get("value"), call))
    except Exception:  # noqa: BLE001 - a value of the wrong shape fails the check
        return False


def ran_beyond(replies: Any, expected: list[dict[str, Any]], drawn: list[dict[str, Any]], refs: set[str],
               where: str, known: set[str] | None = None) -> list[tuple[str, int, str]]:
    """(file, line, reference) for each reference that ran while the sandbox answered a call (the reply's 'ran',
    :func:`simlib.grade.child._answer`) and not while the master's run answered it: the student's code reached it,
    directly or through the library; where the student's line is not known (or its code name is not in ``known``:
    the sandbox may write anything there), the first such call is named."""
    out, seen = [], set()
    for k, (got, want, call) in enumerate(zip(replies if isinstance(replies, list) else [], expected, drawn), 1):
        theirs = {r[0] for r in want.get("ran", []) if isinstance(r, list) and r} if isinstance(want, dict) else set()
        ran = got.get("ran") if isinstance(got, dict) else None
        for r in (ran if isinstance(ran, list) else [])[:20]:
            if (isinstance(r, list) and len(r) == 3 and r[0] in refs and r[0] not in theirs and isinstance(r[1], str)
                    and type(r[2]) is int and (r[0], r[1], r[2]) not in seen):
                seen.add((r[0], r[1], r[2]))
                name = r[1] if known is None or r[1] in known else ""
                out.append((name or f"{where}, call {k} of {len(drawn)} ({_innermost(call)[:40]})", r[2], r[0]))
    return out


TOO_LARGE = "the values are larger than 1 MB"  # the one message of the sandbox's own a failed probe unit keeps


def failed(text: str) -> str:
    """A failed probe unit's message. The sandbox's text is the submission's to choose, written after its code saw the
    calls, so it could carry their inputs out, encoded: only the exception's type is kept, where it is a builtin one."""
    text = str(text)
    return text if text == TOO_LARGE else f"the sandbox did not answer the calls (it raised {_raised(text.split(':')[0])})"


def _raised(name: str) -> str:
    """An exception's type name fit for feedback: a builtin one's, else 'an exception' (a class's name is the
    submission's to choose, so could carry anything)."""
    known = isinstance(getattr(builtins, name, None), type) and issubclass(getattr(builtins, name), BaseException)
    return name if known else "an exception"


def verdict(replies: Any, expected: list[dict[str, Any]], drawn: list[dict[str, Any]],
            checks: dict[str, Any] | None = None) -> str:
    """'' if every reply passes (see :func:`_passes`), else which call did not (by name only: no value is shown)."""
    if not isinstance(replies, list) or len(replies) != len(expected):
        return "the sandbox did not answer every call"
    for k, (got, want, call) in enumerate(zip(replies, expected, drawn), 1):
        where = f"call {k} of {len(drawn)} ({_innermost(call)[:40]})"
        if isinstance(got, dict) and "raises" in call:
            if _passes(got, want, call, checks or {}):
                continue
            return f"{where} did not raise {call['raises']}"
        if not isinstance(got, dict) or "value" not in got:
            name = str(got.get("error", "")) if isinstance(got, dict) else ""
            if name == TooLarge.__name__:
                return f"{where} returned more than {MAX_ITEMS} items in one list"
            return f"{where} raised {_raised(name)}"
        if not _passes(got, want, call, checks or {}):
            what = "fails this part's check" if "check" in call else "differs from the master's"
            return f"{where} gave a value that {what} on inputs drawn for this grading"
    return ""

"""Options generated from a config dataclass's field metadata: one source for the CLI's flags and the panel's controls.

A field declares ``metadata={"help": ..., "flag": ..., "min": ..., "max": ...}`` (see
:mod:`simlib.sim.config`); :func:`options` turns the fields into :class:`Option` records (name,
type, default, help, bounds), :meth:`Option.check` is the range check the dataclass itself runs,
and :func:`add_arguments` makes argparse arguments of them. Nothing here imports NumPy, so a
command's ``--help`` stays fast.

    >>> from simlib.sim.config import SimConfig
    >>> opt = next(o for o in options(SimConfig) if o.name == "n_workers")
    >>> opt.flag, opt.type.__name__, opt.default, opt.min
    ('--workers', 'int', 8, 1)
    >>> opt.parse("0")
    Traceback (most recent call last):
    ...
    ValueError: n_workers must be an integer in [1, 1000000], got 0
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Iterable

from simlib._validate import _is_int, _is_number, one_of


@dataclass(frozen=True)
class Option:
    """One configurable field: its dotted name, flag, type, default, help and allowed range."""

    name: str
    flag: str | None
    type: type
    default: Any
    help: str
    min: float | None = None
    max: float | None = None
    min_open: bool = False  # the minimum itself is excluded (x > min)
    choices: tuple[Any, ...] | None = None
    optional: bool = False  # None is allowed: the feature is off
    aliases: tuple[str, ...] = ()
    unit: str = ""
    callable_ok: bool = False  # code may pass a function instead (an extension point), the CLI a string
    most_field: str | None = None  # another field this one may not exceed (the config's validate checks it)

    def range_text(self) -> str:
        """'in [1, 10000]', '> 0', 'one of ...' -- the allowed values in words."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.min is not None and self.max is not None:
            text = f"in {'(' if self.min_open else '['}{_show(self.min)}, {_show(self.max)}]"
        elif self.min is not None:
            text = f"{'>' if self.min_open else '>='} {_show(self.min)}"
        else:
            text = "" if self.max is None else f"<= {_show(self.max)}"
        if self.most_field is not None:
            text += f"{' and ' if text else ''}<= {self.most_field}"
        return text

    def check(self, value: Any) -> None:
        """Raise ValueError naming the field unless min <= value <= max (of the right type)."""
        if (value is None and self.optional) or (self.callable_ok and callable(value)):
            return
        if self.choices is not None:
            one_of(self.name, value, self.choices)
            return
        if self.type in (bool, str):
            if not isinstance(value, self.type):
                what = "True or False" if self.type is bool else "a string"
                raise ValueError(f"{self.name} must be {what}, got {value!r}")
            return
        what = "an integer" if self.type is int else "a finite number"
        if not (_is_int(value) if self.type is int else _is_number(value) and math.isfinite(value)) or not self._within(value):
            rng = self.range_text()
            raise ValueError(f"{self.name} must be {what}{' ' + rng if rng else ''}, got {value!r}")

    def _within(self, value: float) -> bool:
        if self.min is not None and (value < self.min or (self.min_open and value == self.min)):
            return False
        return self.max is None or value <= self.max

    def parse(self, text: str) -> Any:
        """A command-line string -> a checked value (ValueError naming the field otherwise)."""
        try:
            value = self.type(text) if self.type in (int, float) else text
        except ValueError:
            kind = "an integer" if self.type is int else "a number"
            raise ValueError(f"{self.name} must be {kind} {self.range_text()}, got {text!r}") from None
        self.check(value)
        return value


def options(cls: type, prefix: str = "") -> list[Option]:
    """Every field of dataclass ``cls`` as an Option (nested dataclass fields flattened as 'outer.inner')."""
    return list(_options(cls, prefix))


@functools.lru_cache(maxsize=None)
def _options(cls: type, prefix: str) -> tuple[Option, ...]:
    # Cached: configs validate themselves on every construction and replace().
    hints = typing.get_type_hints(cls)
    out: list[Option] = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if meta.get("option", True) is False:  # code-only extension points have no flag or control
            continue
        base, optional = _unwrap(hints[f.name])
        if dataclasses.is_dataclass(base):
            out.extend(_options(base, prefix + f.name + "."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        keys = ("min", "max", "min_open", "choices", "unit", "callable_ok", "most_field")
        given = {k: meta[k] for k in keys if k in meta}
        out.append(Option(name=prefix + f.name, flag=meta.get("flag", "--" + f.name.replace("_", "-")), type=base,
                          default=default, help=meta.get("help", ""), optional=optional,
                          aliases=tuple(meta.get("aliases", ())), **given))  # the rest: Option's own defaults
    return tuple(out)


def check_fields(obj: Any, prefix: str = "") -> None:
    """Run every field's :meth:`Option.check` on a dataclass instance (nested ones are checked by their own class)."""
    for opt in _options(type(obj), prefix):
        if "." not in opt.name[len(prefix):]:
            opt.check(getattr(obj, opt.name[len(prefix):]))


def dest(opt: Option) -> str:
    """The argparse attribute name of an option: its dotted name with dots as '__'."""
    return opt.name.replace(".", "__")


def add_arguments(group: Any, opts: Iterable[Option], defaults: Any = None) -> None:
    """Add one argparse argument per option with a flag; defaults read from ``defaults`` (a config) if given."""
    for opt in opts:
        if not opt.flag:
            continue
        default = functools.reduce(getattr, opt.name.split("."), defaults) if defaults is not None else opt.default
        flags = (opt.flag, *opt.aliases)
        rng = opt.range_text()
        if opt.type is bool:
            group.add_argument(*flags, dest=dest(opt), action="store_true", default=default, help=opt.help)
            continue
        help_text = opt.help + (f" ({opt.unit})" if opt.unit else "") + (f"; {rng}" if rng and opt.choices is None else "")
        if opt.optional and default is None:
            help_text += "; off unless given"
        metavar = "{" + ",".join(map(str, opt.choices)) + "}" if opt.choices else opt.flag.lstrip("-").upper().replace("-", "_")
        group.add_argument(*flags, dest=dest(opt), type=argparse_type(opt), default=default, help=help_text,
                           metavar=metavar)


def values(args: argparse.Namespace, opts: Iterable[Option]) -> dict[str, Any]:
    """The parsed values as a nested dict: {'n_workers': 8, 'stragglers': {'slow_factor': 4.0, ...}}."""
    out: dict[str, Any] = {}
    for opt in opts:
        if opt.flag and hasattr(args, dest(opt)):
            *outer, leaf = opt.name.split(".")
            functools.reduce(lambda d, part: d.setdefault(part, {}), outer, out)[leaf] = getattr(args, dest(opt))
    return out


def argparse_type(opt: Option) -> Any:
    """An argparse ``type=`` for ``opt``: :meth:`Option.parse`, its error worded for argparse."""

    def parse(text: str) -> Any:
        try:
            return opt.parse(text)
        except ValueError as exc:
            # argparse prefixes 'argument --flag: '; the field name would only repeat it.
            raise argparse.ArgumentTypeError(str(exc).removeprefix(opt.name + " ")) from None

    parse.__name__ = opt.type.__name__
    return parse


def _show(bound: float) -> str:
    """Bounds as a reader writes them: 10000, 1e+15, 0.5."""
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """int | None -> (int, True); int -> (int, False)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(hint))
    return hint, False

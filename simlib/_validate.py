"""Validation at the boundary: every check raises ValueError naming the field and the allowed range."""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import os
from typing import Any, Iterable, Mapping, TypeVar

T = TypeVar("T")


def positive(name: str, value: Any) -> None:
    """Require value > 0 (and finite)."""
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def non_negative(name: str, value: Any) -> None:
    """Require value >= 0 (and finite)."""
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def nearest(name: str, known: Iterable[str]) -> str:
    """"did you mean 'x'?" for the known name closest to a misspelt ``name``, or ''."""
    near = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean {near[0]!r}?" if near else ""


def known_names(given: Iterable[str], known: list[str], where: str) -> None:
    """Refuse a name in ``given`` that is not one of ``known``, naming it, the nearest known one and all of them."""
    for key in given:
        if key not in known:
            hint = (nearest(key, known) + " ").lstrip()
            raise ValueError(f"{key}: not an option of {where}; {hint}its options: {', '.join(known)}")


def options(cls: type[T], given: Mapping[str, Any], where: str) -> T:
    """``cls(**given)`` for a dataclass of keyword options, refusing a name that is not one of its fields."""
    known_names(given, [f.name for f in dataclasses.fields(cls)], where)  # type: ignore[arg-type]
    return cls(**given)


def positive_int(name: str, value: Any, most: int | None = None) -> None:
    """Require an integer >= 1 (and <= ``most``)."""
    if not _is_int(value) or value < 1 or most is not None and value > most:
        raise ValueError(f"{name} must be an integer {'>= 1' if most is None else f'in [1, {most}]'}, got {value!r}")


def non_negative_int(name: str, value: Any) -> None:
    """Require an integer >= 0."""
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def probability(name: str, value: Any) -> None:
    """Require 0 <= value <= 1."""
    if not _is_number(value) or not (0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")


def boolean(name: str, value: Any) -> None:
    """Require True or False (not a truthy stand-in such as 1 or 'yes')."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def one_of(name: str, value: Any, allowed: Iterable[Any]) -> None:
    """Require value to be one of the allowed choices."""
    allowed = tuple(allowed)
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} must be one of {choices}; got {value!r}")


def even_ranges(n_workers: Any, total: int, what: str) -> list[tuple[int, int]]:
    """Contiguous near-equal ranges [start, stop) of ``total`` items, one per worker (each worker gets at least one)."""
    positive_int("n_workers", n_workers)
    if n_workers > total:
        raise ValueError(f"n_workers ({n_workers}) must be <= the number of {what} ({total})")
    import numpy as np

    bounds = np.linspace(0, total, n_workers + 1).astype(int).tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def array(name: str, a: Any, kinds: str = "") -> None:
    """Require a 1-D NumPy array, of a dtype kind in ``kinds`` if given ('iu': integers, 'f': floating point)."""
    import numpy as np

    if not isinstance(a, np.ndarray) or a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D NumPy array, got {type(a).__name__}")
    if kinds and a.dtype.kind not in kinds:
        raise ValueError(f"{name} must hold {'integers' if kinds == 'iu' else 'floats'}, got dtype {a.dtype}")


def available_memory() -> float:
    """Bytes of memory available to a new allocation (MemAvailable; physical pages as a fallback)."""
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 8e9


def gb(n: float) -> str:
    """Bytes as '1.23 GB'."""
    return f"{n / 1e9:.3g} GB"


def fits_memory(name: str, value: Any, nbytes: float, per_unit: float, what: str) -> None:
    """Require nbytes <= half the memory available; the error names ``name`` and the largest value that fits."""
    budget = available_memory() / 2
    if nbytes > budget:
        most = max(0, int((budget - (nbytes - per_unit * value)) // per_unit))
        raise ValueError(f"{name}: {name} = {value} needs about {gb(nbytes)} for {what}, more than half the memory "
                         f"available ({gb(2 * budget)}); use at most {most}")


def _is_number(value: Any) -> bool:
    return isinstance(value, float) or _is_int(value) or _is_numpy(value, "floating")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) or _is_numpy(value, "integer")


def _is_numpy(value: Any, kind: str) -> bool:
    """isinstance(value, numpy.<kind>), importing NumPy only when asked (``simlib.protocol`` stays light)."""
    import numpy as np

    return isinstance(value, getattr(np, kind))

"""Array-module selection: the same array code runs on NumPy (CPU, CI) and CuPy (GPU)."""
from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

try:  # CuPy is optional: no import error on machines without it.
    import cupy as _cupy  # type: ignore
except Exception:  # pragma: no cover - depends on the machine
    _cupy = None


def array_module(*arrays: Any) -> ModuleType:
    """The module (numpy or cupy) that owns the given arrays; numpy when none is a CuPy array."""
    if _cupy is not None:
        for a in arrays:
            if isinstance(a, _cupy.ndarray):
                return _cupy
    return np


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    if _cupy is None:
        return False
    try:
        return _cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # pragma: no cover - depends on the machine
        return False


def get_xp(name: str = "auto") -> ModuleType:
    """Resolve 'numpy', 'cupy' or 'auto' (CuPy when a GPU is present) to a module."""
    if name == "numpy":
        return np
    if name == "cupy":
        if not gpu_available():
            raise ValueError("xp='cupy' needs CuPy and a CUDA device; none was found (use xp='numpy')")
        return _cupy
    if name == "auto":
        return _cupy if gpu_available() else np
    raise ValueError(f"xp must be one of 'numpy', 'cupy', 'auto'; got {name!r}")


def to_numpy(a: Any) -> np.ndarray:
    """Copy a NumPy or CuPy array to host memory as NumPy."""
    if _cupy is not None and isinstance(a, _cupy.ndarray):
        return _cupy.asnumpy(a)
    return np.asarray(a)

"""One GPU as a substrate: CuPy array code that runs unchanged on NumPy where no GPU is present.

Functions here take their array module from their inputs (``simlib.backend.array_module``) or
from an ``xp`` argument ('numpy', 'cupy', 'auto'), so CI tests the NumPy path of the same code
that runs on the device. Runs return the same :class:`simlib.trace.Trace` as the other
substrates, with ``substrate="gpu"``.

Modules (imported on demand, so that loading one does not load the others):

* :mod:`simlib.gpu.hogwild` -- lock-free SGD for sparse logistic regression, one batch of rows
  per step: gather, margins, scatter-add of the sparse updates (``train_batched``, ``batch_step``).
* :mod:`simlib.gpu.glove`, :mod:`simlib.gpu.lda` -- the GloVe and LDA twins.

Each twin also has fused CUDA kernels of its step for CuPy; :func:`use_fused` decides which runs.
"""
from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import numpy as np

KERNELS = ("auto", "array", "fused")


def use_fused(kernel: str, xp: ModuleType) -> bool:
    """Whether a twin runs its fused CUDA kernels: 'fused', or 'auto' on CuPy; 'array' never.

    Raises a ValueError naming ``kernel`` for an unknown choice, or for 'fused' on NumPy.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "fused" and xp is np:
        raise ValueError("kernel='fused' needs CuPy and a CUDA device (xp='cupy'); use kernel='array' on NumPy")
    return kernel == "fused" or (kernel == "auto" and xp is not np)


@functools.lru_cache(maxsize=None)
def cuda_kernels(source: str, names: tuple[str, ...]) -> tuple[Any, ...]:  # pragma: no cover - needs a GPU
    """The CUDA kernels ``names`` of ``source``, compiled by CuPy once per process and kept."""
    import cupy

    module = cupy.RawModule(code=source)
    return tuple(module.get_function(name) for name in names)

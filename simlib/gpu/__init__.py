"""One GPU as a substrate: CuPy array code that runs unchanged on NumPy where no GPU is present.

Functions here take their array module from their inputs (``simlib.backend.array_module``) or
from an ``xp`` argument ('numpy', 'cupy', 'auto'), so CI tests the NumPy path of the same code
that runs on the device. Runs return the same :class:`simlib.trace.Trace` as the other
substrates, with ``substrate="gpu"``.

Modules (imported on demand, so that loading one does not load the others):

* :mod:`simlib.gpu.substrate` -- the ``gpu`` substrate of ``simlib.run``; Hogwild! runs there through
  the logistic problem's local-step hook (:mod:`simlib.problems.logistic_device`).
* :mod:`simlib.gpu.lda` -- the LDA twin, a batched loop of its own (GloVe runs on the substrate through
  :mod:`simlib.problems.glove_device`).

Fused CUDA kernels are chosen by :func:`use_fused` and compiled once by :func:`cuda_kernels`.
"""
from __future__ import annotations

from simlib.backend import KERNELS, cuda_kernels, use_fused

__all__ = ["KERNELS", "cuda_kernels", "use_fused"]

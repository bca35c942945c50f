"""One GPU as a substrate: CuPy array code that runs unchanged on NumPy where no GPU is present.

Functions here take their array module from their inputs (``simlib.backend.array_module``) or
from an ``xp`` argument ('numpy', 'cupy', 'auto'), so CI tests the NumPy path of the same code
that runs on the device. Runs return the same :class:`simlib.trace.Trace` as the other
substrates, with ``substrate="gpu"``.

Modules (imported on demand, so that loading one does not load the others):

* :mod:`simlib.gpu.substrate` -- the ``gpu`` substrate of ``simlib.run``. Each problem's device steps
  live beside its math: :mod:`simlib.problems.logistic_device` (Hogwild!),
  :mod:`simlib.problems.glove_device` (batched AdaGrad), :mod:`simlib.problems.lda_device` (batched
  collapsed Gibbs).

Fused CUDA kernels are chosen by :func:`simlib.backend.use_fused` and compiled once by
:func:`simlib.backend.cuda_kernels`; the lock-free kernels (``device_kernel='hogwild'``) share the
work queue :class:`simlib.backend.RowQueue`.
"""

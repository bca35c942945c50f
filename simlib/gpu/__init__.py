"""One GPU as a substrate: CuPy array code that runs unchanged on NumPy where no GPU is present.

Functions here take their array module from their inputs (``simlib.backend.array_module``) or
from an ``xp`` argument ('numpy', 'cupy', 'auto'), so CI tests the NumPy path of the same code
that runs on the device. Runs return the same :class:`simlib.trace.Trace` as the other
substrates, with ``substrate="gpu"``.

Modules (imported on demand, so that loading one does not load the others):

* :mod:`simlib.gpu.hogwild` -- lock-free SGD for sparse logistic regression, one batch of rows
  per step: gather, margins, scatter-add of the sparse updates (``train_batched``, ``batch_step``).
* :mod:`simlib.gpu.glove`, :mod:`simlib.gpu.lda` -- the GloVe and LDA twins.
"""

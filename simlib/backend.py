"""Array-module selection: the same array code runs on NumPy (CPU, CI) and CuPy (GPU)."""
from __future__ import annotations

import contextlib
import functools
import weakref
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Iterator

import numpy as np

from simlib import _validate as check

try:  # CuPy is optional: no import error on machines without it.
    import cupy as _cupy  # type: ignore
except Exception:  # pragma: no cover - depends on the machine
    _cupy = None


def array_module(*arrays: Any) -> ModuleType:
    """The module (numpy or cupy) that owns the given arrays; numpy when none is a CuPy array."""
    return _cupy if _cupy is not None and any(isinstance(a, _cupy.ndarray) for a in arrays) else np


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
    check.one_of("xp", name, ("numpy", "cupy", "auto"))
    gpu = name != "numpy" and gpu_available()  # asked once: it counts the CUDA devices
    if name == "cupy" and not gpu:
        raise ValueError("xp='cupy' needs CuPy and a CUDA device; none was found (use xp='numpy')")
    return _cupy if gpu else np


def to_numpy(a: Any) -> np.ndarray:
    """Copy a NumPy or CuPy array to host memory as NumPy."""
    return np.asarray(a) if array_module(a) is np else _cupy.asnumpy(a)


def synchronize(xp: ModuleType) -> None:
    """Wait for the device's queued work, so that a wall-clock reading means something (NumPy: nothing to wait for)."""
    if xp is not np:  # pragma: no cover - needs a GPU
        xp.cuda.Device().synchronize()


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS limited to one thread within ``with one_blas_thread():`` (or a function decorated ``@one_blas_thread()``).

    NOTE: the course's products are small (layers of 64 to 512 units, batches of 8 to 1,024 rows) and its processes
    share the cores: with BLAS's own threads fighting workers and other programs for them, lesson 12 took 85 s cold
    beside two busy loops (its large-batch cell 60 to 76 s) against 15 s (3.4 s) on one thread, on 2 cores; 40 steps
    of a dataflow graph's two towers took 9.7 s, not 1.3 s. The course's serial training runs in it, and a worker
    group's parent for the run (its forked workers inherit one thread: set inside a forked child instead, OpenBLAS
    starts a pool that spins, and 100 steps of a 2-worker BSP run on shared memory took 0.10 s, not 0.003 s);
    importing simlib changes no program's BLAS.
    """
    from threadpoolctl import threadpool_limits  # imported when first needed: most runs never call it

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def scatter_add(target: Any, index: Any, values: Any) -> None:
    """``target[index] += values`` with repeated indices accumulating, on NumPy or CuPy.

    NumPy uses ``np.add.at``; CuPy (12 and later; the ``gpu`` extra asks for 13) its atomic ``add.at``.
    Neither waits for the device, so a loop of them stays queued.
    """
    array_module(target).add.at(target, index, values)


def segment_sum(index: Any, weights: Any, n: int) -> Any:
    """``out[k]`` = the sum of ``weights`` where ``index == k``, for ``k < n``: a bincount of known length.

    With ``weights=None`` it counts (integers). On NumPy this is ``np.bincount``. CuPy's
    ``bincount`` reads the largest index back to the host (and checks for negatives) on every
    call, which stalls a queue of small kernels; here it is a zero array and one atomic add.
    """
    xp = array_module(index)
    if xp is np:
        return np.bincount(index, weights=weights, minlength=n)
    if weights is None:  # pragma: no cover - needs a GPU
        weights = xp.ones(index.shape, dtype=xp.int32)
    out = xp.zeros(n, dtype=weights.dtype)
    scatter_add(out, index, weights)
    return out


KERNELS = ("auto", "array", "fused", "hogwild")


def use_fused(kernel: str, xp: ModuleType) -> bool:
    """Whether device code runs its fused CUDA kernels: 'fused', or 'auto' on CuPy; 'array' never.

    'hogwild' (lock-free rows, see :class:`RowQueue`) is handled before this by the problems that offer
    it (logistic, GloVe, LDA); reaching here it is refused. Raises a ValueError naming ``kernel`` for an
    unknown choice, for 'fused' on NumPy, or for 'hogwild'.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "fused" and xp is np:
        raise ValueError("kernel='fused' needs CuPy and a CUDA device (xp='cupy'); use kernel='array' on NumPy")
    if kernel == "hogwild":
        raise ValueError("kernel='hogwild' (lock-free rows) is offered by the logistic, GloVe and LDA problems only; "
                         "use 'auto', 'fused' or 'array'")
    return kernel == "fused" or (kernel == "auto" and xp is not np)


@dataclass(frozen=True)
class InFlight:
    """What lock-free device steps report: items applied, and how many earlier items each missed.

    An item (a row, an entry) "missed" the items taken before it whose updates had not landed when
    it read the table: Hogwild!'s staleness, counted on the device. A local-step hook returns one of
    these; the ``gpu`` substrate records it in the trace.
    """

    items: int = 0
    missed_sum: int = 0
    missed_max: int = 0

    def __add__(self, other: "InFlight") -> "InFlight":
        return InFlight(self.items + other.items, self.missed_sum + other.missed_sum,
                        max(self.missed_max, other.missed_max))

    @property
    def missed_mean(self) -> float:
        return self.missed_sum / self.items if self.items else 0.0

    @classmethod
    def of(cls, counts: Any) -> "InFlight":
        """From a :class:`RowQueue` launch's counts (reads them back: one wait for the device)."""
        _, done, total, most = (int(v) for v in to_numpy(counts))
        return cls(done, total, most)


# A work queue for lock-free kernels, prepended to their CUDA source. q = [next item, items done,
# sum of items missed, most items missed]; a warp takes ``chunk`` items in order at a time.
QUEUE_SOURCE = r"""
__device__ __forceinline__ long long queue_take(unsigned long long* q, long long total, long long chunk,
                                                long long* missed) {
    // Lane 0 takes the next chunk and counts the earlier items not done yet; every lane gets its first item.
    long long t = 0, m = 0;
    if (threadIdx.x % 32 == 0) {
        t = (long long)atomicAdd(&q[0], (unsigned long long)chunk);
        if (t < total) m = t - (long long)(*(volatile unsigned long long*)&q[1]);
    }
    *missed = m > 0 ? m : 0;
    return __shfl_sync(0xffffffffu, t, 0);
}

__device__ __forceinline__ void queue_done(unsigned long long* q, long long count, long long missed, long long* sum,
                                           long long* most) {
    // A chunk of ``count`` items done: each missed what its first missed (the warp did the ones between).
    __threadfence();  // the items' updates are visible before they count as done
    __syncwarp();
    if (threadIdx.x % 32 == 0) {
        atomicAdd(&q[1], (unsigned long long)count);
        *sum += missed * count;  // kept by the warp until it leaves: two counters per chunk
        if (missed > *most) *most = missed;
    }
}

__device__ __forceinline__ void queue_leave(unsigned long long* q, long long sum, long long most) {
    if (threadIdx.x % 32 == 0 && sum > 0) {
        atomicAdd(&q[2], (unsigned long long)sum);
        atomicMax(&q[3], (unsigned long long)most);
    }
}
"""


class RowQueue:  # pragma: no cover - needs a GPU
    """The host side of :data:`QUEUE_SOURCE`: its counters, the launch of ``in_flight`` warps, the report."""

    def __init__(self, xp: ModuleType):
        self.q = xp.zeros(4, dtype=np.uint64)

    def launch(self, kernel: Any, in_flight: int, items: int, args: tuple) -> Any:
        """Run ``kernel(*args, q)`` with ``in_flight`` warps (no more than ``items``) taking items from a fresh queue.

        Returns the queue's counts, on the device. Nothing waits: read them with :meth:`InFlight.of`
        once the work is wanted.
        """
        self.q.fill(0)
        in_flight = max(1, min(in_flight, items))
        per_block = 8 if in_flight % 8 == 0 else 1
        kernel((in_flight // per_block,), (32 * per_block,), (*args, self.q))
        return self.q.copy()


@functools.lru_cache(maxsize=None)
def cuda_kernels(source: str, names: tuple[str, ...]) -> tuple[Any, ...]:  # pragma: no cover - needs a GPU
    """The CUDA kernels ``names`` of ``source``, compiled by CuPy once per process and kept."""
    import cupy

    module = cupy.RawModule(code=source)
    return tuple(module.get_function(name) for name in names)


_COPIES: "weakref.WeakKeyDictionary[Any, dict[str, Any]]" = weakref.WeakKeyDictionary()


def device_copies(owner: Any, xp: ModuleType, make: Any) -> Any:
    """``make(xp)``, made once per owner and array module and kept while the owner lives (a problem's data on a device)."""
    per = _COPIES.setdefault(owner, {})
    if xp.__name__ not in per:
        per[xp.__name__] = make(xp)
    return per[xp.__name__]

"""The gpu substrate (Hogwild, GloVe, LDA) on NumPy and CuPy against the CPU substrates and peers, in one run.

Each section times one problem on the same data three ways: the peer or the CPU substrate
(processes on this machine's cores), and ``simlib.run(..., substrate='gpu')`` on NumPy and on
CuPy (when a CUDA device is present; otherwise those rows say so). Batch size is the GPU's
staleness knob (a batch reads the table once), so every gpu row also reports quality: the final loss, cost or log-likelihood
next to the CPU run's. Throughput excludes data loading and one warm-up launch. Run::

    python benchmarks/gpu.py            # 200 k x 100 k Hogwild data, KJV GloVe and LDA
    python benchmarks/gpu.py --quick    # small sizes, for a smoke test on a laptop
    python benchmarks/gpu.py --only lda --topics 1000 --corpus nytimes:0.1 --lda-sweeps 10   # a corpus past the caches
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

# This folder holds a script named like the `lda` package; keep it off the path.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from simlib.backend import get_xp, gpu_available, synchronize  # noqa: E402
from simlib.data import Vocabulary, load_kjv  # noqa: E402
import simlib  # noqa: E402
from simlib.problems.glove import GloveConfig, count_cooccurrences  # noqa: E402
from simlib.problems.glove_table import GloveProblem  # noqa: E402
from simlib.problems.lda import LDACorpus  # noqa: E402
from simlib.problems.lda_table import LDAProblem  # noqa: E402
from simlib.problems.logistic import LogisticProblem, make_sparse_classification  # noqa: E402
from benchmarks.corpus_nytimes import load_corpus  # noqa: E402
from benchmarks.record import record  # noqa: E402

NO_GPU = "(no CUDA device)"
SKIP: set[str] = set()  # array modules whose gpu-substrate rows --skip leaves out


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    """(fn(), wall seconds), with the device's queue drained before each clock reading."""
    xp = get_xp("auto")
    synchronize(xp)
    t = time.perf_counter()
    out = fn()
    synchronize(xp)
    return out, time.perf_counter() - t


def gpu_rows(runs: list[tuple[str, str, int]], label: Callable[[str, int], str],
             measure: Callable[[str, str, int], tuple[float, float]]) -> list[tuple[str, float | None, float | None]]:
    """One row per (xp, kernel, size) on the gpu substrate: (name, rate, quality); CuPy rows without a device are empty."""
    rows: list[tuple[str, float | None, float | None]] = []
    for xp, kernel, size in runs:
        name = f"gpu substrate, {xp}{'' if kernel == 'array' else ', ' + kernel}, {label(kernel, size)}"
        if xp in SKIP:
            continue
        rows.append((name, None, None) if xp == "cupy" and not gpu_available() else (name, *measure(xp, kernel, size)))
    return rows


def table(title: str, unit: str, quality: str, rows: list[tuple[str, float | None, float | None]], base: str,
          unit_bytes: float | Callable[[str], float] = 0.0) -> None:
    """Print rows of (name, rate, quality); ratios are against the row named ``base``.

    CuPy rows also get their fraction of the device's memory bandwidth: rate x ``unit_bytes`` (the
    bytes a unit of work must read and write at least; a function of the row's name where kernels
    differ) over a device-to-device copy's rate.
    """
    ref = dict((n, r) for n, r, _ in rows)[base]
    bw = copy_bandwidth()
    print(f"\n{title}")
    print(f"{'implementation':<46} {unit:>14} {'x ' + base[:18]:>20} {quality:>16} {'of bandwidth':>13}")
    for name, rate, q in rows:
        if rate is None:
            print(f"{name:<46} {NO_GPU:>14}")
            continue
        per = unit_bytes(name) if callable(unit_bytes) else unit_bytes
        share = f"{rate * per / bw:>12.1%}" if bw and "cupy" in name and per else ""
        print(f"{name:<46} {rate / 1e6:>14.2f} {rate / ref:>19.2f}x {q:>16.5f} {share:>13}")
        if "cupy" in name and ref:
            record(__file__, f"{title.split(':')[0]}, {name}", base, rate / ref, unit, machine=_DEVICE[0])


_BANDWIDTH: list[float] = []
_DEVICE = ["no CUDA device"]  # the records' machine: the device's name, once main has asked for it


def copy_bandwidth() -> float:
    """Bytes per second a device-to-device copy of 1 GiB moves, read and write counted (0 without a device)."""
    if not gpu_available():
        return 0.0
    if not _BANDWIDTH:
        import cupy

        a = cupy.ones(2**28, dtype=np.float32)
        b = cupy.empty_like(a)
        b[...] = a  # warm-up
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(10):
            b[...] = a
        stop.record()
        stop.synchronize()
        _BANDWIDTH.append(10 * 2 * a.nbytes / (cupy.cuda.get_elapsed_time(start, stop) / 1e3))
        print(f"device-to-device copy: {_BANDWIDTH[0] / 1e12:.2f} TB/s (read + write)")
    return _BANDWIDTH[0]


def hogwild_section(args: argparse.Namespace) -> None:
    from sklearn.linear_model import SGDClassifier

    data = make_sparse_classification(args.rows, args.features, 60, zipf=1.0, seed=0)
    full = LogisticProblem(data, l2=1e-5, eval_rows=None)
    nnz = data.nnz * args.epochs
    x = data.to_scipy().astype(np.float64)
    clf = SGDClassifier(loss="log_loss", penalty="l2", alpha=1e-5, learning_rate="constant", eta0=0.2,
                        fit_intercept=False, shuffle=False, max_iter=args.epochs, tol=None)
    _, sk_s = timed(lambda: clf.fit(x, data.y))
    rows: list[tuple[str, float | None, float | None]] = [
        ("scikit-learn SGDClassifier (1 core)", nnz / sk_s, full.loss(clf.coef_.ravel()))]
    problem = LogisticProblem(data, l2=1e-5, eval_rows=2_000, l2_on="all")
    for n in (1, 2):  # the contract's in-place path on shared memory (compiled in the parent first)
        res = simlib.run(problem, "async", substrate="shm", n_workers=n, batch_size=1, lr=0.2,
                         steps=args.epochs * problem.epoch_steps(n, 1), monitor_every=1.0)
        rows.append((f"hogwild, {n} process{'es' if n > 1 else ''}", nnz / res.seconds,
                     full.loss(problem.weights(res.params))))
    runs = [("numpy", "array", b) for b in args.numpy_batches] + [("cupy", "array", b) for b in (256, 4096)] + \
        [("cupy", "fused", b) for b in args.batches] + [("cupy", "hogwild", b) for b in args.lock_free]

    def hogwild(xp: str, kernel: str, b: int) -> tuple[float, float]:
        """One worker on the gpu substrate, mini-batches of b rows on one read of the weights, lr scaled by b."""
        problem.device_kernel = kernel
        res = simlib.run(problem, "async", substrate="gpu", xp=xp, n_workers=1, batch_size=b, lr=0.2 * b,
                         steps=args.epochs * problem.epoch_steps(1, b), eval_every=10**9)
        return nnz / res.seconds, full.loss(problem.weights(res.params))

    rows += gpu_rows(runs, lambda _, b: f"B={b}", hogwild)
    problem.device_kernel = "auto"
    print(f"\nHogwild: {data.n_rows:,} rows x {data.n_features:,} features, {data.nnz / data.n_rows:.1f} nonzeros/row, "
          f"{args.epochs} epochs, lr 0.2 per row, l2 1e-5")
    # per nonzero: its index and value, the weight read, the weight's atomic update (read + write)
    table("sparse logistic regression (hogwild: B rows in flight, each at lr / B)", "M nnz/s", "final loss", rows,
          "scikit-learn SGDClassifier (1 core)", unit_bytes=40)
    contract_rows(problem, args)


def contract_rows(problem: LogisticProblem, args: argparse.Namespace) -> None:
    """simlib.run(problem, 'bsp', substrate='gpu') with 8 workers, 200 steps: CuPy against NumPy, rows per second."""
    print(f"\nthe contract's gpu substrate, BSP, 8 workers, {args.contract_steps} steps (the goal: CuPy >= 10x NumPy)")
    for b in (256, 4096):
        rate = {}
        for xp in ("numpy", "cupy"):
            if xp == "cupy" and not gpu_available():
                continue
            simlib.run(problem, "bsp", substrate="gpu", xp=xp, n_workers=8, batch_size=b, lr=0.2, steps=2)  # warm-up
            res = simlib.run(problem, "bsp", substrate="gpu", xp=xp, n_workers=8, batch_size=b, lr=0.2,
                             steps=args.contract_steps, eval_every=10**9)
            rate[xp] = 8 * args.contract_steps * b / res.seconds
        ratio = f"{rate['cupy'] / rate['numpy']:.1f}x" if "cupy" in rate else NO_GPU
        print(f"  batch {b:>5}: NumPy {rate['numpy'] / 1e3:9.1f} k rows/s   CuPy "
              f"{rate['cupy'] / 1e3 if 'cupy' in rate else float('nan'):9.1f} k rows/s   CuPy / NumPy {ratio}")


def glove_section(args: argparse.Namespace) -> None:
    docs = load_kjv().docs
    vocab = Vocabulary.build(docs, min_count=5)
    ids, offsets = vocab.encode_docs(docs)
    cooc = count_cooccurrences(ids, offsets, len(vocab), 10)
    cfg = GloveConfig(dim=50, epochs=args.glove_epochs)
    updates = cooc.nnz * cfg.epochs
    rows: list[tuple[str, float | None, float | None]] = []
    problem = GloveProblem(cooc, cfg)
    for n in (1, 2):  # Hogwild on the contract's shared-memory table (it compiles in the parent before the workers start)
        res = simlib.run(problem, "async", substrate="shm", n_workers=n, batch_size=1, lr=cfg.lr,
                         steps=cfg.epochs * problem.epoch_steps(n, 1), monitor_every=60.0)
        rows.append((f"hogwild, {n} process{'es' if n > 1 else ''}", updates / res.seconds, problem.epoch_costs(res)[-1]))
    runs = [("numpy", "array", 8192), ("cupy", "array", 8192)] + [("cupy", "fused", b) for b in args.glove_batches] + \
        [("cupy", "hogwild", b) for b in args.glove_batches]

    def glove(xp: str, kernel: str, b: int) -> tuple[float, float]:
        """One worker on the gpu substrate, steps of b entries read at once."""
        problem.device_kernel = kernel
        run = lambda epochs: simlib.run(problem, "async", substrate="gpu", xp=xp, n_workers=1, batch_size=b,  # noqa: E731
                                        lr=cfg.lr, steps=epochs * problem.epoch_steps(1, b), eval_every=10**9)
        run(1)  # warm-up (and the fused kernels' compilation)
        res = run(cfg.epochs)
        return updates / res.seconds, problem.epoch_costs(res)[-1]

    rows += gpu_rows(runs, lambda _, b: f"B={b}", glove)
    problem.device_kernel = "auto"
    print(f"\nGloVe: KJV, {cooc.nnz:,} co-occurrence entries, vocabulary {len(vocab):,}, d = 50, {cfg.epochs} epochs")
    # per update: rows of W, C and their AdaGrad sums, each read and written (float32), and the entry
    table("AdaGrad updates (cost = mean 0.5 f diff^2 of the last pass; hogwild: B entries in flight)", "M updates/s",
          "final cost", rows, "hogwild, 1 process", unit_bytes=4 * 2 * 4 * cfg.dim + 16)


def lda_section(args: argparse.Namespace) -> None:
    c, name = load_corpus(args.corpus, max_docs=400 if args.quick else None)
    for K in args.lda_topics:
        lda_rows(c, name, K, args, dense=K <= 100)


def lda_rows(c: LDACorpus, name: str, K: int, args: argparse.Namespace, dense: bool) -> None:
    """One CPU process (and two, where ``dense``) against the gpu substrate's batched and lock-free sweeps at K topics."""
    sweeps = args.sweeps
    rows: list[tuple[str, float | None, float | None]] = []
    problem = LDAProblem(c, K, 0.1, 0.01)
    for n in (1, 2) if dense else (1,):  # the contract on shared memory (it compiles in the parent before the workers start)
        res = simlib.run(problem, "bsp", substrate="shm", n_workers=n, steps=sweeps, monitor_every=60.0)
        ll = problem.log_likelihood(res.params, problem.assignments(res))
        rows.append((f"AD-LDA BSP, {n} process{'es' if n > 1 else ''}", c.n_tokens * sweeps / res.seconds, ll / c.n_tokens))
    runs = ([("numpy", "array", 8), ("cupy", "array", 8)] + [("cupy", "fused", nb) for nb in args.lda_batches]
            if dense else []) + [("cupy", "hogwild", w) for w in args.lda_warps]

    def lda(xp: str, kernel: str, size: int) -> tuple[float, float]:
        """One worker on the gpu substrate: each sweep in ``size`` batches drawn at once, or (hogwild) ``size``
        warps per document."""
        problem.device_kernel = kernel
        batch = size if kernel == "hogwild" else -(-c.n_tokens // size)
        run = lambda steps: simlib.run(problem, "bsp", substrate="gpu", xp=xp, n_workers=1, steps=steps,  # noqa: E731
                                       batch_size=batch, eval_every=10**9)
        run(1)  # warm-up (and the fused kernels' compilation)
        res = run(sweeps)
        return c.n_tokens * sweeps / res.seconds, problem.log_likelihood(res.params, problem.assignments(res)) / c.n_tokens

    rows += gpu_rows(runs, lambda kernel, n: f"W={n} per doc" if kernel == "hogwild" else f"{n} batches/sweep", lda)
    problem.device_kernel = "auto"
    print(f"\nLDA: {name}, {c.n_docs:,} documents, {c.n_tokens:,} tokens, K = {K}, {sweeps} sweeps")
    # per token (dense in K): its word's and its document's count rows read, a few counts written; hogwild keeps the
    # document's row in shared memory (read and written once per sweep), so its word's row alone
    table("collapsed Gibbs (quality = log p(w, z) per token, higher is better; hogwild: a block per document, "
          "W tokens of it in flight)", "M tokens/s", "log p / token", rows, "AD-LDA BSP, 1 process",
          unit_bytes=lambda name: (4 if "hogwild" in name else 8) * K + 32)
    print(f"(the {c.n_words:,} x {K:,} word-topic table is {4 * c.n_words * K / 2**20:.1f} MiB: a cache of "
          "tens of MiB serves most of its reads, so a share near or past 100% is the cache's bandwidth)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke test")
    ap.add_argument("--only", default="hogwild,glove,lda", help="sections to run, comma-separated")
    ap.add_argument("--topics", default="100,1000", help="LDA's numbers of topics, comma-separated")
    ap.add_argument("--skip", default="", help="leave out the gpu substrate's rows on these array modules, e.g. numpy")
    ap.add_argument("--corpus", default=None,
                    help="LDA's corpus: the KJV's chapters (default), a text file, or nytimes:SCALE, a corpus of "
                         "NYTimes' shape at SCALE drawn from LDA (benchmarks/corpus_nytimes.py; 1: ~100 M tokens)")
    ap.add_argument("--lda-sweeps", type=int, default=None,
                    help="LDA's sweeps per run, the CPU rows' and the gpu substrate's (default 50, 5 with --quick)")
    args = ap.parse_args()
    if args.lda_sweeps is not None and args.lda_sweeps < 1:
        ap.error(f"--lda-sweeps must be a positive integer, got {args.lda_sweeps}")
    SKIP.update(x for x in args.skip.split(",") if x)
    big = not args.quick
    args.rows, args.features = (200_000, 100_000) if big else (20_000, 10_000)
    args.epochs = 5 if big else 2
    args.contract_steps = 200 if big else 20
    args.numpy_batches = [4096] if big else [256]
    args.batches = [16, 64, 256, 1024, 4096]
    args.lock_free = [64, 256, 512, 1024, 4096]
    args.glove_epochs = 10 if big else 2
    args.glove_batches = [1024, 8192, 65536]
    args.sweeps = args.lda_sweeps or (50 if big else 5)
    args.lda_batches = [8, 32, 128, 512]
    args.lda_warps = [4, 8, 16, 32]
    args.lda_topics = [int(k) for k in args.topics.split(",")]
    device = "none"
    if gpu_available():
        import cupy

        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        _DEVICE[0] = device
    print(f"CUDA device: {device}")
    for section in args.only.split(","):
        {"hogwild": hogwild_section, "glove": glove_section, "lda": lda_section}[section](args)


if __name__ == "__main__":
    main()

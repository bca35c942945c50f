"""Benchmark LDA collapsed Gibbs: tokens per second and log-likelihood after a fixed number of sweeps.

    python benchmarks/lda.py            # KJV chapters (stop words removed), K = 20 and 100, 100 sweeps
    python benchmarks/lda.py --quick    # 400 chapters, 20 sweeps
    python benchmarks/lda.py --kernels sparse,mh,alias --topics 100,1000 --sweeps 10   # this project's samplers
    python benchmarks/lda.py --kernels sparse,mh --topics 1000 --sweeps 30 --workers 1,2 --bare   # AD-LDA's scaling
    python benchmarks/lda.py --corpus FILE ...   # any text file, one document per line (see docs/benchmarks.md,
                                                 # "A larger corpus" for the 5 M-token dictionary)

Peers, measured in the same run on the same documents, alpha = 0.1, beta = 0.01:

* the `lda` package (Cython collapsed Gibbs, one core): the classic reference for the likelihood;
* tomotopy with 1 and 2 workers (hyper-parameter optimisation off, so it samples the same model);
* this project: the single-process sparse sampler (``simlib.problems.lda_gibbs``) and AD-LDA on
  1 and 2 processes with BSP (``simlib.run(LDAProblem(...), "bsp", substrate="shm")``).

With ``--kernels`` each named kernel of ``simlib.problems.lda_gibbs`` (the exact sparse sampler,
LightLDA's Metropolis-Hastings sampler ``mh``, AliasLDA's ``alias``, the dense one) runs through
``simlib.run(LDAProblem(..., kernel=...), "bsp", substrate="shm")`` at each ``--topics`` K, on the
same documents from the same random start, in one table with each kernel's speed relative to the
first; tomotopy with as many workers is the one peer kept there (when it is installed).

Every row's log-likelihood is the joint log p(w, z) computed by ``simlib.problems.lda`` from that
sampler's final assignments, so the numbers compare like for like. Sampling time excludes
model construction and the random initialisation. Goals (from the issue): tokens/s >= tomotopy's
with the same number of workers at K = 100; log-likelihood within 1% of the `lda` package's.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

# This file is named like the `lda` package: take its folder off the path so `import lda` finds the peer.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import simlib  # noqa: E402
from benchmarks.record import record  # noqa: E402
from simlib.problems.lda_table import LDAProblem  # noqa: E402
from simlib.problems.lda import LDACorpus, count_tables, kjv_corpus, log_likelihood, text_corpus  # noqa: E402
from simlib.problems.lda_gibbs import KERNELS, GibbsState  # noqa: E402

ALPHA, BETA = 0.1, 0.01
KERNEL_NAMES = {"mh": "Metropolis-Hastings", "alias": "AliasLDA"}  # the others are named as they are


def run_lda_package(c: LDACorpus, K: int, sweeps: int) -> tuple[float, float]:
    """(tokens/s, log-likelihood) of the `lda` package."""
    import lda

    logging.getLogger("lda").setLevel(logging.ERROR)
    X = np.zeros((c.n_docs, c.n_words), np.int64)
    np.add.at(X, (c.doc_of, c.words), 1)
    model = lda.LDA(n_topics=K, n_iter=sweeps, alpha=ALPHA, eta=BETA, random_state=0, refresh=10 * sweeps)
    t = time.perf_counter()
    model.fit(X)
    dt = time.perf_counter() - t
    ll = log_likelihood(model.ndz_, model.nzw_.T, model.nz_, ALPHA, BETA)
    return c.n_tokens * sweeps / dt, ll


def run_tomotopy(c: LDACorpus, K: int, sweeps: int, workers: int) -> tuple[float, float, float]:
    """(tokens/s, log-likelihood, CPU seconds per token) of tomotopy with ``workers`` threads."""
    import tomotopy as tp

    model = tp.LDAModel(k=K, alpha=ALPHA, eta=BETA, seed=0)
    model.optim_interval = 0  # keep alpha fixed: the same model as the other rows
    for d in range(c.n_docs):
        model.add_doc([c.vocab[w] for w in c.doc(d)])
    with warnings.catch_warnings():  # tomotopy warns that runs with several workers are not reproducible
        warnings.simplefilter("ignore", RuntimeWarning)
        model.train(0, workers=workers)
        t, cpu = time.perf_counter(), time.process_time()
        model.train(sweeps, workers=workers)
    dt, cpu = time.perf_counter() - t, time.process_time() - cpu
    index = {w: i for i, w in enumerate(c.vocab)}
    vocab = list(model.used_vocabs)
    words = np.concatenate([[index[vocab[w]] for w in doc.words] for doc in model.docs]).astype(np.int32)
    z = np.concatenate([np.asarray(doc.topics) for doc in model.docs]).astype(np.int32)
    lengths = [len(doc.words) for doc in model.docs]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ll = log_likelihood(*count_tables(LDACorpus(words, offsets, c.n_words), z, K), ALPHA, BETA)
    return c.n_tokens * sweeps / dt, ll, cpu / (c.n_tokens * sweeps)


def run_simlib(c: LDACorpus, K: int, sweeps: int, kernel: str = "sparse") -> tuple[float, float, float]:
    """(tokens/s, log-likelihood, CPU seconds per token) of the bare serial loop of one kernel (no simlib.run)."""
    state = GibbsState.init(c, K, ALPHA, BETA, seed=0, kernel=kernel)
    t, cpu = time.perf_counter(), time.process_time()
    for s in range(sweeps):
        state.sweep(seed=s)
    dt, cpu = time.perf_counter() - t, time.process_time() - cpu
    return c.n_tokens * sweeps / dt, state.log_likelihood(), cpu / (c.n_tokens * sweeps)


def run_simlib_parallel(c: LDACorpus, K: int, sweeps: int, workers: int, kernel: str = "sparse",
                        sync_every: int | None = None) -> tuple[float, float, float]:
    """(tokens/s, log-likelihood, CPU seconds per token) of AD-LDA with BSP on ``workers`` processes (shared memory)."""
    problem = LDAProblem(c, K, ALPHA, BETA, kernel=kernel, sync_every=sync_every)
    res = simlib.run(problem, "bsp", substrate="shm", n_workers=workers, steps=sweeps, monitor_every=60.0)
    return (c.n_tokens * sweeps / res.seconds, problem.log_likelihood(res.params, problem.assignments(res)),
            res.measured["cpu_seconds"] / (c.n_tokens * sweeps))


def compare_kernels(c: LDACorpus, kernels: list[str], topics: list[int], sweeps: int, workers: list[int], repeat: int,
                    sync_every: int | None = None, bare: bool = False) -> None:
    """One table: each kernel through simlib.run at each K and number of processes, tomotopy beside.

    M tokens/s (wall, best of the interleaved repetitions), CPU ns per token (the workers' CPU, summed),
    log p(w, z) per token after ``sweeps``; each row against the first kernel's 1-process row (speed) and
    against the same kernel's 1-process row (log p, when 1 is among ``workers``). With ``bare``, each kernel's
    serial loop outside simlib.run too (workers shown as 0), the same chain as simlib.run's 1-process run.
    """
    for k in kernels:
        GibbsState.init(c.subset(np.arange(2)), 2, kernel=k).sweep(0)  # load the compiled kernels before timing
    try:
        import tomotopy  # noqa: F401
        peers = {("tomotopy", w): (lambda K, w=w: run_tomotopy(c, K, sweeps, w)) for w in workers}
    except ImportError:
        peers = {}
    header = (f"{'K':>5} {'kernel':<8} {'workers':>7} {'M tokens/s':>11} {'CPU ns/tok':>10} {'vs tomotopy':>11} "
              f"{'vs 1 proc':>9} {'log p(w,z)/token':>17} {'vs 1 proc':>9}")
    print(header)
    print("-" * len(header))
    loads = []
    for K in topics:
        best: dict[tuple[str, int], tuple[float, float, float]] = {}
        runs = {(k, w): (lambda K, k=k, w=w: run_simlib_parallel(c, K, sweeps, w, k, sync_every))
                for k in kernels for w in workers} | peers
        if bare:
            runs |= {(k, 0): (lambda K, k=k: run_simlib(c, K, sweeps, k)) for k in kernels}
        for _ in range(repeat):  # interleaved, the best speed kept (the machine is shared)
            for key, fn in runs.items():
                speed, ll, cpu = fn(K)
                loads.append(os.getloadavg()[0])
                old = best.get(key)
                best[key] = (max(speed, old[0]) if old else speed, ll, min(cpu, old[2]) if old else cpu)
        for (k, w), (speed, ll, cpu) in best.items():
            tomo = best.get(("tomotopy", max(w, 1)))
            one = best.get((k, 1))
            vs_tomo = f"{speed / tomo[0]:.2f}x" if tomo and k != "tomotopy" else ""
            vs_one = f"{speed / one[0]:.2f}x" if one and w != 1 and k != "tomotopy" else ""
            ll_one = f"{(ll - one[1]) / abs(one[1]):+.2%}" if one and w != 1 and k != "tomotopy" else ""
            if tomo and k != "tomotopy":
                record(__file__, f"LDA K = {K:,}, {KERNEL_NAMES.get(k, k)}, {w} process{'es' if w > 1 else ''}",
                       f"tomotopy, {max(w, 1)} worker{'s' if w > 1 else ''}", speed / tomo[0], "tokens/s",
                       headline=(K, k, w) == (1000, "mh", 1))
            print(f"{K:>5} {k:<8} {w:>7} {speed / 1e6:>11.2f} {cpu * 1e9:>10.0f} {vs_tomo:>11} {vs_one:>9} "
                  f"{ll / c.n_tokens:>17.4f} {ll_one:>9}")
    print(f"Load average (1 min) during the runs: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores. "
          "Wall-clock speeds of one run compare with each other only; CPU per token is less sensitive to the load.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="400 chapters, 20 sweeps, one repetition")
    ap.add_argument("--sweeps", type=int, default=None, help="sweeps per run (default 100, 20 with --quick)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="interleaved repetitions of the fast samplers; the best speed is kept (default 3, 1 with --quick)")
    ap.add_argument("--kernels", default=None,
                    help="compare these simlib kernels only, e.g. sparse,mh (from simlib.problems.lda_gibbs.KERNELS)")
    ap.add_argument("--topics", default="100,1000", help="with --kernels: the numbers of topics K, e.g. 100,1000")
    ap.add_argument("--workers", default="1",
                    help="with --kernels: AD-LDA processes, e.g. 1,2 (default 1); tomotopy runs with as many threads")
    ap.add_argument("--sync-every", type=int, default=None,
                    help="with --kernels and several processes: tokens between two syncs with the table (default "
                         "LDAProblem's: max(1024, 2^20 / K); a number above the corpus's tokens syncs once per sweep)")
    ap.add_argument("--bare", action="store_true",
                    help="with --kernels: also each kernel's serial loop outside simlib.run (workers shown as 0)")
    ap.add_argument("--corpus", default=None,
                    help="a plain or gzipped text file, one document per line, instead of the KJV chapters "
                         "(the same stop-word rule: simlib.problems.lda.text_corpus)")
    args = ap.parse_args()
    sweeps = args.sweeps or (20 if args.quick else 100)
    repeat = args.repeat or (1 if args.quick else 3)
    if args.kernels:
        kernels = args.kernels.split(",")
        topics = [int(k) for k in args.topics.split(",") if k.strip().isdigit()]
        workers = [int(w) for w in args.workers.split(",") if w.strip().isdigit()]
        if (any(k not in KERNELS for k in kernels) or not topics or min(topics) < 1 or not workers or min(workers) < 1
                or (args.sync_every is not None and args.sync_every < 1)):
            ap.error(f"--kernels must name kernels of {KERNELS}; --topics, --workers and --sync-every positive integers")
    max_docs = 400 if args.quick else None
    c = text_corpus(args.corpus, max_docs=max_docs) if args.corpus else kjv_corpus(max_docs=max_docs)
    name = Path(args.corpus).name if args.corpus else "KJV chapters"
    if args.kernels:
        print(f"{name}: {c.n_docs} documents, {c.n_tokens:,} tokens, {c.n_words:,} words; {sweeps} sweeps; "
              f"alpha={ALPHA}, beta={BETA}; AD-LDA BSP through simlib.run, best of {repeat} interleaved runs")
        compare_kernels(c, kernels, topics, sweeps, workers, repeat, args.sync_every, args.bare)
        return
    print(f"{name}: {c.n_docs} documents, {c.n_tokens:,} tokens, {c.n_words:,} words; "
          f"{sweeps} sweeps; alpha={ALPHA}, beta={BETA}; best of {repeat} interleaved runs (lda package: 1 run)")
    GibbsState.init(c, 2).sweep(0)  # load the compiled kernels before timing
    header = f"{'K':>4} {'sampler':<26} {'workers':>7} {'M tokens/s':>11} {'log p(w,z)':>14} {'vs tomotopy':>12} {'LL vs lda':>10}"
    print(header)
    print("-" * len(header))
    for K in (20, 100):
        fast = {
            ("tomotopy", 1): lambda: run_tomotopy(c, K, sweeps, 1),
            ("tomotopy", 2): lambda: run_tomotopy(c, K, sweeps, 2),
            ("simlib sparse (1 process)", 1): lambda: run_simlib(c, K, sweeps),
            ("simlib AD-LDA BSP", 1): lambda: run_simlib_parallel(c, K, sweeps, 1),
            ("simlib AD-LDA BSP", 2): lambda: run_simlib_parallel(c, K, sweeps, 2),
        }
        # NOTE: the machine is shared, so the load changes from one row to the next; interleaving
        # the samplers and keeping each one's best run compares them under the same conditions.
        best: dict[tuple[str, int], tuple[float, float]] = {}
        for _ in range(repeat):
            for key, fn in fast.items():
                speed, ll = fn()[:2]
                if key not in best or speed > best[key][0]:
                    best[key] = (speed, best.get(key, (0.0, ll))[1])
        rows = [("lda package", 1, *run_lda_package(c, K, sweeps))] + [(n, w, *best[(n, w)]) for n, w in fast]
        peer_ll = rows[0][3]
        tomo = {w: best[("tomotopy", w)][0] for w in (1, 2)}
        for name, w, speed, ll in rows:
            ratio = "" if name == "tomotopy" else f"{speed / tomo[w]:.2f}x"
            print(f"{K:>4} {name:<26} {w:>7} {speed / 1e6:>11.2f} {ll:>14,.0f} {ratio:>12} {(ll - peer_ll) / abs(peer_ll):>+10.2%}")
        ours = {w: max(r[2] for r in rows if r[0].startswith("simlib") and r[1] == w) for w in (1, 2)}
        worst_ll = max(abs(r[3] - peer_ll) / abs(peer_ll) for r in rows if r[0].startswith("simlib"))
        for w in (1, 2):
            record(__file__, f"LDA K = {K}, {w} worker{'s' if w > 1 else ''}" + (f" ({name})" if args.corpus else ""),
                   f"tomotopy, {w} worker{'s' if w > 1 else ''}", ours[w] / tomo[w], "tokens/s",
                   headline=K == 100 and not args.corpus)
        print(f"     goals at K={K}: speed vs tomotopy 1 worker {ours[1] / tomo[1]:.2f}x, 2 workers "
              f"{ours[2] / tomo[2]:.2f}x (goal >= 1); largest log-likelihood gap to lda {worst_ll:.2%} (goal < 1%)")
    print("Measured on a shared, busy machine: compare rows of one run, not across runs.")


if __name__ == "__main__":
    main()

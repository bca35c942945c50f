"""Hogwild! against scikit-learn: nonzeros per second and final loss on the same sparse data.

Every method runs the same number of epochs over the same rows with the same constant step
size and L2 weight. The peer is ``SGDClassifier(loss='log_loss', penalty='l2',
learning_rate='constant')`` (one core, Cython). Throughput is nonzeros processed per second of
training (process start-up excluded; the 'wall s' column includes it). Methods take turns,
``--repeats`` rounds, and the fastest round of each is shown (as ``timeit`` does), because on a
shared 2-core machine other programs steal whole time slices. The loss is the full objective
over all rows. Every simlib row is ``simlib.run(LogisticProblem(...), protocol, substrate="shm")``, one row per
step: the in-place path of the contract. Hogwild runs twice: with every weight decayed every step
(``l2_on='all'``, scikit-learn's objective and its shared scale) and with L2 on the touched
features only (``l2_on='touched'``, the parameter server's sparse L2), each also with replicas
(``hot_keys=``: every process updates a private copy of the weights, of every feature unless
``--hot-keys`` names how many of the most frequent, and adds its share of the change to the table
once per chunk of ``--replica-chunk`` rows, so no cache line moves between the cores in between:
HogWild++'s replicas). The 2-process Hogwild rows run under SSP with a bound of ``--lead`` rows (4 chunks):
each process takes its own half of the rows, and under 'async' the one that finishes first leaves the
other alone for up to a fifth of the run (measured: 0.06-0.28 s of 1.3), whose every step also decays the
weights of the features only the first half holds, so the final loss ended 0.7-3% above scikit-learn's;
bounding the lead keeps both halves in step to the end (the 'async' rows show the difference, ``--lead 0``
makes every row async). 'cores' is CPU seconds per training second: how many cores a method really got
(fewer than its processes when other programs compete), and 'M nnz/CPU-s' is the throughput
per CPU second, which the competition does not dilute. With ``--headline`` each round also fits scikit-learn on
each half of the rows in its own process at once, sharing nothing: its rate over one whole fit in that round is the
ceiling this machine gives 2 processes at that moment (two cores of a shared host do not run two programs at twice
one's rate), printed beside the Hogwild rows and kept in their record. Run::

    python benchmarks/hogwild.py            # 200 k rows x 100 k features, ~50 nonzeros per row
    python benchmarks/hogwild.py --quick    # 20 k x 10 k, one repeat
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np

from numba import njit

import simlib
from simlib.parallel.group import WorkerGroup
from simlib.parallel.shm import SharedArray
from simlib.problems.logistic import LogisticProblem, make_sparse_classification
from record import at_once, record


# the rows the headline row replaces in the README: the async one (its final loss was 1.35% above the peer's), and a
# run of 5 rounds before in-place SSP waited for whole chunks (its worker at the bound ran chunks of a row or two)
REPLACED = ["Hogwild!, 2 processes, replicas, median of 5 rounds",
            "Hogwild!, 2 processes, replicas (SSP, lead <= 160,000 rows), median of 5 rounds"]


def on_shm(data, protocol: str, n_workers: int, lr: float, l2: float, epochs: int, batch_size: int = 1,
           l2_on: str = "all", **options) -> tuple[np.ndarray, float, float, float]:
    """One simlib.run on shared memory: (weights, train seconds, wall seconds, CPU seconds)."""
    prob = LogisticProblem(data, l2=l2, eval_rows=2_000, l2_on=l2_on)
    t = time.perf_counter()
    res = simlib.run(prob, protocol, substrate="shm", n_workers=n_workers, batch_size=batch_size, lr=lr,
                     steps=epochs * prob.epoch_steps(n_workers, batch_size), monitor_every=1.0, **options)
    wall = time.perf_counter() - t
    return prob.weights(res.params), res.seconds, wall, res.measured["cpu_seconds"]


def batched(data, lr: float, l2: float, epochs: int, batch_size: int) -> tuple[np.ndarray, float, float, float]:
    """The gpu substrate on NumPy: mini-batches on one read of the weights, at lr * batch_size, in the same tuple."""
    prob = LogisticProblem(data, l2=l2, eval_rows=2_000, l2_on="all")
    t, c = time.perf_counter(), time.process_time()
    res = simlib.run(prob, "async", substrate="gpu", xp="numpy", n_workers=1, batch_size=batch_size,
                     lr=lr * batch_size, steps=epochs * prob.epoch_steps(1, batch_size), eval_every=10**9)
    return prob.weights(res.params), res.seconds, time.perf_counter() - t, time.process_time() - c


def sklearn_fit(x, y: np.ndarray, lr: float, l2: float, epochs: int) -> tuple[np.ndarray, float, float]:
    """The peer: scikit-learn's SGD with the same schedule on the CSR rows ``x``; returns (weights, fit seconds, CPU
    seconds)."""
    from sklearn.linear_model import SGDClassifier

    clf = SGDClassifier(
        loss="log_loss", penalty="l2", alpha=l2, learning_rate="constant", eta0=lr,
        fit_intercept=False, shuffle=False, max_iter=epochs, tol=None,
    )
    c, t = time.thread_time(), time.perf_counter()
    clf.fit(x, y)
    return clf.coef_.ravel().copy(), time.perf_counter() - t, time.thread_time() - c


def sklearn_halves(x, y: np.ndarray, lr: float, l2: float, epochs: int) -> float:
    """scikit-learn on each half of the rows, in two processes at once, sharing nothing: the slower fit's seconds.
    Against one fit of every row, what a perfect 2-process split of the peer itself reaches on this machine now."""
    half = len(y) // 2
    return max(at_once(*(lambda rows=rows: sklearn_fit(x[rows], y[rows], lr, l2, epochs)[1]
                         for rows in (slice(0, half), slice(half, None)))))


@njit(nogil=True, cache=True)
def _random_updates(w: np.ndarray, idx: np.ndarray, reps: int) -> float:
    """Read-modify-write ``w`` at the positions ``idx``, ``reps`` times (a Hogwild update without the math)."""
    s = 0.0
    for _ in range(reps):
        for j in idx:
            s += w[j]
            w[j] = w[j] * 0.999 + 1e-9
    return s


def _probe_member(worker: int, n: int, shared: SharedArray, private: bool, reps: int) -> float:
    """Seconds per update of this worker: on the group's shared array, or on a private copy of it."""
    w = np.zeros(shared.array.shape) if private else shared.array
    idx = np.random.default_rng(worker).integers(0, w.shape[0], 1_000_000)
    _random_updates(w, idx, 1)
    s = time.perf_counter()
    _random_updates(w, idx, reps)
    return (time.perf_counter() - s) / (reps * len(idx))


def coherence_probe(n_features: int, start_method: str) -> None:
    """Why two Hogwild processes are not twice as fast here: random updates of one shared array.

    Each of 2 processes updates random entries of an array the size of the weights, either its
    own (private) or the one they share. Private arrays scale; a shared one makes every write
    invalidate the other core's copy of that cache line, whatever the features' frequencies.
    """
    rows = []
    with WorkerGroup(2, start_method, label="coherence probe") as group:
        shared = group.zeros(n_features)
        for private in (True, False):
            per = group.run(_probe_member, shared, private, 20)
            rows.append(("private arrays" if private else "one shared array", float(np.mean(per))))
    print(f"\n2 processes, random read-modify-writes of {n_features:,} float64 ({n_features * 8 / 2**20:.1f} MiB):")
    for name, sec in rows:
        print(f"  {name:<18} {sec * 1e9:6.2f} ns per update per process")
    print(f"  sharing costs {rows[1][1] / rows[0][1]:.1f}x per update: the cache lines bounce between the cores")


def _chunks_member(worker: int, n: int, prob: LogisticProblem, shared: SharedArray, hot_keys: int, lr: float,
                   chunk: int) -> list[tuple[float, float, float, int]]:
    """Hogwild! on this worker's shard, chunk by chunk: (start, end, CPU seconds, nonzeros) of each chunk."""
    w, shard = shared.array, prob.shards(n)[worker]
    replica = prob.replica(hot_keys, 1, n) if hot_keys else None
    d, (a, b), out = prob.data, shard, []
    for c in range(0, (b - a) * 2, chunk):  # two epochs
        rows = a + (np.arange(c, c + chunk) % (b - a))
        t, cpu = time.perf_counter(), time.thread_time()
        prob.local_steps(w, shard, c, chunk, 1, lr, replica=replica)
        out.append((t, time.perf_counter(), time.thread_time() - cpu, int((d.indptr[rows + 1] - d.indptr[rows]).sum())))
    return out


def co_running(data, lr: float, l2: float, start_method: str, hot_keys: int, repeats: int = 6, chunk: int = 2_000,
               peer_per_cpu: float | None = None) -> None:
    """Nonzeros per CPU second of 2 Hogwild! processes while both are on a CPU, and while one runs alone.

    On a machine other programs share, the two processes often take turns, and a turn alone moves no cache
    line; the chunks timed here count only when the process had its core (CPU time >= 90 % of the chunk's wall
    time) and the other process had one too for >= 90 % of it (or for <= 10 %: 'alone'). This is the cost of
    sharing the table that the throughput table blurs under load (its 'on two whole cores' lines take the
    rate per CPU second of processes that, on a busy machine, mostly took turns); ``peer_per_cpu``, when
    given, turns the rate of both on a CPU into what two whole cores would do against scikit-learn.
    """
    prob = LogisticProblem(data, l2=l2, eval_rows=2_000, l2_on="all")
    for hot in (0, hot_keys):  # compiled here, not in each process's first chunk
        prob.local_steps(prob.init_params(), (0, 1), 0, 1, 1, 0.0, replica=prob.replica(hot, 1) if hot else None)
    print(f"\n2 processes, Hogwild! chunks of {chunk:,} rows on one shared table (l2_on='all'), {repeats} runs:")
    for hot in (0, hot_keys):
        both, alone = np.zeros(2), np.zeros(2)  # (nonzeros, CPU seconds)
        for _ in range(repeats):
            with WorkerGroup(2, start_method, label="co-running probe") as group:
                shared = group.copy_of(prob.init_params())
                runs = group.run(_chunks_member, prob, shared, hot, lr, chunk)
            for i in (0, 1):
                other = [(s, e) for s, e, cpu, _ in runs[1 - i] if cpu >= 0.9 * (e - s)]
                for s, e, cpu, nz in runs[i]:
                    if cpu < 0.9 * (e - s):
                        continue
                    overlap = sum(max(0.0, min(e, e2) - max(s, s2)) for s2, e2 in other) / (e - s)
                    if overlap >= 0.9:
                        both += (nz, cpu)
                    elif overlap <= 0.1:
                        alone += (nz, cpu)
        rate = [f"{z / c / 1e6:5.0f} M nnz/CPU-s ({c:.2f} CPU-s timed)" if c else "    - (no such chunk)" for z, c in (both, alone)]
        print(f"  hot_keys={hot:<6,} both on a CPU: {rate[0]}   alone: {rate[1]}")
        if both[1] and peer_per_cpu:
            print(f"    two whole cores at that rate: {2 * both[0] / both[1] / 1e6:.0f} M nnz/s = "
                  f"{2 * both[0] / both[1] / peer_per_cpu:.2f}x scikit-learn's rate per CPU second")


def main() -> None:
    """Print one table: throughput, ratio to scikit-learn, final loss and its gap to scikit-learn's."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 k rows x 10 k features, one repeat, replica chunks of 4 k")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--features", type=int, default=100_000)
    ap.add_argument("--draws", type=int, default=60, help="feature draws per row (repeats dropped: ~50 unique)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.2, help="constant step size")
    ap.add_argument("--l2", type=float, default=1e-5, help="L2 weight")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--start-method", default="fork", choices=["fork", "spawn"])
    ap.add_argument("--hot-keys", type=int, default=0, help="features each process keeps a replica of (0: all)")
    ap.add_argument("--replica-chunk", type=int, default=40_000, help="rows between two pushes of a replica (0.4 shard)")
    ap.add_argument("--lead", type=int, default=None,
                    help="rows one of 2 processes may run ahead of the other (SSP's bound; 0: async; "
                         "default: 4 x --replica-chunk)")
    ap.add_argument("--headline", action="store_true",
                    help="only scikit-learn, serial and the 2-process Hogwild rows (each run >= 2 s: --epochs 120), "
                         "and each round scikit-learn on each half of the rows in two processes at once (the ceiling)")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.features, args.repeats, args.replica_chunk = 20_000, 10_000, 1, 4_000
    args.lead = 4 * args.replica_chunk if args.lead is None else args.lead
    data = make_sparse_classification(args.rows, args.features, args.draws, zipf=1.0, seed=0)
    full = LogisticProblem(data, l2=args.l2, eval_rows=None)
    nnz = data.nnz * args.epochs
    print(
        f"{data.n_rows:,} rows x {data.n_features:,} features, {data.nnz / data.n_rows:.1f} nonzeros/row, "
        f"{args.epochs} epochs, lr={args.lr}, l2={args.l2}, start method {args.start_method}, "
        f"2 processes {'async' if not args.lead else f'under SSP, lead <= {args.lead:,} rows'}, "
        f"best of {args.repeats}" + (" (headline rows only)" if args.headline else "")
    )

    sm, hot = args.start_method, args.hot_keys or args.features
    two = f"ssp:{args.lead}" if args.lead else "async"  # the 2-process Hogwild rows' protocol
    common = dict(lr=args.lr, l2=args.l2, epochs=args.epochs, start_method=sm)
    replicas = dict(hot_keys=hot, chunk=args.replica_chunk, **common)
    methods: list[tuple[str, int, Callable[[], tuple]]] = [
        ("serial (in place)", 1, lambda: on_shm(data, "async", 1, **common)),
        ("locked", 2, lambda: on_shm(data, "async", 2, locked=True, **common)),
        ("hogwild", 2, lambda: on_shm(data, two, 2, **common)),
        ("hogwild, replicas", 2, lambda: on_shm(data, two, 2, **replicas)),
        *([("hogwild, replicas, async", 2, lambda: on_shm(data, "async", 2, **replicas))] if args.lead else []),
        ("hogwild, touched L2", 1, lambda: on_shm(data, "async", 1, l2_on="touched", **common)),
        ("hogwild, touched L2", 2, lambda: on_shm(data, two, 2, l2_on="touched", **common)),
        ("hogwild, touched, replicas", 2, lambda: on_shm(data, two, 2, l2_on="touched", **replicas)),
        ("bsp, batch 256/worker", 2, lambda: on_shm(data, "bsp", 2, batch_size=256, **common)),
        ("gpu substrate (NumPy), B=256", 1, lambda: batched(data, args.lr, args.l2, args.epochs, 256)),
    ]
    if args.headline:
        methods = [m for m in methods if m[0] in ("serial (in place)", "hogwild", "hogwild, replicas",
                                                  "hogwild, replicas, async")]
    fits: list[tuple[np.ndarray, float, float]] = []
    runs: list[list[tuple]] = [[] for _ in methods]
    halves: list[float] = []  # --headline: scikit-learn on each half at once, each round (the machine's ceiling)
    x = data.to_scipy().astype(np.float64)  # the peer's CSR rows, converted once, outside every timed fit
    for _ in range(args.repeats):  # take turns, so a busy spell hurts every method alike
        fits.append(sklearn_fit(x, data.y, args.lr, args.l2, args.epochs))
        if args.headline:
            halves.append(sklearn_halves(x, data.y, args.lr, args.l2, args.epochs))
        for k, (_, _, fn) in enumerate(methods):
            runs[k].append(fn())
    sk_w, sk_s, sk_cpu = fits[-1][0], min(s for _, s, _ in fits), min(c for _, _, c in fits)
    sk_loss = full.loss(sk_w)
    rows: list[tuple[str, int, float, float, float, float]] = [("scikit-learn SGDClassifier", 1, sk_s, sk_s, sk_cpu, sk_loss)]
    for (name, workers, _), done in zip(methods, runs):
        best = min(done, key=lambda r: r[1])
        cpu = min(r[3] for r in done)
        rows.append((name, workers, best[1], best[2], cpu, full.loss(done[-1][0])))

    print(
        f"{'method':<30} {'procs':>5} {'train s':>8} {'wall s':>7} {'cores':>5} {'M nnz/s':>8} {'x sklearn':>9} "
        f"{'M nnz/CPU-s':>11} {'final loss':>10} {'vs sklearn':>10}"
    )
    rate, per_cpu = {}, {}
    for name, workers, train_s, wall_s, cpu_s, loss in rows:
        r = nnz / train_s
        rate[(name, workers)], per_cpu[(name, workers)] = r, nnz / cpu_s
        print(
            f"{name:<30} {workers:>5} {train_s:8.3f} {wall_s:7.2f} {cpu_s / train_s:5.2f} {r / 1e6:8.1f} "
            f"{r / (nnz / sk_s):8.2f}x {nnz / cpu_s / 1e6:11.1f} {loss:10.5f} {100 * (loss - sk_loss) / sk_loss:+9.2f}%"
        )
    sk = nnz / sk_s
    print("\nper round (scikit-learn and each method take turns): its rate over scikit-learn's in the same round")
    ceiling = sorted(fit[1] / s for fit, s in zip(fits, halves))
    if ceiling:
        print(f"  {'ceiling: scikit-learn on halves':<30} 2 procs: median {np.median(ceiling):.2f}x, worst "
              f"{ceiling[0]:.2f}x, best {ceiling[-1]:.2f}x (each half's fit in its own process at once, sharing "
              "nothing: what this machine gives 2 processes now)")
    for (name, workers, _), done in zip(methods, runs):
        ratios = sorted(fit[1] / r[1] for fit, r in zip(fits, done))
        gaps = sorted(100 * (full.loss(r[0]) - sk_loss) / sk_loss for r in done)
        print(f"  {name:<30} {workers} procs: median {np.median(ratios):.2f}x, worst {ratios[0]:.2f}x, "
              f"best {ratios[-1]:.2f}x over {len(ratios)} rounds (train s {min(r[1] for r in done):.2f}"
              f"-{max(r[1] for r in done):.2f}); final loss {gaps[0]:+.2f}% to {gaps[-1]:+.2f}% of scikit-learn's")
        if args.headline and workers == 2:
            how = "async" if "async" in name or not args.lead else f"SSP, lead <= {args.lead:,} rows"
            record(__file__, f"Hogwild!, 2 processes{name.removeprefix('hogwild').removesuffix(', async')} ({how}), "
                   f"median of {len(ratios)} rounds", "scikit-learn SGDClassifier(log_loss)", float(np.median(ratios)),
                   "nonzeros/s", headline=name == "hogwild, replicas", worst=round(ratios[0], 3),
                   best=round(ratios[-1], 3), loss_gap_pct=[round(gaps[0], 2), round(gaps[-1], 2)],
                   **({"replaces": REPLACED} if name == "hogwild, replicas" else {}),
                   train_seconds=round(float(np.median([r[1] for r in done])), 2), epochs=args.epochs,
                   **({"peer_halves_ceiling": round(float(np.median(ceiling)), 3)} if ceiling else {}))
    if args.headline:
        return
    loss_of = {(name, workers): loss for name, workers, *_, loss in rows}
    for name, serial in (("hogwild", "serial (in place)"), ("hogwild, replicas", "serial (in place)"),
                         ("hogwild, touched, replicas", "hogwild, touched L2")):
        rate[(name, 1)], per_cpu[(name, 1)] = rate[(serial, 1)], per_cpu[(serial, 1)]
    for name in ("hogwild", "hogwild, replicas", "hogwild, touched L2", "hogwild, touched, replicas"):
        h1, h2 = rate[(name, 1)], rate[(name, 2)]
        gap = 100 * abs(loss_of[(name, 2)] - sk_loss) / sk_loss
        ideal = 2 * per_cpu[(name, 2)]
        print()
        print(f"{name}, 2 procs / scikit-learn : {h2 / sk:.2f}x   (goal >= 0.9x)")
        print(f"{name}, 2 procs / 1 proc       : {h2 / h1:.2f}x   (stretch goal >= 1.5x)")
        print(f"{name}, 2 procs loss vs sklearn: {gap:.2f}%  (goal <= 0.5%)")
        record(__file__, f"Hogwild!, 2 processes{name.removeprefix('hogwild')}", "scikit-learn SGDClassifier(log_loss)",
               h2 / sk, "nonzeros/s", headline=False)  # the README's figure: --headline's median of rounds
        print(
            f"  on two whole cores ({ideal / 1e6:.0f} M nnz/s = 2 x its rate per CPU second): "
            f"{ideal / (nnz / sk_cpu):.2f}x scikit-learn's rate per CPU second, "
            f"{ideal / per_cpu[(name, 1)]:.2f}x its own 1-process rate per CPU second"
        )
    coherence_probe(args.features, sm)
    co_running(data, args.lr, args.l2, sm, hot, repeats=6 * args.repeats, chunk=10_000, peer_per_cpu=nnz / sk_cpu)


if __name__ == "__main__":
    main()

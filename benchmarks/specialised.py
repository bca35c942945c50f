"""What the specialised parallel loops buy over the same algorithm run through ``simlib.run``.

simlib keeps two hand-written multi-process loops beside the contract's substrates:
Hogwild! logistic regression (``simlib.parallel.hogwild``: compiled lock-free SGD on a shared
weight vector) and AD-LDA (``simlib.parallel.lda``: compiled Gibbs sweeps against a cached
table). The same problems also run on the contract's shared-memory substrate
(``simlib.run(problem, protocol, substrate="shm")``, where every step is a Python-level
get / step / add on a :class:`~simlib.contract.Table`). Each row here is one run, timed end to
end around the call (process start included), on the same data and the same number of workers;
the ratio is the specialised loop's throughput over the contract's, in the same run of this script.
The quality column is the final loss (Hogwild, on the same 2,000 rows) or log p(w | z) (LDA): Hogwild
takes one step per row, the contract one mean gradient per mini-batch of 256 rows at the same step size.

    python benchmarks/specialised.py          # about a minute on a 2-core laptop
    python benchmarks/specialised.py --quick  # smaller problems, a few seconds
"""
from __future__ import annotations

import argparse
import time

import simlib
from simlib.parallel import hogwild, lda
from simlib.problems.lda import make_synthetic_corpus, word_log_likelihood
from simlib.problems.lda_table import LDAProblem
from simlib.problems.logistic import LogisticProblem, make_sparse_classification

WORKERS = 2
BATCH = 256
TOPICS, ALPHA, BETA = 20, 0.1, 0.01


def timed(fn):
    """(seconds, result) of one call, wall time."""
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def hogwild_rows(rows: int, epochs: int) -> list[tuple]:
    """Hogwild! SGD: rows visited per second and the final loss on the same 2,000 rows, both ways."""
    data = make_sparse_classification(rows, 20_000, 20, seed=0)
    n = rows * epochs
    s1, res = timed(lambda: hogwild.train(data, "hogwild", n_workers=WORKERS, epochs=epochs, lr=0.2, l2=1e-5))
    problem = LogisticProblem(data, l2=1e-5, eval_rows=2_000, l2_on="all")  # the loop's objective: every weight decays
    steps = n // WORKERS
    s2, run = timed(lambda: simlib.run(problem, "async", substrate="shm", n_workers=WORKERS, steps=steps,
                                       batch_size=1, lr=0.2))
    return [("hogwild", "parallel.hogwild.train", n / s1, res.trace.quality[-1].value),
            ("hogwild", "simlib.run(async, shm)", WORKERS * steps / s2, run.quality)]


def lda_rows(n_docs: int, sweeps: int) -> list[tuple]:
    """AD-LDA under BSP: tokens sampled per second and the final log p(w | z), both ways."""
    corpus, _, _ = make_synthetic_corpus(n_docs=n_docs, n_topics=TOPICS, n_words=2_000, doc_length=150, seed=0)
    s1, run = timed(lambda: lda.train_parallel(corpus, TOPICS, ALPHA, BETA, n_sweeps=sweeps, n_workers=WORKERS,
                                               protocol="bsp", record_every=None))
    problem = LDAProblem(corpus, n_topics=TOPICS, alpha=ALPHA, beta=BETA)
    s2, res = timed(lambda: simlib.run(problem, "bsp", substrate="shm", n_workers=WORKERS, steps=sweeps))
    n = corpus.n_tokens * sweeps
    return [("lda", "parallel.lda.train_parallel", n / s1, word_log_likelihood(run.n_wk, run.n_k, BETA)),
            ("lda", "simlib.run(bsp, shm)", n / s2, res.quality)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller problems")
    q = ap.parse_args().quick
    rows = hogwild_rows(50_000 if q else 400_000, 2 if q else 3) + lda_rows(200 if q else 2_000, 3 if q else 10)
    print(f"{WORKERS} workers; throughput end to end (process start included)\n")
    print(f"{'problem':<8} {'how':<30} {'per second':>12} {'quality':>14} {'ratio':>7}")
    for i, (prob, how, speed, quality) in enumerate(rows):
        ratio = f"{speed / rows[i + 1][2]:.1f}x" if i % 2 == 0 else "1.0x"
        print(f"{prob:<8} {how:<30} {speed:>12,.0f} {quality:>14.4g} {ratio:>7}")


if __name__ == "__main__":
    main()

"""The proof that moving a hand-written loop onto ``simlib.run`` loses nothing: both, on the same problem, in one run.

Before a loop is deleted, this script runs it beside the same algorithm through the contract
(``simlib.run(problem, protocol, substrate="shm")``), timed end to end around the call (process start
included), on the same data and the same number of workers; the ratio is the loop's throughput over
the contract's, in the same run. The quality column is log p(w | z) after the same sweeps. What is
left here is AD-LDA (``simlib.parallel.lda``: compiled Gibbs sweeps against a cached table); the
README records the figures of loops already moved (Hogwild!: its last run here is quoted there).

    python benchmarks/specialised.py          # about a minute on a 2-core laptop
    python benchmarks/specialised.py --quick  # smaller problems, a few seconds
"""
from __future__ import annotations

import argparse
import time

import simlib
from simlib.parallel import lda
from simlib.problems.lda import make_synthetic_corpus, word_log_likelihood
from simlib.problems.lda_table import LDAProblem

WORKERS = 2
TOPICS, ALPHA, BETA = 20, 0.1, 0.01


def timed(fn):
    """(seconds, result) of one call, wall time."""
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


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
    rows = lda_rows(200 if q else 2_000, 3 if q else 10)
    print(f"{WORKERS} workers; throughput end to end (process start included)\n")
    print(f"{'problem':<8} {'how':<30} {'per second':>12} {'quality':>14} {'ratio':>7}")
    for i, (prob, how, speed, quality) in enumerate(rows):
        ratio = f"{speed / rows[i + 1][2]:.1f}x" if i % 2 == 0 else "1.0x"
        print(f"{prob:<8} {how:<30} {speed:>12,.0f} {quality:>14.4g} {ratio:>7}")


if __name__ == "__main__":
    main()

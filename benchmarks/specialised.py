"""What the local-step hook buys: the same problem on the same substrate, in place against get / step / add.

Every hand-written training loop that stood beside ``simlib.run`` was moved onto it and deleted, each
after this script had run the loop and the contract side by side on the same problem (docs/benchmarks.md
records those last runs). What is left to show is the one switch inside the contract: a problem's
compiled ``local_steps`` applied to the shared table in place, against the generic path where each
step is a Python-level get (a locked copy), step and add (``rule=`` a StepRule subclass that scales by
1 sends a run there, since a rule that could change pushes must see each one). Each row is one
``simlib.run(..., substrate="shm")``, timed end to end around the call (process start included), on
the same data and the same number of workers; the ratio is the in-place throughput over the generic
path's, in the same run of this script. Quality: the final loss on the same 2,000 rows.

    python benchmarks/specialised.py          # a few seconds on a 2-core laptop
    python benchmarks/specialised.py --quick  # smaller problems
"""
from __future__ import annotations

import argparse
import time

import simlib
from simlib.problems.logistic import LogisticProblem, make_sparse_classification
from simlib.protocol import StepRule
from record import record

WORKERS = 2


class Unscaled(StepRule):
    """The plain rule as a subclass: pushes unchanged, but the substrate cannot know that, so it takes get / step / add."""

    def scale(self, tau: int) -> float:
        return 1.0


def timed(fn):
    """(seconds, result) of one call, wall time."""
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def rows_per_second(rows: int, batch_size: int) -> list[tuple]:
    """Logistic SGD under async on shared memory: rows per second and final loss, in place and get / step / add."""
    data = make_sparse_classification(rows, 20_000, 20, seed=0)
    problem = LogisticProblem(data, l2=1e-5, eval_rows=2_000, l2_on="all")
    steps = problem.epoch_steps(WORKERS, batch_size)
    out = []
    for how, extra in (("in place (local_steps)", {}), ("get / step / add", {"rule": Unscaled()})):
        s, res = timed(lambda: simlib.run(problem, "async", substrate="shm", n_workers=WORKERS, steps=steps,
                                          batch_size=batch_size, lr=0.2, **extra))
        assert res.trace.meta["path"] == ("in place" if not extra else "get / step / add")
        out.append((f"B={batch_size}", how, WORKERS * steps * batch_size / s, res.quality))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller problems")
    q = ap.parse_args().quick
    rows = rows_per_second(20_000 if q else 100_000, 1) + rows_per_second(50_000 if q else 400_000, 256)
    print(f"{WORKERS} workers, async, one epoch; throughput end to end (process start included)\n")
    print(f"{'batch':<7} {'how':<24} {'rows/s':>12} {'loss':>8} {'ratio':>7}")
    for i, (batch, how, speed, quality) in enumerate(rows):
        ratio = f"{speed / rows[i + 1][2]:.1f}x" if i % 2 == 0 else "1.0x"
        if i % 2 == 0:
            record(__file__, "the in-place local-step hook, " + ("one row per step" if batch == 1 else
                   f"mini-batches of {batch}"), "the generic get / step / add path", speed / rows[i + 1][2], "rows/s",
                   headline=batch == 1)
        print(f"{batch:<7} {how:<24} {speed:>12,.0f} {quality:>8.4f} {ratio:>7}")


if __name__ == "__main__":
    main()

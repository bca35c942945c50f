"""Benchmark GloVe: co-occurrence counting and AdaGrad training, against the reference C program.

    python benchmarks/glove.py                 # the shipped KJV corpus
    python benchmarks/glove.py --quick         # fewer epochs, smaller vectors
    python benchmarks/glove.py big.txt         # any plain/gzipped text file (one document per line)
    python benchmarks/glove.py --text8 text8   # the text8 format

The reference is stanfordnlp/GloVe (its ``cooccur``, ``shuffle`` and ``glove`` programs). It is
not shipped: build it yourself and point ``GLOVE_REF_DIR`` at the folder holding those binaries;
the benchmark then runs them on the same corpus, vocabulary, window, dimension and epochs in
the same run. Without it the peer rows read 'not measured (set GLOVE_REF_DIR)'.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import simlib  # noqa: E402
from simlib.data import Vocabulary, iter_text8, iter_text_file, load_kjv  # noqa: E402
from simlib.parallel.glove_count import count_parallel  # noqa: E402
from simlib.problems.glove import Cooccurrence, GloveConfig, count_cooccurrences  # noqa: E402
from simlib.problems.glove_slices import GloveSlices  # noqa: E402
from simlib.problems.glove_table import GloveProblem  # noqa: E402
from record import record  # noqa: E402

NOT_MEASURED = "not measured (set GLOVE_REF_DIR)"
MODE_NAMES = {"hogwild": "Hogwild", "model": "model-parallel", "bsp": "BSP"}


def load_docs(args: argparse.Namespace) -> tuple[str, list[list[str]]]:
    """The corpus to benchmark: the shipped KJV, or the file named on the command line (streamed)."""
    if args.text8:
        return Path(args.text8).name, list(iter_text8(args.text8))
    if args.corpus:
        return Path(args.corpus).name, list(iter_text_file(args.corpus))
    return "KJV (shipped)", load_kjv().docs


def run_reference(ref: Path, docs: list[list[str]], vocab: Vocabulary, cfg: GloveConfig, window: int,
                  threads: list[int], work: Path, count_repeats: int = 1) -> dict:
    """Run the C programs on the same corpus and vocabulary; return their speeds and costs."""
    corpus = work / "corpus.txt"
    with open(corpus, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(" ".join(d) + "\n")
    vocab.save(work / "vocab.txt")
    n_tokens = sum(1 for d in docs for w in d if w in vocab)
    out: dict = {}
    out["count_s"] = math.inf
    for _ in range(count_repeats):  # the best of as many runs as ours get
        t = time.perf_counter()
        with open(corpus, "rb") as fin, open(work / "cooc.bin", "wb") as fout:
            subprocess.run([str(ref / "cooccur"), "-verbose", "0", "-symmetric", "1", "-window-size", str(window),
                            "-vocab-file", str(work / "vocab.txt"), "-memory", "2.0"],
                           stdin=fin, stdout=fout, check=True)
        out["count_s"] = min(out["count_s"], time.perf_counter() - t)
    out["count_tokens_per_s"] = n_tokens / out["count_s"]
    with open(work / "cooc.bin", "rb") as fin, open(work / "cooc.shuf.bin", "wb") as fout:
        subprocess.run([str(ref / "shuffle"), "-verbose", "0", "-memory", "2.0"], stdin=fin, stdout=fout, check=True)
    out["nnz"] = (work / "cooc.shuf.bin").stat().st_size // 16  # one record: int, int, double
    for n in threads:
        t = time.perf_counter()
        proc = subprocess.run(
            [str(ref / "glove"), "-input-file", str(work / "cooc.shuf.bin"), "-vocab-file", str(work / "vocab.txt"),
             "-save-file", str(work / "vectors"), "-threads", str(n), "-x-max", str(cfg.x_max), "-alpha",
             str(cfg.alpha), "-iter", str(cfg.epochs), "-vector-size", str(cfg.dim), "-eta", str(cfg.lr),
             "-binary", "0", "-write-header", "0", "-verbose", "2"],
            capture_output=True, text=True, check=True)
        seconds = time.perf_counter() - t  # includes reading the input and writing vectors: favours us slightly
        costs = [float(c) for c in re.findall(r"iter: \d+, cost: ([0-9.eE+-]+)", proc.stderr)]
        out[n] = {"updates_per_s": cfg.epochs * out["nnz"] / seconds, "costs": costs}
    return out


def train(cooc: Cooccurrence, cfg: GloveConfig, mode: str, n: int) -> tuple[float, float, list[float]]:
    """(updates/s over the training, updates per CPU-second of the workers, cost per epoch) of ``mode``, through
    simlib.run on shared memory: 'hogwild' (GloveProblem, async), 'bsp' (GloveProblem, 4,096 entries per worker per
    step) or 'model' (GloveSlices under BSP: the dimensions split, batches of 8,192 entries shared by all workers,
    two steps each)."""
    problem = GloveSlices(cooc, cfg, max_workers=n) if mode == "model" else GloveProblem(cooc, cfg)
    batch = {"hogwild": 1, "bsp": 4096, "model": 8192}[mode]
    res = simlib.run(problem, "async" if mode == "hogwild" else "bsp", substrate="shm", n_workers=n, batch_size=batch,
                     lr=cfg.lr, steps=cfg.epochs * problem.epoch_steps(n, batch), monitor_every=60.0)
    # entry updates: every step's batch on each worker (the last may run into the next pass); the split's workers
    # share each entry, updated once per epoch
    updates = cfg.epochs * cooc.nnz if mode == "model" else n * res.trace.meta["steps"] * batch
    return updates / res.seconds, updates / res.measured["cpu_seconds"], problem.epoch_costs(res)


def fmt(x: float, unit: str = "") -> str:
    """A number with 3 significant figures in M (millions) or as is."""
    return f"{x / 1e6:.2f} M{unit}" if x >= 1e5 else f"{x:.3g}{unit}"


def main(argv: list[str] | None = None) -> None:
    """Measure and print the comparison table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="?", help="plain or gzipped text file, one document per line")
    parser.add_argument("--text8", help="a text8-format file")
    parser.add_argument("--quick", action="store_true", help="2 epochs, d = 25")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--dim", type=int, default=None)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--min-count", type=int, default=5)
    parser.add_argument("--modes", default="hogwild,model,bsp", help="training modes to time with 2 workers")
    parser.add_argument("--count-repeats", type=int, default=1,
                        help="time the counting (ours and C's) this many times and keep the best")
    args = parser.parse_args(argv)
    epochs = args.epochs or (2 if args.quick else 5)
    dim = args.dim or (25 if args.quick else 50)
    cfg = GloveConfig(dim=dim, epochs=epochs)

    name, docs = load_docs(args)
    corpus = "KJV" if name.startswith("KJV") else name  # as the records name it
    vocab = Vocabulary.build(docs, min_count=args.min_count)
    ids, offsets = vocab.encode_docs(docs)
    print(f"corpus: {name}: {len(docs):,} documents, {len(ids):,} tokens in vocabulary, "
          f"vocabulary {len(vocab):,} (min_count {args.min_count}); window {args.window}, d = {dim}, {epochs} epochs")

    count_cooccurrences(ids[: offsets[min(3, len(docs))]], offsets[: min(3, len(docs)) + 1], len(vocab), args.window)
    count1 = count2 = 0.0
    for _ in range(args.count_repeats):  # best of n, each end to end (count_parallel: its processes' start included)
        t = time.perf_counter()
        cooc = count_cooccurrences(ids, offsets, len(vocab), args.window)
        count1 = max(count1, len(ids) / (time.perf_counter() - t))
        t = time.perf_counter()
        count_parallel(ids, offsets, len(vocab), args.window, n_workers=2)
        count2 = max(count2, len(ids) / (time.perf_counter() - t))

    runs = {("hogwild", n): train(cooc, cfg, "hogwild", n) for n in (1, 2)}
    for mode in [m for m in args.modes.split(",") if m and m != "hogwild"]:
        runs[(mode, 2)] = train(cooc, cfg, mode, 2)

    ref_dir = os.environ.get("GLOVE_REF_DIR")
    ref = None
    if ref_dir:
        with tempfile.TemporaryDirectory() as work:
            ref = run_reference(Path(ref_dir), docs, vocab, cfg, args.window, [1, 2], Path(work), args.count_repeats)

    print(f"\nco-occurrence counting (nonzero entries: simlib {cooc.nnz:,}"
          + (f", C {ref['nnz']:,})" if ref else ")"))
    print(f"{'implementation':<34}{'tokens/s':>14}{'vs C cooccur':>16}")
    c_count = ref["count_tokens_per_s"] if ref else None
    for label, speed in [("simlib, 1 process", count1), ("simlib, 2 processes (map-reduce)", count2)]:
        ratio = f"{speed / c_count:.2f}x" if c_count else "-"
        print(f"{label:<34}{fmt(speed):>14}{ratio:>16}")
        if c_count:
            record(__file__, f"co-occurrence counting, {label.removeprefix('simlib, ')}, {corpus}",
                   "stanfordnlp/GloVe cooccur (C)", speed / c_count, "tokens/s")
    print(f"{'stanfordnlp/GloVe cooccur':<34}{(fmt(c_count) if c_count else NOT_MEASURED):>14}")

    print("\ntraining (AdaGrad; cost = mean 0.5 f diff^2 of each pass, as the C program prints it; every mode "
          "through simlib.run on shared memory)")
    # per CPU-s: updates per second of CPU time the workers got; on a busy machine (other processes taking the
    # cores) it stays near what a quiet one gives, where updates/s does not
    print(f"{'implementation':<34}{'updates/s':>12}{'vs C, 1 thread':>16}{'per CPU-s':>12}   cost per epoch")
    c1 = ref[1]["updates_per_s"] if ref else None
    for (mode, n), (speed, per_cpu, per_epoch) in runs.items():
        ratio = f"{speed / c1:.2f}x" if c1 else "-"
        costs = " ".join(f"{c:.5f}" for c in per_epoch)
        if c1:
            record(__file__, f"GloVe {MODE_NAMES.get(mode, mode)}, {n} process{'es' if n > 1 else ''}, {corpus}",
                   "stanfordnlp/GloVe (C), 1 thread", speed / c1, "updates/s", headline=(mode, n) == ("hogwild", 2))
        print(f"{f'simlib {mode}, {n} process' + ('es' if n > 1 else ''):<34}{fmt(speed):>12}{ratio:>16}"
              f"{fmt(per_cpu):>12}   {costs}")
    for n in (1, 2):
        label = f"stanfordnlp/GloVe, {n} thread" + ("s" if n > 1 else "")
        if ref:
            ratio = f"{ref[n]['updates_per_s'] / c1:.2f}x"
            costs = " ".join(f"{c:.5f}" for c in ref[n]["costs"])
            print(f"{label:<34}{fmt(ref[n]['updates_per_s']):>12}{ratio:>16}{'-':>12}   {costs}")
        else:
            print(f"{label:<34}{NOT_MEASURED:>12}")
    print("\nload average at the end (1, 5, 15 min): " + " ".join(f"{x:.2f}" for x in os.getloadavg())
          + f" on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()

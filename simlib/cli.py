"""Command line: ``simlib compare`` (the main job), ``simlib run`` and ``simlib live``.

``simlib`` is the installed console script; ``python -m simlib`` is the same program. Every value is
checked before any work starts (ranges from the config dataclasses' field metadata, sizes against
the problem and this machine's memory, the figure's path): a bad one prints one line naming the
flag and exits with status 2, without a traceback and without writing anything. Ctrl-C prints one
line and exits with status 130. NumPy, SimPy and matplotlib are imported only once the arguments
are known to be good, so ``--help`` and errors answer at once.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from simlib import options as opts
from simlib._validate import available_memory, gb as _gb
from simlib.app import serve
from simlib.protocol import Protocol
from simlib.signals import ctrl_c_unwrapped
from simlib.sim.config import COST_ONLY_TRACE_BYTES_PER_STEP, TRACE_BYTES_PER_STEP, SimConfig, Stragglers
from simlib.course.experiments import (COMPARE_FEATURES, COMPARE_NNZ, COMPARE_ROWS, DEFAULT_PROTOCOLS, DEFAULT_TARGET,
                                    default_cluster)

FIGURE_TYPES = (".png", ".svg", ".pdf")
# compare's fix for more workers than its data set has rows: the cost model alone, no data read
COST_ONLY_FLAGS = "--cost-only --step-keys 500"
# A mini-batch's arrays per row and per nonzero (row ids, offsets, gathered indices/values, keys).
BATCH_BYTES_PER_ROW, BATCH_BYTES_PER_NNZ = 64, 32
# Building a synthetic data set: about 50 bytes per nonzero at its peak (draws, ids, values).
DATA_BYTES_PER_NNZ = 64
PROCESS_BYTES = 150e6  # one worker process of a real substrate (interpreter, NumPy, its shard)
TRAINING_FIELDS = ("n_workers", "steps", "batch_size", "lr", "staleness_aware", "accumulation", "seed")


class CliError(Exception):
    """A bad command line: the message is the whole one-line answer."""


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage block) raised as CliError."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        hint = f" ({self.prog} --help lists them)" if "arguments" in message else ""
        raise CliError(f"{self.prog}: error: {message}{hint}")


# -- what the flags come from --------------------------------------------------------------------


def _size_field(default: int, help: str, hi: int) -> Any:
    return field(default=default, metadata={"help": help, "min": 1, "max": hi})


@dataclass(frozen=True)
class ProblemSize:
    """The synthetic sparse logistic-regression problem of ``simlib run``."""

    rows: int = _size_field(COMPARE_ROWS, "rows of the synthetic data set", 10_000_000)
    features: int = _size_field(COMPARE_FEATURES, "features (parameters) of the model", 10_000_000)
    nnz: int = _size_field(COMPARE_NNZ, "nonzeros per row", 10_000)


def _refusal(exc: ValueError, default_flag: str) -> str:
    """'--flag: message' for a configuration error (the flag of the field it names first, else ``default_flag``)."""
    msg = " ".join(str(exc).split())
    name = msg.split(" ", 1)[0].rstrip(":,")
    flag = next((o.flag for o in opts.options(SimConfig) + opts.options(ProblemSize) if o.name == name), None)
    return f"{flag or default_flag}: {msg}"


# -- checks made before any work ------------------------------------------------------------------


@dataclass(frozen=True)
class Footprint:
    """What one command keeps in memory beside its data: runs of traces, worker processes, and the fixes it offers."""

    runs: int = 1
    processes: int = 0
    trace_bytes: int = TRACE_BYTES_PER_STEP  # per worker-step
    more_workers: str = "raise --rows"  # how to get more workers than rows
    more_steps: str = "fewer --workers"  # how to keep more steps


def check_sizes(size: ProblemSize, n_workers: int, steps: int, batch_size: int, footprint: Footprint = Footprint(),
                budget: float | None = None) -> None:
    """Raise CliError naming the flag if the run cannot hold its data, batches and traces in half the free memory."""
    budget = available_memory() / 2 if budget is None else budget
    rows, nnz, runs, processes = size.rows, size.nnz, footprint.runs, footprint.processes
    if n_workers > rows:
        raise CliError(f"--workers: {n_workers} workers need at least one row each; the problem has {rows} rows; "
                       f"use at most {rows} workers, or {footprint.more_workers}")
    shard = rows // n_workers
    if batch_size > shard:
        raise CliError(f"--batch-size: a batch of {batch_size} rows is larger than a worker's shard ({shard} rows of "
                       f"{rows}, over {n_workers} workers) and would repeat rows; use at most {shard}")
    # (flag, its value, bytes per unit of it, what they hold, the fix after 'use at most N')
    for flag, n, per_unit, what, fix in (
            ("--batch-size", batch_size, BATCH_BYTES_PER_ROW + BATCH_BYTES_PER_NNZ * nnz,
             f"a batch of {batch_size} rows needs", ""),
            ("--steps", steps, runs * n_workers * footprint.trace_bytes,
             f"{runs} run(s) of {n_workers} workers x {steps} steps keep a trace of",
             f" steps, or {footprint.more_steps}"),
            ("--workers", processes, PROCESS_BYTES, f"{processes} processes need", "")):
        if n * per_unit > budget:
            raise CliError(f"{flag}: {what} about {_gb(n * per_unit)}, more than half the memory available "
                           f"({_gb(2 * budget)}); use at most {int(budget // per_unit)}{fix}")


def check_output(path: str) -> None:
    """Raise CliError naming --out unless ``path`` is a figure file this process can create (nothing is left behind)."""
    if not path.strip():
        raise CliError(f"--out: give a file name ending in {', '.join(FIGURE_TYPES)}, e.g. simlib_out/compare.png")
    if os.path.splitext(path)[1].lower() not in FIGURE_TYPES:
        raise CliError(f"--out: the figure must be {', '.join(t[1:].upper() for t in FIGURE_TYPES)} "
                       f"(a name ending in {', '.join(FIGURE_TYPES)}), got {path!r}")
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise CliError(f"--out: {path!r} is a directory; give a file name such as {os.path.join(path, 'compare.png')}")
    if os.path.exists(full) and not os.access(full, os.W_OK):
        raise CliError(f"--out: {path!r} exists and is not writable")
    ancestor = parent = os.path.dirname(full)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise CliError(f"--out: {ancestor} is not a directory, so {path!r} cannot be created")
    if ancestor not in (parent, os.path.dirname(parent)):  # one new folder (simlib_out/), like mkdir, never a tree
        missing = os.path.join(ancestor, os.path.relpath(parent, ancestor).split(os.sep)[0])
        raise CliError(f"--out: the folder {missing} does not exist (only the figure's own folder is made); "
                       f"create it first, or write to a folder that exists")
    try:  # a real probe: permissions alone say nothing for root or for /proc
        if ancestor == parent:
            with tempfile.TemporaryFile(dir=parent):
                pass
        else:
            os.rmdir(tempfile.mkdtemp(dir=ancestor))
    except OSError as exc:
        raise CliError(f"--out: cannot write {path!r} ({exc.strerror or exc} in {ancestor})") from None


def _protocol(text: str) -> Protocol:
    try:
        return Protocol.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("protocol: ")) from None


def _protocol_list(text: str) -> list[Protocol]:
    """--protocols: 'bsp,ssp:3,async' -> Protocols (each read by Protocol.parse)."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("name at least one run, e.g. 'bsp,ssp:3,async'")
    return [_protocol(p) for p in parts]


# -- compare ----------------------------------------------------------------------------------------


def _compare_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--protocols", type=_protocol_list, default=",".join(DEFAULT_PROTOCOLS),
                   help="comma-separated runs: bsp, ssp:S (staleness bound S), essp:S (eager SSP), async")
    target = opts.Option("target", "--target", float, DEFAULT_TARGET, "", min=0, min_open=True)  # a log-loss: > 0
    # SUPPRESS: no attribute unless the flag is given (a cost-only run refuses a target, not the default)
    p.add_argument("--target", type=opts.argparse_type(target), default=argparse.SUPPRESS,
                   help=f"target loss for 'time to target' (default: {DEFAULT_TARGET:g}; none with --cost-only)")
    p.add_argument("--out", default=os.path.join("simlib_out", "compare.png"),
                   help="figure path (" + ", ".join(t[1:].upper() for t in FIGURE_TYPES) + ")")
    p.add_argument("--no-plot", action="store_true", help="skip the figure")
    flagged = [o for o in opts.options(SimConfig) if o.flag]  # SimConfig's flags: the cluster's, the stragglers'
    base = default_cluster()
    opts.add_arguments(p.add_argument_group("cluster"), [o for o in flagged if "." not in o.name], base)
    opts.add_arguments(p.add_argument_group("stragglers"), [o for o in flagged if o.name.startswith("stragglers.")],
                       base)


def compare_configs(args: argparse.Namespace) -> list[SimConfig]:
    """One validated config per protocol, from the parsed flags; a refusal says which protocols would work."""
    values = opts.values(args, opts.options(SimConfig))  # the flags compare did not add are skipped
    try:
        values["stragglers"] = Stragglers(**values.pop("stragglers"))
    except ValueError as exc:
        raise CliError(_refusal(exc, "--protocols")) from None
    made, refused = [], None  # (spec, config) of each protocol the flags allow
    for p in args.protocols:
        try:
            made.append((p.spec, SimConfig(**values, protocol=p.spec)))  # the spec: the read rule, the flags the rest
        except ValueError as exc:
            refused = refused or exc
    if refused is not None:
        fix = f"; use --protocols {','.join(spec for spec, _ in made)}" if made else ""
        raise CliError(_refusal(refused, "--protocols") + fix)
    return [config for _, config in made]


def validate_compare(args: argparse.Namespace) -> list[SimConfig]:
    """Every check of ``compare`` that can fail, before any work: configs, sizes, the figure's path."""
    configs = compare_configs(args)
    cfg = configs[0]
    for flag, n, what in (("--servers", cfg.n_servers, "nodes"), ("--summation-nodes", cfg.n_summation, "nodes"),
                          ("--step-keys", cfg.step_keys or 0, "keys per step")):
        if n > COMPARE_FEATURES:
            raise CliError(f"{flag}: {n} {what}, but the model has {COMPARE_FEATURES} parameters; "
                           f"use at most {COMPARE_FEATURES}")
    if cfg.cost_only and hasattr(args, "target"):
        raise CliError("--target: a cost-only run (--cost-only) computes no loss, so it has no target; drop --target "
                       "or --cost-only")
    # A fixed cost-only step reads no data: the rows need not cover the workers (a trace is all it keeps).
    rows = max(COMPARE_ROWS, cfg.n_workers * cfg.batch_size) if cfg.step_keys is not None else COMPARE_ROWS
    cost_only = cfg.cost_only and cfg.step_keys is not None
    more = "fewer --workers" if cost_only else f"fewer --workers, or {COST_ONLY_FLAGS} (columns of spans, no math)"
    footprint = Footprint(runs=len(configs), more_steps=more, more_workers=f"{COST_ONLY_FLAGS} (the cost model alone, "
                          "no data read)", trace_bytes=COST_ONLY_TRACE_BYTES_PER_STEP if cost_only else
                          TRACE_BYTES_PER_STEP)
    check_sizes(ProblemSize(rows=rows), cfg.n_workers, cfg.steps, cfg.batch_size, footprint)
    if not args.no_plot:
        check_output(args.out)
    return configs


class _Progress:
    """Progress over the runs on stderr: a tqdm bar once a job has taken two seconds, on a terminal only.

    A thread redraws the bar every second, so its clock moves during a run that reports nothing as it goes
    (a cost-only run of 100,000 workers is a minute in compiled code).
    """

    def __init__(self, labels: Sequence[str], file: Any = None, disable: bool | None = None, tick: float = 1.0):
        from tqdm import tqdm

        self.labels = list(labels)
        # disable=None: tqdm stays silent when the stream is not a terminal (a log, a pipe, a test)
        self.bar = tqdm(total=len(self.labels), desc=self.labels[0], unit="run", delay=2.0, disable=disable, leave=False,
                        file=sys.stderr if file is None else file, bar_format="{l_bar}{bar}| {n:.2f}/{total} runs "
                        "[{elapsed}<{remaining}]")
        self._stop = threading.Event()
        self._ticker = None if self.bar.disable else threading.Thread(target=self._tick, args=(tick,), daemon=True)
        if self._ticker is not None:
            self._ticker.start()

    def _tick(self, every: float) -> None:
        while not self._stop.wait(every):
            if time.time() - self.bar.start_t >= self.bar.delay:
                self.bar.refresh()

    def __call__(self, run: int, fraction: float) -> None:
        check_interrupt()
        self.bar.set_description(self.labels[run], refresh=False)
        self.bar.update(run + fraction - self.bar.n)

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        self.bar.close()


_SCALES = {"ms": 1e3, "s": 1.0, "MB": 1e-6}  # a table unit -> the factor its values are shown with


def _fmt(v: Any, unit: str = "") -> str:
    if isinstance(v, str):  # already a word ('no math')
        return v
    if v is None or (isinstance(v, float) and math.isnan(v) and unit != "loss"):
        return "never"
    if unit == "loss":
        return f"{v:.4g}" if math.isfinite(v) else "diverged"
    if unit in _SCALES:  # two decimals for everyday magnitudes, three significant digits beyond them
        x = v * _SCALES[unit]
        return f"{x:.2f}" if x == 0 or 0.01 <= abs(x) < 1e6 else f"{x:.3g}"
    if unit == "%":
        return f"{100 * v:.0f}%"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _table(cols: Sequence[tuple[str, str, str]], rows: list[dict[str, Any]]) -> str:
    cells = [[h for h, _, _ in cols]] + [[_fmt(r[k], u) for _, k, u in cols] for r in rows]
    widths = [max(len(row[j]) for row in cells) for j in range(len(cols))]
    lines = ["  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_table(rows: list[dict[str, Any]], target: float) -> str:
    """The comparison as a fixed-width text table ('never': target not reached, 'diverged': loss not finite)."""
    return _table([
        ("run", "run", ""), (f"time to {target:g} (ms)", "time_to_target", "ms"),
        ("rounds to target", "rounds_to_target", ""), ("time/step (ms)", "time_per_step", "ms"),
        ("waiting", "wait_fraction", "%"), ("MB moved", "bytes_moved", "MB"),
        ("mean stale", "mean_staleness", ""), ("final loss", "final_loss", "loss"),
    ], rows)


@contextlib.contextmanager
def _running(labels: Sequence[str]) -> Iterator[_Progress]:
    """The runs' progress bar, cleared however they end (Ctrl-C included) before any line is printed; overflow in
    a diverging run is reported as 'diverged' in the table, not as NumPy warnings."""
    import numpy as np

    progress = _Progress(labels)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            yield progress
    finally:
        progress.close()


def run_compare(args: argparse.Namespace) -> int:
    """The main job: check everything, simulate each protocol, print the table, write the figure."""
    configs = validate_compare(args)
    from simlib.course.experiments import compare, compare_problem, summary_rows

    compare_problem(configs[0].seed)  # built (and its kernels compiled) here, so Ctrl-C is checked after it
    check_interrupt()

    with _running([c.label for c in configs]) as progress:
        traces = compare([p.spec for p in args.protocols], configs[0], progress=progress)
    base = configs[0]
    print(f"{base.n_workers} workers x {base.steps} steps, stragglers: {base.stragglers.describe()}, "
          f"latency {base.latency * 1e3:.4g} ms, bandwidth {base.bandwidth / 1e6:.4g} MB/s (simulated time)")
    target = getattr(args, "target", DEFAULT_TARGET)
    rows = summary_rows(traces, target)
    if base.cost_only:  # no math ran: no loss, no time to a target
        for row in rows:
            row.update(time_to_target="-", rounds_to_target="-", final_loss="no math")
    print(format_table(rows, target))
    for t in traces:
        if t.meta.get("stall_reason"):
            print(f"{t.label} stalled: {t.meta['stall_reason']}")
    if not args.no_plot:
        from simlib.viz import compare_figure, save_figure

        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        save_figure(compare_figure(traces, target=target), args.out)
        print(f"figure written to {args.out}")
    return 0


# -- run ----------------------------------------------------------------------------------------------


def _run_flags(p: argparse.ArgumentParser) -> None:
    from simlib import substrates

    p.add_argument("--problem", choices=("logistic",), default="logistic", help="the problem to train")
    p.add_argument("--protocol", type=_protocol, default="ssp:3",
                   help="bsp, ssp:S, essp:S (eager SSP), async or allreduce, on every substrate")
    p.add_argument("--substrate", choices=substrates.names(), default="sim", help="where the run happens")
    opts.add_arguments(p.add_argument_group("problem size"), opts.options(ProblemSize))
    training = [o for o in opts.options(SimConfig) if o.name in TRAINING_FIELDS]
    opts.add_arguments(p.add_argument_group("training"), training, default_cluster())


def validate_run(args: argparse.Namespace) -> tuple[ProblemSize, dict[str, Any]]:
    """Every check of ``run`` before any work: sizes against the problem and memory, the substrate loads."""
    size = ProblemSize(**opts.values(args, opts.options(ProblemSize)))
    training = opts.values(args, [o for o in opts.options(SimConfig) if o.name in TRAINING_FIELDS])
    if size.nnz > size.features:
        raise CliError(f"--nnz: {size.nnz} nonzeros per row need at least as many --features (got {size.features})")
    data = size.rows * size.nnz * DATA_BYTES_PER_NNZ
    budget = available_memory() / 2
    if data > budget:
        raise CliError(f"--rows: {size.rows} x {size.nnz} nonzeros need about {_gb(data)} to build, more than half "
                       f"the memory available ({_gb(2 * budget)})")
    from simlib import substrates

    try:
        SimConfig(protocol=args.protocol, **training)  # the training fields' ranges, from their metadata
    except ValueError as exc:
        raise CliError(_refusal(exc, "--protocol")) from None
    processes = 0 if args.substrate == "sim" else training["n_workers"] + 1
    check_sizes(size, training["n_workers"], training["steps"], training["batch_size"],
                Footprint(processes=processes), budget=budget - data)
    try:
        substrates.get(args.substrate)
    except Exception as exc:  # a substrate that cannot load is a one-line answer, whatever the cause
        raise CliError(f"--substrate: {args.substrate!r} could not be loaded ({type(exc).__name__}: "
                       f"{' '.join(str(exc).split())}); available: {', '.join(substrates.names())}") from None
    return size, training


def run_one(args: argparse.Namespace) -> int:
    """``simlib run``: one problem, one protocol, one substrate; the summary as a table."""
    if args.substrate == "ray":
        # Ray turns token authentication on by default and warns that it did unless the mode is chosen;
        # choosing the same mode explicitly keeps the protection and drops the warning. Set before Ray or
        # any process that starts it is loaded, so they all read it.
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    size, training = validate_run(args)
    import simlib
    from simlib.backend import gpu_available
    from simlib.problems.logistic import LogisticProblem, make_sparse_classification

    if args.substrate == "gpu" and not gpu_available():
        print(f"{_prog()} run: no CUDA device (or no CuPy) here, so the 'gpu' substrate runs its NumPy twin on the "
              "CPU: the same array code, not GPU timings", file=sys.stderr, flush=True)

    seed = training["seed"]
    data = make_sparse_classification(size.rows, size.features, size.nnz, label_noise=0.05, seed=seed)
    problem = LogisticProblem(data, l2=1e-4, eval_rows=min(4_000, size.rows), seed=seed)
    check_interrupt()
    # the bar's clock runs while the substrate starts (Ray's cluster, worker processes, the first compile)
    try:
        with _running([f"{args.protocol.label} on {args.substrate!r}"]):
            result = simlib.run(problem, args.protocol, substrate=args.substrate, **training)
    except ValueError as exc:
        raise CliError(_refusal(exc, "--substrate")) from None
    t = result.trace
    s = t.summary()
    kind = "simulated time" if args.substrate == "sim" else "wall-clock time"
    where = repr(args.substrate)
    if args.substrate == "gpu" and t.meta.get("xp") == "cupy":
        where += " with CuPy"
    elif args.substrate == "gpu":
        where, kind = "the NumPy twin of 'gpu'", f"no CUDA device; {kind}"
    print(f"{args.problem}: {size.rows} rows x {size.features} features, {size.nnz} nonzeros per row; "
          f"{t.n_workers} workers x {training['steps']} steps on {where} ({kind})")
    row = {"run": args.protocol.label, "time": t.makespan, "updates": int(s["updates_applied"]),
           "dropped": int(s["updates_dropped"]), "bytes": s["bytes_sent"] + s["bytes_received"],
           "tau": s["mean_staleness"], "final": s["final_" + t.metric]}
    print(_table([("run", "run", ""), ("time (s)", "time", "s"), ("updates", "updates", ""),
                  ("dropped", "dropped", ""), ("MB moved", "bytes", "MB"), ("mean tau", "tau", ""),
                  (f"final {t.metric}", "final", "loss" if t.metric == "loss" else "")], [row]))
    # What the table cannot say by itself: what an update is, and why protocols look alike.
    unit = t.meta.get("update_unit", "one worker's step (its push)")
    print(f"updates: pushes applied to the table; one update here is {unit}")
    if args.substrate == "sim":
        print("the simulated cluster of 'simlib run' has equal workers and no stragglers, so no worker waits "
              "and bsp, ssp and async take the same time; 'simlib compare' simulates stragglers")
    return 0


# -- the top level ------------------------------------------------------------------------------------


# Each command: its one-line help (in the top-level listing and atop its own --help), its --help description,
# flags and job.
_COMMANDS = {
    "compare": ("simulate BSP, SSP and async on one cluster; print a table and write a figure",
                "Simulate the same training job under several protocols on one cluster (same seed, so the same "
                "straggler draws), print time to a target loss, time per step, waiting and bytes, and write the "
                "timelines and loss curves to a figure.", _compare_flags, run_compare),
    "run": ("train one problem under one protocol on one substrate; print its summary",
            "Train a problem with simlib.run on a substrate (the simulator or real processes) and print time, "
            "updates, bytes, mean staleness tau and the final metric.", _run_flags, run_one),
    "live": ("serve the live lecture panel (sliders, timelines, play mode) on 127.0.0.1", serve.__doc__.splitlines()[0],
             serve.add_arguments, serve.run),
}


def _prog() -> str:
    """'simlib' for the console script, 'python -m simlib' for the module (argv[0] says which)."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "simlib"
    return "python -m simlib" if name in ("__main__.py", "-c", "-m", "") else name


def _dispatch(argv: list[str], prog: str) -> int:
    command = argv[0] if argv else None
    top = _Parser(prog=prog, description="simlib: distributed ML you can run and measure", allow_abbrev=False)
    sub = top.add_subparsers(dest="command", required=True, metavar="{compare,run,live}")
    if command not in _COMMANDS:  # --help, or a one-line error for a missing or unknown command
        for name, (text, *_) in _COMMANDS.items():
            sub.add_parser(name, help=text, add_help=False)
        top.parse_args(argv)
        return 2
    text, description, add_flags, job = _COMMANDS[command]
    # allow_abbrev=False: a flag is spelt in full ('--worker 4' is a typo, not '--workers 4')
    parser = sub.add_parser(command, help=text, description=description, allow_abbrev=False,
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_flags(parser)
    args = parser.parse_args(argv[1:])
    try:
        return job(args)
    except (CliError, ValueError) as exc:  # a check before any work, or one that only the run itself could make
        raise CliError(f"{parser.prog}: error: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``simlib`` and ``python -m simlib``: returns the exit status (0, 2 bad input, 130 Ctrl-C)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        with _ctrl_c():
            return _dispatch(argv, _prog())
    except CliError as exc:  # the message names the command: 'simlib compare: error: --workers: ...'
        print(" ".join(str(exc).split()), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return interrupted()


_pressed = False


@contextlib.contextmanager
def _ctrl_c() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt and is remembered, so :func:`check_interrupt` finds it if a library swallowed it."""
    global _pressed
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        global _pressed
        _pressed = True
        raise KeyboardInterrupt

    def quiet(unraisable: Any) -> None:
        # A Ctrl-C that lands in a callback Python cannot raise from (numba's compiler calls back through
        # ctypes; fork hooks) is printed as "Exception ignored ... Traceback" and dropped. It is
        # remembered here, and check_interrupt raises it where it can be raised: nothing to print.
        if not (_pressed and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            hook(unraisable)

    _pressed = False
    previous, hook = signal.signal(signal.SIGINT, handler), sys.unraisablehook
    sys.unraisablehook = quiet
    try:
        with ctrl_c_unwrapped():
            yield
    finally:
        if signal.getsignal(signal.SIGINT) is handler:
            signal.signal(signal.SIGINT, previous)
        if sys.unraisablehook is quiet:
            sys.unraisablehook = hook


def check_interrupt() -> None:
    """Raise KeyboardInterrupt if Ctrl-C was pressed (some imports catch it and carry on)."""
    if _pressed:
        raise KeyboardInterrupt


def interrupted() -> int:
    """Ctrl-C: one line, status 130 (a second Ctrl-C while leaving is ignored, and so is what follows it).

    An object half built when the Ctrl-C landed (llvmlite's, while numba compiles) can fail in its
    finaliser as the process leaves, printing "Exception ignored ... Traceback" after the one line;
    the process is leaving because of that Ctrl-C, so such reports are dropped from here on.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print("interrupted", file=sys.stderr, flush=True)
    sys.unraisablehook = _leaving
    return 130


def _leaving(unraisable: Any) -> None:
    """The unraisable-exception hook once the process is leaving after a Ctrl-C: nothing more to say."""

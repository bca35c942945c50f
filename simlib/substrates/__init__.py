"""Substrates found by name, and the one entry point :func:`run`.

One module per substrate: :mod:`~simlib.substrates.sim` (the discrete-event cluster of
:mod:`simlib.sim`), :mod:`~simlib.substrates.pipes` and :mod:`~simlib.substrates.shm` (real processes
on the infrastructure of :mod:`simlib.parallel`), :mod:`~simlib.substrates.gpu` (one device array,
CuPy or its NumPy twin) and :mod:`~simlib.substrates.ray` (actors). Each problem's math and
compiled kernels live beside it under :mod:`simlib.problems`.

A substrate is a module with a top-level ``run(problem, protocol, training, **options) -> Result``
(its options as keyword parameters, or as the fields of the dataclass ``run.options``).
The built-in ones are imported on first use, so ``import simlib`` stays light; :func:`register`
adds another (a test's serial loop, or a new engine) without touching this file.

Example::

    >>> from simlib.problems.logistic import LogisticProblem, make_sparse_classification
    >>> prob = LogisticProblem(make_sparse_classification(1_000, 100, 5, seed=0), eval_rows=None)
    >>> res = run(prob, "ssp:1", substrate="sim", n_workers=2, steps=10)
    >>> res.trace.substrate, len(res.trace.updates)
    ('sim', 20)
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import fields, is_dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from simlib import _validate as check
from simlib.protocol import MAX_REAL_WORKERS, MAX_WORKERS, Protocol, StepRule, read_allowed
from simlib.signals import ctrl_c_unwrapped

if TYPE_CHECKING:
    from simlib.contract import Result

# NOTE: the contract (and NumPy with it) is imported in run(), not here, so that listing the
# substrates (the CLI's `run --help`) stays under half a second.
Runner = Callable[..., "Result"]

BUILTIN = {
    "sim": "simlib.substrates.sim",
    "shm": "simlib.substrates.shm",
    "pipes": "simlib.substrates.pipes",
    "gpu": "simlib.substrates.gpu",
    "ray": "simlib.substrates.ray",
}
_registered: dict[str, Runner] = {}
# The features of the worker program and the server, and where they cannot mean anything (run refuses them there,
# naming the feature and the reason): every other (feature, substrate) pair runs. tests/test_worker.py checks every
# cell of sim, pipes, shm and gpu.
FEATURES = ("backup_workers", "timeout", "compression", "clock_batches", "essp", "accumulation", "staleness_aware",
            "read_rule", "allreduce")
REFUSED = {
    ("backup_workers", "gpu"): "lock-step device rounds leave no straggler behind",
    ("timeout", "pipes"): "per-step deadlines need the server's timers: simulated only",
    ("timeout", "shm"): "per-step deadlines need the server's timers: simulated only",
    ("timeout", "gpu"): "lock-step device rounds leave no straggler behind",
    ("clock_batches", "gpu"): "a round is one mini-batch of every worker",
    ("accumulation", "shm"): "averaging pushes needs a server; the shared table adds each push as it lands",
}
# What cannot mean anything under protocol 'allreduce' (every worker's gradient summed into every replica each
# step, no server), on every substrate; the last column of the feature table.
WITH_ALLREDUCE = {
    "backup_workers": "every replica must add the same sum: none can be dropped",
    "timeout": "every replica must add the same sum: none can be dropped",
    "compression": "modelled by the simulator without buckets; the real all-reduces sum dense float64 buckets",
    "clock_batches": "a step is one mini-batch per worker, all-reduced at once",
    "essp": "a protocol of its own: all-reduce has no cache to push to",
    "accumulation": "no server to average pushes: each step's sum lands whole",
    "staleness_aware": "tau is 0 for every step: nothing to scale",
    "read_rule": "no reads to gate: every replica holds every step before the next",
}
_RULE = {f.name for f in fields(StepRule)}


def register(name: str, runner: Runner) -> None:
    """Make ``runner`` available as ``run(..., substrate=name)``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"substrate name must be a non-empty string, got {name!r}")
    _registered[name] = runner


def unregister(name: str) -> None:
    """Forget a substrate added with :func:`register`."""
    _registered.pop(name, None)


def feature_table() -> list[list[str]]:
    """Rows of feature x substrate: 'runs', or the reason it is refused there; the last column, under 'allreduce'."""
    subs = sorted(BUILTIN)
    return [["feature", *subs, "with allreduce"]] + [
        [f, *(REFUSED.get((f, s), "runs") for s in subs), WITH_ALLREDUCE.get(f, "runs")] for f in FEATURES]


def names() -> list[str]:
    """Every substrate name :func:`run` accepts."""
    return sorted(set(BUILTIN) | set(_registered))


def get(name: str) -> Runner:
    """The runner of substrate ``name``; ValueError naming 'substrate' if unknown."""
    if name in _registered:
        return _registered[name]
    if name not in BUILTIN:
        raise ValueError(f"substrate must be one of {', '.join(repr(n) for n in names())}; got {name!r}")
    return importlib.import_module(BUILTIN[name]).run


def run(problem: Any, protocol: Protocol | str = "bsp", substrate: str = "sim", **options: Any) -> "Result":
    """Train ``problem`` under ``protocol`` on ``substrate``; every substrate returns the same Result.

    Options shared by all substrates: ``n_workers``, ``steps`` (per worker; default 50, or the problem's own
    ``epochs`` passes where it has them, as GloVe's ``GloveConfig(epochs=...)``), ``batch_size``, ``lr`` (default
    0.5, or the problem's own ``lr`` where it has one, as GloVe's ``GloveConfig(lr=...)``: an ``lr=`` that
    differs from the problem's own is refused, naming both), ``eval_every``, ``seed``, ``staleness_aware``,
    ``accumulation`` (or ``rule``: a StepRule, or a subclass with its own ``scale(tau)``), ``read_rule``
    (replacing the SSP read rule); the rest go to the substrate (e.g. the simulator's network, stragglers
    and ``compression``, the real substrates' ``start_method``).
    """
    from simlib.contract import Training, capabilities, check_problem

    check_problem(problem)  # the optional hooks too, once (simlib.contract.capabilities)
    caps = capabilities(problem)
    _own_lr(problem, caps.lr, options)
    proto = Protocol.parse(protocol)
    runner = get(substrate)
    proto = _with_protocol_options(proto, options, runner)
    given = {k: options.pop(k) for k in list(options) if k in _RULE}
    rule = options.pop("rule", None)
    if rule is not None and given:
        raise ValueError(f"{sorted(given)[0]}: give it to the StepRule passed as rule=, not beside it")
    shared = {f.name for f in fields(Training)} - {"rule"}
    # Training refuses a rule that is not a StepRule (or a subclass's instance)
    settings = {k: options.pop(k) for k in list(options) if k in shared}
    training = Training(rule=StepRule(**given) if rule is None else rule, **settings)
    if caps.epochs is not None and "steps" not in settings:  # the problem's own run length (GloveConfig(epochs=...))
        training = replace(training, steps=caps.epochs * problem.epoch_steps(training.n_workers, training.batch_size))
    rule = training.rule
    if caps.exact_deltas:
        _refuse_lossy(problem, proto, options.get("compression"), rule)
    if rule.staleness_aware and not caps.linear_step:
        raise ValueError(f"staleness_aware: {type(problem).__name__}'s updates are not gradient steps, "
                         "so they cannot be scaled by 1/tau")
    _check_workers(substrate, proto, training.n_workers)
    _refuse(substrate, proto, training, options)
    # check_run: protocols and substrates the problem cannot run on; check_training: settings its math cannot run
    if caps.check_run is not None:
        caps.check_run(proto, substrate)
    if caps.check_training is not None:
        caps.check_training(training)
    _check_allreduce(problem, proto, training, substrate, options, caps)
    if training.read_rule is not None:  # a rule that stalls the very first read is named before anything starts
        read_allowed(training.read_rule, 0, 0, proto.bound)
    _check_options(substrate, runner, options, sorted(shared | _RULE | {"rule"}))
    if "clock_batches" in options or "managed_bandwidth" in options:  # refused before anything starts
        from simlib.managed import check as check_managed, check_clocks

        clocks = options.get("clock_batches", 1)
        check.positive_int("clock_batches", clocks)
        check_clocks(training.steps, clocks)  # the work a run's clocks imply
        check_managed(proto, clocks, options.get("managed_bandwidth"), rule.plain)
    with ctrl_c_unwrapped():
        return runner(problem, proto, training, **options)


def _check_workers(substrate: str, proto: Protocol, n: int) -> None:
    """ValueError naming n_workers or backup_workers where the run cannot have ``n`` workers: a real substrate starts
    a process or an actor each (at most MAX_REAL_WORKERS), and shm and pipes start theirs on this machine."""
    proto.check_workers(n)
    if substrate == "sim":
        return
    if n > MAX_REAL_WORKERS:
        raise ValueError(f"n_workers must be <= {MAX_REAL_WORKERS} on substrate {substrate!r} (a process or actor per "
                         f"worker), got {n}; the simulator (substrate 'sim') takes up to {MAX_WORKERS}")
    if substrate in ("shm", "pipes"):
        from simlib.parallel.group import check_processes

        server = substrate == "pipes" and proto.kind != "allreduce"
        check_processes(n + server, f"substrate {substrate!r} (a process per worker{' and its server' * server})")


def _check_allreduce(problem: Any, proto: Protocol, training: Any, substrate: str, options: dict[str, Any],
                     caps: Any) -> None:
    """ValueError naming the setting that cannot mean anything under protocol 'allreduce' (WITH_ALLREDUCE), or the
    all-reduce's own options given to another protocol."""
    if proto.kind != "allreduce":
        # (overlap=True, the default, passes: a SimConfig's fields all travel to simlib.run)
        for name, given in (("bucket_bytes", options.get("bucket_bytes") is not None),
                            ("overlap", options.get("overlap", True) is not True)):
            if given:
                raise ValueError(f"{name} applies to protocol 'allreduce' only, not {proto.spec!r}")
        return
    rule = training.rule
    given = {"accumulation": rule.accumulation is not None or type(rule) is not StepRule,
             "staleness_aware": rule.staleness_aware, "read_rule": training.read_rule is not None,
             "clock_batches": options.get("clock_batches", 1) != 1 or options.get("managed_bandwidth") is not None,
             "compression": options.get("compression") not in (None, "none") and (
                 substrate != "sim" or options.get("bucket_bytes") is not None)}
    for name, on in given.items():
        if on:
            raise ValueError(f"{name}: not with protocol 'allreduce' ({WITH_ALLREDUCE[name]})")
    if caps.in_place_only:
        raise ValueError(f"protocol: {type(problem).__name__}'s steps exist only in place, with no gradient to "
                         "all-reduce; use a parameter-server protocol")
    if options.get("bucket_bytes") is not None and caps.backward_layers is None:
        raise ValueError(f"bucket_bytes: {type(problem).__name__} has no backward_layers (its gradient layer by layer),"
                         " so its gradient goes as one all-reduce; leave bucket_bytes out")


def _refuse(substrate: str, proto: Protocol, training: Any, options: dict[str, Any]) -> None:
    """ValueError naming a feature given that cannot mean anything on ``substrate`` (:data:`REFUSED`), and why."""
    given = {"backup_workers": proto.backup_workers, "timeout": proto.timeout is not None,
             "clock_batches": options.get("clock_batches", 1) != 1,
             "accumulation": training.rule.group_size(training.n_workers) != 1}
    for name, on in given.items():
        if on and (name, substrate) in REFUSED:
            raise ValueError(f"{name}: not on substrate {substrate!r} ({REFUSED[name, substrate]})")


def _own_lr(problem: Any, own: float | None, options: dict[str, Any]) -> None:
    """Set ``options['lr']`` to the problem's ``own`` lr where it has one; ValueError naming lr if the two differ."""
    if own is None:
        return
    given = options.setdefault("lr", own)
    if given != own:
        raise ValueError(f"lr: simlib.run was given lr={given!r}, but {type(problem).__name__} has its own lr={own!r} "
                         "(its configuration's, e.g. GloveConfig(lr=...)); leave lr= out, or make the two agree")


def _with_protocol_options(proto: Protocol, options: dict[str, Any], runner: Runner) -> Protocol:
    """``proto`` merged with the ``backup_workers`` (and, where the substrate has no ``timeout`` of its own,
    the per-step deadline ``timeout``) given beside it, popped from ``options``.

    They used to reach the simulator's SimConfig, which took the protocol's own values over them: the
    run went on without the backup workers or the deadline asked for, and said nothing. The real
    substrates' own ``timeout`` is their hang guard (seconds for the whole run), left to them.
    """
    own = {p.name for p in _own_options(runner) or ()}
    return proto.merged(**{name: options.pop(name) for name in ("backup_workers", "timeout")
                           if name in options and name not in own})


def _own_options(runner: Runner) -> list[inspect.Parameter] | None:
    """The parameters ``runner`` takes after (problem, protocol, training); None for a callable without a signature.

    A runner that takes ``**options`` and builds a dataclass of them says so as ``runner.options = TheDataclass``:
    its fields are its options.
    """
    if is_dataclass(getattr(runner, "options", None)):
        return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY) for f in fields(runner.options)]
    try:
        return list(inspect.signature(runner).parameters.values())[3:]
    except (TypeError, ValueError):
        return None


def _check_options(substrate: str, runner: Runner, options: dict[str, Any], shared: list[str]) -> None:
    """ValueError naming an option ``runner`` does not take, with the ones it does (a bare TypeError otherwise)."""
    params = _own_options(runner)
    # None: a callable without a signature answers for itself; **options: it checks its own (the simulator:
    # SimConfig's fields)
    if params is None or any(p.kind is p.VAR_KEYWORD for p in params):
        return
    own = [p.name for p in params]
    for key in options:
        if key not in own:
            hint = (check.nearest(key, own + shared) + " ").lstrip()
            raise ValueError(f"{key}: not an option of substrate {substrate!r}; {hint}its own options: "
                             f"{', '.join(own) or 'none'}; shared by every substrate: {', '.join(shared)}")


def _refuse_lossy(problem: Any, protocol: Protocol, compression: Any, rule: StepRule) -> None:
    """ValueError naming the setting that drops or bends pushes, for a problem whose deltas must all land."""
    for name, value in (("backup_workers", protocol.backup_workers), ("timeout", protocol.timeout),
                        ("compression", compression not in (None, "none") and compression),
                        ("accumulation", rule.accumulation is not None), ("rule", type(rule) is not StepRule)):
        if value:
            raise ValueError(f"{name}: {type(problem).__name__} needs every push applied whole (its counts must "
                             "match its assignments), so it runs without backup workers, deadlines, compression "
                             "or a step rule that averages or scales pushes (accumulation, rule=)")

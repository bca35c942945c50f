"""The contract, once for every substrate: Protocol, Clocks, the step rule, and one property suite.

The property suite runs on every registered substrate that can run the case, including a tiny
in-test substrate (a serial loop over ParamServer) registered here: adding a substrate is adding
one ``run`` function.
"""
import math
import multiprocessing
import re
import tokenize
from pathlib import Path

import numpy as np
import pytest

import simlib
from simlib import substrates
from simlib.contract import ParamServer, Result, Training, check_problem, key_bounds, serial_reference
from simlib.problems.logistic import LogisticProblem, make_sparse_classification
from simlib.protocol import Accumulator, Clocks, Protocol, StepRule
from simlib.trace import SPAN_KINDS, Trace

ROOT = Path(__file__).resolve().parents[1]


# -- Protocol -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, kind, bound, label", [
    ("bsp", "bsp", 0, "BSP"), ("BSP", "bsp", 0, "BSP"), ("ssp:3", "ssp", 3, "SSP(3)"),
    ("SSP(3)", "ssp", 3, "SSP(3)"), (" ssp : 0 ", "ssp", 0, "SSP(0)"), ("async", "async", math.inf, "Async"),
    ("ssp:00000001", "ssp", 1, "SSP(1)"), ("ssp:0001000000", "ssp", 1_000_000, "SSP(1000000)"),
])
def test_protocol_parses_every_spelling(spec, kind, bound, label):
    p = Protocol.parse(spec)
    assert (p.kind, p.bound, p.label) == (kind, bound, label)
    assert Protocol.parse(p.spec) == p


@pytest.mark.parametrize("spec, field", [
    ("ssp", "SSP needs a staleness bound"), ("bsp:2", "only SSP takes a bound"), ("mesh", "unknown protocol"),
    ("ssp:99999999999999999999", "staleness must be <="), ("ssp:-1", "unknown protocol"), (3, "protocol"),
    ("ssp:0001000001", "staleness must be <="),
])
def test_bad_protocols_are_refused_by_name(spec, field):
    with pytest.raises(ValueError, match=field):
        Protocol.parse(spec)


def test_protocol_refuses_contradictions():
    with pytest.raises(ValueError, match="staleness applies to protocol 'ssp' only"):
        Protocol("async", staleness=5)
    with pytest.raises(ValueError, match="clocked protocol"):
        Protocol("async", backup_workers=1)
    with pytest.raises(ValueError, match="backup_workers must be < n_workers"):
        Clocks(2, Protocol("bsp", backup_workers=2))
    assert Protocol.parse("ssp:2", backup_workers=1).label == "SSP(2) b=1"


# -- Clocks -------------------------------------------------------------------------------------------
def test_clocks_gate_reads_by_the_bound_and_complete_steps_in_order():
    c = Clocks(3, "ssp:1")
    assert [c.may_read(k) for k in range(3)] == [True, True, False]
    assert c.deliver(1) and c.deliver(1) and c.deliver(1)  # step 1 full, but step 0 is not
    assert c.completed == 0 and not c.may_read(2)
    assert c.deliver(0) and c.deliver(0) and c.deliver(0)
    assert c.completed == 2 and c.may_read(3) and not c.may_read(4)
    assert c.clock_lag(3) == 1


def test_backup_workers_drop_late_pushes_and_deadlines_complete_steps():
    c = Clocks(3, Protocol("bsp", backup_workers=1))
    assert c.deliver(0) and c.deliver(0)
    assert c.completed == 1
    assert c.deliver(0) is False  # the slowest push of a complete step is dropped
    d = Clocks(2, Protocol("bsp", timeout=0.5))
    assert d.open(0, now=1.0) == 1.5 and d.open(0, now=1.2) is None
    assert d.expire(0) and d.completed == 1 and not d.expire(0)
    assert d.deliver(0) is False


def test_async_never_waits():
    c = Clocks(2, "async")
    assert all(c.may_read(k) for k in (0, 10, 10_000))


def _code(path: Path) -> str:
    """The file's code with comments and strings (docstrings included) removed."""
    with path.open("rb") as f:
        toks = [t for t in tokenize.tokenize(f.readline) if t.type not in (tokenize.COMMENT, tokenize.STRING)]
    return " ".join(t.string for t in toks)


def test_the_ssp_read_rule_is_written_once_and_every_server_calls_it():
    # Any comparison of a clock against "c - s" (or "clock - bound") outside protocol.py is a second copy.
    rule = re.compile(r"(clock|\bc)\s*-\s*(self\s*\.\s*)?(bound|staleness|s)\b\s*(<=|>=|<|>)|"
                      r"(<=|>=|<|>)\s*(clock|\bc)\s*-\s*(self\s*\.\s*)?(bound|staleness|s)\b")
    hits = [p for p in (ROOT / "simlib").rglob("*.py") if rule.search(_code(p))]
    assert [p.name for p in hits] == ["protocol.py"], hits
    for module in ("sim/clocks.py", "contract.py", "substrates/shm.py"):
        assert "may_read(" in (ROOT / "simlib" / module).read_text(), module


# -- the staleness-aware step rule --------------------------------------------------------------------
def test_staleness_aware_rule_on_a_hand_computed_three_worker_case():
    # Three workers read version 0; their pushes land in order, then worker 0 reads again and pushes.
    server = ParamServer(np.zeros(1), 3, "async", StepRule(staleness_aware=True))
    reads = [server.pull(np.array([0]))[1] for _ in range(3)]
    assert reads == [0, 0, 0]
    taus = [server.push(0, np.array([0]), np.array([1.0]), v)[1] for v in reads]
    assert taus == [0, 1, 2]  # pushes skipped 0, 1 and 2 updates
    assert server.params[0] == pytest.approx(1.0 + 1.0 / 1 + 1.0 / 2)  # alpha0 / max(tau, 1)
    v = server.pull(np.array([0]))[1]
    assert server.push(1, np.array([0]), np.array([1.0]), v) == (True, 0)
    assert server.params[0] == pytest.approx(3.5) and server.version == 4


def test_accumulation_factor_averages_floor_lambda_over_n_pushes():
    acc = Accumulator(StepRule(staleness_aware=True, accumulation=6), n_workers=3)
    assert acc.c == 2
    assert acc.push(np.array([0]), np.array([2.0]), 0) == (0, [])
    tau, ready = acc.push(np.array([0]), np.array([2.0]), 0)
    assert tau == 0 and [float(d[0]) for _, d in ready] == [1.0, 1.0] and acc.version == 1
    tau, _ = acc.push(np.array([0]), np.array([4.0]), 0)  # read before the first update
    assert tau == 1


def test_staleness_aware_rule_keeps_async_stable_where_plain_async_fails():
    from simlib.course.experiments import DEFAULT_TARGET, cluster_options, compare_problem

    prob = compare_problem()
    plain = simlib.run(prob, "async", substrate="sim", **cluster_options(lr=24.0)).trace
    aware = simlib.run(prob, "async", substrate="sim", **cluster_options(lr=24.0, staleness_aware=True)).trace
    assert plain.time_to(DEFAULT_TARGET) is None
    assert aware.time_to(DEFAULT_TARGET) is not None
    assert aware.summary()["mean_staleness"] == plain.summary()["mean_staleness"] > 1


# -- the property suite over every substrate ----------------------------------------------------------
def serial_loop(problem, protocol, training: Training, **options) -> Result:
    """A substrate in a dozen lines: workers take turns over one ParamServer, all reading before any push."""
    server = ParamServer(problem.init_params(), training.n_workers, protocol, training.rule)
    trace = Trace(label=protocol.label, substrate="serial", n_workers=training.n_workers)
    shards = problem.shards(training.n_workers)
    trace.record_quality(0.0, 0, problem.quality(server.params))
    for c in range(training.steps):
        assert server.may_read(c)
        reads = []
        for i in range(training.n_workers):
            batch = problem.batch(shards[i], c, training.batch_size)
            keys = problem.keys(batch)
            reads.append((batch, keys, *server.pull(keys), server.clocks.clock_lag(c)))
        for i, (batch, keys, values, version, lag) in enumerate(reads):
            k, d = problem.step(values, batch, keys, training.lr)
            applied, tau = server.push(c, k, d, version)
            trace.span(i, "compute", c, c + 1, step=c)
            trace.update(c + 1, i, c, tau, applied, lag)
    server.finish()
    trace.record_quality(training.steps, training.steps * training.n_workers, problem.quality(server.params))
    return Result(trace, server.params)


def test_the_simulator_and_ray_cut_the_key_range_at_the_same_integer_bounds():
    from simlib.sim.config import SimConfig
    from simlib.sim.engine import _Run
    from simlib.substrates import ray

    # 7 * 122 / 14 = 61 exactly, where a float linspace gives 60.99999999999999 and floors it to 60.
    assert key_bounds(122, 14).tolist() == [k * 122 // 14 for k in range(15)] and key_bounds(122, 14)[7] == 61
    problem = LogisticProblem(make_sparse_classification(200, 122, 5, seed=1), eval_rows=None)
    run = _Run(SimConfig(n_workers=1, steps=1, n_servers=14, seed=0), problem, None)
    assert run.key_bounds.tolist() == key_bounds(122, 14).tolist() and ray.key_bounds is key_bounds


@pytest.fixture(scope="module", autouse=True)
def _serial_substrate():
    substrates.register("serial", serial_loop)
    yield
    substrates.unregister("serial")


SUBSTRATES = {
    "serial": {},
    "sim": {},
    "pipes": {},
    "shm": {"chunk": 1},  # one trace update per step; the default chunks are checked on their own below
    "gpu": {"xp": "numpy"},
}


@pytest.fixture(scope="module")
def tiny():
    return LogisticProblem(make_sparse_classification(600, 60, 5, seed=1), l2=1e-4, eval_rows=None)


@pytest.mark.parametrize("substrate", list(SUBSTRATES))
def test_one_worker_equals_the_serial_reference(tiny, substrate):
    res = simlib.run(tiny, "bsp", substrate=substrate, n_workers=1, steps=12, batch_size=8, lr=0.5,
                     **SUBSTRATES[substrate])
    np.testing.assert_allclose(np.asarray(res.params), serial_reference(tiny, 12, 8, 0.5), rtol=1e-12, atol=1e-15)
    assert all(u.staleness == 0 for u in res.trace.updates)


@pytest.mark.parametrize("substrate", list(SUBSTRATES))
@pytest.mark.parametrize("protocol", ["bsp", "ssp:1", "async"])
def test_reads_respect_the_bound_and_the_trace_is_well_formed(tiny, substrate, protocol):
    n, steps = 3, 8
    res = simlib.run(tiny, protocol, substrate=substrate, n_workers=n, steps=steps, batch_size=8, lr=0.5,
                     **SUBSTRATES[substrate])
    tr = res.trace
    bound = Protocol.parse(protocol).bound
    assert len(tr.updates) == n * steps
    assert sorted((u.worker, u.step) for u in tr.updates) == [(i, c) for i in range(n) for c in range(steps)]
    assert all(0 <= u.clock_lag <= bound for u in tr.updates), "a read exceeded the staleness bound"
    assert all(0 <= u.staleness < n * steps for u in tr.updates)
    assert all(s.kind in SPAN_KINDS and s.end > s.start and 0 <= s.worker < n for s in tr.spans)
    assert len(tr.quality) >= 2 and all(np.isfinite(q.value) for q in tr.quality)
    assert tr.quality[-1].value < tr.quality[0].value
    assert np.asarray(res.params).shape == (tiny.n_params,)
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("protocol", ["bsp", "ssp:2", "async"])
@pytest.mark.parametrize("batch_size", [1, 8])
def test_shm_fast_path_chunks_steps_within_the_bound(tiny, protocol, batch_size):
    """The local-step hook in chunks: one trace update per chunk, no chunk reads past the bound, every step
    applied once (one worker: the serial replay, bit for bit), and the first look at the clocks starts it."""
    n, steps, chunk = 3, 20, 6
    res = simlib.run(tiny, protocol, substrate="shm", n_workers=n, steps=steps, batch_size=batch_size, lr=0.5,
                     chunk=chunk)
    tr, bound = res.trace, Protocol.parse(protocol).bound
    assert tr.meta["path"] == "in place" and tr.meta["update_unit"] == "a chunk of up to 6 steps"
    for i in range(n):
        ends = [u.step for u in tr.updates if u.worker == i]
        sizes = np.diff([-1] + ends)
        assert ends[-1] == steps - 1 and all(1 <= k <= min(chunk, bound + 1) for k in sizes)
    assert all(0 <= u.clock_lag <= bound for u in tr.updates)
    assert tr.quality[-1].value < tr.quality[0].value
    one = simlib.run(tiny, protocol, substrate="shm", n_workers=1, steps=steps, batch_size=batch_size, lr=0.5)
    np.testing.assert_array_equal(one.params, serial_reference(tiny, steps, batch_size, 0.5))


def test_shm_takes_get_step_add_where_the_step_rule_changes_pushes(tiny):
    aware = simlib.run(tiny, "async", substrate="shm", n_workers=2, steps=4, staleness_aware=True)
    plain = simlib.run(tiny, "async", substrate="shm", n_workers=2, steps=4)
    assert (aware.trace.meta["path"], plain.trace.meta["path"]) == ("get / step / add", "in place")


class ZeroRule(StepRule):
    """Scales every push by 0: a substrate that applies a push without the step rule moves the table."""

    def scale(self, tau: int) -> float:
        return 0.0


class InverseTau(StepRule):
    """Assignment 01's master rule, a subclass with its own scale(tau) = 1 / max(tau, 1)."""

    def scale(self, tau: int) -> float:
        return 1.0 / max(tau, 1)


@pytest.mark.parametrize("substrate", list(SUBSTRATES))
def test_every_substrate_applies_pushes_through_the_one_step_rule(tiny, substrate):
    """The zero rule leaves the table as it started on every substrate (shm and gpu moved it by 0.20:
    they applied a subclass's scale only with staleness_aware=True), and the master rule with one worker
    (tau = 0 always) is the serial replay."""
    opts = dict(substrate=substrate, steps=6, batch_size=8, lr=0.5, **SUBSTRATES[substrate])
    zero = simlib.run(tiny, "async", n_workers=3, rule=ZeroRule(), **opts)
    np.testing.assert_array_equal(np.asarray(zero.params), tiny.init_params())
    assert len(zero.trace.updates) == 18
    one = simlib.run(tiny, "async", n_workers=1, rule=InverseTau(), **opts)
    np.testing.assert_allclose(np.asarray(one.params), serial_reference(tiny, 6, 8, 0.5), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("substrate", list(SUBSTRATES))
def test_bsp_pushes_are_never_stale_so_the_aware_rule_leaves_bsp_alone(tiny, substrate):
    """Under BSP a round's pushes make one update (the lectures' hard-synchronous case): tau = 0 for every push
    on every substrate (it counted the round's earlier pushes, 0 .. n-1, so alpha0/tau damped fresh gradients);
    where a run is deterministic the staleness-aware rule then changes nothing."""
    opts = dict(substrate=substrate, n_workers=3, steps=6, batch_size=8, lr=0.5, **SUBSTRATES[substrate])
    plain = simlib.run(tiny, "bsp", **opts)
    aware = simlib.run(tiny, "bsp", staleness_aware=True, **opts)
    assert {u.staleness for u in plain.trace.updates} == {u.staleness for u in aware.trace.updates} == {0}
    if substrate in ("serial", "sim"):
        np.testing.assert_array_equal(np.asarray(aware.params), np.asarray(plain.params))
    if substrate == "gpu":  # the plain rule runs in place, the aware one through the server: the same sums, rounded apart
        np.testing.assert_allclose(np.asarray(aware.params), np.asarray(plain.params), rtol=1e-10, atol=1e-13)
    ssp = simlib.run(tiny, "ssp:1", **opts)
    assert all(u.staleness >= 0 for u in ssp.trace.updates)


def _strict(clock: int, completed: int, bound: float) -> bool:
    """A read rule that ignores the protocol's bound: BSP under any protocol."""
    return clock <= completed


@pytest.mark.parametrize("substrate", list(SUBSTRATES))
def test_a_read_rule_reaches_every_substrate(tiny, substrate):
    """read_rule= binds on every substrate (it worked on 'sim' only): a BSP rule under async keeps the lag at 0,
    and a rule that refuses a read with every earlier step complete is named before anything runs."""
    opts = dict(substrate=substrate, n_workers=3, steps=6, batch_size=8, **SUBSTRATES[substrate])
    res = simlib.run(tiny, "async", read_rule=_strict, **opts)
    assert len(res.trace.updates) == 18 and max(u.clock_lag for u in res.trace.updates) == 0
    with pytest.raises(ValueError, match=r"read_rule: never\(0, 0, inf\) refused a read at clock 0"):
        simlib.run(tiny, "async", read_rule=never, **opts)
    assert not multiprocessing.active_children()


def never(clock: int, completed: int, bound: float) -> bool:
    """A read rule that allows nothing: every run with it would stall."""
    return False


@pytest.mark.parametrize("substrate", list(SUBSTRATES))
@pytest.mark.parametrize("options, field", [
    ({"n_workers": 0}, "n_workers"), ({"steps": -1}, "steps"), ({"lr": float("nan")}, "lr"),
    ({"batch_size": 1.5}, "batch_size"),
])
def test_bad_options_are_refused_by_name_on_every_substrate(tiny, substrate, options, field):
    with pytest.raises(ValueError, match=field):
        simlib.run(tiny, "bsp", substrate=substrate, **options, **SUBSTRATES[substrate])


def test_bad_problem_protocol_and_substrate_are_refused_by_name(tiny):
    with pytest.raises(ValueError, match="problem: a object is not a Problem; it lacks init_params"):
        simlib.run(object())
    with pytest.raises(ValueError, match="SSP needs a staleness bound"):
        simlib.run(tiny, "ssp")
    with pytest.raises(ValueError, match="substrate must be one of"):
        simlib.run(tiny, "bsp", substrate="mpi")
    with pytest.raises(ValueError, match="bogus: not an option of substrate 'sim'"):
        simlib.run(tiny, "bsp", substrate="sim", bogus=1)
    check_problem(tiny)


@pytest.mark.parametrize("substrate, option, message", [
    ("sim", {"latncy": 1e-3}, "latncy: not an option of substrate 'sim'; did you mean 'latency'?"),
    ("pipes", {"hot_keys": 8}, "hot_keys: not an option of substrate 'pipes'; its own options: "
                               "clock_batches, managed_bandwidth, compression, bucket_bytes, overlap, start_method, "
                               "timeout"),
    ("shm", {"start_metod": "spawn"}, "start_metod: not an option of substrate 'shm'; did you mean 'start_method'?"),
    ("gpu", {"n_worker": 2}, "n_worker: not an option of substrate 'gpu'; did you mean 'n_workers'?"),
    ("ray", {"n_server": 2}, "n_server: not an option of substrate 'ray'; did you mean 'n_servers'?"),
    # the simulator's ranges hold on every substrate: a billion-row batch had the pipe workers killed for memory
    ("pipes", {"batch_size": 10**9}, "batch_size must be an integer in [1, 10000000], got 1000000000"),
    ("shm", {"steps": 10**10}, "steps must be an integer in [1, 1000000000], got 10000000000"),
    ("sim", {"steps": 10**7}, "steps must be an integer in [1, 1000000], got 10000000"),
])
def test_an_option_a_substrate_does_not_take_or_out_of_range_is_named(tiny, substrate, option, message):
    """Refused before any process, actor or device starts (it was a bare TypeError from the substrate's run)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        simlib.run(tiny, "bsp", substrate=substrate, **{"n_workers": 2, "steps": 2, **option})


@pytest.mark.parametrize("substrate, protocol, server", [("shm", "bsp", 0), ("pipes", "bsp", 1), ("shm", "allreduce", 0),
                                                         ("pipes", "allreduce", 0)])
def test_more_processes_than_a_few_per_cpu_are_refused_up_front(tiny, substrate, protocol, server):
    """A process per worker (and the pipe server's): past PROCESSES_PER_CPU per CPU the run is refused, naming
    n_workers and the simulator, before anything starts (1,000 workers on 2 cores ran 3 steps for over 25 s)."""
    import os

    from simlib.parallel.group import PROCESSES_PER_CPU

    most = PROCESSES_PER_CPU * os.cpu_count()
    for n in (most - server + 1, 1_000 + most):
        with pytest.raises(ValueError, match=rf"^n_workers: substrate '{substrate}' .* would start {n + server} processes, "
                                             rf"more than {most} .*substrate 'sim'"):
            simlib.run(tiny, protocol, substrate=substrate, n_workers=n, steps=3)


def test_registry_lists_the_built_in_substrates():
    assert {"sim", "pipes", "shm", "gpu"} <= set(substrates.names())


# -- the warm-up before workers fork ------------------------------------------------------------------
@pytest.mark.parametrize("substrate", ["shm", "pipes"])
def test_forked_workers_never_compile_a_kernel_of_the_problem(substrate):
    """The parent compiles the problem's kernels with the types its workers pass (int64 keys from a shared
    table, int32 keys off a pipe); forked workers compiling at once on a fresh checkout can crash. With
    compiling switched off after the warm-up, a worker needing another signature fails the run."""
    from numba.core.registry import CPUDispatcher

    from simlib.substrates import pipes as pipe_ps
    from simlib.problems import logistic

    prob = LogisticProblem(make_sparse_classification(2_000, 300, 8, seed=3), eval_rows=400)
    (pipe_ps.warm_up if substrate == "pipes" else simlib.contract.warm_up)(prob)
    kernels = [k for k in vars(logistic).values() if isinstance(k, CPUDispatcher) and k.signatures]
    assert {logistic._batch_step, logistic._batch_keys} <= set(kernels)  # step: _batch_step (the gradient inside)
    for k in kernels:
        k.disable_compile()
    try:
        res = simlib.run(prob, "bsp", substrate=substrate, n_workers=2, steps=3, batch_size=32, start_method="fork")
    finally:
        for k in kernels:
            k.disable_compile(False)
    assert len(res.trace.updates) == 6


@pytest.mark.parametrize("option, value", [("backup_workers", 1), ("timeout", 1e-4)])
def test_backup_workers_and_a_deadline_given_beside_the_protocol_are_obeyed(option, value):
    """simlib.run(problem, 'bsp', backup_workers=1) ran plain BSP on the simulator: the protocol's own 0 won."""
    from simlib.course.experiments import compare_problem

    prob = compare_problem()
    beside = simlib.run(prob, "bsp", substrate="sim", n_workers=4, steps=10, **{option: value})
    inside = simlib.run(prob, Protocol("bsp", **{option: value}), substrate="sim", n_workers=4, steps=10)
    assert beside.trace.label == inside.trace.label != "BSP"
    assert sum(not u.applied for u in beside.trace.updates) == sum(not u.applied for u in inside.trace.updates) > 0
    with pytest.raises(ValueError, match=f"{option}=.* contradicts the protocol's own {option}"):
        simlib.run(prob, Protocol("bsp", **{option: value}), substrate="sim", n_workers=4, steps=10,
                   **{option: value * 2})


@pytest.mark.parametrize("substrate", ["pipes", "shm"])
def test_a_real_substrates_own_timeout_stays_its_hang_guard(tiny, substrate):
    """timeout= is the real substrates' limit for the whole run, not the protocol's per-step deadline (which
    async refuses): taking it for the deadline broke every run that set the guard."""
    res = simlib.run(tiny, "async", substrate=substrate, n_workers=1, steps=2, timeout=60.0)
    assert len(res.trace.updates) >= 1 and "T=" not in res.trace.label


def test_a_simconfig_merges_the_protocols_backup_workers_with_its_own_field():
    """SimConfig(protocol=Protocol(...), backup_workers=b) kept only the protocol's value, as simlib.run did."""
    from simlib.sim import SimConfig

    assert SimConfig(protocol=Protocol("bsp"), backup_workers=1, n_workers=4).backup_workers == 1
    assert SimConfig(protocol=Protocol("bsp"), timeout=0.5, n_workers=4).timeout == 0.5
    with pytest.raises(ValueError, match="backup_workers=2 contradicts the protocol's own backup_workers=1"):
        SimConfig(protocol=Protocol("bsp", backup_workers=1), backup_workers=2, n_workers=4)


# -- the capability contract: the optional hooks, read and checked once -----------------------------
def test_capabilities_read_each_hook_once_with_its_default(tiny):
    from simlib.contract import HOOKS, capabilities
    from simlib.problems.lda_table import LDAProblem

    caps = capabilities(tiny)
    assert caps.local_steps is not None and caps.linear_step and not caps.exact_deltas
    assert caps.table_dtype == np.float64 and caps.in_place == caps.local_steps
    lda = capabilities(LDAProblem.__new__(LDAProblem))  # class attributes and methods alone
    assert lda.exact_deltas and not lda.linear_step and lda.table_dtype == np.int32 and lda.in_place_chunk == 1
    assert lda.in_place is not None and lda.device_steps is not None  # the gpu substrate prefers the device hook
    assert set(HOOKS) == set(type(caps).__dataclass_fields__)


@pytest.mark.parametrize("hook, value, words", [
    ("local_steps", 3, "local_steps: .* must be a method"),
    ("exact_deltas", "yes", "exact_deltas: .* must be a bool"),
    ("in_place_chunk", 0, "in_place_chunk: .* must be a positive integer"),
    ("table_dtype", "not a type", "table_dtype: .* must be a NumPy dtype"),
])
def test_a_malformed_hook_is_refused_by_name_before_anything_runs(tiny, hook, value, words):
    class Odd:
        def __getattr__(self, name):
            return value if name == hook else getattr(tiny, name)

    with pytest.raises(ValueError, match=words):
        simlib.run(Odd(), "bsp", substrate="sim", n_workers=2, steps=2)

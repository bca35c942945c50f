"""The one worker program (simlib.worker): the serial transport, and its features on every substrate."""
import numpy as np
import pytest

import simlib
import simlib.sim
from simlib.contract import serial_reference
from simlib.worker import Compute, Gate, Plan, Pull, Push, Serial, drive, ps_worker, run_serial

# What each substrate takes for a quick run without its metric every step.
QUIET = {"sim": {}, "pipes": {"evaluate": False}, "shm": {"monitor_every": 10.0}, "gpu": {"xp": "numpy"}}


class _Messages:
    """A problem without the in-place path: every step goes through get / step / add, on every substrate."""

    def __init__(self, problem):
        self.inner = problem

    def __getattr__(self, name):
        if name in ("local_steps", "inner"):
            raise AttributeError(name)
        return getattr(self.inner, name)


class _FixedSteps(_Messages):
    """A problem whose update ignores the values read: the final table is the sum of every update."""

    def step(self, values, batch, keys, lr):
        return keys, lr * np.sin(keys + 1.0) * len(batch) / 100


def _all_updates(problem, fixed, n_workers, batches, batch_size, lr):
    """The initial table plus every mini-batch's fixed update of every shard."""
    expected = problem.init_params().astype(np.float64)
    for shard in problem.shards(n_workers):
        for b in range(batches):
            batch = problem.batch(shard, b, batch_size)
            keys, d = fixed.step(None, batch, problem.keys(batch), lr)
            np.add.at(expected, keys, d)
    return expected


def test_the_program_on_the_serial_transport_is_sgd_effect_by_effect(small_problem):
    """The effects come in the order gate, pull, compute, push, and the table is plain SGD's."""
    seen, table = [], small_problem.init_params()

    class Recording(Serial):
        """The serial transport, noting the name of each effect it performs."""

    for name in ("gate", "pull", "compute", "push"):
        def perform(self, effect, name=name):
            seen.append(name)
            return getattr(Serial, name)(self, effect)

        setattr(Recording, name, perform)

    drive(ps_worker(small_problem, small_problem.shards(1)[0], Plan(3, 16, 0.5)), Recording(table))
    assert seen == ["gate", "pull", "compute", "push"] * 3
    np.testing.assert_array_equal(table, serial_reference(small_problem, 3, 16, 0.5))


def test_a_dropped_push_rejoins_at_the_first_step_not_complete(small_problem):
    """The program's rule for backup workers: a push the server drops moves the worker to the completed step."""
    program = ps_worker(small_problem, small_problem.shards(1)[0], Plan(10, 8, 0.5))
    assert program.send(None) == Gate(0)
    assert type(program.send(1)) is Pull
    assert type(program.send((small_problem.init_params()[:0], 0))) is Compute
    push = program.send((np.arange(0), np.zeros(0)))
    assert type(push) is Push and push.step == 0
    assert program.send((False, 7)) == Gate(7)  # dropped, and the others completed steps 0 .. 6


def test_a_delayed_read_sees_the_table_delay_updates_ago(small_problem):
    table = small_problem.init_params()
    run_serial(small_problem, small_problem.shards(1)[0], Plan(4, 16, 0.5), table, delay=1)
    fresh = serial_reference(small_problem, 4, 16, 0.5)
    assert not np.array_equal(table, fresh) and np.allclose(table, fresh, atol=0.5)


@pytest.mark.parametrize("substrate", ["sim", "pipes", "shm"])
@pytest.mark.parametrize("budget", [None, 1e5])
def test_clocks_of_several_batches_and_managed_communication_lose_no_update(small_problem, substrate, budget):
    """Bosen's clocks (with and without early messages) on every substrate: every update lands exactly once."""
    fixed, k, steps, n = _FixedSteps(small_problem), 4, 5, 3
    res = simlib.run(fixed, "ssp:2", substrate=substrate, n_workers=n, steps=steps, batch_size=16, lr=0.5,
                     clock_batches=k, managed_bandwidth=budget, **QUIET[substrate])
    np.testing.assert_allclose(res.params, _all_updates(small_problem, fixed, n, steps * k, 16, 0.5),
                               rtol=1e-10, atol=1e-12)
    assert len(res.trace.updates) == n * steps and max(u.clock_lag for u in res.trace.updates) <= 2
    if budget is not None and substrate != "shm":  # the server's count of early messages (shm has no server)
        assert res.trace.meta["managed"]["messages"] > 0


@pytest.mark.parametrize("substrate", ["sim", "pipes", "shm", "gpu"])
def test_compression_is_encoded_by_the_worker_on_every_substrate(small_problem, substrate):
    """Top 10% of each push: the pushes carry about a tenth of the entries, and the run still trains."""
    def pushed(res):
        return sum(s.nbytes for s in res.trace.spans if s.kind == "send")

    opts = {"n_workers": 2, "steps": 8, "batch_size": 16, "lr": 0.5, "eval_every": 8}
    prob = _Messages(small_problem)
    full = simlib.run(prob, "ssp:1", substrate=substrate, **opts, **QUIET[substrate])
    top = simlib.run(prob, "ssp:1", substrate=substrate, compression="topk:0.1", **opts, **QUIET[substrate])
    # pipes' send spans hold the pulls' keys too (4 bytes a key against a full push's 12)
    assert pushed(top) < (0.5 if substrate == "pipes" else 0.25) * pushed(full)
    assert top.trace.quality[-1].value < top.trace.quality[0].value


@pytest.mark.parametrize("substrate", ["sim", "pipes", "shm"])
def test_backup_workers_complete_each_step_with_the_first_n_minus_b_pushes(small_problem, substrate):
    """As in the simulator: of n pushes per step n - b count and the rest are dropped; the bound holds, and a
    straggler that never finishes first has pushes dropped (real substrates: worker 2 sleeps after each step)."""
    slow = {} if substrate == "sim" else {"straggler": (2, 0.02)}
    cluster = {"stragglers": simlib.sim.Stragglers(slow_workers=1, slow_factor=20.0)} if substrate == "sim" else {}
    res = simlib.run(_Messages(small_problem), "bsp", substrate=substrate, n_workers=3, steps=12, batch_size=16,
                     lr=0.5, backup_workers=1, **slow, **cluster, **QUIET[substrate])
    ups = res.trace.updates
    applied = [u for u in ups if u.applied]
    by_step = {c: sum(1 for u in applied if u.step == c) for c in range(12)}
    assert all(count <= 2 for count in by_step.values())  # never more than the quorum n - b
    assert sum(1 for u in ups if not u.applied) > 0  # the straggler's late pushes were dropped
    assert res.trace.quality[-1].value < res.trace.quality[0].value


# One quick run of each feature; the table in simlib.substrates says where each is refused and why.
FEATURE_RUNS = {
    "backup_workers": ("bsp", {"backup_workers": 1}),
    "timeout": (simlib.Protocol("bsp", timeout=0.05), {}),  # the per-step deadline (a real run's timeout= is its guard)
    "compression": ("ssp:1", {"compression": "topk:0.5"}),
    "clock_batches": ("ssp:1", {"clock_batches": 2, "managed_bandwidth": 1e6}),
    "essp": ("essp:1", {}),
    "accumulation": ("async", {"accumulation": 6}),  # 2 pushes of 3 workers averaged into one update
    "staleness_aware": ("async", {"staleness_aware": True}),
    "read_rule": ("ssp:1", {"read_rule": lambda clock, completed, bound: clock - bound <= completed}),
    "allreduce": ("allreduce", {}),  # the protocol itself; the table's last column: the features it refuses
}


@pytest.mark.parametrize("substrate", ["sim", "pipes", "shm", "gpu"])
@pytest.mark.parametrize("feature", list(FEATURE_RUNS))
def test_every_feature_runs_on_every_substrate_or_is_refused_by_name_as_the_table_says(small_problem, feature,
                                                                                       substrate):
    from simlib.substrates import REFUSED

    protocol, kwargs = FEATURE_RUNS[feature]
    run = lambda: simlib.run(_Messages(small_problem), protocol, substrate=substrate, n_workers=3, steps=4,
                             batch_size=16, lr=0.5, **kwargs, **QUIET[substrate])
    if (feature, substrate) in REFUSED:
        with pytest.raises(ValueError, match=feature):
            run()
    else:
        res = run()
        assert len(res.trace.updates) > 0 and res.trace.quality[-1].value < res.trace.quality[0].value


def test_the_feature_table_names_every_feature_and_substrate(capsys):
    from simlib.substrates import FEATURES, feature_table, names

    rows = feature_table()
    print("\n".join(" | ".join(row) for row in rows))
    assert rows[0][1:-1] == sorted(names()) and [r[0] for r in rows[1:]] == list(FEATURES) == list(FEATURE_RUNS)
    assert "feature | gpu | pipes | ray | shm | sim | with allreduce" in capsys.readouterr().out


def test_the_architecture_page_shows_the_feature_table_as_it_is():
    from pathlib import Path

    from simlib.substrates import feature_table

    rows = feature_table()
    table = "| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]) + "\n" + "\n".join(
        "| " + " | ".join(r) + " |" for r in rows[1:])
    assert table in (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()

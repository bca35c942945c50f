"""The ``ray`` substrate on a real two-node Ray cluster on this machine: the contract's properties and real kills.

One module-scoped cluster (a head node marked ``server``, a second node marked ``worker``) serves every
test; each run starts its own actors on it and kills them at the end.
"""
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

import simlib  # noqa: E402
from simlib.calibration.ray_cost import ray_message_cost, sim_options  # noqa: E402
from simlib.contract import serial_reference  # noqa: E402
from simlib.diverged import Diverged  # noqa: E402
from simlib.problems.glove import GloveConfig  # noqa: E402
from simlib.problems.glove_table import GloveProblem  # noqa: E402
from simlib.problems.lda import count_tables, make_synthetic_corpus  # noqa: E402
from simlib.problems.lda_table import LDAProblem  # noqa: E402
from simlib.problems.logistic import LogisticProblem, make_sparse_classification  # noqa: E402
from simlib.problems.mlp import MLPProblem  # noqa: E402
from simlib.protocol import Protocol  # noqa: E402
from simlib.substrates.ray import _gone, _read, _started, _tree  # noqa: E402
from simlib.trace import SPAN_KINDS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ACTOR_NAMES = ("RayPSCoordinator", "RayPSShard", "RayPSWorker")
# How long a test waits for a run's actors: a local Ray's start (3 tries of Ray's fixed 30 s for a raylet to register),
# then the run's wait for its actors (READY_TIMEOUT, 120 s), and more. Only a run that never gets there waits it out.
START_BOUND = 400


def _start_cluster(attempts: int = 3) -> Cluster:
    """Head node (server) + one node (worker); a node start is retried (Ray's 15 s agent limit on busy machines)."""
    for attempt in range(attempts):
        cluster = Cluster(initialize_head=False)
        try:
            cluster.add_node(num_cpus=1, resources={"server": 1})
            cluster.add_node(num_cpus=1, resources={"worker": 1})
            return cluster
        except Exception:
            cluster.shutdown()
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def cluster():
    c = _start_cluster()
    ray.init(address=c.address, logging_level="WARNING", log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def tiny():
    return LogisticProblem(make_sparse_classification(600, 60, 5, seed=1), l2=1e-4, eval_rows=None)


def _own_processes() -> dict[int, str]:
    """pid -> title of every live process descended from this test process: the cluster's nodes (started here)
    and the actors their raylets start. Other test runs on the machine, with actors of the same names, are not."""
    return {pid: _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace")
            for pid in _tree(os.getpid())[1:]}


def _actor_processes() -> list[str]:
    """Titles of this test run's live processes running the substrate's actors (Ray names them after the class)."""
    return [t for t in _own_processes().values() if any(f"ray::{n}" in t for n in ACTOR_NAMES)]


def _wait_gone(within: float = 20.0) -> list[str]:
    deadline = time.monotonic() + within
    while (left := _actor_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _assert_well_formed(tr, n: int, steps: int, bound: float) -> None:
    """Every (worker, step) updated once, reads within the bound, spans and bytes as the contract counts them."""
    assert sorted((u.worker, u.step) for u in tr.updates) == [(i, c) for i in range(n) for c in range(steps)]
    assert all(0 <= u.clock_lag <= bound for u in tr.updates), "a read exceeded the staleness bound"
    assert all(0 <= u.staleness < n * steps for u in tr.updates)
    assert all(s.kind in SPAN_KINDS and s.end > s.start and 0 <= s.worker < n for s in tr.spans)
    recv = [s for s in tr.spans if s.kind == "recv"]
    assert len(recv) == n * steps and all(s.nbytes > 0 and s.nbytes % 12 == 0 for s in recv)
    assert tr.summary()["bytes_sent"] == tr.summary()["bytes_received"]  # 12 B per key each way, uncompressed
    assert len(tr.quality) >= 2 and tr.quality[-1].value < tr.quality[0].value


def test_one_worker_equals_the_serial_reference_on_two_shards(cluster, tiny):
    res = simlib.run(tiny, "bsp", substrate="ray", n_workers=1, steps=12, batch_size=8, lr=0.5, n_servers=2)
    np.testing.assert_allclose(res.params, serial_reference(tiny, 12, 8, 0.5), rtol=1e-12, atol=1e-15)
    assert all(u.staleness == 0 and u.clock_lag == 0 for u in res.trace.updates)
    assert res.trace.substrate == "ray" and res.trace.meta["n_servers"] == 2


@pytest.mark.parametrize("protocol, n_servers", [("bsp", 1), ("ssp:1", 2), ("async", 1)])
def test_reads_respect_the_bound_and_the_trace_is_well_formed(cluster, tiny, protocol, n_servers):
    n, steps = 3, 8
    res = simlib.run(tiny, protocol, substrate="ray", n_workers=n, steps=steps, batch_size=8, lr=0.5,
                     n_servers=n_servers)
    tr = res.trace
    _assert_well_formed(tr, n, steps, Protocol.parse(protocol).bound)
    assert res.params.shape == (tiny.n_params,)
    if protocol == "bsp":
        assert {s.kind for s in tr.spans} >= {"compute", "recv", "send"}


def test_pushes_go_through_the_step_rule_and_reads_through_the_read_rule(cluster, tiny):
    """The contract suite's zero rule and strict read rule, on sharded Ray servers."""
    from simlib.protocol import StepRule

    class ZeroRule(StepRule):
        def scale(self, tau: int) -> float:
            return 0.0

    res = simlib.run(tiny, "async", substrate="ray", n_workers=2, steps=4, batch_size=8, n_servers=2, rule=ZeroRule(),
                     read_rule=lambda clock, completed, bound: clock <= completed)
    np.testing.assert_array_equal(res.params, tiny.init_params())
    assert len(res.trace.updates) == 8 and max(u.clock_lag for u in res.trace.updates) == 0


def test_backup_workers_compression_and_placement_in_one_run(cluster, tiny):
    res = simlib.run(tiny, Protocol("bsp", backup_workers=1), substrate="ray", n_workers=3, steps=6, batch_size=8,
                     compression="onebit", placement="resources")
    applied = [u for u in res.trace.updates if u.applied]
    assert all(sum(u.step == c for u in applied) == 2 for c in {u.step for u in applied})  # quorum n - b = 2
    assert all(u.clock_lag == 0 for u in res.trace.updates)
    sent = sum(s.nbytes for s in res.trace.spans if s.kind == "send")
    recv = sum(s.nbytes for s in res.trace.spans if s.kind == "recv")
    assert 0 < sent < recv  # one bit a value + 4 B a key, against 12 B a key pulled
    # placement='resources': the servers on the head node (marked 'server'), the workers on the other one.
    role = {n["NodeID"]: ("server" if "server" in n["Resources"] else "worker") for n in ray.nodes()}
    assert {role[node] for _, node in res.measured["actors"]["servers"]} == {"server"}
    assert {role[node] for _, node in res.measured["actors"]["workers"]} == {"worker"}


@pytest.mark.parametrize("n_servers", [1, 2])
def test_managed_communication_on_ray_loses_no_update(cluster, tiny, n_servers):
    """The worker program's clocks and early messages on actors: every update lands once, on every shard."""
    class Fixed:  # defined here, so that Ray's workers get it by value: its update ignores the values read
        def __init__(self, inner):
            self.inner = inner

        def step(self, values, batch, keys, lr):
            return keys, lr * np.sin(keys + 1.0) * len(batch) / 100

        def __getattr__(self, name):
            if name == "inner":
                raise AttributeError(name)
            return getattr(self.inner, name)

    from tests.test_worker import _all_updates

    fixed, k, steps = Fixed(tiny), 3, 4
    expected = _all_updates(tiny, fixed, 2, steps * k, 8, 0.5)
    res = simlib.run(fixed, "ssp:1", substrate="ray", n_workers=2, steps=steps, batch_size=8, lr=0.5,
                     clock_batches=k, managed_bandwidth=1e6, n_servers=n_servers, evaluate=False)
    np.testing.assert_allclose(res.params, expected, rtol=1e-10, atol=1e-12)
    assert max(u.clock_lag for u in res.trace.updates) <= 1
    assert sum(1 for s in res.trace.spans if s.kind == "send") > 2 * steps  # early messages beside the clocks' pushes


def test_lda_counts_are_conserved_on_sharded_servers(cluster):
    corpus = make_synthetic_corpus(n_docs=60, n_topics=4, n_words=50, doc_length=30, seed=0)[0]
    prob = LDAProblem(corpus, n_topics=4, alpha=0.5)
    res = simlib.run(prob, "ssp:1", substrate="ray", n_workers=2, steps=5, n_servers=2)
    prob.check_counts(res.params)
    _, n_wk, n_k = count_tables(corpus, prob.assignments(res), 4)  # the workers' topics, in measured['local']
    np.testing.assert_array_equal(prob.split(res.params)[0], n_wk)
    np.testing.assert_array_equal(prob.split(res.params)[1], n_k)
    assert all(u.clock_lag <= 1 for u in res.trace.updates) and len(res.trace.updates) == 10
    assert res.quality > res.trace.quality[0].value  # log p(w | z) rises
    with pytest.raises(ValueError, match="compression: LDAProblem needs every push applied whole"):
        simlib.run(prob, "bsp", substrate="ray", compression="onebit")


def test_glove_one_worker_equals_the_serial_reference_and_its_trace_is_well_formed(cluster, cooc):
    prob = GloveProblem(cooc, GloveConfig(dim=4), eval_entries=2_000)
    res = simlib.run(prob, "bsp", substrate="ray", n_workers=1, steps=10, batch_size=16, lr=0.05, n_servers=2)
    np.testing.assert_allclose(res.params, serial_reference(prob, 10, 16, 0.05), rtol=0, atol=1e-12)
    _assert_well_formed(res.trace, 1, 10, 0)  # includes: GloVe's cost falls
    assert res.trace.metric == "cost"


def test_a_run_that_diverges_on_a_cluster_the_driver_keeps_leaves_none_of_its_actors_alive(cluster):
    """Diverged leaves the run after its teardown: by then every actor process the run created has ended (ray.kill
    only asks; they went about 50 ms later, and nothing else stops them on a cluster the driver keeps). The Ray
    cluster's own table of actors names those the run created, and their processes (all on this machine)."""
    from ray._private.state import actors as actor_table
    from test_diverged import LR, N_WORKERS, STEPS

    before = set(actor_table())
    prob = LogisticProblem(make_sparse_classification(400, 50, 5, seed=0), eval_rows=None)
    with pytest.raises(Diverged):
        simlib.run(prob, "bsp", substrate="ray", n_workers=N_WORKERS, steps=STEPS, lr=LR, eval_every=1)
    created = [a for key, a in actor_table().items() if key not in before]
    assert sorted(a["ActorClassName"] for a in created) == ["RayPSCoordinator", *["RayPSWorker"] * N_WORKERS]
    assert all(a["Pid"] > 0 for a in created)
    assert [a["ActorClassName"] for a in created if not _gone(a["Pid"])] == []


def test_allreduce_replicas_take_one_process_step(cluster):
    """Protocol 'allreduce' on Ray (on this module's cluster: a Ray of its own took 20 s of the suite): each bucket
    summed by the coordinator and added to both replicas, the parameters one process's on the global batch."""
    from allreduce_kit import BATCH, LR, N, one_process, sends

    mlp = MLPProblem(hidden=(32, 16))
    res = simlib.run(mlp, "allreduce", substrate="ray", n_workers=N, steps=2, batch_size=BATCH, lr=LR,
                     bucket_bytes=2000)
    expected = one_process(mlp, steps=2)
    np.testing.assert_allclose(res.params, expected, rtol=1e-6, atol=1e-9 * np.abs(expected).max())
    assert [len(sends(res, i, c)) for i in range(N) for c in range(2)] == [2] * 4
    assert len(res.trace.updates) == N * 2


def test_mlp_one_worker_is_the_serial_reference_and_two_async_workers_learn_digits(cluster):
    prob = MLPProblem()  # dense: every push carries all 2,410 parameters, over two server shards
    res = simlib.run(prob, "bsp", substrate="ray", n_workers=1, steps=10, batch_size=32, lr=0.3, n_servers=2)
    np.testing.assert_array_equal(res.params, serial_reference(prob, 10, 32, 0.3))
    two = simlib.run(prob, "async", substrate="ray", n_workers=2, steps=100, batch_size=32, lr=0.3, eval_every=50)
    assert prob.accuracy(two.params) > 0.9 > 0.2 > prob.accuracy(prob.init_params())
    assert sorted((u.worker, u.step) for u in two.trace.updates) == [(i, c) for i in range(2) for c in range(100)]


def test_divergence_ends_the_run_naming_its_step_and_value_and_leaves_no_actors(cluster):
    """tests/test_diverged.py's check on this module's cluster, where it costs no Ray start of its own."""
    from simlib.diverged import Diverged

    prob = LogisticProblem(make_sparse_classification(400, 50, 5, seed=0), eval_rows=None)
    with pytest.raises(Diverged) as info:
        simlib.run(prob, "bsp", substrate="ray", n_workers=2, steps=150, lr=1e6, eval_every=1)
    found = re.match(r"^training diverged: the loss at step (\d+) was (nan|inf|-inf) \(lr=1e\+06 is too large\?\)$",
                     str(info.value))
    assert found and int(found.group(1)) == info.value.step and not np.isfinite(info.value.value), str(info.value)
    assert 0 < info.value.step <= 300 and info.value.step % 2 == 0  # the server measures after every 2 pushes
    assert _wait_gone() == []


def test_message_cost_under_two_callers_prices_a_queueing_server(cluster, tiny):
    busy = ray_message_cost(keys=(1, 256), calls=3, callers=2)
    assert busy.callers == 2 and busy.sizes == (16, 4_096) and all(t > 0 for t in busy.round_trips)
    # A busy server answers each of two callers once every two service times, and never faster than its CPU.
    intercept = busy.round_trips[0] - busy.sizes[0] / busy.bandwidth
    assert busy.server_cpu > 0 and busy.server_time >= max(busy.server_cpu, intercept / 2) * (1 - 1e-9)
    with pytest.raises(ValueError, match="one must be a ping-pong with callers=1"):
        sim_options(busy, 1e-8, 1e-5)
    one = dataclasses.replace(busy, callers=1)
    opts = sim_options(one, 1e-8, 1e-5, busy=busy)
    assert opts["server_time"] == busy.server_time and opts["compute_overhead"] == pytest.approx(1e-5 + one.latency)
    sim = simlib.run(tiny, "bsp", substrate="sim", n_workers=2, steps=3, batch_size=8, **opts)
    assert sim.trace.makespan >= 3 * 4 * busy.server_time  # two pulls and two pushes queue at one server per step
    with pytest.raises(ValueError, match="keys"):
        ray_message_cost(keys=(1, 1_000_000))


def test_bad_options_are_refused_by_name(tiny):
    with pytest.raises(ValueError, match="n_servers"):
        simlib.run(tiny, "bsp", substrate="ray", n_servers=0)
    with pytest.raises(ValueError, match="placement"):
        simlib.run(tiny, "bsp", substrate="ray", placement="rack")
    with pytest.raises(ValueError, match="compression"):
        simlib.run(tiny, "bsp", substrate="ray", compression="zip")
    with pytest.raises(ValueError, match="accumulation"):
        simlib.run(tiny, "bsp", substrate="ray", n_servers=2, accumulation=4)


def test_an_address_no_cluster_answers_on_is_refused_at_once(tiny):
    """Ray retried such an address for minutes, deaf to Ctrl-C and SIGTERM (a `timeout 300` did not end it).
    In a fresh process: one connected to a cluster refuses another address (the next test)."""
    with socket.socket() as s:  # a port nothing listens on: bound, then closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    driver = textwrap.dedent(f"""
        import simlib
        from simlib.problems.logistic import LogisticProblem, make_sparse_classification
        prob = LogisticProblem(make_sparse_classification(600, 60, 5, seed=1), eval_rows=None)
        for address in ("127.0.0.1:{port}", "head-node"):
            try:
                simlib.run(prob, "bsp", substrate="ray", address=address, n_workers=2, steps=2)
            except (ConnectionError, ValueError) as e:
                print(type(e).__name__, e)
    """)
    done = subprocess.run([sys.executable, "-c", driver], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"ConnectionError ray: no Ray cluster answers at 127.0.0.1:{port}"), done.stdout
    assert lines[1].startswith("ValueError address must be 'host:port'"), done.stdout


def test_a_local_ray_that_never_comes_up_is_refused_by_name_after_its_tries():
    """Under load far past the cores, Ray's fixed 30 s for a raylet to register ran out on every try and its
    bare Exception ('The current node timed out during startup') reached the user; now the run says what
    happened, how often it tried and how busy the machine is. Ray's start is made to fail as it did there
    (in a fresh process, so no cluster of this module is connected)."""
    script = textwrap.dedent("""
        import ray
        from simlib.substrates import ray as substrate
        calls = []
        def init(*args, **kwargs):
            calls.append(kwargs.get("address"))
            raise Exception("The current node timed out during startup. This could happen because ...")
        ray.init = init
        try:
            substrate.connect(None, 1)
        except RuntimeError as e:
            print(len(calls), calls[0], "|", e)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.split(" ")[:2] == ["3", "local"], done.stdout + done.stderr
    assert "ray: a local Ray did not start in 3 tries" in done.stdout, done.stdout
    assert "the last said: The current node timed out during startup." in done.stdout, done.stdout
    assert "load average is" in done.stdout and "pass address= of a running cluster" in done.stdout, done.stdout


def test_a_connected_driver_refuses_another_clusters_address(cluster, tiny):
    """It used to run on the cluster it was connected to, ignoring the address it was given."""
    port = int(cluster.address.rpartition(":")[2])
    for elsewhere in (f"127.0.0.1:{port + 1}", f"10.255.255.1:{port}"):  # another port; another host, same port
        with pytest.raises(ValueError, match="address: this process is already connected to the Ray cluster at"):
            simlib.run(tiny, "bsp", substrate="ray", address=elsewhere, n_workers=2, steps=2)
    for same in (cluster.address, f"localhost:{port}"):  # as Ray names it, and as a user on this machine may
        res = simlib.run(tiny, "bsp", substrate="ray", address=same, n_workers=2, steps=2)
        assert len(res.trace.updates) == 4


def _kill_later(pid_of, delay: float):
    """Start a thread that SIGKILLs the process ``pid_of()`` names once it exists, ``delay`` s later."""
    import threading

    def run():
        deadline = time.monotonic() + START_BOUND
        while time.monotonic() < deadline:
            pid = pid_of()
            if pid:
                time.sleep(delay)
                try:
                    os.kill(pid, signal.SIGKILL)
                    return
                except ProcessLookupError:  # a process of that title that was already on its way out: look again
                    pass
            time.sleep(0.05)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _pid_of(title: str):
    """A finder of the pid of this test run's process titled ``ray::<title>`` (None while there is none)."""
    def find():
        return next((pid for pid, t in _own_processes().items() if f"ray::{title}" in t), None)
    return find


def test_a_killed_worker_fails_the_run_fast_naming_it(cluster, tiny):
    killer = _kill_later(_pid_of("RayPSWorker.run"), delay=0.5)
    with pytest.raises(RuntimeError, match=r"ray: worker \d died mid-run"):
        simlib.run(tiny, "bsp", substrate="ray", n_workers=2, steps=100_000, batch_size=8, timeout=300)
    killer.join()
    assert _wait_gone() == []


def test_a_killed_server_fails_the_run_with_a_clear_error(cluster, tiny):
    find = _pid_of("RayPSCoordinator")
    killer = _kill_later(lambda: _pid_of("RayPSWorker.run")() and find(), delay=0.5)  # once the workers run
    with pytest.raises(RuntimeError, match="ray: server shard 0 died mid-run"):
        simlib.run(tiny, "async", substrate="ray", n_workers=2, steps=100_000, batch_size=8, timeout=300)
    killer.join()
    assert _wait_gone() == []


def test_an_actor_that_never_gets_ready_ends_the_run_at_its_timeout(cluster, tiny):
    """The wait for the actors' start was a fixed 120 s, whatever the run's timeout= (3 of 3 runs waited 60-110 s)."""
    driver = os.getpid()

    class NeverReady(type(tiny)):
        def batch(self, shard, step, batch_size):
            if os.getpid() != driver:  # in the worker actor: its warm-up step never ends
                time.sleep(3600)
            return super().batch(shard, step, batch_size)

    stuck = NeverReady(tiny.data, l2=1e-4, eval_rows=None)
    with pytest.raises(TimeoutError, match=r"^ray: .*worker 1 not placed and started within timeout=4 s"):
        simlib.run(stuck, "bsp", substrate="ray", n_workers=2, steps=2, batch_size=8, timeout=4)
    assert _wait_gone() == []


@pytest.mark.slow
def test_kill_9_of_a_driver_that_started_its_own_ray_leaves_none_of_its_processes():
    """Its raylet's agents (ray::DashboardAgent, ray::RuntimeEnvAgent), orphaned, outlived it by 60-66 s; the
    run's watchdog now kills them once the driver has gone."""
    driver = textwrap.dedent("""
        import simlib
        from simlib.problems.logistic import LogisticProblem, make_sparse_classification
        prob = LogisticProblem(make_sparse_classification(600, 60, 5, seed=1), eval_rows=None)
        simlib.run(prob, "bsp", substrate="ray", n_workers=2, steps=10**6, batch_size=8, num_cpus=2, timeout=300)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", driver], env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_BOUND
        while not any(b"ray::RayPSWorker.run" in _read(f"/proc/{p}/cmdline") for p in _tree(proc.pid)):
            assert time.monotonic() < deadline and proc.poll() is None, "the run's workers never started"
            time.sleep(0.1)
        ray_processes = {p: _started(p) for p in _tree(proc.pid)[1:]}
        assert any(b"ray::DashboardAgent" in _read(f"/proc/{p}/cmdline") for p in ray_processes)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10.0  # a kill -9 of shm's or pipes' parent leaves nothing after 1 s
        # An exited process its parent has not yet reaped (a zombie) is gone: a loaded run counted 7, no command line
        while (left := [p for p, t in ray_processes.items() if t and _started(p) == t and not _gone(p)]) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.kill()
    assert left == [], [_read(f"/proc/{p}/cmdline") for p in left]


def test_ctrl_c_stops_the_run_and_leaves_no_actors(cluster):
    driver = textwrap.dedent(f"""
        import simlib
        from simlib.problems.logistic import LogisticProblem, make_sparse_classification
        prob = LogisticProblem(make_sparse_classification(600, 60, 5, seed=1), eval_rows=None)
        print("starting", flush=True)
        simlib.run(prob, "bsp", substrate="ray", address={cluster.address!r}, n_workers=2, steps=100_000,
                   batch_size=8, timeout=300)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", driver], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + START_BOUND
        while not [p for p in _actor_processes() if "RayPSWorker.run" in p] and time.monotonic() < deadline \
                and proc.poll() is None:
            time.sleep(0.1)
        assert time.monotonic() < deadline and proc.poll() is None, "the run's workers never started"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert _wait_gone() == []


def test_ctrl_c_while_the_driver_connects_to_its_new_ray_ends_the_run_cleanly():
    """Ray's driver calls back into Python while its core worker's C++ constructor runs; a
    KeyboardInterrupt raised there crashed the interpreter (SIGSEGV or SIGABRT) and left Ray's
    processes behind. The Ctrl-C is sent inside that callback, every time."""
    import faultkit

    marker = f"ray-connect-{os.getpid()}"
    driver = textwrap.dedent("""
        import os, signal
        from ray._private import gc_collect_manager

        made = gc_collect_manager.PythonGCThread.__init__

        def ctrl_c_inside(self, *args, **kwargs):  # called from CoreWorker.__cinit__
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10_000):  # Python code: the handler runs here
                pass
            made(self, *args, **kwargs)

        gc_collect_manager.PythonGCThread.__init__ = ctrl_c_inside
        import simlib
        from simlib.problems.logistic import LogisticProblem, make_sparse_classification
        prob = LogisticProblem(make_sparse_classification(600, 60, 5, seed=1), eval_rows=None)
        try:
            simlib.run(prob, "bsp", substrate="ray", n_workers=2, steps=10, batch_size=8, num_cpus=2, timeout=120)
            print("the run finished: the Ctrl-C was lost")
        except KeyboardInterrupt:
            print("interrupted")
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), faultkit.MARKER_ENV: marker}
    done = subprocess.run([sys.executable, "-c", driver], env=env, capture_output=True, text=True, timeout=180)
    assert (done.returncode, done.stdout.strip()) == (0, "interrupted"), done.stderr[-3000:]
    deadline = time.monotonic() + 10.0
    while (left := faultkit.with_marker(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], f"processes of the interrupted start outlived it: {left}"


@pytest.mark.parametrize("moment, title", [("starting", b""), ("running", b"ray::RayPSWorker.run")])
def test_sigterm_ends_a_ray_run_with_status_143_as_on_the_other_substrates(moment, title, tmp_path):
    """Ray's own handler exited with 15, and an exit raised inside ray.wait came out as status 1."""
    import faultkit

    marker = f"ray-term-{moment}-{os.getpid()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), faultkit.MARKER_ENV: marker}
    proc = subprocess.Popen([sys.executable, "-m", "simlib", "run", "--substrate", "ray", "--workers", "2",
                             "--steps", "1000000", "--rows", "2000", "--features", "100"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + START_BOUND
        while not [p for p in faultkit.with_marker(marker, title) if p != proc.pid] and time.monotonic() < deadline \
                and proc.poll() is None:
            time.sleep(0.05)
        assert time.monotonic() < deadline and proc.poll() is None, f"the run never reached {moment!r}"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    deadline = time.monotonic() + 10.0
    while (left := faultkit.with_marker(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], f"processes of the run outlived it: {left}"


def test_an_ended_actor_process_is_seen_at_once_even_as_a_zombie():
    """The driver looks at /proc for its local actors: a process that exited (a zombie, not yet reaped) is gone."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while not _gone(child.pid) and time.monotonic() < deadline:  # exited, not reaped: state Z
        time.sleep(0.05)
    assert _gone(child.pid)
    with open(f"/proc/{child.pid}/stat", "rb") as f:
        assert f.read().rsplit(b")", 1)[1].split()[0] == b"Z"  # it is still listed: only a zombie
    child.wait()
    assert _gone(child.pid)  # reaped: no longer listed
    assert not _gone(os.getpid())

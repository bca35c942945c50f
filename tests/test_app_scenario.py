"""The live panel's scenarios: slider settings to simulator configs, the cached runner and its process pool."""
from __future__ import annotations

import os
import time

import pytest

from simlib.app.scenario import LiveSettings, Runner, shutdown_pool

SMALL = dict(n_workers=4, steps=20)


def test_settings_map_sliders_to_simulator_configs():
    s = LiveSettings(n_workers=8, steps=40, straggler="slow worker", severity=4.0, staleness=2)
    cfgs = s.configs()
    assert [c.label for c in cfgs] == ["BSP", "SSP(2)", "Async"]
    assert all(c.stragglers.slow_workers == 1 and c.stragglers.slow_factor == 4.0 for c in cfgs)
    assert all(c.n_workers == 8 and c.steps == 40 for c in cfgs)
    jitter = LiveSettings(straggler="jitter", severity=2.0).configs()[0].stragglers
    assert jitter.jitter == "lognormal" and jitter.jitter_sigma == pytest.approx(0.5)
    fail = LiveSettings(straggler="failure", steps=100).configs()[0].stragglers
    assert fail.fail_worker == 0 and fail.fail_time > 0 and fail.restart_after > 0
    ring = LiveSettings(topology="allreduce").configs()
    assert [c.protocol for c in ring] == ["bsp"] and ring[0].topology == "allreduce"


def test_the_default_scenario_tells_the_protocols_apart():
    """Default settings, real workload: the title's ratio is at least 1.3x and the waiting shares are far apart."""
    from simlib.viz.plots import default_target, finding

    runner = Runner()
    bsp, ssp, asy = runner.run(LiveSettings().configs(runner.nnz_per_row))
    wait = [t.summary()["wait_fraction"] for t in (bsp, ssp, asy)]
    assert wait[0] > 0.25 and wait[0] - wait[1] > 0.15 and wait[1] - wait[2] > 0.05, wait
    target = default_target([bsp, ssp, asy])
    assert bsp.time_to(target) / min(ssp.time_to(target), asy.time_to(target)) >= 1.3
    ratio = float(finding([bsp, ssp, asy], target).split("x sooner")[0].split()[-1])
    assert ratio >= 1.3


@pytest.mark.parametrize("field, value", [("n_workers", 0), ("protocols", ("bsp", "gossip")), ("staleness", -1),
                                          ("straggler", "cosmic rays"), ("severity", 0.5), ("latency", -1.0),
                                          ("bandwidth", 0.0), ("topology", "tree")])
def test_bad_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        LiveSettings(**{field: value})


def test_runner_cache_is_bounded(tiny_problem):
    runner = Runner(tiny_problem, capacity=2)
    cfgs = [c for s in (1.0, 2.0) for c in LiveSettings(**SMALL, severity=s, protocols=("bsp",)).configs()]
    cfgs += LiveSettings(**SMALL, severity=3.0, protocols=("bsp",)).configs()
    runner.run(cfgs)
    assert len(runner.cache) == 2 and runner.simulated == 3
    runner.run(cfgs[:1])  # evicted: simulated again
    assert runner.simulated == 4


def _children(pid: int) -> set[int]:
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.add(int(d))
            except OSError:
                pass
    return out


def _grandchildren() -> set[int]:
    """Processes started by our children: the pool's workers (forked by the forkserver child)."""
    return {g for c in _children(os.getpid()) for g in _children(c)}


def test_process_pool_gives_the_same_traces_and_leaves_no_process(tiny_problem):
    shutdown_pool()
    cfgs = LiveSettings(**SMALL, severity=2.5).configs()
    pooled = Runner(tiny_problem, processes=2).run(cfgs)
    serial = Runner(tiny_problem, processes=1).run(cfgs)
    assert pooled == serial  # each run is deterministic, wherever it is simulated
    assert len(_grandchildren()) >= 2  # the runs really went to two worker processes
    shutdown_pool()
    deadline = time.monotonic() + 60  # the pool's processes exit as soon as they are scheduled: a bound for a hang
    while _grandchildren() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _grandchildren()

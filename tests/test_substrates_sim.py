"""The sim substrate: simlib.run's options for the simulator (progress) and SimConfigs run through simlib.run."""
import numpy as np
import pytest

import simlib
from simlib.protocol import Protocol, StepRule
from simlib.sim import SimConfig, Stragglers
from simlib.sim.engine import run_config
from simlib.substrates.sim import run_args


class Halve(StepRule):
    """A step-rule subclass: every push lands at half size."""

    def scale(self, tau: int) -> float:
        return 0.5


def test_progress_reports_the_fraction_of_steps_done(small_problem):
    seen = []
    simlib.run(small_problem, "ssp:1", substrate="sim", n_workers=2, steps=10, progress=seen.append)
    assert len(seen) > 1 and seen == sorted(seen) and seen[-1] == pytest.approx(1.0) and seen[0] < 1.0


def test_progress_must_be_callable(small_problem):
    with pytest.raises(ValueError, match="progress must be a callable"):
        simlib.run(small_problem, "bsp", substrate="sim", n_workers=2, steps=2, progress=0.5)


def test_an_unknown_option_names_progress_among_the_options(small_problem):
    with pytest.raises(ValueError, match="progres: not an option of substrate 'sim'.*progress"):
        simlib.run(small_problem, "bsp", substrate="sim", n_workers=2, steps=2, progres=print)


SLOW = Stragglers(jitter="lognormal", slow_workers=1, slow_factor=3.0)
CONFIGS = {
    "defaults": SimConfig(steps=5),
    "ssp, sites, stragglers": SimConfig(n_workers=4, protocol="ssp:2", steps=8, sites=2, stragglers=SLOW, seed=3),
    "backup worker and deadline": SimConfig(n_workers=4, steps=8, stragglers=SLOW, backup_workers=1, timeout=0.01),
    "a Protocol value": SimConfig(n_workers=3, protocol=Protocol("ssp", 1, backup_workers=1), steps=6),
    "essp, staleness-aware": SimConfig(n_workers=3, protocol="essp:2", steps=6, staleness_aware=True, lr=0.2),
    "a step-rule subclass, compression": SimConfig(n_workers=2, protocol="async", steps=6, rule=Halve(),
                                                   compression="topk:0.1", eval_every=3),
    "accumulation, all-reduce": SimConfig(n_workers=4, steps=4, accumulation=8, topology="allreduce"),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_run_args_run_the_config_bit_for_bit(small_problem, name):
    cfg = CONFIGS[name]
    res, state = simlib.run(small_problem, **run_args(cfg)), run_config(cfg, small_problem)
    assert res.trace == state.trace and res.trace.label == cfg.label
    assert np.array_equal(res.params, state.w) and res.trace.updates


def test_a_server_per_site_returns_each_sites_table_and_outbox(small_problem):
    res = simlib.run(small_problem, "ssp:1", substrate="sim", n_workers=4, steps=6, sites=2, hierarchy="per-site",
                     significance=0.01)
    tables, boxes = res.measured["site_tables"], res.measured["outboxes"]
    assert len(tables) == len(boxes) == 2 and tables[0] is res.params
    assert np.allclose(tables[0], tables[1]) and np.abs(tables[1]).sum() > 0  # the final flush reached both sites
    flat = simlib.run(small_problem, "ssp:1", substrate="sim", n_workers=4, steps=6, sites=2)
    assert "site_tables" not in flat.measured and "outboxes" not in flat.measured

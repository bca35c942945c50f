"""Calibration: real measurements (quick mode) with spreads, a pipe fit that reproduces them, clean failures."""
import math
import os

import numpy as np
import pytest

from simlib.parallel.shm import PREFIX
from simlib.calibration.calibrate import (Calibration, Spread, busy_note, calibrate, fit_line, measure_contention,
                                          measure_load, step_jitter)
from simlib.sim.config import SimConfig


def _segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"{PREFIX}{os.getpid()}_")} if os.path.isdir("/dev/shm") else set()


def _children() -> set[int]:
    import multiprocessing

    return {p.pid for p in multiprocessing.active_children()}


@pytest.fixture(scope="module")
def cal():
    before_shm, before_kids = _segments(), _children()
    c = calibrate(quick=True)
    assert _segments() <= before_shm, "calibration left shared-memory segments behind"
    assert _children() <= before_kids, "calibration left child processes behind"
    return c


def _spreads(c: Calibration) -> list[tuple[str, Spread]]:
    out = [(f"kernel {k} {f}", getattr(v, f)) for k, v in c.kernels.items() for f in ("per_unit", "contention")]
    out += [("kernel bsp_step jitter", c.kernels["bsp_step"].jitter)]  # the spread a BSP twin's steps are drawn with
    out += [("pipe_latency", c.pipe_latency), ("pipe_bandwidth", c.pipe_bandwidth),
            ("shm_copy_bandwidth", c.shm_copy_bandwidth), ("lock_cost", c.lock_cost)]
    out += [(f"process_start {n}", s) for n, s in c.process_start.items()]
    out += [(f"null shm BSP step, {n} workers", s) for n, s in c.bsp_step.items()]
    out += [(f"cpu_share {n}", s) for n, s in c.cpu_share.items()]
    return out


def test_every_figure_is_positive_finite_with_a_spread(cal):
    for name, s in _spreads(cal):
        assert math.isfinite(s.median) and s.median > 0, name
        assert s.n >= 2, f"{name} was measured {s.n} time(s)"
        assert s.q25 <= s.median <= s.q75, name
    # How long quick mode takes is a timing, reported by benchmarks/calibration.py --quick; here only
    # that it was recorded (a wall-clock bound fails on a loaded machine).
    assert math.isfinite(cal.context["seconds"]) and cal.context["seconds"] > 0


def test_fitted_pipe_model_reproduces_its_own_measurements(cal):
    # The straight line holds up to 1 MiB; above it a pipe's cost per byte jumps (which is why
    # workloads are priced at their own size), and the interpolated curve is exact everywhere.
    # One message time on a loaded machine can be 3x its quiet value, so no single point is held
    # to a tight bound: every point within 5x, and the line must explain the size dependence --
    # its relative error well below that of the best constant (a model that ignores size).
    linear = [(n, t) for n, t in zip(cal.pipe_sizes, cal.pipe_times) if n <= 2**20]
    line_err = sum(((cal.pipe_time(n) - t) / t) ** 2 for n, t in linear)
    times = np.array([t for _, t in linear])
    const = 1.0 / np.mean(1.0 / times)  # the constant minimising the same relative squared error
    const_err = float(np.sum(((const - times) / times) ** 2))
    assert line_err < 0.5 * const_err, (line_err, const_err, linear)
    for size, measured in linear:
        assert 0.2 < cal.pipe_time(size) / measured < 5.0, (size, cal.pipe_time(size), measured)
    for size, measured in zip(cal.pipe_sizes, cal.pipe_times):
        assert cal.measured_pipe_time(size) == pytest.approx(measured, rel=1e-9)
    # bigger messages take longer, in the measurements and in the fit
    assert cal.pipe_times[-1] > cal.pipe_times[0]
    assert cal.pipe_time(cal.pipe_sizes[-1]) > cal.pipe_time(cal.pipe_sizes[0])


def test_fit_line_recovers_a_known_line_and_names_bad_input():
    x = np.array([8.0, 1e3, 1e5, 1e6])
    a, b = fit_line(x, 5e-5 + x / 1e9)
    assert a == pytest.approx(5e-5, rel=1e-9) and b == pytest.approx(1e-9, rel=1e-9)
    with pytest.raises(ValueError, match="y must be positive"):
        fit_line([1, 2], [1.0, 0.0])


def test_step_jitter_is_the_lognormal_with_the_calls_expected_max_of_two():
    # calls of 1 and 3 us (mean 2): the slower of two distinct calls is 1.5 times the mean = 2 Phi(sigma / sqrt 2)
    assert step_jitter([[1e-6, 3e-6], [5.0]]) == pytest.approx(math.sqrt(2) * 0.6744897501960817)
    rng = np.random.default_rng(0)
    for sigma in (0.2, 0.6):  # mean-1 lognormal calls of two sizes: their sigma comes back
        walls = [size * np.exp(sigma * rng.standard_normal(5_000) - sigma**2 / 2) for size in (1e-6, 1e-3)]
        assert step_jitter(walls) == pytest.approx(sigma, abs=0.02)
    assert step_jitter([[2e-6] * 5, [3e-3] * 4]) == 0.0  # every call alike: no noise, whatever the sizes
    assert math.isnan(step_jitter([[1e-6]]))


def test_contention_is_measured_with_its_jitter():
    got = measure_contention(["bsp_step"], repeats=1, window=0.02)
    assert set(got) == {"bsp_step"} and len(got["bsp_step"]["slowdown"]) == len(got["bsp_step"]["jitter"]) == 2
    assert all(math.isfinite(j) and j > 0 for j in got["bsp_step"]["jitter"])


def test_sim_config_is_priced_by_the_calibration(cal):
    cfg = cal.sim_config("hogwild_sgd", busy=1, n_workers=2, steps=3)
    assert isinstance(cfg, SimConfig)
    k = cal.kernels["hogwild_sgd"]
    assert cfg.compute_per_unit == pytest.approx(k.per_unit.median / cal.share(1))
    assert cfg.latency == pytest.approx(cal.pipe_latency.median * cal.pipe_share / cal.share(1))
    two = cal.sim_config("hogwild_sgd", busy=2)
    assert two.compute_per_unit == pytest.approx(k.per_unit.median * k.contention.median / cal.share(2))


def test_table(cal):
    text = str(cal)
    assert "pipe latency" in text and "IQR" in text and "hogwild_sgd" in text


def test_load_share_is_a_fraction_of_a_core():
    share = measure_load(0.02, 2)
    for n, s in share.items():
        assert 0 < s.median <= 1.0 and s.n >= 5 * n


def test_busy_note_names_the_processes_that_got_less_than_a_core():
    idle = {1: Spread(0.99, 0.98, 1.0, 5), 2: Spread(0.95, 0.93, 0.97, 10)}
    busy = {1: Spread(0.97, 0.95, 0.99, 5), 2: Spread(0.48, 0.40, 0.55, 10)}
    assert busy_note(idle) == ""
    note = busy_note(busy)
    assert "busy" in note and "2 processes got 0.48" in note and "1 process got" not in note
    assert busy_note(idle, threshold=0.96) != ""  # the threshold decides
    assert busy_note({1: Spread.unmeasured()}) == ""  # nothing measured is not evidence of load
    with pytest.raises(ValueError, match="threshold"):
        busy_note(idle, threshold=1.5)
    with pytest.raises(ValueError, match="cpu_share"):
        busy_note({})


@pytest.mark.parametrize("kwargs, field", [
    ({"quick": "yes"}, "quick"),
    ({"quick": True, "repeats": 0}, "repeats"),
])
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        calibrate(**kwargs)


def test_bad_kernel_and_busy_name_the_field(cal):
    with pytest.raises(ValueError, match="kernel"):
        cal.sim_config("nope")
    with pytest.raises(ValueError, match="busy"):
        cal.sim_config(busy=0)
    with pytest.raises(ValueError, match="seconds"):
        measure_load(-1.0)


def test_pipe_time_is_interpolated_between_measured_sizes(cal):
    import dataclasses

    from simlib.calibration.calibrate import Spread

    cal = dataclasses.replace(
        cal,
        pipe_sizes=(1_000, 1_000_000, 4_000_000),
        pipe_times=(50e-6, 400e-6, 3_200e-6),
        pipe_latency=Spread(50e-6, 50e-6, 50e-6, 1),
    )
    for n, t in zip(cal.pipe_sizes, cal.pipe_times):
        assert cal.measured_pipe_time(n) == pytest.approx(t, rel=1e-12)
    assert 400e-6 < cal.measured_pipe_time(2_000_000) < 3_200e-6
    # priced at its own size, a 4 MB message costs what was measured, not what the line says
    assert cal.pipe_latency.median + 4_000_000 / cal.bandwidth_at(4_000_000) == pytest.approx(3_200e-6)
    with pytest.raises(ValueError, match="nbytes"):
        cal.measured_pipe_time(0)

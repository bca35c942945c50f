"""The main job, ``python -m simlib compare``: the seeds' results, the table, the figure, clean errors."""
import os
import subprocess
import sys

import pytest

from simlib.cli import format_table, main
from simlib.course.experiments import DEFAULT_TARGET, compare, default_cluster, summary_rows, with_protocol


@pytest.fixture(scope="module")
def default_runs():
    return {t.label: t for t in compare()}


def test_ssp_reaches_target_sooner_than_bsp_with_stragglers(default_runs):
    bsp, ssp = default_runs["BSP"], default_runs["SSP(3)"]
    assert ssp.time_to(DEFAULT_TARGET) < 0.8 * bsp.time_to(DEFAULT_TARGET)


def test_async_has_shortest_step_but_needs_more_steps(default_runs):
    bsp, ssp, asy = default_runs["BSP"], default_runs["SSP(3)"], default_runs["Async"]
    step = {k: t.summary()["time_per_step"] for k, t in default_runs.items()}
    assert step["Async"] < step["SSP(3)"] < step["BSP"]
    assert asy.steps_to(DEFAULT_TARGET) > bsp.steps_to(DEFAULT_TARGET)
    assert asy.summary()["max_clock_lag"] > ssp.summary()["max_clock_lag"] == 3
    assert asy.summary()["mean_staleness"] > ssp.summary()["mean_staleness"]


def test_summary_rows_carry_the_table_columns(default_runs):
    rows = summary_rows(list(default_runs.values()), DEFAULT_TARGET)
    assert [r["run"] for r in rows] == ["BSP", "SSP(3)", "Async"]
    assert rows[0]["wait_fraction"] > rows[1]["wait_fraction"] > rows[2]["wait_fraction"] == 0.0
    assert all(r["bytes_moved"] > 0 for r in rows)


def test_cli_prints_table_and_writes_figure(tmp_path, capsys):
    out = tmp_path / "cmp.png"
    rc = main(["compare", "--workers", "4", "--steps", "30", "--protocols", "bsp,ssp:2", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "BSP" in text and "SSP(2)" in text and "time/step (ms)" in text
    assert out.exists() and out.stat().st_size > 10_000


def test_cli_runs_managed_communication_under_a_stale_protocol(capsys):
    rc = main(["compare", "--workers", "3", "--steps", "6", "--protocols", "ssp:2", "--clock-batches", "3",
               "--managed-bandwidth", "2e5", "--no-plot"])
    assert rc == 0 and "SSP(2) 3/clock managed 0.2 MB/s" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--workers", "0"], "--workers"),
        (["--latency", "-1"], "--latency"),
        (["--protocols", "ssp:-1"], "protocols"),
        (["--protocols", "gossip"], "unknown protocol"),
        (["--backup-workers", "1"], "use --protocols bsp,ssp:3"),
        (["--slow-factor", "0.5"], "--slow-factor"),
    ],
)
def test_cli_bad_configuration_exits_2_with_one_line(argv, needle):
    proc = subprocess.run(
        [sys.executable, "-m", "simlib", "compare", "--no-plot", *argv], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_help_explains_every_flag():
    proc = subprocess.run([sys.executable, "-m", "simlib", "compare", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for flag in ("--workers", "--protocols", "--latency", "--bandwidth", "--jitter", "--backup-workers", "--target"):
        assert flag in proc.stdout


def test_with_protocol_reads_protocol_specs():
    base = default_cluster(backup_workers=1)
    assert with_protocol(base, "SSP(4)").label == "SSP(4) b=1"
    assert with_protocol(base, "bsp").staleness == 0
    with pytest.raises(ValueError, match="staleness bound"):
        with_protocol(base, "ssp")


def test_format_table_says_diverged_and_keeps_cells_short():
    row = {"run": "BSP", "time_to_target": None, "rounds_to_target": None, "time_per_step": 1e300,
           "wait_fraction": 0.5, "bytes_moved": 1e250, "mean_staleness": 0.0, "final_loss": float("nan")}
    text = format_table([row], 0.44)
    assert "diverged" in text and "never" in text
    assert max(len(cell) for cell in text.splitlines()[-1].split()) <= 10  # the data row: no 200-digit cells


def test_run_command_prints_the_summary(capsys):
    rc = main(["run", "--workers", "3", "--steps", "10", "--protocol", "ssp:1", "--rows", "2000", "--features", "100"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "SSP(1)" in out and "mean tau" in out and "final loss" in out and "30" in out


def test_progress_shows_only_after_two_seconds(capsys):
    from simlib.cli import _Progress

    quick = _Progress(["bsp", "async"], tty=True)
    quick(0, 0.5)
    quick.close()
    assert capsys.readouterr().err == ""  # a run under two seconds prints nothing
    slow = _Progress(["bsp", "async"], tty=True)
    slow.t0 -= 3.0  # as if it had been running for three seconds
    slow(1, 0.5)
    slow.close()
    err = capsys.readouterr().err
    assert "75.0%" in err and "async" in err and err.endswith("\n")


def test_cli_says_which_runs_stalled_and_why(capsys):
    rc = main(["compare", "--no-plot", "--workers", "3", "--steps", "20", "--protocols", "bsp,async",
               "--fail-worker", "1", "--fail-time", "0.002"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "BSP stalled" in out and "backup_workers" in out
    assert "Async stalled" not in out


def test_progress_off_a_terminal_is_a_line_per_finished_run(capsys):
    from simlib.cli import _Progress

    p = _Progress(["bsp", "async"], tty=False)
    p.t0 -= 3.0
    p(0, 0.5)
    p(1, 0.1)
    p.close()
    err = capsys.readouterr().err
    assert "\r" not in err and err.splitlines()[0].startswith("bsp done (1/2") and len(err.splitlines()) == 2


def test_run_on_gpu_without_a_device_says_it_runs_the_numpy_twin():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no device, on any machine
    proc = subprocess.run([sys.executable, "-m", "simlib", "run", "--substrate", "gpu", "--workers", "2", "--steps", "3",
                           "--rows", "2000", "--features", "100"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    header = proc.stdout.splitlines()[0]
    assert "on the NumPy twin of 'gpu' (no CUDA device; wall-clock time)" in header, header
    assert "NumPy twin" in proc.stderr and "no CUDA device" in proc.stderr, proc.stderr

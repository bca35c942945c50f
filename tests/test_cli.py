"""The main job, ``python -m simlib compare``: the lectures' results, the table, the figure, clean errors."""
import io
import os
import re
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


def test_run_help_names_every_protocol_and_no_substrate_it_is_refused_on():
    """It said essp:S ran on substrate sim only (every substrate runs it) and left allreduce out."""
    from simlib.substrates import REFUSED

    proc = subprocess.run([sys.executable, "-m", "simlib", "run", "--help"], capture_output=True, text=True, timeout=60)
    text = " ".join(proc.stdout.split())
    assert "essp:S (eager SSP), async or allreduce, on every substrate" in text
    assert not any(feature in ("essp", "allreduce") for feature, _ in REFUSED)


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


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_on_a_terminal_once_two_seconds_have_passed():
    from simlib.cli import _Progress

    out = _Terminal()
    quick = _Progress(["bsp", "async"], file=out)
    quick(0, 0.5)
    quick.close()
    assert out.getvalue() == ""  # a job under two seconds prints nothing
    slow = _Progress(["bsp", "async"], file=out)
    slow.bar.start_t -= 3.0  # as if it had been running for three seconds
    slow.bar.last_print_t -= 3.0
    slow(1, 0.5)
    assert "75%" in out.getvalue() and "async" in out.getvalue() and "1.50/2 runs" in out.getvalue()
    slow.close()


def test_progress_moves_during_a_run_that_reports_nothing():
    import time

    from simlib.cli import _Progress

    out = _Terminal()
    p = _Progress(["bsp cost-only"], file=out, tick=0.05)
    p.bar.start_t -= 3.0  # past the two seconds, and then silence: no call as the run goes
    deadline = time.monotonic() + 60  # the ticker's first refresh, however late a loaded machine runs it
    while "runs [" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)
    p.close()
    shown = re.search(r"0\.00/1 runs \[00:(\d\d)<", out.getvalue())
    assert shown and int(shown.group(1)) >= 3, out.getvalue()


def test_compare_reports_each_run_at_its_start_and_end_even_cost_only():
    calls = []
    compare(["bsp", "async"], default_cluster(n_workers=3, steps=4, cost_only=True, step_keys=20),
            progress=lambda run, fraction: calls.append((run, fraction)))
    assert calls == [(0, 0.0), (0, 1.0), (1, 0.0), (1, 1.0)]


def test_progress_is_quiet_off_a_terminal():
    from simlib.cli import _Progress

    out = io.StringIO()  # not a terminal: a log, a pipe
    p = _Progress(["bsp", "async"], file=out)
    assert p.bar.disable
    p(0, 0.5)
    p(1, 0.1)
    p.close()
    assert out.getvalue() == ""


def test_cli_says_which_runs_stalled_and_why(capsys):
    rc = main(["compare", "--no-plot", "--workers", "3", "--steps", "20", "--protocols", "bsp,async",
               "--fail-worker", "1", "--fail-time", "0.002"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "BSP stalled" in out and "backup_workers" in out
    assert "Async stalled" not in out


def test_run_on_gpu_without_a_device_says_it_runs_the_numpy_twin():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no device, on any machine
    proc = subprocess.run([sys.executable, "-m", "simlib", "run", "--substrate", "gpu", "--workers", "2", "--steps", "3",
                           "--rows", "2000", "--features", "100"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    header = proc.stdout.splitlines()[0]
    assert "on the NumPy twin of 'gpu' (no CUDA device; wall-clock time)" in header, header
    assert "NumPy twin" in proc.stderr and "no CUDA device" in proc.stderr, proc.stderr


@pytest.mark.parametrize("protocol", ["bsp", "async"])
def test_run_on_the_simulator_says_there_are_no_stragglers_and_what_an_update_is(protocol, capsys):
    rc = main(["run", "--workers", "2", "--steps", "5", "--protocol", protocol, "--rows", "2000", "--features", "100"])
    lines = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert lines[3].split()[2] == "10"  # 2 workers x 5 steps: 10 updates
    assert lines[4] == "updates: pushes applied to the table; one update here is one worker's step (its push)"
    assert "no stragglers" in lines[5] and "simlib compare" in lines[5]


def test_run_on_shared_memory_says_an_update_is_a_chunk_of_steps(capsys):
    rc = main(["run", "--substrate", "shm", "--protocol", "async", "--workers", "2", "--steps", "50", "--rows", "2000",
               "--features", "100"])
    lines = capsys.readouterr().out.splitlines()
    assert rc == 0
    updates = int(lines[3].split()[2])
    assert updates < 100  # fewer than 2 x 50 steps: the in-place path records one update per chunk
    assert lines[4].startswith("updates: pushes applied to the table; one update here is a chunk of up to ")
    assert not any("stragglers" in line for line in lines)


def test_the_figure_folder_is_made_when_its_parent_exists(tmp_path, capsys):
    out = tmp_path / "new" / "cmp.png"
    assert main(["compare", "--workers", "2", "--steps", "5", "--protocols", "bsp", "--out", str(out)]) == 0
    assert out.stat().st_size > 0
    capsys.readouterr()
    deeper = tmp_path / "absent" / "new" / "cmp.png"
    assert main(["compare", "--workers", "2", "--steps", "5", "--protocols", "bsp", "--out", str(deeper)]) == 2
    assert f"--out: the folder {tmp_path / 'absent'} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "absent").exists()


def test_a_cost_only_trace_keeps_less_than_the_cli_counts_per_worker_step():
    """The refusal of --steps counts COST_ONLY_TRACE_BYTES_PER_STEP per worker-step of a cost-only run."""
    import tracemalloc

    from simlib.cli import COST_ONLY_TRACE_BYTES_PER_STEP
    from simlib.sim.engine import run_config

    def kept(n_workers: int, steps: int) -> int:
        cfg = with_protocol(default_cluster(n_workers=n_workers, steps=steps, cost_only=True, step_keys=500), "ssp:3")
        tracemalloc.start()
        trace = run_config(cfg).trace
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert len(trace.updates) == n_workers * steps
        return size

    kept(50, 2)  # compiled once, outside the measurement
    n_workers, steps = 5_000, 10
    assert kept(n_workers, steps) / (n_workers * steps) < COST_ONLY_TRACE_BYTES_PER_STEP


@pytest.mark.heavy  # a whole Ray start for one warning (15 s of a quiet CI run); tests/test_ray.py runs Ray itself
def test_run_on_ray_prints_no_token_warning(tmp_path):
    pytest.importorskip("ray")
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    proc = subprocess.run([sys.executable, "-m", "simlib", "run", "--substrate", "ray", "--workers", "2", "--steps", "3",
                           "--rows", "2000", "--features", "100"], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "SSP(3)" in proc.stdout
    assert "Token authentication" not in proc.stderr, proc.stderr

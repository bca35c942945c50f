"""Fault injection into real runs: a driver process per algorithm, real signals, leak checks from outside.

:class:`Driver` starts ``fault_driver.py`` in its own session (so the whole process group can be
signalled, as a terminal's Ctrl-C does) and with a unique marker in its command line: forked
workers share it, so a worker that outlived the run is found in /proc even if it was orphaned.
:func:`inject` starts one run, waits a random moment, delivers one fault and measures how long
the run took to end after it.
"""
from __future__ import annotations

import json
import os
import queue
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).with_name("fault_driver.py")
FAULTS = ("kill9-worker", "term-worker", "exception-worker", "int-parent", "term-parent", "int-group")
# What a run must end with for each fault (class names as the driver reports them).
EXPECTED = {
    "kill9-worker": {"WorkerDied"},
    "term-worker": {"WorkerError", "WorkerDied"},
    "exception-worker": {"WorkerError", "WorkerDied"},
    "int-parent": {"KeyboardInterrupt"},
    "term-parent": {"SystemExit", "killed by SIGTERM"},
    "int-group": {"KeyboardInterrupt"},
}
PROMPT = 5.0  # seconds a run may take to end after its fault


def with_marker(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains ``marker``."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        out.append(int(pid))
    return out


def segments_of(pid: int) -> list[str]:
    """Shared-memory segments named after process ``pid`` (simlib's prefix)."""
    from simlib.parallel.shm import PREFIX

    mine = f"{PREFIX}{pid}_"
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(mine))


@dataclass
class Outcome:
    """How one repetition ended."""

    fault: str
    error: str | None
    message: str
    seconds_after_fault: float
    left: dict[str, Any] = field(default_factory=dict)


class Driver:
    """One ``fault_driver.py`` process running ``algorithm``; restarted if a fault kills it."""

    def __init__(self, algorithm: str):
        self.algorithm = algorithm
        self.proc: subprocess.Popen | None = None
        self.restarts = -1

    # -- process -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the driver and wait until it has loaded everything (its first short run)."""
        self.marker = f"simlib-fault-{secrets.token_hex(6)}"
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, str(DRIVER), self.algorithm, self.marker], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                     start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True).start()
        ready = self.next_event(120.0)
        assert ready is not None and ready["event"] == "ready", self.diagnosis()
        self.baseline_threads = ready["threads"]
        self.restarts += 1

    @staticmethod
    def _read(stream: Any, lines: queue.Queue) -> None:
        for line in stream:
            lines.put(json.loads(line))
        lines.put(None)

    def next_event(self, timeout: float) -> dict[str, Any] | None:
        """The driver's next report, or None if it exited (or ``timeout`` passed)."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def workers(self) -> list[int]:
        """The driver's forked workers (they carry its marker)."""
        return [p for p in with_marker(self.marker) if self.proc is None or p != self.proc.pid]

    def diagnosis(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-3000:]

    def close(self) -> None:
        """Stop the driver (it is idle between runs: closing stdin ends it)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    # -- one repetition ------------------------------------------------------------------------
    def inject(self, fault: str, rng: random.Random, window: float = 0.4) -> Outcome:
        """Start a run, deliver ``fault`` at a random moment of it, return how and when the run ended."""
        if not self.alive():
            self.start()
        assert self.proc is not None
        pid = self.proc.pid
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        started = self.next_event(30.0)
        assert started is not None and started["event"] == "started", self.diagnosis()
        if fault.endswith("-worker"):
            # a worker must exist to be signalled: wait for the fork, then a random moment more
            deadline = time.monotonic() + 20.0
            while not self.workers() and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, window))
            targets = self.workers()
            assert targets, f"{self.algorithm}: no worker ever started\n{self.diagnosis()}"
            target = rng.choice(targets)
            sig = {"kill9-worker": signal.SIGKILL, "term-worker": signal.SIGTERM,
                   "exception-worker": signal.SIGUSR1}[fault]
        else:
            time.sleep(rng.uniform(0.0, window))
            target = pid
            sig = signal.SIGTERM if fault == "term-parent" else signal.SIGINT
        faulted = time.monotonic()
        if fault == "int-group":
            os.killpg(pid, signal.SIGINT)
        else:
            try:
                os.kill(target, sig)
            except ProcessLookupError:  # the worker ended between the look-up and the signal
                pass
        ended = self.next_event(PROMPT + 10.0)
        seconds = time.monotonic() - faulted
        if ended is None:  # the driver exited (SIGTERM outside the run's handler) or hangs
            try:
                code = self.proc.wait(max(0.0, PROMPT + 10.0 - seconds))
            except subprocess.TimeoutExpired:
                for p in [pid, *self.workers()]:  # every stack, to say where it hangs
                    os.kill(p, signal.SIGUSR2)
                time.sleep(1.0)
                self.proc.kill()
                self.proc.wait()
                return Outcome(fault, "HANG", self.diagnosis(), seconds)
            seconds = min(seconds, time.monotonic() - faulted)
            error = "killed by SIGTERM" if code == -signal.SIGTERM else f"exit code {code}"
            left = self._left_after_exit(pid)
            self.proc = None
            return Outcome(fault, error, self.diagnosis()[-500:], seconds, left)
        left = {"children": ended["children"], "segments": ended["segments"], "workers": self.workers(),
                "threads": sorted(set(ended["threads"]) - set(self.baseline_threads))}
        return Outcome(fault, ended["error"], ended["message"], seconds, left)

    def _left_after_exit(self, pid: int) -> dict[str, Any]:
        """What a dead driver left: workers carrying its marker, its segments (after the tracker's sweep)."""
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and (self.workers() or segments_of(pid)):
            time.sleep(0.02)  # orphans die by PDEATHSIG; the resource tracker unlinks what the driver owned
        return {"workers": self.workers(), "segments": segments_of(pid)}


def check(outcome: Outcome, algorithm: str) -> list[str]:
    """Problems with one repetition's ending (empty if it ended promptly, clearly and cleanly)."""
    where = f"{algorithm}, {outcome.fault}"
    problems = []
    if outcome.error not in EXPECTED[outcome.fault]:
        problems.append(f"{where}: ended with {outcome.error!r} ({outcome.message}), "
                        f"expected one of {sorted(EXPECTED[outcome.fault])}")
    if outcome.seconds_after_fault > PROMPT:
        problems.append(f"{where}: took {outcome.seconds_after_fault:.1f} s after the fault to end")
    for what, items in outcome.left.items():
        if items:
            problems.append(f"{where}: left {what} behind: {items}")
    return problems

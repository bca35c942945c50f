"""Fault injection into real runs: a driver process per algorithm, real signals, leak checks from outside.

:class:`Driver` starts ``fault_driver.py`` in its own session (so the whole process group can be
signalled, as a terminal's Ctrl-C does) and with a unique marker in its command line and its
environment: forked workers share the first, every process it starts (Ray's GCS, raylet and actor
processes included) inherits the second, so a process that outlived the run is found in /proc even
if it was orphaned. :meth:`Driver.inject` starts one run, waits a random moment, delivers one fault
and measures how long the run took to end after it.

On Ray the workers are actor processes (their title is ``ray::RayPSWorker...``); a run on this
driver's own Ray (mode ``attached``) must leave none of its actors behind, and a run that started its
own Ray (mode ``owned``) must leave no process at all.
"""
from __future__ import annotations

import json
import os
import queue
import random
import re
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
    "stop-worker": {"TimeoutError"},  # SIGSTOP for good: only the run's timeout= can end it (not in FAULTS)
}
PROMPT = 5.0  # seconds a run may take to end after its fault
MARKER_ENV = "SIMLIB_FAULT_MARKER"
RAY_ACTORS = b"ray::RayPS"  # the title of every actor process of a Ray run
SETTLE = 3.0  # seconds a process that is on its way out (a killed actor, a stopping raylet) may take


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def with_marker(marker: str, title: bytes = b"") -> list[int]:
    """Pids of live (non-zombie) processes carrying ``marker`` (command line or environment), titled ``title``..."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = _read(f"/proc/{pid}/cmdline")
            if not cmdline.startswith(title) or b"resource_tracker" in cmdline:
                continue  # multiprocessing's resource tracker outlives runs by design (it unlinks what they leak)
            if marker.encode() not in cmdline and f"{MARKER_ENV}={marker}".encode() not in _read(f"/proc/{pid}/environ"):
                continue
            if _read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()[0] == b"Z":
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
    mode: str = ""  # Ray: 'attached' or 'owned', and 'late' if the fault waited for the workers


class Driver:
    """One ``fault_driver.py`` process running ``algorithm``; restarted if a fault kills it."""

    def __init__(self, algorithm: str, timeout: float | None = None):
        self.algorithm, self.timeout = algorithm, timeout  # the runs' timeout= (the driver's default: 60 s)
        self.proc: subprocess.Popen | None = None
        self.restarts = -1

    # -- process -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the driver and wait until it has loaded everything (its first short run)."""
        self.marker = f"simlib-fault-{secrets.token_hex(6)}"
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   **{MARKER_ENV: self.marker})
        self.stderr = tempfile.TemporaryFile()
        argv = [sys.executable, str(DRIVER), self.algorithm, self.marker]
        argv += [str(self.timeout)] if self.timeout else []
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                     start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.stray: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True).start()
        ready = self.next_event(120.0)
        assert ready is not None and ready["event"] == "ready", self.diagnosis()
        self.restarts += 1

    def _read(self, stream: Any, lines: queue.Queue) -> None:
        for line in stream:
            if line.startswith("{"):
                lines.put(json.loads(line))
            else:  # a library's own print; kept for the diagnosis
                self.stray.append(line)
        lines.put(None)

    def next_event(self, timeout: float) -> dict[str, Any] | None:
        """The driver's next report, or None if it exited (or ``timeout`` passed)."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def on_ray(self) -> bool:
        return self.algorithm == "run-ray"

    def workers(self) -> list[int]:
        """The run's workers: the driver's forked processes, or on Ray the worker actors' processes."""
        if self.on_ray:
            return with_marker(self.marker, RAY_ACTORS + b"Worker")
        return self.others()

    def running(self) -> list[int]:
        """Workers in their training loop (on Ray: actors past their start-up, titled ``...RayPSWorker.run``)."""
        if self.on_ray:
            return with_marker(self.marker, RAY_ACTORS + b"Worker.run")
        return self.workers()

    def started(self) -> list[int]:
        """Workers running their own Python code: on Ray every actor; a forked worker once it has set
        SIGINT to ignored, the first thing ``WorkerGroup``'s bootstrap does. Before that, CPython may
        still be clearing the signals caught since the fork, and a SIGUSR1 sent then is lost (the
        library blocks SIGINT and SIGTERM around the fork for that reason; SIGUSR1 is the test's own)."""
        if self.on_ray:
            return self.workers()
        return [p for p in self.workers() if _ignores_sigint(p)]

    def others(self) -> list[int]:
        """Every live process carrying the driver's marker, less the driver."""
        return [p for p in with_marker(self.marker) if self.proc is None or p != self.proc.pid]

    def diagnosis(self, limit: int = 3000) -> str:
        self.stderr.seek(0)
        return ("".join(self.stray) + self.stderr.read().decode(errors="replace"))[-limit:]

    def close(self) -> list[int]:
        """Stop the driver (it is idle between runs: closing stdin ends it); the processes it left behind."""
        if self.proc is None:
            return []
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        return _settled(self.others)

    # -- one repetition ------------------------------------------------------------------------
    def inject(self, fault: str, rng: random.Random, mode: str | None = None, late: bool | None = None,
               window: float = 0.4) -> Outcome:
        """Start a run, deliver ``fault`` at a random moment of it, return how and when the run ended.

        ``late``: wait for the run's workers to exist before the random moment (always for worker
        faults); otherwise the moment falls in [0, ``window``) s after the run's start. ``mode``:
        Ray's ``attached`` or ``owned`` (see ``fault_driver``).
        """
        late = fault.endswith("-worker") if late is None else late
        outcome = self._inject(fault, rng, mode, late, window)
        outcome.mode = " ".join(w for w in (mode, "late" if late else "") if w)
        return outcome

    def _inject(self, fault: str, rng: random.Random, mode: str | None, late: bool, window: float) -> Outcome:
        if not self.alive():
            self.start()
        assert self.proc is not None
        pid = self.proc.pid
        self.proc.stdin.write(f"go {mode}\n" if mode else "go\n")
        self.proc.stdin.flush()
        started = self.next_event(120.0)  # on Ray, the driver may first start or stop its own Ray
        assert started is not None and started["event"] == "started", self.diagnosis()
        if late:
            # a worker must exist to be signalled: wait for it, then a random moment more
            deadline = time.monotonic() + 120.0
            while not self.running() and time.monotonic() < deadline:
                time.sleep(0.005)
            assert self.running(), f"{self.algorithm}: no worker ever started\n{self.diagnosis()}"
        time.sleep(rng.uniform(0.0, window))
        faulted = self._deliver(fault, rng, pid)
        ended = self.next_event(PROMPT + 10.0)
        seconds = time.monotonic() - faulted
        if ended is None:  # the driver exited (SIGTERM outside the run's handler) or hangs
            try:
                code = self.proc.wait(max(0.0, PROMPT + 10.0 - seconds))
            except subprocess.TimeoutExpired:
                # every stack, to say where it hangs: the driver's first and alone (its workers share its
                # stderr, and their dumps would interleave with it), then the rest
                before, stacks = self.diagnosis(1500), []
                for group in ([pid], self.others()):
                    self.stderr.seek(0, os.SEEK_END)
                    mark = self.stderr.tell()
                    for p in group:
                        try:
                            os.kill(p, signal.SIGUSR2)
                        except ProcessLookupError:
                            pass
                    time.sleep(1.0)
                    self.stderr.seek(mark)
                    stacks.append(self.stderr.read().decode(errors="replace")[-6000:])
                self.proc.kill()
                self.proc.wait()
                text = f"{before}\n--- the driver ({pid}):\n{stacks[0]}\n--- every other process:\n{stacks[1]}"
                return Outcome(fault, "HANG", text, seconds, {"processes": _settled(self.others)})
            seconds = min(seconds, time.monotonic() - faulted)
            error = "killed by SIGTERM" if code == -signal.SIGTERM else f"exit code {code}"
            left = self._left_after_exit(pid)
            self.proc = None
            return Outcome(fault, error, self.diagnosis()[-500:], seconds, left)
        children = set(ended["children"]) - set(started["children"])
        threads = set(ended["threads"]) - set(started["threads"])
        left = {"segments": ended["segments"]}
        if not self.on_ray:
            left.update(children=sorted(children), workers=self.workers(), threads=sorted(threads))
        elif ended["error"] == "SystemExit":  # the driver exits after a SIGTERM: every process it started must go
            self.proc.wait(60)
            self.proc = None
            left.update(processes=_settled(self.others))
        elif mode == "owned":  # the run's own Ray: nothing of it may outlive the run
            left.update(processes=_settled(self.others), threads=sorted(threads))
        else:  # this driver's Ray stays; the run's actors and any process the run started must go
            # NOTE: a "Dummy-N" thread is one of Ray's own C++ threads that called into Python; it lives
            # as long as the driver's connection to Ray, not as long as the run.
            left.update(actors=_settled(lambda: with_marker(self.marker, RAY_ACTORS)),
                        children=_settled(lambda: sorted(set(self.others()) & children)),
                        threads=sorted(t for t in threads if not t.startswith("Dummy-")))
        return Outcome(fault, ended["error"], ended["message"], seconds, left)

    def _deliver(self, fault: str, rng: random.Random, pid: int) -> float:
        """Send ``fault``'s signal now; when it was sent (a worker that ended meanwhile is replaced by another)."""
        if fault == "int-group":
            faulted = time.monotonic()
            os.killpg(pid, signal.SIGINT)
            return faulted
        if not fault.endswith("-worker"):
            faulted = time.monotonic()
            os.kill(pid, signal.SIGTERM if fault == "term-parent" else signal.SIGINT)
            return faulted
        sig = {"kill9-worker": signal.SIGKILL, "term-worker": signal.SIGTERM, "exception-worker": signal.SIGUSR1,
               "stop-worker": signal.SIGSTOP}[fault]
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            # An injected exception goes to a worker past its start-up (see started); a kill or a
            # SIGTERM to any worker, however young: the library must handle those from the fork on.
            targets = self.started() if fault == "exception-worker" else self.workers()
            if not targets:  # between two worker groups (a loop of short runs): wait for the next
                time.sleep(0.005)
                continue
            faulted = time.monotonic()
            try:
                os.kill(rng.choice(targets), sig)
                return faulted
            except ProcessLookupError:  # the worker ended between the look-up and the signal
                continue
        raise AssertionError(f"{self.algorithm}: no live worker to signal\n{self.diagnosis()}")

    def _left_after_exit(self, pid: int) -> dict[str, Any]:
        """What a dead driver left: processes carrying its marker, its segments (after the tracker's sweep)."""
        deadline = time.monotonic() + SETTLE
        while time.monotonic() < deadline and (self.others() or segments_of(pid)):
            time.sleep(0.02)  # orphans die by PDEATHSIG; the resource tracker unlinks what the driver owned
        return {"processes": self.others(), "segments": segments_of(pid)}


def _ignores_sigint(pid: int) -> bool:
    try:
        for line in _read(f"/proc/{pid}/status").decode().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    except (OSError, ValueError):
        pass
    return False


def _settled(find: Any) -> list[int]:
    """``find()`` once it is empty, or after SETTLE seconds (processes already told to exit may take a moment)."""
    deadline = time.monotonic() + SETTLE
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def expected(fault: str, algorithm: str) -> set[str]:
    """The errors a run of ``algorithm`` may end with after ``fault``."""
    if algorithm == "run-ray" and fault.endswith("-worker"):
        return {"RuntimeError"}  # ray_ps names the worker: "ray: worker 1 died mid-run" / "... failed"
    return EXPECTED[fault]


def check(outcome: Outcome, algorithm: str) -> list[str]:
    """Problems with one repetition's ending (empty if it ended promptly, clearly and cleanly)."""
    where = f"{algorithm}{f' ({outcome.mode})' if outcome.mode else ''}, {outcome.fault}"
    problems = []
    if outcome.error not in expected(outcome.fault, algorithm):
        problems.append(f"{where}: ended with {outcome.error!r} ({outcome.message}), "
                        f"expected one of {sorted(expected(outcome.fault, algorithm))}")
    elif algorithm == "run-ray" and outcome.fault.endswith("-worker") and not re.match(r"ray: worker \d", outcome.message):
        problems.append(f"{where}: the error does not name the worker: {outcome.message}")
    if outcome.seconds_after_fault > PROMPT:
        problems.append(f"{where}: took {outcome.seconds_after_fault:.1f} s after the fault to end")
    for what, items in outcome.left.items():
        if items:
            problems.append(f"{where}: left {what} behind: {items}")
    return problems

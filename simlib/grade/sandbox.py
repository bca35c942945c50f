"""Run one submission's cells in a confined child process; the grader's side of :mod:`simlib.grade.child`.

Isolation, and what each measure does and does not stop:

* **its own process session** (``start_new_session``); at the end every process in the session and
  every descendant seen is killed (the child is a subreaper, so double forks stay its descendants).
* **time**: a limit per cell and for the whole submission, enforced here by killing everything;
  RLIMIT_CPU as a backstop.
* **memory**: RLIMIT_AS per process (a 10 GB allocation fails with MemoryError), and the resident
  memory of the whole process tree, watched here.
* **processes**: RLIMIT_NPROC where the kernel applies it (not to root); in any case the grader
  watches the tree every few milliseconds and kills it past ``max_procs``. A fork bomb faster than
  that poll can briefly exceed the count before it is killed.
* **files**: the child starts in a fresh scratch directory holding only the submission; Landlock
  (Linux >= 5.13) then lets it read only Python, its packages, the ``simlib`` package and system
  directories, and write only the scratch directory and /dev/shm. Hidden tests, other submissions
  and the gradebook are outside both, so opening them fails with PermissionError. Hidden tests never
  touch the disk: each cell is sent over a pipe after the previous one has finished.
* **network**: a fresh network namespace when run as root, Landlock's TCP rules (ABI >= 4) and an
  audit hook refusing IPv4/IPv6 sockets; proxy variables are removed from the environment.
* **signals**: Landlock's scope (ABI >= 6) stops the submission signalling the grader.
* **not stopped**: code that tampers with the test harness inside its own interpreter (as in
  nbgrader, where tests share the student's kernel), e.g. by replacing ``numpy.testing``; where
  Landlock is missing, the file limits above do not hold (the grader says so in its log).

Shared memory: as root each submission gets a private, empty /dev/shm (a tmpfs in its own mount
namespace) that disappears with it, so submissions can be graded in parallel. Otherwise segments
that appear in /dev/shm while a submission runs are unlinked after it, and grading runs one
submission at a time so that every new segment is the submission's (:func:`parallel_safe`).
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import simlib

SHM = Path("/dev/shm")
SYSTEM_READ = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc", "/sys", "/opt/conda"]
DEVICES = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/tty", "/dev/full"]
MAX_RESTARTS = 3


@dataclass(frozen=True)
class Limits:
    """What one submission may use: seconds per cell and in all, memory per process, processes."""

    cell_s: float = 60.0
    wall_s: float = 180.0
    memory_mb: int = 2048
    max_procs: int = 32
    file_mb: int = 64

    def __post_init__(self) -> None:
        for name in ("cell_s", "wall_s", "memory_mb", "max_procs", "file_mb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class Unit:
    """One piece of code to run: a cell, or the visible or hidden half of a test cell."""

    name: str
    source: str
    kind: str  # 'code' (set-up, answers, the student's own cells) or 'test'


@dataclass
class Outcome:
    """What happened to a unit: ok, or not and why (None if it never ran)."""

    ok: bool | None = None
    error: str = ""
    fatal: bool = False


@dataclass
class Report:
    """Every unit's outcome plus notes on the run (isolation used, restarts)."""

    outcomes: list[Outcome]
    notes: list[str] = field(default_factory=list)


class Fatal(Exception):
    """The child can no longer answer: it died, ran out of time, or broke the protocol."""


def python_roots() -> list[str]:
    """Directories the child must read: the interpreter, its standard library and packages, simlib."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(v for k, v in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib"))
    paths.update(p for p in sys.path if p and "site-packages" in p)
    paths.add(os.path.dirname(simlib.__file__))
    return sorted(os.path.realpath(p) for p in paths if p and os.path.exists(p))


def readable_roots() -> list[str]:
    """Everything the child may read."""
    return python_roots() + [p for p in SYSTEM_READ if os.path.exists(p)]


def exposed(path: Path | str) -> str | None:
    """The readable root that contains ``path``, if any (hidden tests or grades must not be inside one)."""
    real = os.path.realpath(path)
    for root in readable_roots():
        if real == root or real.startswith(root.rstrip("/") + "/"):
            return root
    return None


def _frame(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj).encode("utf-8")
    return struct.pack(">I", len(data)) + data


class Child:
    """One sandboxed interpreter, its result pipe, and a watcher over its process tree."""

    def __init__(self, scratch: Path, limits: Limits, log: Path, numba_cache: Path):
        self.limits = limits
        r, w = os.pipe()
        os.set_inheritable(w, True)
        env = {
            "PATH": "/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch), "MPLCONFIGDIR": str(scratch),
            "MPLBACKEND": "Agg", "NUMBA_CACHE_DIR": str(numba_cache), "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "LANG": "C.UTF-8",
            "no_proxy": "*", "NO_PROXY": "*",
        }
        root = os.path.dirname(os.path.dirname(simlib.__file__))
        cfg = {
            "root": root, "result_fd": w, "memory_mb": limits.memory_mb, "file_mb": limits.file_mb,
            "cpu_s": int(limits.wall_s) + 5, "nproc": _user_processes() + limits.max_procs,
            "landlock": sys.platform.startswith("linux"), "read_only": readable_roots(),
            "read_write": [str(scratch), str(SHM), str(numba_cache)], "rw_files": [d for d in DEVICES if os.path.exists(d)],
        }
        boot = f"import sys; sys.path.insert(0, {root!r}); from simlib.grade.child import main; main()"
        self.log = open(log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-E", "-s", "-c", boot, json.dumps(cfg)], stdin=subprocess.PIPE, stdout=self.log,
            stderr=subprocess.STDOUT, cwd=scratch, env=env, pass_fds=(w,), start_new_session=True,
        )
        os.close(w)
        self.results = r
        self.buffer = b""
        self.seen: dict[int, int] = {}  # pid -> start time, every process of the tree ever seen
        self.violation = ""
        self._stopped: set[int] = set()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()
        self.seq = 0

    # -- the process tree -----------------------------------------------------------------------
    watch_every = 0.02  # seconds between the watcher's looks at the process tree

    def _watch(self) -> None:
        while not self._stop.wait(self.watch_every):
            tree = self.tree()
            if self._crowded(tree):
                self.kill()
                return
            rss = sum(_rss_bytes(pid) for pid in tree)
            if rss > 2 * self.limits.memory_mb * 1024 * 1024:
                self.violation = f"the processes used more than {2 * self.limits.memory_mb} MB together"
                self.kill()
                return

    def _crowded(self, tree: list[int]) -> bool:
        """Whether ``tree`` has more processes than allowed; if so, that becomes the violation."""
        if len(tree) <= self.limits.max_procs:
            return False
        self.violation = self.violation or f"more than {self.limits.max_procs} processes (a fork bomb?)"
        return True

    def tree(self) -> list[int]:
        """The child's session members and descendants now alive (remembered for the final kill)."""
        stats = _proc_stats()
        root = self.proc.pid
        children: dict[int, list[int]] = {}
        for pid, (ppid, sid, _) in stats.items():
            children.setdefault(ppid, []).append(pid)
        found, stack = set(), [root]
        while stack:
            pid = stack.pop()
            if pid in stats and pid not in found:
                found.add(pid)
                stack.extend(children.get(pid, ()))
        found.update(pid for pid, (_, sid, _) in stats.items() if sid == root)
        found.update(pid for pid, start in self.seen.items() if pid in stats and stats[pid][2] == start)
        for pid in found:
            self.seen[pid] = stats[pid][2]
        return sorted(found)

    def kill(self) -> None:
        """Stop the whole tree, then SIGKILL it, until nothing of it is left.

        Everything is stopped first while the child (a subreaper) is alive, so no process can fork
        or be re-parented out of sight between the scan and the kill.
        """
        for _ in range(50):
            tree = self.tree()
            fresh = [pid for pid in tree if pid not in self._stopped]
            for pid in fresh:
                _signal(pid, signal.SIGSTOP)
            self._stopped.update(fresh)
            if not fresh:
                break
        for _ in range(200):
            alive = [p for p in self.tree() if p != os.getpid()]
            for pid in alive:
                _signal(pid, signal.SIGKILL)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.poll()
            if not alive or alive == [self.proc.pid] and self.proc.returncode is not None:
                return
            time.sleep(0.005)

    def close(self) -> None:
        """Stop the watcher, kill everything, release the pipes."""
        self._stop.set()
        self.kill()
        self.proc.wait()
        self.kill()  # orphans re-parented when the child itself died
        self._watcher.join()
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        os.close(self.results)
        self.log.close()

    # -- the protocol ---------------------------------------------------------------------------
    def receive(self, deadline: float) -> dict[str, Any]:
        """The next frame from the child, or Fatal (died, timed out, or garbled the channel)."""
        while True:
            if len(self.buffer) >= 4:
                (n,) = struct.unpack(">I", self.buffer[:4])
                if n > 1 << 20:
                    raise Fatal("the submission wrote into the grader's result channel")
                if len(self.buffer) >= 4 + n:
                    data, self.buffer = self.buffer[4:4 + n], self.buffer[4 + n:]
                    try:
                        return json.loads(data.decode("utf-8"))
                    except ValueError:
                        raise Fatal("the submission wrote into the grader's result channel") from None
            wait = deadline - time.monotonic()
            if self.violation:
                raise Fatal(self.violation)
            if wait <= 0:
                raise Fatal("timeout")
            ready, _, _ = select.select([self.results], [], [], min(wait, 0.1))
            if ready:
                chunk = os.read(self.results, 65536)
                if not chunk:
                    time.sleep(0.05)  # let the watcher record a violation that killed it
                    if self.violation:
                        raise Fatal(self.violation)
                    code = self.proc.wait()
                    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
                    raise Fatal(f"the grading process {how} (did the submission call exit, or run out of CPU time?)")
                self.buffer += chunk

    def run(self, unit: Unit, deadline: float) -> Outcome:
        """Send one unit, wait for its answer until ``deadline``."""
        self.seq += 1
        try:
            self.proc.stdin.write(_frame({"seq": self.seq, "name": unit.name, "source": unit.source}))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the child is gone; receive() says how
        reply = self.receive(deadline)
        if reply.get("seq") != self.seq or not isinstance(reply.get("ok"), bool):
            raise Fatal("the submission wrote into the grader's result channel")
        # The unit that leaves a crowd of processes behind is the one to blame, however late the
        # watcher (a thread polling every watch_every s, later on a busy machine) would have looked: checked
        # here, before the next unit starts, a regrade blames the same unit.
        if self.violation or self._crowded(self.tree()):
            raise Fatal(self.violation)
        return Outcome(reply["ok"], str(reply.get("error", ""))[:1000])


def _signal(pid: int, sig: int) -> None:
    """Send a signal to a process that may already be gone."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _proc_stats() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, session id, start time) for every process now listed in /proc."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                text = f.read().decode("ascii", "replace")
        except OSError:
            continue
        rest = text[text.rfind(")") + 2:].split()
        if len(rest) > 19 and rest[0] != "Z":
            out[int(name)] = (int(rest[1]), int(rest[3]), int(rest[19]))
    return out


def _rss_bytes(pid: int) -> int:
    """Resident set size of a process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def _user_processes() -> int:
    """Processes this user runs now (RLIMIT_NPROC counts them all, so the limit is this plus max_procs)."""
    uid = os.getuid()
    n = 0
    for name in os.listdir("/proc"):
        try:
            n += name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid
        except OSError:
            pass
    return n


def run_units(units: list[Unit], notebook: bytes, limits: Limits = Limits(), numba_cache: Path | None = None,
              warm: bool = False) -> Report:
    """Run the units in order in sandboxed children; after a fatal error, restart and go on without it.

    ``numba_cache`` holds the library's compiled kernels: a submission gets a private copy (so it
    cannot plant code for the next one), and the instructor's own run (``warm=True``) fills it.

    A restarted child re-runs the earlier code units (not the tests) so later parts see the same
    definitions; at most :data:`MAX_RESTARTS` restarts, then the rest is marked not run.
    """
    report = Report([Outcome() for _ in units])
    start = time.monotonic()
    shm_before = _shm_entries()
    own_shm = False
    skip: set[int] = set()
    i, restarts = 0, 0
    with tempfile.TemporaryDirectory(prefix="simlib-grade-log-") as private:
        while i < len(units):
            scratch = Path(tempfile.mkdtemp(prefix="simlib-grade-"))
            child: Child | None = None
            current = -1
            try:
                (scratch / "submission.ipynb").write_bytes(notebook)
                kernels = scratch / "numba-cache"
                if numba_cache is not None and warm:
                    kernels = numba_cache
                elif numba_cache is not None and numba_cache.is_dir():
                    shutil.copytree(numba_cache, kernels)
                kernels.mkdir(parents=True, exist_ok=True)
                log = Path(private) / "child.log"
                child = Child(scratch, limits, log, kernels)
                try:
                    hello = child.receive(time.monotonic() + 60)
                except Fatal as exc:
                    raise RuntimeError(f"the grading sandbox did not start ({exc}):\n{log.read_text()[-2000:]}") from None
                own_shm = bool(hello.get("private_shm"))
                if restarts == 0:
                    report.notes.append(_describe_isolation(hello))
                for j in range(i):  # replay definitions after a restart
                    if units[j].kind == "code" and j not in skip:
                        current = j
                        child.run(units[j], _deadline(start, limits))
                while i < len(units):
                    current = i
                    report.outcomes[i] = child.run(units[i], _deadline(start, limits))
                    i += 1
            except Fatal as exc:
                reason = str(exc)
                if reason == "timeout":
                    reason = _timeout_reason(start, limits)
                skip.add(current)
                if current == i:
                    report.outcomes[i] = Outcome(False, f"stopped: {reason}", fatal=True)
                    i += 1
                restarts += 1
                report.notes.append(f"restarted after '{units[current].name}': {reason}")
            finally:
                if child is not None:
                    child.close()
                shutil.rmtree(scratch, ignore_errors=True)
                if not own_shm:
                    _unlink_new_shm(shm_before)
            if restarts > MAX_RESTARTS or time.monotonic() - start >= limits.wall_s:
                for k in range(i, len(units)):
                    report.outcomes[k] = Outcome(False, "not run: the submission stopped the grader too often "
                                                        "(time, memory, processes or exit)")
                break
    return report


def _deadline(start: float, limits: Limits) -> float:
    return min(time.monotonic() + limits.cell_s, start + limits.wall_s)


def _timeout_reason(start: float, limits: Limits) -> str:
    if time.monotonic() - start >= limits.wall_s - 0.05:
        return f"time limit of {limits.wall_s:g} s for the whole submission exceeded"
    return f"time limit of {limits.cell_s:g} s per cell exceeded (an infinite loop?)"


def _describe_isolation(hello: dict[str, Any]) -> str:
    abi = hello.get("landlock", 0)
    files = f"Landlock ABI {abi}" if abi else "NOT confined (Landlock unavailable)"
    return (f"isolation: files {files}; network namespace {'yes' if hello.get('netns') else 'no'}; "
            f"private /dev/shm {'yes' if hello.get('private_shm') else 'no'}")


def parallel_safe() -> bool:
    """Whether submissions may run side by side: each gets a private /dev/shm only as root."""
    return os.getuid() == 0 and sys.platform.startswith("linux")


def _shm_entries() -> set[str]:
    try:
        return set(os.listdir(SHM))
    except OSError:
        return set()


def _unlink_new_shm(before: set[str]) -> None:
    """Unlink /dev/shm entries that appeared during the submission (segments, semaphores)."""
    for name in _shm_entries() - before:
        try:
            (SHM / name).unlink()
        except OSError:
            pass

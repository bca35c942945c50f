"""Run one submission's cells in a confined child process; the grader's side of :mod:`simlib.grade.child`.

Two sandboxes, chosen once per run (:func:`choose`):

* **bubblewrap** (``bwrap``, the sandbox Flatpak uses), wherever it runs: the submission gets its own
  PID, mount, network, IPC and UTS namespaces, its own ``/proc`` (it sees only its own processes), a
  cleared environment, no capabilities, and a filesystem holding only Python, its packages, the
  ``simlib`` package and system libraries (read-only) plus two size-limited tmpfs, ``/tmp`` (its
  scratch, also HOME and the working directory) and ``/dev/shm``. ``/etc``, other users' files, the
  hidden tests, other submissions and the gradebook are not mounted at all. When the namespace's
  first process dies (killed by the grader, or by the kernel when the grader dies:
  ``--die-with-parent``), the kernel kills every process in it, however it was forked
  (``setsid``, double forks, ``clone(CLONE_PARENT)``): nothing of a submission outlives it. Started
  by root, the sandbox becomes a user id of its own (:func:`sandbox_uid`, one per submission) before
  any submitted code runs, so the per-user limits it can exhaust (128 inotify instances, processes)
  are its own, not root's nor another student's; it then holds no capability at all.
* **the watcher** (fallback where ``bwrap`` cannot run): its own process session, the child a
  subreaper, and a thread here that watches the process tree and kills it at the end; if the grader
  itself dies, a shell outside the sandbox holding a pipe from it kills the session's process group
  (:func:`_watchdog`). A process that leaves the tree (``clone(CLONE_PARENT)``) can escape it; the
  grader says so once.

In both, on top: as root, where the kernel offers one, a cgroup of its own (:mod:`simlib.grade.cgroup`):
``pids.max`` = ``max_procs``, ``memory_mb`` for all its processes together, every process in it
killed at teardown, wherever it went; Landlock (Linux >= 5.13) confines reads to the same trees and
writes to scratch; rlimits bound address space (a 10 GB allocation fails with MemoryError), CPU
time and file size; without a cgroup, the watcher thread kills the sandbox past ``max_procs``
processes or twice ``memory_mb`` resident in all; IPv4/IPv6 sockets are refused; a seccomp filter refuses the
kernel keyrings, execve (no program starts), AF_VSOCK sockets and io_uring
(:func:`simlib.grade.child.syscall_filter`); output is drained here and capped per cell.

Hidden tests never exist as text in the sandbox: test cells are compiled here and sent, with every
other unit, in one frame before the submission's first cell runs; the child then closes that
channel, and each unit starts on a bare "go" byte. Replies carry a nonce per unit, so frames the
submission writes into the result channel ahead of time are refused.

**Not stopped** for a part whose hidden tests run as code: tampering with the harness inside the
student's own interpreter (as in nbgrader, where tests share the student's kernel): walking the stack
or the garbage collector to the compiled tests or the nonces, replacing ``exec`` or the reference
functions the tests call. A part whose hidden tests define ``_probes`` (:mod:`simlib.grade.probe`; every
part of the course's assignments) sends no test code at all: its calls come after every cell has run,
the sandbox answers with plain values, and the grader compares them with the master's outside, so such
tampering changes only values.
"""
from __future__ import annotations

import base64
import contextlib
import functools
import itertools
import json
import marshal
import math
import os
import secrets
import select
import shutil
import re
import signal
import stat
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
from simlib.grade import cgroup as cgroups
from simlib.grade import probe
from simlib.grade.child import MAX_FRAME, frame

SHM = Path("/dev/shm")
# Read-only trees besides Python's own; /etc, /proc of others and /sys are left out on purpose.
SYSTEM_READ = ["/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32", "/opt/conda"]
DEVICES = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/full"]
MAX_RESTARTS = 3
SETTLE_S = 1.0  # how long a unit's end waits for the processes it left behind to stop multiplying
INSIDE_SCRATCH = "/tmp"
FLAGS = {  # Limits field -> its command-line flag, metavar and meaning (the flag's type is its default's)
    "cell_s": ("--cell-timeout", "S", "seconds one cell may run"),
    "wall_s": ("--timeout", "S", "seconds a whole submission may run"),
    "memory_mb": ("--memory-mb", "MB", "memory of all a submission's processes together where a cgroup can be made "
                                       "(as root), else twice this resident; address space per process"),
    "max_procs": ("--max-procs", "N", "processes a submission may run at once; with a cgroup, its pids.max, which "
                                      "counts threads and the sandbox's own 2 or 3"),
    "output_mb": ("--output-mb", "MB", "output one cell may print"),
    "disk_mb": ("--disk-mb", "MB", "scratch space, and /dev/shm space, of a submission"),
}


@dataclass(frozen=True)
class Limits:
    """What one submission may use: seconds per cell and in all, memory per process, processes,
    output per cell, scratch disk (each of /tmp and /dev/shm)."""

    cell_s: float = 60.0
    wall_s: float = 180.0
    memory_mb: int = 2048
    max_procs: int = 32
    output_mb: int = 64
    disk_mb: int = 512

    def __post_init__(self) -> None:
        for name, (flag, _, _) in FLAGS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{flag} ({name}) must be a number > 0, got {value!r}")


@dataclass(frozen=True)
class Unit:
    """One piece of code to run: a cell, or the visible or hidden half of a test cell (of the part ``part``)."""

    name: str
    source: str
    kind: str  # 'code' (the master's set-up), 'answer' (the student's cells), 'test', or 'probe' (calls as JSON)
    part: str = ""


@dataclass
class Outcome:
    """What happened to a unit: ok, or not and why (None if it never ran); a probe unit's replies to its calls."""

    ok: bool | None = None
    error: str = ""
    values: Any = None
    used: list[tuple[str, int, str]] = field(default_factory=list)  # (code name, line, reference) read at run time


@dataclass
class Report:
    """Every unit's outcome plus notes on the run (isolation used, restarts)."""

    outcomes: list[Outcome]
    notes: list[str] = field(default_factory=list)


TAMPERED = "the submission wrote into the grader's result channel"


class Fatal(Exception):
    """The child can no longer answer: it died, ran out of time, or broke the protocol."""


class SandboxError(RuntimeError):
    """The sandbox itself could not start (not the submission's doing)."""


class Interrupted(Exception):
    """Grading was stopped (Ctrl-C): the sandbox was killed, the submission's grade is not known."""


SCRATCH = "simlib-grade-"
_OWNER = re.compile(rf"{SCRATCH}(\d+)\.(\d+)-")


def scratch_dir() -> Path:
    """A fresh scratch folder named after this grader (pid and start time), so a later grader can tell it stale."""
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH}{os.getpid()}.{_start_time(os.getpid())}-"))


def sweep_scratch() -> list[str]:
    """Remove the scratch folders (this user's) of graders no longer running, e.g. killed with SIGKILL; their names."""
    gone = []
    with contextlib.suppress(OSError), os.scandir(tempfile.gettempdir()) as entries:
        for entry in entries:
            owner = _OWNER.match(entry.name)
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if owner and stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() \
                        and _start_time(int(owner[1])) != int(owner[2]):
                    shutil.rmtree(entry.path)
                    gone.append(entry.name)
    return gone


def python_roots() -> list[str]:
    """Directories the child must read: the interpreter, its standard library and packages, simlib."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             os.path.dirname(os.path.abspath(sys.executable))}
    paths.update(v for k, v in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib"))
    paths.update(p for p in sys.path if p and "site-packages" in p)
    paths.add(os.path.dirname(simlib.__file__))
    return sorted({f(p) for p in paths if p and os.path.exists(p) for f in (os.path.realpath, os.path.abspath)})


def readable_roots() -> list[str]:
    """Everything the child may read."""
    return python_roots() + [p for p in SYSTEM_READ if os.path.exists(p)]


def exposed(path: Path | str) -> str | None:
    """The readable root that contains ``path``, if any (hidden tests or grades must not be inside one)."""
    real = os.path.realpath(path)
    return next((root for root in map(os.path.realpath, readable_roots()) if os.path.commonpath([real, root]) == root),
                None)


# -- choosing the sandbox -------------------------------------------------------------------------
def bwrap_args(scratch: Path, kernels: Path, warm: bool, limits: Limits, uid: int = 0) -> list[str]:
    """bwrap's options: namespaces, a cleared environment, the read-only trees, the two quota'd tmpfs; with ``uid``,
    only the capabilities to become that user (the child does, first thing), and both tmpfs writable by it."""
    disk = str(limits.disk_mb * 1024 * 1024)
    caps = ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--perms", "01777"] if uid else []
    # --unshare-all makes a user namespace mapping root alone, where no other uid exists: the rest of it, then
    unshare = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"] if uid else [
        "--unshare-all"]
    args = ["bwrap", *unshare, "--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL",
            "--proc", "/proc", "--dev", "/dev", *caps, "--size", disk, "--tmpfs", "/dev/shm",
            *caps[-2:], "--size", disk, "--tmpfs", INSIDE_SCRATCH]
    # the folders above each tree, made 0755 (bwrap makes them 0700, which a uid of its own cannot cross)
    above = {str(a) for p in SYSTEM_READ + python_roots() + ["/run/numba-cache"] for a in Path(p).parents if str(a) != "/"}
    args += [a for d in sorted(above, key=lambda d: d.count("/")) for a in ("--dir", d)]
    for path in SYSTEM_READ + ["/bin"]:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += [a for root in python_roots() for a in ("--ro-bind", root, root)]
    args += ["--ro-bind", os.path.abspath(scratch / "submission.ipynb"), f"{INSIDE_SCRATCH}/submission.ipynb"]
    bind, at = ("--bind", f"{INSIDE_SCRATCH}/numba-cache") if warm else ("--ro-bind", "/run/numba-cache")
    return args + [bind, os.path.abspath(kernels), at, "--chdir", INSIDE_SCRATCH]


def _bwrap_problem(code: str, uid: int, want: str) -> str:
    """'' if ``code`` prints ``want`` in a bubblewrap sandbox (as ``uid`` where not 0), else why not (one phrase)."""
    tmp = scratch_dir()
    try:
        (tmp / "submission.ipynb").write_text("{}")
        res = subprocess.run(bwrap_args(tmp, tmp, False, Limits(), uid) + ["--", sys.executable, "-E", "-s", "-c", code,
                             str(uid)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap did not run ({exc})"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if res.returncode != 0 or res.stdout.strip() != want:
        return f"bwrap did not run a sandbox here ({(res.stderr.strip().splitlines() or ['no message'])[-1]})"
    return ""


@functools.lru_cache(maxsize=None)
def bwrap_problem() -> str:
    """'' if bubblewrap runs a Python here, else why not (one phrase)."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (apt-get install bubblewrap)"
    return _bwrap_problem("import os; print(os.getpid())", 0, "2")


DROP = "import os, sys; u = int(sys.argv[1]); os.setgroups([]); os.setresgid(u, u, u); os.setresuid(u, u, u)"
UID_BASE = 0x5EED0000  # uids no account uses: 256 per grader process, by its pid
_uids = itertools.count()


@functools.lru_cache(maxsize=None)
def uid_problem() -> str:
    """'' if a bubblewrap sandbox started as root can become an unprivileged user of its own here, else why not."""
    if os.geteuid() != 0:
        return "the grader is not root"
    code = f"{DROP}; open('/tmp/x', 'w'); open('/dev/shm/x', 'w'); print(os.getuid())"
    return _bwrap_problem(code, UID_BASE, str(UID_BASE))


def sandbox_uid(kind: str) -> int:
    """A user id of its own for a sandbox, so the per-user limits it exhausts (inotify instances, processes) are not
    root's nor another student's; 0 where the sandbox stays root (the watcher, or bwrap where it cannot switch)."""
    if kind != "bwrap" or os.geteuid() != 0 or bwrap_problem() or uid_problem():
        return 0
    return UID_BASE + (os.getpid() % 4096) * 256 + next(_uids) % 256


def choose(kind: str = "auto") -> tuple[str, str]:
    """('bwrap' or 'watcher', notes on each fallback used, one per line); ValueError for a kind that cannot run."""
    if kind not in ("auto", "bwrap", "watcher"):
        raise ValueError(f"--sandbox must be auto, bwrap or watcher, got {kind!r}")
    notes = []
    if cgroups.problem():
        notes.append(f"note: no cgroup for submissions ({cgroups.problem()}); memory is limited per process "
                     "(rlimits) and process counts by the watcher's polling, which a fast fork bomb can outrun briefly")
    problem = bwrap_problem() if kind != "watcher" else ""
    if problem and kind == "bwrap":
        raise ValueError(f"--sandbox bwrap: {problem}")
    if problem:
        escape = ("a process forked with CLONE_PARENT may outlive grading" if cgroups.problem() else
                  "without the namespaces a submission can see the host's processes")
        notes.insert(0, f"note: {problem}; falling back to the process watcher, which cannot stop every escape "
                        f"({escape})")
    return "watcher" if problem or kind == "watcher" else "bwrap", "\n".join(notes)


# -- the child ------------------------------------------------------------------------------------
def _watchdog(group: int) -> subprocess.Popen | None:
    """A shell outside the sandbox that SIGKILLs process group ``group`` once the pipe from this process closes (this
    process died); None where no shell starts (the watcher's teardown still runs while the grader lives)."""
    try:
        return subprocess.Popen(["/bin/sh", "-c", 'while read -r _; do :; done; kill -9 "-$0"', str(group)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError:
        return None


class Child:
    """One sandboxed interpreter, its pipes, and a watcher over its processes and output."""

    watch_every = 0.02  # seconds between the watcher's looks at the process tree

    def __init__(self, scratch: Path, limits: Limits, kernels: Path, warm: bool, kind: str,
                 stop: threading.Event | None = None, uid: int = 0):
        self.limits, self.kind, self.stop = limits, kind, stop
        r, w = os.pipe()
        os.set_inheritable(w, True)
        root = os.path.dirname(os.path.dirname(simlib.__file__))
        inside = Path(INSIDE_SCRATCH) if kind == "bwrap" else scratch
        cache = inside / "numba-cache" if kind == "bwrap" else kernels
        env = {
            "PATH": "/usr/bin:/bin", "HOME": str(inside), "TMPDIR": str(inside), "MPLCONFIGDIR": str(inside),
            "MPLBACKEND": "Agg", "NUMBA_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "LANG": "C.UTF-8",
            "no_proxy": "*", "NO_PROXY": "*",
        }
        cfg = {
            "root": root, "result_fd": w, "memory_mb": limits.memory_mb, "file_mb": limits.disk_mb,
            "cpu_s": int(limits.wall_s) + 5, "landlock": sys.platform.startswith("linux"),
            "read_only": readable_roots() + ["/run/numba-cache"], "own_proc": kind == "bwrap",
            "read_write": [str(inside), str(SHM), str(cache)], "rw_files": [d for d in DEVICES if os.path.exists(d)],
            "kernels": "/run/numba-cache" if kind == "bwrap" and not warm else "", "uid": uid,
        }
        boot = f"import sys; sys.path.insert(0, {root!r}); from simlib.grade.child import main; main()"
        cmd = [sys.executable, "-E", "-s", "-c", boot, json.dumps(cfg)]
        fds = [w]
        if kind == "bwrap":  # options through a pipe, so the host's paths are not in the sandbox's /proc/1/cmdline
            options = bwrap_args(scratch, kernels, warm, limits, uid) + [a for k, v in env.items() for a in ("--setenv", k, v)]
            ar, aw = os.pipe()
            os.write(aw, b"".join(a.encode() + b"\0" for a in options[1:]))
            os.close(aw)
            fds.append(ar)
            cmd = ["bwrap", "--args", str(ar), "--"] + cmd
        self.cgroup = None
        try:
            # Made before the launch, joined by the launcher before it execs: nothing is ever forked outside it.
            self.cgroup = cgroups.create(limits.max_procs, limits.memory_mb)
            if self.cgroup is not None:
                cmd = self.cgroup.launcher(cmd)
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=scratch,
                env=env, pass_fds=fds, start_new_session=True,
            )
        except BaseException:  # no child: its pipes go too, or each failed start would leak descriptors
            if self.cgroup is not None:
                self.cgroup.remove()
            os.close(r)
            raise
        finally:
            for fd in fds:
                os.close(fd)
        # NOTE: bubblewrap's --die-with-parent ends its sandbox with the grader; under the watcher a grader killed by
        # SIGKILL left a submission's processes running (a fork sleeping for a minute). A shell of the grader's holds a
        # pipe from it: when the grader dies the pipe closes and the shell kills the sandbox's process group.
        self.watchdog = None if kind == "bwrap" else _watchdog(self.proc.pid)
        os.set_blocking(self.proc.stdin.fileno(), False)  # written with a deadline (:meth:`_write`)
        self.results = r
        self.buffer = b""
        self.seen: dict[int, int] = {}  # pid -> start time, every process of the tree ever seen
        self.violation = ""
        self.output = 0  # bytes printed by the current unit
        self.tail = b""  # the last bytes printed, for a sandbox that did not start
        self._stopped: set[int] = set()
        self.known: set[tuple[int, int]] = set()  # (pid, start) in the cgroup: a clone(CLONE_PARENT) child is the grader's own
        self._stop = threading.Event()
        self._drain = threading.Thread(target=self._read_output, daemon=True)
        self._drain.start()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()
        self.nonces: list[str] = []
        self.late: dict[int, Any] = {}

    # -- output and the process tree ------------------------------------------------------------
    def _read_output(self) -> None:
        """Drain stdout/stderr; past ``output_mb`` in one unit, stop the sandbox."""
        cap = self.limits.output_mb * 1024 * 1024
        with contextlib.suppress(OSError, ValueError):  # the pipe closed under the read
            for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):
                self.output += len(chunk)
                self.tail = (self.tail + chunk)[-4096:]
                if self.output > cap and not self.violation:
                    self.violation = f"the cell printed more than {self.limits.output_mb} MB"
                    self.kill()

    def _watch(self) -> None:
        while not self._stop.wait(self.watch_every):
            if self._over_limit(resident=True):
                self.kill()
                return

    def _over_limit(self, resident: bool = False) -> bool:
        """Whether the cgroup refused a fork or killed for memory, or (without one) the tree has more processes
        than allowed or, if ``resident``, more than twice ``memory_mb`` resident; if so, that is the violation."""
        if self.cgroup is not None:  # the kernel enforces both limits; only say so as soon as one is hit
            why = self.cgroup.violation()
            self.violation = self.violation or why
            return bool(why)
        tree = self.tree()
        if len(tree) - (2 if self.kind == "bwrap" else 0) > self.limits.max_procs:  # bwrap and the namespace's init
            self.violation = self.violation or f"more than {self.limits.max_procs} processes (a fork bomb?)"
            return True
        if not resident or sum(_rss_bytes(pid) for pid in tree) <= 2 * self.limits.memory_mb * 1024 * 1024:
            return False
        self.violation = f"the processes used more than {2 * self.limits.memory_mb} MB together"
        return True

    def _processes(self) -> int:
        """How many processes the sandbox holds now: its cgroup's, or (without one) its tree's."""
        return len(self.cgroup.members()) if self.cgroup is not None else len(self.tree())

    def _settle(self, before: int) -> None:
        """While the processes a unit left behind (more than ``before``) still multiply, wait, up to SETTLE_S:
        the limit they are about to hit is that unit's to answer for, not the next one's."""
        deadline, now = time.monotonic() + SETTLE_S, self._processes()
        while now > before and time.monotonic() < deadline and not self._over_limit():
            time.sleep(self.watch_every)
            before, now = now, self._processes()

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
        # a copy, taken at once (in C): the watcher thread and the unit's end both update it
        found.update(pid for pid, start in list(self.seen.items()) if pid in stats and stats[pid][2] == start)
        found.discard(os.getpid())
        self.seen.update((pid, stats[pid][2]) for pid in found)
        return sorted(found)

    def kill(self) -> None:
        """Stop the whole tree, then SIGKILL it, until nothing of it is left.

        Under bubblewrap, killing the namespace's init (in the tree) makes the kernel kill everything
        in the namespace. For the watcher, everything is stopped first while the child (a subreaper)
        is alive, so no process can fork or be re-parented out of sight between the scan and the kill.
        With a cgroup, everything in it is killed first, however it left the tree or the namespace.
        """
        if self.cgroup is not None:
            self.known.update((pid, _start_time(pid)) for pid in self.cgroup.members())
            self.cgroup.kill()
        for _ in range(50):
            fresh = [pid for pid in self.tree() if pid not in self._stopped]
            for pid in fresh:
                cgroups.signal_quietly(pid, signal.SIGSTOP)
            self._stopped.update(fresh)
            if not fresh:
                break
        for _ in range(200):
            alive = self.tree()
            for pid in alive:
                cgroups.signal_quietly(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
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
        _reap_children(self.known | set(self.seen.items()), self.proc.pid)
        if self.watchdog is not None:  # killed, not told: the group's id may be another's by now
            self.watchdog.kill()
            self.watchdog.wait()
            self.watchdog.stdin.close()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        self._drain.join(timeout=5)
        os.close(self.results)
        if self.cgroup is not None:
            self.cgroup.remove()

    # -- the protocol ---------------------------------------------------------------------------
    def receive(self, deadline: float) -> dict[str, Any]:
        """The next frame from the child, or Fatal (died, timed out, or garbled the channel)."""
        while True:
            n = int.from_bytes(self.buffer[:4], "big") if len(self.buffer) >= 4 else MAX_FRAME  # short: wait
            if n > MAX_FRAME or len(self.buffer) >= 4 + n:
                data, self.buffer = self.buffer[4:4 + n], self.buffer[4 + n:]
                try:
                    reply = json.loads(data.decode("utf-8")) if n <= MAX_FRAME else None
                except (ValueError, RecursionError, MemoryError):
                    reply = None
                if not isinstance(reply, dict):
                    raise Fatal(TAMPERED)
                return reply
            wait = deadline - time.monotonic()
            if self.stop is not None and self.stop.is_set():
                raise Interrupted("grading was interrupted")
            if self.violation:
                raise Fatal(self.violation)
            if wait <= 0:
                raise Fatal("timeout")
            ready, _, _ = select.select([self.results], [], [], min(wait, 0.1))
            if ready:
                chunk = os.read(self.results, 65536)
                if not chunk:
                    time.sleep(0.05)  # let the watcher record a violation that killed it
                    if self.violation or self.cgroup is not None and self._over_limit():
                        raise Fatal(self.violation)
                    code = self.proc.wait()
                    if self.kind == "bwrap" and code > 128:  # bwrap exits 128 + N when its child died of signal N
                        code = 128 - code
                    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
                    raise Fatal(f"the grading process {how} (did the submission call exit, or run out of CPU time?)")
                self.buffer += chunk

    def send_plan(self, units: list[Unit], watch: list[str] = (), deadline: float = math.inf) -> None:
        """Every unit in one frame, before any of them runs: tests compiled here, never as text; ``watch``: the
        library's reference answers whose reads by the student's code the child notes."""
        self.nonces = [secrets.token_hex(16) for _ in units]
        # a probe's calls follow its "go" byte instead: unseen until every cell of the student's has run
        self.late = {k: json.loads(u.source) for k, u in enumerate(units) if u.kind == "probe"}
        plan = [{"name": u.name, "nonce": n, **({"code": _compiled(u)} if u.kind == "test" else
                                                 {"late": True} if u.kind == "probe" else {"source": u.source}),
                 **({"student": True} if u.kind == "answer" else {})}
                for u, n in zip(units, self.nonces)]
        self._write(frame({"units": plan, "watch": list(watch)}), deadline)

    def _write(self, data: bytes, deadline: float) -> None:
        """Write to the child's control pipe by ``deadline`` (Fatal 'timeout' past it: a child that stops reading it,
        or shrinks it, cannot hold the grader); Interrupted once ``stop`` is set; a child gone: receive() says how."""
        view, fd = memoryview(data), self.proc.stdin.fileno()
        while view:
            if self.stop is not None and self.stop.is_set():
                raise Interrupted("grading was interrupted")
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise Fatal("timeout")
            try:
                if select.select([], [fd], [], min(wait, 0.1))[1]:
                    view = view[os.write(fd, view):]
            except BlockingIOError:
                continue
            except (OSError, ValueError):
                return

    def run(self, k: int, deadline: float) -> Outcome:
        """Let unit ``k`` of the plan run; wait for its answer until ``deadline``."""
        self.output = 0
        before = self._processes()
        self._write(b"g" + (frame({"calls": self.late[k]}) if k in self.late else b""), deadline)
        reply = self.receive(deadline)
        if reply.get("seq") != k or reply.get("nonce") != self.nonces[k] or not isinstance(reply.get("ok"), bool):
            raise Fatal(TAMPERED)
        # The unit that leaves a crowd of processes behind is the one to blame, however late the
        # watcher (a thread polling every watch_every s, later on a busy machine) would have looked: checked
        # here, before the next unit starts, a regrade blames the same unit; and a crowd still growing
        # when the unit returns (a fork bomb's children still forking) is waited for first.
        self._settle(before)
        if self.violation or self._over_limit():
            raise Fatal(self.violation)
        error = str(reply.get("error", ""))[:1000]
        if k in self.late and not reply["ok"]:  # the sandbox's text, where it has seen the calls
            error = probe.failed(error)
        return Outcome(reply["ok"], error, values=reply.get("values"), used=_used(reply))


def _used(reply: dict[str, Any]) -> list[tuple[str, int, str]]:
    """The reads of reference answers a reply reports, those of the right types (the submission may write anything)."""
    used = reply.get("used")
    return [(str(u[0])[:200], u[1], str(u[2])[:200]) for u in (used if isinstance(used, list) else [])[:20]
            if isinstance(u, list) and len(u) == 3 and type(u[1]) is int and all(isinstance(x, str) for x in u[::2])]


def _reap_children(processes: set[tuple[int, int]], skip: int, patience: float = 1.0) -> None:
    """Collect the exit status of those (pid, start time) that are this process's children: a submission's
    clone(CLONE_PARENT) processes are, and killed they stay zombies of the grader until reaped. The start
    time guards against a reused pid (another sandbox's own process, whose status its Popen must get)."""
    waiting = {pid for pid, start in processes if pid != skip and _start_time(pid) == start and start}

    def reaped() -> bool:
        for pid in list(waiting):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not ours (or already collected)
                done = pid
            if done:
                waiting.discard(pid)
        return not waiting

    cgroups.until(reaped, patience)


def _stat_fields(pid: int | str) -> list[bytes]:
    """The fields of /proc/PID/stat after the command name, state first ([] if the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _start_time(pid: int) -> int:
    """The start time of process ``pid`` in clock ticks (0 if it is gone), zombies included."""
    fields = _stat_fields(pid)
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else 0


@functools.lru_cache(maxsize=256)
def _compiled(unit: Unit) -> str:
    """A test unit as base64 marshalled bytecode (the master's code, so compiling it here is safe)."""
    return base64.b64encode(marshal.dumps(compile(unit.source, f"<{unit.name}>", "exec"))).decode("ascii")


def _proc_stats() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, session id, start time) for every process now listed in /proc."""
    out = {}
    for name in os.listdir("/proc"):
        rest = _stat_fields(name) if name.isdigit() else []
        if len(rest) > 19 and rest[0] != b"Z":
            out[int(name)] = (int(rest[1]), int(rest[3]), int(rest[19]))
    return out


def _rss_bytes(pid: int) -> int:
    """Resident set size of a process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def run_units(units: list[Unit], notebook: bytes, limits: Limits = Limits(), numba_cache: Path | None = None,
              warm: bool = False, sandbox: str = "auto", stop: threading.Event | None = None,
              watch: list[str] = ()) -> Report:
    """Run the units in order in sandboxed children; after a fatal error, restart and go on without it.

    ``numba_cache`` holds the library's compiled kernels: a submission gets a private copy (so it
    cannot plant code for the next one), and the instructor's own run (``warm=True``) fills it.

    A restarted child re-runs the earlier code units (not the tests) so later parts see the same
    definitions; at most :data:`MAX_RESTARTS` restarts, then the rest is marked not run. Once ``stop``
    is set, the sandbox is killed and :class:`Interrupted` raised. ``watch``: see :meth:`Child.send_plan`.
    """
    kind, _ = choose(sandbox)
    uid = sandbox_uid(kind)  # one per submission, kept across restarts
    report = Report([Outcome() for _ in units])
    start = time.monotonic()
    shm_before = _shm_entries()
    own_shm = kind == "bwrap"
    skip: set[int] = set()
    i, restarts = 0, 0
    while i < len(units):
        scratch = scratch_dir()
        child: Child | None = None
        current = -1
        try:
            (scratch / "submission.ipynb").write_bytes(notebook)
            kernels = scratch / "numba-cache"
            if numba_cache is not None and (warm or kind == "bwrap"):
                kernels = numba_cache  # bound read-only under bwrap unless warm: the child copies it
            elif numba_cache is not None and numba_cache.is_dir():
                shutil.copytree(numba_cache, kernels)
            kernels.mkdir(parents=True, exist_ok=True)
            if warm and uid:  # the instructor's run writes the compiled kernels as the sandbox's user
                os.chown(kernels, uid, uid)
            child = Child(scratch, limits, kernels, warm, kind, stop, uid)
            try:
                hello = child.receive(time.monotonic() + 60)
            except Fatal as exc:
                tail = child.tail.decode("utf-8", "replace").strip().splitlines()
                raise SandboxError(f"the grading sandbox did not start ({exc}; {tail[-1] if tail else 'no output'})") from None
            own_shm = own_shm or bool(hello.get("private_shm"))
            if restarts == 0:
                report.notes.append(_describe_isolation(kind, hello, child.cgroup, limits))
            # the earlier code units replayed (all but those that stopped a child), then the rest
            plan = [j for j in range(i) if units[j].kind in ("code", "answer") and j not in skip] + list(range(i, len(units)))
            child.send_plan([units[j] for j in plan], watch, min(time.monotonic() + limits.cell_s, start + limits.wall_s))
            for k, j in enumerate(plan):
                current = j
                outcome = child.run(k, min(time.monotonic() + limits.cell_s, start + limits.wall_s))
                if j >= i:
                    report.outcomes[j] = outcome
                    i = j + 1
        except Fatal as exc:
            reason = _timeout_reason(start, limits) if str(exc) == "timeout" else str(exc)
            skip.add(current)
            if current == i:
                report.outcomes[i] = Outcome(False, f"stopped: {reason}")
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
            report.outcomes[i:] = [Outcome(False, "not run: the submission stopped the grader too often "
                                                  "(time, memory, processes or exit)") for _ in units[i:]]
            break
    return report


def _timeout_reason(start: float, limits: Limits) -> str:
    if time.monotonic() - start >= limits.wall_s - 0.05:
        return f"time limit of {limits.wall_s:g} s for the whole submission exceeded"
    return f"time limit of {limits.cell_s:g} s per cell exceeded (an infinite loop?)"


def _describe_isolation(kind: str, hello: dict[str, Any], cgroup: cgroups.Cgroup | None, limits: Limits) -> str:
    abi = hello.get("landlock", 0)
    files = (f"Landlock ABI {abi}" if abi else "no Landlock") + (
        "; seccomp (no keyrings, AF_VSOCK, io_uring)" if hello.get("seccomp") else "; no seccomp filter")
    group = (f"{cgroups.kind()} (pids.max {limits.max_procs}, memory {limits.memory_mb} MB)"
             if cgroup is not None else "no cgroup")
    if kind == "bwrap":
        user = f"uid {hello['uid']}" if hello.get("uid") else "uid 0 (root)"
        return f"isolation: bubblewrap (PID, mount, network, IPC namespaces; own /proc); {user}; {files}; {group}"
    return (f"isolation: process watcher; files {files}; network namespace {'yes' if hello.get('netns') else 'no'}; "
            f"private /dev/shm {'yes' if hello.get('private_shm') else 'no'}; {group}")


def _shm_entries() -> set[str]:
    try:
        return set(os.listdir(SHM))
    except OSError:
        return set()


def _unlink_new_shm(before: set[str]) -> None:
    """Unlink /dev/shm entries that appeared during the submission (segments, semaphores)."""
    for name in _shm_entries() - before:
        with contextlib.suppress(OSError):
            (SHM / name).unlink()

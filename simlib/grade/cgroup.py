"""A cgroup per submission: at most ``--max-procs`` tasks, ``--memory-mb`` for all its processes together,
and every process in it killed at teardown.

Used as root wherever the kernel offers a writable hierarchy with the ``pids`` and ``memory``
controllers (:func:`layout`, probed once): cgroup v2 (one unified hierarchy; ``pids.max``,
``memory.max``, teardown by ``cgroup.kill``) or cgroup v1 (the ``pids`` and ``memory`` hierarchies;
teardown freezes the ``freezer`` hierarchy's copy, where mounted, SIGKILLs every pid in
``cgroup.procs`` and thaws). Each submission's cgroup is made under the grader's own, and its
launcher (:meth:`Cgroup.launcher`) writes its own pid into ``cgroup.procs`` before it execs the
sandbox, so every process of the submission, however forked, is born inside it. Unlike the
watcher's polling, the kernel refuses the fork past the limit (``pids.events`` counts it) and
the OOM killer acts on the sum (``oom_kill`` counts it); :meth:`Cgroup.violation` turns either
count into a one-line reason naming the flag.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

PREFIX = "simlib-grade-"
FREEZE_S = 2.0  # how long to wait for a freeze, then for the cgroup to empty
_serial = itertools.count()
# per cgroup version: the freezer's state file, its frozen and thawed values, the file that shows it frozen and the text
FREEZER = {2: ("cgroup.freeze", "1", "0", "cgroup.events", "frozen 1"),
           1: ("freezer.state", "FROZEN", "THAWED", "freezer.state", "FROZEN")}


@dataclass(frozen=True)
class Layout:
    """Where submissions' cgroups go: cgroup ``version`` 1 or 2, and the grader's own cgroup folder per
    hierarchy ('unified' for v2; 'pids', 'memory' and, if mounted, 'freezer' for v1)."""

    version: int
    parents: dict[str, Path]


def _own_paths(text: str) -> dict[str, str]:
    """/proc/self/cgroup -> {controller: path}; the v2 line ('0::/path') under 'unified'."""
    out = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.update(dict.fromkeys(parts[1].split(",") if parts[1] else ["unified"], parts[2]))
    return out


def _mounts(text: str) -> dict[str, tuple[str, str]]:
    """/proc/self/mountinfo -> {controller: (mount point, root of the mount in its hierarchy)}."""
    out: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point = fields[3], fields[4].replace("\\040", " ")
        for name in ["unified"] if tail[0] == "cgroup2" else tail[2].split(",") if tail[0] == "cgroup" else []:
            out.setdefault(name, (point, root))
    return out


def _folder(controller: str, own: dict[str, str], mounts: dict[str, tuple[str, str]]) -> Path | None:
    """The grader's own cgroup folder in ``controller``'s hierarchy, if it is mounted and visible here."""
    if controller not in own or controller not in mounts:
        return None
    point, root = mounts[controller]
    if os.path.commonpath([own[controller], root]) != root:  # not below the mount's root: not visible here
        return None
    folder = Path(point) / os.path.relpath(own[controller], root)
    return folder if folder.is_dir() else None


def _sweep(parent: Path) -> None:
    """Remove empty cgroups left by a grader that died (their names carry its pid)."""
    for entry in parent.glob(PREFIX + "*"):
        pid = entry.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                entry.rmdir()


def _probe(version: int, parents: dict[str, Path]) -> tuple[Layout | None, str]:
    """(the layout, '') if a child cgroup can be made and removed in every hierarchy, else (None, why not)."""
    for parent in parents.values():
        _sweep(parent)
        probe = parent / f"{PREFIX}{os.getpid()}-probe-{secrets.token_hex(4)}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            return None, f"cannot create a cgroup under {parent} ({exc.strerror})"
    return Layout(version, parents), ""


def _v2(own: dict[str, str], mounts: dict[str, tuple[str, str]]) -> tuple[Layout | None, str]:
    folder = _folder("unified", own, mounts)
    if folder is None:
        return None, "no cgroup v2 hierarchy"
    try:
        available = (folder / "cgroup.controllers").read_text().split()
        enabled = (folder / "cgroup.subtree_control").read_text().split()
    except OSError as exc:
        return None, f"cgroup v2 unreadable ({exc.strerror})"
    missing = [c for c in ("pids", "memory") if c not in available]
    if missing:
        return None, f"cgroup v2 lacks the {' and '.join(missing)} controller"
    wanted = [c for c in ("pids", "memory") if c not in enabled]
    if wanted:
        try:
            (folder / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
        except OSError as exc:  # EBUSY: the grader's cgroup holds processes, so it cannot delegate
            return None, (f"cgroup v2: cannot enable pids and memory for children of {folder} ({exc.strerror}; "
                          "run the grader in a cgroup of its own, e.g. systemd-run --scope -p Delegate=yes)")
    return _probe(2, {"unified": folder})


def _v1(own: dict[str, str], mounts: dict[str, tuple[str, str]]) -> tuple[Layout | None, str]:
    parents = {c: _folder(c, own, mounts) for c in ("pids", "memory", "freezer")}
    missing = [c for c in ("pids", "memory") if parents[c] is None]
    if missing:
        return None, f"no cgroup v1 {' or '.join(missing)} hierarchy"
    return _probe(1, {c: p for c, p in parents.items() if p is not None})


@functools.lru_cache(maxsize=None)
def layout() -> tuple[Layout | None, str]:
    """(where submissions' cgroups go, '') or (None, why no cgroup can be made here); probed once."""
    if not os.path.exists("/proc/self/cgroup"):
        return None, "this system has no cgroups"
    if os.geteuid() != 0:
        return None, "the grader is not running as root"
    try:
        own = _own_paths(Path("/proc/self/cgroup").read_text())
        mounts = _mounts(Path("/proc/self/mountinfo").read_text())
    except OSError as exc:
        return None, f"cgroups unreadable ({exc.strerror})"
    found, why = _v2(own, mounts)
    if found is None:  # v1's reason, unless it has no v1 hierarchy either
        found, why1 = _v1(own, mounts)
        why = why if why1.startswith("no cgroup v1") else why1
    return found, why


def problem() -> str:
    """'' if each submission gets a cgroup, else why not (one phrase)."""
    return layout()[1]


def kind() -> str:
    """'cgroup v1', 'cgroup v2' or 'no cgroup': part of what a grade depends on."""
    found = layout()[0]
    return f"cgroup v{found.version}" if found is not None else "no cgroup"


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _field(path: Path, key: str) -> int:
    """The number after ``key`` in a 'key value' file (pids.events, memory.events, memory.oom_control)."""
    for line in _read(path).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return 0


def _number(path: Path) -> int:
    text = _read(path).strip()
    return int(text) if text.isdigit() else 0


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


class Cgroup:
    """One submission's cgroup (one folder per hierarchy): created with its limits, removed by :meth:`remove`."""

    def __init__(self, found: Layout, max_procs: int, memory_mb: int):
        self.layout, self.max_procs, self.memory_mb = found, max_procs, memory_mb
        name = f"{PREFIX}{os.getpid()}-{next(_serial)}-{secrets.token_hex(4)}"
        self.dirs = {c: parent / name for c, parent in found.parents.items()}
        self.pids = self.dirs.get("pids", self.dirs.get("unified"))
        self.memory = self.dirs.get("memory", self.dirs.get("unified"))
        v2, limit = found.version == 2, str(memory_mb * 1024 * 1024)
        try:
            for folder in self.dirs.values():
                folder.mkdir()
            (self.pids / "pids.max").write_text(str(max_procs))
            (self.memory / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(limit)
            # no swap beyond the limit (v1: where swap is accounted)
            _write(self.memory / ("memory.swap.max" if v2 else "memory.memsw.limit_in_bytes"), "0" if v2 else limit)
        except OSError:
            self.remove()  # those made (the others are gone already)
            raise

    def launcher(self, cmd: list[str]) -> list[str]:
        """``cmd`` behind a shell that joins this cgroup (every hierarchy) and then execs it."""
        procs = [str(d / "cgroup.procs") for d in self.dirs.values()]
        script = ('n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n - 1)); done; '
                  'exec "$@"')
        return ["/bin/sh", "-c", script, "simlib-grade", str(len(procs)), *procs, *cmd]

    def members(self) -> list[int]:
        """Pids of the processes now in the cgroup."""
        return [int(p) for p in _read(self.pids / "cgroup.procs").split() if p.isdigit()]

    def _oom_kills(self) -> int:
        """Processes the memory limit killed (memory.events, or v1's memory.oom_control)."""
        return _field(self.memory / ("memory.events" if self.layout.version == 2 else "memory.oom_control"), "oom_kill")

    def stats(self) -> dict[str, int]:
        """Peak and current tasks, forks refused by pids.max, processes killed by the memory limit, peak bytes."""
        peak = "memory.peak" if self.layout.version == 2 else "memory.max_usage_in_bytes"
        return {"pids_peak": _number(self.pids / "pids.peak"), "pids_current": _number(self.pids / "pids.current"),
                "pids_refused": _field(self.pids / "pids.events", "max"), "oom_kills": self._oom_kills(),
                "memory_peak": _number(self.memory / peak)}

    def violation(self) -> str:
        """A one-line reason if the submission hit pids.max or the memory limit, else ''."""
        if self._oom_kills():
            return (f"its processes together used more than {self.memory_mb} MB "
                    "(--memory-mb, the cgroup's memory limit, killed one)")
        if _field(self.pids / "pids.events", "max"):
            return (f"tried to run more than {self.max_procs} processes at once "
                    "(--max-procs, the cgroup's pids.max; a fork bomb?)")
        return ""

    def kill(self) -> None:
        """SIGKILL every process in the cgroup at once (cgroup.kill, or freeze, kill, thaw), until it is empty."""
        deadline = time.monotonic() + FREEZE_S
        until(lambda: self._kill_once(deadline) or not self.members(), FREEZE_S)

    def _kill_once(self, deadline: float) -> None:
        """cgroup.kill (v2, kernels from 5.14), else: freeze where a freezer is (so nothing forks between the listing
        and the kill), SIGKILL every member, thaw so they die."""
        v2 = self.layout.version == 2
        if v2 and _write(self.pids / "cgroup.kill", "1"):
            return
        folder = self.pids if v2 else self.dirs.get("freezer")
        state, freeze, thaw, shows, frozen = FREEZER[self.layout.version]
        if folder is not None and _write(folder / state, freeze):
            until(lambda: frozen in _read(folder / shows), deadline - time.monotonic(), 0.002)
        for pid in self.members():
            signal_quietly(pid, signal.SIGKILL)
        if folder is not None:
            _write(folder / state, thaw)

    def remove(self) -> None:
        """Kill whatever is left in the cgroup and remove it from every hierarchy."""
        self.kill()
        for folder in self.dirs.values():
            until(lambda: _rmdir(folder), FREEZE_S, 0.01)  # it fails while its last processes are being released


def _rmdir(folder: Path) -> bool:
    """Remove a cgroup folder; whether it is gone."""
    try:
        folder.rmdir()
    except OSError as exc:
        return isinstance(exc, FileNotFoundError)
    return True


def until(done: Callable[[], Any], seconds: float, step: float = 0.005) -> bool:
    """Call ``done`` every ``step`` s until it returns true (True) or ``seconds`` have passed (False)."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def signal_quietly(pid: int, sig: int) -> None:
    """Send a signal to a process that may already be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def create(max_procs: int, memory_mb: int) -> Cgroup | None:
    """A fresh cgroup with these limits, or None where none can be made (see :func:`problem`)."""
    found = layout()[0]
    return Cgroup(found, max_procs, memory_mb) if found is not None else None

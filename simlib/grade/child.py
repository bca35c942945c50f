"""The sandboxed side of :mod:`simlib.grade.sandbox`: confine this process, then run cells sent over stdin.

Started by the grader (inside bubblewrap, or alone under the watcher) with a JSON config as its one
argument. It imports what every assignment needs, then, before any submitted code runs: limits its
address space, CPU time and file sizes; cuts off the network (a fresh network namespace where
permitted, Landlock's TCP rules, and a refusal of AF_INET/AF_INET6 sockets); confines the
filesystem with Landlock (read-only: Python, its packages, the ``simlib`` package, system
libraries; read-write: the scratch directory and /dev/shm); and installs a seccomp filter
(:func:`syscall_filter`: no kernel keyrings, no program started, no AF_VSOCK sockets, no io_uring). Then it reads the
whole plan (every
unit, tests as compiled code) in one frame, moves the control pipe off stdin (which becomes
/dev/null), and runs unit after unit, each on a "go" byte, answering each on the result pipe with
ok or the error's type and message and the unit's nonce. A probe unit's calls (:mod:`simlib.grade.probe`)
come after its "go" byte, once every cell has run; its answer carries their plain values. Each answer also
says where the student's code read one of the library's reference answers (:func:`know`), however its
name was built (``importlib.import_module("simlib." + "protocol")``, ``__import__``, ``getattr`` chains),
and where the student's code ran one (:func:`_profile`), however it was reached (``vars(module)[...]``,
``sys.modules[...].__dict__``, ``globals()``, the garbage collector, a clone of its code, another library
function): while the student's cells and the grader's calls run, a profile hook notes each call into a
reference's code objects, and each reply to a call lists the references that ran during it, which the
grader compares with the master's replies (:func:`simlib.grade.gradebook.flags`). A reference keyword
(``staleness_aware``) counts where a library function takes it as True, and where library code that reads
it as an attribute runs on an object that has it True, however that object was made (the student's class
borrowing ``StepRule.scale``, a rule's fields copied onto a fresh object). Processes the submission forks
inherit the hook and send what they note up a pipe (:func:`_up`), which each reply takes in first; there, where no
reply checks the hook, it is checked at every audited event and at ``os._exit``, and ``ctypes`` used by the student's
code counts as removing it (:func:`_watch_forks`).
"""
from __future__ import annotations

import base64
import _thread
import contextlib
import builtins
import ctypes
import errno
import fcntl
import functools
import importlib
import inspect
import json
import marshal
import os
import platform
import posix
import shutil
import signal
import resource
import select
import socket
import struct
import sys
import sysconfig
import threading
import types
from multiprocessing import resource_tracker
from typing import Any

from simlib.grade import probe

PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 38, 36
CLONE_NEWNET, CLONE_NEWNS = 0x40000000, 0x00020000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 2, 4, 1 << 14, 1 << 18
SYS_LANDLOCK = {"create": 444, "add": 445, "restrict": 446}
# Landlock filesystem rights (ABI 1..5), network rights (ABI 4) and scopes (ABI 6).
FS_FILE = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)  # execute, write, read, truncate, ioctl
FS_READ = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read file, read dir
FS_BITS = {1: 13, 2: 14, 3: 15, 4: 15}  # ABI -> how many filesystem rights it has (16 from ABI 5 on)
NET_TCP = 1 | 2  # bind, connect
SCOPES = 1 | 2  # abstract unix sockets, signals to processes outside the sandbox
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # seccomp_data.arch of each machine's native calls
SYSCALLS = {"x86_64": {"socket": 41, "add_key": 248, "request_key": 249, "keyctl": 250, "execve": 59, "execveat": 322},
            "aarch64": {"socket": 198, "add_key": 217, "request_key": 218, "keyctl": 219, "execve": 221,
                        "execveat": 281}}
IO_URING = (425, 426, 427)  # io_uring_setup, _enter, _register: one number on every machine
X32_BIT, AF_VSOCK = 0x40000000, 40
MESSAGE_CHARS = 600
MAX_FRAME = 1 << 20  # the grader refuses larger replies
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long


def landlock(read_only: list[str], read_write: list[str], rw_files: list[str]) -> int:
    """Confine this process (and its children) to the given paths; returns the ABI used (0 = unavailable)."""
    abi = LIBC.syscall(SYS_LANDLOCK["create"], None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return 0
    fs = (1 << FS_BITS.get(abi, 16)) - 1
    fields = [fs, NET_TCP, SCOPES][:1 + (abi >= 4) + (abi >= 6)]
    attr = struct.pack(f"{len(fields)}Q", *fields)
    ruleset = LIBC.syscall(SYS_LANDLOCK["create"], ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        return 0
    rules = [(path, FS_READ if os.path.isdir(path) else FS_READ & FS_FILE) for path in read_only]
    for path, access in rules + [(path, fs) for path in read_write] + [(path, FS_FILE) for path in rw_files]:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        rule = struct.pack("=Qi", access & fs, fd)
        LIBC.syscall(SYS_LANDLOCK["add"], ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.c_char_p(rule), ctypes.c_uint32(0))
        os.close(fd)
    confined = (LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
                and LIBC.syscall(SYS_LANDLOCK["restrict"], ctypes.c_int(ruleset), ctypes.c_uint32(0)) == 0)
    os.close(ruleset)  # on either outcome: the submission's code must not find it open
    return int(abi) if confined else 0


def syscall_filter(machine: str = platform.machine()) -> bytes | None:
    """The seccomp program (struct sock_filter[]: code, jt, jf, k) run on each system call: EPERM for the kernel
    keyrings (add_key, request_key, keyctl: not namespaced, so a key outlives the sandbox and reaches the next one
    with its uid), for execve and execveat (no program starts, so no fresh Python the call watch is not in: a
    ``subprocess`` of ``sys.executable``, ``multiprocessing`` under spawn or forkserver), for socket(AF_VSOCK, ...)
    (to the hypervisor: no network namespace holds it), for io_uring (which opens sockets past this filter) and for
    calls of another ABI (x32, int 0x80); anything else runs. None on a machine whose numbers it does not know."""
    if machine not in SYSCALLS:
        return None
    nr = SYSCALLS[machine]
    load, equal, at_least, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    code = [(load, 0, 0, 4), (equal, 0, "deny", AUDIT_ARCH[machine]), (load, 0, 0, 0), (at_least, "deny", 0, X32_BIT)]
    code += [(equal, "deny", 0, nr[name]) for name in ("add_key", "request_key", "keyctl", "execve", "execveat")]
    code += [(equal, "deny", 0, n) for n in IO_URING]
    code += [(equal, 0, "allow", nr["socket"]), (load, 0, 0, 16), (equal, "deny", "allow", AF_VSOCK)]  # args[0]: int
    code += [(ret, 0, 0, 0x7FFF0000), (ret, 0, 0, 0x00050000 | errno.EPERM)]  # SECCOMP_RET_ALLOW, _ERRNO | EPERM
    where = {"allow": len(code) - 2, "deny": len(code) - 1}
    return b"".join(struct.pack("=HBBI", op, *(where[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)), k)
                    for i, (op, jt, jf, k) in enumerate(code))


def seccomp(program: bytes | None) -> bool:
    """Install the filter on this process and every process it starts from now (no new privileges first)."""
    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    zero = ctypes.c_ulong(0)
    return program is not None and LIBC.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), zero, zero, zero) == 0 and (
        LIBC.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(Program(len(program) // 8, program)),
                   zero, zero) == 0)


def limit_resources(cfg: dict[str, Any]) -> None:
    """Address space, CPU seconds, file size, no core dumps (processes: the grader counts them)."""
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cfg["memory_mb"] * mb, cfg["memory_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_mb"] * mb, cfg["file_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def private_shm() -> bool:
    """A fresh tmpfs on /dev/shm in a new mount namespace (root only): segments vanish with the sandbox."""
    return (LIBC.unshare(CLONE_NEWNS) == 0 and LIBC.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0
            and LIBC.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1g,mode=1777") == 0)


def refuse(event: str, args: tuple) -> None:
    """Audit hook: no IPv4/IPv6 sockets (Unix sockets, used by multiprocessing, stay allowed), and no subinterpreter
    (``_xxsubinterpreters``: a fresh interpreter in this process, which the call watch is not in)."""
    if event == "socket.__new__" and len(args) > 1 and args[1] in (socket.AF_INET, socket.AF_INET6):
        raise PermissionError("network access is disabled while grading")
    if event == "cpython.PyInterpreterState_New":
        raise PermissionError("new interpreters are disabled while grading")


def read_frame(fd: int) -> Any:
    """One length-prefixed JSON frame, or None at end of input."""
    head = read_exact(fd, 4)
    body = None if head is None else read_exact(fd, int.from_bytes(head, "big"))
    return None if body is None else json.loads(body.decode("utf-8"))


def read_exact(fd: int, n: int) -> bytes | None:
    """Exactly n bytes from a pipe, or None if it closes first."""
    data = bytearray()
    while len(data) < n:
        chunk = _READ(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def frame(obj: Any) -> bytes:
    """One length-prefixed JSON frame (both ways: the grader's plan, the child's replies)."""
    data = json.dumps(obj).encode("utf-8")
    return struct.pack(">I", len(data)) + data


def describe(exc: BaseException) -> str:
    """'Type: message', shortened; no traceback, so test code is never echoed."""
    try:
        text = f"{type(exc).__name__}: {exc}".strip().removesuffix(":")
    except BaseException:  # noqa: BLE001 - a hostile __str__
        text = type(exc).__name__
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + " ..."


def private_control(fd: int) -> int:
    """Move the control pipe to a high, close-on-exec descriptor and put /dev/null on ``fd``."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 200)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, fd)
    os.close(null)
    return moved


class Watched(types.ModuleType):
    """A library module whose reads of the reference answers (:func:`know`) by the student's code are noted."""

    def __getattribute__(self, name: str) -> Any:
        value = types.ModuleType.__getattribute__(self, name)
        ref = WATCHED.get(id(self), {}).get(name)
        if ref is not None:
            _note(sys._getframe(1), ref)
        return value


WATCHED: dict[int, dict[str, str]] = {}  # id(module) -> {name there: the reference it holds ('simlib.protocol.may_read')}
NOTED: dict[tuple[str, int, str], None] = {}  # (file, line, reference) of the student's reads, in order, until sent
MASTER_FILES: set[str] = set()  # the code names of the master's units ('<setup>'), whose reads are not noted
MAX_NOTED = 20
_STDLIB = tuple(os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib"))


def _asker(frame: types.FrameType | None) -> types.FrameType | None:
    """The first frame from ``frame`` outward that is not the standard library's (getattr chains through importlib,
    operator, inspect; functools' wrappers)."""
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen ") or (
            frame.f_code.co_filename.startswith(_STDLIB) and "-packages" not in frame.f_code.co_filename)):
        frame = frame.f_back
    return frame


def _note(start: types.FrameType | None, ref: str) -> None:
    """Note a read or a run of ``ref`` when the code that asked for it, from frame ``start`` outward (the standard
    library passed over), is the student's."""
    frame = _asker(start)
    if frame is not None and _mine(frame) and len(NOTED) < MAX_NOTED:
        key = (frame.f_code.co_filename[:200], frame.f_lineno, ref)
        if key not in NOTED:
            NOTED[key] = None
            _up(["used", *key])


UP: list[int] = []  # [the serving process's pid, the read end, the write end] of the pipe forked processes note into


def _up(record: list[Any]) -> None:
    """In a process the submission forked (os.fork, multiprocessing), where the hook runs on but its notes would die
    with it: send a note up to the serving process, one line no longer than a pipe writes whole."""
    if UP and os.getpid() != UP[0]:
        line = json.dumps(record).encode() + b"\n"
        with contextlib.suppress(OSError):  # the pipe full, or closed by the submission
            if len(line) <= select.PIPE_BUF:
                _WRITE(UP[2], line)


def _gather() -> None:
    """Take in the notes forked processes sent up (:func:`_up`): reads into NOTED, references run into RAN."""
    data = b""
    for _ in range(16) if UP else ():
        try:
            chunk = _READ(UP[1], 65536)
        except OSError:  # empty (non-blocking), or closed by the submission
            break
        data += chunk
    for line in data.splitlines():
        with contextlib.suppress(ValueError, TypeError, LookupError):  # a line the submission wrote may be anything
            kind, *rest = json.loads(line)
            if kind == "used" and len(NOTED) < MAX_NOTED:
                NOTED[tuple(rest)] = None
            elif kind == "ran" and len(RAN) < MAX_NOTED:
                RAN.setdefault(rest[0], (rest[1], rest[2]))


# The hook's own functions and the channel's, taken before any submitted code runs (a submission may replace
# sys.setprofile, or os.write to strip what a reply says it used).
_SETPROFILE, _GETPROFILE, _THREAD_SETPROFILE = sys.setprofile, sys.getprofile, threading.setprofile
_READ, _WRITE, _EXIT, _SIGNAL = os.read, os.write, os._exit, signal.signal
_START_THREAD = _thread.start_new_thread
_THREAD_START = threading.Thread._bootstrap_inner.__code__  # where a thread of threading's sets its profile hook
REF_CODES: dict[int, tuple[types.CodeType, str]] = {}  # id(code object) -> (it, the reference whose code it is, or
# the reference keyword it takes)
REF_OBJECTS: dict[int, tuple[Any, str]] = {}  # id(reference) -> (it, its dotted name)
REF_PRINTS: dict[tuple, str] = {}  # a reference function's code, as compared (:func:`_fingerprint`) -> its name
REF_SIZES: set[int] = set()  # the lengths of their bytecode: a code object of another length is no copy
CALLED: dict[int, tuple[types.CodeType, str | None]] = {}  # id(code) -> (it, _reference_of(it)), for the code called
RAN: dict[str, tuple[str, int]] = {}  # the references run since the last reset -> the student's (file, line) or ('', 0)
TAMPER = "sys.setprofile"  # noted where the submission replaces or removes the profile hook


def _resolve(ref: str) -> Any:
    """The object a dotted name names: its longest importable module, then attributes ('simlib.protocol.Clocks.may_read')."""
    parts = ref.split(".")
    for k in range(len(parts) - 1, 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        return functools.reduce(getattr, parts[k:], module)
    raise LookupError(ref)


def _codes(obj: Any) -> list[types.CodeType]:
    """The code objects that calling ``obj`` runs first: a function's (a jitted one's Python), a class's own methods'."""
    if isinstance(obj, type):
        found = [getattr(v, "__func__", getattr(v, "fget", v)) for v in vars(obj).values()]
        return [f.__code__ for f in found if isinstance(getattr(f, "__code__", None), types.CodeType)]
    code = getattr(getattr(obj, "py_func", obj), "__code__", None)
    return [code] if isinstance(code, types.CodeType) else []


def _fingerprint(code: types.CodeType) -> tuple:
    """What two compilations of one function's source share (bytecode, constants, names), whatever the file name."""
    consts = tuple(_fingerprint(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts)
    return code.co_code, consts, code.co_names, code.co_varnames


def know(refs: list[str]) -> None:
    """Resolve the references (again when modules were loaded): their objects, code objects and fingerprints, for
    :func:`_profile` and :func:`named`; for a keyword ('staleness_aware'), the code of every library function and class
    that takes it. Then watch every library module that holds one of the objects, under any name (:class:`Watched`):
    the library's reference answers, read at run time by name."""
    for ref in [r for r in refs if "." in r]:
        with contextlib.suppress(Exception):  # a reference the library no longer has is nothing to watch
            obj = _resolve(ref)
            REF_OBJECTS[id(obj)] = (obj, ref)
            for code in _codes(obj):
                REF_CODES[id(code)] = (code, ref)
                REF_PRINTS[_fingerprint(code)] = ref
                REF_SIZES.add(len(code.co_code))
    keywords = {r for r in refs if "." not in r}  # with the code of each library function taking or reading one
    for module in [m for name, m in list(sys.modules.items()) if name.split(".")[0] == "simlib"]:
        with contextlib.suppress(Exception):  # an entry the submission put there need not be a module
            found = {k: REF_OBJECTS[id(v)][1] for k, v in list(vars(module).items()) if id(v) in REF_OBJECTS}
            if found and type(module) in (types.ModuleType, Watched):
                WATCHED[id(module)] = found
                module.__class__ = Watched
        for obj in list(vars(module).values()) if keywords else []:
            for code in _codes(obj) if getattr(obj, "__module__", None) == module.__name__ else []:
                taken = keywords & set(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
                taken |= keywords & set(code.co_names) if code.co_argcount else set()
                REF_CODES.update({id(code): (code, min(taken))} if taken else {})
    CALLED.clear()  # what was no reference before may be one now


def _mine(frame: types.FrameType) -> bool:
    """Whether a frame runs the student's code: not a file's (the library, the standard library: a module imported
    from that very file, whose globals it runs in; a file name alone is any name given to compile), not a master's unit,
    not code a module made for itself (a dataclass's __init__: its globals are a module's loaded from a file)."""
    name = frame.f_code.co_filename
    if name.startswith("<frozen ") or name in MASTER_FILES:
        return False
    module = sys.modules.get(frame.f_globals.get("__name__", ""))
    loaded = getattr(module, "__file__", None) if getattr(module, "__dict__", None) is frame.f_globals else None
    if name.startswith("/"):
        return not (isinstance(loaded, str) and (loaded == name or os.path.realpath(loaded) == os.path.realpath(name)))
    return not loaded


def _profile(frame: types.FrameType, event: str, arg: Any) -> None:
    """The profile hook: note a call into a reference's code (see :func:`_ran`), or of a library function with a
    reference keyword set True (``StepRule(**{"staleness" + "_aware": True})``), or a replacement of this hook.
    An exception raised in it (a signal handler's: a worker's SIGTERM) drops it; that is kept in RAISED, but for a
    RecursionError."""
    try:
        if event == "call":
            seen = CALLED.get(id(frame.f_code))
            if seen is None or seen[0] is not frame.f_code:
                seen = CALLED[id(frame.f_code)] = (frame.f_code, _reference_of(frame.f_code))
            if seen[1] is not None and ("." in seen[1] or _set(frame, seen[1])):
                _ran(frame.f_back, seen[1])
        elif event == "c_call" and arg is _SETPROFILE and frame.f_globals is not globals() and not (
                frame.f_code is _THREAD_START and threading._profile_hook is _profile):  # a thread taking the hook
            _ran(frame, TAMPER)
    except RecursionError:  # the recursion limit reached in here: a drop that a submission can cause at will
        raise
    except BaseException:
        RAISED[:] = [True]
        raise


RAISED: list[bool] = []  # [True] once an exception went through the hook, which CPython then drops (or a signal
# handler raised one, which may go through the hook as it starts, before its body can say so)


def _signal(signum: int, handler: Any) -> Any:
    """``signal.signal``, a Python handler wrapped to note in RAISED an exception it raises (a worker's SIGTERM)."""
    if not callable(handler):
        return _SIGNAL(signum, handler)

    @functools.wraps(handler)
    def noted(*args: Any) -> Any:
        try:
            return handler(*args)
        except BaseException:
            RAISED[:] = [True]
            raise

    return _SIGNAL(signum, noted)


def _reference_of(code: types.CodeType) -> str | None:
    """The reference (or keyword) whose code ``code`` is, or is a copy of, compiled from its source (the same
    bytecode, constants and names: :func:`_fingerprint`); else None. The profile hook asks once per code object."""
    known = REF_CODES.get(id(code))
    if known is not None and known[0] is code:
        return known[1]
    return REF_PRINTS.get(_fingerprint(code)) if len(code.co_code) in REF_SIZES else None


def _set(frame: types.FrameType, keyword: str) -> bool:
    """Whether a library function runs with a reference keyword set: passed True, or True on its first argument
    (``self``), or replaced there by a descriptor of the submission's (a property); looked up without running any
    of the submission's code."""
    if frame.f_locals.get(keyword) is True:
        return True
    try:
        value = inspect.getattr_static(frame.f_locals.get(frame.f_code.co_varnames[0]), keyword, None)
        return value is True or inspect.getattr_static(type(value), "__get__", None) is not None
    except Exception:  # noqa: BLE001 - the object is the submission's
        return False


def _ran(start: types.FrameType | None, ref: str) -> None:
    """A reference ran, called from frame ``start``: noted where the student's code called it (:func:`_note`); kept
    in RAN with the innermost student line on the stack, however many of the library's frames lie between."""
    _note(start, ref)
    if ref not in RAN:  # the frames past serve's are the child's start (``python -c``), nobody's code
        while start is not None and start.f_code is not serve.__code__ and not _mine(start):
            start = start.f_back
        start = None if start is not None and start.f_code is serve.__code__ else start
        RAN[ref] = ("", 0) if start is None else (start.f_code.co_filename[:200], start.f_lineno)
        _up(["ran", ref, *RAN[ref]])


def _reference_in(value: Any) -> tuple[str, types.CodeType | None] | None:
    """(reference, None) if ``value`` is a reference, wraps one (partial, bound method, __wrapped__) or runs a
    reference's own code; (reference, the copy) if it runs a copy of it (the same bytecode, constants and names,
    compiled from its source)."""
    for _ in range(8):
        if id(value) in REF_OBJECTS and REF_OBJECTS[id(value)][0] is value:
            return REF_OBJECTS[id(value)][1], None
        code = getattr(value, "__code__", None)
        if isinstance(code, types.CodeType):
            known = REF_CODES.get(id(code))
            if known is not None and known[0] is code:
                return known[1], None
            cloned = REF_PRINTS.get(_fingerprint(code))
            if cloned is not None:
                return cloned, code
        inner = getattr(value, "func", None) or getattr(value, "__func__", None) or getattr(value, "__wrapped__", None)
        if inner is None:
            return None
        value = inner
    return None


def named(calls: Any, namespace: dict[str, Any]) -> None:
    """Note each name the grader's calls look up in the notebook that is (or wraps, or copies) a reference."""
    for head in sorted(h for h in heads(calls) if h in namespace and not h.startswith("$")):
        with contextlib.suppress(Exception):  # the student's objects may raise on any attribute
            found = _reference_in(namespace[head])
            if found is not None and len(NOTED) < MAX_NOTED:
                ref, code = found
                where = (code.co_filename, code.co_firstlineno) if code is not None else (
                    f"the name {head!r} the grader calls", 0)
                NOTED[(*where, ref)] = None


def heads(arg: Any) -> set[str]:
    """The first part of each name a probe's calls look up ('$w' of '$w.array'), those in arguments included."""
    if isinstance(arg, list):
        return {h for a in arg for h in heads(a)}
    return {str(arg.get("call", arg.get("name", ""))).split(".")[0], *heads(arg.get("args", [])),
            *heads(list(arg.get("kwargs", {}).values()))} if isinstance(arg, dict) else set()


def _hook(on: bool, recursion: bool = False) -> None:
    """Install the profile hook (this thread and threads started from now), or remove it, noting if it was replaced,
    or removed where no RecursionError (``recursion``) explains it: CPython drops a profile hook that raises, as the
    call into it does at the recursion limit; a removal through ``sys.setprofile`` is noted as the call happens
    (:func:`_profile`), one through ``ctypes`` (``PyEval_SetProfile``) or a RecursionError caught is noted here."""
    if not on and _GETPROFILE() is not _profile and (_GETPROFILE() is not None or not recursion) \
            and len(NOTED) < MAX_NOTED:
        NOTED[("the submission's code", 0, TAMPER)] = None
    _SETPROFILE(_profile if on else None)
    _THREAD_SETPROFILE(_profile if on else None)


FORK: list[bool] = []  # in a process the submission forked: [whether the watch was on in the thread that forked]


def _forked() -> None:
    """``os.register_at_fork``'s hook in each new process: whether the watch it inherited was on."""
    FORK[:] = [_GETPROFILE() is _profile]


def _still_watched() -> None:
    """In a forked process that inherited the watch, which no reply checks (:func:`serve` does in its own): if it was
    removed (``ctypes``, a caught RecursionError), send that up (:func:`_up`) and put it back. Dropped by an exception
    that went through it (:data:`RAISED`: a SIGTERM's SystemExit, where a group stops its workers), it is put back."""
    if (UP and os.getpid() != UP[0] and FORK[:1] != [False] and threading.current_thread() is threading.main_thread()
            and _GETPROFILE() is not _profile):  # the thread that forked, not threads started since
        if not (RAISED and _GETPROFILE() is None):
            _up(["used", "the submission's code", 0, TAMPER])
        _SETPROFILE(_profile)


def _watch_forks(event: str, args: tuple) -> None:
    """Audit hook (no submission removes one): in a forked process, the watch is checked at each audited event, and
    ``ctypes`` used by the student's code (the tool that removes the watch unseen) counts as removing it."""
    if UP and os.getpid() != UP[0] and event != "sys.setprofile":  # which putting the watch back raises
        if event.startswith("ctypes.") and FORK[:1] != [False]:
            asker = _asker(sys._getframe(1))
            if asker is not None and _mine(asker):
                _up(["used", "the submission's code", 0, TAMPER])
        _still_watched()


def _exit(status: int) -> None:
    """``os._exit``, the watch checked first (:func:`_still_watched`): how forked processes end (multiprocessing too)."""
    _still_watched()
    _EXIT(status)


def _start_new_thread(function: Any, args: tuple, kwargs: dict | None = None) -> int:
    """``_thread.start_new_thread``, the new thread under the profile hook where the thread starting it is (a thread of
    ``threading``'s gets it from ``threading.setprofile``; one started by ``_thread`` itself would run unwatched)."""
    hooked = _GETPROFILE() is _profile

    def run(*a: Any, **k: Any) -> Any:
        if hooked:
            _SETPROFILE(_profile)
        return function(*a, **k)

    return _START_THREAD(run, args, kwargs or {})


def serve(plan: list[dict[str, Any]], control: int, result_fd: int, refs: list[str] = ()) -> None:
    """Run each unit of the plan in one namespace, like a kernel, when the grader says go."""
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    MASTER_FILES.update(f"<{u['name']}>" for u in plan if not u.get("student"))
    loaded = 0
    for seq in range(len(plan)):
        if _READ(control, 1) != b"g":
            return
        unit, plan[seq] = plan[seq], {}
        code = values = None
        if refs and len(sys.modules) != loaded:  # a module loaded since may hold a reference too
            know(refs)
            loaded = len(sys.modules)
        hooked = bool(REF_CODES) and bool(unit.get("student") or unit.get("late"))  # the student's code runs
        try:
            if hooked:
                _hook(True)
            if unit.get("late"):  # the grader's calls (see simlib.grade.probe): values back, no code of the tests
                kept: dict[str, Any] = {}  # the values this part's calls keep ('as'), for its later calls
                calls = (read_frame(control) or {}).get("calls", [])
                named(calls, namespace)
                values = [_answer(call, namespace, kept) for call in calls]
                del kept
            else:
                code = (marshal.loads(base64.b64decode(unit.pop("code"))) if "code" in unit
                        else compile(unit.pop("source"), f"<{unit['name']}>", "exec"))
                exec(code, namespace)
            ok, error, status = True, "", 0
        except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are the submission's too
            ok, error = False, describe(exc)
            status = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
        if UP and os.getpid() != UP[0]:  # a forked process unwound into this loop (sys.exit in a child, a worker's
            try:  # SIGTERM raised as it called os._exit): it ends here, and never replies as this process
                _exit(status)
            finally:
                _EXIT(status)
        if hooked:
            _hook(False, error.startswith("RecursionError"))
        reply = {"seq": seq, "nonce": unit["nonce"], "ok": ok, "error": error, "values": values}
        del code, unit
        with contextlib.suppress(BaseException):  # the submission may have closed or replaced stdout
            sys.stdout.flush()
        _gather()
        reply["used"] = [list(k) for k in NOTED]  # the reads noted since the last reply: [file, line, reference]
        NOTED.clear()
        data = frame(reply)
        if len(data) > MAX_FRAME:
            data = frame({**reply, "values": [], "ok": False, "error": probe.TOO_LARGE})
        _WRITE(result_fd, data)


def _answer(call: dict[str, Any], namespace: dict[str, Any], kept: dict[str, Any]) -> dict[str, Any]:
    """One call's reply (:func:`simlib.grade.probe.answer`), with the references that ran during it: [name, file, line]."""
    RAN.clear()
    reply = probe.answer(call, namespace, kept)
    if REF_CODES:  # the hook removed during the call is noted, and on again for the next call
        _hook(False, reply.get("error") == "RecursionError")
        _hook(True)
    _gather()
    if RAN:
        reply["ran"] = [[ref, *where] for ref, where in RAN.items()]
    return reply


def main() -> None:
    """Confine, then serve cells (see the module docstring)."""
    cfg = json.loads(sys.argv[1])
    if cfg["uid"]:  # a user of its own, first: its per-user limits (inotify, processes) are not root's; no capability left
        os.setgroups([])
        os.setresgid(cfg["uid"], cfg["uid"], cfg["uid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    if cfg["kernels"]:  # the instructor's compiled kernels, copied so this submission cannot alter them
        shutil.copytree(cfg["kernels"], os.environ["NUMBA_CACHE_DIR"], dirs_exist_ok=True)
    import numpy  # noqa: F401 - imported before the limits, as every assignment needs it

    import simlib  # noqa: F401
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != os.path.realpath(cfg["root"])]
    LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    as_root = os.getuid() == 0  # then a new, empty network namespace (loopback down) and a private /dev/shm
    netns = as_root and LIBC.unshare(CLONE_NEWNET) == 0
    shm = as_root and private_shm()
    limit_resources(cfg)
    proc = ["/proc"] if cfg["own_proc"] else [f"/proc/{os.getpid()}", "/proc/stat", "/proc/cpuinfo", "/proc/meminfo"]
    read_only = cfg["read_only"] + proc + ["/sys/devices/system/cpu"]
    abi = landlock(read_only, cfg["read_write"], cfg["rw_files"]) if cfg["landlock"] else 0
    # shared memory's tracker would be a fresh Python, which cannot start here; this sandbox's /dev/shm goes with it
    resource_tracker.register = resource_tracker.unregister = lambda name, rtype: None
    filtered = seccomp(syscall_filter())
    sys.addaudithook(refuse)
    fcntl.fcntl(cfg["result_fd"], fcntl.F_SETFD, fcntl.FD_CLOEXEC)
    os.write(cfg["result_fd"], frame({"seq": -1, "ok": True, "landlock": abi, "netns": netns, "private_shm": shm,
                                      "uid": os.getuid(), "seccomp": filtered}))
    plan = read_frame(0)
    if plan is None:
        return
    control = private_control(0)
    UP[:] = [os.getpid(), *os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)]
    _thread.start_new_thread = _thread.start_new = threading._start_new_thread = _start_new_thread
    os.register_at_fork(after_in_child=_forked)
    os._exit = posix._exit = _exit
    signal.signal = _signal
    sys.addaudithook(_watch_forks)
    serve(plan["units"], control, cfg["result_fd"], plan.get("watch", []))


if __name__ == "__main__":
    main()

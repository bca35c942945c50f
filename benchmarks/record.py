"""Benchmark results as data: one JSON line per measured ratio, appended to ``records/<script>.jsonl``.

Every benchmark script calls :func:`record` for each ratio it prints against its peer; the README's
results table and the site's results page are generated from the latest record of each workload
(``python benchmarks/results.py``). A record holds the workload, the peer, the ratio (simlib's speed
over the peer's, so above 1 is faster), what was measured, the machine, its load average, the commit
and the date. The history of a figure is its records, oldest first.
"""
from __future__ import annotations

import datetime
import json
import math
import multiprocessing as mp
import os
import platform
import queue
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterable

RECORDS = Path(__file__).resolve().parent / "records"
FIELDS = ("workload", "peer", "ratio", "measure", "machine", "load", "commit", "date")


def machine() -> str:
    """This machine in a few words: cores, architecture, system, Python."""
    return f"{os.cpu_count()} cores {platform.machine()}, {platform.system()}, Python {platform.python_version()}"


def at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Each call in a forked process of its own, all at once, sharing nothing: their results, in order (RuntimeError
    if one dies). What the machine gives that many processes at this moment: a benchmark's ceiling."""
    ctx = mp.get_context("fork")
    done = ctx.Queue()
    procs = [ctx.Process(target=lambda i=i, call=call: done.put((i, call()))) for i, call in enumerate(calls)]
    for proc in procs:
        proc.start()
    out: dict[int, Any] = {}
    try:
        while len(out) < len(procs):
            try:
                i, value = done.get(timeout=1.0)
                out[i] = value
            except queue.Empty:
                if any(proc.exitcode not in (None, 0) for proc in procs):
                    raise RuntimeError(f"a process running at once with others died: exit codes "
                                       f"{[proc.exitcode for proc in procs]}") from None
    finally:
        for proc in procs:
            proc.join(timeout=5.0)
            if proc.is_alive():
                proc.kill()
    return [out[i] for i in range(len(procs))]


def commit() -> str:
    """The checkout's short commit id, with '+' when it has uncommitted changes ('unknown' outside git)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=RECORDS.parent, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    try:
        return git("rev-parse", "--short", "HEAD") + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def record(script: str, workload: str, peer: str, ratio: float, measure: str, folder: Path | None = None,
           **extra: Any) -> dict[str, Any]:
    """Append one record: ratio = simlib's ``measure`` / the peer's (> 1: simlib is faster); returns it."""
    if not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"ratio: must be a finite number > 0, got {ratio!r}")
    row = {"workload": workload, "peer": peer, "ratio": round(float(ratio), 3), "measure": measure,
           "machine": machine(), "load": round(os.getloadavg()[0], 1), "commit": commit(),
           "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(), **extra}
    folder = RECORDS if folder is None else folder
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{Path(script).stem}.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return row


def load(folder: Path | None = None) -> list[dict[str, Any]]:
    """Every record under ``folder``, each with its script's name, in file order (oldest first per file)."""
    rows = []
    for path in sorted((RECORDS if folder is None else folder).glob("*.jsonl")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                row = json.loads(line)
                missing = [k for k in FIELDS if k not in row]
                if missing:
                    raise ValueError(f"{path.name}, line {n}: a record needs {', '.join(missing)}")
                rows.append({"script": f"{path.stem}.py", **row})
    return rows


def latest(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last record of each (script, workload), in the order the workloads first appear."""
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["script"], row["workload"])
        if key not in last or row["date"] >= last[key]["date"]:
            last[key] = row
    return list(last.values())

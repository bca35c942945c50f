"""``python -m simlib live``: serve the live lecture panel on this machine, for a lecturer who does not open notebooks.

Serves ``lessons/live.ipynb`` with Voilà when it is installed (the page opens straight into the
panel, no code shown), else with JupyterLab (then: Run > Run All Cells). Always on 127.0.0.1:
a classroom projects the laptop's screen, the network never sees the server. Example::

    python -m simlib live --port 8866
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from simlib import _validate as check

HOST = "127.0.0.1"
# A Jupyter data folder holding the panel's Voilà template (the lab page, less its CDN stylesheets).
TEMPLATE_ROOT = Path(__file__).resolve().parent
TEMPLATE = "simlib-live"
# A page that unloads shuts its kernel down (simlib.app.voila_server); one whose browser died without
# unloading leaves it behind, and Voilà shuts down kernels idle and unconnected this long.
CULL_IDLE_S = 20
CULL_INTERVAL_S = 5

# The notebook the panel lives in, shipped with the package (live.ipynb); lessons/live.ipynb is the same file
# (a test checks it). One code cell and no markdown: Voilà shows outputs only, so the page is the panel and its title.
PACKAGED_NOTEBOOK = Path(__file__).with_name("live.ipynb")


def default_notebook() -> Path:
    """``lessons/live.ipynb`` of a source checkout, or a copy of the packaged one in a temporary folder (the server
    writes beside the notebook it serves, and an installed package's folder may not be writable)."""
    here = Path(__file__).resolve().parents[2] / "lessons" / "live.ipynb"
    if here.is_file():
        return here
    path = Path(tempfile.mkdtemp(prefix="simlib-live-")) / "live.ipynb"
    shutil.copyfile(PACKAGED_NOTEBOOK, path)
    return path


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``live`` subcommand's flags, on its parser of a ``simlib`` command line (their help says their defaults)."""
    p.formatter_class = argparse.HelpFormatter
    p.add_argument("--port", type=int, default=8866, help="port on 127.0.0.1 (default 8866)")
    p.add_argument("--server", choices=("auto", "voila", "lab"), default="auto",
                   help="voila: the panel alone; lab: JupyterLab; auto: Voilà if installed, else JupyterLab")
    p.add_argument("--notebook", default=None, help="notebook to serve (default: lessons/live.ipynb)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser window")
    p.add_argument("--dry-run", action="store_true", help="print the server command and exit")


def has_voila() -> bool:
    """Whether Voilà can be started from this Python."""
    return importlib.util.find_spec("voila") is not None


def build_command(args: argparse.Namespace) -> list[str]:
    """The server command line for ``args`` (validated: port range, server availability, notebook present)."""
    port = args.port
    check.positive_int("port", port, most=65535)
    server = args.server
    if server == "auto":
        server = "voila" if has_voila() else "lab"
    if server == "voila" and not has_voila():
        raise ValueError("server 'voila' needs Voilà: pip install voila (or use --server lab)")
    notebook = Path(args.notebook) if args.notebook else default_notebook()
    if not notebook.is_file():
        raise ValueError(f"notebook {str(notebook)!r} does not exist")
    if server == "voila":
        # Voilà, less the bug that keeps a reloaded page's kernel running (see voila_server).
        cmd = [sys.executable, "-m", "simlib.app.voila_server", str(notebook), f"--Voila.ip={HOST}", f"--port={port}",
               "--theme=light", f"--template={TEMPLATE}",
               f"--MappingKernelManager.cull_idle_timeout={CULL_IDLE_S}",
               f"--MappingKernelManager.cull_interval={CULL_INTERVAL_S}",
               "--MappingKernelManager.cull_connected=False"]
    else:
        cmd = [sys.executable, "-m", "jupyter", "lab", str(notebook), f"--ip={HOST}", f"--port={port}",
               f"--ServerApp.root_dir={notebook.parent}"]
    if args.no_browser:
        cmd.append("--no-browser")
    return cmd


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the panel's template folder on JUPYTER_PATH."""
    env = dict(os.environ if base is None else base)
    env["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(TEMPLATE_ROOT), env.get("JUPYTER_PATH", "")) if p)
    return env


def run(args: argparse.Namespace) -> int:
    """Start the server and wait; Ctrl-C stops it (and its kernels) cleanly. Returns its exit status."""
    cmd = build_command(args)
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    lab = cmd[2] == "jupyter"
    print(f"serving the live panel on http://{HOST}:{args.port}"
          + (" (JupyterLab: Run > Run All Cells to start it)" if lab else "") + "; Ctrl-C stops it", flush=True)
    proc = subprocess.Popen(cmd, env=server_env())
    try:
        return proc.wait()
    except KeyboardInterrupt:
        # Jupyter servers shut their kernels down on SIGTERM; SIGKILL only if that takes too long.
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return 0

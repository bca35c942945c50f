"""The lecturer's command line: `python -m simlib live` builds a loopback server command for the live notebook."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from simlib.app import serve

REPO = Path(__file__).resolve().parents[1]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="simlib live")
    serve.add_arguments(parser)
    return parser.parse_args(argv)


def test_lab_command_serves_the_live_notebook_on_loopback():
    cmd = serve.build_command(_args("--server", "lab", "--port", "9123", "--no-browser"))
    assert cmd[:4] == [sys.executable, "-m", "jupyter", "lab"]
    assert Path(cmd[4]) == REPO / "lessons" / "live.ipynb"
    assert "--ip=127.0.0.1" in cmd and "--port=9123" in cmd and "--no-browser" in cmd


def test_auto_picks_voila_only_when_installed(monkeypatch):
    monkeypatch.setattr(serve, "has_voila", lambda: True)
    cmd = serve.build_command(_args())
    assert cmd[1:3] == ["-m", "simlib.app.voila_server"] and "--Voila.ip=127.0.0.1" in cmd
    monkeypatch.setattr(serve, "has_voila", lambda: False)
    assert serve.build_command(_args())[2] == "jupyter"
    with pytest.raises(ValueError, match="voila"):
        serve.build_command(_args("--server", "voila"))


@pytest.mark.parametrize("argv, field", [(("--port", "0"), "port"), (("--port", "70000"), "port"),
                                         (("--notebook", "missing.ipynb"), "notebook")])
def test_bad_arguments_name_the_field(argv, field):
    with pytest.raises(ValueError, match=field):
        serve.build_command(_args("--server", "lab", *argv))


def test_dry_run_prints_the_command(capsys):
    assert serve.run(_args("--server", "lab", "--dry-run")) == 0
    out = capsys.readouterr().out
    assert "jupyter lab" in out and "live.ipynb" in out


def test_committed_notebook_is_the_one_served_without_outputs(monkeypatch, tmp_path):
    committed = (REPO / "lessons" / "live.ipynb").read_bytes()
    assert serve.PACKAGED_NOTEBOOK.read_bytes() == committed
    for cell in json.loads(committed)["cells"]:
        assert not cell.get("outputs") and cell.get("execution_count") is None
    # an installed package (no lessons/ beside it) serves a copy of the packaged notebook
    monkeypatch.setattr(serve, "__file__", str(tmp_path / "simlib" / "app" / "serve.py"))
    monkeypatch.setattr(serve.tempfile, "mkdtemp", lambda prefix: str(tmp_path))
    assert serve.default_notebook().read_bytes() == committed

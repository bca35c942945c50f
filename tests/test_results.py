"""Benchmark results as data: records appended by the scripts, tables generated from the latest ones."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.record import FIELDS, latest, load, record
from benchmarks.results import BEGIN, END, short_table, with_table

ROOT = Path(__file__).resolve().parents[1]


def test_a_record_is_one_json_line_with_every_field(tmp_path):
    row = record("benchmarks/hogwild.py", "Hogwild!, 2 processes", "scikit-learn", 1.23456, "nonzeros/s",
                 folder=tmp_path, headline=True)
    lines = (tmp_path / "hogwild.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [row]
    assert all(row[k] not in (None, "") for k in FIELDS)
    assert row["ratio"] == 1.235 and row["load"] >= 0 and len(row["date"]) == 10
    record("hogwild.py", "Hogwild!, 2 processes", "scikit-learn", 0.9, "nonzeros/s", folder=tmp_path)
    assert len((tmp_path / "hogwild.jsonl").read_text().splitlines()) == 2  # appended: the history stays


@pytest.mark.parametrize("ratio", [0, -1.0, math.nan, math.inf])
def test_a_ratio_that_is_no_ratio_is_refused_by_name(ratio, tmp_path):
    with pytest.raises(ValueError, match="ratio: must be a finite number > 0"):
        record("x.py", "w", "p", ratio, "time", folder=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_latest_record_of_each_workload_is_the_one_shown(tmp_path):
    for date, ratio in (("2026-11-20", 1.0), ("2026-11-26", 2.0), ("2026-11-22", 3.0)):
        (tmp_path / "lda.jsonl").open("a").write(json.dumps(
            {"workload": "LDA", "peer": "tomotopy", "ratio": ratio, "measure": "tokens/s", "machine": "m", "load": 1,
             "commit": "abc", "date": date, "headline": True}) + "\n")
    rows = load(tmp_path)
    assert [r["ratio"] for r in latest(rows)] == [2.0]
    table = short_table(rows)
    assert table.splitlines()[2] == "| LDA | tomotopy | **2x** tokens/s | 2026-11-26, abc |"
    assert with_table(f"a\n{BEGIN}\nold\n{END}\nb\n", table) == f"a\n{BEGIN}\n{table}\n{END}\nb\n"


def test_a_workload_a_later_record_replaces_leaves_the_readme_table(tmp_path):
    row = {"peer": "sklearn", "measure": "nonzeros/s", "machine": "m", "load": 1, "commit": "abc", "headline": True}
    with (tmp_path / "hogwild.jsonl").open("w") as f:
        f.write(json.dumps({**row, "workload": "async", "ratio": 1.6, "date": "2026-11-20"}) + "\n")
        f.write(json.dumps({**row, "workload": "ssp, 5", "ratio": 1.3, "date": "2026-11-21"}) + "\n")
        f.write(json.dumps({**row, "workload": "ssp", "ratio": 1.5, "date": "2026-11-21", "replaces": "async"}) + "\n")
        f.write(json.dumps({**row, "workload": "ssp, 7", "ratio": 1.7, "date": "2026-11-22",
                            "replaces": ["ssp", "ssp, 5"]}) + "\n")
    (tmp_path / "lda.jsonl").write_text(json.dumps({**row, "workload": "async", "ratio": 2.0, "date": "2026-11-20"}))
    shown = ["| ssp, 7 | sklearn | **1.7x** nonzeros/s | 2026-11-22, abc |",
             "| async | sklearn | **2x** nonzeros/s | 2026-11-20, abc |"]
    assert short_table(load(tmp_path)).splitlines()[2:] == shown


def test_a_record_missing_a_field_is_refused(tmp_path):
    (tmp_path / "x.jsonl").write_text(json.dumps({"workload": "w", "peer": "p", "ratio": 1.0}) + "\n")
    with pytest.raises(ValueError, match="x.jsonl, line 1: a record needs measure, machine, load, commit, date"):
        load(tmp_path)


def test_the_readme_table_and_the_results_page_are_the_records():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "results.py"), "--check"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    readme = (ROOT / "README.md").read_text()
    shown = readme.split(BEGIN, 1)[1].split(END, 1)[0]
    rows = load()
    gone = {(r["script"], name) for r in rows if r.get("replaces")
            for name in ([r["replaces"]] if isinstance(r["replaces"], str) else r["replaces"])}
    headline = [r for r in latest(rows) if r.get("headline") and (r["script"], r["workload"]) not in gone]
    assert len(headline) >= 10 and all(f"| {r['workload']} |" in shown for r in headline)
    assert not any(f"| {workload} |" in shown for _, workload in gone)


def test_every_benchmark_with_a_peer_writes_a_record():
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if "record(__file__" in p.read_text()}
    assert scripts >= {"sim_speed", "hogwild", "glove", "lda", "specialised", "compression", "grade", "live_redraw",
                       "ray_ps", "lessons", "cli_errors", "gpu"}

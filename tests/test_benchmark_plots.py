"""benchmarks/plots.py draws valid PNGs from the --quick results of both benchmark scripts and
from an RSS trace recorded by benchmarks/rss_trace.py --quick."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("results")
    for name in ("generic-quick.json", "columnar-quick.json"):
        shutil.copy(BENCH / "results" / name, results / name)
    _run(str(BENCH / "rss_trace.py"), "--quick", "--out", str(results))
    return results


def test_rss_trace_records_samples_spills_and_merge(quick_results):
    trace = json.loads((quick_results / "rss-trace-quick.json").read_text())
    samples = trace["samples"]
    assert len(samples) > 10
    assert all(a["t"] < b["t"] for a, b in itertools.pairwise(samples))
    assert all(s["granted"] <= trace["budget"] for s in samples)
    spills = [e for e in trace["events"] if e["kind"] == "spill"]
    assert len(spills) == trace["metrics"]["spill_count"] >= 1
    insert, merge = trace["phases"]["insert"], trace["phases"]["merge"]
    assert insert[0] < insert[1] <= merge[0] < merge[1]
    assert all(insert[0] <= e["t"] <= merge[1] for e in spills)


def test_plots_writes_valid_pngs(quick_results, tmp_path):
    out = tmp_path / "img"
    proc = _run(
        str(BENCH / "plots.py"), "--quick", "--results", str(quick_results), "--out", str(out)
    )
    expected = {
        f"{script}-{kind}.png"
        for script in ("generic", "columnar")
        for kind in ("time-vs-budget", "rss-vs-budget", "throughput")
    } | {"rss-trace.png"}
    assert {p.name for p in out.iterdir()} == expected
    for name in expected:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_SIGNATURE, name
        assert len(data) > 10_000, name  # a drawn figure, not an empty canvas
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width >= 500 and height >= 300, (name, width, height)
    assert str(out / "rss-trace.png") in proc.stdout


def test_plots_names_a_missing_results_file(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "plots.py"),
            "--results",
            str(tmp_path),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "generic.json does not exist" in proc.stderr

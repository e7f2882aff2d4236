"""The README's main job, on a small scale: it must spill, verify itself and exit 0."""

import os
import subprocess
import sys


def test_demo_spills_and_verifies(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "extagg",
            "demo",
            "--records",
            "300000",
            "--keys",
            "100000",
            "--memory",
            "4m",
            "--spill-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verified against NumPy" in proc.stdout
    assert "columnar result matches NumPy" in proc.stdout
    spills = [line for line in proc.stdout.splitlines() if line.startswith("spills:")]
    assert spills and not spills[0].startswith("spills: 0 ")
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_cli_rejects_a_bad_budget():
    proc = subprocess.run(
        [sys.executable, "-m", "extagg", "demo", "--memory", "lots"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "lots" in proc.stderr and "Traceback" not in proc.stderr


def test_files_demo_spills_and_verifies(tmp_path):
    """`make demo`: extagg aggregate on the generated Parquet sample, checked against NumPy."""
    spill = tmp_path / "spill"
    spill.mkdir()
    proc = subprocess.run(
        [
            sys.executable, "-m", "extagg", "demo-files", "--rows", "400000", "--memory-q2",
            "4m", "--cache", str(tmp_path / "cache"), "--spill-dir", str(spill),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "EXTAGG_PROGRESS": "0"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Q1 verified against NumPy" in proc.stdout
    assert "Q2 verified against NumPy: 100,000 groups" in proc.stdout
    assert "note: Q2 did not spill" not in proc.stdout
    # both summaries: Q1's filter drops rows after they are read (no row group is skipped)
    assert proc.stderr.count("Read 400,000 rows") == 2
    assert not any(p.is_file() for p in spill.rglob("*"))
    # the sample is cached: asking again returns the same files, untouched
    from extagg.sample import write_lineitem

    data = tmp_path / "cache" / "lineitem-400000-42"
    before = {p.name: p.stat().st_mtime_ns for p in data.iterdir()}
    files = write_lineitem(str(data), 400_000, 42)
    assert {os.path.basename(f) for f in files} == set(before)
    assert {p.name: p.stat().st_mtime_ns for p in data.iterdir()} == before

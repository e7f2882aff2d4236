"""The README's main job, on a small scale: it must spill, verify itself and exit 0."""

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

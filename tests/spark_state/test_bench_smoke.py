"""``benchmarks/bench_spark_state.py`` runs (tiny, extagg side only) so the script cannot rot."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_spark_state_runs():
    script = os.path.join(ROOT, "benchmarks", "bench_spark_state.py")
    result = subprocess.run(
        [sys.executable, script, "--keys", "3000", "--partitions", "2", "--no-spark"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("extagg: 3,000 rows") == 2  # snapshot and delta shapes

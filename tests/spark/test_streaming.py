"""The docs' streaming example: a real query killed by SIGKILL mid-batch and restarted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from extagg.state import read_change_feed

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "spark_stream.py"


def test_killed_and_restarted_query_state_equals_batch_answer(tmp_path):
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "demo", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert "killed the query in batch 2 (exit -9)" in out
    assert "state equals the batch computation" in out
    # batch 2 ran twice (before the kill, and replayed after it) and wrote version 3 both times
    assert out.count("batch 2 merged into the state") == 2
    feed = list(read_change_feed(str(tmp_path / "state"), 0))
    assert sorted({row[0] for row in feed}) == [0, 1, 2, 3, 4]

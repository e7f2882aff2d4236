"""numba's on-disk cache survives several processes compiling the same kernels at once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import numpy as np
import pyarrow as pa
from extagg.columnar import aggregate
data = {"k": np.arange(2000) % 13, "s": np.array(["ab", "c"] * 1000, dtype=object),
        "v": np.arange(2000, dtype=np.float64)}
out = aggregate(data, keys=["k", "s"], aggs={"t": ("v", "sum"), "n": ("*", "count")},
                memory="16m", force_spill_rows=500)
assert out.num_rows == 26, out.num_rows
assert sum(out["n"].to_pylist()) == 2000
print("ok")
"""


@pytest.mark.slow
def test_three_processes_compile_into_one_fresh_cache(tmp_path) -> None:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [p.communicate(timeout=600) for p in procs]
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, err
        assert out.strip().endswith("ok")
    cached = [f for _r, _d, files in os.walk(tmp_path / "numba-cache") for f in files]
    assert any(f.endswith(".nbi") for f in cached) and any(f.endswith(".nbc") for f in cached)
    # a fourth process loads from the cache and agrees
    again = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr

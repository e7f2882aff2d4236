"""numba's on-disk cache survives several processes compiling the same kernels at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


LOAD_ONLY = """
import sys
import extagg._numba as nb
from extagg.columnar import aggregate
out = aggregate({"k": [1, 2, 1, 3], "v": [1.0, 2.0, 3.0, 4.0]}, keys=["k"],
                aggs={"t": ("v", "sum")})
assert sorted(zip(out["k"].to_pylist(), out["t"].to_pylist())) == [(1, 4.0), (2, 2.0), (3, 4.0)]
print("filled" if nb._target_ready else "not filled")
print(" ".join(m for m in ("numba.np.arrayobj", "numba.cpython.charseq") if m in sys.modules))
"""


def test_cached_kernels_load_without_filling_the_compiler_registries() -> None:
    # numba's cache fills every lowering/typing registry of its CPU target before loading a
    # kernel (~0.14 s, ~40 MiB a process); extagg's kernel cache does not. The first run may
    # compile (a cold cache: registries filled); the second only loads.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", LOAD_ONLY], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["not", "filled"], done.stdout


KERNEL_MODULE = """
import numpy as np
from extagg._numba import jit

@jit()
def doubled(n):
    out = np.empty(n, dtype=np.int64)  # numba.np.arrayobj's np.empty, in its environment
    for i in range(n):
        out[i] = 2 * i
    if n == 3:
        raise ValueError("three rows")
    return out
"""
CALL_KERNEL = """
import sys
import kernel_module
print(kernel_module.doubled(4).tolist())
for bad in (3, -1):
    try:
        kernel_module.doubled(bad)
    except ValueError as exc:
        print(exc)
print("numba.np.arrayobj" in sys.modules)
"""


def test_a_cached_kernel_loads_without_importing_numbas_implementations(tmp_path) -> None:
    # a cached kernel's environments name numba's implementation modules (np.empty's:
    # numba.np.arrayobj, 0.2-0.5 s to import); it loads, runs and raises without them
    (tmp_path / "kernel_module.py").write_text(KERNEL_MODULE)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), root]))
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba-cache")
    runs = [
        subprocess.run([sys.executable, "-c", CALL_KERNEL], env=env, capture_output=True, text=True)
        for _ in range(2)
    ]
    for done in runs:
        assert done.returncode == 0, done.stderr
    answers = ["[0, 2, 4, 6]", "three rows", "negative dimensions not allowed"]
    assert runs[0].stdout.splitlines() == [*answers, "True"]  # compiled: numba imports it
    assert runs[1].stdout.splitlines() == [*answers, "False"]  # loaded


CALL_KERNEL_COUNTING_RUNTIME_COMPILES = """
import numba
import numpy as np
from numba.core.runtime import nrtdynmod
compiles = []
compile_runtime = nrtdynmod.create_nrt_module
nrtdynmod.create_nrt_module = lambda ctx: (compiles.append(1), compile_runtime(ctx))[1]
import kernel_module
print(kernel_module.doubled(4).tolist())
try:
    kernel_module.doubled(3)
except ValueError as exc:
    print(exc)
print(numba.njit(lambda n: np.ones(n).sum())(5))  # compiled now, linked with the runtime
print("compiled" if compiles else "loaded")
"""


def test_numbas_runtime_loads_from_its_cached_object_code(tmp_path) -> None:
    """numba compiles its runtime (NRT) at every start (27 ms, 27 MiB of LLVM paged in); its
    object code is cached beside the kernels' and loaded instead. A cache file altered or
    cut short is compiled again and replaced."""
    (tmp_path / "kernel_module.py").write_text(KERNEL_MODULE)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), root]))
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba-cache")

    def run() -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", CALL_KERNEL_COUNTING_RUNTIME_COMPILES],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[:3] == ["[0, 2, 4, 6]", "three rows", "5.0"]
        return lines[3:]

    assert run() == ["compiled"]
    (cached,) = [
        os.path.join(d, f)
        for d, _sub, files in os.walk(tmp_path / "numba-cache")
        for f in files
        if f.startswith("extagg-nrt-")
    ]
    whole = Path(cached).read_bytes()
    assert run() == ["loaded"]
    for damaged in (whole[: len(whole) // 2], whole[:100] + bytes([whole[100] ^ 1]) + whole[101:]):
        Path(cached).write_bytes(damaged)
        assert run() == ["compiled"]
        assert Path(cached).read_bytes() == whole  # replaced by a whole file
        assert run() == ["loaded"]

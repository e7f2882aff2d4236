"""Quick throughput check of the columnar engine: GROUP BY int key, SUM(float), COUNT(*).

Workload: ``--rows`` rows (default 20 M) over ``--keys`` distinct int64 keys (default 1 M),
fed as dicts of NumPy arrays of ``--batch`` rows. Two budgets: in memory (``--memory``,
default 2g) and 1/8 of the in-memory run's peak granted memory (spills and merges). Each budget
runs in a fresh process: one untimed warm-up, then ``--repeat`` timed runs; reported are the
median (min-max) seconds, rows/s, spills, peak granted memory and the process's peak RSS.
Also reports the first call's time (numba compile or cache load) in a fresh process with a
cold cache (empty ``NUMBA_CACHE_DIR``) and with a warm one. Usage::

    python benchmarks/bench_columnar_quick.py [--rows 20000000] [--keys 1000000] [--json out]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def make_data(rows: int, keys: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, keys, rows, dtype=np.int64), rng.random(rows)


def run_once(key: np.ndarray, value: np.ndarray, batch: int, memory: str) -> dict:
    from extagg.columnar import HashAggregator

    started = time.perf_counter()
    agg = HashAggregator(keys="k", aggs={"s": ("v", "sum"), "n": ("*", "count")}, memory=memory)
    for start in range(0, len(key), batch):
        agg.update({"k": key[start : start + batch], "v": value[start : start + batch]})
    groups = sum(b.num_rows for b in agg.results())
    elapsed = time.perf_counter() - started
    m = agg.metrics
    return {
        "seconds": elapsed,
        "groups": groups,
        "spills": m.spill_count,
        "merge_passes": m.merge_passes,
        "peak_granted": m.peak_granted_bytes,
        "disk_bytes": m.disk_bytes_spilled,
    }


def child(args: argparse.Namespace) -> None:
    key, value = make_data(args.rows, args.keys)
    run_once(key, value, args.batch, args.memory)  # warm-up (compile/cache load, page faults)
    runs = [run_once(key, value, args.batch, args.memory) for _ in range(args.repeat)]
    times = [r["seconds"] for r in runs]
    from extagg._sysinfo import peak_rss

    out = dict(runs[-1])
    out.update(
        median_s=statistics.median(times),
        min_s=min(times),
        max_s=max(times),
        rows_per_s=args.rows / statistics.median(times),
        peak_rss=peak_rss(),  # this process's own (ru_maxrss carries the parent's over exec)
        memory=args.memory,
    )
    print(json.dumps(out))


def first_call(cache_dir: str) -> float:
    code = (
        "import time; t=time.perf_counter();"
        "import numpy as np; from extagg.columnar import aggregate;"
        "aggregate({'k': np.arange(1000) % 7, 'v': np.ones(1000)}, keys='k',"
        " aggs={'s': ('v', 'sum'), 'n': ('*', 'count')}, memory='64m');"
        "print(time.perf_counter() - t)"
    )
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr)
    return float(out.stdout.strip().splitlines()[-1])


def spawn(args: argparse.Namespace, memory: str) -> dict:
    cmd = [
        sys.executable, __file__, "--child", "--rows", str(args.rows), "--keys", str(args.keys),
        "--batch", str(args.batch), "--repeat", str(args.repeat), "--memory", memory,
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def fmt(r: dict) -> str:
    mib = 1024 * 1024
    return (
        f"{r['median_s']:.2f} s ({r['min_s']:.2f}-{r['max_s']:.2f}), "
        f"{r['rows_per_s'] / 1e6:.1f} M rows/s, {r['spills']} spills, "
        f"{r['merge_passes']} extra merge passes, peak granted {r['peak_granted'] / mib:.0f} MiB, "
        f"peak RSS {r['peak_rss'] / mib:.0f} MiB, spilled {r['disk_bytes'] / mib:.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--memory", default="2g")
    parser.add_argument("--json")
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    results: dict = {"rows": args.rows, "keys": args.keys}
    with tempfile.TemporaryDirectory() as cache:
        results["first_call_cold_s"] = first_call(cache)
        results["first_call_warm_s"] = first_call(cache)
    print(f"first call: cold cache {results['first_call_cold_s']:.1f} s, "
          f"warm cache {results['first_call_warm_s']:.2f} s")  # fmt: skip
    in_memory = spawn(args, args.memory)
    results["in_memory"] = in_memory
    print(f"in memory ({args.memory}): {fmt(in_memory)}")
    eighth = max(1, in_memory["peak_granted"] // 8)
    spilling = spawn(args, str(eighth))
    results["eighth_budget"] = spilling
    print(f"1/8 budget ({eighth / 1024 / 1024:.0f} MiB): {fmt(spilling)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()

"""Speed-up of the columnar engine with threads (``HashAggregator(threads=N)``).

For each workload (``SUM(v) GROUP BY k``: int64 keys over the full range, short string keys)
and each memory setting (no limit, 1/8 of the in-memory table), runs ``threads`` = 1, 2, ...
in fresh processes (the shared harness: an untimed warm-up child, then ``--runs`` timed ones)
and reports the median seconds, the speed-up over one thread, and the peak RSS above the
baseline next to the limit. The limit is 1/8 of the peak memory the one-thread no-limit run
reported (``metrics.peak_memory_bytes``, the table's arrays). Every run's result is checked
against the one-thread run (same rows, same order, by a digest).

    .venv/bin/python benchmarks/bench_threads.py            # 20 M int / 5 M string rows
    .venv/bin/python benchmarks/bench_threads.py --quick    # tiny, for the smoke test
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as H

NAME = "threads"

WORKLOADS: dict[str, dict[str, Any]] = {
    "int-20M-1M": {"kind": "int", "rows": 20_000_000, "keys": 1_000_000},
    "str-5M-1M": {"kind": "str", "rows": 5_000_000, "keys": 1_000_000},
}
QUICK: dict[str, dict[str, Any]] = {
    "int-quick": {"kind": "int", "rows": 200_000, "keys": 20_000},
    "str-quick": {"kind": "str", "rows": 100_000, "keys": 10_000},
}


def make_table(spec: dict[str, Any]) -> pa.Table:
    """The workload's input: keys drawn uniformly from ``keys`` distinct values (seeded)."""
    rng = np.random.default_rng(11)
    index = rng.integers(0, spec["keys"], spec["rows"])
    values = rng.integers(0, 1000, spec["rows"])
    if spec["kind"] == "int":
        # distinct keys spread over the whole int64 range (an odd multiply mod 2**64)
        keys = (index.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
        return pa.table({"k": keys, "v": values})
    names = pa.array([f"user_{i}" for i in range(spec["keys"])])
    return pa.table({"k": names.take(pa.array(index)), "v": values})


def child(case: dict[str, Any]) -> dict[str, Any]:
    """One timed run (in a fresh process)."""
    from extagg.columnar import aggregate

    table = make_table(case["workload"])
    warm = table.slice(0, 5000)
    aggregate(warm, "k", {"s": ("v", "sum")}, threads=case["threads"], memory="64m")
    out: dict[str, Any] = {}

    cpu: dict[str, float] = {}

    def run() -> pa.Table:
        started = time.process_time()  # CPU seconds of every thread of the process
        try:
            return aggregate(
                table, "k", {"s": ("v", "sum")}, threads=case["threads"], memory=case["memory"]
            )
        finally:
            cpu["seconds"] = time.process_time() - started

    t = H.timed(run)
    result: pa.Table = t.value
    digest = hashlib.sha256()  # of the values in order (not of how they are chunked)
    for col in result.columns:
        values = col.to_numpy(zero_copy_only=False)
        if values.dtype == object:
            digest.update("\x00".join(map(str, values)).encode())
        else:
            digest.update(np.ascontiguousarray(values).tobytes())
    from extagg import run_metrics

    metrics = run_metrics(result)
    out.update(t.as_dict())
    out.update(
        groups=result.num_rows,
        digest=digest.hexdigest()[:16],
        spills=metrics.spill_count,
        peak_memory_bytes=metrics.peak_memory_bytes,
        peak_granted_bytes=metrics.peak_granted_bytes,
        load=os.getloadavg()[0],
        cpu_seconds=cpu["seconds"],
    )
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the suite and write ``benchmarks/results/threads*.{json,md}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    H.add_common_arguments(parser)
    parser.add_argument("--threads", type=int, nargs="+", help="thread counts (default 1 2)")
    parser.add_argument("--workloads", nargs="+", help="workload names (default all)")
    args = parser.parse_args(argv)
    if args.child:
        H.run_guarded(lambda: child(json.loads(args.child)))
        return 0
    workloads = QUICK if args.quick else WORKLOADS
    if args.workloads:
        workloads = {k: v for k, v in workloads.items() if k in args.workloads}
    runs = args.runs or (1 if args.quick else 3)
    warmup = args.warmup if args.warmup is not None else (0 if args.quick else 1)
    counts = args.threads or [1, 2]
    script = str(Path(__file__).resolve())
    results: list[dict[str, Any]] = []
    rows: list[list[Any]] = []
    for name, spec in workloads.items():
        limit: int | None = None
        for mode in ("no limit", "1/8 of the table"):
            base: dict[str, Any] | None = None
            for n in counts:
                memory = "16g" if mode == "no limit" else limit
                case = {"workload": spec, "name": name, "mode": mode, "threads": n,
                        "memory": memory}  # fmt: skip
                print(f"{name} {mode} threads={n}", flush=True)
                r = H.run_case(script, case, runs=runs, warmup=warmup, timeout=1800)
                results.append(r)
                s = r["summary"]
                if "error" in s:
                    rows.append([name, mode, n, s["error"], "", "", "", "", ""])
                    continue
                if base is None:
                    base = s
                if limit is None and mode == "no limit" and n == counts[0]:
                    limit = max(1 << 20, int(s["peak_memory_bytes"][0]) // 8)
                same = s["digest"] == base["digest"]
                speedup = base["seconds"][0] / s["seconds"][0]
                rows.append([
                    name, mode if mode == "no limit" else f"{mode} ({H.format_bytes(limit)})", n,
                    H.format_range(s["seconds"], unit=" s"), f"{speedup:.2f}x",
                    f"{s['cpu_seconds'][0]:.2f} s",
                    H.format_bytes(s["peak_above_baseline"][0]), s["spills"][0],
                    "yes" if same else "NO",
                ])  # fmt: skip
    headers = ["workload", "memory", "threads", "seconds (median, min-max)", "speed-up",
               "CPU seconds (all threads)",
               "peak RSS above baseline", "spills", "same result"]  # fmt: skip
    info = H.machine_info()
    text = (
        f"Measured on {info['platform']}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.2f} at the end ({runs} timed run(s) per case, medians).\n\n"
        + H.markdown_table(headers, rows)
    )
    out = args.out
    H.write_results(NAME + ("-quick" if args.quick else ""), {"results": results}, text, out)
    if not args.no_readme and not args.quick:
        H.update_readme(NAME, text)
    print(text)
    bad = [row for row in rows if row[-1] == "NO"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the columnar engine's time goes: per-stage timings of one in-memory aggregation.

Runs ``HashAggregator.update`` + ``results`` on a cached workload of ``bench_columnar.py`` in
this process (one untimed warm-up on the first 50 000 rows loads the numba cache) with the
stage functions wrapped by timers: converting a batch to columns, hashing and canonicalising
the keys, probing the table, each aggregate's update, growing the table, and the results. What
is left of the total is the Python around them (chunk loop, slicing, accounting). The bare
presized ceiling (:mod:`numba_ceiling`) runs on the same data for the ratio. Usage::

    python benchmarks/profile_columnar.py int-1M int-10M str-1M
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _datasets as D
import bench_columnar as B

TIMES: dict[str, float] = defaultdict(float)
CPU: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)


def _wrap(owner: Any, attr: str, label: str) -> None:
    inner = getattr(owner, attr)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t, c = time.perf_counter(), time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            TIMES[label] += time.perf_counter() - t
            CPU[label] += time.thread_time() - c
            CALLS[label] += 1

    setattr(owner, attr, timed)


_INSTRUMENTED: list[bool] = []


def _instrument() -> None:
    if _INSTRUMENTED:
        return
    _INSTRUMENTED.append(True)
    from extagg.collection import typed_table
    from extagg.columnar import hash_aggregator

    _wrap(hash_aggregator, "to_columns", "to_columns (Arrow → NumPy views)")
    _wrap(hash_aggregator.HashAggregator, "_encode", "encode keys (hash + words)")
    _wrap(typed_table.TypedHashTable, "insert", "probe / insert (group ids)")
    _wrap(hash_aggregator.HashAggregator, "_fold", "fold aggregates (update_all)")
    _wrap(hash_aggregator, "try_grow", "grow table (rehash)")


def profile(name: str, ceiling: bool) -> None:
    from extagg import HashAggregator

    spec = B.WORKLOADS[name]
    table = D.load_table(D.dataset_path(spec))
    rows = table.num_rows

    def run(t: Any) -> tuple[float, float, int]:
        start, cpu0 = time.perf_counter(), time.thread_time()
        with HashAggregator(spec["keys"], spec["aggs"], memory=B.NO_LIMIT) as agg:
            for batch in t.to_batches():
                agg.update(batch)
            mid, cpu1 = time.perf_counter(), time.thread_time()
            groups = sum(b.num_rows for b in agg.results())
        end, cpu2 = time.perf_counter(), time.thread_time()
        TIMES["results (sort + gather + Arrow)"] += end - mid
        CPU["results (sort + gather + Arrow)"] += cpu2 - cpu1
        return end - start, cpu2 - cpu0, groups

    run(table.slice(0, 50_000))
    _instrument()
    TIMES.clear()
    CPU.clear()
    CALLS.clear()
    total, cpu, groups = run(table)
    load = os.getloadavg()[0]
    print(f"\n{name}: {rows:,} rows, {groups:,} groups, aggs {spec['aggs']}; load {load:.1f}")
    print(f"  total {total:.3f} s wall, {cpu:.3f} s CPU ({rows / total / 1e6:.1f} M rows/s)")
    print(f"  {'stage':<40} {'wall s':>7}  {'CPU s':>7}  {'% CPU':>6}")
    accounted = 0.0
    for label, seconds in TIMES.items():
        accounted += CPU[label]
        share = 100 * CPU[label] / cpu
        print(
            f"  {label:<40} {seconds:7.3f}  {CPU[label]:7.3f}  {share:5.1f} %  ({CALLS[label]} calls)"
        )
    rest = "rest (Python: chunk loop, slicing, accounting)"
    print(f"  {rest:<40} {'':7}  {cpu - accounted:7.3f}  {100 * (cpu - accounted) / cpu:5.1f} %")
    if ceiling and spec["kind"] == "int":
        from numba_ceiling import ceiling_aggregate

        keys = [table.column(k).to_numpy() for k in spec["keys"]]
        values = [table.column("v").to_numpy()]
        ceiling_aggregate([k[:50_000] for k in keys], [v[:50_000] for v in values], ["sum"])
        t, c0 = time.perf_counter(), time.thread_time()
        ceiling_aggregate(keys, values, ["sum"], groups=spec["distinct"])
        c, ccpu = time.perf_counter() - t, time.thread_time() - c0
        print(
            f"  ceiling (presized, sum): {c:.3f} s wall, {ccpu:.3f} s CPU; extagg throughput / "
            f"ceiling = {c / total:.0%} (wall), {ccpu / cpu:.0%} (CPU)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", choices=sorted(B.WORKLOADS))
    parser.add_argument("--no-ceiling", action="store_true")
    args = parser.parse_args()
    for name in args.workloads:
        profile(name, not args.no_ceiling)


if __name__ == "__main__":
    main()

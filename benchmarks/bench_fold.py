"""Batch fold of the generic AppendOnlyMap against a plain dict loop.

Workload (the task's target): 2 M ``(int, float)`` records over 200 k distinct keys, sum
combiners, records arriving in batches of 1024, in two flavours:

* ``fresh``: every record carries its own key object, as records parsed from a file or converted
  from Arrow/NumPy (``.tolist()``) do;
* ``shared``: records reuse the key objects of a 200 k-key universe (identity hits everywhere,
  the most favourable case for ``dict``).

Peers:

* ``dict``: ``for k, v in zip(keys, values): d[k] = d[k] + v if k in d else v``
* ``dict+calls``: the same loop calling the combiner functions (what a generic engine pays)
* ``fold``: ``SizeTrackingAppendOnlyMap.fold(keys, values, create, merge)`` per batch, Python
  functions as combiners
* ``fold+add``: the same with ``merge = operator.add`` (PySpark's usual sum combiner)
* ``change_value``: one ``change_value`` per record (Spark's per-record path), for scale

One untimed warm-up, then the median (min-max) of ``--repeat`` runs. Usage::

    python benchmarks/bench_fold.py [--records 2000000] [--keys 200000] [--repeat 5] [--json out]
"""

from __future__ import annotations

import argparse
import json
import operator
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

from extagg.collection import SizeTrackingAppendOnlyMap

BATCH = 1024

Batches = list[tuple[list[int], list[float]]]


def make_batches(records: int, keys: int, workload: str, seed: int = 1) -> Batches:
    rng = np.random.default_rng(seed)
    universe = rng.choice(2**40, size=keys, replace=False)
    picks = rng.integers(0, keys, records)
    values = rng.random(records)
    if workload == "fresh":
        key_array = universe[picks]
        return [
            (key_array[i : i + BATCH].tolist(), values[i : i + BATCH].tolist())
            for i in range(0, records, BATCH)
        ]
    shared = universe.tolist()
    all_keys = [shared[i] for i in picks.tolist()]
    all_values = values.tolist()
    return [(all_keys[i : i + BATCH], all_values[i : i + BATCH]) for i in range(0, records, BATCH)]


def create(v: float) -> float:
    return v


def merge(c: float, v: float) -> float:
    return c + v


def run_dict(batches: Batches) -> dict:
    d: dict = {}
    for keys, values in batches:
        for k, v in zip(keys, values):
            d[k] = d[k] + v if k in d else v
    return d


def run_dict_calls(batches: Batches) -> dict:
    d: dict = {}
    for keys, values in batches:
        for k, v in zip(keys, values):
            d[k] = merge(d[k], v) if k in d else create(v)
    return d


def run_fold(batches: Batches) -> SizeTrackingAppendOnlyMap:
    m = SizeTrackingAppendOnlyMap()
    for keys, values in batches:
        m.fold(keys, values, create, merge)
    return m


def run_fold_add(batches: Batches) -> SizeTrackingAppendOnlyMap:
    m = SizeTrackingAppendOnlyMap()
    for keys, values in batches:
        m.fold(keys, values, create, operator.add)
    return m


def run_change_value(batches: Batches) -> SizeTrackingAppendOnlyMap:
    m = SizeTrackingAppendOnlyMap()
    for keys, values in batches:
        for k, v in zip(keys, values):
            m.change_value(k, lambda had, old, v=v: old + v if had else v)
    return m


def measure(fn: Callable, batches: Batches, repeat: int) -> dict:
    fn(batches)  # warm-up: numba cache load, first touch of memory
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn(batches)
        times.append(time.perf_counter() - started)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def check(batches: Batches) -> None:
    reference = run_dict(batches)
    folded = dict(run_fold(batches).items())
    if folded.keys() != reference.keys() or any(
        abs(folded[k] - reference[k]) > 1e-9 * max(1.0, abs(reference[k])) for k in reference
    ):
        raise SystemExit("fold result differs from the dict reference")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workload", choices=["fresh", "shared", "both"], default="both")
    parser.add_argument("--skip-change-value", action="store_true")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()

    peers = {
        "dict": run_dict,
        "dict+calls": run_dict_calls,
        "fold": run_fold,
        "fold+add": run_fold_add,
    }
    if not args.skip_change_value:
        peers["change_value"] = run_change_value
    workloads = ["fresh", "shared"] if args.workload == "both" else [args.workload]
    report: dict = {
        "benchmark": "bench_fold",
        "records": args.records,
        "keys": args.keys,
        "batch": BATCH,
        "python": platform.python_version(),
        "workloads": {},
    }
    for workload in workloads:
        batches = make_batches(args.records, args.keys, workload)
        check(batches)
        results = {name: measure(fn, batches, args.repeat) for name, fn in peers.items()}
        base = results["dict"]["median_s"]
        print(f"{workload}: {args.records:,} records, {args.keys:,} keys, batches of {BATCH}")
        for name, r in results.items():
            r["records_per_s"] = args.records / r["median_s"]
            r["speedup_vs_dict"] = base / r["median_s"]
            print(
                f"  {name:>13}: {r['median_s']:.3f} s (min {r['min_s']:.3f}, max {r['max_s']:.3f})"
                f"  {r['records_per_s'] / 1e6:.2f} M rec/s  {r['speedup_vs_dict']:.2f}x dict"
            )
        report["workloads"][workload] = results
        del batches
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()

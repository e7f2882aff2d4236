"""The count / sum / mean patterns on the generic engine's typed path against a plain dict loop.

Issue 11 asks the typed path to fold "the count/sum/mean patterns PySpark jobs use" and beat a
``dict`` loop. Each pattern runs three ways over ``bench_generic``'s record stream (same keys,
float values): ``dict`` (the loop a Python job writes), ``extagg-typed``
(``Aggregator.counting()`` / ``summing()`` / ``sum_count()``, compiled) and ``extagg-general``
(the same combiner as lambdas, what ``ExternalAppendOnlyMap`` folds record by record), in
memory, then ``extagg-typed`` at a spilling budget. Every engine runs in turn in this one
process, ``--rounds`` times; the table gives median CPU seconds (load from other jobs then hits
all engines alike) and ``dict / extagg-typed`` (target ≥ 1). Usage::

    python benchmarks/bench_patterns.py                 # int64 2 M / 100 k and user_N 1 M / 200 k
    python benchmarks/bench_patterns.py --quick
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_generic import INTERLEAVED, QUICK_INTERLEAVED, records

from extagg import Aggregator, ExternalAppendOnlyMap

PATTERNS = ("count", "sum", "mean")
IN_MEMORY = 8 << 30


def typed_aggregator(pattern: str) -> Aggregator[Any, Any]:
    return {
        "count": Aggregator.counting,
        "sum": Aggregator.summing,
        "mean": Aggregator.sum_count,
    }[pattern]()


def lambda_aggregator(pattern: str) -> Aggregator[Any, Any]:
    if pattern == "count":
        return Aggregator(lambda v: 1, lambda c, v: c + 1, lambda a, b: a + b)
    if pattern == "sum":
        return Aggregator(lambda v: v, lambda c, v: c + v, lambda a, b: a + b)
    return Aggregator(
        lambda v: (v, 1), lambda c, v: (c[0] + v, c[1] + 1), lambda a, b: (a[0] + b[0], a[1] + b[1])
    )


def run_dict(pattern: str, spec: dict[str, Any]) -> tuple[int, str]:
    d: dict[Any, Any] = {}
    stream = records(spec["records"], spec["distinct"], spec["kind"])
    get = d.get
    if pattern == "count":
        for k, _ in stream:
            d[k] = get(k, 0) + 1
    elif pattern == "sum":
        for k, v in stream:
            d[k] = get(k, 0.0) + v
    else:
        for k, v in stream:
            c = get(k)
            d[k] = (v, 1) if c is None else (c[0] + v, c[1] + 1)
    return sum(1 for _ in d.items()), "-"


def run_map(agg: Aggregator[Any, Any], spec: dict[str, Any], budget: int) -> tuple[int, str]:
    with ExternalAppendOnlyMap(agg, memory=budget) as m:
        m.insert_all(records(spec["records"], spec["distinct"], spec["kind"]))
        path = "typed" if type(m._map).__name__ == "TypedReduceMap" else "general"
        groups = sum(1 for _ in m.iterator())
        return groups, f"{path}, {m.metrics.spill_count} spills"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny data, one round")
    parser.add_argument("--rounds", type=int, help="rounds (default 3, quick 1)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    workloads = QUICK_INTERLEAVED if args.quick else INTERLEAVED
    print("| workload | pattern | dict | extagg-typed | extagg-general | typed, spilling | "
          "dict / extagg-typed (target ≥ 1) | general / typed |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, spec in workloads.items():
        prime = {**spec, "records": 20_000, "distinct": 2_000}
        for pattern in PATTERNS:
            run_map(typed_aggregator(pattern), prime, spec["spill"])
            run_map(lambda_aggregator(pattern), prime, spec["spill"])
        for pattern in PATTERNS:
            engines: dict[str, Callable[[], tuple[int, str]]] = {
                "dict": lambda p=pattern, s=spec: run_dict(p, s),
                "typed": lambda p=pattern, s=spec: run_map(typed_aggregator(p), s, IN_MEMORY),
                "general": lambda p=pattern, s=spec: run_map(lambda_aggregator(p), s, IN_MEMORY),
                "spilling": lambda p=pattern, s=spec: run_map(typed_aggregator(p), s, s["spill"]),
            }
            cpu: dict[str, list[float]] = {e: [] for e in engines}
            notes: dict[str, str] = {}
            groups = set()
            for _ in range(rounds):
                for engine, run in engines.items():
                    started = time.process_time()
                    count, notes[engine] = run()
                    cpu[engine].append(time.process_time() - started)
                    groups.add(count)
            if len(groups) != 1:
                raise SystemExit(f"{name} {pattern}: engines disagree on the groups: {groups}")
            med = {e: statistics.median(v) for e, v in cpu.items()}
            print(
                f"| {name} ({spec['records']:,} / {spec['distinct']:,}) | {pattern} "
                f"| {med['dict']:.2f} | {med['typed']:.2f} ({notes['typed']}) "
                f"| {med['general']:.2f} | {med['spilling']:.2f} ({notes['spilling']}) "
                f"| {med['dict'] / med['typed']:.2f}× | {med['general'] / med['typed']:.2f}× |",
                flush=True,
            )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nCPU seconds, medians of {rounds} rounds, interleaved in one process; load {load}.")


if __name__ == "__main__":
    main()

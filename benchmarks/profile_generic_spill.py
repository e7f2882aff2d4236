"""Where the generic engine's CPU goes while it spills, and an A/B against the merger.

``--phases``: one run of ``ExternalAppendOnlyMap(Aggregator(lambda v: v, lambda c, v: c + v,
lambda a, b: a + b))`` per workload of ``bench_generic.py`` in this process, CPU seconds of
the insert and iteration and of the parts inside them (size samples, spill sort, spill
writes, batch decoding, the merge's combine), timed by wrapping those functions.

Default (A/B): ``pyspark.shuffle.ExternalMerger`` and the map of every source tree given by
``--trees`` (default: this one), each run in a fresh process (primed first, as
``bench_generic.py``'s children are), interleaved round by round so that a shared machine's
load hits all alike; CPU seconds of the timed block, medians. Usage::

    python benchmarks/profile_generic_spill.py --trees /work/main . --rounds 3
    python benchmarks/profile_generic_spill.py --phases
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

CHILD = r"""
import sys, time, json
sys.path.insert(0, {bench!r})
import bench_generic as B
import pyspark.shuffle, extagg
spec = B.WORKLOADS[{workload!r}]
spec["spill"] = {spill!r} or spec["spill"]
kind = spec["kind"]
prime = B.records(B.PRIME_RECORDS, B.PRIME_RECORDS // 10, kind, seed=B.SEED + 1)
if {engine!r} == "merger":
    B.run_merger(prime, spec["spill"])
else:
    B.run_extagg(prime, spec["spill"], force=B.PRIME_RECORDS // 4)
    B.run_extagg(B.records(B.PRIME_RECORDS, B.PRIME_RECORDS // 10, kind), spec["spill"])
stream = B.records(spec["records"], spec["distinct"], kind)
cpu, wall = time.process_time(), time.perf_counter()
r = (B.run_merger if {engine!r} == "merger" else B.run_extagg)(stream, spec["spill"])
print(json.dumps({{"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall,
                  "spills": r["spills"], "groups": r["groups"], "total": r["total"]}}))
"""


def ab(trees: list[str], workloads: list[str], rounds: int, spill: int | None) -> None:
    """Merger and every tree's map in fresh processes, interleaved; prints medians."""
    engines = [("merger", trees[-1])] + [(tree, tree) for tree in trees]
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for workload in workloads:
        for r in range(rounds):
            for name, tree in engines:
                code = CHILD.format(
                    bench=str(HERE), workload=workload, spill=spill,
                    engine="merger" if name == "merger" else "extagg",
                )  # fmt: skip
                env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
                proc = subprocess.run(  # run in the tree: "-c" puts the cwd first on sys.path
                    [sys.executable, "-c", code], env=env, capture_output=True, text=True,
                    cwd=str(Path(tree).resolve()),
                )  # fmt: skip
                if proc.returncode:
                    raise SystemExit(proc.stderr[-3000:])
                result = json.loads(proc.stdout.strip().splitlines()[-1])
                cells.setdefault((workload, name), []).append(result)
                print(
                    f"{workload} {name} round {r}: {result['cpu']:.2f} s CPU, "
                    f"{result['spills']} spills, load {os.getloadavg()[0]:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
    for workload in workloads:
        merger = statistics.median(c["cpu"] for c in cells[(workload, "merger")])
        parts = [f"{workload}: merger {merger:.2f} s"]
        for tree in trees:
            mine = statistics.median(c["cpu"] for c in cells[(workload, tree)])
            parts.append(f"{tree} {mine:.2f} s (merger/extagg {merger / mine:.2f}x)")
        totals = {round(c["total"], 6) for (w, _), cs in cells.items() if w == workload for c in cs}
        parts.append("same totals" if len(totals) == 1 else f"TOTALS DIFFER {totals}")
        print("; ".join(parts))


def phases(workloads: list[str], spill: int | None) -> None:
    """One spilling run per workload here, with the CPU seconds of its parts."""
    sys.path.insert(0, str(HERE))
    import bench_generic as B

    from extagg import Aggregator, ExternalAppendOnlyMap
    from extagg.collection import append_only_map, size_tracker
    from extagg.generic import external_map, merge_phase
    from extagg.spill import codecs, runfile

    spent: dict[str, float] = {}

    def timed(owner: Any, name: str, label: str) -> None:
        function = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.process_time() - started

        setattr(owner, name, wrapper)

    timed(size_tracker.SizeTrackingAppendOnlyMap, "_measure_size", "size samples")
    timed(append_only_map.AppendOnlyMap, "destructive_sort_order", "spill sort")
    timed(external_map, "scalar_sorted_rows", "spill arrays")
    timed(runfile.RunWriter, "write_sorted", "spill write")
    timed(codecs.ObjectCodec, "decode", "decode")
    timed(merge_phase, "combine_object_pieces", "combine")
    for workload in workloads:
        spent.clear()
        spec = B.WORKLOADS[workload]
        budget = spill or spec["spill"]
        with ExternalAppendOnlyMap(Aggregator(*B.LAMBDAS), memory=budget) as m:
            started = time.process_time()
            m.insert_all(B.records(spec["records"], spec["distinct"], spec["kind"]))
            inserted = time.process_time()
            for _ in m.iterator():
                pass
            done = time.process_time()
            spills = m.metrics.spill_count
        parts = ", ".join(f"{k} {v:.2f}" for k, v in spent.items())
        print(
            f"{workload}: insert {inserted - started:.2f} s, iterate {done - inserted:.2f} s, "
            f"{spills} spills; inside: {parts}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["int64-125k", "user-250k"])
    parser.add_argument("--trees", nargs="+", default=[str(HERE.parent)])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spill-mib", type=int, help="override the spilling budget (MiB)")
    parser.add_argument("--phases", action="store_true", help="time the parts, in process")
    args = parser.parse_args()
    spill = args.spill_mib * 1024 * 1024 if args.spill_mib else None
    if args.phases:
        phases(args.workloads, spill)
    else:
        ab(args.trees, args.workloads, args.rounds, spill)


if __name__ == "__main__":
    main()

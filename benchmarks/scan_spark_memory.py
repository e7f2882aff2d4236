"""What a Python worker holds above its budget in a spilling RDD shuffle, map side and reduce side.

Runs, in a fresh process per case, what PySpark's Python workers run for ``reduceByKey``,
``aggregateByKey`` (tuple combiner) or ``groupByKey().mapValues(len)`` (the functions of
``profile_spark.py``), with the stock merger or extagg's, on records generated lazily (as
``sc.range(...).map(...)`` does): each map task's output goes through ``partitionBy``'s writer
to a temporary file, then one reduce partition reads every map task's share back a pickled
batch at a time. The RSS is sampled every 2 ms; "fixed" is the RSS after a small warm-up run
of the same call (imports, compiled kernels); the peaks above it are printed for the map and
the reduce side against the budget.

    python benchmarks/scan_spark_memory.py --records 4000000 --keys 1000000 --memory 32
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("PYTHONHASHSEED", "0")
MIB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Peak:
    """The largest RSS seen while the block runs."""

    def __enter__(self) -> Peak:
        self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(0.002)

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def records(start: int, stop: int, keys: int, kind: str) -> Iterator[tuple[Any, int]]:
    if kind == "int":
        return (((i * 40503) % keys, i % 1000) for i in range(start, stop))
    return ((f"k{(i * 2654435761) % keys}", i % 1000) for i in range(start, stop))


def job(args: argparse.Namespace, n: int, keys: int, maps: int, peaks: dict[str, int]) -> None:
    """One job's Python work; the peaks of the map tasks and of reduce partition 0."""
    from profile_spark import aggregators, shuffle_write

    if args.engine == "extagg":
        from extagg.spark.merger import SparkGroupBy as Group
        from extagg.spark.merger import SparkMerger as Merger
    else:
        from pyspark.shuffle import ExternalGroupBy as Group
        from pyspark.shuffle import ExternalMerger as Merger
    from pyspark.serializers import read_long

    agg = aggregators()[args.call]
    group_by = args.call == "groupByKey"
    step = -(-n // maps)
    with tempfile.TemporaryFile() as spool:
        offsets: list[tuple[int, int]] = []
        for start in range(0, n, step):
            with Peak() as peak:
                merger = Merger(agg, args.memory * 0.9)
                merger.mergeValues(records(start, min(n, start + step), keys, args.kind))
                chunks = shuffle_write(merger.items(), args.partitions, args.memory, args.engine)
                for label in chunks:
                    data = next(chunks)
                    if read_long(__import__("io").BytesIO(label)) == 0:
                        offsets.append((spool.tell(), len(data)))
                        spool.write(data)
                del merger, chunks
            peaks["map"] = max(peaks.get("map", 0), peak.peak)

        def shuffle_read() -> Iterator[Any]:
            for offset, size in offsets:
                spool.seek(offset)
                yield from pickle.loads(spool.read(size))

        with Peak() as peak:
            reducer = (Group if group_by else Merger)(agg, args.memory)
            reducer.mergeCombiners(shuffle_read())
            count = sum(len(v) if group_by else 1 for _, v in reducer.items())
            del reducer
        peaks["reduce"] = max(peaks.get("reduce", 0), peak.peak)
        peaks["count"] = count


def child(args: argparse.Namespace) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pyspark.worker  # noqa: F401  (what every worker imports)

    started = rss()
    job(args, 20_000, 5_000, 2, {})  # warm-up: imports, compiled kernels
    fixed = rss()
    peaks: dict[str, int] = {}
    job(args, args.records, args.keys, args.maps, peaks)
    print(json.dumps({"start": started, "fixed": fixed, **peaks}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=4_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--maps", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--memory", type=float, default=32.0, help="worker memory, MiB")
    parser.add_argument("--kinds", nargs="*", default=["int", "str"])
    parser.add_argument(
        "--calls", nargs="*", default=["reduceByKey", "aggregateByKey", "groupByKey"]
    )
    parser.add_argument("--engines", nargs="*", default=["stock", "extagg"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        for key, value in json.loads(args.child).items():
            setattr(args, key, value)
        child(args)
        return
    print(
        f"# {args.records:,} records, {args.keys:,} keys, {args.maps} map tasks, "
        f"{args.memory:g} MiB workers, load {os.getloadavg()[0]:.1f}"
    )
    print("| call | keys | engine | fixed MiB | map peak − fixed | reduce peak − fixed |")
    print("|---|---|---|---:|---:|---:|")
    for kind in args.kinds:
        for call in args.calls:
            for engine in args.engines:
                spec = json.dumps({"call": call, "kind": kind, "engine": engine})
                out = subprocess.run(
                    [sys.executable, __file__, *sys.argv[1:], "--child", spec],
                    capture_output=True,
                    text=True,
                )
                if out.returncode:
                    print(f"| {call} | {kind} | {engine} | error: {out.stderr[-300:]} |")
                    continue
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(
                    f"| {call} | {kind} | {engine} | {r['fixed'] / MIB:.0f} | "
                    f"{(r['map'] - r['fixed']) / MIB:.1f} | "
                    f"{(r['reduce'] - r['fixed']) / MIB:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

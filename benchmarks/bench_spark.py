"""PySpark's own RDD aggregations with and without ``extagg.spark.install()``, on local[2].

    .venv/bin/python benchmarks/bench_spark.py --records 2000000 --keys 500000 --worker-memory 32m

For each of ``reduceByKey``, ``aggregateByKey`` (tuple combiner) and
``groupByKey().mapValues(len)``: wall time, the Python workers' peak RSS (sampled every 50 ms
from the JVM's process tree) and the spill bytes Spark's task metrics carry, stock and with
extagg installed, at a worker memory that makes the stock merger spill. Then
``extagg.spark.aggregate`` against ``df.groupBy().agg()``. Every pair of answers is checked equal.
"""

from __future__ import annotations

import argparse
import operator
import os
import sys
import threading
import time
from typing import Any

import psutil


class RssSampler:
    """Peak RSS of any single Python worker under this process (the JVM's children)."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            for proc in me.children(recursive=True):
                try:
                    if "python" in proc.name().lower():
                        self.peak = max(self.peak, proc.memory_info().rss)
                except psutil.Error:
                    pass
            time.sleep(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()


def spill_bytes(sc: Any, group: str) -> tuple[int, int]:
    tracker, store = sc.statusTracker(), sc._jsc.sc().statusStore()
    time.sleep(1.0)  # the listener bus is asynchronous
    stages = [s for j in tracker.getJobIdsForGroup(group) for s in tracker.getJobInfo(j).stageIds]
    data = [store.lastStageAttempt(s) for s in stages]
    return sum(d.memoryBytesSpilled() for d in data), sum(d.diskBytesSpilled() for d in data)


def add_pair(c: tuple[int, int], v: int) -> tuple[int, int]:
    return (c[0] + v, c[1] + 1)


def merge_pair(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0] + b[0], a[1] + b[1])


CALLS = {
    "reduceByKey": lambda rdd: rdd.reduceByKey(operator.add),
    "aggregateByKey": lambda rdd: rdd.aggregateByKey((0, 0), add_pair, merge_pair),
    "groupByKey.len": lambda rdd: rdd.groupByKey().mapValues(len),
}


def run(sc: Any, name: str, rdd: Any, installed: bool) -> tuple[dict[str, Any], int]:
    import extagg.spark as es

    group = f"{name}-{'extagg' if installed else 'stock'}"
    sc.setJobGroup(group, group)
    if installed:
        es.install()
    try:
        with RssSampler() as rss:
            start = time.perf_counter()
            out = CALLS[name](rdd).map(lambda kv: hash((kv[0], kv[1])) & 0xFFFFFFFF).sum()
            wall = time.perf_counter() - start
    finally:
        es.uninstall()
    memory, disk = spill_bytes(sc, group)
    row = {
        "call": name,
        "engine": "extagg" if installed else "stock",
        "wall_s": round(wall, 2),
        "worker_peak_rss_mib": round(rss.peak / 2**20, 1),
        "memory_spilled_mib": round(memory / 2**20, 1),
        "disk_spilled_mib": round(disk / 2**20, 1),
    }
    return row, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--worker-memory", default="32m")
    parser.add_argument("--skip-dataframe", action="store_true")
    parser.add_argument("--calls", nargs="*", default=list(CALLS), choices=list(CALLS))
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import extagg.spark as es

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("extagg-bench-spark")
        .config("spark.ui.enabled", "false")
        .config("spark.python.worker.memory", args.worker_memory)
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    n, keys = args.records, args.keys
    rdd = sc.range(0, n, numSlices=args.partitions).map(
        lambda i: (f"k{(i * 2654435761) % keys}" if i % 2 else (i * 40503) % keys, i % 1000)
    )
    print(
        f"# {n:,} records, {keys:,}-ish keys (int and str), {args.partitions} partitions, "
        f"local[2], spark.python.worker.memory={args.worker_memory}, load {os.getloadavg()[0]:.1f}"
    )
    for name in args.calls:
        answers = []
        for installed in (False, True):
            row, answer = run(sc, name, rdd, installed)
            answers.append(answer)
            print(row, flush=True)
        assert answers[0] == answers[1], f"{name}: stock and extagg answers differ"
    if args.skip_dataframe:
        return
    df = spark.range(0, n, numPartitions=args.partitions).select(
        (F.col("id") * 40503 % keys).alias("k"),
        (F.col("id") % 1000).alias("v"),
        (F.col("id") % 97 / 7.0).alias("x"),
    )
    df = df.cache()
    df.count()
    aggs = {"n": ("*", "count"), "s": ("v", "sum"), "m": ("x", "mean"), "mx": ("v", "max")}
    exprs = [F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"), F.avg("x").alias("m"),
             F.max("v").alias("mx")]  # fmt: skip
    results = {}
    for label, make in (
        ("df.groupBy().agg()", lambda: df.groupBy("k").agg(*exprs)),
        ("extagg.spark.aggregate", lambda: es.aggregate(df, ["k"], aggs)),
    ):
        with RssSampler() as rss:
            start = time.perf_counter()
            out = make().select(F.sum(F.hash("k", "n", "s", "mx"))).first()[0]
            wall = time.perf_counter() - start
        results[label] = out
        print(
            {
                "call": label,
                "wall_s": round(wall, 2),
                "worker_peak_rss_mib": round(rss.peak / 2**20, 1),
            },
            flush=True,
        )
    assert len(set(results.values())) == 1, results
    spark.stop()


if __name__ == "__main__":
    main()

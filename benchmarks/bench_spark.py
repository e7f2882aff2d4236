"""PySpark's own RDD aggregations with and without ``extagg.spark.install()``, on local[2].

    .venv/bin/python benchmarks/bench_spark.py            # the issue's measurement (~10-15 min)
    .venv/bin/python benchmarks/bench_spark.py --quick    # a small run that checks the script
    .venv/bin/python benchmarks/bench_spark.py --records 3000000 --keys 1000000 --keys-type int

For each of ``reduceByKey``, ``aggregateByKey`` (tuple combiner) and
``groupByKey().mapValues(len)``, on a workload of int keys and one of string keys (apart, so
that the stock merger can sort its keys when it spills): wall time, the Python workers' peak RSS (sampled every 50 ms from the JVM's process tree) against their fixed
RSS (a worker that ran a trivial job importing what the engine imports) and the spill bytes
Spark's task metrics carry, stock and with extagg installed, at a worker memory that makes the
stock merger spill. A call that fails is recorded with its error and the run goes on. Then
``extagg.spark.aggregate`` against ``df.groupBy().agg()``. Every pair of answers is checked
equal; ``--out`` appends the rows as JSON lines.
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


def tree_cpu() -> tuple[float, float]:
    """CPU seconds (user + system) of this process's descendants so far, and of the Python
    ones (the workers and their daemon), the children they reaped included: on a shared
    machine a call's CPU time says more than its wall time."""
    total = python = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            t = proc.cpu_times()
            cpu = t.user + t.system + t.children_user + t.children_system
            total += cpu
            if "python" in proc.name().lower():
                python += cpu
        except psutil.Error:
            pass
    return total, python


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


def _worker_rss(_: Any) -> int:
    """In a worker: its RSS after importing what a job with extagg installed imports."""
    import psutil as ps

    if os.environ.get("EXTAGG_BENCH_IMPORT"):
        import extagg.spark.merger
        import extagg.spark.shuffle
    if os.environ.get("EXTAGG_BENCH_IMPORT") == "engine":  # reduceByKey's, aggregateByKey's
        import extagg.generic.external_map
        import extagg.generic.typed_map  # noqa: F401
    return int(ps.Process().memory_info().rss)


def warm_up(sc: Any, installed: bool) -> None:
    """Run every benchmarked call once on 40 k records at a 1 MiB worker memory (so that the
    engines spill and merge): the workers then hold what does not grow with the data -- the
    imports and, with extagg, the compiled kernels loaded from numba's cache (~10 MiB) -- as
    ``extagg aggregate`` counts its fixed RSS after loading the query's kernels."""
    import extagg.spark as es

    conf = sc._conf  # PySpark reads the worker memory from the driver's conf per call
    memory = conf.get("spark.python.worker.memory")
    conf.set("spark.python.worker.memory", "1m")
    if installed:
        es.install()
    try:
        for kind in ("int", "str"):
            for call in CALLS.values():
                call(make_rdd(sc, kind, 40_000, 4_000, 2)).count()
    finally:
        es.uninstall()
        conf.set("spark.python.worker.memory", memory)


def fixed_rss(sc: Any, installed: bool, flag: str = "engine") -> int:
    """A worker's RSS before any benchmarked call (the fixed overhead the budget comes on top
    of): with extagg, after importing what reduceByKey and aggregateByKey need
    (``flag="engine"``, numba included; reused workers keep it for every later call) or
    groupByKey alone (``"1"``); after :func:`warm_up`, the kernels included."""
    import extagg.spark as es

    if installed:
        es.install()
    try:
        # a new worker: the import flag travels in the closure, not in the worker's env
        flag = flag if installed else ""

        def probe(it: Any) -> Any:
            os.environ["EXTAGG_BENCH_IMPORT"] = flag
            yield max(_worker_rss(x) for x in it)

        return int(sc.parallelize(range(2), 2).mapPartitions(probe).max())
    finally:
        es.uninstall()


def run(sc: Any, call: str, kind: str, rdd: Any, installed: bool) -> tuple[dict[str, Any], Any]:
    """One timed call; a failure is recorded in the row (``error``), not raised."""
    import extagg.spark as es

    engine = "extagg" if installed else "stock"
    group = f"{call}-{kind}-{engine}-{time.monotonic_ns()}"
    sc.setJobGroup(group, group)
    row: dict[str, Any] = {"call": call, "keys": kind, "engine": engine}
    out: Any = None
    if installed:
        es.install()
    rss = RssSampler()
    try:
        with rss:
            cpu0, py0 = tree_cpu()
            start = time.perf_counter()
            try:
                out = CALLS[call](rdd).map(lambda kv: hash((kv[0], kv[1])) & 0xFFFFFFFF).sum()
            except Exception as exc:  # recorded, and the next call runs
                row["error"] = f"{type(exc).__name__}: {_short(exc)}"
            wall = time.perf_counter() - start
            cpu1, py1 = tree_cpu()
    finally:
        es.uninstall()
    memory, disk = spill_bytes(sc, group)
    row.update(
        wall_s=round(wall, 2),
        cpu_s=round(cpu1 - cpu0, 2),
        worker_cpu_s=round(py1 - py0, 2),
        worker_peak_rss_mib=round(rss.peak / 2**20, 1),
        memory_spilled_mib=round(memory / 2**20, 1),
        disk_spilled_mib=round(disk / 2**20, 1),
    )
    return row, out


def _short(exc: BaseException) -> str:
    """The telling line of a (Py4J-wrapped) worker error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line:
            return line[:300]
    return (lines[-1] if lines else repr(exc))[:300]


def make_rdd(sc: Any, kind: str, n: int, keys: int, partitions: int) -> Any:
    """``n`` records over ``keys`` keys (int, or the string ``k<int>``), values 0..999."""
    if kind == "int":
        return sc.range(0, n, numSlices=partitions).map(lambda i: ((i * 40503) % keys, i % 1000))
    return sc.range(0, n, numSlices=partitions).map(
        lambda i: (f"k{(i * 2654435761) % keys}", i % 1000)
    )


def print_table(rows: list[dict[str, Any]], fixed: dict[str, int], budget_mib: float) -> None:
    print("\n| call | keys | stock s | extagg s | speed-up | CPU s stock / extagg (workers) "
          "| peak RSS stock / extagg MiB | disk spilled stock / extagg MiB |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    pairs: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for row in rows:
        pairs.setdefault((row["call"], row["keys"]), {})[row["engine"]] = row
    for (call, kind), by in pairs.items():
        s, e = by.get("stock", {}), by.get("extagg", {})

        def cell(r: dict[str, Any], key: str) -> str:
            return "error" if "error" in r else str(r.get(key, "-"))

        ratio = (
            f"{s['wall_s'] / e['wall_s']:.2f}x"
            if "error" not in s and "error" not in e and s and e
            else "-"
        )
        print(
            f"| {call} | {kind} | {cell(s, 'wall_s')} | {cell(e, 'wall_s')} | {ratio} | "
            f"{s.get('cpu_s', '-')} / {e.get('cpu_s', '-')} "
            f"({s.get('worker_cpu_s', '-')} / {e.get('worker_cpu_s', '-')}) | "
            f"{s.get('worker_peak_rss_mib', '-')} / {e.get('worker_peak_rss_mib', '-')} | "
            f"{s.get('disk_spilled_mib', '-')} / {e.get('disk_spilled_mib', '-')} |"
        )
    for row in rows:
        if "error" in row:
            print(f"- {row['call']} {row['keys']} {row['engine']}: {row['error']}")
    print(
        "\nworker fixed RSS: "
        + ", ".join(f"{e} {b / 2**20:.0f} MiB" for e, b in fixed.items())
        + f"; worker budget {budget_mib:.0f} MiB → RSS target ≤ 1.25 × budget + fixed = "
        + ", ".join(f"{e} {1.25 * budget_mib + b / 2**20:.0f} MiB" for e, b in fixed.items())
    )


def dataframe_part(spark: Any, n: int, keys: int, partitions: int) -> list[dict[str, Any]]:
    """``extagg.spark.aggregate`` against ``df.groupBy().agg()``: the common functions, then
    var/std of values with a large mean, exact decimal sum/avg, ``count_distinct`` and the exact
    quantiles (``median``, ``percentile``)."""
    from pyspark.sql import functions as F

    import extagg.spark as es

    df = spark.range(0, n, numPartitions=partitions).select(
        (F.col("id") * 40503 % keys).alias("k"),
        (F.col("id") % 1000).alias("v"),
        (F.col("id") % 97 / 7.0).alias("x"),
        (F.lit(1.7e9) + F.col("id") % 601).alias("t"),  # epoch seconds: a large mean
        (F.col("id") % 100003 / 100).cast("decimal(12,2)").alias("d"),
        (F.col("id") % 997).alias("u"),
    )
    df = df.cache()
    df.count()
    cases = {
        "count, sum, mean, max": (
            {"n": ("*", "count"), "s": ("v", "sum"), "m": ("x", "mean"), "mx": ("v", "max")},
            [F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"), F.avg("x").alias("m"),
             F.max("v").alias("mx")],
            ["n", "s", "mx"],
        ),
        "std, var_pop": (
            {"sd": ("t", "std"), "vp": ("t", "var_pop")},
            [F.stddev("t").alias("sd"), F.var_pop("t").alias("vp")],
            [],
        ),
        "decimal sum, avg": (
            {"s": ("d", "sum"), "m": ("d", "mean")},
            [F.sum("d").alias("s"), F.avg("d").alias("m")],
            ["s", "m"],
        ),
        "count_distinct, count": (
            {"u": ("u", "count_distinct"), "n": ("*", "count")},
            [F.countDistinct("u").alias("u"), F.count(F.lit(1)).alias("n")],
            ["u", "n"],
        ),
        "median, percentile": (
            {"md": ("v", "median"), "p9": ("x", "percentile(0.9)")},
            [F.median("v").alias("md"), F.percentile("x", 0.9).alias("p9")],
            [],
        ),
    }  # fmt: skip
    rows = []
    for case, (aggs, exprs, exact) in cases.items():
        results: dict[str, Any] = {}
        for label, make in (
            ("df.groupBy().agg()", lambda: df.groupBy("k").agg(*exprs)),  # noqa: B023
            ("extagg.spark.aggregate", lambda: es.aggregate(df, ["k"], aggs)),  # noqa: B023
        ):
            row: dict[str, Any] = {"call": label, "functions": case}
            with RssSampler() as rss:
                start = time.perf_counter()
                try:
                    out = make()
                    # exact columns hashed; floats summed (their last bits may differ)
                    floats = [c for c in aggs if c not in exact]
                    results[label] = out.select(
                        F.sum(F.hash("k", *exact)), *(F.sum(c) for c in floats)
                    ).first()
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {_short(exc)}"
                row["wall_s"] = round(time.perf_counter() - start, 2)
            row["worker_peak_rss_mib"] = round(rss.peak / 2**20, 1)
            rows.append(row)
            print(row, flush=True)
        if len(results) == 2:
            a, b = results.values()
            same = a[0] == b[0] and all(
                abs(x - y) <= 1e-9 * max(abs(x), abs(y)) for x, y in zip(a[1:], b[1:], strict=True)
            )
            print(f"{case}: answers {'equal' if same else 'DIFFER: ' + str(results)}", flush=True)
    df.unpersist()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=2_000_000, help="distinct keys (groups)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--worker-memory", default="32m")
    parser.add_argument("--keys-type", nargs="*", default=["int", "str"], choices=["int", "str"])
    parser.add_argument("--skip-dataframe", action="store_true")
    parser.add_argument("--calls", nargs="*", default=list(CALLS), choices=list(CALLS))
    parser.add_argument("--engines", nargs="*", default=["stock", "extagg"])
    parser.add_argument(
        "--interleave", action="store_true", help="alternate stock and extagg on each call"
    )
    parser.add_argument("--quick", action="store_true", help="200k records, 50k keys, 8m")
    parser.add_argument("--out", help="append the rows to this file as JSON lines")
    args = parser.parse_args()
    if args.quick:
        args.records, args.keys, args.worker_memory = 200_000, 50_000, "8m"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from extagg._config import parse_size

    def new_session() -> Any:
        """A SparkSession with its own Python workers (a stopped one's workers exit)."""
        session = (
            SparkSession.builder.master("local[2]")
            .appName("extagg-bench-spark")
            .config("spark.ui.enabled", "false")
            .config("spark.python.worker.memory", args.worker_memory)
            .config("spark.python.worker.reuse", "true")
            .config("spark.sql.shuffle.partitions", str(args.partitions))
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("OFF")
        return session

    spark = new_session()
    sc = spark.sparkContext
    n, keys = args.records, args.keys
    budget_mib = parse_size(args.worker_memory) / 2**20
    started = time.perf_counter()
    print(
        f"# {n:,} records, {keys:,} keys ({' and '.join(args.keys_type)}, apart), "
        f"{args.partitions} partitions, local[2], spark.python.worker.memory={args.worker_memory}, "
        f"load {os.getloadavg()[0]:.1f} at start",
        flush=True,
    )
    # each engine in a session of its own: Python workers are reused, and one keeps what its
    # allocator holds from earlier tasks (and the modules it imported), which would count
    # against the other engine; in --interleave mode both share the workers
    fixed: dict[str, int] = {}
    imports: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    answers: dict[tuple[str, str], dict[str, Any]] = {}

    def measure_fixed(engine: str) -> None:
        imports[engine] = fixed_rss(sc, engine == "extagg")
        warm_up(sc, engine == "extagg")
        fixed[engine] = fixed_rss(sc, engine == "extagg")

    if args.interleave:  # stock and extagg alternate; stock's RSS then counts extagg's imports
        for engine in args.engines:
            measure_fixed(engine)
        order = [(e, k, c) for k in args.keys_type for c in args.calls for e in args.engines]
    else:
        order = [(e, k, c) for e in args.engines for k in args.keys_type for c in args.calls]
    for engine, kind, call in order:
        if engine not in fixed:
            if fixed:  # the next engine: new workers
                spark.stop()
                spark = new_session()
                sc = spark.sparkContext
            measure_fixed(engine)
        rdd = make_rdd(sc, kind, n, keys, args.partitions)
        row, answer = run(sc, call, kind, rdd, engine == "extagg")
        rows.append(row)
        if "error" not in row:
            answers.setdefault((call, kind), {})[engine] = answer
        print(row, flush=True)
    for (call, kind), by in answers.items():
        if len(set(by.values())) > 1:
            print(f"!! {call} {kind}: stock and extagg answers differ: {by}", flush=True)
            for row in rows:
                if row["call"] == call and row["keys"] == kind:
                    row["error"] = "answers differ"
    print_table(rows, fixed, budget_mib)
    print(
        "worker RSS after imports only (before the warm-up job): "
        + ", ".join(f"{e} {b / 2**20:.0f} MiB" for e, b in imports.items())
    )
    if not args.skip_dataframe:
        rows += dataframe_part(spark, n, keys, args.partitions)
    print(f"\n# done in {time.perf_counter() - started:.0f} s, load {os.getloadavg()[0]:.1f}")
    if args.out:
        import json

        with open(args.out, "a") as f:
            for row in rows:
                fixed_mib = round(fixed.get(row.get("engine", ""), 0) / 2**20, 1) or None
                f.write(json.dumps({**row, "records": n, "groups": keys,
                                    "worker_memory": args.worker_memory,
                                    "worker_fixed_rss_mib": fixed_mib}) + "\n")  # fmt: skip
    spark.stop()


if __name__ == "__main__":
    main()

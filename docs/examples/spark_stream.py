"""A Structured Streaming query keeping running totals in extagg's state store, killed, restarted.

    python docs/examples/spark_stream.py demo /tmp/extagg-stream-demo

writes JSON files into ``<dir>/input`` one by one, runs the query (one file per micro-batch) in a
child process, kills that process with SIGKILL in the middle of batch 2 — after extagg committed
the batch's state, before Spark committed the batch — adds more files, restarts the query, and
checks the state against a plain batch computation over every file. ``job`` mode is the query.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time

SCHEMA = "k string, v long, x double"
BY = ["k"]
AGGS = {
    "n": ("*", "count"),
    "total": ("v", "sum"),
    "biggest": ("v", "max"),
    "mean_x": ("x", "mean"),
    "std_x": ("x", "std"),
}


def run_job(workdir: str, slow_batch: int | None) -> None:
    """The streaming query: files of <workdir>/input → running aggregates in <workdir>/state."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import extagg.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("extagg-stream-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", os.path.join(workdir, "spark-local"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    stream = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(os.path.join(workdir, "input"))
    )
    update = extagg.spark.StatefulAggregate(BY, AGGS, os.path.join(workdir, "state"), memory="32m")

    def each_batch(batch_df, batch_id):
        update(batch_df, batch_id)
        print(f"batch {batch_id} merged into the state", flush=True)
        if batch_id == slow_batch:
            # the state of this batch is committed; Spark's commit of it is not yet written
            open(os.path.join(workdir, f"in-batch-{batch_id}"), "w").close()
            time.sleep(600)

    query = (
        stream.writeStream.foreachBatch(each_batch)
        .option("checkpointLocation", os.path.join(workdir, "spark-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


def write_file(workdir: str, index: int, rows: int = 2000) -> list[dict]:
    rng = random.Random(index)
    records = [
        {"k": f"key-{rng.randrange(50)}", "v": rng.randrange(1000), "x": rng.uniform(0, 10)}
        for _ in range(rows)
    ]
    path = os.path.join(workdir, "input", f"part-{index:03d}.json")
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    os.replace(path + ".tmp", path)  # the stream only ever sees whole files
    return records


def batch_answer(records: list[dict]) -> dict:
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r["k"], []).append(r)
    out = {}
    for k, rs in groups.items():
        xs = [r["x"] for r in rs]
        mean = sum(xs) / len(xs)
        var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else None
        out[k] = {
            "n": len(rs),
            "total": sum(r["v"] for r in rs),
            "biggest": max(r["v"] for r in rs),
            "mean_x": mean,
            "std_x": None if var is None else math.sqrt(var),
        }
    return out


def demo(workdir: str) -> int:
    os.makedirs(os.path.join(workdir, "input"), exist_ok=True)
    records: list[dict] = []
    for i in range(4):
        records += write_file(workdir, i)
    job = [sys.executable, __file__, "job", workdir]
    # its own process group: the kill takes the query's JVM down with it
    child = subprocess.Popen([*job, "--slow-batch", "2"], start_new_session=True)
    marker = os.path.join(workdir, "in-batch-2")
    deadline = time.monotonic() + 300
    while not os.path.exists(marker):
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            raise SystemExit("the query never reached batch 2")
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    print(f"killed the query in batch 2 (exit {child.returncode}); restarting", flush=True)
    for i in range(4, 5):
        records += write_file(workdir, i)
    subprocess.run(job, check=True)

    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    import extagg.spark
    from extagg.state import Checkpoint

    schema = StructType(
        [
            StructField("k", StringType()),
            StructField("v", LongType()),
            StructField("x", DoubleType()),
        ]
    )
    update = extagg.spark.StatefulAggregate(BY, AGGS, os.path.join(workdir, "state"))
    state = update.results(schema)
    expected = batch_answer(records)
    batches = Checkpoint(os.path.join(workdir, "state")).committed_batches()
    print(f"state batches committed: {batches}; {len(state)} keys")
    ok = state.keys() == expected.keys() and batches == list(range(5))
    for k, want in expected.items():
        got = state.get(k, {})
        for name, value in want.items():
            same = (
                got.get(name) == value
                if isinstance(value, int) or value is None
                else math.isclose(got.get(name) or math.nan, value, rel_tol=1e-9)
            )
            if not same:
                print(f"MISMATCH {k} {name}: state {got.get(name)!r}, batch {value!r}")
                ok = False
    print("state equals the batch computation" if ok else "state DIFFERS from the batch answer")
    return 0 if ok else 1


if __name__ == "__main__":
    mode, workdir = sys.argv[1], sys.argv[2]
    if mode == "job":
        slow = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--slow-batch" else None
        run_job(workdir, slow)
    else:
        sys.exit(demo(workdir))

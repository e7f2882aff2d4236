"""Reading an N-key Spark state version: extagg (no JVM) vs Spark's own ``statestore`` reader.

The state is a real Spark checkpoint layout for a ``groupBy(k).agg(count, sum)`` (key
``struct<k: string>``, value ``struct<count: bigint, sum: bigint>``), written by
``extagg.state.spark.write_state`` (Spark reads it back; the tests prove it). Two shapes:

* ``snapshot``: version 1 as ``1.snapshot`` per partition (extagg streams it as is);
* ``delta``: the snapshot removed, version 1 is ``1.delta`` (extagg rebuilds it through the
  external map under ``--memory``).

Each reader runs in its own process. extagg: ``read_state(...).iter_batches()`` to Arrow,
every row decoded. Spark: ``SparkSession`` on ``local[2]`` then
``spark.read.format("statestore").load(cp).write.format("noop")`` (every row produced); the
wall time of the whole process is "JVM start included", the read alone "excluded". Peak RSS is
sampled over the process tree (the JVM included) every 50 ms.

    .venv/bin/python benchmarks/bench_spark_state.py --keys 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

KEY = {
    "type": "struct",
    "fields": [{"name": "k", "type": "string", "nullable": True, "metadata": {}}],
}
VALUE = {
    "type": "struct",
    "fields": [
        {"name": "count", "type": "long", "nullable": True, "metadata": {}},
        {"name": "sum", "type": "long", "nullable": True, "metadata": {}},
    ],
}

EXTAGG_CHILD = """
import sys, time, json
t0 = time.perf_counter()
from extagg.state.spark import read_state
rows = 0
for batch in read_state(sys.argv[1], memory=sys.argv[2]).iter_batches():
    rows += batch.num_rows
print(json.dumps({"rows": rows, "read_s": time.perf_counter() - t0}))
"""

SPARK_CHILD = """
import sys, time, json, os
os.environ["PYSPARK_PYTHON"] = sys.executable
t0 = time.perf_counter()
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.driver.memory", "2g").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
t1 = time.perf_counter()
df = spark.read.format("statestore").load(sys.argv[1])
df.write.format("noop").mode("overwrite").save()
t2 = time.perf_counter()
rows = spark.read.format("statestore").load(sys.argv[1]).count()
spark.stop()
print(json.dumps({"rows": rows, "start_s": t1 - t0, "read_s": t2 - t1}))
"""


def build(path: str, keys: int, partitions: int) -> float:
    from extagg.state.spark import write_state

    started = time.perf_counter()
    rows = (({"k": f"user-{i:09d}"}, {"count": i % 97 + 1, "sum": i * 3}) for i in range(keys))
    write_state(path, 0, KEY, VALUE, rows, batch_id=0, num_partitions=partitions)
    return time.perf_counter() - started


def measure(code: str, *args: str) -> dict:
    """Run ``code`` in a child Python; wall time and peak RSS of its whole process tree."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, cwd=ROOT, text=True
    )
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        parent = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                tree = [parent, *parent.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree))
            except psutil.Error:
                pass
            time.sleep(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    out, _ = proc.communicate()
    stop.set()
    thread.join()
    if proc.returncode:
        raise RuntimeError(f"child failed with {proc.returncode}")
    result = json.loads(out.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - started
    result["peak_rss_mb"] = peak / 2**20
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--memory", default="256m", help="extagg's budget for the external map")
    parser.add_argument("--shapes", nargs="+", default=["snapshot", "delta"])
    parser.add_argument("--no-spark", action="store_true")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="bench-spark-state-")
    try:
        checkpoint = os.path.join(work, "cp")
        print(f"writing {args.keys:,} keys: {build(checkpoint, args.keys, args.partitions):.1f} s")
        print(f"load average {os.getloadavg()[0]:.1f} (2 cores, shared machine)")
        for shape in args.shapes:
            if shape == "delta":
                for p in range(args.partitions):
                    os.unlink(os.path.join(checkpoint, "state", "0", str(p), "1.snapshot"))
                    os.unlink(os.path.join(checkpoint, "state", "0", str(p), ".1.snapshot.crc"))
            ours = measure(EXTAGG_CHILD, checkpoint, args.memory)
            print(
                f"[{shape}] extagg: {ours['rows']:,} rows, wall {ours['wall_s']:.1f} s "
                f"(read {ours['read_s']:.1f} s), peak RSS {ours['peak_rss_mb']:.0f} MB"
            )
            if not args.no_spark:
                theirs = measure(SPARK_CHILD, checkpoint)
                print(
                    f"[{shape}] spark : {theirs['rows']:,} rows, wall {theirs['wall_s']:.1f} s "
                    f"(JVM+session start {theirs['start_s']:.1f} s, read {theirs['read_s']:.1f} s), "
                    f"peak RSS {theirs['peak_rss_mb']:.0f} MB"
                )
        print(f"load average {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Real Spark checkpoints for the Spark-state tests, built once per session.

Each builder writes its input batches as Parquet files (one file per micro-batch), runs a
streaming query over them with ``trigger(availableNow=True)`` and ``maxFilesPerTrigger=1``, and
returns the checkpoint directory. Snapshots are forced by a small ``minDeltasForSnapshot`` and a
short maintenance interval.
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq

UTC = dt.timezone.utc


def _write_batches(directory: str, batches: list[pa.Table]) -> None:
    os.makedirs(directory, exist_ok=True)
    for index, table in enumerate(batches):
        pq.write_table(table, os.path.join(directory, f"part-{index:04d}.parquet"))


def _run(query_builder, checkpoint: str) -> None:
    query = (
        query_builder.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    )
    query.awaitTermination()
    if query.exception() is not None:  # pragma: no cover - surfaced by the test
        raise RuntimeError(str(query.exception()))


def _stream(spark, directory: str, schema):
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(directory)


def build_aggregation(spark, root: str, mode: str, name: str | None = None) -> str:
    """``groupBy(k).agg(count, sum)`` in ``mode`` over four batches (its checkpoint and input
    folders named after ``name``, default ``agg-<mode>``)."""
    from pyspark.sql import functions as F

    name = name or f"agg-{mode}"
    data = os.path.join(root, f"{name}-in")
    rng = random.Random(7)
    words = ["apple", "banana", "cherry", "date", "elderberry", "fig", "grape", "", "ü-nicode"]
    batches = []
    for _ in range(4):
        ks = [rng.choice(words) for _ in range(12)]
        vs = [rng.randrange(-50, 100) for _ in ks]
        batches.append(pa.table({"k": ks, "v": pa.array(vs, pa.int64())}))
    _write_batches(data, batches)
    df = _stream(spark, data, "k string, v long")
    agg = df.groupBy("k").agg(F.count("*").alias("cnt"), F.sum("v").alias("total"))
    checkpoint = os.path.join(root, name)
    _run(agg.writeStream.format("noop").outputMode(mode), checkpoint)
    return checkpoint


def build_global_aggregation(spark, root: str) -> str:
    """``agg(count, sum)`` with no ``groupBy`` over three batches: the key schema is the empty
    ``struct<>`` and the state is in partition 0 only, whatever the shuffle partitions."""
    from pyspark.sql import functions as F

    data = os.path.join(root, "global-in")
    _write_batches(
        data, [pa.table({"v": pa.array(range(i, i + 4 * i + 1), pa.int64())}) for i in range(3)]
    )
    agg = _stream(spark, data, "v long").agg(F.count("*").alias("cnt"), F.sum("v").alias("total"))
    checkpoint = os.path.join(root, "global")
    _run(agg.writeStream.format("noop").outputMode("update"), checkpoint)
    return checkpoint


def build_typed_aggregation(spark, root: str) -> str:
    """A complete-mode aggregation keyed by (int, decimal, date) with typed aggregates."""
    from pyspark.sql import functions as F

    data = os.path.join(root, "typed-in")
    rng = random.Random(11)
    batches = []
    for _ in range(3):
        n = 10
        batches.append(
            pa.table(
                {
                    "g": pa.array([rng.randrange(3) for _ in range(n)], pa.int32()),
                    "d": pa.array(
                        [decimal.Decimal(rng.randrange(-999, 999)) / 100 for _ in range(n)],
                        pa.decimal128(10, 2),
                    ),
                    "day": pa.array(
                        [dt.date(2024, 1, 1 + rng.randrange(2)) for _ in range(n)], pa.date32()
                    ),
                    "x": pa.array([rng.random() * 100 for _ in range(n)], pa.float64()),
                    "big": pa.array(
                        [decimal.Decimal(rng.randrange(10**20)) / 10**3 for _ in range(n)],
                        pa.decimal128(30, 3),
                    ),
                }
            )
        )
    _write_batches(data, batches)
    df = _stream(spark, data, "g int, d decimal(10,2), day date, x double, big decimal(30,3)")
    agg = df.groupBy("g", "d", "day").agg(
        F.sum("x").alias("sx"),
        F.avg("x").alias("ax"),
        F.sum("big").alias("sbig"),
        F.max("x").alias("mx"),
    )
    checkpoint = os.path.join(root, "typed")
    _run(agg.writeStream.format("noop").outputMode("complete"), checkpoint)
    return checkpoint


def build_window(spark, root: str) -> str:
    """A windowed count with a watermark: later batches evict old windows (deletes)."""
    from pyspark.sql import functions as F

    data = os.path.join(root, "window-in")
    base = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
    batches = []
    for batch in range(4):
        ts = [base + dt.timedelta(seconds=batch * 30 + i * 3) for i in range(8)]
        ks = [["a", "b", "c"][i % 3] for i in range(8)]
        batches.append(pa.table({"k": ks, "t": pa.array(ts, pa.timestamp("us", tz="UTC"))}))
    _write_batches(data, batches)
    df = _stream(spark, data, "k string, t timestamp")
    agg = (
        df.withWatermark("t", "10 seconds")
        .groupBy(F.window("t", "10 seconds"), "k")
        .agg(F.count("*").alias("cnt"))
    )
    checkpoint = os.path.join(root, "window")
    _run(agg.writeStream.format("noop").outputMode("update"), checkpoint)
    return checkpoint


def typed_rows(count: int, seed: int) -> list[dict]:
    """Rows of every key-able type (None in every column now and then), for dropDuplicates."""
    rng = random.Random(seed)

    def maybe(value):
        return None if rng.random() < 0.15 else value

    rows = []
    for _ in range(count):
        rows.append(
            {
                "b": maybe(rng.random() < 0.5),
                "i8": maybe(rng.randrange(-128, 128)),
                "i16": maybe(rng.randrange(-(2**15), 2**15)),
                "i32": maybe(rng.randrange(-(2**31), 2**31)),
                "i64": maybe(rng.randrange(-(2**63), 2**63)),
                "f32": maybe(rng.choice([0.5, -1.25, 3.0e10, 1.5])),
                "f64": maybe(rng.uniform(-1e300, 1e300)),
                "dec": maybe(decimal.Decimal(rng.randrange(-(10**17), 10**17)) / 10**4),
                "bigdec": maybe(decimal.Decimal(rng.randrange(-(10**37), 10**37)) / 10**6),
                "s": maybe("".join(rng.choice("abcé€𝄞 xyz") for _ in range(rng.randrange(0, 20)))),
                "bin": maybe(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 13)))),
                "day": maybe(dt.date(1960, 1, 1) + dt.timedelta(days=rng.randrange(40000))),
                "ts": maybe(
                    dt.datetime(1960, 1, 1, tzinfo=UTC)
                    + dt.timedelta(microseconds=rng.randrange(2 * 10**15))
                ),
                "ntz": maybe(
                    dt.datetime(1990, 1, 1) + dt.timedelta(microseconds=rng.randrange(10**15))
                ),
                "st": maybe(
                    {"x": maybe(rng.randrange(1000)), "y": maybe(rng.choice(["p", "q", "rr"]))}
                ),
                "arr": maybe([maybe(rng.randrange(-5, 5)) for _ in range(rng.randrange(0, 5))]),
                "sarr": maybe(
                    [maybe(rng.choice(["u", "vv", ""])) for _ in range(rng.randrange(4))]
                ),
            }
        )
    return rows


TYPED_SCHEMA_DDL = (
    "b boolean, i8 tinyint, i16 smallint, i32 int, i64 bigint, f32 float, f64 double, "
    "dec decimal(18,4), bigdec decimal(38,6), s string, bin binary, day date, ts timestamp, "
    "ntz timestamp_ntz, st struct<x: int, y: string>, arr array<int>, sarr array<string>"
)


def typed_arrow_schema() -> pa.Schema:
    return pa.schema(
        [
            ("b", pa.bool_()),
            ("i8", pa.int8()),
            ("i16", pa.int16()),
            ("i32", pa.int32()),
            ("i64", pa.int64()),
            ("f32", pa.float32()),
            ("f64", pa.float64()),
            ("dec", pa.decimal128(18, 4)),
            ("bigdec", pa.decimal128(38, 6)),
            ("s", pa.string()),
            ("bin", pa.binary()),
            ("day", pa.date32()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("ntz", pa.timestamp("us")),
            ("st", pa.struct([("x", pa.int32()), ("y", pa.string())])),
            ("arr", pa.list_(pa.int32())),
            ("sarr", pa.list_(pa.string())),
        ]
    )


def build_dedup(spark, root: str) -> str:
    """``dropDuplicates`` over every key-able type: the state keys are rows Spark encoded."""
    data = os.path.join(root, "dedup-in")
    rows = typed_rows(150, seed=3)
    schema = typed_arrow_schema()
    batches = [pa.Table.from_pylist(rows[i : i + 50], schema=schema) for i in range(0, 150, 50)]
    batches.append(pa.Table.from_pylist(rows[:20], schema=schema))  # duplicates only
    _write_batches(data, batches)
    df = _stream(spark, data, TYPED_SCHEMA_DDL)
    checkpoint = os.path.join(root, "dedup")
    _run(df.dropDuplicates().writeStream.format("noop").outputMode("append"), checkpoint)
    return checkpoint


def build_map_values(spark, root: str) -> str:
    """State values holding maps and arrays: ``groupBy(k).agg(first(m), max(arr))``."""
    from pyspark.sql import functions as F

    data = os.path.join(root, "maps-in")
    rng = random.Random(5)
    batches = []
    for _ in range(2):
        n = 8
        batches.append(
            pa.table(
                {
                    "k": pa.array([rng.randrange(3) for _ in range(n)], pa.int64()),
                    "m": pa.array(
                        [
                            [
                                (f"k{j}", rng.choice([None, j * 1.5]))
                                for j in range(rng.randrange(3))
                            ]
                            for _ in range(n)
                        ],
                        pa.map_(pa.string(), pa.float64()),
                    ),
                }
            )
        )
    _write_batches(data, batches)
    df = _stream(spark, data, "k long, m map<string, double>")
    agg = df.groupBy("k").agg(F.first("m").alias("fm"), F.count("*").alias("n"))
    checkpoint = os.path.join(root, "maps")
    _run(agg.writeStream.format("noop").outputMode("update"), checkpoint)
    return checkpoint


def build_join(spark, root: str) -> str:
    """An inner stream-stream join on ``id`` (state on both sides, never evicted)."""
    left_dir = os.path.join(root, "join-left")
    right_dir = os.path.join(root, "join-right")
    rng = random.Random(9)
    lefts, rights = [], []
    for _ in range(3):
        lefts.append(
            pa.table(
                {
                    "id": pa.array([rng.randrange(6) for _ in range(5)], pa.int32()),
                    "lv": [f"l{rng.randrange(100)}" for _ in range(5)],
                }
            )
        )
        rights.append(
            pa.table(
                {
                    "id": pa.array([rng.randrange(6) for _ in range(5)], pa.int32()),
                    "rv": pa.array([rng.randrange(100) for _ in range(5)], pa.int64()),
                }
            )
        )
    _write_batches(left_dir, lefts)
    _write_batches(right_dir, rights)
    left = _stream(spark, left_dir, "id int, lv string")
    right = _stream(spark, right_dir, "id int, rv long").withColumnRenamed("id", "rid")
    joined = left.join(right, left.id == right.rid)
    checkpoint = os.path.join(root, "join")
    _run(joined.writeStream.format("noop").outputMode("append"), checkpoint)
    return checkpoint


def build_pandas_state(spark, root: str) -> str:
    """``applyInPandasWithState`` keeping a running count and last value per key."""
    import pandas as pd
    from pyspark.sql.streaming.state import GroupStateTimeout

    data = os.path.join(root, "pstate-in")
    rng = random.Random(13)
    batches = []
    for _ in range(3):
        batches.append(
            pa.table(
                {
                    "k": [rng.choice(["x", "y", "z"]) for _ in range(6)],
                    "v": pa.array([rng.randrange(10) for _ in range(6)], pa.int64()),
                }
            )
        )
    _write_batches(data, batches)

    def update(key, pdfs, state):
        count, last = state.get if state.exists else (0, 0)
        for pdf in pdfs:
            count += len(pdf)
            last = int(pdf["v"].iloc[-1])
        state.update((count, last))
        yield pd.DataFrame({"k": [key[0]], "count": [count]})

    df = _stream(spark, data, "k string, v long")
    out = df.groupBy("k").applyInPandasWithState(
        update,
        outputStructType="k string, count long",
        stateStructType="count long, last long",
        outputMode="update",
        timeoutConf=GroupStateTimeout.NoTimeout,
    )
    checkpoint = os.path.join(root, "pstate")
    _run(out.writeStream.format("noop").outputMode("update"), checkpoint)
    return checkpoint


def build_compressed(spark, root: str, codec: str) -> str:
    """The aggregation of :func:`build_aggregation` with its state files compressed by
    ``codec`` (``spark.sql.streaming.stateStore.compression.codec``)."""
    key = "spark.sql.streaming.stateStore.compression.codec"
    spark.conf.set(key, codec)
    try:
        return build_aggregation(spark, root, "update", name=f"codec-{codec}")
    finally:
        spark.conf.unset(key)


def build_rocksdb(spark, root: str) -> str:
    """The same aggregation with the RocksDB provider (which extagg refuses)."""
    key = "spark.sql.streaming.stateStore.providerClass"
    spark.conf.set(key, "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    try:
        from pyspark.sql import functions as F

        data = os.path.join(root, "rocks-in")
        _write_batches(data, [pa.table({"k": ["a", "b"], "v": pa.array([1, 2], pa.int64())})])
        df = _stream(spark, data, "k string, v long")
        agg = df.groupBy("k").agg(F.sum("v").alias("total"))
        checkpoint = os.path.join(root, "rocks")
        _run(agg.writeStream.format("noop").outputMode("update"), checkpoint)
        return checkpoint
    finally:
        spark.conf.unset(key)

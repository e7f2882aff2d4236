"""``write_state`` output is read back by Spark's own ``statestore`` source, and a streaming
``groupBy().agg()`` resumed on a bootstrapped checkpoint continues the totals."""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from extagg import Aggregator, ExternalAppendOnlyMap
from extagg.state.spark import read_state
from extagg.state.spark.writer import write_state
from tests.spark_state.conftest import normalize, sort_key

pytestmark = pytest.mark.spark

KEY_SCHEMA = {
    "type": "struct",
    "fields": [{"name": "k", "type": "string", "nullable": True, "metadata": {}}],
}
VALUE_SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "count", "type": "long", "nullable": True, "metadata": {}},
        {"name": "sum", "type": "long", "nullable": True, "metadata": {}},
    ],
}


def _history(directory, files=3, rows=400, seed=21):
    """Historical input files: (k, v) rows, a few hundred keys, some non-ASCII."""
    rng = random.Random(seed)
    os.makedirs(directory)
    for i in range(files):
        ks = [f"key-{rng.randrange(300)}{'é' if rng.random() < 0.1 else ''}" for _ in range(rows)]
        vs = [rng.randrange(-20, 100) for _ in ks]
        pq.write_table(
            pa.table({"k": ks, "v": pa.array(vs, pa.int64())}),
            os.path.join(directory, f"h{i}.parquet"),
        )


def _aggregate_history(directory):
    """extagg's external map (forced to spill) folds the history into (count, sum) per key."""
    aggregator = Aggregator(
        lambda v: (1, v), lambda c, v: (c[0] + 1, c[1] + v), lambda a, b: (a[0] + b[0], a[1] + b[1])
    )
    emap = ExternalAppendOnlyMap(aggregator, "16m", force_spill_every=256)
    for name in sorted(os.listdir(directory)):
        table = pq.read_table(os.path.join(directory, name))
        emap.insert_all(zip(table.column("k").to_pylist(), table.column("v").to_pylist()))
    assert emap.metrics.spill_count > 0
    with emap:
        return dict(emap.iterator())


def _resume(writer, checkpoint):
    """Run a streaming query (``writer``: its ``writeStream``, sink chosen) on the checkpoint
    until the input is read, and check it did not fail."""
    query = (
        writer.outputMode("update")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None


@pytest.fixture(scope="module")
def bootstrapped(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("bootstrap")
    history = str(root / "history")
    _history(history)
    totals = _aggregate_history(history)
    checkpoint = str(root / "checkpoint")
    counts = write_state(
        checkpoint,
        0,
        KEY_SCHEMA,
        VALUE_SCHEMA,
        (({"k": k}, {"count": c, "sum": s}) for k, (c, s) in totals.items()),
        batch_id=0,
        num_partitions=2,
    )
    assert sum(counts.values()) == len(totals) and all(counts.values())
    return checkpoint, totals, root


def test_sparks_reader_reads_what_was_written(spark, bootstrapped):
    checkpoint, totals, _root = bootstrapped
    theirs = spark.read.format("statestore").load(checkpoint).collect()
    expected = sorted((normalize(((k,), (c, s))) for k, (c, s) in totals.items()), key=sort_key)
    assert (
        sorted((normalize((tuple(r.key), tuple(r.value))) for r in theirs), key=sort_key)
        == expected
    )
    assert {r.partition_id for r in theirs} == {0, 1}
    ours = read_state(checkpoint).to_list()
    assert sorted(normalize((tuple(k), tuple(v))) for k, v, _ in ours) == sorted(expected)
    metadata = spark.read.format("state-metadata").load(checkpoint).collect()
    assert [(m.operatorName, m.numPartitions, m.maxBatchId) for m in metadata] == [
        ("stateStoreSave", 2, 0)
    ]


def test_resumed_query_continues_the_totals(spark, bootstrapped):
    from pyspark.sql import functions as F

    checkpoint, totals, root = bootstrapped
    incoming = str(root / "incoming")
    os.makedirs(incoming)
    new_rows = {"k": ["key-1", "key-2", "brand-new", "key-1"], "v": [5, 7, 11, 13]}
    pq.write_table(
        pa.table({"k": new_rows["k"], "v": pa.array(new_rows["v"], pa.int64())}),
        os.path.join(incoming, "n0.parquet"),
    )
    stream = spark.readStream.schema("k string, v long").parquet(incoming)
    agg = stream.groupBy("k").agg(F.count("*").alias("cnt"), F.sum("v").alias("total"))
    collected = []
    _resume(
        agg.writeStream.foreachBatch(lambda df, batch: collected.append((batch, df.collect()))),
        checkpoint,
    )
    assert [batch for batch, _ in collected] == [1]  # the first batch after the bootstrap
    output = {r.k: (r.cnt, r.total) for r in collected[0][1]}
    expected = dict(totals)
    for k, v in zip(new_rows["k"], new_rows["v"]):
        count, total = expected.get(k, (0, 0))
        expected[k] = (count + 1, total + v)
    assert output == {k: expected[k] for k in set(new_rows["k"])}
    assert os.path.isfile(os.path.join(checkpoint, "commits", "1"))  # batch 1 ran on our state
    after = {row[0][0]: tuple(row[1]) for row in read_state(checkpoint, batch_id=1)}
    assert after == expected


def test_an_aggregation_buffer_with_repeated_names_exports_as_parquet_spark_reads(tmp_path):
    """Spark's buffer of ``count(*), sum(x), avg(y)`` has ``count, sum, sum, count``: the
    Parquet export and ``read_state(...).to_arrow()`` kept the repeated names, which Spark
    refused to read back ([COLUMN_ALREADY_EXISTS]) and pyarrow to turn into dicts. They are
    numbered there, as the CSV and JSON Lines output already did (``sum.1``)."""
    import pyarrow.parquet as pq

    from extagg.state.cli import main as state_main
    from extagg.state.spark import read_state

    ckpt = tmp_path / "ckpt"
    fields = [("count", "long"), ("sum", "double"), ("sum", "double"), ("count", "long")]
    value = {
        "type": "struct",
        "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields],
    }
    write_state(ckpt, 0, KEY_SCHEMA, value, [(("a",), (3, 1.5, 6.0, 2))], num_partitions=2)
    rows = read_state(str(ckpt)).to_arrow().to_pylist()
    assert rows[0]["value"] == {"count": 3, "sum": 1.5, "sum.1": 6.0, "count.1": 2}
    out = tmp_path / "state.parquet"
    assert state_main(["export", str(ckpt), "-o", str(out)]) == 0
    names = pq.read_table(out).schema.field("value").type
    assert [names.field(i).name for i in range(names.num_fields)] == [
        "count",
        "sum",
        "sum.1",
        "count.1",
    ]


@pytest.mark.parametrize("damage", ["cut 1", "cut 4", "flip end checksum"])
def test_a_damaged_end_of_a_state_file_is_a_corrupt_file_error(tmp_path, damage):
    """The rows of a file end with Spark's end-of-file marker before the LZ4 stream's end
    block; the reader stopped at the marker, so a file cut in its end block, or with that
    block damaged, read as whole. The stream is read to its end now."""
    from extagg.errors import CorruptFileError

    ckpt = tmp_path / "ckpt"
    write_state(ckpt, 0, KEY_SCHEMA, VALUE_SCHEMA, [(("a",), (1, 2)), (("b",), (3, 4))],
                num_partitions=1)  # fmt: skip
    files = [p for p in ckpt.rglob("*") if p.suffix in (".delta", ".snapshot")]
    assert files and len(read_state(str(ckpt)).to_list()) == 2
    for path in files:  # the version's delta and its snapshot: whichever is read
        data = bytearray(path.read_bytes())
        if damage.startswith("cut"):
            data = data[: -int(damage.split()[1])]
        else:
            data[-2] ^= 0x40
        path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError) as info:
        read_state(str(ckpt)).to_list()
    assert info.value.path in {str(p) for p in files}


@pytest.mark.parametrize("case", ["after batch 3", "global aggregation"])
def test_a_query_resumes_after_a_later_batch_and_on_a_global_aggregation(spark, tmp_path, case):
    """Two bootstraps Spark could not resume or read back: state written after batch 3 (a
    resumed query also reads the offsets of batch 2: "batch 2 doesn't exist"), and a global
    aggregation written with partition folders besides 0 (the resumed query writes only
    partition 0's next version; both readers then missed ``state/0/1/2.delta``)."""
    from pyspark.sql import functions as F

    value = {"type": "struct", "fields": VALUE_SCHEMA["fields"]}
    incoming = str(tmp_path / "incoming")
    os.makedirs(incoming)
    pq.write_table(
        pa.table({"k": ["a", "b"], "v": pa.array([5, 7], pa.int64())}),
        os.path.join(incoming, "n0.parquet"),
    )
    checkpoint = str(tmp_path / "checkpoint")
    stream = spark.readStream.schema("k string, v long").parquet(incoming)
    if case == "global aggregation":
        key = {"type": "struct", "fields": []}
        # 4 partitions: the empty key's hash is not 0 modulo 4 (it is modulo 2)
        write_state(checkpoint, 0, key, value, [((), (1, 10))], batch_id=0, num_partitions=4)
        assert sorted(os.listdir(os.path.join(checkpoint, "state", "0"))) == ["0", "_metadata"]
        agg = stream.groupBy().agg(F.count("*").alias("c"), F.sum("v").alias("t"))
        first_batch, want = 1, {(): (3, 22)}
    else:
        write_state(checkpoint, 0, KEY_SCHEMA, value, [(("a",), (1, 10))], batch_id=3,
                    num_partitions=2)  # fmt: skip
        agg = stream.groupBy("k").agg(F.count("*").alias("c"), F.sum("v").alias("t"))
        first_batch, want = 4, {("a",): (2, 15), ("b",): (1, 7)}
    _resume(agg.writeStream.format("noop"), checkpoint)
    assert os.path.isfile(os.path.join(checkpoint, "commits", str(first_batch)))
    ours = {tuple(k): tuple(v) for k, v, _ in read_state(checkpoint).to_list()}
    assert ours == want
    theirs = spark.read.format("statestore").load(checkpoint).collect()
    assert {tuple(r.key): tuple(r.value) for r in theirs} == want

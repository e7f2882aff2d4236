"""extagg's readers of Spark checkpoints return exactly Spark's ``statestore`` and
``state-metadata`` rows: every batch, the change feed, snapshots, join sides."""

from __future__ import annotations

import os

import pytest

from extagg.state.spark import is_spark_checkpoint, read_change_feed, read_metadata, read_state
from tests.spark_state.conftest import normalize, sort_key

pytestmark = pytest.mark.spark

QUERIES = [
    "agg_update",
    "agg_complete",
    "global",
    "typed",
    "window",
    "dedup",
    "maps",
    "pandas_state",
]


def spark_rows(spark, path, **options):
    reader = spark.read.format("statestore")
    for key, value in options.items():
        reader = reader.option(key, value)
    rows = reader.load(path).collect()
    return sorted((normalize(tuple(r)) for r in rows), key=sort_key)


def our_rows(rows):
    return sorted((normalize(tuple(r)) for r in rows), key=sort_key)


def committed(path):
    return sorted(int(n) for n in os.listdir(os.path.join(path, "commits")) if n.isdigit())


@pytest.mark.parametrize("query", QUERIES)
def test_state_of_every_batch_equals_spark(spark, checkpoints, query):
    path = checkpoints.get(query)
    assert is_spark_checkpoint(path)
    batches = committed(path)
    assert len(batches) >= 2
    for batch in batches:
        ours = our_rows(read_state(path, batch_id=batch))
        assert ours == spark_rows(spark, path, batchId=batch), (query, batch)
    assert ours  # the last batch holds state


def test_zstd_compressed_state_equals_spark(spark, checkpoints):
    """State files Spark compressed with zstd (``stateStore.compression.codec``): every
    batch and the change feed as Spark reads them."""
    path = checkpoints.get("zstd")
    with open(os.path.join(path, "state", "0", "0", "1.delta"), "rb") as f:
        assert f.read(4) == b"\x28\xb5\x2f\xfd"  # a zstd frame
    for batch in committed(path):
        ours = our_rows(read_state(path, batch_id=batch))
        assert ours == spark_rows(spark, path, batchId=batch), batch
    assert ours
    feed = our_rows(read_change_feed(path, start_batch_id=0))
    assert feed == spark_rows(spark, path, readChangeFeed=True, changeStartBatchId=0)


@pytest.mark.parametrize("query", ["agg_update", "global", "window", "dedup", "pandas_state"])
def test_change_feed_equals_spark(spark, checkpoints, query):
    path = checkpoints.get(query)
    last = committed(path)[-1]
    ours = our_rows(read_change_feed(path, 0, last))
    theirs = spark_rows(
        spark, path, readChangeFeed="true", changeStartBatchId=0, changeEndBatchId=last
    )
    assert ours == theirs
    if query == "window":  # the watermark evicted old windows
        assert any(row[1] == "delete" for row in ours)


def test_window_state_shrinks_after_eviction(checkpoints):
    path = checkpoints.get("window")
    sizes = [len(read_state(path, batch_id=b).to_list()) for b in committed(path)]
    assert min(sizes[1:]) < max(sizes)


def test_snapshot_start_equals_spark(spark, checkpoints):
    path = checkpoints.get("agg_update")
    directory = os.path.join(path, "state", "0", "0")
    snapshots = sorted(
        int(n.split(".")[0]) for n in os.listdir(directory) if n.endswith(".snapshot")
    )
    assert snapshots, "maintenance wrote no snapshot"
    start = snapshots[0] - 1
    last = committed(path)[-1]
    ours = our_rows(read_state(path, batch_id=last, partition_id=0, snapshot_start_batch_id=start))
    theirs = spark_rows(
        spark, path, batchId=last, snapshotPartitionId=0, snapshotStartBatchId=start
    )
    assert ours == theirs and ours


@pytest.mark.parametrize("side", ["left", "right"])
def test_join_sides_equal_spark(spark, checkpoints, side):
    path = checkpoints.get("join")
    for batch in committed(path):
        ours = our_rows(read_state(path, batch_id=batch, join_side=side))
        assert ours == spark_rows(spark, path, batchId=batch, joinSide=side), (side, batch)
    assert ours


@pytest.mark.parametrize("query", ["agg_update", "join"])
def test_metadata_equals_spark(spark, checkpoints, query):
    path = checkpoints.get(query)
    theirs = spark.read.format("state-metadata").load(path).collect()
    ours = read_metadata(path).to_list()
    assert sorted(normalize(tuple(r)) for r in ours) == sorted(normalize(tuple(r)) for r in theirs)


def test_arrow_types_follow_the_schema(checkpoints):
    import pyarrow as pa

    table = read_state(checkpoints.get("window")).to_arrow()
    key = table.schema.field("key").type
    assert key.field("window").type == pa.struct(
        [("start", pa.timestamp("us", tz="UTC")), ("end", pa.timestamp("us", tz="UTC"))]
    )
    assert key.field("k").type == pa.string()
    assert table.schema.field("partition_id").type == pa.int32()

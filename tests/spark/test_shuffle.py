"""Typed shuffle batches: the map side's typed groups are partitioned and pickled as arrays,
read back as the same pairs in the same partitions and order, and folded from their arrays on
the reduce side. In-process with PySpark's own serializers, then through a real local[2]."""

from __future__ import annotations

import io
import operator
import pickle
from collections import defaultdict

import numpy as np
import pytest
from pyspark.serializers import BatchedSerializer, CPickleSerializer, NoOpSerializer

import extagg.spark as es
from extagg.collection.pair_arrays import PairArrays
from extagg.generic.external_map import ExternalAppendOnlyMap
from extagg.generic.typed_map import typed_op
from extagg.spark import shim
from extagg.spark.merger import SparkMerger
from extagg.spark.partial import HandedOn, PartialCombiner
from extagg.spark.shuffle import partition_numbers, write_buckets

pytestmark = pytest.mark.spark

PARTITIONS = 4


@pytest.fixture(autouse=True)
def _hash_seed(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # portable_hash refuses to run without it


def records(kind: str, n: int = 200_000, keys: int = 100_000) -> list:
    rng = np.random.default_rng(11)
    ids = rng.integers(0, keys, size=n).tolist()
    values = rng.integers(-1000, 1000, size=n).tolist()
    if kind == "str":
        return [(f"user_{i}é" if i % 97 == 0 else f"user_{i}", v) for i, v in zip(ids, values)]
    if kind == "float":
        return [(i * 7_000_000_000_019, v / 8) for i, v in zip(ids, values)]
    return [(i - keys // 2, v) for i, v in zip(ids, values)]


def map_side(data: list) -> HandedOn:
    """extagg's map side of reduceByKey(add) at a small budget: several generations."""
    combiner = PartialCombiner(
        lambda v: v, operator.add, typed_op=typed_op(operator.add), memory=1 << 20
    )
    return combiner.combine(iter(data))


def by_partition(stream: list) -> dict[int, list[bytes]]:
    """``write_buckets``' output (partition number, then a pickled batch) per partition."""
    from pyspark.serializers import read_long

    out: dict[int, list[bytes]] = defaultdict(list)
    for number, blob in zip(stream[::2], stream[1::2]):
        out[read_long(io.BytesIO(number))].append(blob)
    return out


def framed(blobs: list[bytes]) -> io.BytesIO:
    """What a reduce task's Python worker reads for its partition: length-framed batches."""
    buf = io.BytesIO()
    NoOpSerializer().dump_stream(blobs, buf)  # PySpark's own framing of raw bytes
    buf.seek(0)
    return buf


@pytest.mark.parametrize("kind", ["int", "str", "float"])
def test_typed_batches_carry_the_same_pairs_in_the_same_partitions(kind, monkeypatch):
    data = records(kind)
    serializer = CPickleSerializer()
    ours = by_partition(list(write_buckets(map_side(data), PARTITIONS, serializer, 1.0)))
    plain = by_partition(list(write_buckets(list(map_side(data)), PARTITIONS, serializer, 1.0)))
    assert set(ours) == set(plain) == set(range(PARTITIONS))
    blocks = [pickle.loads(b) for blobs in ours.values() for b in blobs]
    assert any(isinstance(b, PairArrays) for b in blocks)
    assert not any(isinstance(pickle.loads(b), PairArrays) for bs in plain.values() for b in bs)
    assert sum(map(len, ours.values())) < 400  # blocks of many pairs, not one per generation
    reference: dict = defaultdict(int)
    for k, v in data:
        reference[k] += v
    folded_blocks = []
    original = ExternalAppendOnlyMap.insert_batch

    def counting_insert_batch(self, batch):
        folded_blocks.append(len(batch))
        return original(self, batch)

    monkeypatch.setattr(ExternalAppendOnlyMap, "insert_batch", counting_insert_batch)
    merged: dict = {}
    for part in range(PARTITIONS):
        # PySpark's own reader sees the list each batch stands for, in the same order
        stock_pairs = list(BatchedSerializer(serializer).load_stream(framed(ours[part])))
        plain_pairs = list(BatchedSerializer(serializer).load_stream(framed(plain[part])))
        assert stock_pairs == plain_pairs
        keys = [k for k, _ in stock_pairs]
        assert set(partition_numbers(keys, PARTITIONS)) == {part}
        # extagg's reduce side folds the blocks from their arrays, spilling at 1 MiB
        stream = shim.shuffle_deserializer(serializer).load_stream(framed(ours[part]))
        merger = SparkMerger(_reduce_aggregator(), 1.0)
        merger.mergeCombiners(stream)
        assert merger.spills > 0
        merged.update(merger.items())
    assert sum(folded_blocks) > len(reference)  # every block through insert_batch
    assert merged == reference


def _reduce_aggregator():
    from pyspark.shuffle import Aggregator

    return Aggregator(lambda v: v, operator.add, operator.add)


def test_shuffle_stream_gives_pairs_or_batches_not_both():
    serializer = CPickleSerializer()
    blobs = [serializer.dumps([(1, 2), (3, 4)]), serializer.dumps([(5, 6)])]
    deserializer = shim.shuffle_deserializer(serializer)
    assert deserializer == shim.shuffle_deserializer(serializer)  # one class per process
    assert list(deserializer.load_stream(framed(blobs))) == [(1, 2), (3, 4), (5, 6)]
    stream = deserializer.load_stream(framed(blobs))
    assert next(stream) == (1, 2)
    with pytest.raises(RuntimeError, match="batches are gone"):
        stream.extagg_batches()
    assert [list(b) for b in deserializer.load_stream(framed(blobs)).extagg_batches()] == [
        [(1, 2), (3, 4)],
        [(5, 6)],
    ]


def test_hand_on_read_as_pairs_equals_read_as_parts():
    data = records("str", n=20_000, keys=5_000)
    pairs = list(map_side(data))
    from_parts = [pair for part in map_side(data).parts() for pair in part]
    assert pairs == from_parts
    handed = map_side(data)
    next(handed)
    with pytest.raises(RuntimeError, match="parts are gone"):
        handed.parts()
    handed.close()


def test_typed_blocks_cross_a_real_shuffle(spark_context):
    """Through the JVM: extagg's writer ships blocks, the shuffled RDD's deserializer hands
    them to a reader whole, and PySpark's own reading of the same RDD sees the pairs."""

    def combine_locally(it):
        return PartialCombiner(
            lambda v: v, operator.add, typed_op=typed_op(operator.add), memory=1 << 20
        ).combine(it)

    n, keys = 80_000, 20_000
    rdd = spark_context.parallelize(range(n), 3).map(lambda i: (f"k{(i * 7919) % keys}", i))
    with es.installed():
        shuffled = rdd.mapPartitions(combine_locally).partitionBy(3)
        kinds = shuffled.mapPartitions(
            lambda it: [type(b).__name__ for b in it.extagg_batches()]
        ).collect()
        summed = dict(shuffled.reduceByKey(operator.add).collect())
        reduced = dict(rdd.reduceByKey(operator.add, 3).collect())
    assert "PairArrays" in kinds
    expected: dict = defaultdict(int)
    for i in range(n):
        expected[f"k{(i * 7919) % keys}"] += i
    assert summed == reduced == expected

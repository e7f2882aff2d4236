"""The UnsafeRow codec and the partitioner against bytes and placements Spark produced.

``dropDuplicates`` over a row of every key-able type makes Spark encode those rows as state
keys: decoding them must give the input rows back, and re-encoding must give Spark's bytes.
Every key of every Spark-written store must sit in the partition our Murmur3 assigns it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import glob
import os
import struct

import pytest

from extagg.state.spark import RowDecoder, RowEncoder, SparkCheckpoint
from extagg.state.spark.datafile import iter_records
from extagg.state.spark.partitioning import partition_for
from tests.spark_state import builders

pytestmark = pytest.mark.spark


def _store_records(path, store="default"):
    cp = SparkCheckpoint(path)
    operator = cp.operator(0)
    info = operator.store(store)
    key_schema, value_schema = cp.schemas(0, info)
    for partition in range(info.num_partitions):
        directory = cp.store_dir(0, partition, store)
        for file in sorted(glob.glob(os.path.join(directory, "*.delta"))):
            for key, value in iter_records(file, snapshot=False):
                yield key_schema, value_schema, partition, key, value


def _canonical(row):
    out = {}
    for name, value in row.items():
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc)
        if isinstance(value, dict):
            value = tuple(value.values())
        if name == "f32" and value is not None:  # the input as a float32 holds it
            value = struct.unpack("<f", struct.pack("<f", value))[0]
        if isinstance(value, decimal.Decimal):  # by value: 1.50 == 1.5, exponents differ
            value = value.as_integer_ratio()
        out[name] = value
    return out


def test_spark_encoded_rows_decode_and_reencode_byte_for_byte(checkpoints):
    path = checkpoints.get("dedup")
    expected = {repr(sorted(_canonical(r).items())) for r in builders.typed_rows(150, seed=3)}
    seen = set()
    for key_schema, _value_schema, _p, key, _value in _store_records(path):
        decoded = RowDecoder(key_schema).decode(key)
        as_dict = decoded.as_dict()
        as_dict["st"] = None if as_dict["st"] is None else tuple(as_dict["st"])
        seen.add(repr(sorted(_canonical(as_dict).items())))
        assert RowEncoder(key_schema).encode(decoded) == key
    assert seen == expected


@pytest.mark.parametrize(
    "query", ["dedup", "window", "agg_update", "typed", "maps", "pandas_state"]
)
def test_values_reencode_byte_for_byte(checkpoints, query):
    for _k, value_schema, _p, _key, value in _store_records(checkpoints.get(query)):
        if value is not None:
            assert RowEncoder(value_schema).encode(RowDecoder(value_schema).decode(value)) == value


@pytest.mark.parametrize(
    "query,store",
    [
        ("dedup", "default"),
        ("window", "default"),
        ("agg_update", "default"),
        ("typed", "default"),
        ("join", "left-keyToNumValues"),
        ("join", "right-keyToNumValues"),
    ],
)
def test_keys_sit_in_sparks_murmur3_partition(checkpoints, query, store):
    count = 0
    for key_schema, _v, partition, key, _value in _store_records(checkpoints.get(query), store):
        row = RowDecoder(key_schema).decode(key)
        assert partition_for(row, key_schema, 2) == partition, row
        count += 1
    assert count

"""Property tests of the UnsafeRow codec (no Spark): decode(encode(row)) == row for random
schemas and rows, encoding is deterministic, and Spark's documented hash example holds."""

from __future__ import annotations

import datetime as dt
import decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from extagg.state.spark import (
    ArrayType,
    AtomicType,
    DecimalType,
    MapType,
    RowDecoder,
    RowEncoder,
    StructField,
    StructType,
    parse_schema,
)
from extagg.state.spark.partitioning import hash_unsafe_bytes, spark_hash

UTC = dt.timezone.utc
ATOMIC = {
    "boolean": st.booleans(),
    "byte": st.integers(-128, 127),
    "short": st.integers(-(2**15), 2**15 - 1),
    "integer": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32, allow_nan=False),
    "double": st.floats(allow_nan=False),
    "string": st.text(max_size=20),
    "binary": st.binary(max_size=20),
    "date": st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31)),
    "timestamp": st.datetimes(
        dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30), timezones=st.just(UTC)
    ),
    "timestamp_ntz": st.datetimes(dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31)),
}


def _decimal_values(precision: int, scale: int):
    bound = 10**precision - 1
    return st.integers(-bound, bound).map(lambda n: decimal.Decimal(f"{n}E-{scale}"))


@st.composite
def types_and_values(draw, depth=0):
    kinds = ["atomic", "decimal"] + (["struct", "array", "map"] if depth < 2 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "atomic":
        name = draw(st.sampled_from(sorted(ATOMIC)))
        return AtomicType(name), ATOMIC[name]
    if kind == "decimal":
        precision = draw(st.integers(1, 38))
        scale = draw(st.integers(0, precision))
        return DecimalType(precision, scale), _decimal_values(precision, scale)
    if kind == "struct":
        schema, values = draw(structs(depth + 1))
        return schema, values
    if kind == "array":
        element, values = draw(types_and_values(depth + 1))
        return ArrayType(element), st.lists(st.none() | values, max_size=5)
    key_type = AtomicType(draw(st.sampled_from(["integer", "string", "long"])))
    value_type, values = draw(types_and_values(depth + 1))
    keys = ATOMIC[key_type.name]
    return MapType(key_type, value_type), st.lists(st.tuples(keys, st.none() | values), max_size=4)


@st.composite
def structs(draw, depth=0):
    fields = draw(st.lists(types_and_values(depth), min_size=1, max_size=5 if depth else 66))
    schema = StructType(tuple(StructField(f"f{i}", t) for i, (t, _) in enumerate(fields)))
    values = st.tuples(*[st.none() | strategy for _, strategy in fields])
    return schema, values


@st.composite
def schema_and_row(draw):
    schema, values = draw(structs())
    return schema, draw(values)


def _plain(value):
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@settings(max_examples=80, deadline=None)
@given(schema_and_row())
def test_roundtrip(case):
    schema, row = case
    data = RowEncoder(schema).encode(row)
    assert len(data) % 8 == 0
    assert _plain(RowDecoder(schema).decode(data)) == _plain(row)
    assert RowEncoder(schema).encode(RowDecoder(schema).decode(data)) == data
    assert parse_schema(schema.json()) == schema


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=40), st.integers(-(2**31), 2**31 - 1))
def test_hash_unsafe_bytes_matches_a_plain_reference(data, seed):
    def reference(data: bytes, seed: int) -> int:
        m = 0xFFFFFFFF

        def mix(h, k):
            k = (k * 0xCC9E2D51) & m
            k = ((k << 15) | (k >> 17)) & m
            k = (k * 0x1B873593) & m
            h ^= k
            h = ((h << 13) | (h >> 19)) & m
            return (h * 5 + 0xE6546B64) & m

        h = seed & m
        aligned = len(data) - len(data) % 4
        for i in range(0, aligned, 4):
            h = mix(h, int.from_bytes(data[i : i + 4], "little"))
        for b in data[aligned:]:
            h = mix(h, (b - 256 if b > 127 else b) & m)
        h ^= len(data)
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & m
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & m
        h ^= h >> 16
        return h - (1 << 32) if h & 0x80000000 else h

    assert hash_unsafe_bytes(data, seed) == reference(data, seed)


def test_sparks_documented_hash_example():
    # SELECT hash('Spark', array(123), 2) = -1321691492 (Spark's Murmur3Hash docs)
    schema = StructType(
        (
            StructField("a", AtomicType("string")),
            StructField("b", ArrayType(AtomicType("integer"))),
            StructField("c", AtomicType("integer")),
        )
    )
    assert spark_hash(("Spark", [123], 2), schema) == -1321691492

"""Which shuffle partition Spark puts a key in: ``pmod(Murmur3Hash(key columns, 42), n)``.

Spark's ``HashPartitioning`` hashes the key *values* column by column (``Murmur3Hash``, seed
42, each column's hash seeding the next; nulls leave the running hash as is): ints, dates,
bytes, shorts, booleans through ``hashInt``; longs and timestamps through ``hashLong``; floats
and doubles by their bits (-0.0 as 0); decimals by their unscaled long, or the bytes of
``BigInteger.toByteArray`` past 18 digits; strings and binaries through ``hashUnsafeBytes``,
whose tail bytes are mixed one by one (unlike standard Murmur3); structs, arrays and maps
field by field, element by element. The state store partition of a key is that partition.

``hashInt``/``hashLong`` equal standard Murmur3 of the 4/8 little-endian bytes, so ``mmh3``
computes them; for byte strings the standard hash of the 4-byte-aligned prefix is unwound
(``fmix`` is invertible) and Spark's tail mixing is applied in Python.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import mmh3

from extagg.state.spark.types import (
    MAX_LONG_DIGITS,
    ArrayType,
    AtomicType,
    DecimalType,
    MapType,
    SparkType,
    StructType,
    UnsupportedSparkTypeError,
)
from extagg.state.spark.unsaferow import EPOCH_DATE, big_decimal_bytes, micros, unscaled

__all__ = ["spark_hash", "partition_for", "hash_unsafe_bytes", "SEED"]

SEED = 42
_M = 0xFFFFFFFF
_C1, _C2 = 0xCC9E2D51, 0x1B873593
_F1, _F2 = 0x85EBCA6B, 0xC2B2AE35
_F1_INV, _F2_INV = pow(_F1, -1, 1 << 32), pow(_F2, -1, 1 << 32)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M


def _fmix(h: int) -> int:
    h ^= h >> 16
    h = (h * _F1) & _M
    h ^= h >> 13
    h = (h * _F2) & _M
    return h ^ (h >> 16)


def _unfmix(h: int) -> int:
    h ^= h >> 16
    h = (h * _F2_INV) & _M
    h ^= (h >> 13) ^ (h >> 26)
    h = (h * _F1_INV) & _M
    return h ^ (h >> 16)


def _signed(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


def hash_unsafe_bytes(data: bytes, seed: int) -> int:
    """Spark's ``Murmur3_x86_32.hashUnsafeBytes`` (signed 32-bit result)."""
    seed &= _M
    aligned = len(data) - len(data) % 4
    h = _unfmix(mmh3.hash(data[:aligned], seed, signed=False)) ^ aligned if aligned else seed
    for byte in data[aligned:]:
        k = (byte - 256 if byte > 127 else byte) & _M
        k = (_rotl((k * _C1) & _M, 15) * _C2) & _M
        h = (_rotl(h ^ k, 13) * 5 + 0xE6546B64) & _M
    return _signed(_fmix(h ^ len(data)))


def _hash_int(value: int, seed: int) -> int:
    return mmh3.hash(struct.pack("<i", value), seed & _M)


def _hash_long(value: int, seed: int) -> int:
    return mmh3.hash(struct.pack("<q", value), seed & _M)


def _hash(value: Any, data_type: SparkType, seed: int) -> int:
    if value is None:
        return seed
    if isinstance(data_type, AtomicType):
        name = data_type.name
        if name == "boolean":
            return _hash_int(1 if value else 0, seed)
        if name in ("byte", "short", "integer"):
            return _hash_int(value, seed)
        if name == "date":
            return _hash_int(value if isinstance(value, int) else (value - EPOCH_DATE).days, seed)
        if name == "long":
            return _hash_long(value, seed)
        if name in ("timestamp", "timestamp_ntz"):
            return _hash_long(micros(value, name == "timestamp_ntz"), seed)
        if name == "float":
            if value == 0.0:
                return _hash_int(0, seed)
            bits = (
                0x7FC00000
                if math.isnan(value)
                else struct.unpack("<i", struct.pack("<f", value))[0]
            )
            return _hash_int(bits, seed)
        if name == "double":
            if value == 0.0:
                return _hash_long(0, seed)
            if math.isnan(value):
                return _hash_long(0x7FF8000000000000, seed)
            return _hash_long(struct.unpack("<q", struct.pack("<d", value))[0], seed)
        if name == "string":
            return hash_unsafe_bytes(value.encode("utf-8", "surrogateescape"), seed)
        if name == "binary":
            return hash_unsafe_bytes(bytes(value), seed)
        if name == "void":
            return seed
    if isinstance(data_type, DecimalType):
        number = unscaled(value, data_type)
        if data_type.precision <= MAX_LONG_DIGITS:
            return _hash_long(number, seed)
        return hash_unsafe_bytes(big_decimal_bytes(number), seed)
    if isinstance(data_type, StructType):
        values = _struct_values(value, data_type)
        for field, item in zip(data_type.fields, values):
            seed = _hash(item, field.data_type, seed)
        return seed
    if isinstance(data_type, ArrayType):
        for item in value:
            seed = _hash(item, data_type.element_type, seed)
        return seed
    if isinstance(data_type, MapType):
        pairs = value.items() if isinstance(value, Mapping) else value
        for key, item in pairs:
            seed = _hash(key, data_type.key_type, seed)
            seed = _hash(item, data_type.value_type, seed)
        return seed
    raise UnsupportedSparkTypeError(f"cannot hash Spark type {data_type!r}")


def _struct_values(row: Any, schema: StructType) -> Sequence[Any]:
    if isinstance(row, Mapping):
        return [row.get(name) for name in schema.names]
    if isinstance(row, (str, bytes)) or not isinstance(row, Sequence):
        return [row]
    return row


def spark_hash(row: Any, schema: StructType, seed: int = SEED) -> int:
    """``Murmur3Hash(<schema's columns>, seed)`` of one key row (signed 32-bit).

    Parameters
    ----------
    row
        The key row: a tuple by position or a dict by field name.
    schema
        The key schema (the grouping columns).
    seed
        The hash seed (Spark's ``HashPartitioning`` uses 42).

    Returns
    -------
    int
        The signed 32-bit hash.
    """
    return _signed(_hash(row, schema, seed) & _M)


def partition_for(row: Any, schema: StructType, num_partitions: int) -> int:
    """The shuffle (and state store) partition Spark assigns the key ``row``.

    Parameters
    ----------
    row
        The key row: a tuple by position or a dict by field name.
    schema
        The key schema (the grouping columns).
    num_partitions
        The query's ``spark.sql.shuffle.partitions``.

    Returns
    -------
    int
        ``pmod(spark_hash(row), num_partitions)``.
    """
    return spark_hash(row, schema) % num_partitions

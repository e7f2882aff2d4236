"""The deterministic key/value codec of state files."""

from __future__ import annotations

import datetime as dt
import enum
import math
import struct
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extagg.hashing import stable_hash
from extagg.state.codec import (
    CANONICAL_NAN,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    key_hash_of,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(allow_nan=True),
    st.text(),
    st.binary(),
    st.decimals(allow_nan=True),
    st.dates(),
    st.datetimes(),
    st.datetimes(timezones=st.just(dt.timezone(dt.timedelta(hours=2)))),
    st.timedeltas(),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.lists(children, max_size=4).map(tuple)
    ),
    max_leaves=12,
)
keys = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False),
        st.text(),
        st.binary(),
        st.decimals(allow_nan=False),
        st.dates(),
        st.datetimes(),
        st.timedeltas(),
    ),
    lambda children: st.lists(children, max_size=3).map(tuple),
    max_leaves=8,
)


def same(a, b) -> bool:
    """Equality that also holds for NaN and keeps types apart (1 vs True vs 1.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, Decimal):  # its digits and exponent too: 1.50 stays 1.50
        return str(a) == str(b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@given(values)
def test_values_round_trip_with_their_types(value):
    encoded = encode_value(value)
    assert same(decode_value(encoded), value)
    assert encode_value(value) == encoded  # deterministic
    assert encode_value(decode_value(encoded)) == encoded


@given(keys)
def test_keys_carry_their_stable_hash_and_round_trip(key):
    encoded = encode_key(key)
    assert key_hash_of(encoded) == stable_hash(key)
    assert encoded[:8] == struct.pack(">Q", stable_hash(key))
    assert same(decode_key(encoded), key)


@given(st.lists(keys, min_size=2, max_size=20, unique_by=encode_key))
def test_bytewise_order_of_encoded_keys_is_hash_order(key_list):
    by_bytes = sorted(key_list, key=encode_key)
    hashes = [stable_hash(k) for k in by_bytes]
    assert hashes == sorted(hashes)


def test_the_format_is_pinned():
    assert encode_value(None) == b"\x00"
    assert encode_value(False) == b"\x01"
    assert encode_value(True) == b"\x02"
    assert encode_value(1) == b"\x03" + (1).to_bytes(8, "big")
    assert encode_value(-1) == b"\x03" + b"\xff" * 8
    assert encode_value(2**70) == b"\x04\x09" + (2**70).to_bytes(9, "big", signed=True)
    assert encode_value(1.5) == b"\x05" + struct.pack(">d", 1.5)
    assert encode_value("hé") == b"\x06\x03" + "hé".encode()
    assert encode_value(b"ab") == b"\x07\x02ab"
    assert encode_value((1, "a")) == b"\x08\x02" + encode_value(1) + encode_value("a")
    assert encode_value([None]) == b"\x09\x01\x00"
    assert encode_value("x" * 200)[:3] == b"\x06\xc8\x01"  # varint length 200
    assert encode_value(Decimal("-1.50")) == b"\x0b\x05-1.50"
    assert encode_value(dt.date(1970, 1, 2)) == b"\x0c" + (1).to_bytes(8, "big")
    assert encode_value(dt.datetime(1970, 1, 1, 0, 0, 1)) == b"\x0d" + (10**6).to_bytes(8, "big")
    paris_summer = dt.timezone(dt.timedelta(hours=2))
    assert encode_value(dt.datetime(1970, 1, 1, 2, tzinfo=paris_summer)) == b"\x0e" + bytes(8)
    day = 86_400 * 10**6
    assert encode_value(dt.timedelta(microseconds=-1)) == b"\x0f" + b"\xff" * 8 + (
        day - 1
    ).to_bytes(8, "big")


def test_dates_and_times_are_state_keys_and_values():
    """A stream grouped by a date, or keeping the max of a timestamp, failed at its first
    batch ("cannot hash a key of type datetime.date", "cannot encode datetime.datetime"):
    they are stored by their day or microsecond; an aware datetime by its instant, read back
    in UTC, so equal instants are one key."""
    aware = dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    utc = dt.datetime(2024, 1, 1, 11, tzinfo=dt.timezone.utc)
    assert stable_hash(aware) == stable_hash(utc) and encode_key(aware) == encode_key(utc)
    assert decode_value(encode_value(aware)) == aware
    assert stable_hash(dt.date(2024, 1, 1)) != stable_hash(dt.datetime(2024, 1, 1))
    assert stable_hash(dt.date(2024, 1, 1)) != stable_hash(dt.date(2024, 1, 1).toordinal())


def test_decimal_keys_hash_as_the_numbers_they_equal():
    """A Spark decimal key (exact ids, money) is a state key now: it hashes as the int or
    float it equals (``Decimal(7) == 7``, ``Decimal('1.5') == 1.5``), else by its value."""
    assert stable_hash(Decimal(7)) == stable_hash(Decimal("7.00")) == stable_hash(7)
    assert stable_hash(Decimal("1.5")) == stable_hash(1.5)
    assert stable_hash(Decimal(2**53 + 1)) != stable_hash(Decimal(2**53))
    assert stable_hash(Decimal("0.1")) == stable_hash(Decimal("0.10")) != stable_hash(0.1)
    assert decode_key(encode_key(Decimal("12345678901234567891"))) == 12345678901234567891


def test_every_nan_encodes_the_same_and_decodes_to_one_object():
    other_nan = struct.unpack(">d", b"\x7f\xf8\x00\x00\x00\x00\x00\x01")[0]
    assert encode_value(float("nan")) == encode_value(other_nan)
    assert decode_value(encode_value(float("nan"))) is CANONICAL_NAN


def test_subclasses_and_numpy_scalars_encode_by_value():
    class Color(enum.IntEnum):
        RED = 3

    class Name(str, enum.Enum):  # str(Name.RED) is "Name.RED": it was stored as that
        RED = "red"

    assert encode_value(Color.RED) == encode_value(3)
    assert (
        encode_key(Name.RED) == encode_key("red") and decode_value(encode_value(Name.RED)) == "red"
    )
    assert encode_value(np.int64(7)) == encode_value(7)
    assert encode_value(np.float32(0.5)) == encode_value(0.5)
    assert encode_value(np.bool_(True)) == encode_value(True)
    assert encode_value(bytearray(b"xy")) == encode_value(b"xy")
    assert encode_key(np.int32(5)) == encode_key(5)


def test_unsupported_values_name_the_type_and_the_pickle_option():
    with pytest.raises(TypeError, match=r"builtins\.set.*allow_pickle=True"):
        encode_value({1, 2})
    with pytest.raises(TypeError, match=r"builtins\.dict"):
        encode_value((1, {"a": 1}))


def test_pickle_only_when_allowed():
    value = {"a": {1, 2}}
    encoded = encode_value(value, allow_pickle=True)
    assert decode_value(encoded, allow_pickle=True) == value
    with pytest.raises(ValueError, match="does not allow pickle"):
        decode_value(encoded)


def test_keys_need_a_deterministic_hash():
    with pytest.raises(TypeError, match=r"cannot hash a key of type builtins\.list"):
        encode_key([1, 2])
    with pytest.raises(TypeError, match="frozenset"):
        encode_key(frozenset({1}))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"\x03\x00\x01", "int64 is truncated"),
        (b"\x05\x00", "float is truncated"),
        (b"\x06\x05ab", "ends early"),
        (b"\x06\x02\xff\xfe", "invalid UTF-8"),
        (b"\x06\x80", "ends inside a length"),
        (b"\x1f", "unknown type tag 0x1f"),
        (b"\x00\x00", "unexpected bytes"),
        (b"\x08\x05\x00", "claims 5 elements"),
        (b"\x09\x01" * 300 + b"\x00", "nested too deeply"),
        (b"\x0a\x02ab", "does not allow pickle"),
        (b"\x0b\x021x", "invalid encoded decimal"),
        (b"\x0c\x00\x01", "date or time is truncated"),
        (b"\x0c" + (10**9).to_bytes(8, "big"), "out of range"),
    ],
)
def test_malformed_encodings_raise_value_error(data, message):
    with pytest.raises(ValueError, match=message):
        decode_value(data)


def test_malformed_keys_raise_value_error():
    with pytest.raises(ValueError, match="at least 9 bytes"):
        decode_key(b"\x00" * 8)
    with pytest.raises(ValueError, match="cannot unpickle"):
        decode_value(b"\x0a\x02ab", allow_pickle=True)

"""The deterministic key/value codec of state files.

The same value always gives the same bytes, in every process: ``None``, ``bool``, ``int`` (any
size), ``float``, ``str``, ``bytes``, ``decimal.Decimal``, ``datetime.date``/``datetime``/
``timedelta``, and tuples and lists of these. Other
values are pickled only when the operator was created with ``allow_pickle=True`` (pickle is
neither deterministic for every type nor safe to load from untrusted files).

A key in a state file is ``stable_hash(key)`` as 8 big-endian bytes followed by the key's encoding,
so the bytewise order of encoded keys *is* the file order: ascending ``stable_hash``, ties by the
encoding. Keys must be of the types :func:`extagg.hashing.stable_hash` defines.

Encoding (tag byte, then payload; lengths are LEB128 varints):
``00`` None · ``01`` False · ``02`` True · ``03`` int64 (8 bytes, big-endian) ·
``04`` other int (length, two's-complement big-endian bytes) · ``05`` float (8 bytes IEEE, one
canonical NaN) · ``06`` str (length, UTF-8 with surrogatepass) · ``07`` bytes (length, bytes) ·
``08`` tuple (count, elements) · ``09`` list (count, elements) · ``0A`` pickle (length, bytes) ·
``0B`` decimal (length, its ``str()`` in ASCII: digits and exponent as they are, ``1.50``) ·
``0C`` date (8 bytes: days since 1970-01-01) · ``0D`` naive datetime (8 bytes: microseconds
since 1970-01-01 00:00 of its wall clock) · ``0E`` datetime with a zone (8 bytes: microseconds
since the epoch, UTC; read back in UTC) · ``0F`` timedelta (8 bytes its days, 8 bytes the
microseconds past them).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import math
import pickle
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from extagg.errors import CorruptFileError
from extagg.hashing import stable_hash

__all__ = [
    "KEY_CODEC",
    "VALUE_CODEC",
    "VALUE_CODEC_PICKLE",
    "encode_value",
    "decode_value",
    "encode_key",
    "decode_key",
    "key_hash_prefix",
    "key_hash_of",
    "CANONICAL_NAN",
    "canonical_key",
    "decoding",
]

#: names recorded in the operator metadata
KEY_CODEC = "extagg1"
VALUE_CODEC = "extagg1"
VALUE_CODEC_PICKLE = "extagg1+pickle"

_NONE, _FALSE, _TRUE, _INT64, _BIGINT, _FLOAT, _STR, _BYTES, _TUPLE, _LIST, _PICKLE = range(11)
_DECIMAL, _DATE, _NAIVE_DATETIME, _UTC_DATETIME, _TIMEDELTA = 11, 12, 13, 14, 15
_EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MICRO = dt.timedelta(microseconds=1)

_S_Q = struct.Struct(">q")
_S_D = struct.Struct(">d")
_S_HASH = struct.Struct(">Q")
_pack_q = _S_Q.pack
_pack_d = _S_D.pack
_pack_hash = _S_HASH.pack
_unpack_q = _S_Q.unpack_from
_unpack_d = _S_D.unpack_from
_unpack_hash = _S_HASH.unpack_from
_INT64_MIN = -(1 << 63)
_INT64_END = 1 << 63
_NAN_BYTES = _pack_d(math.nan)
#: every decoded NaN is this object, so a dict rebuilt from a file keeps one NaN key
CANONICAL_NAN = math.nan

_B_NONE = bytes((_NONE,))
_B_FALSE = bytes((_FALSE,))
_B_TRUE = bytes((_TRUE,))
_B_INT64 = bytes((_INT64,))
_B_FLOAT = bytes((_FLOAT,))


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _encode_into(obj: Any, out: list[bytes], allow_pickle: bool) -> None:
    kind = type(obj)
    if kind is int:
        if _INT64_MIN <= obj < _INT64_END:
            out.append(_B_INT64 + _pack_q(obj))
        else:
            data = obj.to_bytes((obj.bit_length() + 8) // 8, "big", signed=True)
            out.append(bytes((_BIGINT,)) + _varint(len(data)) + data)
    elif kind is str:
        data = obj.encode("utf-8", "surrogatepass")
        out.append(bytes((_STR,)) + _varint(len(data)) + data)
    elif obj is None:
        out.append(_B_NONE)
    elif kind is float:
        out.append(_B_FLOAT + (_pack_d(obj) if obj == obj else _NAN_BYTES))
    elif kind is bool:
        out.append(_B_TRUE if obj else _B_FALSE)
    elif kind is bytes:
        out.append(bytes((_BYTES,)) + _varint(len(obj)) + obj)
    elif kind is tuple or kind is list:
        out.append(bytes((_TUPLE if kind is tuple else _LIST,)) + _varint(len(obj)))
        for element in obj:
            _encode_into(element, out, allow_pickle)
    elif isinstance(obj, np.generic) and not isinstance(obj, (np.void, np.object_)):
        _encode_into(obj.item(), out, allow_pickle)
    elif isinstance(obj, bool):
        out.append(_B_TRUE if obj else _B_FALSE)
    elif isinstance(obj, int):  # IntEnum and other int subclasses go by value, like stable_hash
        _encode_into(int(obj), out, allow_pickle)
    elif isinstance(obj, float):
        _encode_into(float(obj), out, allow_pickle)
    elif isinstance(obj, str):
        _encode_into(str.__str__(obj), out, allow_pickle)  # its value: not "Color.RED"
    elif isinstance(obj, (bytearray, memoryview)):
        _encode_into(bytes(obj), out, allow_pickle)
    elif isinstance(obj, dt.datetime):  # before date: a datetime is a date too
        if obj.tzinfo is None or obj.utcoffset() is None:
            out.append(bytes((_NAIVE_DATETIME,)) + _pack_q((obj - _EPOCH) // _MICRO))
        else:
            out.append(bytes((_UTC_DATETIME,)) + _pack_q((obj - _EPOCH_UTC) // _MICRO))
    elif isinstance(obj, dt.date):  # Spark's date and timestamp columns
        out.append(bytes((_DATE,)) + _pack_q(obj.toordinal() - _EPOCH_DATE.toordinal()))
    elif isinstance(obj, dt.timedelta):  # a day-time interval's sum
        out.append(
            bytes((_TIMEDELTA,))
            + _pack_q(obj.days)
            + _pack_q(obj.seconds * 10**6 + obj.microseconds)
        )
    elif isinstance(obj, decimal.Decimal):  # a Spark decimal's exact value (money, long ids)
        data = str(obj).encode("ascii")
        out.append(bytes((_DECIMAL,)) + _varint(len(data)) + data)
    elif allow_pickle:
        data = pickle.dumps(obj, protocol=5)
        out.append(bytes((_PICKLE,)) + _varint(len(data)) + data)
    else:
        raise TypeError(
            f"the state codec cannot encode a value of type {kind.__module__}.{kind.__qualname__}: "
            "supported are None, bool, int, float, str, bytes, Decimal, date, datetime, timedelta "
            "and tuples/lists of these; create "
            "the operator with allow_pickle=True to store other values with pickle"
        )


def encode_value(obj: Any, allow_pickle: bool = False) -> bytes:
    """The deterministic encoding of ``obj``; ``TypeError`` names an unsupported type."""
    kind = type(obj)
    if kind is int and _INT64_MIN <= obj < _INT64_END:
        return _B_INT64 + _pack_q(obj)
    if kind is float:
        return _B_FLOAT + (_pack_d(obj) if obj == obj else _NAN_BYTES)
    parts: list[bytes] = []
    _encode_into(obj, parts, allow_pickle)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def encode_key(key: Any) -> bytes:
    """``stable_hash(key)`` (8 bytes, big-endian) followed by the key's encoding.

    ``TypeError`` names a key type without a deterministic hash.
    """
    return _pack_hash(stable_hash(key)) + encode_value(key)


def key_hash_prefix(key_hash: int) -> bytes:
    """The 8-byte prefix that an encoded key with hash ``key_hash`` starts with."""
    return _pack_hash(key_hash)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("encoded value ends inside a length")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("length varint is too long")


def _take(data: bytes, pos: int, size: int) -> tuple[bytes, int]:
    end = pos + size
    if end > len(data):
        raise ValueError(f"encoded value ends early: needs {size} bytes at offset {pos}")
    return data[pos:end], end


def _decode_at(data: bytes, pos: int, allow_pickle: bool, depth: int) -> tuple[Any, int]:
    if pos >= len(data):
        raise ValueError("encoded value is empty")
    tag = data[pos]
    pos += 1
    if tag == _INT64:
        if pos + 8 > len(data):
            raise ValueError("encoded int64 is truncated")
        return _unpack_q(data, pos)[0], pos + 8
    if tag == _STR:
        size, pos = _read_varint(data, pos)
        raw, pos = _take(data, pos, size)
        try:
            return raw.decode("utf-8", "surrogatepass"), pos
        except UnicodeDecodeError as exc:
            raise ValueError(f"invalid UTF-8 in an encoded str: {exc}") from None
    if tag == _NONE:
        return None, pos
    if tag == _FLOAT:
        if pos + 8 > len(data):
            raise ValueError("encoded float is truncated")
        number = _unpack_d(data, pos)[0]
        return (CANONICAL_NAN if number != number else number), pos + 8
    if tag == _FALSE:
        return False, pos
    if tag == _TRUE:
        return True, pos
    if tag == _BYTES:
        size, pos = _read_varint(data, pos)
        return _take(data, pos, size)
    if tag in (_TUPLE, _LIST):
        if depth > 200:
            raise ValueError("encoded value is nested too deeply")
        count, pos = _read_varint(data, pos)
        if count > len(data) - pos:
            raise ValueError(f"encoded sequence claims {count} elements in {len(data) - pos} bytes")
        items = []
        for _ in range(count):
            item, pos = _decode_at(data, pos, allow_pickle, depth + 1)
            items.append(item)
        return (tuple(items) if tag == _TUPLE else items), pos
    if tag == _BIGINT:
        size, pos = _read_varint(data, pos)
        raw, pos = _take(data, pos, size)
        return int.from_bytes(raw, "big", signed=True), pos
    if tag in (_DATE, _NAIVE_DATETIME, _UTC_DATETIME, _TIMEDELTA):
        width = 16 if tag == _TIMEDELTA else 8
        if pos + width > len(data):
            raise ValueError("encoded date or time is truncated")
        count = _unpack_q(data, pos)[0]
        try:
            if tag == _DATE:
                value: Any = dt.date.fromordinal(_EPOCH_DATE.toordinal() + count)
            elif tag == _NAIVE_DATETIME:
                value = _EPOCH + count * _MICRO
            elif tag == _UTC_DATETIME:
                value = _EPOCH_UTC + count * _MICRO
            else:
                value = dt.timedelta(days=count, microseconds=_unpack_q(data, pos + 8)[0])
        except (ValueError, OverflowError):
            raise ValueError(f"encoded date or time {count} is out of range") from None
        return value, pos + width
    if tag == _DECIMAL:
        size, pos = _read_varint(data, pos)
        raw, pos = _take(data, pos, size)
        try:
            return decimal.Decimal(raw.decode("ascii")), pos
        except (UnicodeDecodeError, decimal.InvalidOperation):
            raise ValueError(f"invalid encoded decimal {raw[:40]!r}") from None
    if tag == _PICKLE:
        size, pos = _read_varint(data, pos)
        raw, pos = _take(data, pos, size)
        if not allow_pickle:
            raise ValueError(
                "found a pickled value but the operator metadata does not allow pickle "
                "(it was not created with allow_pickle=True)"
            )
        try:
            return pickle.loads(raw), pos
        except Exception as exc:
            raise ValueError(f"cannot unpickle a stored value: {exc}") from None
    raise ValueError(f"unknown type tag 0x{tag:02x} in an encoded value")


def decode_value(data: bytes, allow_pickle: bool = False, start: int = 0) -> Any:
    """Decode what :func:`encode_value` produced (from ``start``); ``ValueError`` if malformed."""
    if len(data) - start == 9 and data[start] == _INT64:
        return _unpack_q(data, start + 1)[0]
    value, end = _decode_at(data, start, allow_pickle, 0)
    if end != len(data):
        raise ValueError(f"{len(data) - end} unexpected bytes after an encoded value")
    return value


def decode_key(data: bytes) -> Any:
    """Decode an encoded key (hash prefix and encoding); ``ValueError`` if malformed."""
    if len(data) < 9:
        raise ValueError(f"an encoded key has at least 9 bytes, got {len(data)}")
    return decode_value(data, False, 8)


def canonical_key(key: Any) -> Any:
    """``key`` with every float NaN in it (also inside tuples) replaced by :data:`CANONICAL_NAN`.

    NaN is not equal to itself, so a dict holds as many NaN keys as NaN objects; the encoding
    has one NaN, so the disk holds one. Keys going into the state store's in-memory versions
    are made canonical so both agree (every NaN object is the same key, the one on disk).
    """
    if type(key) is float or isinstance(key, np.floating):  # NumPy's NaN encodes as NaN too
        return CANONICAL_NAN if key != key else key
    if type(key) is tuple:
        items = tuple(canonical_key(item) for item in key)
        if any(a is not b for a, b in zip(items, key)):
            return items
    return key


def key_hash_of(data: bytes) -> int:
    """The ``stable_hash`` stored in the first 8 bytes of an encoded key."""
    return _unpack_hash(data, 0)[0]


@contextlib.contextmanager
def decoding(source: str) -> Iterator[None]:
    """Turn a malformed encoding met while reading ``source`` into a ``CorruptFileError``.

    The files' checksums passed, so such a record was written by something else (or by a newer
    format); either way it is reported against the file or directory it came from.
    """
    try:
        yield
    except CorruptFileError:
        raise
    except ValueError as exc:
        raise CorruptFileError(source, None, f"a record cannot be decoded: {exc}") from None

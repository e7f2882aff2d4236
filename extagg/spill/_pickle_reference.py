"""Pure-Python reference of :mod:`extagg.spill._pickle_kernels` (same signature, same
results); the tests compare the two. It is also the specification.

A batch of the generic engine is ``pickle.dumps((keys, values))`` (:class:`extagg.spill.codecs
.ObjectCodec`). Batches of plain ``int`` keys with ``float`` or ``int`` combiners — what a
lambda sum leaves — are written from arrays in one fixed shape of pickle (protocol 5, no
frame, no memo)::

    PROTO 5  EMPTY_LIST MARK  (LONG1 k)*n  APPENDS
             EMPTY_LIST MARK  (BINFLOAT v | LONG1 v)*n  APPENDS  TUPLE2  STOP

:func:`parse_int_rows` reads exactly that shape straight into arrays, with no Python object
per row; anything else — another opcode, a LONG1 longer than 8 bytes, mixed float and int
values, bytes left over, a payload cut short — returns :data:`NOT_PARSED` and the caller
unpickles the batch as before (so malformed batches raise what they always raised). What it
returns is exactly what ``pickle.loads`` gives: LONG1 is a little-endian two's-complement int,
BINFLOAT a big-endian IEEE double.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "FLOAT_VALUES", "INT_VALUES", "NOT_PARSED", "int_rows_size", "parse_int_rows",
    "write_int_rows",
]  # fmt: skip

NOT_PARSED = 0
FLOAT_VALUES = 1
INT_VALUES = 2

PROTO = 0x80
EMPTY_LIST = 0x5D
MARK = 0x28
APPENDS = 0x65
LONG1 = 0x8A
BINFLOAT = 0x47
TUPLE2 = 0x86
STOP = 0x2E


def _long1(data: np.ndarray, pos: int, end: int) -> tuple[int, int, bool]:
    """``(value as int64 bits, next position, ok)`` of a LONG1 opcode's operand at ``pos``."""
    if pos >= end:
        return 0, pos, False
    length = int(data[pos])
    if length > 8 or pos + 1 + length > end:
        return 0, pos, False
    value = int.from_bytes(bytes(data[pos + 1 : pos + 1 + length]), "little", signed=True)
    return value, pos + 1 + length, True


def parse_int_rows(data: np.ndarray, n: int, keys: np.ndarray, values: np.ndarray) -> int:
    """Parse ``data`` (the pickle bytes of one batch of ``n`` rows, ``uint8``) into ``keys``
    and ``values`` (``uint64`` arrays of bit patterns: an ``int64``'s, a ``float64``'s);
    returns :data:`FLOAT_VALUES`, :data:`INT_VALUES` or :data:`NOT_PARSED`."""
    end = len(data)
    if end < 4 or data[0] != PROTO or data[1] != 5 or data[2] != EMPTY_LIST or data[3] != MARK:
        return NOT_PARSED
    pos = 4
    for i in range(n):
        if pos >= end or data[pos] != LONG1:
            return NOT_PARSED
        key, pos, ok = _long1(data, pos + 1, end)
        if not ok:
            return NOT_PARSED
        keys[i] = key & 0xFFFF_FFFF_FFFF_FFFF
    if pos + 3 > end or data[pos] != APPENDS or data[pos + 1] != EMPTY_LIST:
        return NOT_PARSED
    if data[pos + 2] != MARK:
        return NOT_PARSED
    pos += 3
    kind = NOT_PARSED
    for i in range(n):
        if pos >= end:
            return NOT_PARSED
        op = int(data[pos])
        if op == BINFLOAT and kind != INT_VALUES and pos + 9 <= end:
            kind = FLOAT_VALUES
            values[i] = int.from_bytes(bytes(data[pos + 1 : pos + 9]), "big")
            pos += 9
        elif op == LONG1 and kind != FLOAT_VALUES:
            kind = INT_VALUES
            value, pos, ok = _long1(data, pos + 1, end)
            if not ok:
                return NOT_PARSED
            values[i] = value & 0xFFFF_FFFF_FFFF_FFFF
        else:
            return NOT_PARSED
    if pos + 3 != end or data[pos] != APPENDS or data[pos + 1] != TUPLE2 or data[pos + 2] != STOP:
        return NOT_PARSED
    return FLOAT_VALUES if kind == NOT_PARSED else kind


def int_rows_size(n: int) -> int:
    """Bytes :func:`write_int_rows` writes for ``n`` rows (at most: float values take 9)."""
    return 4 + 10 * n + 3 + 10 * n + 3


def write_int_rows(
    keys: np.ndarray, values: np.ndarray, value_is_float: bool, out: np.ndarray
) -> int:
    """Write the shape :func:`parse_int_rows` reads — keys and int values as 8-byte LONG1,
    float values as BINFLOAT — from ``uint64`` bit patterns into ``out``; returns its length."""
    head = bytes([PROTO, 5, EMPTY_LIST, MARK])
    parts = [head]
    for k in keys.tolist():
        parts.append(bytes([LONG1, 8]) + int(k).to_bytes(8, "little"))
    parts.append(bytes([APPENDS, EMPTY_LIST, MARK]))
    for v in values.tolist():
        if value_is_float:
            parts.append(bytes([BINFLOAT]) + int(v).to_bytes(8, "big"))
        else:
            parts.append(bytes([LONG1, 8]) + int(v).to_bytes(8, "little"))
    parts.append(bytes([APPENDS, TUPLE2, STOP]))
    data = b"".join(parts)
    out[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    return len(data)

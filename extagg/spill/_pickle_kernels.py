"""numba kernel that reads the generic engine's plain int-key batches straight into arrays.

:mod:`extagg.spill._pickle_reference` is the plain-Python twin and the specification (the
tests compare the two, and both against ``pickle.loads``).
"""

from __future__ import annotations

import numpy as np

from extagg._numba import jit
from extagg.spill._pickle_reference import (
    APPENDS,
    BINFLOAT,
    EMPTY_LIST,
    FLOAT_VALUES,
    INT_VALUES,
    LONG1,
    MARK,
    NOT_PARSED,
    PROTO,
    STOP,
    TUPLE2,
    int_rows_size,
)

__all__ = [
    "FLOAT_VALUES", "INT_VALUES", "NOT_PARSED", "int_rows_size", "parse_int_rows",
    "write_int_rows",
]  # fmt: skip


@jit(inline="always")
def _long1(data: np.ndarray, pos: int, end: int) -> tuple[np.uint64, int, bool]:  # pragma: no cover
    """LONG1's operand at ``pos``: its int64 bits, the next position, whether it is valid."""
    if pos >= end:
        return np.uint64(0), pos, False
    length = np.int64(data[pos])
    if length > 8 or pos + 1 + length > end:
        return np.uint64(0), pos, False
    bits = np.uint64(0)
    for j in range(length):
        bits |= np.uint64(data[pos + 1 + j]) << np.uint64(8 * j)
    if 0 < length < 8 and data[pos + length] >= 0x80:  # negative: extend the sign
        bits |= ~np.uint64(0) << np.uint64(8 * length)
    return bits, pos + 1 + length, True


@jit()
def parse_int_rows(
    data: np.ndarray, n: int, keys: np.ndarray, values: np.ndarray
) -> int:  # pragma: no cover - compiled
    """Parse one batch's pickle bytes into arrays (see the reference)."""
    end = data.shape[0]
    if end < 4 or data[0] != PROTO or data[1] != 5 or data[2] != EMPTY_LIST or data[3] != MARK:
        return NOT_PARSED
    pos = 4
    for i in range(n):
        if pos >= end or data[pos] != LONG1:
            return NOT_PARSED
        bits, pos, ok = _long1(data, pos + 1, end)
        if not ok:
            return NOT_PARSED
        keys[i] = bits
    if pos + 3 > end or data[pos] != APPENDS or data[pos + 1] != EMPTY_LIST:
        return NOT_PARSED
    if data[pos + 2] != MARK:
        return NOT_PARSED
    pos += 3
    kind = NOT_PARSED
    for i in range(n):
        if pos >= end:
            return NOT_PARSED
        op = data[pos]
        if op == BINFLOAT and kind != INT_VALUES and pos + 9 <= end:
            kind = FLOAT_VALUES
            bits = np.uint64(0)
            for j in range(8):
                bits = (bits << np.uint64(8)) | np.uint64(data[pos + 1 + j])
            values[i] = bits
            pos += 9
        elif op == LONG1 and kind != FLOAT_VALUES:
            kind = INT_VALUES
            bits, pos, ok = _long1(data, pos + 1, end)
            if not ok:
                return NOT_PARSED
            values[i] = bits
        else:
            return NOT_PARSED
    if pos + 3 != end or data[pos] != APPENDS or data[pos + 1] != TUPLE2 or data[pos + 2] != STOP:
        return NOT_PARSED
    return FLOAT_VALUES if kind == NOT_PARSED else kind


@jit()
def write_int_rows(
    keys: np.ndarray, values: np.ndarray, value_is_float: bool, out: np.ndarray
) -> int:  # pragma: no cover - compiled
    """The pickle bytes of int-key rows from their bit patterns (see the reference)."""
    out[0] = PROTO
    out[1] = 5
    out[2] = EMPTY_LIST
    out[3] = MARK
    pos = 4
    n = keys.shape[0]
    for i in range(n):
        out[pos] = LONG1
        out[pos + 1] = 8
        bits = keys[i]
        for j in range(8):
            out[pos + 2 + j] = np.uint8((bits >> np.uint64(8 * j)) & np.uint64(0xFF))
        pos += 10
    out[pos] = APPENDS
    out[pos + 1] = EMPTY_LIST
    out[pos + 2] = MARK
    pos += 3
    for i in range(n):
        bits = values[i]
        if value_is_float:
            out[pos] = BINFLOAT
            for j in range(8):
                out[pos + 1 + j] = np.uint8((bits >> np.uint64(56 - 8 * j)) & np.uint64(0xFF))
            pos += 9
        else:
            out[pos] = LONG1
            out[pos + 1] = 8
            for j in range(8):
                out[pos + 2 + j] = np.uint8((bits >> np.uint64(8 * j)) & np.uint64(0xFF))
            pos += 10
    out[pos] = APPENDS
    out[pos + 1] = TUPLE2
    out[pos + 2] = STOP
    return pos + 3

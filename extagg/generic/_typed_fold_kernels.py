"""numba kernels of the generic engine's typed path (:mod:`extagg.generic.typed_map`).

They fold a batch of numeric values into per-group states after the typed table has given every
record its group id. :mod:`extagg.generic._typed_fold_reference` is the plain-Python twin and
the specification (the tests compare the two).
"""

from __future__ import annotations

import numpy as np

from extagg._numba import copy_bytes, jit
from extagg.generic._typed_fold_reference import (
    APPENDS,
    BINFLOAT,
    BINUNICODE,
    EMPTY_LIST,
    LONG1,
    MARK,
    OP_ADD,
    OP_COUNT,
    OP_MAX,
    OP_MIN,
    OP_SUM_COUNT,
    SHORT_BINUNICODE,
    STOP,
    TUPLE2,
    pickled_size,
)

__all__ = [
    "OP_ADD",
    "OP_COUNT",
    "OP_MAX",
    "OP_MIN",
    "OP_SUM_COUNT",
    "fold_count",
    "fold_float",
    "fold_int",
    "fold_sum_count",
    "pickle_rows",
    "pickled_size",
]


@jit()
def fold_float(
    op: int, gids: np.ndarray, values: np.ndarray, states: np.ndarray, next_new: int
) -> tuple[int, int]:  # pragma: no cover - compiled
    """Fold ``float64`` ``values`` into ``states`` (see the reference)."""
    n = gids.shape[0]
    for i in range(n):
        g = gids[i]
        v = values[i]
        if g == next_new:
            states[g] = v
            next_new += 1
            continue
        s = states[g]
        if op == OP_ADD:
            states[g] = s + v
        elif op == OP_MIN:
            if v < s:
                states[g] = v
        elif v > s:
            states[g] = v
    return n, next_new


@jit()
def fold_int(
    op: int, gids: np.ndarray, values: np.ndarray, states: np.ndarray, next_new: int
) -> tuple[int, int]:  # pragma: no cover - compiled
    """Fold ``int64`` ``values`` into ``states``, stopping before an overflowing sum."""
    n = gids.shape[0]
    for i in range(n):
        g = gids[i]
        v = values[i]
        if g == next_new:
            states[g] = v
            next_new += 1
            continue
        s = states[g]
        if op == OP_ADD:
            total = s + v  # wraps on overflow: detected by the signs
            if ((s ^ total) & (v ^ total)) < 0:
                return i, next_new
            states[g] = total
        elif op == OP_MIN:
            if v < s:
                states[g] = v
        elif v > s:
            states[g] = v
    return n, next_new


@jit()
def fold_count(
    gids: np.ndarray, counts: np.ndarray, next_new: int
) -> tuple[int, int]:  # pragma: no cover - compiled
    """Count the records of each group into ``counts`` (see the reference)."""
    n = gids.shape[0]
    for i in range(n):
        g = gids[i]
        if g == next_new:
            counts[g] = 1
            next_new += 1
        else:
            counts[g] += 1
    return n, next_new


@jit()
def fold_sum_count(
    gids: np.ndarray,
    values: np.ndarray,
    counts_in: np.ndarray,
    sums: np.ndarray,
    counts: np.ndarray,
    next_new: int,
    sum_low: float,
    sum_high: float,
) -> tuple[int, int]:  # pragma: no cover - compiled
    """Fold ``float64`` or ``int64`` values into ``(sums, counts)`` (see the reference).

    One kernel for both value types (numba compiles one specialisation each). The sum's bound
    test runs before the addition, so an ``int64`` sum never wraps (a test on the wrapped
    result would be folded away by LLVM, which treats signed overflow as impossible).
    """
    n = gids.shape[0]
    ones = counts_in.shape[0] == 0
    for i in range(n):
        g = gids[i]
        v = values[i]
        c = np.int64(1) if ones else counts_in[i]
        if g == next_new:
            sums[g] = v
            counts[g] = c
            next_new += 1
            continue
        s = counts[g]
        count = s + c
        if ((s ^ count) & (c ^ count)) < 0:
            return i, next_new
        t = sums[g]
        if (v > 0 and t > sum_high - v) or (v < 0 and t < sum_low - v):
            return i, next_new
        sums[g] = t + v
        counts[g] = count
    return n, next_new


@jit()
def _put_long1(out: np.ndarray, pos: int, bits: np.uint64) -> int:  # pragma: no cover
    """LONG1 with the 8 little-endian bytes of ``bits`` (an int64's two's complement)."""
    out[pos] = LONG1
    out[pos + 1] = 8
    for j in range(8):
        out[pos + 2 + j] = np.uint8((bits >> np.uint64(8 * j)) & np.uint64(0xFF))
    return pos + 10


@jit()
def pickle_rows(
    order: np.ndarray,
    key_is_str: bool,
    key_bits: np.ndarray,
    var_offsets: np.ndarray,
    arena: np.ndarray,
    value_is_float: bool,
    state_bits: np.ndarray,
    pairs: bool,
    count_bits: np.ndarray,
    out: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """``pickle.dumps((keys, values))`` of the groups ``order`` into ``out`` (see the reference)."""
    out[0] = 0x80
    out[1] = 5
    out[2] = EMPTY_LIST
    out[3] = MARK
    pos = 4
    n = order.shape[0]
    for i in range(n):
        g = order[i]
        if key_is_str:
            start = var_offsets[g]
            length = var_offsets[g + 1] - start
            if length < 256:
                out[pos] = SHORT_BINUNICODE
                out[pos + 1] = length
                pos += 2
            else:
                out[pos] = BINUNICODE
                for j in range(4):
                    out[pos + 1 + j] = (length >> (8 * j)) & 0xFF
                pos += 5
            copy_bytes(out, pos, arena, start, length)
            pos += length
        else:
            pos = _put_long1(out, pos, key_bits[g])
    out[pos] = APPENDS
    out[pos + 1] = EMPTY_LIST
    out[pos + 2] = MARK
    pos += 3
    for i in range(n):
        g = order[i]
        if value_is_float:
            bits = state_bits[g]
            out[pos] = BINFLOAT
            for j in range(8):
                out[pos + 1 + j] = np.uint8((bits >> np.uint64(56 - 8 * j)) & np.uint64(0xFF))
            pos += 9
        else:
            pos = _put_long1(out, pos, state_bits[g])
        if pairs:
            pos = _put_long1(out, pos, count_bits[g])
            out[pos] = TUPLE2
            pos += 1
    out[pos] = APPENDS
    out[pos + 1] = TUPLE2
    out[pos + 2] = STOP
    return pos + 3

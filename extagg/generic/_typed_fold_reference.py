"""Pure-Python references of :mod:`extagg.generic._typed_fold_kernels` (same signatures, same
effects); the tests compare the two. They are also the specification of the typed fold.

A batch of records has already been given group ids (``gids``) by the typed table, new groups
numbered in order of first appearance from ``next_new`` on, so the record that creates group
``g`` is the first record with ``gids[i] == g`` while ``g == next_new``. That record's value
becomes the state (``Aggregator.reducing``'s ``create_combiner`` is the identity); every other
record folds its value in with the operation, exactly as the Python builtins do it:

* ``OP_ADD``: ``state + value``; on ``int64`` an overflow stops the fold at that record (Python
  ints do not overflow: the caller hands the rest to the general path);
* ``OP_MIN``: ``min(state, value)`` keeps ``state`` unless ``value < state`` (so NaN and ``-0.0``
  behave as in Python);
* ``OP_MAX``: ``max(state, value)`` keeps ``state`` unless ``value > state``.

Two more shapes of state serve the count / sum / mean patterns (``Aggregator.counting()``,
``Aggregator.sum_count()``):

* ``OP_COUNT``: one ``int64`` count per group; a value is not looked at, a new group starts at
  1 and every further record adds 1 (:func:`fold_count`). Combiners (counts) fold as
  ``OP_ADD`` on ``int64``.
* ``OP_SUM_COUNT``: a ``(sum, count)`` pair per group, the sum as ``OP_ADD`` folds it (float,
  or int64 stopping before an overflow), the count an ``int64`` (:func:`fold_sum_count`); a
  record adds ``(value, 1)`` or, when combiners are folded, ``(sum, count)``.
"""

from __future__ import annotations

import numpy as np

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

OP_ADD = 0
OP_MIN = 1
OP_MAX = 2
OP_COUNT = 3
OP_SUM_COUNT = 4

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def fold_float(
    op: int, gids: np.ndarray, values: np.ndarray, states: np.ndarray, next_new: int
) -> tuple[int, int]:
    """Fold ``float64`` ``values`` into ``states``; returns ``(records folded, next_new)``."""
    for i in range(gids.shape[0]):
        g = int(gids[i])
        v = float(values[i])
        if g == next_new:
            states[g] = v
            next_new += 1
            continue
        s = float(states[g])
        if op == OP_ADD:
            states[g] = s + v
        elif op == OP_MIN:
            if v < s:
                states[g] = v
        elif v > s:
            states[g] = v
    return gids.shape[0], next_new


def fold_int(
    op: int, gids: np.ndarray, values: np.ndarray, states: np.ndarray, next_new: int
) -> tuple[int, int]:
    """Fold ``int64`` ``values`` into ``states``; stops before a sum leaving ``int64`` and
    returns ``(records folded, next_new)``."""
    for i in range(gids.shape[0]):
        g = int(gids[i])
        v = int(values[i])
        if g == next_new:
            states[g] = v
            next_new += 1
            continue
        s = int(states[g])
        if op == OP_ADD:
            total = s + v
            if not _INT64_MIN <= total <= _INT64_MAX:
                return i, next_new
            states[g] = total
        elif op == OP_MIN:
            if v < s:
                states[g] = v
        elif v > s:
            states[g] = v
    return gids.shape[0], next_new


def fold_count(gids: np.ndarray, counts: np.ndarray, next_new: int) -> tuple[int, int]:
    """Count the records of each group into ``counts`` (a new group starts at 1); returns
    ``(records folded, next_new)``."""
    for i in range(gids.shape[0]):
        g = int(gids[i])
        if g == next_new:
            counts[g] = 1
            next_new += 1
        else:
            counts[g] = int(counts[g]) + 1
    return gids.shape[0], next_new


def fold_sum_count(
    gids: np.ndarray,
    values: np.ndarray,
    counts_in: np.ndarray,
    sums: np.ndarray,
    counts: np.ndarray,
    next_new: int,
    sum_low: float,
    sum_high: float,
) -> tuple[int, int]:
    """Fold ``float64`` or ``int64`` ``values`` into ``(sums, counts)``: each record adds
    ``(value, 1)`` — or ``(value, counts_in[i])`` when ``counts_in`` is not empty (folding
    combiners); stops before a count leaving ``int64`` or a sum leaving ``[sum_low,
    sum_high]`` (``int64``'s bounds for ``int64`` values; ``±inf`` for floats, which never
    stops a float sum). Returns ``(records folded, next_new)``."""
    is_int = values.dtype.kind == "i"
    ones = counts_in.shape[0] == 0
    for i in range(gids.shape[0]):
        g = int(gids[i])
        v = int(values[i]) if is_int else float(values[i])
        c = 1 if ones else int(counts_in[i])
        if g == next_new:
            sums[g] = v
            counts[g] = c
            next_new += 1
            continue
        t = int(sums[g]) if is_int else float(sums[g])
        count = int(counts[g]) + c
        if not _INT64_MIN <= count <= _INT64_MAX:
            return i, next_new
        if (v > 0 and t > sum_high - v) or (v < 0 and t < sum_low - v):
            return i, next_new
        sums[g] = t + v
        counts[g] = count
    return gids.shape[0], next_new


# -- spilling without Python objects -------------------------------------------------------------
# A spilled batch of the generic engine is ``pickle.dumps((keys, values))`` after its hashes
# (:class:`extagg.spill.codecs.ObjectCodec`). The typed path writes those bytes itself, from its
# arrays, with the opcodes below (protocol 5 without frames or memo, both optional): the merge
# then reads what it would have read had the rows been pickled as ``str``/``int``/``float``.
PROTO = b"\x80\x05"
EMPTY_LIST = 0x5D  # ]
MARK = 0x28  # (
APPENDS = 0x65  # e
TUPLE2 = 0x86
STOP = 0x2E  # .
SHORT_BINUNICODE = 0x8C  # 1-byte length, UTF-8 bytes
BINUNICODE = 0x58  # X, 4-byte little-endian length, UTF-8 bytes
LONG1 = 0x8A  # 1-byte length (8 here), little-endian two's complement
BINFLOAT = 0x47  # G, 8 bytes big-endian IEEE 754


def pickled_size(n: int, key_bytes: int, pairs: bool = False) -> int:
    """An upper bound of the bytes :func:`pickle_rows` writes for ``n`` rows whose str keys
    hold ``key_bytes`` UTF-8 bytes together (0 for int keys); ``pairs``: each value is a
    ``(sum, count)`` tuple."""
    return 16 + n * (5 + 10) + key_bytes + n * (21 if pairs else 10)


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
) -> int:
    """Write ``pickle.dumps((keys, values))`` of the groups ``order`` (in that order) into
    ``out`` and return its length. Keys are the int64 whose two's complement is
    ``key_bits[g]`` (``uint64``) or the UTF-8 (surrogatepass) bytes
    ``arena[var_offsets[g]:var_offsets[g + 1]]``; values the float64 or int64 whose bits are
    ``state_bits[g]`` — with ``pairs``, the tuple of that and the int64 ``count_bits[g]``."""
    buf = bytearray(PROTO)
    buf += bytes((EMPTY_LIST, MARK))
    for g in order.tolist():
        if key_is_str:
            raw = bytes(arena[var_offsets[g] : var_offsets[g + 1]])
            if len(raw) < 256:
                buf += bytes((SHORT_BINUNICODE, len(raw)))
            else:
                buf += bytes((BINUNICODE,)) + len(raw).to_bytes(4, "little")
            buf += raw
        else:
            buf += bytes((LONG1, 8)) + int(key_bits[g]).to_bytes(8, "little")
    buf += bytes((APPENDS, EMPTY_LIST, MARK))
    for g in order.tolist():
        if value_is_float:
            buf += bytes((BINFLOAT,)) + int(state_bits[g]).to_bytes(8, "big")
        else:
            buf += bytes((LONG1, 8)) + int(state_bits[g]).to_bytes(8, "little")
        if pairs:
            buf += bytes((LONG1, 8)) + int(count_bits[g]).to_bytes(8, "little") + bytes((TUPLE2,))
    buf += bytes((APPENDS, TUPLE2, STOP))
    out[: len(buf)] = np.frombuffer(bytes(buf), dtype=np.uint8)
    return len(buf)

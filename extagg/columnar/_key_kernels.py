"""numba kernels that turn key columns into the typed table's key representation and back.

Fixed-width keys become 64-bit words whose equality is key equality: floats are canonicalised
(every NaN is one NaN, ``-0.0`` is ``0.0``) and nulls become 0 (their null bit tells them
apart). Several variable-length key columns are packed into one byte string per row, each value
prefixed by its ``u32`` length (a null is an empty value; its null bit tells it apart).
Plain-Python references: :mod:`extagg.columnar._key_reference`.
"""

from __future__ import annotations

import numpy as np

from extagg._numba import copy_bytes, jit

__all__ = [
    "float_words",
    "add_var_lengths",
    "write_var",
    "unpack_var",
    "combine_codes",
    "lookup_groups",
]

_jit = jit()

_CANONICAL_NAN = np.uint64(0x7FF8000000000000)


@_jit
def float_words(values, valid, out):
    """Canonical float64 bit patterns of ``values`` (float32 or float64); nulls give 0."""
    has_mask = valid.shape[0] > 0
    for i in range(values.shape[0]):
        x = np.float64(values[i])
        if has_mask and not valid[i]:
            out[i] = np.uint64(0)
        elif x != x:
            out[i] = _CANONICAL_NAN
        elif x == 0.0:
            out[i] = np.uint64(0)
        else:
            out[i] = np.float64(x).view(np.uint64)


@_jit
def add_var_lengths(offsets, valid, prefix, lengths):
    """``lengths[i] += prefix + len(value i)`` (0 for a null value)."""
    has_mask = valid.shape[0] > 0
    for i in range(lengths.shape[0]):
        size = offsets[i + 1] - offsets[i]
        if has_mask and not valid[i]:
            size = 0
        lengths[i] += prefix + size


@_jit
def write_var(cursor, offsets, data, valid, prefix, blob):
    """Append value ``i`` (length-prefixed when ``prefix``) at ``cursor[i]`` and advance it."""
    has_mask = valid.shape[0] > 0
    for i in range(cursor.shape[0]):
        s = offsets[i]
        size = offsets[i + 1] - s
        if has_mask and not valid[i]:
            size = 0
        c = cursor[i]
        if prefix:
            for b in range(4):
                blob[c + b] = np.uint8((size >> (8 * b)) & 0xFF)
            c += 4
        copy_bytes(blob, c, data, s, size)
        cursor[i] = c + size


@_jit
def unpack_var(blob_offsets, blob, index):
    """Column ``index`` of length-prefixed packed values: ``(offsets from 0, data)``."""
    n = blob_offsets.shape[0] - 1
    out_off = np.empty(n + 1, dtype=np.int64)
    out_off[0] = 0
    starts = np.empty(n, dtype=np.int64)
    total = 0
    for i in range(n):
        c = blob_offsets[i]
        size = 0
        for _ in range(index + 1):
            size = 0
            for b in range(4):
                size |= np.int64(blob[c + b]) << (8 * b)
            c += 4 + size
        starts[i] = c - size
        total += size
        out_off[i + 1] = total
    out = np.empty(total, dtype=np.uint8)
    for i in range(n):
        d = out_off[i]
        copy_bytes(out, d, blob, starts[i], out_off[i + 1] - d)
    return out_off, out


@_jit
def combine_codes(combo, codes, valid, base, first):
    """Fold one dictionary-coded key into each row's combination number, in place:
    ``combo = combo * base + code`` (``combo = code`` when ``first``); a null (``valid``
    non-empty and false) takes code ``base - 1``. ``codes`` of any integer type: no copy."""
    has_mask = valid.shape[0] > 0
    for i in range(combo.shape[0]):
        code = np.int64(codes[i])
        if has_mask and not valid[i]:
            code = np.int64(base - 1)
        if first:
            combo[i] = code
        else:
            combo[i] = combo[i] * base + code


@_jit
def lookup_groups(combo, lookup, gids):
    """Each row's group id ``lookup[combo]`` into ``gids``; returns how many rows had none
    (-1) yet."""
    misses = 0
    for i in range(combo.shape[0]):
        g = lookup[combo[i]]
        gids[i] = g
        if g < 0:
            misses += 1
    return misses

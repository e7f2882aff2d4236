"""Plain-Python references of :mod:`extagg.columnar._key_kernels`, for the tests."""

from __future__ import annotations

import math
import struct

import numpy as np


def float_words(values, valid, out):
    """Reference of ``float_words``."""
    for i, x in enumerate(values.tolist()):
        if len(valid) and not valid[i]:
            out[i] = 0
        elif math.isnan(x):
            out[i] = 0x7FF8000000000000
        elif x == 0.0:
            out[i] = 0
        else:
            out[i] = struct.unpack("<Q", struct.pack("<d", float(x)))[0]


def add_var_lengths(offsets, valid, prefix, lengths):
    """Reference of ``add_var_lengths``."""
    for i in range(len(lengths)):
        size = 0 if (len(valid) and not valid[i]) else int(offsets[i + 1] - offsets[i])
        lengths[i] += prefix + size


def write_var(cursor, offsets, data, valid, prefix, blob):
    """Reference of ``write_var``."""
    for i in range(len(cursor)):
        value = b"" if (len(valid) and not valid[i]) else bytes(data[offsets[i] : offsets[i + 1]])
        piece = (struct.pack("<I", len(value)) if prefix else b"") + value
        c = int(cursor[i])
        blob[c : c + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
        cursor[i] = c + len(piece)


def unpack_var(blob_offsets, blob, index):
    """Reference of ``unpack_var``."""
    values = []
    for i in range(len(blob_offsets) - 1):
        c = int(blob_offsets[i])
        for _ in range(index):
            (size,) = struct.unpack_from("<I", bytes(blob[c : c + 4]))
            c += 4 + size
        (size,) = struct.unpack_from("<I", bytes(blob[c : c + 4]))
        values.append(bytes(blob[c + 4 : c + 4 + size]))
    out_off = np.zeros(len(values) + 1, dtype=np.int64)
    out_off[1:] = np.cumsum([len(v) for v in values], dtype=np.int64)
    return out_off, np.frombuffer(b"".join(values), dtype=np.uint8).copy()


def radix_partition(hashes, bits, order, bounds):
    """Reference of :func:`extagg.columnar._radix_kernels.radix_partition`."""
    parts: list[list[int]] = [[] for _ in range(len(bounds) - 1)]
    for i, h in enumerate(hashes.tolist()):
        parts[h >> (64 - bits)].append(i)
    bounds[0] = 0
    pos = 0
    for p, rows in enumerate(parts):
        for r in rows:
            order[pos] = r
            pos += 1
        bounds[p + 1] = pos


def gather_hashes(hashes, rows, bits, out):
    """Reference of :func:`extagg.columnar._radix_kernels.gather_hashes`."""
    for i, r in enumerate(rows.tolist()):
        h = int(hashes[r])
        out[i] = ((h << bits) | (h >> (64 - bits))) & (2**64 - 1) if bits else h


def scatter_partitions(values, order, bounds, fill, out):
    """Reference of :func:`extagg.columnar._radix_kernels.scatter_partitions`."""
    for p in range(len(bounds) - 1):
        for j, i in enumerate(range(int(bounds[p]), int(bounds[p + 1]))):
            out[p, int(fill[p]) + j] = values[int(order[i])]


def gather_words(words, rows, out):
    """Reference of :func:`extagg.columnar._radix_kernels.gather_words`."""
    for i, r in enumerate(rows.tolist()):
        out[i, :] = words[r, :]


def combine_codes(combo, codes, valid, base, first):
    """Reference of ``combine_codes``."""
    for i in range(len(combo)):
        code = int(codes[i])
        if len(valid) and not valid[i]:
            code = base - 1
        combo[i] = code if first else int(combo[i]) * base + code


def lookup_groups(combo, lookup, gids):
    """Reference of ``lookup_groups``."""
    misses = 0
    for i in range(len(combo)):
        gids[i] = lookup[int(combo[i])]
        misses += int(gids[i] < 0)
    return misses

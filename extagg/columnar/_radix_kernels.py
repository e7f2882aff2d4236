"""numba kernels of the threaded columnar engine: rows grouped by the top bits of their hash.

:func:`radix_partition` is a stable counting sort of a chunk's rows by partition (the top
``bits`` of each key hash): one pass counts, one pass places. Stable, so a partition's rows keep
their input order (``first``/``last`` rely on it). It releases the GIL (``extagg._numba``), so
the slices of a chunk are sorted side by side. :func:`gather_hashes` and :func:`gather_words`
copy one partition's keys out of a slice in one pass each (the hashes rotated as the
partition's aggregator sees them). :func:`scatter_partitions` appends a chunk's rows, so
grouped, to one buffer per partition (a column at a time: the rows a hash-partitioning
aggregator sets aside). Plain-Python references: :mod:`extagg.columnar._key_reference`.
"""

from __future__ import annotations

import numpy as np

from extagg._numba import jit

__all__ = ["gather_hashes", "gather_words", "radix_partition", "scatter_partitions"]

_jit = jit()


@_jit
def radix_partition(hashes: np.ndarray, bits: int, order: np.ndarray, bounds: np.ndarray) -> None:
    """Rows of ``hashes`` grouped by their top ``bits`` (1..16), stably.

    Fills ``order`` (int64, one per row: the row numbers of partition 0, then 1, ...) and
    ``bounds`` (int64, ``2**bits + 1``: partition ``p`` is ``order[bounds[p]:bounds[p + 1]]``).
    """
    n = hashes.shape[0]
    if bits == 1:  # two threads: both cursors in registers (no store-to-load chain)
        ones = 0
        for i in range(n):
            ones += np.int64(hashes[i] >> np.uint64(63))
        bounds[0] = 0
        bounds[1] = n - ones
        bounds[2] = n
        low = 0
        high = n - ones
        for i in range(n):
            top = np.int64(hashes[i] >> np.uint64(63))
            order[high if top else low] = i
            low += 1 - top
            high += top
        return
    shift = np.uint64(64 - bits)
    parts = bounds.shape[0] - 1
    # counts and cursors in arrays of the kernel's own, which ``order`` cannot alias: the
    # compiler keeps no reload of them after every store (0.65 -> 0.3 ms a 128 K-row slice)
    counts = np.zeros(parts, np.int64)
    for i in range(n):
        counts[np.int64(hashes[i] >> shift)] += 1
    bounds[0] = 0
    for p in range(parts):
        bounds[p + 1] = bounds[p] + counts[p]
    cursor = bounds[:parts].copy()
    for i in range(n):
        p = np.int64(hashes[i] >> shift)
        j = cursor[p]
        order[j] = i
        cursor[p] = j + 1


@_jit
def gather_hashes(hashes, rows, bits, out):
    """``out[i] = rotate_left(hashes[rows[i]], bits)`` (``0 <= bits < 64``)."""
    b = np.uint64(bits)
    back = np.uint64((64 - bits) % 64)
    for i in range(rows.shape[0]):
        h = hashes[rows[i]]
        out[i] = (h << b) | (h >> back) if bits else h


@_jit
def gather_words(words, rows, out):
    """``out[i, :] = words[rows[i], :]`` (2-D uint64 key words)."""
    width = words.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(width):
            out[i, j] = words[r, j]


@_jit
def scatter_partitions(
    values: np.ndarray, order: np.ndarray, bounds: np.ndarray, fill: np.ndarray, out: np.ndarray
) -> None:
    """Append each partition's rows to its buffer: ``out[p, fill[p] + j] = values[order[i]]``
    for the ``j``-th row ``i`` of ``bounds[p]..bounds[p + 1]`` (what :func:`radix_partition`
    made). ``values`` is 1-D (``out``: partitions x capacity) or 2-D (a row's several words;
    ``out``: partitions x capacity x words); the rows must fit (``fill`` is not changed)."""
    for p in range(bounds.shape[0] - 1):
        at = fill[p]
        for i in range(bounds[p], bounds[p + 1]):
            out[p, at] = values[order[i]]
            at += 1

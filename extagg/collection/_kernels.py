"""numba kernels of the generic AppendOnlyMap: batch probing, rehashing, undo, hash sorting.

The map keeps its Python keys and combiners in dense lists (insertion order); these kernels only
see the open-addressing ``int32`` table of entry references and each entry's cached Python
``hash()`` (``int64``). They decide key equality only between two tagged ints (an exact ``int``
equal to its hash: equal hashes are equal values); every other hash match is confirmed in Python
by the caller. Pure-Python twins, which also serve as the specification of the layout and the
probe sequence, live in :mod:`extagg.collection._kernels_reference`.
"""

from __future__ import annotations

import numpy as np

from extagg._numba import jit
from extagg.collection._kernels_reference import CONFIRMED, EMPTY, NEW, UNCONFIRMED

__all__ = [
    "CONFIRMED",
    "EMPTY",
    "NEW",
    "UNCONFIRMED",
    "probe_batch",
    "rehash_table",
    "release_entries",
    "resolve_ties",
    "stable_argsort_u64",
]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
#: runs of equal top bits longer than this are sorted with a merge sort instead of insertion
_INSERTION_RUN = 16


@jit(inline="always")
def _home_slot(h, shift, mask):  # pragma: no cover - compiled
    x = np.uint64(h) * _GOLDEN
    return np.int64(x >> np.uint64(shift)) & mask


@jit()
def probe_batch(
    table,
    entry_hashes,
    batch_hashes,
    batch_tags,
    start,
    size,
    grow_threshold,
    shift,
    mask,
    out_entries,
    out_status,
):  # pragma: no cover - compiled
    """Probe ``batch_hashes[start:]``, adding entries for new hashes (see the reference)."""
    n = batch_hashes.shape[0]
    unconfirmed = 0
    for i in range(start, n):
        h = batch_hashes[i]
        tag = np.int64(batch_tags[i])
        pos = _home_slot(h, shift, mask)
        step = 1
        while True:
            ref = np.int64(table[pos])
            if ref == EMPTY:
                if size >= grow_threshold:
                    return i, size, unconfirmed
                table[pos] = 2 * size + tag
                entry_hashes[size] = h
                out_entries[i] = size
                out_status[i] = NEW
                size += 1
                break
            if entry_hashes[ref >> 1] == h:
                out_entries[i] = ref >> 1
                if tag != 0 and (ref & 1) != 0:
                    out_status[i] = CONFIRMED
                else:
                    out_status[i] = UNCONFIRMED
                    unconfirmed += 1
                break
            pos = (pos + step) & mask
            step += 1
    return n, size, unconfirmed


@jit()
def rehash_table(old_table, entry_hashes, new_table, shift, mask):  # pragma: no cover - compiled
    """Re-insert every reference of the old table into the empty new one (see the reference)."""
    moved = 0
    for old in range(old_table.shape[0]):
        ref = np.int64(old_table[old])
        if ref == EMPTY:
            continue
        pos = _home_slot(entry_hashes[ref >> 1], shift, mask)
        step = 1
        while new_table[pos] != EMPTY:
            pos = (pos + step) & mask
            step += 1
        new_table[pos] = ref
        moved += 1
    return moved


@jit()
def release_entries(table, entry_hashes, first, stop, shift, mask):  # pragma: no cover - compiled
    """Empty the slots of the newest entries ``first..stop-1`` (see the reference)."""
    for entry in range(stop - 1, first - 1, -1):
        pos = _home_slot(entry_hashes[entry], shift, mask)
        step = 1
        while True:
            ref = np.int64(table[pos])
            if ref != EMPTY and (ref >> 1) == entry:
                break
            pos = (pos + step) & mask
            step += 1
        table[pos] = EMPTY


@jit()
def resolve_ties(packed, values, index_bits):  # pragma: no cover - compiled
    """Stable order of ``values`` from its sorted packed (top bits, index) words (see reference)."""
    n = packed.shape[0]
    index_mask = np.uint64((1 << index_bits) - 1)
    order = np.empty(n, dtype=np.int64)
    for i in range(n):
        order[i] = np.int64(packed[i] & index_mask)
    shift = np.uint64(index_bits)
    i = 0
    while i < n:
        top = packed[i] >> shift
        j = i + 1
        while j < n and (packed[j] >> shift) == top:
            j += 1
        if j - i > 1:
            run = j - i
            if run <= _INSERTION_RUN:
                # stable insertion sort by full value; the run starts in index order
                for a in range(i + 1, j):
                    item = order[a]
                    v = values[item]
                    b = a - 1
                    while b >= i and values[order[b]] > v:
                        order[b + 1] = order[b]
                        b -= 1
                    order[b + 1] = item
            else:
                idx = order[i:j].copy()
                sub = np.empty(run, dtype=values.dtype)
                for a in range(run):
                    sub[a] = values[idx[a]]
                perm = np.argsort(sub, kind="mergesort")
                for a in range(run):
                    order[i + a] = idx[perm[a]]
        i = j
    return order


def stable_argsort_u64(values: np.ndarray) -> np.ndarray:
    """Indices sorting ``uint64`` ``values`` ascending, equal values in index order.

    Faster than ``np.argsort(kind="stable")`` on 64-bit keys (no AVX-512 here): sorts packed
    ``(top bits of value, index)`` words with ``np.sort`` and fixes the rare runs whose top bits
    tie in :func:`resolve_ties`. Needs two ``int64``-sized arrays of working memory.
    """
    n = values.shape[0]
    if n < 2:
        return np.arange(n, dtype=np.int64)
    index_bits = (n - 1).bit_length()
    low = np.uint64(index_bits)
    packed = (values >> low) << low
    packed |= np.arange(n, dtype=np.uint64)
    packed.sort()
    return resolve_ties(packed, values, index_bits)

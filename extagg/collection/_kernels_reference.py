"""Pure-Python references of the numba kernels in :mod:`extagg.collection._kernels`.

Each function has the same signature and the same effect (outputs written, value returned) as
its jitted twin; the tests compare the two on random inputs. They are also the specification.

The layout they work on (a compact dict, as CPython's): entries live densely in insertion order
(``entry_hashes[e]`` is the cached Python ``hash()`` of entry ``e``; the keys and values are
Python lists the kernels never see) and the open-addressing ``table`` (``int32``) holds ``-1`` for
an empty slot, else ``2 * e + tag``. ``tag`` may be 1 only when entry ``e``'s key is an exact
``int`` equal to its own hash: two such keys are equal exactly when their hashes are, so the
kernel may confirm the match itself (0 is always safe: the caller then compares the keys).

The probe sequence (shared with the single-key methods of the map): hash ``h`` has home slot
``((h * GOLDEN) mod 2**64) >> shift`` (the top ``log2(capacity)`` bits of the product, so every
bit of ``h`` moves the slot) masked with ``capacity - 1``; on a miss the probe moves by 1, 2, 3,
... slots (triangular probing, which visits every slot of a power-of-two table).
"""

from __future__ import annotations

import numpy as np

GOLDEN = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1

#: table value of an empty slot
EMPTY = -1
#: probe status of a record: hash match confirmed as key match / new key claimed / unconfirmed
CONFIRMED = 0
NEW = 1
UNCONFIRMED = 2


def home_slot(h: int, shift: int, mask: int) -> int:
    """The first slot probed for cached hash ``h``."""
    return (((h * GOLDEN) & M64) >> shift) & mask


def probe_batch(
    table: np.ndarray,
    entry_hashes: np.ndarray,
    batch_hashes: np.ndarray,
    batch_tags: np.ndarray,
    start: int,
    size: int,
    grow_threshold: int,
    shift: int,
    mask: int,
    out_entries: np.ndarray,
    out_status: np.ndarray,
) -> tuple[int, int, int]:
    """Probe ``batch_hashes[start:]`` in order, adding an entry for every new hash.

    ``batch_tags[i]`` is 1 when record ``i``'s key is an exact int equal to its hash. For record
    ``i`` writes ``out_entries[i]`` (the entry with an equal cached hash, or the entry just added)
    and ``out_status[i]``: ``NEW`` when added, ``CONFIRMED`` for a hash match where both keys are
    tagged ints, else ``UNCONFIRMED`` (the caller must compare the keys). Adding entry ``size``
    fills the empty slot with ``2 * size + tag`` and sets ``entry_hashes[size]``. The probe stops
    before a record that would add an entry while ``size >= grow_threshold`` (grow first).

    Returns ``(stop, size, unconfirmed)``: the first record not probed (``len(batch_hashes)``
    when all were), the entry count afterwards and the number of ``UNCONFIRMED`` records.
    """
    n = len(batch_hashes)
    unconfirmed = 0
    for i in range(start, n):
        h = int(batch_hashes[i])
        tag = int(batch_tags[i])
        pos = home_slot(h, shift, mask)
        step = 1
        while True:
            ref = int(table[pos])
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
                if tag and ref & 1:
                    out_status[i] = CONFIRMED
                else:
                    out_status[i] = UNCONFIRMED
                    unconfirmed += 1
                break
            pos = (pos + step) & mask
            step += 1
    return n, size, unconfirmed


def rehash_table(
    old_table: np.ndarray, entry_hashes: np.ndarray, new_table: np.ndarray, shift: int, mask: int
) -> int:
    """Re-insert every reference of the old table (slot order, as Spark) into the empty new one.

    No equality checks: every entry is distinct. Returns the number of references moved.
    """
    moved = 0
    for old in range(len(old_table)):
        ref = int(old_table[old])
        if ref == EMPTY:
            continue
        pos = home_slot(int(entry_hashes[ref >> 1]), shift, mask)
        step = 1
        while new_table[pos] != EMPTY:
            pos = (pos + step) & mask
            step += 1
        new_table[pos] = ref
        moved += 1
    return moved


def release_entries(
    table: np.ndarray, entry_hashes: np.ndarray, first: int, stop: int, shift: int, mask: int
) -> None:
    """Empty the table slots of entries ``first..stop-1``, the most recently added ones.

    Newest first: an entry's probe path only crosses slots of older entries, so each search
    finds its entry before any slot it has emptied.
    """
    for entry in range(stop - 1, first - 1, -1):
        pos = home_slot(int(entry_hashes[entry]), shift, mask)
        step = 1
        while True:
            ref = int(table[pos])
            if ref != EMPTY and ref >> 1 == entry:
                break
            pos = (pos + step) & mask
            step += 1
        table[pos] = EMPTY


def stable_argsort_u64(values: np.ndarray) -> np.ndarray:
    """Indices that sort ``values`` ascending; equal values keep their index order."""
    return np.array(sorted(range(len(values)), key=lambda i: int(values[i])), dtype=np.int64)


def resolve_ties(packed: np.ndarray, values: np.ndarray, index_bits: int) -> np.ndarray:
    """The stable order of ``values`` from its sorted packed words.

    ``packed`` holds ``(values[i] >> index_bits << index_bits) | i`` sorted ascending: the order
    of the top bits, ties broken by index. Entries whose top bits are equal but whose full values
    differ are reordered by full value (stably), giving exactly the stable argsort of ``values``.
    """
    index_mask = (1 << index_bits) - 1
    order = [int(p) & index_mask for p in packed]
    out: list[int] = []
    i = 0
    n = len(order)
    while i < n:
        j = i + 1
        top = int(packed[i]) >> index_bits
        while j < n and int(packed[j]) >> index_bits == top:
            j += 1
        out.extend(sorted(order[i:j], key=lambda k: int(values[k])))
        i = j
    return np.array(out, dtype=np.int64)

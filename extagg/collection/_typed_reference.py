"""Plain-Python references of :mod:`extagg.collection._typed_kernels`, for the tests.

Same arguments, same results, written for clarity rather than speed.
"""

from __future__ import annotations

import numpy as np

from extagg.collection._typed_kernels import ARENA_FULL, DONE, TABLE_FULL


def _key(words, nulls, var_off, var_data, i):
    null = int(nulls[i]) if len(nulls) else 0
    var = bytes(var_data[var_off[i] : var_off[i + 1]]) if len(var_off) else b""
    return (null, tuple(int(w) for w in words[i]), var)


def insert_rows(
    hashes, words, nulls, var_off, var_data, start, slots, shift, key_words, key_nulls,
    g_var_off, arena, meta, grow_at, out_gid,
):  # fmt: skip
    """Reference of ``insert_rows``: same probing, same stopping rules."""
    n = len(hashes)
    mask = len(slots) - 1
    n_groups, used = int(meta[0]), int(meta[1])
    has_var = len(g_var_off) > 0
    for i in range(start, n):
        h = int(hashes[i])
        pos = h >> int(shift)
        step = 0
        key = _key(words, nulls, var_off, var_data, i)
        while True:
            g1 = int(slots[pos, 1])
            if g1 == 0:
                if n_groups >= grow_at:
                    meta[0], meta[1] = n_groups, used
                    return i, TABLE_FULL
                if has_var:
                    value = key[2]
                    if used + len(value) > len(arena):
                        meta[0], meta[1] = n_groups, used
                        return i, ARENA_FULL
                    arena[used : used + len(value)] = np.frombuffer(value, dtype=np.uint8)
                    used += len(value)
                    g_var_off[n_groups + 1] = used
                key_words[n_groups, :] = words[i, :]
                if len(key_nulls):  # empty: no null key anywhere (see the kernel)
                    key_nulls[n_groups] = key[0]
                slots[pos, 0] = h
                slots[pos, 1] = n_groups + 1
                out_gid[i] = n_groups
                n_groups += 1
                break
            if int(slots[pos, 0]) == h:
                g = g1 - 1
                if _key(key_words, key_nulls, g_var_off, arena, g) == key:
                    out_gid[i] = g
                    break
            step += 1
            pos = (pos + step) & mask
    meta[0], meta[1] = n_groups, used
    return n, DONE


def insert_rows_hash_is_key(hashes, words, start, slots, shift, key_words, meta, grow_at, out_gid):
    """Reference of ``insert_rows_hash_is_key``: a hash match is a key match."""
    n = len(hashes)
    mask = len(slots) - 1
    n_groups = int(meta[0])
    for i in range(start, n):
        h = int(hashes[i])
        pos = h >> int(shift)
        step = 0
        while True:
            g1 = int(slots[pos, 1])
            if g1 == 0:
                if n_groups >= grow_at:
                    meta[0] = n_groups
                    return i, TABLE_FULL
                key_words[n_groups, 0] = words[i, 0]
                slots[pos, 0], slots[pos, 1] = h, n_groups + 1
                out_gid[i] = n_groups
                n_groups += 1
                break
            if int(slots[pos, 0]) == h:
                out_gid[i] = g1 - 1
                break
            step += 1
            pos = (pos + step) & mask
    meta[0] = n_groups
    return n, DONE


def rehash_slots(old, new, shift):
    """Reference of ``rehash_slots``."""
    mask = len(new) - 1
    for i in range(len(old)):
        if int(old[i, 1]) == 0:
            continue
        pos = int(old[i, 0]) >> int(shift)
        step = 0
        while int(new[pos, 1]) != 0:
            step += 1
            pos = (pos + step) & mask
        new[pos] = old[i]


def sort_slots(slots):
    """Reference of ``sort_slots``: occupied slots to the front, sorted by (hash, group)."""
    pairs = sorted((int(h), int(g)) for h, g in slots if int(g) != 0)
    for i, (h, g) in enumerate(pairs):
        slots[i, 0] = h
        slots[i, 1] = g
    return len(pairs)


def sort_hash_index(hashes, index):
    """Reference of ``sort_hash_index``."""
    pairs = sorted(zip(hashes.tolist(), index.tolist()))
    hashes[:] = [p[0] for p in pairs]
    index[:] = [p[1] for p in pairs]


def _group_sorted_rows(sorted_hashes, order, words, nulls, var_off, var_data, out_gid, first_row):
    """Number the keys of rows visited in ``order`` (sorted by hash), in visiting order."""
    groups: dict[tuple[int, tuple], int] = {}
    for p, row in enumerate(order.tolist()):
        key = (int(sorted_hashes[p]), _key(words, nulls, var_off, var_data, row))
        if key not in groups:
            first_row[len(groups)] = row
            groups[key] = len(groups)
        out_gid[row] = groups[key]
    return len(groups)


def group_sorted_pieces(hashes, starts, words, nulls, var_off, var_data, out_gid, first_row):
    """Reference of ``group_sorted_pieces``: sort rows by (hash, row), then group them (the
    pieces' order is not used)."""
    order = np.arange(len(hashes), dtype=np.int64)
    sorted_hashes = hashes.copy()
    sort_hash_index(sorted_hashes, order)
    return _group_sorted_rows(
        sorted_hashes, order, words, nulls, var_off, var_data, out_gid, first_row
    )


def gather_var(offsets, data, rows):
    """Reference of ``gather_var``."""
    pieces = [bytes(data[offsets[r] : offsets[r + 1]]) for r in rows.tolist()]
    out_off = np.zeros(len(pieces) + 1, dtype=np.int64)
    out_off[1:] = np.cumsum([len(p) for p in pieces], dtype=np.int64)
    return out_off, np.frombuffer(b"".join(pieces), dtype=np.uint8).copy()


def gather_group_keys(key_words, key_nulls, slot_gids, out_words, out_nulls):
    """Reference of ``gather_group_keys``."""
    gids = slot_gids.astype(np.int64) - 1
    out_words[:, :] = key_words[gids].T
    out_nulls[:] = key_nulls[gids]


def take_groups(values, slot_gids, out):
    """Reference of ``take_groups``."""
    out[:] = values[slot_gids.astype(np.int64) - 1]


def gather_groups(key_words, key_nulls, rows, slot_gids, out_words, out_nulls, out_rows):
    """Reference of ``gather_groups``."""
    if len(key_nulls) == 0:  # no null key anywhere
        key_nulls = np.zeros(len(key_words), dtype=out_nulls.dtype)
    gather_group_keys(key_words, key_nulls, slot_gids, out_words, out_nulls)
    out_rows[:, :] = rows[slot_gids.astype(np.int64) - 1]


def compact_groups(key_words, key_nulls, rows, old_gids):
    """Reference of ``compact_groups``: the kept groups gathered, then written to the front."""
    keep = np.asarray(old_gids, dtype=np.int64) - 1
    m = len(keep)
    key_words[:m] = key_words[keep].copy()
    if len(key_nulls):
        key_nulls[:m] = key_nulls[keep].copy()
    rows[:m] = rows[keep].copy()

"""The typed table's numba kernels against their plain-Python references."""

from __future__ import annotations

import zlib
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from extagg.collection import _typed_kernels as K
from extagg.collection import _typed_reference as R
from extagg.collection.typed_table import TypedHashTable

E8 = np.zeros(0, dtype=np.uint8)
E64 = np.zeros(0, dtype=np.int64)


def _var(values: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(v) for v in values])
    return offsets, np.frombuffer(b"".join(values), dtype=np.uint8).copy()


rows_strategy = st.lists(
    st.tuples(st.integers(0, 6), st.integers(0, 3), st.sampled_from([b"", b"a", b"bb", b"a\0"])),
    max_size=120,
)


def _insert_all(mod, hashes, words, nulls, var_off, var_data, has_var, capacity=4):
    """Insert every row, growing the table (and arena) whenever the kernel stops."""
    table = TypedHashTable(words.shape[1], 2, has_var, capacity=capacity, arena_capacity=1)
    out = np.full(len(hashes), -1, dtype=np.int64)
    pos, stops = 0, []
    while pos < len(hashes):
        pos, status = mod.insert_rows(
            hashes, words, nulls, var_off, var_data, pos, table.slots, table.shift,
            table.key_words, table.key_nulls, table.var_offsets, table.arena, table.meta,
            table.grow_at, out,
        )  # fmt: skip
        stops.append((pos, status))
        if status == K.TABLE_FULL:
            table.grow()
        elif status == K.ARENA_FULL:
            table.grow_arena(int(var_off[pos + 1] - var_off[pos]))
    return table, out, stops


@pytest.mark.parametrize("has_var", [False, True])
@given(rows=rows_strategy, hash_bits=st.integers(0, 3))
def test_insert_rows_matches_reference(rows, hash_bits, has_var) -> None:
    # few distinct hashes (0..2**hash_bits, spread to the high bits) force collisions
    words = np.array([[w] for w, _n, _v in rows], dtype=np.uint64).reshape(len(rows), 1)
    nulls = np.array([n for _w, n, _v in rows], dtype=np.uint8)
    var_off, var_data = _var([v for *_r, v in rows]) if has_var else (E64, E8)
    hashes = (words[:, 0] % np.uint64(2**hash_bits)) << np.uint64(61)
    fast = _insert_all(K, hashes, words, nulls, var_off, var_data, has_var)
    slow = _insert_all(R, hashes, words, nulls, var_off, var_data, has_var)
    assert fast[1].tolist() == slow[1].tolist()
    assert fast[2] == slow[2]
    assert np.array_equal(fast[0].slots, slow[0].slots)
    fast[0].check_invariants()
    # equal keys got equal groups, unequal keys different ones
    keys = [(w, n, v if has_var else b"") for w, n, v in rows]
    by_key: dict = {}
    for key, gid in zip(keys, fast[1].tolist()):
        assert by_key.setdefault(key, gid) == gid
    assert len(set(by_key.values())) == len(by_key)


#: long keys differing in one byte (the probe compares 8 bytes at a time, then the tail)
_LONG_KEYS = [b"user_0000000001", b"user_0000000002", b"user_00000000010", b"x" * 8, b"x" * 9]


@settings(max_examples=60)
@given(
    keys=st.lists(st.integers(0, 44), min_size=1, max_size=900),
    hash_bits=st.integers(0, 8),
    with_nulls=st.booleans(),
)
def test_insert_rows_across_probe_blocks_matches_reference(keys, hash_bits, with_nulls) -> None:
    """Rows spanning several of the kernel's probe blocks, mostly hits on groups already
    there, with collisions (few hash bits), long variable-length keys, null masks, and the
    table or the arena filling mid-block: the same groups, stops and slots as row by row."""
    values = [_LONG_KEYS[v % 5] + bytes([v]) * (v // 5 % 3) for v in keys]
    words = np.array([[v // 15] for v in keys], dtype=np.uint64).reshape(len(keys), 1)
    nulls = np.array([v // 5 % 2 for v in keys] if with_nulls else [], dtype=np.uint8)
    var_off, var_data = _var(values)
    identity = [
        (v // 15, v // 5 % 2 if with_nulls else 0, b) for v, b in zip(keys, values, strict=True)
    ]
    # a hash of the whole key with only ``hash_bits`` bits: equal keys, equal hashes
    small = [(zlib.crc32(b) + 7 * w + 13 * n) % 2**hash_bits for w, n, b in identity]
    hashes = np.array(small, dtype=np.uint64) << np.uint64(56)
    fast = _insert_all(K, hashes, words, nulls, var_off, var_data, True)
    slow = _insert_all(R, hashes, words, nulls, var_off, var_data, True)
    assert fast[1].tolist() == slow[1].tolist()
    assert fast[2] == slow[2]
    assert np.array_equal(fast[0].slots, slow[0].slots)
    first = list(dict.fromkeys(identity))
    assert fast[1].tolist() == [first.index(key) for key in identity]
    # the same rows again: every one a hit on a group of an earlier block
    for mod, (table, out, _stops) in ((K, fast), (R, slow)):
        again = np.full(len(keys), -1, dtype=np.int64)
        done = mod.insert_rows(
            hashes, words, nulls, var_off, var_data, 0, table.slots, table.shift,
            table.key_words, table.key_nulls, table.var_offsets, table.arena, table.meta,
            table.grow_at, again,
        )  # fmt: skip
        assert done == (len(keys), K.DONE)
        assert again.tolist() == out.tolist()


@given(st.lists(st.integers(0, 2**64 - 1), min_size=0, max_size=300), st.integers(0, 2))
def test_sort_hash_index_matches_reference(values, dup_every) -> None:
    hashes = np.array(values, dtype=np.uint64)
    if dup_every and len(hashes):
        hashes[:: dup_every + 1] = hashes[0]  # many equal hashes: the heap-sort path
    index = np.arange(len(hashes), dtype=np.int64)[::-1].copy()
    h1, i1, h2, i2 = hashes.copy(), index.copy(), hashes.copy(), index.copy()
    K.sort_hash_index(h1, i1)
    R.sort_hash_index(h2, i2)
    assert h1.tolist() == h2.tolist() and i1.tolist() == i2.tolist()


def test_sort_hash_index_large_random() -> None:
    rng = np.random.default_rng(3)
    hashes = rng.integers(0, 2**64 - 1, 200_000, dtype=np.uint64)
    hashes[::7] = hashes[1]
    index = np.arange(len(hashes), dtype=np.int64)
    expected = np.lexsort((index, hashes))
    h, i = hashes.copy(), index.copy()
    K.sort_hash_index(h, i)
    assert np.array_equal(i, expected) and np.array_equal(h, hashes[expected])


@given(rows=rows_strategy)
def test_sort_slots_and_rehash_match_reference(rows) -> None:
    words = np.array([[w] for w, _n, _v in rows], dtype=np.uint64).reshape(len(rows), 1)
    nulls = np.array([n for _w, n, _v in rows], dtype=np.uint8)
    hashes = (words[:, 0] * np.uint64(0x9E3779B97F4A7C15)) ^ nulls.astype(np.uint64)
    table, _, _ = _insert_all(K, hashes, words, nulls, E64, E8, False)
    bigger = np.zeros((table.capacity * 2, 2), dtype=np.uint64)
    bigger_ref = bigger.copy()
    shift = np.uint64(64 - (table.capacity * 2).bit_length() + 1)
    K.rehash_slots(table.slots, bigger, shift)
    R.rehash_slots(table.slots, bigger_ref, shift)
    assert np.array_equal(bigger, bigger_ref)
    a, b = table.slots.copy(), table.slots.copy()
    assert K.sort_slots(a) == R.sort_slots(b) == table.num_groups
    n = table.num_groups
    assert np.array_equal(a[:n], b[:n])


@pytest.mark.parametrize("load", [0.7, 0.875])
def test_sort_slots_of_a_full_table_with_wrapped_slots(load) -> None:
    # a table filled to `load` whose last quarter of homes is crowded: probes wrap to the front
    rng = np.random.default_rng(11)
    capacity = 1 << 12
    n = int(capacity * load)
    hashes = rng.integers(0, 2**64 - 1, n, dtype=np.uint64)
    hashes[: n // 8] |= np.uint64(0xFFF0) << np.uint64(48)  # homes in the last 16 slots
    table = TypedHashTable(1, 1, False, capacity=capacity)
    table.extend_groups(n)
    out = np.empty(n, dtype=np.int64)
    words = np.arange(n, dtype=np.uint64).reshape(n, 1)
    assert table.insert(hashes, words, E8, E64, E8, 0, out) == (n, K.DONE)
    homes = table.slots[:, 0] >> table.shift
    occupied = table.slots[:, 1] != 0
    assert np.any(occupied & (homes > np.arange(capacity, dtype=np.uint64)))  # some wrapped
    a, b = table.slots.copy(), table.slots.copy()
    assert K.sort_slots(a) == R.sort_slots(b) == n
    assert np.array_equal(a[:n], b[:n])


def test_sort_slots_of_an_arbitrary_slot_array_falls_back_to_the_radix_sort() -> None:
    # slots not laid out by a table (descending hashes, equal hashes): still sorted exactly
    n = 5000
    slots = np.zeros((8192, 2), dtype=np.uint64)
    slots[:n, 0] = np.arange(n, 0, -1, dtype=np.uint64) << np.uint64(40)
    slots[: n // 2 : 7, 0] = np.uint64(77)  # ties broken by group id
    slots[:n, 1] = np.arange(n, 0, -1, dtype=np.uint64)
    a, b = slots.copy(), slots.copy()
    assert K.sort_slots(a) == R.sort_slots(b) == n
    assert np.array_equal(a[:n], b[:n])


def _hash_sorted_pieces(hashes, cuts):
    """Row order and piece starts for rows cut at ``cuts`` into pieces, each sorted by hash."""
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(hashes)}), len(hashes)]
    order = np.concatenate(
        [lo + np.argsort(hashes[lo:hi], kind="stable") for lo, hi in pairwise(bounds)]
    ).astype(np.int64)
    return order, np.array(bounds, dtype=np.int64)


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1), st.binary(max_size=3)), max_size=80),
    st.integers(0, 3),
    st.lists(st.integers(0, 80), max_size=6),
)
# two pieces exhausted before the last one's rows of the largest hash
@example(rows=[(3, 0, b""), (2, 0, b""), (0, 0, b""), (1, 0, b"")], hash_kind=3, cuts=[1, 2])
def test_group_sorted_pieces_matches_reference(rows, hash_kind, cuts) -> None:
    m = len(rows)
    words = np.array([[w] for w, _n, _v in rows], dtype=np.uint64).reshape(m, 1)
    if hash_kind == 0:  # heavy collisions
        hashes = (words[:, 0] % np.uint64(2)).astype(np.uint64)
    elif hash_kind == 1:  # equal high bits (one merge window), distinct low bits
        hashes = (np.uint64(0xABCD) << np.uint64(48)) | words[:, 0]
    elif hash_kind == 2:
        hashes = (words[:, 0] + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    else:  # the largest hash, which an exhausted piece's head reads as
        hashes = np.where(words[:, 0] < 2, np.uint64(2**64 - 1), words[:, 0])
    order, starts = _hash_sorted_pieces(hashes, cuts)
    rows = [rows[i] for i in order.tolist()]
    words, hashes = words[order], hashes[order]
    nulls = np.array([n for _w, n, _v in rows], dtype=np.uint8)
    var_off, var_data = _var([v for *_r, v in rows])
    results = []
    for mod in (K, R):
        out_gid = np.full(m, -1, dtype=np.int64)
        first = np.full(m, -1, dtype=np.int64)
        g = mod.group_sorted_pieces(hashes, starts, words, nulls, var_off, var_data, out_gid, first)
        results.append((int(g), out_gid.tolist(), first[:g].tolist()))
    assert results[0] == results[1]
    assert results[0][0] == len(set(rows))


def test_group_sorted_pieces_many_pieces_few_keys() -> None:
    # the merge's case: the same keys from many sources (a heap deeper than a few levels)
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 3000, 50_000, dtype=np.uint64)
    hashes = keys * np.uint64(0x9E3779B97F4A7C15)
    order, starts = _hash_sorted_pieces(hashes, rng.integers(1, 50_000, 40).tolist())
    keys, hashes = keys[order], hashes[order]
    words = keys.reshape(-1, 1).copy()
    out_gid = np.empty(len(keys), dtype=np.int64)
    first = np.empty(len(keys), dtype=np.int64)
    g = int(K.group_sorted_pieces(hashes, starts, words, E8, E64, E8, out_gid, first))
    distinct = np.unique(keys)
    assert g == len(distinct)
    group_hashes = hashes[first[:g]]
    assert np.all(group_hashes[1:] >= group_hashes[:-1])  # groups numbered in hash order
    assert np.array_equal(keys[first[out_gid]], keys)  # every row in its key's group
    assert np.array_equal(np.sort(keys[first[:g]]), distinct)
    assert np.all(first[:g] == np.array([np.flatnonzero(out_gid == i).min() for i in range(g)]))


@given(st.lists(st.binary(max_size=6), max_size=30), st.data())
def test_gather_var_matches_reference(values, data) -> None:
    offsets, blob = _var(values)
    rows = np.array(
        data.draw(st.lists(st.integers(0, max(0, len(values) - 1)), max_size=20)) if values else [],
        dtype=np.int64,
    )
    o1, d1 = K.gather_var(offsets, blob, rows)
    o2, d2 = R.gather_var(offsets, blob, rows)
    assert o1.tolist() == o2.tolist() and d1.tobytes() == d2.tobytes()


def _insert_all_by_hash(mod, hashes, words, capacity=4):
    table = TypedHashTable(1, 1, False, capacity=capacity, hash_is_key=True)
    out = np.full(len(hashes), -1, dtype=np.int64)
    pos, stops = 0, []
    while pos < len(hashes):
        pos, status = mod.insert_rows_hash_is_key(
            hashes, words, pos, table.slots, table.shift, table.key_words, table.meta,
            table.grow_at, out,
        )  # fmt: skip
        stops.append((pos, status))
        if status == K.TABLE_FULL:
            table.grow()
    return table, out, stops


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=200), st.integers(0, 40))
def test_insert_rows_hash_is_key_matches_reference_and_the_general_kernel(values, dups) -> None:
    from extagg import _hash_kernels as HK

    values = values + values[:dups]  # repeated keys
    words = np.array(values, dtype=np.int64).view(np.uint64).reshape(len(values), 1)
    hashes = np.empty(len(values), dtype=np.uint64)
    HK.hash_int_column(np.array(values, dtype=np.int64), np.zeros(0, dtype=np.bool_), hashes)
    fast = _insert_all_by_hash(K, hashes, words)
    slow = _insert_all_by_hash(R, hashes, words)
    general = _insert_all(K, hashes, words, np.zeros(0, np.uint8), E64, E8, False)
    assert fast[1].tolist() == slow[1].tolist() == general[1].tolist()
    assert fast[2] == slow[2]
    assert np.array_equal(fast[0].slots, slow[0].slots)
    assert np.array_equal(fast[0].slots, general[0].slots)
    fast[0].check_invariants()
    # group ids number the distinct keys in order of first appearance
    first = list(dict.fromkeys(values))
    assert fast[1].tolist() == [first.index(v) for v in values]


def test_hash_is_key_needs_one_fixed_width_word() -> None:
    with pytest.raises(ValueError, match="one fixed-width key word"):
        TypedHashTable(2, 2, False, hash_is_key=True)
    with pytest.raises(ValueError, match="one fixed-width key word"):
        TypedHashTable(1, 1, True, hash_is_key=True)


def test_a_table_that_saw_nulls_compares_keys_again() -> None:
    """Nulls hash to a constant some integer may share: after a null, match by key again."""
    from extagg import _hash_kernels as HK

    table = TypedHashTable(1, 1, False, hash_is_key=True)
    null_hash = np.empty(1, dtype=np.uint64)
    HK.hash_int_column(np.zeros(1, np.int64), np.zeros(1, dtype=np.bool_), null_hash)
    out = np.empty(1, dtype=np.int64)
    # a null row (word 0) and then a non-null row forged to share the null's hash
    table.insert(null_hash, np.zeros((1, 1), np.uint64), np.ones(1, np.uint8), E64, E8, 0, out)
    assert out.tolist() == [0]
    table.insert(null_hash, np.full((1, 1), 5, np.uint64), np.zeros(0, np.uint8), E64, E8, 0, out)
    assert out.tolist() == [1]  # not merged into the null group
    assert table.num_groups == 2


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.uint8, np.bool_])
@given(data=st.data())
def test_gathers_by_slot_id_match_reference(dtype, data) -> None:
    groups = data.draw(st.integers(1, 40))
    words = np.arange(groups * 3, dtype=np.uint64).reshape(groups, 3) * np.uint64(7)
    nulls = (np.arange(groups) % 3).astype(np.uint8)
    values = (np.arange(groups) * 5 % 7).astype(dtype)
    picks = data.draw(st.lists(st.integers(1, groups), max_size=60))
    slots = np.zeros((len(picks), 2), dtype=np.uint64)
    slots[:, 1] = picks
    slot_gids = slots[:, 1]  # a strided view, as sort_by_hash hands out
    outs = []
    for mod in (K, R):
        w = np.empty((3, len(picks)), dtype=np.uint64)
        n = np.empty(len(picks), dtype=np.uint8)
        v = np.empty(len(picks), dtype=dtype)
        mod.gather_group_keys(words, nulls, slot_gids, w, n)
        mod.take_groups(values, slot_gids, v)
        for width in (5, 8, 13):
            rows = (np.arange(groups * width) % 251).astype(np.uint8).reshape(groups, width)
            w2, n2 = np.empty_like(w), np.empty_like(n)
            r = np.empty((len(picks), width), np.uint8)
            mod.gather_groups(words, nulls, rows, slot_gids, w2, n2, r)
            assert w2.tolist() == w.tolist() and n2.tolist() == n.tolist()
            assert r.tolist() == [rows[p - 1].tolist() for p in picks]
            mod.gather_groups(words, nulls[:0], rows, slot_gids, w2, n2, r)  # no null keys
            assert n2.tolist() == [0] * len(picks)
        outs.append((w.tolist(), n.tolist(), v.tolist()))
    assert outs[0] == outs[1]
    assert outs[0][2] == [values[p - 1].item() for p in picks]


@given(st.integers(0, 60), st.integers(0, 3), st.integers(0, 40), st.booleans(), st.data())
def test_compact_groups_matches_reference(groups, words, width, nulls, data) -> None:
    keep = sorted(data.draw(st.sets(st.integers(1, max(1, groups)), max_size=groups)))
    rng = np.random.default_rng(groups * 7 + width)
    arrays = (
        rng.integers(0, 2**63, (groups, words)).astype(np.uint64),
        rng.integers(0, 255, groups if nulls else 0).astype(np.uint8),
        rng.integers(0, 255, (groups, width)).astype(np.uint8),
    )
    fast = [a.copy() for a in arrays]
    slow = [a.copy() for a in arrays]
    gids = np.array(keep, dtype=np.uint64)
    K.compact_groups(*fast, gids)
    R.compact_groups(*slow, gids)
    for a, b in zip(fast, slow):
        assert np.array_equal(a, b)

"""The AppendOnlyMap's numba kernels against their pure-Python references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extagg.collection import _kernels, _kernels_reference
from extagg.collection._kernels_reference import EMPTY, home_slot

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _shift_mask(capacity: int) -> tuple[int, int]:
    log2 = capacity.bit_length() - 1
    return (64 - log2 if log2 else 63), capacity - 1


def _fresh(capacity: int, threshold: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full(capacity, EMPTY, dtype=np.int32), np.zeros(max(threshold, 1), dtype=np.int64)


def _run_probe(impl, table, entry_hashes, hashes, tags, start, size, threshold, capacity):
    shift, mask = _shift_mask(capacity)
    entries = np.full(len(hashes), -7, dtype=np.int64)
    status = np.full(len(hashes), 9, dtype=np.uint8)
    result = impl(
        table, entry_hashes, hashes, tags, start, size, threshold, shift, mask, entries, status
    )
    return tuple(int(x) for x in result), entries, status


hash_values = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([INT64_MIN, INT64_MAX, -2, 2**61 - 1]),
    st.integers(INT64_MIN, INT64_MAX),
)


@given(
    log2_capacity=st.integers(0, 6),
    prefix=st.lists(hash_values, max_size=40),
    batch=st.lists(st.tuples(hash_values, st.booleans()), min_size=1, max_size=60),
    start_frac=st.floats(0, 1),
)
def test_probe_batch_matches_reference(log2_capacity, prefix, batch, start_frac):
    capacity = 1 << log2_capacity
    threshold = int(0.7 * capacity)
    table, entry_hashes = _fresh(capacity, threshold)
    # fill part of the table through the reference itself
    prefix_hashes = np.array(prefix, dtype=np.int64)
    (_, size, _), _, _ = _run_probe(
        _kernels_reference.probe_batch,
        table,
        entry_hashes,
        prefix_hashes,
        np.zeros(len(prefix), dtype=np.uint8),
        0,
        0,
        threshold,
        capacity,
    )
    hashes = np.array([h for h, _ in batch], dtype=np.int64)
    tags = np.array([t for _, t in batch], dtype=np.uint8)
    start = int(start_frac * (len(batch) - 1))
    results = []
    for impl in (_kernels.probe_batch, _kernels_reference.probe_batch):
        t, e = table.copy(), entry_hashes.copy()
        out = _run_probe(impl, t, e, hashes, tags, start, size, threshold, capacity)
        results.append((out, t, e))
    (ret_a, ent_a, st_a), t_a, e_a = results[0]
    (ret_b, ent_b, st_b), t_b, e_b = results[1]
    assert ret_a == ret_b
    np.testing.assert_array_equal(ent_a, ent_b)
    np.testing.assert_array_equal(st_a, st_b)
    np.testing.assert_array_equal(t_a, t_b)
    np.testing.assert_array_equal(e_a[: ret_a[1]], e_b[: ret_b[1]])


def test_probe_batch_stops_before_growth_and_reports_statuses():
    capacity, threshold = 4, 2
    table, entry_hashes = _fresh(capacity, threshold)
    hashes = np.array([5, 5, 9, 5, 11, 9], dtype=np.int64)
    tags = np.array([1, 1, 0, 0, 1, 1], dtype=np.uint8)
    for impl in (_kernels.probe_batch, _kernels_reference.probe_batch):
        t, e = table.copy(), entry_hashes.copy()
        (stop, size, unconfirmed), entries, status = _run_probe(
            impl, t, e, hashes, tags, 0, 0, threshold, capacity
        )
        # 5 new (tagged), 5 confirmed, 9 new (untagged), 5 unconfirmed (record untagged),
        # 11 needs a third entry at threshold 2: stop there
        assert (stop, size, unconfirmed) == (4, 2, 1)
        assert entries[:4].tolist() == [0, 0, 1, 0]
        assert status[:4].tolist() == [1, 0, 1, 2]
        assert sorted(x for x in t.tolist() if x != EMPTY) == [1, 2]  # 2*0+1 and 2*1+0


@pytest.mark.parametrize("h", [0, 1, -1, -2, INT64_MIN, INT64_MAX, 2**61 - 1, 123456789])
@pytest.mark.parametrize("log2_capacity", [0, 1, 5, 29])
def test_home_slot_of_kernel_and_reference_agree(h, log2_capacity):
    capacity = 1 << min(log2_capacity, 10)  # the table itself stays small
    shift, _ = _shift_mask(1 << log2_capacity)
    mask = capacity - 1
    table = np.full(capacity, EMPTY, dtype=np.int32)
    entry_hashes = np.zeros(1, dtype=np.int64)
    _kernels.probe_batch(
        table,
        entry_hashes,
        np.array([h], dtype=np.int64),
        np.zeros(1, dtype=np.uint8),
        0,
        0,
        1,
        shift,
        mask,
        np.empty(1, dtype=np.int64),
        np.empty(1, dtype=np.uint8),
    )
    assert int(np.flatnonzero(table != EMPTY)[0]) == home_slot(h, shift, mask)


@given(log2_capacity=st.integers(0, 7), hashes=st.lists(hash_values, max_size=90))
def test_rehash_table_matches_reference(log2_capacity, hashes):
    capacity = 1 << log2_capacity
    threshold = int(0.7 * capacity)
    table, entry_hashes = _fresh(capacity, threshold)
    batch = np.array(hashes, dtype=np.int64)
    tags = (np.arange(len(hashes)) % 2).astype(np.uint8)
    (_, size, _), _, _ = _run_probe(
        _kernels_reference.probe_batch, table, entry_hashes, batch, tags, 0, 0, threshold, capacity
    )
    new_capacity = capacity * 2
    shift, mask = _shift_mask(new_capacity)
    outs = []
    for impl in (_kernels.rehash_table, _kernels_reference.rehash_table):
        new_table = np.full(new_capacity, EMPTY, dtype=np.int32)
        moved = impl(table, entry_hashes, new_table, shift, mask)
        outs.append((int(moved), new_table))
    assert outs[0][0] == outs[1][0] == size
    np.testing.assert_array_equal(outs[0][1], outs[1][1])


@given(
    log2_capacity=st.integers(1, 7),
    hashes=st.lists(hash_values, min_size=1, max_size=90),
    keep_frac=st.floats(0, 1),
)
def test_release_entries_undoes_the_newest_entries_exactly(log2_capacity, hashes, keep_frac):
    capacity = 1 << log2_capacity
    threshold = int(0.7 * capacity)
    table, entry_hashes = _fresh(capacity, threshold)
    batch = np.array(hashes, dtype=np.int64)
    tags = np.zeros(len(hashes), dtype=np.uint8)
    snapshots = {0: table.copy()}  # the table as it was when it held n entries
    size = 0
    for i in range(len(hashes)):
        (stop, size, _), _, _ = _run_probe(
            _kernels_reference.probe_batch,
            table,
            entry_hashes,
            batch[i : i + 1],
            tags[i : i + 1],
            0,
            size,
            threshold,
            capacity,
        )
        if stop == 0:
            break
        snapshots.setdefault(size, table.copy())
    keep = int(keep_frac * size)
    shift, mask = _shift_mask(capacity)
    for impl in (_kernels.release_entries, _kernels_reference.release_entries):
        t = table.copy()
        impl(t, entry_hashes, keep, size, shift, mask)
        np.testing.assert_array_equal(t, snapshots[keep])


u64 = st.integers(0, 2**64 - 1)


@given(
    st.one_of(
        st.lists(u64, max_size=80),
        st.lists(st.sampled_from([0, 1, 2**63, 2**64 - 1, 2**40 + 3]), max_size=80),
        st.lists(st.integers(0, 50), max_size=200),  # top bits all equal: one long run
    )
)
def test_stable_argsort_matches_reference_and_numpy(values):
    arr = np.array(values, dtype=np.uint64)
    got = _kernels.stable_argsort_u64(arr)
    assert got.tolist() == _kernels_reference.stable_argsort_u64(arr).tolist()
    assert got.tolist() == np.argsort(arr, kind="stable").tolist()


@given(st.lists(u64, min_size=2, max_size=120), st.integers(0, 64))
def test_resolve_ties_matches_reference(values, extra_bits):
    arr = np.array(values, dtype=np.uint64)
    index_bits = min((len(values) - 1).bit_length() + extra_bits % 8, 30)
    low = np.uint64(index_bits)
    packed = ((arr >> low) << low) | np.arange(len(values), dtype=np.uint64)
    packed.sort()
    got = _kernels.resolve_ties(packed, arr, index_bits)
    want = _kernels_reference.resolve_ties(packed, arr, index_bits)
    assert got.tolist() == want.tolist() == np.argsort(arr, kind="stable").tolist()

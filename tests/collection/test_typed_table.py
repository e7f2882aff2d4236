"""TypedHashTable: exact byte accounting, growth, sorting, restoring after a failed spill."""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np
import pytest

from extagg import hashing
from extagg.collection import typed_table as TT
from extagg.collection._typed_kernels import ARENA_FULL, DONE, TABLE_FULL
from extagg.collection.typed_table import (
    MIN_CAPACITY,
    TypedHashTable,
    _grown,
    _reservation_of,
    payload_row_dtype,
    zeros,
)

E8 = np.zeros(0, dtype=np.uint8)
E64 = np.zeros(0, dtype=np.int64)
PAYLOAD = [(np.dtype(np.float64), 0.0), (np.dtype(np.int64), -1), (np.dtype(np.bool_), False)]


def _fill(table: TypedHashTable, keys: np.ndarray) -> np.ndarray:
    hashes = hashing.hash_array(keys)
    words = keys.astype(np.int64).view(np.uint64).reshape(len(keys), 1)
    out = np.empty(len(keys), dtype=np.int64)
    pos = 0
    while pos < len(keys):
        pos, status = table.insert(hashes, words, E8, E64, E8, pos, out)
        if status == TABLE_FULL:
            table.grow()
    return out


def test_nbytes_is_exact_and_predicted() -> None:
    for has_var in (False, True):
        table = TypedHashTable(2, 3, has_var, PAYLOAD)
        assert table.nbytes == TypedHashTable.bytes_for(2, 3, has_var, PAYLOAD)
        arrays = [table.slots, table.key_words, table.key_nulls, table.meta, table.var_offsets]
        arrays += [table.arena, table.rows]  # the payload fields are views of the rows
        assert table.nbytes == sum(a.nbytes for a in arrays)
        assert all(np.shares_memory(p, table.rows) for p in table.payload)
        predicted = table.bytes_after_growth()
        # small arrays grow by copying: at the peak the old table and the new one are held
        # (but for the arena and the meta words, which a doubling keeps)
        kept = table.meta.nbytes + table.arena.nbytes
        assert table.bytes_at_growth_peak() == table.nbytes + predicted - kept
        table.grow()
        assert table.nbytes == predicted


def test_payload_rows_are_packed_widest_first() -> None:
    spec = [(np.dtype(np.bool_), False), (np.dtype(np.int32), -1), (np.dtype(np.float64), 0.5)]
    dtype = payload_row_dtype(spec)
    assert dtype.itemsize == 13
    assert [dtype.fields[f"p{i}"][1] for i in range(3)] == [12, 8, 0]
    table = TypedHashTable(1, 1, False, spec)
    assert [p[5] for p in table.payload] == [False, -1, 0.5]
    raw = table.rows.view(np.uint8)
    assert raw.shape == (table.grow_at * 13,)
    assert raw[3 * 13 : 3 * 13 + 8].view(np.float64)[0] == 0.5
    assert raw[3 * 13 + 8 : 3 * 13 + 12].view(np.int32)[0] == -1
    assert payload_row_dtype([]).itemsize == 0


def test_growth_keeps_groups_and_payload() -> None:
    table = TypedHashTable(1, 1, False, PAYLOAD, capacity=MIN_CAPACITY)
    keys = np.arange(10_000) * 7919 - 5000
    gids = _fill(table, keys)
    table.payload[0][gids] = keys.astype(np.float64)
    assert table.num_groups == 10_000
    table.check_invariants()
    assert np.array_equal(table.key_words[:10_000, 0].view(np.int64), keys)
    before = table.payload[0][:10_000].copy()
    table.grow()
    assert np.array_equal(table.payload[0][:10_000], before)
    assert np.all(table.payload[1][10_000:] == -1)  # new rows get the fill value
    again = _fill(table, keys)
    assert np.array_equal(again, gids)  # same keys find the same groups after growth


@pytest.mark.parametrize("hash_is_key", [False, True])
def test_extending_groups_fills_the_slots_further_and_keeps_everything(hash_is_key) -> None:
    from extagg.collection.typed_table import FULL_LOAD_FACTOR

    table = TypedHashTable(1, 1, False, PAYLOAD, capacity=1024, hash_is_key=hash_is_key)
    keys = np.arange(5000, dtype=np.int64) * 7919 - 5000
    hashes = hashing.hash_array(keys)
    words = keys.view(np.uint64).reshape(len(keys), 1)
    out = np.empty(len(keys), dtype=np.int64)
    pos, status = table.insert(hashes, words, E8, E64, E8, 0, out)
    assert status == TABLE_FULL and pos == table.grow_at == int(1024 * 0.7)
    table.payload[0][out[:pos]] = keys[:pos].astype(np.float64)
    target = table.fill_target()
    assert target == int(1024 * FULL_LOAD_FACTOR)
    predicted_peak = table.bytes_after_extension(target)
    table.extend_groups(target)
    assert table.grow_at == target and table.capacity == 1024
    assert table.nbytes < predicted_peak  # the peak also counts one array being copied
    assert np.all(table.payload[1][pos:] == -1)  # new rows get the fill value
    assert np.array_equal(table.payload[0][out[:pos]], keys[:pos].astype(np.float64))
    pos2, status = table.insert(hashes, words, E8, E64, E8, pos, out)
    assert status == TABLE_FULL and pos2 == target  # stopped at the new limit
    table.check_invariants()
    again = np.empty(pos2, dtype=np.int64)
    table.insert(hashes[:pos2], words[:pos2], E8, E64, E8, 0, again)
    assert np.array_equal(again, out[:pos2])  # every key still finds its group
    assert table.fill_target() == target  # nothing more to extend at this capacity
    with pytest.raises(ValueError, match="cannot hold"):
        table.extend_groups(1024)


def test_sort_by_hash_orders_groups_and_restore_rebuilds() -> None:
    table = TypedHashTable(1, 1, False, PAYLOAD)
    keys = np.array([5, 3, 5, 9, -1, 3, 0], dtype=np.int64)
    gids = _fill(table, keys)
    hashes, slot_gids = table.sort_by_hash()
    assert np.all(np.diff(hashes.astype(np.float64)) >= 0)
    expected = sorted(set(keys.tolist()), key=hashing.stable_hash)
    got = table.key_words[slot_gids.astype(np.int64) - 1, 0].view(np.int64).tolist()
    assert got == expected
    table.restore_after_sort()
    table.check_invariants()
    assert np.array_equal(_fill(table, keys), gids)


def test_arena_full_stops_and_resumes() -> None:
    table = TypedHashTable(0, 1, True, arena_capacity=4096)
    values = [b"x" * 3000, b"y" * 3000, b"x" * 3000]
    offsets = np.array([0, 3000, 6000, 9000], dtype=np.int64)
    data = np.frombuffer(b"".join(values), dtype=np.uint8)
    hashes = np.array([hashing.stable_hash(v) for v in values], dtype=np.uint64)
    words = np.zeros((3, 0), dtype=np.uint64)
    out = np.empty(3, dtype=np.int64)
    pos, status = table.insert(hashes, words, E8, offsets, data, 0, out)
    assert (pos, status) == (1, ARENA_FULL)
    needed = table.pending_var_bytes(offsets, 1)
    assert table.bytes_after_arena_growth(needed) - table.nbytes == 4096
    table.grow_arena(needed)
    pos, status = table.insert(hashes, words, E8, offsets, data, pos, out)
    assert (pos, status) == (3, DONE)
    assert out.tolist() == [0, 1, 0]
    table.check_invariants()


def test_bad_capacity_and_too_many_key_columns() -> None:
    with pytest.raises(ValueError, match="power of two"):
        TypedHashTable(1, 1, False, capacity=100)
    with pytest.raises(ValueError, match="at most 64 key columns"):
        TypedHashTable(1, 65, False)


def test_clear_after_a_spill_keeps_the_arrays_and_forgets_every_group() -> None:
    # the aggregator's spill: sort, write, clear; the next input fills the same arrays
    table = TypedHashTable(1, 1, False, PAYLOAD, capacity=1024, hash_is_key=True)
    table.extend_groups(table.fill_target())
    grow_at, nbytes = table.grow_at, table.nbytes
    keys = np.arange(800, dtype=np.int64) * 31
    hashes = hashing.hash_array(keys)
    words = keys.view(np.uint64).reshape(len(keys), 1)
    nulls = np.ones(len(keys), dtype=np.uint8)  # all null: the general probe, masks written
    out = np.empty(len(keys), dtype=np.int64)
    table.insert(hashes, words, nulls, E64, E8, 0, out)
    table.payload[1][: len(keys)] = 7  # states of the 800 groups
    table.sort_by_hash()
    table.clear()
    assert table.num_groups == 0 and table.grow_at == grow_at and table.nbytes == nbytes
    assert np.all(table.payload[1] == -1) and np.all(table.slots == 0)
    # non-null keys through the integer-key probe, then nulls through the general one
    pos, status = table.insert(hashes, words, E8, E64, E8, 0, out)
    assert (pos, status) == (len(keys), DONE)
    null_hash = np.array([hashing.hash_array(np.array([0]))[0]], dtype=np.uint64)
    one_null = np.empty(1, dtype=np.int64)
    table.insert(null_hash, np.zeros((1, 1), np.uint64), np.ones(1, np.uint8), E64, E8, 0, one_null)
    assert one_null[0] == len(keys)  # its own group, not key 0's
    table.check_invariants()
    _hashes, slot_gids = table.sort_by_hash()
    _words, key_nulls, _o, _d = table.gather_keys(slot_gids)
    assert int(key_nulls.sum()) == 1  # only the null group says null


def _rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE here")
def test_large_arrays_are_mapped_zeroed_and_given_back() -> None:
    small = zeros((100, 2), np.uint64)
    assert not isinstance(small.base, mmap.mmap) and not small.any()
    size = 64 << 20
    before = _rss_anon()
    big = zeros((size // 16, 2), np.uint64)
    assert big.nbytes == size and big.shape == (size // 16, 2) and big.flags.writeable
    assert not big.any()  # the kernel's zero pages
    big[:] = 7  # touch every page
    touched = _rss_anon()
    assert touched - before >= size * 0.9
    del big  # the mapping goes with the array
    assert touched - _rss_anon() >= size * 0.9


def _linux_at_least(major: int, minor: int) -> bool:
    if sys.platform != "linux":
        return False
    release = os.uname().release.split("-")[0].split(".")
    try:
        return (int(release[0]), int(release[1])) >= (major, minor)
    except (IndexError, ValueError):
        return False


@pytest.mark.skipif(not _linux_at_least(5, 14), reason="MADV_POPULATE_WRITE: Linux 5.14+")
def test_a_populated_array_is_resident_at_once() -> None:
    """Slot arrays are made resident when made (a probe reads a slot before writing it: two
    page faults per page otherwise); other large arrays only as they are written."""
    size = 64 << 20
    before = _rss_anon()
    lazy = zeros((size // 16, 2), np.uint64)
    assert _rss_anon() - before < size // 4
    populated = zeros((size // 16, 2), np.uint64, populate=True)
    assert _rss_anon() - before >= size * 0.9
    assert not populated.any() and not lazy.any()  # zeros all the same


@pytest.mark.parametrize("hash_is_key", [False, True])
def test_keeping_the_lower_hashes_compacts_in_place_and_rotates(hash_is_key) -> None:
    """A split table keeps the groups of its lower hashes: renumbered, their payload and keys
    kept, the others gone, the rest of the rows back to their fill values; the kept hashes
    (top bit zero) are then given to the table rotated by one bit, and sorting hands them out
    unrotated and in order."""
    rng = np.random.default_rng(4)
    table = TypedHashTable(1, 1, False, PAYLOAD, capacity=1 << 12, hash_is_key=hash_is_key)
    keys = rng.choice(1 << 40, 2000, replace=False).astype(np.int64)
    gids = _fill(table, keys)
    table.payload[0][gids] = keys.astype(np.float64)
    table.payload[1][gids] = np.arange(len(keys))
    hashes, slot_gids = table.sort_by_hash()
    m = int(np.searchsorted(hashes, np.uint64(1) << np.uint64(63)))
    kept = table.key_words[slot_gids[:m].astype(np.int64) - 1, 0].view(np.int64).copy()
    table.keep_sorted_prefix(m, rotation=1)
    table.check_invariants()
    assert table.num_groups == m and table.rotation == 1
    assert sorted(table.key_words[:m, 0].view(np.int64).tolist()) == sorted(kept.tolist())
    assert np.array_equal(table.payload[0][:m], table.key_words[:m, 0].view(np.int64))
    assert np.all(table.payload[1][m:] == -1)
    # the kept keys are found again (hashes rotated as the table now takes them); a new key
    # of the lower half gets a new group
    low = hashing.hash_array(kept) >> np.uint64(63) == 0
    assert low.all()
    fresh = next(k for k in range(1, 10**6) if hashing.hash_array(np.array([k]))[0] >> 63 == 0)
    more = np.concatenate([kept, [fresh]])
    rotated = hashing.hash_array(more)
    rotated = (rotated << np.uint64(1)) | (rotated >> np.uint64(63))
    words = more.view(np.uint64).reshape(len(more), 1)
    out = np.empty(len(more), dtype=np.int64)
    assert table.insert(rotated, words, E8, E64, E8, 0, out) == (len(more), DONE)
    assert np.array_equal(table.payload[0][out[:-1]], kept.astype(np.float64))
    assert out[-1] == m
    hashes, slot_gids = table.sort_by_hash()
    assert np.all(hashes[:-1] <= hashes[1:])
    assert sorted(hashes.tolist()) == sorted(hashing.hash_array(more).tolist())


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE here")
def test_growable_arrays_reserve_address_space_not_memory() -> None:
    size = 64 << 20
    before = _rss_anon()
    big = zeros((size // 16, 2), np.uint64, growable=True)
    area = _reservation_of(big)
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert area is not None and big.nbytes == size
    assert area.capacity == min(physical, TT.RESERVE_FACTOR * size)
    assert big.ctypes.data % TT.HUGE_PAGE == 0  # huge pages line up with the array
    assert _rss_anon() - before < size // 4  # nothing touched, nothing resident
    grown = _grown(big, size // 8, size // 16, 0)  # twice the rows, same mapping
    assert _reservation_of(grown) is area and grown.nbytes == 2 * size
    assert _rss_anon() - before < size // 4
    grown[:1000] = 7
    short = _grown(grown, 10, 10, 0)  # a shorter view, then longer again keeping 5 rows:
    again = _grown(short, 1000, 5, 0)  # the bytes exposed before are zeroed, not reused
    assert np.all(again[:5] == 7) and not again[5:].any()


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE here")
def test_an_array_outgrowing_its_reservation_moves_to_a_larger_one(monkeypatch) -> None:
    monkeypatch.setattr(TT, "RESERVE_FACTOR", 4)
    rows = (8 << 20) // 8
    first = zeros(rows, np.int64, growable=True)
    first[:] = np.arange(rows)
    area = _reservation_of(first)
    assert area.capacity == 4 * first.nbytes
    in_place = _grown(first, 4 * rows, rows, 0)  # fills the reservation exactly
    assert _reservation_of(in_place) is area
    moved = _grown(in_place, 8 * rows, 4 * rows, 0)  # a copy into a new, larger reservation
    assert (
        _reservation_of(moved) is not area and _reservation_of(moved).capacity == 4 * moved.nbytes
    )
    assert np.array_equal(moved[:rows], np.arange(rows)) and not moved[rows:].any()


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE here")
@pytest.mark.parametrize("hash_is_key", [False, True])
def test_group_arrays_grow_in_place_and_reused_bytes_start_clean(monkeypatch, hash_is_key):
    """Small arrays made growable (the threshold lowered): doubling keeps the group arrays'
    mapping (no copy), every group and state survives, rows exposed again after a clear hold
    the fill values, not old states, and the table matches a dict through cycles of fill,
    grow, sort and clear."""
    monkeypatch.setattr(TT, "HUGE_PAGE_BYTES", 4096)
    monkeypatch.setattr(TT, "RESERVE_FACTOR", 1 << 12)  # room for every doubling here
    table = TypedHashTable(1, 1, False, PAYLOAD, capacity=MIN_CAPACITY, hash_is_key=hash_is_key)
    rng = np.random.default_rng(7)
    for cycle in range(3):
        keys = rng.choice(1 << 40, size=20_000 - 6000 * cycle, replace=False).astype(np.int64)
        reserved = None
        ref: dict[int, float] = {}
        for start in range(0, len(keys), 2500):
            part = keys[start : start + 2500]
            gids = _fill(table, part)
            if reserved is None and table.rows.nbytes >= 4096:
                reserved = TT._reservation_of(table.rows)
            assert np.all(table.payload[1][table.num_groups :] == -1)
            assert not table.key_nulls[table.num_groups :].any()
            table.payload[0][gids] += part.astype(np.float64)
            table.payload[1][gids] = cycle
            for k in part.tolist():
                ref[k] = ref.get(k, 0.0) + float(k)
        assert reserved is not None and TT._reservation_of(table.rows) is reserved
        # every group array grows in place: the peak of a doubling is the new table and the
        # old slot array, not the old table beside the new one
        peak = table.bytes_at_growth_peak()
        assert peak == table.bytes_after_growth() + table.slots.nbytes
        assert peak < table.nbytes + table.bytes_after_growth()
        assert TT._reservation_of(table.key_words) is not None
        table.check_invariants()
        n = table.num_groups
        got = dict(zip(table.key_words[:n, 0].view(np.int64).tolist(), table.payload[0][:n]))
        assert got == ref and np.all(table.payload[1][:n] == cycle)
        table.sort_by_hash()
        table.clear()
        if cycle == 1:
            table.reset(MIN_CAPACITY)  # a new mapping after a reset


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE here")
def test_no_address_space_is_reserved_under_an_address_space_limit() -> None:
    """``ulimit -v`` (PySpark sets one for ``spark.executor.pyspark.memory``): a reservation
    would eat what the process may map, so large arrays are exact and grow by copying."""
    import subprocess
    import sys

    code = (
        "import resource, numpy as np\n"
        "from extagg.collection.typed_table import zeros, _grown, _reservation_of\n"
        "hard = resource.getrlimit(resource.RLIMIT_AS)[1]\n"
        "resource.setrlimit(resource.RLIMIT_AS, (8 << 30, hard))\n"
        "a = zeros((1 << 20, 2), np.uint64, growable=True)\n"
        "a[:] = 3\n"
        "assert len(_reservation_of(a)) == a.nbytes\n"
        "b = _grown(a, 1 << 21, 1 << 20, 0)\n"
        "assert _reservation_of(b) is not _reservation_of(a) and b[: 1 << 20].min() == 3\n"
        "assert not b[1 << 20 :].any()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as f:
            text = f.read()
    except OSError:
        return ""
    return text[text.find("[") + 1 : text.find("]")]


def _anon_huge_bytes(array: np.ndarray) -> int:
    """``AnonHugePages`` of the mapping holding ``array`` (``/proc/self/smaps``)."""
    address = array.ctypes.data
    inside = False
    with open("/proc/self/smaps", encoding="ascii") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1]) * 1024
    raise AssertionError("the array's mapping is not in /proc/self/smaps")


@pytest.mark.skipif(_thp_mode() != "madvise", reason="huge pages are not given on advice here")
@pytest.mark.parametrize("advised", [False, True])
def test_huge_pages_only_when_asked_for(monkeypatch, advised) -> None:
    """``EXTAGG_HUGE_PAGES`` (``USE_HUGE_PAGES``): off by default, because a huge page's first
    touch cost more than its small ones on the machines measured; on, the table's large
    arrays are backed by huge pages."""
    monkeypatch.setattr(TT, "USE_HUGE_PAGES", advised)
    array = zeros(32 << 20, np.uint8, growable=True)
    array[:] = 1
    huge = _anon_huge_bytes(array)
    assert huge > 0 if advised else huge == 0


def test_huge_pages_are_off_unless_the_environment_says_so() -> None:
    import subprocess
    import sys

    code = "import extagg.collection.typed_table as t; print(t.USE_HUGE_PAGES)"
    for value, expected in ((None, "False"), ("1", "True"), ("0", "False"), ("yes", "True")):
        env = {k: v for k, v in os.environ.items() if k != "EXTAGG_HUGE_PAGES"}
        if value is not None:
            env["EXTAGG_HUGE_PAGES"] = value
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
        )
        assert out.stdout.strip() == expected


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE here")
def test_a_growable_array_makes_no_huge_page_past_its_end_resident(monkeypatch) -> None:
    """Huge pages are advised only for the whole ones the array covers: writing its last
    bytes must not make a 2 MiB page of the reservation beyond it resident."""
    monkeypatch.setattr(TT, "USE_HUGE_PAGES", True)
    size = (64 << 20) + 4096
    before = _rss_anon()
    array = zeros(size, np.uint8, growable=True)
    array[:] = 1
    assert _rss_anon() - before < size + (256 << 10)  # not size + a 2 MiB page
    grown = _grown(array, size + (8 << 20), size, 0)
    grown[size:] = 2
    assert _rss_anon() - before < size + (8 << 20) + (256 << 10)

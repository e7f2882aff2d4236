"""The typed hash table: open addressing over typed key columns, loops compiled by numba.

Keys arrive already canonicalised (see :mod:`extagg.columnar.columns`): ``k`` 64-bit words per
row for the fixed-width key columns, a null bitmask per row, and at most one variable-length
byte string per row (several string columns are packed into one). Groups are numbered densely
in order of first appearance; their keys live in group-indexed arrays (``key_words``,
``key_nulls``, an arena of bytes with offsets) next to caller-defined *payload* fields
(aggregate states), so spilling is a gather in hash order. The payload fields of a group are
interleaved in one packed row of a record array (:attr:`TypedHashTable.rows`, widest fields
first): updating every aggregate of a group touches one or two cache lines, not one per state
array. :attr:`TypedHashTable.payload` gives each field as a
strided view.

The table never allocates on its own initiative: the owner asks :meth:`bytes_after_growth` /
:meth:`bytes_after_arena_growth`, gets the memory granted, then calls :meth:`grow` /
:meth:`grow_arena`. The class holds no per-row loops; those are in ``_typed_kernels``.
"""

from __future__ import annotations

import mmap
import os
import platform
import sys
from collections.abc import Sequence

import numpy as np

from extagg.collection import _typed_kernels as K

__all__ = [
    "TypedHashTable",
    "null_mask_dtype",
    "payload_row_dtype",
    "zeros",
    "HUGE_PAGE_BYTES",
    "LOAD_FACTOR",
    "FULL_LOAD_FACTOR",
    "MIN_CAPACITY",
    "MAX_CAPACITY",
]

LOAD_FACTOR = 0.7
#: the load a table may be filled to, instead of spilling, when doubling it is not granted
FULL_LOAD_FACTOR = 0.875
MIN_CAPACITY = 64
MAX_CAPACITY = 1 << 30
MIN_ARENA = 4096


#: arrays of at least this many bytes get a mapping of their own (zeroed by the kernel, given
#: back when the array goes, growable in place) and, with :data:`USE_HUGE_PAGES`, transparent
#: huge pages
HUGE_PAGE_BYTES = 4 << 20
#: advise those mappings to use transparent huge pages (``EXTAGG_HUGE_PAGES=1``; off by
#: default). A probe into a large table then rarely misses the TLB as well as the cache, but a
#: huge page touched for the first time can cost far more than its 512 small ones: on the VM
#: measured (docs/columnar.md, "Huge pages") a 15 M-group table's doublings took 2.0–2.6 s with
#: them and 0.9–1.0 s without, and the whole aggregation was 15 % slower with them. Where the
#: kernel's THP mode is ``always`` the kernel uses them anyway.
USE_HUGE_PAGES = os.environ.get("EXTAGG_HUGE_PAGES", "0").strip().lower() in ("1", "true", "yes")
#: the size of a transparent huge page (x86-64, arm64 with 4 KiB pages)
HUGE_PAGE = 2 << 20


def zeros(
    shape: int | tuple[int, ...],
    dtype: np.dtype | type,
    *,
    growable: bool = False,
    populate: bool = False,
) -> np.ndarray:
    """``np.zeros``; large arrays in an anonymous mapping of their own, advised to use huge
    pages with :data:`USE_HUGE_PAGES` (the kernel zero-fills it; unmapped when the array is
    collected). ``nbytes`` is the same.

    ``growable``: the mapping reserves address space (not memory: no page is touched, none
    counted by the kernel) for the array to grow along its first axis in place, so that
    :func:`_grown` extends it without a copy or new zero pages (see :class:`_Reservation`).

    ``populate``: the pages are made at once, written (``MADV_POPULATE_WRITE``), for an array
    that is about to be written all over. A slot array is: a probe *reads* a slot before it
    writes it, so each of its pages took two faults (the shared zero page mapped, then copied
    on write); made at once, a 15 M-group table's doublings took 0.6 s instead of 0.92-1.14
    and half the page faults."""
    dtype = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    count = int(np.prod(dims, dtype=np.int64))
    nbytes = count * dtype.itemsize
    if nbytes < HUGE_PAGE_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.zeros(dims, dtype=dtype)
    area = _Reservation.make(nbytes, _reserve_bytes(nbytes) if growable else 0)
    if area.capacity == nbytes:
        _advise_huge_pages(area, 0, len(area))
    else:  # only what the array covers: a huge page past its end would be resident, unused
        covered = area.start + nbytes // HUGE_PAGE * HUGE_PAGE
        _advise_huge_pages(area, area.start, covered)
        _advise_huge_pages(area, covered, len(area), huge=False)  # even where THP is "always"
    if populate:
        _populate(area, area.start, area.start + nbytes)
    return np.frombuffer(area, dtype=dtype, count=count, offset=area.start).reshape(dims)


#: ``MADV_POPULATE_WRITE`` (Linux 5.14; the ``mmap`` module has no name for it)
_MADV_POPULATE_WRITE = 23 if sys.platform == "linux" else None


def _populate(area: mmap.mmap, start: int, end: int) -> None:
    """Make the pages of ``[start, end)`` of ``area`` resident and writable now (one call, no
    trap per page); where the kernel cannot (before 5.14), they come on first touch."""
    if end <= start or _MADV_POPULATE_WRITE is None:
        return
    begin = start // mmap.PAGESIZE * mmap.PAGESIZE
    try:
        area.madvise(_MADV_POPULATE_WRITE, begin, end - begin)
    except (OSError, ValueError):
        pass


def _advise_huge_pages(area: mmap.mmap, start: int, end: int, huge: bool = True) -> None:
    """Advise ``[start, end)`` of ``area`` to use huge pages, or (``huge=False``) not to
    (``start`` page-aligned)."""
    advise = getattr(mmap, "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE", None)
    if advise is None or end <= start or (huge and not USE_HUGE_PAGES):
        return
    try:
        area.madvise(advise, start, end - start)
    except (OSError, ValueError):  # huge pages not offered: a plain mapping is still zeroed
        pass


#: ``MAP_NORESERVE`` (the ``mmap`` module has it from Python 3.13; 0x4000 on Linux x86-64 and
#: arm64): the reservation is not charged to the kernel's commit accounting
_MAP_NORESERVE = getattr(
    mmap,
    "MAP_NORESERVE",
    0x4000 if sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64") else 0,
)


class _Reservation(mmap.mmap):
    """An anonymous private mapping, possibly longer than the array over it: the rest is
    address space only (``MAP_NORESERVE``; pages exist once written), so a table's group arrays
    grow by a longer view over the same mapping — no copy of the groups, and no second set of
    fresh pages for the kernel to zero (where a doubling's time went: 43 % of an in-memory
    10 M-group aggregation). Arrays start at ``start``, the first 2 MiB boundary of a
    reservation (so that its huge pages line up with the array), and may take ``capacity``
    bytes. ``exposed`` is how many bytes views have covered so far: beyond it the mapping is
    still all zeros."""

    exposed: int
    start: int
    capacity: int

    @classmethod
    def make(cls, nbytes: int, reserve: int) -> _Reservation:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        area = None
        if reserve > nbytes:
            try:
                area = cls(-1, reserve + HUGE_PAGE, flags=flags | _MAP_NORESERVE)
            except (OSError, OverflowError, ValueError):  # no address space to spare: exact
                area = None
        if area is None:
            area = cls(-1, nbytes, flags=flags)
            area.start, area.capacity = 0, nbytes
        else:
            address = np.frombuffer(area, dtype=np.uint8, count=1).ctypes.data
            area.start, area.capacity = -address % HUGE_PAGE, reserve
        area.exposed = nbytes
        return area


#: a growable array reserves this many times its size (eight doublings in place, then one copy
#: into a new reservation): address space stays bounded by what the tables hold, however many
#: tables (threads, partitions) a process has
RESERVE_FACTOR = 256


def _reserve_bytes(nbytes: int) -> int:
    """The address space a growable array of ``nbytes`` reserves: :data:`RESERVE_FACTOR`
    times its size, at most physical memory (a table never holds more); nothing where the
    address space is limited (``ulimit -v``, or PySpark's ``spark.executor.pyspark.memory``:
    reserving would take from what the process may map) — then arrays grow by copying.
    Asked each time: a limit may be set after import."""
    import resource

    try:
        if resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY:
            return 0
        physical = int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError):
        return 0
    return min(physical, RESERVE_FACTOR * nbytes)


def _reservation_of(array: np.ndarray) -> _Reservation | None:
    base = array.base
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer holds the mapping through a memoryview
        base = base.obj
    return base if isinstance(base, _Reservation) else None


def _grow_at(capacity: int) -> int:
    return int(capacity * LOAD_FACTOR)


def null_mask_dtype(num_key_columns: int) -> np.dtype:
    if num_key_columns > 64:
        raise ValueError(f"at most 64 key columns are supported, got {num_key_columns}")
    return np.dtype(np.uint8) if num_key_columns <= 8 else np.dtype(np.uint64)


def payload_row_dtype(payload: Sequence[tuple[np.dtype, object]]) -> np.dtype:
    """The record dtype of a group's payload row: field ``p{i}`` is payload ``i``, widest
    fields first so each sits at a multiple of its size within the row; rows are packed, not
    padded (memory is the product: a padded row of a max state, 8 + 1 bytes, would take 16),
    so a field may be unaligned in memory, which x86 loads and stores do not mind.
    ``itemsize`` 0 when there is no payload."""
    dtypes = [np.dtype(dt) for dt, _ in payload]
    order = sorted(range(len(dtypes)), key=lambda i: -dtypes[i].itemsize)
    offsets = [0] * len(dtypes)
    end = 0
    for i in order:
        size = dtypes[i].itemsize
        end = -(-end // size) * size
        offsets[i] = end
        end += size
    itemsize = end
    names = [f"p{i}" for i in range(len(dtypes))]
    return np.dtype({"names": names, "formats": dtypes, "offsets": offsets, "itemsize": itemsize})


class TypedHashTable:
    """Open-addressing table (quadratic probing, power-of-two capacity, hashes cached per slot).

    ``num_words`` fixed-width key words per group, ``has_var`` whether keys carry a
    variable-length part, ``payload`` the ``(dtype, fill value)`` of each per-group payload
    field (one row per group in :attr:`rows`, each field exposed as a strided view in
    :attr:`payload`, grown with the table).
    """

    def __init__(
        self,
        num_words: int,
        num_key_columns: int,
        has_var: bool,
        payload: Sequence[tuple[np.dtype, object]] = (),
        *,
        capacity: int = MIN_CAPACITY,
        arena_capacity: int = MIN_ARENA,
        hash_is_key: bool = False,
    ) -> None:
        if hash_is_key and (num_words != 1 or has_var):
            raise ValueError("hash_is_key needs exactly one fixed-width key word")
        #: the key hash is a bijection of the one key word (integer keys): a matching hash is a
        #: matching key unless a null was inserted (nulls hash to a constant)
        self.hash_is_key = hash_is_key
        if capacity < 2 or capacity & (capacity - 1) or capacity > MAX_CAPACITY:
            raise ValueError(f"capacity must be a power of two in [2, 2**30], got {capacity}")
        self.num_words = num_words
        self.has_var = has_var
        self.null_dtype = null_mask_dtype(num_key_columns)
        self.payload_spec = [(np.dtype(dt), fill) for dt, fill in payload]
        self.row_dtype = payload_row_dtype(self.payload_spec)
        #: bits the hashes given to :meth:`insert` were rotated left by (0: none); the table
        #: hands out hashes rotated back (:meth:`sort_by_hash`). A table that holds only the
        #: hashes whose top ``rotation`` bits are zero is given them rotated, so that its slots
        #: (chosen by the top bits) are all used; their order is the same either way
        self.rotation = 0
        self._allocate(capacity, arena_capacity if has_var else 0)

    # -- sizes -------------------------------------------------------------------------------

    def _bytes_for(self, capacity: int, arena_capacity: int) -> int:
        groups = _grow_at(capacity)
        per_group = 8 * self.num_words + self.null_dtype.itemsize + self.row_dtype.itemsize
        total = capacity * 16 + groups * per_group + 16  # slots + groups + meta
        if self.has_var:
            total += (groups + 1) * 8 + arena_capacity
        return total

    @staticmethod
    def bytes_for(
        num_words: int,
        num_key_columns: int,
        has_var: bool,
        payload: Sequence[tuple[np.dtype, object]],
        capacity: int = MIN_CAPACITY,
        arena_capacity: int = MIN_ARENA,
    ) -> int:
        """Bytes a table of this shape holds at ``capacity`` (for asking before allocating)."""
        probe = TypedHashTable.__new__(TypedHashTable)
        probe.num_words = num_words
        probe.has_var = has_var
        probe.null_dtype = null_mask_dtype(num_key_columns)
        probe.payload_spec = [(np.dtype(dt), fill) for dt, fill in payload]
        probe.row_dtype = payload_row_dtype(probe.payload_spec)
        return probe._bytes_for(capacity, arena_capacity if has_var else 0)

    @property
    def nbytes(self) -> int:
        """Bytes held by all arrays of the table (exactly what was allocated)."""
        total = self.slots.nbytes + self.key_words.nbytes + self.key_nulls.nbytes + self.meta.nbytes
        total += self.var_offsets.nbytes + self.arena.nbytes
        return total + self.rows.nbytes

    @property
    def capacity(self) -> int:
        return self.slots.shape[0]

    @property
    def num_groups(self) -> int:
        return int(self.meta[0])

    @property
    def arena_used(self) -> int:
        return int(self.meta[1])

    def bytes_after_growth(self) -> int:
        """Bytes the table holds after doubling its capacity (arena unchanged)."""
        return self._bytes_for(self.capacity * 2, self.arena.shape[0])

    def bytes_at_growth_peak(self) -> int:
        """Bytes held at the peak of :meth:`grow`: the old and the new slot arrays, and each
        group array once at its new size if it grows in place (a growable mapping with room:
        :func:`_grown`), else old and new beside each other."""
        peak = self.bytes_after_growth() + self.slots.nbytes
        groups = _grow_at(self.capacity * 2)
        for array, rows in (
            (self.key_words, groups),
            (self.key_nulls, groups),
            (self.var_offsets, groups + 1 if self.has_var else 0),
            (self.rows, groups),
        ):
            if not _grows_in_place(array, rows):
                peak += array.nbytes
        return peak

    def bytes_at_capacity(self, capacity: int) -> int:
        """Bytes an empty table of ``capacity`` slots would hold (arena size unchanged)."""
        return self._bytes_for(capacity, self.arena.shape[0])

    def bytes_after_arena_growth(self, needed: int) -> int:
        """Bytes after growing the arena so that ``needed`` more bytes fit."""
        return self._bytes_for(self.capacity, self._arena_target(needed))

    def _arena_target(self, needed: int) -> int:
        size = max(self.arena.shape[0], MIN_ARENA)
        while size < self.arena_used + needed:
            size *= 2
        return size

    # -- allocation --------------------------------------------------------------------------

    def _allocate(self, capacity: int, arena_capacity: int) -> None:
        groups = _grow_at(capacity)
        self.slots = zeros((capacity, 2), np.uint64, populate=True)
        self.shift = np.uint64(64 - (capacity.bit_length() - 1))
        self.grow_at = groups
        self.key_words = zeros((groups, self.num_words), np.uint64, growable=True)
        self.key_nulls = zeros(groups, self.null_dtype, growable=True)
        if self.has_var:
            self.var_offsets = zeros(groups + 1, np.int64, growable=True)
            self.arena = np.zeros(arena_capacity, dtype=np.uint8)
        else:
            self.var_offsets = np.zeros(0, dtype=np.int64)
            self.arena = np.zeros(0, dtype=np.uint8)
        self._set_rows(zeros(groups, self.row_dtype, growable=True), 0)
        self.meta = np.zeros(2, dtype=np.int64)
        self._nulls_seen = False
        self._grow_at_before_sort = 0

    def _set_rows(self, rows: np.ndarray, keep: int) -> None:
        """Hold ``rows`` (its first ``keep`` rows are groups already): fill the rest with
        each field's fill value and make the field views."""
        self.rows = rows
        self.payload = [rows[name] for name in self.row_dtype.names or ()]
        for view, (_, fill) in zip(self.payload, self.payload_spec, strict=True):
            if fill != 0:
                view[keep:] = fill

    def _grow_rows(self, groups: int, keep: int) -> None:
        if self.row_dtype.itemsize == 0:
            self._set_rows(np.zeros(groups, dtype=self.row_dtype), keep)
            return
        self._set_rows(_grown(self.rows, groups, keep, 0), keep)

    def reset(self, capacity: int = MIN_CAPACITY) -> None:
        """Drop every group and start again at ``capacity`` (after a spill)."""
        self._allocate(capacity, MIN_ARENA if self.has_var else 0)

    def reallocate(self, capacity: int) -> None:
        """Drop every group and start again empty at ``capacity`` slots, the arena's size
        kept (after a spill, when a larger table is granted than doubling would have been:
        an empty table is allocated new, not copied, so the old arrays are dropped first)."""
        if capacity < 2 or capacity & (capacity - 1) or capacity > MAX_CAPACITY:
            raise ValueError(f"capacity must be a power of two in [2, 2**30], got {capacity}")
        arena_capacity = self.arena.shape[0]
        # the old arrays go first: the new ones are not made beside them
        self.slots = self.key_words = np.zeros((0, 2), dtype=np.uint64)
        self.var_offsets = np.zeros(0, dtype=np.int64)
        self.arena = np.zeros(0, dtype=np.uint8)
        self._set_rows(np.zeros(0, dtype=self.row_dtype), 0)
        self._allocate(capacity, arena_capacity)

    def clear(self) -> None:
        """Drop every group but keep every array (after a spill that will be followed by more
        input: the table fills to the same size again, so regrowing it from small would only
        rehash the same groups several times over). Works after :meth:`sort_by_hash` too."""
        n = self.num_groups
        self.slots.fill(0)
        self.key_nulls[:n] = 0  # the integer-key probe does not write them: keep them zero
        for p, (_, fill) in zip(self.payload, self.payload_spec, strict=True):
            p[:n] = fill
        self.meta[:] = 0
        self.grow_at = self._grow_at_before_sort or self.grow_at
        self._grow_at_before_sort = 0
        self._nulls_seen = False

    def grow(self) -> None:
        """Double the capacity, keeping every group (the caller has been granted the bytes)."""
        capacity = self.capacity * 2
        if capacity > MAX_CAPACITY:
            raise MemoryError(f"typed hash table cannot grow beyond {MAX_CAPACITY} slots")
        n = self.num_groups
        groups = _grow_at(capacity)
        slots = zeros((capacity, 2), np.uint64, populate=True)
        shift = np.uint64(64 - (capacity.bit_length() - 1))
        K.rehash_slots(self.slots, slots, shift)
        self.slots, self.shift, self.grow_at = slots, shift, groups
        self.key_words = _grown(self.key_words, groups, n, 0)
        self.key_nulls = _grown(self.key_nulls, groups, n, 0)
        if self.has_var:
            self.var_offsets = _grown(self.var_offsets, groups + 1, n + 1, 0)
        self._grow_rows(groups, n)

    def fill_target(self) -> int:
        """Groups the table could hold at its current capacity if filled to
        :data:`FULL_LOAD_FACTOR` (equal to ``grow_at`` when already extended)."""
        return max(self.grow_at, int(self.capacity * FULL_LOAD_FACTOR))

    def bytes_after_extension(self, groups: int) -> int:
        """Bytes held at the peak of :meth:`extend_groups` to ``groups``: the table after it
        plus the largest one new array (the arrays are replaced one at a time)."""
        widths = [8 * self.num_words, self.null_dtype.itemsize, self.row_dtype.itemsize]
        if self.has_var:
            widths.append(8)
        added = (groups - self.grow_at) * sum(widths)
        return self.nbytes + added + groups * max(widths)

    def extend_groups(self, groups: int) -> None:
        """Let the table hold ``groups`` groups without doubling its slots (a fuller table,
        slower probes, but no spill yet). The caller has been granted the new arrays."""
        if groups > self.capacity - 1:
            raise ValueError(f"cannot hold {groups} groups in {self.capacity} slots")
        if groups <= self.grow_at:
            return
        n = self.num_groups
        # one array at a time: each old one is freed before the next new one is made
        self.key_words = _grown(self.key_words, groups, n, 0)
        self.key_nulls = _grown(self.key_nulls, groups, n, 0)
        if self.has_var:
            self.var_offsets = _grown(self.var_offsets, groups + 1, n + 1, 0)
        self._grow_rows(groups, n)
        self.grow_at = groups

    def grow_arena(self, needed: int) -> None:
        """Grow the arena so ``needed`` more bytes fit (the caller has been granted the bytes)."""
        target = self._arena_target(needed)
        arena = np.zeros(target, dtype=np.uint8)
        arena[: self.arena_used] = self.arena[: self.arena_used]
        self.arena = arena

    # -- use ---------------------------------------------------------------------------------

    def insert(
        self,
        hashes: np.ndarray,
        words: np.ndarray,
        nulls: np.ndarray,
        var_offsets: np.ndarray,
        var_data: np.ndarray,
        start: int,
        out_gid: np.ndarray,
    ) -> tuple[int, int]:
        """Assign group ids to rows ``start..``; see ``_typed_kernels.insert_rows``."""
        if nulls.shape[0]:
            self._nulls_seen = True
        elif self.hash_is_key and not self._nulls_seen:
            next_row, status = K.insert_rows_hash_is_key(
                hashes, words, start, self.slots, self.shift, self.key_words, self.meta,
                self.grow_at, out_gid,
            )  # fmt: skip
            return int(next_row), int(status)
        # no null key seen yet: the group null masks are all zero, neither read nor written
        key_nulls = self.key_nulls if self._nulls_seen else self.key_nulls[:0]
        next_row, status = K.insert_rows(
            hashes, words, nulls, var_offsets, var_data, start, self.slots, self.shift,
            self.key_words, key_nulls, self.var_offsets, self.arena, self.meta,
            self.grow_at, out_gid,
        )  # fmt: skip
        return int(next_row), int(status)

    def pending_var_bytes(self, var_offsets: np.ndarray, row: int) -> int:
        """Length of the variable-length key of ``row`` (after an ``ARENA_FULL`` stop)."""
        return int(var_offsets[row + 1] - var_offsets[row])

    def sort_by_hash(self) -> tuple[np.ndarray, np.ndarray]:
        """Destructively order the groups by ``(hash, group id)``.

        Returns ``(hashes, group_ids)`` views into the slot array (valid until :meth:`reset`);
        the probe structure is gone afterwards, so the table must be reset before inserting.
        """
        n = int(K.sort_slots(self.slots))
        self._grow_at_before_sort = self.grow_at
        self.grow_at = 0  # inserting now would corrupt the sorted prefix
        _rotate_in_place(self.slots[:n, 0], 64 - self.rotation)
        return self.slots[:n, 0], self.slots[:n, 1]

    def restore_after_sort(self) -> None:
        """Rebuild the probe structure after :meth:`sort_by_hash` (when a spill failed)."""
        n = self.num_groups
        _rotate_in_place(self.slots[:n, 0], self.rotation)
        slots = zeros(self.slots.shape, self.slots.dtype, populate=True)
        K.rehash_slots(self.slots[:n], slots, self.shift)
        self.slots = slots
        self.grow_at = self._grow_at_before_sort or _grow_at(self.capacity)
        self._grow_at_before_sort = 0

    @staticmethod
    def keep_bytes(groups: int) -> int:
        """Scratch bytes :meth:`keep_sorted_prefix` holds while it keeps ``groups`` groups."""
        return 16 * groups

    def keep_sorted_prefix(self, m: int, rotation: int | None = None) -> None:
        """After :meth:`sort_by_hash`: keep only the first ``m`` groups in hash order (the
        others were written elsewhere), numbered ``0..m-1`` again in their old order, and
        rebuild the probe structure in place, with the hashes rotated by ``rotation`` bits
        from now on (default: as before; see :attr:`rotation`). Fixed-width keys only (the
        arena of variable keys is not compacted). Holds :meth:`keep_bytes` of scratch."""
        if self.has_var:
            raise ValueError("keep_sorted_prefix needs fixed-width keys")
        n = self.num_groups
        if not 0 <= m <= n:
            raise ValueError(f"cannot keep {m} of {n} groups")
        if rotation is not None:
            self.rotation = rotation % 64
        kept = self.slots[:m]
        K.sort_hash_index(kept[:, 1], kept[:, 0])  # ascending old ids, their hashes along
        width = self.row_dtype.itemsize
        raw = self.rows.view(np.uint8).reshape(len(self.rows), width)
        key_nulls = self.key_nulls if self._nulls_seen else self.key_nulls[:0]
        K.compact_groups(self.key_words, key_nulls, raw, kept[:, 1])
        pairs = kept.copy()
        pairs[:, 1] = np.arange(1, m + 1, dtype=np.uint64)
        _rotate_in_place(pairs[:, 0], self.rotation)
        self.slots.fill(0)
        K.rehash_slots(pairs, self.slots, self.shift)
        del pairs
        for p, (_, fill) in zip(self.payload, self.payload_spec, strict=True):
            p[m:n] = fill
        self.key_nulls[m:n] = 0
        self.meta[0] = m
        self.grow_at = self._grow_at_before_sort or _grow_at(self.capacity)
        self._grow_at_before_sort = 0

    def gather_keys(
        self, slot_gids: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Keys of the groups ``slot_gids - 1`` (group ids as :meth:`sort_by_hash` gives them):
        key words as ``(num_words, n)`` (one contiguous row per word), null masks and the
        variable part as (offsets, bytes)."""
        n = slot_gids.shape[0]
        words = np.empty((self.num_words, n), dtype=np.uint64)
        nulls = np.empty(n, dtype=self.key_nulls.dtype)
        K.gather_group_keys(self.key_words, self.key_nulls, slot_gids, words, nulls)
        if not self.has_var:
            return words, nulls, None, None
        offsets, data = self.gather_var_keys(slot_gids)
        return words, nulls, offsets, data

    def gather_groups(self, slot_gids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Fixed-width keys (as :meth:`gather_keys`) and payload rows (a record array of
        :attr:`row_dtype`) of the groups ``slot_gids - 1``, in one visit per group."""
        n = slot_gids.shape[0]
        words = np.empty((self.num_words, n), dtype=np.uint64)
        nulls = np.empty(n, dtype=self.key_nulls.dtype)
        out = np.empty(n, dtype=self.row_dtype)
        width = self.row_dtype.itemsize
        raw = self.rows.view(np.uint8).reshape(len(self.rows), width)
        key_nulls = self.key_nulls if self._nulls_seen else self.key_nulls[:0]
        K.gather_groups(
            self.key_words, key_nulls, raw, slot_gids, words, nulls,
            out.view(np.uint8).reshape(n, width),
        )  # fmt: skip
        return words, nulls, out

    def gather_var_keys(self, slot_gids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The variable-length key parts of the groups ``slot_gids - 1`` as (offsets, bytes)."""
        return K.gather_var(self.var_offsets, self.arena, slot_gids.astype(np.int64) - 1)

    def gather_payload(self, index: int, slot_gids: np.ndarray) -> np.ndarray:
        """Payload array ``index`` of the groups ``slot_gids - 1``."""
        values = self.payload[index]
        out = np.empty(slot_gids.shape[0], dtype=values.dtype)
        K.take_groups(values, slot_gids, out)
        return out

    def check_invariants(self) -> None:
        """Assert the table's invariants (O(capacity); for tests)."""
        n = self.num_groups
        occupied = self.slots[self.slots[:, 1] != 0]
        assert len(occupied) == n, (len(occupied), n)
        assert n <= self.grow_at
        gids = np.sort(occupied[:, 1].astype(np.int64) - 1)
        assert np.array_equal(gids, np.arange(n)), "group ids must be 0..n-1, each once"
        if self.has_var:
            assert self.var_offsets[0] == 0
            assert np.all(np.diff(self.var_offsets[: n + 1]) >= 0)
            assert self.var_offsets[n] == self.arena_used <= self.arena.shape[0]


def _rotate_in_place(hashes: np.ndarray, bits: int) -> None:
    """Rotate ``hashes`` left by ``bits`` in place, 64 Ki at a time (small temporaries)."""
    bits %= 64
    if not bits:
        return
    left, right = np.uint64(bits), np.uint64(64 - bits)
    step = 1 << 16
    for lo in range(0, hashes.shape[0], step):
        part = hashes[lo : lo + step]
        part[:] = (part << left) | (part >> right)


def _row_bytes(array: np.ndarray) -> int:
    return array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))


def _grows_in_place(array: np.ndarray, rows: int) -> bool:
    """Whether :func:`_grown` would give ``array`` ``rows`` rows without a new array."""
    area = _reservation_of(array)
    return (
        area is not None
        and rows * _row_bytes(array) <= area.capacity
        and array.flags.c_contiguous
        and array.shape[0] <= rows
    )


def _grown(array: np.ndarray, rows: int, keep: int, fill: object) -> np.ndarray:
    """``array`` with ``rows`` rows, its first ``keep`` kept and the rest ``fill``: a longer
    view over the same mapping when the array is growable and the mapping has room (nothing
    copied), else a new array (growable if large)."""
    shape = (rows, *array.shape[1:])
    area = _reservation_of(array)
    row_bytes = _row_bytes(array)
    need = rows * row_bytes
    if area is not None and need <= area.capacity and array.flags.c_contiguous and keep <= rows:
        flat = np.frombuffer(area, dtype=np.uint8, count=need, offset=area.start)
        # bytes a view has covered before may hold old groups (after a clear): zero them
        flat[keep * row_bytes : min(need, area.exposed)] = 0
        if need > area.exposed:  # huge pages for the whole ones now covered (see zeros)
            begin = area.start + area.exposed // HUGE_PAGE * HUGE_PAGE
            _advise_huge_pages(area, begin, area.start + need // HUGE_PAGE * HUGE_PAGE)
            area.exposed = need
        out = flat.view(array.dtype).reshape(shape)
        if fill != 0:
            out[keep:] = fill
        return out
    out = zeros(shape, array.dtype, growable=True)
    if fill != 0:
        out[keep:] = fill
    if keep:
        if array.dtype.names:  # records as bytes: a record-by-record copy is ~20x slower
            out.view(np.uint8)[: keep * row_bytes] = array.view(np.uint8)[: keep * row_bytes]
        else:
            out[:keep] = array[:keep]
    return out

"""Spark's AppendOnlyMap for Python keys: open addressing, values change, keys never leave.

Layout (a compact dict, as CPython's): the entries live densely in insertion order - keys in a
Python list, combiners in a Python list, each key's cached ``hash()`` in an ``int64`` array - and
the open-addressing table is an ``int32`` array holding ``-1`` for an empty slot, else the entry
number (times two, plus a tag bit for exact ints equal to their hash). A numba kernel probes a
whole batch of records at once (:meth:`AppendOnlyMap.fold`); key equality is confirmed in Python
(or, between tagged ints, by the hash itself), so keys whose hashes collide stay apart. Growing
rebuilds only the ``int32`` table: no Python object is touched, none moves.

Capacity, growth and error arithmetic follow Spark (``spark-semantics.md`` section 1): power-of-two
capacity (default 64, at most 2**29), ``grow_threshold = floor(0.7 * capacity)``, the table doubles
when a new key would make ``size > grow_threshold``. Probing is triangular from a Fibonacci-hashed
home slot (:mod:`extagg.collection._kernels_reference`). ``None`` is an ordinary key. Combiners
must not modify the map they are folded into.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import numpy as np

from extagg._hash_kernels import hash_str_list
from extagg.collection import _kernels
from extagg.collection._batch_fold import UNCREATED, BatchFoldMixin, hash_key, int_tag
from extagg.collection._kernels import EMPTY
from extagg.errors import DestroyedError
from extagg.hashing import hash_array, order_hashes

__all__ = [
    "SORT_BYTES_PER_ENTRY",
    "DEFAULT_CAPACITY",
    "LOAD_FACTOR",
    "MAXIMUM_CAPACITY",
    "AppendOnlyMap",
    "next_power_of_2",
]

logger = logging.getLogger(__name__)

MAXIMUM_CAPACITY = 1 << 29
LOAD_FACTOR = 0.7
DEFAULT_CAPACITY = 64
DESTROYED_MESSAGE = "Map state is invalid from destructive sorting!"
#: peak working memory of :meth:`AppendOnlyMap.destructive_sort_order` per entry: the unsorted
#: and sorted hashes and the permutation, 8 bytes each (the table is freed before)
SORT_BYTES_PER_ENTRY = 24

_GOLDEN = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
#: bytes per entry of the entry arrays: the cached hash, the int-key copy and its flag
ENTRY_ARRAY_BYTES = 8 + 8 + 1


def next_power_of_2(n: int) -> int:
    """``n`` if it is a power of two, else the next power of two above it (``n >= 1``)."""
    return 1 << (n - 1).bit_length()


def _geometry(capacity: int) -> tuple[int, int, int, int]:
    """``(capacity, mask, shift, grow_threshold)`` of a power-of-two capacity. The shift keeps
    the top ``log2(capacity)`` bits of the Fibonacci product (63 for capacity 1: mask 0)."""
    log2 = capacity.bit_length() - 1
    return capacity, capacity - 1, (64 - log2 if log2 else 63), int(LOAD_FACTOR * capacity)


class AppendOnlyMap(BatchFoldMixin):
    """Open-addressing hash map with Python keys and values; keys are never removed.

    Keys compare by identity or ``==``, as in a ``dict``. Iteration yields ``(key, value)`` pairs
    in insertion order (Spark's ``iterator`` yields pairs too).
    """

    #: largest capacity; a subclass may lower it (tests do, to reach the limit cheaply)
    MAXIMUM_CAPACITY = MAXIMUM_CAPACITY

    __slots__ = (
        "_capacity",
        "_destroyed",
        "_folded",
        "_grow_threshold",
        "_hashes",
        "_int_keys",
        "_is_int",
        "_keys",
        "_mask",
        "_shift",
        "_size",
        "_table",
        "_values",
    )

    def __init__(self, initial_capacity: int = DEFAULT_CAPACITY) -> None:
        if isinstance(initial_capacity, bool) or not isinstance(initial_capacity, int):
            raise TypeError(
                f"initial_capacity must be an int, not {type(initial_capacity).__name__}"
            )
        limit = self.MAXIMUM_CAPACITY
        if initial_capacity > limit:
            raise ValueError(
                f"requirement failed: Can't make capacity bigger than {limit} elements "
                f"(initial capacity {initial_capacity})"
            )
        if initial_capacity < 1:
            raise ValueError(
                f"requirement failed: Invalid initial capacity {initial_capacity} "
                f"(must be between 1 and {limit})"
            )
        self._destroyed = False
        self._folded = 0
        self._size = 0
        self._keys: list[Any] = []
        self._values: list[Any] = []
        self._hashes = np.empty(0, dtype=np.int64)
        self._int_keys = np.empty(0, dtype=np.int64)
        self._is_int = np.empty(0, dtype=np.bool_)
        self._set_capacity(next_power_of_2(initial_capacity))
        self._table = np.full(self._capacity, EMPTY, dtype=np.int32)

    def _set_capacity(self, capacity: int) -> None:
        """Set the capacity numbers and size the entry-hash array to the new threshold."""
        self._capacity, self._mask, self._shift, self._grow_threshold = _geometry(capacity)
        hashes = np.empty(self._grow_threshold, dtype=np.int64)
        hashes[: self._size] = self._hashes[: self._size]
        self._hashes = hashes
        self._int_keys, self._is_int = _grown_int_keys(
            self._int_keys, self._is_int, self._grow_threshold, self._size
        )

    def _check_valid(self) -> None:
        if self._destroyed:
            raise DestroyedError(DESTROYED_MESSAGE)

    @property
    def capacity(self) -> int:
        """Number of table slots (a power of two)."""
        self._check_valid()
        return self._capacity

    @property
    def grow_threshold(self) -> int:
        """``floor(0.7 * capacity)``: the table grows when a new key would exceed it."""
        self._check_valid()
        return self._grow_threshold

    @property
    def at_grow_threshold(self) -> bool:
        """True when the next new key grows the table (Spark's ``atGrowThreshold``)."""
        self._check_valid()
        return self._size == self._grow_threshold

    @property
    def size(self) -> int:
        """Number of keys."""
        self._check_valid()
        return self._size

    def __len__(self) -> int:
        self._check_valid()
        return self._size

    def __repr__(self) -> str:
        if self._destroyed:
            return f"{type(self).__name__}(<destroyed>)"
        return f"{type(self).__name__}(size={self._size}, capacity={self._capacity})"

    # -- single-key operations (probe in Python with the kernels' sequence) -------------------

    def _locate(self, key: Any, h: int) -> int:
        """The entry holding ``key``, or ``~slot`` of the empty slot where it would go."""
        mask, table, hashes, keys = self._mask, self._table, self._hashes, self._keys
        pos = (((h * _GOLDEN) & _M64) >> self._shift) & mask
        step = 1
        while True:
            ref = table.item(pos)
            if ref == EMPTY:
                return ~pos
            entry = ref >> 1
            if hashes.item(entry) == h:
                current = keys[entry]
                if current is key or current == key:
                    return entry
            pos = (pos + step) & mask
            step += 1

    def _insert_new(self, key: Any, h: int, value: Any, empty_pos: int) -> None:
        """Add a key known to be absent, growing first if it would pass the threshold."""
        if self._size >= self._grow_threshold:
            self._grow_table()
            empty_pos = ~self._locate(key, h)
        entry = self._size
        self._table[empty_pos] = 2 * entry + int_tag(key, h)
        self._hashes[entry] = h
        is_int = type(key) is int and _INT64_MIN <= key <= _INT64_MAX
        self._is_int[entry] = is_int
        if is_int:
            self._int_keys[entry] = key
        self._keys.append(key)
        self._values.append(value)
        self._size = entry + 1

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` (Spark's ``apply`` returns null when absent)."""
        self._check_valid()
        entry = self._locate(key, hash_key(key))
        return self._values[entry] if entry >= 0 else default

    def __contains__(self, key: Hashable) -> bool:
        self._check_valid()
        return self._locate(key, hash_key(key)) >= 0

    def update(self, key: Hashable, value: Any) -> None:
        """Set the value of ``key``, adding the key if it is new (may grow the table)."""
        self._check_valid()
        h = hash_key(key)
        entry = self._locate(key, h)
        if entry >= 0:
            self._values[entry] = value
        else:
            self._insert_new(key, h, value, ~entry)

    def change_value(self, key: Hashable, update_fn: Callable[[bool, Any], Any]) -> Any:
        """Set ``key``'s value to ``update_fn(had_value, old_value)`` and return the new value.

        ``update_fn(False, None)`` for a new key. The key is added only after ``update_fn``
        returns, so an exception leaves the map unchanged; the returned value is the computed
        one even when the insert grows the table.
        """
        self._check_valid()
        h = hash_key(key)
        entry = self._locate(key, h)
        if entry >= 0:
            new_value = update_fn(True, self._values[entry])
            self._values[entry] = new_value
            return new_value
        size = self._size
        new_value = update_fn(False, None)
        if self._size != size:  # update_fn changed the map: probe again
            self._check_valid()
            entry = self._locate(key, h)
            if entry >= 0:
                self._values[entry] = new_value
                return new_value
        self._insert_new(key, h, new_value, ~entry)
        return new_value

    def growth_bytes(self) -> int:
        """Bytes the next doubling allocates while the old arrays are still alive.

        The engine asks the memory manager for these before a chunk that may grow the table.
        """
        new_capacity = self._capacity * 2
        return new_capacity * 4 + int(LOAD_FACTOR * new_capacity) * ENTRY_ARRAY_BYTES

    def _grow_table(self) -> None:
        """Double the capacity, re-inserting every slot in slot order (Spark's growTable).

        The new arrays are built aside and swapped in at the end: a failure (MemoryError,
        interrupt) leaves the old table in place."""
        new_capacity = self._capacity * 2
        if new_capacity > self.MAXIMUM_CAPACITY:
            raise ValueError(
                f"requirement failed: Can't contain more than {self._grow_threshold} elements"
            )
        capacity, mask, shift, threshold = _geometry(new_capacity)
        hashes = np.empty(threshold, dtype=np.int64)
        hashes[: self._size] = self._hashes[: self._size]
        table = np.full(new_capacity, EMPTY, dtype=np.int32)
        _kernels.rehash_table(self._table, hashes, table, shift, mask)
        int_keys, is_int = _grown_int_keys(self._int_keys, self._is_int, threshold, self._size)
        self._table, self._hashes = table, hashes
        self._int_keys, self._is_int = int_keys, is_int
        self._capacity, self._mask, self._shift, self._grow_threshold = (
            capacity,
            mask,
            shift,
            threshold,
        )
        logger.debug("AppendOnlyMap grew to %d slots (%d keys)", new_capacity, self._size)

    def _truncate(self, keep: int) -> None:
        """Drop the entries added after the first ``keep`` (exact: they are the newest)."""
        if keep < self._size:
            _kernels.release_entries(
                self._table, self._hashes, keep, self._size, self._shift, self._mask
            )
            del self._keys[keep:]
            del self._values[keep:]
            self._size = keep

    # -- the batch fold (the hot path) ---------------------------------------------------------
    def items(self) -> Iterator[tuple[Any, Any]]:
        """``(key, value)`` pairs in insertion order (keys added meanwhile are included).
        Raises ``AssertionError`` if the map is destroyed during the iteration."""
        self._check_valid()
        return self._iterate()

    __iter__ = items

    def _iterate(self) -> Iterator[tuple[Any, Any]]:
        keys, values = self._keys, self._values
        entry = 0
        while True:
            self._check_valid()
            if entry >= self._size:
                return
            yield keys[entry], values[entry]
            entry += 1

    def destructive_sorted_arrays(self) -> tuple[np.ndarray, list[Any], list[Any]]:
        """Destroy the map and return its entries sorted by :func:`extagg.hashing.order_hash`.

        Returns ``(hashes, keys, values)``: ``uint64`` order hashes ascending, entries with equal
        hashes in insertion order (stable), keys and values permuted accordingly. The table is
        released; afterwards every method raises ``AssertionError``. Working memory: about 60
        bytes per entry besides the new lists (the engine uses :meth:`destructive_sort_order`).
        """
        hashes, order, keys, values = self.destructive_sort_order()
        positions = order.tolist()
        sorted_keys = list(map(keys.__getitem__, positions))
        return hashes, sorted_keys, list(map(values.__getitem__, positions))

    def destructive_sort_order(self) -> tuple[np.ndarray, np.ndarray, list[Any], list[Any]]:
        """Destroy the map and return ``(hashes, order, keys, values)`` without copying rows.

        ``hashes`` are the :func:`extagg.hashing.order_hash` values ascending, ``order[i]`` the
        position in ``keys``/``values`` (insertion order) of the ``i``-th entry in that order;
        equal hashes keep insertion order. The table is freed first, so the working memory is
        the two 8-byte arrays (16 bytes per entry held, 24 at the peak of the sort): see
        :data:`SORT_BYTES_PER_ENTRY`.
        """
        self._check_valid()
        keys, values = self._keys, self._values
        n = self._size
        unsorted: np.ndarray | None
        if n and self._is_int[:n].all():  # exact ints in int64: hashed from the map's copy
            unsorted = hash_array(self._int_keys[:n])
        else:
            unsorted = hash_str_list(keys)  # all str keys: compiled
        if unsorted is None:
            unsorted = order_hashes(keys)  # may run user __hash__: the map is still intact
        self._destroyed = True
        self._size = 0
        self._keys, self._values = [], []
        self._drop_arrays()
        order = _kernels.stable_argsort_u64(unsorted)
        hashes = unsorted[order]
        return hashes, order, keys, values

    def int_key_column(self) -> np.ndarray | None:
        """Every key as ``int64`` in insertion order when all are exact ``int`` that fit, else
        ``None``: the map's own copy (kept for confirming matches), still valid after
        :meth:`destructive_sort_order` drops the map's reference to it."""
        self._check_valid()
        n = self._size
        if n == 0 or not self._is_int[:n].all():
            return None
        return self._int_keys[:n]

    def destructive_arrays(self) -> tuple[list[Any], list[Any]]:
        """Destroy the map and return its keys and values in insertion order (no sorting)."""
        self._check_valid()
        keys, values = self._keys, self._values
        self._destroyed = True
        self._size = 0
        self._keys, self._values = [], []
        self._drop_arrays()
        return keys, values

    def _drop_arrays(self) -> None:
        self._table = np.empty(0, dtype=np.int32)
        self._hashes = np.empty(0, dtype=np.int64)
        self._int_keys = np.empty(0, dtype=np.int64)
        self._is_int = np.empty(0, dtype=np.bool_)

    def destructive_sorted_iterator(self) -> Iterator[tuple[Any, Any]]:
        """Destroy the map now and iterate ``(key, value)`` in order-hash order."""
        _, order, keys, values = self.destructive_sort_order()
        return _gather_pairs(order, keys, values)

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant (for tests; O(n * probe))."""
        self._check_valid()
        cap, size, mask = self._capacity, self._size, self._mask
        if cap & (cap - 1) or not 1 <= cap <= self.MAXIMUM_CAPACITY or len(self._table) != cap:
            raise AssertionError(f"capacity {cap} is not a power of two in range")
        if self._grow_threshold != int(LOAD_FACTOR * cap) or size > self._grow_threshold:
            raise AssertionError(f"size {size} / threshold {self._grow_threshold} wrong")
        if not len(self._keys) == len(self._values) == size <= len(self._hashes):
            raise AssertionError(f"size {size}: {len(self._keys)} keys, {len(self._values)} values")
        table = self._table.tolist()
        slot_of: dict[int, int] = {}
        for pos, ref in enumerate(table):
            if ref != EMPTY:
                if not 0 <= ref >> 1 < size or ref >> 1 in slot_of:
                    raise AssertionError(f"slot {pos} refers to a bad or repeated entry {ref >> 1}")
                slot_of[ref >> 1] = pos
        if len(slot_of) != size:
            raise AssertionError(f"{len(slot_of)} table slots for {size} entries")
        seen: dict[Any, int] = {}
        for entry, key in enumerate(self._keys):
            h, pos = hash(key), slot_of[entry]
            if self._hashes.item(entry) != h:
                raise AssertionError(f"entry {entry}: cached hash != hash({key!r})")
            if table[pos] & 1 and not int_tag(key, h):  # 0 is always safe (no shortcut)
                raise AssertionError(f"entry {entry}: int tag on {key!r}")
            if self._is_int[entry] and self._int_keys[entry] != key:
                raise AssertionError(f"entry {entry}: int key copy != {key!r}")
            if self._values[entry] is UNCREATED:
                raise AssertionError(f"entry {entry} ({key!r}) has no combiner")
            probe, step = (((h * _GOLDEN) & _M64) >> self._shift) & mask, 1
            while probe != pos:
                if table[probe] == EMPTY or step > cap:
                    raise AssertionError(f"key {key!r} in slot {pos} unreachable from its home")
                probe, step = (probe + step) & mask, step + 1
            if key in seen:
                raise AssertionError(f"key {key!r} is entries {seen[key]} and {entry}")
            seen[key] = entry


def _grown_int_keys(
    int_keys: np.ndarray, is_int: np.ndarray, length: int, keep: int
) -> tuple[np.ndarray, np.ndarray]:
    """The int-key copy arrays resized to ``length`` entries, the first ``keep`` kept."""
    new_keys = np.empty(length, dtype=np.int64)
    new_is_int = np.zeros(length, dtype=np.bool_)
    new_keys[:keep] = int_keys[:keep]
    new_is_int[:keep] = is_int[:keep]
    return new_keys, new_is_int


def _gather_pairs(
    order: np.ndarray, keys: list[Any], values: list[Any]
) -> Iterator[tuple[Any, Any]]:
    """``(keys[i], values[i])`` for ``i`` in ``order``, gathering a slice at a time."""
    step = 8192
    for start in range(0, len(order), step):
        positions = order[start : start + step].tolist()
        yield from zip(map(keys.__getitem__, positions), map(values.__getitem__, positions))

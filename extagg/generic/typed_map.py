"""The typed path of :class:`~extagg.generic.external_map.ExternalAppendOnlyMap`.

For ``Aggregator.reducing(operator.add | min | max)`` — ``reduceByKey(add)``, the sums, minima
and maxima most jobs run —, ``Aggregator.counting()`` (a count per key, values not looked at)
and ``Aggregator.sum_count()`` (a ``(sum, count)`` per key, the mean's combiner) over records
whose keys are all exact ``int`` (fitting ``int64``) or all exact ``str`` and whose values are
all exact ``float`` or all exact ``int`` (any values, for the count), a chunk of records
becomes NumPy arrays (keys, their :func:`extagg.hashing.order_hash`, values) and is folded in
compiled code: the typed table (:class:`~extagg.collection.typed_table.TypedHashTable`) gives
every record its group, :mod:`extagg.generic._typed_fold_kernels` folds the values. No Python
code runs per record.

The result is exactly the general path's: groups are numbered in order of first appearance (the
general map's insertion order), a spill orders them by ``(order hash, first appearance)`` as the
general map's stable sort does, the states are what the Python operation computes (IEEE float
adds, ``min``/``max`` with Python's NaN and ``-0.0`` behaviour). A chunk that does not fit (a
``bool``, a float or tuple key, an ``int`` beyond ``int64``, values of mixed types, an ``int``
sum leaving ``int64``) makes the map hand its groups to a general
:class:`~extagg.collection.SizeTrackingAppendOnlyMap` (:meth:`TypedReduceMap.to_general`); the
engine folds the rest there.

Memory: the table's arrays exactly, plus what the groups will cost as Python objects when they
are read at the end (two list slots, a key and a value object each), since that is held next to
the table at that moment. A spill makes no such objects: :class:`TypedSortedRows` writes the
run's pickle bytes from the arrays (the estimate stays, conservatively, the same).
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from extagg._hash_kernels import hash_var_column
from extagg.collection import SizeTrackingAppendOnlyMap
from extagg.collection import _typed_kernels as TK
from extagg.collection.pair_arrays import PairArrays, decode_keys
from extagg.collection.size_estimator import allocated_size
from extagg.collection.typed_table import TypedHashTable
from extagg.errors import DestroyedError
from extagg.function_code import is_plain_add
from extagg.generic import _typed_fold_kernels as FK
from extagg.generic.aggregator import Aggregator
from extagg.hashing import hash_array

__all__ = [
    "TYPED_OPS",
    "TypedReduceMap",
    "TypedSortedRows",
    "aggregator_op",
    "scalar_sorted_rows",
    "typed_op",
]

#: reduce function → kernel operation code
TYPED_OPS: dict[Callable[[Any, Any], Any], int] = {
    operator.add: FK.OP_ADD,
    min: FK.OP_MIN,
    max: FK.OP_MAX,
}

#: Python objects a group becomes when read: two list slots and a boxed value (int or float)
_ENTRY_BYTES = 16 + 32
#: ... and for a ``(sum, count)`` state, a 2-tuple and the boxed count besides
_PAIR_BYTES = 64 + 32
_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
_INT_KEY_BYTES = 32
_EMPTY_NULLS = np.empty(0, dtype=np.uint8)
_EMPTY_I64 = np.empty(0, dtype=np.int64)
# The bounds a (sum, count) pattern's sum must stay within, typed like its values.
_INT64_BOUNDS = (np.int64(np.iinfo(np.int64).min), np.int64(np.iinfo(np.int64).max))
_FLOAT_BOUNDS = (-np.inf, np.inf)
_EMPTY_U8 = np.empty(0, dtype=np.uint8)
_EMPTY_U64 = np.empty(0, dtype=np.uint64)
_EMPTY_BOOL = np.empty(0, dtype=np.bool_)


def typed_op(reduce_function: Callable[[Any, Any], Any] | None) -> int | None:
    """The kernel operation of a reducing aggregator's function, or ``None`` (general path)."""
    if reduce_function is None:
        return None
    if is_plain_add(reduce_function):  # operator.add, or a lambda a, b: a + b
        return FK.OP_ADD
    try:
        return TYPED_OPS.get(reduce_function)
    except TypeError:  # an unhashable callable object
        return None


def aggregator_op(aggregator: Aggregator[Any, Any]) -> int | None:
    """The kernel operation of ``aggregator``: ``OP_COUNT`` for ``Aggregator.counting()``,
    ``OP_SUM_COUNT`` for ``Aggregator.sum_count()`` and for the reducing aggregator of its
    ``merge_combiners`` (whose records are combiners: fold them with ``combiners=True``), that
    of its reduce function for ``Aggregator.reducing(operator.add | min | max)``, else
    ``None`` (general path)."""
    pattern = aggregator.pattern
    if pattern == "count":
        return FK.OP_COUNT
    if pattern in ("sum_count", "sum_count_merge"):  # the latter folds combiners
        return FK.OP_SUM_COUNT
    return typed_op(aggregator.reduce_function)


def _identity(value: Any) -> Any:
    return value


def _never(_combiner: Any, _value: Any) -> Any:  # pragma: no cover - keys are distinct
    raise AssertionError("to_general folds distinct keys")


class TypedReduceMap:
    """Groups of plain keys with one numeric state each, folded in compiled code.

    It offers what :class:`~extagg.generic.external_map.ExternalAppendOnlyMap` uses of its
    general map (size estimate, growth, destructive sort, destructive arrays), but folds with
    :meth:`fold_typed`, which reports how many records fitted.
    """

    def __init__(self, op: int, *, from_zero: bool = False) -> None:
        self.op = op
        #: values are added to an int ``0`` first (PySpark's ``foldByKey(0, add)``,
        #: ``aggregateByKey((0, 0), ...)``): ``0 + v``, which turns a float ``-0.0`` into ``0.0``
        self.from_zero = from_zero
        self.key_kind: type | None = None  # int or str, fixed by the first chunk
        self.value_kind: type | None = None  # float or int
        self._table: TypedHashTable | None = None
        self._ascii = True  # every str key so far is ASCII: the arena decodes in one piece
        self._key_bytes = 0  # sampled allocated bytes of str keys ...
        self._key_samples = 0  # ... over this many keys
        self._largest: tuple[int, Any] = (0, None)
        self._folded = 0
        self._destroyed = False

    # -- sizes ---------------------------------------------------------------------------------
    def _check_valid(self) -> None:
        if self._destroyed:
            raise DestroyedError("Map state is invalid from destructive sorting!")

    def __len__(self) -> int:
        self._check_valid()
        return 0 if self._table is None else self._table.num_groups

    def __bool__(self) -> bool:
        return len(self) > 0

    def __repr__(self) -> str:
        return f"TypedReduceMap(op={self.op}, keys={getattr(self.key_kind, '__name__', None)})"

    @property
    def last_fold_count(self) -> int:
        """Records folded by the last :meth:`fold_typed`."""
        return self._folded

    @property
    def largest_entry(self) -> tuple[int, Any]:
        """``(bytes, key)`` of the largest key seen (values are numbers)."""
        return self._largest

    @property
    def grow_threshold(self) -> int:
        """Groups the table holds before it doubles."""
        self._check_valid()
        return 0 if self._table is None else self._table.grow_at

    def growth_bytes(self) -> int:
        """Bytes the next doubling (and arena growth, for str keys) adds for a moment."""
        table = self._table
        if table is None:
            return 64 * 1024
        extra = table.bytes_after_growth() - table.nbytes
        if table.has_var and 2 * table.arena_used > table.arena.shape[0]:
            extra += table.arena.shape[0]
        return extra

    def _entry_bytes(self) -> int:
        if self.op == FK.OP_SUM_COUNT:  # a 2-tuple of a number and an int
            return _ENTRY_BYTES + _PAIR_BYTES
        return _ENTRY_BYTES

    def _key_object_bytes(self) -> int:
        if self.key_kind is str:
            return self._key_bytes // max(1, self._key_samples)
        return _INT_KEY_BYTES

    def estimate_size(self) -> int:
        """Bytes of the table plus its groups as Python objects (exact arrays, sampled keys)."""
        self._check_valid()
        table = self._table
        if table is None:
            return 0
        per_group = self._entry_bytes() + self._key_object_bytes()
        return table.nbytes + table.num_groups * per_group

    # -- folding -------------------------------------------------------------------------------
    def fold_typed(
        self, keys: Sequence[Any], values: Sequence[Any], combiners: bool = False
    ) -> int:
        """Fold as many records of the chunk as fit the typed path; returns their number.

        ``combiners``: ``values`` are combiners of the aggregator (a spill put back), not
        values — the same for ``add``/``min``/``max``; counts, or ``(sum, count)`` pairs, for
        ``OP_COUNT``/``OP_SUM_COUNT``. Either the whole chunk (it fits), none (a key or value
        type that does not fit), or the records before an ``int`` sum or count that would
        leave ``int64``. Fewer than all means the map must be handed over with
        :meth:`to_general` before anything else is folded.
        """
        self._check_valid()
        self._folded = 0
        n = len(keys)
        if n == 0:
            return 0
        states = self._states_arrays(values, n, combiners)
        if states is None:
            return 0
        prepared = self._keys_arrays(keys, n)
        if prepared is None:
            return 0
        return self._insert_and_fold(prepared, states, combiners)

    def fold_pairs(self, batch: PairArrays, combiners: bool = False) -> int:
        """:meth:`fold_typed` of a block of typed pairs, read from its arrays (no Python object
        per pair): all of it, none (keys or values of another type than this map's), or the
        pairs before an ``int`` sum or count that would leave ``int64``."""
        self._check_valid()
        self._folded = 0
        n = len(batch)
        if n == 0:
            return 0
        states = self._batch_states(batch, combiners)
        if states is None:
            return 0
        key_kind = str if batch.key_is_str else int
        if self.key_kind is not None and key_kind is not self.key_kind:
            return 0
        self.key_kind = key_kind
        if batch.int_keys is not None:
            ints = batch.int_keys
            words = ints.view(np.uint64).reshape(n, 1)
            prepared = (hash_array(ints), words, _EMPTY_I64, _EMPTY_U8)
        else:
            first = int(batch.offsets[0])
            offsets = batch.offsets - first
            data = batch.arena[first : first + int(offsets[-1])]
            if not batch.ascii_keys:
                self._ascii = False
            hashes = np.empty(n, dtype=np.uint64)
            _hash_var(offsets, data, hashes)
            self._sample_batch_keys(batch.slice(0, min(n, 8)), offsets, data)
            prepared = (hashes, np.empty((n, 0), dtype=np.uint64), offsets, data)
        return self._insert_and_fold(prepared, states, combiners)

    def _batch_states(self, batch: PairArrays, combiners: bool) -> tuple[np.ndarray, ...] | None:
        """The arrays the fold reads from a block's combiners, or ``None`` if they do not fit."""
        op = self.op
        kind = float if batch.states.dtype == np.float64 else int
        if op == FK.OP_COUNT and not combiners:
            self.value_kind = int
            return ()
        if op == FK.OP_COUNT:
            kind_needed: type | None = int
        else:
            kind_needed = self.value_kind
        if kind_needed is not None and kind is not kind_needed:
            return None
        pairs = op == FK.OP_SUM_COUNT and combiners
        if pairs != (batch.counts is not None):
            return None
        self.value_kind = kind
        if batch.counts is not None:
            return (batch.states, batch.counts)
        return (batch.states,)

    def _sample_batch_keys(self, head: PairArrays, offsets: np.ndarray, data: np.ndarray) -> None:
        """Size samples of a block's first keys, and its longest key, as :meth:`_sample_keys`."""
        getsizeof = sys.getsizeof
        for key in head.key_objects():
            self._key_bytes += allocated_size(getsizeof(key))
            self._key_samples += 1
        lengths = np.diff(offsets)
        longest = int(lengths.argmax())
        if int(lengths[longest]) > self._largest[0]:
            (key,) = decode_keys(None, offsets[longest : longest + 2], data, False)
            self._largest = (allocated_size(getsizeof(key)) + _ENTRY_BYTES, key)

    def _insert_and_fold(
        self,
        prepared: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        states: tuple[np.ndarray, ...],
        combiners: bool,
    ) -> int:
        hashes, words, offsets, data = prepared
        n = len(hashes)
        table = self._table_for()
        gids = np.empty(n, dtype=np.int64)
        groups_before = table.num_groups
        start = 0
        while True:
            start, status = table.insert(hashes, words, _EMPTY_NULLS, offsets, data, start, gids)
            if status == TK.DONE:
                break
            if status == TK.TABLE_FULL:
                table.grow()
            else:
                table.grow_arena(table.pending_var_bytes(offsets, start))
        done, next_new = self._fold(gids, states, combiners, groups_before)
        done = int(done)
        if done < n:
            self._valid_groups = int(next_new)
        self._folded = done
        return done

    def _fold(
        self, gids: np.ndarray, states: tuple[np.ndarray, ...], combiners: bool, next_new: int
    ) -> tuple[int, int]:
        payload = self._table.payload if self._table is not None else []
        op = self.op
        if op == FK.OP_COUNT:
            if combiners:
                return FK.fold_int(FK.OP_ADD, gids, states[0], payload[0], next_new)
            return FK.fold_count(gids, payload[0], next_new)
        if op == FK.OP_SUM_COUNT:
            counts_in = states[1] if combiners else _EMPTY_I64
            low, high = _INT64_BOUNDS if self.value_kind is int else _FLOAT_BOUNDS
            return FK.fold_sum_count(
                gids, states[0], counts_in, payload[0], payload[1], next_new, low, high
            )
        fold = FK.fold_float if self.value_kind is float else FK.fold_int
        return fold(op, gids, states[0], payload[0], next_new)

    def _states_arrays(
        self, values: Sequence[Any], n: int, combiners: bool
    ) -> tuple[np.ndarray, ...] | None:
        """The arrays the fold reads from ``values``, or ``None`` if they do not fit."""
        op = self.op
        if op == FK.OP_COUNT:
            if not combiners:
                self.value_kind = int  # the state is a count; values are not looked at
                return ()
            counts = _exact_array(values, n, int)
            if counts is None:
                return None
            self.value_kind = int
            return (counts,)
        if op == FK.OP_SUM_COUNT and combiners:
            tuple_count = operator.countOf(map(type, values), tuple)
            if tuple_count != n or operator.countOf(map(len, values), 2) != n:
                return None
            counts = _exact_array(list(map(_SECOND, values)), n, int)
            sums = self._values_array(list(map(_FIRST, values)), n)
            if counts is None or sums is None:
                return None
            return (sums, counts)
        array = self._values_array(values, n)
        if array is None:
            return None
        if self.from_zero and array.dtype == np.float64:
            array += 0.0  # 0 + v: -0.0 becomes 0.0, every other value (NaN too) stays itself
        return (array,)

    def _values_array(self, values: Sequence[Any], n: int) -> np.ndarray | None:
        kind = self.value_kind
        if kind is None:
            kind = type(values[0])
            if kind is not float and kind is not int:
                return None
        array = _exact_array(values, n, kind)
        if array is not None:
            self.value_kind = kind
        return array

    def _keys_arrays(
        self, keys: Sequence[Any], n: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """``(hashes, key words, var offsets, var bytes)`` of the chunk's keys, or ``None``."""
        kind = self.key_kind
        if kind is None:
            kind = type(keys[0])
            if kind is not int and kind is not str:
                return None
        if operator.countOf(map(type, keys), kind) != n:
            return None
        if kind is int:
            try:
                ints = np.fromiter(keys, dtype=np.int64, count=n)
            except OverflowError:
                return None
            self.key_kind = int
            return hash_array(ints), ints.view(np.uint64).reshape(n, 1), _EMPTY_I64, _EMPTY_U8
        lengths, offsets, data, ascii_keys = _str_key_arrays(keys, n)
        if not ascii_keys:
            self._ascii = False
        self.key_kind = str
        raw = data
        hashes = np.empty(n, dtype=np.uint64)
        _hash_var(offsets, raw, hashes)
        self._sample_keys(keys, lengths)
        return hashes, np.empty((n, 0), dtype=np.uint64), offsets, raw

    def _sample_keys(self, keys: Sequence[Any], lengths: list[int]) -> None:
        getsizeof = sys.getsizeof
        for key in keys[:8]:
            self._key_bytes += allocated_size(getsizeof(key))
        self._key_samples += min(8, len(keys))
        longest = max(lengths)
        if longest > self._largest[0]:
            key = keys[lengths.index(longest)]
            self._largest = (allocated_size(getsizeof(key)) + _ENTRY_BYTES, key)

    def _table_for(self) -> TypedHashTable:
        if self._table is None:
            is_int = self.key_kind is int
            state = np.dtype(np.float64 if self.value_kind is float else np.int64)
            payload = [(state, 0)]
            if self.op == FK.OP_SUM_COUNT:
                payload.append((np.dtype(np.int64), 0))  # the count
            self._table = TypedHashTable(
                1 if is_int else 0, 1, not is_int, payload, hash_is_key=is_int
            )
        return self._table

    # -- handing out ---------------------------------------------------------------------------
    def _groups(self) -> int:
        table = self._table
        if table is None:
            return 0
        return min(table.num_groups, getattr(self, "_valid_groups", table.num_groups))

    def _key_list(self, n: int) -> list[Any]:
        table = self._table
        assert table is not None
        is_str = self.key_kind is str
        int_keys = None if is_str else _key_bits(table, n)
        return decode_keys(int_keys, table.var_offsets[: n + 1], table.arena, self._ascii)

    def _lists(self) -> tuple[list[Any], list[Any]]:
        n = self._groups()
        if n == 0 or self._table is None:
            return [], []
        payload = self._table.payload
        values: list[Any] = payload[0][:n].tolist()
        if self.op == FK.OP_SUM_COUNT:
            values = list(zip(values, payload[1][:n].tolist(), strict=True))
        return self._key_list(n), values

    def _destroy(self) -> None:
        self._destroyed = True
        self._table = None

    def to_general(self) -> SizeTrackingAppendOnlyMap:
        """Destroy this map and return a general map holding its groups, in the same order."""
        self._check_valid()
        keys, values = self._lists()
        self._destroy()
        general = SizeTrackingAppendOnlyMap()
        general.fold(keys, values, _identity, _never)
        return general

    def destructive_arrays(self) -> tuple[list[Any], list[Any]]:
        """Destroy the map; its keys and states in order of first appearance."""
        self._check_valid()
        keys, values = self._lists()
        self._destroy()
        return keys, values

    def destructive_pair_slices(self, size: int = 16384) -> Iterator[PairArrays]:
        """Destroy the map; its groups in order of first appearance, ``size`` at a time, as
        :class:`~extagg.collection.pair_arrays.PairArrays` (views of the table, which the
        generator holds until it is done): no Python object per group (what a shuffle writer
        that partitions and pickles arrays takes)."""
        self._check_valid()
        table, n = self._table, self._groups()
        is_str, ascii_keys, pairs = self.key_kind is str, self._ascii, self.op == FK.OP_SUM_COUNT
        self._destroy()
        return _pair_slices(table, n, max(1, size), is_str, ascii_keys, pairs)

    def destructive_sort_order(self) -> tuple[np.ndarray, np.ndarray, list[Any], list[Any]]:
        """Destroy the map; ``(order hashes ascending, order, keys, values)`` as
        :meth:`~extagg.collection.AppendOnlyMap.destructive_sort_order` gives them."""
        self._check_valid()
        table = self._table
        if table is None:
            self._destroy()
            return np.empty(0, np.uint64), np.empty(0, np.int64), [], []
        assert self._groups() == table.num_groups, "a partial fold must go to_general first"
        keys, values = self._lists()
        hashes, gids = table.sort_by_hash()
        order = gids.astype(np.int64) - 1
        hashes = hashes.copy()
        self._destroy()
        return hashes, order, keys, values

    def destructive_sorted_rows(self) -> TypedSortedRows:
        """Destroy the map; its groups in spill order (as :meth:`destructive_sort_order`) as a
        block that a run file stores without making a Python object per group."""
        self._check_valid()
        table = self._table
        assert table is not None and self._groups() == table.num_groups, "to_general first"
        n = table.num_groups
        hashes, gids = table.sort_by_hash()
        order = gids.astype(np.int64) - 1
        pairs = self.op == FK.OP_SUM_COUNT
        rows = TypedSortedRows(
            hashes.copy(),
            order,
            key_bits=_key_bits(table, n),
            var_offsets=table.var_offsets[: n + 1],
            arena=table.arena,
            state_bits=table.payload[0][:n].view(np.uint64),
            count_bits=table.payload[1][:n].view(np.uint64) if pairs else None,
            key_is_str=self.key_kind is str,
            value_is_float=self.value_kind is float,
            row_bytes=self._entry_bytes() + self._key_object_bytes(),
            ascii_keys=self._ascii,
        )
        self._destroy()  # the slot array goes; the block holds the key and state arrays
        return rows


class TypedSortedRows:
    """Hash-sorted groups of a destroyed :class:`TypedReduceMap`, spilled from its arrays.

    A run file stores a batch of the generic engine as ``pickle.dumps((keys, values))``
    (:class:`~extagg.spill.codecs.ObjectCodec`); :meth:`pickled_rows` writes those very bytes
    in compiled code (:func:`extagg.generic._typed_fold_kernels.pickle_rows`), so a spill of
    the typed path neither decodes a ``str`` nor boxes a number per group, and the merge reads
    the run as any other. ``slice`` and ``hashes`` are what the run writer uses; ``nbytes``
    estimates the rows as Python objects once read (for the batch size); :meth:`lists` gives
    them back as objects (a spill that failed puts them back into the map).
    """

    __slots__ = (
        "hashes", "order", "_keys", "_offsets", "_arena", "_states", "_counts", "_key_is_str",
        "_value_is_float", "_row_bytes", "_ascii",
    )  # fmt: skip

    def __init__(
        self,
        hashes: np.ndarray,
        order: np.ndarray,
        *,
        key_bits: np.ndarray,
        var_offsets: np.ndarray,
        arena: np.ndarray,
        state_bits: np.ndarray,
        count_bits: np.ndarray | None = None,
        key_is_str: bool,
        value_is_float: bool,
        row_bytes: int,
        ascii_keys: bool,
    ) -> None:
        self.hashes = hashes
        self.order = order
        self._keys = key_bits
        self._offsets = var_offsets
        self._arena = arena
        self._states = state_bits
        self._counts = count_bits  # (sum, count) states: the counts
        self._key_is_str = key_is_str
        self._value_is_float = value_is_float
        self._row_bytes = row_bytes
        self._ascii = ascii_keys

    def __len__(self) -> int:
        return len(self.order)

    def slice(self, start: int, stop: int) -> TypedSortedRows:
        """Rows ``start:stop`` (views; the arrays are shared)."""
        part = TypedSortedRows.__new__(TypedSortedRows)
        for name in self.__slots__:
            setattr(part, name, getattr(self, name))
        part.hashes = self.hashes[start:stop]
        part.order = self.order[start:stop]
        return part

    def nbytes(self) -> int:
        """Estimated bytes of the rows as Python objects (a key and a number each)."""
        n = len(self.order)
        return int(self.hashes.nbytes + 2 * (56 + 8 * n) + self._row_bytes * n)

    def pickled_rows(self) -> bytes:
        """``pickle.dumps((keys, values))`` of these rows, written from the arrays."""
        order = self.order
        key_bytes = 0
        if self._key_is_str:
            key_bytes = int((self._offsets[order + 1] - self._offsets[order]).sum())
        pairs = self._counts is not None
        out = np.empty(FK.pickled_size(len(order), key_bytes, pairs), dtype=np.uint8)
        counts = self._counts if self._counts is not None else _EMPTY_U64
        end = FK.pickle_rows(
            order, self._key_is_str, self._keys, self._offsets, self._arena,
            self._value_is_float, self._states, pairs, counts, out,
        )  # fmt: skip
        return out[: int(end)].tobytes()

    def lists(self) -> tuple[list[Any], list[Any]]:
        """Keys and values of every group of the map, in order of first appearance."""
        n = len(self._states)
        int_keys = None if self._key_is_str else self._keys
        keys = decode_keys(int_keys, self._offsets, self._arena, self._ascii)
        kind = np.float64 if self._value_is_float else np.int64
        values: list[Any] = self._states[:n].view(kind).tolist()
        if self._counts is not None:
            counts = self._counts[:n].view(np.int64).tolist()
            values = list(zip(values, counts, strict=True))
        return keys, values


def scalar_sorted_rows(
    hashes: np.ndarray,
    order: np.ndarray,
    keys: list[Any],
    values: list[Any],
    int_keys: np.ndarray | None,
) -> TypedSortedRows | None:
    """The hash-sorted rows of a general map (``destructive_sort_order``'s result) as a block
    written from arrays, when every key is an exact ``int`` fitting ``int64`` (``int_keys``,
    the map's copy of them) or every key an exact ``str``, and every combiner an exact
    ``float`` or every one an exact ``int`` fitting ``int64``; else ``None``.

    Why: the rows of a spill are written in hash order, which visits the key and combiner
    objects in random memory order, three times each (gathered, pickled, released) — on this
    kind of machine a cache and TLB miss apiece, 1–3 µs per row. Here each object is read
    once in insertion order into an array; the run's pickle bytes are then written from the
    arrays (:meth:`TypedSortedRows.pickled_rows`), so the run reads back as the same objects.
    The arrays take 16 bytes per row (int keys: 8, the map's own copy), within what a sort
    is granted (the map's hash and slot arrays are freed by then); the objects can be freed.
    """
    n = len(keys)
    if n == 0 or len(values) != n:
        return None
    kind = type(values[0])
    if kind is not float and kind is not int:
        return None
    states = _exact_array(values, n, kind)
    if states is None:
        return None
    if int_keys is not None and len(int_keys) == n:
        key_bits, offsets, arena, ascii_keys, is_str = (
            int_keys.view(np.uint64), _EMPTY_I64, _EMPTY_U8, True, False,
        )  # fmt: skip
    elif type(keys[0]) is str and operator.countOf(map(type, keys), str) == n:
        offsets, arena, ascii_keys = _str_arena(keys, n)
        key_bits, is_str = _EMPTY_U64, True
    else:
        return None
    step = max(1, n // 16)
    sample = order[::step][:16].tolist()
    getsizeof = sys.getsizeof
    per_row = sum(getsizeof(keys[i]) + getsizeof(values[i]) for i in sample) // len(sample)
    return TypedSortedRows(
        hashes,
        order,
        key_bits=key_bits,
        var_offsets=offsets,
        arena=arena,
        state_bits=states.view(np.uint64),
        key_is_str=is_str,
        value_is_float=kind is float,
        row_bytes=per_row + 16,
        ascii_keys=ascii_keys,
    )


#: keys joined and encoded at a time by :func:`_str_arena` (bounds its temporary copies)
_ARENA_CHUNK = 8192


def _str_arena(keys: list[Any], n: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(byte offsets, UTF-8 bytes, all ASCII)`` of many exact ``str`` keys, built a chunk of
    keys at a time into one array: beside the result, only one chunk's joined ``str`` and its
    bytes exist at once (a spill's working memory stays within what it is granted)."""
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, keys), dtype=np.int64, count=n), out=offsets[1:])
    arena = np.empty(int(offsets[-1]), dtype=np.uint8)
    for start in range(0, n, _ARENA_CHUNK):
        stop = min(n, start + _ARENA_CHUNK)
        data = "".join(keys[start:stop]).encode("utf-8", "surrogatepass")
        begin, end = int(offsets[start]), int(offsets[stop])
        if len(data) != end - begin:  # not all ASCII: byte offsets differ from str lengths
            _, offsets, arena, ascii_keys = _str_key_arrays(keys, n)
            return offsets, arena, ascii_keys
        arena[begin:end] = np.frombuffer(data, dtype=np.uint8)
    return offsets, arena, True


def _str_key_arrays(keys: Sequence[Any], n: int) -> tuple[list[int], np.ndarray, np.ndarray, bool]:
    """``(str lengths, byte offsets, UTF-8 bytes, all ASCII)`` of exact ``str`` keys (lone
    surrogates kept, ``surrogatepass``)."""
    lengths = list(map(len, keys))
    joined = "".join(keys)
    data = joined.encode("utf-8", "surrogatepass")
    ascii_keys = len(data) == len(joined)
    byte_lengths = lengths
    if not ascii_keys:  # byte lengths differ from str lengths
        encoded = [k.encode("utf-8", "surrogatepass") for k in keys]
        byte_lengths = list(map(len, encoded))
        data = b"".join(encoded)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(byte_lengths, dtype=np.int64, count=n), out=offsets[1:])
    return lengths, offsets, np.frombuffer(data, dtype=np.uint8), ascii_keys


def _exact_array(values: Sequence[Any], n: int, kind: type) -> np.ndarray | None:
    """``values`` as a ``float64``/``int64`` array if every one is exactly of type ``kind``
    (and fits ``int64``), else ``None``."""
    if operator.countOf(map(type, values), kind) != n:
        return None
    if kind is float:
        return np.fromiter(values, dtype=np.float64, count=n)
    try:
        return np.fromiter(values, dtype=np.int64, count=n)
    except OverflowError:
        return None


def _pair_slices(
    table: TypedHashTable | None, n: int, size: int, is_str: bool, ascii_keys: bool, pairs: bool
) -> Iterator[PairArrays]:
    """:meth:`TypedReduceMap.destructive_pair_slices`' generator (holds the table until done)."""
    if table is None or n == 0:
        return
    states = table.payload[0]
    counts = table.payload[1] if pairs else None
    for start in range(0, n, size):
        stop = min(n, start + size)
        part_counts = None if counts is None else counts[start:stop]
        if is_str:
            offsets = table.var_offsets[start : stop + 1]
            yield PairArrays(
                None, offsets, table.arena, ascii_keys, states[start:stop], part_counts
            )
        else:
            keys = table.key_words[start:stop, 0].view(np.int64)
            yield PairArrays(keys, None, None, True, states[start:stop], part_counts)


def _key_bits(table: TypedHashTable, n: int) -> np.ndarray:
    """The int64 keys of groups ``0..n-1`` as ``uint64`` words (empty for str keys)."""
    if table.key_words.shape[1] == 0:
        return _EMPTY_U64
    return table.key_words[:n, 0]


def _hash_var(offsets: np.ndarray, data: np.ndarray, out: np.ndarray) -> None:
    hash_var_column(offsets, data, _EMPTY_BOOL, out)  # type: ignore[no-untyped-call]

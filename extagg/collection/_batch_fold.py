"""The batch fold of :class:`~extagg.collection.append_only_map.AppendOnlyMap` (its hot path).

A batch of records is hashed at once (ints vectorised), probed by one numba kernel call that
adds an entry for every new hash and matches the rest by hash, then the combiners run in one
Python loop over the entry numbers. Hash equality is not key equality: matches are confirmed in
one C-level tuple comparison (or, between exact ints equal to their hash, by the kernel), and a
mismatching record continues its probe in Python. Split out of ``append_only_map`` for size; the
mixin works on that module's layout (``_table``, ``_hashes``, ``_keys``, ``_values``, ``_size``).
"""

from __future__ import annotations

import bisect
import operator
import sys
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from extagg.collection import _kernels
from extagg.collection._kernels import NEW, UNCONFIRMED
from extagg.errors import BadKeyError

__all__ = ["UNCREATED", "BatchFoldMixin", "hash_batch", "hash_key", "int_tag", "python_int_hashes"]

_MODULUS = sys.hash_info.modulus
_INT_HASH_IS_VALUE = sys.hash_info.width == 64 and _MODULUS == (1 << 61) - 1


class _Uncreated:
    """Placeholder value of an entry whose combiner is being created (never visible outside)."""

    __slots__ = ()


UNCREATED = _Uncreated()


def unhashable_error(key: Any, err: TypeError) -> TypeError:
    return TypeError(
        f"unhashable key of type {type(key).__name__}: AppendOnlyMap keys must be hashable ({err})"
    )


def key_error(index: int, key: Any, err: BaseException, doing: str = "hashing it") -> BadKeyError:
    """The :class:`~extagg.errors.BadKeyError` of record ``index`` whose key failed."""
    kind = type(key).__name__
    if doing == "hashing it" and isinstance(err, TypeError):
        reason = f"unhashable key of type {kind}: AppendOnlyMap keys must be hashable ({err})"
    else:
        reason = f"key of type {kind}: {doing} raised {type(err).__name__}: {err}"
    failure = BadKeyError(index, key, reason)
    failure.__cause__ = err
    return failure


def first_hash_failure(keys: Sequence[Any]) -> tuple[int, BaseException] | None:
    """The first key whose ``hash()`` raises, with its exception (``None`` if all hash)."""
    for i, key in enumerate(keys):
        try:
            hash(key)
        except Exception as err:
            return i, err
    return None


def hash_key(key: Any) -> int:
    try:
        return hash(key)
    except TypeError as err:
        raise unhashable_error(key, err) from err


def int_tag(key: Any, h: int) -> int:
    """1 when ``key`` is an exact int equal to its hash (equal hashes then mean equal keys)."""
    return 1 if type(key) is int and h == key else 0


def python_int_hashes(ints: np.ndarray) -> np.ndarray:
    """``hash(x)`` of every ``int64`` value, vectorised: ``|x| mod P`` with the sign of ``x``
    (``P = 2**61 - 1``), ``-1`` becoming ``-2`` (64-bit CPython's integer hash)."""
    bits = ints.view(np.uint64)
    negative = ints < 0
    magnitude = np.where(negative, np.uint64(0) - bits, bits)  # |x|, also for -2**63
    p = np.uint64(_MODULUS)
    reduced = (magnitude & p) + (magnitude >> np.uint64(61))
    reduced = np.where(reduced >= p, reduced - p, reduced).view(np.int64)
    out = np.where(negative, -reduced, reduced)
    out[out == -1] = -2
    return out


def hash_batch(keys: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``hash()`` of every key as ``int64``, its int tag as ``uint8``, and the keys themselves as
    ``int64`` when all are exact ints that fit (else ``None``). A batch of plain ints is hashed
    vectorised: ``hash(x) == x`` for ``-P < x < P`` (``P = 2**61 - 1``) but ``x == -1``.
    """
    n = len(keys)
    if (
        _INT_HASH_IS_VALUE
        and n
        and type(keys[0]) is int
        and operator.countOf(map(type, keys), int) == n
    ):
        try:
            ints = np.fromiter(keys, dtype=np.int64, count=n)
        except OverflowError:
            pass
        else:
            tags = (ints < _MODULUS) & (ints > -_MODULUS) & (ints != -1)
            hashes = ints if tags.all() else python_int_hashes(ints)
            return hashes, tags.view(np.uint8), ints
    try:
        hashes = np.fromiter(map(hash, keys), dtype=np.int64, count=n)
    except Exception as err:
        failure = first_hash_failure(keys)
        if failure is None:
            raise
        index, key_err = failure
        raise key_error(index, keys[index], key_err) from err
    return hashes, np.zeros(n, dtype=np.uint8), None


def first_mismatch(
    table_keys: list[Any], entries: list[int], keys: Sequence[Any]
) -> tuple[int, BaseException | None]:
    """Index of the first record whose entry's key differs from its own (``len`` if none),
    and the exception if comparing them raised (a key's ``__eq__``)."""
    if len(entries) > 1:
        stored = operator.itemgetter(*entries)(table_keys)
    else:
        stored = (table_keys[entries[0]],)
    try:
        if stored == tuple(keys):  # element-wise identity-or-== in C
            return len(entries), None
    except Exception:
        pass
    for i, (a, b) in enumerate(zip(stored, keys)):
        try:
            if not (a is b or a == b):
                return i, None
        except Exception as err:
            return i, err
    return len(entries), None


class BatchFoldMixin:
    """``fold`` for AppendOnlyMap (see the module docstring)."""

    __slots__ = ()
    _table: np.ndarray
    _hashes: np.ndarray
    _int_keys: np.ndarray
    _is_int: np.ndarray
    _keys: list[Any]
    _values: list[Any]
    _size: int
    _grow_threshold: int
    _shift: int
    _mask: int
    _folded: int

    def fold(
        self,
        keys: Sequence[Hashable],
        values: Sequence[Any],
        create_combiner: Callable[[Any], Any],
        merge_value: Callable[[Any, Any], Any],
    ) -> None:
        """Fold records ``(keys[i], values[i])`` in order into the map (Spark's combineByKey).

        A new key gets ``create_combiner(value)``, a present one ``merge_value(old, value)``:
        exactly these calls, in record order. If a combiner raises, or a key cannot be hashed or
        compared (:class:`~extagg.errors.BadKeyError`, naming the record), the records before it
        stay folded, it and the ones after it are not, and the map stays consistent;
        :attr:`last_fold_count` says how many were folded. Pass lists (or tuples) for speed.
        """
        self._check_valid()
        self._folded = 0
        n = len(keys)
        if len(values) != n:
            raise ValueError(f"fold needs one value per key: got {n} keys, {len(values)} values")
        if n == 0:
            return
        try:
            hashes, tags, ints = hash_batch(keys)
        except BadKeyError as failure:
            if failure.index:  # fold the records before the bad key, then report it
                self.fold(keys[: failure.index], values[: failure.index], create_combiner,
                          merge_value)  # fmt: skip
            self._folded = failure.index
            raise
        entries = np.empty(n, dtype=np.int64)
        status = np.empty(n, dtype=np.uint8)
        start = 0
        while start < n:
            self._folded = start
            size_before = self._size
            stop, self._size, unconfirmed = _kernels.probe_batch(
                self._table,
                self._hashes,
                hashes,
                tags,
                start,
                size_before,
                self._grow_threshold,
                self._shift,
                self._mask,
                entries,
                status,
            )
            if stop == start:  # the next record is a new key and the table is full
                self._grow_table()
                continue
            try:
                start = self._apply_probed(
                    keys,
                    values,
                    hashes,
                    ints,
                    entries[start:stop],
                    status[start:stop],
                    start,
                    size_before,
                    unconfirmed,
                    create_combiner,
                    merge_value,
                )
            except BaseException:  # a combiner, a key's __eq__, or an interrupt
                self._drop_uncreated(size_before)
                raise
        self._folded = n

    @property
    def last_fold_count(self) -> int:
        """Records of the last :meth:`fold` call that were folded (all of them unless it
        raised; then exactly those before the failing record)."""
        return self._folded

    def _drop_uncreated(self, size_before: int) -> None:
        """Drop the entries the kernel added whose key or combiner is missing.

        They are always the newest (keys are appended and combiners created in record order),
        so truncating restores a consistent map holding every record folded before the failure.
        """
        keep = min(self._size, len(self._keys), len(self._values))
        values, uncreated = self._values, UNCREATED
        while keep > size_before and values[keep - 1] is uncreated:
            keep -= 1
        self._truncate(keep)

    def _apply_probed(
        self,
        keys: Sequence[Hashable],
        values: Sequence[Any],
        hashes: np.ndarray,
        ints: np.ndarray | None,
        entry_array: np.ndarray,
        chunk_status: np.ndarray,
        start: int,
        size_before: int,
        unconfirmed: int,
        create_combiner: Callable[[Any], Any],
        merge_value: Callable[[Any, Any], Any],
    ) -> int:
        """Apply the combiners to the records probed from ``start``; return the next record.

        The kernel added an entry per new hash and matched the rest by hash. The new keys are
        appended first so repeated keys within the chunk can be confirmed; then, if any match
        is unconfirmed, the stored keys are compared with the records' keys in one C-level tuple
        comparison. At the first mismatch (equal hashes, unequal keys) the entries added after
        it are dropped, the records before it are applied, and the mismatching record continues
        its probe in Python; the caller re-probes the rest. On an exception the caller drops
        the entries left without a key or combiner (:meth:`_drop_uncreated`).
        """
        table_keys, table_values = self._keys, self._values
        chunk_entries = entry_array.tolist()
        count = len(chunk_entries)
        chunk_keys = keys[start : start + count]
        chunk_ints = None if ints is None else ints[start : start + count]
        added = self._size - size_before
        new_positions: list[int] = []
        if added:
            new_array = np.flatnonzero(chunk_status == NEW)
            new_positions = new_array.tolist()
            table_keys.extend([chunk_keys[i] for i in new_positions])
            table_values.extend([UNCREATED] * added)
            if chunk_ints is not None:  # keep a copy of int keys: matches confirm in NumPy
                self._int_keys[size_before : self._size] = chunk_ints[new_array]
            self._is_int[size_before : self._size] = chunk_ints is not None
        end = count
        eq_error: BaseException | None = None
        if unconfirmed and not (
            chunk_ints is not None and self._ints_confirm(entry_array, chunk_status, chunk_ints)
        ):
            end, eq_error = first_mismatch(table_keys, chunk_entries, chunk_keys)
            if end < count:
                self._truncate(size_before + bisect.bisect_left(new_positions, end))
        chunk_values = iter(values[start : start + end])
        if end > 1:  # gather in C first: the loop then finds the entries in cache
            operator.itemgetter(*(chunk_entries if end == count else chunk_entries[:end]))(
                table_values
            )
        try:
            if added:
                is_new = NEW
                for e, st, v in zip(chunk_entries, chunk_status.tolist(), chunk_values):
                    if st == is_new:
                        table_values[e] = create_combiner(v)
                    else:
                        table_values[e] = merge_value(table_values[e], v)
            else:
                for e, v in zip(chunk_entries, chunk_values):
                    table_values[e] = merge_value(table_values[e], v)
        except BaseException:
            # the failing record was taken from the iterator: the ones before it are folded
            self._folded = start + end - operator.length_hint(chunk_values) - 1
            raise
        self._after_updates(end)
        if end == count:
            return start + count
        record = start + end
        self._folded = record
        key, value, h = keys[record], values[record], int(hashes[record])
        if eq_error is not None:
            raise key_error(record, key, eq_error, "comparing it with an equal-hash key")
        try:
            entry = self._locate(key, h)
        except Exception as err:
            raise key_error(record, key, err, "comparing it with an equal-hash key") from err
        if entry >= 0:
            table_values[entry] = merge_value(table_values[entry], value)
        else:
            self._insert_new(key, h, create_combiner(value), ~entry)
        self._after_updates(1)
        return record + 1

    def _ints_confirm(
        self, entry_array: np.ndarray, chunk_status: np.ndarray, chunk_ints: np.ndarray
    ) -> bool:
        """Whether every hash match of an all-int chunk is a key match, decided on the entries'
        int-key copies (exact ints equal exactly when their values are); ``False`` sends the
        chunk to the Python comparison, which finds the first mismatch."""
        matched = np.flatnonzero(chunk_status == UNCONFIRMED)
        found = entry_array[matched]
        return bool(
            self._is_int[found].all() and np.array_equal(self._int_keys[found], chunk_ints[matched])
        )

    def _after_updates(self, n: int) -> None:
        """Hook: ``n`` records were folded (the size-tracking subclass counts them)."""

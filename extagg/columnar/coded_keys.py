"""Dictionary-encoded key columns folded by their codes: hash the distinct keys, not every row.

A Parquet column written with dictionary pages (the usual for low-cardinality strings: TPC-H's
``l_returnflag``) can be read as an Arrow ``DictionaryArray``: per row a small integer code,
the values once. When every key column of a chunk comes so, :class:`CodedKeys` combines the
codes of a row into one integer (mixed radix, a null as one more code), finds the combinations
present in the chunk (a ``bincount``), and gives the key columns of those few combinations
(:meth:`CodedKeys.present`); the aggregator inserts only them into its table and maps every
row's combination to its group id with one gather. The strings of a key are then never
decoded, hashed or compared per row.

Only when the combinations possible are few (at most :func:`max_combinations` of a chunk's
rows): the temporaries (a count and a group id per combination) are then no larger than the
per-row key encoding they replace. Otherwise, or when the table cannot take every present
combination without growing, the aggregator decodes the keys (:meth:`CodedKeys.decode`) and
folds the chunk as any other.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from extagg.columnar._key_kernels import combine_codes, lookup_groups
from extagg.columnar.columns import Column, to_column

__all__ = ["CODED_ROW_BYTES", "CodedKeys", "CodedLookup", "coded_keys", "max_combinations"]

#: combinations always allowed, whatever the chunk's rows (a few KiB of temporaries)
MIN_COMBINATIONS = 1 << 10
#: temporaries a row folded by its keys' codes needs, beyond its converted columns: the
#: combination number, a column's codes widened, the group id, and (at most one per row) a
#: count and a group id per combination (8 bytes each)
CODED_ROW_BYTES = 40
#: a lookup of at most this many combinations, and dictionaries of at most
#: :data:`KEPT_DICTIONARY_BYTES`, are kept from one batch to the next (a few KiB)
KEPT_COMBINATIONS = 1 << 10
KEPT_DICTIONARY_BYTES = 1 << 14


def max_combinations(rows: int) -> int:
    """The most key combinations a chunk of ``rows`` rows is folded by codes with."""
    return max(MIN_COMBINATIONS, rows)


@dataclass
class CodedKeys:
    """The key columns of a run of rows as dictionary arrays (one per key, in key order)."""

    names: list[str]
    arrays: list[pa.DictionaryArray]

    def __len__(self) -> int:
        return len(self.arrays[0])

    def slice(self, lo: int, hi: int) -> CodedKeys:
        """Rows ``lo..hi`` (zero-copy)."""
        if lo == 0 and hi == len(self):
            return self
        return CodedKeys(self.names, [a.slice(lo, hi - lo) for a in self.arrays])

    def decode(self) -> dict[str, Column]:
        """The key columns decoded, as :func:`~extagg.columnar.columns.to_columns` gives them."""
        return {name: to_column(name, arr) for name, arr in zip(self.names, self.arrays)}

    def dictionaries(self) -> dict[str, Column]:
        """Each key's dictionary as a column (its values' type is the key column's type)."""
        return {name: to_column(name, arr.dictionary) for name, arr in zip(self.names, self.arrays)}

    def combinations(self) -> tuple[np.ndarray, int] | None:
        """Each row's combination number (``int64``) and how many there can be; ``None`` when
        there can be more than :func:`max_combinations` of the rows."""
        n = len(self)
        bases = []
        total = 1
        for arr in self.arrays:
            bases.append(_base(arr))
            total *= bases[-1]
            if total > max_combinations(n):
                return None
        combo = np.empty(n, dtype=np.int64)
        for i, (arr, base) in enumerate(zip(self.arrays, bases)):
            valid = _valid(arr) if arr.null_count else _NO_MASK
            combine_codes(combo, _codes(arr), valid, base, i == 0)
        return combo, total

    def group_ids(self, combo: np.ndarray, lookup: np.ndarray) -> tuple[np.ndarray, int]:
        """Each row's group id by ``lookup`` (-1: none yet) and how many rows have none."""
        gids = np.empty(len(combo), dtype=np.int64)
        return gids, int(lookup_groups(combo, lookup, gids))

    def missing(self, combo: np.ndarray, total: int, lookup: np.ndarray) -> np.ndarray:
        """The combinations present in ``combo`` that ``lookup`` has no group for (-1),
        ascending."""
        counts = np.bincount(combo, minlength=total)
        found = np.flatnonzero(counts)
        return found[lookup[found] < 0]

    def key_columns(self, found: np.ndarray) -> dict[str, Column]:
        """The key columns of the combinations ``found`` (one row each)."""
        cols: dict[str, Column] = {}
        stride = int(np.prod([_base(arr) for arr in self.arrays], dtype=np.int64))
        rest = found
        for name, arr in zip(self.names, self.arrays):
            stride //= _base(arr)
            index = rest // stride
            rest = rest - index * stride
            mask = index >= len(arr.dictionary) if arr.null_count else None
            indices = pa.array(index, type=pa.int64(), mask=mask)
            cols[name] = to_column(name, arr.dictionary.take(indices))
        return cols


def _base(arr: pa.DictionaryArray) -> int:
    """Codes of a key column in the combination number: its dictionary's, one more for null."""
    return max(1, len(arr.dictionary) + (1 if arr.null_count else 0))


#: dictionary sets a :class:`CodedLookup` keeps at once: a CSV parser builds each block's
#: dictionaries in the order the values first appear there, so the blocks of a file cycle
#: through a few orders of the same values (TPC-H Q1 on SF1 CSV at 26 MiB, 555 KiB blocks:
#: 1 110 of 1 350 blocks came with another order than the last one's, 9 with one not among
#: the last 16)
KEPT_DICTIONARY_SETS = 16


class CodedLookup:
    """The group id of each key combination of the dictionaries seen lately (-1: none yet),
    for the last :data:`KEPT_DICTIONARY_SETS` sets of dictionaries, valid while the table
    they were inserted in holds its groups: the same table object and no spill since (a
    spill empties it). At most :data:`KEPT_COMBINATIONS` combinations and
    :data:`KEPT_DICTIONARY_BYTES` of dictionaries kept in all."""

    def __init__(self) -> None:
        self._table: Any = None
        self._spills = -1
        #: (dictionaries, which have nulls, lookup), the most recently used last
        self._kept: list[tuple[list[pa.Array], list[bool], np.ndarray]] = []

    def get(self, table: Any, spills: int, coded: CodedKeys, total: int) -> np.ndarray:
        """The lookup for ``coded``'s combinations in ``table`` after ``spills`` spills: one
        kept for the same dictionaries, else a new one with no groups."""
        dictionaries = [arr.dictionary for arr in coded.arrays]
        nulls = [bool(arr.null_count) for arr in coded.arrays]
        if self._table is None or self._table() is not table or self._spills != spills:
            self.clear()
        for i in range(len(self._kept) - 1, -1, -1):
            kept, kept_nulls, lookup = self._kept[i]
            if (
                len(lookup) == total
                and kept_nulls == nulls
                and all(a is b or a.equals(b) for a, b in zip(dictionaries, kept))
            ):
                if i != len(self._kept) - 1:
                    self._kept.append(self._kept.pop(i))
                return lookup
        lookup = np.full(total, -1, dtype=np.int64)
        size = sum(d.nbytes for d in dictionaries)
        if total <= KEPT_COMBINATIONS and size <= KEPT_DICTIONARY_BYTES:
            self._table = weakref.ref(table)
            self._spills = spills
            self._kept.append((dictionaries, nulls, lookup))
            while len(self._kept) > KEPT_DICTIONARY_SETS or (
                sum(len(e[2]) for e in self._kept) > KEPT_COMBINATIONS
                or sum(d.nbytes for e in self._kept for d in e[0]) > KEPT_DICTIONARY_BYTES
            ):
                self._kept.pop(0)
        return lookup  # else a chunk's temporary (in CODED_ROW_BYTES): not kept

    def clear(self) -> None:
        """Keep nothing."""
        self._table = None
        self._kept = []


def _codes(arr: pa.DictionaryArray) -> np.ndarray:
    """The codes of ``arr`` in their own integer type, zero-copy (a null's code is whatever
    its slot holds)."""
    indices = arr.indices
    buf = indices.buffers()[1]
    if buf is None:
        return np.zeros(len(arr), dtype=np.int64)
    dtype = np.dtype(indices.type.to_pandas_dtype())
    return np.frombuffer(buf, dtype=dtype)[indices.offset : indices.offset + len(indices)]


_NO_MASK = np.zeros(0, dtype=np.bool_)


def _valid(arr: pa.Array) -> np.ndarray:
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)


def coded_keys(batch: pa.RecordBatch, keys: Sequence[str]) -> CodedKeys | None:
    """The key columns of ``batch`` as :class:`CodedKeys` when every one is a dictionary array
    of (signed or unsigned) integer codes; else ``None``."""
    if not keys:
        return None
    arrays = []
    for name in keys:
        index = batch.schema.get_field_index(name)
        if index < 0:
            return None
        arr = batch.column(index)
        if not pa.types.is_dictionary(arr.type) or not pa.types.is_integer(arr.type.index_type):
            return None
        arrays.append(arr)
    return CodedKeys(list(keys), arrays)

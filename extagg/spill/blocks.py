"""Blocks: hash-sorted rows as they flow through spill files and the merge.

Both engines spill and merge the same shape of data — a ``uint64`` hash per row, ascending — and
differ only in how the rest of a row is held: Python objects (:class:`ObjectBlock`) or NumPy
columns (:class:`ColumnBlock`). The run-file format and the merge only rely on ``hashes``,
``len``, ``slice`` and ``concat``.
"""

from __future__ import annotations

import sys
from typing import Any, Union

import numpy as np

__all__ = ["ObjectBlock", "IntKeyBlock", "PermutedObjectBlock", "ColumnBlock", "Block"]

_EMPTY_HASHES = np.empty(0, dtype=np.uint64)


class ObjectBlock:
    """Rows of the generic engine: ``hashes[i]`` is the order hash of ``keys[i]``."""

    __slots__ = ("hashes", "keys", "values")

    def __init__(self, hashes: np.ndarray, keys: list[Any], values: list[Any]) -> None:
        if not (len(hashes) == len(keys) == len(values)):
            raise ValueError(
                f"block columns differ in length: {len(hashes)} hashes, {len(keys)} keys, "
                f"{len(values)} values"
            )
        self.hashes = hashes
        self.keys = keys
        self.values = values

    def __len__(self) -> int:
        return len(self.keys)

    def slice(self, start: int, stop: int) -> ObjectBlock:
        return ObjectBlock(self.hashes[start:stop], self.keys[start:stop], self.values[start:stop])

    def tail(self, start: int) -> ObjectBlock:
        return self.slice(start, len(self.keys))

    @staticmethod
    def empty() -> ObjectBlock:
        return ObjectBlock(_EMPTY_HASHES, [], [])

    @staticmethod
    def concat(blocks: list[ObjectBlock]) -> ObjectBlock:
        if len(blocks) == 1:
            return blocks[0]
        keys: list[Any] = []
        values: list[Any] = []
        for block in blocks:
            keys.extend(block.keys)
            values.extend(block.values)
        hashes = np.concatenate([b.hashes for b in blocks]) if blocks else _EMPTY_HASHES
        return ObjectBlock(hashes, keys, values)

    def nbytes(self) -> int:
        """A cheap estimate: the arrays and lists plus a sampled per-row object size."""
        n = len(self.keys)
        if n == 0:
            return 0
        step = max(1, n // 16)
        sample = range(0, n, step)
        per_row = sum(
            sys.getsizeof(self.keys[i]) + sys.getsizeof(self.values[i]) for i in sample
        ) / len(sample)
        return int(self.hashes.nbytes + 2 * (56 + 8 * n) + per_row * n)


class IntKeyBlock(ObjectBlock):
    """Rows of the generic engine whose keys are plain ``int`` (``int64``) and combiners all
    ``float`` or all ``int`` (``int64``), held as arrays: what a run batch of a lambda sum
    decodes to (:class:`~extagg.spill.codecs.ObjectCodec`) with no Python object per row.

    ``keys`` and ``values`` are built as lists on each access (the same ints and floats
    unpickling would give); the generic combine reads ``int_keys`` and ``numbers`` directly.
    """

    __slots__ = ("int_keys", "numbers")

    def __init__(self, hashes: np.ndarray, int_keys: np.ndarray, numbers: np.ndarray) -> None:
        if not (len(hashes) == len(int_keys) == len(numbers)):
            raise ValueError("int-key block columns differ in length")
        self.hashes = hashes
        self.int_keys = int_keys
        self.numbers = numbers

    @property
    def keys(self) -> list[Any]:  # type: ignore[override]
        """The keys as Python ints (a new list)."""
        return list(self.int_keys.tolist())

    @property
    def values(self) -> list[Any]:  # type: ignore[override]
        """The combiners as Python floats or ints (a new list)."""
        return list(self.numbers.tolist())

    def __len__(self) -> int:
        return len(self.hashes)

    def slice(self, start: int, stop: int) -> IntKeyBlock:
        return IntKeyBlock(
            self.hashes[start:stop], self.int_keys[start:stop], self.numbers[start:stop]
        )

    def tail(self, start: int) -> IntKeyBlock:
        return self.slice(start, len(self.hashes))

    def pickled_rows(self) -> bytes:
        """``pickle.dumps((keys, values))``-equivalent bytes written from the arrays in the
        shape the codec reads back as arrays (an intermediate merge's run stays fast)."""
        from extagg.spill._pickle_kernels import int_rows_size, write_int_rows  # numba: lazily

        out = np.empty(int_rows_size(len(self.hashes)), dtype=np.uint8)
        size = write_int_rows(
            np.ascontiguousarray(self.int_keys).view(np.uint64),
            np.ascontiguousarray(self.numbers).view(np.uint64),
            self.numbers.dtype == np.float64,
            out,
        )
        return out[:size].tobytes()

    def nbytes(self) -> int:
        """Bytes of the rows once handed out as Python objects (an int and a number each)."""
        n = len(self.hashes)
        return int(self.hashes.nbytes + 2 * (56 + 8 * n) + 64 * n) if n else 0


class PermutedObjectBlock:
    """Hash-sorted rows of the generic engine without sorted copies of the rows.

    ``hashes`` are ascending and ``order[i]`` is the position in ``keys``/``values`` (insertion
    order) of the ``i``-th row. Slices gather their rows on demand, so sorting a map for a
    spill costs 16 bytes per entry (the hashes and the order) instead of new key and value
    lists plus a list of Python ints for the permutation.
    """

    __slots__ = ("hashes", "order", "keys", "values")

    def __init__(
        self, hashes: np.ndarray, order: np.ndarray, keys: list[Any], values: list[Any]
    ) -> None:
        if not (len(hashes) == len(order)) or len(keys) != len(values):
            raise ValueError("permuted block columns differ in length")
        self.hashes = hashes
        self.order = order
        self.keys = keys
        self.values = values

    def __len__(self) -> int:
        return len(self.order)

    def slice(self, start: int, stop: int) -> ObjectBlock:
        """Rows ``start:stop`` in hash order, gathered into a plain :class:`ObjectBlock`."""
        positions = self.order[start:stop].tolist()
        return ObjectBlock(
            self.hashes[start:stop],
            list(map(self.keys.__getitem__, positions)),
            list(map(self.values.__getitem__, positions)),
        )

    def tail(self, start: int) -> PermutedObjectBlock:
        """Rows ``start:`` as a view (nothing gathered)."""
        return PermutedObjectBlock(self.hashes[start:], self.order[start:], self.keys, self.values)

    def nbytes(self) -> int:
        """Estimated bytes of the rows (see :meth:`ObjectBlock.nbytes`)."""
        n = len(self.order)
        if n == 0:
            return 0
        return self.slice(0, n).nbytes() if n <= 16 else self._sampled_nbytes(n)

    def _sampled_nbytes(self, n: int) -> int:
        step = n // 16
        rows = [int(self.order[i]) for i in range(0, n, step)]
        per_row = sum(
            sys.getsizeof(self.keys[i]) + sys.getsizeof(self.values[i]) for i in rows
        ) / len(rows)
        return int(self.hashes.nbytes + self.order.nbytes + 2 * (56 + 8 * n) + per_row * n)


class ColumnBlock:
    """Rows of the columnar engine as NumPy columns.

    ``columns`` are row-aligned fixed-width arrays; ``var_columns`` hold variable-length values
    (strings, bytes) as ``(offsets, data)`` with ``len(offsets) == len(hashes) + 1`` and
    ``offsets[0] == 0``.
    """

    __slots__ = ("hashes", "columns", "var_columns")

    def __init__(
        self,
        hashes: np.ndarray,
        columns: dict[str, np.ndarray] | None = None,
        var_columns: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        self.hashes = hashes
        self.columns = columns or {}
        self.var_columns = var_columns or {}
        n = len(hashes)
        for name, col in self.columns.items():
            if len(col) != n:
                raise ValueError(f"column {name!r} has {len(col)} rows, block has {n}")
        for name, (offsets, _data) in self.var_columns.items():
            if len(offsets) != n + 1:
                raise ValueError(f"column {name!r} has {len(offsets) - 1} rows, block has {n}")

    def __len__(self) -> int:
        return len(self.hashes)

    def slice(self, start: int, stop: int) -> ColumnBlock:
        n = len(self.hashes)
        start, stop = max(0, min(start, n)), max(0, min(stop, n))
        stop = max(start, stop)
        var = {}
        for name, (offsets, data) in self.var_columns.items():
            lo, hi = int(offsets[start]), int(offsets[stop])
            var[name] = (offsets[start : stop + 1] - offsets[start], data[lo:hi])
        return ColumnBlock(
            self.hashes[start:stop],
            {name: col[start:stop] for name, col in self.columns.items()},
            var,
        )

    def tail(self, start: int) -> ColumnBlock:
        return self.slice(start, len(self.hashes))

    @staticmethod
    def concat(blocks: list[ColumnBlock]) -> ColumnBlock:
        if len(blocks) == 1:
            return blocks[0]
        if not blocks:
            raise ValueError("cannot concatenate zero column blocks")
        first = blocks[0]
        columns = {
            name: np.concatenate([b.columns[name] for b in blocks]) for name in first.columns
        }
        var = {}
        for name in first.var_columns:
            parts = [b.var_columns[name] for b in blocks]
            offsets = [np.zeros(1, dtype=np.int64)]
            base = 0
            for off, _data in parts:
                offsets.append(off[1:].astype(np.int64, copy=False) + base)
                base += int(off[-1])
            var[name] = (
                np.concatenate(offsets),
                np.concatenate([d for _o, d in parts]) if parts else np.empty(0, np.uint8),
            )
        return ColumnBlock(np.concatenate([b.hashes for b in blocks]), columns, var)

    def nbytes(self) -> int:
        total = self.hashes.nbytes + sum(c.nbytes for c in self.columns.values())
        for offsets, data in self.var_columns.values():
            total += offsets.nbytes + data.nbytes
        return int(total)


Block = Union[ObjectBlock, ColumnBlock]

"""Groups as :class:`~extagg.spill.blocks.ColumnBlock` rows: out of the table, combined, finished.

A block row is one group: its key hash, key words ``k0..`` (one per fixed-width key column),
null bits ``knull``, packed variable-length key bytes ``kvar`` and aggregate states ``s0..`` in
the order of the table's payload. The same layout is spilled, merged and turned into Arrow, so
nothing is converted until the very end.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import ModuleType

import numpy as np
import pyarrow as pa

from extagg.collection import _typed_kernels as TK
from extagg.collection.typed_table import TypedHashTable
from extagg.columnar import _kernels
from extagg.columnar import functions as F
from extagg.columnar.keys import NULLS_COLUMN, VAR_COLUMN, WORD_PREFIX, KeyLayout
from extagg.errors import SumOverflowError
from extagg.spill.blocks import ColumnBlock

__all__ = ["BlockLayout", "state_column"]

_EMPTY_I64 = np.zeros(0, dtype=np.int64)
_EMPTY_U8 = np.zeros(0, dtype=np.uint8)


def state_column(index: int) -> str:
    return f"s{index}"


class BlockLayout:
    """Converts between the table, column blocks and Arrow record batches."""

    def __init__(
        self,
        keys: KeyLayout,
        specs: Sequence[F.AggregateSpec],
        kernels: ModuleType | None = None,
    ) -> None:
        self.keys = keys
        self.specs = list(specs)
        self.kernels = kernels
        self.state_index: list[list[int]] = []
        self.state_fields: list[F.StateField] = []
        for spec in self.specs:
            first = len(self.state_fields)
            self.state_fields.extend(spec.states)
            self.state_index.append(list(range(first, len(self.state_fields))))
        self.output_names = [*keys.names, *(s.output for s in self.specs)]

    @property
    def fixed_row_bytes(self) -> int:
        """Bytes of one block row without its variable-length key bytes."""
        total = 8 + 8 * self.keys.num_words + self.keys.null_dtype.itemsize
        total += sum(f.dtype.itemsize for f in self.state_fields)
        if self.keys.has_var:
            total += 8
        return total

    # -- from the table ----------------------------------------------------------------------

    def gather(
        self, table: TypedHashTable, hashes: np.ndarray, slot_gids: np.ndarray
    ) -> ColumnBlock:
        """The groups ``slot_gids - 1`` (table order ids from ``sort_by_hash``) as a block."""
        words, nulls, var_off, var_data = table.gather_keys(slot_gids)
        columns = {f"{WORD_PREFIX}{j}": words[j] for j in range(words.shape[0])}
        columns[NULLS_COLUMN] = nulls
        for i in range(len(table.payload)):
            columns[state_column(i)] = table.gather_payload(i, slot_gids)
        var = {}
        if var_off is not None and var_data is not None:
            var[VAR_COLUMN] = (var_off, var_data)
        return ColumnBlock(np.ascontiguousarray(hashes), columns, var)

    def iter_sorted(
        self,
        table: TypedHashTable,
        hashes: np.ndarray,
        slot_gids: np.ndarray,
        start: int,
        batch_rows: int,
        batch_var_bytes: int,
    ) -> Iterator[tuple[int, ColumnBlock]]:
        """Blocks of at most ``batch_rows`` rows and about ``batch_var_bytes`` key bytes.

        Yields ``(next_start, block)`` from row ``start`` of the sorted groups on.
        """
        n = len(hashes)
        pos = start
        while pos < n:
            stop = min(n, pos + batch_rows)
            if table.has_var and batch_var_bytes > 0:
                stop = pos + _rows_within(table, slot_gids[pos:stop], batch_var_bytes)
            yield stop, self.gather(table, hashes[pos:stop], slot_gids[pos:stop])
            pos = stop

    # -- merging -----------------------------------------------------------------------------

    def _key_arrays(
        self, block: ColumnBlock
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n = len(block)
        w = self.keys.num_words
        if w == 1:
            words = np.ascontiguousarray(block.columns[f"{WORD_PREFIX}0"]).reshape(n, 1)
        else:
            words = np.empty((n, w), dtype=np.uint64)
            for j in range(w):
                words[:, j] = block.columns[f"{WORD_PREFIX}{j}"]
        nulls = block.columns[NULLS_COLUMN]
        var_off, var_data = block.var_columns.get(VAR_COLUMN, (_EMPTY_I64, _EMPTY_U8))
        return words, nulls, var_off, var_data

    def combine(self, pieces: list[ColumnBlock]) -> ColumnBlock:
        """Merge hash-sorted pieces (keys unique within each) into one hash-sorted block.

        Rows are grouped through a scratch hash table (keys compared word by word, so colliding
        keys stay apart), the groups ordered by (hash, first row), and the states of equal keys
        merged by the aggregate kernels.
        """
        if len(pieces) == 1:
            return pieces[0]
        block = ColumnBlock.concat(pieces)
        m = len(block)
        words, nulls, var_off, var_data = self._key_arrays(block)
        out_gid = np.empty(m, dtype=np.int64)
        first_row = np.empty(m, dtype=np.int64)
        groups = int(
            TK.group_rows(block.hashes, words, nulls, var_off, var_data, out_gid, first_row)
        )
        rows = first_row[:groups]
        columns = {
            name: np.ascontiguousarray(block.columns[name][rows])
            for name in block.columns
            if not name.startswith("s")
        }
        var = {}
        if VAR_COLUMN in block.var_columns:
            var[VAR_COLUMN] = TK.gather_var(var_off, var_data, rows)
        kernels = self.kernels or _kernels
        for spec, indexes in zip(self.specs, self.state_index):
            src = [block.columns[state_column(i)] for i in indexes]
            dst = [np.full(groups, f.fill, dtype=f.dtype) for f in spec.states]
            F.merge(spec, dst, out_gid, src, kernels)
            for i, arr in zip(indexes, dst):
                columns[state_column(i)] = arr
        return ColumnBlock(block.hashes[rows], columns, var)

    # -- to Arrow ----------------------------------------------------------------------------

    def finish(self, block: ColumnBlock) -> pa.RecordBatch:
        """The result rows of ``block``: key columns, then one column per aggregate."""
        words, nulls, var_off, var_data = self._key_arrays(block)
        keys = self.keys.decode(words, nulls, var_off if self.keys.has_var else None, var_data)
        aggs = []
        for spec, indexes in zip(self.specs, self.state_index):
            states = [block.columns[state_column(i)] for i in indexes]
            try:
                aggs.append(F.finalize(spec, states))
            except SumOverflowError as exc:
                key = [k[exc.row].as_py() for k in keys]
                shown = key[0] if len(key) == 1 else tuple(key)
                raise SumOverflowError(f"{exc} (group {shown!r})", exc.row) from None
        return pa.RecordBatch.from_arrays([*keys, *aggs], names=self.output_names)

    def empty_batch(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [pa.array([], type=t) for t in self.output_types()], names=self.output_names
        )

    def output_types(self) -> list[pa.DataType]:
        return [*self.keys.types, *(s.output_type for s in self.specs)]


def _rows_within(table: TypedHashTable, slot_gids: np.ndarray, limit: int) -> int:
    """How many leading groups of ``slot_gids`` fit in ``limit`` key bytes (at least one)."""
    gids = slot_gids.astype(np.int64) - 1
    sizes = table.var_offsets[gids + 1] - table.var_offsets[gids]
    fits = int(np.searchsorted(np.cumsum(sizes), limit, side="right"))
    return max(1, fits)

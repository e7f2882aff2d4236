"""Groups as :class:`~extagg.spill.blocks.ColumnBlock` rows: out of the table, combined, finished.

A block row is one group: its key hash, key words ``k0..`` (one per fixed-width key column),
null bits ``knull``, packed variable-length key bytes ``kvar`` and aggregate states ``s0..`` in
the order of the table's payload. The same layout is spilled, merged and turned into Arrow, so
nothing is converted until the very end.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa

from extagg.collection import _typed_kernels as TK
from extagg.collection.typed_table import TypedHashTable
from extagg.columnar import _kernels
from extagg.columnar import functions as F
from extagg.columnar.keys import NULLS_COLUMN, VAR_COLUMN, WORD_PREFIX, KeyLayout
from extagg.columnar.var_states import VarArena
from extagg.errors import SumOverflowError
from extagg.hashing import stable_hash
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
        #: the aggregates whose first two states (``ref``, ``len`` into the table's
        #: :class:`~extagg.columnar.var_states.VarArena`) are one var column ``s{ref}`` in a block
        self.var_specs = [i for i, spec in enumerate(self.specs) if F.is_var_spec(spec)]
        self._arena_states = {
            j for i in self.var_specs for j in self.state_index[i][:2]
        }  # fmt: skip

    @property
    def has_var_states(self) -> bool:
        return bool(self.var_specs)

    def var_len_states(self) -> list[int]:
        """Payload indexes of the ``len`` states of the variable-length aggregates."""
        return [self.state_index[i][1] for i in self.var_specs]

    @property
    def fixed_row_bytes(self) -> int:
        """Bytes of one block row without its variable-length key bytes."""
        total = 8 + 8 * self.keys.num_words + self.keys.null_dtype.itemsize
        total += sum(
            f.dtype.itemsize for i, f in enumerate(self.state_fields) if i not in self._arena_states
        )
        if self.keys.has_var:
            total += 8
        return total + 8 * len(self.var_specs)

    # -- from the table ----------------------------------------------------------------------

    def gather(
        self,
        table: TypedHashTable,
        hashes: np.ndarray,
        slot_gids: np.ndarray,
        arena: VarArena | None = None,
    ) -> ColumnBlock:
        """The groups ``slot_gids - 1`` (table order ids from ``sort_by_hash``) as a block
        (``arena``: the table's string states, when it has any)."""
        # keys and state rows in one visit per group, then each state field as its column
        words, nulls, rows = table.gather_groups(slot_gids)
        columns = {f"{WORD_PREFIX}{j}": words[j] for j in range(words.shape[0])}
        columns[NULLS_COLUMN] = nulls
        for i in range(len(table.payload)):
            if i not in self._arena_states:
                columns[state_column(i)] = np.ascontiguousarray(rows[f"p{i}"])
        del rows
        var = {}
        if table.has_var:
            var[VAR_COLUMN] = table.gather_var_keys(slot_gids)
        if self.var_specs:
            assert arena is not None
            groups = slot_gids.astype(np.int64) - 1
            kernels = self.kernels or F._kernels
            for k in self.var_specs:
                ref, length = self.state_index[k][:2]
                var[state_column(ref)] = kernels.gather_arena(
                    arena.data, table.payload[ref], table.payload[length], groups
                )
        return ColumnBlock(np.ascontiguousarray(hashes), columns, var)

    def iter_sorted(
        self,
        table: TypedHashTable,
        hashes: np.ndarray,
        slot_gids: np.ndarray,
        start: int,
        batch_rows: int,
        batch_var_bytes: int,
        arena: VarArena | None = None,
    ) -> Iterator[tuple[int, ColumnBlock]]:
        """Blocks of at most ``batch_rows`` rows and about ``batch_var_bytes`` key and string
        state bytes.

        Yields ``(next_start, block)`` from row ``start`` of the sorted groups on.
        """
        n = len(hashes)
        pos = start
        while pos < n:
            stop, _ = self.batch_stop(table, slot_gids, pos, batch_rows, batch_var_bytes)
            yield stop, self.gather(table, hashes[pos:stop], slot_gids[pos:stop], arena)
            pos = stop

    def batch_stop(
        self,
        table: TypedHashTable,
        slot_gids: np.ndarray,
        start: int,
        batch_rows: int,
        batch_var_bytes: int,
    ) -> tuple[int, int]:
        """Where the result batch that starts at sorted group ``start`` ends — after at most
        ``batch_rows`` groups and about ``batch_var_bytes`` key and string state bytes — and
        its key and string state bytes (0 when not counted: no limit, or none)."""
        stop = min(len(slot_gids), start + batch_rows)
        lens = [table.payload[i] for i in self.var_len_states()]
        if (table.has_var or lens) and batch_var_bytes > 0:
            rows, var_bytes = _rows_within(table, slot_gids[start:stop], batch_var_bytes, lens)
            return start + rows, var_bytes
        return stop, 0

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

    def key_arrays(
        self, block: ColumnBlock
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A block's keys as the table's insert takes them: words ``(n, num_words)``, null
        masks (empty when no key is null), variable part as (offsets, bytes)."""
        words, nulls, var_off, var_data = self._key_arrays(block)
        if not nulls.any():
            nulls = nulls[:0]
        return words, nulls, var_off, var_data

    def merge_into(
        self, table: TypedHashTable, gids: np.ndarray, block: ColumnBlock, lo: int, hi: int
    ) -> None:
        """Fold the states of rows ``lo..hi`` of ``block`` into the table's groups ``gids``
        (one per row). Not for string min/max/first/last (their states live in an arena)."""
        assert not self.var_specs
        kernels = self.kernels or _kernels
        for spec, indexes in zip(self.specs, self.state_index):
            src = [block.columns[state_column(i)][lo:hi] for i in indexes]
            dst = [table.payload[i] for i in indexes]
            F.merge(spec, dst, gids, src, kernels)

    def combine(self, pieces: list[ColumnBlock]) -> ColumnBlock:
        """Merge hash-sorted pieces (keys unique within each) into one hash-sorted block.

        The pieces are merged by hash (keys compared word by word, so colliding keys stay
        apart), the groups numbered in (hash, first row) order, and the states of equal keys
        merged by the aggregate kernels.
        """
        if len(pieces) == 1:
            return pieces[0]
        starts = np.zeros(len(pieces) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in pieces], out=starts[1:])
        block = ColumnBlock.concat(pieces)
        m = len(block)
        words, nulls, var_off, var_data = self._key_arrays(block)
        out_gid = np.empty(m, dtype=np.int64)
        first_row = np.empty(m, dtype=np.int64)
        groups = int(
            TK.group_sorted_pieces(
                block.hashes, starts, words, nulls, var_off, var_data, out_gid, first_row
            )
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
            if F.is_var_spec(spec):
                name = state_column(indexes[0])
                rest = [block.columns[state_column(i)] for i in indexes[2:]]
                var[name], merged = F.merge_var(
                    spec, out_gid, groups, block.var_columns[name], rest, kernels
                )
                for i, arr in zip(indexes[2:], merged):
                    columns[state_column(i)] = arr
                continue
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
            states: list[Any]
            if F.is_var_spec(spec):
                states = [block.var_columns[state_column(indexes[0])]]
                states += [block.columns[state_column(i)] for i in indexes[2:]]
            else:
                states = [block.columns[state_column(i)] for i in indexes]
            try:
                aggs.append(F.finalize(spec, states))
            except SumOverflowError as exc:
                key = [k[exc.row].as_py() for k in keys]
                shown = key[0] if len(key) == 1 else tuple(key)
                raise SumOverflowError(f"{exc} (group {shown!r})", exc.row) from None
        return pa.RecordBatch.from_arrays([*keys, *aggs], names=self.output_names)

    def initial_block(self, rows: int) -> ColumnBlock:
        """``rows`` groups with no input folded in (all keys null, states at their fill values):
        what a global aggregate of no rows finishes (count 0, sum null, as SQL)."""
        hashes = np.full(rows, GLOBAL_HASHES[0], dtype=np.uint64)
        columns = {
            f"{WORD_PREFIX}{j}": np.zeros(rows, np.uint64) for j in range(self.keys.num_words)
        }
        columns[NULLS_COLUMN] = np.zeros(rows, dtype=self.keys.null_dtype)
        for i, f in enumerate(self.state_fields):
            if i not in self._arena_states:
                columns[state_column(i)] = np.full(rows, f.fill, dtype=f.dtype)
        var = {VAR_COLUMN: (np.zeros(rows + 1, np.int64), _EMPTY_U8)} if self.keys.has_var else {}
        for k in self.var_specs:
            var[state_column(self.state_index[k][0])] = (np.zeros(rows + 1, np.int64), _EMPTY_U8)
        return ColumnBlock(hashes, columns, var)

    def empty_batch(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [pa.array([], type=t) for t in self.output_types()], names=self.output_names
        )

    def output_types(self) -> list[pa.DataType]:
        return [*self.keys.types, *(s.output_type for s in self.specs)]


#: the key hash of a global aggregate's one group (its key is the empty tuple)
GLOBAL_HASHES = np.array([stable_hash(())], dtype=np.uint64)


def global_row_untyped(requests: Sequence[F.AggregateRequest]) -> pa.RecordBatch:
    """The one row of a global aggregate that saw no input, its column types unknown: counts
    are 0 (``int64``), everything else null (Arrow type ``null``)."""
    arrays = [pa.array([0], pa.int64()) if r.func == "count" else pa.nulls(1) for r in requests]
    return pa.RecordBatch.from_arrays(arrays, names=[r.output for r in requests])


def _rows_within(
    table: TypedHashTable, slot_gids: np.ndarray, limit: int, lens: Sequence[np.ndarray] = ()
) -> tuple[int, int]:
    """How many leading groups of ``slot_gids`` fit in ``limit`` key bytes and string state
    bytes (``lens``: the lengths of the states, -1 for none) (at least one), and their bytes."""
    gids = slot_gids.astype(np.int64) - 1
    sizes = np.zeros(len(gids), dtype=np.int64)
    if table.has_var:
        sizes += table.var_offsets[gids + 1] - table.var_offsets[gids]
    for length in lens:
        sizes += np.maximum(length[gids], 0)
    total = np.cumsum(sizes)
    fits = max(1, int(np.searchsorted(total, limit, side="right")))
    return fits, int(total[fits - 1]) if len(total) else 0

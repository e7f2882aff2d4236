"""HashAggregator: GROUP BY over typed columns in bounded, accounted memory.

Batches are cut into chunks; each chunk's keys are hashed and canonicalised (``keys``), the
typed table (``extagg.collection.typed_table``) assigns group ids in one compiled call, and one
compiled call per aggregate folds the values into per-group states. The table asks this
consumer for the exact bytes of its grown arrays before every growth; when the memory manager
refuses, the table is sorted by hash and written as a run file (the shared run-file format,
column codec) and is emptied, keeping its arrays for the input still to come. ``results()``
merges the in-memory table with every run through :mod:`extagg.merge.heap`, combining states of
equal keys in compiled kernels, and streams Arrow record batches in hash order (the same order
whether or not anything spilled). A table that barely reduces its input while its keys keep
coming back makes the aggregator partition the input instead (:mod:`.partitioned`,
:mod:`.partitions`): each partition is aggregated afterwards by a child aggregator.

Memory held = table arrays (exact) + chunk buffers (an upper bound per row) + one I/O batch
(gathering and encoding a spill batch), never less than a floor of
``min(INITIAL_MEMORY_THRESHOLD, max_memory / 16)`` so a starved table does not spill tiny runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from extagg._config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_FAN_IN,
    INITIAL_MEMORY_THRESHOLD,
    format_size,
    parse_size,
)
from extagg.collection import _typed_kernels as TK
from extagg.collection.typed_table import MIN_ARENA, MIN_CAPACITY, TypedHashTable
from extagg.columnar import functions as F
from extagg.columnar._sources import TableSource
from extagg.columnar.blocks import GLOBAL_HASHES, BlockLayout, global_row_untyped
from extagg.columnar.buffers import BATCH_VAR_BYTES, IO_COPIES, plan_buffers
from extagg.columnar.columns import Column, iter_record_batches, to_columns
from extagg.columnar.growth import grow_arena_or_spill, grow_or_spill, make_room_for_key_bytes
from extagg.columnar.keys import EncodedKeys, KeyLayout
from extagg.columnar.merging import result_blocks
from extagg.columnar.partitioned import set_aside
from extagg.columnar.partitions import (
    PARTITION_BITS,
    PartitionWriter,
    rotate_left,
)
from extagg.columnar.runs import spill_table
from extagg.errors import MemoryLimitError
from extagg.memory import (
    MemoryConsumer,
    TaskMemoryManager,
    UnifiedMemoryManager,
    resolve_task_memory_manager,
)
from extagg.metrics import SpillMetrics
from extagg.spill.tempdir import SpillDirs

__all__ = ["HashAggregator"]

log = logging.getLogger(__name__)


class HashAggregator(MemoryConsumer):
    """Spillable hash aggregation of record batches (see the module docstring).

    ``keys`` are the grouping columns; ``aggs`` maps output names to ``(column, function)``
    (``("*", "count")`` counts rows); functions are listed in :mod:`extagg.columnar.functions`.
    ``memory`` gives a private budget, ``memory_manager`` shares a manager, neither uses the
    process default. ``force_spill_rows`` (tests) spills after every N input rows; ``fan_in``
    and ``batch_size`` shape the merge and the run files.
    """

    def __init__(
        self,
        keys: str | Sequence[str],
        aggs: Mapping[str, tuple[str, str]],
        *,
        memory: int | str | None = None,
        memory_manager: UnifiedMemoryManager | TaskMemoryManager | None = None,
        spill_dirs: Iterable[str] | str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        fan_in: int = DEFAULT_FAN_IN,
        compression: str = "lz4",
        max_spill_bytes: int | str | None = None,
        force_spill_rows: int | None = None,
        chunk_rows: int | None = None,
        name: str | None = None,
    ) -> None:
        self.keys = [keys] if isinstance(keys, str) else list(keys)
        if not all(isinstance(k, str) for k in self.keys):
            raise TypeError(f"keys must be column names (strings), got {keys!r}")
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"key columns must be distinct, got {self.keys}")
        self._requests = F.parse_aggs(aggs)
        self._aggs = dict(aggs)
        #: whether input rows may be set aside and aggregated later (first/last need row order)
        self._order_free = not any(r.func.startswith(("first", "last")) for r in self._requests)
        clash = {r.output for r in self._requests} & set(self.keys)
        if clash:
            raise ValueError(f"aggregate outputs {sorted(clash)} have the names of key columns")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if fan_in < 2:
            raise ValueError(f"fan_in must be at least 2, got {fan_in}")
        if force_spill_rows is not None and force_spill_rows < 1:
            raise ValueError(f"force_spill_rows must be positive, got {force_spill_rows}")
        tmm = resolve_task_memory_manager(memory, memory_manager)
        super().__init__(tmm, name)
        self.batch_size = batch_size
        self.fan_in = fan_in
        self.compression = compression
        self.force_spill_rows = force_spill_rows
        self.batch_var_bytes = BATCH_VAR_BYTES
        self.run_rows = batch_size
        cap = (
            None if max_spill_bytes is None else parse_size(max_spill_bytes, name="max_spill_bytes")
        )
        dirs = (
            list(spill_dirs)
            if spill_dirs is not None and not isinstance(spill_dirs, str)
            else spill_dirs
        )
        self._spill_dirs = SpillDirs(dirs, max_spill_bytes=cap)
        self._max_memory = tmm.memory_manager.max_memory
        self._budget = self._max_memory  # the whole task's, which partitions' aggregators share
        self._chunk_rows_arg = chunk_rows
        self.metrics = SpillMetrics()
        self._lock = threading.RLock()
        self._needed = list(
            dict.fromkeys([*self.keys, *(r.column for r in self._requests if r.column)])
        )
        self._schema: dict[str, tuple[str, pa.DataType]] | None = None
        self._layout: BlockLayout | None = None
        self._table: TypedHashTable | None = None
        self._runs: list[str] = []
        self._max_batch_bytes = 0  # largest decoded batch of any run: sizes merge buffers
        self._rows_since_spill = 0
        self._scratch = 0  # bytes reserved for chunk buffers
        self._io_bytes = 0  # bytes reserved for one spill batch
        self._aside_bytes = 0  # bytes reserved for the partition buffers
        self._floor = 0
        self._source: TableSource | None = None
        self._level = 0  # partitioning depth: 0 for the aggregator the caller made
        self._partitions: PartitionWriter | None = None
        self._state = "open"  # open -> reading -> closed

    # ------------------------------------------------------------------ schema
    @property
    def input_columns(self) -> list[str]:
        """The input columns the query reads (keys, then aggregated columns)."""
        return list(self._needed)

    @property
    def schema(self) -> pa.Schema | None:
        """The output schema (known after the first ``update``)."""
        if self._layout is None:
            return None
        return pa.schema(list(zip(self._layout.output_names, self._layout.output_types())))

    def _init_schema(self, cols: dict[str, Column]) -> None:
        for name in self.keys:
            if cols[name].kind not in (
                "int",
                "uint",
                "float",
                "bool",
                "temporal",
                "decimal",
                "string",
                "binary",
            ):
                raise TypeError(f"key column {name!r} has unsupported type {cols[name].arrow_type}")
        specs = [F.resolve(r, None if r.column is None else cols[r.column]) for r in self._requests]
        key_cols = [cols[k] for k in self.keys]
        keys = KeyLayout(self.keys, [c.kind for c in key_cols], [c.arrow_type for c in key_cols])
        self._layout = BlockLayout(keys, specs)
        self._schema = {n: (c.kind, c.arrow_type) for n, c in cols.items()}
        self._plan()

    def _plan(self, chunk_share: int = 64) -> None:
        """Size the chunk and I/O buffers and the floor for this aggregator's budget."""
        assert self._layout is not None
        plan = plan_buffers(
            self._layout, len(self._needed), self._max_memory, self.batch_size,
            self._chunk_rows_arg, chunk_share,
        )  # fmt: skip
        self._chunk_rows = plan.chunk_rows
        self._scratch = plan.scratch_bytes
        self.run_rows = plan.run_rows
        self.batch_var_bytes = plan.batch_var_bytes
        self._io_bytes = plan.io_bytes
        self._floor = max(self._min_bytes(), min(INITIAL_MEMORY_THRESHOLD, self._max_memory // 16))

    @property
    def io_batch_bytes(self) -> int:
        """Bytes of one spill batch (without the copies encoding makes)."""
        return self._io_bytes // IO_COPIES

    def _check_schema(self, cols: dict[str, Column]) -> None:
        assert self._schema is not None
        for name, col in cols.items():
            kind, arrow_type = self._schema[name]
            same = col.kind == kind and (col.is_var or col.arrow_type == arrow_type)
            if not same:
                raise TypeError(
                    f"column {name!r} changed type between update() calls: it was {arrow_type}, "
                    f"this batch has {col.arrow_type}"
                )

    def _payload(self) -> list[tuple[np.dtype, Any]]:
        assert self._layout is not None
        return [(f.dtype, f.fill) for f in self._layout.state_fields]

    def _table_bytes(self, capacity: int = MIN_CAPACITY) -> int:
        assert self._layout is not None
        k = self._layout.keys
        return TypedHashTable.bytes_for(
            k.num_words, len(k.names), k.has_var, self._payload(), capacity, MIN_ARENA
        )

    def _min_bytes(self) -> int:
        return self._table_bytes() + self._scratch + self._io_bytes

    # ------------------------------------------------------------------ memory
    def _hold(self, total: int) -> bool:
        """Hold at least ``total`` bytes; False (holding what we held) if not granted."""
        want = total - self.used
        if want <= 0:
            return True
        got = self.acquire_memory(want)
        if got < want:
            if got:
                self.free_memory(got)
            return False
        self.metrics.peak_granted_bytes = max(self.metrics.peak_granted_bytes, self.used)
        return True

    def _in_use(self) -> int:
        table = 0 if self._table is None else self._table.nbytes
        if self._source is not None:
            table += self._source.nbytes
        return table + self._scratch + self._io_bytes + self._aside_bytes

    def _trim(self) -> None:
        """Give back what the table no longer needs (keeping the floor)."""
        excess = self.used - max(self._floor, self._in_use())
        if excess > 0:
            self.free_memory(excess)
        self.metrics.peak_memory_bytes = max(self.metrics.peak_memory_bytes, self._in_use())

    def _ensure_table(self) -> TypedHashTable:
        if self._table is None:
            need = max(self._floor, self._min_bytes())
            if not self._hold(need):
                raise MemoryLimitError(
                    f"{self.name} needs {format_size(need)} to start (a table of "
                    f"{format_size(self._table_bytes())}, chunk buffers of "
                    f"{format_size(self._scratch)}, an I/O batch of {format_size(self._io_bytes)}) "
                    f"but the memory manager granted less (max_memory "
                    f"{format_size(self._max_memory)}, {format_size(self.used)} held)"
                )
            k = self._layout.keys if self._layout else None
            assert k is not None
            self._table = TypedHashTable(
                k.num_words, len(k.names), k.has_var, self._payload(), hash_is_key=k.hash_is_key
            )
            self._trim()
        return self._table

    # ------------------------------------------------------------------ updating
    def update(self, batch: Any) -> None:
        """Fold one batch (pyarrow RecordBatch/Table, pandas DataFrame or dict of arrays)."""
        with self._lock:
            if self._state != "open":
                raise RuntimeError(f"{self.name}: update() after results() or close()")
            chunk = self._chunk_rows if self._layout is not None else None
            for rb in iter_record_batches(batch, chunk):
                if self._schema is None:
                    if rb.num_rows == 0 and _has_null_typed(rb, self._needed):
                        continue  # nothing to learn the types from, nothing to aggregate
                    cols = to_columns(rb, self._needed)
                    self._init_schema(cols)
                else:
                    known = {name: t for name, (_kind, t) in self._schema.items()}
                    cols = to_columns(rb, self._needed, known)
                    self._check_schema(cols)
                self._update_columns(cols, rb.num_rows)

    def _update_columns(self, cols: dict[str, Column], n: int) -> None:
        """Fold ``n`` rows of checked input columns, chunk by chunk."""
        step = self._chunk_rows
        start = 0
        while start < n:
            stop = min(n, start + step)
            if self.force_spill_rows is not None:
                stop = min(stop, start + self.force_spill_rows - self._rows_since_spill)
            part = (
                cols
                if (start == 0 and stop == n)
                else {k: c.slice(start, stop) for k, c in cols.items()}
            )
            self._update_chunk(part, stop - start)
            start = stop
            if (
                self.force_spill_rows is not None
                and self._rows_since_spill >= self.force_spill_rows
            ):
                if self._table is not None and self._table.num_groups:
                    spill_table(self, f"forced every {self.force_spill_rows} rows")
                self._rows_since_spill = 0

    def _update_chunk(self, cols: dict[str, Column], n: int) -> None:
        layout = self._layout
        assert layout is not None
        if self._partitions is not None:
            set_aside(self, cols, n, 0)
            return
        table = self._ensure_table()
        key_cols = [cols[k] for k in self.keys]
        var_bytes = sum(c.data.nbytes for c in key_cols if c.data is not None)
        if var_bytes:
            make_room_for_key_bytes(self, var_bytes)
            table = self._ensure_table()
        enc = self._encode(key_cols, n)
        gids = np.empty(n, dtype=np.int64)
        seq0 = self.metrics.records_read
        pos = 0
        while pos < n:
            table = self._ensure_table()
            nxt, status = table.insert(
                enc.hashes, enc.words, enc.nulls, enc.var_offsets, enc.var_data, pos, gids
            )
            if nxt > pos:
                self._fold(table, cols, gids, pos, nxt, n, seq0)
            pos = nxt
            if status == TK.TABLE_FULL:
                grow_or_spill(self, table)
                if self._partitions is not None:  # the rest of this chunk goes aside too
                    self.metrics.records_read += pos
                    set_aside(self, cols, n, pos, enc.hashes)
                    self._trim()
                    return
            elif status == TK.ARENA_FULL:
                grow_arena_or_spill(self, table, table.pending_var_bytes(enc.var_offsets, pos))
        self.metrics.records_read += n
        self._rows_since_spill += n
        if var_bytes:
            self._trim()

    def _fold(
        self,
        table: TypedHashTable,
        cols: dict[str, Column],
        gids: np.ndarray,
        lo: int,
        hi: int,
        n: int,
        seq0: int,
    ) -> None:
        layout = self._layout
        assert layout is not None
        whole = lo == 0 and hi == n
        g = gids if whole else gids[lo:hi]
        for spec, indexes in zip(layout.specs, layout.state_index):
            col = None if spec.column is None else cols[spec.column]
            if col is not None and not whole:
                col = col.slice(lo, hi)
            F.update(spec, [table.payload[i] for i in indexes], g, col, seq0 + lo)

    # ------------------------------------------------------------------ spilling
    def spill(self, size: int, trigger: MemoryConsumer) -> int:
        """Spill because another consumer needs memory; returns the bytes freed."""
        if trigger is self or self._state == "closed":
            return 0
        if not self._lock.acquire(blocking=False):
            return 0  # busy in another thread: cannot spill safely now
        try:
            before = self.used
            if self._source is not None:
                self._source.spill_rest()
            elif self._state == "open" and self._table is not None and self._table.num_groups:
                spill_table(
                    self, f"requested by {getattr(trigger, 'name', trigger)}", release_all=True
                )
            else:
                return 0
            return max(0, before - self.used)
        finally:
            self._lock.release()

    # ------------------------------------------------------------------ results
    def results(self) -> Iterator[pa.RecordBatch]:
        """Every group once, as Arrow record batches in hash order. Destructive; call once."""
        return (batch for _hashes, batch in self.hashed_results())

    def hashed_results(self) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
        """:meth:`results` with each batch's key hashes (``uint64``, ascending): two
        aggregators over the same groups can be joined on them as their batches stream."""
        with self._lock:
            if self._state != "open":
                raise RuntimeError(
                    f"{self.name}: results() can be called only once, before close()"
                )
            self._state = "reading"
        return self._results()

    def _results(self) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
        try:
            if self._layout is None:
                if not self.keys:  # a global aggregate of no input at all: one row
                    yield GLOBAL_HASHES, global_row_untyped(self._requests)
                return
            layout = self._layout
            groups_before = self.metrics.groups
            for block in result_blocks(self):
                for start in range(0, len(block), self.batch_size):
                    part = (
                        block.slice(start, start + self.batch_size)
                        if len(block) > self.batch_size
                        else block
                    )
                    self.metrics.groups += len(part)
                    yield part.hashes, layout.finish(part)
            if not self.keys and self.metrics.groups == groups_before:
                self.metrics.groups += 1  # a global aggregate has one row, even of no input
                block = layout.initial_block(1)
                yield block.hashes, layout.finish(block)
        finally:
            self.close()

    def _encode(self, key_cols: list[Column], n: int | None = None) -> EncodedKeys:
        """Hash and canonicalise keys (``n`` rows: needed without key columns); a partition's
        aggregator rotates the hashes (see :func:`~extagg.columnar.partitions.rotate_left`)."""
        assert self._layout is not None
        enc = self._layout.keys.encode(key_cols, n)
        if self._level:
            enc.hashes = rotate_left(enc.hashes, PARTITION_BITS * self._level)
        return enc

    # ------------------------------------------------------------------ cleanup
    @property
    def spill_files(self) -> list[str]:
        """The run files currently on disk."""
        return self._spill_dirs.files

    def close(self) -> None:
        """Release all memory and delete every run file. Idempotent."""
        with self._lock:
            if self._state == "closed":
                return
            self._state = "closed"
            self._table = None
            if self._source is not None:
                self._source.close()
                self._source = None
            if self._partitions is not None:
                self._partitions.abort()
                self._partitions = None
            if self._level == 0:  # children share their parent's spill dirs
                self._spill_dirs.cleanup()
            self._runs.clear()
            self.close_memory()

    def __enter__(self) -> HashAggregator:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return (
            f"<HashAggregator {self.name} {self._state}: keys={self.keys}, "
            f"{self.metrics.records_read} rows, {self.metrics.spill_count} spills, "
            f"{format_size(self.used)} held>"
        )


def _has_null_typed(rb: pa.RecordBatch, names: list[str]) -> bool:
    index = rb.schema.get_field_index
    return any(index(n) >= 0 and pa.types.is_null(rb.schema.field(n).type) for n in names)

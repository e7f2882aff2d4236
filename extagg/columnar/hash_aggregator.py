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
coming back makes the aggregator partition the input instead (:mod:`.partitioning`,
:mod:`.partition_files`): each partition is aggregated afterwards by a child aggregator. With
fixed-width keys the table is split rather than spilled whole then (hybrid hash aggregation):
the lower half of its partitions stays in memory and only the others' rows are set aside.

The aggregator is a :class:`~extagg.spillable.Spillable`; its helpers (growth, runs, merging,
partitioning) work on its :class:`~extagg.columnar.state.TableState`.

Memory held = table arrays (exact) + chunk buffers (an upper bound per row) + one I/O batch
(gathering and encoding a spill batch), never less than a floor of
``min(INITIAL_MEMORY_THRESHOLD, max_memory / 16)`` so a starved table does not spill tiny runs.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import pyarrow as pa

from extagg._config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_FAN_IN,
    INITIAL_MEMORY_THRESHOLD,
    THREADS_ENV,
    env_int,
    format_size,
    resolve_threads,
)
from extagg._interrupts import deferred_interrupts
from extagg.collection import _typed_kernels as TK
from extagg.collection.typed_table import MIN_ARENA, MIN_CAPACITY, TypedHashTable
from extagg.columnar import functions as F
from extagg.columnar import threaded as thread_fold
from extagg.columnar._sources import TableSource
from extagg.columnar.buffers import (
    BATCH_VAR_BYTES,
    IO_COPIES,
    MERGE_COPIES,
    partition_chunks,
    plan_buffers,
)
from extagg.columnar.coded_keys import CODED_ROW_BYTES, CodedKeys, CodedLookup, coded_keys
from extagg.columnar.columns import (
    Column,
    ReusedArrays,
    iter_record_batches,
    key_names,
    to_columns,
)
from extagg.columnar.growth import (
    enlarge_empty,
    grow_arena_or_spill,
    make_room_for_var_states,
    try_grow,
)
from extagg.columnar.keys import EncodedKeys, KeyLayout
from extagg.columnar.layout import GLOBAL_HASHES, BlockLayout, global_row_untyped
from extagg.columnar.merging import ReserveMerge, result_blocks
from extagg.columnar.partition_files import (
    MAX_LEVEL,
    NUM_PARTITIONS,
    PARTITION_BITS,
    PartitionSource,
    PartitionWriter,
    buffer_bytes,
    partition_of,
    rotate_left,
)
from extagg.columnar.partitioning import (
    resident_rotation,
    set_aside,
    spill_or_partition,
    split_table,
    start_partitioning,
)
from extagg.columnar.runs import spill_table, write_merged_run
from extagg.columnar.state import TableState
from extagg.columnar.threaded import ThreadedFold, partition_bits
from extagg.columnar.var_states import MIN_VAR_ARENA, VarArena, chunk_stop
from extagg.errors import MemoryLimitError, SpillError, UsageError
from extagg.memory import (
    ENGINE_MIN_BUDGET,
    Consumer,
    TaskMemoryManager,
    UnifiedMemoryManager,
    describe_holders,
)
from extagg.merge.heap import BlockSource, merge_in_passes
from extagg.spill.blocks import ColumnBlock
from extagg.spill.runfile import RunReader
from extagg.spillable import OPEN, READING, Spillable

__all__ = ["HashAggregator"]

log = logging.getLogger(__name__)

#: rows of an Arrow batch with dictionary-coded keys folded in one piece at most
CODED_BATCH_ROWS = 1 << 17

#: rows per chunk at most with threads (each worker folds its partitions' share of it)
THREAD_CHUNK_ROWS = 1 << 18
#: the least budget per thread partition when the thread count was not asked for: measured
#: (benchmarks/bench_scaling.py, budget curve, 20 M rows, 10 M groups, two threads) peak RSS
#: above baseline 0.81x a 60 MiB limit but 1.2-1.4x a 30 MiB one (the merges' working set at
#: 15 MiB per partition), and two threads no faster than one at 30-120 MiB in all
AUTO_THREAD_MIN_BUDGET = 32 << 20
#: the least rows per chunk with threads when the thread count was not asked for (a chunk's
#: buffers take up to a sixteenth of the budget, so this is a budget: ~120 MiB with one int key
#: and one value): every call that folds a partition's share of a chunk costs Python work, and
#: with smaller chunks two threads measured 1.1-2.2x slower than one (int-1M at 14 MiB, str-1M
#: at 17 MiB, int-10M at 109 MiB; benchmarks/README.md, "Columnar, 2026-11-26, second pass")
AUTO_THREAD_MIN_CHUNK_ROWS = 1 << 16


class HashAggregator(Spillable[ColumnBlock]):
    """Spillable hash aggregation of record batches in a compiled (numba) hash table.

    Feed batches with :meth:`update`, then read :meth:`results` once. Groups live in typed
    arrays granted exactly by the memory manager; when a grant is refused the table is sorted by
    key hash and spilled as a column run, and runs are merged at the end (or the input is
    hash-partitioned when the table cannot reduce it). Results come in key-hash order whatever
    was spilled.

    Parameters
    ----------
    keys
        Grouping column name or names.
    aggs
        Output name → ``(column, function)``; ``("*", "count")`` counts rows. Functions are
        :data:`extagg.columnar.FUNCTIONS` and their :data:`extagg.columnar.ALIASES`.
    memory
        A private budget: bytes or a size string like ``"256m"``.
    memory_manager
        A shared ``UnifiedMemoryManager`` or ``TaskMemoryManager`` (default: the process manager).
    spill_dirs
        Spill directories (default ``EXTAGG_SPILL_DIR``, else ``SPARK_LOCAL_DIRS``, else the
        system temp directory).
    batch_size
        Groups per batch in a run file and per output batch.
    fan_in
        Most runs merged at once; more are merged in intermediate passes.
    compression
        ``"lz4"`` or ``"none"`` for run-file batches.
    max_spill_bytes
        Cap on bytes on disk at once (default ``EXTAGG_MAX_SPILL_BYTES``, none).
    force_spill_rows
        Test knob: spill after every N input rows (with threads: each of the P thread
        partitions after every N / P of its rows).
    chunk_rows
        Rows hashed and probed per compiled call (default: sized from the budget).
    threads
        Worker threads (default ``EXTAGG_THREADS``, else the CPUs the process may use,
        ``os.sched_getaffinity``). With more than one, the keys are split by hash among
        thread partitions folded side by side (:mod:`extagg.columnar.threaded`); the result,
        rows and order, is the same for every thread count. ``1`` folds in the caller's thread.
        A budget too small for a child per partition falls back to fewer threads; without a
        count asked for, each thread partition needs 32 MiB of the budget (below that threads
        were measured to exceed the limit in RSS) and a chunk 2**16 rows (a sixteenth of the
        budget; below that two threads were measured slower than one). Keys that come as
        dictionary arrays fold by their codes, in one thread whatever the count.
    name
        Name in logs and memory reports.

    Raises
    ------
    ValueError
        Unknown function, missing column, a batch whose schema differs from the first.
    TypeError
        Unsupported key type or a value column the function cannot take.
    OverflowError
        An integer ``sum`` leaves the int64 range (``SumOverflowError``; a ``uint64`` sum is a
        ``decimal128(38, 0)``, past 38 digits).

    Notes
    -----
    ``update`` costs O(rows) (one probe per row, expected O(1)); a spill sorts the table in
    O(groups) (nearly sorted already) and writes it; the merge of r runs is O(groups × log r).
    Memory held: the table's arrays (exactly accounted, old and new both during a growth), one
    chunk of hashes and slots, and one I/O batch per run while merging.

    Examples
    --------
    >>> import numpy as np
    >>> with HashAggregator(keys="k", aggs={"n": ("*", "count")}, memory="16m") as agg:
    ...     agg.update({"k": np.array([1, 2, 1])})
    ...     sorted(tuple(row.values()) for b in agg.results() for row in b.to_pylist())
    [(1, 2), (2, 1)]
    """

    def __init__(
        self,
        keys: str | Sequence[str],
        aggs: Mapping[str, Any] | Sequence[str] | str,
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
        threads: int | None = None,
        name: str | None = None,
    ) -> None:
        self.keys = key_names(keys)
        self.threads = resolve_threads(threads) if self.keys else 1
        #: no count asked for (argument or EXTAGG_THREADS): threads only where they pay
        self._threads_auto = threads is None and env_int(THREADS_ENV) is None
        if not all(isinstance(k, str) for k in self.keys):
            raise TypeError(f"keys must be column names (strings), got {keys!r}")
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"key columns must be distinct, got {self.keys}")
        if aggs is F.NO_AGGREGATES and not self.keys:
            raise TypeError("an aggregator with no aggregate needs keys")
        self._requests = F.parse_aggs(aggs, states=True)  # every form checked, errors named
        # the children's, as {output: (column, function)} (texts such as "n=count(*)" parsed)
        self._aggs = aggs if aggs is F.NO_AGGREGATES else dict(F.agg_mapping(aggs))
        #: whether input rows may be set aside and aggregated later (first/last need row order)
        self._order_free = not any(r.func.startswith(("first", "last")) for r in self._requests)
        clash = {r.output for r in self._requests} & set(self.keys)
        if clash:
            raise ValueError(f"aggregate outputs {sorted(clash)} have the names of key columns")
        if force_spill_rows is not None and force_spill_rows < 1:
            raise ValueError(f"force_spill_rows must be positive, got {force_spill_rows}")
        if chunk_rows is not None and chunk_rows < 1:
            raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
        super().__init__(
            memory,
            memory_manager=memory_manager,
            spill_dirs=spill_dirs,
            batch_size=batch_size,
            fan_in=fan_in,
            compression=compression,
            max_spill_bytes=max_spill_bytes,
            name=name,
        )
        self.force_spill_rows = force_spill_rows
        #: the table, its layout, buffer sizes: what the helper modules work on
        self.table_state = TableState(
            name=self.name,
            budget=self.budget,
            runs=self.runs,
            metrics=self.metrics,
            lock=self.lock,
            run_rows=batch_size,
            batch_var_bytes=BATCH_VAR_BYTES,
        )
        self.budget.usage = self.table_state.in_use
        #: the whole task's memory, which partitions' aggregators share
        self._task_budget = self.budget.max_memory
        self._chunk_rows_arg = chunk_rows
        self._needed = list(
            dict.fromkeys([*self.keys, *(r.column for r in self._requests if r.column)])
        )
        self._schema: dict[str, tuple[str, pa.DataType]] | None = None
        self._source: TableSource | None = None
        self._partitions: PartitionWriter | None = None
        #: the partition buffers were written out and their memory given back to another
        #: consumer: the next rows set aside hold it again
        self._aside_released = False
        #: the thread partitions and their pool (``threads`` > 1, from the first batch with
        #: rows on, unless its keys come dictionary-coded: see :meth:`_choose_threads`)
        self._threaded: ThreadedFold | None = None
        self._chunk_arrays = ReusedArrays()  # a chunk's temporaries, within its buffers
        self._threads_pending = False
        #: groups the first table is sized for (:meth:`expect_groups`), 0: grown as they come
        self._expected_groups = 0
        #: bytes of a thread partition's spill batch (the merge of thread-local tables reads them)
        self._thread_io_batch = 0
        self._peak_lock = threading.Lock()
        #: group ids of the key combinations of dictionary-coded batches seen last
        self._coded_lookup = CodedLookup()

    @property
    def run_rows(self) -> int:
        """Rows per batch of a run file."""
        return self.table_state.run_rows

    @property
    def batch_var_bytes(self) -> int:
        """Key bytes per batch of a run file, about."""
        return self.table_state.batch_var_bytes

    # ------------------------------------------------------------------ schema
    @property
    def input_columns(self) -> list[str]:
        """The input columns the query reads (keys, then aggregated columns)."""
        return list(self._needed)

    @property
    def schema(self) -> pa.Schema | None:
        """The output schema (known after the first ``update``)."""
        layout = self.table_state.layout_or_none
        if layout is None:
            return None
        return pa.schema(list(zip(layout.output_names, layout.output_types())))

    def _init_schema(self, cols: dict[str, Column]) -> None:
        """Learn the input's types from its first batch and plan the buffers."""
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
        self.table_state.layout_or_none = BlockLayout(keys, specs)
        self._schema = {n: (c.kind, c.arrow_type) for n, c in cols.items()}
        self._plan()
        self._threads_pending = self.threads > 1

    def _choose_threads(self, rb: pa.RecordBatch) -> None:
        """At the first batch with rows, start the threads, or fold in one: keys that come
        as dictionary codes fold by their codes (a lookup per row, no hashing), which the
        thread partitions cannot do: they would decode and hash every key (TPC-H Q1 on SF10
        Parquet: 12-13 s of CPU with two threads, 4.5-4.9 s with one)."""
        if not self._threads_pending or rb.num_rows == 0:
            return
        self._threads_pending = False
        if coded_keys(rb, self.keys) is not None:
            log.info("%s: keys come dictionary-coded: folded by their codes, 1 thread", self.name)
            self.threads = 1
            return
        self._start_threads()

    def _plan(self, chunk_share: int = 64) -> None:
        """Size the chunk and I/O buffers and the floor for this aggregator's budget."""
        st = self.table_state
        max_memory = self.budget.max_memory
        plan = plan_buffers(
            st.layout, len(self._needed), max_memory, self.batch_size,
            self._chunk_rows_arg, chunk_share, st.merge_limit,
        )  # fmt: skip
        st.chunk_rows = plan.chunk_rows
        st.scratch = plan.scratch_bytes
        st.run_rows = plan.run_rows
        st.batch_var_bytes = plan.batch_var_bytes
        st.io_bytes = plan.io_bytes
        self.budget.floor = max(self._min_bytes(), min(INITIAL_MEMORY_THRESHOLD, max_memory // 16))

    @property
    def io_batch_bytes(self) -> int:
        """Bytes of one spill batch (without the copies encoding makes)."""
        return self.table_state.io_bytes // IO_COPIES

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
        return [(f.dtype, f.fill) for f in self.table_state.layout.state_fields]

    def _table_bytes(self, capacity: int = MIN_CAPACITY) -> int:
        k = self.table_state.layout.keys
        return TypedHashTable.bytes_for(
            k.num_words, len(k.names), k.has_var, self._payload(), capacity, MIN_ARENA
        )

    def _min_bytes(self) -> int:
        st = self.table_state
        arena = MIN_VAR_ARENA if st.layout.has_var_states else 0
        return self._table_bytes() + arena + st.scratch + st.io_bytes

    # ------------------------------------------------------------------ memory
    def _ensure_table(self) -> TypedHashTable:
        st = self.table_state
        if st.table is None:
            need = max(self.budget.floor, self._min_bytes())
            if not self.budget.hold(need):
                raise MemoryLimitError(
                    f"{self.name} needs {format_size(need)} to start (a table of "
                    f"{format_size(self._table_bytes())}, chunk buffers of "
                    f"{format_size(st.scratch)}, an I/O batch of {format_size(st.io_bytes)}) "
                    f"but the memory manager granted less (max_memory "
                    f"{format_size(self.budget.max_memory)}, {format_size(self.used)} held by "
                    f"it; {describe_holders(self.task_memory_manager.memory_manager)})"
                )
            k = st.layout.keys
            st.table = TypedHashTable(
                k.num_words, len(k.names), k.has_var, self._payload(), hash_is_key=k.hash_is_key
            )
            if 0 < st.resident_parts < NUM_PARTITIONS:  # a split table's hashes share top bits
                st.table.rotation = resident_rotation(st.resident_parts)
            if st.layout.has_var_states and st.var_arena is None:
                st.var_arena = VarArena()
            self.budget.trim()
            expected, self._expected_groups = self._expected_groups, 0
            if expected:
                enlarge_empty(st, st.table, expected)
        return st.table

    # ------------------------------------------------------------------ updating
    def update(self, batch: Any) -> None:
        """Fold one batch (pyarrow RecordBatch/Table, pandas DataFrame or dict of arrays).

        After a ``SpillError`` (disk full, spill cap) the aggregator takes no more input: the
        next call raises again at once, naming the original error."""
        with self.lock:
            self.check_open(f"{self.name}: update() after results() or close()")
            st = self.table_state
            chunk = st.chunk_rows if st.layout_or_none is not None else None
            held = self._hold_coded_scratch(batch)
            if held:
                chunk = None  # the batch is folded by its keys' codes, whole
            try:
                for rb in iter_record_batches(batch, chunk, self._needed):
                    if self._schema is None:
                        if rb.num_rows == 0 and _has_null_typed(rb, self._needed):
                            continue  # nothing to learn the types from, nothing to aggregate
                        cols = to_columns(rb, self._needed)
                        self._init_schema(cols)
                        self._choose_threads(rb)
                    else:
                        self._choose_threads(rb)
                        coded = self._coded_keys(rb)
                        if coded is not None:
                            self._update_coded(rb, coded)
                            continue
                        known = {name: t for name, (_kind, t) in self._schema.items()}
                        rb = _widened_to(rb, known)
                        cols = to_columns(rb, self._needed, known)
                        self._check_schema(cols)
                    self._update_columns(cols, rb.num_rows)
            except SpillError as err:
                self.fail(err)  # folding on would grow past the grant: take no more input
                raise
            finally:
                if held:
                    st.scratch -= held
                    self.budget.trim()

    def update_columns(self, cols: dict[str, Column], n: int) -> None:
        """Fold ``n`` rows of input columns (as :func:`~extagg.columnar.columns.to_columns`
        makes them; extra columns are ignored): :meth:`update` for a caller that holds its
        rows as columns already, such as a partition read back from disk."""
        with self.lock:
            self.check_open(f"{self.name}: update() after results() or close()")
            cols = {name: cols[name] for name in self._needed}
            if self._schema is None:
                self._init_schema(cols)
            else:
                self._check_schema(cols)
            try:
                self._update_columns(cols, n)
            except SpillError as err:
                self.fail(err)
                raise

    def expect_groups(self, groups: int) -> None:
        """Start the table large enough for about ``groups`` groups, as far as the budget
        grants (a caller that knows them, e.g. from the rows of a partition read back), so it
        is not grown, rehashed, step by step up to them. Before any input."""
        if self.table_state.table is not None:
            raise UsageError(f"{self.name}: expect_groups() before the first update()")
        self._expected_groups = max(0, int(groups))

    def limit_merge_memory(self, nbytes: int) -> None:
        """Let the final merge of its runs hold at most ``nbytes`` of read buffers (two at
        least: more passes over the runs instead), for an aggregator whose results are read
        beside others' (``count_distinct``'s levels and the other aggregates are joined as
        they are merged: the first merge took all of a small budget)."""
        self.table_state.merge_limit = max(0, int(nbytes))

    def nest(self, depth: int) -> None:
        """Aggregate the rows of one hash partition ``depth`` levels down, whose key hashes
        share their top ``depth`` * 4 bits: the table and its own partitions use the hashes
        rotated left by that much, and its output has them rotated back. Before any input."""
        st = self.table_state
        if self._schema is not None:
            raise UsageError(f"{self.name}: nest() before the first update()")
        if self.threads > 1:  # the thread partitions rotate the hashes their own way
            raise UsageError(f"{self.name}: nest() needs threads=1, not {self.threads}")
        st.level = depth
        st.rotation = st.rotate_back = PARTITION_BITS * depth

    def _hold_coded_scratch(self, batch: Any) -> int:
        """Bytes held, beyond the chunk buffers, to fold ``batch`` by its keys' codes in one
        piece (0: in chunks as usual): an Arrow batch of up to :data:`CODED_BATCH_ROWS` rows
        goes whole when the manager has the buffers free, the per-chunk overheads then paid
        once a batch even at small budgets (chunks of 1 024 rows at 8 MiB). Held: what the
        per-row path would need for the whole batch (its keys may have to be decoded) plus
        the codes' few words a row (combination, widened codes, group id)."""
        st = self.table_state
        if (
            not isinstance(batch, pa.RecordBatch)
            or self._schema is None
            or self._threaded is not None
            or self._partitions is not None
            or batch.num_rows <= st.chunk_rows
            or batch.num_rows > CODED_BATCH_ROWS
        ):
            return 0
        # enough for the per-row path too: a batch whose keys fall back to being decoded
        per_row = st.layout.keys.scratch_bytes(1, 0) + 16 * len(self._needed) + CODED_ROW_BYTES
        need = batch.num_rows * per_row
        extra = int(need - st.scratch)
        if extra <= 0 or coded_keys(batch, self.keys) is None:
            return 0
        # only memory free now, to one task: asking for more would spill (this table, or
        # another consumer's) or wait for other tasks, dearer than folding in chunks
        mm = self.task_memory_manager.memory_manager
        free = mm.max_memory - mm.execution_memory_used - mm.storage_memory_used
        if extra > free or len(mm.tasks()) > 1 or not self.budget.hold_more(extra):
            return 0
        st.scratch += extra
        return extra

    def _coded_keys(self, rb: pa.RecordBatch) -> CodedKeys | None:
        """The batch's keys as dictionary codes, when they all come so and this aggregator
        folds chunks itself (one thread, no partitions yet)."""
        if self._threaded is not None or self._partitions is not None:
            return None
        return coded_keys(rb, self.keys)

    def _update_coded(self, rb: pa.RecordBatch, coded: CodedKeys) -> None:
        """Fold a batch whose key columns are dictionary arrays: the other columns decoded
        as usual, the keys folded by their codes chunk by chunk (see :mod:`.coded_keys`)."""
        assert self._schema is not None
        keys = set(self.keys)
        aggregated = {r.column for r in self._requests if r.column}
        names = [name for name in self._needed if name not in keys or name in aggregated]
        known = {name: t for name, (_kind, t) in self._schema.items()}
        cols = to_columns(rb, names, known)
        self._check_schema({**cols, **coded.dictionaries()})
        self._update_columns(cols, rb.num_rows, coded, step=max(rb.num_rows, 1))

    def _update_columns(
        self,
        cols: dict[str, Column],
        n: int,
        enc: EncodedKeys | CodedKeys | None = None,
        step: int | None = None,
    ) -> None:
        """Fold ``n`` rows of checked input columns, chunk by chunk (``enc``: their keys
        already encoded, hashes as this aggregator sees them, or their dictionary codes;
        ``step``: rows a chunk, when the caller holds buffers for more than the usual)."""
        if self._threaded is not None:
            self._update_threaded(cols, n)
            return
        st = self.table_state
        step = st.chunk_rows if step is None else max(step, st.chunk_rows)
        every = self.force_spill_rows
        # string min/max/first/last: chunks whose values take at most 1/8 of the budget (the
        # state arena is asked for room for all of them before a chunk is folded)
        state_cols = self._var_state_columns(cols)
        state_offsets = [c.offsets for c in state_cols if c.offsets is not None]
        state_limit = max(1, self.budget.max_memory // 8)
        start = 0
        while start < n:
            stop = min(n, start + step)
            if every is not None:
                stop = min(stop, start + every - st.rows_since_spill)
            if state_offsets and self._partitions is None:
                stop = chunk_stop(state_offsets, start, stop, state_limit)
            part = (
                cols
                if (start == 0 and stop == n)
                else {k: c.slice(start, stop) for k, c in cols.items()}
            )
            # a chunk is folded whole (keys placed, every aggregate updated, rows counted, a
            # spill it needs written and the table emptied) before a Ctrl-C is raised:
            # ``metrics.records_read`` counts exactly the rows folded
            with deferred_interrupts():
                self._update_chunk(
                    part, stop - start, None if enc is None else enc.slice(start, stop)
                )
                if every is not None and st.rows_since_spill >= every:
                    if st.table is not None and st.table.num_groups:
                        spill_table(st, f"forced every {every} rows")
                    st.rows_since_spill = 0
            start = stop

    def _update_chunk(
        self, cols: dict[str, Column], n: int, enc: EncodedKeys | CodedKeys | None = None
    ) -> None:
        st = self.table_state
        if isinstance(enc, CodedKeys):
            if self._fold_coded(cols, n, enc):
                return
            cols = {**cols, **enc.decode()}  # too many combinations, or no room: as usual
            enc = None
        if self._partitions is not None and st.resident_parts == 0:
            self._set_aside(cols, n, 0, None if enc is None else enc.hashes)
            return
        if n > 1 and self._chunk_var_bytes(cols) > self.budget.max_memory // 4:
            # long strings: the chunk's bytes (held once more while packed) would not fit
            # beside the table, so fold it in halves (400 keys of 3 KB failed at 1 MiB)
            half = n // 2
            for lo, hi in ((0, half), (half, n)):
                part = {name: c.slice(lo, hi) for name, c in cols.items()}
                self._update_chunk(part, hi - lo, None if enc is None else enc.slice(lo, hi))
            return
        table = self._ensure_table()
        if st.layout.has_var_states:  # first: growing the arena trims what is held to its use
            state_cols = self._var_state_columns(cols)
            state_bytes = sum(c.data.nbytes for c in state_cols if c.data is not None)
            make_room_for_var_states(st, state_bytes)
            table = self._ensure_table()
        key_cols = [cols[k] for k in self.keys]
        var_bytes = sum(c.data.nbytes for c in key_cols if c.data is not None)
        if var_bytes:
            self._make_room_for_key_bytes(var_bytes)
            table = self._ensure_table()
        if enc is None:
            enc = self._encode(key_cols, n)
        if self._partitions is not None:  # some partitions resident: set the others' rows aside
            cols, enc, n = self._route(cols, enc, n)
            if n == 0:
                return
        # the group ids of a chunk's rows: filled again at every chunk (see ReusedArrays)
        gids = (
            self._chunk_arrays.get("gids", n, np.int64)
            if n <= st.chunk_rows
            else np.empty(n, dtype=np.int64)
        )
        seq0 = self.metrics.records_read
        pos = 0
        hashes = enc.hashes
        while pos < n:
            if st.layout.has_var_states:  # again: the key bytes' room or a spill mid-chunk
                self._room_for_var_states(cols, pos, n)  # (which empties the arena) took it
            table = self._ensure_table()
            if table.rotation and hashes is enc.hashes:
                hashes = rotate_left(enc.hashes, table.rotation)
            nxt, status = table.insert(
                hashes, enc.words, enc.nulls, enc.var_offsets, enc.var_data, pos, gids
            )
            if nxt > pos:
                self._fold(table, cols, gids, pos, nxt, n, seq0)
            pos = nxt
            try:
                if status == TK.TABLE_FULL:
                    if not try_grow(st, table):
                        self._spill_or_partition(table)
                elif status == TK.ARENA_FULL:
                    grow_arena_or_spill(st, table, table.pending_var_bytes(enc.var_offsets, pos))
            except BaseException:
                # a spill that failed (SpillError: disk full, a spill cap) leaves the rows
                # folded so far in the table, and in the results: counted, so that a caller
                # resuming from ``records_read`` neither skips nor repeats a row
                self.metrics.records_read += pos
                raise
            if status == TK.TABLE_FULL and self._partitions is not None:
                # the rest of this chunk is routed too
                self.metrics.records_read += pos
                if pos < n:
                    rest = {k: c.slice(pos, n) for k, c in cols.items()}
                    self._update_chunk(rest, n - pos, enc.slice(pos, n))
                self.budget.trim()
                return
        self.metrics.records_read += n
        st.rows_since_spill += n
        if var_bytes or self._partitions is not None:
            self.budget.trim()

    def _fold_coded(self, cols: dict[str, Column], n: int, coded: CodedKeys) -> bool:
        """Fold a chunk by its keys' codes: insert the key combinations present (few), then
        fold every row with its combination's group id. False (nothing done) when there may
        be too many combinations, or the table cannot take the present ones without growing
        (then the caller folds the chunk the usual way, which grows or spills)."""
        st = self.table_state
        if self._partitions is not None:
            return False
        found = coded.combinations()
        if found is None:
            return False
        combo, total = found
        self._ensure_table()  # after a spill: a new table and its string-state arena
        if st.layout.has_var_states:  # first: growing the arena trims what is held to its use
            state_cols = self._var_state_columns(cols)
            state_bytes = sum(c.data.nbytes for c in state_cols if c.data is not None)
            make_room_for_var_states(st, state_bytes)
        table = self._ensure_table()
        lookup = self._coded_lookup.get(table, self.metrics.spill_count, coded, total)
        gids, misses = coded.group_ids(combo, lookup)
        new = coded.missing(combo, total, lookup) if misses else combo[:0]
        if len(new):
            key_cols = coded.key_columns(new)
            m = len(new)
            enc = self._encode([key_cols[k] for k in self.keys], m)
            var_bytes = int(enc.var_offsets[-1] - enc.var_offsets[0]) if len(enc.var_offsets) else 0
            if table.num_groups + m > table.grow_at or (
                table.has_var and table.arena_used + var_bytes > table.arena.shape[0]
            ):
                return False
            group_of = np.empty(m, dtype=np.int64)
            nxt, status = table.insert(
                enc.hashes, enc.words, enc.nulls, enc.var_offsets, enc.var_data, 0, group_of
            )
            assert nxt == m and status == 0, (nxt, m, status)  # room was checked above
            lookup[new] = group_of
            gids = lookup[combo]
        self._fold(table, cols, gids, 0, n, n, self.metrics.records_read)
        self.metrics.records_read += n
        st.rows_since_spill += n
        return True

    def _var_state_columns(self, cols: dict[str, Column]) -> list[Column]:
        """The input column of every string min/max/first/last (once per aggregate)."""
        layout = self.table_state.layout
        return [cols[str(layout.specs[i].column)] for i in layout.var_specs]

    def _chunk_var_bytes(self, cols: dict[str, Column]) -> int:
        """The string bytes of a chunk's keys and string-state inputs."""
        used = [cols[k] for k in self.keys]
        if self.table_state.layout_or_none is not None and self.table_state.layout.has_var_states:
            used += self._var_state_columns(cols)
        return sum(int(c.offsets[-1] - c.offsets[0]) for c in used if c.offsets is not None)

    def _room_for_var_states(self, cols: dict[str, Column], start: int, stop: int) -> None:
        """Room in the string-state arena for the values of rows ``start:stop`` (the most
        their min/max/first/last can append), before they are inserted."""
        self._ensure_table()
        arena = self.table_state.var_arena
        assert arena is not None
        need = 0
        for col in self._var_state_columns(cols):
            if col.offsets is not None:
                need += int(col.offsets[stop]) - int(col.offsets[start])
        if arena.room < need:
            make_room_for_var_states(self.table_state, need)

    def _make_room_for_key_bytes(self, var_bytes: int) -> None:
        """Chunk key bytes may be copied once when packed: hold them too for this chunk."""
        self.maybe_spill(
            self.table_state.in_use() + var_bytes, "no memory for the key bytes of a chunk"
        )
        if not self.budget.hold_more(var_bytes) and not self._restart_empty_table(var_bytes):
            raise MemoryLimitError(
                f"{self.name} needs {format_size(var_bytes)} more for the key bytes of a chunk "
                f"({self.budget.describe()})"
            )

    def _restart_empty_table(self, var_bytes: int) -> bool:
        """An empty table started large (sized for a partition's rows read back, without
        headroom) may leave no room for a chunk's key bytes: start it again at its smallest and
        hold them (``count_distinct`` beside three aggregates by a string key failed at 1 MiB
        with an empty 16 384-slot table holding 623 KiB). Whether they are held now."""
        st = self.table_state
        table = st.table
        if table is None or table.num_groups != 0 or table.nbytes <= self._table_bytes():
            return False
        st.table = None
        st.var_arena = None
        self._chunk_arrays.clear()
        self.budget.free(self.budget.used)
        self._ensure_table()
        return self.budget.hold_more(var_bytes)

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
        st = self.table_state
        layout = st.layout
        whole = lo == 0 and hi == n
        g = gids if whole else gids[lo:hi]
        columns: list[Column | None] = []
        for spec in layout.specs:
            col = None if spec.column is None else cols[spec.column]
            columns.append(col if col is None or whole else col.slice(lo, hi))
        states = [[table.payload[i] for i in indexes] for indexes in layout.state_index]
        # the common aggregates in one pass over the groups' interleaved state rows
        F.update_all(
            layout.specs,
            states,
            g,
            columns,
            seq0 + lo,
            table.rows,
            arena=st.var_arena,
            groups=table.num_groups,
        )

    # ------------------------------------------------------------------ threads
    def _start_threads(self) -> None:
        """Plan the thread partitions for the budget (fewer when a child per partition would
        not fit) and hold the chunk buffers; ``self.threads`` becomes what is used."""
        st = self.table_state
        max_memory = self.budget.max_memory
        per_row = st.layout.keys.scratch_bytes(1, 0) + 8 + 2 * 16 * len(self._needed)
        rows = max(1 << 10, min(THREAD_CHUNK_ROWS, max_memory // (16 * per_row)))
        rows = 1 << (rows.bit_length() - 1)
        scratch = rows * per_row
        least_rows = AUTO_THREAD_MIN_CHUNK_ROWS if self._threads_auto else thread_fold.INLINE_ROWS
        if rows < least_rows:  # asked for or not: chunks this small are folded inline anyway
            log.info(
                "%s: a budget of %s gives chunks of %d rows with threads: 1 thread (each "
                "partition's share of a chunk would cost more to hand over than to fold)",
                self.name, format_size(max_memory), rows,
            )  # fmt: skip
            self.threads = 1
            return
        wanted = bits = partition_bits(self.threads)
        while bits:
            child_max = (max_memory - scratch) >> bits
            floor = self._child_floor(child_max)
            least = AUTO_THREAD_MIN_BUDGET if self._threads_auto else ENGINE_MIN_BUDGET
            if child_max >= least and (floor << bits) + scratch <= max_memory // 2:
                break
            bits -= 1
        if bits < wanted:
            log.info(
                "%s: a budget of %s holds %d thread partitions, not %d: %d thread%s",
                self.name, format_size(max_memory), 1 << bits, 1 << wanted,
                min(self.threads, 1 << bits), "" if bits == 0 else "s",
            )  # fmt: skip
        if bits == 0:
            self.threads = 1
            return
        threads = min(self.threads, 1 << bits)
        plan = (st.chunk_rows, st.scratch, st.io_bytes, self.budget.floor)
        st.chunk_rows, st.scratch, st.io_bytes = rows, scratch, 0
        self.budget.floor = scratch  # held until the results: the caller's task stays active
        threaded = ThreadedFold(
            name=self.name,
            threads=threads,
            bits=bits,
            memory_manager=self.task_memory_manager.memory_manager,
            owner_task=self.task_memory_manager.task_id,
            # through weak references: the fold held by this aggregator must not hold it in
            # turn (dropped without close(), it is finalised at once, not by the cyclic GC)
            make_child=_weakly(self._thread_child),
            encode=_weakly(self._encode_part),
            on_peak=_weakly(self._note_peak),
            make_local=_weakly(self._thread_local_child) if self._order_free else None,
            merge=_weakly(self._merge_thread_streams),
        )
        self._threaded = threaded
        try:
            if not self.budget.hold(scratch):
                raise MemoryLimitError(f"{format_size(scratch)} of chunk buffers not granted")
            threaded.start()  # every child takes its table now, before any worker runs
        except MemoryLimitError as err:  # the share left is too small: one thread
            log.info("%s: %d threads not started (%s): 1 thread", self.name, threads, err)
            self._threaded = None
            threaded.close()
            st.chunk_rows, st.scratch, st.io_bytes, self.budget.floor = plan
            self.budget.trim()
            self.threads = 1
            return
        self.threads = threads

    def _child_floor(self, max_memory: int) -> int:
        """The memory a thread partition's child planning with ``max_memory`` holds at least."""
        st = self.table_state
        plan = plan_buffers(
            st.layout, len(self._needed), max_memory, self.batch_size, self._chunk_rows_arg
        )
        arena = MIN_VAR_ARENA if st.layout.has_var_states else 0
        least = self._table_bytes() + arena + plan.scratch_bytes + plan.io_bytes
        return max(least, min(INITIAL_MEMORY_THRESHOLD, max_memory // 16))

    def _encode_part(
        self, part: dict[str, Column], n: int, reuse: Any
    ) -> EncodedKeys:  # the threads' encode: a slice's keys
        return self._encode([part[k] for k in self.keys], n, reuse)

    def _thread_child(
        self, part: int, task: TaskMemoryManager, bits: int, name: str | None = None
    ) -> HashAggregator:
        """The aggregator of thread partition ``part``: same query, a worker's task, the
        spill dirs shared, hashes rotated by ``bits``."""
        st = self.table_state
        child = HashAggregator(
            self.keys,
            self._aggs,
            memory_manager=task,
            batch_size=self.batch_size,
            fan_in=self.fan_in,
            compression=self.compression,
            # about every N rows in all: each of the 2**bits partitions gets ~1/2**bits of them
            force_spill_rows=(
                None if self.force_spill_rows is None else max(1, self.force_spill_rows >> bits)
            ),
            chunk_rows=self._chunk_rows_arg,
            threads=1,
            name=name or f"{self.name}/t{part}",
        )
        child.share_spill_dirs(self.runs)
        child.table_state.rotation = child.table_state.rotate_back = bits
        child.budget.max_memory = child._task_budget = max(
            1, (self.budget.max_memory - st.scratch) >> bits
        )
        child._schema = self._schema
        child.table_state.layout_or_none = st.layout
        child._plan()
        self._thread_io_batch = max(self._thread_io_batch, child.io_batch_bytes)
        threaded = self._threaded
        assert threaded is not None
        child.budget.on_grant = threaded.note_grant
        return child

    def _thread_local_child(self, worker: int, task: TaskMemoryManager) -> HashAggregator:
        """Worker ``worker``'s own table when there are few groups: a thread partition's
        aggregator that sees every hash unrotated."""
        threaded = self._threaded
        assert threaded is not None
        child = self._thread_child(worker, task, threaded.bits, f"{self.name}/local{worker}")
        child.table_state.rotation = child.table_state.rotate_back = 0
        child.budget.floor = child._min_bytes()  # few groups: no room kept for growth
        return child

    def drop_floor(self) -> None:
        """Keep no memory beyond what the table and buffers use (a thread partition whose
        rows now go to thread-local tables; its worker's task stays active through them)."""
        with self.lock:
            self.budget.floor = 0
            self.budget.trim()

    def _merge_thread_streams(
        self,
        sources: list[BlockSource[ColumnBlock]],
        groups: list[int | None],
        reserve: ReserveMerge,
    ) -> Iterator[ColumnBlock]:
        """The thread partitions' stream and the thread-local tables' streams merged, equal
        keys combined, in hash order; ``groups``: the most rows a source holds (``None``: any
        number). Merge buffers are held through ``reserve`` (a worker's: the caller's task has
        the smallest share): about two batches per source, a small table's no more than its
        rows."""
        st = self.table_state
        batch = max(self._thread_io_batch, st.runs.max_batch_bytes, 1)
        row = max(1, st.layout.fixed_row_bytes)
        need = [batch if g is None else max(1, min(batch, g * row)) for g in groups]
        per_source = -(-sum(need) // len(need)) * MERGE_COPIES
        fan_in, _ = reserve(per_source, len(sources), None, None)
        yield from merge_in_passes(
            sources,
            st.layout.combine,
            fan_in=fan_in,
            write_run=lambda blocks: write_merged_run(st, blocks),
        )

    @property
    def groups_in_memory(self) -> int:
        """Groups in the in-memory table now (with threads: in all the threads' tables)."""
        threaded = self._threaded
        if threaded is not None:
            return threaded.groups_held()
        table = self.table_state.table
        return 0 if table is None else table.num_groups

    def _note_peak(self, workers: int) -> None:
        """Record the most memory this aggregator and its workers held together."""
        with self._peak_lock:
            total = workers + self.used
            if total > self.metrics.peak_granted_bytes:
                self.metrics.peak_granted_bytes = total

    def _update_threaded(self, cols: dict[str, Column], n: int) -> None:
        """Fold ``n`` rows chunk by chunk on the threads; on any error the aggregator closes
        (its children and files too) and the error propagates unchanged."""
        st = self.table_state
        threaded = self._threaded
        assert threaded is not None
        # chunks whose strings (keys and values) take at most 1/24 of the budget: up to three
        # more copies are held while a chunk is gathered per partition (see _fold_threaded)
        var_offsets = [c.offsets for c in cols.values() if c.offsets is not None]
        var_limit = max(1, self.budget.max_memory // 24)
        start = 0
        while start < n:
            stop = min(n, start + st.chunk_rows)
            if var_offsets:
                stop = chunk_stop(var_offsets, start, stop, var_limit)
            part = (
                cols
                if (start == 0 and stop == n)
                else {k: c.slice(start, stop) for k, c in cols.items()}
            )
            # a chunk is folded by every worker before a Ctrl-C is raised (or not at all, the
            # aggregator then closed, if a worker failed): ``records_read`` counts the rows folded
            with deferred_interrupts():
                try:
                    self._fold_threaded(threaded, part, stop - start)
                except BaseException as exc:
                    if isinstance(exc, Exception):  # what a later update() says (check_open)
                        self.fail(exc)
                    self.close()
                    raise
            start = stop

    def _fold_threaded(self, threaded: ThreadedFold, cols: dict[str, Column], n: int) -> None:
        # the strings of a chunk are copied again, gathered per partition: a worker gathers
        # its partition's key bytes, then each string column's, slice by slice, then joins
        # the slices' pieces: at most three copies of the strings at once over all workers
        var_bytes = sum(c.data.nbytes for c in cols.values() if c.data is not None)
        if var_bytes and not self.budget.hold_more(3 * var_bytes):
            raise MemoryLimitError(
                f"{self.name} needs {format_size(3 * var_bytes)} more for the strings of a "
                f"chunk ({self.budget.describe()})"
            )
        self._note_peak(threaded.held())
        try:
            threaded.fold(cols, n)
        finally:
            self._sync_thread_metrics(threaded)  # spills are seen (progress bars) as they happen
        self.metrics.records_read += n
        if var_bytes:
            self.budget.trim()

    def _sync_thread_metrics(self, threaded: ThreadedFold) -> None:
        """The thread partitions do all the spilling: this aggregator's spill and merge
        figures are theirs, summed."""
        self.metrics.take_spills_of(threaded.child_metrics())

    # -- what a thread partition's child does for ThreadedFold
    def start(self) -> None:
        """Take the starting memory (the table) now."""
        with self.lock:
            self._ensure_table()

    def fold_encoded(self, cols: dict[str, Column], enc: EncodedKeys, n: int) -> None:
        """Fold ``n`` rows whose keys are already encoded (hashes as this aggregator sees
        them, i.e. rotated); the columns must have the types of the first batch."""
        with self.lock:
            self.check_open(f"{self.name}: update() after results() or close()")
            try:
                self._update_columns(cols, n, enc)
            except SpillError as err:
                self.fail(err)
                raise

    def blocks(self) -> Iterator[ColumnBlock]:
        """Every group once, combined, in hash order (hashed as the parent sees them)."""
        return self._blocks()

    def read_with(self, submit: Callable[..., Future[Any]], lanes: int) -> None:
        """Gather the in-memory table's result batches ``lanes`` at a time, the others than
        the reader's on ``submit`` (a thread partition's aggregator: see ``TableSource``)."""
        with self.lock:
            self.table_state.read_pool = submit
            self.table_state.read_lanes = lanes

    @property
    def takes_groups(self) -> bool:
        """Whether :meth:`fold_groups` may be called: not once hash-partitioned."""
        return self._partitions is None

    def fold_groups(self, block: ColumnBlock) -> None:
        """Fold a block of combined groups (a thread-local table's, hashed as the parent sees
        them) into the table, as a spilled run's groups are merged."""
        with self.lock:
            self.check_open(f"{self.name}: fold_groups() after results() or close()")
            self._fold_states(block)

    # ------------------------------------------------------------------ partitioning
    def _spill_or_partition(self, table: TypedHashTable) -> None:
        """The full table cannot grow: spill it, and maybe partition the input from now on."""
        st = self.table_state
        may_partition = self._order_free and st.level < MAX_LEVEL and self.force_spill_rows is None
        if self._partitions is not None:  # split before: keep half as many partitions
            hashes, gids = table.sort_by_hash()
            if split_table(st, table, hashes, gids, self._partitions) is not None:
                return
            reason = "memory for growth not granted; every partition set aside from now on"
            spill_table(st, reason, sorted_table=(hashes, gids))
            del hashes, gids
            st.table = None
            st.var_arena = None
            st.resident_parts = 0
            self.budget.trim()
            return

        def split(hashes: np.ndarray, gids: np.ndarray) -> bool:
            self._partitions = split_table(st, table, hashes, gids, None)
            return self._partitions is not None

        splits = not (st.layout.keys.has_var or st.layout.has_var_states)
        if not spill_or_partition(st, table, may_partition, split if splits else None):
            return
        if self._partitions is not None:  # split: the lower partitions stay in the table
            self._enlarge_split_chunks()
            return
        # no table any more: larger chunks and a buffer per partition, as large as granted
        plans = [(st.chunk_rows, st.scratch)]
        if self._chunk_rows_arg is None:
            plans.insert(0, partition_chunks(st.layout, len(self._needed), self.budget.max_memory))
        self._partitions = start_partitioning(st, plans)
        if self._partitions is not None:
            st.resident_parts = 0

    def _enlarge_split_chunks(self) -> None:
        """After a split, most rows of a chunk are set aside (written per partition) and each
        chunk costs a sort and a write call per partition whatever its size: chunks as large
        as the input had once partitioned (``partition_chunks``), if the budget grants their
        buffers beside the kept table (the fold's and the set-aside's temporaries and the
        kept rows' copies), else as large as granted, else unchanged."""
        st = self.table_state
        if self._chunk_rows_arg is not None or st.chunk_rows <= 0:
            return
        rows, aside_scratch = partition_chunks(st.layout, len(self._needed), self.budget.max_memory)
        per_row = st.scratch // st.chunk_rows + aside_scratch // max(1, rows)
        while rows > st.chunk_rows:
            if self.budget.hold_more(rows * per_row - st.scratch):
                st.chunk_rows, st.scratch = rows, rows * per_row
                log.debug("%s: chunks of %d rows while split", self.name, rows)
                return
            rows //= 2

    def _route(
        self, cols: dict[str, Column], enc: EncodedKeys, n: int
    ) -> tuple[dict[str, Column], EncodedKeys, int]:
        """Set aside the rows of a chunk whose partitions are no longer resident; returns the
        others (copied, their copies held: fixed-width keys, no strings), to fold."""
        st = self.table_state
        writer = self._partitions
        assert writer is not None
        keep = partition_of(enc.hashes) < st.resident_parts
        kept = int(np.count_nonzero(keep))
        if kept == n:
            return cols, enc, n
        try:
            set_aside(st, writer, cols, enc.hashes, np.flatnonzero(~keep))
        except MemoryLimitError:
            raise
        except BaseException:
            self.close()  # some rows of this chunk may be on disk and others not
            raise
        if kept == 0:
            return cols, enc, 0
        rows = np.flatnonzero(keep)
        copies = enc.nbytes() * kept // max(1, n) + 8 * kept
        copies += sum(c.nbytes() for c in cols.values()) * kept // max(1, n)
        if not self.budget.hold_more(copies):
            if st.table is not None and st.table.num_groups:
                # the others could not give it (a thread's sibling busy folding spills only
                # between its chunks): the kept partitions' groups go to a run instead (at
                # 64 MiB, two threads, 20 M rows over 1 M keys failed here, 9 MiB elsewhere)
                spill_table(st, "memory to fold the kept rows of a chunk not granted")
            if not self.budget.hold_more(copies):
                raise MemoryLimitError(
                    f"{self.name} needs {format_size(copies)} more to fold the kept rows of a "
                    f"chunk ({self.budget.describe()})"
                )
        return {k: c.take(rows) for k, c in cols.items()}, enc.take(rows), kept

    def _set_aside(
        self, cols: dict[str, Column], n: int, start: int, hashes: np.ndarray | None = None
    ) -> None:
        """Write rows ``start..n`` of a chunk to their partitions."""
        assert self._partitions is not None
        self._hold_released_buffers()
        if start:
            cols = {k: c.slice(start, n) for k, c in cols.items()}
            hashes = None if hashes is None else hashes[start:n]
        if hashes is None:
            hashes = self._encode([cols[k] for k in self.keys]).hashes
        try:
            set_aside(self.table_state, self._partitions, cols, hashes)
        except MemoryLimitError:
            raise
        except BaseException:
            # some rows of this chunk may be on disk and others not: nothing can be trusted
            self.close()
            raise

    def _hold_released_buffers(self) -> None:
        """Hold again the partition buffers a spill gave back (see :meth:`force_spill`)."""
        if not self._aside_released:
            return
        st = self.table_state
        if not st.budget.hold(st.in_use()):
            raise MemoryLimitError(
                f"{self.name} needs {format_size(st.in_use())} for its partition buffers and "
                f"chunk ({st.budget.describe()})"
            )
        self._aside_released = False

    def _child(self) -> HashAggregator:
        """An aggregator for one partition: same query, same memory manager and spill dirs."""
        st = self.table_state
        level = st.level + 1
        child = HashAggregator(
            self.keys,
            self._aggs,
            memory_manager=self.task_memory_manager,
            batch_size=self.batch_size,
            fan_in=self.fan_in,
            compression=self.compression,
            chunk_rows=self._chunk_rows_arg,
            name=f"{self.name}/p{level}",
            threads=1,
        )
        child.share_spill_dirs(self.runs)
        child.table_state.level = level
        child.table_state.rotation = st.rotation + PARTITION_BITS
        child.table_state.rotate_back = PARTITION_BITS
        # what this aggregator and its own parents still hold is not the child's to plan with
        child.budget.max_memory = max(1, self._task_budget - self.task_memory_manager.memory_used)
        child._task_budget = self._task_budget
        child._schema = self._schema
        child.table_state.layout_or_none = st.layout
        child._plan(chunk_share=8)  # it reads large partition batches: fewer, larger chunks
        return child

    def _spill_split_table(self) -> None:
        """At the results, a split table whose partitions also have groups in runs (spilled
        before it was split) is spilled too, partition by partition: each partition's groups
        are then combined in its aggregator, and nothing is merged afterwards (the table would
        otherwise be merged with the partitions' outputs, holding its memory meanwhile)."""
        st = self.table_state
        if _runs_start_at(st.runs.paths, st.resident_parts):
            return  # the table's partitions have no groups elsewhere: it is read first
        assert st.table is not None
        if st.table.num_groups:
            spill_table(st, "a split table, at the results")
        st.table = None
        st.var_arena = None
        st.resident_parts = 0
        self.budget.trim()

    def _presize(self, groups: int) -> None:
        """Start the table large enough for ``groups`` groups, as far as granted (a
        partition's aggregator, told the rows it is about to get)."""
        table = self._ensure_table()
        if table.num_groups == 0:
            enlarge_empty(self.table_state, table, groups)

    def _fold_states(self, block: ColumnBlock) -> None:
        """Fold a block of groups (states of the parent's spilled table, hashed as the parent
        sees them) into the table: equal keys combined, new keys inserted; a full table that
        cannot grow is spilled as a run and started again."""
        st = self.table_state
        assert self._partitions is None  # a partition's groups come before its rows
        layout = st.layout
        hashes = rotate_left(block.hashes, st.rotate_back)
        words, nulls, var_off, var_data = layout.key_arrays(block)
        n = len(block)
        gids = np.empty(n, dtype=np.int64)
        pos = 0
        with deferred_interrupts():  # a block is folded whole or not at all
            while pos < n:
                table = self._ensure_table()
                nxt, status = table.insert(hashes, words, nulls, var_off, var_data, pos, gids)
                if nxt > pos:
                    layout.merge_into(table, gids[pos:nxt], block, pos, nxt)
                pos = nxt
                if status == TK.TABLE_FULL and not try_grow(st, table):
                    spill_table(st, "memory for growth not granted", keep_arrays=True)
                    enlarge_empty(st, table)
                elif status == TK.ARENA_FULL:
                    grow_arena_or_spill(st, table, table.pending_var_bytes(var_off, pos))

    # ------------------------------------------------------------------ Spillable hooks
    def should_spill(self, current: int) -> bool:
        """Spill when ``current`` bytes (all the table and buffers need) are not granted."""
        return not self.budget.hold(current)

    def release_after_spill(self) -> None:
        """Nothing: spilling the table gave back what it no longer needs."""

    def collection_is_empty(self) -> bool:
        """Whether the in-memory hash table holds no group."""
        table = self.table_state.table
        return table is None or table.num_groups == 0

    def spill_collection(self, size: int, reason: str) -> None:
        """Write the hash table's groups as a sorted run and start it again empty."""
        spill_table(self.table_state, reason)

    def force_spill(self, trigger: Consumer) -> int:
        """Spill because another consumer needs memory; returns the bytes freed."""
        before = self.used
        if self._source is not None:
            self._source.spill_rest()
        elif (
            self.phase == OPEN
            or (self.phase == READING and self._threaded is None and self._partitions is None)
        ) and not self.collection_is_empty():
            # READING: results asked for but not begun (a stream joined beside others, read
            # after them: count_distinct's levels), its table not yet handed to a source
            spill_table(
                self.table_state,
                f"requested by {getattr(trigger, 'name', trigger)}",
                release_all=True,
            )
            self._chunk_arrays.clear()  # all memory given back: the chunk's too
        elif self.phase == OPEN and self.used and trigger is not self and self._threaded is None:
            # nothing to spill, but memory held for more input: an empty table kept after its
            # own spill, or the buffers of rows set aside by partition. Another consumer wants
            # it now (a count_distinct setting its rows aside starved at 4 MiB beside it)
            st = self.table_state
            if self._partitions is not None and st.table is None:
                with deferred_interrupts():
                    self._partitions.release_buffers()
                self._aside_released = True
            elif st.table is not None and st.table.num_groups == 0:
                st.table = None
                st.var_arena = None
            else:
                return 0
            st.budget.free(st.budget.used)
            self._chunk_arrays.clear()
        else:
            return 0
        return max(0, before - self.used)

    def release_collection(self) -> None:
        """Drop the hash table and its arena; close the source read and abort open partitions."""
        self.table_state.table = None
        self.table_state.var_arena = None
        self._chunk_arrays.clear()
        if self._threaded is not None:
            threaded, self._threaded = self._threaded, None
            threaded.close()
        if self._source is not None:
            self._source.close()
            self._source = None
        if self._partitions is not None:
            self._partitions.abort()
            self._partitions = None

    # ------------------------------------------------------------------ results
    def results(self, *, ordered: bool = True) -> Iterator[pa.RecordBatch]:
        """Every group once, as Arrow record batches in hash order. Destructive; call once.

        ``ordered=False``: in no particular order - when nothing was spilled, partitioned or
        split among threads, the table's groups as it made them (no sort, a sequential read:
        for a reader that folds them again, as ``count_distinct``'s second level does)."""
        with self.lock:
            self.begin_reading(f"{self.name}: results() can be called only once, before close()")
        return (batch for _hashes, batch in self._results(ordered))

    def hashed_results(self) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
        """:meth:`results` with each batch's key hashes (``uint64``, ascending): two
        aggregators over the same groups can be joined on them as their batches stream."""
        with self.lock:
            self.begin_reading(f"{self.name}: results() can be called only once, before close()")
        return self._results()

    def _results(self, ordered: bool = True) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
        try:
            layout = self.table_state.layout_or_none
            if layout is None:
                if not self.keys:  # a global aggregate of no input at all: one row
                    yield GLOBAL_HASHES, global_row_untyped(self._requests)
                return
            groups_before = self.metrics.groups
            for block in self._blocks(ordered):
                for start in range(0, len(block), self.batch_size):
                    part = (
                        block.slice(start, start + self.batch_size)
                        if len(block) > self.batch_size
                        else block
                    )
                    self.metrics.groups += len(part)
                    yield part.hashes, layout.finish(part)
                    self.check_not_closed_while_reading()
            if not self.keys and self.metrics.groups == groups_before:
                self.metrics.groups += 1  # a global aggregate has one row, even of no input
                block = layout.initial_block(1)
                yield block.hashes, layout.finish(block)
        finally:
            self.close()

    def _blocks(self, ordered: bool = True) -> Iterator[ColumnBlock]:
        """Every group once, as combined blocks in hash order: the in-memory table, the runs
        and the partitions merged (``ordered=False``: the table alone is read unsorted)."""
        st = self.table_state
        if self._threaded is not None:
            with self.lock:
                threaded = self._threaded
                st.scratch = 0  # no more chunks: give back their buffers
                self.budget.floor = 0
                self.budget.trim()
            return threaded.blocks(lambda _merged: self._sync_thread_metrics(threaded))
        with self.lock:
            if st.table is not None and self._partitions is not None and st.runs:
                self._spill_split_table()
            if st.table is not None:
                self.metrics.peak_memory_bytes = max(self.metrics.peak_memory_bytes, st.in_use())
                alone = not st.runs and self._partitions is None
                self._source = TableSource(st, st.table, ordered=ordered or not alone)
                st.table = None
            partitions = None
            state_runs: list[str] = []
            if self._partitions is not None:
                writer, self._partitions = self._partitions, None
                try:
                    paths = writer.finish()
                except BaseException:
                    writer.abort()
                    raise
                assert self._schema is not None
                # the tables spilled before partitioning: each partition's groups folded into
                # its child, so the children's outputs need no merge (not for string states)
                state_runs = [] if st.layout.has_var_states else st.runs.take_paths()
                partitions = PartitionSource(
                    paths,
                    self.runs,
                    {name: self._schema[name] for name in self._needed},
                    name=self.name,
                    make_child=self._child,
                    feed=lambda child, cols, n: child._update_columns(cols, n),
                    child_blocks=lambda child: child._blocks(),
                    child_done=lambda child: self.metrics.absorb(child.metrics),
                    state_runs=state_runs,
                    fold_states=lambda child, block: child._fold_states(block),
                    presize=lambda child, rows: child._presize(rows // 2),
                    feed_bytes=buffer_bytes(self.budget.max_memory),
                )
            st.scratch = 0  # no more chunks to fold: give back their buffers
            # reading a partition back holds one of its batches (stored, decompressed, decoded),
            # or one batch of a run of groups, or consecutive small batches fed together up to
            # the size of one (held twice: the batches, then joined)
            batch = max(buffer_bytes(self.budget.max_memory), st.runs.max_batch_bytes)
            st.aside_bytes = IO_COPIES * batch if partitions is not None else 0
            self.budget.floor = 0
            self.budget.trim()
            # a split table holds the lower partitions, the partitions' aggregators the upper
            # ones (the runs are theirs): the table's groups first, then theirs, no merge
            apart = partitions is not None and not st.runs and st.resident_parts > 0
            if apart and state_runs:
                apart = _runs_start_at(state_runs, st.resident_parts)
        return result_blocks(
            st, self._source, partitions, self.reserve_merge_memory, self.io_batch_bytes,
            apart=apart,
        )  # fmt: skip

    def _encode(
        self, key_cols: list[Column], n: int | None = None, reuse: ReusedArrays | None = None
    ) -> EncodedKeys:
        """Hash and canonicalise keys (``n`` rows: needed without key columns); a partition's
        aggregator rotates the hashes (see :func:`~extagg.columnar.partition_files.rotate_left`).
        ``reuse``: see :meth:`~extagg.columnar.keys.KeyLayout.encode`."""
        rotation = self.table_state.rotation
        enc = self.table_state.layout.keys.encode(key_cols, n, reuse)
        if rotation:
            enc.hashes = rotate_left(enc.hashes, rotation)
        return enc

    # ------------------------------------------------------------------ cleanup
    def __repr__(self) -> str:
        return (
            f"<HashAggregator {self.name} {self.phase}: keys={self.keys}, "
            f"{self.metrics.records_read} rows, {self.metrics.spill_count} spills, "
            f"{format_size(self.used)} held>"
        )


def _runs_start_at(paths: list[str], part: int) -> bool:
    """Whether every run (sorted by hash) holds only hashes of partition ``part`` and up."""
    bound = part << (64 - PARTITION_BITS)
    for path in paths:
        with RunReader(path) as reader:
            if reader.batches and reader.batches[0].min_hash < bound:
                return False
    return True


def _has_null_typed(rb: pa.RecordBatch, names: list[str]) -> bool:
    index = rb.schema.get_field_index
    return any(index(n) >= 0 and pa.types.is_null(rb.schema.field(n).type) for n in names)


def _widened_to(rb: pa.RecordBatch, known: dict[str, pa.DataType]) -> pa.RecordBatch:
    """``rb`` with a number column whose type differs from the first batch's cast to it,
    where every value fits (chunked reads give ``int32`` then ``int64``, or ``int64`` then
    ``double`` for a chunk with a null; each refused the run: "changed type between update()
    calls"). A value that does not fit is a ``TypeError`` naming the column and both types."""
    out = rb
    for name, to in known.items():
        i = rb.schema.get_field_index(name)
        if i < 0:
            continue
        have = rb.schema.field(i).type
        if have == to or not (_numeric(have) and _numeric(to)):
            continue
        original = rb.column(i)
        try:
            column = original.cast(to)  # safe: fails on overflow or a lost fraction
            if pa.types.is_floating(to) and not _same_values(original, column.cast(have)):
                # a float cast is not checked by Arrow: 0.1 as float32 is 0.10000000149…
                raise pa.ArrowInvalid(f"a value changes in {to}")
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise TypeError(
                f"column {name!r} changed type between update() calls: it was {to}, this "
                f"batch has {have} with values {to} cannot hold ({exc}); cast the input "
                "to one type"
            ) from None
        out = out.set_column(i, rb.schema.field(i).with_type(to), column)
    return out


def _same_values(original: pa.Array, round_trip: pa.Array) -> bool:
    """Whether every value of ``original`` came back from a cast and back unchanged (NaN as
    NaN, nulls as nulls)."""
    import pyarrow.compute as pc

    same = pc.equal(original, round_trip)
    if pa.types.is_floating(original.type):
        same = pc.or_(same, pc.and_(pc.is_nan(original), pc.is_nan(round_trip)))
    return bool(pc.all(pc.fill_null(same, True)).as_py())


def _numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t))


def _weakly(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (a bound method) called through a weak reference to its object."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = ref()
        if bound is None:
            raise ReferenceError("the aggregator of this thread fold is gone")
        return bound(*args, **kwargs)

    return call

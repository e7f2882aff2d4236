"""``aggregate_files(...)``: files in, aggregated record batches out, with progress and metrics.

The input phase (scan, filter, fold, spill) runs inside the call; what comes back is a
``pyarrow.RecordBatchReader`` over the merge phase, so the result is streamed too: nothing
holds the whole input or the whole result. With ``output=`` the result is written instead and
the run's :class:`~extagg.metrics.RunMetrics` returned. ``extagg.run_metrics(reader)`` gives the
metrics of a reader (complete once it has been read to the end).
"""

from __future__ import annotations

import difflib
import errno
import itertools
import logging
import os
import re
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from extagg._config import env_size, resolve_file_threads
from extagg._input_paths import output_directory_problem, output_is_an_input, output_problem
from extagg._interrupts import latched_interrupts, raise_if_interrupted
from extagg._names import split_key_aliases
from extagg._sysinfo import current_rss, peak_rss
from extagg.errors import (
    MemoryLimitError,
    OutputError,
    QueryError,
)
from extagg.io.expressions import (
    AggregateArguments,
    ComputedColumn,
    computed_aggs,
    result_columns,
    split_aggregate_expressions,
    with_computed,
)
from extagg.io.inputs import (
    TEXT_BLOCKS_AHEAD,
    TEXT_BLOCKS_HELD,
    InputScan,
    open_input,
    row_bytes,
    text_blocks_held,
    unknown_column,
)
from extagg.io.output import ResultWriter
from extagg.io.output import output_format as pick_output_format
from extagg.io.where import (
    ParsedExpression,
    parse_expression,
    struct_field,
)
from extagg.memory import MemoryConsumer
from extagg.memory.sizing import MEMORY_ENV
from extagg.metrics import RunMetrics, register_metrics
from extagg.spillable import Spillable

if TYPE_CHECKING:
    from extagg.columnar.sort import SortKey

__all__ = ["FileQuery", "aggregate_files", "parse_order_by", "plan_query"]

log = logging.getLogger(__name__)

#: the smallest scan batch (at tiny budgets; per-batch overheads dominate below it)
MIN_BATCH_ROWS = 1_024
#: the peak RSS in the metrics is read at most this often while a query runs, and at its end
RSS_READ_INTERVAL_S = 0.25

ProgressArg = bool | Callable[[RunMetrics], None] | None


class FileQuery:
    """A checked query: the input plan, the aggregates, the filters. :meth:`run` executes it.

    Building it raises every usage error (unknown column or function, bad expression) before
    any data is read; the CLI turns those into exit status 2.
    """

    def __init__(
        self,
        scan: InputScan,
        by: list[str],
        aggs: Mapping[str, tuple[str, str]],
        having: ParsedExpression | None,
        memory: int | str | None,
        memory_manager: Any,
        spill_dirs: Sequence[str] | str | None,
        order: Sequence[SortKey] = (),
        threads: int | None = None,
        computed: Sequence[ComputedColumn] = (),
        limit: int | None = None,
    ) -> None:
        self.scan = scan
        self.computed = list(computed)
        try:  # the reader thread takes a core: see resolve_file_threads
            self.threads = resolve_file_threads(threads)
        except ValueError as exc:  # a bad EXTAGG_THREADS
            raise QueryError(str(exc)) from None
        self.by = by
        self.aggs = aggs
        self.having = having
        self.memory = memory
        self.memory_manager = memory_manager
        self.spill_dirs = spill_dirs
        #: the result columns sorted by, each with its direction (empty: hash order)
        self.order = list(order)
        #: the result rows kept at most (after the order)
        self.limit = limit
        #: expressions over aggregates (``r=sum(a) / sum(b)``): computed on the result from
        #: hidden aggregates (see split_aggregate_expressions), then the result's columns are
        #: the keys and :attr:`outputs`, in order
        self.post: list[tuple[str, ParsedExpression]] = []
        self.outputs: list[str] = []
        #: the result's names of the keys (``--by 'year(d) as y'``: ``y``), in order
        self.key_names: list[str] = list(by)
        self.metrics = RunMetrics(
            files=len(scan.files), bytes_total=scan.total_bytes, rows_total=scan.total_rows,
            row_groups_total=scan.row_groups_total, files_skipped=scan.files_skipped,
        )  # fmt: skip
        self._agg: Any = None
        # weak: the streams' frames hold this query, which must not keep them alive in turn
        # (a reader dropped or closed half read closes them at once, not at the cyclic GC)
        self._streams: list[weakref.ref[Any]] = []
        self._scan_memory: _ScanMemory | None = None
        self._tmm: Any = None
        #: the task manager whose peak the metrics report (watched from run() to close())
        self._watching: Any = None
        self._rss_read_at = -1.0  # when the peak RSS was last read (see _sync)

    def close(self) -> None:
        """Stop the run: close the result streams and the aggregator, which deletes every
        spill and sort-run file. Idempotent; safe to call from an interrupt handler."""
        for ref in reversed(self._streams):
            stream = ref()
            if stream is not None:
                stream.close()
        self._streams.clear()
        if self._scan_memory is not None:
            self._scan_memory.close_memory()
        if self._agg is not None:
            self._agg.close()
            self._agg = None
        self._end_peak_watch()

    def _end_peak_watch(self) -> None:
        if self._watching is not None:
            self._watching.memory_manager.unwatch_execution_peak(self._watching.task_id)
            self._watching = None

    def run(self, progress: Callable[[RunMetrics], None] | None = None) -> pa.RecordBatchReader:
        """Read and fold the whole input now; return a reader over the merged result."""
        from extagg.columnar import HashAggregator
        from extagg.columnar.distinct import DistinctAggregator, needs_levels
        from extagg.columnar.objects import ObjectAggregator, untyped_columns
        from extagg.memory import resolve_task_memory_manager

        m = self.metrics
        started = time.perf_counter()
        m.rss_import_bytes = current_rss()
        tmm = resolve_task_memory_manager(self.memory, self.memory_manager)
        factory: Any = DistinctAggregator if needs_levels(self.aggs) else HashAggregator
        options: dict[str, Any] = {"threads": self.threads}
        # the columns the aggregation reads: not a struct read only for its fields (computed)
        empty = self._with_computed(self.scan.schema.empty_table())
        read = [*self.by, *(s[0] for s in self.aggs.values() if isinstance(s, (tuple, list)))]
        untyped = untyped_columns(empty.schema, [c for c in read if c != "*"])
        if untyped:  # nested or null-typed columns: Python objects in the generic engine
            log.info("columns %s: aggregated by the generic engine", untyped)
            factory, options = ObjectAggregator, {}
        else:
            computed_reads = [name for c in self.computed for name in c.parsed.columns]
            self.scan.dictionary_columns = _dictionary_keys(self.scan, self.by, computed_reads)
        agg = factory(self.by, self.aggs, memory_manager=tmm, spill_dirs=self.spill_dirs, **options)
        m.budget_bytes = tmm.memory_manager.max_memory
        self._agg = agg
        self._tmm = tmm
        self._scan_memory = _ScanMemory(tmm)
        self._scan_memory.reserve(self.scan, m.budget_bytes)
        tmm.memory_manager.watch_execution_peak(tmm.task_id)  # from what is held now to close()
        self._watching = tmm
        try:
            try:  # resolves every aggregate against its column's type: the result schema
                agg.update(empty)
            except TypeError as exc:
                hint = ""
                if self.scan.format in ("csv", "tsv", "json") and "of type string" in str(exc):
                    hint = (
                        "; a text file's column is read as strings when a value in the sample "
                        "its types are inferred from is not a number: --column-types "
                        "COLUMN:float64 reads it as numbers (and names the first value that is not)"
                    )
                    if self.scan.format != "json":
                        hint += "; numbers written with a decimal comma (1,5) need --decimal-comma"
                raise QueryError(f"{exc} (in {_files_named(self.scan.files)}){hint}") from None
            first = True
            for batch in self.scan.batches():
                if self.computed:  # here, not on the reader thread: there its Python glue
                    # contended for the GIL with the fold (SF1 Q1 as written: 0.55 -> 0.60 s,
                    # at 8 MiB 1.02 -> 1.09 s, peak RSS +20 MiB)
                    batch = self._with_computed(batch)
                if first:
                    warm = factory(self.by, self.aggs, memory_manager=tmm,
                                   spill_dirs=self.spill_dirs, **options)  # fmt: skip
                    _load_kernels(warm, batch, self._scan_memory)
                    m.rss_fixed_bytes = current_rss()
                agg.update(batch)
                if first:
                    first = False
                    self._scan_memory.resize(self.scan, batch, m.budget_bytes)
                self._scan_memory.adapt(self.scan, batch, m.budget_bytes)
                self._scan_memory.observe(pa.total_allocated_bytes(), m.budget_bytes)
                self._sync(agg, started)
                if progress is not None:
                    progress(m)
                raise_if_interrupted()
            if first:
                m.rss_fixed_bytes = current_rss()
            schema = agg.schema
            assert schema is not None
            finish = self._post_columns(schema)
            if finish is not None:
                schema = finish(schema.empty_table()).schema
            if self.key_names != self.by:
                schema = self._renamed(schema.empty_table()).schema
        except BaseException:
            self._scan_memory.close_memory()
            agg.close()
            self._end_peak_watch()
            raise
        m.input_time_s = time.perf_counter() - started
        self._scan_memory.close_memory()  # the scan is over: its buffers go back to the pool
        batches = self._results(agg, started, progress, finish)
        self._streams.append(weakref.ref(batches))
        if self.order:
            from extagg.columnar.sort import external_sort

            batches = external_sort(
                batches, schema, self.order, tmm, self.spill_dirs, m, limit=self.limit
            )
            self._streams.append(weakref.ref(batches))
        if self.limit is not None:
            batches = _first_rows(batches, self.limit, m)
            self._streams.append(weakref.ref(batches))
        # pyarrow's close() of a reader over a Python iterator leaves the iterator open: its
        # spill files and grant go when the reader is dropped (a reader imported through the
        # C stream interface would close it, but turns every exception into an ArrowInvalid)
        reader = pa.RecordBatchReader.from_batches(schema, _ClosedWhenDropped(batches, self.close))
        register_metrics(reader, m)
        return reader

    def _with_computed(self, batch: Any) -> Any:
        """``batch`` (or an empty table) with the computed keys and aggregate arguments
        appended (see :class:`~extagg.io.expressions.ComputedColumn`)."""
        read = [*self.by, *(s[0] for s in self.aggs.values() if isinstance(s, (tuple, list)))]
        return with_computed(batch, self.computed, keep=read)

    def _sync(self, agg: Any, started: float, final: bool = False) -> None:
        m = self.metrics
        p = self.scan.progress
        am = agg.metrics
        m.rows_read = p.rows
        m.bytes_read = p.bytes
        m.row_groups_read = p.row_groups_read
        m.spill_count = am.spill_count
        m.num_spill_files = am.num_spill_files
        m.memory_bytes_spilled = am.memory_bytes_spilled
        m.disk_bytes_spilled = am.disk_bytes_spilled
        if self._watching is not None:  # the run's task and its fold threads at once
            peak = self._watching.memory_manager.execution_peak(self._watching.task_id)
            m.peak_granted_bytes = max(m.peak_granted_bytes, peak)
        now = time.perf_counter()
        m.wall_time_s = now - started
        # the kernel's high-water mark misses nothing between reads, and reading it (a file in
        # /proc) cost ~0.3 ms a batch, 3 % of a 60 M-row query: a few times a second will do
        if final or now - self._rss_read_at >= RSS_READ_INTERVAL_S:
            self._rss_read_at = now
            m.peak_rss_bytes = peak_rss()

    def _post_columns(self, schema: pa.Schema) -> Callable[[Any], Any] | None:
        """What turns a result batch of the aggregator (``schema``) into one of the query
        when it has expressions over aggregates: those computed (a usage error where their
        operands do not fit), the hidden aggregates left out; ``None`` without any."""
        if not self.post:
            return None
        columns = result_columns(self.post, schema)
        keep = [*self.by, *self.outputs]

        def finish(batch: Any) -> Any:
            return with_computed(batch, columns).select(keep)

        return finish

    def _renamed(self, batch: Any) -> Any:
        """A result batch (keys first) with the keys' names the query gave them."""
        return batch.rename_columns([*self.key_names, *batch.schema.names[len(self.by) :]])

    def _results(
        self,
        agg: Any,
        started: float,
        progress: Callable[[RunMetrics], None] | None,
        finish: Callable[[Any], Any] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        m = self.metrics
        try:
            schema = getattr(agg, "schema", None)
            if finish is not None and schema is not None:
                schema = finish(schema.empty_table()).schema
            renamed = self.key_names != self.by
            if renamed and schema is not None:
                schema = self._renamed(schema.empty_table()).schema
            if self.having is not None and schema is not None:
                # typed as the results are (a quoted value read as its column's type; a test
                # that is not one, or operands that do not fit, a usage error at its operator)
                self.having.bind(schema)
            for batch in agg.results():
                m.groups += batch.num_rows
                if finish is not None:
                    batch = finish(batch)
                if renamed:
                    batch = self._renamed(batch)
                if self.having is not None:
                    batch = _having(batch, self.having)
                m.rows_out += batch.num_rows
                self._sync(agg, started)
                if progress is not None:
                    progress(m)
                raise_if_interrupted()
                if batch.num_rows:
                    yield batch
            self._sync(agg, started, final=True)
            m.finished = True
            if progress is not None:
                progress(m)
        finally:
            agg.close()


class _ClosedWhenDropped:
    """The result batches a reader hands out, and the run closed when the reader is dropped:
    a reader dropped before its first batch left its generator unstarted (its ``finally``
    never ran), and the aggregator's finaliser warned that it "was dropped without close()"
    where the docs tell users to drop the reader."""

    __slots__ = ("_batches", "_close")

    def __init__(self, batches: Iterator[pa.RecordBatch], close: Callable[[], None]) -> None:
        self._batches = batches
        self._close = close

    def __iter__(self) -> _ClosedWhenDropped:
        return self

    def __next__(self) -> pa.RecordBatch:
        return next(self._batches)

    def __del__(self) -> None:
        try:
            self._close()
        except Exception:  # at interpreter exit, what close needs may be gone already
            pass


#: rows of the first batch folded by :func:`_load_kernels`
WARM_ROWS = 64


def _load_kernels(warm: Any, batch: pa.RecordBatch, trigger: MemoryConsumer) -> None:
    """Fold the first rows of ``batch`` with ``warm`` (a throwaway aggregator of the run's
    kind), spill them, fold them again and read the merged result, then close it: the
    compiled kernels the query's column types need — the fold's, the spill's and the merge's
    — are loaded (from numba's cache: 10-30 ms and ~1 MiB each; compiled, with the
    compiler's transient memory, on a first run with a cold cache) before the run's "fixed"
    RSS is measured, so that what the process gains afterwards is the run's data. Kernels
    of the rarer paths (a hash-partitioned table, a multi-pass merge) load when used."""
    rows = batch.slice(0, WARM_ROWS)
    spills = isinstance(warm, Spillable)  # the columnar engine: load its spill and merge too
    # its spill is no spill of the run's: not logged as one (`-v` showed a 3-group query spill)
    quiet = logging.Filter("extagg.io.run.warm-up")  # passes no record of other loggers
    spill_log = logging.getLogger("extagg.columnar.hash_aggregator")
    spill_log.addFilter(quiet)
    try:
        warm.update(rows)
        if spills:
            warm.spill(1, trigger)
            warm.update(rows)
        for _ in warm.results():
            pass
    except ArithmeticError:
        # the rows folded twice: a sum of them past its type's range (2^62 + 1 once fits
        # int64, twice does not) is no error of the query's, whose run reports its own
        pass
    except MemoryLimitError as exc:
        # beside the run's own aggregator under a tiny budget (1 MiB, eight count_distinct:
        # seventeen tables and their merges twice over) the warm-up's merge may not fit; what
        # it did not load loads when the run first uses it
        log.debug("kernels not all loaded ahead: %s", exc)
    finally:
        spill_log.removeFilter(quiet)
        warm.close()


#: the smallest CSV/JSON block a text scan parses
MIN_TEXT_BLOCK_BYTES = 64 << 10
#: a CSV/JSON block size below which the text may take up to a third of the budget instead
#: of a quarter: every block costs ~0.1 ms in Arrow's reader and ~0.5 ms more in the scan
#: and the fold (TPC-H SF1 CSV Q1: 2.6 s of Arrow's parse alone with 96 KiB blocks, 1.9 s
#: with 1 MiB; 5.5 s end to end at 9 MiB with 96 KiB blocks)
GOOD_TEXT_BLOCK_BYTES = 256 << 10


class _ScanMemory(MemoryConsumer):
    """The scan's decoded batches (the one being folded and the ones Arrow reads ahead),
    accounted to the memory manager like the aggregator's tables; not spillable.

    The batch size is chosen so that they take at most 1/8 of the budget (1 024 to 65 536
    rows), and that much is acquired before the scan starts; 1/4 while the aggregator holds
    little (see :meth:`adapt`). CSV/JSON text is parsed in blocks (64 KiB to 4 MiB), of which
    the scan holds :data:`~extagg.io.inputs.TEXT_BLOCKS_HELD` at most, raw or parsed, the
    batches included: the blocks are sized so that all of them fit in 1/4 of the budget (in
    up to 1/3 of a small one, for blocks of :data:`GOOD_TEXT_BLOCK_BYTES`), and that much is
    acquired. A quarter, not an eighth: a text block's size is fixed for the file (no
    :meth:`adapt`), and at an eighth TPC-H SF1 CSV Q1 at 26 MiB took 2.6-3.1 s in 277 KiB
    blocks against 1.8-2.1 s in 830 KiB ones.
    """

    def __init__(self, tmm: Any) -> None:
        super().__init__(tmm, None)
        self._batch_rows = 65_536  # the largest batch asked for
        self._tmm = tmm
        self._div = 8  # the batches' share of the budget: 1/8, or 1/4 (see adapt)
        self._width = 0  # bytes a row, from the first batch
        self._wanted = 0  # what the batches of the current size take
        self._settle = 0  # batches of the smaller size to see before releasing the rest

    def reserve(self, scan: InputScan, budget: int) -> None:
        """Size the scan's batches from the schema's estimated row width; acquire them."""
        self._batch_rows = scan.batch_rows
        block = budget // 4 // TEXT_BLOCKS_HELD  # the batches included (a block's rows or fewer)
        if block < GOOD_TEXT_BLOCK_BYTES:  # up to a third of a small budget for text
            block = max(block, min(GOOD_TEXT_BLOCK_BYTES, budget // 3 // TEXT_BLOCKS_HELD))
        block = min(scan.block_bytes, block)
        if block < MIN_TEXT_BLOCK_BYTES:
            # blocks no smaller than the minimum: under a tiny budget (below ~2.2 MiB) fewer
            # of them read ahead, so that the text stays within a third (12 blocks of 64 KiB
            # took 3/4 of 1 MiB, and the aggregator, left 256 KiB, could not merge two runs)
            fits = budget // 3 // (MIN_TEXT_BLOCK_BYTES * text_blocks_held(1))
            scan.text_blocks_ahead = int(max(1, min(TEXT_BLOCKS_AHEAD, fits)))
        scan.block_bytes = int(max(MIN_TEXT_BLOCK_BYTES, block))
        self._size(scan, row_bytes(scan.schema), budget)

    def resize(self, scan: InputScan, batch: pa.RecordBatch, budget: int) -> None:
        """Size them again from the first batch's real width (the schema's estimate counts
        32 bytes for every string: 7 times a TPC-H flag's), from the next fragment on."""
        if batch.num_rows:
            width = -(-batch.nbytes // batch.num_rows)  # the rows' bytes, not the whole
            # buffers a slice of a bigger decoded row group points into
            self._width = max(width, 1)
            self._size(scan, self._width, budget)

    def adapt(self, scan: InputScan, batch: pa.RecordBatch, budget: int) -> None:
        """Between batches: while the rest of the run (the aggregator) holds at most a
        quarter of the budget, the batches may take a quarter of it instead of an eighth
        (twice the rows: half the per-batch overheads, which dominate at small budgets:
        TPC-H Q1 at 8 MiB, 9 K-row batches, 1.33 s of CPU against 1.06 s with 18 K), when
        the manager has that free for this one task; back to an eighth once the rest holds
        more, the larger batches' bytes released only after batches of the new size (from
        the next row group on) have replaced those read ahead. Parquet only: a CSV/JSON
        batch is a parsed text block, whose size the budget set at the start."""
        if not self._width or scan.format != "parquet":  # text: a batch is a parsed block
            return
        others = self._tmm.memory_used - self.used
        div = 4 if others <= budget // 4 else 8
        if div == self._div:
            if self._settle and batch.num_rows <= scan.batch_rows:
                self._settle -= 1
                if not self._settle and self.used > self._wanted:
                    self.free_memory(self.used - self._wanted)
            return
        if div < self._div:  # larger: only with memory free now, to one task
            mm = self._tmm.memory_manager
            free = mm.max_memory - mm.execution_memory_used - mm.storage_memory_used
            if budget // 8 > free or len(mm.tasks()) > 1:
                return
        self._div = div
        self._size(scan, self._width, budget, release=div < 8)
        self._settle = 0 if div < 8 else scan.readahead + 1

    def observe(self, arrow_bytes: int, budget: int) -> None:
        """Hold at least what Arrow's memory pool has allocated now, up to a quarter of the
        budget: besides the batches, Parquet's reader keeps one to three pages (~1 MiB each
        as most writers cut them) per column it decodes, whatever the batch size, and the
        filter copies what it keeps. What the scan really holds is then accounted, and the
        aggregator's share of the budget shrinks by it."""
        want = min(arrow_bytes, budget // 4)
        if want > self.used:
            self.acquire_memory(want - self.used)

    def _size(self, scan: InputScan, width: int, budget: int, release: bool = True) -> None:
        batches = scan.readahead + 1
        share = budget // self._div
        rows = share // (width * batches)
        scan.batch_rows = int(max(MIN_BATCH_ROWS, min(self._batch_rows, rows)))
        text = (
            scan.block_bytes * text_blocks_held(scan.text_blocks_ahead)
            if scan.format in ("csv", "tsv", "json")
            else 0
        )
        # room for one batch more: the consumer may filter a batch beside the reader
        scan.filter_on_consumer = scan.batch_rows * width * (batches + 1) <= max(share, text)
        batches += scan.filter_on_consumer
        # a text scan's batches are cut from the blocks it holds: counted in those
        want = max(min(scan.batch_rows * width * batches, share), text)
        self._wanted = want
        if want > self.used:
            self.acquire_memory(want - self.used)
        elif want < self.used and release:
            self.free_memory(self.used - want)


def _dictionary_keys(
    scan: InputScan, keys: Sequence[str], computed_reads: Sequence[str] = ()
) -> list[str]:
    """The string key columns a Parquet or CSV scan reads as dictionary arrays: the columnar
    engine groups them by their codes (see :mod:`extagg.columnar.coded_keys`). Not those the
    filter or a computed key or argument reads (they take plain values: ``lower(k)`` has no
    kernel for a dictionary). From CSV only when every key is such a column
    and a sample shows them few (:meth:`InputScan.few_distinct`): the codes are then used,
    and a text parser's dictionaries are built per block, unlike Parquet's stored ones."""
    if scan.format not in ("parquet", "csv", "tsv"):
        return []
    filtered = {*scan.filter_columns, *computed_reads}
    out = []
    for name in keys:
        if name not in scan.schema.names:  # a computed key
            continue
        t = scan.schema.field(name).type
        if (pa.types.is_string(t) or pa.types.is_binary(t)) and name not in filtered:
            out.append(name)
    if scan.format != "parquet" and (len(out) < len(keys) or not scan.few_distinct(out)):
        return []
    return out


def _with_alias_hint(error: QueryError, keys: Sequence[str]) -> QueryError:
    """``error`` (an unknown column), with how to name a key when a key reads as ``NAME=EXPR``
    whose ``NAME`` is that column (``--agg``'s way of naming, which ``--by`` reads as ``=``)."""
    missing = getattr(error, "column", None)
    for key in keys:
        named = re.match(r"\s*([^\W\d][\w.]*)\s*=(?!=)\s*(.+)", key, re.S)
        if named is not None and named.group(1) == missing:
            hint = f"{named.group(2).strip()} AS {missing}"
            return QueryError(f"{error}; to name a key, write it as --by {hint!r}")
    return error


def _first_rows(
    batches: Iterator[pa.RecordBatch], limit: int, metrics: RunMetrics
) -> Iterator[pa.RecordBatch]:
    """The first ``limit`` rows of ``batches``; the rest is not read (``batches`` closed at
    once: its files deleted), and ``metrics`` say so (``rows_out``, ``groups_partial``)."""
    left = limit
    try:
        for batch in batches:
            if batch.num_rows > left:
                batch = batch.slice(0, left)
                metrics.groups_partial = True
            left -= batch.num_rows
            if batch.num_rows:
                yield batch
            if left <= 0:
                if not metrics.groups_partial:  # cut exactly at a batch's end: any more?
                    metrics.groups_partial = any(b.num_rows for b in itertools.islice(batches, 1))
                break
    finally:
        metrics.rows_out = limit - left
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def parse_order_by(order_by: str | Sequence[str], columns: Sequence[str]) -> list[SortKey]:
    """``"n desc, user"`` (or ``["n desc", "user"]``) as sort keys over the result's
    ``columns``: a name (quoted if it has spaces or commas: ``'"Prix (EUR)" desc'``),
    optionally ``asc`` or ``desc`` (DuckDB's and SQL's; nulls last either way). An unknown
    name is a usage error listing the result's columns."""
    from extagg._names import split_top_level, unquote

    items = split_top_level(order_by) if isinstance(order_by, str) else list(order_by)
    keys: list[SortKey] = []
    for item in items:
        text = str(item).strip()
        direction = "ascending"
        words = text.rsplit(None, 1)
        if len(words) == 2 and words[1].lower() in ("asc", "desc"):
            text = words[0].strip()
            direction = "descending" if words[1].lower() == "desc" else "ascending"
        name = unquote(text)
        if name not in columns:
            raise unknown_column(name, list(columns), "result column")
        keys.append((name, direction))
    if not keys:
        raise QueryError("order_by names no result column (give 'column [desc], ...')")
    return keys


def _files_named(files: Sequence[str]) -> str:
    if len(files) == 1:
        return files[0]
    return f"{len(files)} files: {', '.join(files[:3])}{', ...' if len(files) > 3 else ''}"


def _having(batch: pa.RecordBatch, having: ParsedExpression) -> pa.RecordBatch:
    """The result rows ``having`` keeps: by its eager mask (Acero's filter printed "An input
    buffer was poorly aligned" for every batch read back from a spill file), else by its
    expression."""
    mask = having.mask(batch)
    if mask is None:
        return _filter(batch, having.expression)
    return batch if mask.true_count == len(mask) else batch.filter(mask)


def _filter(batch: pa.RecordBatch, expr: Any) -> pa.RecordBatch:
    table = pa.Table.from_batches([batch]).filter(expr)
    return table.combine_chunks().to_batches()[0] if table.num_rows else batch.slice(0, 0)


def _parse_where(text: str | None) -> ParsedExpression | None:
    if text is None or not str(text).strip():
        return None
    return parse_expression(str(text))


#: the keyword options of :func:`aggregate_files` that shape the scan and the aggregation
SCAN_OPTIONS = (
    "format", "delimiter", "column_types", "schema", "header", "batch_rows", "spill_dirs",
    "memory_manager", "threads", "encoding", "quote", "decimal_comma",
)  # fmt: skip


def plan_query(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    by: str | Sequence[str] = (),
    aggs: Mapping[str, tuple[str, str]] | Sequence[str] | str | None = None,
    where: str | None = None,
    having: str | None = None,
    memory: int | str | None = None,
    memory_manager: Any = None,
    spill_dirs: Sequence[str] | str | None = None,
    sort: bool = False,
    order_by: str | Sequence[str] | None = None,
    limit: int | None = None,
    format: str | None = None,
    delimiter: str | None = None,
    column_types: Mapping[str, Any] | str | None = None,
    schema: pa.Schema | str | None = None,
    header: bool = True,
    batch_rows: int = 65_536,
    threads: int | None = None,
    encoding: str | None = None,
    quote: str | None = '"',
    decimal_comma: bool = False,
) -> FileQuery:
    """Check a query and plan its scan (see :func:`aggregate_files`); reads no data rows."""
    from extagg._config import parse_size
    from extagg.columnar.functions import NO_AGGREGATES, agg_mapping, parse_aggs

    keys, key_names = split_key_aliases([by] if isinstance(by, str) else list(by))
    post: list[tuple[str, str]] = []
    outputs: list[str] = []
    if isinstance(aggs, str) or (
        isinstance(aggs, Sequence) and aggs and all(isinstance(a, str) for a in aggs)
    ):  # --agg texts: some may be expressions over aggregates (r=sum(a) / sum(b))
        texts = [aggs] if isinstance(aggs, str) else list(aggs)
        engine, post, outputs = split_aggregate_expressions(texts)
        if post:
            aggs = engine
    asked: Mapping[str, Any] | None = agg_mapping(aggs)
    if asked is None or asked is NO_AGGREGATES:  # SELECT DISTINCT by
        if not keys:
            raise QueryError("no keys and no aggregates: give by= (its distinct values) or aggs=")
        asked = NO_AGGREGATES
    try:
        parse_aggs(asked, distinct=True)  # an unknown function: a usage error now
    except (TypeError, ValueError) as exc:
        raise QueryError(str(exc)) from None
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise QueryError(f"key column(s) {repeated} given twice in by")
    repeated = sorted({k for k in key_names if key_names.count(k) > 1})
    if repeated:
        raise QueryError(f"two keys named {repeated} in by: give them different names")
    clash = sorted(set(key_names) & {*asked, *(name for name, _ in post)})
    if clash:
        raise QueryError(
            f"aggregate output(s) {clash} have the names of key columns: rename them "
            f"(--agg 'other_name=func(col)')"
        )
    sample = 1 << 22
    if memory is not None:
        from extagg.memory import check_engine_budget

        try:  # a budget below the engines' minimum is a bad argument, like a bad size
            budget = check_engine_budget(parse_size(memory, name="memory"))
        except (TypeError, ValueError) as exc:
            raise QueryError(str(exc)) from None
        # CSV type inference parses this much, holding ~5 times it (two blocks and the parse)
        sample = max(1 << 20, min(sample, budget // 16))
    elif os.environ.get(MEMORY_ENV, "").strip():
        from extagg.memory import check_engine_budget

        try:  # the budget the default manager will read: bad, a usage error as --memory's
            check_engine_budget(env_size(MEMORY_ENV))  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise QueryError(str(exc)) from None
    if threads is not None:
        from extagg._config import resolve_threads

        try:
            resolve_threads(threads)
        except ValueError as exc:
            raise QueryError(str(exc)) from None
    where_expr = _parse_where(where)
    having_expr = _parse_where(having)
    arguments = AggregateArguments(keys, asked)
    types = {}
    if isinstance(column_types, str):  # as --column-types gives them: "a=int64,b=string"
        from extagg.io.inputs import parse_column_types

        column_types = parse_column_types(column_types)
    if isinstance(schema, str):  # as --schema gives it: "id:int64,name:string"
        from extagg.io.inputs import parse_column_types

        schema = pa.schema(list(parse_column_types(schema).items())) if schema.strip() else None
    elif schema is not None and not isinstance(schema, pa.Schema):
        raise QueryError(
            f"schema must be a pyarrow.Schema or a text like 'id:int64,name:string', "
            f"not {type(schema).__name__}"
        )
    if column_types:
        from extagg.io.inputs import parse_type

        types = {
            k: (v if isinstance(v, pa.DataType) else parse_type(str(v)))
            for k, v in column_types.items()
        }
    first_error: QueryError | None = None
    taken: list[str] = []  # expressions read as columns of their text
    while True:
        try:
            scan = open_input(
                paths, arguments.needed(),
                filter=None if where_expr is None else where_expr.expression,
                filter_columns=[] if where_expr is None else where_expr.columns, format=format,
                delimiter=delimiter, column_types=types, schema=schema, header=header,
                quote=quote, sample_bytes=sample, encoding=encoding,
                decimal_comma=decimal_comma,
                bind_filter=None if where_expr is None else where_expr.bind,
                struct_paths=arguments.struct_paths([] if where_expr is None else [where_expr]),
            )  # fmt: skip
            break
        except QueryError as exc:
            missing = getattr(exc, "column", None)
            # ``payload.user``: a struct's field; every one the input lacks at once (each
            # open parses a text file's sample again)
            fields = {}
            for name in getattr(exc, "missing", [missing]):
                if name is not None and name not in arguments.fields:
                    field = struct_field(name, getattr(exc, "struct_types", {}))
                    if field is not None:
                        fields[name] = field
            if fields:
                for name, field in fields.items():
                    arguments.read_struct_field(name, field)
                if where_expr is not None and set(fields) & set(where_expr.columns):
                    where_expr = parse_expression(str(where), arguments.fields)
                continue
            if missing in arguments.syntax:  # neither a column nor an expression
                syntax = arguments.syntax[missing]
                is_key = missing in arguments.keys
                quoted = "--by '\"Price (EUR)\"'" if is_key else "'p=sum(\"Price (EUR)\")'"
                raise QueryError(
                    f"{exc}; read as an expression, {missing!r} fails: {syntax.reason} at "
                    f"position {syntax.position} (a column name with spaces or parentheses is "
                    f"quoted: {quoted})"
                ) from None
            if first_error is not None and missing in taken:
                raise _with_alias_hint(first_error, keys) from None  # its own column says more
            texts = [] if missing is None else arguments.take_as_columns(missing)
            if not texts:
                raise
            taken.extend(texts)
            first_error = first_error or exc
    computed = arguments.computed(scan.schema)
    scan.batch_rows = batch_rows
    if where_expr is not None:
        scan.filter_mask = where_expr.mask
    results = [*key_names, *(outputs if post else asked)]  # the result's columns
    if having_expr is not None:
        out_cols = results
        for name in having_expr.columns:
            if name not in out_cols:
                raise unknown_column(name, out_cols, "result column")
    order: list[SortKey] = []
    if order_by is not None and (not isinstance(order_by, str) or order_by.strip()):
        if sort:
            raise QueryError("give sort (by the keys) or order_by, not both")
        names = [*key_names, *(() if asked is NO_AGGREGATES else results[len(keys) :])]
        order = parse_order_by(order_by, names)
    elif sort:
        order = [(k, "ascending") for k in key_names]
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise QueryError(f"limit must be a whole number of rows, 0 or more; got {limit!r}")
    grouped_by = dict(zip(key_names, keys, strict=True))
    for name, _ in order:
        key = grouped_by.get(name)
        if key is None or key not in scan.schema.names:  # an aggregate; a computed key
            continue
        typ = scan.schema.field(key).type
        if pa.types.is_nested(typ):
            raise QueryError(
                f"--sort cannot order key {key!r} of type {typ} (lists, structs and maps "
                "have no order here); leave --sort out, the groups are the same"
            )
    kept_aggs = asked if asked is NO_AGGREGATES else dict(asked)  # NO_AGGREGATES by identity
    if computed:  # the aggregates read the computed columns by their names
        kept_aggs = computed_aggs(kept_aggs, computed)
    query = FileQuery(
        scan, keys, kept_aggs, having_expr, memory, memory_manager, spill_dirs, order, threads,
        computed, limit,
    )  # fmt: skip
    if post:
        query.post = [(name, parse_expression(text)) for name, text in post]
        query.outputs = outputs
    query.key_names = key_names
    return query


def aggregate_files(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    by: str | Sequence[str] = (),
    aggs: Mapping[str, tuple[str, str]] | Sequence[str] | str | None = None,
    where: str | None = None,
    having: str | None = None,
    memory: int | str | None = None,
    output: str | os.PathLike[str] | None = None,
    output_format: str | None = None,
    overwrite: bool = False,
    sort: bool = False,
    order_by: str | Sequence[str] | None = None,
    limit: int | None = None,
    progress: ProgressArg = False,
    **options: Any,
) -> pa.RecordBatchReader | RunMetrics:
    """Group the rows of Parquet/CSV/JSON Lines/Arrow files by ``by`` and compute ``aggs``.

    Parameters
    ----------
    paths
        A path, glob or directory (hive ``key=value`` folders become columns), or a list of
        them.
    by
        The key column(s); empty for one global result row.
    aggs
        ``{"name": ("column", "function")}`` as :func:`extagg.aggregate` takes
        (``("*", "count")`` counts rows), or ``--agg`` texts: ``["n=count(*)",
        "total=sum(amount)"]``. Omitted (``None``): no aggregate, one row per distinct value
        of ``by`` (``SELECT DISTINCT``).
    where
        Filter on input rows (pushed into the scan), in the grammar of ``--where``.
    having
        Filter on result rows, over the key and aggregate names.
    memory
        The memory budget (``"256m"`` or bytes); default from ``EXTAGG_MEMORY``.
    output
        Write the result to this file (``"-"``: CSV to stdout) instead of returning a reader.
        A text output named ``.gz``, ``.zst`` or ``.bz2`` (``out.csv.gz``) is compressed.
    output_format
        Format of ``output`` when its extension does not say (parquet, csv, tsv, jsonl,
        ipc).
    overwrite
        Replace an existing ``output`` (otherwise it is an error).
    sort
        Sort the result by the keys (an external sort in the same budget); otherwise results
        come in hash order of the keys.
    order_by
        Sort the result by these result columns instead, each ``asc`` (the default) or
        ``desc``, nulls last: ``"n desc, user"`` or ``["n desc", "user"]``.
    limit
        Keep the first ``limit`` rows of the result (of its order: with ``order_by``, a
        top-N, whose sort keeps ``limit`` rows a run).
    progress
        ``True`` for a bar on stderr, or a callable given the live
        :class:`~extagg.metrics.RunMetrics`.
    **options
        Shape the scan: ``format``, ``delimiter``, ``column_types`` (a mapping of names to
        types, or ``"id=int64,price=decimal(15,2)"``), ``schema`` (every CSV column in order:
        a ``pyarrow.Schema`` or ``"id:int64,name:string"``), ``header``,
        ``encoding`` (of CSV/TSV text not in UTF-8, e.g. ``"latin-1"``), ``quote`` (the
        CSV/TSV quote character, ``'"'``; ``None`` for text that quotes nothing),
        ``decimal_comma`` (CSV/TSV numbers written ``1,5``; the delimiter must be another),
        ``spill_dirs``,
        ``memory_manager``; ``threads`` for the aggregation (see
        :class:`~extagg.columnar.HashAggregator`).

    Returns
    -------
    pyarrow.RecordBatchReader | RunMetrics
        Without ``output`` a reader of the result (``extagg.run_metrics(reader)`` gives its
        metrics); with ``output`` the run's :class:`~extagg.metrics.RunMetrics`, after the file
        was written atomically.

    Raises
    ------
    QueryError
        An unknown column or function, a bad expression (``ExpressionError``, a subclass) or
        option, an existing ``output``.
    InputError
        A missing, unreadable or corrupt input file, or files whose schemas cannot be
        unified (naming the file, and for Parquet the row group).
    OutputError
        The output could not be written (disk full, missing directory).
    MemoryLimitError
        The budget is too small for the query's smallest working set.
    """
    unknown = sorted(set(options) - set(SCAN_OPTIONS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], SCAN_OPTIONS, n=1, cutoff=0.6)
        raise QueryError(
            f"aggregate_files() got an unknown option {unknown[0]!r}"
            f"{f'; did you mean {close[0]!r}?' if close else ''} (options: "
            f"{', '.join(SCAN_OPTIONS)})"
        )
    out = None if output is None else os.fspath(output)
    fmt = None if out is None else pick_output_format(out, output_format)
    if out is not None:  # before the input is read, not after
        missing = output_directory_problem(out)
        if missing is not None:
            raise OutputError(missing, directory=os.path.dirname(os.path.abspath(out)),
                              errno=errno.ENOENT)  # fmt: skip
        problem = output_problem(out, overwrite)
        if problem is not None:
            raise QueryError(problem)
    query = plan_query(paths, by=by, aggs=aggs, where=where, having=having, memory=memory,
                       sort=sort, order_by=order_by, limit=limit, **options)  # fmt: skip
    clash = output_is_an_input(out, query.scan.files)
    if clash is not None:
        query.close()
        raise QueryError(clash)
    callback, bar = _progress_callback(progress, query)
    if out is None or fmt is None:
        return query.run(callback)
    try:
        with latched_interrupts():  # the whole run is here: a Ctrl-C lost in a __del__ counts
            reader = query.run(callback)
            with ResultWriter(out, fmt, reader.schema, overwrite=overwrite) as writer:
                for batch in reader:
                    writer.write(batch)
                raise_if_interrupted()  # before the output appears under its name
    except BaseException:
        query.close()  # spill files and grant go now, not when the exception is collected
        raise
    finally:
        if bar is not None:
            bar.close()
    return query.metrics


def _progress_callback(
    progress: ProgressArg, query: FileQuery
) -> tuple[Callable[[RunMetrics], None] | None, Any]:
    if callable(progress):
        return progress, None
    if not progress:
        return None, None
    from extagg._progress import progress_bar, progress_enabled

    bar = progress_bar(enabled=progress_enabled(True), **bar_options(query.metrics))
    return make_bar_callback(bar), bar


def bar_options(m: RunMetrics) -> dict[str, Any]:
    """tqdm arguments for a run: rows of the known total (Parquet metadata), else rows counted
    with the bytes of whole files read (of the total) in the postfix."""
    return {"total": m.rows_total or None, "unit": " rows", "unit_scale": True, "desc": "read"}


def make_bar_callback(bar: Any) -> Callable[[RunMetrics], None]:
    """A progress callback that drives ``bar``: rows read; bytes of whole files read, spills
    and result groups in the postfix."""
    from extagg._config import format_size

    state = {"pos": 0, "last": 0.0}

    def update(m: RunMetrics) -> None:
        now = time.monotonic()
        if not m.finished and now - state["last"] < 0.2:
            return
        state["last"] = now
        if m.finished:
            bar.set_postfix_str("")
            bar.close()
            return
        bar.set_postfix_str(
            f"files {format_size(m.bytes_read)} of {format_size(m.bytes_total)} read, "
            f"{m.spill_count} spills ({format_size(m.disk_bytes_spilled)}), "
            f"{m.groups:,} groups out",
            refresh=False,
        )
        pos = m.rows_read
        if pos > state["pos"]:
            bar.update(pos - state["pos"])
            state["pos"] = pos

    return update

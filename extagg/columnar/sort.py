"""External sort of result batches by columns, each ascending or descending (nulls last, as
DuckDB orders them), inside the memory manager's budget.

Batches are buffered while the memory manager grants their size (the aggregator still needs
the rest while its results are read); when it does not, the buffer is sorted and written as
a run (a spill file of Arrow IPC streams, one per batch of about a sixteenth of what the
buffer held, each checked by its length and CRC-32 when read back: a damaged run is a
:class:`~extagg.errors.CorruptFileError` naming it, never wrong rows) and its memory given
back. The runs are then merged k ways, vectorised: each
round loads one batch per run where needed, sorts what is loaded, and emits every row up to
the smallest "last loaded key" of the runs (no unread row of any run can sort before it).
The merge holds a few copies of one batch per run, granted by the memory manager: when the
grant does not cover every run, runs are merged into longer runs first, as many at a time as
it covers (at least two, at most :data:`MAX_FAN_IN`). Runs are read with plain reads, not
memory-mapped (mapped pages stay in the process's RSS). Rows with equal keys keep no
particular order (result groups are unique, so there are none when the keys are sorted by).
With a ``limit``, each sorted buffer keeps only its first ``limit`` rows: a top-N over many
groups writes runs of ``limit`` rows at most.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from extagg._sysinfo import peak_rss
from extagg.errors import CorruptFileError, SpillError
from extagg.memory import MemoryConsumer, TaskMemoryManager
from extagg.memory.task import Consumer
from extagg.metrics import RunMetrics
from extagg.spill.tempdir import SpillDirs

__all__ = ["ExternalSort", "SortKey", "external_sort", "sort_indices"]

#: a column to sort by and its direction: ``("n", "descending")``
SortKey = tuple[str, str]

log = logging.getLogger(__name__)

#: rows of a run's batches at most (fewer when a sixteenth of the buffer is less, but at
#: least ``MIN_RUN_BATCH_ROWS``: each batch costs a footer entry and a read)
RUN_BATCH_ROWS = 16_384
MIN_RUN_BATCH_ROWS = 1_024
#: ... or fewer, down to this, for a merge capped below two runs' batches of the least
CAPPED_RUN_BATCH_ROWS = 128
#: a run's batch is at most this part of the buffer that was sorted into it
RUN_BATCH_SHARE = 16
#: runs merged at once at most: each round of a merge sorts what is loaded of every run, so
#: its work grows with the fan-in, against a pass more for fewer (643 runs of 5 M rows at
#: 8 MiB: 24 s with 8, 22 s with 16, 19-20 s with 32 or 64, 28 s with 128)
MAX_FAN_IN = 32
#: the column that tags each row with its run in a merge round by every key
_RUN = "__extagg_run"
#: copies of a loaded batch the merge holds at once (the pending rows, their concatenation
#: with the bound, the sorted output)
MERGE_COPIES = 3


@dataclass
class _Run:
    """A sorted run file: its largest batch (what the merge loads of it at once), the rows
    of its batches and where each batch is: ``(offset, length, crc32)`` of its bytes."""

    path: str
    max_batch_bytes: int
    rows: int
    batches: list[tuple[int, int, int]]


class _SortBuffer(MemoryConsumer):
    """Buffered result batches whose memory is granted by the task's memory manager.

    When another consumer runs short (the aggregation whose results these are: its hash
    partitions are aggregated as the results are read), the buffer is written as a sorted run
    and its memory given back, as it is when its own grant falls short: a buffer holding
    all it could get starved the partitions of a small budget."""

    def __init__(
        self,
        tmm: TaskMemoryManager,
        schema: pa.Schema,
        keys: Sequence[SortKey],
        dirs: SpillDirs,
        metrics: RunMetrics | None,
        limit: int | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(tmm, name)
        #: the rows wanted at most (a run keeps its first ``limit``)
        self.limit = limit
        self.batches: list[pa.RecordBatch] = []
        #: the memory granted for :attr:`batches` (a batch's grant may be short of its size)
        self.batches_granted = 0
        self.runs: list[_Run] = []
        #: the merge's read buffers at most (see :attr:`ExternalSort.max_merge_bytes`)
        self.max_merge_bytes: int | None = None
        #: sorted runs written from the buffer, their bytes on disk and in memory (merged runs
        #: not counted)
        self.runs_written = 0
        self.bytes_written = 0
        self.memory_written = 0
        self.schema, self.keys, self.dirs, self.metrics = schema, keys, dirs, metrics
        #: while batches are taken (not in the merge): another consumer may have them written
        self.taking = True
        #: guards the batches (a spill comes from whichever thread asks for memory); never
        #: held while memory is asked for, so such a thread cannot wait for it in turn
        self.lock = threading.RLock()

    def add(self, batch: pa.RecordBatch, granted: int) -> None:
        with self.lock:
            self.batches.append(batch)
            self.batches_granted += granted

    def write_run(self) -> int:
        """The buffered batches as a sorted run; returns the memory given back."""
        with self.lock:
            if not self.batches:
                return 0
            # two runs' loaded batches within the cap, a seventh of it left for batches of
            # longer rows than the average
            cap = self.max_merge_bytes
            batch_cap = None if cap is None else cap // (2 * MERGE_COPIES + 1)
            run = _write_run(self.batches, self.schema, self.keys, self.dirs, self.limit, batch_cap)
            self.runs.append(run)
            self.runs_written += 1
            self.bytes_written += sum(length for _, length, _ in run.batches)
            self.memory_written += sum(b.nbytes for b in self.batches)
            self.batches.clear()
            freed, self.batches_granted = self.batches_granted, 0
            self.free_memory(freed)
            if self.metrics is not None:
                self.metrics.sort_runs += 1
            return freed

    def spill(self, size: int, trigger: Consumer) -> int:
        if trigger is self or not self.taking:
            return 0  # its own grant falling short: the sort loop writes the run
        return self.write_run()


def sort_indices(table: pa.Table, keys: Sequence[SortKey]) -> pa.Array:
    """The row order of ``table`` by ``keys`` (nulls last); half floats are compared as
    ``float32``, 32- and 64-bit decimals as ``decimal128``, extension types (``arrow.uuid``)
    by their storage (the same orders; Arrow's sort has no kernel for them: a ``--sort`` by
    one raised ``ArrowNotImplementedError: halffloat``, "Sorting not supported for type
    extension<arrow.uuid>"); a month-day-nano interval by its length with 30-day months and
    24-hour days, as DuckDB orders them."""
    columns: dict[str, pa.ChunkedArray] = {}
    sort_keys: list[tuple[str, str]] = []
    for i, (k, direction) in enumerate(keys):
        column = table.column(k)
        if column.type == pa.month_day_nano_interval():
            columns[f"{i}d"], columns[f"{i}n"] = _interval_order(column)
            sort_keys += [(f"{i}d", direction), (f"{i}n", direction)]
        else:
            columns[str(i)] = _sortable(column)
            sort_keys.append((str(i), direction))
    by = pa.table(columns)
    if by.num_rows and any(c.num_chunks > 1 for c in by.columns):
        by = by.combine_chunks()  # Arrow sorts one chunk much faster than it merges many
    return pc.sort_indices(by, sort_keys=sort_keys)  # nulls last


#: nanoseconds in a day
_DAY_NS = 86_400 * 10**9


def _interval_order(column: pa.ChunkedArray) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """Two columns whose order is that of the month-day-nano intervals ``column``: whole
    days (a month as 30) and the nanoseconds past them; nulls in both where it is null."""
    layout = np.dtype([("months", "<i4"), ("days", "<i4"), ("nanos", "<i8")])
    days, rest = [], []
    for chunk in column.chunks:
        data = chunk.buffers()[1]
        values = (
            np.frombuffer(data, layout, count=chunk.offset + len(chunk))[chunk.offset :]
            if data is not None
            else np.zeros(len(chunk), layout)
        )
        whole = values["months"].astype(np.int64) * 30 + values["days"]
        whole += values["nanos"] // _DAY_NS
        missing = chunk.is_null().to_numpy(zero_copy_only=False)
        days.append(pa.array(whole, pa.int64(), mask=missing))
        rest.append(pa.array(values["nanos"] % _DAY_NS, pa.int64(), mask=missing))
    return pa.chunked_array(days, pa.int64()), pa.chunked_array(rest, pa.int64())


def _sortable(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """``column`` as a type Arrow's sort has a kernel for, in the same order."""
    typ = column.type
    if isinstance(typ, pa.BaseExtensionType):
        return pa.chunked_array([c.storage for c in column.chunks], typ.storage_type)
    if pa.types.is_float16(typ):
        return column.cast(pa.float32())
    if pa.types.is_decimal(typ) and typ.bit_width < 128:
        return column.cast(pa.decimal128(typ.precision, typ.scale))
    return column


def _sorted(table: pa.Table, keys: Sequence[SortKey], limit: int | None = None) -> pa.Table:
    order = sort_indices(table, keys)
    return table.take(order if limit is None else order[:limit])


class ExternalSort:
    """Batches sorted by ``keys`` (a name: ascending; or ``(name, "descending")``), nulls last,
    in bounded memory: :meth:`add` each batch, then read :meth:`sorted` once (its run files
    are removed when it ends, or by :meth:`close`). ``limit``: only the first rows;
    ``max_buffer_bytes``: the batches buffered at most before they are written as a run;
    ``name``: its memory consumer's (in a :class:`~extagg.errors.MemoryLimitError`);
    ``copies``: a batch is granted this many times its size (its sort's copies counted)."""

    def __init__(
        self,
        schema: pa.Schema,
        keys: Sequence[str | SortKey],
        tmm: TaskMemoryManager,
        spill_dirs: Sequence[str] | str | SpillDirs | None,
        metrics: RunMetrics | None = None,
        limit: int | None = None,
        max_buffer_bytes: int | None = None,
        name: str | None = None,
        copies: int = 1,
    ) -> None:
        self.schema = schema
        #: the memory a batch is granted, in its sizes: the buffer's sort copies what it holds
        #: (the columns sorted by, then every column in order), and those copies may be counted
        self.copies = copies
        #: a run is written before the buffer holds more (its sort copies what it holds)
        self.max_buffer_bytes = max_buffer_bytes
        self.order: list[SortKey] = [(k, "ascending") if isinstance(k, str) else k for k in keys]
        self.metrics, self.limit = metrics, limit
        if isinstance(spill_dirs, SpillDirs):
            self.dirs, self._own_dirs = spill_dirs, False
        else:
            folders = (
                spill_dirs
                if spill_dirs is None or isinstance(spill_dirs, str)
                else list(spill_dirs)
            )
            self.dirs, self._own_dirs = SpillDirs(folders), True
        self.buffer = _SortBuffer(tmm, schema, self.order, self.dirs, metrics, limit, name)
        self._state = "adding"

    @property
    def max_merge_bytes(self) -> int | None:
        """The merge's read buffers at most (None: what the memory manager grants). Set
        before the runs are written, it also caps their batches, so that two runs' loaded
        batches fit it (the merge takes two always: a quantile's sort held 372 KiB of a
        256 KiB share at 1 MiB, and a count_distinct beside it could not merge)."""
        return self.buffer.max_merge_bytes

    @max_merge_bytes.setter
    def max_merge_bytes(self, nbytes: int | None) -> None:
        self.buffer.max_merge_bytes = nbytes

    @property
    def runs(self) -> int:
        """The sorted runs written so far."""
        return len(self.buffer.runs)

    def add(self, batch: pa.RecordBatch) -> None:
        """Buffer a batch; the buffer is written as a sorted run when its memory is not
        granted (one batch is always let through)."""
        if self._state != "adding":
            raise RuntimeError("ExternalSort.add() after sorted() or close()")
        buf = self.buffer
        need = batch.nbytes * self.copies
        if self.max_buffer_bytes is not None and buf.batches_granted + need > self.max_buffer_bytes:
            buf.write_run()
        got = buf.acquire_memory(need)
        if got < need:
            if got:
                buf.free_memory(got)
            buf.write_run()
            got = buf.acquire_memory(need)  # one batch is always let through
        buf.add(batch, got)
        _note_granted(buf, self.metrics)

    def sorted(self) -> Iterator[pa.RecordBatch]:
        """Every row added, in order; call once."""
        if self._state != "adding":
            raise RuntimeError("ExternalSort.sorted() can be read once, before close()")
        self._state = "sorting"
        buf, order, metrics = self.buffer, self.order, self.metrics
        try:
            with buf.lock:
                buf.taking = False
            held = buf.batches_granted
            if not buf.runs and (self.max_merge_bytes is None or held <= self.max_merge_bytes):
                table = pa.Table.from_batches(buf.batches, schema=self.schema)
                table = _sorted(table, order, self.limit)
                buf.batches.clear()
                yield from table.to_batches(max_chunksize=RUN_BATCH_ROWS)
                return
            buf.write_run()
            started = time.perf_counter()
            yield from _merge_runs(
                buf.runs, self.schema, order, buf, self.dirs, metrics, self.max_merge_bytes
            )
            if metrics is not None:  # the merge comes after the run's last measure
                metrics.peak_rss_bytes = max(metrics.peak_rss_bytes, peak_rss())
                metrics.wall_time_s += time.perf_counter() - started
        finally:
            self.close()

    def close(self) -> None:
        """Release its memory and remove its run files. Idempotent."""
        self._state = "closed"
        self.buffer.batches.clear()
        self.buffer.close_memory()
        for run in self.buffer.runs:
            try:
                os.unlink(run.path)
            except FileNotFoundError:
                pass
        self.buffer.runs.clear()
        if self._own_dirs:
            self.dirs.cleanup()


def external_sort(
    batches: Iterator[pa.RecordBatch],
    schema: pa.Schema,
    keys: Sequence[str | SortKey],
    tmm: TaskMemoryManager,
    spill_dirs: Sequence[str] | str | None,
    metrics: RunMetrics | None = None,
    limit: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """``batches`` sorted by ``keys`` (see :class:`ExternalSort`), in bounded memory; only
    the first ``limit`` rows if given."""
    sort = ExternalSort(schema, keys, tmm, spill_dirs, metrics, limit)
    try:
        for batch in batches:
            sort.add(batch)
        yield from sort.sorted()
    finally:
        sort.close()


def _note_granted(buf: _SortBuffer, metrics: RunMetrics | None) -> None:
    if metrics is not None:
        metrics.peak_granted_bytes = max(metrics.peak_granted_bytes, buf.used)


def _write_run(
    batches: list[pa.RecordBatch],
    schema: pa.Schema,
    keys: Sequence[SortKey],
    dirs: SpillDirs,
    limit: int | None = None,
    batch_cap: int | None = None,
) -> _Run:
    """``batches`` sorted into a run file (its first ``limit`` rows), in batches of at most
    ``batch_cap`` bytes if given (but :data:`CAPPED_RUN_BATCH_ROWS` rows)."""
    table = _sorted(pa.Table.from_batches(batches, schema=schema), keys, limit)
    row_bytes = max(1, table.nbytes // max(1, table.num_rows))
    rows = max(
        MIN_RUN_BATCH_ROWS, min(RUN_BATCH_ROWS, table.nbytes // RUN_BATCH_SHARE // row_bytes)
    )
    if batch_cap is not None:
        rows = min(rows, max(CAPPED_RUN_BATCH_ROWS, batch_cap // row_bytes))
    return _write_batches(table.to_batches(max_chunksize=rows), schema, dirs, rows, table.nbytes)


def _write_batches(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    dirs: SpillDirs,
    rows: int,
    size: int | None,
) -> _Run:
    """``batches`` (of at most ``rows`` rows) as a new run file. A failed write (disk
    full...) removes it and raises :class:`~extagg.errors.SpillError` naming the file and
    its directory; an error while ``batches`` are made removes it too, and propagates."""
    path = dirs.new_path("sort")
    largest = 0
    offset = 0
    written: list[tuple[int, int, int]] = []
    sink = None
    try:
        try:
            sink = open(path, "wb")  # noqa: SIM115 (closed below, also on errors)
        except OSError as exc:
            raise _write_error(path, size, exc) from exc
        for batch in batches:
            largest = max(largest, batch.nbytes)
            data = _ipc_bytes(batch, schema)
            try:
                sink.write(data)
            except OSError as exc:
                raise _write_error(path, size, exc) from exc
            written.append((offset, len(data), zlib.crc32(data)))
            offset += len(data)
        try:
            sink.close()
        except OSError as exc:
            raise _write_error(path, size, exc) from exc
    except BaseException:
        try:
            if sink is not None:
                sink.close()
        except OSError:
            pass
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    log.info("sort run %s written", path)
    return _Run(path, largest, rows, written)


def _ipc_bytes(batch: pa.RecordBatch, schema: pa.Schema) -> pa.Buffer:
    """One batch as an Arrow IPC stream of its own (schema, dictionaries, the batch)."""
    out = pa.BufferOutputStream()
    with pa.ipc.new_stream(out, schema) as writer:
        writer.write_batch(batch)
    return out.getvalue()


def _read_batch(handle: Any, run: _Run, i: int) -> pa.RecordBatch:
    """Batch ``i`` of ``run``, its length and checksum verified."""
    offset, length, crc = run.batches[i]
    handle.seek(offset)
    data = handle.read(length)
    if len(data) != length:
        raise CorruptFileError(
            run.path, offset, f"truncated: batch {i} has {len(data)} of its {length} bytes"
        )
    if zlib.crc32(data) != crc:
        raise CorruptFileError(run.path, offset, f"checksum mismatch in batch {i}")
    with pa.ipc.open_stream(pa.py_buffer(data)) as reader:
        return reader.read_next_batch()


def _write_error(path: str, size: int | None, exc: OSError) -> SpillError:
    folder = os.path.dirname(path)
    need = "" if size is None else f" ({size:,} bytes)"
    return SpillError(
        f"cannot write the sort run {path}{need} in {folder}: {exc.strerror or exc}",
        directory=folder, bytes_needed=size, errno=exc.errno,
    )  # fmt: skip


def _merge_runs(
    runs: list[_Run],
    schema: pa.Schema,
    keys: Sequence[SortKey],
    buf: _SortBuffer,
    dirs: SpillDirs,
    metrics: RunMetrics | None,
    max_bytes: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """Every run's rows in order: merged as many at a time as the memory granted (at most
    ``max_bytes``, but two runs' batches always) covers."""
    while True:
        per_run = MERGE_COPIES * max(1, max(r.max_batch_bytes for r in runs))
        want = per_run * min(len(runs), MAX_FAN_IN)
        if max_bytes is not None:
            want = min(want, max(2 * per_run, max_bytes))
        granted = buf.acquire_memory(want)
        _note_granted(buf, metrics)
        fan_in = max(2, min(len(runs), MAX_FAN_IN, granted // per_run))
        try:
            if fan_in >= len(runs):
                yield from _merge(runs, schema, keys, RUN_BATCH_ROWS)
                return
            group = runs[:fan_in]  # ``runs`` (the buffer's) changed in place: what close() removes
            log.info("merging %d of %d sort runs into one", fan_in, len(runs))
            rows = max(r.rows for r in group)
            merged = _merge(group, schema, keys, rows)
            runs.append(_write_batches(merged, schema, dirs, rows, None))
            del runs[:fan_in]
            for run in group:
                os.unlink(run.path)
        finally:
            buf.free_memory(buf.used)


def _merge(
    runs: list[_Run], schema: pa.Schema, keys: Sequence[SortKey], rows: int
) -> Iterator[pa.RecordBatch]:
    """The rows of ``runs`` in order, in batches of at most ``rows`` rows."""
    files = []
    try:
        for r in runs:
            try:
                files.append(open(r.path, "rb"))  # noqa: SIM115 (closed below)
            except FileNotFoundError as exc:
                raise CorruptFileError(r.path, None, "the sort run is gone") from exc
        if _leads_by_integers(schema, keys):
            yield from _merge_files_by_lead(files, runs, schema, keys, rows)
        else:
            yield from _merge_files(files, runs, schema, keys, rows)
    finally:
        for f in files:
            f.close()


def _merge_files(
    files: list[Any], runs: list[_Run], schema: pa.Schema, keys: Sequence[SortKey], rows: int
) -> Iterator[pa.RecordBatch]:
    next_batch = [0] * len(runs)
    last_row: list[pa.Table | None] = [None] * len(runs)  # last loaded row of each run
    carry = schema.empty_table()

    def load(i: int) -> pa.Table | None:
        if next_batch[i] >= len(runs[i].batches):
            last_row[i] = None
            return None
        b = _read_batch(files[i], runs[i], next_batch[i])
        next_batch[i] += 1
        last_row[i] = pa.Table.from_batches([b.slice(b.num_rows - 1, 1)])
        return pa.Table.from_batches([b])

    loaded = [t for t in (load(i) for i in range(len(runs))) if t is not None]
    carry = pa.concat_tables([carry, *loaded])
    while True:
        live = [i for i, row in enumerate(last_row) if row is not None]
        if not live:
            yield from _sorted(carry, keys).to_batches(max_chunksize=rows)
            return
        bounds = pa.concat_tables([last_row[i] for i in live])
        first = sort_indices(bounds, keys)
        owner = live[first[0].as_py()]
        bound = last_row[owner]
        assert bound is not None
        combined = pa.concat_tables([carry, bound]).combine_chunks()
        order = sort_indices(combined, keys)
        order_np = order.to_numpy()
        sentinel = combined.num_rows - 1  # stable sort: the real row comes before its copy
        cut = int((order_np == sentinel).nonzero()[0][0])
        out = combined.take(order_np[:cut])
        carry = combined.take(order_np[cut + 1 :])
        yield from out.to_batches(max_chunksize=rows)
        nxt = load(owner)
        if nxt is not None:
            carry = pa.concat_tables([carry, nxt])


def _leads_by_integers(schema: pa.Schema, keys: Sequence[SortKey]) -> bool:
    """Whether the first sort key is an ascending 64-bit integer column (the quantiles' key
    hash, a ``--sort`` by an id): its runs can be cut by binary search."""
    name, direction = keys[0]
    typ = schema.field(name).type
    return direction == "ascending" and (pa.types.is_int64(typ) or pa.types.is_uint64(typ))


def _rows_up_to(table: pa.Table, row: list[Any], keys: Sequence[SortKey]) -> int | None:
    """How many first rows of ``table`` (sorted by ``keys``, ascending) sort at or before
    ``row`` (its values of ``keys``): a binary search on each key within the rows equal on
    the keys before it. None where NumPy cannot search a key as Arrow sorts it (a null, a
    descending key, a type whose values do not compare with NumPy's)."""
    lo, hi = 0, table.num_rows
    for (name, direction), value in zip(keys, row, strict=True):
        if lo == hi:
            break
        column = table.column(name).slice(lo, hi - lo)
        if direction != "ascending" or value is None or column.null_count:
            return None
        typ = column.type
        if not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_string(typ)
                or pa.types.is_large_string(typ)):  # fmt: skip
            return None
        values = column.to_numpy()
        try:
            left = int(np.searchsorted(values, value, side="left"))
            right = int(np.searchsorted(values, value, side="right"))
        except TypeError:
            return None
        lo, hi = lo + left, lo + right
    return hi


def _lead_values(column: pa.ChunkedArray) -> np.ndarray:
    """A 64-bit integer column as NumPy values, nulls (sorted last) as the largest value."""
    largest = np.iinfo(np.uint64 if pa.types.is_uint64(column.type) else np.int64).max
    filled = pc.fill_null(column, pa.scalar(largest, column.type)) if column.null_count else column
    return filled.to_numpy()


def _merge_files_by_lead(
    files: list[Any], runs: list[_Run], schema: pa.Schema, keys: Sequence[SortKey], rows: int
) -> Iterator[pa.RecordBatch]:
    """:func:`_merge_files` for runs whose first key is a 64-bit integer: each round, every
    run's loaded rows whose first key is below the smallest "last loaded first key" of the
    runs still being read are cut off by binary search and only they are sorted (the plain
    merge sorts all it holds each round: ~the fan-in times the rows). Where no row is below
    it (one first key over many batches: a large group's values, a global quantile), a round
    of the plain merge by every key makes progress: the rows up to the smallest last loaded
    row are emitted, the others go back to their runs' loaded rows (only that run reads on,
    so what is held stays a batch or so per run)."""
    lead_name = keys[0][0]
    count = len(runs)
    next_batch = [0] * count
    held: list[pa.Table] = [schema.empty_table() for _ in runs]  # loaded, not emitted
    leads: list[np.ndarray] = [np.zeros(0, np.uint64) for _ in runs]

    def more(i: int) -> bool:
        return next_batch[i] < len(runs[i].batches)

    def load(i: int) -> None:
        batch = _read_batch(files[i], runs[i], next_batch[i])
        next_batch[i] += 1
        table = pa.Table.from_batches([batch])
        held[i] = pa.concat_tables([held[i], table]) if held[i].num_rows else table
        leads[i] = _lead_values(held[i].column(lead_name))

    while True:
        for i in range(count):
            while not held[i].num_rows and more(i):
                load(i)
        feeding = [i for i in range(count) if more(i)]
        if not feeding:  # every run read: what is held, in order
            rest = [t for t in held if t.num_rows]
            if rest:
                yield from _sorted(pa.concat_tables(rest), keys).to_batches(max_chunksize=rows)
            return
        bound = min(leads[i][-1] for i in feeding)
        pieces, emitted = [], set()
        for i in range(count):
            cut = int(np.searchsorted(leads[i], bound, side="left"))
            if cut:
                pieces.append(held[i].slice(0, cut))
                held[i], leads[i] = held[i].slice(cut), leads[i][cut:]
                emitted.add(i)
        if pieces:
            yield from _sorted(pa.concat_tables(pieces), keys).to_batches(max_chunksize=rows)
            for i in feeding:  # what it holds is the bound's rows: read on past them
                if i in emitted and leads[i][-1] == bound:
                    load(i)
            continue
        # a round by every key: up to the smallest last loaded row of the runs being read
        lasts = pa.concat_tables([held[i].slice(held[i].num_rows - 1, 1) for i in feeding])
        owner = feeding[sort_indices(lasts, keys)[0].as_py()]
        sentinel = held[owner].slice(held[owner].num_rows - 1, 1)
        bound_row = [sentinel.column(name)[0].as_py() for name, _ in keys]
        upto = [_rows_up_to(held[i], bound_row, keys) for i in range(count)]
        if all(n is not None for n in upto):  # each run cut by binary search on every key
            pieces = [held[i].slice(0, n) for i, n in enumerate(upto) if n]
            for i, n in enumerate(upto):
                if n:
                    held[i], leads[i] = held[i].slice(n), leads[i][n:]
            yield from _sorted(pa.concat_tables(pieces), keys).to_batches(max_chunksize=rows)
            continue
        tagged = [
            t.append_column(_RUN, pa.array(np.full(t.num_rows, i, np.int32)))
            for i, t in enumerate([*held, sentinel]) if t.num_rows
        ]  # fmt: skip
        combined = pa.concat_tables(tagged).combine_chunks()
        order = sort_indices(combined, keys).to_numpy()
        at = int((order == combined.num_rows - 1).nonzero()[0][0])  # stable: after its equals
        yield from combined.take(order[:at]).drop_columns([_RUN]).to_batches(max_chunksize=rows)
        rest = combined.take(order[at + 1 :])
        source = rest.column(_RUN).to_numpy()
        rest = rest.drop_columns([_RUN])
        for i in range(count):  # each run's rows back, in order (a stable sort's subsequence)
            mine = source == i
            held[i] = rest.filter(pa.array(mine)) if mine.any() else schema.empty_table()
            leads[i] = _lead_values(held[i].column(lead_name))

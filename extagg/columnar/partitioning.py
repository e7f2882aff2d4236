"""The aggregator's partitioned mode: deciding on it and entering it.

Functions on the aggregator's :class:`~extagg.columnar.state.TableState` (like
:mod:`~extagg.columnar.growth`); the partition files, the hash bits and the merge source over
the partitions' aggregators are in :mod:`extagg.columnar.partition_files`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from extagg._config import format_size
from extagg.collection.typed_table import TypedHashTable
from extagg.columnar.buffers import IO_COPIES
from extagg.columnar.columns import Column
from extagg.columnar.growth import enlarge_empty
from extagg.columnar.partition_files import (
    MIN_BUFFER_BYTES,
    PARTITION_BELOW,
    PARTITION_BITS,
    REPEAT_RATE,
    PartitionWriter,
    buffer_bytes,
    held_bytes,
    repeat_rate,
    sample_bytes,
)
from extagg.columnar.runs import spill_table, write_table_run
from extagg.columnar.state import TableState
from extagg.errors import MemoryLimitError

__all__ = [
    "set_aside",
    "spill_or_partition",
    "SPLIT_REPEAT_RATE",
    "resident_rotation",
    "split_buffer_bytes",
    "split_table",
    "start_partitioning",
]

log = logging.getLogger(__name__)


def spill_or_partition(
    st: TableState,
    table: TypedHashTable,
    may_partition: bool,
    split: Callable[[np.ndarray, np.ndarray], bool] | None = None,
) -> bool:
    """The full table cannot grow: spill it. Returns True when the input should be partitioned
    from now on (``may_partition`` and the table barely reduces its input while its keys keep
    coming back, see :mod:`extagg.columnar.partition_files`); the table is then spilled whole,
    or, if ``split(hashes, gids)`` (given the sorted table) returns True, only in part: that
    function wrote the groups of some partitions and kept the others in the table."""
    reason = "memory for growth not granted"
    low_reduction = st.rows_since_spill < PARTITION_BELOW * table.num_groups
    if not (low_reduction and st.runs and may_partition):
        spill_table(st, reason, keep_arrays=True)
        enlarge_empty(st, table)
        return False
    rows = st.rows_since_spill
    hashes, gids = table.sort_by_hash()
    try:
        rate = _repeat_rate(st, hashes)
    except BaseException:
        table.restore_after_sort()
        raise
    if rate is None or rate < (SPLIT_REPEAT_RATE if split is not None else REPEAT_RATE):
        spill_table(st, reason, keep_arrays=True, sorted_table=(hashes, gids))
        del hashes, gids  # views of the old slots
        enlarge_empty(st, table)
        return False
    log.info(
        "%s: its full table of %d groups came from %d rows and %.0f %% of its keys are in "
        "earlier runs; setting the input aside in hash partitions from now on (level %d)",
        st.name, table.num_groups, rows, 100 * rate, st.level,
    )  # fmt: skip
    if split is not None and split(hashes, gids):
        return True
    spill_table(st, f"{reason}; partitioning from now on", sorted_table=(hashes, gids))
    return True


#: the repeat rate from which a table that can be split (fixed-width keys, no string states)
#: partitions: lower than :data:`~extagg.columnar.partition_files.REPEAT_RATE`, since a split
#: keeps half the table in memory (measured, 20 M rows over 10 M keys: at 60 MiB the rate
#: reached 20 % only at the 7th full table, 7 % at the 2nd; 2.3 % per table with two threads
#: at 30 MiB); keys that never come back (a rate near 0) still spill sorted tables
SPLIT_REPEAT_RATE = 0.05


def split_buffer_bytes(max_memory: int) -> int:
    """Bytes buffered per partition while a table keeps some partitions resident: small, the
    table keeps the memory, but not so small that the rows set aside cost more to write than
    to fold. 1/512 of the budget wrote them in batches of ~30 KiB at 32 MiB: SUM over 20 M
    rows and 1 M int64 keys with two threads spent 4.5 s writing 314 MB (6.4 s in all); with
    1/128, 2.8 s (4.2 s), and 20 M rows over 10 M keys at 60 and 139 MiB took 3-14 % less with
    one thread or two (held: 35 such buffers, ~1/4 of the budget at most)."""
    return max(4 * MIN_BUFFER_BYTES, max_memory // 128)


def resident_rotation(resident: int) -> int:
    """Bits the hashes of ``resident`` partitions (a power of two) are rotated by in a split
    table: the top bits they all share (zero)."""
    return PARTITION_BITS - (resident.bit_length() - 1)


def split_table(
    st: TableState,
    table: TypedHashTable,
    hashes: np.ndarray,
    gids: np.ndarray,
    writer: PartitionWriter | None,
) -> PartitionWriter | None:
    """Hybrid hash aggregation: the full ``table`` (sorted: ``hashes``, ``gids``) keeps the
    lower half of its resident partitions (``st.resident_parts``) and writes the groups of the
    upper half as a run, partition by partition; the rows of those partitions are set aside
    from now on (``writer``, started here with small buffers if None). Returns the writer, or
    None when the memory for it (buffers, the scratch of compacting the table) is not granted
    or no partition would stay: nothing was done then, the table is still sorted.

    A table just over its budget then spills a part of its groups, not all of them, and the
    rows of the kept partitions are aggregated in memory to the end, as in DuckDB's and
    PostgreSQL's hybrid hash aggregation.
    """
    resident = st.resident_parts // 2
    if resident == 0 or table.has_var:
        return None
    bound = np.uint64(resident) << np.uint64(64 - PARTITION_BITS)
    cut = int(np.searchsorted(hashes, bound))
    n = len(hashes)
    scratch = table.keep_bytes(cut)
    budget = st.budget
    limit = 0
    aside = 0
    if writer is None:
        limit = split_buffer_bytes(budget.max_memory)
        while limit >= MIN_BUFFER_BYTES:
            aside = held_bytes(limit, IO_COPIES)
            if budget.hold_more(aside + scratch):
                break
            limit //= 2
        else:
            return None
    elif not budget.hold_more(scratch):
        return None
    size = table.nbytes
    metrics = st.metrics
    if cut < n:
        metrics.spill_count += 1
        log.info(
            "%s: its full table of %d groups came from %d rows; spilling the %d groups of "
            "partitions %d-%d, keeping %d in memory; their rows are set aside from now on",
            st.name, n, st.rows_since_spill, n - cut, resident, st.resident_parts - 1, cut,
        )  # fmt: skip
        started = time.perf_counter()
        try:
            write_table_run(st, table, hashes, gids, cut, st.var_arena)
        except BaseException:
            table.restore_after_sort()
            budget.trim()
            raise
        finally:
            metrics.spill_time_s += time.perf_counter() - started
        metrics.memory_bytes_spilled += size * (n - cut) // max(1, n)
    # the kept hashes share their top bits: rotated, the next bits choose the table's slots
    table.keep_sorted_prefix(cut, resident_rotation(resident))
    st.resident_parts = resident
    st.rows_since_spill = 0
    if writer is None:
        st.aside_bytes += aside
        writer = PartitionWriter(st.runs, limit)
    budget.trim()
    return writer


def _repeat_rate(st: TableState, sorted_hashes: np.ndarray) -> float | None:
    """:func:`~extagg.columnar.partition_files.repeat_rate`, with its sample held (``None``
    when the memory for it is not granted)."""
    sample = sample_bytes(st.runs.paths)
    if not st.budget.hold_more(sample):
        return None
    try:
        return repeat_rate(sorted_hashes, st.runs.paths)
    finally:
        st.budget.trim()


def start_partitioning(st: TableState, plans: list[tuple[int, int]]) -> PartitionWriter | None:
    """From now on input rows are set aside by hash (the table was just spilled): drop the
    table, take the first chunk plan ``(chunk_rows, scratch bytes)`` of ``plans`` whose
    partition buffers are granted; returns the writer, or None to go on spilling tables."""
    st.table = None
    st.var_arena = None
    st.budget.trim()
    max_memory = st.budget.max_memory
    for chunk_rows, scratch in plans:
        st.chunk_rows, st.scratch = chunk_rows, scratch
        limit = buffer_bytes(max_memory)
        while limit >= MIN_BUFFER_BYTES:
            aside = held_bytes(limit, IO_COPIES)
            if st.budget.hold_more(aside):
                break
            limit //= 2
        if limit >= MIN_BUFFER_BYTES:
            break
    else:  # not even the smallest buffers: go on spilling tables
        log.info(
            "%s cannot hold %s of partition buffers (%s); it keeps spilling tables",
            st.name, format_size(held_bytes(MIN_BUFFER_BYTES, IO_COPIES)), st.budget.describe(),
        )  # fmt: skip
        return None
    st.aside_bytes = aside
    return PartitionWriter(st.runs, limit)


def set_aside(
    st: TableState,
    writer: PartitionWriter,
    cols: dict[str, Column],
    hashes: np.ndarray,
    rows: np.ndarray | None = None,
) -> None:
    """Write the rows of a chunk (keys hashed to ``hashes``), or its rows ``rows``, to their
    partitions, holding the copies of their strings meanwhile. On a failure some rows may be
    on disk and others not: the caller must give up (close)."""
    var_bytes = sum(c.data.nbytes for c in cols.values() if c.data is not None)
    if var_bytes and not st.budget.hold_more(2 * var_bytes):
        _set_aside_in_pieces(st, writer, cols, hashes, rows)
        return
    started = time.perf_counter()
    try:
        writer.write(cols, hashes, rows)
    finally:
        st.metrics.spill_time_s += time.perf_counter() - started
    if var_bytes:
        st.budget.trim()
    n = len(hashes) if rows is None else len(rows)
    st.metrics.records_read += n
    st.rows_since_spill += n


def _set_aside_in_pieces(
    st: TableState,
    writer: PartitionWriter,
    cols: dict[str, Column],
    hashes: np.ndarray,
    rows: np.ndarray | None,
) -> None:
    """:func:`set_aside` of a chunk whose strings' copies are not granted at once (a budget of
    a few MiB, most of it the partition buffers and the input): its rows a piece at a time,
    each piece half the last one that was not granted; a single row not granted is a
    :class:`MemoryLimitError`."""
    chosen = np.arange(len(hashes), dtype=np.int64) if rows is None else rows
    # the bytes of strings before each chosen row, over every variable-length column
    before = np.zeros(len(chosen) + 1, dtype=np.int64)
    for col in cols.values():
        if col.offsets is not None:
            lengths = np.diff(col.offsets.astype(np.int64, copy=False))
            before[1:] += np.cumsum(lengths[chosen])
    start, size = 0, max(1, len(chosen) // 2)
    while start < len(chosen):
        stop = min(len(chosen), start + size)
        need = 2 * int(before[stop] - before[start])
        if need and not st.budget.hold_more(need):
            if size == 1:
                raise MemoryLimitError(
                    f"{st.name} needs {format_size(need)} more to set aside a row's "
                    f"{format_size(need // 2)} of strings ({st.budget.describe()})"
                )
            size = max(1, size // 2)
            continue
        started = time.perf_counter()
        try:
            writer.write(cols, hashes, chosen[start:stop])
        finally:
            st.metrics.spill_time_s += time.perf_counter() - started
            st.budget.trim()
        st.metrics.records_read += stop - start
        st.rows_since_spill += stop - start
        start = stop

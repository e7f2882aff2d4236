"""The aggregator's partitioned mode: deciding on it, entering it, setting rows aside, children.

Functions on a :class:`~extagg.columnar.HashAggregator` (like :mod:`~extagg.columnar.growth`);
the files and the merge source they use are in :mod:`extagg.columnar.partitions`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from extagg._config import format_size
from extagg.collection.typed_table import TypedHashTable
from extagg.columnar.buffers import IO_COPIES, partition_chunks
from extagg.columnar.columns import Column
from extagg.columnar.partitions import (
    MAX_LEVEL,
    MIN_BUFFER_BYTES,
    PARTITION_BELOW,
    REPEAT_RATE,
    PartitionWriter,
    buffer_bytes,
    held_bytes,
    repeat_rate,
    sample_bytes,
)
from extagg.columnar.runs import spill_table
from extagg.errors import MemoryLimitError

if TYPE_CHECKING:
    from extagg.columnar.hash_aggregator import HashAggregator

__all__ = ["absorb_child_metrics", "child_aggregator", "set_aside", "spill_or_partition"]

log = logging.getLogger(__name__)


def spill_or_partition(agg: HashAggregator, table: TypedHashTable) -> None:
    """The full table cannot grow: spill it, and partition the input from now on if it
    barely reduces its input while its keys keep coming back (see
    :mod:`extagg.columnar.partitions`)."""
    reason = "memory for growth not granted"
    low_reduction = agg._rows_since_spill < PARTITION_BELOW * table.num_groups
    if not (
        low_reduction
        and agg._runs
        and agg._order_free
        and agg._level < MAX_LEVEL
        and agg.force_spill_rows is None
    ):
        spill_table(agg, reason, keep_arrays=True)
        return
    rows = agg._rows_since_spill
    hashes, gids = table.sort_by_hash()
    try:
        rate = _repeat_rate(agg, hashes)
    except BaseException:
        table.restore_after_sort()
        raise
    if rate is None or rate < REPEAT_RATE:
        spill_table(agg, reason, keep_arrays=True, sorted_table=(hashes, gids))
        return
    log.info(
        "%s: its full table of %d groups came from %d rows and %.0f %% of its keys are in "
        "earlier runs; setting the input aside in hash partitions from now on (level %d)",
        agg.name, table.num_groups, rows, 100 * rate, agg._level,
    )  # fmt: skip
    spill_table(agg, f"{reason}; partitioning from now on", sorted_table=(hashes, gids))
    _start_partitioning(agg)


def _repeat_rate(agg: HashAggregator, sorted_hashes: np.ndarray) -> float | None:
    """:func:`~extagg.columnar.partitions.repeat_rate`, with its sample held (``None``
    when the memory for it is not granted)."""
    sample = sample_bytes(agg._runs)
    if not agg._hold(agg._in_use() + sample):
        return None
    try:
        return repeat_rate(sorted_hashes, agg._runs)
    finally:
        agg._trim()


def _start_partitioning(agg: HashAggregator) -> None:
    """From now on input rows are set aside by hash (the table was just spilled)."""
    agg._table = None
    agg._trim()
    # no table any more: larger chunks and a buffer per partition, as large as granted
    plans = [(agg._chunk_rows, agg._scratch)]
    if agg._chunk_rows_arg is None:
        assert agg._layout is not None
        plans.insert(0, partition_chunks(agg._layout, len(agg._needed), agg._max_memory))
    for chunk_rows, scratch in plans:
        agg._chunk_rows, agg._scratch = chunk_rows, scratch
        limit = buffer_bytes(agg._max_memory)
        while limit >= MIN_BUFFER_BYTES:
            aside = held_bytes(limit, IO_COPIES)
            if agg._hold(agg._in_use() + aside):
                break
            limit //= 2
        if limit >= MIN_BUFFER_BYTES:
            break
    else:  # not even the smallest buffers: go on spilling tables
        log.info(
            "%s cannot hold %s of partition buffers (%s held, max_memory %s); it keeps "
            "spilling tables",
            agg.name, format_size(held_bytes(MIN_BUFFER_BYTES, IO_COPIES)),
            format_size(agg.used), format_size(agg._max_memory),
        )  # fmt: skip
        return
    agg._aside_bytes = aside
    agg._partitions = PartitionWriter(agg, limit)


def set_aside(
    agg: HashAggregator,
    cols: dict[str, Column],
    n: int,
    start: int,
    hashes: np.ndarray | None = None,
) -> None:
    """Write rows ``start..n`` of a chunk to their partitions."""
    assert agg._partitions is not None and agg._layout is not None
    if start:
        cols = {k: c.slice(start, n) for k, c in cols.items()}
        hashes = None if hashes is None else hashes[start:n]
    var_bytes = sum(c.data.nbytes for c in cols.values() if c.data is not None)
    if var_bytes and not agg._hold(agg._in_use() + 2 * var_bytes):
        raise MemoryLimitError(
            f"{agg.name} needs {format_size(2 * var_bytes)} more to set aside a chunk's "
            f"{format_size(var_bytes)} of strings ({format_size(agg.used)} held, "
            f"max_memory {format_size(agg._max_memory)})"
        )
    if hashes is None:
        hashes = agg._encode([cols[k] for k in agg.keys]).hashes
    started = time.perf_counter()
    try:
        agg._partitions.write(cols, hashes)
    except BaseException:
        # some rows of this chunk may be on disk and others not: nothing can be trusted
        agg.close()
        raise
    finally:
        agg.metrics.spill_time_s += time.perf_counter() - started
        if var_bytes and agg._state != "closed":
            agg._trim()
    agg.metrics.records_read += n - start
    agg._rows_since_spill += n - start


def child_aggregator(agg: HashAggregator, level: int) -> HashAggregator:
    """An aggregator for one partition: same query, same memory manager and spill dirs."""
    child = type(agg)(
        agg.keys,
        agg._aggs,
        memory_manager=agg.task_memory_manager,
        batch_size=agg.batch_size,
        fan_in=agg.fan_in,
        compression=agg.compression,
        chunk_rows=agg._chunk_rows_arg,
        name=f"{agg.name}/p{level}",
    )
    child._spill_dirs = agg._spill_dirs
    child._level = level
    # what this aggregator and its own parents still hold is not the child's to plan with
    child._max_memory = max(1, agg._budget - agg.task_memory_manager.memory_used)
    child._budget = agg._budget
    child._schema = agg._schema
    child._layout = agg._layout
    child._plan(chunk_share=8)  # it reads large partition batches: fewer, larger chunks
    return child


def absorb_child_metrics(agg: HashAggregator, child: HashAggregator) -> None:
    m, c = agg.metrics, child.metrics
    m.spill_count += c.spill_count
    m.num_spill_files += c.num_spill_files
    m.memory_bytes_spilled += c.memory_bytes_spilled
    m.disk_bytes_spilled += c.disk_bytes_spilled
    m.raw_bytes_spilled += c.raw_bytes_spilled
    m.spill_time_s += c.spill_time_s
    m.merge_time_s += c.merge_time_s
    m.merge_passes += c.merge_passes
    m.merge_files += c.merge_files
    m.peak_memory_bytes = max(m.peak_memory_bytes, c.peak_memory_bytes)

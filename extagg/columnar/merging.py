"""The merge phase of :class:`~extagg.columnar.HashAggregator`: runs in, combined blocks out.

The shared :func:`extagg.merge.heap.merge_in_passes` drives it; the aggregator supplies the sources
(its in-memory table and its run files), the compiled ``combine`` of its block layout, and
accounted memory for the merge buffers, whose size decides the fan-in.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from extagg._config import format_size
from extagg.columnar._sources import TableSource
from extagg.columnar.buffers import IO_COPIES, MERGE_COPIES
from extagg.columnar.partitioned import absorb_child_metrics, child_aggregator
from extagg.columnar.partitions import (
    PARTITION_BITS,
    PartitionSource,
    buffer_bytes,
    rotate_right,
)
from extagg.columnar.runs import write_merged_run
from extagg.errors import MemoryLimitError
from extagg.merge.heap import BlockSource, RunSource, merge_in_passes
from extagg.spill.blocks import ColumnBlock

if TYPE_CHECKING:
    from extagg.columnar.hash_aggregator import HashAggregator

__all__ = ["drain", "merge_blocks", "result_blocks"]


def drain(source: BlockSource) -> Iterator[ColumnBlock]:
    """Every block of one source (no merging needed)."""
    try:
        while source.next_min_hash() is not None:
            yield source.read_next()
    finally:
        source.close()


def merge_blocks(
    agg: HashAggregator, table_source: TableSource | None, partitions: BlockSource | None = None
) -> Iterator[ColumnBlock]:
    """Merge the aggregator's in-memory table, runs and partitions (one source that aggregates
    them one after the other); combined blocks in hash order."""
    layout = agg._layout
    assert layout is not None
    sources: list[BlockSource] = [] if table_source is None else [table_source]
    runs: list[BlockSource] = [RunSource(p, owner=agg._spill_dirs) for p in agg._runs]
    agg._runs = []
    if partitions is not None:
        runs.append(partitions)
    sources.extend(runs)
    # the partitions' aggregators need memory while the merge runs: leave them three quarters
    limit = agg._max_memory // 4 if partitions is not None else None
    fan_in = _reserve_merge_memory(agg, len(runs), table_source, limit)
    metrics = agg.metrics

    def on_pass(number: int, _runs: int) -> None:
        metrics.merge_passes = number

    started = time.perf_counter()
    for block in merge_in_passes(
        sources,
        layout.combine,
        fan_in=fan_in,
        write_run=lambda blocks: write_merged_run(agg, blocks),
        on_pass=on_pass,
    ):
        metrics.merge_time_s += time.perf_counter() - started
        yield block
        started = time.perf_counter()
    metrics.merge_time_s += time.perf_counter() - started


def _reserve_merge_memory(
    agg: HashAggregator, num_runs: int, table_source: TableSource | None, limit: int | None
) -> int:
    """Hold read and combine buffers for the merge (at most ``limit`` bytes); returns the
    fan-in they allow.

    When the budget cannot hold them next to the in-memory table, the table's groups go to disk
    first (one more run) rather than merging in many passes.
    """
    largest = max(agg._max_batch_bytes, agg.io_batch_bytes, 1)
    per_source = largest * MERGE_COPIES
    wanted = min(agg.fan_in, num_runs + 1) * per_source
    if limit is not None:
        wanted = min(wanted, max(limit, 2 * per_source))
    granted = agg.acquire_memory(wanted)
    if granted < wanted and table_source is not None:
        with agg._lock:
            if table_source.spill_rest():
                granted += agg.acquire_memory(wanted - granted)
    agg.metrics.peak_granted_bytes = max(agg.metrics.peak_granted_bytes, agg.used)
    fan_in = min(agg.fan_in, granted // per_source)
    if fan_in < 2:
        agg.free_memory(granted)
        raise MemoryLimitError(
            f"{agg.name} needs {format_size(2 * per_source)} to merge two runs "
            f"({format_size(per_source)} of buffers per run) but was granted "
            f"{format_size(granted)} (max_memory {format_size(agg._max_memory)})"
        )
    return fan_in


def result_blocks(agg: HashAggregator) -> Iterator[ColumnBlock]:
    """Every group of ``agg`` once, as combined blocks in hash order: its in-memory table, its
    runs and its partitions merged (a partition's aggregator hands its blocks hashed as its
    parent sees them)."""
    with agg._lock:
        if agg._table is not None:
            agg.metrics.peak_memory_bytes = max(agg.metrics.peak_memory_bytes, agg._in_use())
            agg._source = TableSource(agg, agg._table)
            agg._table = None
        partitions = None
        if agg._partitions is not None:
            writer, agg._partitions = agg._partitions, None
            try:
                paths = writer.finish()
            except BaseException:
                writer.abort()
                raise
            partitions = PartitionSource(
                agg, paths, child_aggregator, result_blocks, absorb_child_metrics
            )
        agg._scratch = 0  # no more chunks to fold: give back their buffers
        # reading a partition back holds one of its batches (stored, decompressed, decoded)
        agg._aside_bytes = (
            IO_COPIES * buffer_bytes(agg._max_memory) if partitions is not None else 0
        )
        agg._floor = 0
        agg._trim()
    source = agg._source
    if not agg._runs and partitions is None:
        blocks = drain(source) if source is not None else _no_blocks()
    elif not agg._runs and source is None:
        assert partitions is not None
        blocks = drain(partitions)
    else:
        blocks = merge_blocks(agg, source, partitions)
    if not agg._level:
        yield from blocks
        return
    with contextlib.closing(blocks):  # a partition's groups, hashed as its parent sees them
        for block in blocks:
            hashes = rotate_right(block.hashes, PARTITION_BITS)
            yield ColumnBlock(hashes, block.columns, block.var_columns)


def _no_blocks() -> Iterator[ColumnBlock]:
    yield from ()

"""The merge phase of :class:`~extagg.columnar.HashAggregator`: runs in, combined blocks out.

The shared :func:`extagg.merge.heap.merge_in_passes` drives it; the aggregator supplies, in its
:class:`~extagg.columnar.state.TableState`, the sources (its in-memory table and its run files,
and one source over its partitions), the compiled ``combine`` of its block layout, and a
``reserve`` that holds accounted memory for the merge buffers, whose size decides the fan-in.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator, Iterator

from extagg.columnar._sources import TableSource
from extagg.columnar.buffers import MERGE_COPIES
from extagg.columnar.partition_files import rotate_right
from extagg.columnar.runs import write_merged_run
from extagg.columnar.state import TableState
from extagg.merge.heap import BlockSource, merge_in_passes
from extagg.spill.blocks import ColumnBlock

__all__ = ["ReserveMerge", "drain", "merge_blocks", "result_blocks"]

#: ``(bytes per source, sources, spill_rest, limit) -> (fan_in, bytes granted)``, as
#: :meth:`extagg.spillable.Spillable.reserve_merge_memory`
ReserveMerge = Callable[[int, int, Callable[[], bool] | None, int | None], tuple[int, int]]


def drain(source: BlockSource[ColumnBlock]) -> Generator[ColumnBlock, None, None]:
    """Every block of one source (no merging needed)."""
    try:
        while source.next_min_hash() is not None:
            yield source.read_next()
    finally:
        source.close()


def merge_blocks(
    st: TableState,
    table_source: TableSource | None,
    partitions: BlockSource[ColumnBlock] | None,
    reserve: ReserveMerge,
    io_batch_bytes: int,
) -> Generator[ColumnBlock, None, None]:
    """Merge the in-memory table, the runs and the partitions (one source that aggregates them
    one after the other); combined blocks in hash order."""
    layout = st.layout
    sources: list[BlockSource[ColumnBlock]] = [] if table_source is None else [table_source]
    runs = st.runs.take_sources()
    if partitions is not None:
        runs.append(partitions)
    sources.extend(runs)
    # the partitions' aggregators need memory while the merge runs: leave them three quarters
    limit = st.merge_limit
    if partitions is not None:
        quarter = st.budget.max_memory // 4
        limit = quarter if limit is None else min(limit, quarter)
    per_source = max(st.runs.max_batch_bytes, io_batch_bytes, 1) * MERGE_COPIES
    spill_rest = None if table_source is None else table_source.spill_rest
    fan_in, _ = reserve(per_source, len(runs) + 1, spill_rest, limit)
    metrics = st.metrics

    def on_pass(number: int, _runs: int) -> None:
        metrics.merge_passes = number

    started = time.perf_counter()
    for block in merge_in_passes(
        sources,
        layout.combine,
        fan_in=fan_in,
        write_run=lambda blocks: write_merged_run(st, blocks),
        on_pass=on_pass,
    ):
        metrics.merge_time_s += time.perf_counter() - started
        yield block
        started = time.perf_counter()
    metrics.merge_time_s += time.perf_counter() - started


def result_blocks(
    st: TableState,
    table_source: TableSource | None,
    partitions: BlockSource[ColumnBlock] | None,
    reserve: ReserveMerge,
    io_batch_bytes: int,
    *,
    apart: bool = False,
) -> Iterator[ColumnBlock]:
    """Every group once, as combined blocks in hash order: the sorted in-memory table, the runs
    and the partitions merged (a partition's aggregator hands its blocks hashed as its parent
    sees them). ``apart``: no runs, and every hash of the table is below every hash of the
    partitions (a split table): the two are read one after the other, the table first (its
    memory is given back before the partitions' aggregators start)."""
    blocks: Generator[ColumnBlock, None, None]
    if apart and table_source is not None and partitions is not None and not st.runs:
        blocks = _chain(drain(table_source), drain(partitions))
    elif not st.runs and partitions is None:
        blocks = drain(table_source) if table_source is not None else _no_blocks()
    elif not st.runs and table_source is None:
        assert partitions is not None
        blocks = drain(partitions)
    else:
        blocks = merge_blocks(st, table_source, partitions, reserve, io_batch_bytes)
    if not st.rotate_back:
        yield from blocks
        return
    with contextlib.closing(blocks):  # a partition's groups, hashed as its parent sees them
        for block in blocks:
            hashes = rotate_right(block.hashes, st.rotate_back)
            yield ColumnBlock(hashes, block.columns, block.var_columns)


def _chain(
    *parts: Generator[ColumnBlock, None, None],
) -> Generator[ColumnBlock, None, None]:
    """The blocks of each generator in turn (every one closed when this one is)."""
    try:
        for part in parts:
            yield from part
    finally:
        for part in parts:
            part.close()


def _no_blocks() -> Generator[ColumnBlock, None, None]:
    yield from ()

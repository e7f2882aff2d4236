"""Run files of :class:`~extagg.columnar.HashAggregator`: its sorted table (spilled, and the
table started again), merged runs.

Both use the shared run-file format with the column codec; every batch is a
:class:`~extagg.spill.blocks.ColumnBlock` in the layout of :mod:`extagg.columnar.blocks`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from extagg._config import format_size
from extagg.collection.typed_table import TypedHashTable
from extagg.merge.heap import BlockSource, write_run_from
from extagg.spill.blocks import ColumnBlock
from extagg.spill.codecs import COLUMN_CODEC
from extagg.spill.runfile import RunFile, RunWriter

if TYPE_CHECKING:
    from extagg.columnar.hash_aggregator import HashAggregator

log = logging.getLogger("extagg.columnar.hash_aggregator")  # where spills were always logged

__all__ = ["spill_table", "write_merged_run", "write_table_run"]


def _count(agg: HashAggregator, info: RunFile) -> None:
    agg._max_batch_bytes = max(agg._max_batch_bytes, info.max_batch_bytes)
    agg.metrics.disk_bytes_spilled += info.disk_bytes
    agg.metrics.raw_bytes_spilled += info.raw_bytes


def write_table_run(
    agg: HashAggregator,
    table: TypedHashTable,
    hashes: np.ndarray,
    slot_gids: np.ndarray,
    start: int,
) -> str:
    """Write the sorted groups ``start..`` of ``table`` as a run; returns its path.

    On any failure the partial file is removed and the error propagates.
    """
    layout = agg._layout
    assert layout is not None
    path = agg._spill_dirs.new_path("agg")
    writer = RunWriter(path, COLUMN_CODEC, compression=agg.compression, spill_dirs=agg._spill_dirs)
    try:
        for _, block in layout.iter_sorted(
            table, hashes, slot_gids, start, agg.run_rows, agg.batch_var_bytes
        ):
            writer.write_block(block)
        info = writer.finish()
    except BaseException:
        writer.abort()
        raise
    _count(agg, info)
    agg.metrics.num_spill_files += 1
    return path


def write_merged_run(agg: HashAggregator, blocks: Iterator[ColumnBlock]) -> BlockSource:
    """Write the output of an intermediate merge pass as a run; returns a source over it."""
    source, info = write_run_from(
        blocks,
        path=agg._spill_dirs.new_path("merge"),
        codec=COLUMN_CODEC,
        batch_size=agg.run_rows,
        compression=agg.compression,
        spill_dirs=agg._spill_dirs,
    )
    _count(agg, info)
    agg.metrics.merge_files += 1
    return source


def spill_table(
    agg: HashAggregator,
    reason: str,
    *,
    keep_arrays: bool = False,
    release_all: bool = False,
    sorted_table: tuple[np.ndarray, np.ndarray] | None = None,
) -> None:
    """Sort ``agg``'s table by hash, write it as a run and start again: emptied in place with
    ``keep_arrays`` (the table was full and more input will fill it again), small
    otherwise (the memory is wanted for something else: key bytes, a larger arena), or
    with no table and all memory given back with ``release_all``. ``sorted_table``: what
    ``sort_by_hash`` returned, if the caller sorted it already."""
    table = agg._table
    assert table is not None and table.num_groups > 0
    size = table.nbytes
    agg.metrics.spill_count += 1
    log.info(
        "Thread %d spilling in-memory aggregation table of %s (%d groups) to disk "
        "(%d time%s so far; %s)",
        threading.get_ident(), format_size(size), table.num_groups,
        agg.metrics.spill_count, "s" if agg.metrics.spill_count > 1 else "", reason,
    )  # fmt: skip
    started = time.perf_counter()
    hashes, slot_gids = sorted_table if sorted_table is not None else table.sort_by_hash()
    try:
        path = write_table_run(agg, table, hashes, slot_gids, 0)
    except BaseException:
        table.restore_after_sort()
        raise
    finally:
        agg.metrics.spill_time_s += time.perf_counter() - started
    del hashes, slot_gids
    agg._runs.append(path)
    agg.metrics.memory_bytes_spilled += size
    agg._rows_since_spill = 0
    if release_all:
        agg._table = None
        agg.free_memory(agg.used)
    elif keep_arrays:
        table.clear()
        agg._trim()
    else:
        table.reset()
        agg._trim()

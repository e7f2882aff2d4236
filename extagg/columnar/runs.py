"""Run files of :class:`~extagg.columnar.HashAggregator`: its sorted table (spilled, and the
table started again), merged runs.

Both use the shared run-file format with the column codec; every batch is a
:class:`~extagg.spill.blocks.ColumnBlock` in the layout of :mod:`extagg.columnar.layout`.
Functions take the aggregator's :class:`~extagg.columnar.state.TableState`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import numpy as np

from extagg._config import format_size
from extagg.collection.typed_table import TypedHashTable
from extagg.columnar.partition_files import partition_bounds
from extagg.columnar.state import TableState
from extagg.columnar.var_states import VarArena
from extagg.merge.heap import BlockSource
from extagg.spill.blocks import ColumnBlock
from extagg.spill.codecs import COLUMN_CODEC
from extagg.spill.runfile import RunWriter

log = logging.getLogger("extagg.columnar.hash_aggregator")  # where spills were always logged

__all__ = ["spill_table", "write_merged_run", "write_table_run"]


def write_table_run(
    st: TableState,
    table: TypedHashTable,
    hashes: np.ndarray,
    slot_gids: np.ndarray,
    start: int,
    arena: VarArena | None = None,
) -> str:
    """Write the sorted groups ``start..`` of ``table`` (its string states in ``arena``) as a
    run of ``st.runs``; returns its path. On any failure the partial file is removed and the
    error propagates."""
    layout = st.layout

    def write(writer: RunWriter) -> None:
        # no batch spans two hash partitions: a partitioned aggregation reads each
        # partition's groups from the run on their own (partition_files.PartitionSource)
        for lo, hi in partition_bounds(hashes, start):
            for _, block in layout.iter_sorted(
                table, hashes[:hi], slot_gids[:hi], lo, st.run_rows, st.batch_var_bytes, arena
            ):
                writer.write_block(block)

    return st.runs.write("agg", COLUMN_CODEC, write)


def write_merged_run(st: TableState, blocks: Iterator[ColumnBlock]) -> BlockSource[ColumnBlock]:
    """Write the output of an intermediate merge pass as a run; returns a source over it."""
    return st.runs.write_merged(blocks, COLUMN_CODEC, st.run_rows)


def spill_table(
    st: TableState,
    reason: str,
    *,
    keep_arrays: bool = False,
    release_all: bool = False,
    sorted_table: tuple[np.ndarray, np.ndarray] | None = None,
) -> None:
    """Sort the table by hash, write it as a run and start again: emptied in place with
    ``keep_arrays`` (the table was full and more input will fill it again), small
    otherwise (the memory is wanted for something else: key bytes, a larger arena), or
    with no table and all memory given back with ``release_all``. ``sorted_table``: what
    ``sort_by_hash`` returned, if the caller sorted it already."""
    table = st.table
    assert table is not None and table.num_groups > 0
    size = table.nbytes
    metrics = st.metrics
    metrics.spill_count += 1
    log.info(
        "Thread %d spilling in-memory aggregation table of %s (%d groups) to disk "
        "(%d time%s so far; %s)",
        threading.get_ident(), format_size(size), table.num_groups,
        metrics.spill_count, "s" if metrics.spill_count > 1 else "", reason,
    )  # fmt: skip
    started = time.perf_counter()
    hashes, slot_gids = sorted_table if sorted_table is not None else table.sort_by_hash()
    try:
        write_table_run(st, table, hashes, slot_gids, 0, st.var_arena)
    except BaseException:
        table.restore_after_sort()
        raise
    finally:
        metrics.spill_time_s += time.perf_counter() - started
    del hashes, slot_gids
    metrics.memory_bytes_spilled += size
    st.rows_since_spill = 0
    arena = st.var_arena
    if release_all:
        st.table = None
        st.var_arena = None
        st.budget.free(st.budget.used)
    elif keep_arrays:
        table.clear()
        if arena is not None:
            arena.clear()
        st.budget.trim()
    else:
        table.reset()
        if arena is not None:  # small again, but with the room promised to the chunk folding
            arena.clear(shrink=True)
        st.budget.trim()

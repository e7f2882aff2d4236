"""Run files of :class:`~extagg.aggregate.HashAggregator`: its sorted table, merged runs.

Both use the shared run-file format with the column codec; every batch is a
:class:`~extagg.spill.blocks.ColumnBlock` in the layout of :mod:`extagg.aggregate.blocks`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from extagg.collection.typed_table import TypedHashTable
from extagg.merge import BlockSource, write_run_from
from extagg.spill.blocks import ColumnBlock
from extagg.spill.codecs import COLUMN_CODEC
from extagg.spill.runfile import RunFile, RunWriter

if TYPE_CHECKING:
    from extagg.aggregate.hash_aggregator import HashAggregator

__all__ = ["write_table_run", "write_merged_run"]


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

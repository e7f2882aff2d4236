"""The merge phase of :class:`~extagg.generic.external_map.ExternalAppendOnlyMap`.

The in-memory map (sorted) and every run file go through the shared
:func:`extagg.merge.heap.merge_in_passes`; equal keys are combined with the aggregator's
``merge_combiners``. The merge's read buffers (about one decoded batch per open run) are asked of
the map's memory manager first, and their grant decides the fan-in.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from extagg._config import format_size
from extagg.errors import MemoryLimitError
from extagg.merge.heap import (
    BlockSource,
    RunSource,
    combine_object_pieces,
    merge_in_passes,
    write_run_from,
)
from extagg.spill.blocks import ObjectBlock
from extagg.spill.codecs import OBJECT_CODEC

if TYPE_CHECKING:
    from extagg.generic.external_map import ExternalAppendOnlyMap
    from extagg.generic.memory_rows import SpillableMemorySource

__all__ = ["OBJECT_EXPANSION", "merged_pairs"]

#: decoded Python rows take about this many times their pickled bytes
OBJECT_EXPANSION = 4


def merged_pairs(
    emap: ExternalAppendOnlyMap, memory_source: SpillableMemorySource
) -> Iterator[Iterator[tuple[Any, Any]]]:
    """``(key, combiner)`` pairs of the whole map in hash order, one iterator per merged block.

    Closes every source, gives back the merge memory and closes the map when done, on error
    and when the consumer stops early.
    """
    sources: list[BlockSource] = [memory_source]
    with emap._lock:  # a forced spill from another thread may be moving rows to a run
        sources += [RunSource(path, owner=emap._spill_dirs) for path in emap._runs]
    merge_memory = 0
    metrics = emap.metrics
    try:
        fan_in = emap.fan_in
        if len(sources) > 1:
            fan_in, merge_memory = _reserve_merge_memory(emap, memory_source, len(sources))
        merge = emap.aggregator.merge_combiners

        def on_pass(number: int, _runs: int) -> None:
            metrics.merge_passes = number

        started = time.perf_counter()
        blocks = merge_in_passes(
            sources,
            lambda pieces: combine_object_pieces(pieces, merge),
            fan_in=fan_in,
            write_run=lambda blocks: _write_merged_run(emap, blocks),
            on_pass=on_pass,
        )
        for block in blocks:
            metrics.merge_time_s += time.perf_counter() - started
            metrics.groups += len(block)
            yield zip(block.keys, block.values)
            started = time.perf_counter()
        metrics.merge_time_s += time.perf_counter() - started
    finally:
        for source in sources:
            source.close()
        if merge_memory:
            emap.free_memory(min(merge_memory, emap.used))
        emap.close()


def _reserve_merge_memory(
    emap: ExternalAppendOnlyMap, memory_source: SpillableMemorySource, num_sources: int
) -> tuple[int, int]:
    """Account the merge's read buffers (about one decoded batch per open run).

    If the budget cannot hold them next to the in-memory map, the map's unread rows go to disk
    first (one more run) rather than merging in many passes. Returns the fan-in the granted
    memory allows and the bytes granted.
    """
    per_source = max(1, emap._max_batch_bytes * OBJECT_EXPANSION)
    wanted = min(emap.fan_in, num_sources) * per_source
    granted = emap.acquire_memory(wanted)
    if granted < wanted and emap._threshold > 0 and memory_source.spill_rest():
        emap.metrics.memory_bytes_spilled += emap._threshold
        emap._release_down_to(0)
        granted += emap.acquire_memory(wanted - granted)
    emap._note_granted()
    if granted < 2 * per_source:
        emap.free_memory(granted)
        max_memory = emap.task_memory_manager.memory_manager.max_memory
        raise MemoryLimitError(
            f"{emap.name} cannot merge {num_sources} sorted runs: it needs "
            f"{format_size(2 * per_source)} for two read buffers of "
            f"{format_size(per_source)} and was granted {format_size(granted)} "
            f"of a {format_size(max_memory)} budget"
        )
    fan_in = max(2, min(emap.fan_in, granted // per_source))
    return fan_in, granted


def _write_merged_run(emap: ExternalAppendOnlyMap, blocks: Iterator[ObjectBlock]) -> BlockSource:
    """Write one intermediate merge's output as a run (counted in the map's metrics)."""
    path = emap._spill_dirs.new_path("merge")
    source, info = write_run_from(
        blocks,
        path=path,
        codec=OBJECT_CODEC,
        batch_size=emap._batch_rows(),
        compression=emap.compression,
        spill_dirs=emap._spill_dirs,
    )
    emap.metrics.merge_files += 1
    emap.metrics.disk_bytes_spilled += info.disk_bytes
    emap.metrics.raw_bytes_spilled += info.raw_bytes
    return source

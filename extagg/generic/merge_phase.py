"""The merge phase of :class:`~extagg.generic.external_map.ExternalAppendOnlyMap`.

The in-memory map (sorted) and every run file go through the shared
:func:`extagg.merge.heap.merge_in_passes`; equal keys are combined with the aggregator's
``merge_combiners`` (:func:`extagg.merge.objects.combine_object_pieces`). The map reserves the
merge's read buffers (about one decoded batch per open run, :data:`OBJECT_EXPANSION` times its
pickled bytes) first; their grant decides the fan-in given here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from extagg.merge.heap import BlockSource, merge_in_passes
from extagg.merge.objects import MergeCombiners, combine_object_pieces
from extagg.metrics import SpillMetrics
from extagg.spill.blocks import ObjectBlock
from extagg.spill.codecs import OBJECT_CODEC
from extagg.spillable import RunSet

__all__ = ["OBJECT_EXPANSION", "merged_pairs"]

#: decoded Python rows take about this many times their pickled bytes
OBJECT_EXPANSION = 4


def merged_pairs(
    sources: Sequence[BlockSource[ObjectBlock]],
    merge_combiners: MergeCombiners,
    *,
    fan_in: int,
    runs: RunSet[ObjectBlock],
    batch_rows: Callable[[], int],
    metrics: SpillMetrics,
) -> Iterator[Iterator[tuple[Any, Any]]]:
    """``(key, combiner)`` pairs of ``sources`` merged in hash order, one iterator per merged
    block; intermediate merges write runs of ``batch_rows()`` rows into ``runs``.

    The caller closes the sources (and gives back the merge memory) when this ends.
    """

    def on_pass(number: int, _runs: int) -> None:
        metrics.merge_passes = number

    def write_run(blocks: Iterator[ObjectBlock]) -> BlockSource[ObjectBlock]:
        return runs.write_merged(blocks, OBJECT_CODEC, batch_rows())

    started = time.perf_counter()
    blocks = merge_in_passes(
        sources,
        lambda pieces: combine_object_pieces(pieces, merge_combiners),
        fan_in=fan_in,
        write_run=write_run,
        on_pass=on_pass,
    )
    for block in blocks:
        metrics.merge_time_s += time.perf_counter() - started
        metrics.groups += len(block)
        yield zip(block.keys, block.values)
        started = time.perf_counter()
    metrics.merge_time_s += time.perf_counter() - started

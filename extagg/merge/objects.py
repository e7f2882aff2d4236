"""The generic engine's combine: rows of equal keys merged with ``merge_combiners``.

:func:`combine_object_pieces` is the ``combine`` that :func:`extagg.merge.heap.merge_sources`
calls for :class:`~extagg.spill.blocks.ObjectBlock` sources (the columnar engine's combine is
:meth:`extagg.columnar.layout.BlockLayout.combine`, compiled).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from typing import Any

import numpy as np

from extagg.spill.blocks import ObjectBlock

__all__ = ["combine_object_pieces"]

MergeCombiners = Callable[[Any, Any], Any]


def combine_object_pieces(
    pieces: list[ObjectBlock], merge_combiners: MergeCombiners
) -> ObjectBlock:
    """Merge hash-sorted pieces (keys unique within each) into one, combining equal keys.

    Rows with equal hashes are compared with ``==``; only equal keys are combined, in source
    order (``merge_combiners(earlier, later)``); colliding but unequal keys stay apart.
    """
    if len(pieces) == 1:
        return pieces[0]
    block = ObjectBlock.concat(pieces)
    order = np.argsort(block.hashes, kind="stable")
    hashes = block.hashes[order]
    n = len(hashes)
    same = hashes[1:] == hashes[:-1]
    positions = order.tolist()
    keys = list(map(block.keys.__getitem__, positions))
    values = list(map(block.values.__getitem__, positions))
    if not same.any():
        return ObjectBlock(hashes, keys, values)
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    ends = np.append(starts[1:], n)
    multi = ends - starts > 1
    dropped: list[int] = []
    drop = dropped.append
    for s, e in zip(starts[multi].tolist(), ends[multi].tolist()):
        ka = keys[s]
        if e - s == 2:  # the common case: one key in two sources
            kb = keys[s + 1]
            if kb is ka or kb == ka:
                values[s] = merge_combiners(values[s], values[s + 1])
                drop(s + 1)
        elif keys[s:e].count(ka) == e - s:  # one key in several sources
            values[s] = reduce(merge_combiners, values[s:e])
            dropped.extend(range(s + 1, e))
        else:  # colliding hashes of unequal keys: combine each key with its equals only
            _combine_colliding(keys, values, s, e, merge_combiners, dropped)
    if not dropped:
        return ObjectBlock(hashes, keys, values)
    keep = np.ones(n, dtype=bool)
    keep[dropped] = False
    idx = np.flatnonzero(keep).tolist()
    return ObjectBlock(
        hashes[keep], list(map(keys.__getitem__, idx)), list(map(values.__getitem__, idx))
    )


def _combine_colliding(
    keys: list[Any],
    values: list[Any],
    s: int,
    e: int,
    merge_combiners: MergeCombiners,
    dropped: list[int],
) -> None:
    """Within rows ``s:e`` (equal hashes), fold each row into the first earlier equal key."""
    alive = list(range(s, e))
    while alive:
        a, rest = alive[0], alive[1:]
        ka = keys[a]
        alive = []
        for b in rest:
            kb = keys[b]
            if kb is ka or kb == ka:
                values[a] = merge_combiners(values[a], values[b])
                dropped.append(b)
            else:
                alive.append(b)

"""The generic engine's combine: rows of equal keys merged with ``merge_combiners``.

:func:`combine_object_pieces` is the ``combine`` that :func:`extagg.merge.heap.merge_sources`
calls for :class:`~extagg.spill.blocks.ObjectBlock` sources (the columnar engine's combine is
:meth:`extagg.columnar.layout.BlockLayout.combine`, compiled).

Keys that are all exact ``int`` or ``str`` (what most jobs group by) take a vectorised path:
the rows are ordered and compared as NumPy arrays (no per-row Python), and when the
combiners are all exact ``float`` (or ``int``) and ``merge_combiners`` is ``operator.add`` or
a function whose code is exactly ``return a + b`` of its two arguments
(:func:`extagg.function_code.is_plain_add`), every group is summed by a compiled left fold in
the same order (:mod:`extagg.merge._combine_kernels`), the very doubles the function gives.
Otherwise ``merge_combiners`` is called as before.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import reduce
from typing import Any

import numpy as np

from extagg.function_code import is_plain_add
from extagg.spill.blocks import IntKeyBlock, ObjectBlock

__all__ = ["combine_object_pieces", "is_plain_add", "same_key"]

MergeCombiners = Callable[[Any, Any], Any]

#: below this many rows a window is combined row by row (the arrays cost more than they save)
VECTOR_MIN_ROWS = 64
# the bounds a compiled segment sum stays within, typed like its values
_INT64_BOUNDS = (np.int64(np.iinfo(np.int64).min), np.int64(np.iinfo(np.int64).max))
_FLOAT_BOUNDS = (-np.inf, np.inf)


def combine_object_pieces(
    pieces: list[ObjectBlock], merge_combiners: MergeCombiners
) -> ObjectBlock:
    """Merge hash-sorted pieces (keys unique within each) into one, combining equal keys.

    Rows with equal hashes are compared with ``==``; only equal keys are combined, in source
    order (``merge_combiners(earlier, later)``); colliding but unequal keys stay apart.
    """
    if len(pieces) == 1:
        return pieces[0]
    if sum(map(len, pieces)) >= VECTOR_MIN_ROWS:
        fast: ObjectBlock | None = _combine_int_arrays(pieces, merge_combiners)
        if fast is None:
            fast = _combine_plain_keys(pieces, merge_combiners)
        if fast is not None:
            return fast
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
            try:  # inline: the hot path of a merge
                equal = kb is ka or ka == kb or same_key(ka, kb)
            except TypeError:
                equal = keys_equal(ka, kb)
            if equal:
                values[s] = merge_combiners(values[s], values[s + 1])
                drop(s + 1)
            continue
        try:
            everywhere = keys[s:e].count(ka) == e - s
        except TypeError:  # an == that raises for one order of the pair (Decimal, NumPy)
            everywhere = False
        if everywhere:  # one key in several sources
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


def _combine_int_arrays(
    pieces: list[ObjectBlock], merge_combiners: MergeCombiners
) -> IntKeyBlock | None:
    """The combine of int-key pieces with a plain ``+`` done on arrays alone: run batches
    decoded as :class:`~extagg.spill.blocks.IntKeyBlock` (and lists of exact ints and
    numbers, turned into arrays); ``None`` (nothing done) for anything else, unequal keys of
    one hash or an ``int64`` overflow."""
    if not is_plain_add(merge_combiners):
        return None
    keys, numbers = [], []
    for piece in pieces:
        arrays = _int_arrays(piece)
        if arrays is None:
            return None
        keys.append(arrays[0])
        numbers.append(arrays[1])
    dtype = numbers[0].dtype
    if any(column.dtype != dtype for column in numbers):
        return None  # int and float combiners: Python's int + float decides
    hashes = np.concatenate([piece.hashes for piece in pieces])
    order = np.argsort(hashes, kind="stable")
    hashes = hashes[order]
    key_array = np.concatenate(keys)[order]
    same = np.flatnonzero(hashes[1:] == hashes[:-1])
    if len(same) and not (key_array[same] == key_array[same + 1]).all():
        return None
    column = np.concatenate(numbers)[order]
    if not len(same):
        return IntKeyBlock(hashes, key_array, column)
    first = np.ones(len(hashes), dtype=bool)
    first[same + 1] = False
    starts = np.flatnonzero(first)
    out = np.empty(len(starts), dtype=dtype)
    if not _segment_sums(column, starts, out):
        return None
    return IntKeyBlock(hashes[starts], key_array[starts], out)


def _int_arrays(piece: ObjectBlock) -> tuple[np.ndarray, np.ndarray] | None:
    """``(int64 keys, float64 or int64 combiners)`` of a piece, or ``None`` if its keys are
    not all exact ints in ``int64`` or its combiners not all exact floats or all exact ints."""
    if type(piece) is IntKeyBlock:
        return piece.int_keys, piece.numbers
    keys, values = piece.keys, piece.values
    n = len(keys)
    count = operator.countOf
    if not n or count(map(type, keys), int) != n:
        return None
    kind = type(values[0])
    if (kind is not float and kind is not int) or count(map(type, values), kind) != n:
        return None
    try:
        return (
            np.array(keys, dtype=np.int64),
            np.array(values, dtype=np.float64 if kind is float else np.int64),
        )
    except OverflowError:
        return None


def _combine_plain_keys(
    pieces: list[ObjectBlock], merge_combiners: MergeCombiners
) -> ObjectBlock | None:
    """:func:`combine_object_pieces` for pieces whose keys are all exact ``int``/``str``, with
    NumPy; ``None`` (nothing done) for other keys or when two unequal keys share a hash."""
    keys: list[Any] = []
    values: list[Any] = []
    for piece in pieces:
        keys.extend(piece.keys)
        values.extend(piece.values)
    n = len(keys)
    count = operator.countOf
    kind = type(keys[0])
    if kind is not int and kind is not str:
        return None
    matching = count(map(type, keys), kind)
    if matching != n and matching + count(map(type, keys), str if kind is int else int) != n:
        return None
    hashes = np.concatenate([piece.hashes for piece in pieces])
    order = np.argsort(hashes, kind="stable")  # runs of sorted pieces: timsort merges them
    hashes = hashes[order]
    key_array = _key_array(keys, matching == n and kind is int)[order]
    same = np.flatnonzero(hashes[1:] == hashes[:-1])
    if len(same) and not (key_array[same] == key_array[same + 1]).all():
        return None  # unequal keys of one hash: the general path keeps them apart
    if not len(same):
        return ObjectBlock(
            hashes, key_array.tolist(), list(map(values.__getitem__, order.tolist()))
        )
    first = np.ones(n, dtype=bool)
    first[same + 1] = False
    starts = np.flatnonzero(first)
    summed = _plain_sums(values, order, starts, merge_combiners)
    if summed is None:
        vs = list(map(values.__getitem__, order.tolist()))
        summed = [vs[s] for s in starts.tolist()]
        ends = np.append(starts[1:], n)
        multi = np.flatnonzero(ends - starts > 1)
        for g, s, e in zip(multi.tolist(), starts[multi].tolist(), ends[multi].tolist()):
            summed[g] = reduce(merge_combiners, vs[s:e])
    return ObjectBlock(hashes[starts], key_array[starts].tolist(), summed)


def _key_array(keys: list[Any], all_int: bool) -> np.ndarray:
    """The keys as an ``int64`` array when they are all ints that fit (compared and handed
    back as ints of equal value), else as an object array."""
    if all_int:
        try:
            return np.array(keys, dtype=np.int64)
        except OverflowError:
            pass
    return np.array(keys, dtype=object)


def _segment_sums(column: np.ndarray, starts: np.ndarray, out: np.ndarray) -> bool:
    """Each segment's left-fold sum of ``column`` (float64 or int64) into ``out``; ``False``
    when an ``int64`` sum overflows. The compiled kernels are imported here: a worker whose
    merges never sum plain numbers (PySpark's ``groupByKey``) never loads numba."""
    from extagg.merge import _combine_kernels as CK

    low, high = _FLOAT_BOUNDS if column.dtype == np.float64 else _INT64_BOUNDS
    return bool(CK.segment_sum(column, starts, out, low, high) < 0)


def _plain_sums(
    values: list[Any], order: np.ndarray, starts: np.ndarray, merge_combiners: MergeCombiners
) -> list[Any] | None:
    """Every group's left-fold sum when ``merge_combiners`` is a plain ``+`` and the values
    are all exact floats (or all exact ints whose sums stay in ``int64``), else ``None``."""
    n = len(values)
    if not is_plain_add(merge_combiners):
        return None
    kind = type(values[0])
    if (kind is not float and kind is not int) or operator.countOf(map(type, values), kind) != n:
        return None
    out: np.ndarray
    if kind is float:
        column = np.array(values, dtype=np.float64)[order]
        out = np.empty(len(starts), dtype=np.float64)
        _segment_sums(column, starts, out)
        return list(out.tolist())
    try:
        ints = np.array(values, dtype=np.int64)[order]
    except OverflowError:
        return None
    out = np.empty(len(starts), dtype=np.int64)
    if not _segment_sums(ints, starts, out):
        return None  # a sum leaves int64: Python ints compute it
    return list(out.tolist())


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
            if kb is ka or keys_equal(ka, kb):
                values[a] = merge_combiners(values[a], values[b])
                dropped.append(b)
            else:
                alive.append(b)


def keys_equal(a: Any, b: Any) -> bool:
    """Whether keys ``a`` (met first) and ``b`` are one group, as a dict holding ``a`` finds
    ``b`` (``a == b``), or as :func:`same_key` says. An ``==`` that raises is tried the other
    way round (``Decimal(1) == np.int64(1)`` raises ``TypeError``; the reverse is True), then
    taken as unequal."""
    try:
        return bool(a == b) or same_key(a, b)
    except TypeError:
        try:
            return bool(b == a)
        except TypeError:
            return False


def same_key(a: Any, b: Any) -> bool:
    """Whether two keys found unequal by ``==`` are one group anyway: both float NaN, or
    tuples equal element-wise with NaN equal to NaN (the generic engine makes every NaN key
    one group, :mod:`extagg.generic.keys`; unpickled copies of its NaN are new objects)."""
    if isinstance(a, float):
        return isinstance(b, float) and a != a and b != b
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return all(x is y or x == y or same_key(x, y) for x, y in zip(a, b))
    return False

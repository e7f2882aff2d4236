"""Deterministic size estimates of Python objects, exact for small ones and sampled for big maps.

:func:`estimate_size` walks an object graph the way Spark's ``SizeEstimator`` walks the JVM heap:
``sys.getsizeof`` of every reachable object rounded up to what the allocator really hands out
(:func:`allocated_size`), each object counted once per call, shared
singletons (``None``, ``True``, ``False``, the cached small ints -5..256, the empty string) not at
all. :func:`estimate_entries_size` estimates the keys and values of a dense table from a fixed,
evenly spaced sample of its entries, so measuring a map of millions of entries costs O(sample),
not O(entries) (Spark samples large arrays the same way).

Estimates are heuristics (SPARK-6738: sampling shared objects can over-count them), but they
are deterministic: the same data always gives the same number.
"""

from __future__ import annotations

import functools
import sys
import types
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, cast

import numpy as np

__all__ = [
    "DEFAULT_SAMPLE_SIZE",
    "EntriesEstimate",
    "estimate_entries",
    "allocated_size",
    "estimate_size",
    "estimate_entries_size",
]

#: entries measured by :func:`estimate_entries_size` (Spark's ARRAY_SAMPLE_SIZE is 100)
DEFAULT_SAMPLE_SIZE = 100
#: a container with more elements than this has a sample of them walked, the rest scaled
#: from it (Spark's ARRAY_SIZE_FOR_SAMPLING is 400): walking all of a value of millions of
#: objects held a set of their ids, hundreds of MiB outside any budget
CONTAINER_SAMPLE_FROM = 400

_getsizeof = sys.getsizeof
_ATOMS = (int, float, str, bytes, complex, bool, bytearray, type(None))
_SEQUENCES = (tuple, list, set, frozenset, deque)
# objects whose __dict__ leads into modules and code, not into data: size only, no walk
_OPAQUE = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    types.FrameType,
    np.ndarray,  # getsizeof already includes the data buffer the array owns
)


@functools.lru_cache(maxsize=512)
def _slot_names(cls: type) -> tuple[str, ...]:
    """Attribute names of every ``__slots__`` entry of ``cls`` and its bases (private names
    mangled the way Python stores them)."""
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        for name in slots:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{klass.__name__.lstrip('_')}{name}"
            names.append(name)
    return tuple(names)


def allocated_size(requested: int) -> int:
    """Bytes an allocation of ``requested`` bytes really occupies: CPython's small-object
    allocator serves requests up to 512 bytes from 16-byte size classes; larger ones come from
    ``malloc``, which adds an 8-byte header and rounds to 16. A float asks for 24 bytes and
    occupies 32 — ignoring that under-counts a map of small objects by a quarter."""
    if requested <= 512:
        return (requested + 15) & ~15
    return (requested + 8 + 15) & ~15


def _deep_size_all(roots: list[Any], seen: set[int]) -> int:
    """Bytes of every object reachable from ``roots`` whose id is not in ``seen`` (updated).

    ``roots`` is consumed (used as the walk's stack)."""
    total = 0
    stack = roots
    pop = stack.pop
    push_all = stack.extend
    while stack:
        obj = pop()
        kind = type(obj)
        if kind is int:
            if -5 <= obj <= 256:
                continue
        elif obj is None or obj is True or obj is False or (kind is str and not obj):
            continue
        ident = id(obj)
        if ident in seen:
            continue
        seen.add(ident)
        size = _getsizeof(obj)
        total += (size + 15) & ~15 if size <= 512 else (size + 23) & ~15
        if kind is float or kind is int or kind is str or kind is bytes:
            continue
        if kind is tuple or kind is list:
            if len(obj) > CONTAINER_SAMPLE_FROM:
                total += _sampled_elements(obj, len(obj), seen)
            else:
                push_all(obj)
            continue
        if kind is dict:
            if len(obj) > CONTAINER_SAMPLE_FROM:
                total += _sampled_elements(obj.items(), len(obj), seen)
            else:
                push_all(obj.keys())
                push_all(obj.values())
            continue
        if isinstance(obj, (*_ATOMS, *_OPAQUE)):
            continue
        if isinstance(obj, dict):
            if len(obj) > CONTAINER_SAMPLE_FROM:
                total += _sampled_elements(obj.items(), len(obj), seen)
            else:
                push_all(obj.keys())
                push_all(obj.values())
        elif isinstance(obj, _SEQUENCES):
            if len(obj) > CONTAINER_SAMPLE_FROM:
                total += _sampled_elements(obj, len(obj), seen)
            else:
                push_all(obj)
        instance_dict = getattr(obj, "__dict__", None)
        if isinstance(instance_dict, dict):
            push_all((instance_dict,))
        for name in _slot_names(cast(type, kind)):
            try:
                push_all((getattr(obj, name),))
            except AttributeError:  # an unset slot
                pass
    return total


def _sampled_elements(elements: Iterable[Any], n: int, seen: set[int]) -> int:
    """Bytes of the ``n`` elements of a large container, from :data:`DEFAULT_SAMPLE_SIZE`
    evenly spaced ones walked (each a whole subgraph) and scaled to ``n``: O(sample) ids
    held, not O(n). As in :func:`estimate_entries`, one sampled element larger than the
    others together counts once."""
    step = n / DEFAULT_SAMPLE_SIZE
    if isinstance(elements, (list, tuple)):  # by index: O(sample)
        sample = [elements[int(j * step)] for j in range(DEFAULT_SAMPLE_SIZE)]
    else:  # a dict's items, a set: one pass, the sample kept
        picks = {int(j * step) for j in range(DEFAULT_SAMPLE_SIZE)}
        sample = [element for i, element in enumerate(elements) if i in picks]
    sizes = [_deep_size_all([element], seen) for element in sample]
    if not sizes:
        return 0
    total, largest = sum(sizes), max(sizes)
    rest = total - largest
    if largest > rest:
        return int(largest + rest * (n - 1) / max(1, len(sizes) - 1))
    return int(total * n / len(sizes))


def estimate_size(obj: Any) -> int:
    """Deep size of ``obj`` in bytes: :func:`allocated_size` of ``sys.getsizeof`` summed over
    everything it references.

    Walks tuples, lists, sets, frozensets, deques, dicts (keys and values), and instances through
    their ``__dict__`` and ``__slots__``; classes, modules and functions count their own size
    only. Shared objects count once; ``None``, ``True``, ``False``, small ints (-5..256) and
    ``""`` count 0. A container of more than :data:`CONTAINER_SAMPLE_FROM` elements has
    :data:`DEFAULT_SAMPLE_SIZE` of them walked and the rest scaled. Deterministic; costs
    O(objects reachable), at most a sample's worth per large container.

    >>> estimate_size(None), estimate_size(7)
    (0, 0)
    >>> big = 10**6
    >>> size = lambda o: allocated_size(sys.getsizeof(o))
    >>> estimate_size([big, big]) == size([big, big]) + size(big)
    True
    """
    return _deep_size_all([obj], set())


class EntriesEstimate(NamedTuple):
    """What :func:`estimate_entries` found: the estimated bytes of all entries, and the
    largest entry it measured (its bytes and position; ``-1`` for an empty table)."""

    total: int
    largest: int
    largest_index: int


def estimate_entries(
    keys: Sequence[Any], values: Sequence[Any], sample_size: int = DEFAULT_SAMPLE_SIZE
) -> EntriesEstimate:
    """Deep size of the entries ``(keys[i], values[i])`` of a dense table, without the lists.

    With at most ``sample_size`` entries every entry is measured; otherwise ``sample_size``
    evenly spaced entries are, and their mean is scaled to ``len(keys)`` entries (objects
    shared by sampled entries counted once), so the cost is O(sample), not O(entries). One
    sampled entry larger than all the others together is an outlier, not a sample of many
    like it: it is counted once and only the rest is scaled (a single 200 MB value among
    small ones would otherwise count ``len / sample_size`` times).
    """
    n = len(keys)
    if n == 0:
        return EntriesEstimate(0, 0, -1)
    picks = range(n) if n <= sample_size else [(j * n) // sample_size for j in range(sample_size)]
    seen: set[int] = set()
    total = largest = 0
    largest_at = -1
    for i in picks:
        size = _deep_size_all([keys[i], values[i]], seen)
        total += size
        if size > largest:
            largest, largest_at = size, i
    if n <= sample_size:
        return EntriesEstimate(total, largest, largest_at)
    rest = total - largest
    if largest > rest:
        scaled = largest + rest * (n - 1) / (sample_size - 1)
    else:
        scaled = total * n / sample_size
    return EntriesEstimate(int(scaled), largest, largest_at)


def estimate_entries_size(
    keys: Sequence[Any], values: Sequence[Any], sample_size: int = DEFAULT_SAMPLE_SIZE
) -> int:
    """:func:`estimate_entries`' total: the estimated bytes of a dense table's entries."""
    return estimate_entries(keys, values, sample_size).total

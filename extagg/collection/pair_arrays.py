"""Typed ``(key, combiner)`` pairs held as arrays: a typed table's groups handed on, or a
shuffle batch, without a Python object per pair.

:class:`PairArrays` is what the typed path (:mod:`extagg.generic.typed_map`) hands on when the
consumer can take arrays — the PySpark shuffle writer of :func:`extagg.spark.install`
(:mod:`extagg.spark.shuffle`), which partitions it by key and pickles each partition's part
as such a block, and the reduce side, which folds the block into its own typed table
(:meth:`extagg.generic.external_map.ExternalAppendOnlyMap.insert_batch`) without decoding it.
Anything else iterates it and gets the same ``(key, combiner)`` pairs, in the same order, as
Python objects: a block read by PySpark's own deserializer (``BatchedSerializer`` flattens
whatever iterable each pickled batch is) is still the list of records it stands for.

Keys are all exact ``int`` (``int64``) or all exact ``str`` (UTF-8 in one byte arena with
offsets); combiners all ``float`` or all ``int`` (``int64``), or ``(sum, count)`` pairs. Only
NumPy is needed to build, pickle, unpickle and iterate one (no numba: a worker that only reads
a shuffle does not compile anything for it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import Any

import numpy as np

__all__ = ["PairArrays", "decode_keys"]

_EMPTY_I64 = np.empty(0, dtype=np.int64)
_EMPTY_U8 = np.empty(0, dtype=np.uint8)


def decode_keys(
    int_keys: np.ndarray | None, offsets: np.ndarray, arena: np.ndarray, ascii_keys: bool
) -> list[Any]:
    """Python keys: ``int_keys`` (``int64``) as ints, else the ``str`` keys of the arena
    (``offsets`` has one more entry than there are keys; lone surrogates kept)."""
    if int_keys is not None:
        ints: list[Any] = int_keys.view(np.int64).tolist()
        return ints
    bounds = offsets.tolist()
    raw = arena[bounds[0] : bounds[-1]].tobytes()
    base = bounds[0]
    if ascii_keys:
        text = raw.decode("ascii")
        return [text[a - base : b - base] for a, b in pairwise(bounds)]
    return [raw[a - base : b - base].decode("utf-8", "surrogatepass") for a, b in pairwise(bounds)]


class PairArrays:
    """``n`` pairs of typed keys and combiners (see the module docstring).

    ``int_keys``: the ``int64`` keys, or ``None`` for ``str`` keys held as ``offsets``
    (``n + 1`` byte offsets into ``arena``, not necessarily starting at 0) and ``arena``
    (UTF-8); ``ascii_keys`` says every ``str`` key is ASCII. ``states``: the combiners
    (``float64`` or ``int64``), or the sums of ``(sum, count)`` combiners whose counts are
    ``counts`` (``int64``).
    """

    __slots__ = ("int_keys", "offsets", "arena", "ascii_keys", "states", "counts")

    def __init__(
        self,
        int_keys: np.ndarray | None,
        offsets: np.ndarray | None,
        arena: np.ndarray | None,
        ascii_keys: bool,
        states: np.ndarray,
        counts: np.ndarray | None = None,
    ) -> None:
        n = len(states)
        if states.dtype != np.float64 and states.dtype != np.int64:
            raise TypeError(f"PairArrays: states must be float64 or int64, not {states.dtype}")
        if int_keys is not None:
            if int_keys.dtype != np.int64 or len(int_keys) != n:
                raise ValueError("PairArrays: int keys must be int64, one per state")
            offsets, arena = _EMPTY_I64, _EMPTY_U8
        elif offsets is None or arena is None or len(offsets) != n + 1:
            raise ValueError("PairArrays: str keys need n + 1 offsets and an arena")
        if counts is not None and (counts.dtype != np.int64 or len(counts) != n):
            raise ValueError("PairArrays: counts must be int64, one per state")
        self.int_keys = int_keys
        self.offsets = offsets
        self.arena = arena
        self.ascii_keys = bool(ascii_keys)
        self.states = states
        self.counts = counts

    def __len__(self) -> int:
        return len(self.states)

    def __repr__(self) -> str:
        kind = "str" if self.int_keys is None else "int"
        return f"PairArrays({len(self)} pairs, {kind} keys, {self.states.dtype} states)"

    def __reduce__(self) -> tuple[Any, ...]:
        # NumPy arrays pickle as their raw bytes (protocol 5: one copy into the pickle)
        if self.int_keys is None:
            first = int(self.offsets[0]) if len(self.offsets) else 0
            offsets = self.offsets - first
            arena = self.arena[first : first + int(offsets[-1])] if len(offsets) else _EMPTY_U8
            keys: tuple[Any, ...] = (None, offsets, arena)
        else:
            keys = (self.int_keys, None, None)
        return (PairArrays, (*keys, self.ascii_keys, self.states, self.counts))

    @property
    def key_is_str(self) -> bool:
        """Whether the keys are ``str`` (else ``int``)."""
        return self.int_keys is None

    def key_objects(self) -> list[Any]:
        """The keys as Python objects."""
        return decode_keys(self.int_keys, self.offsets, self.arena, self.ascii_keys)

    def value_objects(self) -> list[Any]:
        """The combiners as Python objects (numbers, or ``(sum, count)`` tuples)."""
        values: list[Any] = self.states.tolist()
        if self.counts is not None:
            values = list(zip(values, self.counts.tolist(), strict=True))
        return values

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return zip(self.key_objects(), self.value_objects(), strict=True)

    def slice(self, start: int, stop: int) -> PairArrays:
        """Pairs ``start:stop`` (views of these arrays)."""
        counts = None if self.counts is None else self.counts[start:stop]
        if self.int_keys is not None:
            keys = self.int_keys[start:stop]
            return PairArrays(keys, None, None, True, self.states[start:stop], counts)
        offsets = self.offsets[start : stop + 1]
        return PairArrays(
            None, offsets, self.arena, self.ascii_keys, self.states[start:stop], counts
        )

    def take(self, index: np.ndarray) -> PairArrays:
        """The pairs at ``index`` (an ``int64`` array), in that order, copied."""
        counts = None if self.counts is None else self.counts[index]
        if self.int_keys is not None:
            return PairArrays(self.int_keys[index], None, None, True, self.states[index], counts)
        offsets, arena = _gather_var(self.offsets, self.arena, index)
        return PairArrays(None, offsets, arena, self.ascii_keys, self.states[index], counts)

    @staticmethod
    def concat(parts: Sequence[PairArrays]) -> PairArrays:
        """One block of ``parts``' pairs, in order (they must be of one kind)."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        states = np.concatenate([p.states for p in parts])
        counts = None
        if first.counts is not None:
            counts = np.concatenate([_counts_of(p) for p in parts])
        if first.int_keys is not None:
            keys = np.concatenate([_int_keys_of(p) for p in parts])
            return PairArrays(keys, None, None, True, states, counts)
        arenas, lengths = [], []
        for p in parts:
            if p.int_keys is not None:
                raise TypeError("PairArrays.concat: int and str keys mixed")
            start, stop = int(p.offsets[0]), int(p.offsets[-1])
            arenas.append(p.arena[start:stop])
            lengths.append(np.diff(p.offsets))
        offsets = np.zeros(len(states) + 1, dtype=np.int64)
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
        arena = np.concatenate(arenas) if arenas else _EMPTY_U8
        ascii_keys = all(p.ascii_keys for p in parts)
        return PairArrays(None, offsets, arena, ascii_keys, states, counts)


def _int_keys_of(part: PairArrays) -> np.ndarray:
    if part.int_keys is None:
        raise TypeError("PairArrays.concat: int and str keys mixed")
    return part.int_keys


def _counts_of(part: PairArrays) -> np.ndarray:
    if part.counts is None:
        raise TypeError("PairArrays.concat: (sum, count) and plain combiners mixed")
    return part.counts


def _gather_var(
    offsets: np.ndarray, arena: np.ndarray, index: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets from 0, arena)`` of the variable-length values at ``index``, in that order."""
    starts = offsets[index]
    lengths = offsets[index + 1] - starts
    new_offsets = np.zeros(len(index) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    total = int(new_offsets[-1])
    if total == 0:
        return new_offsets, _EMPTY_U8
    # byte j of value i comes from arena[starts[i] + j]: a running index shifted per value
    shift = np.repeat(starts - new_offsets[:-1], lengths)
    return new_offsets, arena[np.arange(total, dtype=np.int64) + shift]

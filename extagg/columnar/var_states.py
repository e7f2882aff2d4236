"""The byte arena of variable-length aggregate states (min/max/first/last of strings, binaries).

A group's value is ``ref``/``len`` in the table's payload pointing into one arena per table.
The arena only grows by appending (a value no longer than the one it replaces is written over
it), is emptied when the table is spilled and is asked of the memory manager, exactly, before it
grows (:func:`extagg.columnar.growth.make_room_for_var_states`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["MIN_VAR_ARENA", "VarArena", "chunk_stop"]

#: bytes of a new arena
MIN_VAR_ARENA = 4096


class VarArena:
    """``data[:used]`` holds the values; ``reserved`` is what the chunk being folded may add."""

    __slots__ = ("data", "used", "reserved")

    def __init__(self, capacity: int = MIN_VAR_ARENA) -> None:
        self.data = np.empty(capacity, dtype=np.uint8)
        self.used = 0
        self.reserved = 0

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def room(self) -> int:
        return self.data.shape[0] - self.used

    def capacity_for(self, need: int) -> int:
        """The capacity (a power of two) that leaves room for ``need`` more bytes."""
        want = self.used + need
        cap = max(MIN_VAR_ARENA, self.data.shape[0])
        while cap < want:
            cap *= 2
        return cap

    def grow(self, capacity: int) -> None:
        if self.used == 0:
            self.data = np.empty(0, dtype=np.uint8)  # drop the old array before allocating
        new = np.empty(capacity, dtype=np.uint8)
        new[: self.used] = self.data[: self.used]
        self.data = new

    def clear(self, shrink: bool = False) -> None:
        """Forget every value (the table was spilled); ``shrink``: keep only the capacity the
        chunk being folded was promised (``reserved``)."""
        self.used = 0
        if shrink:
            capacity = self.capacity_for(self.reserved)
            if capacity < self.data.shape[0]:
                self.data = np.empty(capacity, dtype=np.uint8)


def chunk_stop(offsets: Sequence[np.ndarray], start: int, stop: int, limit: int) -> int:
    """The end of the longest chunk ``start..end`` (``end <= stop``, at least one row) whose
    values, summed over the columns of ``offsets``, take at most ``limit`` bytes."""
    total = np.zeros(stop - start + 1, dtype=np.int64)
    for off in offsets:
        total += off[start : stop + 1] - off[start]
    fits = int(np.searchsorted(total, limit, side="right")) - 1
    return start + max(1, fits)

"""The in-memory part of an ExternalAppendOnlyMap while it is being iterated.

Both kinds can move their unread rows to disk when another consumer forces a spill, and drop
their references so the memory is really freed (Spark's SPARK-22713).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from extagg.hashing import order_hashes
from extagg.memory import Consumer
from extagg.merge.heap import RunSource, SortedBlockSource
from extagg.spill.blocks import ObjectBlock, PermutedObjectBlock

__all__ = ["MoveToRun", "SpillableMemorySource", "Trigger", "UnsortedMemoryRows"]

#: who asked for a spill: another consumer, a description, or None (the merge itself)
Trigger = Consumer | str | None
#: ``(unread rows sorted by hash, trigger) -> a source over the run they were written to``
MoveToRun = Callable[[PermutedObjectBlock | ObjectBlock, Trigger], RunSource[ObjectBlock]]


class UnsortedMemoryRows:
    """The in-memory map during an unordered iteration with no runs: insertion order.

    A forced spill sorts the unread rows by hash and moves them to a run; the iteration then
    continues from the run, so each key is still yielded exactly once.
    """

    CHUNK = 65_536

    def __init__(
        self,
        keys: list[Any],
        values: list[Any],
        *,
        lock: threading.RLock,
        move_to_run: MoveToRun,
        release: Callable[[], None],
    ) -> None:
        self.lock = lock  # the map's: a forced spill from another thread must not see a torn read
        self.move_to_run = move_to_run
        self.release = release  # gives back the memory held for the rows
        self.keys: list[Any] | None = keys
        self.values: list[Any] | None = values
        self.pos = 0
        self.run: RunSource[ObjectBlock] | None = None

    def next_chunk(self) -> tuple[list[Any], list[Any]] | None:
        """The next ``(keys, values)`` to hand out, or ``None`` at the end."""
        with self.lock:
            return self._next_chunk()

    def _next_chunk(self) -> tuple[list[Any], list[Any]] | None:
        if self.run is not None:
            if self.run.next_min_hash() is None:
                return None
            block = self.run.read_next()
            return block.keys, block.values
        if self.keys is None or self.values is None:
            return None
        if self.pos >= len(self.keys):
            self.keys = self.values = None  # fully read: let the memory go
            self.release()
            return None
        start, self.pos = self.pos, min(self.pos + self.CHUNK, len(self.keys))
        return self.keys[start : self.pos], self.values[start : self.pos]

    def spill_rest(self, trigger: Trigger = None) -> bool:
        """Sort the unread rows by key hash, write them as a run, drop the lists."""
        with self.lock:
            return self._spill_rest(trigger)

    def _spill_rest(self, trigger: Trigger) -> bool:
        if self.run is not None or self.keys is None or self.values is None:
            return False
        if self.pos >= len(self.keys):
            # everything was handed out (as copies): the lists are dead weight, free them now
            self.keys = self.values = None
            return True
        hashes = order_hashes(self.keys[self.pos :])
        order = np.argsort(hashes, kind="stable")
        block = PermutedObjectBlock(hashes[order], order + self.pos, self.keys, self.values)
        del hashes, order
        # on a failed write (disk full) the rows stay here and the iteration goes on from memory
        self.run = self.move_to_run(block, trigger)
        self.keys = self.values = None  # the block, and with it the lists, dies on return
        return True

    def close(self) -> None:
        with self.lock:
            self.keys = self.values = None
            if self.run is not None:
                self.run.close()


class SpillableMemorySource(SortedBlockSource[ObjectBlock]):
    """The sorted in-memory map during iteration; can move its unread rows to disk.

    Reads and the move to disk hold the map's lock: a forced spill from another thread must
    never write rows the merge has already taken (they would be yielded twice).
    """

    def __init__(
        self,
        block: ObjectBlock | PermutedObjectBlock,
        batch_size: int,
        *,
        lock: threading.RLock,
        move_to_run: MoveToRun,
        release: Callable[[], None],
    ) -> None:
        super().__init__(block, batch_size)
        self.lock = lock
        self.move_to_run = move_to_run
        self.release = release
        self.run: RunSource[ObjectBlock] | None = None

    def next_min_hash(self) -> int | None:
        with self.lock:
            if self.run is not None:
                return self.run.next_min_hash()
            h = super().next_min_hash()
            if h is None and self.block is not None:
                self.block = None  # fully read: let the memory go
                self.release()
            return h

    def read_next(self) -> ObjectBlock:
        with self.lock:
            if self.run is not None:
                return self.run.read_next()
            return super().read_next()

    def spill_rest(self, trigger: Trigger = None) -> bool:
        """Write the unread rows to a run and read from there; drop the in-memory block."""
        with self.lock:
            if self.run is not None:
                return False
            rest = self.remaining()
            if rest is None:
                return False
            assert isinstance(rest, (ObjectBlock, PermutedObjectBlock))
            self.run = self.move_to_run(rest, trigger)
            self.block = None
            return True

    def close(self) -> None:
        with self.lock:
            super().close()
            if self.run is not None:
                self.run.close()

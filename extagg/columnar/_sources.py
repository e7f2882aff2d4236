"""The in-memory table as a merge source that can move its unread groups to disk."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from extagg.collection.typed_table import TypedHashTable
from extagg.columnar.runs import write_table_run
from extagg.merge.heap import BlockSource, RunSource

if TYPE_CHECKING:
    from extagg.columnar.hash_aggregator import HashAggregator

__all__ = ["TableSource"]

log = logging.getLogger(__name__)


class TableSource(BlockSource):
    """The owner's final table, sorted by hash, handed out a batch at a time.

    Holds the table's memory (``nbytes``) until every group has been read or until
    :meth:`spill_rest` writes the unread groups to a run (when another consumer needs memory),
    then gives it back to the owner's memory manager.
    """

    def __init__(self, owner: HashAggregator, table: TypedHashTable) -> None:
        self.owner = owner
        self.table: TypedHashTable | None = table
        self.nbytes = table.nbytes
        hashes, gids = table.sort_by_hash()
        self.hashes: np.ndarray | None = hashes
        self.gids: np.ndarray | None = gids
        self.pos = 0
        self.run: RunSource | None = None

    def next_min_hash(self) -> int | None:
        with self.owner._lock:
            if self.run is not None:
                return self.run.next_min_hash()
            if self.hashes is None or self.pos >= len(self.hashes):
                self._release()
                return None
            return int(self.hashes[self.pos])

    def read_next(self) -> Any:
        with self.owner._lock:
            if self.run is not None:
                return self.run.read_next()
            assert self.table is not None and self.hashes is not None and self.gids is not None
            layout = self.owner._layout
            assert layout is not None
            stop, block = next(
                layout.iter_sorted(
                    self.table, self.hashes, self.gids, self.pos, self.owner.run_rows,
                    self.owner.batch_var_bytes,
                )
            )  # fmt: skip
            self.pos = stop
            return block

    def spill_rest(self) -> bool:
        """Write the unread groups to a run, read from there on, free the table's memory."""
        with self.owner._lock:  # never while another thread is reading a batch
            return self._spill_rest()

    def _spill_rest(self) -> bool:
        if self.run is not None or self.table is None or self.hashes is None:
            return False
        assert self.gids is not None
        if self.pos >= len(self.hashes):
            self._release()
            return False
        owner = self.owner
        owner.metrics.spill_count += 1
        log.info(
            "%s force spilling the unread %d groups of its in-memory table to disk",
            owner.name,
            len(self.hashes) - self.pos,
        )
        started = time.perf_counter()
        try:
            path = write_table_run(owner, self.table, self.hashes, self.gids, self.pos)
        finally:
            owner.metrics.spill_time_s += time.perf_counter() - started
        owner.metrics.memory_bytes_spilled += self.nbytes
        self.run = RunSource(path, owner=owner._spill_dirs)
        self._release()
        return True

    def _release(self) -> None:
        if self.table is None:
            return
        self.table = None
        self.hashes = None
        self.gids = None
        freed, self.nbytes = self.nbytes, 0
        owner = self.owner
        if freed and owner.used:
            owner.free_memory(min(freed, owner.used))

    def close(self) -> None:
        with self.owner._lock:
            self._release()
            if self.run is not None:
                self.run.close()

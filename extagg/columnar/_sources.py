"""The in-memory table as a merge source that can move its unread groups to disk."""

from __future__ import annotations

import logging
import time

import numpy as np

from extagg.collection.typed_table import TypedHashTable
from extagg.columnar.runs import write_table_run
from extagg.columnar.state import TableState
from extagg.merge.heap import BlockSource, RunSource
from extagg.spill.blocks import ColumnBlock

__all__ = ["TableSource"]

log = logging.getLogger(__name__)


class TableSource(BlockSource[ColumnBlock]):
    """The aggregator's final table, sorted by hash, handed out a batch at a time.

    Holds the table's memory (counted in ``st.source_bytes``) until every group has been read
    or until :meth:`spill_rest` writes the unread groups to a run (when another consumer needs
    memory), then gives it back.
    """

    def __init__(self, st: TableState, table: TypedHashTable) -> None:
        self.st = st
        self.table: TypedHashTable | None = table
        self.nbytes = table.nbytes
        st.source_bytes += self.nbytes
        hashes, gids = table.sort_by_hash()
        self.hashes: np.ndarray | None = hashes
        self.gids: np.ndarray | None = gids
        self.pos = 0
        self.run: RunSource[ColumnBlock] | None = None

    def next_min_hash(self) -> int | None:
        with self.st.lock:
            if self.run is not None:
                return self.run.next_min_hash()
            if self.hashes is None or self.pos >= len(self.hashes):
                self._release()
                return None
            return int(self.hashes[self.pos])

    def read_next(self) -> ColumnBlock:
        st = self.st
        with st.lock:
            if self.run is not None:
                block: ColumnBlock = self.run.read_next()
                return block
            assert self.table is not None and self.hashes is not None and self.gids is not None
            stop, block = next(
                st.layout.iter_sorted(
                    self.table, self.hashes, self.gids, self.pos, st.run_rows, st.batch_var_bytes
                )
            )
            self.pos = stop
            return block

    def spill_rest(self) -> bool:
        """Write the unread groups to a run, read from there on, free the table's memory."""
        with self.st.lock:  # never while another thread is reading a batch
            return self._spill_rest()

    def _spill_rest(self) -> bool:
        if self.run is not None or self.table is None or self.hashes is None:
            return False
        assert self.gids is not None
        if self.pos >= len(self.hashes):
            self._release()
            return False
        st = self.st
        st.metrics.spill_count += 1
        log.info(
            "%s force spilling the unread %d groups of its in-memory table to disk",
            st.name,
            len(self.hashes) - self.pos,
        )
        started = time.perf_counter()
        try:
            path = write_table_run(st, self.table, self.hashes, self.gids, self.pos)
        finally:
            st.metrics.spill_time_s += time.perf_counter() - started
        st.metrics.memory_bytes_spilled += self.nbytes
        self.run = st.runs.detach(path)
        self._release()
        return True

    def _release(self) -> None:
        if self.table is None:
            return
        self.table = None
        self.hashes = None
        self.gids = None
        freed, self.nbytes = self.nbytes, 0
        self.st.source_bytes -= freed
        if freed:
            self.st.budget.free(freed)

    def close(self) -> None:
        with self.st.lock:
            self._release()
            if self.run is not None:
                self.run.close()

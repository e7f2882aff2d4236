"""The working state of one :class:`~extagg.columnar.HashAggregator`, handed to its helpers.

Growing the table (:mod:`.growth`), spilling it (:mod:`.runs`), reading it back
(:mod:`._sources`), partitioning the input (:mod:`.partitioning`) and merging (:mod:`.merging`)
all work on a :class:`TableState` — the table and its layout, the memory budget, the run set and
the buffer sizes — never on the aggregator, so none of them imports the class that calls it
(DuckDB's radix-partitioned table passes its state the same way).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from extagg.collection.typed_table import TypedHashTable
from extagg.columnar.layout import BlockLayout
from extagg.columnar.partition_files import NUM_PARTITIONS
from extagg.columnar.var_states import VarArena
from extagg.errors import UsageError
from extagg.metrics import SpillMetrics
from extagg.spill.blocks import ColumnBlock
from extagg.spillable import MemoryBudget, RunSet

__all__ = ["TableState"]


@dataclass(eq=False)
class TableState:
    """What an aggregator's helpers read and change.

    Memory in use (:meth:`in_use`, what :attr:`budget` trims to) is the table's arrays (exact),
    the byte arena of its string states (``var_arena``, exact),
    the sorted table being read (``source_bytes``), the chunk buffers (``scratch``), one I/O
    batch (``io_bytes``) and the partition buffers (``aside_bytes``).
    """

    name: str
    budget: MemoryBudget
    runs: RunSet[ColumnBlock]
    metrics: SpillMetrics
    lock: threading.RLock
    #: partitioning depth: 0 for the aggregator the caller made, 1 for its partitions' ...
    level: int = 0
    #: bits the key hashes are rotated left by before this aggregator sees them (a thread's or
    #: a partition's aggregator: its hashes share their top bits, the next bits should lead)
    rotation: int = 0
    #: bits of that rotation its output undoes (its parent's hashes are rotated by the rest)
    rotate_back: int = 0
    #: the most bytes of read buffers its final merge may hold (None: as many as it can use);
    #: set when its results are read beside other aggregators' (``limit_merge_memory``)
    merge_limit: int | None = None
    #: partitions (by the top 4 bits of the hash) whose rows go to the table: 16 (all) until
    #: the table is split (:func:`~extagg.columnar.partitioning.split_table`), 0 once every
    #: row is set aside; the rows of the others are set aside in partition files
    resident_parts: int = NUM_PARTITIONS
    layout_or_none: BlockLayout | None = None
    table: TypedHashTable | None = None
    #: the table's min/max/first/last string and binary values (None without such aggregates)
    var_arena: VarArena | None = None
    #: rows folded since the last spill (the reduction a full table achieved)
    rows_since_spill: int = 0
    chunk_rows: int = 0
    run_rows: int = 0
    batch_var_bytes: int = 0
    scratch: int = 0
    io_bytes: int = 0
    aside_bytes: int = 0
    source_bytes: int = 0
    #: threads that may gather the sorted table's next result batches beside the reader (a
    #: thread partition's aggregator, once its workers are done folding): ``submit`` of an
    #: executor, and how many batches are gathered at once (the reader's one included)
    read_pool: Callable[..., Future[Any]] | None = None
    read_lanes: int = 1

    @property
    def layout(self) -> BlockLayout:
        """The block layout (known once the first batch gave the column types)."""
        if self.layout_or_none is None:
            raise UsageError(f"{self.name}: no layout before the first batch")
        return self.layout_or_none

    @property
    def buffers(self) -> int:
        """Bytes of the chunk buffers and the I/O batch."""
        return self.scratch + self.io_bytes

    def in_use(self) -> int:
        """Bytes the aggregator really uses now (see the class docstring)."""
        table = 0 if self.table is None else self.table.nbytes
        if self.var_arena is not None:
            table += self.var_arena.nbytes
        return table + self.source_bytes + self.scratch + self.io_bytes + self.aside_bytes

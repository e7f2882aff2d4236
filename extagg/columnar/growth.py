"""Grow the aggregator's table, or spill it: the decision the memory grant makes.

Every growth is asked of the memory manager first, for the exact bytes the table will hold at
its peak (old and new arrays during a copy) plus the chunk and I/O buffers. When doubling is
refused the table is filled further (to 7/8 of its slots) if that much is granted; only then is
it spilled. Each function works on a :class:`~extagg.columnar.HashAggregator`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from extagg._config import format_size
from extagg.collection.typed_table import MAX_CAPACITY, TypedHashTable
from extagg.columnar.partitioned import spill_or_partition
from extagg.columnar.runs import spill_table
from extagg.errors import MemoryLimitError

if TYPE_CHECKING:
    from extagg.columnar.hash_aggregator import HashAggregator

__all__ = ["grow_arena_or_spill", "grow_or_spill", "make_room_for_key_bytes"]


def make_room_for_key_bytes(agg: HashAggregator, var_bytes: int) -> None:
    """Chunk key bytes may be copied once when packed: hold them too for this chunk."""
    assert agg._table is not None
    if not agg._hold(agg._in_use() + var_bytes):
        if agg._table.num_groups:
            spill_table(agg, "no memory for the key bytes of a chunk")
        if not agg._hold(agg._in_use() + var_bytes):
            raise MemoryLimitError(
                f"{agg.name} needs {format_size(var_bytes)} more for the key bytes of a chunk "
                f"({format_size(agg.used)} held, max_memory {format_size(agg._max_memory)})"
            )


def grow_or_spill(agg: HashAggregator, table: TypedHashTable) -> None:
    """The table is full: double it, else fill it further, else spill it."""
    buffers = agg._scratch + agg._io_bytes
    if table.capacity * 2 <= MAX_CAPACITY and agg._hold(
        table.nbytes + table.bytes_after_growth() + buffers
    ):
        table.grow()
        agg._trim()
        return
    target = table.fill_target()
    if target > table.grow_at and agg._hold(table.bytes_after_extension(target) + buffers):
        table.extend_groups(target)  # no memory to double: fill the slots we have further
        agg._trim()
        return
    spill_or_partition(agg, table)


def grow_arena_or_spill(agg: HashAggregator, table: TypedHashTable, needed: int) -> None:
    """A key's bytes do not fit the arena: grow it, else spill, else fail (a key too big)."""
    current = table.nbytes
    grown = table.bytes_after_arena_growth(needed)
    extra = grown - current + table.arena.nbytes  # old and new arena exist while copying
    if agg._hold(current + extra + agg._scratch + agg._io_bytes):
        table.grow_arena(needed)
        agg._trim()
        return
    if table.num_groups:
        spill_table(agg, "memory for key bytes not granted")
        return
    raise MemoryLimitError(
        f"{agg.name} cannot hold a key of {format_size(needed)}: growing the key arena "
        f"needs {format_size(extra)} more than the {format_size(agg.used)} held "
        f"(max_memory {format_size(agg._max_memory)})"
    )

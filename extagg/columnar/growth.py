"""Grow the aggregator's table, or spill it: the decision the memory grant makes.

Every growth is asked of the memory manager first, for the exact bytes the table will hold at
its peak (old and new arrays during a copy) plus the chunk and I/O buffers. When doubling is
refused the table is filled further (to 7/8 of its slots) if that much is granted; only then is
it spilled. Each function works on the aggregator's :class:`~extagg.columnar.state.TableState`.
"""

from __future__ import annotations

from extagg._config import format_size
from extagg.collection.typed_table import MAX_CAPACITY, TypedHashTable
from extagg.columnar.runs import spill_table
from extagg.columnar.state import TableState
from extagg.errors import MemoryLimitError

__all__ = ["grow_arena_or_spill", "try_grow"]


def try_grow(st: TableState, table: TypedHashTable) -> bool:
    """The table is full: double it, else fill it further; False if neither is granted (the
    caller spills it, or partitions)."""
    budget = st.budget
    if table.capacity * 2 <= MAX_CAPACITY and budget.hold(
        table.nbytes + table.bytes_after_growth() + st.buffers
    ):
        table.grow()
        budget.trim()
        return True
    target = table.fill_target()
    if target > table.grow_at and budget.hold(table.bytes_after_extension(target) + st.buffers):
        table.extend_groups(target)  # no memory to double: fill the slots we have further
        budget.trim()
        return True
    return False


def grow_arena_or_spill(st: TableState, table: TypedHashTable, needed: int) -> None:
    """A key's bytes do not fit the arena: grow it, else spill, else fail (a key too big)."""
    current = table.nbytes
    grown = table.bytes_after_arena_growth(needed)
    extra = grown - current + table.arena.nbytes  # old and new arena exist while copying
    if st.budget.hold(current + extra + st.buffers):
        table.grow_arena(needed)
        st.budget.trim()
        return
    if table.num_groups:
        spill_table(st, "memory for key bytes not granted")
        return
    raise MemoryLimitError(
        f"{st.name} cannot hold a key of {format_size(needed)}: growing the key arena "
        f"needs {format_size(extra)} more than the {format_size(st.budget.used)} held "
        f"(max_memory {format_size(st.budget.max_memory)})"
    )

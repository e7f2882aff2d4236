"""Grow the aggregator's table, or spill it: the decision the memory grant makes.

Every growth is asked of the memory manager first, for the exact bytes the table will hold at
its peak (old and new slot arrays during the rehash; group arrays old and new during a copy,
or once where they grow in place) plus the chunk and I/O buffers. When doubling is
refused the table is filled further (to 7/8 of its slots) if that much is granted; only then is
it spilled. Each function works on the aggregator's :class:`~extagg.columnar.state.TableState`.
"""

from __future__ import annotations

from extagg._config import format_size
from extagg.collection.typed_table import LOAD_FACTOR, MAX_CAPACITY, TypedHashTable
from extagg.columnar.runs import spill_table
from extagg.columnar.state import TableState
from extagg.errors import MemoryLimitError

__all__ = ["enlarge_empty", "grow_arena_or_spill", "make_room_for_var_states", "try_grow"]


def try_grow(st: TableState, table: TypedHashTable) -> bool:
    """The table is full: double it, else fill it further; False if neither is granted (the
    caller spills it, or partitions)."""
    budget = st.budget
    if table.capacity * 2 <= MAX_CAPACITY and budget.hold(
        table.bytes_at_growth_peak() + st.buffers
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


#: the share of ``max_memory`` an enlarged table leaves free: for the scratch and the partition
#: buffers of splitting it later (:func:`extagg.columnar.partitioning.split_table`)
ENLARGE_HEADROOM = 5


def enlarge_empty(st: TableState, table: TypedHashTable, groups: int | None = None) -> None:
    """Start the empty table again at the largest capacity the budget grants, up to
    ``max_memory`` (and no larger than ``groups`` groups need, if given).

    After a spill: doubling a table holds the old and the new arrays at once, so a table under
    a limit stops growing at about a third of it; an empty table is allocated new, without a
    copy. A larger table spills less often, and each run then holds more of the input's repeats
    combined. Before a partition is aggregated: its size is known, so the table is not grown
    (rehashed) step by step up to it.
    """
    assert table.num_groups == 0
    budget = st.budget
    others = st.in_use() - table.nbytes
    # a table sized for what it will get (``groups``) will not be split: no headroom
    headroom = 0 if groups is not None else budget.max_memory // ENLARGE_HEADROOM
    capacity = table.capacity
    while capacity * 2 <= MAX_CAPACITY:
        if groups is not None and int(capacity * LOAD_FACTOR) >= groups:
            break
        need = others + table.bytes_at_capacity(capacity * 2)
        if need + headroom > budget.max_memory or not budget.hold(need):
            break
        capacity *= 2
    if capacity > table.capacity:
        table.reallocate(capacity)
    budget.trim()


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


def make_room_for_var_states(st: TableState, need: int) -> None:
    """Before a chunk is folded: room in the string-state arena for ``need`` more bytes (all
    its values, the most its min/max/first/last can append). Grows the arena if granted (old
    and new exist while copying), else spills the table (which empties the arena), else fails
    (a chunk's values larger than the budget)."""
    arena = st.var_arena
    assert arena is not None
    arena.reserved = need
    for attempt in range(2):
        if arena.room >= need:
            return
        # an empty arena is replaced, not copied: the old one is not held beside the new
        old = arena.nbytes if arena.used == 0 else 0
        for capacity in dict.fromkeys((arena.capacity_for(need), arena.used + need)):
            if st.budget.hold(st.in_use() - old + capacity):
                arena.grow(capacity)
                st.budget.trim()
                return
        if attempt == 0 and st.table is not None and st.table.num_groups:
            spill_table(st, "memory for string aggregate states not granted")
        elif attempt == 0 and arena.used:
            arena.clear()
    raise MemoryLimitError(
        f"{st.name} cannot hold the {format_size(need)} of string values of a chunk for its "
        f"min/max/first/last states: growing their arena to {format_size(capacity)} is not "
        f"granted ({format_size(st.budget.used)} held, max_memory "
        f"{format_size(st.budget.max_memory)})"
    )

"""Which task memory manager a consumer uses: its own budget, a shared manager, or the default.

Also where an engine's budget is checked against :data:`ENGINE_MIN_BUDGET`, so a budget it
cannot work with fails when the engine is built, not at the merge after the whole input was read.
"""

from __future__ import annotations

from extagg._config import MiB, format_size, parse_size
from extagg.errors import BudgetError
from extagg.memory.task import TaskMemoryManager, task_memory_manager
from extagg.memory.unified import UnifiedMemoryManager, default_memory_manager

__all__ = ["ENGINE_MIN_BUDGET", "check_engine_budget", "resolve_task_memory_manager"]

ENGINE_MIN_BUDGET = 1 * MiB
"""The smallest budget (bytes) both engines complete a spill and merge with.

Measured on small records with the default batch sizes, not guessed: the columnar aggregator
needs 91 KiB (int keys) to 111 KiB (string keys) just to start (a 64-slot table, chunk buffers
for its minimum of 1,024 rows, one I/O batch) and, with string keys, could not set aside
partition input at 512 KiB; the generic map's merge needs two read buffers of about 38 KiB for
10,000 small records. 1 MiB is the smallest power of two with which every case of
tests/memory/test_budget_checks.py spills and merges.
"""


def check_engine_budget(budget: int, *, name: str = "memory") -> int:
    """``budget``, or :class:`~extagg.errors.BudgetError` if it is below the engines' minimum.

    Parameters
    ----------
    budget
        The budget in bytes.
    name
        What the budget is called in the error message (the option that set it).

    Returns
    -------
    int
        ``budget`` unchanged.

    Raises
    ------
    BudgetError
        ``budget`` is below :data:`ENGINE_MIN_BUDGET`.
    """
    if budget < ENGINE_MIN_BUDGET:
        raise BudgetError(
            f"{name} of {format_size(budget)} ({budget} bytes) is below the engines' working "
            f"minimum of {format_size(ENGINE_MIN_BUDGET)} ({ENGINE_MIN_BUDGET} bytes): an "
            "aggregation with it would fail at its merge after reading the whole input",
            budget=budget,
            minimum=ENGINE_MIN_BUDGET,
        )
    return budget


def resolve_task_memory_manager(
    memory: int | str | None,
    memory_manager: UnifiedMemoryManager | TaskMemoryManager | None,
) -> TaskMemoryManager:
    """The task memory manager a consumer should use.

    Parameters
    ----------
    memory
        A private budget: a new manager of that size (bytes or size string).
    memory_manager
        A ``UnifiedMemoryManager`` (→ this thread's task) or an explicit ``TaskMemoryManager``.
        With neither argument, the process-wide default manager is used. Either way the budget
        must be at least :data:`ENGINE_MIN_BUDGET`.

    Raises
    ------
    ValueError
        Both arguments given, or an invalid size.
    BudgetError
        The budget is below :data:`ENGINE_MIN_BUDGET` (a ``ValueError``).
    """
    if memory is not None and memory_manager is not None:
        raise ValueError("give either memory= or memory_manager=, not both")
    if isinstance(memory_manager, TaskMemoryManager):
        tmm = memory_manager
    elif memory is not None:
        budget = check_engine_budget(parse_size(memory, name="memory"))
        tmm = task_memory_manager(UnifiedMemoryManager(max_memory=budget))
    else:
        tmm = task_memory_manager(memory_manager or default_memory_manager())
    check_engine_budget(tmm.memory_manager.max_memory, name="the memory manager's max_memory")
    return tmm

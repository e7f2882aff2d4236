"""Which task memory manager a consumer uses: its own budget, a shared manager, or the default."""

from __future__ import annotations

from extagg._config import parse_size
from extagg.memory.task import TaskMemoryManager, task_memory_manager
from extagg.memory.unified import UnifiedMemoryManager, default_memory_manager

__all__ = ["resolve_task_memory_manager"]


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
        With neither argument, the process-wide default manager is used.

    Raises
    ------
    ValueError
        Both arguments given, or an invalid size.
    """
    if memory is not None and memory_manager is not None:
        raise ValueError("give either memory= or memory_manager=, not both")
    if isinstance(memory_manager, TaskMemoryManager):
        return memory_manager
    if memory is not None:
        return task_memory_manager(
            UnifiedMemoryManager(max_memory=parse_size(memory, name="memory"))
        )
    return task_memory_manager(memory_manager or default_memory_manager())

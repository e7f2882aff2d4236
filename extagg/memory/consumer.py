"""MemoryConsumer: the base class of everything that holds execution memory.

Subclass it, ask for memory with ``acquire_memory`` before growing, give it back with
``free_memory``, and implement ``spill(size, trigger)`` to write data out when another consumer
of the same task needs memory (return the bytes freed; call ``free_memory`` for them). Call
``close_memory()`` when done (from your ``close()``).

Rules a ``spill`` must keep (Spark's): it runs in the requesting thread while that task's
acquisitions are paused; it may call ``free_memory`` but must not call ``acquire_memory``
(that raises ``RuntimeError``); it should do nothing and return 0 when ``trigger is self``
unless it can spill its own data safely mid-operation.
"""

from __future__ import annotations

import itertools
import logging
import threading

from extagg.memory._util import check_bytes
from extagg.memory.task import Consumer, TaskMemoryManager
from extagg.memory.task import task_memory_manager as _current_task_memory_manager

__all__ = ["MemoryConsumer"]

logger = logging.getLogger(__name__)

_serial = itertools.count(1)


class MemoryConsumer:
    """Holds ``used`` bytes of execution memory granted by a :class:`TaskMemoryManager`.

    ``task_memory_manager`` defaults to the current thread's in the default memory manager;
    ``name`` defaults to the class name and a counter (``"ExternalAppendOnlyMap-3"``).
    """

    def __init__(
        self, task_memory_manager: TaskMemoryManager | None = None, name: str | None = None
    ) -> None:
        if task_memory_manager is None:
            task_memory_manager = _current_task_memory_manager()
        elif not isinstance(task_memory_manager, TaskMemoryManager):
            raise TypeError(
                f"task_memory_manager must be a TaskMemoryManager, not "
                f"{type(task_memory_manager).__name__}"
            )
        self._tmm = task_memory_manager
        self._name = name if name is not None else f"{type(self).__name__}-{next(_serial)}"
        self._used = 0
        self._used_lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    @property
    def used(self) -> int:
        """Bytes of execution memory this consumer holds."""
        return self._used

    @property
    def task_memory_manager(self) -> TaskMemoryManager:
        return self._tmm

    def acquire_memory(self, num_bytes: int) -> int:
        """Ask for ``num_bytes``; returns the bytes granted (0 <= granted <= num_bytes).

        May make other consumers of the task (and, last, this one) spill, and may wait for
        other tasks to release memory (``MemoryLimitError`` after the manager's timeout).
        """
        granted = self._tmm.acquire_execution_memory(num_bytes, self)
        if granted:
            with self._used_lock:
                self._used += granted
        return granted

    def free_memory(self, num_bytes: int) -> None:
        """Give back ``num_bytes`` (clamped to ``used`` with a warning)."""
        num_bytes = check_bytes(num_bytes, "num_bytes")
        with self._used_lock:
            if num_bytes > self._used:
                logger.warning(
                    "%s frees %d bytes but holds only %d; freeing %d",
                    self._name,
                    num_bytes,
                    self._used,
                    self._used,
                )
                num_bytes = self._used
            self._used -= num_bytes
        self._tmm.release_execution_memory(num_bytes, self)

    def spill(self, size: int, trigger: Consumer) -> int:
        """Free memory by writing data out; returns the bytes freed. The base class holds no
        spillable data and returns 0."""
        return 0

    def close_memory(self) -> int:
        """Free everything this consumer holds and unregister it; returns the bytes freed.

        Idempotent; the consumer may acquire again later (it registers again).
        """
        with self._used_lock:
            held, self._used = self._used, 0
        self._tmm.release_execution_memory(held, self)
        self._tmm.unregister(self)
        return held

    def forget_memory(self) -> int:
        """Task clean-up released our memory wholesale: zero ``used``; returns what it was."""
        with self._used_lock:
            held, self._used = self._used, 0
        return held

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self._name!r} used={self._used} task={self._tmm.task_id!r}>"
        )

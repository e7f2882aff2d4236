"""TaskMemoryManager: one task's execution memory and cooperative spilling of its consumers.

A *task* is a thread (its ``threading.get_ident()``) or an explicit id. When the memory
manager grants a consumer less than it asked for, the task manager makes the task's other
consumers spill, then the requester itself (Spark's ``TaskMemoryManager``, SPARK-4452,
SPARK-35486, SPARK-36933):

* the consumers holding memory are sorted by the bytes they hold, the requester keyed 0 so it
  spills last; the keys are taken once per request;
* while the request is short: pick the consumer with the smallest key that still covers the
  shortfall, else the one with the largest key; within equal keys the most recently
  registered; call ``spill(shortfall, requester)`` and re-acquire the shortfall; a consumer
  that freed nothing is dropped from the candidates, one that freed something stays (another
  task may have taken the memory first, so the loop retries).

``spill`` runs outside the memory manager's lock, holding only this task manager's re-entrant
lock. A spill may call ``free_memory`` but must not acquire memory (``UsageError``, a
``RuntimeError``).
"""

from __future__ import annotations

import bisect
import logging
import threading
import weakref
from collections.abc import Hashable
from typing import Protocol

from extagg.errors import UsageError
from extagg.memory._util import check_bytes, describe_bytes
from extagg.memory.unified import UnifiedMemoryManager, default_memory_manager

__all__ = ["Consumer", "TaskMemoryManager", "task_managers", "task_memory_manager"]

logger = logging.getLogger(__name__)


class Consumer(Protocol):
    """What a task manager needs of a consumer (:class:`extagg.memory.MemoryConsumer` is the
    class to subclass; this protocol keeps ``task`` from importing ``consumer``)."""

    @property
    def name(self) -> str: ...

    @property
    def used(self) -> int: ...

    @property
    def task_memory_manager(self) -> TaskMemoryManager: ...

    def spill(self, size: int, trigger: Consumer) -> int:
        """Release about ``size`` bytes (asked for by ``trigger``); returns the bytes freed."""
        ...

    def forget_memory(self) -> int:
        """Task clean-up released its memory wholesale: zero ``used``; returns what it was."""
        ...


class _Registry:
    """The task managers of one memory manager: by task id (those still referenced) and all
    live ones (for reports)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_task: weakref.WeakValueDictionary[Hashable, TaskMemoryManager] = (
            weakref.WeakValueDictionary()
        )
        self.all: weakref.WeakSet[TaskMemoryManager] = weakref.WeakSet()


_registries: weakref.WeakKeyDictionary[UnifiedMemoryManager, _Registry] = (
    weakref.WeakKeyDictionary()
)
_registries_lock = threading.Lock()


def _registry(mm: UnifiedMemoryManager) -> _Registry:
    with _registries_lock:
        registry = _registries.get(mm)
        if registry is None:
            registry = _registries[mm] = _Registry()
        return registry


def task_managers(mm: UnifiedMemoryManager) -> list[TaskMemoryManager]:
    """Every live TaskMemoryManager of ``mm`` (for reports).

    Parameters
    ----------
    mm
        The memory manager whose task managers are listed.

    Returns
    -------
    list[TaskMemoryManager]
        The task managers still alive.
    """
    registry = _registry(mm)
    with registry.lock:
        return list(registry.all)


class _HeldBytes:
    """Bytes granted through one task manager (shared with its finaliser)."""

    __slots__ = ("lock", "value")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value = 0

    def add(self, delta: int) -> None:
        with self.lock:
            self.value = max(0, self.value + delta)


class TaskMemoryManager:
    """Execution memory of one task (by default one thread), shared by its :class:`MemoryConsumer`
    objects.

    When a consumer asks for more than the manager grants, the other consumers of the task are
    asked to spill (the smallest that covers the shortfall, else the largest), then the requester
    itself, as Spark's task memory manager does.

    Parameters
    ----------
    memory_manager
        The manager granting the memory.
    task_id
        The task's identity (default: the current thread's id).
    """

    def __init__(
        self, memory_manager: UnifiedMemoryManager, task_id: Hashable | None = None
    ) -> None:
        if not isinstance(memory_manager, UnifiedMemoryManager):
            raise TypeError(
                f"memory_manager must be a UnifiedMemoryManager, not "
                f"{type(memory_manager).__name__}"
            )
        self._mm = memory_manager
        self._task_id = threading.get_ident() if task_id is None else task_id
        self._acquire_lock = threading.RLock()  # serialises acquisitions and spills
        self._state_lock = threading.Lock()  # guards the consumer registry only
        # registration order; a consumer whose finaliser releases its memory
        # (``releases_when_dropped``) is held weakly, so that dropping it without close()
        # frees it (files, grant) at once, not when the cyclic GC finds it
        self._consumers: dict[int, Consumer | weakref.ref[Consumer]] = {}
        self._spill_depth = 0  # > 0 while this task's lock owner runs a spill()
        self._held = _HeldBytes()
        finaliser = weakref.finalize(
            self, memory_manager.defer_leaked_release, self._task_id, self._held
        )
        finaliser.atexit = False
        registry = _registry(memory_manager)
        with registry.lock:
            registry.all.add(self)

    @property
    def memory_manager(self) -> UnifiedMemoryManager:
        return self._mm

    @property
    def task_id(self) -> Hashable:
        return self._task_id

    @property
    def consumers(self) -> list[Consumer]:
        """The registered consumers (those that acquired memory and are not closed)."""
        with self._state_lock:
            return [c for ref in self._consumers.values() if (c := _live(ref)) is not None]

    @property
    def memory_used(self) -> int:
        """Bytes granted through this task manager and not released."""
        return self._held.value

    def acquire_execution_memory(self, required: int, consumer: Consumer) -> int:
        """Grant up to ``required`` bytes to ``consumer``, spilling consumers if short.

        Returns the bytes granted (0 <= granted <= required); the consumer is registered.
        Exceptions from a ``spill`` propagate after the bytes granted so far are released.
        """
        required = check_bytes(required, "required")
        self._check_owner(consumer)
        if required == 0:
            return 0
        with self._acquire_lock:
            if self._spill_depth:
                raise UsageError(
                    f"{consumer.name} asked for {required} bytes from inside a spill() of task "
                    f"{self._task_id!r}: spill() may free memory but must not acquire it"
                )
            got = self._mm.acquire_execution_memory(required, self._task_id)
            if got < required:
                got = self._spill_until_granted(required, got, consumer)
            self._held.add(got)
            with self._state_lock:
                ref = self._consumers.get(id(consumer))
                if ref is None or _live(ref) is not consumer:
                    self._consumers[id(consumer)] = (
                        weakref.ref(consumer)
                        if getattr(consumer, "releases_when_dropped", False)
                        else consumer
                    )
            return got

    def release_execution_memory(self, size: int, consumer: Consumer) -> None:
        """Return ``size`` bytes of ``consumer`` (never takes the acquire lock)."""
        size = check_bytes(size, "size")
        self._check_owner(consumer)
        if size:
            self._mm.release_execution_memory(size, self._task_id)
            self._held.add(-size)

    def clean_up_all_allocated_memory(self) -> int:
        """End of task: forget every consumer, release all the task's execution memory.

        Returns the bytes released; more than 0 means a consumer leaked memory (logged).
        Covers everything ``task_id`` holds, also through other task managers of the same id.
        """
        same_task = [t for t in task_managers(self._mm) if t.task_id == self._task_id]
        consumers: list[Consumer] = []
        for tmm in {id(t): t for t in [self, *same_task]}.values():
            consumers.extend(tmm.consumers)
            with tmm._state_lock:
                tmm._consumers.clear()
            with tmm._held.lock:
                tmm._held.value = 0
        leaks = [(c.name, leaked) for c in consumers if (leaked := c.forget_memory())]
        released = self._mm.release_all_execution_memory_for_task(self._task_id)
        if released or leaks:
            logger.warning(
                "task %r: released %s of execution memory at clean-up; leaked by: %s",
                self._task_id,
                describe_bytes(released),
                ", ".join(f"{name} ({size} bytes)" for name, size in leaks) or "no consumer",
            )
        return released

    # ------------------------------------------------------------------ internals
    def _spill_until_granted(self, required: int, got: int, requester: Consumer) -> int:
        """Spark's spill loop; returns the new ``got``. Caller holds the acquire lock.

        If a spill (or a re-acquire) raises, everything granted to this request is released.
        """
        groups: dict[int, list[Consumer]] = {}
        for candidate in self.consumers:
            used = candidate.used
            if used > 0:
                groups.setdefault(0 if candidate is requester else used, []).append(candidate)
        keys = sorted(groups)
        try:
            while got < required and keys:
                shortfall = required - got
                index = bisect.bisect_left(keys, shortfall)
                key = keys[index] if index < len(keys) else keys[-1]
                group = groups[key]
                victim = group[-1]
                if self._spill(victim, shortfall, requester) > 0:
                    got += self._mm.acquire_execution_memory(shortfall, self._task_id)
                else:
                    group.pop()
                    if not group:
                        del groups[key]
                        keys.remove(key)
        except BaseException:
            if got:
                self._mm.release_execution_memory(got, self._task_id)
            raise
        return got

    def _spill(self, victim: Consumer, size: int, trigger: Consumer) -> int:
        """Call ``victim.spill``; returns the bytes its ``used`` actually dropped."""
        before = victim.used
        logger.debug(
            "task %r: spilling %s (holds %s) to free %s for %s",
            self._task_id,
            victim.name,
            describe_bytes(before),
            describe_bytes(size),
            trigger.name,
        )
        self._spill_depth += 1
        try:
            reported = victim.spill(size, trigger)
        except BaseException as exc:
            log = logger.debug if isinstance(exc, KeyboardInterrupt) else logger.error
            log("task %r: error while calling spill() on %s", self._task_id, victim.name)
            if hasattr(exc, "add_note"):
                exc.add_note(f"raised by spill() of {victim.name}, triggered by {trigger.name}")
            raise
        finally:
            self._spill_depth -= 1
        if isinstance(reported, bool) or not isinstance(reported, int) or reported < 0:
            raise TypeError(
                f"{victim.name}.spill() must return the bytes it freed as an int >= 0, "
                f"got {reported!r}"
            )
        freed = max(0, before - victim.used)
        if freed != reported:
            logger.warning(
                "task %r: %s.spill() reported %d bytes freed but its usage dropped by %d",
                self._task_id,
                victim.name,
                reported,
                freed,
            )
        return freed

    def unregister(self, consumer: Consumer) -> None:
        """Forget ``consumer`` (it closed); it registers again when it next acquires."""
        with self._state_lock:
            self._consumers.pop(id(consumer), None)

    def _check_owner(self, consumer: Consumer) -> None:
        if consumer.task_memory_manager is not self:
            raise ValueError(
                f"consumer {consumer.name} belongs to task "
                f"{consumer.task_memory_manager.task_id!r}, not to task {self._task_id!r}"
            )

    def __repr__(self) -> str:
        return (
            f"TaskMemoryManager(task_id={self._task_id!r}, consumers={len(self._consumers)}, "
            f"memory_used={self._held.value})"
        )


def _live(ref: Consumer | weakref.ref[Consumer]) -> Consumer | None:
    return ref() if isinstance(ref, weakref.ref) else ref


def task_memory_manager(
    mm: UnifiedMemoryManager | None = None, task_id: Hashable | None = None
) -> TaskMemoryManager:
    """The TaskMemoryManager of ``task_id`` in ``mm``: the same object for the same pair as long as
    anything (e.g. a consumer) refers to it; an unreferenced one leaves the registry by itself.

    Parameters
    ----------
    mm
        The manager (default: the process-wide one).
    task_id
        The task (default: the current thread).
    """
    if mm is None:
        mm = default_memory_manager()
    elif not isinstance(mm, UnifiedMemoryManager):
        raise TypeError(f"mm must be a UnifiedMemoryManager or None, not {type(mm).__name__}")
    key = threading.get_ident() if task_id is None else task_id
    registry = _registry(mm)
    with registry.lock:
        tmm = registry.by_task.get(key)
    if tmm is not None:
        return tmm
    created = TaskMemoryManager(mm, key)
    with registry.lock:
        tmm = registry.by_task.setdefault(key, created)
    return tmm

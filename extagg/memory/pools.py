"""Execution and storage memory pools (Spark's ``ExecutionMemoryPool`` / ``StorageMemoryPool``).

Pools only do arithmetic and bookkeeping. They own no lock: the :class:`UnifiedMemoryManager`
owns the one lock and calls every method here while holding it, and it alone moves pool size
between the two pools (so the sizes always add up to ``max_memory``).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass

__all__ = ["ExecutionMemoryPool", "HelperTaskId", "MemoryPool", "StorageMemoryPool"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HelperTaskId:
    """The id of a task that works for another, ``owner`` (worker ``index`` of a threaded
    aggregator): the owner and its helpers count as *one* task in the fair share, and the
    helpers split what the owner leaves of it. As tasks of their own they each took 1/(N+1)
    of the pool beside their owner's (which holds little: the chunk being split, the scan's
    batches): two threads at 64 MiB used 22 of 30 MiB of execution memory and spilled twice
    as much as one thread.

    Parameters
    ----------
    owner
        The id of the task it works for.
    index
        Which of the owner's helpers it is (a worker thread's number).
    """

    owner: Hashable
    index: int


class MemoryPool(ABC):
    """A resizable pool: ``pool_size`` bytes of which ``memory_used`` are handed out.

    Parameters
    ----------
    name
        ``"execution"`` or ``"storage"``, for messages.
    pool_size
        Initial size in bytes.
    """

    def __init__(self, name: str, pool_size: int) -> None:
        if pool_size < 0:
            raise ValueError(f"{name} pool size must not be negative, got {pool_size}")
        self.name = name
        self._pool_size = pool_size

    @property
    def pool_size(self) -> int:
        return self._pool_size

    @property
    @abstractmethod
    def memory_used(self) -> int:
        """Bytes handed out from this pool."""

    @property
    def memory_free(self) -> int:
        return self._pool_size - self.memory_used

    def increment_pool_size(self, delta: int) -> None:
        """Grow the pool by ``delta`` bytes (``ValueError`` if negative)."""
        if delta < 0:
            raise ValueError(f"cannot grow the {self.name} pool by a negative size {delta}")
        self._pool_size += delta

    def decrement_pool_size(self, delta: int) -> None:
        """Shrink the pool by ``delta`` bytes (``ValueError`` below zero)."""
        if not 0 <= delta <= self._pool_size:
            raise ValueError(
                f"cannot shrink the {self.name} pool of {self._pool_size} bytes by {delta}"
            )
        if self._pool_size - delta < self.memory_used:
            raise ValueError(
                f"cannot shrink the {self.name} pool to {self._pool_size - delta} bytes: "
                f"{self.memory_used} bytes are in use"
            )
        self._pool_size -= delta


class ExecutionMemoryPool(MemoryPool):
    """Execution memory shared fairly among tasks: each of N active tasks gets 1/2N .. 1/N.

    Parameters
    ----------
    pool_size
        Initial size in bytes.
    notify
        Called whenever a waiting task might now succeed (a task joined or left, or memory was
        released); the manager passes its condition's ``notify_all``.
    """

    def __init__(self, pool_size: int, notify: Callable[[], None]) -> None:
        super().__init__("execution", pool_size)
        self._memory_for_task: dict[Hashable, int] = {}
        self._used = 0
        self._notify = notify
        #: task (with its helpers) -> [the most they held at once, watchers]; only for the
        #: tasks someone watches (see :meth:`watch_peak`)
        self._peaks: dict[Hashable, list[int]] = {}

    @property
    def memory_used(self) -> int:
        return self._used

    def memory_used_by_task(self, task_id: Hashable) -> int:
        """Bytes held by ``task_id`` (0 if none)."""
        return self._memory_for_task.get(task_id, 0)

    def task_memory(self) -> dict[Hashable, int]:
        """A copy of the bytes held by each active task."""
        return dict(self._memory_for_task)

    @property
    def num_active_tasks(self) -> int:
        return len(self._memory_for_task)

    def fair_share(self, task_id: Hashable) -> tuple[int, int]:
        """``(N, 1/(2N) of the pool)`` as the task sees it now (for messages); a task and its
        helpers count once."""
        groups = {_group(t) for t in self._memory_for_task} | {_group(task_id)}
        num_tasks = max(1, len(groups))
        return num_tasks, self._pool_size // (2 * num_tasks)

    def try_acquire(
        self,
        num_bytes: int,
        task_id: Hashable,
        maybe_grow_pool: Callable[[int], None],
        compute_max_pool_size: Callable[[], int],
    ) -> int | None:
        """One round of Spark's fair-share loop: the bytes granted, or ``None`` to wait.

        Grants ``min(num_bytes, 1/N cap - held, free)`` unless that would leave the task under
        1/(2N) of the pool, in which case the caller must wait for another task to release
        memory and call again. A task above its 1/N cap gets 0 at once (SPARK-31720): its
        caller must spill. ``maybe_grow_pool(extra)`` may first reclaim storage memory.
        """
        if num_bytes <= 0:
            raise ValueError(f"invalid number of bytes requested: {num_bytes}")
        if task_id not in self._memory_for_task:
            self._memory_for_task[task_id] = 0
            self._notify()  # waiters recompute N
        current = self._memory_for_task[task_id]
        group = _group(task_id)
        group_used = 0
        groups: set[Hashable] = set()
        helpers = 0
        for other, used in self._memory_for_task.items():
            other_group = _group(other)
            groups.add(other_group)
            if other_group == group:
                group_used += used
                helpers += isinstance(other, HelperTaskId)
        num_tasks = len(groups)  # a task and its helpers count once
        maybe_grow_pool(num_bytes - self.memory_free)
        max_per_task = compute_max_pool_size() // num_tasks
        min_per_task = self._pool_size // (2 * num_tasks)
        room = max_per_task - group_used
        at_part = False
        if isinstance(task_id, HelperTaskId):  # an equal part of what the owner leaves
            owner_used = self._memory_for_task.get(task_id.owner, 0)
            part_room = (max_per_task - owner_used) // helpers - current
            at_part = part_room < min(num_bytes, room)
            room = min(room, part_room)
        max_to_grant = min(num_bytes, max(0, room))
        to_grant = max(0, min(max_to_grant, self.memory_free))
        # under 1/(2N): wait for other tasks to release, unless what stops a helper is its
        # own part (its siblings need not release anything: it must spill instead)
        if to_grant < num_bytes and not at_part and group_used + to_grant < min_per_task:
            return None
        if current + to_grant == 0:
            self.forget_idle_task(task_id)  # a task holding nothing does not count in N
        else:
            self._memory_for_task[task_id] = current + to_grant
            self._used += to_grant
            peak = self._peaks.get(group)
            if peak is not None and group_used + to_grant > peak[0]:
                peak[0] = group_used + to_grant
        return to_grant

    def _group_used(self, group: Hashable) -> int:
        return sum(used for t, used in self._memory_for_task.items() if _group(t) == group)

    def watch_peak(self, task_id: Hashable) -> None:
        """Start recording the most that ``task_id`` and its helpers hold at once (from what
        they hold now); watches nest, each ended by :meth:`unwatch_peak`."""
        group = _group(task_id)
        peak = self._peaks.get(group)
        if peak is None:
            self._peaks[group] = [self._group_used(group), 1]
        else:
            peak[1] += 1

    def peak_used(self, task_id: Hashable) -> int:
        """The most ``task_id`` and its helpers held at once since the first watch (what they
        hold now if unwatched): the true high-water mark, where adding the consumers' own
        peaks counts twice memory one of them released before another took it."""
        peak = self._peaks.get(_group(task_id))
        return self._group_used(_group(task_id)) if peak is None else peak[0]

    def unwatch_peak(self, task_id: Hashable) -> None:
        """End one :meth:`watch_peak` (the record goes with the last)."""
        group = _group(task_id)
        peak = self._peaks.get(group)
        if peak is not None:
            peak[1] -= 1
            if peak[1] <= 0:
                del self._peaks[group]

    def forget_idle_task(self, task_id: Hashable) -> None:
        """Drop a task that holds nothing (it stops counting in N)."""
        if self._memory_for_task.get(task_id, -1) == 0:
            del self._memory_for_task[task_id]
            self._notify()

    def release_memory(self, num_bytes: int, task_id: Hashable) -> int:
        """Release ``num_bytes`` of the task (clamped to what it holds); returns bytes released."""
        current = self._memory_for_task.get(task_id, 0)
        if num_bytes > current:
            logger.warning(
                "Internal error: release called on %d bytes but task %r only has %d bytes "
                "of memory from the %s pool",
                num_bytes,
                task_id,
                current,
                self.name,
            )
            num_bytes = current
        if task_id in self._memory_for_task:
            remaining = current - num_bytes
            self._used -= num_bytes
            if remaining <= 0:
                del self._memory_for_task[task_id]
            else:
                self._memory_for_task[task_id] = remaining
        self._notify()
        return num_bytes

    def release_all_memory_for_task(self, task_id: Hashable) -> int:
        """Release everything ``task_id`` holds; returns the bytes released."""
        held = self._memory_for_task.get(task_id, 0)
        self.release_memory(held, task_id)
        return held


class StorageMemoryPool(MemoryPool):
    """Storage memory for cached blocks; frees space by asking the store to evict blocks.

    The evictor, ``evict(exclude_block_id, space)``, evicts least recently used blocks (never
    ``exclude_block_id``) until at least ``space`` bytes are freed and returns the bytes freed, or
    evicts nothing and returns 0 when that is impossible (Spark's all-or-nothing rule).

    Parameters
    ----------
    pool_size
        Initial size in bytes.
    """

    def __init__(self, pool_size: int) -> None:
        super().__init__("storage", pool_size)
        self._used = 0
        self._evict: Callable[[Hashable | None, int], int] = lambda _block_id, _space: 0

    def set_evictor(self, evict: Callable[[Hashable | None, int], int]) -> None:
        """Install the function that evicts blocks (the manager's ``MemoryStore``)."""
        self._evict = evict

    @property
    def memory_used(self) -> int:
        return self._used

    def acquire_memory(self, block_id: Hashable | None, num_bytes: int) -> bool:
        """Take ``num_bytes`` for ``block_id``, evicting other blocks if needed."""
        to_free = max(0, num_bytes - self.memory_free)
        if to_free > 0:
            self._evict(block_id, to_free)
        enough = num_bytes <= self.memory_free
        if enough:
            self._used += num_bytes
        return enough

    def release_memory(self, num_bytes: int) -> None:
        """Give back ``num_bytes`` (clamped to what is used, with a warning)."""
        if num_bytes > self._used:
            logger.warning(
                "Attempted to release %d bytes of storage memory when we only have %d bytes",
                num_bytes,
                self._used,
            )
            self._used = 0
        else:
            self._used -= num_bytes

    def free_space_to_shrink_pool(self, space: int) -> int:
        """Free up to ``space`` bytes for execution: unused memory first, then evict blocks.

        Returns the bytes now free for the pool to shrink by (evicted blocks may free more
        than asked; the caller decides how much to take).
        """
        from_free = min(space, self.memory_free)
        remaining = space - from_free
        evicted = self._evict(None, remaining) if remaining > 0 else 0
        return from_free + evicted


def _group(task_id: Hashable) -> Hashable:
    """The task a fair share is counted for: a helper's owner, else the task itself."""
    return task_id.owner if isinstance(task_id, HelperTaskId) else task_id

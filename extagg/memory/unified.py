"""UnifiedMemoryManager: execution and storage memory that borrow from each other.

The rules (Spark's ``UnifiedMemoryManager``, SPARK-10983):

* Execution (aggregation buffers) and storage (cached blocks of the :class:`MemoryStore`)
  share ``max_memory``. Storage starts with ``storage_fraction`` of it, the *storage region*;
  execution gets the rest. The two pool sizes always add up to ``max_memory``.
* Execution may take free storage memory, and may evict cached blocks, but only until storage
  is back down to its region. Storage may take free execution memory but never evicts it.
* Among tasks (threads, or explicit ids), each of the N tasks holding execution memory may hold
  at most 1/N of the execution pool and is guaranteed 1/(2N): a request that would leave a task
  under 1/(2N) waits until another task releases memory; a task above 1/N gets 0 at once and
  must spill. A task holding nothing stops counting in N. A wait gives up after
  ``wait_timeout`` seconds (argument, else ``EXTAGG_MEMORY_WAIT_TIMEOUT``, else 120) with a
  :class:`MemoryLimitError` naming the sizes involved.

One lock (with a condition variable for the waits) guards both pools and the store's
bookkeeping. No user code runs under it: eviction callbacks are queued and run after it is
released, and consumers are spilled by the :class:`TaskMemoryManager` outside it.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Hashable
from typing import Any

from extagg._config import format_size, parse_size
from extagg.errors import MemoryLimitError
from extagg.memory._util import check_bytes, describe_bytes, resolve_task_id
from extagg.memory.pools import ExecutionMemoryPool, StorageMemoryPool
from extagg.memory.sizing import cap_to_machine, resolve_memory_budget
from extagg.memory.store import MemoryStore

__all__ = [
    "UnifiedMemoryManager",
    "default_memory_manager",
    "set_default_memory_manager",
    "DEFAULT_WAIT_TIMEOUT",
    "WAIT_TIMEOUT_ENV",
    "resolve_wait_timeout",
]

logger = logging.getLogger(__name__)

#: seconds a task waits for its 1/(2N) share before MemoryLimitError
DEFAULT_WAIT_TIMEOUT = 120.0
"""Seconds a task waits for its 1/(2N) share of execution memory before ``MemoryLimitError``."""
WAIT_TIMEOUT_ENV = "EXTAGG_MEMORY_WAIT_TIMEOUT"
"""Environment variable overriding :data:`DEFAULT_WAIT_TIMEOUT` (seconds)."""


class UnifiedMemoryManager:
    """Decides who may hold memory: an execution pool (per task) and a storage pool (blocks).

    Spark's unified memory manager: execution may borrow free storage memory and evict cached
    blocks down to the storage region; storage may borrow free execution memory but never evicts
    it. Each of N active tasks gets between 1/(2N) and 1/N of execution memory; a task below its
    share waits up to ``wait_timeout``. Thread-safe.

    Parameters
    ----------
    max_memory
        The budget: bytes or a size string (``"256m"`` = 256 MiB).
    storage_fraction
        Share in ``[0, 1)`` of the budget that is the storage region.
    wait_timeout
        Seconds a task waits for its fair share (default ``EXTAGG_MEMORY_WAIT_TIMEOUT`` or 120).

    Raises
    ------
    ValueError
        An invalid size or fraction.

    Notes
    -----
    Every acquire and release is O(1) under one lock (plus evictions, O(blocks evicted)). The
    manager itself holds no data: it only counts bytes.

    Examples
    --------
    >>> mm = UnifiedMemoryManager("64m")
    >>> mm.acquire_execution_memory(1024)
    1024
    >>> mm.release_execution_memory(1024)
    """

    def __init__(
        self,
        max_memory: int | str,
        storage_fraction: float = 0.5,
        wait_timeout: float | None = None,
    ) -> None:
        self._max_memory = cap_to_machine(parse_size(max_memory, name="max_memory"))
        self._storage_fraction = _check_fraction(storage_fraction)
        self._wait_timeout = resolve_wait_timeout(wait_timeout)
        self._storage_region_size = int(self._max_memory * self._storage_fraction)
        self._lock = threading.RLock()
        self._condition = threading.Condition(self._lock)
        self._execution_pool = ExecutionMemoryPool(
            self._max_memory - self._storage_region_size, self._condition.notify_all
        )
        self._storage_pool = StorageMemoryPool(self._storage_region_size)
        self._memory_store = MemoryStore(self)
        self.set_memory_store(self._memory_store)
        # (task_id, bytes) left behind by task managers collected while holding memory
        self._leaked: deque[tuple[Hashable, int]] = deque()

    @classmethod
    def auto(
        cls,
        storage_fraction: float = 0.5,
        wait_timeout: float | None = None,
        **sizing: Any,
    ) -> UnifiedMemoryManager:
        """A manager sized from ``EXTAGG_MEMORY`` or the machine (see :mod:`.sizing`).

        ``sizing`` goes to :func:`~extagg.memory.sizing.resolve_memory_budget` (e.g.
        ``cgroup_root`` for tests).
        """
        return cls(resolve_memory_budget(None, **sizing), storage_fraction, wait_timeout)

    # ------------------------------------------------------------------ execution
    def acquire_execution_memory(self, num_bytes: int, task_id: Hashable | None = None) -> int:
        """Grant up to ``num_bytes`` of execution memory to ``task_id`` (default: this thread).

        May evict cached blocks (down to the storage region), may block while the task is under
        its 1/(2N) share, and may return 0 at once when the task is at its 1/N cap.
        """
        num_bytes = check_bytes(num_bytes, "num_bytes")
        task_id = resolve_task_id(task_id)
        if num_bytes == 0:
            return 0
        try:
            return self._acquire_execution_memory(num_bytes, task_id)
        except BaseException:  # timeout, KeyboardInterrupt in the wait, a failing callback
            with self._lock:
                self._execution_pool.forget_idle_task(task_id)
            raise

    def _acquire_execution_memory(self, num_bytes: int, task_id: Hashable) -> int:
        store = self._memory_store
        deadline: float | None = None
        while True:
            with self._lock:
                self._release_leaked_locked()
                granted = self._execution_pool.try_acquire(
                    num_bytes,
                    task_id,
                    self._maybe_grow_execution_pool,
                    self._compute_max_execution_pool_size,
                )
                if granted is None and not store.has_pending_evictions():
                    now = time.monotonic()
                    if deadline is None:
                        deadline = now + self._wait_timeout
                        n, min_share = self._execution_pool.fair_share(task_id)
                        logger.info(
                            "TID %s waiting for at least 1/2N of execution pool to be free "
                            "(needs %d bytes, holds %d, 1/2N = %d bytes, N = %d)",
                            task_id,
                            num_bytes,
                            self._execution_pool.memory_used_by_task(task_id),
                            min_share,
                            n,
                        )
                    elif now >= deadline:
                        raise self._wait_timeout_error(num_bytes, task_id)
                    self._condition.wait(deadline - now)
            store.run_pending_evictions()
            if granted is not None:
                return granted

    def release_execution_memory(self, num_bytes: int, task_id: Hashable | None = None) -> None:
        """Return ``num_bytes`` of ``task_id``; more than it holds is clamped with a warning."""
        num_bytes = check_bytes(num_bytes, "num_bytes")
        with self._lock:
            self._execution_pool.release_memory(num_bytes, resolve_task_id(task_id))

    def release_all_execution_memory_for_task(self, task_id: Hashable | None = None) -> int:
        """Release everything ``task_id`` holds; returns the bytes released."""
        with self._lock:
            return self._execution_pool.release_all_memory_for_task(resolve_task_id(task_id))

    def task_memory(self, task_id: Hashable | None = None) -> int:
        """Execution bytes held by ``task_id`` (default: this thread)."""
        with self._lock:
            return self._execution_pool.memory_used_by_task(resolve_task_id(task_id))

    def watch_execution_peak(self, task_id: Hashable | None = None) -> None:
        """Record the most execution memory ``task_id`` (default: this thread) and its helper
        tasks hold at once, until :meth:`unwatch_execution_peak`; read it with
        :meth:`execution_peak`."""
        with self._lock:
            self._execution_pool.watch_peak(resolve_task_id(task_id))

    def execution_peak(self, task_id: Hashable | None = None) -> int:
        """See :meth:`watch_execution_peak`."""
        with self._lock:
            return self._execution_pool.peak_used(resolve_task_id(task_id))

    def unwatch_execution_peak(self, task_id: Hashable | None = None) -> None:
        """End one :meth:`watch_execution_peak` of ``task_id``."""
        with self._lock:
            self._execution_pool.unwatch_peak(resolve_task_id(task_id))

    def tasks(self) -> dict[Hashable, int]:
        """Execution bytes held by each active task."""
        with self._lock:
            return self._execution_pool.task_memory()

    # ------------------------------------------------------------------ storage
    def acquire_storage_memory(self, block_id: Hashable, num_bytes: int) -> bool:
        """Account ``num_bytes`` of storage for ``block_id``; may evict other blocks, never
        execution memory. Most callers want ``memory_store.put`` instead."""
        num_bytes = check_bytes(num_bytes, "num_bytes")
        with self._lock:
            acquired = self.acquire_storage_memory_locked(block_id, num_bytes)
        self._memory_store.run_pending_evictions()
        return acquired

    def release_storage_memory(self, num_bytes: int) -> None:
        """Give back ``num_bytes`` of storage memory (clamped to what is held, with a warning)."""
        num_bytes = check_bytes(num_bytes, "num_bytes")
        with self._lock:
            self.release_storage_memory_locked(num_bytes)

    def acquire_storage_memory_locked(self, block_id: Hashable, num_bytes: int) -> bool:
        """:meth:`acquire_storage_memory` for a caller holding :attr:`lock` (the store)."""
        execution, storage = self._execution_pool, self._storage_pool
        max_storage = self._max_memory - execution.memory_used
        if num_bytes > max_storage:
            logger.info(
                "Will not store %r as the required space (%d bytes) exceeds our memory limit "
                "(%d bytes)",
                block_id,
                num_bytes,
                max_storage,
            )
            return False
        if num_bytes > storage.memory_free:  # borrow free execution memory
            borrowed = min(execution.memory_free, num_bytes - storage.memory_free)
            execution.decrement_pool_size(borrowed)
            storage.increment_pool_size(borrowed)
        return storage.acquire_memory(block_id, num_bytes)

    def release_storage_memory_locked(self, num_bytes: int) -> None:
        """:meth:`release_storage_memory` for a caller holding :attr:`lock` (the store)."""
        self._storage_pool.release_memory(num_bytes)
        self._condition.notify_all()  # execution may now grow into it

    # ---------------------------------------------------------- pool arithmetic
    def _maybe_grow_execution_pool(self, extra_needed: int) -> None:
        """Move free (or evictable beyond the region) storage memory into execution."""
        if extra_needed <= 0:
            return
        storage = self._storage_pool
        reclaimable = max(storage.memory_free, storage.pool_size - self._storage_region_size)
        if reclaimable > 0:
            freed = storage.free_space_to_shrink_pool(min(extra_needed, reclaimable))
            # an evicted block may free more than asked: that surplus is free storage memory,
            # which execution may borrow anyway; take what this request needs, leave the rest
            space = min(extra_needed, freed)
            storage.decrement_pool_size(space)
            self._execution_pool.increment_pool_size(space)

    def _compute_max_execution_pool_size(self) -> int:
        return self._max_memory - min(self._storage_pool.memory_used, self._storage_region_size)

    def _wait_timeout_error(self, num_bytes: int, task_id: Hashable) -> MemoryLimitError:
        pool = self._execution_pool
        held = pool.memory_used_by_task(task_id)
        n, min_share = pool.fair_share(task_id)
        pool.forget_idle_task(task_id)
        b = describe_bytes
        return MemoryLimitError(
            f"task {task_id!r} waited {self._wait_timeout:g} s for {b(num_bytes)} of execution "
            f"memory: it holds {b(held)} and is guaranteed 1/(2N) = {b(min_share)} of the "
            f"{b(pool.pool_size)} execution pool shared by N = {n} tasks, but only "
            f"{b(pool.memory_free)} are free and no other task released memory "
            f"(max_memory = {b(self._max_memory)}, storage holds {b(self.storage_memory_used)}); "
            f"raise the memory budget, run fewer tasks at once, or raise wait_timeout / "
            f"{WAIT_TIMEOUT_ENV}"
        )

    # ------------------------------------------------------- leaks of dead tasks
    def defer_leaked_release(self, task_id: Hashable, held: Any) -> None:
        """Finaliser of a collected TaskMemoryManager: queue its unreleased bytes.

        Runs at any point (garbage collection), possibly inside this manager's lock, so it only
        appends to a deque; the next acquire releases the bytes.
        """
        leaked = held.value
        if leaked > 0:
            self._leaked.append((task_id, leaked))

    def _release_leaked_locked(self) -> None:
        while self._leaked:
            task_id, leaked = self._leaked.popleft()
            released = self._execution_pool.release_memory(
                min(leaked, self._execution_pool.memory_used_by_task(task_id)), task_id
            )
            logger.warning(
                "task %r: a TaskMemoryManager was garbage-collected holding %d bytes of "
                "execution memory (a consumer was never closed); released %d bytes",
                task_id,
                leaked,
                released,
            )

    # ------------------------------------------------------------------ introspection
    @property
    def max_memory(self) -> int:
        return self._max_memory

    @property
    def storage_fraction(self) -> float:
        return self._storage_fraction

    @property
    def wait_timeout(self) -> float:
        return self._wait_timeout

    @property
    def storage_region_size(self) -> int:
        return self._storage_region_size

    @property
    def execution_pool_size(self) -> int:
        return self._execution_pool.pool_size

    @property
    def storage_pool_size(self) -> int:
        return self._storage_pool.pool_size

    @property
    def execution_memory_used(self) -> int:
        return self._execution_pool.memory_used

    @property
    def storage_memory_used(self) -> int:
        return self._storage_pool.memory_used

    @property
    def memory_store(self) -> MemoryStore:
        return self._memory_store

    def set_memory_store(self, store: MemoryStore) -> None:
        """Use ``store`` for cached blocks (Spark's ``setMemoryStore``): the storage pool asks
        it to evict blocks when it must make room."""
        self._memory_store = store
        self._storage_pool.set_evictor(store.evict_blocks_to_free_space_locked)

    @property
    def lock(self) -> threading.RLock:
        """The manager's lock; the memory store shares it (``*_locked`` methods need it)."""
        return self._lock

    def pool_snapshot(self) -> dict[str, Any]:
        """Pool sizes and usage, read atomically."""
        with self._lock:
            execution, storage = self._execution_pool, self._storage_pool
            return {
                "max_memory": self._max_memory,
                "storage_region_size": self._storage_region_size,
                "execution": {
                    "pool_size": execution.pool_size,
                    "used": execution.memory_used,
                    "free": execution.memory_free,
                },
                "storage": {
                    "pool_size": storage.pool_size,
                    "used": storage.memory_used,
                    "free": storage.memory_free,
                    "blocks": len(self._memory_store),
                    "block_bytes": self._memory_store.memory_used,
                    "offloaded_blocks": len(self._memory_store.offloaded_block_ids()),
                },
                "tasks": execution.task_memory(),
            }

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` unless the pools are consistent (for tests)."""
        with self._lock:
            execution, storage = self._execution_pool, self._storage_pool
            problems = []
            if execution.pool_size + storage.pool_size != self._max_memory:
                problems.append(
                    f"pool sizes {execution.pool_size} + {storage.pool_size} != max_memory "
                    f"{self._max_memory}"
                )
            for pool in (execution, storage):
                if not 0 <= pool.memory_used <= pool.pool_size:
                    problems.append(
                        f"{pool.name} pool uses {pool.memory_used} of {pool.pool_size} bytes"
                    )
            per_task = execution.task_memory()
            if sum(per_task.values()) != execution.memory_used:
                problems.append(
                    f"tasks hold {sum(per_task.values())} bytes but the execution pool counts "
                    f"{execution.memory_used}"
                )
            if any(held < 0 for held in per_task.values()):
                problems.append(f"negative task memory: {per_task}")
            store = self._memory_store
            if store.memory_used > storage.memory_used:
                problems.append(
                    f"store blocks hold {store.memory_used} bytes but the storage pool counts "
                    f"{storage.memory_used}"
                )
            if problems:
                raise AssertionError("memory manager invariants broken: " + "; ".join(problems))

    def __repr__(self) -> str:
        return (
            f"UnifiedMemoryManager(max_memory={format_size(self._max_memory)}, "
            f"execution={self.execution_memory_used}/{self.execution_pool_size}, "
            f"storage={self.storage_memory_used}/{self.storage_pool_size})"
        )


# ---------------------------------------------------------------- process default
_default_lock = threading.Lock()
_default_manager: UnifiedMemoryManager | None = None


def default_memory_manager() -> UnifiedMemoryManager:
    """The process-wide manager, created on first use with :meth:`UnifiedMemoryManager.auto`."""
    global _default_manager
    with _default_lock:
        if _default_manager is None:
            _default_manager = UnifiedMemoryManager.auto()
            logger.info("default memory manager: %r", _default_manager)
        return _default_manager


def set_default_memory_manager(
    memory_manager: UnifiedMemoryManager | None,
) -> UnifiedMemoryManager | None:
    """Replace the process-wide manager; returns the previous one.

    Parameters
    ----------
    memory_manager
        The new default, or ``None`` to recreate it lazily from ``EXTAGG_MEMORY`` or the machine.
    """
    global _default_manager
    if memory_manager is not None and not isinstance(memory_manager, UnifiedMemoryManager):
        raise TypeError(
            f"expected a UnifiedMemoryManager or None, not {type(memory_manager).__name__}"
        )
    with _default_lock:
        previous, _default_manager = _default_manager, memory_manager
    return previous


# ---------------------------------------------------------------------- helpers
def _check_fraction(storage_fraction: float) -> float:
    if isinstance(storage_fraction, bool) or not isinstance(storage_fraction, (int, float)):
        raise TypeError(
            f"storage_fraction must be a number in [0, 1), not {type(storage_fraction).__name__}"
        )
    if not 0 <= storage_fraction < 1:  # also rejects NaN
        raise ValueError(f"storage_fraction must be in [0, 1), got {storage_fraction!r}")
    return float(storage_fraction)


def resolve_wait_timeout(wait_timeout: float | None) -> float:
    """Explicit argument > ``EXTAGG_MEMORY_WAIT_TIMEOUT`` > 120 s."""
    source = "wait_timeout"
    if wait_timeout is None:
        raw = os.environ.get(WAIT_TIMEOUT_ENV, "").strip()
        if not raw:
            return DEFAULT_WAIT_TIMEOUT
        source = f"environment variable {WAIT_TIMEOUT_ENV}"
        try:
            wait_timeout = float(raw)
        except ValueError:
            raise ValueError(f"{source}={raw!r} is not a number of seconds") from None
    if isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float)):
        raise TypeError(f"wait_timeout must be seconds, not {type(wait_timeout).__name__}")
    if not (wait_timeout > 0 and math.isfinite(wait_timeout)):
        raise ValueError(
            f"{source} must be a positive finite number of seconds, got {wait_timeout!r}"
        )
    return float(wait_timeout)

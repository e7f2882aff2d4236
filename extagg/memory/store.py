"""MemoryStore: cached blocks held in storage memory, evicted least recently used first.

A block is any value with a size in bytes that its owner can afford to lose or offload (the
state store keeps loaded versions here). ``put`` acquires storage memory for it, evicting older
blocks when needed; execution memory requests may evict blocks too, but only down to the
storage region (see :mod:`extagg.memory.unified`).

On eviction the block's ``on_evict(block_id, value)`` callback runs. It may

* return ``None`` (or anything that is not callable): the block is dropped; or
* return a zero-argument callable (a *reloader*), e.g. after writing the value to disk: the block
  stays known to the store (``contains`` is true) and the next ``get`` calls the reloader, puts the
  value back into memory under the same size and callback, and returns it. A reloader is used
  once; if it has a ``close()`` method, the store calls it when the reloader is no longer needed
  (after a successful reload, on ``remove``/``clear``, or when the block was replaced), so the
  owner can delete its disk copy.

Callbacks and reloaders are user code: they always run after the memory manager's lock is
released (in the thread whose request caused the eviction, or in the thread calling ``get``),
never under it. A failing ``on_evict`` is logged and the block dropped (it is a cache; the
owner recomputes); a failing reloader raises from ``get`` and the block stays reloadable.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol

__all__ = ["MemoryStore", "EvictionCallback"]

logger = logging.getLogger(__name__)

#: ``on_evict(block_id, value)``: returns ``None`` to drop the block or a zero-arg reloader
EvictionCallback = Callable[[Hashable, Any], Any]


class _Block:
    """One cached block; ``busy`` is set while its ``on_evict`` or reloader runs unlocked."""

    __slots__ = ("block_id", "busy", "on_evict", "reloader", "size", "value")

    def __init__(
        self, block_id: Hashable, value: Any, size: int, on_evict: EvictionCallback | None
    ) -> None:
        self.block_id = block_id
        self.value = value
        self.size = size
        self.on_evict = on_evict
        self.reloader: Callable[[], Any] | None = None
        self.busy: threading.Event | None = None


class StorageMemory(Protocol):
    """What the store needs of its memory manager (a
    :class:`~extagg.memory.UnifiedMemoryManager`), whose lock it shares."""

    @property
    def lock(self) -> threading.RLock: ...

    def acquire_storage_memory_locked(self, block_id: Hashable, num_bytes: int) -> bool: ...

    def release_storage_memory_locked(self, num_bytes: int) -> None: ...


class MemoryStore:
    """LRU cache of blocks in the storage pool of one :class:`UnifiedMemoryManager`.

    Obtain it as ``memory_manager.memory_store``. It shares the manager's lock, so its
    bookkeeping is atomic with the pool arithmetic. Thread-safe; each operation is O(1) plus the
    blocks it evicts. It holds the cached values themselves, at most the storage memory granted.

    Parameters
    ----------
    memory_manager
        The manager whose storage pool holds the blocks.
    """

    def __init__(self, memory_manager: StorageMemory) -> None:
        self._mm = memory_manager
        self._lock = memory_manager.lock
        self._in_memory: OrderedDict[Hashable, _Block] = OrderedDict()  # least recent first
        self._offloaded: dict[Hashable, _Block] = {}  # evicted, reloadable or being evicted
        self._pending: deque[_Block] = deque()  # evicted blocks whose on_evict has not run
        self._bytes = 0

    # ------------------------------------------------------------------ public API
    def put(
        self,
        block_id: Hashable,
        value: Any,
        size: int,
        on_evict: EvictionCallback | None = None,
    ) -> bool:
        """Cache ``value`` as ``block_id`` taking ``size`` bytes of storage memory.

        Evicts least recently used blocks if needed (never execution memory, never this
        block). Replaces an existing block of the same id. Returns ``False`` (and caches
        nothing) when the storage pool cannot make room.
        """
        size = _check_size(size, block_id)
        if on_evict is not None and not callable(on_evict):
            raise TypeError(f"on_evict of block {block_id!r} must be callable or None")
        with self._lock:
            stale = self._discard_locked(block_id)
            stored = self._insert_locked(_Block(block_id, value, size, on_evict))
        self._after_unlock(stale)
        return stored

    def get(self, block_id: Hashable, default: Any = None) -> Any:
        """The value of ``block_id`` (marking it most recently used), reloading it if it was
        offloaded; ``default`` when the store does not know the block."""
        while True:
            with self._lock:
                block = self._in_memory.get(block_id)
                if block is not None:
                    self._in_memory.move_to_end(block_id)
                    return block.value
                block = self._offloaded.get(block_id)
                if block is None:
                    return default
                busy = block.busy
                if busy is None:  # offloaded and idle: this thread reloads it
                    reloader = block.reloader
                    block.busy = threading.Event()
            if busy is None:
                assert reloader is not None
                return self._reload(block, reloader)
            self.run_pending_evictions()  # its on_evict may be queued in this very thread
            busy.wait()

    def remove(self, block_id: Hashable) -> bool:
        """Forget ``block_id`` (freeing its memory, closing its reloader); ``True`` if known."""
        with self._lock:
            known = block_id in self._in_memory or block_id in self._offloaded
            stale = self._discard_locked(block_id)
        self._after_unlock(stale)
        return known

    def contains(self, block_id: Hashable) -> bool:
        """Whether ``get`` would find the block (in memory or offloaded with a reloader)."""
        with self._lock:
            return block_id in self._in_memory or block_id in self._offloaded

    __contains__ = contains

    def is_in_memory(self, block_id: Hashable) -> bool:
        """Whether ``block_id`` is cached in memory now."""
        with self._lock:
            return block_id in self._in_memory

    def clear(self) -> None:
        """Forget every block (no ``on_evict`` callbacks run; reloaders are closed)."""
        with self._lock:
            stale: list[Any] = []
            for block_id in [*self._in_memory, *self._offloaded]:
                stale.extend(self._discard_locked(block_id))
        self._after_unlock(stale)

    def block_ids(self) -> list[Hashable]:
        """Ids of the blocks in memory, least recently used first."""
        with self._lock:
            return list(self._in_memory)

    def offloaded_block_ids(self) -> list[Hashable]:
        """Ids of blocks evicted from memory that can be reloaded."""
        with self._lock:
            return list(self._offloaded)

    def block_size(self, block_id: Hashable) -> int | None:
        """Accounted size of ``block_id`` in bytes, or ``None`` if unknown."""
        with self._lock:
            block = self._in_memory.get(block_id) or self._offloaded.get(block_id)
            return None if block is None else block.size

    @property
    def memory_used(self) -> int:
        """Bytes of storage memory held by the blocks in memory."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._in_memory)

    def __repr__(self) -> str:
        return (
            f"MemoryStore(blocks={len(self._in_memory)}, offloaded={len(self._offloaded)}, "
            f"memory_used={self._bytes})"
        )

    # ------------------------------------------------------- called by the manager
    def evict_blocks_to_free_space_locked(self, exclude: Hashable | None, space: int) -> int:
        """Evict LRU blocks (never ``exclude``) freeing at least ``space`` bytes, or none.

        Called under the manager's lock by the storage pool; ``on_evict`` callbacks are only
        queued here and run by :meth:`run_pending_evictions` once the lock is released.
        """
        selected: list[_Block] = []
        freed = 0
        for block_id, block in self._in_memory.items():
            if freed >= space:
                break
            if exclude is not None and block_id == exclude:
                continue
            selected.append(block)
            freed += block.size
        if freed < space:
            logger.debug(
                "cannot free %d bytes of storage memory: only %d bytes of blocks are evictable",
                space,
                freed,
            )
            return 0
        for block in selected:
            del self._in_memory[block.block_id]
            self._bytes -= block.size
            self._mm.release_storage_memory_locked(block.size)
            if block.on_evict is not None:
                block.busy = threading.Event()
                self._offloaded[block.block_id] = block
                self._pending.append(block)
            logger.debug("evicted block %r (%d bytes) from memory", block.block_id, block.size)
        return freed

    def has_pending_evictions(self) -> bool:
        """Whether evicted blocks wait for their ``on_evict`` (:meth:`run_pending_evictions`)."""
        return bool(self._pending)

    def run_pending_evictions(self) -> None:
        """Run queued ``on_evict`` callbacks; must be called without the manager's lock."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                block = self._pending.popleft()
                value, block.value = block.value, None
            result = None
            try:
                assert block.on_evict is not None
                result = block.on_evict(block.block_id, value)
            except Exception:
                logger.error(
                    "on_evict callback of block %r failed; the block is dropped",
                    block.block_id,
                    exc_info=True,
                )
            finally:
                stale = self._finish_eviction(block, result if callable(result) else None)
                _close_quietly(stale)

    # ------------------------------------------------------------------ internals
    def _finish_eviction(self, block: _Block, reloader: Callable[[], Any] | None) -> Any:
        """Record the outcome of ``on_evict``; returns a reloader nobody needs any more."""
        with self._lock:
            current = self._offloaded.get(block.block_id) is block
            if current and reloader is not None:
                block.reloader = reloader
                stale = None
            else:
                if current:
                    del self._offloaded[block.block_id]
                stale = reloader  # dropped, or the block was removed/replaced meanwhile
            busy, block.busy = block.busy, None
        if busy is not None:
            busy.set()
        return stale

    def _reload(self, block: _Block, reloader: Callable[[], Any]) -> Any:
        """Call an offloaded block's reloader and put the value back into memory."""
        block_id = block.block_id
        try:
            value = reloader()
        except BaseException:
            with self._lock:
                superseded = self._offloaded.get(block_id) is not block
                busy, block.busy = block.busy, None
            assert busy is not None
            busy.set()
            if superseded:
                _close_quietly(reloader)
            raise
        stale: list[Any] = []
        with self._lock:
            if self._offloaded.get(block_id) is block:
                del self._offloaded[block_id]
                if self._insert_locked(_Block(block_id, value, block.size, block.on_evict)):
                    stale.append(reloader)
                else:  # no room now: serve the value, keep the block reloadable
                    self._offloaded[block_id] = block
                    logger.info(
                        "reloaded block %r (%d bytes) has no room in memory; it stays offloaded",
                        block_id,
                        block.size,
                    )
            else:
                stale.append(reloader)  # removed or replaced while reloading
            busy, block.busy = block.busy, None
        assert busy is not None
        busy.set()
        self._after_unlock(stale)
        return value

    def _insert_locked(self, block: _Block) -> bool:
        if not self._mm.acquire_storage_memory_locked(block.block_id, block.size):
            return False
        self._in_memory[block.block_id] = block
        self._bytes += block.size
        return True

    def _discard_locked(self, block_id: Hashable) -> list[Any]:
        """Drop every trace of ``block_id``; returns reloaders to close after unlocking."""
        stale: list[Any] = []
        block = self._in_memory.pop(block_id, None)
        if block is not None:
            self._bytes -= block.size
            self._mm.release_storage_memory_locked(block.size)
        block = self._offloaded.pop(block_id, None)
        if block is not None and block.busy is None and block.reloader is not None:
            stale.append(block.reloader)  # busy blocks: their unlocked thread closes it
        return stale

    def _after_unlock(self, stale: Iterable[Any]) -> None:
        self.run_pending_evictions()
        for reloader in stale:
            _close_quietly(reloader)


def _check_size(size: int, block_id: Hashable) -> int:
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"size of block {block_id!r} must be an int, not {type(size).__name__}")
    if size < 0:
        raise ValueError(f"size of block {block_id!r} must not be negative, got {size}")
    return size


def _close_quietly(reloader: Any) -> None:
    """Call ``reloader.close()`` if it has one; log (not raise) its failure."""
    close = getattr(reloader, "close", None)
    if close is None or not callable(close):
        return
    try:
        close()
    except Exception:
        logger.warning("closing the reloader %r failed", reloader, exc_info=True)

"""MemoryStore: LRU eviction, drop and reload callbacks, replacement, threads."""

from __future__ import annotations

import logging
import threading

import pytest

from extagg.memory import UnifiedMemoryManager
from tests.memory.helpers import Worker, wait_until


def test_put_get_remove_contains(mm: UnifiedMemoryManager) -> None:
    store = mm.memory_store
    assert store.put("a", [1, 2], 100)
    assert store.get("a") == [1, 2]
    assert "a" in store and store.contains("a") and store.is_in_memory("a")
    assert store.block_size("a") == 100
    assert (store.memory_used, mm.storage_memory_used, len(store)) == (100, 100, 1)
    assert store.get("missing") is None
    assert store.get("missing", default="x") == "x"
    assert store.remove("a") is True
    assert store.remove("a") is False
    assert "a" not in store
    assert (store.memory_used, mm.storage_memory_used) == (0, 0)
    mm.check_invariants()


def test_lru_eviction_order(mm: UnifiedMemoryManager) -> None:
    store = mm.memory_store
    evicted: list[str] = []

    def record(block_id, _value):
        evicted.append(block_id)

    for name in "abc":
        assert store.put(name, name, 300, on_evict=record)
    assert store.get("a") == "a"  # a becomes most recently used
    assert store.block_ids() == ["b", "c", "a"]
    assert store.put("d", "d", 300, on_evict=record)  # needs 200 more: evicts b
    assert evicted == ["b"]
    assert store.block_ids() == ["c", "a", "d"]
    assert store.put("e", "e", 500, on_evict=record)  # needs 400: c and a
    assert evicted == ["b", "c", "a"]
    assert store.block_ids() == ["d", "e"]
    assert store.get("b") is None and "b" not in store  # dropped: no reloader
    mm.check_invariants()


def test_too_big_block_is_refused_without_evicting(mm: UnifiedMemoryManager) -> None:
    store = mm.memory_store
    assert store.put("a", "a", 600)
    assert not store.put("huge", "h", 1001)
    assert store.block_ids() == ["a"]
    mm.acquire_execution_memory(300, "t")
    assert not store.put("big", "b", 701)  # execution holds 300: at most 700 for storage
    assert store.block_ids() == ["a"]
    assert store.put("fits", "f", 400)  # evicts a, never execution
    assert store.block_ids() == ["fits"]
    assert mm.execution_memory_used == 300
    mm.check_invariants()


def test_raw_acquire_never_evicts_the_block_it_is_for(mm: UnifiedMemoryManager) -> None:
    store = mm.memory_store
    store.put("a", "a", 600)
    store.put("b", "b", 400)
    assert mm.acquire_storage_memory("a", 100)  # evicts b (LRU would pick a first)
    assert store.block_ids() == ["a"]
    assert not mm.acquire_storage_memory("a", 500)  # only a could be evicted
    assert store.block_ids() == ["a"]


def test_put_replaces_a_block(mm: UnifiedMemoryManager) -> None:
    store = mm.memory_store
    assert store.put("a", "old", 400)
    assert store.put("a", "new", 700)
    assert store.get("a") == "new"
    assert (store.memory_used, mm.storage_memory_used) == (700, 700)
    mm.check_invariants()


def test_reload_after_eviction(mm: UnifiedMemoryManager) -> None:
    store = mm.memory_store
    disk: dict[str, object] = {}
    calls: list[str] = []

    def offload(block_id, value):
        disk[block_id] = value
        calls.append(f"evict {block_id}")

        def reload():
            calls.append(f"reload {block_id}")
            return disk.pop(block_id)

        return reload

    assert store.put("a", {"k": 1}, 600, on_evict=offload)
    assert store.put("b", {"k": 2}, 400, on_evict=offload)
    assert store.put("c", {"k": 3}, 500, on_evict=offload)  # evicts a (600 covers 500)
    assert calls == ["evict a"]
    assert store.contains("a") and not store.is_in_memory("a")
    assert store.offloaded_block_ids() == ["a"]
    assert store.get("a") == {"k": 1}  # reloaded, re-put: evicts b and c (LRU) for 600
    assert calls == ["evict a", "reload a", "evict b", "evict c"]
    assert store.block_ids() == ["a"]
    assert sorted(store.offloaded_block_ids()) == ["b", "c"]
    assert store.get("a") == {"k": 1}  # now from memory
    assert calls[-1] == "evict c"
    mm.check_invariants()


def test_reloaders_are_closed_when_no_longer_needed(mm: UnifiedMemoryManager) -> None:
    store = mm.memory_store
    closed: list[str] = []

    class DiskCopy:
        def __init__(self, block_id, value):
            self.block_id, self.value = block_id, value

        def __call__(self):
            return self.value

        def close(self):
            closed.append(self.block_id)

    store.put("a", "A", 1000, on_evict=DiskCopy)
    store.put("b", "B", 1000, on_evict=DiskCopy)  # evicts a
    assert closed == []
    assert store.get("a") == "A"  # reload a (evicts b) -> a's copy closed
    assert closed == ["a"]
    assert store.remove("b") is True  # offloaded b forgotten -> closed
    assert closed == ["a", "b"]
    store.put("c", "C", 1000, on_evict=DiskCopy)  # evicts a again
    store.put("a", "A2", 10)  # replacing offloaded a closes its copy
    assert closed == ["a", "b", "a"]
    store.put("d", "D", 990, on_evict=DiskCopy)  # evicts c
    store.clear()
    assert closed == ["a", "b", "a", "c"]
    assert (len(store), store.offloaded_block_ids(), mm.storage_memory_used) == (0, [], 0)


def test_failing_on_evict_drops_the_block(mm: UnifiedMemoryManager, caplog) -> None:
    store = mm.memory_store

    def broken(block_id, value):
        raise OSError("disk gone")

    store.put("a", "A", 1000, on_evict=broken)
    with caplog.at_level(logging.ERROR, logger="extagg.memory"):
        assert store.put("b", "B", 1000)
    assert "on_evict callback of block 'a' failed" in caplog.text
    assert "a" not in store
    mm.check_invariants()


def test_failing_reloader_raises_and_stays_reloadable(mm: UnifiedMemoryManager) -> None:
    store = mm.memory_store
    attempts: list[int] = []

    def flaky():
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("transient")
        return "A"

    store.put("a", "A", 1000, on_evict=lambda _id, _value: flaky)
    store.put("b", "B", 1000)
    with pytest.raises(OSError, match="transient"):
        store.get("a")
    assert store.contains("a")
    assert store.get("a") == "A"
    assert store.block_ids() == ["a"]


def test_reloaded_block_without_room_stays_offloaded(mm: UnifiedMemoryManager) -> None:
    store = mm.memory_store
    store.put("a", "A", 600, on_evict=lambda _id, value: lambda: value)
    # execution needs 100 of the 100 storage holds beyond its region: evicts a
    assert mm.acquire_execution_memory(500, "t") == 500
    assert store.offloaded_block_ids() == ["a"]
    assert store.get("a") == "A"  # served; 600 > the 500 execution leaves to storage
    assert store.offloaded_block_ids() == ["a"] and not store.is_in_memory("a")
    assert mm.storage_memory_used == 0
    mm.release_execution_memory(500, "t")
    assert store.get("a") == "A"  # room again: back in memory
    assert store.block_ids() == ["a"]
    mm.check_invariants()


def test_on_evict_must_be_callable_and_sizes_checked(mm: UnifiedMemoryManager) -> None:
    store = mm.memory_store
    with pytest.raises(TypeError, match="on_evict of block 'a'"):
        store.put("a", 1, 10, on_evict="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size of block 'a'"):
        store.put("a", 1, -1)
    with pytest.raises(TypeError, match="size of block 'a'"):
        store.put("a", 1, 1.5)  # type: ignore[arg-type]
    assert store.put("empty", None, 0)
    assert "empty" in store


def test_get_waits_for_a_running_eviction(mm: UnifiedMemoryManager) -> None:
    """A get during another thread's on_evict waits for it and then reloads."""
    store = mm.memory_store
    entered, release = threading.Event(), threading.Event()

    def slow_offload(block_id, value):
        entered.set()
        assert release.wait(10)
        return lambda: value

    store.put("a", "A", 1000, on_evict=slow_offload)
    evictor = Worker(lambda: store.put("b", "B", 1000))
    evictor.start()
    assert entered.wait(10)
    # the memory is already free for b; a is being offloaded
    wait_until(lambda: store.is_in_memory("b"), "b is stored")
    reader = Worker(lambda: store.get("a"))
    reader.start()
    release.set()
    assert evictor.outcome() is True
    assert reader.outcome() == "A"
    assert store.block_ids() == ["a"]
    mm.check_invariants()


def test_concurrent_gets_reload_once(mm: UnifiedMemoryManager) -> None:
    store = mm.memory_store
    reloads: list[int] = []
    gate = threading.Event()

    def reload():
        reloads.append(1)
        assert gate.wait(10)
        return "A"

    store.put("a", "A", 1000, on_evict=lambda _id, _value: reload)
    store.put("b", "B", 1000)
    readers = [Worker(lambda: store.get("a")) for _ in range(4)]
    for reader in readers:
        reader.start()
    wait_until(lambda: len(reloads) == 1, "one reader reloads")
    gate.set()
    assert [reader.outcome() for reader in readers] == ["A"] * 4
    assert len(reloads) == 1

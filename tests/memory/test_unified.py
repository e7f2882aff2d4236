"""Pool arithmetic of UnifiedMemoryManager on a 1000-byte manager (storage region 500)."""

from __future__ import annotations

import logging

import pytest

from extagg.errors import MemoryLimitError
from extagg.memory import UnifiedMemoryManager


def test_initial_pools_split_by_storage_fraction(mm: UnifiedMemoryManager) -> None:
    assert mm.max_memory == 1000
    assert mm.storage_region_size == 500
    assert (mm.execution_pool_size, mm.storage_pool_size) == (500, 500)
    assert (mm.execution_memory_used, mm.storage_memory_used) == (0, 0)
    mm.check_invariants()


def test_size_strings_and_fractions() -> None:
    mm = UnifiedMemoryManager("1k", storage_fraction=0.25)
    assert (mm.max_memory, mm.storage_region_size, mm.execution_pool_size) == (1024, 256, 768)
    assert UnifiedMemoryManager("2MiB", storage_fraction=0).storage_pool_size == 0


@pytest.mark.parametrize("bad", [0, -1, "0", "-5m", "", "12 parsecs", "1.5x"])
def test_bad_max_memory_names_it(bad: object) -> None:
    with pytest.raises(ValueError, match="max_memory"):
        UnifiedMemoryManager(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [1, 1.0, -0.1, float("nan"), 2])
def test_bad_storage_fraction(bad: float) -> None:
    with pytest.raises(ValueError, match="storage_fraction"):
        UnifiedMemoryManager(1000, storage_fraction=bad)


def test_bad_types() -> None:
    with pytest.raises(TypeError, match="storage_fraction"):
        UnifiedMemoryManager(1000, storage_fraction="half")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_memory"):
        UnifiedMemoryManager([1000])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wait_timeout"):
        UnifiedMemoryManager(1000, wait_timeout=0)
    with pytest.raises(ValueError, match="wait_timeout"):
        UnifiedMemoryManager(1000, wait_timeout=float("inf"))


def test_wait_timeout_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert UnifiedMemoryManager(1000).wait_timeout == 120.0
    monkeypatch.setenv("EXTAGG_MEMORY_WAIT_TIMEOUT", "2.5")
    assert UnifiedMemoryManager(1000).wait_timeout == 2.5
    assert UnifiedMemoryManager(1000, wait_timeout=7).wait_timeout == 7.0  # explicit wins
    monkeypatch.setenv("EXTAGG_MEMORY_WAIT_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="EXTAGG_MEMORY_WAIT_TIMEOUT"):
        UnifiedMemoryManager(1000)
    monkeypatch.setenv("EXTAGG_MEMORY_WAIT_TIMEOUT", "-1")
    with pytest.raises(ValueError, match="EXTAGG_MEMORY_WAIT_TIMEOUT"):
        UnifiedMemoryManager(1000)


def test_byte_counts_are_checked(mm: UnifiedMemoryManager) -> None:
    with pytest.raises(ValueError, match="num_bytes"):
        mm.acquire_execution_memory(-1, "t")
    with pytest.raises(TypeError, match="num_bytes"):
        mm.acquire_execution_memory(1.5, "t")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="num_bytes"):
        mm.acquire_storage_memory("b", True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_bytes"):
        mm.release_execution_memory(-3, "t")
    assert mm.acquire_execution_memory(0, "t") == 0
    assert mm.tasks() == {}


def test_execution_grant_borrows_free_storage(mm: UnifiedMemoryManager) -> None:
    assert mm.acquire_execution_memory(600, "t1") == 600
    assert (mm.execution_pool_size, mm.storage_pool_size) == (600, 400)
    assert mm.acquire_execution_memory(400, "t1") == 400
    assert (mm.execution_pool_size, mm.storage_pool_size) == (1000, 0)
    assert mm.acquire_execution_memory(1, "t1") == 0  # nothing left, alone: 0 at once
    assert mm.task_memory("t1") == 1000
    mm.check_invariants()


def test_storage_borrows_free_execution_memory(mm: UnifiedMemoryManager) -> None:
    assert mm.acquire_storage_memory("b1", 700)
    assert (mm.execution_pool_size, mm.storage_pool_size) == (300, 700)
    assert mm.storage_memory_used == 700
    mm.check_invariants()


def test_storage_never_evicts_execution(mm: UnifiedMemoryManager) -> None:
    assert mm.acquire_execution_memory(800, "t1") == 800
    assert not mm.acquire_storage_memory("big", 300)  # only 200 not used by execution
    assert mm.execution_memory_used == 800
    assert mm.acquire_storage_memory("fits", 200)
    assert (mm.execution_pool_size, mm.storage_pool_size) == (800, 200)
    assert mm.memory_store.put("block", "v", 1) is False  # storage is full, execution stays
    assert mm.execution_memory_used == 800
    mm.check_invariants()


def test_execution_cannot_take_storage_used_within_its_region(mm: UnifiedMemoryManager) -> None:
    assert mm.acquire_storage_memory("raw", 500)  # used storage, not an evictable block
    assert mm.acquire_execution_memory(800, "t1") == 500
    assert (mm.execution_pool_size, mm.storage_pool_size) == (500, 500)
    mm.check_invariants()


def test_execution_evicts_blocks_only_down_to_the_region(mm: UnifiedMemoryManager) -> None:
    store = mm.memory_store
    for name in "abc":
        assert store.put(name, name.upper(), 300)
    assert (mm.execution_pool_size, mm.storage_pool_size) == (100, 900)
    # needs 300 beyond the free 100; 400 of storage lies beyond its region: evict "a" only
    assert mm.acquire_execution_memory(400, "t1") == 400
    assert store.block_ids() == ["b", "c"]
    assert (mm.execution_pool_size, mm.storage_pool_size) == (400, 600)
    # 100 beyond the region left: evicting "b" frees 300, all free storage execution may take
    assert mm.acquire_execution_memory(300, "t1") == 300
    assert store.block_ids() == ["c"]
    assert (mm.execution_pool_size, mm.storage_pool_size) == (700, 300)
    # "c" lies inside the region: never evicted, execution gets what is free
    assert mm.acquire_execution_memory(300, "t1") == 0
    assert store.block_ids() == ["c"]
    mm.check_invariants()


def test_release_more_than_held_is_clamped_with_a_warning(
    mm: UnifiedMemoryManager, caplog: pytest.LogCaptureFixture
) -> None:
    mm.acquire_execution_memory(100, "t1")
    with caplog.at_level(logging.WARNING, logger="extagg.memory"):
        mm.release_execution_memory(150, "t1")
    assert "release called on 150 bytes but task 't1' only has 100 bytes" in caplog.text
    assert mm.task_memory("t1") == 0
    assert mm.tasks() == {}
    assert mm.execution_memory_used == 0
    caplog.clear()
    mm.acquire_storage_memory("b", 50)
    with caplog.at_level(logging.WARNING, logger="extagg.memory"):
        mm.release_storage_memory(80)
    assert "release 80 bytes of storage memory when we only have 50" in caplog.text
    assert mm.storage_memory_used == 0
    mm.check_invariants()


def test_release_all_for_task(mm: UnifiedMemoryManager) -> None:
    mm.acquire_execution_memory(300, "t1")
    mm.acquire_execution_memory(200, "t2")
    assert mm.release_all_execution_memory_for_task("t1") == 300
    assert mm.release_all_execution_memory_for_task("t1") == 0
    assert mm.tasks() == {"t2": 200}
    mm.check_invariants()


def test_default_task_is_the_current_thread(mm: UnifiedMemoryManager) -> None:
    import threading

    assert mm.acquire_execution_memory(10) == 10
    assert mm.task_memory(threading.get_ident()) == 10
    assert mm.task_memory() == 10


def test_check_invariants_detects_corruption(mm: UnifiedMemoryManager) -> None:
    mm.acquire_execution_memory(100, "t1")
    mm._execution_pool._memory_for_task["t1"] = 90  # break the books on purpose
    with pytest.raises(AssertionError, match="tasks hold 90 bytes"):
        mm.check_invariants()
    mm._execution_pool._memory_for_task["t1"] = 100
    mm._storage_pool._pool_size += 1
    with pytest.raises(AssertionError, match="max_memory"):
        mm.check_invariants()


def test_memory_limit_error_is_a_memory_error() -> None:
    assert issubclass(MemoryLimitError, MemoryError)

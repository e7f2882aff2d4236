"""Fair sharing among tasks: the 1/N cap, the 1/(2N) wait, its release, its timeout."""

from __future__ import annotations

import logging

import pytest

from extagg.errors import MemoryLimitError
from extagg.memory import MemoryConsumer, UnifiedMemoryManager, task_memory_manager
from tests.memory.helpers import Worker, wait_until


def test_one_task_may_take_everything(mm: UnifiedMemoryManager) -> None:
    assert mm.acquire_execution_memory(1000, "t1") == 1000


def test_cap_of_one_nth_returns_zero_at_once(mm: UnifiedMemoryManager) -> None:
    assert mm.acquire_execution_memory(500, "t1") == 500
    assert mm.acquire_execution_memory(300, "t2") == 300
    # N = 2: t1 is at its cap of 1000 // 2 = 500, so it gets 0 without waiting (SPARK-31720)
    assert mm.acquire_execution_memory(100, "t1") == 0
    # t2 may grow to its cap (200 more), not beyond
    assert mm.acquire_execution_memory(400, "t2") == 200
    assert mm.tasks() == {"t1": 500, "t2": 500}
    mm.check_invariants()


def test_three_tasks_cap_at_one_third(mm: UnifiedMemoryManager) -> None:
    mm.acquire_execution_memory(100, "t1")
    mm.acquire_execution_memory(100, "t2")
    assert mm.acquire_execution_memory(900, "t3") == 333  # 1000 // 3
    assert mm.acquire_execution_memory(900, "t1") == 233
    assert mm.acquire_execution_memory(900, "t2") == 233
    assert mm.execution_memory_used == 999


def test_helpers_share_their_owners_fair_share(mm: UnifiedMemoryManager) -> None:
    """A threaded aggregator's workers are helpers of the caller's task: with the caller they
    count as one task, and split what the caller leaves of its share (as tasks of their own
    each had 1/3 of the pool, the caller's third mostly unused)."""
    from extagg.memory import HelperTaskId

    h0, h1 = HelperTaskId("t1", 0), HelperTaskId("t1", 1)
    assert mm.acquire_execution_memory(100, "t1") == 100
    assert mm.acquire_execution_memory(10, h0) == 10  # every worker starts before any folds
    assert mm.acquire_execution_memory(10, h1) == 10
    assert mm.acquire_execution_memory(1000, h0) == 440  # (1000 - 100) // 2 - 10
    assert mm.acquire_execution_memory(1000, h1) == 440
    assert mm.acquire_execution_memory(10, "t1") == 0  # the group is at its cap: t1 spills
    mm.release_execution_memory(450, h0)
    assert mm.acquire_execution_memory(50, "t1") == 50  # the owner takes what is left...
    assert mm.acquire_execution_memory(1000, h0) == 400  # ...and a helper the rest
    assert mm.tasks() == {"t1": 150, h0: 400, h1: 450}
    mm.check_invariants()


def test_a_helper_group_counts_once_beside_other_tasks(mm: UnifiedMemoryManager) -> None:
    from extagg.memory import HelperTaskId

    assert mm.acquire_execution_memory(100, "t2") == 100
    h0, h1 = HelperTaskId("t1", 0), HelperTaskId("t1", 1)
    assert mm.acquire_execution_memory(10, h0) == 10
    assert mm.acquire_execution_memory(10, h1) == 10
    # N = 2 (t2, and t1's helpers): the group's cap is 500, each helper's 250
    assert mm.acquire_execution_memory(1000, h0) == 240
    assert mm.acquire_execution_memory(1000, h1) == 240
    assert mm.acquire_execution_memory(1000, "t2") == 400  # t2 up to its own 500
    assert mm.execution_memory_used == 1000
    mm.check_invariants()


def test_a_helper_at_its_part_is_refused_at_once_not_made_to_wait() -> None:
    """Four helpers: each may hold a quarter of what the owner leaves, so the group can be
    under half the pool while one helper is at its part. Waiting for the group's 1/(2N)
    would wait on its own siblings, which need not release anything: it gets what its part
    allows at once, and spills."""
    import time

    from extagg.memory import HelperTaskId

    mm = UnifiedMemoryManager(1000, storage_fraction=0.5, wait_timeout=30)
    helpers = [HelperTaskId("t1", w) for w in range(4)]
    assert mm.acquire_execution_memory(100, "t1") == 100
    for h in helpers:
        assert mm.acquire_execution_memory(5, h) == 5
    started = time.monotonic()
    assert mm.acquire_execution_memory(1000, helpers[0]) == 220  # (1000 - 100) // 4 - 5
    assert mm.acquire_execution_memory(10, helpers[0]) == 0
    assert time.monotonic() - started < 5  # not the 30 s wait
    mm.check_invariants()


def test_partial_grant_when_at_least_half_share(mm: UnifiedMemoryManager) -> None:
    assert mm.acquire_execution_memory(700, "t1") == 700
    # N = 2, t2 needs 400 but only 300 are free: 300 >= 1/(2N) = 250, so granted without waiting
    assert mm.acquire_execution_memory(400, "t2") == 300


def test_half_share_wait_released_by_another_thread(mm: UnifiedMemoryManager) -> None:
    assert mm.acquire_execution_memory(1000, "t1") == 1000
    waiter = Worker(lambda: mm.acquire_execution_memory(300, "t2"))
    waiter.start()
    # t2 registers with 0 bytes (it now counts in N) and waits: nothing is free
    wait_until(lambda: mm.tasks() == {"t1": 1000, "t2": 0}, "t2 waits")
    assert waiter.is_alive()
    mm.release_execution_memory(600, "t1")
    assert waiter.outcome() == 300
    assert mm.tasks() == {"t1": 400, "t2": 300}
    mm.check_invariants()


def test_waiter_takes_what_it_needs_to_reach_half_share(mm: UnifiedMemoryManager) -> None:
    assert mm.acquire_execution_memory(1000, "t1") == 1000
    waiter = Worker(lambda: mm.acquire_execution_memory(400, "t2"))
    waiter.start()
    wait_until(lambda: "t2" in mm.tasks(), "t2 waits")
    mm.release_execution_memory(100, "t1")  # 100 < 1/(2N) = 250: keep waiting
    mm.release_execution_memory(100, "t1")
    assert waiter.is_alive()
    mm.release_execution_memory(60, "t1")  # 260 free >= 250: granted (all that is free)
    assert waiter.outcome() == 260


def test_clean_up_of_a_task_unblocks_another(mm: UnifiedMemoryManager) -> None:
    tmm1 = task_memory_manager(mm, "t1")
    holder = MemoryConsumer(tmm1, "holder")
    assert holder.acquire_memory(1000) == 1000
    waiter = Worker(lambda: MemoryConsumer(task_memory_manager(mm, "t2")).acquire_memory(500))
    waiter.start()
    wait_until(lambda: "t2" in mm.tasks(), "t2 waits")
    assert tmm1.clean_up_all_allocated_memory() == 1000  # > 0: holder leaked
    assert holder.used == 0
    assert waiter.outcome() == 500
    mm.check_invariants()


def test_wait_timeout_raises_with_the_sizes(caplog: pytest.LogCaptureFixture) -> None:
    mm = UnifiedMemoryManager(1000, wait_timeout=0.05)
    assert mm.acquire_execution_memory(1000, "t1") == 1000
    with (
        caplog.at_level(logging.INFO, logger="extagg.memory"),
        pytest.raises(MemoryLimitError) as error,
    ):
        mm.acquire_execution_memory(100, "t2")
    message = str(error.value)
    for part in (
        "task 't2' waited 0.05 s for 100 bytes",
        "it holds 0 bytes",
        "1/(2N) = 250 bytes",
        "1000 bytes execution pool shared by N = 2 tasks",
        "only 0 bytes are free",
        "EXTAGG_MEMORY_WAIT_TIMEOUT",
    ):
        assert part in message
    assert "TID t2 waiting for at least 1/2N of execution pool" in caplog.text
    # the task that gave up holds nothing and no longer counts in N
    assert mm.tasks() == {"t1": 1000}
    mm.check_invariants()


def test_zero_byte_task_stops_counting_in_n(mm: UnifiedMemoryManager) -> None:
    mm.acquire_execution_memory(300, "t1")
    mm.acquire_execution_memory(300, "t2")
    mm.release_execution_memory(300, "t2")
    assert mm.tasks() == {"t1": 300}
    # alone again: t1 may take everything
    assert mm.acquire_execution_memory(700, "t1") == 700


def test_a_new_task_wakes_waiters_to_recompute(mm: UnifiedMemoryManager) -> None:
    """Waiters re-check when N changes; releases by several tasks all count."""
    assert mm.acquire_execution_memory(500, "t1") == 500
    assert mm.acquire_execution_memory(500, "t2") == 500
    waiter = Worker(lambda: mm.acquire_execution_memory(200, "t3"))
    waiter.start()
    wait_until(lambda: "t3" in mm.tasks(), "t3 waits")
    mm.release_execution_memory(100, "t1")
    mm.release_execution_memory(100, "t2")
    # N = 3, 1/(2N) = 166: 200 free is enough
    assert waiter.outcome() == 200
    mm.check_invariants()


def test_cap_counts_storage_only_up_to_its_region(mm: UnifiedMemoryManager) -> None:
    store = mm.memory_store
    assert store.put("a", "A", 400) and store.put("b", "B", 300)  # 700: 200 beyond the region
    assert mm.execution_pool_size == 300
    assert mm.acquire_execution_memory(100, "t1") == 100
    # N = 2: the cap is (1000 - min(700, 500)) // 2 = 250, not (1000 - 700) // 2 = 150
    assert mm.acquire_execution_memory(200, "t2") == 200
    assert store.block_ids() == ["a", "b"]  # it fit in free execution memory: nothing evicted

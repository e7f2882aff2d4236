"""Threads: user code never runs under the manager's lock; a randomised stress test."""

from __future__ import annotations

import random
import sys
import threading
import time

import pytest

from extagg.errors import MemoryLimitError
from extagg.memory import (
    MemoryConsumer,
    TaskMemoryManager,
    UnifiedMemoryManager,
    task_memory_manager,
)
from tests.memory.helpers import RecordingConsumer, Worker


def lock_is_free(mm: UnifiedMemoryManager) -> bool:
    """Whether another thread can take the manager's lock right now."""

    def probe() -> bool:
        if mm._lock.acquire(blocking=False):
            mm._lock.release()
            return True
        return False

    worker = Worker(probe)
    worker.start()
    return bool(worker.outcome())


def test_callbacks_and_spills_run_outside_the_manager_lock(mm: UnifiedMemoryManager) -> None:
    seen: list[tuple[str, bool]] = []
    store = mm.memory_store

    def offload(block_id, value):
        seen.append((f"on_evict {block_id}", lock_is_free(mm)))

        def reload():
            seen.append((f"reload {block_id}", lock_is_free(mm)))
            return value

        return reload

    store.put("a", "A", 600, on_evict=offload)
    store.put("b", "B", 600, on_evict=offload)  # evicted by a put
    assert mm.acquire_execution_memory(500, "t") == 500  # evicts b for execution
    mm.release_execution_memory(500, "t")
    assert store.get("a") == "A"

    tmm = TaskMemoryManager(mm, "spilling")

    def note_spill(consumer: RecordingConsumer) -> None:
        seen.append((f"spill {consumer.name}", lock_is_free(mm)))

    RecordingConsumer(tmm, "victim", during_spill=note_spill).acquire_memory(400)
    RecordingConsumer(tmm, "R").acquire_memory(1000)
    assert [what for what, _ in seen] == [
        "on_evict a",
        "on_evict b",
        "reload a",
        "on_evict a",  # R's request evicts a again, then spills victim
        "spill victim",
    ]
    assert all(free for _, free in seen), seen


def test_eviction_callbacks_run_before_an_acquire_waits() -> None:
    """A request that evicts a block and then must wait runs the block's on_evict first; here
    the callback is what lets another task release memory, so a deferred callback would hang."""
    mm = UnifiedMemoryManager(1000, wait_timeout=30)
    evicted = threading.Event()
    store = mm.memory_store
    store.put("a", "A", 100, on_evict=lambda _id, _value: evicted.set())
    store.put("b", "B", 500)  # storage holds 600: 100 beyond its region
    assert mm.acquire_execution_memory(400, "t1") == 400

    def release_when_evicted() -> None:
        assert evicted.wait(10)
        mm.release_execution_memory(400, "t1")

    helper = Worker(release_when_evicted)
    helper.start()
    # t2 evicts a (100 more for execution), is still under 1/(2N) = 125: waits for t1
    assert mm.acquire_execution_memory(300, "t2") == 300
    helper.outcome()
    assert store.block_ids() == ["b"]
    mm.check_invariants()


def test_waiting_with_pending_evictions_still_times_out() -> None:
    mm = UnifiedMemoryManager(1000, wait_timeout=0.05)
    done: list[str] = []
    mm.memory_store.put("a", "A", 100, on_evict=lambda block_id, _v: done.append(block_id))
    mm.memory_store.put("b", "B", 500)
    assert mm.acquire_execution_memory(400, "t1") == 400
    with pytest.raises(MemoryLimitError, match="task 't2' waited"):
        mm.acquire_execution_memory(300, "t2")
    assert done == ["a"]
    assert mm.tasks() == {"t1": 400}


STEPS = 1500


class StressConsumer(MemoryConsumer):
    """Spills a random part of what it holds; thread-safe enough for cross-thread spills."""

    def __init__(self, tmm: TaskMemoryManager, seed: int) -> None:
        super().__init__(tmm)
        self.random = random.Random(seed)
        self.lock = threading.Lock()

    def spill(self, size: int, trigger: MemoryConsumer) -> int:
        with self.lock:
            amount = min(self.used, self.random.choice([size, self.used, self.used // 2]))
            self.free_memory(amount)
            return amount


def stress_worker(mm: UnifiedMemoryManager, seed: int, task_id, steps: int, errors: list) -> None:
    rng = random.Random(seed)
    tmm = task_memory_manager(mm, task_id)
    consumers = [StressConsumer(tmm, seed * 10 + i) for i in range(3)]
    store = mm.memory_store
    try:
        for _ in range(steps):
            action = rng.random()
            consumer = rng.choice(consumers)
            if action < 0.45:
                want = rng.randint(1, 300)
                granted = consumer.acquire_memory(want)
                assert 0 <= granted <= want
            elif action < 0.75:
                with consumer.lock:
                    consumer.free_memory(rng.randint(0, consumer.used))
            elif action < 0.8:
                consumer.spill(rng.randint(1, 200), consumer)
            elif action < 0.9:
                block = f"block-{rng.randint(0, 9)}"
                if rng.random() < 0.5:
                    store.put(block, block, rng.randint(0, 300), on_evict=lambda _b, v: lambda: v)
                else:
                    store.put(block, block, rng.randint(0, 300))
            elif action < 0.97:
                block = f"block-{rng.randint(0, 9)}"
                assert store.get(block) in (None, block)
            else:
                store.remove(f"block-{rng.randint(0, 9)}")
            mm.check_invariants()
            assert all(c.used >= 0 for c in consumers)
    except BaseException as exc:  # reported by the test
        errors.append(exc)
    finally:
        for consumer in consumers:
            consumer.close_memory()


@pytest.mark.parametrize("shared_task", [False, True], ids=["task-per-thread", "shared-task"])
def test_stress_eight_threads(shared_task: bool) -> None:
    previous_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: more interleavings
    try:
        run_stress(shared_task)
    finally:
        sys.setswitchinterval(previous_interval)


def run_stress(shared_task: bool) -> None:
    mm = UnifiedMemoryManager(1000, storage_fraction=0.3, wait_timeout=20)
    errors: list[BaseException] = []
    threads = [
        threading.Thread(
            target=stress_worker,
            args=(mm, seed, "shared" if shared_task else None, STEPS, errors),
            daemon=True,
        )
        for seed in range(8)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads), "deadlock: threads still running"
    if errors:
        raise errors[0]
    mm.check_invariants()
    assert mm.tasks() == {}
    assert mm.execution_memory_used == 0
    assert mm.storage_memory_used == mm.memory_store.memory_used
    mm.memory_store.clear()
    assert mm.storage_memory_used == 0

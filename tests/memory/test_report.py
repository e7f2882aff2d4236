"""report() / format_report(): JSON-serialisable snapshots of pools, tasks and consumers."""

from __future__ import annotations

import json

from extagg.memory import (
    MemoryConsumer,
    UnifiedMemoryManager,
    format_report,
    report,
    set_default_memory_manager,
    task_memory_manager,
)


def test_report_lists_pools_tasks_and_consumers(mm: UnifiedMemoryManager) -> None:
    big = MemoryConsumer(task_memory_manager(mm, "t1"), "big")
    small = MemoryConsumer(task_memory_manager(mm, ("stage", 2)), "small")
    idle = MemoryConsumer(task_memory_manager(mm, "t3"), "idle")
    idle.acquire_memory(5)
    idle.free_memory(5)  # registered, holds nothing; its task holds nothing
    big.acquire_memory(400)
    small.acquire_memory(100)
    mm.memory_store.put("cached", b"x", 300)
    snapshot = report(mm)
    assert json.loads(json.dumps(snapshot)) == snapshot
    assert snapshot["max_memory"] == 1000
    assert snapshot["storage_region_size"] == 500
    assert snapshot["execution"] == {"pool_size": 500, "used": 500, "free": 0}
    assert snapshot["storage"] == {
        "pool_size": 500,
        "used": 300,
        "free": 200,
        "blocks": 1,
        "block_bytes": 300,
        "offloaded_blocks": 0,
    }
    assert snapshot["tasks"] == [
        {"task_id": "t1", "bytes": 400},
        {"task_id": "('stage', 2)", "bytes": 100},
    ]
    assert snapshot["consumers"] == [
        {"task_id": "t1", "name": "big", "used": 400},
        {"task_id": "('stage', 2)", "name": "small", "used": 100},
        {"task_id": "t3", "name": "idle", "used": 0},
    ]
    text = format_report(snapshot)
    assert "execution: 500 B used of 500 B (0 B free)" in text
    assert "storage:   300 B used of 500 B (200 B free), 1 blocks in memory" in text
    assert "task t1: 400 B\n      big: 400 B" in text
    assert "task t3: 0 B\n      idle: 0 B" in text


def test_report_of_the_default_manager(isolated_default) -> None:
    mm = UnifiedMemoryManager("3g")
    set_default_memory_manager(mm)
    snapshot = report()
    assert snapshot["max_memory"] == 3 * 2**30
    assert "memory: max 3.0 GiB (storage region 1536.0 MiB)" in format_report(snapshot)

"""The execution high-water mark of a task and its helpers (what `extagg aggregate` reports as
"peak memory granted"): the most they held at once, never more than the pool."""

from __future__ import annotations

from extagg.memory import HelperTaskId, UnifiedMemoryManager

MIB = 1 << 20


def test_peak_is_what_a_task_and_its_helpers_held_at_once() -> None:
    mm = UnifiedMemoryManager(64 * MIB)
    owner, helper = "run", HelperTaskId("run", 0)
    mm.acquire_execution_memory(2 * MIB, owner)  # held before the watch: the start
    mm.watch_execution_peak(owner)
    assert mm.execution_peak(owner) == 2 * MIB
    assert mm.acquire_execution_memory(8 * MIB, owner) == 8 * MIB
    assert mm.acquire_execution_memory(5 * MIB, helper) == 5 * MIB  # 15 MiB at once
    mm.release_execution_memory(10 * MIB, owner)
    assert mm.acquire_execution_memory(9 * MIB, owner) == 9 * MIB  # 14 at once: not a peak
    mm.acquire_execution_memory(4 * MIB, "another task")  # not counted
    mm.release_execution_memory(5 * MIB, helper)
    assert mm.acquire_execution_memory(5 * MIB, owner) == 5 * MIB  # the owner's own peak: 14
    # the owner's peak (14) + the helper's (5) would say 19: more than they ever held
    assert mm.execution_peak(owner) == 15 * MIB
    assert mm.execution_peak(helper) == 15 * MIB  # a helper reads its owner's figure
    mm.unwatch_execution_peak(owner)
    assert mm.execution_peak(owner) == 14 * MIB  # unwatched: what is held now


def test_watches_nest() -> None:
    mm = UnifiedMemoryManager(64 * MIB)
    mm.watch_execution_peak("t")
    mm.watch_execution_peak("t")
    mm.acquire_execution_memory(3 * MIB, "t")
    mm.release_execution_memory(3 * MIB, "t")
    mm.unwatch_execution_peak("t")
    assert mm.execution_peak("t") == 3 * MIB  # still watched by the outer one
    mm.unwatch_execution_peak("t")
    assert mm.execution_peak("t") == 0
    mm.unwatch_execution_peak("t")  # one too many: nothing to end

"""Stateful property test: the manager and its store against a plain-Python model.

The model restates the rules of ``extagg.memory.unified`` with plain numbers and lists (pool
sizes, per-task bytes, blocks in LRU order); hypothesis drives random sequences of execution
grants/releases and block puts/gets/removes over three tasks and checks that the manager and
the model agree after every step, and that ``check_invariants`` holds.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from extagg.errors import MemoryLimitError
from extagg.memory import UnifiedMemoryManager

MAX = 1000
REGION = 500
TASKS = st.sampled_from(["t0", "t1", "t2"])
BLOCKS = st.sampled_from(["a", "b", "c", "d", "e"])


class Model:
    """Plain-number restatement of the pool rules."""

    def __init__(self) -> None:
        self.exec_pool = MAX - REGION
        self.storage_pool = REGION
        self.tasks: dict[str, int] = {}
        self.lru: list[tuple[str, int, bool]] = []  # (block, size, reloadable), oldest first
        self.offloaded: dict[str, int] = {}  # block -> size

    @property
    def storage_used(self) -> int:
        return sum(size for _, size, _ in self.lru)

    def evict(self, space: int, exclude: str | None) -> int:
        chosen, freed = [], 0
        for entry in self.lru:
            if freed >= space:
                break
            if entry[0] != exclude:
                chosen.append(entry)
                freed += entry[1]
        if freed < space:
            return 0
        for entry in chosen:
            self.lru.remove(entry)
            if entry[2]:
                self.offloaded[entry[0]] = entry[1]
        return freed

    def acquire_execution(self, n: int, task: str) -> int | None:
        self.tasks.setdefault(task, 0)
        count, held = len(self.tasks), self.tasks[task]
        extra = n - (self.exec_pool - sum(self.tasks.values()))
        if extra > 0:
            storage_free = self.storage_pool - self.storage_used
            reclaimable = max(storage_free, self.storage_pool - REGION)
            if reclaimable > 0:
                want = min(extra, reclaimable)
                from_free = min(want, storage_free)
                evicted = self.evict(want - from_free, None) if want > from_free else 0
                moved = min(extra, from_free + evicted)
                self.storage_pool -= moved
                self.exec_pool += moved
        cap = (MAX - min(self.storage_used, REGION)) // count
        floor = self.exec_pool // (2 * count)
        free = self.exec_pool - sum(self.tasks.values())
        grant = max(0, min(n, max(0, cap - held), free))
        if grant < n and held + grant < floor:
            return None  # waits
        if held + grant == 0:
            del self.tasks[task]
        else:
            self.tasks[task] = held + grant
        return grant

    def release_execution(self, n: int, task: str) -> None:
        held = self.tasks.get(task, 0)
        if task in self.tasks:
            if held - min(n, held) <= 0:
                del self.tasks[task]
            else:
                self.tasks[task] = held - n

    def put(self, block: str, size: int, reloadable: bool) -> bool:
        self.lru = [entry for entry in self.lru if entry[0] != block]
        self.offloaded.pop(block, None)
        return self._insert(block, size, reloadable)

    def _insert(self, block: str, size: int, reloadable: bool) -> bool:
        if size > MAX - sum(self.tasks.values()):
            return False
        storage_free = self.storage_pool - self.storage_used
        if size > storage_free:
            borrowed = min(self.exec_pool - sum(self.tasks.values()), size - storage_free)
            self.exec_pool -= borrowed
            self.storage_pool += borrowed
        to_free = size - (self.storage_pool - self.storage_used)
        if to_free > 0:
            self.evict(to_free, block)
        if size > self.storage_pool - self.storage_used:
            return False
        self.lru.append((block, size, reloadable))
        return True

    def get(self, block: str) -> bool:
        """True if the block is known (in memory, or offloaded and now reloaded/served)."""
        for entry in self.lru:
            if entry[0] == block:
                self.lru.remove(entry)
                self.lru.append(entry)
                return True
        if block in self.offloaded:
            size = self.offloaded.pop(block)
            if not self._insert(block, size, True):
                self.offloaded[block] = size
            return True
        return False

    def remove(self, block: str) -> bool:
        known = any(entry[0] == block for entry in self.lru) or block in self.offloaded
        self.lru = [entry for entry in self.lru if entry[0] != block]
        self.offloaded.pop(block, None)
        return known


class MemoryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.mm = UnifiedMemoryManager(MAX, storage_fraction=REGION / MAX, wait_timeout=0.001)
        self.model = Model()
        self.values: dict[str, str] = {}
        self.version = 0

    @rule(task=TASKS, n=st.integers(1, 700))
    def acquire_execution(self, task: str, n: int) -> None:
        expected = self.model.acquire_execution(n, task)
        if expected is not None:
            assert self.mm.acquire_execution_memory(n, task) == expected
            return
        # the model says this task must wait for others: the manager times out
        before = [entry[0] for entry in self.model.lru]
        try:
            self.mm.acquire_execution_memory(n, task)
        except MemoryLimitError:
            pass
        else:
            raise AssertionError("expected a 1/(2N) wait")
        self._resync(before)

    @rule(task=TASKS, n=st.integers(0, 700))
    def release_execution(self, task: str, n: int) -> None:
        self.model.release_execution(n, task)
        self.mm.release_execution_memory(n, task)

    @rule(task=TASKS)
    def release_all(self, task: str) -> None:
        expected = self.model.tasks.pop(task, 0)
        assert self.mm.release_all_execution_memory_for_task(task) == expected

    @rule(block=BLOCKS, size=st.integers(0, 700), reloadable=st.booleans())
    def put(self, block: str, size: int, reloadable: bool) -> None:
        self.version += 1
        value = f"{block}-{self.version}"
        self.values[block] = value
        on_evict = (lambda _id, v: lambda: v) if reloadable else None
        expected = self.model.put(block, size, reloadable)
        assert self.mm.memory_store.put(block, value, size, on_evict=on_evict) is expected

    @rule(block=BLOCKS)
    def get(self, block: str) -> None:
        known = self.model.get(block)
        got = self.mm.memory_store.get(block)
        assert got == (self.values[block] if known else None)

    @rule(block=BLOCKS)
    def remove(self, block: str) -> None:
        assert self.mm.memory_store.remove(block) is self.model.remove(block)

    def _resync(self, lru_before: list[str]) -> None:
        """After a timed-out wait: evictions took the oldest blocks; adopt the real state."""
        store = self.mm.memory_store
        now = store.block_ids()
        assert now == lru_before[len(lru_before) - len(now) :]
        model = self.model
        model.exec_pool, model.storage_pool = self.mm.execution_pool_size, self.mm.storage_pool_size
        model.tasks = dict(self.mm.tasks())
        sizes = {entry[0]: entry for entry in model.lru}
        for gone in lru_before[: len(lru_before) - len(now)]:
            entry = sizes[gone]
            model.lru.remove(entry)
            if entry[2]:
                model.offloaded[gone] = entry[1]

    @invariant()
    def agrees_with_model(self) -> None:
        mm, model = self.mm, self.model
        mm.check_invariants()
        assert mm.execution_pool_size == model.exec_pool
        assert mm.storage_pool_size == model.storage_pool
        assert mm.tasks() == model.tasks
        assert mm.memory_store.block_ids() == [entry[0] for entry in model.lru]
        assert sorted(mm.memory_store.offloaded_block_ids()) == sorted(model.offloaded)
        assert mm.storage_memory_used == model.storage_used


TestMemoryMachine = MemoryMachine.TestCase

"""TaskMemoryManager: cooperative spilling (exact order), consumers, clean-up, registry."""

from __future__ import annotations

import gc
import logging
import signal
import threading

import pytest

from extagg.errors import SpillError
from extagg.memory import (
    MemoryConsumer,
    TaskMemoryManager,
    UnifiedMemoryManager,
    default_memory_manager,
    set_default_memory_manager,
    task_managers,
    task_memory_manager,
)
from tests.memory.helpers import RecordingConsumer, Worker, wait_until


def make_consumers(tmm: TaskMemoryManager, sizes: dict[str, int], log: list[str], **kw):
    consumers = {}
    for name, size in sizes.items():
        consumer = RecordingConsumer(tmm, name, log, **kw.get(name, {}))
        assert consumer.acquire_memory(size) == size
        consumers[name] = consumer
    return consumers


def test_spill_picks_smallest_covering_else_largest(mm: UnifiedMemoryManager) -> None:
    tmm = TaskMemoryManager(mm, "t")
    log: list[str] = []
    c = make_consumers(tmm, {"A": 100, "B": 200, "C": 300, "D": 400}, log)
    requester = RecordingConsumer(tmm, "R", log)
    # shortfall 450: nobody covers it -> largest (D, 400); shortfall 50 -> smallest >= 50 (A)
    assert requester.acquire_memory(450) == 450
    assert log == ["D", "A"]
    assert {name: x.used for name, x in c.items()} == {"A": 0, "B": 200, "C": 300, "D": 0}
    assert requester.used == 450
    mm.check_invariants()


def test_spill_order_with_refusals_ends_with_the_requester(mm: UnifiedMemoryManager) -> None:
    tmm = TaskMemoryManager(mm, "t")
    log: list[str] = []
    c = make_consumers(
        tmm,
        {"R": 400, "A": 100, "B": 200, "C": 300},
        log,
        B={"refuse": True},
        C={"refuse": True},
    )
    # requester is keyed 0: C and B refuse (dropped), A frees 100 then nothing (dropped),
    # finally R itself spills its 400
    assert c["R"].acquire_memory(500) == 500
    assert log == ["C", "B", "A", "A", "R"]
    assert c["R"].used == 500  # 400 spilled, 500 granted
    assert (c["A"].used, c["B"].used, c["C"].used) == (0, 200, 300)
    mm.check_invariants()


def test_equal_usage_spills_the_last_registered_first(mm: UnifiedMemoryManager) -> None:
    tmm = TaskMemoryManager(mm, "t")
    log: list[str] = []
    make_consumers(tmm, {"first": 300, "second": 300, "third": 400}, log)
    assert RecordingConsumer(tmm, "R", log).acquire_memory(250) == 250
    assert log == ["second"]


def test_requester_spills_itself_last(mm: UnifiedMemoryManager) -> None:
    tmm = TaskMemoryManager(mm, "t")
    log: list[str] = []
    c = make_consumers(tmm, {"R": 600, "small": 100}, log)
    mm.acquire_execution_memory(300, "other")  # N = 2: t is over its 1/N cap
    assert c["R"].acquire_memory(200) == 200
    # small frees 100 but the task is still over its cap, so the re-acquire gets 0; small is
    # asked again (it freed something last time), frees nothing and is dropped; then R
    assert log == ["small", "small", "R"]


def test_no_spill_when_nothing_else_holds_memory(mm: UnifiedMemoryManager) -> None:
    tmm = TaskMemoryManager(mm, "t")
    log: list[str] = []
    requester = RecordingConsumer(tmm, "R", log)
    mm.acquire_storage_memory("raw", 500)  # inside the storage region: not reclaimable
    assert requester.acquire_memory(800) == 500
    assert log == []


def test_freed_memory_stolen_by_another_task_is_retried(mm: UnifiedMemoryManager) -> None:
    """SPARK-35486: another task grabs the memory a spill freed; the loop spills again."""
    tmm = TaskMemoryManager(mm, "t")
    log: list[str] = []
    stolen: list[int] = []

    def thief(_victim: RecordingConsumer) -> None:
        if not stolen:
            stolen.append(mm.acquire_execution_memory(300, "thief"))

    victim = RecordingConsumer(tmm, "A", log, spill_amount=300, during_spill=thief)
    assert victim.acquire_memory(600) == 600
    requester = RecordingConsumer(tmm, "R", log)
    assert requester.acquire_memory(500) == 500
    assert stolen == [300]
    assert log == ["A", "A"]  # the first spill's memory went to the thief
    assert (victim.used, requester.used) == (0, 500)
    assert mm.tasks() == {"t": 500, "thief": 300}
    mm.check_invariants()


def test_spill_error_propagates_and_releases_the_partial_grant(mm: UnifiedMemoryManager) -> None:
    tmm = TaskMemoryManager(mm, "t")

    class FailingConsumer(MemoryConsumer):
        def spill(self, size: int, trigger: MemoryConsumer) -> int:
            raise SpillError("disk full", directory="/nowhere", bytes_needed=size)

    failing = FailingConsumer(tmm, "failing")
    assert failing.acquire_memory(700) == 700
    requester = RecordingConsumer(tmm, "R")
    with pytest.raises(SpillError, match="disk full") as error:
        requester.acquire_memory(500)  # 300 granted, then the spill fails
    assert error.value.bytes_needed == 200
    if hasattr(error.value, "__notes__"):
        assert "spill() of failing, triggered by R" in error.value.__notes__[0]
    assert requester.used == 0
    assert mm.task_memory("t") == 700
    assert requester not in tmm.consumers
    mm.check_invariants()


def test_spill_must_not_acquire(mm: UnifiedMemoryManager) -> None:
    tmm = TaskMemoryManager(mm, "t")

    class GreedySpiller(MemoryConsumer):
        def spill(self, size: int, trigger: MemoryConsumer) -> int:
            return self.acquire_memory(10)

    greedy = GreedySpiller(tmm, "greedy")
    greedy.acquire_memory(1000)
    with pytest.raises(RuntimeError, match="must not acquire"):
        RecordingConsumer(tmm, "R").acquire_memory(100)
    assert mm.task_memory("t") == 1000
    mm.check_invariants()


@pytest.mark.parametrize("bad", [None, -1, 1.5, True])
def test_spill_must_return_bytes(mm: UnifiedMemoryManager, bad: object) -> None:
    tmm = TaskMemoryManager(mm, "t")

    class BadSpiller(MemoryConsumer):
        def spill(self, size: int, trigger: MemoryConsumer) -> int:
            return bad  # type: ignore[return-value]

    BadSpiller(tmm, "bad").acquire_memory(1000)
    with pytest.raises(TypeError, match=r"bad\.spill\(\) must return the bytes it freed"):
        RecordingConsumer(tmm, "R").acquire_memory(100)


def test_spill_lying_about_bytes_is_measured_not_trusted(
    mm: UnifiedMemoryManager, caplog: pytest.LogCaptureFixture
) -> None:
    tmm = TaskMemoryManager(mm, "t")

    class Liar(MemoryConsumer):
        def spill(self, size: int, trigger: MemoryConsumer) -> int:
            return 500  # frees nothing

    Liar(tmm, "liar").acquire_memory(1000)
    with caplog.at_level(logging.WARNING, logger="extagg.memory"):
        assert RecordingConsumer(tmm, "R").acquire_memory(100) == 0  # terminates
    assert "liar.spill() reported 500 bytes freed but its usage dropped by 0" in caplog.text


def test_base_consumer_does_not_spill(mm: UnifiedMemoryManager) -> None:
    tmm = TaskMemoryManager(mm, "t")
    plain = MemoryConsumer(tmm)
    assert plain.name.startswith("MemoryConsumer-")
    assert plain.acquire_memory(1000) == 1000
    assert plain.spill(10, plain) == 0
    assert MemoryConsumer(tmm).acquire_memory(10) == 0


def test_consumer_accounting_and_close(mm: UnifiedMemoryManager, caplog) -> None:
    tmm = TaskMemoryManager(mm, "t")
    consumer = MemoryConsumer(tmm, "c")
    assert consumer.acquire_memory(0) == 0
    assert tmm.consumers == []  # registered on the first real grant
    assert consumer.acquire_memory(300) == 300
    assert tmm.consumers == [consumer]
    consumer.free_memory(100)
    assert (consumer.used, mm.task_memory("t"), tmm.memory_used) == (200, 200, 200)
    with caplog.at_level(logging.WARNING, logger="extagg.memory"):
        consumer.free_memory(500)
    assert "c frees 500 bytes but holds only 200" in caplog.text
    assert (consumer.used, mm.task_memory("t")) == (0, 0)
    with pytest.raises(ValueError, match="num_bytes"):
        consumer.free_memory(-1)
    consumer.acquire_memory(50)
    assert consumer.close_memory() == 50
    assert consumer.close_memory() == 0
    assert tmm.consumers == []
    assert mm.tasks() == {}


def test_consumer_of_another_task_is_rejected(mm: UnifiedMemoryManager) -> None:
    foreign = MemoryConsumer(TaskMemoryManager(mm, "a"), "foreign")
    with pytest.raises(ValueError, match="belongs to task 'a', not to task 'b'"):
        TaskMemoryManager(mm, "b").acquire_execution_memory(10, foreign)
    with pytest.raises(TypeError, match="TaskMemoryManager"):
        MemoryConsumer(mm)  # type: ignore[arg-type]


def test_clean_up_reports_leaks(mm: UnifiedMemoryManager, caplog) -> None:
    tmm = TaskMemoryManager(mm, "t")
    closed, leaky = MemoryConsumer(tmm, "closed"), MemoryConsumer(tmm, "leaky")
    closed.acquire_memory(100)
    leaky.acquire_memory(200)
    closed.close_memory()
    with caplog.at_level(logging.WARNING, logger="extagg.memory"):
        assert tmm.clean_up_all_allocated_memory() == 200
    assert "leaked by: leaky (200 bytes)" in caplog.text
    assert (leaky.used, tmm.consumers, mm.tasks()) == (0, [], {})
    assert tmm.clean_up_all_allocated_memory() == 0


def test_registry_returns_the_same_manager_per_task(mm: UnifiedMemoryManager) -> None:
    tmm = task_memory_manager(mm, "t")
    assert task_memory_manager(mm, "t") is tmm
    assert task_memory_manager(mm, "u") is not tmm
    here = task_memory_manager(mm)
    assert here.task_id == threading.get_ident()
    there = Worker(lambda: task_memory_manager(mm))
    there.start()
    assert there.outcome() is not here
    there.result = None
    consumer = MemoryConsumer(tmm)
    del tmm
    gc.collect()
    assert task_memory_manager(mm, "t") is consumer.task_memory_manager  # alive via consumer
    del consumer
    gc.collect()
    assert [t.task_id for t in task_managers(mm)] == [here.task_id]  # only the one referenced


def test_registry_drops_unreferenced_managers(mm: UnifiedMemoryManager) -> None:
    first = task_memory_manager(mm, "t")
    first_id = id(first)
    MemoryConsumer(first).close_memory()
    del first
    gc.collect()
    assert task_managers(mm) == []
    fresh = task_memory_manager(mm, "t")
    assert fresh.consumers == [] and fresh.memory_used == 0
    del first_id


def test_collected_task_manager_releases_leaked_memory(mm: UnifiedMemoryManager, caplog) -> None:
    tmm = task_memory_manager(mm, "lost")
    MemoryConsumer(tmm, "never-closed").acquire_memory(300)
    del tmm
    gc.collect()
    assert mm.task_memory("lost") == 300  # released lazily, on the next acquire
    with caplog.at_level(logging.WARNING, logger="extagg.memory"):
        mm.acquire_execution_memory(1, "other")
    assert mm.task_memory("lost") == 0
    assert "garbage-collected holding 300 bytes" in caplog.text
    mm.check_invariants()


def test_default_manager_and_default_consumer(isolated_default, monkeypatch) -> None:
    monkeypatch.setenv("EXTAGG_MEMORY", "64m")
    mm = default_memory_manager()
    assert mm.max_memory == 64 * 2**20
    assert default_memory_manager() is mm
    consumer = MemoryConsumer()  # default manager, current thread's task
    assert consumer.task_memory_manager.memory_manager is mm
    assert consumer.task_memory_manager is task_memory_manager()
    assert consumer.acquire_memory(1000) == 1000
    consumer.close_memory()
    mine = UnifiedMemoryManager(1000)
    assert set_default_memory_manager(mine) is mm
    assert default_memory_manager() is mine
    with pytest.raises(TypeError, match="UnifiedMemoryManager"):
        set_default_memory_manager("big")  # type: ignore[arg-type]


def test_default_manager_is_created_once_across_threads(isolated_default, monkeypatch) -> None:
    monkeypatch.setenv("EXTAGG_MEMORY", "1m")
    workers = [Worker(default_memory_manager) for _ in range(8)]
    for worker in workers:
        worker.start()
    managers = {id(worker.outcome()) for worker in workers}
    assert len(managers) == 1


def test_clean_up_covers_every_manager_of_the_task(mm: UnifiedMemoryManager) -> None:
    first, second = TaskMemoryManager(mm, "t"), TaskMemoryManager(mm, "t")
    a, b = MemoryConsumer(first, "a"), MemoryConsumer(second, "b")
    a.acquire_memory(100)
    b.acquire_memory(200)
    assert mm.task_memory("t") == 300
    assert first.clean_up_all_allocated_memory() == 300
    assert (a.used, b.used, first.memory_used, second.memory_used) == (0, 0, 0, 0)
    assert second.consumers == []
    del first, second, a, b
    gc.collect()
    mm.acquire_execution_memory(1, "other")  # would release stale leaks, if any were queued
    assert mm.tasks() == {"other": 1}


def test_interrupted_wait_leaves_no_idle_task(mm: UnifiedMemoryManager) -> None:
    """Ctrl-C while waiting for memory: the waiting task does not stay counted in N."""
    mm.acquire_execution_memory(1000, "hog")

    main = threading.main_thread().ident
    assert main == threading.get_ident(), "runs in the main thread (signals go there)"

    interrupted = threading.Event()

    def interrupt_while_waiting() -> None:
        wait_until(lambda: "t" in mm.tasks(), "t waits")
        # a real Ctrl-C, delivered to the waiter; repeated until it lands (a loaded machine
        # may deliver the first one before the waiter is inside its wait)
        while not interrupted.wait(0.2):
            signal.pthread_kill(main, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupter = Worker(interrupt_while_waiting)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            MemoryConsumer(TaskMemoryManager(mm, "t")).acquire_memory(100)
    finally:
        interrupted.set()
        signal.signal(signal.SIGINT, previous)
    interrupter.outcome()
    assert mm.tasks() == {"hog": 1000}


def test_spill_error_after_a_successful_spill_releases_everything(
    mm: UnifiedMemoryManager,
) -> None:
    tmm = TaskMemoryManager(mm, "t")

    class FailingConsumer(MemoryConsumer):
        def spill(self, size: int, trigger: MemoryConsumer) -> int:
            raise SpillError("disk full", directory="/nowhere", bytes_needed=size)

    log: list[str] = []
    spiller = RecordingConsumer(tmm, "A", log)
    spiller.acquire_memory(400)
    FailingConsumer(tmm, "B").acquire_memory(300)
    requester = RecordingConsumer(tmm, "R", log)
    requester.acquire_memory(300)
    # shortfall 600: A (largest) spills 400, re-acquired; shortfall 200: B covers it, fails
    with pytest.raises(SpillError):
        requester.acquire_memory(600)
    assert log == ["A"]
    assert (spiller.used, requester.used) == (0, 300)
    assert mm.task_memory("t") == 600  # B's 300 + R's 300: the 400 re-acquired went back
    assert tmm.memory_used == 600
    mm.check_invariants()

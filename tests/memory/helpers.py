"""Helpers for the memory-manager tests: a scriptable consumer, polling, worker threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from extagg.memory import MemoryConsumer, TaskMemoryManager


class RecordingConsumer(MemoryConsumer):
    """Spills by freeing ``spill_amount`` (default: all it holds; nothing when ``refuse``) and
    appends its name to the shared ``log`` on every spill call."""

    def __init__(
        self,
        tmm: TaskMemoryManager,
        name: str,
        log: list[str] | None = None,
        *,
        refuse: bool = False,
        spill_amount: int | None = None,
        during_spill: Callable[[RecordingConsumer], None] | None = None,
    ) -> None:
        super().__init__(tmm, name)
        self.log = log if log is not None else []
        self.refuse = refuse
        self.spill_amount = spill_amount
        self.during_spill = during_spill

    def spill(self, size: int, trigger: MemoryConsumer) -> int:
        self.log.append(self.name)
        if self.refuse:
            return 0
        amount = self.used if self.spill_amount is None else min(self.spill_amount, self.used)
        self.free_memory(amount)
        if self.during_spill is not None:
            self.during_spill(self)
        return amount


def wait_until(predicate: Callable[[], bool], what: str, limit: float = 10.0) -> None:
    """Poll until ``predicate()`` holds; fail naming ``what`` if it never does."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.002)


class Worker(threading.Thread):
    """A thread that runs ``target`` and keeps its result or exception."""

    def __init__(self, target: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self._target_fn = target
        self.result: object = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self._target_fn()
        except BaseException as exc:  # handed to the test
            self.error = exc

    def outcome(self, timeout: float = 10.0) -> object:
        self.join(timeout)
        assert not self.is_alive(), "worker thread did not finish"
        if self.error is not None:
            raise self.error
        return self.result

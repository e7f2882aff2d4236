"""Fixtures for the memory-manager tests: a 1000-byte manager, an isolated default manager."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from extagg.memory import UnifiedMemoryManager, set_default_memory_manager


@pytest.fixture
def mm() -> UnifiedMemoryManager:
    """1000 bytes, storage region 500, waits give up after 5 s (tests never reach it)."""
    return UnifiedMemoryManager(1000, storage_fraction=0.5, wait_timeout=5)


@pytest.fixture
def isolated_default() -> Iterator[None]:
    """Restore the process-wide default manager after the test."""
    previous = set_default_memory_manager(None)
    try:
        yield
    finally:
        set_default_memory_manager(previous)

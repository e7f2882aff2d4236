"""Fixtures for the state store tests: a private memory manager, a checkpoint, a provider."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from extagg.memory import UnifiedMemoryManager
from extagg.state import Checkpoint, Operator, StateStoreConf, StateStoreProvider


@pytest.fixture
def mm() -> UnifiedMemoryManager:
    """64 MiB, half of it the storage region: plenty for the small states of these tests."""
    return UnifiedMemoryManager("64m", storage_fraction=0.5, wait_timeout=5)


@pytest.fixture
def conf() -> StateStoreConf:
    return StateStoreConf(min_deltas_for_snapshot=3, min_versions_to_retain=5)


@pytest.fixture
def checkpoint(tmp_path) -> Checkpoint:
    return Checkpoint(tmp_path / "checkpoint")


@pytest.fixture
def operator(checkpoint: Checkpoint) -> Operator:
    return checkpoint.operator(0, name="running_totals", num_partitions=2)


@pytest.fixture
def provider(operator, conf, mm) -> Iterator[StateStoreProvider]:
    p = operator.provider(0, conf=conf, memory_manager=mm)
    yield p
    p.close()


def commit_version(
    provider: StateStoreProvider,
    version: int,
    puts: dict[Any, Any] | Iterable[tuple[Any, Any]] = (),
    removes: Iterable[Any] = (),
) -> int:
    """Load ``version``, apply puts then removes, commit; returns the new version."""
    store = provider.get_store(version)
    for key, value in puts.items() if isinstance(puts, dict) else puts:
        store.put(key, value)
    for key in removes:
        store.remove(key)
    return store.commit()


def temp_files(directory) -> list[str]:
    """Temp files (``.name.*.tmp``) anywhere below ``directory``."""
    found = []
    for root, _dirs, files in os.walk(directory):
        found.extend(os.path.join(root, f) for f in files if f.endswith(".tmp"))
    return sorted(found)


def state_files(directory) -> list[str]:
    """Names of the delta and snapshot files directly in ``directory``."""
    return sorted(name for name in os.listdir(directory) if name.endswith((".delta", ".snapshot")))

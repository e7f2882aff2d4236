"""A commit whose delta fails to land must not publish the version (not even via a snapshot)."""

import errno

import pytest

from extagg.memory import UnifiedMemoryManager
from extagg.state import StateStoreConf, StateStoreProvider, atomic
from extagg.state.errors import StateStoreCommitError


def add(a, b):
    return a + b


@pytest.fixture
def provider(tmp_path):
    conf = StateStoreConf(min_deltas_for_snapshot=1)
    p = StateStoreProvider(str(tmp_path), conf=conf, memory_manager=UnifiedMemoryManager("64m"))
    yield p
    p.close()


def fail_delta_commits(monkeypatch):
    original = atomic.AtomicFile.commit

    def failing(self, *args):
        if self.path.endswith(".delta"):
            self.cancel()
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return original(self, *args)

    monkeypatch.setattr(atomic.AtomicFile, "commit", failing)


def test_failed_merge_update_with_snapshot_due(provider, tmp_path, monkeypatch):
    assert provider.merge_update(0, [(1, 10)], add) == 1
    fail_delta_commits(monkeypatch)
    with pytest.raises(StateStoreCommitError, match="No space left"):
        provider.merge_update(1, [(2, 7), (1, 5)], add)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1.delta"]
    assert provider.latest_version() == 1
    assert dict(provider.iter_version(1)) == {1: 10}


def test_recommit_replaces_a_stale_snapshot(provider, tmp_path):
    provider.merge_update(0, [(1, 10)], add)
    provider.merge_update(1, [(1, 5)], add)  # 2.snapshot is due and written
    assert (tmp_path / "2.snapshot").exists()
    provider.merge_update(1, [(1, 1)], add)  # the batch is retried with other data
    assert dict(provider.iter_version(2)) == {1: 11}
    store = provider.get_store(1)
    store.put(1, 100)
    store.commit()  # and once more through the in-memory path
    assert dict(provider.iter_version(2)) == {1: 100}

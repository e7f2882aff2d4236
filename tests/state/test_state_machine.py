"""A Hypothesis state machine: the provider against a dict-of-versions model.

Rules: open a store on any retained version (re-committing an old version is a retried batch),
put, remove, commit, abort, merge_update, reload from a fresh provider, maintenance (snapshots
and cleanup), and reading old versions both loaded and streamed.
"""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from extagg.hashing import stable_hash
from extagg.memory import UnifiedMemoryManager
from extagg.state import StateStoreConf, StateStoreProvider
from extagg.state.codec import encode_key

from .conftest import temp_files

KEYS = st.one_of(
    st.integers(-3, 12),
    st.sampled_from(["a", "b", "", ("t", 1), (1, 2.5), None, True, 1.0, -0.0, b"k"]),
)
VALUES = st.one_of(st.integers(), st.text(max_size=4), st.lists(st.integers(), max_size=3))


def merge(old, new):
    return old + new if isinstance(old, int) and not isinstance(old, bool) else new


class StateStoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="extagg-state-machine-")
        self.mm = UnifiedMemoryManager("32m", wait_timeout=5)
        self.conf = StateStoreConf(
            min_deltas_for_snapshot=2, min_versions_to_retain=3, max_versions_in_memory=2
        )
        self.provider = self._new_provider()
        self.versions: dict[int, dict] = {0: {}}  # version -> its state, for valid versions
        self.floor = 0  # versions below it may have been cleaned up
        self.store = None
        self.pending: dict = {}

    def _new_provider(self) -> StateStoreProvider:
        return StateStoreProvider(self.directory, conf=self.conf, memory_manager=self.mm)

    def available(self) -> list[int]:
        return sorted(v for v in self.versions if v == 0 or v >= self.floor)

    def draw_version(self, data) -> int:
        """Mostly the newest version (long chains), sometimes any retained one (retries)."""
        versions = self.available()
        return data.draw(
            st.one_of(st.just(versions[-1]), st.just(versions[-1]), st.sampled_from(versions))
        )

    def _record(self, new_version: int, state: dict) -> None:
        for version in [v for v in self.versions if v > new_version]:
            del self.versions[version]  # built on the replaced version: no longer meaningful
        self.versions[new_version] = state

    @precondition(lambda self: self.store is None)
    @rule(data=st.data())
    def open_store(self, data) -> None:
        version = self.draw_version(data)
        self.store = self.provider.get_store(version)
        self.pending = dict(self.versions[version])
        assert dict(self.store.items()) == self.pending

    @precondition(lambda self: self.store is not None)
    @rule(key=KEYS, value=VALUES)
    def put(self, key, value) -> None:
        self.store.put(key, value)
        self.pending[key] = value

    @precondition(lambda self: self.store is not None)
    @rule(key=KEYS)
    def remove(self, key) -> None:
        self.store.remove(key)
        self.pending.pop(key, None)

    @precondition(lambda self: self.store is not None)
    @rule()
    def commit(self) -> None:
        new_version = self.store.commit()
        assert new_version == self.store.version + 1
        self._record(new_version, self.pending)
        self.store = None

    @precondition(lambda self: self.store is not None)
    @rule()
    def abort(self) -> None:
        self.store.abort()
        self.store = None

    @precondition(lambda self: self.store is None)
    @rule(data=st.data(), pairs=st.dictionaries(KEYS, st.integers(), max_size=8))
    def merge_update(self, data, pairs) -> None:
        version = self.draw_version(data)
        ordered = sorted(pairs.items(), key=lambda kv: (stable_hash(kv[0]), encode_key(kv[0])))
        new_version = self.provider.merge_update(version, ordered, merge)
        assert new_version == version + 1
        state = dict(self.versions[version])
        for key, combiner in ordered:
            state[key] = merge(state[key], combiner) if key in state else combiner
        self._record(new_version, state)

    @precondition(lambda self: self.store is None)
    @rule()
    def reload(self) -> None:
        self.provider.close()
        self.provider = self._new_provider()

    @precondition(lambda self: self.store is None)
    @rule()
    def maintenance(self) -> None:
        self.provider.do_maintenance()
        self.floor = max(
            self.floor, self.provider.latest_version() - self.conf.min_versions_to_retain
        )

    @rule(data=st.data())
    def read_version(self, data) -> None:
        version = data.draw(st.sampled_from(self.available()))
        assert dict(self.provider.get_read_store(version).items()) == self.versions[version]
        assert dict(self.provider.iter_version(version)) == self.versions[version]

    @invariant()
    def store_matches_pending(self) -> None:
        if self.store is not None:
            assert len(self.store) == len(self.pending)
            for key, value in self.pending.items():
                assert self.store.get(key) == value

    @invariant()
    def no_temp_files(self) -> None:
        assert temp_files(self.directory) == []

    @invariant()
    def cache_is_bounded(self) -> None:
        assert len(self.provider.cached_versions) <= self.conf.max_versions_in_memory
        assert self.mm.storage_memory_used == self.provider.metrics.memory_used_bytes

    def teardown(self) -> None:
        self.provider.close()
        shutil.rmtree(self.directory, ignore_errors=True)


StateStoreMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=60, deadline=None
)
TestStateStoreMachine = StateStoreMachine.TestCase

"""StateStoreProvider and StateStore: versions, commits, errors of Spark §5.3/§5.4, metrics."""

from __future__ import annotations

import math
import os
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg.errors import CorruptFileError
from extagg.state import (
    StateFileNotFoundError,
    StateStoreCommitError,
    StateStoreConf,
    StateStoreError,
    StateStoreProvider,
    UnexpectedVersionError,
)
from extagg.state.codec import encode_key, encode_value
from extagg.state.files import StateFileReader

from .conftest import commit_version, state_files, temp_files


def encoded_size(mapping: dict) -> int:
    return sum(len(encode_key(k)) + len(encode_value(v)) for k, v in mapping.items())


def test_put_get_remove_commit_and_reload(provider, operator, conf, mm):
    store = provider.get_store(0)
    assert store.version == 0 and len(store) == 0
    store.put("a", 1)
    store.put(("k", 2), [1, 2])
    store.put("a", 2)
    store.remove("missing")
    assert store.get("a") == 2 and store.get("zz") is None and store.get("zz", 5) == 5
    assert "a" in store and len(store) == 2
    assert store.commit() == 1
    assert store.has_committed
    assert commit_version(provider, 1, {"b": 3.5}, removes=["a"]) == 2
    fresh = operator.provider(0, conf=conf, memory_manager=mm)
    assert dict(fresh.get_read_store(1).items()) == {"a": 2, ("k", 2): [1, 2]}
    assert dict(fresh.get_read_store(2).items()) == {("k", 2): [1, 2], "b": 3.5}
    assert fresh.metrics.loaded_map_cache_miss_count == 2
    fresh.close()


def test_negative_version_is_rejected(provider):
    for call in (provider.get_store, provider.get_read_store):
        with pytest.raises(UnexpectedVersionError, match="Version cannot be less than 0") as info:
            call(-1)
        assert info.value.error_class == "CANNOT_LOAD_STATE_STORE.UNEXPECTED_VERSION"
    with pytest.raises(UnexpectedVersionError):
        provider.merge_update(-1, [], lambda a, b: a)
    with pytest.raises(TypeError, match="version must be an int"):
        provider.get_store("1")


def test_unknown_version_names_the_missing_file(provider):
    commit_version(provider, 0, {"a": 1})
    with pytest.raises(StateFileNotFoundError) as info:
        provider.get_store(3)
    expected = os.path.join(provider.directory, "3.delta")
    assert info.value.path == expected
    assert f"Error reading delta file {expected}" in str(info.value)
    assert f"{expected} does not exist" in str(info.value)
    assert "latest version is 1" in str(info.value)
    assert info.value.error_class == "CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS"


def test_a_missing_delta_in_the_chain_is_named(provider, operator, conf, mm):
    for version in range(3):
        commit_version(provider, version, {version: version})
    os.unlink(os.path.join(provider.directory, "2.delta"))
    fresh = operator.provider(0, conf=conf, memory_manager=mm)
    with pytest.raises(StateFileNotFoundError, match=r"2\.delta does not exist"):
        fresh.get_store(3)
    fresh.close()


def test_corrupt_delta_raises_corrupt_file_error(provider, operator, conf, mm):
    commit_version(provider, 0, {"a": 1})
    commit_version(provider, 1, {"b": 2})
    path = os.path.join(provider.directory, "2.delta")
    with open(path, "r+b") as handle:
        handle.seek(30)
        byte = handle.read(1)
        handle.seek(30)
        handle.write(bytes([byte[0] ^ 0xFF]))
    fresh = operator.provider(0, conf=conf, memory_manager=mm)
    with pytest.raises(CorruptFileError) as info:
        fresh.get_store(2)
    assert info.value.path == path
    assert repr(fresh) in str(info.value)
    assert dict(fresh.get_store(1).items()) == {"a": 1}
    fresh.close()


def test_spark_state_errors(provider):
    store = provider.get_store(0)
    with pytest.raises(ValueError, match="Cannot put a null value"):
        store.put("a", None)
    store.put("a", 1)
    store.commit()
    with pytest.raises(StateStoreError, match="Cannot put after already committed or aborted"):
        store.put("b", 1)
    with pytest.raises(StateStoreError, match="Cannot remove after already committed or aborted"):
        store.remove("a")
    with pytest.raises(StateStoreError, match="Cannot commit after already committed or aborted"):
        store.commit()
    store.abort()  # a committed store stays committed
    assert store.has_committed
    aborted = provider.get_store(1)
    aborted.abort()
    with pytest.raises(StateStoreError, match="Cannot commit after already committed or aborted"):
        aborted.commit()
    read = provider.get_read_store(1)
    for action in (lambda: read.put("x", 1), lambda: read.remove("a"), read.commit):
        with pytest.raises(StateStoreError, match="read-only"):
            action()


def test_unsupported_keys_and_values_fail_at_put_naming_the_type(provider):
    store = provider.get_store(0)
    with pytest.raises(TypeError, match=r"builtins\.list"):
        store.put([1], 1)
    with pytest.raises(TypeError, match=r"builtins\.set.*allow_pickle"):
        store.put("a", {1})
    assert len(store) == 0
    store.abort()


def test_pickled_values_when_the_operator_allows_them(checkpoint, conf, mm):
    op = checkpoint.operator(1, name="sets", num_partitions=1, allow_pickle=True)
    provider = op.provider(0, conf=conf, memory_manager=mm)
    commit_version(provider, 0, {"a": {1, 2}, "b": {"x": 1}})
    fresh = op.provider(0, conf=conf, memory_manager=mm)
    assert dict(fresh.get_read_store(1).items()) == {"a": {1, 2}, "b": {"x": 1}}
    provider.close()
    fresh.close()


def test_nothing_is_written_before_commit_and_abort_leaves_nothing(provider):
    store = provider.get_store(0)
    store.put("a", 1)
    store.remove("a")
    store.put("b", 2)
    assert os.listdir(provider.directory) == []
    store.abort()
    assert os.listdir(provider.directory) == []
    with provider.get_store(0) as scoped:
        scoped.put("c", 3)
    assert os.listdir(provider.directory) == []  # leaving the block aborted it


def test_an_empty_commit_still_writes_a_delta(provider):
    assert provider.get_store(0).commit() == 1
    assert state_files(provider.directory) == ["1.delta"]
    assert list(StateFileReader(os.path.join(provider.directory, "1.delta"))) == []
    assert dict(provider.get_read_store(1).items()) == {}


def test_removing_a_key_added_in_the_same_batch_records_nothing(provider):
    commit_version(provider, 0, {"kept": 1})
    store = provider.get_store(1)
    store.put("new", 1)
    store.remove("new")
    store.remove("kept")
    store.commit()
    rows = list(StateFileReader(os.path.join(provider.directory, "2.delta")))
    assert rows == [(encode_key("kept"), None)]


def test_recommitting_a_version_replaces_it(provider, operator, conf, mm):
    commit_version(provider, 0, {"a": 1})
    commit_version(provider, 1, {"b": 1})
    commit_version(provider, 1, {"b": 2, "c": 3})  # the batch is retried
    assert temp_files(provider.directory) == []
    fresh = operator.provider(0, conf=conf, memory_manager=mm)
    assert dict(fresh.get_read_store(2).items()) == {"a": 1, "b": 2, "c": 3}
    fresh.close()


def test_recommitting_a_version_with_a_snapshot_replaces_the_snapshot(operator, mm):
    conf = StateStoreConf(min_deltas_for_snapshot=1)
    provider = operator.provider(0, conf=conf, memory_manager=mm)
    for version in range(3):
        commit_version(provider, version, {version: "old"})
    provider.do_maintenance()
    assert "3.snapshot" in state_files(provider.directory)
    commit_version(provider, 2, {2: "new"})
    fresh = operator.provider(0, conf=conf, memory_manager=mm)
    assert dict(fresh.get_read_store(3).items()) == {0: "old", 1: "old", 2: "new"}
    provider.close()
    fresh.close()


def test_a_failed_commit_keeps_the_previous_version_and_the_store_usable(provider, tmp_path):
    commit_version(provider, 0, {"a": 1})
    store = provider.get_store(1)
    store.put("b", 2)
    moved = tmp_path / "moved"
    shutil.move(provider.directory, moved)
    with open(provider.directory, "w") as blocker:  # the directory is now a file
        blocker.write("x")
    with pytest.raises(StateStoreCommitError, match="Error committing version 2") as info:
        store.commit()
    assert info.value.error_class == "CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT"
    os.unlink(provider.directory)
    shutil.move(moved, provider.directory)
    assert temp_files(provider.directory) == []
    assert state_files(provider.directory) == ["1.delta"]
    assert store.commit() == 2  # the store stayed updating: the retry succeeds
    assert dict(provider.get_read_store(2).items()) == {"a": 1, "b": 2}


def test_items_tolerate_changes_while_iterating(provider):
    commit_version(provider, 0, {i: i for i in range(10)})
    store = provider.get_store(1)
    seen = []
    for key, value in store.items():
        seen.append((key, value))
        store.remove((key + 1) % 10)
        store.put(key + 100, value)
    assert seen[0] == (0, 0)
    assert all(key < 10 for key, _ in seen)  # keys put during the iteration are not seen
    store.abort()


def test_values_handed_out_are_the_callers_own(provider):
    commit_version(provider, 0, {"list": [1, 2], "tuple": (1, [2])})
    store = provider.get_store(1)
    store.get("list").append(3)
    store.get("tuple")[1].append(3)
    assert store.get("list") == [1, 2] and store.get("tuple") == (1, [2])
    value = [9]
    store.put("mine", value)
    value.append(10)  # what was put is what is stored
    assert store.get("mine") == [9]
    store.commit()
    assert provider.get_read_store(1).get("list") == [1, 2]
    assert provider.get_read_store(2).get("mine") == [9]


def test_equal_keys_of_different_types_are_one_key(provider, operator, conf, mm):
    commit_version(provider, 0, {1: "int", 2.5: "float"})
    commit_version(provider, 1, [(1.0, "float-one"), (True, "bool-one")])
    commit_version(provider, 2, removes=[True])
    commit_version(provider, 3, {1.0: "back"})
    fresh = operator.provider(0, conf=conf, memory_manager=mm)
    for version, expected in [
        (2, {1: "bool-one", 2.5: "float"}),
        (3, {2.5: "float"}),
        (4, {1: "back", 2.5: "float"}),
    ]:
        assert dict(provider.get_read_store(version).items()) == expected
        assert dict(fresh.get_read_store(version).items()) == expected
        assert dict(fresh.iter_version(version)) == expected
    fresh.close()


def _typed(items) -> list:
    return sorted((repr(key), type(key).__name__, value) for key, value in items)


@pytest.mark.parametrize(
    ("stored", "ops"),
    [
        (True, [("remove", 1), ("put", 1, "b")]),  # the new key's bytes sort after the old's
        (1, [("remove", 1), ("put", True, "b")]),  # ... and before them
        (1.0, [("remove", 1), ("put", 1, "b"), ("remove", 1.0), ("put", True, "c")]),
        (True, [("put", 1, "x"), ("remove", 1), ("put", 1, "b")]),
        (True, [("remove", True), ("put", 1.0, "b"), ("remove", 1), ("put", True, "c")]),
        ((1, "t"), [("remove", (True, "t")), ("put", (1.0, "t"), "b")]),
    ],
)
def test_a_key_removed_and_put_again_in_one_batch_is_the_new_key(tmp_path, mm, stored, ops):
    """remove(1); put(1, "b") over a stored True kept the key object True: as in a dict, the
    key put after the remove is the key held, in memory, in the files and in the change feed."""
    from extagg.state import Checkpoint, read_change_feed, read_state

    checkpoint = Checkpoint(tmp_path / "cp")
    operator = checkpoint.operator(0, num_partitions=1)
    provider = operator.provider(0, memory_manager=mm)
    commit_version(provider, 0, {stored: "a", "other": 0})
    checkpoint.commit(0)
    replaying = operator.provider(0, memory_manager=mm)
    replaying.get_read_store(1)  # cached: version 2 is replayed from its delta onto it
    expected = {stored: "a", "other": 0}
    store = provider.get_store(1)
    for op, key, *value in ops:
        if op == "remove":
            store.remove(key)
            del expected[key]
        else:
            store.put(key, value[0])
            expected[key] = value[0]
    assert _typed(store.items()) == _typed(expected.items())
    store.commit()
    checkpoint.commit(1)
    fresh = operator.provider(0, memory_manager=mm)
    want = _typed(expected.items())
    assert _typed(provider.get_read_store(2).items()) == want  # the cached new version
    assert _typed(fresh.get_read_store(2).items()) == want  # merged from the files
    assert _typed(operator.provider(0, memory_manager=mm).iter_version(2)) == want
    assert _typed(replaying.get_read_store(2).items()) == want  # cached base + delta
    assert _typed((row.key, row.value) for row in read_state(checkpoint.path)) == want
    replayed = {stored: "a", "other": 0}
    for row in read_change_feed(checkpoint.path, 1, 1):
        if row.change_type == "delete":
            del replayed[row.key]
        else:
            replayed[row.key] = row.value
    assert _typed(replayed.items()) == want
    for p in (provider, replaying, fresh):
        p.close()


EQUAL_KEYS = [True, 1, 1.0, False, 0, 0.0, -0.0, (1, "t"), (True, "t"), (1.0, "t"), "s", math.nan]


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(
        st.lists(
            st.tuples(st.sampled_from(EQUAL_KEYS), st.one_of(st.none(), st.integers(0, 9))),
            max_size=8,
        ),
        min_size=1,
        max_size=3,
    )
)
def test_puts_and_removes_of_equal_keys_hold_what_a_dict_holds(tmp_path_factory, batches):
    """Any mix of puts and removes (None: remove) of equal keys of other types in a batch: every
    read path, the writing store's own before its commit included, holds the dict's keys,
    their types included, and its size."""
    from extagg.memory import UnifiedMemoryManager
    from extagg.state import Checkpoint, read_state

    mm = UnifiedMemoryManager("32m", wait_timeout=5)
    checkpoint = Checkpoint(tmp_path_factory.mktemp("cp"))
    operator = checkpoint.operator(0, num_partitions=1)
    provider = operator.provider(0, memory_manager=mm)
    expected: dict = {}
    for batch, ops in enumerate(batches):
        replaying = operator.provider(0, memory_manager=mm)
        replaying.get_read_store(batch)  # cached: the new version is replayed onto it
        store = provider.get_store(batch)
        for key, value in ops:
            if value is None:
                store.remove(key)
                expected.pop(key, None)
            else:
                store.put(key, value)
                expected[key] = value
        assert len(store) == len(expected)
        assert _typed(store.items()) == _typed(expected.items())  # the writer's own view
        store.commit()
        checkpoint.commit(batch)
        assert provider.metrics.num_keys == len(expected)
        want = _typed(expected.items())
        assert _typed(provider.get_read_store(batch + 1).items()) == want
        assert _typed(replaying.get_read_store(batch + 1).items()) == want
        fresh = operator.provider(0, memory_manager=mm)
        assert _typed(fresh.get_read_store(batch + 1).items()) == want
        assert _typed((r.key, r.value) for r in read_state(checkpoint.path)) == want
        replaying.close()
        fresh.close()
    provider.close()


def test_cache_keeps_at_most_max_versions_in_memory(operator, mm):
    provider = operator.provider(
        0, conf=StateStoreConf(max_versions_in_memory=2), memory_manager=mm
    )
    for version in range(5):
        commit_version(provider, version, {version: "x" * 100})
    assert provider.cached_versions == [4, 5]
    assert mm.storage_memory_used == provider.metrics.memory_used_bytes > 0
    provider.get_read_store(2)  # older than every cached version: not inserted (Spark's rule)
    assert provider.cached_versions == [4, 5]
    assert provider.metrics.loaded_map_cache_miss_count == 1
    provider.get_read_store(5)
    assert provider.metrics.loaded_map_cache_hit_count == 5  # 4 get_stores + this one
    provider.close()
    assert mm.storage_memory_used == 0
    with pytest.raises(StateStoreError, match="is closed"):
        provider.get_store(5)


def test_no_cache_when_max_versions_in_memory_is_zero(operator, mm):
    provider = operator.provider(
        0, conf=StateStoreConf(max_versions_in_memory=0), memory_manager=mm
    )
    for version in range(3):
        commit_version(provider, version, {version: version})
    assert provider.cached_versions == []
    assert mm.storage_memory_used == 0
    assert dict(provider.get_read_store(3).items()) == {0: 0, 1: 1, 2: 2}
    provider.close()


def test_execution_memory_evicts_cached_versions(operator):
    from extagg.memory import UnifiedMemoryManager

    mm = UnifiedMemoryManager(4 * 1024 * 1024, storage_fraction=0.1, wait_timeout=5)
    provider = operator.provider(0, conf=StateStoreConf(), memory_manager=mm)
    commit_version(provider, 0, {i: "v" * 50 for i in range(5000)})  # ~0.75 MB cached
    assert provider.cached_versions == [1]
    assert mm.storage_memory_used > mm.storage_region_size  # borrowed from execution
    wanted = mm.max_memory - mm.storage_region_size
    granted = mm.acquire_execution_memory(wanted, task_id="t")
    assert granted == wanted
    assert provider.cached_versions == []  # evicted to make room for execution
    assert provider.metrics.memory_used_bytes == 0
    assert len(provider.get_read_store(1)) == 5000  # rebuilt from the files
    assert provider.metrics.loaded_map_cache_miss_count == 1
    mm.release_execution_memory(granted, task_id="t")
    provider.close()


def test_fresh_providers_do_not_share_cached_blocks(provider, operator, conf, mm):
    commit_version(provider, 0, {"a": 1})
    fresh = operator.provider(0, conf=conf, memory_manager=mm)
    assert fresh.get_read_store(1).get("a") == 1
    assert fresh.metrics.loaded_map_cache_miss_count == 1
    fresh.close()


@pytest.mark.parametrize(
    "make_entry",
    [
        lambda i: (i * 1000, i * 7),
        lambda i: (f"user-{i:08d}", (i, float(i), f"name{i}")),
        lambda i: ((i, f"day{i % 31}"), [i, i + 1]),
    ],
    ids=["int-int", "str-tuple", "tuple-list"],
)
def test_cached_size_estimate_is_within_30_percent(make_entry):
    import tracemalloc

    from extagg.state.cache import estimate_map_size

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        mapping = dict(make_entry(i) for i in range(20_000))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    estimate = estimate_map_size(mapping)
    assert 0.7 * held <= estimate <= 1.3 * held, (estimate, held)


def test_metrics_count_keys_and_encoded_bytes(provider, operator, conf, mm):
    expected = {i: ("v", i) for i in range(50)}
    commit_version(provider, 0, expected)
    metrics = provider.metrics
    assert metrics.num_keys == 50
    assert metrics.state_on_current_version_size_bytes == encoded_size(expected)
    store = provider.get_store(1)
    for i in range(0, 50, 2):
        store.remove(i)
        expected.pop(i)
    store.put("new", [1, 2, 3])
    expected["new"] = [1, 2, 3]
    assert store.metrics.num_keys == len(expected)
    assert store.metrics.state_on_current_version_size_bytes == encoded_size(expected)
    store.commit()
    assert provider.metrics.num_keys == len(expected)
    assert provider.metrics.state_on_current_version_size_bytes == encoded_size(expected)
    fresh = operator.provider(0, conf=conf, memory_manager=mm)
    fresh.get_read_store(2)
    assert fresh.metrics.num_keys == len(expected)
    assert fresh.metrics.state_on_current_version_size_bytes == encoded_size(expected)
    assert fresh.metrics.memory_used_bytes > 0
    fresh.close()


def test_provider_on_a_plain_directory_and_repr(tmp_path, mm):
    with StateStoreProvider(tmp_path / "store", memory_manager=mm) as provider:
        commit_version(provider, 0, {"a": 1})
        assert "op=0,part=0,store=default" in repr(provider)
        assert "version=1" in repr(provider.get_read_store(1))
        assert provider.latest_version() == 1
    assert mm.storage_memory_used == 0
    with pytest.raises(TypeError, match="conf must be a StateStoreConf"):
        StateStoreProvider(tmp_path / "x", conf={"a": 1}, memory_manager=mm)


def test_conf_validation():
    with pytest.raises(ValueError, match="min_deltas_for_snapshot must be at least 1"):
        StateStoreConf(min_deltas_for_snapshot=0)
    with pytest.raises(ValueError, match="max_versions_in_memory must be at least 0"):
        StateStoreConf(max_versions_in_memory=-1)
    with pytest.raises(TypeError, match="min_versions_to_retain must be an int"):
        StateStoreConf(min_versions_to_retain="5")
    with pytest.raises(ValueError, match="compression must be one of"):
        StateStoreConf(compression="gzip")


def test_uncompressed_files(operator, mm):
    provider = operator.provider(0, conf=StateStoreConf(compression="none"), memory_manager=mm)
    commit_version(provider, 0, {"a": 1})
    reader = StateFileReader(os.path.join(provider.directory, "1.delta"))
    assert reader.compression == "none"
    reader.close()
    provider.close()


def test_undecodable_records_raise_corrupt_file_error(tmp_path, mm):
    from extagg.state.files import DELTA, StateFileWriter

    for name, value, message in [
        ("pickled", encode_value({1}, allow_pickle=True), "does not allow pickle"),
        ("unknown", b"\x1f", "unknown type tag 0x1f"),
    ]:
        directory = tmp_path / name
        directory.mkdir()
        writer = StateFileWriter(directory / "1.delta", DELTA)  # checksums are fine
        writer.write(encode_key("a"), value)
        writer.commit()
        with StateStoreProvider(directory, memory_manager=mm) as provider:
            with pytest.raises(CorruptFileError, match=message) as info:
                provider.get_store(1)
            assert info.value.path == str(directory / "1.delta")  # the file, not the dir
            with pytest.raises(CorruptFileError, match=message) as info:
                dict(provider.iter_version(1))
            assert info.value.path == str(directory / "1.delta")

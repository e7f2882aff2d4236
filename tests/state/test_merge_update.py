"""merge_update, the streaming path: equal to the in-memory path, byte for byte."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extagg import Aggregator, ExternalAppendOnlyMap
from extagg.hashing import stable_hash
from extagg.memory import UnifiedMemoryManager
from extagg.state import StateStoreConf, StateStoreProvider
from extagg.state.codec import encode_key, encode_value
from extagg.state.files import DELTA, SNAPSHOT, StateFileReader, StateFileWriter
from extagg.state.streams import merge_records, open_version

from ..conftest import files_under
from .conftest import state_files, temp_files

KEYS = st.one_of(
    st.integers(-50, 50),
    st.text(max_size=3),
    st.tuples(st.integers(0, 3), st.text(max_size=2)),
    st.sampled_from([None, True, False, 1.0, 0.0, -0.0, 2.5, b"x"]),
)
BATCH = st.tuples(
    st.dictionaries(KEYS, st.integers(-100, 100), max_size=12),
    st.lists(KEYS, max_size=4),
)


def add(old, new):
    return old + new


def hash_ordered(pairs: dict) -> list:
    return sorted(pairs.items(), key=lambda kv: (stable_hash(kv[0]), encode_key(kv[0])))


def in_memory_update(provider: StateStoreProvider, version: int, pairs) -> int:
    store = provider.get_store(version)
    for key, combiner in pairs:
        old = store.get(key)
        store.put(key, combiner if old is None else add(old, combiner))
    return store.commit()


def apply_history(provider: StateStoreProvider, history) -> int:
    version = 0
    for puts, removes in history:
        store = provider.get_store(version)
        for key, value in puts.items():
            store.put(key, value)
        for key in removes:
            store.remove(key)
        version = store.commit()
    return version


def read_bytes(path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


@given(
    history=st.lists(BATCH, max_size=6), update=st.dictionaries(KEYS, st.integers(), max_size=15)
)
def test_merge_update_writes_what_the_in_memory_path_writes(tmp_path_factory, history, update):
    root = tmp_path_factory.mktemp("merge")
    mm = UnifiedMemoryManager("32m", wait_timeout=5)
    conf = StateStoreConf(min_deltas_for_snapshot=2)
    streaming = StateStoreProvider(root / "streaming", conf=conf, memory_manager=mm)
    in_memory = StateStoreProvider(root / "in_memory", conf=conf, memory_manager=mm)
    try:
        version = apply_history(streaming, history)
        apply_history(in_memory, history)
        for name in state_files(streaming.directory):  # same input: identical files
            assert read_bytes(streaming._path(int(name.split(".")[0]), DELTA)) == read_bytes(
                in_memory._path(int(name.split(".")[0]), DELTA)
            )
        pairs = hash_ordered(update)
        assert streaming.merge_update(version, iter(pairs), add) == version + 1
        assert in_memory_update(in_memory, version, pairs) == version + 1
        in_memory.do_maintenance()
        new = version + 1
        assert read_bytes(streaming._path(new, DELTA)) == read_bytes(in_memory._path(new, DELTA))
        snapshot = streaming._path(new, SNAPSHOT)
        assert os.path.exists(snapshot) == os.path.exists(in_memory._path(new, SNAPSHOT))
        if os.path.exists(snapshot):
            assert read_bytes(snapshot) == read_bytes(in_memory._path(new, SNAPSHOT))
        expected = dict(in_memory.get_read_store(new).items())
        assert dict(streaming.iter_version(new)) == expected
        fresh = StateStoreProvider(root / "streaming", conf=conf, memory_manager=mm)
        assert dict(fresh.get_read_store(new).items()) == expected
        assert streaming.metrics.num_keys == len(expected)
        assert streaming.metrics.state_on_current_version_size_bytes == sum(
            len(encode_key(k)) + len(encode_value(v)) for k, v in expected.items()
        )
        fresh.close()
    finally:
        streaming.close()
        in_memory.close()


@pytest.mark.parametrize("force_spill_every", [None, 7, 50])
def test_merge_update_from_an_external_map_with_forced_spills(tmp_path, force_spill_every):
    rng = random.Random(force_spill_every or 0)
    mm = UnifiedMemoryManager("64m", wait_timeout=5)
    conf = StateStoreConf(min_deltas_for_snapshot=2)
    provider = StateStoreProvider(tmp_path / "store", conf=conf, memory_manager=mm)
    counts = Aggregator(lambda v: v, lambda c, v: c + v, lambda a, b: a + b)
    expected: dict = {}
    version = 0
    for _batch in range(5):
        records = [
            (rng.choice([rng.randrange(300), f"k{rng.randrange(50)}"]), 1) for _ in range(700)
        ]
        for key, value in records:
            expected[key] = expected.get(key, 0) + value
        with ExternalAppendOnlyMap(
            counts, memory_manager=mm, force_spill_every=force_spill_every
        ) as engine:
            engine.insert_all(records)
            if force_spill_every:
                assert engine.metrics.spill_count > 0 or len(engine.spill_files) > 0
            version = provider.merge_update(
                version, engine.iterator(ordered=True), counts.merge_combiners
            )
    assert dict(provider.iter_version(version)) == expected
    assert dict(provider.get_read_store(version).items()) == expected
    assert any(name.endswith(".snapshot") for name in state_files(provider.directory))
    provider.close()


def test_input_out_of_hash_order_is_rejected_and_nothing_is_written(provider):
    provider.merge_update(0, hash_ordered({"a": 1}), add)
    before = state_files(provider.directory)
    pairs = hash_ordered({i: i for i in range(10)})
    with pytest.raises(ValueError, match="not in key-hash order") as info:
        provider.merge_update(1, reversed(pairs), add)
    assert "ExternalAppendOnlyMap.iterator(ordered=True)" in str(info.value)
    assert state_files(provider.directory) == before
    assert temp_files(provider.directory) == []
    assert dict(provider.iter_version(1)) == {"a": 1}


def test_repeated_keys_and_bad_items_are_rejected(provider):
    with pytest.raises(ValueError, match="repeats key 1"):
        provider.merge_update(0, [(1, 1), (1, 2)], add)
    with pytest.raises(ValueError, match="repeats key True"):
        provider.merge_update(0, [(1, 1), (True, 2)], add)
    # two NaN objects are one stored key though not ==: the documented error, not the writer's
    # internal "strictly ascending order"
    for first, second in [(float("nan"), float("nan")), ((float("nan"), "x"), (float("nan"), "x"))]:
        with pytest.raises(ValueError, match=r"repeats key \(?nan"):
            provider.merge_update(0, [(first, 1), (second, 1)], add)
    with pytest.raises(TypeError, match=r"\(key, combiner\) pairs; item 0"):
        provider.merge_update(0, [1], add)
    with pytest.raises(TypeError, match=r"cannot hash a key of type builtins\.list"):
        provider.merge_update(0, [([1], 1)], add)
    with pytest.raises(TypeError, match=r"cannot store the combiner of key 'k'.*builtins\.set"):
        provider.merge_update(0, [("k", {1})], add)
    with pytest.raises(TypeError, match="merge_combiners must be callable"):
        provider.merge_update(0, [], None)
    assert os.listdir(provider.directory) == []


def test_a_none_value_is_refused_as_put_refuses_it(provider):
    # the codec can encode None, but a stored None reads as an absent key (get(k, default)
    # gives None, diff and remove lose it): Spark's and StateStore.put's "Cannot put a null value"
    with pytest.raises(ValueError, match="Cannot put a null value") as put_error:
        provider.get_store(0).put("k", None)
    pairs = hash_ordered({i: i for i in range(20_000)})  # past the writer's buffer: a temp file
    pairs[-1] = (pairs[-1][0], None)
    with pytest.raises(ValueError, match="Cannot put a null value") as info:
        provider.merge_update(0, pairs, add)
    assert f"(key {pairs[-1][0]!r}) into StateStoreProvider[" in str(info.value)
    assert type(info.value) is type(put_error.value)
    assert os.listdir(provider.directory) == []
    provider.merge_update(0, hash_ordered({"a": 1, "b": 2}), add)
    with pytest.raises(ValueError, match=r"Cannot put a null value \(key 'a'\)"):
        provider.merge_update(1, hash_ordered({"a": 5}), lambda old, new: None)
    assert state_files(provider.directory) == ["1.delta"]
    assert temp_files(provider.directory) == []
    assert dict(provider.iter_version(1)) == {"a": 1, "b": 2}


def test_a_failing_merge_function_writes_nothing(provider):
    provider.merge_update(0, hash_ordered({i: i for i in range(100)}), add)

    def broken(old, new):
        raise RuntimeError("user code failed")

    with pytest.raises(RuntimeError, match="user code failed"):
        provider.merge_update(1, hash_ordered({5: 1}), broken)
    assert state_files(provider.directory) == ["1.delta"]
    assert temp_files(provider.directory) == []


def test_merge_update_writes_a_snapshot_when_due_and_replaces_a_stale_one(operator, mm):
    provider = operator.provider(
        0, conf=StateStoreConf(min_deltas_for_snapshot=2), memory_manager=mm
    )
    for version in range(3):
        provider.merge_update(version, [(version, 1)], add)
    assert state_files(provider.directory) == ["1.delta", "2.delta", "3.delta", "3.snapshot"]
    for version in range(3):  # retried batches: the same versions again, other data
        provider.merge_update(version, [(version, 10)], add)
    snapshot = list(StateFileReader(provider._path(3, SNAPSHOT)))
    assert snapshot == sorted((encode_key(v), encode_value(10)) for v in range(3))
    provider.close()


def test_merge_update_invalidates_a_cached_later_version(provider):
    store = provider.get_store(0)
    store.put("a", 1)
    store.commit()  # version 1 is cached
    provider.merge_update(0, [("a", 5)], add)  # version 1 rewritten
    assert provider.get_read_store(1).get("a") == 5


def test_merge_update_merges_many_files_in_passes(tmp_path, monkeypatch, mm):
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv("EXTAGG_SPILL_DIR", str(spill))
    conf = StateStoreConf(min_deltas_for_snapshot=100, fan_in=2)
    provider = StateStoreProvider(tmp_path / "store", conf=conf, memory_manager=mm)
    expected: dict = {}
    for version in range(7):
        pairs = {version * 3 + i: 1 for i in range(5)}
        for key, value in pairs.items():
            expected[key] = expected.get(key, 0) + value
        provider.merge_update(version, hash_ordered(pairs), add)
    assert dict(provider.iter_version(7)) == expected
    assert dict(provider.get_read_store(7).items()) == expected
    assert files_under(spill) == []  # the pass files were removed
    provider.close()


def test_open_version_removes_its_pass_files_when_abandoned(tmp_path, monkeypatch):
    spill = tmp_path / "spill"
    monkeypatch.setenv("EXTAGG_SPILL_DIR", str(spill))
    paths = []
    for version in range(1, 6):
        path = tmp_path / f"{version}.delta"
        writer = StateFileWriter(path, DELTA)
        writer.write(encode_key(version), encode_value(version))
        writer.commit()
        paths.append(str(path))
    stream = open_version(paths, "test", fan_in=2)
    next(stream)
    assert len(files_under(spill)) == 1  # the last pass's merged file
    stream.close()
    assert files_under(spill) == []


def fake_key(prefix: bytes, key) -> bytes:
    """An encoded key with a chosen hash prefix: real 64-bit collisions are hard to find."""
    return prefix + encode_value(key)


def test_merge_records_resolves_colliding_hashes_by_key_equality():
    prefix = b"\x00" * 7 + b"\x01"
    a, b, c = fake_key(prefix, "a"), fake_key(prefix, "b"), fake_key(prefix, 1)
    one_float = fake_key(prefix, 1.0)
    base = sorted([(a, b"A0"), (b, b"B0"), (c, b"C0")])
    newer = sorted([(b, None), (one_float, b"C1")])  # delete b; update 1 through 1.0
    newest = sorted([(b, b"B2")])  # b comes back
    merged = list(merge_records([base, newer, newest]))
    assert merged == sorted([(a, b"A0"), (b, b"B2"), (c, b"C1")])  # 1 keeps its first bytes
    deleted_then_new = list(merge_records([[(c, b"C0")], [(c, None)], [(one_float, b"F")]]))
    assert deleted_then_new == [(one_float, b"F")]  # re-inserted: the new key object


def test_merge_update_matches_colliding_keys_by_equality(tmp_path, mm):
    provider = StateStoreProvider(tmp_path / "store", memory_manager=mm)
    provider.merge_update(0, hash_ordered({1: 10, 2.5: 1, "x": 1, 0.0: 1}), add)
    provider.merge_update(1, hash_ordered({1.0: 5, -0.0: 2, "y": 1}), add)
    provider.merge_update(2, hash_ordered({True: 1}), add)
    state = dict(provider.iter_version(3))
    assert state == {1: 16, 2.5: 1, "x": 1, 0: 3, "y": 1}
    kept = sorted((k, type(k).__name__) for k in state if k in (0, 1))
    assert kept == [(0.0, "float"), (1, "int")]  # the first stored key objects are kept
    assert [type(k) for k in provider.get_read_store(3) if k == 1] == [int]
    provider.close()


@pytest.mark.parametrize("force_spill_rows", [None, 300])
def test_merge_update_from_hash_aggregator_batches(tmp_path, force_spill_rows):
    import pyarrow as pa

    from extagg.columnar.hash_aggregator import HashAggregator
    from extagg.state import record_batch_pairs

    rng = random.Random(3)
    mm = UnifiedMemoryManager("64m", wait_timeout=5)
    provider = StateStoreProvider(tmp_path / "store", memory_manager=mm)
    expected: dict = {}
    version = 0
    for _batch in range(3):
        users = [rng.choice([None, *range(40)]) for _ in range(2000)]
        days = [rng.choice(["mon", "tue", None]) for _ in range(2000)]
        amounts = [rng.randrange(100) for _ in range(2000)]
        for key in zip(users, days):
            expected.setdefault(key, [0, 0])
        for user, day, amount in zip(users, days, amounts):
            expected[(user, day)][0] += amount
            expected[(user, day)][1] += 1
        table = pa.table({"user": pa.array(users, pa.int64()), "day": days, "amount": amounts})
        with HashAggregator(
            ["user", "day"],
            {"total": ("amount", "sum"), "n": ("amount", "count")},
            memory_manager=mm,
            force_spill_rows=force_spill_rows,
        ) as agg:
            agg.update(table)
            pairs = record_batch_pairs(agg.results(), ["user", "day"])
            version = provider.merge_update(
                version, pairs, lambda old, new: (old[0] + new[0], old[1] + new[1])
            )
    assert dict(provider.iter_version(version)) == {k: tuple(v) for k, v in expected.items()}
    provider.close()


def test_record_batch_pairs_shapes_and_errors():
    import datetime

    import pyarrow as pa

    from extagg.state import record_batch_pairs

    batch = pa.record_batch(
        {"k": [1, 2], "d": pa.array([datetime.date(1970, 1, 2), None]), "v": [5, 6], "w": [7, 8]}
    )
    assert list(record_batch_pairs([batch], "k", "v")) == [(1, 5), (2, 6)]
    assert list(record_batch_pairs([batch], ["k", "d"], ["v"])) == [((1, 1), 5), ((2, None), 6)]
    day = datetime.date(1970, 1, 2)  # values stay Python objects; only keys become storage
    assert list(record_batch_pairs([batch], "k")) == [(1, (day, 5, 7)), (2, (None, 6, 8))]
    with pytest.raises(ValueError, match=r"no column\(s\) \['x'\]"):
        list(record_batch_pairs([batch], "x"))

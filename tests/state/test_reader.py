"""read_state, read_change_feed, read_metadata: results, streaming, every option error of §6."""

from __future__ import annotations

import logging
import os
import random
import shutil
import tracemalloc

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg.errors import CorruptFileError
from extagg.state import (
    Checkpoint,
    CommittedBatchUnavailableError,
    StateFileNotFoundError,
    StateSourceOptionError,
    StateStoreConf,
    StateStoreError,
    read_change_feed,
    read_metadata,
    read_state,
)
from extagg.state.reader import read_diff

from .conftest import commit_version


def build(checkpoint: Checkpoint, mm, batches: int = 4, seed: int = 1):
    """Operator 0 (2 partitions, stores default and 'other'), operator 1 (1 partition).

    Returns the states: {(operator, store, partition): [state after batch 0, 1, ...]}.
    """
    rng = random.Random(seed)
    conf = StateStoreConf(min_deltas_for_snapshot=1)
    op0 = checkpoint.operator(0, name="totals", num_partitions=2)
    op1 = checkpoint.operator(1, name="counts", num_partitions=1)
    targets = [(op0, "default", 0), (op0, "default", 1), (op0, "other", 0), (op1, "default", 0)]
    history: dict = {}
    providers = {t: t[0].provider(t[2], t[1], conf, memory_manager=mm) for t in targets}
    for batch in range(batches):
        for (op, store, partition), provider in providers.items():
            state = dict(history.get((op.operator_id, store, partition), [{}])[-1])
            puts = {rng.randrange(30): (batch, rng.randrange(100)) for _ in range(8)}
            removes = [rng.randrange(30) for _ in range(3)]
            commit_version(provider, batch, puts, removes)
            state.update(puts)
            for key in removes:
                state.pop(key, None)
            history.setdefault((op.operator_id, store, partition), []).append(state)
            provider.do_maintenance()
        checkpoint.commit(batch)
    for provider in providers.values():
        provider.close()
    return history


@pytest.fixture
def built(checkpoint, mm):
    return build(checkpoint, mm)


def rows_by_partition(rows) -> dict:
    out: dict = {}
    for row in rows:
        out.setdefault(row.partition_id, {})[row.key] = row.value
    return out


def test_read_state_defaults_to_the_last_committed_batch(checkpoint, built):
    rows = read_state(checkpoint.path)
    assert rows_by_partition(rows) == {
        0: built[(0, "default", 0)][-1],
        1: built[(0, "default", 1)][-1],
    }
    assert rows_by_partition(rows) == rows_by_partition(rows)  # re-iterable: reads again


def test_read_state_at_batches_operators_stores_and_partitions(checkpoint, built):
    for batch in range(4):
        got = rows_by_partition(read_state(checkpoint.path, batch_id=batch, store_name="other"))
        assert got == {0: built[(0, "other", 0)][batch]}
        got = rows_by_partition(read_state(checkpoint.path, batch, operator_id=1))
        assert got == {0: built[(1, "default", 0)][batch]}
        got = rows_by_partition(read_state(checkpoint.path, batch, partition_id=1))
        assert got == {1: built[(0, "default", 1)][batch]}


def test_rows_are_named_and_sorted_by_key_hash_within_a_partition(checkpoint, built):
    from extagg.hashing import stable_hash

    rows = list(read_state(checkpoint.path, partition_id=0))
    assert rows[0]._fields == ("key", "value", "partition_id")
    hashes = [stable_hash(row.key) for row in rows]
    assert hashes == sorted(hashes)


def test_read_state_from_a_snapshot(checkpoint, built):
    directory = os.path.join(checkpoint.state_dir, "0", "1")
    snapshots = sorted(int(n.split(".")[0]) for n in os.listdir(directory) if "snapshot" in n)
    assert snapshots  # maintenance wrote some (min_deltas_for_snapshot=1)
    start = snapshots[0] - 1
    got = read_state(checkpoint.path, batch_id=3, partition_id=1, snapshot_start_batch_id=start)
    assert rows_by_partition(got) == {1: built[(0, "default", 1)][3]}
    with pytest.raises(StateFileNotFoundError, match=r"0\.snapshot|1\.snapshot") as info:
        read_state(checkpoint.path, batch_id=3, partition_id=1, snapshot_start_batch_id=0)
    assert info.value.error_class.endswith("SNAPSHOT_FILE_NOT_EXISTS")


def test_to_arrow_and_batches(checkpoint, built):
    table = read_state(checkpoint.path).to_arrow()
    assert table.column_names == ["key", "value", "partition_id"]
    assert table.schema.field("partition_id").type == pa.int32()
    assert pa.types.is_struct(table.schema.field("value").type)  # tuple values: structs
    assert table.num_rows == sum(len(built[(0, "default", p)][-1]) for p in (0, 1))
    batches = list(read_state(checkpoint.path).iter_batches(batch_rows=5))
    assert sum(b.num_rows for b in batches) == table.num_rows
    assert max(b.num_rows for b in batches) == 5
    changes = read_change_feed(checkpoint.path, 0).to_arrow()
    assert changes.schema.field("batch_id").type == pa.int64()
    assert set(changes.column("change_type").to_pylist()) <= {"update", "delete"}
    empty = read_change_feed(checkpoint.path, 0, 0, partition_id=1)
    assert empty.to_arrow().num_rows == len(empty.to_list())


def test_change_feed_rows_are_the_differences_between_versions(checkpoint, built):
    for (operator_id, store, partition), states in built.items():
        rows = [
            row
            for row in read_change_feed(
                checkpoint.path, 0, operator_id=operator_id, store_name=store
            )
            if row.partition_id == partition
        ]
        for batch, after in enumerate(states):
            before = states[batch - 1] if batch else {}
            changes = [row for row in rows if row.batch_id == batch]
            rebuilt = dict(before)
            for row in changes:
                if row.change_type == "delete":
                    assert row.key in before and row.value is None
                    del rebuilt[row.key]
                else:
                    assert row.change_type == "update"
                    rebuilt[row.key] = row.value
            assert rebuilt == after
            changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
            assert changed <= {row.key for row in changes}


def test_diff_compares_the_stored_bytes_not_python_equality(checkpoint, mm):
    # == says NaN != NaN (an untouched NaN looked changed) and 1 == 1.0 (a real change of
    # the stored value looked like none): the diff compares the canonical encodings instead
    operator = checkpoint.operator(0, name="t", num_partitions=1)
    provider = operator.provider(0, memory_manager=mm)
    commit_version(provider, 0, {"nan": float("nan"), "n": 1, "b": 1, "t": (1, float("nan"))})
    checkpoint.commit(0)
    commit_version(provider, 1, {"n": 1.0, "b": True})  # equal under ==, other bytes
    checkpoint.commit(1)
    for batch in (0, 1):
        assert list(read_diff(checkpoint.path, batch, batch)) == []
    rows = sorted(tuple(row) for row in read_diff(checkpoint.path, 0, 1))
    assert rows == [("changed", "b", 1, True, 0), ("changed", "n", 1, 1.0, 0)]
    assert [type(row[3]) for row in rows] == [bool, float]
    provider.close()


@settings(max_examples=25)
@given(seed=st.integers(0, 10_000), batches=st.integers(1, 6))
def test_change_feed_replays_to_every_version(tmp_path_factory, seed, batches):
    from extagg.memory import UnifiedMemoryManager

    checkpoint = Checkpoint(tmp_path_factory.mktemp("cp"))
    built = build(checkpoint, UnifiedMemoryManager("32m", wait_timeout=5), batches, seed)
    for start in range(batches):
        state = dict(built[(0, "default", 0)][start - 1]) if start else {}
        for row in read_change_feed(checkpoint.path, start, partition_id=0):
            if row.change_type == "delete":
                del state[row.key]
            else:
                state[row.key] = row.value
        assert state == built[(0, "default", 0)][-1]


def test_change_feed_range_and_missing_delta(checkpoint, built):
    rows = list(read_change_feed(checkpoint.path, 1, 2))
    assert {row.batch_id for row in rows} == {1, 2}
    os.unlink(os.path.join(checkpoint.state_dir, "0", "1", "2.delta"))
    with pytest.raises(StateFileNotFoundError, match="CANNOT_READ_STREAMING_STATE_FILE") as info:
        read_change_feed(checkpoint.path, 0)
    assert info.value.path.endswith(os.path.join("0", "1", "2.delta"))
    assert "does not exist" in str(info.value)


def test_read_metadata(checkpoint, built):
    rows = read_metadata(checkpoint.path).to_list()
    assert [tuple(row) for row in rows] == [
        (0, "totals", "default", 2, 0, 3),
        (0, "totals", "other", 2, 0, 3),
        (1, "counts", "default", 1, 0, 3),
    ]
    table = read_metadata(checkpoint.path).to_arrow()
    assert table.column_names == [
        "operator_id",
        "operator_name",
        "store_name",
        "num_partitions",
        "min_batch_id",
        "max_batch_id",
    ]


def test_read_metadata_without_commits_and_with_broken_metadata(checkpoint, mm, caplog):
    op = checkpoint.operator(0, name="x", num_partitions=1)
    commit_version(op.provider(0, memory_manager=mm), 0, {"a": 1})
    assert [tuple(r) for r in read_metadata(checkpoint.path)] == [(0, "x", "default", 1, -1, -1)]
    os.makedirs(os.path.join(checkpoint.state_dir, "2", "0"))
    with open(os.path.join(checkpoint.state_dir, "2", "0", "1.delta"), "wb"):
        pass
    os.makedirs(os.path.join(checkpoint.state_dir, "3", "_metadata"))
    with open(checkpoint.metadata_path(3), "w") as handle:
        handle.write("{not json")
    with caplog.at_level(logging.WARNING):
        rows = [tuple(r) for r in read_metadata(checkpoint.path)]
    assert rows == [(0, "x", "default", 1, -1, -1), (2, "", "default", 1, -1, -1)]
    assert "has no metadata file" in caplog.text
    assert "Skipping operator 3" in caplog.text


def test_reading_streams_the_state(checkpoint, mm):
    from extagg.hashing import stable_hash

    op = checkpoint.operator(0, name="big", num_partitions=1)
    provider = op.provider(0, memory_manager=mm)
    padding = "p" * 200
    provider.merge_update(
        0, ((i, (i, padding)) for i in sorted(range(30_000), key=stable_hash)), lambda a, b: b
    )
    provider.close()
    checkpoint.commit(0)
    tracemalloc.start()
    try:
        count = sum(1 for _row in read_state(checkpoint.path))
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 30_000
    assert peak < 3 * 1024 * 1024  # the state as a dict takes ~12 MB


# ------------------------------------------------------------------------------ option errors
@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"batch_id": -1}, "batch_id"),
        ({"operator_id": -1}, "operator_id"),
        ({"partition_id": -2}, "partition_id"),
        ({"snapshot_start_batch_id": -1, "partition_id": 0}, "snapshot_start_batch_id"),
    ],
)
def test_negative_ids_are_rejected(checkpoint, built, kwargs, option):
    with pytest.raises(StateSourceOptionError) as info:
        read_state(checkpoint.path, **kwargs)
    assert info.value.option == option
    assert info.value.error_class == "STDS_INVALID_OPTION_VALUE.IS_NEGATIVE"
    assert f"Invalid value for source option '{option}': cannot be negative." in str(info.value)


def test_change_feed_option_errors(checkpoint, built):
    with pytest.raises(StateSourceOptionError, match="'start_batch_id': cannot be negative"):
        read_change_feed(checkpoint.path, -1)
    with pytest.raises(StateSourceOptionError, match="'end_batch_id': cannot be negative"):
        read_change_feed(checkpoint.path, 0, -1)
    with pytest.raises(StateSourceOptionError, match="must be specified") as info:
        read_change_feed(checkpoint.path, None)
    assert info.value.option == "start_batch_id"
    with pytest.raises(StateSourceOptionError) as info:
        read_change_feed(checkpoint.path, 3, 1)
    assert info.value.option == "end_batch_id"
    assert "'end_batch_id' (1) cannot be smaller than 'start_batch_id' (3)" in str(info.value)


def test_other_option_errors(checkpoint, built):
    with pytest.raises(StateSourceOptionError, match="'store_name': cannot be empty") as info:
        read_state(checkpoint.path, store_name="  ")
    assert info.value.error_class == "STDS_INVALID_OPTION_VALUE.IS_EMPTY"
    with pytest.raises(StateSourceOptionError, match="'partition_id' must be specified") as info:
        read_state(checkpoint.path, snapshot_start_batch_id=1)
    assert info.value.error_class == "STDS_REQUIRED_OPTION_UNSPECIFIED"
    with pytest.raises(StateSourceOptionError, match="less than or equal to 'batch_id' \\(1\\)"):
        read_state(checkpoint.path, batch_id=1, partition_id=0, snapshot_start_batch_id=2)
    with pytest.raises(StateSourceOptionError, match="operator 7 does not exist") as info:
        read_state(checkpoint.path, operator_id=7)
    assert info.value.option == "operator_id"
    with pytest.raises(StateSourceOptionError, match="store 'nope' does not exist") as info:
        read_state(checkpoint.path, store_name="nope")
    assert info.value.option == "store_name"
    with pytest.raises(StateSourceOptionError, match="partition 2 does not exist") as info:
        read_state(checkpoint.path, partition_id=2)
    assert info.value.option == "partition_id"
    with pytest.raises(TypeError, match="'batch_id' must be an int"):
        read_state(checkpoint.path, batch_id="1")
    # past the last commit: refused as Spark refuses it (its version may never have been
    # committed), not a missing file
    last = checkpoint.last_committed_batch()
    assert last is not None and last < 8
    with pytest.raises(CommittedBatchUnavailableError) as unavailable:
        read_state(checkpoint.path, batch_id=8)
    assert unavailable.value.error_class == "STDS_COMMITTED_BATCH_UNAVAILABLE"
    with pytest.raises(CommittedBatchUnavailableError):
        list(read_change_feed(checkpoint.path, 0, end_batch_id=last + 1))


def test_path_errors(tmp_path):
    with pytest.raises(StateSourceOptionError, match="'path' must be specified"):
        read_state("")
    with pytest.raises(StateSourceOptionError, match="does not exist") as info:
        read_state(tmp_path / "nowhere")
    assert info.value.option == "path"
    with pytest.raises(StateSourceOptionError):
        read_metadata(tmp_path / "nowhere")


def test_no_committed_batch(checkpoint, mm):
    op = checkpoint.operator(0, name="x", num_partitions=1)
    commit_version(op.provider(0, memory_manager=mm), 0, {"a": 1})
    for call in (lambda: read_state(checkpoint.path), lambda: read_change_feed(checkpoint.path, 0)):
        with pytest.raises(CommittedBatchUnavailableError, match="No committed batch found"):
            call()
    assert rows_by_partition(read_state(checkpoint.path, batch_id=0)) == {0: {"a": 1}}


def test_checkpoint_commit_requires_every_partition(checkpoint, mm):
    op = checkpoint.operator(0, name="x", num_partitions=3)
    commit_version(op.provider(0, memory_manager=mm), 0, {"a": 1})
    commit_version(op.provider(1, memory_manager=mm), 0, {"b": 1})
    checkpoint.commit(0)  # partition 2 never held state
    commit_version(op.provider(0, memory_manager=mm), 1, {"a": 2})
    with pytest.raises(StateStoreError, match="partition 1 of operator 0") as info:
        checkpoint.commit(1)
    assert "2.delta is missing" in str(info.value)
    assert checkpoint.committed_batches() == [0]
    with pytest.raises(ValueError, match="batch_id cannot be negative"):
        checkpoint.commit(-1)


def test_checkpoint_commit_checks_an_operator_whose_metadata_is_lost(checkpoint, mm, caplog):
    # the readers infer a lost _metadata from the partition folders; commit skipped such an
    # operator and accepted a batch no partition wrote, which read_state then failed on
    op = checkpoint.operator(0, name="x", num_partitions=1)
    commit_version(op.provider(0, memory_manager=mm), 0, {"a": 1})
    checkpoint.commit(0)
    shutil.rmtree(os.path.dirname(checkpoint.metadata_path(0)))
    assert [tuple(row) for row in read_state(checkpoint.path)] == [("a", 1, 0)]
    with (
        caplog.at_level(logging.WARNING, logger="extagg.state"),
        pytest.raises(StateStoreError, match="partition 0 of operator 0") as info,
    ):
        checkpoint.commit(1)
    assert "2.delta is missing" in str(info.value)
    assert checkpoint.committed_batches() == [0]
    assert any("no metadata file" in record.getMessage() for record in caplog.records)
    commit_version(op.provider(0, memory_manager=mm), 1, {"a": 2})
    checkpoint.commit(1)
    assert [tuple(row) for row in read_state(checkpoint.path)] == [("a", 2, 0)]


def test_a_partition_whose_files_are_lost_is_not_taken_for_one_without_state(checkpoint, mm):
    """Partition 2 never held state and reads as empty; partition 1's files gone (a bad copy)
    read as empty too, without a word, and the next batch could be committed."""
    op = checkpoint.operator(0, name="x", num_partitions=3)
    for partition in (0, 1):
        commit_version(op.provider(partition, memory_manager=mm), 0, {f"k{partition}": 1})
    checkpoint.commit(0)
    assert checkpoint.partitions_with_state(0, 0) == {0, 1}
    assert rows_by_partition(read_state(checkpoint.path)) == {0: {"k0": 1}, 1: {"k1": 1}}
    assert rows_by_partition(read_state(checkpoint.path, partition_id=2)) == {}
    shutil.rmtree(op.store_directory(1))
    lost = os.path.join(op.store_directory(1), "1.delta")
    for read in (
        lambda: read_state(checkpoint.path),
        lambda: read_state(checkpoint.path, partition_id=1),
        lambda: read_change_feed(checkpoint.path, 0),
    ):
        with pytest.raises(StateFileNotFoundError, match="held state when batch 0") as info:
            read()
        assert info.value.path == lost
    commit_version(op.provider(0, memory_manager=mm), 1, {"k0": 2})
    with pytest.raises(StateStoreError, match=r"partition 1 of .* held state at batch 0"):
        checkpoint.commit(1)
    assert checkpoint.committed_batches() == [0]


def test_operator_metadata_is_validated(checkpoint, mm):
    checkpoint.operator(0, name="x", num_partitions=3)
    with pytest.raises(ValueError, match=r"number of partitions 4 \(recorded 3\)"):
        checkpoint.operator(0, num_partitions=4)
    with pytest.raises(ValueError, match=r"operator name 'y' \(recorded 'x'\)"):
        checkpoint.operator(0, name="y")
    with pytest.raises(ValueError, match="allow_pickle=True"):
        checkpoint.operator(0, allow_pickle=True)
    with pytest.raises(ValueError, match="pass num_partitions"):
        checkpoint.operator(1)
    op = checkpoint.operator(0)
    with pytest.raises(ValueError, match="partition_id 3 is out of range"):
        op.provider(3, memory_manager=mm)
    for bad in ("", " a", "a/b", ".x", "_x", "12"):
        with pytest.raises(ValueError):
            op.provider(0, bad, memory_manager=mm)
    op.provider(0, "left-keyToNumValues", memory_manager=mm).close()
    assert checkpoint.operator(0).metadata.store_names == ("default", "left-keyToNumValues")


def test_a_delta_copied_from_another_partition_is_corrupt_there(checkpoint, mm):
    """A delta in another store's folder (a restore that copied partition 1's ``2.delta`` over
    partition 0's) was read as partition 0's changes: its keys appeared in partition 0, and
    partition 1's keys in both. Its header names its store: every reader (the provider, the
    state and the change feed) now raises ``CorruptFileError`` naming the file and both stores."""
    op = checkpoint.operator(0, name="x", num_partitions=2)
    for batch in range(2):
        for partition in range(2):
            commit_version(
                op.provider(partition, memory_manager=mm), batch, {f"k{partition}": batch}
            )
        checkpoint.commit(batch)
    assert rows_by_partition(read_state(checkpoint.path)) == {0: {"k0": 1}, 1: {"k1": 1}}
    target = os.path.join(op.store_directory(0, "default"), "2.delta")
    shutil.copyfile(os.path.join(op.store_directory(1, "default"), "2.delta"), target)
    calls = {
        "provider": lambda: op.provider(0, memory_manager=mm).get_read_store(2),
        "read_state": lambda: list(read_state(checkpoint.path)),
        "change feed": lambda: list(read_change_feed(checkpoint.path, 1, partition_id=0)),
    }
    for name, call in calls.items():
        with pytest.raises(CorruptFileError, match="another partition") as info:
            call()
        assert info.value.path == target, name
        assert "(op=0,part=1,store=default), not (op=0,part=0,store=default)" in str(info.value)
    # partition 1 reads its own file as before
    assert rows_by_partition(read_state(checkpoint.path, partition_id=1)) == {1: {"k1": 1}}

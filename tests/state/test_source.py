"""read_state_source: Spark's statestore options, their rules and conflicts (§6)."""

from __future__ import annotations

import pytest

from extagg.state import (
    StateSourceConflictError,
    StateSourceOptionError,
    read_change_feed,
    read_state,
    read_state_source,
)

from .conftest import commit_version


@pytest.fixture
def path(checkpoint, mm):
    op = checkpoint.operator(0, name="totals", num_partitions=1)
    provider = op.provider(0, memory_manager=mm)
    for batch in range(3):
        commit_version(provider, batch, {batch: batch, "all": batch})
        provider.do_maintenance()
        checkpoint.commit(batch)
    provider.close()
    return checkpoint.path


def test_options_map_to_the_readers(path):
    assert read_state_source(path).to_list() == read_state(path).to_list()
    assert (
        read_state_source(path, {"BATCHID": "1", "operatorId": 0, "storename": "default"}).to_list()
        == read_state(path, 1).to_list()
    )
    changes = read_state_source(
        path, readChangeFeed="true", changeStartBatchId="1", changeEndBatchId=2
    )
    assert changes.to_list() == read_change_feed(path, 1, 2).to_list()
    assert read_state_source(options={"path": path}).to_list() == read_state(path).to_list()


def test_snapshot_options_come_together(path):
    with pytest.raises(StateSourceOptionError, match="'snapshotPartitionId' must be specified"):
        read_state_source(path, snapshotStartBatchId=0)
    with pytest.raises(StateSourceOptionError, match="'snapshotStartBatchId' must be specified"):
        read_state_source(path, snapshotPartitionId=0)
    with pytest.raises(StateSourceOptionError, match="less than or equal to 'batchId'"):
        read_state_source(path, batchId=0, snapshotStartBatchId=1, snapshotPartitionId=0)


@pytest.mark.parametrize(
    ("options", "names"),
    [
        (
            {"readChangeFeed": True, "changeStartBatchId": 0, "batchId": 1},
            ("readChangeFeed", "batchId"),
        ),
        (
            {"readChangeFeed": "true", "changeStartBatchId": 0, "snapshotStartBatchId": 0},
            ("readChangeFeed", "snapshotStartBatchId"),
        ),
        (
            {"readChangeFeed": True, "changeStartBatchId": 0, "joinSide": "left"},
            ("readChangeFeed", "joinSide"),
        ),
        ({"joinSide": "right", "storeName": "other"}, ("joinSide", "storeName")),
    ],
)
def test_conflicting_options(path, options, names):
    with pytest.raises(StateSourceConflictError) as info:
        read_state_source(path, options)
    assert info.value.error_class == "STDS_CONFLICT_OPTIONS"
    assert info.value.options == names
    for name in names:
        assert f"'{name}'" in str(info.value)


def test_change_feed_options(path):
    with pytest.raises(StateSourceOptionError, match="'changeStartBatchId' must be specified"):
        read_state_source(path, readChangeFeed=True)
    for name in ("changeStartBatchId", "changeEndBatchId"):
        with pytest.raises(
            StateSourceOptionError,
            match="Only specify this option when readChangeFeed is set to true",
        ) as info:
            read_state_source(path, {name: 0})
        assert info.value.option == name
    with pytest.raises(StateSourceOptionError, match="cannot be smaller than") as info:
        read_state_source(path, readChangeFeed=True, changeStartBatchId=2, changeEndBatchId=1)
    assert info.value.option == "changeEndBatchId"
    with pytest.raises(StateSourceOptionError, match="must be 'true' or 'false'"):
        read_state_source(path, readChangeFeed="yes")


@pytest.mark.parametrize(
    ("options", "option", "message"),
    [
        ({"batchId": "-1"}, "batchId", "cannot be negative"),
        ({"operatorId": -3}, "operatorId", "cannot be negative"),
        ({"batchId": "one"}, "batchId", "must be an integer"),
        ({"storeName": " "}, "storeName", "cannot be empty"),
        ({"joinSide": "middle"}, "joinSide", "must be 'left', 'right' or 'none'"),
        ({"joinSide": "left"}, "joinSide", "no stream-stream join state"),
        ({"stateVarName": "x"}, "stateVarName", "transformWithState"),
        ({"bachId": 1}, "bachId", "unknown option"),
        ({"batchId": 1, "BATCHID": 1}, "batchId", "more than once"),
    ],
)
def test_invalid_options_name_the_option(path, options, option, message):
    with pytest.raises(StateSourceOptionError, match=message) as info:
        read_state_source(path, options)
    assert info.value.option == option


def test_path_is_required(path):
    with pytest.raises(StateSourceOptionError, match="'path' must be specified"):
        read_state_source()
    with pytest.raises(StateSourceConflictError):
        read_state_source(path, {"path": path})

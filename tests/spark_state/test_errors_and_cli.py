"""Bad Spark checkpoints are refused by name (file, offset, what is supported), and the
``python -m extagg state`` commands work on Spark checkpoints in every format."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from extagg.cli import main as cli_main
from extagg.errors import CorruptFileError
from extagg.state import read_change_feed as generic_changes
from extagg.state import read_state as generic_read_state
from extagg.state.errors import CommittedBatchUnavailableError, StateFileNotFoundError
from extagg.state.spark import (
    UnsupportedCheckpointError,
    UnsupportedLogVersionError,
    read_change_feed,
    read_diff,
    read_metadata,
    read_state,
)
from extagg.state.spark.framing import CodecUnavailableError

pytestmark = pytest.mark.spark


@pytest.fixture
def agg_copy(checkpoints, tmp_path):
    target = tmp_path / "cp"
    shutil.copytree(checkpoints.get("agg_update"), target)
    return str(target)


def _delta(path, version=2, partition=0):
    return os.path.join(path, "state", "0", str(partition), f"{version}.delta")


def test_truncated_delta_names_file_and_offset(agg_copy):
    delta = _delta(agg_copy)
    for snapshot in os.listdir(os.path.dirname(delta)):
        if snapshot.endswith(".snapshot"):
            os.unlink(os.path.join(os.path.dirname(delta), snapshot))
    data = Path(delta).read_bytes()
    Path(delta).write_bytes(data[: len(data) - 25])
    with pytest.raises(CorruptFileError) as info:
        read_state(agg_copy, batch_id=1).to_list()
    assert info.value.path == delta and info.value.offset is not None
    assert "truncated" in str(info.value)


def test_flipped_byte_fails_the_block_checksum(agg_copy):
    delta = _delta(agg_copy, version=1)
    data = bytearray(Path(delta).read_bytes())
    data[30] ^= 0x40
    Path(delta).write_bytes(bytes(data))
    with pytest.raises(CorruptFileError) as info:
        list(generic_changes(agg_copy, 0, 0))
    assert info.value.path == delta and info.value.offset == 0


def test_foreign_and_empty_files(agg_copy):
    delta = _delta(agg_copy, version=1)
    Path(delta).write_bytes(b"")
    with pytest.raises(CorruptFileError, match="unknown compression framing"):
        list(generic_changes(agg_copy, 0, 0))


def test_missing_delta_names_the_file(agg_copy):
    delta = _delta(agg_copy, version=1, partition=1)
    os.unlink(delta)
    with pytest.raises(StateFileNotFoundError) as info:
        generic_changes(agg_copy, 0, 1)
    assert info.value.path == delta


def test_corrupt_schema_file(agg_copy):
    schema = os.path.join(agg_copy, "state", "0", "0", "_metadata", "schema")
    data = Path(schema).read_bytes()
    Path(schema).write_bytes(data[:40])
    with pytest.raises(CorruptFileError) as info:
        read_state(agg_copy)
    assert info.value.path == schema


def test_unknown_log_versions(agg_copy):
    commit = os.path.join(agg_copy, "commits", "3")
    Path(commit).write_text('v9\n{"nextBatchWatermarkMs":0}')
    os.unlink(os.path.join(agg_copy, "commits", ".3.crc"))
    with pytest.raises(UnsupportedLogVersionError, match=r"commits/3.*v9"):
        read_state(agg_copy, batch_id=3)
    metadata = os.path.join(agg_copy, "state", "0", "_metadata", "metadata")
    Path(metadata).write_text("v7\n{}")
    with pytest.raises(UnsupportedLogVersionError, match="operator metadata version 'v7'"):
        read_state(agg_copy, batch_id=2)
    assert read_metadata(agg_copy).to_list() == []  # skipped, as Spark's source does
    from extagg.state.cli import main as state_main

    assert state_main(["metadata", agg_copy]) == 1


def test_uncommitted_batch_is_refused_as_spark_does(agg_copy, capsys):
    """A batch whose state files were written but whose commit was not (a crash between the
    two) was read as if committed; a batch past the last commit named a missing delta file."""
    os.unlink(os.path.join(agg_copy, "commits", "3"))
    os.unlink(os.path.join(agg_copy, "commits", ".3.crc"))
    assert os.path.isfile(_delta(agg_copy, version=4))
    for call in (
        lambda: read_state(agg_copy, batch_id=3),
        lambda: generic_read_state(agg_copy, batch_id=3),
        lambda: read_change_feed(agg_copy, 3, 3),
        lambda: generic_changes(agg_copy, 0, 3),
        lambda: read_diff(agg_copy, 0, 3),
        lambda: read_diff(agg_copy, 3, 2),
        lambda: read_state(agg_copy, batch_id=50),
    ):
        with pytest.raises(CommittedBatchUnavailableError, match="No committed batch") as info:
            call()
        assert info.value.error_class == "STDS_COMMITTED_BATCH_UNAVAILABLE"
        assert info.value.last_committed == 2
    # the defaults are the last committed batch
    assert read_state(agg_copy).to_list() == read_state(agg_copy, batch_id=2).to_list()
    assert {row[0] for row in read_change_feed(agg_copy, 0)} == {0, 1, 2}
    for argv in (
        ["show", agg_copy, "--batch-id", "3"],
        ["show", agg_copy, "--batch-id", "50"],
        ["changes", agg_copy, "--start-batch-id", "3", "--end-batch-id", "3"],
        ["diff", agg_copy, "--from-batch", "0", "--to-batch", "3"],
        ["export", agg_copy, "--batch-id", "3", "--format", "csv", "-o", agg_copy + ".csv"],
    ):
        status, out, err = run(capsys, *argv)
        assert status == 1 and out == "", argv
        assert "[STDS_COMMITTED_BATCH_UNAVAILABLE]" in err and "Batch " in err, argv
        assert "CANNOT_READ" not in err
    assert not os.path.exists(agg_copy + ".csv")


def test_codec_refused_when_its_package_is_missing(agg_copy, monkeypatch):
    import builtins

    delta = _delta(agg_copy, version=1)
    Path(delta).write_bytes(b"\x28\xb5\x2f\xfd" + bytes(20))  # a zstd frame head
    real_import = builtins.__import__

    def no_zstd(name, *args, **kwargs):
        if name == "zstandard":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_zstd)
    with pytest.raises(CodecUnavailableError, match="zstandard"):
        list(generic_changes(agg_copy, 0, 0))


def test_rocksdb_checkpoint_is_refused(checkpoints):
    path = checkpoints.get("rocksdb")
    with pytest.raises(UnsupportedCheckpointError, match="RocksDB"):
        generic_read_state(path)


# ------------------------------------------------------------------------------------ CLI
def run(capsys, *argv):
    status = cli_main(["state", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_cli_show_table_csv_jsonl_parquet(checkpoints, capsys, tmp_path):
    path = checkpoints.get("agg_update")
    expected = read_state(path).to_list()
    status, out, _ = run(capsys, "show", path, "--format", "table")
    assert status == 0 and len(out.splitlines()) == len(expected) + 1
    status, out, _ = run(capsys, "show", path, "--format", "jsonl")
    rows = [json.loads(line) for line in out.splitlines()]
    assert sorted((r["key"]["k"], r["value"]["count"]) for r in rows) == sorted(
        (key.k, value.as_dict()["count"]) for key, value, _ in expected
    )
    status, out, _ = run(capsys, "show", path, "--format", "csv")
    assert out.splitlines()[0] == "key,value,partition_id"
    target = tmp_path / "state.parquet"
    status, _, _ = run(capsys, "show", path, "--format", "parquet", "-o", str(target))
    table = pq.read_table(target)
    assert table.num_rows == len(expected)
    assert table.schema.field("value").type.field("sum").type == "int64"


def test_cli_changes_metadata_diff_export(checkpoints, capsys, tmp_path):
    path = checkpoints.get("window")
    status, out, _ = run(capsys, "changes", path, "--start-batch-id", "0", "--format", "jsonl")
    kinds = {json.loads(line)["change_type"] for line in out.splitlines()}
    assert status == 0 and kinds == {"update", "delete"}
    status, out, _ = run(capsys, "metadata", path, "--format", "csv")
    assert status == 0 and "stateStoreSave" in out
    status, out, _ = run(
        capsys, "diff", path, "--from-batch", "0", "--to-batch", "3", "--format", "jsonl"
    )
    diff = [json.loads(line) for line in out.splitlines()]
    assert status == 0 and {d["change_type"] for d in diff} >= {"added", "removed"}
    old = {json.dumps(r[0].as_dict(), default=str) for r in read_state(path, batch_id=0)}
    removed = {json.dumps(d["key"]) for d in diff if d["change_type"] == "removed"}
    assert removed and len(removed) <= len(old)
    target = tmp_path / "export.parquet"
    status, _, _ = run(capsys, "export", path, "--batch-id", "2", "-o", str(target))
    assert status == 0 and pq.read_table(target).num_rows == len(
        read_state(path, batch_id=2).to_list()
    )


def test_cli_metadata_without_operators_exits_nonzero(tmp_path, capsys):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "state" / "0").mkdir(parents=True)
    status, _, err = run(capsys, "metadata", str(tmp_path))
    assert status == 1 and "no readable operator" in err


def test_cli_join_side_with_a_store_name_is_refused_as_spark_does(checkpoints, capsys):
    """The command dropped --store-name beside --join-side and printed the side's rows."""
    path = checkpoints.get("join")
    status, out, err = run(
        capsys, "show", path, "--join-side", "left", "--store-name", "left-keyToNumValues"
    )
    assert status != 0 and out == ""
    assert "STDS_CONFLICT_OPTIONS" in err and "storeName" in err
    status, out, _ = run(capsys, "show", path, "--join-side", "left")
    assert status == 0 and out

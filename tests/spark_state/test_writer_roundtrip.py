"""``write_state`` then extagg's reader, no Spark: the rows come back, in Spark's partitions;
a delta-only version is rebuilt through the external map, spilling, to the same rows."""

from __future__ import annotations

import decimal
import os

import pytest

from extagg.errors import CorruptFileError
from extagg.state.spark import (
    AtomicType,
    DecimalType,
    StructField,
    StructType,
    partition_for,
    read_change_feed,
    read_diff,
    read_state,
    write_state,
)

KEY = StructType((StructField("k", AtomicType("string")), StructField("n", AtomicType("integer"))))
VALUE = StructType(
    (StructField("total", DecimalType(20, 2)), StructField("last", AtomicType("double")))
)


def _rows(count):
    return [
        ((f"key-{i % 977}-é", i), (decimal.Decimal(i) / 4, None if i % 5 == 0 else i * 0.5))
        for i in range(count)
    ]


def _plain(rows):
    return sorted((tuple(k), tuple(v)) for k, v, _p in rows)


def test_written_rows_read_back_in_their_partitions(tmp_path):
    rows = _rows(3000)
    counts = write_state(tmp_path / "cp", 0, KEY, VALUE, rows, batch_id=4, num_partitions=3)
    assert sum(counts.values()) == len(rows)
    read = read_state(tmp_path / "cp").to_list()  # default: the last committed batch (4)
    expected = sorted(
        (k, (decimal.Decimal(v[0]).quantize(decimal.Decimal("0.01")), v[1])) for k, v in rows
    )
    assert _plain(read) == expected
    assert all(partition_for(k, KEY, 3) == p for k, _v, p in read)
    changes = read_change_feed(tmp_path / "cp", 4).to_list()
    assert len(changes) == len(rows) and {c[1] for c in changes} == {"update"}


def test_delta_only_version_spills_to_the_same_rows(tmp_path, monkeypatch):
    rows = _rows(5000)
    path = tmp_path / "cp"
    write_state(path, 0, KEY, VALUE, rows, batch_id=0, num_partitions=2)
    whole = _plain(read_state(path).to_list())
    for p in range(2):
        os.unlink(path / "state" / "0" / str(p) / "1.snapshot")
    monkeypatch.setenv("EXTAGG_FORCE_SPILL_EVERY", "500")
    assert _plain(read_state(path, memory="4m").to_list()) == whole
    assert list(read_diff(path, 0, 0)) == []


def test_writer_refuses_existing_state_and_null_values(tmp_path):
    write_state(tmp_path / "cp", 0, KEY, VALUE, _rows(3), num_partitions=1)
    with pytest.raises(FileExistsError):
        write_state(tmp_path / "cp", 0, KEY, VALUE, _rows(3), num_partitions=1)
    with pytest.raises(ValueError, match="cannot be null"):
        write_state(tmp_path / "other", 0, KEY, VALUE, [(("a", 1), None)], num_partitions=1)
    assert not any(
        name.endswith(".tmp") for _d, _s, files in os.walk(tmp_path / "other") for name in files
    )


def test_written_file_truncated_is_corrupt(tmp_path):
    path = tmp_path / "cp"
    write_state(path, 0, KEY, VALUE, _rows(200), num_partitions=1)
    delta = path / "state" / "0" / "0" / "1.delta"
    delta.write_bytes(delta.read_bytes()[:-30])
    with pytest.raises(CorruptFileError) as info:
        read_change_feed(path, 0).to_list()
    assert info.value.path == str(delta)

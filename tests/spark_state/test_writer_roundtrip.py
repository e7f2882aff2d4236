"""``write_state`` then extagg's reader, no Spark: the rows come back, in Spark's partitions;
a delta-only version is rebuilt through the external map, spilling, to the same rows."""

from __future__ import annotations

import decimal
import os
import shutil

import pytest

from extagg.errors import CorruptFileError
from extagg.state.errors import StateSourceError
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


def test_an_empty_key_schema_global_aggregation_reads_back(tmp_path):
    """``groupBy().agg(...)`` keys its one row by ``struct<>``: the generated decoder had no
    field to read and was a syntax error."""
    value = StructType((StructField("cnt", AtomicType("long")),))
    write_state(tmp_path / "cp", 0, StructType(()), value, [((), (5,))], num_partitions=1)
    rows = read_state(tmp_path / "cp").to_list()
    assert [(tuple(k), tuple(v), p) for k, v, p in rows] == [((), (5,), 0)]


def test_a_missing_partition_folder_is_an_error_not_a_partial_answer(tmp_path):
    write_state(tmp_path / "cp", 0, KEY, VALUE, _rows(300), num_partitions=3)
    shutil.rmtree(tmp_path / "cp" / "state" / "0" / "1")
    for read in (read_state, lambda path: read_change_feed(path, 0)):
        with pytest.raises(StateSourceError, match=r"no folder for partition 1 \(.*state/0/1\)"):
            read(tmp_path / "cp").to_list()
    shutil.rmtree(tmp_path / "cp" / "state" / "0" / "2")  # only partition 0 left: as a
    with pytest.raises(StateSourceError, match="no folder for partition 1"):  # global
        read_state(tmp_path / "cp").to_list()  # aggregation's, but of a keyed operator


def test_writer_refuses_existing_state_and_null_values(tmp_path):
    write_state(tmp_path / "cp", 0, KEY, VALUE, _rows(3), num_partitions=1)
    with pytest.raises(FileExistsError):
        write_state(tmp_path / "cp", 0, KEY, VALUE, _rows(3), num_partitions=1)
    with pytest.raises(ValueError, match="cannot be null"):
        write_state(tmp_path / "other", 0, KEY, VALUE, [(("a", 1), None)], num_partitions=1)
    assert not any(
        name.endswith(".tmp") for _d, _s, files in os.walk(tmp_path / "other") for name in files
    )


def test_a_failed_write_leaves_nothing_and_can_be_retried(tmp_path):
    """A value that does not fit its schema failed with a bare ``struct.error`` naming no row,
    left the partition folders behind, and the retry was refused ("already exists")."""
    path = tmp_path / "new" / "cp"
    rows = [(("a", 1), (decimal.Decimal(1), 1.0)), (("b", 2), (decimal.Decimal(2), "oops"))]
    with pytest.raises(ValueError, match=r"row 1: value .* of key \('b', 2\) does not fit"):
        write_state(path, 0, KEY, VALUE, rows, num_partitions=4)
    assert not (tmp_path / "new").exists()
    with pytest.raises(ValueError, match=r"row 0: key \(1, 'x'\) does not fit the key schema"):
        write_state(path, 0, KEY, VALUE, [((1, "x"), (decimal.Decimal(1), 1.0))], num_partitions=2)
    rows[1] = (("b", 2), (decimal.Decimal(2), 2.0))
    assert sum(write_state(path, 0, KEY, VALUE, rows, num_partitions=4).values()) == 2
    assert len(read_state(path).to_list()) == 2


def test_partitions_beyond_the_open_file_limit(tmp_path):
    """Every partition's delta and snapshot are open at once: 600 partitions failed with
    ``Too many open files`` under a soft limit of 1 024 and left ~1 000 temp files. The soft
    limit is raised to the hard one; beyond the hard one, a clear error before any file."""
    import resource
    import subprocess
    import sys

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2_000:
        pytest.skip(f"hard limit of open files {hard}")
    wide = hard if hard != resource.RLIM_INFINITY else 4096
    code = f"""
import resource, os
from extagg.state.spark import write_state, read_state
from tests.spark_state.test_writer_roundtrip import KEY, VALUE, _rows
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, {wide}))
write_state({str(tmp_path / "wide")!r}, 0, KEY, VALUE, _rows(1000), num_partitions=600)
assert len(read_state({str(tmp_path / "wide")!r}).to_list()) == 1000
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
try:
    write_state({str(tmp_path / "narrow")!r}, 0, KEY, VALUE, _rows(10), num_partitions=600)
except OSError as exc:
    assert "beyond this process's limit of 1024 open files" in str(exc), exc
else:
    raise AssertionError("no error")
assert not os.path.exists({str(tmp_path / "narrow")!r})
"""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_written_file_truncated_is_corrupt(tmp_path):
    path = tmp_path / "cp"
    write_state(path, 0, KEY, VALUE, _rows(200), num_partitions=1)
    delta = path / "state" / "0" / "0" / "1.delta"
    delta.write_bytes(delta.read_bytes()[:-30])
    with pytest.raises(CorruptFileError) as info:
        read_change_feed(path, 0).to_list()
    assert info.value.path == str(delta)


def test_float_keys_are_written_normalised_as_spark_groups_them():
    """A key of ``-0.0`` or of a NaN with other bits was written as given; Spark normalises
    grouping keys (``0.0``, one NaN), so the resumed query never matched them and split the
    totals. The files are the same bytes as for ``0.0`` and ``float('nan')``."""
    import math
    import struct
    import tempfile
    from pathlib import Path

    key = StructType(
        (StructField("x", AtomicType("double")), StructField("s", AtomicType("string")))
    )
    value = StructType((StructField("n", AtomicType("long")),))
    other_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF8_0000_0000_0001))[0]
    files = []
    for zero, nan in ((-0.0, other_nan), (0.0, math.nan)):
        with tempfile.TemporaryDirectory() as tmp:
            rows = [((zero, "a"), (1,)), ((nan, "b"), (2,)), ({"x": zero, "s": "c"}, (3,))]
            write_state(Path(tmp) / "cp", 0, key, value, rows, num_partitions=3)
            files.append(
                {
                    p.name + p.parent.name: p.read_bytes()
                    for p in (Path(tmp) / "cp").glob("state/0/*/1.*")
                }
            )
    assert files[0] == files[1] and len(files[0]) == 6


def test_state_cli_text_formats_keep_every_field_and_write_valid_json(tmp_path, capsys):
    """An aggregation buffer has one ``sum`` per ``sum()``: JSON objects built by name kept
    the last only (5 of 18 fields of a real query vanished); a NaN was written bare, which
    strict JSON readers refuse; a tab or newline in a string broke the table's rows."""
    import csv
    import io
    import json
    import math

    from extagg.cli import main as cli_main

    def strict(text):
        def refuse(name):
            raise ValueError(f"bare {name}")

        return json.loads(text, parse_constant=refuse)

    key = StructType(
        (StructField("k", AtomicType("string")), StructField("x", AtomicType("double")))
    )
    value = StructType(
        (StructField("sum", AtomicType("long")), StructField("sum", AtomicType("double")))
    )
    rows = [(("a\tb\nc", math.nan), (3, math.inf)), (("d", 1.0), (5, 2.5))]
    path = str(tmp_path / "cp")
    write_state(path, 0, key, value, rows, num_partitions=1)
    assert cli_main(["state", "show", path, "--format", "jsonl"]) == 0
    got = sorted((strict(line) for line in capsys.readouterr().out.splitlines()), key=str)
    assert [(r["key"], r["value"]) for r in got] == [
        ({"k": "a\tb\nc", "x": "NaN"}, {"sum": 3, "sum.1": "Infinity"}),
        ({"k": "d", "x": 1.0}, {"sum": 5, "sum.1": 2.5}),
    ]
    assert cli_main(["state", "show", path, "--format", "csv"]) == 0
    cells = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert sorted(str(strict(c["value"])["sum.1"]) for c in cells) == ["2.5", "Infinity"]
    assert cli_main(["state", "show", path, "--format", "table"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(line.count("\t") == 2 for line in lines)


def test_dates_past_year_9999_and_a_bad_change_feed_partition_are_named(tmp_path, capsys):
    """Spark holds dates past 9999; reading one stopped with a bare ``OverflowError`` (the CLI
    printed a traceback). A change feed of a partition that does not exist advised creating a
    new checkpoint (its delta "does not exist")."""
    from extagg.cli import main as cli_main
    from extagg.state.errors import StateSourceError, StateSourceOptionError

    key = StructType((StructField("d", AtomicType("date")),))
    value = StructType((StructField("n", AtomicType("long")),))
    path = str(tmp_path / "cp")
    write_state(path, 0, key, value, [((2_932_897,), (1,))], num_partitions=2)  # +10000-01-01
    with pytest.raises(StateSourceError, match="a date 2932897 days from 1970-01-01 is outside"):
        read_state(path).to_list()
    assert cli_main(["state", "show", path]) == 1
    err = capsys.readouterr().err
    assert "outside Python's years 1 to 9999" in err and "Traceback" not in err
    with pytest.raises(StateSourceOptionError, match="partition 7 does not exist"):
        read_change_feed(path, 0, partition_id=7).to_list()


def test_dates_and_timestamps_past_python_years_export_to_arrow(tmp_path, capsys):
    """Arrow's date32 / timestamp[us] hold every date and timestamp Spark holds; to_arrow and
    Parquet export went through Python ``datetime`` and failed past year 9999 (or before 1)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from extagg.cli import main as cli_main

    def field(name, type_):
        return {"name": name, "type": type_, "nullable": True, "metadata": {}}

    key_schema = {
        "type": "struct",
        "fields": [field("ts", "timestamp"), field("d", "date"), field("ntz", "timestamp_ntz")],
    }
    array = {"type": "array", "elementType": "timestamp", "containsNull": True}
    map_ = {"type": "map", "keyType": "date", "valueType": "long", "valueContainsNull": True}
    value_schema = {
        "type": "struct",
        "fields": [field("n", "long"), field("tss", array), field("dm", map_)],
    }
    year_10000 = 253_402_300_800_000_000
    keys = [(2**62, 2**31 - 1, year_10000), (-(2**62), -(2**31), 0), (0, 2_932_897, -1)]
    state = [(k, (i, [k[0], None], [(k[1], i)])) for i, k in enumerate(keys)]
    path = str(tmp_path / "cp")
    write_state(path, 0, key_schema, value_schema, state, num_partitions=2)

    def raw(table):
        key = table.column("key").combine_chunks()
        value = table.column("value").combine_chunks()
        tss = value.field("tss").flatten()
        dm = value.field("dm")
        return sorted(
            zip(
                key.field("ts").cast(pa.int64()).to_pylist(),
                key.field("d").cast(pa.int32()).to_pylist(),
                key.field("ntz").cast(pa.int64()).to_pylist(),
                value.field("n").to_pylist(),
                tss.cast(pa.int64()).to_pylist()[::2],
                dm.keys.cast(pa.int32()).to_pylist(),
            )
        )

    expected = sorted((*k, i, k[0], k[1]) for i, k in enumerate(keys))
    assert raw(read_state(path).to_arrow()) == expected
    assert raw(pa.Table.from_batches(list(read_state(path).iter_batches(2)))) == expected
    changes = read_change_feed(path, 0).to_arrow()
    assert raw(changes) == expected and set(changes.column("change_type").to_pylist()) == {"update"}
    for command in ("export", "show"):
        target = tmp_path / f"{command}.parquet"
        assert cli_main(["state", command, path, "-o", str(target)]) == 0, capsys.readouterr()
        assert raw(pq.read_table(target)) == expected
    # Python values cannot hold them: a clear error, naming the value
    with pytest.raises(StateSourceError, match="outside Python's years 1 to 9999"):
        read_state(path).to_list()


def test_state_commands_refuse_an_existing_output_without_overwrite(tmp_path, capsys):
    """``state show/export/changes/diff/metadata -o FILE`` replaced an existing file silently;
    ``extagg aggregate`` refuses it without ``--overwrite`` (exit status 2)."""
    import pyarrow.parquet as pq

    from extagg.cli import main as cli_main

    path = str(tmp_path / "cp")
    write_state(path, 0, KEY, VALUE, _rows(10), num_partitions=2)
    target = tmp_path / "out.parquet"
    for argv in (
        ["export", path],
        ["show", path, "--format", "csv"],
        ["changes", path, "--start-batch-id", "0", "--format", "jsonl"],
        ["diff", path, "--from-batch", "0", "--to-batch", "0", "--format", "csv"],
        ["metadata", path, "--format", "csv"],
    ):
        target.write_bytes(b"keep me")
        assert cli_main(["state", *argv, "-o", str(target)]) == 2, argv
        err = capsys.readouterr().err
        assert "exists; pass --overwrite" in err, argv
        assert target.read_bytes() == b"keep me"
        assert cli_main(["state", *argv, "-o", str(target), "--overwrite"]) == 0, argv
        assert target.read_bytes() != b"keep me"
    assert cli_main(["state", "export", path, "-o", str(target), "--overwrite"]) == 0
    assert pq.read_table(target).num_rows == 10

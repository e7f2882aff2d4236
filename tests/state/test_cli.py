"""``extagg state show|changes|metadata``: text, CSV, JSON lines and Parquet output, errors."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from extagg.state.cli import add_state_subcommands, main, run_state_command

from .conftest import commit_version


@pytest.fixture
def path(checkpoint, mm):
    op = checkpoint.operator(0, name="totals", num_partitions=2)
    for partition in range(2):
        provider = op.provider(partition, memory_manager=mm)
        commit_version(provider, 0, {f"k{partition}": (1, "a"), ("t", partition): [1, 2]})
        commit_version(provider, 1, {f"k{partition}": (2, "b")}, removes=[("t", partition)])
        provider.close()
    checkpoint.commit(0)
    checkpoint.commit(1)
    return checkpoint.path


def run(argv: list[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="extagg")
    add_state_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    assert args.handler is run_state_command
    status = run_state_command(args, stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def test_show_prints_the_rows(path):
    status, out, err = run(["state", "show", path])
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "key\tvalue\tpartition_id"
    assert sorted(lines[1:]) == ["k0\t(2, 'b')\t0", "k1\t(2, 'b')\t1"]
    status, out, _ = run(["state", "show", path, "--batch-id", "0", "--partition-id", "1"])
    assert sorted(out.splitlines()[1:]) == ["('t', 1)\t[1, 2]\t1", "k1\t(1, 'a')\t1"]
    status, out, _ = run(["state", "show", path, "--limit", "1"])
    assert len(out.splitlines()) == 2


def test_changes_as_csv_and_json_lines(path, tmp_path):
    status, out, _ = run(["state", "changes", path, "--start-batch-id", "1", "--format", "csv"])
    assert status == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {(r["change_type"], r["key"], r["value"]) for r in rows} == {
        ("update", "k0", "(2, 'b')"),
        ("update", "k1", "(2, 'b')"),
        ("delete", "('t', 0)", ""),
        ("delete", "('t', 1)", ""),
    }
    target = tmp_path / "changes.jsonl"
    status, _, _ = run(["state", "changes", path, "--start-batch-id", "0", "-o", str(target)])
    records = [json.loads(line) for line in target.read_text().splitlines()]
    assert len(records) == 8
    assert {
        "batch_id": 1,
        "change_type": "delete",
        "key": ["t", 0],
        "value": None,
        "partition_id": 0,
    } in records


def test_show_to_parquet_and_metadata(path, tmp_path):
    target = tmp_path / "state.parquet"
    assert run(["state", "show", path, "--output", str(target)])[0] == 0
    table = pq.read_table(target)
    assert table.num_rows == 2
    assert sorted(table.column("key").to_pylist()) == ["k0", "k1"]
    empty = tmp_path / "empty.parquet"
    args = ["state", "show", path, "--format", "parquet", "-o", str(empty), "--limit", "0"]
    assert run(args)[0] == 0
    assert pq.read_table(empty).num_rows == 0
    status, out, _ = run(["state", "metadata", path])
    assert status == 0
    assert out.splitlines()[1] == "0\ttotals\tdefault\t2\t0\t1"


def test_errors_name_the_option_and_exit_1(path, tmp_path):
    status, out, err = run(["state", "show", path, "--batch-id", "-1"])
    assert status == 1 and out == ""
    assert "extagg state show: error:" in err and "'batch_id': cannot be negative" in err
    status, _, err = run(["state", "changes", path, "--start-batch-id", "2", "--end-batch-id", "1"])
    assert status == 1 and "cannot be smaller than 'start_batch_id'" in err
    status, _, err = run(["state", "show", str(tmp_path / "missing")])
    assert status == 1 and f"checkpoint location {tmp_path / 'missing'} does not exist" in err
    (tmp_path / "empty").mkdir()
    status, _, err = run(["state", "show", str(tmp_path / "empty")])
    assert status == 1 and f"{tmp_path / 'empty' / 'state'} does not exist" in err
    (tmp_path / "a-file").write_text("x")  # was "[Errno 20] Not a directory: .../commits"
    status, _, err = run(["state", "show", str(tmp_path / "a-file")])
    assert status == 1 and "a-file is a file; give the checkpoint directory" in err
    # usage errors, exit 2 as extagg aggregate's: a format that needs a file and none given,
    # an output whose format cannot be told (it was written as tab-separated text, silently)
    status, _, err = run(["state", "show", path, "--format", "parquet"])
    assert status == 2 and "needs --output" in err
    status, _, err = run(["state", "export", path])
    assert status == 2 and "needs --output" in err
    status, _, err = run(["state", "show", path, "-o", str(tmp_path / "x.unknown")])
    assert status == 2 and "cannot tell the output format" in err
    assert not (tmp_path / "x.unknown").exists()
    os.unlink(os.path.join(path, "state", "0", "0", "2.delta"))
    status, _, err = run(["state", "show", path])
    assert status == 1 and "2.delta does not exist" in err
    with pytest.raises(SystemExit):
        run(["state", "bogus", path])


def test_runs_as_a_module(path):
    done = subprocess.run(
        [sys.executable, "-m", "extagg.state.cli", "metadata", path, "--format", "csv"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.getcwd()),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("operator_id,operator_name")
    assert main(["metadata", path]) == 0


def test_reading_an_extagg_checkpoint_loads_no_compiler(path):
    """``extagg state show`` of an extagg checkpoint reads without the generic
    engine, whose import loads numba: ~0.3 s of every such command's start."""
    script = (
        "import sys\n"
        "from extagg.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print('numba' in sys.modules, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "state", "show", path, "--format", "csv"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.getcwd()),
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "k0" in done.stdout and done.stderr.strip() == "False"


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.parquet"])
def test_a_failed_export_leaves_the_old_file_and_no_temp_file(path, tmp_path, name):
    target = tmp_path / name
    target.write_bytes(b"old contents")
    os.unlink(os.path.join(path, "state", "0", "1", "2.delta"))  # partition 1 fails mid-read
    status, _, err = run(["state", "show", path, "-o", str(target), "--overwrite"])
    assert status == 1 and "2.delta does not exist" in err
    assert target.read_bytes() == b"old contents"  # never half a file
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_keys_of_several_types_export_as_json_lines_and_parquet_says_so(checkpoint, mm, tmp_path):
    """A Python state store takes keys of any types in one store; Parquet cannot hold them in
    one column: the error names the file, the types and what does hold them, nothing is left
    behind, and the JSON Lines export writes them."""
    op = checkpoint.operator(0, name="mixed", num_partitions=1)
    commit_version(op.provider(0, memory_manager=mm), 0, {1: "a", "b": 2})
    checkpoint.commit(0)
    status, _, err = run(["state", "export", checkpoint.path, "-o", str(tmp_path / "s.parquet")])
    assert status == 1 and "s.parquet" in err and "int, str" in err and "--format jsonl" in err
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]
    status, _, err = run(["state", "export", checkpoint.path, "-o", str(tmp_path / "s.jsonl")])
    assert (status, err) == (0, "")
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert sorted((str(r["key"]), r["value"]) for r in rows) == [("1", "a"), ("b", 2)]


def test_durations_print_as_iso_8601(checkpoint, mm):
    """A timedelta key or value prints as an ISO 8601 duration, exact to the microsecond (it
    printed as ``datetime.timedelta(days=1)``, which no JSON reader parses)."""
    import datetime as dt

    op = checkpoint.operator(0, name="t", num_partitions=1)
    puts = {dt.timedelta(days=1): dt.timedelta(hours=2, minutes=3, seconds=4, milliseconds=500),
            dt.timedelta(microseconds=-1): dt.timedelta(0)}  # fmt: skip
    commit_version(op.provider(0, memory_manager=mm), 0, puts)
    checkpoint.commit(0)
    status, out, err = run(["state", "show", checkpoint.path, "--format", "jsonl"])
    assert (status, err) == (0, "")
    rows = sorted((r["key"], r["value"]) for r in map(json.loads, out.splitlines()))
    assert rows == [("-P0DT0H0M0.000001S", "P0DT0H0M0S"), ("P1DT0H0M0S", "P0DT2H3M4.5S")]
    status, out, _ = run(["state", "show", checkpoint.path, "--format", "csv"])
    assert '"""P1DT0H0M0S""","""P0DT2H3M4.5S"""' in out


def test_a_lone_surrogate_key_is_printed_escaped_not_an_error_mid_output(checkpoint, mm, tmp_path):
    """The codec stores lone surrogates; ``show`` as a table or CSV stopped after the rows
    before it with a UnicodeEncodeError (exit 1)."""
    op = checkpoint.operator(0, name="t", num_partitions=1)
    commit_version(op.provider(0, memory_manager=mm), 0, {"ok": 1, "\ud800x": 2})
    checkpoint.commit(0)
    parser = argparse.ArgumentParser(prog="extagg")
    add_state_subcommands(parser.add_subparsers(dest="command", required=True))
    for fmt in ("table", "csv"):
        raw = io.BytesIO()
        out = io.TextIOWrapper(raw, encoding="utf-8", newline="")  # strict, as a terminal's
        args = parser.parse_args(["state", "show", checkpoint.path, "--format", fmt])
        assert run_state_command(args, stdout=out, stderr=io.StringIO()) == 0
        out.flush()
        assert "\\ud800x" in raw.getvalue().decode("utf-8")
        target = tmp_path / f"s.{fmt}"
        status, _, err = run(["state", "show", checkpoint.path, "--format", fmt, "-o", str(target)])
        assert (status, err) == (0, "") and "\\ud800x" in target.read_text("utf-8")


def test_dash_output_is_standard_output_for_every_command(path, tmp_path, monkeypatch):
    """``-o -`` wrote a file named "-", though the output errors suggest it for standard
    output (as ``extagg aggregate -o -`` means it)."""
    monkeypatch.chdir(tmp_path)
    commands = {
        "show": ["state", "show", path],
        "changes": ["state", "changes", path, "--start-batch-id", "0"],
        "metadata": ["state", "metadata", path],
        "diff": ["state", "diff", path, "--from-batch", "0", "--to-batch", "1"],
    }
    for name, argv in commands.items():
        _, expected, _ = run([*argv, "--format", "jsonl"])
        assert expected, name
        status, out, err = run([*argv, "--format", "jsonl", "-o", "-"])
        assert (status, err, out) == (0, "", expected), name
    parser = argparse.ArgumentParser(prog="extagg")
    add_state_subcommands(parser.add_subparsers(dest="command", required=True))
    for argv in (
        ["state", "export", path, "-o", "-"],
        ["state", "show", path, "-o", "-", "--format", "parquet"],
    ):
        raw = io.BytesIO()
        out = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        assert run_state_command(parser.parse_args(argv), stdout=out, stderr=io.StringIO()) == 0
        table = pq.read_table(io.BytesIO(raw.getvalue()))
        assert table.num_rows == 2 and "key" in table.column_names
    assert "-" not in os.listdir(tmp_path)


def test_output_into_a_missing_directory_or_onto_a_directory_is_named_plainly(
    path, tmp_path, capsys
):
    """``-o no_such_dir/x.csv`` named the hidden temp file ('.x.csv.<host>-...tmp'), and an
    existing directory was called "not a regular file (a pipe, a device)"; ``extagg state``
    and ``extagg aggregate`` share the check, so they say the same."""
    from extagg.cli import main as extagg_main

    source = tmp_path / "in.csv"
    source.write_text("a,b\n1,2\n")
    missing = tmp_path / "no_such_dir" / "x.csv"
    commands = {
        "state": ["state", "show", path],
        "aggregate": ["aggregate", str(source), "--by", "a", "--agg", "n=count(*)", "-q"],
    }
    for name, argv in commands.items():
        assert extagg_main([*argv, "-o", str(missing)]) == 2, name
        err = capsys.readouterr().err
        assert f"output {missing}: its directory {missing.parent} does not exist" in err, name
        assert ".tmp" not in err, name
        assert (
            extagg_main(
                [
                    *argv,
                    "-o",
                    str(tmp_path),
                    "--output-format" if name == "aggregate" else "--format",
                    "csv",
                ]
            )
            == 2
        ), name
        err = capsys.readouterr().err
        assert f"output {tmp_path} is a directory" in err and "a pipe" not in err, name
    assert not missing.parent.exists()

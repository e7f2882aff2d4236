"""``extagg aggregate``: through main(argv) and as a subprocess — outputs, errors and exit
codes, sorting, Ctrl-C, disk full."""

from __future__ import annotations

import decimal
import errno
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import extagg
from extagg.cli import main
from extagg.errors import QueryError

ROOT = Path(__file__).resolve().parent.parent


def table(n: int = 20_000, keys: int = 500, seed: int = 3) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "k": rng.integers(0, keys, n),
            "g": pa.array(rng.choice(["a", "b", "c", "d"], n)),
            "v": np.round(rng.random(n) * 10, 2),
            "u": rng.integers(0, 50, n),
        }
    )


@pytest.fixture
def data(tmp_path) -> tuple[Path, pa.Table]:
    t = table()
    path = tmp_path / "in.parquet"
    pq.write_table(t, path, row_group_size=4_000)
    return path, t


def ref(t: pa.Table, by: list[str]) -> dict:
    df = t.to_pandas().groupby(by).agg(n=("v", "size"), s=("v", "sum"))
    return {(k if isinstance(k, tuple) else (k,)): (int(r.n), float(r.s)) for k, r in df.iterrows()}


def got(t: pa.Table, by: list[str]) -> dict:
    return {tuple(r[k] for k in by): (r["n"], r["s"]) for r in t.to_pylist()}


def check(result: pa.Table, t: pa.Table, by: list[str]) -> None:
    want, have = ref(t, by), got(result, by)
    assert have.keys() == want.keys()
    for key, (n, s) in want.items():
        assert have[key][0] == n and have[key][1] == pytest.approx(s, rel=1e-9)


def read_any(path: Path) -> pa.Table:
    suffix = path.suffix
    if suffix == ".parquet":
        return pq.read_table(path)
    if suffix == ".csv":
        return pacsv.read_csv(path)
    if suffix == ".tsv":
        return pacsv.read_csv(path, parse_options=pacsv.ParseOptions(delimiter="\t"))
    if suffix == ".arrow":
        with pa.ipc.open_file(path) as f:
            return f.read_all()
    return pa.Table.from_pylist([json.loads(line) for line in path.read_text().splitlines()])


ARGS = ["--by", "k", "--agg", "n=count(*)", "--agg", "s=sum(v)"]


@pytest.mark.parametrize("rows", [7, 30_000])
def test_csv_at_the_smallest_budget(tmp_path, rows, capsys):
    """At 1 MiB a CSV scan held 12 blocks of the 64 KiB minimum, 3/4 of the budget: the
    aggregator, left 256 KiB, could not merge two runs (even of a 7-row file's warm-up).
    Fewer blocks are read ahead now, so the text keeps within a third."""
    t = table(rows, keys=max(1, rows // 3), seed=4)
    src = tmp_path / "t.csv"
    pacsv.write_csv(t, src)
    out = tmp_path / "o.csv"
    argv = ["aggregate", str(src), "--by", "k,g", "--agg", "n=count(*)", "--agg", "s=sum(v)",
            "--memory", "1m", "-o", str(out), "--quiet"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    check(read_any(out), t, ["k", "g"])


@pytest.mark.parametrize("by", ["g", "g,k"])
def test_string_key_with_string_min_max_first_last(tmp_path, by, capsys):
    """A string key is read dictionary-coded; its string min/max/first/last states used to
    crash the command on its first batch (the warm-up's spill released their arena)."""
    rng = np.random.default_rng(8)
    n = 60_000
    t = pa.table(
        {
            "g": pa.array(rng.choice(["a", "b", "c", "dé", None], n)),
            "s": pa.array([f"w{x}" for x in rng.integers(0, 5_000, n)]),
            "k": rng.integers(0, 20_000, n),
        }
    )
    src = tmp_path / "s.parquet"
    pq.write_table(t, src, row_group_size=7_000)
    out = tmp_path / "o.parquet"
    argv = [
        "aggregate", str(src), "--by", by, "--agg", "lo=min(s)", "--agg", "hi=max(s)",
        "--agg", "f=first(s)", "--agg", "l=last(s)", "--agg", "n=count(*)",
        "--memory", "1m", "-o", str(out), "--quiet",
    ]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    keys = by.split(",")
    want: dict = {}
    for row in t.to_pylist():
        key, s = tuple(row[k] for k in keys), row["s"]
        lo, hi, f, _, c = want.get(key, (s, s, s, s, 0))
        want[key] = (min(lo, s), max(hi, s), f, s, c + 1)
    have = {
        tuple(r[k] for k in keys): (r["lo"], r["hi"], r["f"], r["l"], r["n"])
        for r in pq.read_table(out).to_pylist()
    }
    assert have == want


@pytest.mark.parametrize("ext", ["parquet", "csv", "tsv", "jsonl", "arrow"])
def test_every_output_format(tmp_path, data, ext, capsys):
    src, t = data
    out = tmp_path / f"out.{ext}"
    assert main(["aggregate", str(src), *ARGS, "--memory", "8m", "-o", str(out)]) == 0
    check(read_any(out), t, ["k"])
    assert not [p for p in os.listdir(tmp_path) if "extagg-tmp" in p]
    err = capsys.readouterr().err
    assert "Read 20,000 rows" in err and "500 groups" in err and "peak RSS" in err


#: the first bytes of each codec's stream
_MAGIC = {"gz": b"\x1f\x8b", "zst": b"\x28\xb5\x2f\xfd", "bz2": b"BZh"}


@pytest.mark.parametrize("name", ["out.csv.gz", "out.tsv.zst", "out.jsonl.bz2", "OUT.CSV.GZ"])
def test_text_output_compressed_by_its_suffix(tmp_path, name, capsys):
    """``out.csv.gz`` is a gzip'd CSV (as DuckDB's ``COPY ... TO 'out.csv.gz'``): it was
    refused ("cannot tell the output format"). A result of many batches (a spilling run of
    ~52 000 groups) is compressed as it streams, one whole stream that reads back equal."""
    t = table(120_000, keys=60_000, seed=11)
    src = tmp_path / "in.parquet"
    pq.write_table(t, src)
    out = tmp_path / name
    argv = ["aggregate", str(src), *ARGS, "--memory", "2m", "-q", "-o", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    raw = out.read_bytes()
    codec = name.lower().rsplit(".", 1)[1]
    assert raw.startswith(_MAGIC[codec])
    text = pa.input_stream(
        str(out), compression={"gz": "gzip", "zst": "zstd"}.get(codec, codec)
    ).read()
    plain = tmp_path / name.lower().rsplit(".", 1)[0]
    plain.write_bytes(text)
    assert len(raw) < len(text) / 1.5
    result = read_any(plain)
    assert result.num_rows == len(set(t.column("k").to_pylist())) > 50_000
    check(result, t, ["k"])
    assert sorted(os.listdir(tmp_path)) == sorted(["in.parquet", name, plain.name])


@pytest.mark.parametrize("codec", ["gz", "zst", "bz2"])
def test_compressed_output_bytes_depend_on_the_rows_only(tmp_path, data, codec, capsys):
    """Equal results give equal compressed bytes whatever the file's name and the time: a
    gzip header holds neither (Python's ``gzip`` writes the temp file's name and the time
    unless told not to)."""
    src, _ = data
    digests = set()
    for name in ("a", "b"):
        out = tmp_path / f"{name}.csv.{codec}"
        assert main(["aggregate", str(src), *ARGS, "--sort", "-q", "-o", str(out)]) == 0
        digests.add(out.read_bytes())
        time.sleep(1.1)  # a gzip header's time is in seconds
    assert len(digests) == 1
    if codec == "gz":
        raw = digests.pop()
        assert raw[3] == 0 and raw[4:8] == bytes(4)  # no name, no time


@pytest.mark.parametrize("name", ["out.parquet.gz", "out.arrow.zst"])
def test_binary_output_with_a_compression_suffix_is_refused(tmp_path, data, name, capsys):
    src, _ = data
    assert main(["aggregate", str(src), *ARGS, "-q", "-o", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert "compresses inside the file" in err and name in err
    assert sorted(os.listdir(tmp_path)) == ["in.parquet"]


def test_compressed_output_named_by_output_format(tmp_path, data, capsys):
    """``--output-format`` names the format; the suffix still says how to compress."""
    src, t = data
    out = tmp_path / "result.gz"
    argv = ["aggregate", str(src), *ARGS, "--output-format", "csv", "-q", "-o", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    plain = tmp_path / "result.csv"
    plain.write_bytes(pa.input_stream(str(out), compression="gzip").read())
    check(read_any(plain), t, ["k"])


def test_existing_output_needs_overwrite(tmp_path, data, capsys):
    src, t = data
    out = tmp_path / "out.csv"
    out.write_text("keep me")
    assert main(["aggregate", str(src), *ARGS, "-o", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err and out.read_text() == "keep me"
    assert main(["aggregate", str(src), *ARGS, "-o", str(out), "--overwrite", "-q"]) == 0
    check(read_any(out), t, ["k"])


def test_table_without_output_and_csv_to_stdout(data, capsys):
    src, t = data
    assert main(["aggregate", str(src), "--by", "g", "--agg", "n=count(*)", "--sort", "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["g", "n"] and lines[-1] == "4 rows"
    assert [line.split()[0] for line in lines[2:6]] == ["a", "b", "c", "d"]
    assert main(["aggregate", str(src), *ARGS, "--show", "5", "-q"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 + 5 + 1 and out[-1].startswith("500 rows (first 5 shown")
    assert main(["aggregate", str(src), *ARGS, "--show", "0", "-q"]) == 0
    assert capsys.readouterr().out == "500 rows\n"  # the count alone (was an empty table)
    assert main(["aggregate", str(src), *ARGS, "-o", "-", "-q", "--sort"]) == 0
    csv = capsys.readouterr().out
    result = pacsv.read_csv(pa.BufferReader(csv.encode()))
    check(result, t, ["k"])
    assert result.column("k").to_pylist() == sorted(result.column("k").to_pylist())


def test_table_escapes_control_characters_and_counts_csv_rows_alone(tmp_path, capsys):
    """A value with a newline broke the table's rows (now ``\\n``); ``count(*)`` alone on a
    CSV said 0 rows; a ``;``-separated ``.csv`` is read by its header."""
    src = tmp_path / "notes.csv"
    src.write_text('k;note\n"multi\nline";1\n"tab\there";2\nplain;3\n')
    assert main(["aggregate", str(src), "--by", "k", "--agg", "n=count(*)", "--sort", "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[2:5]] == ["multi\\nline", "plain", "tab\\there"]
    assert lines[-1] == "3 rows"
    assert main(["aggregate", str(src), "--agg", "n=count(*)", "-o", "-", "-q"]) == 0
    assert capsys.readouterr().out.split() == ["n", "3"]


def test_having_is_typed_by_the_results(data, capsys):
    """``--having`` reads a quoted value as its result column's type and refuses a value that
    is no condition (exit 2), as ``--where`` does."""
    src, t = data
    base = ["aggregate", str(src), "--by", "g", "--agg", "n=count(*)", "-q", "-o", "-"]
    assert main([*base, "--having", "n >= '1' and g like 'a%'"]) == 0
    n = pc.sum(pc.equal(t["g"], "a")).as_py()
    assert capsys.readouterr().out.split() == ["g,n", f"a,{n}"]
    assert main([*base, "--having", "n"]) == 2
    captured = capsys.readouterr()
    assert "a value of type int64, not a condition" in captured.err
    assert captured.out == ""  # not the CSV header of a result that does not come


def test_where_having_and_json_summary(tmp_path, data, capsys):
    src, t = data
    summary = tmp_path / "summary.json"
    out = tmp_path / "o.parquet"
    rc = main([
        "aggregate", str(src), "--by", "k,g", "--agg", "n=count(*)", "--agg", "s=sum(v)",
        "--where", "u between 10 and 19 and g in ('a', 'b')", "--having", "n >= 3",
        "-o", str(out), "--json-summary", str(summary), "-q",
    ])  # fmt: skip
    assert rc == 0 and capsys.readouterr().err == ""
    df = t.to_pandas()
    df = df[(df.u >= 10) & (df.u <= 19) & df.g.isin(["a", "b"])]
    g = df.groupby(["k", "g"]).agg(n=("v", "size"), s=("v", "sum"))
    g = g[g.n >= 3]
    result = pq.read_table(out)
    have = {(r["k"], r["g"]): (r["n"], r["s"]) for r in result.to_pylist()}
    assert have.keys() == set(g.index)
    for key, row in g.iterrows():
        assert have[key][0] == row.n and have[key][1] == pytest.approx(row.s)
    info = json.loads(summary.read_text())
    assert info["rows_read"] == len(t) and info["rows_out"] == len(g)  # read: before --where
    assert info["groups"] >= len(g) and info["finished"] is True


def test_json_summary_is_written_atomically(tmp_path, data, capsys):
    src, _ = data
    summary = tmp_path / "summary.json"
    summary.write_text("old")
    argv = ["aggregate", str(src), *ARGS, "-o", str(tmp_path / "o.csv"), "-q"]
    assert main([*argv, "--json-summary", str(summary), "--overwrite"]) == 0
    assert json.loads(summary.read_text())["finished"] is True
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file
    missing = tmp_path / "nowhere" / "s.json"
    assert main([*argv, "--overwrite", "--json-summary", str(missing)]) == 2
    assert f"directory {missing.parent} does not exist" in capsys.readouterr().err


def test_json_summary_replaces_no_file_unasked_and_never_an_input_or_the_output(
    tmp_path, data, capsys
):
    """``--json-summary`` replaced any existing file, exit 0: the output it had just written
    (``-o r.csv --json-summary r.csv``), the input, anything. It is checked as ``-o`` is now,
    before the run, and never names the output or an input."""
    src, _ = data
    out = tmp_path / "o.csv"
    other = tmp_path / "notes.txt"
    other.write_text("keep")
    argv = ["aggregate", str(src), *ARGS, "-o", str(out), "-q"]
    assert main([*argv, "--json-summary", str(other)]) == 2
    assert "--json-summary: output" in capsys.readouterr().err and other.read_text() == "keep"
    assert not out.exists()  # refused before the run
    assert main(argv) == 0
    before = out.read_bytes()
    for target, words in ((out, "is the output"), (src, "is an input")):
        assert main([*argv, "--overwrite", "--json-summary", str(target)]) == 2
        assert words in capsys.readouterr().err
    assert out.read_bytes() == before and pq.read_table(src).num_rows > 0
    fresh = tmp_path / "fresh.csv"  # neither exists yet: the summary replaced the output
    same = ["aggregate", str(src), *ARGS, "-o", str(fresh), "-q"]
    assert main([*same, "--json-summary", str(tmp_path / "." / "fresh.csv")]) == 2
    assert "is the output" in capsys.readouterr().err and not fresh.exists()


def test_the_output_may_not_be_an_input(tmp_path, data, capsys):
    """``-o in.parquet --overwrite`` with ``in.parquet`` the input replaced the file the run
    read (exit 0), through the command and ``aggregate_files(output=...)`` alike; it is
    refused before the run, as ``--json-summary`` is."""
    src, _ = data
    before = src.read_bytes()
    link = tmp_path / "same.parquet"
    link.symlink_to(src)
    for target in (src, link):
        assert main(["aggregate", str(src), *ARGS, "-o", str(target), "--overwrite", "-q"]) == 2
        assert "is an input" in capsys.readouterr().err
        with pytest.raises(QueryError, match="is an input"):
            extagg.aggregate_files(str(src), by="k", aggs=["n=count(*)"], output=str(target),
                                   overwrite=True)  # fmt: skip
    assert src.read_bytes() == before


def test_a_summary_that_cannot_be_written_leaves_the_old_output(
    tmp_path, data, capsys, monkeypatch
):
    """The output was renamed into place before the summary was written: a summary that then
    failed (a full disk; Ctrl-C there) exited 1 (130) with the ``--overwrite``n output replaced.
    The summary is written first now; the message names it."""
    import extagg.io.output as output_module

    src, _ = data
    out = tmp_path / "o.csv"
    out.write_text("old result")
    real = output_module.atomic_output

    def full_disk(path):
        if str(path).endswith(".json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path)

    monkeypatch.setattr(output_module, "atomic_output", full_disk)
    summary = tmp_path / "s.json"
    argv = ["aggregate", str(src), *ARGS, "-o", str(out), "-q", "--overwrite"]
    assert main([*argv, "--json-summary", str(summary)]) == 1
    err = capsys.readouterr().err
    assert f"cannot write the summary {summary}: disk full" in err
    assert out.read_text() == "old result" and sorted(os.listdir(tmp_path)) == [
        "in.parquet",
        "o.csv",
    ]


def test_csv_not_in_utf8_is_an_input_error_naming_the_file(tmp_path, capsys):
    """A Latin-1 CSV: a header that is not UTF-8 stopped the run with Python's bare
    ``'utf-8' codec can't decode`` (no file named), and values that are not were read as
    binary and written as base64, exit 0. Both are now input errors (exit 1) naming the
    file (and the column); ``--encoding`` reads them."""
    head = tmp_path / "latin1_head.csv"
    head.write_bytes("Région,v\nNord,1\n".encode("latin-1"))
    assert main(["aggregate", str(head), "--agg", "s=sum(v)", "-o", "-", "-q"]) == 1
    err = capsys.readouterr().err
    assert f"cannot read {head} as csv: its header is not UTF-8 text" in err
    values = tmp_path / "latin1.csv"
    values.write_bytes("k,v\nCafé,1\n".encode("latin-1"))
    argv = ["aggregate", str(values), "--by", "k", "--agg", "s=sum(v)", "-o", "-", "-q"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert f"cannot read {values}: column 'k' holds text that is not UTF-8" in err
    assert "Q2Fm6Q==" not in out  # no base64 key
    assert main([*argv, "--column-types", "k:binary"]) == 0
    capsys.readouterr()
    assert main([*argv, "--encoding", "latin-1"]) == 0
    assert capsys.readouterr().out.splitlines() == ["k,s", "Café,1"]


def test_a_missing_output_directory_is_a_usage_error_before_the_run(tmp_path, data, capsys):
    """Found after the whole input was read and spilled (exit 1); now before the scan, as
    the ``--json-summary`` folder is (exit 2)."""
    src, _ = data
    missing = tmp_path / "nowhere" / "o.csv"
    assert main(["aggregate", str(src), *ARGS, "-o", str(missing), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"output {missing}: its directory {missing.parent} does not exist" in err
    assert ".extagg-tmp" not in err


def test_temp_files_of_writers_killed_outright_are_removed_by_the_next_write(tmp_path, data):
    """``kill -9`` (or the OOM killer) mid-write left ``.o.csv.XXXX.extagg-tmp`` beside the
    output for good; a temp file names its writer now, and the next write of that output
    removes those whose writer is gone (not a live one's, not another host's)."""
    from extagg.spill.tempdir import process_dir_name

    src, _ = data
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = process_dir_name(child.pid)
    child.kill()
    child.wait()
    live = process_dir_name()
    pid, start, host = dead.split("-")[1:]
    other_host = f"extagg-{pid}-{start}-{int(host, 16) ^ 1:08x}"
    names = {who: f".o.csv.{owner}.k3x9q1.extagg-tmp"
             for who, owner in (("dead", dead), ("live", live), ("other", other_host))}  # fmt: skip
    names["other output"] = f".p.csv.{dead}.k3x9q1.extagg-tmp"
    for name in names.values():
        (tmp_path / name).write_bytes(b"partial")
    out = tmp_path / "o.csv"
    assert main(["aggregate", str(src), *ARGS, "-o", str(out), "-q"]) == 0
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".extagg-tmp"))
    assert left == sorted(names[k] for k in ("live", "other", "other output"))


def test_atomic_output_removes_its_temp_file_on_error(tmp_path):
    from extagg.io.output import atomic_output

    target = tmp_path / "s.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_output(target) as f:
        f.write(b"half")
        raise RuntimeError("stop")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["s.json"]


def test_agg_columns_may_be_quoted(tmp_path, capsys):
    from extagg.columnar.functions import parse_agg_texts as parse_agg_specs

    assert parse_agg_specs(['s=sum("a ""b"" (c)")', "t = max( `q)` )", "count( * )"]) == {
        "s": ('a "b" (c)', "sum"), "t": ("q)", "max"), "count": ("*", "count"),
    }  # fmt: skip
    src = tmp_path / "w.parquet"
    pq.write_table(pa.table({"my col": ["a", "b", "a"], "Prix (€)": [1.0, 2.0, 3.5]}), src)
    out = tmp_path / "o.parquet"
    argv = ["aggregate", str(src), "--by", "my col", "--agg", 's=sum("Prix (€)")', "-o",
            str(out), "-q"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert {r["my col"]: r["s"] for r in pq.read_table(out).to_pylist()} == {"a": 4.5, "b": 2.0}
    # unquoted, the name is no expression but a column of the file: read as that column
    assert main([*argv[:5], "s=sum(Prix (€))", *argv[6:], "--overwrite"]) == 0
    assert {r["my col"]: r["s"] for r in pq.read_table(out).to_pylist()} == {"a": 4.5, "b": 2.0}
    assert main([*argv[:5], "s=sum(Prix (USD))", *argv[6:], "--overwrite"]) == 2
    assert "quoted: 'p=sum(\"Price (EUR)\")'" in capsys.readouterr().err


def test_count_distinct_as_sql_writes_it(tmp_path, capsys):
    """``count(distinct x)`` (SQL's, DuckDB's) is ``count_distinct(x)``; it was read as a
    column named ``distinct x``. Another function with ``distinct`` is a usage error."""
    from extagg.columnar.functions import parse_agg_texts

    assert parse_agg_texts(["u=count(distinct url)", "COUNT( DISTINCT  a * 2 )"]) == {
        "u": ("url", "count_distinct"), "count_distinct_a * 2": ("a * 2", "count_distinct"),
    }  # fmt: skip
    src = tmp_path / "e.parquet"
    pq.write_table(pa.table({"k": [1, 1, 2, 1], "url": ["a", "b", "a", "a"]}), src)
    argv = ["aggregate", str(src), "--by", "k", "--agg", "u=count(distinct url)", "-o", "-", "-q"]
    assert main(argv) == 0
    assert sorted(capsys.readouterr().out.split()) == sorted(["k,u", "1,2", "2,1"])
    assert main([*argv[:5], "s=sum(distinct url)", *argv[6:]]) == 2
    assert "sum(distinct ...) in 's=sum(distinct url)' is not an aggregate here" in (
        capsys.readouterr().err
    )


def test_expressions_over_aggregates(tmp_path, capsys):
    """``--agg 'r=sum(a) / sum(b)'`` (TPC-H Q14's ``100 * sum(case ...) / sum(...)``) was read
    as ``sum`` of a column ``a) / sum(b``: each aggregate inside is computed by the engine
    (hidden), the expression on the result; ``--having`` and ``--order-by`` see its name, and
    the columns come in the order given. In the ``{name: (column, function)}`` form it stays
    a usage error that says what to do."""
    from extagg.columnar.functions import parse_agg_texts

    src = tmp_path / "r.parquet"
    t = table(5_000, keys=40, seed=9)
    pq.write_table(t, src)
    out = tmp_path / "r.parquet.out.parquet"
    argv = [
        "aggregate", str(src), "--by", "k", "--agg", "n=count(*)",
        "--agg", "ratio = sum(v) / sum(u + 1)",
        "--agg", "pct=100.0 * sum(case when g = 'a' then 1 else 0 end) / count(*)",
        "--agg", "spread=max(v) - min(v)", "--having", "pct > 20", "--order-by", "ratio desc",
        "--memory", "2m", "-o", str(out), "--output-format", "parquet", "-q",
    ]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    result = pq.read_table(out)
    assert result.column_names == ["k", "n", "ratio", "pct", "spread"]
    rows = t.to_pylist()
    expected = []
    for k in sorted({r["k"] for r in rows}):
        mine = [r for r in rows if r["k"] == k]
        pct = 100.0 * sum(r["g"] == "a" for r in mine) / len(mine)
        if pct > 20:
            ratio = sum(r["v"] for r in mine) / sum(r["u"] + 1 for r in mine)
            spread = max(r["v"] for r in mine) - min(r["v"] for r in mine)
            expected.append((k, len(mine), ratio, pct, spread))
    expected.sort(key=lambda e: -e[2])
    got = result.to_pylist()
    assert [(r["k"], r["n"]) for r in got] == [(e[0], e[1]) for e in expected]
    for r, e in zip(got, expected, strict=True):
        assert float(r["ratio"]) == pytest.approx(e[2], rel=1e-12)
        assert float(r["pct"]) == pytest.approx(e[3], rel=1e-12)  # a decimal, as 100.0 is
        assert float(r["spread"]) == pytest.approx(e[4], rel=1e-12)
    with pytest.raises(extagg.QueryError, match="an expression over aggregates"):
        parse_agg_texts(["sum(a) / sum(b)"])  # no name
    with pytest.raises(extagg.QueryError, match="an expression over aggregates"):
        extagg.aggregate_files(src, by="k", aggs={"r": "sum(v) / sum(u)"})
    assert parse_agg_texts(["s=sum((a) * (b))", "t=max(c = ')')"]) == {
        "s": ("(a) * (b)", "sum"), "t": ("c = ')'", "max"),
    }  # fmt: skip
    assert main([*argv[:5], "r=sum(g) / count(*)", "-q"]) == 2  # the call named by its text
    assert "aggregate 'sum(g)': sum('g') is not supported" in capsys.readouterr().err
    assert main([*argv[:5], "r=max(g) / count(*)", "-q"]) == 2  # the expression by its name
    assert "aggregate 'r': '/' does not apply to string" in capsys.readouterr().err
    assert main([*argv[:5], "r=sum(v) / sum(v)", *argv[-5:], "--overwrite"]) == 0  # one sum
    assert pq.read_table(out).column_names == ["k", "r"]


def test_outputs_get_the_umask_permissions_or_those_they_replace(tmp_path, data, capsys):
    """The temp file an output is written through (``mkstemp``: 0600) had its mode kept by
    the rename: outputs only their writer could read."""
    src, _ = data
    out = tmp_path / "o.csv"
    old = os.umask(0o027)
    try:
        assert main(["aggregate", str(src), *ARGS, "-o", str(out), "--quiet"]) == 0
        assert (out.stat().st_mode & 0o777) == 0o640
        out.chmod(0o604)
        assert main(["aggregate", str(src), *ARGS, "-o", str(out), "--overwrite", "-q"]) == 0
        assert (out.stat().st_mode & 0o777) == 0o604
    finally:
        os.umask(old)


def test_disk_full_writing_the_json_summary(tmp_path, data, tiny_fs, capsys):
    src, _ = data
    fd = os.open(tiny_fs / "filler", os.O_WRONLY | os.O_CREAT)
    try:  # fill the 1 MiB file system
        while os.write(fd, b"x" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    out = tmp_path / "o.csv"
    rc = main(["aggregate", str(src), *ARGS, "-o", str(out), "-q",
               "--json-summary", str(tiny_fs / "s.json")])  # fmt: skip
    assert rc == 1 and "No space left" in capsys.readouterr().err
    assert os.listdir(tiny_fs) == ["filler"]  # no partial summary, no temp file


def test_sort_under_a_tiny_budget_uses_runs(tmp_path, capsys):
    # ~157 k groups: a result of ~4.7 MB, larger than the whole 3 MiB budget, so the sort
    # needs runs however little the aggregator still holds while its results are read
    t = table(200_000, keys=100_000, seed=5)
    src = tmp_path / "big.parquet"
    pq.write_table(t, src)
    out = tmp_path / "sorted.parquet"
    summary = tmp_path / "s.json"
    rc = main([
        "aggregate", str(src), "--by", "g,k", "--agg", "n=count(*)", "--agg", "s=sum(v)",
        "--memory", "3m", "--sort", "-o", str(out), "--json-summary", str(summary),
        "--spill-dir", str(tmp_path / "spill"), "-q",
    ])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    result = pq.read_table(out)
    check(result, t, ["g", "k"])
    keys = list(zip(result.column("g").to_pylist(), result.column("k").to_pylist()))
    assert keys == sorted(keys)
    info = json.loads(summary.read_text())
    assert info["spill_count"] > 0 and info["sort_runs"] > 1
    assert not [p for p in (tmp_path / "spill").rglob("*") if p.is_file()]


@pytest.mark.parametrize("limit", [None, 7])
def test_order_by_result_columns_descending_in_runs_with_a_limit(tmp_path, capsys, limit):
    """``--order-by 'n desc, s, g, k'`` sorts by aggregates and keys, each way, nulls last
    (DuckDB's); ``--limit`` keeps the first rows (a top-N: each run keeps that many). Under a
    budget that needs sort runs, and every run file gone afterwards."""
    t = table(200_000, keys=100_000, seed=5)
    src = tmp_path / "big.parquet"
    pq.write_table(t, src)
    out = tmp_path / "top.parquet"
    summary = tmp_path / "s.json"
    argv = [
        "aggregate", str(src), "--by", "g,k", "--agg", "n=count(*)", "--agg", "s=max(u)",
        "--memory", "3m", "--order-by", "n desc, s, g DESC, k", "-o", str(out),
        "--json-summary", str(summary), "--spill-dir", str(tmp_path / "spill"), "-q",
    ]  # fmt: skip
    if limit is not None:
        argv += ["--limit", str(limit)]
    assert main(argv) == 0, capsys.readouterr().err
    result = pq.read_table(out).to_pylist()
    grouped = t.group_by(["g", "k"]).aggregate([([], "count_all"), ("u", "max")]).to_pylist()
    expected = sorted(grouped, key=lambda r: (-r["count_all"], r["u_max"], _desc(r["g"]), r["k"]))
    expected = expected if limit is None else expected[:limit]
    assert [(r["g"], r["k"], r["n"], r["s"]) for r in result] == [
        (r["g"], r["k"], r["count_all"], r["u_max"]) for r in expected
    ]
    info = json.loads(summary.read_text())
    assert info["sort_runs"] > 1
    assert not [p for p in (tmp_path / "spill").rglob("*") if p.is_file()]


def _desc(text: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in text)


def test_order_by_and_limit_from_python_and_their_errors(tmp_path, capsys):
    src = tmp_path / "n.parquet"
    pq.write_table(
        pa.table({"k": [1, 2, 3, 1, 2, None], "v": [5.0, None, 1.0, 2.0, None, 3.0]}), src
    )
    reader = extagg.aggregate_files(src, by="k", aggs=["s=sum(v)"], order_by=["s desc"])
    assert reader.read_all().to_pylist() == [
        {"k": 1, "s": 7.0}, {"k": None, "s": 3.0}, {"k": 3, "s": 1.0}, {"k": 2, "s": None},
    ]  # fmt: skip
    first = extagg.aggregate_files(src, by="k", aggs=["n=count(*)"], limit=2).read_all()
    every = extagg.aggregate_files(src, by="k", aggs=["n=count(*)"]).read_all()
    assert first.to_pylist() == every.slice(0, 2).to_pylist()  # hash order, cut
    none = extagg.aggregate_files(src, by="k", aggs=["n=count(*)"], order_by="k", limit=0)
    assert none.read_all().num_rows == 0
    with pytest.raises(extagg.QueryError, match=r"unknown result column 'ss'.*did you mean 's'"):
        extagg.aggregate_files(src, by="k", aggs=["s=sum(v)"], order_by="ss desc")
    with pytest.raises(extagg.QueryError, match="not both"):
        extagg.aggregate_files(src, by="k", aggs=["s=sum(v)"], order_by="s", sort=True)
    with pytest.raises(extagg.QueryError, match="limit must be a whole number"):
        extagg.aggregate_files(src, by="k", aggs=["s=sum(v)"], limit=-1)
    with pytest.raises(SystemExit) as stop:  # argparse's usage error
        main(["aggregate", str(src), "--by", "k", "--agg", "s=sum(v)", "--limit", "x"])
    assert stop.value.code == 2 and "give a number of rows" in capsys.readouterr().err
    assert main(["aggregate", str(src), "--by", "k", "--agg", "s=sum(v)", "--order-by",
                 "nope", "-q"]) == 2  # fmt: skip
    assert "unknown result column 'nope'" in capsys.readouterr().err


def test_sort_by_a_half_float_key_in_runs(tmp_path, capsys):
    """``--sort`` by a ``float16`` column raised ``ArrowNotImplementedError: halffloat`` (a
    traceback): Arrow's sort has no half-float kernel. Sorted as float32, in runs too."""
    rng = np.random.default_rng(3)
    values = rng.integers(-2000, 2000, 150_000).astype(np.float16) / np.float16(8)
    values[::97] = np.nan
    t = pa.table({"h": pa.array(values, pa.float16(), mask=np.arange(len(values)) % 89 == 0),
                  "s": pa.array([f"name-{i % 30_000}" for i in range(len(values))])})  # fmt: skip
    src = tmp_path / "half.arrow"
    with pa.OSFile(str(src), "wb") as sink, pa.ipc.new_file(sink, t.schema) as writer:
        writer.write_table(t)
    out = tmp_path / "sorted.parquet"
    rc = main(["aggregate", str(src), "--by", "h,s", "--agg", "n=count(*)", "--sort",
               "--memory", "2m", "-o", str(out), "-q"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    result = pq.read_table(out)
    assert result.schema.field("h").type == pa.float16()
    assert sum(result.column("n").to_pylist()) == len(values)
    rows = zip(result.column("h").to_pylist(), result.column("s").to_pylist(), strict=True)
    # numbers ascending, then NaN, then null (Arrow's order); then the names
    keys = [(h is None, h is not None and h != h, h if h == h else 0.0, s) for h, s in rows]
    assert keys == sorted(keys)


def test_where_on_a_half_float_column(tmp_path, capsys):
    """``--where`` on a ``float16`` column was refused ("'>' does not apply to halffloat and
    double": Arrow's compute has no half-float kernels); it is compared as float32, in the
    Parquet scan's row-group pruning and in the rows' filter."""
    x = np.array([0.5, 1.5, 2.5, np.nan, -0.0, 65504, 3.0], np.float16)
    t = pa.table({"k": [1, 1, 2, 2, 3, 3, 4], "x": pa.array(x)})
    src = tmp_path / "half.parquet"
    pq.write_table(t, src, row_group_size=2)
    out = tmp_path / "o.parquet"
    for where, want in [
        ("x between 0.5 and 2", {1: 2}),
        ("x in (0.5, 2.5) or x = 0", {1: 1, 2: 1, 3: 1}),
        ("x + 1 > 60000 and k < 4", {2: 1, 3: 1}),  # NaN above every number, as in Spark
    ]:
        argv = ["aggregate", str(src), "--by", "k", "--agg", "n=count(*)", "--where", where,
                "-o", str(out), "--overwrite", "-q"]  # fmt: skip
        assert main(argv) == 0, capsys.readouterr().err
        got = pq.read_table(out).to_pylist()
        assert {r["k"]: r["n"] for r in got} == want, where


@pytest.mark.parametrize("memory", ["1m", "2m"])
def test_sort_does_not_starve_the_partitions_it_reads(tmp_path, capsys, memory):
    """The sort's buffer held what it could get while the aggregation's hash partitions were
    still aggregated (as its results are read): a string max failed at 2m with an internal
    RuntimeError and at 1m with a MemoryLimitError, where the unsorted query passes. The
    buffer is now written as a run when another consumer runs short."""
    rng = np.random.default_rng(1)
    names = np.array([f"user-{i}-ü" for i in range(50_000)], dtype=object)
    n = 300_000
    t = pa.table({"k": rng.integers(0, 60_000, n), "s": names[rng.integers(0, 50_000, n)]})
    src = tmp_path / "in.parquet"
    pq.write_table(t, src, row_group_size=30_000)
    out = tmp_path / "sorted.parquet"
    rc = main([
        "aggregate", str(src), "--by", "k", "--agg", "mx=max(s)", "--agg", "n=count(*)",
        "--memory", memory, "--sort", "-o", str(out), "-q",
    ])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    result = pq.read_table(out)
    want = t.group_by("k").aggregate([("s", "max"), ("s", "count")]).sort_by("k")
    assert result.column("k").to_pylist() == want.column("k").to_pylist()
    assert result.column("mx").to_pylist() == want.column("s_max").to_pylist()
    assert result.column("n").to_pylist() == want.column("s_count").to_pylist()


def test_count_distinct_under_a_tiny_budget(tmp_path, capsys):
    t = table(150_000, keys=20_000, seed=9)
    src = tmp_path / "cd.parquet"
    pq.write_table(t, src)
    out = tmp_path / "cd.parquet.out.parquet"
    summary = tmp_path / "s.json"
    rc = main([
        "aggregate", str(src), "--by", "k", "--agg", "d=count_distinct(u)", "--agg",
        "n=count(*)", "--memory", "2m", "--spill-dir", str(tmp_path / "spill"),
        "-o", str(out), "--json-summary", str(summary), "-q",
    ])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    g = t.to_pandas().groupby("k").u
    want = {k: (d, n) for (k, d), n in zip(g.nunique().items(), g.size())}
    have = {r["k"]: (r["d"], r["n"]) for r in pq.read_table(out).to_pylist()}
    assert have == want
    assert not [p for p in (tmp_path / "spill").rglob("*") if p.is_file()]
    assert json.loads(summary.read_text())["spill_count"] > 0


def test_by_without_agg_gives_the_distinct_keys(tmp_path, capsys):
    # SELECT DISTINCT g, k: every pair once, under a budget that forces spills, sorted or not
    t = table(150_000, keys=30_000, seed=11)
    src = tmp_path / "d.csv"
    pacsv.write_csv(t, src)
    want = set(zip(t.column("g").to_pylist(), t.column("k").to_pylist()))
    for extra in ([], ["--sort"]):
        out = tmp_path / f"distinct{len(extra)}.parquet"
        summary = tmp_path / f"s{len(extra)}.json"
        rc = main([
            "aggregate", str(src), "--by", "g,k", "--memory", "2m", "-o", str(out),
            "--json-summary", str(summary), "--spill-dir", str(tmp_path / "spill"), "-q", *extra,
        ])  # fmt: skip
        assert rc == 0, capsys.readouterr().err
        result = pq.read_table(out)
        assert result.column_names == ["g", "k"]
        pairs = list(zip(result.column("g").to_pylist(), result.column("k").to_pylist()))
        assert len(pairs) == len(want) and set(pairs) == want
        if extra:
            assert pairs == sorted(pairs)
        assert json.loads(summary.read_text())["spill_count"] > 0
        assert not [p for p in (tmp_path / "spill").rglob("*") if p.is_file()]


def test_aggregate_files_without_aggs_is_select_distinct(tmp_path):
    import extagg

    t = table(40_000, keys=3_000, seed=12)
    src = tmp_path / "d.parquet"
    pq.write_table(t, src, row_group_size=5_000)
    reader = extagg.aggregate_files(src, by="k", where="u < 10", having="k >= 100", threads=2)
    got_keys = reader.read_all().column("k").to_pylist()
    kept = t.filter(pc.less(t.column("u"), 10)).column("k").to_pylist()
    assert sorted(got_keys) == sorted({k for k in kept if k >= 100})
    with pytest.raises(ValueError, match="no keys and no aggregates"):
        extagg.aggregate_files(src)


def test_same_answers_as_duckdb(tmp_path, data, capsys):
    duckdb = pytest.importorskip("duckdb")
    src, _ = data
    out = tmp_path / "q.parquet"
    rc = main([
        "aggregate", str(src), "--by", "g", "--agg", "n=count(*)", "--agg", "s=sum(v)",
        "--agg", "m=mean(u)", "--agg", "hi=max(v)", "--where", "u < 25 and v > 1.5",
        "-o", str(out), "-q",
    ])  # fmt: skip
    assert rc == 0
    mine = {r["g"]: (r["n"], r["s"], r["m"], r["hi"]) for r in pq.read_table(out).to_pylist()}
    con = duckdb.connect()
    rows = con.execute(
        f"select g, count(*), sum(v), avg(u), max(v) from read_parquet('{src}') "
        "where u < 25 and v > 1.5 group by g"
    ).fetchall()
    assert mine.keys() == {r[0] for r in rows}
    for g, n, s, m, hi in rows:
        assert mine[g][0] == n and mine[g][3] == hi
        assert mine[g][1] == pytest.approx(s, rel=1e-9) and mine[g][2] == pytest.approx(m)


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    [
        (["--by", "kk", "--agg", "n=count(*)"], 2, ["unknown column 'kk'", "did you mean 'k'",
                                                    "available: k, g, v, u"]),
        (["--by", "k", "--agg", "n=counts(v)"], 2, ["unknown aggregate function 'counts'",
                                                   "did you mean 'count'?",
                                                   "count, count_distinct, count_if"]),
        (["--by", "k", "--agg", "n count"], 2, ["NAME=FUNC(COLUMN)"]),
        (["--by", "K", "--agg", "n=count(*)"], 2, ["unknown column 'K'", "did you mean 'k'"]),
        (["--by", "k", "--agg", "n=count(*)", "--memory", "12 parsecs"], 2, ["'12 parsecs'"]),
        (["--by", "k", "--agg", "n=count(*)", "--memory", "100k"], 2,
         ["100.0 KiB", "below the engines' working minimum"]),
        (["--by", "k", "--agg", "n=count(*)", "--where", "u > > 1"], 2, ["position 4", "^"]),
        (["--by", "k", "--agg", "n=count(*)", "--having", "nn > 1"], 2,
         ["unknown result column 'nn'", "did you mean 'n'"]),
        (["--by", "k", "--agg", "n=count(*)", "-o", "x.xlsx"], 2, ["--output-format"]),
        ([], 2, ["give --by (its distinct values) or at least one --agg"]),
        (["--by", "k,g,k", "--agg", "n=count(*)"], 2, ["['k'] given twice"]),
        (["--by", "k", "--agg", "k=count(*)"], 2, ["['k'] have the names of key columns"]),
        (["--by", "k", "--agg", "n=count(*)", "--where", "g > 1"], 2,
         ["'>' does not apply to string and int", "position 2"]),
        (["--by", "k", "--agg", "n=count(*)", "--where", "u in ('x')"], 2,
         ["values of 'in' cannot be read as int64"]),
    ],
)  # fmt: skip
def test_usage_errors_exit_2(data, argv, code, words, capsys):
    src, _ = data
    assert main(["aggregate", str(src), *argv]) == code
    err = capsys.readouterr().err
    for w in words:
        assert w in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("value", ["zz", "100k", "0"])
def test_a_bad_memory_variable_is_a_usage_error(data, value, monkeypatch, capsys):
    """``EXTAGG_MEMORY=zz`` exited 1 (a runtime failure) where ``--memory zz`` exits 2."""
    monkeypatch.setenv("EXTAGG_MEMORY", value)
    src, _ = data
    assert main(["aggregate", str(src), "--by", "k", "--agg", "n=count(*)", "-q"]) == 2
    assert "EXTAGG_MEMORY" in capsys.readouterr().err or value == "100k"


@pytest.mark.parametrize(
    "variable, value",
    [("EXTAGG_MAX_SPILL_BYTES", "12q"), ("EXTAGG_MAX_SPILL_BYTES", "-1"),
     ("EXTAGG_MEMORY_WAIT_TIMEOUT", "soon"), ("EXTAGG_MEMORY_WAIT_TIMEOUT", "0")],
)  # fmt: skip
def test_a_bad_setting_in_the_environment_is_a_usage_error(data, variable, value, monkeypatch,
                                                           capsys):  # fmt: skip
    """A bad ``EXTAGG_MAX_SPILL_BYTES`` or ``EXTAGG_MEMORY_WAIT_TIMEOUT`` exited 1, as a
    runtime failure, where a bad ``EXTAGG_MEMORY`` or ``--memory`` exits 2."""
    monkeypatch.setenv(variable, value)
    src, _ = data
    assert main(["aggregate", str(src), "--by", "k", "--agg", "n=count(*)", "-q"]) == 2
    assert variable in capsys.readouterr().err


def test_quoted_values_take_the_column_type_and_aggs_may_be_texts(data):
    """``u >= '25'`` reads the text as ``u``'s type, in the row-group pruning too (Arrow's
    pruning failed on ``u in ('1')``); ``aggs`` may be the ``--agg`` texts."""
    src, t = data
    got = extagg.aggregate_files(
        src, by="g", aggs=["n=count(*)", "sum(v)"], where="u >= '25' and u not in ('30')"
    ).read_all()
    df = t.to_pandas()
    df = df[(df.u >= 25) & (df.u != 30)]
    want = df.groupby("g").agg(n=("v", "size"), s=("v", "sum"))
    mine = {r["g"]: (r["n"], r["sum_v"]) for r in got.to_pylist()}
    assert mine.keys() == set(want.index)
    for g, row in want.iterrows():
        assert mine[g][0] == row.n and mine[g][1] == pytest.approx(row.s, rel=1e-9)


def test_text_outputs_take_binary_values_and_non_finite_floats(tmp_path, capsys):
    """CSV failed on a binary value that is not UTF-8 ("Invalid UTF8 payload"); JSON Lines
    wrote bare NaN/Infinity, which JSON readers reject. Both are read back by pyarrow."""
    import base64
    import json

    import pyarrow.csv as pacsv

    src = tmp_path / "b.parquet"
    pq.write_table(
        pa.table({
            "k": ["a", "b", "a", "c"],
            "blob": pa.array([b"\x00\xff", b"x", b"\x01", None], pa.binary()),
            "f": [1.5, float("nan"), float("inf"), -float("inf")],
        }),
        src,
    )  # fmt: skip
    aggs = ["--agg", "mx=max(blob)", "--agg", "s=sum(f)", "--sort", "-q"]
    for ext in ("csv", "tsv", "jsonl"):
        out = tmp_path / f"o.{ext}"
        assert main(["aggregate", str(src), "--by", "k", *aggs, "-o", str(out)]) == 0, (
            capsys.readouterr().err
        )
        if ext in ("csv", "tsv"):
            read = pacsv.ConvertOptions(strings_can_be_null=True)
            parse = pacsv.ParseOptions(delimiter="," if ext == "csv" else "\t")
            rows = pacsv.read_csv(out, parse_options=parse, convert_options=read).to_pylist()
        else:
            rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        got = {r["k"]: (r["mx"], r["s"]) for r in rows}
        assert base64.b64decode(got["a"][0]) == b"\x01" and got["c"][0] is None
        assert base64.b64decode(got["b"][0]) == b"x"
        if ext in ("csv", "tsv"):
            assert got["a"][1] == float("inf")  # nan: pyarrow reads it as null, so by text
            line = out.read_text(encoding="utf-8").splitlines()[2]
            assert line == "b,eA==,nan".replace(",", "," if ext == "csv" else "\t")
        else:
            assert (got["a"][1], got["b"][1], got["c"][1]) == ("Infinity", "NaN", "-Infinity")


def test_csv_writes_lists_structs_and_maps_as_json_text(tmp_path, capsys):
    """Arrow's CSV writer refused nested columns (``Unsupported Type:list<item: string>``,
    exit 1 after the whole run): they are written as their JSON text, as in JSON Lines."""
    import json

    src = tmp_path / "nested.jsonl"
    src.write_text(
        "".join(
            json.dumps({"tags": ["a", "b"][: i % 3], "u": {"id": i % 2, "n": "x"}, "v": i}) + "\n"
            for i in range(9)
        )
    )
    out = tmp_path / "o.csv"
    argv = ["aggregate", str(src), "--by", "tags", "--agg", "s=sum(v)", "--agg", "f=first(u)"]
    assert main([*argv, "-q", "-o", str(out)]) == 0, capsys.readouterr().err
    rows = pacsv.read_csv(out).to_pylist()
    got = sorted((json.loads(r["tags"]), r["s"], json.loads(r["f"])) for r in rows)
    assert got == [
        ([], 9, {"id": 0, "n": "x"}),
        (["a"], 12, {"id": 1, "n": "x"}),
        (["a", "b"], 15, {"id": 0, "n": "x"}),
    ]
    assert main([*argv, "--sort", "-q"]) == 2  # a usage error before any row is read
    assert "--sort cannot order key 'tags' of type list<item: string>" in capsys.readouterr().err


def test_json_text_of_nested_values_has_no_bare_nan(tmp_path, capsys):
    """A NaN or infinity inside a list, struct or map was written bare (``[1.0, NaN]``) in
    JSON Lines and in CSV's JSON text, which strict JSON readers reject; now as the string
    Spark writes, as a top-level float already was."""
    import json

    import pyarrow.csv as pacsv

    def strict(text: str) -> object:
        def refuse(name: str) -> object:
            raise ValueError(f"bare {name} in {text!r}")

        return json.loads(text, parse_constant=refuse)

    nan, inf = float("nan"), float("inf")
    src = tmp_path / "n.parquet"
    pq.write_table(
        pa.table({
            "k": ["a", "b", "c"],
            "l": pa.array([[1.0, nan], [-inf], None], pa.list_(pa.float64())),
            "s": pa.array([{"x": inf, "y": 1}, {"x": 2.0, "y": 2}, None],
                          pa.struct([("x", pa.float64()), ("y", pa.int64())])),
            "m": pa.array([[("p", nan)], [], None], pa.map_(pa.string(), pa.float32())),
        }),
        src,
    )  # fmt: skip
    argv = ["aggregate", str(src), "--by", "k", "--agg", "l=first(l)", "--agg", "s=first(s)",
            "--agg", "m=first(m)", "--sort", "-q"]  # fmt: skip
    out = tmp_path / "o.jsonl"
    assert main([*argv, "-o", str(out)]) == 0, capsys.readouterr().err
    rows = [strict(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows[0] == {"k": "a", "l": [1.0, "NaN"], "s": {"x": "Infinity", "y": 1},
                       "m": [["p", "NaN"]]}  # fmt: skip
    assert rows[1] == {"k": "b", "l": ["-Infinity"], "s": {"x": 2.0, "y": 2}, "m": []}
    assert rows[2] == {"k": "c", "l": None, "s": None, "m": None}
    out = tmp_path / "o.csv"
    assert main([*argv, "-o", str(out)]) == 0, capsys.readouterr().err
    first = pacsv.read_csv(out).to_pylist()[0]
    assert strict(first["l"]) == [1.0, "NaN"] and strict(first["m"]) == [["p", "NaN"]]


def test_a_sum_near_the_range_is_no_overflow_and_a_real_one_no_traceback(tmp_path, capsys):
    """The kernels' warm-up folded the first rows twice and read the result: one value of
    2^62 + 1 (or a 38-digit decimal of 6e37) failed as an overflow. A sum that does pass
    the range printed a traceback."""
    import decimal

    src = tmp_path / "big.parquet"
    pq.write_table(
        pa.table({
            "k": ["a"],
            "x": pa.array([2**62 + 1], pa.int64()),
            "d": pa.array([decimal.Decimal(6 * 10**37)], pa.decimal128(38, 0)),
        }),
        src,
    )  # fmt: skip
    out = tmp_path / "o.jsonl"
    argv = ["aggregate", str(src), "--by", "k", "--agg", "s=sum(x)", "--agg", "t=sum(d)", "-q"]
    assert main([*argv, "-o", str(out)]) == 0, capsys.readouterr().err
    assert out.read_text() == f'{{"k": "a", "s": {2**62 + 1}, "t": "{6 * 10**37}"}}\n'
    over = tmp_path / "over.parquet"
    pq.write_table(pa.table({"k": ["a"] * 3, "x": pa.array([2**62] * 3, pa.int64())}), over)
    proc = subprocess.run(
        [sys.executable, "-m", "extagg", "aggregate", str(over), "--by", "k", "--agg",
         "s=sum(x)", "-q"], capture_output=True, text=True, env=_env(), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "extagg aggregate: error:" in proc.stderr and "int64" in proc.stderr


def test_csv_nulls_are_empty_fields_only(tmp_path, capsys):
    """Arrow's default null markers read Namibia's code NA, "n/a" and NULL as nulls and a
    float's nan as null (extagg's own CSV writes NaN as nan): only an empty field is null,
    a quoted empty one the empty string, as in DuckDB, Polars and Spark."""
    import json

    src = tmp_path / "na.csv"
    src.write_text('country,v,f\nNA,1,nan\nUS,2,1.5\nNA,3,NaN\n"NA",4,2\nn/a,5,\n,6,1\n"",7,1\n')
    out = tmp_path / "o.jsonl"
    aggs = ["n=count(*)", "s=sum(v)", "sf=sum(f)", "cf=count(f)"]
    argv = ["aggregate", str(src), "--by", "country", *(a for g in aggs for a in ("--agg", g)),
            "--sort", "-q", "-o", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["country"], r["n"], r["s"], r["sf"], r["cf"]) for r in got] == [
        ("", 1, 7, 1.0, 1),
        ("NA", 3, 8, "NaN", 3),
        ("US", 1, 2, 1.5, 1),
        ("n/a", 1, 5, None, 0),
        (None, 1, 6, 1.0, 1),
    ]


def _stdin_bytes(t: pa.Table, kind: str, tmp_path: Path) -> bytes:
    """``t`` as the bytes of a file of ``kind`` (``csv.gz``: gzip'd CSV...)."""
    path = tmp_path / f"src.{kind}"
    fmt, _, compression = kind.partition(".")
    if fmt == "parquet":
        pq.write_table(t, path, row_group_size=5_000)
        return path.read_bytes()
    if fmt in ("arrow", "arrows"):
        with pa.OSFile(str(path), "wb") as sink:
            new = pa.ipc.new_file if fmt == "arrow" else pa.ipc.new_stream
            with new(sink, t.schema) as writer:
                writer.write_table(t, max_chunksize=5_000)
        return path.read_bytes()
    if fmt == "csv":
        pacsv.write_csv(t, path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in t.to_pylist()))
    raw = path.read_bytes()
    import bz2
    import gzip

    compress = {"": bytes, "gz": gzip.compress, "bz2": bz2.compress,
                "zst": lambda b: pa.compress(b, codec="zstd", asbytes=True)}  # fmt: skip
    return compress[compression](raw)


@pytest.mark.parametrize(
    "kind", ["csv", "csv.gz", "csv.bz2", "csv.zst", "jsonl", "jsonl.gz", "parquet", "arrow",
             "arrows"],
)  # fmt: skip
def test_standard_input_read_in_every_format(tmp_path, capsys, monkeypatch, kind):
    """``-`` reads standard input: it was "no such file: -". Its format is told from its
    first bytes (magic numbers, a JSON object, else CSV; compressed ones decompressed to tell),
    it is copied to the spill folder to be read as a file, and the copy is gone after."""
    t = table(20_000, keys=300, seed=5)
    src = tmp_path / "stdin.bin"
    src.write_bytes(_stdin_bytes(t, kind, tmp_path))
    spill = tmp_path / "spill"
    spill.mkdir()
    out = tmp_path / "out.parquet"
    with open(src, "rb") as raw:
        monkeypatch.setattr(sys, "stdin", __import__("io").TextIOWrapper(raw))
        argv = ["aggregate", "-", *ARGS, "--spill-dir", str(spill), "-o", str(out), "-q"]
        assert main(argv) == 0, capsys.readouterr().err
    check(pq.read_table(out), t, ["k"])
    assert not [p for p in spill.rglob("*") if p.is_file()]


def test_standard_input_through_a_pipe_and_a_fifo(tmp_path, capsys):
    """``cat f.csv.gz | extagg aggregate -`` as a shell runs it, and a FIFO (``<(zcat ...)``)
    named as a path: both were refused or read as empty (0 rows, exit 0: the data silently
    lost); they are copied and read whole."""
    import gzip
    import threading

    t = table(30_000, keys=500, seed=6)
    raw = tmp_path / "in.csv"
    pacsv.write_csv(t, raw)
    cmd = [sys.executable, "-m", "extagg", "aggregate", "-", *ARGS, "-o", "-", "-q"]
    proc = subprocess.run(cmd, input=gzip.compress(raw.read_bytes()), capture_output=True,
                          timeout=300, env=_env())  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    check(pacsv.read_csv(pa.py_buffer(proc.stdout)), t, ["k"])

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(raw.read_bytes()))
    writer.start()
    out = tmp_path / "o.parquet"
    assert main(["aggregate", str(fifo), *ARGS, "-o", str(out), "-q"]) == 0
    writer.join()
    check(pq.read_table(out), t, ["k"])
    with pytest.raises(extagg.InputError, match="not a regular file"):  # the library: files
        extagg.aggregate_files(str(fifo), by=["k"], aggs=["n=count(*)"])
    # a FIFO named like a file is read as its extension says: a .tsv whose header has a comma
    # (read as CSV, its columns would be "k\tv" and "w")
    tsv = tmp_path / "pipe.tsv"
    os.mkfifo(tsv)
    writer = threading.Thread(target=lambda: tsv.write_text("k\tv,w\na\t1\nb\t2\na\t3\n"))
    writer.start()
    argv = ["aggregate", str(tsv), "--by", "k", "--agg", 's=sum("v,w")', "--sort", "-o", "-"]
    assert main([*argv, "-q"]) == 0
    writer.join()
    assert capsys.readouterr().out == "k,s\na,4\nb,2\n"
    with pytest.raises(extagg.InputError, match="no input"):
        extagg.aggregate_files([], by=["k"], aggs=["n=count(*)"])


def test_standard_input_errors_name_it(tmp_path, capsys, monkeypatch):
    """An error in what came on standard input names "standard input", not its copy; the copy
    is removed; a terminal as standard input and bytes whose format cannot be told are usage
    errors that say what to do."""
    import io

    spill = tmp_path / "spill"
    spill.mkdir()
    base = ["aggregate", "-", "--by", "k", "--agg", "s=sum(v)", "--spill-dir", str(spill), "-q"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"k,v\na,1\nb,x\n")))
    assert main([*base, "--column-types", "v:int"]) == 1
    err = capsys.readouterr().err
    assert "cannot read standard input as csv" in err and "invalid value 'x'" in err, err
    assert "input-" not in err and not [p for p in spill.rglob("*") if p.is_file()]

    truncated = pa.compress(b"k,v\n" + b"a,1\n" * 100_000, codec="zstd", asbytes=True)[:40]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(truncated)))
    assert main(base) == 1
    assert "cannot read standard input as csv: Truncated" in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\x1f\x8bnot gzip at all")))
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "cannot tell the format of standard input" in err and "give --format" in err

    _, terminal = os.openpty()
    with open(terminal, "rb") as tty:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(tty))
        assert main(base) == 2
    assert "it is a terminal: pipe the data in" in capsys.readouterr().err
    assert not [p for p in spill.rglob("*") if p.is_file()]


def test_ctrl_c_while_standard_input_is_copied(tmp_path):
    """A Ctrl-C while standard input is still coming (its copy half written): exit 130 at
    once, the copy removed."""
    spill = tmp_path / "spill"
    spill.mkdir()
    cmd = [sys.executable, "-m", "extagg", "aggregate", "-", "--agg", "n=count(*)",
           "--spill-dir", str(spill), "-q"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
                            preexec_fn=_sigint_as_at_a_shell)  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(b"k,v\n" + b"a,1\n" * 400_000)  # more than one block: the copy starts
    proc.stdin.flush()
    deadline = time.monotonic() + 60
    while not [p for p in _files_below(spill) if p.stat().st_size] and proc.poll() is None:
        assert time.monotonic() < deadline, "standard input was never copied"
        time.sleep(0.02)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert time.monotonic() - sent < 5 and b"interrupted" in err and b"Traceback" not in err
    assert not [p for p in spill.rglob("*") if p.is_file()]


def test_csv_values_with_newlines_across_blocks(tmp_path, capsys):
    """A quoted value holding a newline failed once the file spanned more than one parse
    block ("Expected 3 columns, got 2" / "out of sync with chunker")."""
    import json

    src = tmp_path / "notes.csv"
    lines = ["k,note,v"]
    for i in range(60_000):
        lines.append(f'{"abc"[i % 3]},"line one {i}\nline, two",{i % 7}')
    src.write_text("\n".join(lines) + "\n")
    assert src.stat().st_size > 1 << 20  # blocks of 64-256 KiB at 4 MiB
    out = tmp_path / "o.jsonl"
    argv = ["aggregate", str(src), "--by", "k", "--agg", "n=count(*)", "--agg", "s=sum(v)",
            "--agg", "m=max(note)", "--memory", "4m", "--sort", "-q", "-o", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["k"], r["n"]) for r in got] == [("a", 20_000), ("b", 20_000), ("c", 20_000)]
    assert sum(r["s"] for r in got) == sum(i % 7 for i in range(60_000))
    assert got[0]["m"] == "line one 9999\nline, two"


def test_output_through_a_symlink_replaces_its_target_and_a_pipe_is_refused(tmp_path, data, capsys):
    """``-o link --overwrite`` replaced the symlink by a regular file (its target kept the
    old result); a FIFO was replaced, its reader given nothing."""
    src, _ = data
    target, link = tmp_path / "target.csv", tmp_path / "link.csv"
    target.write_text("old\n")
    link.symlink_to(target)
    argv = ["aggregate", str(src), "--by", "g", "--agg", "n=count(*)", "-q", "--overwrite"]
    assert main([*argv, "-o", str(link)]) == 0, capsys.readouterr().err
    assert link.is_symlink() and target.read_text().startswith("g,n\n")
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    assert main([*argv, "-o", str(fifo)]) == 2  # refused before the run, as a usage error
    assert "is not a regular file" in capsys.readouterr().err
    assert fifo.is_fifo() and not [p for p in tmp_path.iterdir() if "extagg-tmp" in p.name]


def test_unfinished_outputs_are_removed_when_the_command_leaves_at_once(tmp_path):
    """The command leaves with ``os._exit`` on a Ctrl-C while kernels compile (no writer's
    ``abort`` runs): the temp files of outputs still being written are removed, the
    finished ones are not."""
    from extagg.io.output import ResultWriter, remove_unfinished_outputs

    t = pa.table({"k": [1, 2, 3]})
    with ResultWriter(str(tmp_path / "done.csv"), "csv", t.schema) as writer:
        writer.write(t.to_batches()[0])
    unfinished = ResultWriter(str(tmp_path / "partial.parquet"), "parquet", t.schema)
    unfinished.write(t.to_batches()[0])
    assert len([p for p in tmp_path.iterdir() if "extagg-tmp" in p.name]) == 1
    remove_unfinished_outputs()
    assert [p.name for p in tmp_path.iterdir()] == ["done.csv"]
    unfinished.abort()  # nothing left to remove: no error


def test_parquet_pages_of_many_distinct_strings_do_not_follow_the_batches(tmp_path):
    """A text column of many distinct values (a dictionary that outgrows its page): the
    Parquet writer's pages followed the result batches' lengths past 4096 rows, so 1 M string
    keys gave other file bytes at each budget and thread count (a probe found four digests)."""
    import numpy as np

    from extagg.io.output import ResultWriter

    rng = np.random.default_rng(3)
    n = 150_000
    ids = rng.permutation(n)
    names = pa.array([f"user-{i}-" + "x" * (i % 40) for i in ids.tolist()])
    result = pa.table({"name": names, "n": pa.array(ids, pa.int64())})
    digests = set()
    for rows in (1_000, 4_097, 65_536, 150_000):
        out = tmp_path / f"o{rows}.parquet"
        with ResultWriter(str(out), "parquet", result.schema) as writer:
            for batch in result.to_batches(max_chunksize=rows):
                writer.write(batch)
        digests.add(out.read_bytes())
    assert len(digests) == 1
    assert pq.read_table(out).equals(result)


@pytest.mark.parametrize("suffix", ["parquet", "arrow"])
def test_output_bytes_depend_on_the_rows_only(tmp_path, capsys, suffix):
    """Row groups (Arrow IPC: record batches) of one size whatever the result batches (they
    follow the budget, the spills and the threads): the same file bytes at 4 MiB and with no
    limit, on one thread or two; Parquet numbers written without dictionary pages (a row per
    group: they rarely repeat)."""
    from extagg.io.output import parquet_row_group_rows

    src = tmp_path / "in.parquet"
    pq.write_table(table(600_000, keys=200_000, seed=9), src)
    digests = set()
    for memory, threads in (("4m", "1"), ("4m", "2"), ("1g", "1"), ("1g", "2")):
        out = tmp_path / f"o-{memory}-{threads}.{suffix}"
        assert main(["aggregate", str(src), "--by", "k,g", "--agg", "s=sum(v)", "--memory", memory,
                     "--threads", threads, "-q", "-o", str(out)]) == 0  # fmt: skip
        digests.add(out.read_bytes())
    assert len(digests) == 1
    if suffix == "arrow":
        import pyarrow.ipc

        reader = pyarrow.ipc.open_file(out)
        rows = parquet_row_group_rows(reader.schema)
        sizes = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
        assert sizes[:-1] == [rows] * (len(sizes) - 1) and 0 < sizes[-1] <= rows
        assert sum(sizes) == reader.read_all().num_rows > rows
        return
    meta = pq.read_metadata(out)
    rows = parquet_row_group_rows(pq.read_schema(out))
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sizes[:-1] == [rows] * (len(sizes) - 1) and 0 < sizes[-1] <= rows and len(sizes) > 1
    chunk = meta.row_group(0)
    encodings = {chunk.column(i).path_in_schema: chunk.column(i).encodings for i in range(3)}
    assert not any("DICTIONARY" in e for e in encodings["k"] + encodings["s"])
    assert any("DICTIONARY" in e for e in encodings["g"])  # text keeps its dictionary


def test_runtime_errors_exit_1(tmp_path, capsys):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet at all PAR1")
    assert main(["aggregate", str(bad), "--by", "k", "--agg", "n=count(*)"]) == 1
    err = capsys.readouterr().err
    assert "bad.parquet" in err and "Traceback" not in err
    assert main(["aggregate", str(tmp_path / "none.csv"), "--agg", "n=count(*)"]) == 1
    assert "no such file" in capsys.readouterr().err


def test_a_mistyped_path_or_budget_fails_before_arrow_and_the_kernels_load(tmp_path):
    """Checked first, with nothing heavy imported: the error comes at once (0.1 s, not the
    ~1 s it takes to load pyarrow, numba and the kernels), with the same exit codes."""
    script = (
        "import sys\n"
        "from extagg.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print(code, sorted(m for m in ('pyarrow', 'numba', 'numpy') if m in sys.modules))\n"
    )
    src = tmp_path / "t.csv"
    src.write_text("k,v\na,1\n", encoding="utf-8")
    cases = [
        ([str(tmp_path / "nope.parquet"), "--agg", "n=count(*)"], "1 []", "no such file"),
        ([str(tmp_path / "*.json"), "--agg", "n=count(*)"], "1 []", "no file matches"),
        ([str(src), "--agg", "n=count(*)", "--memory", "9 parsecs"], "2 []", "unknown unit"),
        ([str(src), "--agg", "n=count(*)", "--memory", "10k"], "2 []", "working minimum"),
    ]
    for argv, printed, words in cases:
        done = subprocess.run(
            [sys.executable, "-c", script, "aggregate", *argv],
            capture_output=True, text=True, env=_env(), timeout=120,
        )  # fmt: skip
        assert done.stdout.strip() == printed, (argv, done.stdout, done.stderr)
        assert words in done.stderr


def _files_below(folder: Path) -> list[Path]:
    """The files below ``folder`` while a run may be removing them: a folder removed while it
    was listed is listed again (``rglob`` raised ``FileNotFoundError``)."""
    for _ in range(100):
        try:
            return [p for p in folder.rglob("*") if p.is_file()]
        except FileNotFoundError:
            continue
    return []


def _sigint_as_at_a_shell() -> None:
    """A child's SIGINT as a shell starts it: delivered, default action (a test worker's own
    may be blocked or ignored by what ran in it before, and a child inherits both)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler, SIGINT unblocked, for a test that raises SIGINT in this
    process (restored after)."""
    unblocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXTAGG_")}
    env["EXTAGG_PROGRESS"] = "0"
    return env


def test_subprocess_run_and_exit_codes(tmp_path, data):
    src, t = data
    out = tmp_path / "o.csv"
    cmd = [sys.executable, "-m", "extagg", "aggregate", str(src), *ARGS, "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr
    check(read_any(out), t, ["k"])
    assert "rows/s" in proc.stderr and "budget" in proc.stderr
    proc = subprocess.run(
        [*cmd[:-2], "--by", "nope"], capture_output=True, text=True, timeout=300, env=_env()
    )
    assert proc.returncode == 2 and "unknown column 'nope'" in proc.stderr


def test_stdout_reader_that_leaves_stops_the_run_silently(tmp_path):
    """``-o - | head``: once ``head`` has its lines the run stops as a command killed by
    SIGPIPE would (141), with no error message and no spill file left behind."""
    src = tmp_path / "many.parquet"
    pq.write_table(table(400_000, keys=300_000, seed=5), src)
    spill = tmp_path / "spill"
    spill.mkdir()
    for extra in (["-o", "-"], ["-o", "-", "--output-format", "jsonl"], ["--show", "300000"]):
        cmd = [sys.executable, "-m", "extagg", "aggregate", str(src), "--by", "k", "--agg",
               "n=count(*)", "--memory", "16m", "--spill-dir", str(spill), "-q",
               *extra]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()  # the reader leaves
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=300) == 141, err
        assert first and err == ""
        assert not [p for p in spill.rglob("*") if p.is_file()]


def test_a_failed_json_read_exits_cleanly_every_time(tmp_path):
    """A JSON Lines read that fails in its first block: exit 1 with the error every time (one
    of Arrow's I/O threads dropped its Python file object while the interpreter finalized and
    the process aborted, ``terminate called without an active exception``, 2 runs in 12)."""
    src = tmp_path / "nested.jsonl"
    src.write_text("".join(f'{{"u": {{"id": {i % 2}}}, "v": {i}}}\n' for i in range(50)))
    cmd = [sys.executable, "-m", "extagg", "aggregate", str(src), "--by", "v", "--agg",
           "n=count(*)", "--column-types", "v:string", "-q"]  # fmt: skip
    for _ in range(6):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())
        assert proc.returncode == 1, proc.stderr
        assert "terminate" not in proc.stderr and "changed from string to number" in proc.stderr


def _signal_when(
    cmd: list[str],
    env: dict[str, str],
    ready: Callable[[], bool],
    signum: int,
    too_soon: str,
    repeat: int = 1,
) -> tuple[int, str, float]:
    """Start ``cmd``, send it ``signum`` (``repeat`` times, 2 ms apart) once ``ready()`` (it
    still running, else ``too_soon`` fails the test); its exit status, stderr and the seconds
    it took to stop."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_sigint_as_at_a_shell)  # fmt: skip
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if ready():
            break
        time.sleep(0.02)
    assert proc.poll() is None, too_soon
    proc.send_signal(signum)
    sent = time.monotonic()
    for _ in range(repeat - 1):
        time.sleep(0.002)
        if proc.poll() is not None:
            break
        proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err, time.monotonic() - sent


@pytest.mark.parametrize(
    ("fmt", "signum", "repeat"),
    [
        ("parquet", signal.SIGINT, 1),
        ("csv", signal.SIGINT, 1),
        ("parquet", signal.SIGTERM, 1),
        ("parquet", signal.SIGINT, 1000),
        ("parquet", signal.SIGTERM, 1000),
    ],
)
def test_sigint_stops_and_leaves_no_files(tmp_path, fmt, signum, repeat):
    """Ctrl-C mid-run: exit 130 within a second or so, no spill file or partial output left
    (CSV: Arrow's reader thread may be waiting on the scan's read-ahead limit). SIGTERM
    (``timeout``, ``docker stop``) killed the process with its files left: it stops the same
    way, exit 143. ``repeat``: a user pressing Ctrl-C again and again (every 2 ms until the
    run has stopped, once it has 60 spill files to remove): the later ones must not land in
    the cleanup (they left a traceback, exit -2 and the spill files)."""
    t = table(3_000_000, keys=1_500_000, seed=11)
    src = tmp_path / f"big.{fmt}"
    if fmt == "parquet":
        pq.write_table(t, src, row_group_size=100_000)
    else:
        pacsv.write_csv(t, src)
    spill = tmp_path / "spill"
    spill.mkdir()
    out = tmp_path / "out.parquet"
    cmd = [
        sys.executable, "-m", "extagg", "aggregate", str(src), "--by", "k,u", "--agg",
        "n=count(*)", "--agg", "s=sum(v)", "--memory", "4m", "--spill-dir", str(spill),
        "--sort", "-o", str(out),
    ]  # fmt: skip
    files = 1 if repeat == 1 else 60
    returncode, err, stopped = _signal_when(
        cmd, _env(), lambda: len(_files_below(spill)) >= files, signum,
        f"the run ended before it spilled {files} file(s): make the input larger", repeat,
    )  # fmt: skip
    assert returncode == 128 + signum, err
    assert "interrupted" in err and "Traceback" not in err
    assert not [p for p in spill.rglob("*") if p.is_file()]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"big.{fmt}", "spill"]
    print(f"stopped {stopped:.2f} s after SIGINT")


@pytest.mark.parametrize("name", ["out.csv.gz", "out.jsonl.zst"])
def test_ctrl_c_while_a_compressed_output_is_written(tmp_path, name):
    """A Ctrl-C while the result streams into a compressed output: exit 130, neither the
    output nor its temporary file left (the compressor is closed, the file removed)."""
    src = tmp_path / "big.parquet"
    pq.write_table(table(2_000_000, keys=1_500_000, seed=12), src, row_group_size=200_000)
    cmd = [sys.executable, "-m", "extagg", "aggregate", str(src), "--by", "k,u",
           "--agg", "n=count(*)", "--agg", "s=sum(v)", "-o", str(tmp_path / name)]  # fmt: skip

    def writing() -> bool:
        temps = [p for p in tmp_path.iterdir() if p.name.startswith(f".{name}.")]
        return any(p.stat().st_size > 256 << 10 for p in temps if p.exists())

    returncode, err, _ = _signal_when(
        cmd, _env(), writing, signal.SIGINT, "the output was written before the signal"
    )
    assert returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.parquet"]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_while_kernels_compile_on_a_cold_cache_stops_at_once(tmp_path, signum):
    """With numba's cache empty (a fresh install), the first chunk's fold compiles the
    query's kernels for 6-30 s, out of an interrupt's reach (llvmlite can free an object
    twice if one lands inside): a Ctrl-C waited for the compile's end. The command now
    removes its files and leaves at once."""
    t = table(200_000, keys=50_000, seed=3)
    src = tmp_path / "t.parquet"
    pq.write_table(t, src, row_group_size=50_000)
    spill = tmp_path / "spill"
    spill.mkdir()
    cache = tmp_path / "numba-cache"
    out = tmp_path / "out.parquet"
    cmd = [sys.executable, "-m", "extagg", "aggregate", str(src), "--by", "k,u", "--agg",
           "n=count(*)", "--agg", "s=sum(v)", "--agg", "lo=min(u)", "--memory", "8m",
           "--spill-dir", str(spill), "-o", str(out)]  # fmt: skip
    env = dict(_env(), NUMBA_CACHE_DIR=str(cache))
    returncode, err, stopped = _signal_when(
        cmd, env, lambda: any(p.suffix == ".nbi" for p in cache.rglob("*")), signum,
        "the run ended before its kernels compiled",  # one compiled, more to come
    )  # fmt: skip
    assert returncode == 128 + signum, err
    assert "interrupted" in err and "Traceback" not in err
    assert stopped < 3, f"stopped {stopped:.1f} s after the signal"
    assert not out.exists() and not [p for p in spill.rglob("*") if p.is_file()]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["numba-cache", "spill", "t.parquet"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_ctrl_c_lost_while_kernels_compile_still_stops_the_run(
    tmp_path, monkeypatch, capsys, python_sigint
):
    """CI once sent SIGINT while numba compiled on a cold cache: the ``KeyboardInterrupt`` was
    raised in llvmlite's ``ObjectRef.__del__``, printed and dropped, and the command ran to the
    end, exit 0. Here the interrupt is lost the same way (in a ``__del__``) as the kernels load."""
    import extagg.io.run as run_module

    class SignalsInDel:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)

    load = run_module._load_kernels

    def load_and_lose_an_interrupt(*args):
        load(*args)
        SignalsInDel()

    monkeypatch.setattr(run_module, "_load_kernels", load_and_lose_an_interrupt)
    t = table(50_000, keys=20_000, seed=5)
    src = tmp_path / "t.parquet"
    pq.write_table(t, src, row_group_size=5_000)
    spill = tmp_path / "spill"
    spill.mkdir()
    out = tmp_path / "out.parquet"
    argv = [
        "aggregate", str(src), "--by", "k", "--agg", "n=count(*)", "--memory", "1m",
        "--spill-dir", str(spill), "-o", str(out), "--quiet",
    ]  # fmt: skip
    handler = signal.getsignal(signal.SIGINT)
    assert main(argv) == 130
    assert "interrupted" in capsys.readouterr().err
    assert not out.exists() and not [p for p in spill.rglob("*") if p.is_file()]
    assert signal.getsignal(signal.SIGINT) is handler


@pytest.fixture
def tiny_fs(tmp_path):
    """A 1 MiB tmpfs (needs root); skipped where it cannot be mounted."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {proc.stderr!r}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_disk_full_writing_output(tmp_path, tiny_fs, capsys):
    t = table(300_000, keys=200_000, seed=2)
    src = tmp_path / "wide.parquet"
    pq.write_table(t, src)
    out = tiny_fs / "out.csv"
    rc = main(["aggregate", str(src), "--by", "k,u", "--agg", "n=count(*)", "-o", str(out), "-q"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "disk full" in err and str(tiny_fs) in err and "bytes" in err
    assert os.listdir(tiny_fs) == []  # no partial output, no temporary file


def test_disk_full_writing_compressed_output(tmp_path, tiny_fs, capsys):
    """The compressor's blocks meet the full disk as the plain writer's do: exit 1 naming the
    directory, nothing left on it."""
    rng = np.random.default_rng(5)
    t = pa.table({"k": rng.integers(0, 1 << 40, 200_000), "v": rng.random(200_000)})
    src = tmp_path / "wide.parquet"
    pq.write_table(t, src)
    out = tiny_fs / "out.csv.gz"
    rc = main(["aggregate", str(src), *ARGS, "-o", str(out), "-q"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "disk full" in err and str(tiny_fs) in err
    assert os.listdir(tiny_fs) == []


def test_disk_full_on_stdout(data):
    src, _ = data
    cmd = [sys.executable, "-m", "extagg", "aggregate", str(src), *ARGS, "-o", "-"]
    with open("/dev/full", "wb") as full:
        proc = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True, timeout=300,
                              env=_env())  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "disk full" in proc.stderr and "<stdout>" in proc.stderr


def test_disk_full_while_spilling(tmp_path, tiny_fs, capsys, caplog):
    t = table(400_000, keys=300_000, seed=4)
    src = tmp_path / "spilly.parquet"
    pq.write_table(t, src)
    out = tmp_path / "out.parquet"
    rc = main([
        "aggregate", str(src), "--by", "k,u", "--agg", "n=count(*)", "--agg", "s=sum(v)",
        "--memory", "2m", "--spill-dir", str(tiny_fs), "-o", str(out), "-q",
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 1, err
    assert str(tiny_fs) in err and "bytes" in err and "Traceback" not in err
    # the error, said once: no warning logged before it
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert not out.exists()
    assert not [p for p in tiny_fs.rglob("*") if p.is_file()]


def test_jemalloc_returns_freed_pages_sooner_unless_the_user_set_it(monkeypatch):
    """The command shortens jemalloc's decay (the scan's freed pages otherwise stay resident
    for a second beside the merge's); a user's ``JE_ARROW_MALLOC_CONF`` and other pools are
    left alone."""
    from extagg import cli_aggregate as C

    calls: list[int] = []

    class Pool:
        backend_name = "jemalloc"

    monkeypatch.setattr(pa, "jemalloc_set_decay_ms", calls.append)
    monkeypatch.setattr(pa, "default_memory_pool", lambda: Pool())
    monkeypatch.delenv("JE_ARROW_MALLOC_CONF", raising=False)
    C.return_freed_pages_sooner()
    assert calls == [C.JEMALLOC_DECAY_MS] and C.JEMALLOC_DECAY_MS < 1000
    monkeypatch.setenv("JE_ARROW_MALLOC_CONF", "dirty_decay_ms:5000")
    C.return_freed_pages_sooner()
    monkeypatch.delenv("JE_ARROW_MALLOC_CONF")
    Pool.backend_name = "system"
    C.return_freed_pages_sooner()
    assert calls == [C.JEMALLOC_DECAY_MS]


def test_the_command_sets_up_its_process_before_the_query(tmp_path, monkeypatch, capsys):
    from extagg import cli_aggregate as C

    order: list[str] = []
    monkeypatch.setattr(C, "return_freed_pages_sooner", lambda: order.append("decay"))
    real_plan = __import__("extagg.io.run", fromlist=["plan_query"]).plan_query

    def plan(*args, **kwargs):
        order.append("plan")
        return real_plan(*args, **kwargs)

    monkeypatch.setattr("extagg.io.run.plan_query", plan)
    src = tmp_path / "t.parquet"
    pq.write_table(table(1_000), src)
    assert main(["aggregate", str(src), "--by", "k", "--agg", "n=count(*)", "-q",
                 "-o", str(tmp_path / "o.parquet")]) == 0, capsys.readouterr().err  # fmt: skip
    assert order == ["decay", "plan"]


def test_disk_full_writing_a_sort_run(tiny_fs):
    """A sort run that does not fit its directory: a ``SpillError`` naming the directory and
    the bytes (it was Arrow's bare ``[Errno 28] Error writing bytes to file``), no run left."""
    import numpy as np

    from extagg.columnar.sort import external_sort
    from extagg.errors import SpillError
    from extagg.memory import UnifiedMemoryManager, task_memory_manager

    n = 400_000  # 6.4 MB of results against a 1 MiB file system
    keys = np.random.default_rng(4).permutation(n)
    result = pa.table({"k": keys, "v": keys * 2})
    tmm = task_memory_manager(UnifiedMemoryManager(max_memory=1 << 20))
    sorted_batches = external_sort(
        iter(result.to_batches(max_chunksize=10_000)), result.schema, ["k"], tmm, str(tiny_fs)
    )
    with pytest.raises(SpillError, match=r"cannot write the sort run .* bytes\) in .*tiny") as err:
        next(sorted_batches)
    assert err.value.errno == errno.ENOSPC and str(tiny_fs) in str(err.value.directory)
    assert not [p for p in tiny_fs.rglob("*") if p.is_file()]
    assert tmm.memory_used == 0


def test_a_device_output_and_a_file_as_spill_dir_are_named_first(tmp_path, data, capsys):
    """``-o /dev/full`` asked for ``--overwrite`` before saying a device is refused; a spill
    directory that is a file said "File exists"; an output directory where no file can be
    made showed the temporary file's name in a raw OS error."""
    src, _ = data
    argv = ["aggregate", str(src), "--by", "g", "--agg", "n=count(*)", "-q"]
    assert main([*argv, "-o", "/dev/full", "--output-format", "csv"]) == 2
    assert "/dev/full is not a regular file" in capsys.readouterr().err
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert main([*argv, "--spill-dir", str(plain), "--memory", "1m", "-o", "-"]) == 1
    assert f"cannot spill to {plain}: it is not a directory" in capsys.readouterr().err
    assert main([*argv, "-o", "/proc/extagg-out.csv"]) == 1
    err = capsys.readouterr().err
    assert "cannot write /proc/extagg-out.csv: no file can be made in /proc" in err
    assert "extagg-tmp" not in err


def test_by_takes_quoted_names_with_spaces_and_commas(tmp_path, capsys):
    """A header ``id, name, amount`` names its columns ``" name"``, ``" amount"``: ``--agg``
    and ``--where`` could quote them, ``--by`` stripped the spaces (and split a name holding a
    comma), so no key could name them. Quoted names are taken as written."""
    from extagg.cli_aggregate import split_names
    from extagg.errors import QueryError

    assert split_names(' a , "b, c",`d``e` ,') == ["a", "b, c", "d`e"]
    with pytest.raises(QueryError, match="unterminated"):
        split_names('"abc')
    src = tmp_path / "spaced.csv"
    src.write_text("id, name, amount\n1, bob, 10\n2, ann, 20\n3, bob, 5\n")
    out = tmp_path / "o.parquet"
    argv = ["aggregate", str(src), "--by", '" name"', "--agg", 's=sum(" amount")', "-o", str(out),
            "-q"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert sorted(map(tuple, (r.values() for r in pq.read_table(out).to_pylist()))) == [
        (" ann", 20), (" bob", 15),
    ]  # fmt: skip
    assert main(["aggregate", str(src), "--by", "name", "--agg", "n=count(*)", "-q"]) == 2
    assert """did you mean ' name'? (quote it: " name")""" in capsys.readouterr().err


def test_a_record_longer_than_a_text_block_says_what_would_read_it(tmp_path, capsys):
    """A record longer than the blocks text is parsed in stops the run (exit 1) saying so; a
    larger --memory helps only below the largest block (4 MiB): past it the message said to
    raise --memory, which never helped."""
    src = tmp_path / "long.csv"
    src.write_text("k,t\n" + "a,z\n" * 30_000 + 'a,"' + "x" * (1 << 20) + '"\nb,y\n')
    assert main(["aggregate", str(src), "--by", "k", "--memory", "8m", "-q", "-o", "-"]) == 1
    assert "a larger --memory reads larger blocks" in capsys.readouterr().err
    assert main(["aggregate", str(src), "--by", "k", "--memory", "64m", "-q", "-o", "-"]) == 0
    capsys.readouterr()
    src.write_text('k,t\na,"' + "x" * (9 << 20) + '"\nb,y\n')  # past two blocks
    assert main(["aggregate", str(src), "--by", "k", "-q", "-o", "-"]) == 1
    err = capsys.readouterr().err
    assert "longer than 4 MiB, the largest block, cannot be read" in err and str(src) in err


@pytest.mark.parametrize("words", [["--memory", "-1m"], ["--memory=-1m"], ["--memory", "-.5g"]])
def test_a_negative_size_is_named_as_one(tmp_path, capsys, words):
    """``--memory -1m``: argparse took ``-1m`` for an option ("expected one argument"); the
    size's own check now says what is wrong with it, however it is written."""
    src = tmp_path / "t.csv"
    src.write_text("k\na\n")
    assert main(["aggregate", str(src), "--by", "k", *words, "-q", "-o", "-"]) == 2
    err = capsys.readouterr().err
    assert "invalid memory" in err and "negative size" in err, err


def test_verbose_may_follow_the_command():
    """``extagg aggregate … -v`` was "unrecognized arguments" (only ``extagg -v aggregate``
    worked); a count given before the name is kept when none follows it."""
    from extagg.cli import build_parser

    def verbose(*words):
        command = next(w for w in words if not w.startswith("-"))
        return build_parser(command).parse_args(list(words)).verbose

    assert verbose("aggregate", "x.csv", "-v") == 1
    assert verbose("aggregate", "x.csv", "-vv") == 2
    assert verbose("-v", "aggregate", "x.csv") == 1
    assert verbose("aggregate", "x.csv") == 0
    assert verbose("state", "show", "ckpt", "-v") == 1


def test_json_lines_output_of_nanosecond_values(tmp_path):
    """A nanosecond timestamp, time or duration that is not a whole microsecond stopped a
    JSON Lines output ("Nanosecond duration -7 is not safely convertible to microseconds");
    they are written with their nine digits (durations as seconds)."""
    src = tmp_path / "ns.parquet"
    pq.write_table(pa.table({
        "k": [1],
        "t": pa.array([1704103200123456789], pa.timestamp("ns")),
        "z": pa.array([1704103200123456789], pa.timestamp("ns", "Europe/Paris")),
        "d": pa.array([-7], pa.duration("ns")),
        "h": pa.array([36000123456789], pa.time64("ns")),
    }), src)  # fmt: skip
    out = tmp_path / "o.jsonl"
    assert main(["aggregate", str(src), "--by", "k", "--agg", "t=max(t)", "--agg", "z=max(z)",
                 "--agg", "d=sum(d)", "--agg", "h=max(h)", "-q", "-o", str(out)]) == 0  # fmt: skip
    row = json.loads(out.read_text())
    assert row == {"k": 1, "t": "2024-01-01T10:00:00.123456789",
                   "z": "2024-01-01T11:00:00.123456789+01:00", "d": -7e-09,
                   "h": "10:00:00.123456789"}  # fmt: skip


def test_the_kernel_warm_up_spill_is_not_logged_as_the_runs(tmp_path, caplog):
    """``-v`` logs spills; the warm-up that loads the kernels spills its 64 rows once, and a
    3-group query in a large budget showed "spilling in-memory aggregation table"."""
    src = tmp_path / "t.csv"
    src.write_text("k\na\nb\nc\n")
    with caplog.at_level(logging.INFO, logger="extagg"):
        assert main(["aggregate", str(src), "--by", "k", "-q", "-o", "-"]) == 0
    assert "spilling" not in caplog.text


def test_uuid_and_narrow_decimal_keys_sort_and_write_as_text(tmp_path, capsys):
    """``--sort`` by an ``arrow.uuid`` key ("Sorting not supported for type
    extension<arrow.uuid>") or a decimal32 one failed, and so did CSV/JSON Lines output of a
    uuid (``Unsupported Type``, "cannot write UUID as JSON"): uuids sort by their bytes and
    are written in their canonical form, narrow decimals sort as decimal128."""
    import uuid

    ids = [uuid.UUID(int=(i * 0x9E3779B97F4A7C15) % (1 << 128)) for i in (3, 1, 2, 1)]
    src = tmp_path / "u.parquet"
    pq.write_table(pa.table({
        "k": pa.array([u.bytes for u in ids], pa.binary(16)).cast(pa.uuid()),
        "d": pa.array([decimal.Decimal(x) for x in ("2.5", "-1.0", "0.5", "-1.0")],
                      pa.decimal32(5, 1)),
        "v": [1, 2, 3, 4],
    }), src)  # fmt: skip
    want = sorted({str(u) for u in ids})
    assert main(["aggregate", str(src), "--by", "k", "--agg", "s=sum(v)", "--sort", "-q",
                 "-o", "-"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line.split(",")[0].strip('"') for line in lines] == want
    out = tmp_path / "u.jsonl"
    assert main(["aggregate", str(src), "--by", "k", "--agg", "s=sum(v)", "--sort", "-q",
                 "-o", str(out)]) == 0  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["k"] for r in rows] == want and sum(r["s"] for r in rows) == 10
    got = extagg.aggregate_files(str(src), by="d", aggs=["n=count(*)"], sort=True).read_all()
    assert [str(x) for x in got.column("d").to_pylist()] == ["-1.0", "0.5", "2.5"]


def test_sums_of_decimal32_and_decimal64_columns_of_a_parquet_file(tmp_path, capsys):
    """pyarrow (18+) writes decimal32/64 columns to Parquet and reads them back so: their
    sums, means and extremes were refused ("sum needs numbers"); now as decimal128's."""
    src = tmp_path / "d.parquet"
    dec = [decimal.Decimal(x) for x in ("2.50", "-1.25", "0.75")]
    pq.write_table(pa.table({
        "k": ["a", "a", "b", "b", "b"],
        "p": pa.array([*dec, None, decimal.Decimal("1.00")], pa.decimal64(15, 2)),
        "q": pa.array([decimal.Decimal(i) if i else None for i in (1, 2, 3, 4, 0)],
                      pa.decimal32(5, 0)),
    }), src)  # fmt: skip
    argv = ["aggregate", str(src), "--by", "k", "--agg", "s=sum(p)", "--agg", "a=avg(q)",
            "--agg", "hi=max(p * q)", "--where", "p > 0 or q > 3", "--sort", "-q",
            "-o", "-"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines() == [
        "k,s,a,hi", "a,2.50,1.0000,2.50", "b,1.75,3.5000,2.25",
    ]  # fmt: skip


def test_interval_keys_sort_by_length_and_write_as_duckdb_text(tmp_path, capsys):
    """A month-day-nano interval key (an Arrow file's): ``--sort`` failed ("Sorting not
    supported for type month_day_nano_interval"), CSV output failed ("Unsupported cast ...
    to utf8"), JSON Lines wrote ``[0, 30, 5]``. It now sorts by its length (30-day months,
    24-hour days, as DuckDB), is written as DuckDB's text, and Parquet output is refused
    with the column named, before the run."""
    import pyarrow.feather as feather

    mdn = pa.MonthDayNano
    values = [mdn((1, 0, 0)), mdn((0, 31, 0)), mdn((0, 30, 5)), None, mdn((0, -1, 0)),
              mdn((0, 0, -1)), mdn((-1, 40, 0)), mdn((0, 0, 2 * 86_400 * 10**9)),
              mdn((14, 3, 4 * 3_600 * 10**9))]  # fmt: skip
    src = tmp_path / "i.arrow"
    feather.write_feather(
        pa.table({"m": pa.array(values, pa.month_day_nano_interval()),
                  "v": list(range(len(values)))}), src)  # fmt: skip
    out = tmp_path / "i.jsonl"
    assert main(["aggregate", str(src), "--by", "m", "--agg", "s=sum(v)", "--sort", "-q",
                 "-o", str(out)]) == 0  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["m"], r["s"]) for r in rows] == [
        ("-1 day", 4), ("-00:00:00.000000001", 5), ("48:00:00", 7), ("-1 month 40 days", 6),
        ("1 month", 0), ("30 days 00:00:00.000000005", 2), ("31 days", 1),
        ("1 year 2 months 3 days 04:00:00", 8), (None, 3),
    ]  # fmt: skip
    assert main(["aggregate", str(src), "--by", "m", "--agg", "s=sum(v)", "--sort", "-q",
                 "-o", "-"]) == 0  # fmt: skip
    assert capsys.readouterr().out.splitlines()[1:3] == ["-1 day,4", "-00:00:00.000000001,5"]
    assert main(["aggregate", str(src), "--by", "m", "--agg", "s=sum(v)", "-q",
                 "-o", str(tmp_path / "i.parquet")]) == 1  # fmt: skip
    assert "column 'm' of type month_day_nano_interval cannot be written to Parquet" in (
        capsys.readouterr().err
    )
    assert not list(tmp_path.glob("*.parquet*"))


def test_having_on_spilled_results_prints_no_arrow_warnings(tmp_path, capfd):
    """``--having`` filtered each result batch with an Acero plan, which printed "An input
    buffer was poorly aligned" on stderr (through ``-q``) for batches read back from spill
    files; it filters them by its eager mask now."""
    src = tmp_path / "s.csv"
    with open(src, "w") as f:
        f.write("i,s,v\n")
        f.writelines(f"{i % 9000},k{i % 7000},{(i // 9000) % 10}\n" for i in range(200_000))
    out = tmp_path / "h.parquet"
    assert main(["aggregate", str(src), "--by", "i,s", "--agg", "n=count(*)",
                 "--agg", "cd=count_distinct(v)", "--having", "n > 2 and cd >= 3",
                 "--memory", "1m", "-q", "-o", str(out)]) == 0  # fmt: skip
    assert "poorly aligned" not in capfd.readouterr().err
    got = pq.read_table(out)
    assert got.num_rows > 0 and min(got.column("n").to_pylist()) > 2


def test_a_full_spill_directory_is_passed_over_for_another(tmp_path, tiny_fs):
    """With several spill directories, one disk full failed the whole run although another
    had room; the run now goes on in the others (the engines' contract). The last full one
    is still the error."""
    import operator

    from extagg import Aggregator, ExternalAppendOnlyMap

    room = tmp_path / "room"
    room.mkdir()
    dirs = [str(tiny_fs), str(room)]
    m = ExternalAppendOnlyMap(Aggregator.reducing(operator.add), memory="2m", spill_dirs=dirs)
    m.insert_all((i % 300_000, i) for i in range(900_000))
    assert m.metrics.spill_count > 10
    got = dict(m.iterator())
    assert len(got) == 300_000 and sum(got.values()) == sum(range(900_000))
    m.close()
    keys = np.arange(2_000_000) % 700_000
    table = extagg.aggregate({"k": keys, "v": np.ones(2_000_000)}, keys="k",
                             aggs={"s": ("v", "sum")}, memory="4m", spill_dirs=dirs)  # fmt: skip
    assert table.num_rows == 700_000 and table.column("s").to_numpy().sum() == 2_000_000
    assert not list(room.rglob("*.run")) and not list(tiny_fs.rglob("*.run"))


def test_dates_past_year_9999_print_and_write_as_json(tmp_path, capsys):
    """Arrow, Parquet and DuckDB hold years past 9999; the printed table and JSON Lines went
    through Python's datetime and failed with "date value out of range", naming nothing."""
    import json

    src = tmp_path / "big.parquet"
    pq.write_table(
        pa.table({
            "k": [1, 2],
            "ts": pa.array([631_152_000_000_000_000, 0], pa.timestamp("us")),
            "d": pa.array([5_000_000, 0], pa.date32()),
        }),
        src,
    )  # fmt: skip
    argv = ["aggregate", str(src), "--by", "k", "--agg", "m=max(ts)", "--agg", "md=max(d)", "-q"]
    assert main([*argv, "--sort"]) == 0
    shown = capsys.readouterr().out
    assert "21970-05-31 00:00:00" in shown and "15659-07-15" in shown
    out = tmp_path / "o.jsonl"
    assert main([*argv, "--sort", "-o", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["m"].startswith("21970-05-31T00:00:00") and rows[0]["md"] == "15659-07-15"
    assert rows[1]["md"] == "1970-01-01"

"""aggregate_files over every input format, compressed text, globs, directories, hive folders
and files with different schemas; results against pandas."""

from __future__ import annotations

import bz2
import datetime
import decimal
import gzip
import json
import logging
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

import extagg
import extagg.io  # extagg.io.open_input below: not loaded by `import extagg`
from extagg.errors import InputError, QueryError
from tests.io.conftest import AGGS, as_dict, assert_same, reference, sample_table


def write(table: pa.Table, path, fmt: str) -> None:
    path = str(path)
    if fmt == "parquet":
        pq.write_table(table, path, row_group_size=1_000)
    elif fmt in ("csv", "tsv"):
        opts = pacsv.WriteOptions(delimiter="\t" if fmt == "tsv" else ",")
        pacsv.write_csv(table, path, write_options=opts)
    elif fmt == "jsonl":
        with open(path, "w") as f:
            for row in table.to_pylist():
                f.write(json.dumps(row) + "\n")
    elif fmt == "arrow":
        feather.write_feather(table, path, compression="uncompressed")
    elif fmt == "arrows":  # the IPC stream format, in batches of 700 rows
        with pa.ipc.new_stream(path, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=700):
                writer.write_batch(batch)
    else:  # pragma: no cover
        raise ValueError(fmt)


def compress(path, codec: str) -> str:
    data = Path(path).read_bytes()
    out = f"{path}.{codec}"
    if codec == "gz":
        with gzip.open(out, "wb") as f:
            f.write(data)
    elif codec == "bz2":
        with bz2.open(out, "wb") as f:
            f.write(data)
    else:
        import pyarrow as pa

        with pa.CompressedOutputStream(out, "zstd") as f:
            f.write(data)
    os.unlink(path)
    return out


def run(paths, by=("k", "s"), **kw) -> pa.Table:
    reader = extagg.aggregate_files(paths, by=list(by), aggs=AGGS, memory="16m", **kw)
    return reader.read_all()


@pytest.mark.parametrize("fmt", ["parquet", "csv", "tsv", "jsonl", "arrow", "arrows"])
def test_every_format_matches_pandas(tmp_path, table, fmt):
    path = tmp_path / f"data.{fmt}"
    write(table, path, fmt)
    got = run(str(path))
    assert_same(as_dict(got, ["k", "s"]), reference(table, ["k", "s"]))


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.parametrize("codec", ["gz", "bz2", "zst", "GZ", "BZ2"])
def test_compressed_text(tmp_path, table, fmt, codec):
    """Suffixes in any case: ``.CSV.GZ`` was taken for CSV and parsed compressed."""
    path = tmp_path / f"data.{fmt}"
    write(table, path, fmt)
    packed = Path(compress(path, codec.lower()))
    if codec.isupper():  # DATA.CSV.GZ, data.jsonl.BZ2
        name = packed.name.upper() if fmt == "csv" else f"{path.name}.{codec}"
        packed = packed.rename(packed.with_name(name))
    got = run(str(packed))
    assert_same(
        as_dict(got, ["k"]) if False else as_dict(got, ["k", "s"]), reference(table, ["k", "s"])
    )


def test_globs_directories_and_lists(tmp_path):
    parts = [sample_table(800, seed=i) for i in range(4)]
    for i, t in enumerate(parts):
        write(t, tmp_path / f"part-{i}.parquet", "parquet")
    (tmp_path / "_SUCCESS").write_text("")  # ignored in directories
    whole = pa.concat_tables(parts)
    want = reference(whole, ["k"])
    assert_same(as_dict(run(str(tmp_path / "part-*.parquet"), by=["k"]), ["k"]), want)
    assert_same(as_dict(run(str(tmp_path), by=["k"]), ["k"]), want)
    files = [str(tmp_path / f"part-{i}.parquet") for i in range(4)]
    assert_same(as_dict(run(files, by=["k"]), ["k"]), want)


def test_hive_partitioned_folders(tmp_path):
    t = sample_table(3_000)
    ds.write_dataset(
        t, tmp_path / "hive", format="parquet", partitioning=["s"], partitioning_flavor="hive"
    )
    got = run(str(tmp_path / "hive"), by=["s", "k"])
    assert_same(as_dict(got, ["s", "k"]), reference(t, ["s", "k"]))
    only_x = run(str(tmp_path / "hive"), by=["s"], where="s = 'x'")
    assert only_x.column("s").to_pylist() == ["x"]


def test_arrow_ipc_streams_in_hive_folders_unified_and_filtered(tmp_path):
    """``.arrows`` files (the IPC stream format, which ``pyarrow.dataset`` does not read):
    folder columns, a column one file lacks (nulls), a widened type, a filter, and the
    format told apart from an IPC file by its first bytes whatever the extension."""
    t = sample_table(3_000)
    for y, part in ((1, t.slice(0, 1_800)), (2, t.slice(1_800))):
        folder = tmp_path / "hive" / f"y={y}"
        folder.mkdir(parents=True)
        write(part, folder / "a.arrows", "arrows")
    extra = pa.table({"k": pa.array([1, 2], pa.int32()), "w": [1.5, 2.5]})
    write(extra, tmp_path / "hive" / "y=2" / "b.arrows", "arrows")
    got = extagg.aggregate_files(
        str(tmp_path / "hive"), by="y", aggs={"n": ("*", "count"), "w": ("w", "sum")}
    ).read_all()
    assert {r["y"]: (r["n"], r["w"]) for r in got.to_pylist()} == {
        1: (1_800, None), 2: (1_202, 4.0),
    }  # fmt: skip
    got = extagg.aggregate_files(
        str(tmp_path / "hive"), by=["k"], aggs={"n": ("*", "count")}, where="y = 1 and k < 5",
        format="ipc",
    ).read_all()  # fmt: skip
    head = t.slice(0, 1_800).to_pandas()
    want = head[head.k < 5].groupby("k").size().to_dict()
    assert {r["k"]: r["n"] for r in got.to_pylist()} == want
    stream_named_arrow = tmp_path / "s.arrow"
    write(t, stream_named_arrow, "arrows")
    assert_same(as_dict(run(str(stream_named_arrow)), ["k", "s"]), reference(t, ["k", "s"]))


def test_schemas_are_unified(tmp_path):
    a = pa.table(
        {"k": pa.array([1, 2], pa.int32()), "v": [1.0, 2.0], "q": pa.array([1, 2], pa.int32())}
    )
    b = pa.table({"k": pa.array([2, 3], pa.int64()), "v": pa.array([5, 6], pa.int64())})
    pq.write_table(a, tmp_path / "a.parquet")
    pq.write_table(b, tmp_path / "b.parquet")  # no q: reads as nulls; v widened to double
    reader = extagg.aggregate_files(
        str(tmp_path / "*.parquet"), by="k",
        aggs={"n": ("*", "count"), "sv": ("v", "sum"), "nq": ("q", "count")},
    )  # fmt: skip
    got = {r["k"]: (r["n"], r["sv"], r["nq"]) for r in reader.read_all().to_pylist()}
    assert got == {1: (1, 1.0, 1), 2: (2, 7.0, 1), 3: (1, 6.0, 0)}
    assert reader.schema.field("k").type == pa.int64()


@pytest.mark.parametrize("first", ["lacks the key", "key empty in its first block"])
def test_a_text_key_the_first_file_lacks_or_leaves_empty_reads_as_nulls_there(tmp_path, first):
    """The CSV key sample (dictionary keys or not) is taken from the first file: one without
    the key column, or with it empty throughout its first block (typed null there), failed
    the run with Arrow's ``ArrowKeyError`` / ``ArrowNotImplementedError`` traceback."""
    if first == "lacks the key":
        (tmp_path / "a.csv").write_text("v\n1\n2\n")
    else:
        (tmp_path / "a.csv").write_text("region,v\n" + ",1\n" * 2 + "")
    (tmp_path / "b.csv").write_text("region,v\n" + "".join(f"r{i % 3},10\n" for i in range(30)))
    for paths in (str(tmp_path), [str(tmp_path / "b.csv"), str(tmp_path / "a.csv")]):
        got = extagg.aggregate_files(
            paths, by="region", aggs={"s": ("v", "sum"), "n": ("*", "count")}
        ).read_all()
        rows = {r["region"]: (r["s"], r["n"]) for r in got.to_pylist()}
        assert rows == {
            "r0": (100, 10),
            "r1": (100, 10),
            "r2": (100, 10),
            None: (3 if first == "lacks the key" else 2, 2),
        }


def test_conflicting_schemas_name_both_files_and_the_column(tmp_path):
    pq.write_table(pa.table({"k": [1], "v": [1.0]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"k": [1], "v": ["text"]}), tmp_path / "b.parquet")
    with pytest.raises(InputError) as info:
        extagg.aggregate_files(str(tmp_path / "*.parquet"), by="k", aggs={"s": ("v", "sum")})
    msg = str(info.value)
    assert "'v'" in msg and "a.parquet" in msg and "b.parquet" in msg


@pytest.mark.parametrize(
    "where", ["k < 4", "k < '4'", "k in (0, 1, 2, 3)", "k in ('0', '1', '2', '3')"]
)
def test_where_skips_parquet_row_groups(tmp_path, table, where):
    """Quoted values too: read as the column's type before the row groups are pruned (Arrow's
    pruning failed on ``k in ('1')``)."""
    t = table.sort_by("k")
    (tmp_path / "folder").mkdir()
    pq.write_table(t, tmp_path / "folder" / "sorted.parquet", row_group_size=500)  # 10 groups
    # a file, and a folder (scanned through the dataset, which filters in Arrow)
    for path in (tmp_path / "folder" / "sorted.parquet", tmp_path / "folder"):
        reader = extagg.aggregate_files(str(path), by="k", aggs=AGGS, where=where)
        got = reader.read_all()
        m = extagg.run_metrics(reader)
        assert m.row_groups_total == 10
        kept = t.filter(pa.compute.less(t["k"], 4))
        assert 1 <= m.row_groups_read < 10
        assert m.row_groups_read == -(-kept.num_rows // 500)  # exactly the groups with k < 4
        assert m.rows_read == 500 * m.row_groups_read  # the rows read: before the filter
        assert m.rows_read == m.rows_total  # (the total: of the row groups not skipped)
        assert_same(as_dict(got, ["k"]), reference(kept, ["k"]))


def test_only_needed_columns_are_read(tmp_path, table):
    wide = table.append_column("blob", pa.array(["y" * 1000] * table.num_rows))
    pq.write_table(wide, tmp_path / "w.parquet")
    scan = extagg.io.open_input(str(tmp_path / "w.parquet"), ["k", "v"])
    batch = next(iter(scan.batches()))
    assert batch.schema.names == ["k", "v"]


def test_timestamp_types_with_a_zone_are_given_as_written(tmp_path, capsys):
    """``--column-types 't=timestamp[s,tz=UTC]'`` was cut at the comma inside ``[...]`` (exit
    2), ``--schema 'k:string,t:timestamp[...tz=UTC]'`` at the ``=`` of ``tz=``, and a zone was
    lowercased (``europe/paris``: the result then failed to be written or read back);
    ``column_types`` given as a string raised ``AttributeError``."""
    from extagg.cli import main

    src = tmp_path / "t.csv"
    src.write_text("k,t\na,2024-01-01 10:00:00+02:00\na,2024-01-01 09:30:00+02:00\n")
    out = tmp_path / "o.parquet"
    for option in (
        ["--column-types", "t=timestamp[s,tz=Europe/Paris]"],
        ["--schema", "k:string,t:timestamp[s, tz=Europe/Paris]"],
    ):
        argv = ["aggregate", str(src), "--by", "k", "--agg", "mx=max(t)", *option, "-q",
                "-o", str(out), "--overwrite"]  # fmt: skip
        assert main(argv) == 0, capsys.readouterr().err
        got = pq.read_table(out)
        assert got.schema.field("mx").type.tz == "Europe/Paris"  # Parquet stores s as ms
        assert str(got.to_pylist()[0]["mx"]) == "2024-01-01 09:00:00+01:00"
    result = extagg.aggregate_files(
        str(src), by="k", aggs={"mx": ("t", "max")}, column_types="t=timestamp[ms,tz=+02:00]"
    ).read_all()
    assert result.schema.field("mx").type == pa.timestamp("ms", tz="+02:00")
    assert main([*argv[:6], "--column-types", "t=timestamp[s,tz=Europe/Pariss]", "-q"]) == 2
    assert "unknown time zone 'Europe/Pariss'" in capsys.readouterr().err


def test_quote_none_reads_tsv_that_quotes_nothing(tmp_path, capsys):
    """TSV as databases and Unix tools write it quotes nothing, and a value may begin with
    ``"``: read with quoting, it swallowed the lines after it (6 rows read as 4, exit 0).
    ``--quote none`` (``quote=None``) reads every line as a row; another quote character
    can be given too."""
    from extagg.cli import main

    src = tmp_path / "titles.tsv"
    src.write_text('title\tv\n"Weird Al" Yankovic\t1\n5" screen\t2\n"Hello\t3\nworld\t4\n'
                   'next"\t5\nlast\t6\n')  # fmt: skip
    aggs = {"n": ("*", "count"), "s": ("v", "sum")}
    quoted = extagg.aggregate_files(str(src), aggs=aggs).read_all().to_pylist()
    assert quoted != [{"n": 6, "s": 21}]  # the default: '"' quotes
    got = extagg.aggregate_files(str(src), aggs=aggs, quote=None).read_all().to_pylist()
    assert got == [{"n": 6, "s": 21}]
    argv = ["aggregate", str(src), "--by", "title", "--agg", "n=count(*)", "--quote", "none",
            "-o", "-", "--sort"]  # fmt: skip
    assert main(argv) == 0
    assert '"""Weird Al"" Yankovic",1' in capsys.readouterr().out
    (tmp_path / "single.csv").write_text("k,v\n'a,b',1\n'a,b',2\n")
    got = extagg.aggregate_files(str(tmp_path / "single.csv"), by="k", aggs=aggs, quote="'")
    assert got.read_all().to_pylist() == [{"k": "a,b", "n": 2, "s": 3}]
    assert main([*argv[:6], "--quote", "ab"]) == 2
    assert "--quote must be one character or 'none'" in capsys.readouterr().err


def test_csv_types_delimiter_and_header_options(tmp_path):
    (tmp_path / "a.csv").write_text("id;price;name\n1;2.50;a\n1;0.25;b\n2;1.00;c\n")
    reader = extagg.aggregate_files(
        str(tmp_path / "a.csv"), by="id", aggs={"p": ("price", "sum")}, delimiter=";",
        column_types={"price": "decimal(15,2)"},
    )  # fmt: skip
    got = {r["id"]: r["p"] for r in reader.read_all().to_pylist()}
    assert {k: str(v) for k, v in got.items()} == {1: "2.75", 2: "1.00"}
    (tmp_path / "b.csv").write_text("1,5\n1,6\n3,7\n")
    schema = pa.schema([("id", pa.int64()), ("x", pa.int64())])
    reader = extagg.aggregate_files(
        str(tmp_path / "b.csv"), by="id", aggs={"s": ("x", "sum")}, schema=schema, header=False
    )
    assert {r["id"]: r["s"] for r in reader.read_all().to_pylist()} == {1: 11, 3: 7}
    # with a header: the schema names every column in order, the header line is skipped
    (tmp_path / "c.csv").write_text("ID,Amount\n1,5\n1,6\n3,7\n")
    reader = extagg.aggregate_files(
        str(tmp_path / "c.csv"), by="id", aggs={"s": ("x", "sum")}, schema=schema
    )
    assert {r["id"]: r["s"] for r in reader.read_all().to_pylist()} == {1: 11, 3: 7}


def test_csv_value_that_breaks_inference_names_the_file(tmp_path):
    lines = ["k,v"] + [f"{i},{i}" for i in range(500_000)] + ["1,oops"]
    (tmp_path / "late.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as info:
        extagg.aggregate_files(str(tmp_path / "late.csv"), by="k", aggs={"s": ("v", "sum")})
    assert "late.csv" in str(info.value) and "--column-types" in str(info.value)


def test_json_lines_parse_error_names_the_row_of_the_file(tmp_path):
    # Arrow numbers the row within its block (of 4 MiB here): the message counts from the
    # file's start, from 1
    pad = "x" * 200
    rows = [json.dumps({"k": i % 7, "v": i, "pad": pad}) for i in range(25_000)]  # 5.8 MB
    for bad_row, name in ((1, "first.jsonl"), (2, "second.jsonl"), (25_001, "late.jsonl")):
        lines = [*rows[: bad_row - 1], '{"k": 1, "v": }', *rows[:3]]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
        with pytest.raises(InputError) as info:
            extagg.aggregate_files(
                str(tmp_path / name), by="k", aggs={"n": ("*", "count")}
            ).read_all()
        assert name in str(info.value)
        assert f"in data row {bad_row} of the file" in str(info.value), str(info.value)


def test_corrupt_parquet_names_file_and_row_group(tmp_path, table):
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path, row_group_size=1_000, compression="snappy")
    meta = pq.ParquetFile(path).metadata
    col = meta.row_group(2).column(0)
    data = bytearray(path.read_bytes())
    start = col.data_page_offset
    data[start + 20 : start + 200] = b"\xff" * 180  # garble the third row group's k pages
    path.write_bytes(bytes(data))
    with pytest.raises(InputError) as info:
        extagg.aggregate_files(str(path), by="k", aggs={"n": ("*", "count")}).read_all()
    assert "bad.parquet" in str(info.value)
    assert info.value.row_group == 2 and "row group 2" in str(info.value)
    # among good files (one reader thread reads them all, ahead of the batches taken): the
    # error names the bad one
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(4):
        pq.write_table(table, folder / f"a{i}.parquet", row_group_size=1_000)
    path.rename(folder / "a2b.parquet")
    with pytest.raises(InputError) as info:
        extagg.aggregate_files(str(folder), by="k", aggs={"n": ("*", "count")}).read_all()
    assert "a2b.parquet" in str(info.value) and info.value.row_group == 2


def test_text_errors_name_the_file_among_many(tmp_path):
    for i in range(3):
        (tmp_path / f"f{i}.csv").write_text("k,v\n" + "".join(f"{j},{j}\n" for j in range(50)))
    (tmp_path / "f1b.csv").write_text("k,v\n1,2\n3,4,5\n")
    with pytest.raises(InputError) as info:
        extagg.aggregate_files(str(tmp_path), by="k", aggs={"n": ("*", "count")}).read_all()
    assert "f1b.csv" in str(info.value) and "Expected 2 columns" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"by": "kk"}, ["unknown column 'kk'", "did you mean 'k'", "available: k, s, v, q"]),
        ({"where": "vv > 1"}, ["unknown column 'vv'", "did you mean 'v'"]),
        ({"having": "nn > 1"}, ["unknown result column 'nn'", "did you mean 'n'"]),
        ({"memory": "lots"}, ["'lots'"]),
        ({"aggs": {"x": ("v", "summ")}}, ["unknown aggregate function 'summ'", "sum"]),
        ({"format": "xls"}, ["unknown format 'xls'"]),
    ],
)
def test_usage_errors(tmp_path, table, kwargs, words):
    write(table, tmp_path / "t.parquet", "parquet")
    args = {"by": "k", "aggs": AGGS, **kwargs}
    with pytest.raises(QueryError) as info:
        extagg.aggregate_files(str(tmp_path / "t.parquet"), **args)
    for w in words:
        assert w in str(info.value)


def test_missing_input(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        extagg.aggregate_files(str(tmp_path / "nope.parquet"), by="k", aggs=AGGS)
    with pytest.raises(InputError, match="no file matches"):
        extagg.aggregate_files(str(tmp_path / "*.parquet"), by="k", aggs=AGGS)


def test_globs_skip_the_markers_spark_writes_as_directories_do(tmp_path):
    """``out/*`` of a Spark job's output: its ``_SUCCESS``, ``_committed_*`` and ``.crc`` side
    files are skipped (they had stopped the run: no format for ``_SUCCESS``); a glob matching
    only such files says so; a marker named on its own is read as asked."""
    out = tmp_path / "out"
    out.mkdir()
    pq.write_table(pa.table({"k": [1, 2]}), out / "part-00000.snappy.parquet")
    pq.write_table(pa.table({"k": [3]}), out / "part-00001.snappy.parquet")
    for marker in ("_SUCCESS", "_committed_42", ".part-00000.snappy.parquet.crc"):
        (out / marker).write_bytes(b"")
    for given in (str(out / "*"), str(out)):
        got = extagg.aggregate_files(given, aggs={"n": ("*", "count")}).read_all()
        assert got.to_pylist() == [{"n": 3}]
    with pytest.raises(InputError, match="only marker files match"):
        extagg.aggregate_files(str(out / "_*"), aggs={"n": ("*", "count")})
    with pytest.raises(QueryError, match=r"cannot tell the format of .*_SUCCESS"):
        extagg.aggregate_files(str(out / "_SUCCESS"), aggs={"n": ("*", "count")})


def test_globs_skip_hidden_and_underscore_folders_below_their_wildcards(tmp_path):
    """``data/**/*.csv`` read ``data/_temporary/0/part.csv`` (a Spark job's unfinished output)
    and the walk of ``data`` did not: both skip it now. Folders the pattern names (literally,
    or by a wildcard that starts with ``_``) are read."""
    data = tmp_path / "_data"
    for folder, v in (("", 1), ("_temporary/0", 100), (".staging", 1000), ("_tmp1", 10)):
        (data / folder).mkdir(parents=True, exist_ok=True)
        (data / folder / "part.csv").write_text(f"k,v\na,{v}\n")
    for given, total in (
        (str(data / "**" / "*.csv"), 1),
        (str(data), 1),
        (str(data / "*.csv"), 1),
        (str(data / "_tmp*" / "*.csv"), 10),
        (str(data / "_temporary" / "*" / "*.csv"), 100),
    ):
        got = extagg.aggregate_files(given, aggs={"s": ("v", "sum")}).read_all()
        assert got.to_pylist() == [{"s": total}], given


def test_string_view_columns_are_read_as_strings(tmp_path):
    """Parquet files written by Rust tools (tpchgen-cli) hold string_view columns."""
    t = pa.table({"g": pa.array(["a", "b", "a", None], pa.string_view()), "v": [1, 2, 3, 4]})
    pq.write_table(t, tmp_path / "sv.parquet")
    assert pq.read_schema(tmp_path / "sv.parquet").field("g").type == pa.string_view()
    reader = extagg.aggregate_files(
        str(tmp_path / "sv.parquet"), by="g", aggs={"s": ("v", "sum")}, where="g != 'b'"
    )
    got = {r["g"]: r["s"] for r in reader.read_all().to_pylist()}
    assert got == {"a": 4}


def _scanned_types(source, by, where=None) -> dict:
    """The column types of the first batch a planned query's scan reads."""
    from extagg.io.run import plan_query

    query = plan_query(source, by=by, aggs=AGGS, where=where)
    try:
        query.run()  # plans the dictionary columns, then reads
        return {f.name: f.type for f in next(iter(query.scan.batches())).schema}
    finally:
        query.close()


def test_parquet_string_keys_are_read_as_codes(tmp_path):
    """String keys with small dictionary pages come as dictionary arrays (the engine groups
    them by codes); a key whose writer gave up on the dictionary (a large page), and one the
    filter reads, come as plain strings. Same answers as pandas either way."""
    import numpy as np

    rng = np.random.default_rng(3)
    n = 60_000
    flags = rng.choice(np.array(["A", "N", "R", None], dtype=object), n)
    table = pa.table(
        {
            "f": pa.array(flags, pa.string()),
            "g": pa.array(rng.choice(["x", "y"], n)),
            "u": pa.array([f"user-{i:09d}-{rng.integers(1 << 40)}" for i in range(n)]),
            "v": np.round(rng.random(n) * 100, 3),
            "q": rng.integers(1, 50, n).astype(np.int32),
        }
    )
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=20_000)

    def scanned_types(by, where=None):
        return _scanned_types(path, by, where)

    types = scanned_types(["f", "g", "u"])
    assert pa.types.is_dictionary(types["f"]) and pa.types.is_dictionary(types["g"])
    assert types["u"] == pa.string()  # its ~600 KiB dictionary pages: decoded by Arrow
    assert scanned_types(["f", "g"], where="g = 'x'")["g"] == pa.string()

    for by, where in ((["f", "g"], None), (["g", "f"], "q < 30"), (["f"], "f is not null")):
        got = extagg.aggregate_files(path, by=by, aggs=AGGS, where=where, memory="4m").read_all()
        want_table = table.filter(ds.field("q") < 30) if where == "q < 30" else table
        if where == "f is not null":
            want_table = want_table.filter(ds.field("f").is_valid())
        want = {
            tuple(None if k != k else k for k in key): v  # pandas' NaN for a null key
            for key, v in reference(want_table, by).items()
        }
        assert_same(as_dict(got, by), want)


def test_csv_string_keys_with_few_values_are_parsed_as_codes(tmp_path):
    """CSV key strings that take few values in the first block are parsed as dictionaries
    (grouped by their codes); many values, a key the filter reads, or an int key beside them:
    plain strings. A key with few values at first and many later (its dictionaries then fall
    back to strings chunk by chunk), nulls and empty strings included: the same answers as
    pandas either way, gzip'd too."""
    import numpy as np

    rng = np.random.default_rng(5)
    n = 120_000
    early = 100_000  # the first block (4 MiB, ~70 k rows) holds only these
    late = [f"late-{i}" for i in range(n - early)]  # many values at the end only
    table = pa.table(
        {
            "f": pa.array(rng.choice(np.array(["A", "N", "R", "", None], dtype=object), n)),
            "g": pa.array(rng.choice(["x", "y"], n)),
            "u": pa.array([f"user-{i}" for i in rng.integers(0, 1 << 40, n)]),
            "m": pa.array(list(rng.choice(["p", "q"], early)) + late),
            "k": rng.integers(0, 40, n),
            "v": np.round(rng.random(n) * 100, 3),
            "q": rng.integers(1, 50, n).astype(np.int32),
        }
    )
    path = tmp_path / "t.csv"
    pacsv.write_csv(table, path)
    gz = tmp_path / "t.csv.gz"
    with open(path, "rb") as src, gzip.open(gz, "wb") as dst:
        dst.write(src.read())

    def scanned_types(by, where=None, source=path):
        return _scanned_types(source, by, where)

    types = scanned_types(["f", "g"])
    assert pa.types.is_dictionary(types["f"]) and pa.types.is_dictionary(types["g"])
    assert pa.types.is_dictionary(scanned_types(["f", "g"], source=gz)["g"])
    assert scanned_types(["f", "u"])["f"] == pa.string()  # u: a value per row
    assert scanned_types(["f", "g"], where="g = 'x'")["g"] == pa.string()
    assert scanned_types(["f", "k"])["f"] == pa.string()  # an int key: no codes to group by
    assert pa.types.is_dictionary(scanned_types(["m"])["m"])  # few values in the sample

    for by, where, source in (
        (["f", "g"], None, path),
        (["g", "f"], "q < 30", gz),
        (["m"], None, path),
        (["m", "g"], "k < 20", path),
    ):
        got = extagg.aggregate_files(source, by=by, aggs=AGGS, where=where, memory="4m")
        want_table = table  # "" (quoted) stays the empty string, an empty field is null
        if where == "q < 30":
            want_table = want_table.filter(ds.field("q") < 30)
        if where == "k < 20":
            want_table = want_table.filter(ds.field("k") < 20)
        want = {
            tuple(None if k != k else k for k in key): v  # pandas' NaN for a null key
            for key, v in reference(want_table, by).items()
        }
        assert_same(as_dict(got.read_all(), by), want)


def test_csv_keys_in_hive_folders_and_the_folder_key(tmp_path):
    """Hive-partitioned CSV: a text key with few values is grouped by codes beside the folder
    key, which comes from the folder names (never sampled from the text): same answers as
    pandas."""
    import pyarrow.compute as pc

    table = sample_table(6_000)
    table = table.append_column("t", pc.binary_join_element_wise(table["s"], "-", ""))
    ds.write_dataset(
        table, tmp_path / "hive", format="csv", partitioning=["s"], partitioning_flavor="hive"
    )
    for by in (["s"], ["t"], ["s", "t"]):
        got = extagg.aggregate_files(str(tmp_path / "hive"), by=by, aggs=AGGS, memory="4m")
        assert_same(as_dict(got.read_all(), by), reference(table, by))


def _finished_by(items, finish_sleep=0.0, read_sleep=0.0, consume_sleep=0.0):
    """Run ``_prefetched`` over ``items`` with a finishing step that records its thread."""
    import threading
    import time

    from extagg.io.inputs import _prefetched

    def produce():
        for item in items:
            time.sleep(read_sleep)
            yield item

    def finish(item):
        time.sleep(finish_sleep)
        return item * 10, threading.current_thread().name

    out = []
    for value, thread in _prefetched(produce(), 1, finish):
        out.append((value, thread))
        time.sleep(consume_sleep)
    return out


def test_the_scan_finishes_batches_on_the_side_that_waits():
    """A slow caller leaves the finishing step (the filter) to the reader thread; a slow
    reader hands it to the caller, whose core would otherwise idle. Same items, same order."""
    items = list(range(40))
    # waits of 15 ms: longer than a busy machine's scheduling delays (with 4 ms, CI's load
    # once had the caller finish 3 of 40 items of a slow caller; the test allows 2)
    slow_caller = _finished_by(items, consume_sleep=0.015)
    assert [v for v, _ in slow_caller] == [i * 10 for i in items]
    on_reader = sum(t == "extagg-scan" for _, t in slow_caller)
    assert on_reader >= len(items) - 2, slow_caller

    slow_reader = _finished_by(items, read_sleep=0.015)
    assert [v for v, _ in slow_reader] == [i * 10 for i in items]
    on_caller = sum(t != "extagg-scan" for _, t in slow_reader)
    assert on_caller >= len(items) // 2, slow_reader


def test_a_finishing_step_error_reaches_the_caller_on_either_side():
    from extagg.io.inputs import _prefetched

    def finish(item):
        if item == 3:
            raise ValueError("bad batch 3")
        return item

    for read_sleep in (0.0, 0.003):  # finished by the reader / mostly by the caller

        def produce(read_sleep=read_sleep):
            import time

            for i in range(6):
                time.sleep(read_sleep)
                yield i

        got = []
        with pytest.raises(ValueError, match="bad batch 3"):
            for item in _prefetched(produce(), 1, finish):
                got.append(item)
        assert got == [0, 1, 2]
    assert list(_prefetched(iter(range(5)), 0, lambda i: -i)) == [0, -1, -2, -3, -4]


def test_where_filter_is_the_same_whichever_thread_applies_it(tmp_path, monkeypatch):
    """The Parquet filter step run by the caller (the reader made slow) gives the rows of
    the one run by the reader."""
    import pyarrow.compute as pc

    from extagg.io import inputs

    n = 50_000
    table = pa.table({
        "k": pa.array([i % 7 for i in range(n)], pa.int64()),
        "v": pa.array(range(n), pa.int64()),
        "d": pa.array([i % 100 for i in range(n)], pa.int32()),
    })  # fmt: skip
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=5_000)
    expected = {
        r["k"]: r["s"]
        for r in table.filter(pc.less(table["d"], 30))
        .group_by("k").aggregate([("v", "sum")]).rename_columns(["k", "s"]).to_pylist()
    }  # fmt: skip
    for starved in (False, True):
        monkeypatch.setattr(inputs._WaitBalance, "consumer_starved", lambda self, s=starved: s)
        out = extagg.aggregate_files(
            str(path), by="k", aggs={"s": ("v", "sum")}, where="d < 30", batch_rows=1_000
        ).read_all()
        assert dict(zip(out["k"].to_pylist(), out["s"].to_pylist())) == expected


def _numbers_text(path: Path, n: int) -> Path:
    """``n`` rows of (k, v) as CSV or JSON Lines (by ``path``'s extension), written fast."""
    if path.suffix == ".csv":
        path.write_text("k,v\n" + "".join(f"{i % 97},{i}.5\n" for i in range(n)))
    else:
        path.write_text("".join(f'{{"k": {i % 97}, "v": {i}.5}}\n' for i in range(n)))
    return path


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_text_scan_reads_a_few_blocks_ahead_not_arrows_32(tmp_path, monkeypatch, fmt):
    """Arrow's streaming CSV/JSON readers read 32 blocks ahead of the batch asked for, into
    Arrow's pool and outside the budget; the scan lets them read only a few. While the caller
    holds the first batch, the reader has read at most ``TEXT_BLOCKS_AHEAD`` + 1 blocks
    beyond the batches taken and the pool holds no more than the scan accounts for
    (``TEXT_BLOCKS_HELD`` blocks and the batches: the caller's and the one queued); with
    the limit lifted, the reader runs 20 blocks and more ahead."""
    import gc
    import time

    from extagg.io import inputs

    n = 600_000
    path = _numbers_text(tmp_path / f"t.{fmt}", n)
    block = 128 << 10
    assert path.stat().st_size > 40 * block
    gates: list[inputs._GatedStream] = []

    class Recorded(inputs._GatedStream):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            gates.append(self)

    monkeypatch.setattr(inputs, "_GatedStream", Recorded)

    def scan_with_a_slow_caller(wait_for_lead: int) -> tuple[int, int, int, int]:
        scan = inputs.open_input(str(path), ["k", "v"])
        scan.block_bytes = block
        if wait_for_lead:  # the limit lifted
            scan.text_blocks_ahead = 1 << 20
        gc.collect()
        before = pa.total_allocated_bytes()
        batches = scan.batches()
        first = next(batches)
        gate = gates[-1]
        deadline = time.monotonic() + (5 if wait_for_lead else 0.5)
        while time.monotonic() < deadline:  # Arrow's reader reads ahead as far as it may
            time.sleep(0.05)
            if wait_for_lead and gate.max_lead >= wait_for_lead:
                break
        held = pa.total_allocated_bytes() - before
        lead = gate.max_lead
        rows = first.num_rows + sum(b.num_rows for b in batches)
        return lead, held, first.nbytes, rows

    lead, held, batch_bytes, rows = scan_with_a_slow_caller(0)
    assert rows == n
    assert lead <= inputs.TEXT_BLOCKS_AHEAD + 1, lead
    assert held <= inputs.TEXT_BLOCKS_HELD * block + 2 * batch_bytes, (held, batch_bytes)
    lead, _, _, rows = scan_with_a_slow_caller(20)
    assert rows == n
    assert lead >= 20, lead


def test_the_text_gate_waits_for_the_caller_and_opens_while_the_caller_waits():
    """A read past the limit waits until the caller takes a batch; it goes ahead when the
    caller itself waits for the reader (a block that gives no batch must not stop both);
    closing the gate ends a waiting read with the end of the file."""
    import threading
    import time

    from extagg.io.inputs import GATE_ESCAPE_S, _GatedStream

    gate = _GatedStream(pa.BufferReader(b"x" * 100), ahead=1)
    assert bytes(gate.read(10)) == b"x" * 10 and bytes(gate.read(10)) == b"x" * 10  # 2 reads
    done = threading.Event()
    got: list[bytes] = []

    def third_read() -> None:
        got.append(bytes(gate.read(10)))
        done.set()

    threading.Thread(target=third_read, daemon=True).start()
    assert not done.wait(3 * GATE_ESCAPE_S)  # two blocks ahead of none taken: it waits
    assert gate.call(lambda: 1, taken=True) == 1  # one taken: it may go
    assert done.wait(5) and got == [b"x" * 10]

    done.clear()
    threading.Thread(target=third_read, daemon=True).start()
    assert not done.wait(GATE_ESCAPE_S / 2)
    started = time.monotonic()
    gate.call(lambda: done.wait(5))  # the caller waits on the reader: the read goes ahead
    assert done.is_set() and time.monotonic() - started < 5
    assert gate.max_lead == 3

    done.clear()
    threading.Thread(target=third_read, daemon=True).start()
    assert not done.wait(GATE_ESCAPE_S / 2)
    gate.close()
    assert done.wait(5) and got[-1] == b""


def test_compressed_csv_in_hive_folders(tmp_path):
    """Text files in hive folders, plain and compressed (``.zst`` included), give the
    folder's column and the same groups as the table they came from."""
    table = sample_table(3_000)
    parts = {"x": table.slice(0, 1_000), "y": table.slice(1_000, 1_000), "z": table.slice(2_000)}
    codecs = {"x": None, "y": "gz", "z": "zst"}
    for value, part in parts.items():
        folder = tmp_path / "hive" / f"p={value}"
        folder.mkdir(parents=True)
        write(part, folder / "part.csv", "csv")
        if codecs[value]:
            compress(folder / "part.csv", codecs[value])
    full = pa.concat_tables(
        [t.append_column("p", pa.array([v] * len(t))) for v, t in parts.items()]
    )
    got = run(str(tmp_path / "hive"), by=["p", "k"])
    assert_same(as_dict(got, ["p", "k"]), reference(full, ["p", "k"]))
    only_y = run(str(tmp_path / "hive"), by=["p"], where="p = 'y' and k < 10")
    assert only_y.column("p").to_pylist() == ["y"]


def test_arrow_keeps_no_python_object_of_a_gated_read():
    """A block Arrow reads through the gate is Arrow's own memory: a ``pa.PythonFile`` read
    alone wraps the Python buffer returned, and Arrow's I/O thread later releases it taking
    the GIL, which aborted the process when that came after the interpreter began to
    finalize ("terminate called without an active exception", 1 run in 80 under load)."""
    import gc
    import weakref

    from extagg.io.inputs import _GatedStream

    lent: list[weakref.ref] = []

    class Tracked:
        def __init__(self, data: bytes) -> None:
            self._stream = pa.BufferReader(data)

        def read_buffer(self, nbytes: int) -> pa.Buffer:
            buffer = self._stream.read_buffer(nbytes)
            lent.append(weakref.ref(buffer))
            return buffer

    gate = _GatedStream(Tracked(b"abc" * 1000), ahead=8)
    stream = gate.arrow_stream()
    block = stream.read_buffer(1200)  # as Arrow's reader reads a block
    assert block.to_pybytes() == (b"abc" * 1000)[:1200]
    gc.collect()
    assert lent and all(ref() is None for ref in lent)
    assert stream.read_buffer(10_000).size == 1800 and stream.read_buffer(10).size == 0


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_process_that_leaves_a_text_scan_unfinished_exits_cleanly(tmp_path, fmt):
    """A scan left unfinished (its batches still referenced) at exit: the gate is opened and
    Arrow's reader thread takes its end of file before the interpreter finalizes (a thread of
    Arrow's calling into a finalizing interpreter aborts the process: exit 134)."""
    import subprocess
    import sys

    path = _numbers_text(tmp_path / f"t.{fmt}", 300_000)
    script = (
        "import time\n"
        "from extagg.io.inputs import open_input\n"
        f"scan = open_input({str(path)!r}, ['k', 'v'])\n"
        "scan.block_bytes = 64 << 10\n"
        "KEPT = scan.batches()\n"
        "next(KEPT)\n"
        "time.sleep(0.3)\n"
        "print('left open')\n"
    )
    for _ in range(3):
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip() == "left open"


def test_a_file_with_two_columns_of_one_name_is_refused_naming_both(tmp_path):
    """A CSV header (or a Parquet schema) naming a column twice crashed with a ``KeyError``
    traceback when the query read that name; other columns of the file still read."""
    src = tmp_path / "dup.csv"
    src.write_text("k,k,v\na,b,1\nc,d,2\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"dup\.csv has 2 columns named 'k'"):
        extagg.aggregate_files(str(src), by="k", aggs={"s": ("v", "sum")})
    got = extagg.aggregate_files(str(src), by="v", aggs={"n": ("*", "count")}, sort=True)
    assert got.read_all().to_pylist() == [{"v": 1, "n": 1}, {"v": 2, "n": 1}]
    table = pa.Table.from_arrays([pa.array([1, 2]), pa.array([3, 4])], names=["x", "x"])
    pq.write_table(table, tmp_path / "dup.parquet")
    with pytest.raises(InputError, match=r"dup\.parquet has 2 columns named 'x'"):
        extagg.aggregate_files(str(tmp_path / "dup.parquet"), by="x")


def test_summing_a_csv_column_read_as_text_says_how_to_read_numbers(tmp_path):
    src = tmp_path / "t.csv"
    src.write_text("k,v\na,1\nb,2\nc,one\n", encoding="utf-8")
    with pytest.raises(QueryError, match=r"sum\('v'\).*--column-types COLUMN:float64"):
        extagg.aggregate_files(str(src), by="k", aggs={"s": ("v", "sum")})


@pytest.mark.parametrize("fmt", ["parquet", "csv", "tsv", "jsonl", "arrow", "arrows"])
def test_count_of_rows_alone_reads_no_column_and_counts_every_row(tmp_path, fmt):
    """``count(*)`` with no key reads no column: a CSV/TSV file said 0 rows (its parsed
    blocks were rebuilt with no column, which loses their length)."""
    table = sample_table(2_500)
    path = tmp_path / f"data.{fmt}"
    write(table, path, fmt)
    got = extagg.aggregate_files(str(path), aggs={"n": ("*", "count")}).read_all().to_pylist()
    assert got == [{"n": 2_500}]
    compressed = tmp_path / "data.csv.gz"
    if fmt == "csv":
        compressed.write_bytes(gzip.compress(path.read_bytes()))
        got = extagg.aggregate_files(str(compressed), aggs={"n": ("*", "count")}).read_all()
        assert got.to_pylist() == [{"n": 2_500}]


@pytest.mark.parametrize("delimiter", [";", "|", "\t"])
def test_csv_delimiter_read_off_a_header_without_commas(tmp_path, delimiter):
    """A ``.csv`` whose header has no comma and one of ``;``, ``|`` or a tab between its
    names is read with that delimiter (Excel writes ``;`` where the decimal mark is a comma);
    a header with a comma keeps the comma, and ``delimiter`` given is obeyed."""
    lines = ["id;note;amount", "1;a,b;5", "1;c;6", "2;d;7"]
    path = tmp_path / "semi.csv"
    path.write_text("\ufeff" + "\n".join(line.replace(";", delimiter) for line in lines) + "\n")
    reader = extagg.aggregate_files(str(path), by="id", aggs={"s": ("amount", "sum")})
    assert sorted(reader.read_all().to_pylist(), key=str) == [
        {"id": 1, "s": 11}, {"id": 2, "s": 7}
    ]  # fmt: skip
    one_column = tmp_path / "one.csv"
    one_column.write_text(f"a{delimiter}b,c\n1,2\n")  # a comma in the header: comma-separated
    got = extagg.aggregate_files(str(one_column), by="c", aggs={"n": ("*", "count")}).read_all()
    assert got.to_pylist() == [{"c": 2, "n": 1}]
    with pytest.raises(InputError, match=r"semi\.csv as csv: CSV parse error: Expected 1 columns"):
        extagg.aggregate_files(str(path), by="id", aggs={"n": ("*", "count")}, delimiter=",")


def test_csv_delimiter_read_off_each_file(tmp_path):
    """Each ``.csv`` file's delimiter is read off its own header: a ``;`` file beside a
    ``,`` one (in either order) is read by its columns, not as one column of nulls."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "a_comma.csv").write_text("k,v\na,1\nb,2\n")
    (folder / "b_semi.csv").write_text("k;v\na;10\nb;20\nc;30\n")
    want = [{"k": "a", "s": 11, "n": 2}, {"k": "b", "s": 22, "n": 2}, {"k": "c", "s": 30, "n": 1}]
    aggs = {"s": ("v", "sum"), "n": ("*", "count")}
    for paths in ([str(folder)], [str(folder / "b_semi.csv"), str(folder / "a_comma.csv")]):
        got = extagg.aggregate_files(paths, by="k", aggs=aggs).read_all().to_pylist()
        assert sorted(got, key=str) == want


def test_csv_integers_past_int64_keep_every_digit(tmp_path):
    """Integers past int64 (Arrow infers float64, which made ``...123`` and ``...124`` one
    key) are read as ``decimal(38, 0)``, as DuckDB's HUGEINT; past 38 digits as strings;
    a column of floats stays float64, and ``column_types`` is obeyed."""
    path = tmp_path / "big.csv"
    ids = ["12345678901234567890123", "12345678901234567890124", "9223372036854775808",
           "18446744073709551615"]  # fmt: skip
    path.write_text("id,f,v\n" + "".join(f"{i},{n}.5,{n}\n" for n, i in enumerate(ids, 1)))
    result = extagg.aggregate_files(str(path), by="id", aggs={"s": ("v", "sum")}).read_all()
    assert result.schema.field("id").type == pa.decimal128(38, 0)
    assert sorted((str(r["id"]), r["s"]) for r in result.to_pylist()) == sorted(
        zip(ids, [1, 2, 3, 4], strict=True)
    )
    aggs = {"n": ("id", "count_distinct"), "hi": ("id", "max"), "f": ("f", "sum")}
    got = extagg.aggregate_files(str(path), aggs=aggs).read_all().to_pylist()
    assert got == [{"n": 4, "hi": decimal.Decimal(ids[1]), "f": 12.0}]
    got = extagg.aggregate_files(
        str(path), aggs={"n": ("*", "count")}, where="id = 12345678901234567890124"
    ).read_all()
    assert got.to_pylist() == [{"n": 1}]
    typed = extagg.aggregate_files(
        str(path), by="id", aggs={"n": ("*", "count")}, column_types={"id": pa.float64()}
    ).read_all()
    assert typed.schema.field("id").type == pa.float64() and typed.num_rows == 3
    longer = tmp_path / "longer.csv"
    longer.write_text("id,v\n" + "9" * 39 + ",1\n-" + "9" * 39 + ",2\n")
    result = extagg.aggregate_files(str(longer), by="id", aggs={"s": ("v", "sum")}).read_all()
    assert result.schema.field("id").type == pa.string()
    assert sorted(r["id"] for r in result.to_pylist()) == ["-" + "9" * 39, "9" * 39]


def test_csv_integers_with_leading_zeros_are_strings(tmp_path):
    """Ids written with a leading zero keep it (``007``, ``7`` and ``0007`` are three keys,
    as in DuckDB, which reads them as VARCHAR; Arrow's int64 made them one key ``7``); a
    lone ``0`` or a float such as ``0.5`` is no leading zero."""
    path = tmp_path / "lz.csv"
    path.write_text("id,n,x,v\n007,0,0.5,1\n7,1,1.5,2\n0007,10,-0.25,3\n08,0,00.5,4\n")
    result = extagg.aggregate_files(str(path), by="id", aggs={"s": ("v", "sum")}).read_all()
    assert result.schema.field("id").type == pa.string()
    assert sorted((r["id"], r["s"]) for r in result.to_pylist()) == [
        ("0007", 3), ("007", 1), ("08", 4), ("7", 2)
    ]  # fmt: skip
    got = extagg.aggregate_files(str(path), by="n", aggs={"x": ("x", "sum")}).read_all()
    assert got.schema.field("n").type == pa.int64() and got.schema.field("x").type == pa.float64()
    big = tmp_path / "big_lz.csv"  # past int64 too, with a leading zero: a string
    big.write_text("id,v\n012345678901234567890123,1\n12345678901234567890123,2\n")
    got = extagg.aggregate_files(str(big), by="id", aggs={"s": ("v", "sum")}).read_all()
    assert got.schema.field("id").type == pa.string() and got.num_rows == 2
    typed = extagg.aggregate_files(
        str(path), by="id", aggs={"s": ("v", "sum")}, column_types={"id": pa.int64()}
    ).read_all()
    assert sorted(typed.to_pylist(), key=str) == [{"id": 7, "s": 6}, {"id": 8, "s": 4}]


def test_csv_that_is_not_utf8_is_an_error_naming_file_and_column(tmp_path):
    """A Latin-1 CSV (Arrow infers its text columns as binary, which came out as base64, and
    made every file's keys binary beside a UTF-8 file) stops the run naming the file and
    the column; a column typed binary is read as its bytes."""
    latin = tmp_path / "latin1.csv"
    latin.write_bytes("k,v\nCafé,1\nCafé,2\n".encode("latin-1"))
    utf8 = tmp_path / "utf8.csv"
    utf8.write_text("k,v\nCafé,10\nTea,20\n", encoding="utf-8")
    aggs = {"s": ("v", "sum")}
    for paths in ([str(latin)], [str(utf8), str(latin)]):
        with pytest.raises(
            InputError, match=r"latin1\.csv: column 'k' holds text that is not UTF-8"
        ):
            extagg.aggregate_files(paths, by="k", aggs=aggs)
    got = extagg.aggregate_files(str(latin), aggs=aggs).read_all()  # k not read: no error
    assert got.to_pylist() == [{"s": 3}]
    got = extagg.aggregate_files(
        str(latin), by="k", aggs=aggs, column_types={"k": pa.binary()}
    ).read_all()
    assert got.to_pylist() == [{"k": "Café".encode("latin-1"), "s": 3}]


def test_csv_header_that_is_not_utf8_names_the_file(tmp_path):
    """A header that is not UTF-8 (Python's bare ``'utf-8' codec can't decode`` named no
    file) is an :class:`InputError` naming the file; ``schema`` names the columns instead."""
    path = tmp_path / "latin1_head.csv"
    path.write_bytes("Région,v\nNord,1\nSud,2\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"latin1_head\.csv as csv: its header is not UTF-8"):
        extagg.aggregate_files(str(path), aggs={"s": ("v", "sum")})
    schema = pa.schema([("region", pa.string()), ("v", pa.int64())])
    got = extagg.aggregate_files(str(path), aggs={"s": ("v", "sum")}, schema=schema).read_all()
    assert got.to_pylist() == [{"s": 3}]


def test_csv_encoding_reads_text_not_in_utf8(tmp_path):
    """``encoding`` reads CSV text written in another encoding (a Latin-1 header and values,
    over several blocks; UTF-16 with its ``;`` read off the header), as DuckDB's
    ``encoding``; it applies to CSV/TSV only, and must name a codec."""
    path = tmp_path / "latin1.csv"
    rows = 60_000  # ~1.5 MB: two 1 MiB blocks under a 16 MiB budget
    text = "Région,v\n" + "".join(f"Café{i % 7},{i}\n" for i in range(rows))
    path.write_bytes(text.encode("latin-1"))
    aggs = {"n": ("*", "count"), "s": ("v", "sum")}
    got = extagg.aggregate_files(
        str(path), by="Région", aggs=aggs, encoding="latin-1", memory="16m", sort=True
    ).read_all()
    want = [{"Région": f"Café{k}", "n": len(range(k, rows, 7)), "s": sum(range(k, rows, 7))}
            for k in range(7)]  # fmt: skip
    assert got.to_pylist() == want
    utf16 = tmp_path / "utf16.csv"
    utf16.write_text("k;v\nCafé;1\nCafé;2\nTea;3\n", encoding="utf-16")
    got = extagg.aggregate_files(str(utf16), by="k", aggs=aggs, encoding="utf-16", sort=True)
    assert got.read_all().to_pylist() == [
        {"k": "Café", "n": 2, "s": 3},
        {"k": "Tea", "n": 1, "s": 3},
    ]
    with pytest.raises(QueryError, match="unknown encoding 'nope'"):
        extagg.aggregate_files(str(path), aggs=aggs, encoding="nope")
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text('{"v": 1}\n')
    with pytest.raises(QueryError, match="--encoding applies to CSV/TSV only"):
        extagg.aggregate_files(str(jsonl), aggs=aggs, encoding="latin-1")


def test_json_types_are_inferred_from_a_sample_as_large_as_csvs(tmp_path):
    """JSON Lines types came from Arrow's default 1 MiB block, not the 4 MiB sample the docs
    give for text: a field null for its first 1.4 MB failed ("null in the first block"),
    where the same data as CSV worked."""
    path = tmp_path / "late.jsonl"
    with open(path, "w") as f:
        f.writelines(json.dumps({"k": f"k{i % 4}", "v": None}) + "\n" for i in range(60_000))
        f.writelines(json.dumps({"k": f"k{i % 4}", "v": i}) + "\n" for i in range(1_000))
    assert path.stat().st_size > 1 << 20
    got = extagg.aggregate_files(str(path), by="k", aggs={"s": ("v", "sum")}).read_all()
    assert {r["k"]: r["s"] for r in got.to_pylist()} == {
        f"k{j}": sum(range(j, 1_000, 4)) for j in range(4)
    }


def test_json_field_null_in_the_first_block_is_typed_by_column_types(tmp_path):
    """A JSON Lines field that is null in every line of the first block (its type inferred as
    null) and numbers later: the error says which field and how to type it; with
    ``column_types`` it is read as that type (types given apply to JSON Lines too)."""
    path = tmp_path / "late.jsonl"
    with open(path, "w") as f:
        for i in range(60_000):
            # ~130 bytes a line: the first 4 MiB block (types inferred from it) has no value
            f.write(json.dumps({"k": i % 3, "v": None if i < 50_000 else i, "pad": "x" * 100}))
            f.write("\n")
    aggs = {"s": ("v", "sum")}
    with pytest.raises(InputError, match=r"field 'v' is null .* --column-types v:int64"):
        extagg.aggregate_files(str(path), by="k", aggs=aggs).read_all()
    got = extagg.aggregate_files(str(path), by="k", aggs=aggs, column_types={"v": "int64"})
    got = got.read_all()
    expected = {k: sum(i for i in range(50_000, 60_000) if i % 3 == k) for k in range(3)}
    assert {r["k"]: r["s"] for r in got.to_pylist()} == expected
    with pytest.raises(QueryError, match=r"--column-types 'vv'; did you mean 'v'\?"):
        extagg.aggregate_files(str(path), by="k", aggs=aggs, column_types={"vv": "int64"})
    with pytest.raises(QueryError, match="--column-types applies to CSV/TSV and JSON Lines"):
        pq.write_table(pa.table({"v": [1]}), tmp_path / "x.parquet")
        extagg.aggregate_files(str(tmp_path / "x.parquet"), aggs=aggs, column_types={"v": "int64"})


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_empty_text_files_hold_no_rows(tmp_path, fmt):
    """An empty (or blank, or empty compressed) CSV/JSON Lines file is no rows: Arrow's
    readers refuse it ("Empty CSV file", "Empty JSON stream"), which stopped the whole run
    over a folder where log rotation had left one. All empty: no rows, no types to learn."""
    write(pa.table({"k": [1, 2, 1], "v": [1.0, 2.0, 3.0]}), tmp_path / f"a.{fmt}", fmt)
    (tmp_path / f"b.{fmt}").write_bytes(b"")
    (tmp_path / f"c.{fmt}").write_text("\n\n")
    (tmp_path / f"e.{fmt}").write_text(" \n" * 5_000)  # more than 4 KiB: "Empty CSV file"
    (tmp_path / f"d.{fmt}.gz").write_bytes(gzip.compress(b""))
    aggs = {"s": ("v", "sum"), "n": ("*", "count")}
    got = extagg.aggregate_files(str(tmp_path), by="k", aggs=aggs).read_all().to_pylist()
    assert sorted(got, key=str) == [{"k": 1, "s": 4.0, "n": 2}, {"k": 2, "s": 2.0, "n": 1}]
    os.remove(tmp_path / f"a.{fmt}")
    assert extagg.aggregate_files(str(tmp_path), by="k", aggs=aggs).read_all().num_rows == 0
    got = extagg.aggregate_files(str(tmp_path), aggs=aggs).read_all().to_pylist()
    assert got == [{"s": None, "n": 0}]


def test_empty_inputs_take_the_declared_schema_and_warn_without_one(tmp_path, caplog):
    """Every input empty: a ``--schema`` still names the columns (one it lacks is an unknown
    column, as with rows; the result has its types: a string key was of type null) and
    ``--column-types`` types its columns; with neither no header can tell a mistyped column
    from a real one (DuckDB and Polars refuse such a file), so a warning says the columns
    went unchecked."""
    (tmp_path / "a.csv").write_bytes(b"")
    (tmp_path / "b.csv").write_text("\n")
    schema = "k:string,v:int64"
    aggs = {"s": ("v", "sum"), "n": ("*", "count")}
    with pytest.raises(QueryError, match=r"unknown column 'kk'; did you mean 'k'\?"):
        extagg.aggregate_files(str(tmp_path), by="kk", aggs=aggs, schema=schema, header=False)
    with pytest.raises(QueryError, match="unknown column 'w'"):
        extagg.aggregate_files(str(tmp_path), by="k", aggs=aggs, schema=schema, where="w > 1")
    with caplog.at_level(logging.WARNING, logger="extagg"):
        result = extagg.aggregate_files(str(tmp_path), by="k", aggs=aggs, schema=schema)
        table = result.read_all()
    assert table.num_rows == 0 and not caplog.records
    assert table.schema.field("k").type == pa.string()
    assert table.schema.field("s").type == pa.int64()
    with caplog.at_level(logging.WARNING, logger="extagg"):
        table = extagg.aggregate_files(
            str(tmp_path), by="k", aggs=aggs, column_types={"k": "int32"}
        ).read_all()
    assert table.num_rows == 0 and table.schema.field("k").type == pa.int32()
    assert "every input is empty (2 files, e.g." in caplog.text
    assert "not checked" in caplog.text


@pytest.mark.parametrize("name", ["h.csv", "h.csv.gz", "h.tsv"])
def test_a_csv_file_of_a_header_only_has_columns_of_no_type(tmp_path, name):
    """A CSV file of its header line only (an export of no rows) is no rows, whatever the
    aggregates: its columns have no value to be typed by, and were read as text, so ``sum``
    of one was refused ("not supported for column 'v' of type string"). A column empty in
    every row of a file that has rows stays text, as DuckDB reads it."""
    sep = "\t" if ".tsv" in name else ","
    header = f"k{sep}v\n".encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(header) if name.endswith(".gz") else header)
    aggs = {"s": ("v", "sum"), "m": ("v", "max"), "n": ("*", "count"), "d": ("v", "count_distinct")}
    assert extagg.aggregate_files(str(path), by="k", aggs=aggs).read_all().num_rows == 0
    got = extagg.aggregate_files(str(path), aggs=aggs, where="v > 5").read_all().to_pylist()
    assert got == [{"s": None, "m": None, "n": 0, "d": 0}]
    rows = tmp_path / "rows.csv"
    rows.write_text("k,v\na,\nb,\n")
    with pytest.raises(QueryError, match="of type string"):
        extagg.aggregate_files(str(rows), by="k", aggs={"s": ("v", "sum")})


def test_categorical_and_plain_strings_and_integers_beside_decimals_unify(tmp_path):
    """A pandas categorical column (a Parquet dictionary) in one file and plain strings in
    another were refused as not unifiable; an int32 column beside a decimal(12, 4) one was
    promoted by Arrow to decimal(13, 4), too narrow for the int: the scan failed at its
    first large value ("Precision is not great enough")."""
    import decimal

    folder = tmp_path / "mixed"
    folder.mkdir()
    dictionary = pa.array(["x", "y", "x"]).dictionary_encode()
    pq.write_table(
        pa.table({"k": dictionary, "v": pa.array([1, 2_000_000_000, 3], pa.int32())}),
        folder / "a.parquet",
    )
    pq.write_table(
        pa.table({
            "k": ["x", "z"],
            "v": pa.array([decimal.Decimal("1.2500"), decimal.Decimal("-3.1000")],
                          pa.decimal128(12, 4)),
        }),
        folder / "b.parquet",
    )  # fmt: skip
    got = extagg.aggregate_files(folder, by=["k"], aggs=["s=sum(v)", "n=count(*)"]).read_all()
    rows = {r["k"]: (r["s"], r["n"]) for r in got.to_pylist()}
    assert rows == {
        "x": (decimal.Decimal("5.2500"), 3),
        "y": (decimal.Decimal("2000000000.0000"), 1),
        "z": (decimal.Decimal("-3.1000"), 1),
    }


def test_uint64_beside_a_signed_integer_unifies_exactly(tmp_path):
    """Arrow promoted uint64 beside int64 to int64: the scan then failed past 2^63 - 1 with
    "cannot read u.parquet, row group 0: Integer value ... not in range", as if the file
    were damaged. Both fit decimal(20, 0)."""
    import decimal

    pq.write_table(pa.table({"k": [1, 2], "v": pa.array([2**63 + 5, 7], pa.uint64())}),
                   tmp_path / "u.parquet")  # fmt: skip
    pq.write_table(pa.table({"k": [1, 2], "v": pa.array([-1, -8], pa.int16())}),
                   tmp_path / "i.parquet")  # fmt: skip
    got = extagg.aggregate_files(
        str(tmp_path), by=["k"], aggs=["s=sum(v)", "hi=max(v)"], sort=True
    ).read_all()
    assert got.to_pylist() == [
        {"k": 1, "s": decimal.Decimal(2**63 + 4), "hi": decimal.Decimal(2**63 + 5)},
        {"k": 2, "s": decimal.Decimal(-1), "hi": decimal.Decimal(7)},
    ]


def test_timestamps_stored_with_different_zones_unify_as_utc_instants(tmp_path):
    """Parquet files whose timestamps name different zones (``UTC``, ``Etc/UTC``,
    ``Europe/Paris``: each stores UTC instants) were refused, "these cannot be unified";
    DuckDB reads them as one ``TIMESTAMPTZ``. They unify as UTC, of the finer unit."""
    import datetime as dt

    utc = dt.timezone.utc
    for name, zone, unit, hour in (("a", "UTC", "s", 1), ("b", "Etc/UTC", "ms", 3),
                                   ("c", "Europe/Paris", "us", 2)):  # fmt: skip
        instant = pa.array([dt.datetime(2024, 1, 1, hour, tzinfo=utc)], pa.timestamp(unit, "UTC"))
        table = pa.table({"k": [1], "ts": instant.cast(pa.timestamp(unit, tz=zone))})
        pq.write_table(table, tmp_path / f"{name}.parquet")
    got = extagg.aggregate_files(
        str(tmp_path), by=["k"], aggs=["lo=min(ts)", "hi=max(ts)", "n=count(*)"]
    ).read_all()
    assert got.schema.field("hi").type == pa.timestamp("us", tz="UTC")
    assert got.to_pylist() == [{"k": 1, "lo": dt.datetime(2024, 1, 1, 1, tzinfo=utc),
                                "hi": dt.datetime(2024, 1, 1, 3, tzinfo=utc), "n": 3}]  # fmt: skip


def test_delimiter_names_and_bad_delimiters(tmp_path):
    """``\\t`` and ``tab`` are a tab (a shell passes the two characters); more than one
    character, or none, is a usage error, not Arrow's internal message."""
    path = tmp_path / "t.txt"
    path.write_text("k\tv\na\t1\nb\t2\na\t3\n")
    for name in ("\\t", "tab", "\t"):
        got = extagg.aggregate_files(str(path), by="k", aggs={"s": ("v", "sum")}, format="csv",
                                     delimiter=name).read_all()  # fmt: skip
        assert sorted(got.to_pylist(), key=str) == [{"k": "a", "s": 4}, {"k": "b", "s": 2}]
    for bad in (";;", "", "\n"):
        with pytest.raises(QueryError, match="--delimiter must be one character"):
            extagg.aggregate_files(str(path), by="k", format="csv", delimiter=bad)


def test_text_read_errors_name_the_column_the_type_and_long_lines(tmp_path):
    """A CSV value past the inferred type names the column (Arrow says ``column #1``); a JSON
    one says how to type it; a line longer than a read block says so."""
    csv = tmp_path / "late.csv"
    with open(csv, "w") as f:
        f.write("k,v\n")
        f.writelines(f"k{i % 10},{i}\n" for i in range(1_000_000))
        f.write("k1,1.5\n")
    with pytest.raises(InputError, match="type of column 'v' was inferred"):
        extagg.aggregate_files(str(csv), by="k", aggs={"s": ("v", "sum")}).read_all()
    jsonl = tmp_path / "late.jsonl"
    with open(jsonl, "w") as f:
        f.writelines(json.dumps({"k": i % 5, "v": i}) + "\n" for i in range(300_000))
        f.write(json.dumps({"k": 1, "v": 0.5}) + "\n")
    with pytest.raises(InputError, match="give it with --column-types NAME:TYPE"):
        extagg.aggregate_files(str(jsonl), by="k", aggs={"s": ("v", "sum")}).read_all()
    long = tmp_path / "long.csv"
    long.write_text("k,v,blob\na,1,x\nb,2," + "y" * 5_000_000 + "\n")
    with pytest.raises(InputError, match=r"a line longer than the .* blocks"):
        extagg.aggregate_files(str(long), by="k", aggs={"s": ("v", "sum")},
                               memory="32m").read_all()  # fmt: skip


def test_a_decimal_with_more_places_than_its_type_names_the_column(tmp_path):
    """Arrow's "In CSV column #1: Rescaling Decimal value would cause data loss" named neither
    the column nor what to do (the first block, read for the schema, failed)."""
    path = tmp_path / "dc.csv"
    path.write_text("k,c\na,1.255\na,-1.245\n")
    with pytest.raises(InputError, match=r"value of column 'c' has more decimal places.*scale"):
        extagg.aggregate_files(str(path), by="k", aggs={"s": ("c", "sum")},
                               column_types={"c": "decimal(5,2)"}).read_all()  # fmt: skip
    got = extagg.aggregate_files(str(path), by="k", aggs={"s": ("c", "sum")},
                                 column_types={"c": "decimal(6,3)"}).read_all()  # fmt: skip
    assert str(got["s"][0].as_py()) == "0.010"


def test_quoted_crlf_values_survive_every_block_boundary(tmp_path):
    """pyarrow's streaming CSV reader drops the ``\\n`` of a quoted ``\\r\\n`` that two of its
    blocks split: one value of 66 667 came out as ``...\\rline3`` at 16 MiB. Blocks handed to
    it never end in ``\\r`` now."""
    import csv

    path = tmp_path / "multiline.csv"
    note = 'line1\nline2,"q"\r\nline3'
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["k", "v", "note"])
        for i in range(200_000):
            w.writerow([f"k{i % 7}", i % 100, note if i % 3 == 0 else "plain"])
    for memory in ("16m", "8m", "32m"):
        got = extagg.aggregate_files(str(path), by="note", aggs={"n": ("*", "count")},
                                     memory=memory).read_all()  # fmt: skip
        assert sorted(got.to_pylist(), key=str) == [
            {"note": note, "n": 66_667}, {"note": "plain", "n": 133_333}
        ]  # fmt: skip


def test_folder_column_types_are_inferred_as_spark_infers_them():
    """Folder names give int32, then int64, then float64, date32, timestamp[us], else string;
    a number with leading zeros (a zip code) keeps the column a string, as does a mix."""
    from extagg.io.inputs import folder_column_type as typed

    assert typed({"1", "-7", "__HIVE_DEFAULT_PARTITION__"}) == pa.int32()
    assert typed({"1", "3000000000"}) == pa.int64()
    assert typed({"1", str(2**64)}) == pa.string()
    assert typed({"1", "1.5", "2e3"}) == pa.float64()
    assert typed({"2024-01-31", "2023-12-01"}) == pa.date32()
    assert typed({"2024-01-31 10%3A11%3A12", "2024-01-31T00:00:00.5"}) == pa.timestamp("us")
    for strings in ({"01234", "20000"}, {"+5"}, {"2024-02-30"}, {"1", "x"}, {"nan"}, set()):
        assert typed(strings) == pa.string(), strings
    assert typed({"__HIVE_DEFAULT_PARTITION__"}) == pa.string()


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl", "arrows"])
def test_dated_hive_folders_are_dates_and_filtered_by_date(tmp_path, fmt):
    """``dt=2024-01-02`` folders give a date column (was a string: ``dt >= date '…'`` was a
    type error), ``n=3000000000`` an int64, ``p=1.5`` a float64, ``zip=01234`` a string with
    its zero; a null folder is null; the filter on the folder keys selects whole folders."""
    rows = [
        ("2024-01-01", "3000000000", "1.5", "01234"),
        ("2024-01-02", "1", "2", "20000"),
        ("2024-01-03", "__HIVE_DEFAULT_PARTITION__", "2.5", "01234"),
        ("2024-01-03", "2", "__HIVE_DEFAULT_PARTITION__", "99999"),
    ]
    for i, (dt, n, p, z) in enumerate(rows):
        folder = tmp_path / "hive" / f"dt={dt}" / f"n={n}" / f"p={p}" / f"zip={z}"
        folder.mkdir(parents=True)
        write(pa.table({"v": pa.array([i + 1] * 10, pa.int64())}), folder / f"f.{fmt}", fmt)
    got = extagg.aggregate_files(
        str(tmp_path / "hive"), by=["dt", "n", "p", "zip"], aggs={"s": ("v", "sum")}, sort=True,
        memory="8m",
    ).read_all()  # fmt: skip
    assert [got.schema.field(c).type for c in ("dt", "n", "p", "zip")] == [
        pa.date32(), pa.int64(), pa.float64(), pa.string(),
    ]  # fmt: skip
    from datetime import date

    assert got.to_pylist() == [
        {"dt": date(2024, 1, 1), "n": 3000000000, "p": 1.5, "zip": "01234", "s": 10},
        {"dt": date(2024, 1, 2), "n": 1, "p": 2.0, "zip": "20000", "s": 20},
        {"dt": date(2024, 1, 3), "n": 2, "p": None, "zip": "99999", "s": 40},
        {"dt": date(2024, 1, 3), "n": None, "p": 2.5, "zip": "01234", "s": 30},
    ]
    got = extagg.aggregate_files(
        str(tmp_path / "hive"), by=["zip"], aggs={"s": ("v", "sum")}, sort=True,
        where="dt >= date '2024-01-02' and zip <> '99999'",
    ).read_all()  # fmt: skip
    assert got.to_pylist() == [{"zip": "01234", "s": 30}, {"zip": "20000", "s": 20}]
    # a type given for a folder column wins, in any format; a file's column is refused
    got = extagg.aggregate_files(
        str(tmp_path / "hive"), by=["dt"], aggs={"s": ("v", "sum")}, sort=True,
        column_types={"dt": pa.string()},
    ).read_all()  # fmt: skip
    assert got.column("dt").to_pylist() == ["2024-01-01", "2024-01-02", "2024-01-03"]
    if fmt in ("parquet", "arrows"):
        with pytest.raises(QueryError, match="column-types applies to CSV"):
            extagg.aggregate_files(
                str(tmp_path / "hive"), by=["dt"], aggs={"s": ("v", "sum")},
                column_types={"v": pa.string()},
            )  # fmt: skip


def test_json_integers_past_int64_stay_exact_keys(tmp_path):
    """Unsigned 64-bit ids past 2**63 (hashes, ids) in JSON Lines: Arrow's inference read
    them as float64, and distinct ids merged into one group, exit 0. Integers are read as
    ``uint64``, past ``int64`` both ways as ``decimal(20, 0)``, floats written as floats
    (``3.0``, ``1e20``) stay floats."""
    top = (1 << 64) - 1
    rows = [
        {"id": top, "s": -(1 << 63), "f": 1e20, "v": 1}, {"id": top - 1, "s": top, "f": 3.0},
        {"id": 1 << 63, "s": 0, "f": None}, {"id": 5, "s": -1, "f": 1e20}, {"id": top},
    ]  # fmt: skip
    src = tmp_path / "ids.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = extagg.aggregate_files(str(src), by="id", aggs={"n": ("*", "count")}).read_all()
    assert got.schema.field("id").type == pa.uint64()
    assert dict(zip(got["id"].to_pylist(), got["n"].to_pylist())) == {
        top: 2,
        top - 1: 1,
        1 << 63: 1,
        5: 1,
    }
    got = extagg.aggregate_files(str(src), by="s", aggs={"n": ("*", "count")}).read_all()
    assert got.schema.field("s").type == pa.decimal128(20, 0)
    assert sorted(zip(got["s"].to_pylist(), got["n"].to_pylist()), key=str) == sorted(
        [(decimal.Decimal(k), 1) for k in (-(1 << 63), top, 0, -1)] + [(None, 1)], key=str
    )
    got = extagg.aggregate_files(str(src), by="f", aggs={"n": ("*", "count")}).read_all()
    assert got.schema.field("f").type == pa.float64()


def test_json_lines_dates_and_timestamps_are_typed_from_their_text(tmp_path):
    """JSON Lines dates are ``date32`` (Arrow's inference made them ``timestamp[s]``),
    timestamps with a fraction are timestamps (they were strings), timestamps with offsets
    are instants in UTC (they were moved to UTC in a column without a zone, beside wall times
    left as they were), offsets on some values only leave a string; a later value that does
    not parse names the column, the value and its row."""
    from datetime import date, datetime, timezone

    columns = {
        "k": [1, 1, 2],
        "d": ["2024-03-01", "2024-02-29", None],
        "z": ["2024-01-01T10:00:00.5+02:00", "2024-01-01T09:00:00Z", "2024-01-01T00:00:00-0130"],
        "w": ["2024-01-01 10:00:00", "2024-01-01T09:30:00.25", None],
        "m": ["2024-01-01T10:00:00+02:00", "2024-01-01 09:00:00", None],
    }
    lines = [dict(zip(columns, row)) for row in zip(*columns.values())]
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in lines))
    aggs = {c + "_lo": (c, "min") for c in "dzwm"}
    got = extagg.aggregate_files(str(src), by="k", aggs=aggs, sort=True).read_all()
    assert [got.schema.field(c + "_lo").type for c in "dzwm"] == [
        pa.date32(), pa.timestamp("us", "UTC"), pa.timestamp("us"), pa.string(),
    ]  # fmt: skip
    utc = timezone.utc
    assert got.to_pylist() == [
        {
            "k": 1, "d_lo": date(2024, 2, 29), "z_lo": datetime(2024, 1, 1, 8, 0, 0, 500000, utc),
            "w_lo": datetime(2024, 1, 1, 9, 30, 0, 250000), "m_lo": "2024-01-01 09:00:00",
        },
        {
            "k": 2, "d_lo": None, "z_lo": datetime(2024, 1, 1, 1, 30, tzinfo=utc), "w_lo": None,
            "m_lo": None,
        },
    ]  # fmt: skip
    # a type given is read from the text as well (date32 was "changed from number to string")
    got = extagg.aggregate_files(
        str(src), by="k", aggs={"lo": ("d", "min")}, column_types={"d": pa.date32()}, sort=True,
    ).read_all()  # fmt: skip
    assert got.to_pylist() == [{"k": 1, "lo": date(2024, 2, 29)}, {"k": 2, "lo": None}]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"w": "2024-01-01 10:00:00"}\n' * 50_000 + '{"w": "soon"}\n')  # 1.4 MB
    with pytest.raises(InputError, match=r"'w' to timestamp\[s\]: 'soon' in data row 50001 "):
        extagg.aggregate_files(
            str(bad), by="w", aggs={"n": ("*", "count")}, memory="16m"
        ).read_all()


def _small_files(root, days=40, files_per_day=5, rows=7):
    """A hive folder per day, several small Parquet files in each (a streaming job's output)."""
    import numpy as np

    rng = np.random.default_rng(5)
    tables = []
    for day in range(days):
        folder = root / f"day={day}"
        folder.mkdir(parents=True)
        for i in range(files_per_day):
            t = pa.table({
                "k": pa.array(rng.integers(0, 13, rows)),
                "v": pa.array(rng.integers(-50, 50, rows)),
                "s": pa.array([f"f{day}-{i}-{j}" for j in range(rows)]),
            })  # fmt: skip
            pq.write_table(t, folder / f"part-{i}.parquet", row_group_size=4)
            tables.append(t.append_column("day", pa.array([day] * rows)))
    return pa.concat_tables(tables)


def test_many_small_files_are_folded_in_few_batches_in_order(tmp_path, monkeypatch):
    """200 files of 7 rows (400 row groups) were folded a row group at a time (~0.5 ms of
    fixed cost each: 6 120 such files took 15 s); small batches are now gathered, in order
    (first/last unchanged), and the answers are those of batches folded one by one."""
    from extagg.columnar.hash_aggregator import HashAggregator
    from extagg.io import inputs

    table = _small_files(tmp_path / "t")
    aggs = {"n": ("*", "count"), "s": ("v", "sum"), "f": ("s", "first"), "l": ("s", "last"),
            "lo": ("v", "min")}  # fmt: skip
    calls = []
    update = HashAggregator.update

    def counted(self, batch):
        calls.append(batch.num_rows)
        return update(self, batch)

    monkeypatch.setattr(HashAggregator, "update", counted)
    got = extagg.aggregate_files(str(tmp_path / "t"), by=["k"], aggs=aggs, sort=True).read_all()
    gathered = len(calls)
    monkeypatch.setattr(inputs, "COALESCE_DIVISOR", 1 << 40)  # every batch as it comes
    calls.clear()
    one_by_one = extagg.aggregate_files(
        str(tmp_path / "t"), by=["k"], aggs=aggs, sort=True
    ).read_all()
    assert len(calls) >= 400 > 10 >= gathered
    assert got.equals(one_by_one)
    want = table.to_pandas().groupby("k").v.agg(["count", "sum", "min"])
    assert {r["k"]: (r["n"], r["s"], r["lo"]) for r in got.to_pylist()} == {
        k: tuple(int(x) for x in row) for k, row in want.iterrows()
    }


def test_small_files_gathered_by_the_reader_keep_progress_errors_and_folder_values(tmp_path):
    """Small Parquet files are read, filtered and gathered on the reader's side, one piece
    and one end for many files (a piece and an end per file, handed between the threads, cost
    more than the reads); their footers are read once when there is no filter. The run
    counts every file and row group, the folder columns come from each file's own folders,
    and a damaged file in the middle is the one the error names."""
    table = _small_files(tmp_path / "t", days=30, files_per_day=4)
    reader = extagg.aggregate_files(
        str(tmp_path / "t"), by=["day"], sort=True,
        aggs={"n": ("*", "count"), "s": ("v", "sum"), "f": ("s", "first")},
    )  # fmt: skip
    got = reader.read_all()
    want = table.group_by("day").aggregate([("v", "count"), ("v", "sum")]).sort_by("day")
    assert got.column("n").to_pylist() == want.column("v_count").to_pylist()
    assert got.column("s").to_pylist() == want.column("v_sum").to_pylist()
    assert got.column("f").to_pylist() == [f"f{day}-0-0" for day in range(30)]
    metrics = extagg.run_metrics(reader)
    assert metrics.files == 120 and metrics.rows_read == table.num_rows
    assert metrics.bytes_read == metrics.bytes_total  # every file counted as read
    assert metrics.row_groups_total == metrics.row_groups_read == 240
    damaged = tmp_path / "t" / "day=17" / "part-2.parquet"
    data = bytearray(damaged.read_bytes())
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    data[4:footer] = b"\xff" * (footer - 4)  # every page; the footer is intact
    damaged.write_bytes(bytes(data))
    with pytest.raises(InputError) as err:
        extagg.aggregate_files(str(tmp_path / "t"), by=["day"], aggs=["s=sum(v)"]).read_all()
    assert str(damaged) in str(err.value)


def test_files_whose_folders_the_filter_excludes_are_not_read(tmp_path):
    """A filter on folder columns leaves out the files of the other folders before their
    footers are read: the rows read and row groups are those of the kept folders only, and
    the summary says how many files were skipped."""
    table = _small_files(tmp_path / "t", days=30, files_per_day=3)
    reader = extagg.aggregate_files(
        str(tmp_path / "t"), by=["day"], aggs={"n": ("*", "count"), "s": ("v", "sum")},
        where="day >= 25 and day <> 27", sort=True,
    )  # fmt: skip
    got = reader.read_all()
    kept = table.filter(pa.compute.field("day") >= 25).filter(pa.compute.field("day") != 27)
    want = kept.group_by("day").aggregate([("v", "count"), ("v", "sum")]).sort_by("day")
    assert got.column("day").to_pylist() == want.column("day").to_pylist()
    assert got.column("s").to_pylist() == want.column("v_sum").to_pylist()
    metrics = extagg.run_metrics(reader)
    assert metrics.rows_read == kept.num_rows == 4 * 3 * 7
    assert metrics.files_skipped == 26 * 3
    assert metrics.row_groups_total == metrics.row_groups_read == 4 * 3 * 2
    assert "78 files skipped by their folder names" in metrics.summary()


def test_csv_text_that_looked_like_numbers_or_nothing(tmp_path):
    """Phone numbers written with a plus sign were read as numbers (``+441234567890`` and
    ``441234567890`` one key, the plus gone); a file of a byte order mark alone stopped the run
    ("Empty CSV file") where blank files are skipped; a column empty in the whole sample was
    typed null and failed on its first value past it; a quoted header name's comma made a
    ``|`` file one column. DuckDB's answers in each case."""
    phones = tmp_path / "phones" / "a.csv"
    phones.parent.mkdir()
    phones.write_text("phone,v\n+441234567890,1\n441234567890,2\n+15551234567,3\n")
    (tmp_path / "phones" / "b.csv").write_bytes(b"\xef\xbb\xbf")
    got = extagg.aggregate_files(
        str(tmp_path / "phones"), by="phone", aggs={"s": ("v", "sum")}, sort=True
    ).read_all()  # fmt: skip
    assert got.to_pylist() == [
        {"phone": "+15551234567", "s": 3}, {"phone": "+441234567890", "s": 1},
        {"phone": "441234567890", "s": 2},
    ]  # fmt: skip
    late = tmp_path / "late.csv"
    late.write_text("k,s\n" + "1,\n" * 60_000 + "2,x0\n2,x1\n")  # past a 1 MiB sample
    got = extagg.aggregate_files(
        str(late), by="s", aggs={"n": ("*", "count")}, memory="16m", sort=True
    ).read_all()  # fmt: skip
    assert got.schema.field("s").type == pa.string()
    assert got.to_pylist() == [{"s": "x0", "n": 1}, {"s": "x1", "n": 1}, {"s": None, "n": 60_000}]
    piped = tmp_path / "piped.csv"
    piped.write_text('"name, full"|v\n"Doe, J"|1\n"Roe, K"|2\n')
    got = extagg.aggregate_files(str(piped), by="name, full", aggs={"s": ("v", "sum")}).read_all()
    assert sorted(got.column("name, full").to_pylist()) == ["Doe, J", "Roe, K"]


def test_a_csv_that_quotes_every_field_has_number_columns(tmp_path):
    """A file that quotes every field (Python's ``csv.QUOTE_ALL``, many exporters) with a
    quoted empty field ``""`` in a number column read it as text: ``max`` compared strings
    ("9.5" > "10.5"), ``sum`` was refused and ``--column-types x:float64`` failed on ``''``.
    Such a column is a number column, ``""`` a null there (Spark, DuckDB); in a text column
    ``""`` stays the empty string. Past the sample too (blocks of a 2 MiB budget)."""
    import csv

    src = tmp_path / "quoted.csv"
    with open(src, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["k", "x", "n", "t"])
        for i in range(40_000):
            w.writerow(["a" if i % 2 else "", "" if i % 3 == 0 else f"{i % 100}.5",
                        "" if i % 5 == 0 else i, "" if i % 7 == 0 else "w"])  # fmt: skip
    got = extagg.aggregate_files(
        str(src), by="k",
        aggs={"mx": ("x", "max"), "cx": ("x", "count"), "sn": ("n", "sum"), "ct": ("t", "count"),
              "lo": ("t", "min")},
        sort=True, memory="2m",
    ).read_all()  # fmt: skip
    assert got.schema.field("mx").type == pa.float64()
    assert got.schema.field("sn").type == pa.int64()
    want = {}
    for k in ("", "a"):
        rows = [i for i in range(40_000) if (i % 2 == 1) == (k == "a")]
        want[k] = {
            "k": k, "mx": max(i % 100 + 0.5 for i in rows if i % 3),
            "cx": sum(1 for i in rows if i % 3), "sn": sum(i for i in rows if i % 5),
            "ct": len(rows), "lo": "",
        }  # fmt: skip
    assert got.to_pylist() == [want[""], want["a"]]


@pytest.mark.parametrize("memory", ["2m", "256m"])
def test_a_quoted_empty_number_first_seen_past_the_sample_is_a_null(tmp_path, memory):
    """A number column's first quoted empty field ``""`` after the 4 MiB sample its type was
    inferred from stopped the run ("CSV conversion error to int64: invalid value ''"). The
    file is read again with that column as text, the rows already given skipped: counted by
    rows, not lines (blank lines, a quoted value over two lines before the restart)."""
    src = tmp_path / "late.csv"
    n = 300_000
    with open(src, "w", newline="") as f:
        f.write("k,v,d,note\n")
        for i in range(n):
            late = i in (250_000, 290_000)
            note = '"two\nlines"' if i % 50_000 == 7 else ("" if i % 3 else "x")
            v, d = ('""', '""') if late else (str(i), f"2024-01-{i % 28 + 1:02d}")
            f.write(f"k{i % 7},{v},{d},{note}\n")
            if i % 40_000 == 3:
                f.write("\n")  # a blank line: Arrow skips it
    assert src.stat().st_size > 5 << 20
    got = extagg.aggregate_files(
        str(src), by="k", sort=True, memory=memory,
        aggs={"s": ("v", "sum"), "cv": ("v", "count"), "c": ("*", "count"), "hi": ("d", "max"),
              "cd": ("d", "count"), "cn": ("note", "count")},
    ).read_all()  # fmt: skip
    assert got.schema.field("s").type == pa.int64()
    assert got.schema.field("hi").type == pa.date32()
    late = {250_000, 290_000}
    want = []
    for k in range(7):
        rows = [i for i in range(n) if i % 7 == k]
        want.append({
            "k": f"k{k}", "s": sum(i for i in rows if i not in late),
            "cv": sum(1 for i in rows if i not in late), "c": len(rows),
            "hi": max(datetime.date(2024, 1, i % 28 + 1) for i in rows if i not in late),
            "cd": sum(1 for i in rows if i not in late),
            "cn": sum(1 for i in rows if not i % 3 or i % 50_000 == 7),
        })  # fmt: skip
    assert got.to_pylist() == want


def test_a_quoted_empty_field_in_a_column_typed_by_the_user_is_a_null(tmp_path):
    """``--column-types v:float64`` on a column whose sample holds ``""`` failed before the
    run ("invalid value ''", and a hint that the type was inferred). It keeps the type
    given, ``""`` a null, in a TSV too."""
    for sep, name in ((",", "q.csv"), ("\t", "q.tsv")):
        src = tmp_path / name
        src.write_text(sep.join(["k", "v", "t"]) + "\n" + "".join(
            sep.join(row) + "\n"
            for row in (["a", "1.5", '"x"'], ["b", '""', '""'], ["a", "", "y"], ["b", "2", ""])
        ))  # fmt: skip
        got = extagg.aggregate_files(
            str(src), by="k", sort=True, column_types={"v": pa.float32(), "t": pa.string()},
            aggs={"s": ("v", "sum"), "n": ("v", "count"), "nt": ("t", "count")},
        ).read_all()  # fmt: skip
        assert got.schema.field("s").type == pa.float64()
        assert got.to_pylist() == [{"k": "a", "s": 1.5, "n": 1, "nt": 2},
                                   {"k": "b", "s": 2.0, "n": 1, "nt": 1}]  # fmt: skip


@pytest.mark.parametrize("rows", [10, 500_000])
@pytest.mark.parametrize("compressed", [False, True])
def test_a_ragged_csv_row_is_named_by_its_line(tmp_path, rows, compressed):
    """A row with more (or fewer) fields than the header: Arrow's error gives its text
    only, which does not find it in millions of rows. The error names its line, in the
    sample (before the run) and past it (during the run), compressed or not; the row's text
    inside another line's field is not taken for it."""
    lines = ["k,v", *(f"a{i % 5},{i}" for i in range(rows)), '"xa,1,2",0', "xa,1,2", "b,2"]
    text = "\n".join(lines) + "\n"
    src = tmp_path / ("r.csv.gz" if compressed else "r.csv")
    if compressed:
        src.write_bytes(gzip.compress(text.encode()))
    else:
        src.write_text(text)
    with pytest.raises(InputError) as err:
        extagg.aggregate_files(str(src), by="k", aggs={"s": ("v", "sum")}).read_all()
    message = str(err.value)
    assert str(src) in message and "Expected 2 columns, got 3: xa,1,2" in message
    assert message.endswith(f"(line {rows + 3})")


def test_numbers_with_a_decimal_comma(tmp_path, capsys):
    """The ';'-separated CSVs of locales that write 1,5: ``--decimal-comma`` reads their
    numbers (quoted ones, ``""`` as null, and a decimal type given too); without it a sum
    of such a column says what to give; a comma-separated file cannot have them."""
    from extagg.cli import main

    src = tmp_path / "eu.csv"
    src.write_text('k;v;n\na;1,5;3\nb;"2,25";""\na;-0,5;5\nb;"";7\n')
    got = extagg.aggregate_files(
        str(src), by="k", sort=True, decimal_comma=True,
        aggs={"s": ("v", "sum"), "hi": ("n", "max"), "c": ("v", "count")},
    ).read_all()  # fmt: skip
    assert got.schema.field("s").type == pa.float64()
    assert got.to_pylist() == [{"k": "a", "s": 1.0, "hi": 5, "c": 2},
                               {"k": "b", "s": 2.25, "hi": 7, "c": 1}]  # fmt: skip
    typed = extagg.aggregate_files(
        str(src), by="k", sort=True, decimal_comma=True, column_types="v:decimal(10,2)",
        aggs={"s": ("v", "sum")},
    ).read_all()  # fmt: skip
    assert [r["s"] for r in typed.to_pylist()] == [decimal.Decimal("1.00"), decimal.Decimal("2.25")]
    tsv = tmp_path / "eu.tsv"
    tsv.write_text("k\tv\na\t1,5\na\t2\n")
    assert main(["aggregate", str(tsv), "--by", "k", "--agg", "s=sum(v)", "--decimal-comma",
                 "-q", "-o", "-"]) == 0  # fmt: skip
    assert capsys.readouterr().out.splitlines()[1] == "a,3.5"
    assert main(["aggregate", str(src), "--by", "k", "--agg", "s=sum(v)", "-q", "-o", "-"]) == 2
    assert "--decimal-comma" in capsys.readouterr().err
    comma = tmp_path / "us.csv"
    comma.write_text("k,v\na,1.5\n")
    assert main(["aggregate", str(comma), "--by", "k", "--decimal-comma", "-q", "-o", "-"]) == 1
    assert "separated by commas" in capsys.readouterr().err
    assert main(["aggregate", str(comma), "--by", "k", "--decimal-comma", "--delimiter", ",",
                 "-q", "-o", "-"]) == 2  # fmt: skip
    assert "needs a delimiter other than ','" in capsys.readouterr().err


def test_a_recursive_glob_reads_each_file_once_and_globs_see_hive_folders(tmp_path):
    """``d/**`` matches ``d/`` and every folder below as well as the files, and each folder's
    files were read again: rows counted two and three times, exit 0. A glob over ``dt=``
    folders gives the ``dt`` column as the folder does; a file given beside hive folders has
    that column as nulls (the scan failed with a KeyError)."""
    d = tmp_path / "d"
    (d / "sub" / "deeper").mkdir(parents=True)
    for i, folder in enumerate([d, d / "sub", d / "sub" / "deeper"]):
        (folder / f"x{i}.csv").write_text(f"k,v\na,{i}\nb,{10 * i}\n")
    for pattern in ("d/**", "d/**/*.csv", "d/*", "d"):
        got = extagg.aggregate_files(str(tmp_path / pattern), aggs=["n=count(*)", "s=sum(v)"])
        assert got.read_all().to_pylist() == [{"n": 6, "s": 33}], pattern
    h = tmp_path / "h"
    for day, v in (("2024-01-01", 1), ("2024-01-02", 5)):
        (h / f"dt={day}").mkdir(parents=True)
        pq.write_table(pa.table({"k": ["a"], "v": [v]}), h / f"dt={day}" / "p.parquet")
    alone = tmp_path / "alone.parquet"
    pq.write_table(pa.table({"k": ["c"], "v": [7]}), alone)
    for paths in ([str(h / "*" / "*.parquet")], [str(h / "**")], [str(h), str(alone)]):
        got = extagg.aggregate_files(paths, by="dt", aggs=["s=sum(v)"], sort=True).read_all()
        assert got.schema.field("dt").type == pa.date32(), paths
        want = [(datetime.date(2024, 1, 1), 1), (datetime.date(2024, 1, 2), 5)]
        if len(paths) == 2:
            want.append((None, 7))
        assert [(r["dt"], r["s"]) for r in got.to_pylist()] == want, paths


def test_integers_past_2_53_beside_floats_round_and_wide_decimals_are_refused(tmp_path):
    """An int64 column beside another file's float64 is float64; a value past 2^53 stopped
    the run ("cannot read ..., row group 0: Integer value ... not in range") where SQL
    rounds it. An integer beside a decimal whose widened type needs more than 38 digits was
    read as decimal256 and failed on every row; it is refused up front, naming both files."""
    pq.write_table(pa.table({"k": [1, 1], "x": pa.array([2**53 + 1, 2**63 - 1])}),
                   tmp_path / "a.parquet")  # fmt: skip
    pq.write_table(pa.table({"k": [1], "x": [0.5]}), tmp_path / "b.parquet")
    got = extagg.aggregate_files(
        [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")], by="k",
        aggs=["hi=max(x)", "lo=min(x)", "n=count(x)"],
    ).read_all().to_pylist()  # fmt: skip
    assert got == [{"k": 1, "hi": float(2**63), "lo": 0.5, "n": 3}]
    dec = pa.array([decimal.Decimal("0." + "0" * 29 + "1")], pa.decimal128(38, 30))
    pq.write_table(pa.table({"k": [1], "x": dec}), tmp_path / "d.parquet")
    with pytest.raises(InputError, match="needs more than 38 digits") as err:
        extagg.aggregate_files(
            [str(tmp_path / "a.parquet"), str(tmp_path / "d.parquet")], by="k", aggs=["s=sum(x)"]
        )
    assert "a.parquet" in str(err.value) and "d.parquet" in str(err.value)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_zoned_timestamp_type_reads_wall_times_in_that_zone(tmp_path, fmt):
    """``--column-types 't:timestamp[s,tz=Europe/Paris]'`` (as the docs show) on text without
    an offset failed ("expected a zone offset"), and the error said the type was inferred.
    A wall time is a time in the given zone (an ambiguous one the earlier instant); a value
    with an offset is that instant."""
    rows = [("2024-01-01 10:00:00", 1), ("2024-07-01T10:00:00Z", 2), ("2024-10-27 02:30:00", 3),
            (None, 4)]  # fmt: skip
    src = tmp_path / f"t.{fmt}"
    if fmt == "csv":
        src.write_text("t,v\n" + "".join(f"{t or ''},{v}\n" for t, v in rows))
    else:
        src.write_text("".join(json.dumps({"t": t, "v": v}) + "\n" for t, v in rows))
    got = extagg.aggregate_files(
        str(src), by="t", aggs=["s=sum(v)"], sort=True,
        column_types={"t": pa.timestamp("s", tz="Europe/Paris")},
    ).read_all()  # fmt: skip
    assert got.schema.field("t").type == pa.timestamp("s", tz="Europe/Paris")
    utc = datetime.timezone.utc
    instants = [None if t is None else t.astimezone(utc) for t in got.column("t").to_pylist()]
    assert instants == [
        datetime.datetime(2024, 1, 1, 9, tzinfo=utc),  # +01:00 in winter
        datetime.datetime(2024, 7, 1, 10, tzinfo=utc),
        datetime.datetime(2024, 10, 27, 0, 30, tzinfo=utc),  # the first 02:30, at +02:00
        None,
    ]
    assert got.column("s").to_pylist() == [1, 2, 3, 4]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_wall_times_a_clock_change_skips_move_forward_by_the_gap(tmp_path, fmt):
    """Wall times in a spring-forward gap (02:00-03:00 in Paris on 2024-03-31) all became
    03:00, so distinct values merged and ``--where`` (which reads a literal so: 02:30 is
    03:30) matched none of them. Each moves forward by the gap now, as in DuckDB and Spark."""
    rows = [("2024-03-31 02:15:30", 1), ("2024-03-31 02:59:59", 2), ("2024-03-31 02:30:00", 3),
            ("2024-03-31 01:59:59", 4)]  # fmt: skip
    src = tmp_path / f"t.{fmt}"
    if fmt == "csv":
        src.write_text("t,v\n" + "".join(f"{t},{v}\n" for t, v in rows))
    else:
        src.write_text("".join(json.dumps({"t": t, "v": v}) + "\n" for t, v in rows))
    zoned = {"t": pa.timestamp("s", tz="Europe/Paris")}
    got = extagg.aggregate_files(str(src), by="t", aggs=["s=sum(v)"], sort=True,
                                 column_types=zoned).read_all()  # fmt: skip
    utc = datetime.timezone.utc
    assert [t.astimezone(utc).time() for t in got.column("t").to_pylist()] == [
        datetime.time(0, 59, 59), datetime.time(1, 15, 30), datetime.time(1, 30),
        datetime.time(1, 59, 59),
    ]  # fmt: skip
    assert got.column("s").to_pylist() == [4, 1, 3, 2]
    kept = extagg.aggregate_files(str(src), aggs=["n=count(*)"], column_types=zoned,
                                  where="t = '2024-03-31 02:30:00'").read_all()  # fmt: skip
    assert kept.column("n").to_pylist() == [1]


def test_a_value_that_does_not_fit_a_given_type_says_the_type_was_given(tmp_path):
    """The hint said the type "was inferred from the first block; give it with
    --column-types" when --column-types or --schema had given it."""
    src = tmp_path / "g.csv"
    src.write_text("id,name\n1,a\nx,b\n")
    for options in ({"column_types": "id:int64"}, {"schema": "id:int64,name:string"}):
        with pytest.raises(InputError) as err:
            extagg.aggregate_files(str(src), by="id", **options).read_all()
        assert "does not fit the type given to it" in str(err.value)
        assert "inferred" not in str(err.value)


def test_arrow_dictionaries_of_dates_and_decimals_are_their_values(tmp_path):
    """An Arrow file's dictionary of date32 or decimal values as a key or an aggregate's
    column stopped the command with a traceback ("DictionaryArray converter for type
    dictionary<values=date32[day], ...> not implemented"); ``--where`` on it was refused."""
    import pyarrow.feather as feather

    t = pa.table({
        "k": [1, 1, 2],
        "d": pa.array([datetime.date(2024, 1, 1), None, datetime.date(2024, 1, 2)])
        .dictionary_encode(),
        "x": pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("2.25")],
                      pa.decimal128(10, 2)).dictionary_encode(),
    })  # fmt: skip
    feather.write_feather(t, tmp_path / "d.arrow")
    got = extagg.aggregate_files(
        str(tmp_path / "d.arrow"), by="d", aggs=["s=sum(x)", "hi=max(x)", "n=count(*)"],
        where="x > 1 or x is null", sort=True,
    ).read_all()  # fmt: skip
    assert got.schema.field("d").type == pa.date32()
    assert got.to_pylist() == [
        {"d": datetime.date(2024, 1, 1), "s": decimal.Decimal("1.50"),
         "hi": decimal.Decimal("1.50"), "n": 1},
        {"d": datetime.date(2024, 1, 2), "s": decimal.Decimal("2.25"),
         "hi": decimal.Decimal("2.25"), "n": 1},
        {"d": None, "s": None, "hi": None, "n": 1},
    ]  # fmt: skip


@pytest.mark.parametrize("fmt", ["arrow", "arrows"])
def test_run_end_encoded_columns_are_their_values(tmp_path, fmt):
    """An Arrow file's run-end encoded columns (keys, aggregated, in --where, --sort, a
    folder column beside them): the dataset scan stopped with "Unsupported cast from
    run_end_encoded", and --sort refused such a key."""
    import pyarrow.compute as pc

    keys = ["a"] * 3 + ["b"] * 2 + [None] + ["a"] * 4
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, None, 8.0, 9.0, 10.0]
    t = pa.table({"k": pc.run_end_encode(pa.array(keys)),
                  "v": pc.run_end_encode(pa.array(values)),
                  "n": list(range(10))})  # fmt: skip
    write(t, tmp_path / f"t.{fmt}", fmt)
    got = extagg.aggregate_files(
        str(tmp_path / f"t.{fmt}"), by="k", aggs=["s=sum(v)", "hi=max(k)", "c=count(*)"],
        where="k = 'a' or k is null or v > 4", sort=True,
    ).read_all()  # fmt: skip
    assert got.schema.field("k").type == pa.string()
    assert got.to_pylist() == [
        {"k": "a", "s": 33.0, "hi": "a", "c": 7},
        {"k": "b", "s": 5.0, "hi": "b", "c": 1},
        {"k": None, "s": 6.0, "hi": None, "c": 1},
    ]  # fmt: skip


def test_run_end_encoded_columns_in_a_table(tmp_path):
    """aggregate() on a table of run-end encoded columns: they went to the generic engine,
    which refused ``sum`` of them ("not supported for column 'v' of type run_end_encoded")."""
    import pyarrow.compute as pc

    t = pa.table({
        "k": pc.run_end_encode(pa.array([1, 1, None, 2, 2, 1], pa.int64())),
        "v": pc.run_end_encode(pa.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])),
        "d": pc.run_end_encode(pa.array([datetime.date(2020, 1, 1)] * 4 + [None] * 2)),
    })  # fmt: skip
    got = extagg.aggregate(t, keys=["k"], aggs={"s": ("v", "sum"), "m": ("d", "max")})
    assert got.schema.field("k").type == pa.int64()
    assert sorted(got.to_pylist(), key=lambda r: (r["k"] is None, r["k"])) == [
        {"k": 1, "s": 9.0, "m": datetime.date(2020, 1, 1)},
        {"k": 2, "s": 9.0, "m": datetime.date(2020, 1, 1)},
        {"k": None, "s": 3.0, "m": datetime.date(2020, 1, 1)},
    ]  # fmt: skip


def test_tsv_files_beside_csv_files_are_read_by_tabs(tmp_path):
    """``a.csv b.tsv`` was refused ("the inputs mix formats ['csv', 'tsv']"): each file is
    read with its own delimiter, with or without a header; a --delimiter, which would apply
    to both, still refuses the mix."""
    (tmp_path / "a.csv").write_text("k,v\na,1\nb,2\n")
    (tmp_path / "b.tsv").write_text("k\tv\na\t3\nc\t4\n")
    (tmp_path / "c.csv").write_text("k;v\nc;10\n")
    paths = [str(tmp_path / n) for n in ("a.csv", "b.tsv", "c.csv")]
    got = extagg.aggregate_files(paths, by="k", aggs=["s=sum(v)"], sort=True).read_all()
    assert got.to_pylist() == [{"k": "a", "s": 4}, {"k": "b", "s": 2}, {"k": "c", "s": 14}]
    (tmp_path / "n.csv").write_text("a,1\n")
    (tmp_path / "n.tsv").write_text("a\t2\nb\t5\n")
    bare = [str(tmp_path / "n.csv"), str(tmp_path / "n.tsv")]
    got = extagg.aggregate_files(bare, by="k", aggs=["s=sum(v)"], sort=True, header=False,
                                 schema="k:string,v:int64").read_all()  # fmt: skip
    assert got.to_pylist() == [{"k": "a", "s": 3}, {"k": "b", "s": 5}]
    with pytest.raises(QueryError, match="leave it out"):
        extagg.aggregate_files(paths[:2], by="k", aggs=["s=sum(v)"], delimiter=",").read_all()


def test_a_csv_value_that_does_not_fit_its_column_names_its_line(tmp_path):
    """ "In CSV column #1: ... invalid value 'abc'" named no row; DuckDB names the line. The
    line is found by reading the file again (quoted newlines counted), past the sample too."""
    src = tmp_path / "late.csv"
    with open(src, "w") as f:
        f.write('k,v\n"two\nlines",1\n')
        f.writelines(f"a{i % 10},{i}\n" for i in range(600_000))
        f.write("b,abc\n")
    with pytest.raises(InputError, match=r"invalid value 'abc' \(line 600004\)"):
        extagg.aggregate_files(str(src), by="k", aggs=["s=sum(v)"]).read_all()
    small = tmp_path / "small.csv"
    small.write_text("k,v\nc,2\nd,xyz\n")
    with pytest.raises(InputError, match=r"invalid value 'xyz' \(line 3\)"):
        extagg.aggregate_files(str(small), by="k", aggs=["s=sum(v)"],
                               column_types="v:int64").read_all()  # fmt: skip


def test_a_json_lines_error_after_blank_lines_names_the_line_too(tmp_path):
    """Arrow counts objects, not lines: "in data row 3" pointed at line 3 where the bad
    object was on line 6 (blank lines are no rows). The line is given beside the row."""
    src = tmp_path / "b.jsonl"
    src.write_text('{"k":"a","v":1}\n\n\n{"k":"b","v":2}\n\n{"k":"c",v:3}\n{"k":"d","v":4}\n')
    with pytest.raises(InputError, match=r"data row 3 of the file \(line 6: blank lines"):
        extagg.aggregate_files(str(src), by="k", aggs=["s=sum(v)"]).read_all()
    big = tmp_path / "big.jsonl"  # the bad object past the sample, in a later block
    with open(big, "w") as f:
        f.writelines(f'{{"k":"a{i % 7}","v":{i}}}\n\n' for i in range(300_000))
        f.write('{"k":"c",v:3}\n')
    with pytest.raises(InputError, match=r"data row 300001 of the file \(line 600001: blank"):
        extagg.aggregate_files(str(big), by="k", aggs=["s=sum(v)"]).read_all()


def test_a_json_field_first_set_past_the_sample_can_be_declared(tmp_path):
    """A field that first appears after the block the fields are read from was an unknown
    column, even when --column-types gave its type; it is read with that type now, and the
    unknown-column error says to declare it."""
    src = tmp_path / "late.jsonl"
    with open(src, "w") as f:
        f.writelines(json.dumps({"k": f"k{i % 5}", "v": i}) + "\n" for i in range(300_000))
        f.write(json.dumps({"k": "k1", "v": 1, "late": 5}) + "\n")
    with pytest.raises(QueryError, match=r"unknown column 'late'.*--column-types late:TYPE"):
        extagg.aggregate_files(str(src), by="k", aggs=["s=sum(late)"]).read_all()
    got = extagg.aggregate_files(str(src), by="late", aggs=["n=count(*)"], sort=True,
                                 column_types="late:int64").read_all()  # fmt: skip
    assert got.to_pylist() == [{"late": 5, "n": 1}, {"late": None, "n": 300_000}]


def test_linked_and_unreadable_folders_of_a_directory_are_read_or_refused(tmp_path, monkeypatch):
    """A folder of the input that is a symlink was skipped (``os.walk`` does not follow
    links) and one that cannot be listed was skipped too: exit 0 with its rows missing. A
    linked folder is read (as pyarrow's dataset reads it, a link back up once); one that
    cannot be listed is an ``InputError`` naming it."""
    data = tmp_path / "d"
    (data / "part=1").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    pq.write_table(pa.table({"v": [1, 2]}), data / "part=1" / "a.parquet")
    pq.write_table(pa.table({"v": [10, 20, 30]}), elsewhere / "b.parquet")
    os.symlink(elsewhere, data / "part=2")
    os.symlink(data, data / "part=1" / "loop")  # a link back up: not read twice, no loop
    aggs = {"n": ("*", "count"), "s": ("v", "sum")}
    got = extagg.aggregate_files(str(data), by="part", aggs=aggs, sort=True).read_all()
    assert got.to_pylist() == [{"part": 1, "n": 2, "s": 3}, {"part": 2, "n": 3, "s": 60}]

    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path).endswith("part=2"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(InputError, match=r"cannot read directory .*part=2: Permission denied"):
        extagg.aggregate_files(str(data), by="part", aggs=aggs)

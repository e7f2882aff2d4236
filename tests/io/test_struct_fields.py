"""Fields inside struct columns named with dots (``payload.user.id``): a JSON object's field
or a Parquet struct's, as keys, aggregate arguments, inside expressions and in ``--where``."""

from __future__ import annotations

import gzip
import json
import random

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import extagg
from extagg.cli import main
from extagg.errors import QueryError


def _events(n: int, seed: int) -> list[dict]:
    """Events as a JSON Lines log holds them: a nested object, sometimes null, whose fields
    come and go (the second half has ``geo.city``, the first does not)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        payload = None
        if rng.random() > 0.05:
            geo = {"country": rng.choice(["de", "fr", "us", None])}
            if i >= n // 2:
                geo["city"] = rng.choice(["a", "b"])
            payload = {"user": {"id": rng.randrange(1_000_000)}, "geo": geo}
        rows.append({"kind": rng.choice(["click", "view"]), "ms": rng.randrange(1000),
                     "payload": payload})  # fmt: skip
    return rows


def _field(row: dict, path: str) -> object:
    value: object = row
    for step in path.split("."):
        value = None if value is None else value.get(step)  # type: ignore[attr-defined]
    return value


def _reference(rows: list[dict], keys: list[str], keep) -> dict[tuple, tuple[int, int, object]]:
    """(count, sum of ms, max of payload.user.id) per key, in plain Python."""
    out: dict[tuple, list] = {}
    for row in rows:
        if not keep(row):
            continue
        key = tuple(_field(row, k) for k in keys)
        acc = out.setdefault(key, [0, 0, None])
        acc[0] += 1
        acc[1] += row["ms"]
        uid = _field(row, "payload.user.id")
        if uid is not None and (acc[2] is None or uid > acc[2]):
            acc[2] = uid
    return {k: tuple(v) for k, v in out.items()}


@pytest.fixture
def jsonl_files(tmp_path):
    rows = _events(40_000, seed=7)
    folder = tmp_path / "events"
    folder.mkdir()
    half = len(rows) // 2
    for name, part in (("a.jsonl", rows[:half]), ("b.jsonl.gz", rows[half:])):
        text = "".join(json.dumps(r) + "\n" for r in part)
        if name.endswith(".gz"):
            (folder / name).write_bytes(gzip.compress(text.encode()))
        else:
            (folder / name).write_text(text)
    return str(folder), rows


@pytest.mark.parametrize("memory", [None, "1m"])
def test_fields_of_json_objects_as_keys_arguments_and_filter(jsonl_files, memory):
    """Two files whose objects differ (a field only in the second): the fields unified; a
    null object gives null fields; under 1 MiB it spills and gives the same."""
    path, rows = jsonl_files
    keys = ["payload.user.id", "payload.geo.city"]
    reader = extagg.aggregate_files(
        path, by=keys, aggs=["n=count(*)", "ms=sum(ms)", "top=max(payload.user.id)"],
        where="payload.user.id < 600000 and kind = 'click'", memory=memory,
    )  # fmt: skip
    got = reader.read_all()
    assert got.column_names == [*keys, "n", "ms", "top"]
    want = _reference(
        rows, keys,
        lambda r: r["kind"] == "click" and r["payload"] is not None
        and r["payload"]["user"]["id"] < 600_000,
    )  # fmt: skip
    assert {(r[keys[0]], r[keys[1]]): (r["n"], r["ms"], r["top"]) for r in got.to_pylist()} == want
    if memory:
        assert extagg.run_metrics(reader).spill_count > 0


def test_a_field_inside_an_expression_and_named_with_as(jsonl_files, capsys):
    path, rows = jsonl_files
    argv = ["aggregate", path, "--by", "payload.user.id % 3 AS bucket",
            "--agg", "n=count(*)", "--agg", "big=sum(payload.user.id * 2)",
            "--sort", "-o", "-", "-q"]  # fmt: skip
    assert main(argv) == 0
    want: dict[object, list[int]] = {}
    for r in rows:
        uid = _field(r, "payload.user.id")
        acc = want.setdefault(None if uid is None else uid % 3, [0, 0])
        acc[0] += 1
        acc[1] += 0 if uid is None else 2 * uid
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "bucket,n,big"
    assert lines[1:] == [
        f"{'' if k is None else k},{n},{s if k is not None else ''}"
        for k, (n, s) in sorted(want.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
    ]


def test_parquet_struct_fields_skip_row_groups_by_their_statistics(tmp_path):
    """A filter on a field inside a struct prunes row groups as a column's does."""
    n = 10_000
    t = pa.table({
        "p": [{"id": i, "g": i % 7} for i in range(n)],
        "v": list(range(n)),
    })  # fmt: skip
    path = tmp_path / "sorted.parquet"
    pq.write_table(t, path, row_group_size=1000)
    reader = extagg.aggregate_files(
        str(path), by=["p.g"], aggs={"n": ("*", "count"), "s": ("v", "sum")},
        where="p.id >= 8500",
    )  # fmt: skip
    got = {r["p.g"]: (r["n"], r["s"]) for r in reader.read_all().to_pylist()}
    m = extagg.run_metrics(reader)
    assert (m.row_groups_read, m.row_groups_total) == (2, 10)
    want: dict[int, tuple[int, int]] = {}
    for i in range(8500, n):
        c, s = want.get(i % 7, (0, 0))
        want[i % 7] = (c + 1, s + i)
    assert got == want


def test_a_column_whose_name_has_a_dot_stays_that_column(tmp_path):
    """``a.b`` a column of its own beside a struct ``a``: the column; ``a.c`` the field."""
    t = pa.table({"a.b": ["x", "y", "x"], "a": [{"c": 1}, {"c": 2}, {"c": 4}]})
    pq.write_table(t, tmp_path / "t.parquet")
    got = extagg.aggregate_files(
        str(tmp_path / "t.parquet"), by=["a.b"], aggs={"s": ("a.c", "sum")}
    ).read_all()
    assert sorted(got.to_pylist(), key=lambda r: r["a.b"]) == [
        {"a.b": "x", "s": 5},
        {"a.b": "y", "s": 2},
    ]
    csv = tmp_path / "flat.csv"
    csv.write_text("user.id,v\n1,10\n1,5\n2,1\n")
    got = extagg.aggregate_files(str(csv), by="user.id", aggs={"s": ("v", "sum")}, sort=True)
    assert got.read_all().to_pylist() == [{"user.id": 1, "s": 15}, {"user.id": 2, "s": 1}]


@pytest.mark.parametrize("form", ["table", "reader", "dataset", "batches"])
def test_aggregate_reads_struct_fields_of_every_kind_of_source(form):
    t = pa.table({
        "p": [{"id": i % 3, "g": {"c": "x" if i % 2 else None}} if i % 5 else None
              for i in range(40)],
        "v": list(range(40)),
    })  # fmt: skip
    source = {
        "table": lambda: t,
        "reader": lambda: t.to_reader(),
        "dataset": lambda: ds.dataset(t),
        "batches": lambda: iter(t.to_batches(max_chunksize=7)),
    }[form]()
    out = extagg.aggregate(
        source, ["p.id", "p.g.c"], {"n": ("*", "count"), "s": ("v", "sum")}, memory="1m"
    )
    want: dict[tuple, list[int]] = {}
    for i in range(40):
        key = (None, None) if i % 5 == 0 else (i % 3, "x" if i % 2 else None)
        acc = want.setdefault(key, [0, 0])
        acc[0] += 1
        acc[1] += i
    assert {(r["p.id"], r["p.g.c"]): [r["n"], r["s"]] for r in out.to_pylist()} == want


def test_struct_field_errors_name_the_fields(jsonl_files, capsys):
    path, _ = jsonl_files
    unknown = "unknown field 'usr' in struct column 'payload'; did you mean 'user'?"
    cases = [
        (["--by", "payload.usr.id"], f"{unknown} (its fields: user, geo)"),
        (["--by", "kind", "--where", "payload.user.id.x > 1"], "'payload.user.id' is a int64"),
        (["--by", '"payload.user"'], "unknown column 'payload.user'"),  # quoted: a column
        (
            [
                "--by",
                "kind",
                "--agg",
                "s=sum(payload.user.id)",
                "--column-types",
                "payload.user.id:int32",
            ],
            "a field inside the object column 'payload'",
        ),
    ]
    for args, words in cases:
        assert main(["aggregate", path, *args, "-q"]) == 2, args
        assert words in capsys.readouterr().err
    with pytest.raises(QueryError, match="unknown field 'usr'"):
        extagg.aggregate(pa.table({"p": [{"user": 1}]}), ["p.usr"], {"n": ("*", "count")})


def test_pandas_columns_named_with_dots_go_to_the_engine_as_they_are():
    """A dotted name on pandas (which has no struct columns) is its column, and the frame is
    not converted by pyarrow: a column of mixed Python objects still counts."""
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a.b": ["x", "y", "x"], "o": [1.5, {"q": 1}, "s"], "v": [1, 2, 3]})
    for source in (df, iter([df])):
        out = extagg.aggregate(source, "a.b", {"s": ("v", "sum"), "n": ("o", "count")})
        assert sorted(out.to_pylist(), key=lambda r: r["a.b"]) == [
            {"a.b": "x", "s": 4, "n": 2},
            {"a.b": "y", "s": 2, "n": 1},
        ]


def test_a_field_whose_name_needs_quotes(tmp_path, capsys):
    """``headers."user-agent"``: a quoted part after a dot, as DuckDB writes it; anywhere a
    field goes (a key, an argument, ``--where``)."""
    path = tmp_path / "h.jsonl"
    lines = [
        {"headers": {"user-agent": "curl", "x.y": 1}},
        {"headers": {"user-agent": "curl", "x.y": 2}},
        {"headers": {"user-agent": "firefox", "x.y": 4}},
        {"headers": None},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    argv = ["aggregate", str(path), "--by", 'headers."user-agent" AS agent',
            "--agg", 's=sum(headers."x.y")', "--where", 'headers."x.y" < 4 or headers is null',
            "--sort", "-o", "-", "-q"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines() == ["agent,s", "curl,3", ","]


def test_a_struct_read_for_its_fields_leaves_the_columnar_engine_in_charge(jsonl_files, caplog):
    """The struct column read only for the fields computed from it is not aggregated: the
    typed engine folds the fields (the struct beside them had sent the whole query to the
    generic engine, Python per row: 7 s instead of 1.4 on 2 M JSON lines). A struct that is
    itself a key still goes to the generic engine, and gives the same groups."""
    path, rows = jsonl_files
    with caplog.at_level("INFO", logger="extagg"):
        fields = extagg.aggregate_files(path, by=["payload.geo.country"], aggs="n=count(*)")
        by_field = {r["payload.geo.country"]: r["n"] for r in fields.read_all().to_pylist()}
    assert "generic engine" not in caplog.text
    with caplog.at_level("INFO", logger="extagg"):
        whole = extagg.aggregate_files(path, by=["payload"], aggs="n=count(*)").read_all()
    assert "generic engine" in caplog.text
    by_struct: dict[object, int] = {}
    for r in whole.to_pylist():
        country = None if r["payload"] is None else r["payload"]["geo"]["country"]
        by_struct[country] = by_struct.get(country, 0) + r["n"]
    want = _reference(rows, ["payload.geo.country"], lambda r: True)
    assert by_field == by_struct == {k[0]: v[0] for k, v in want.items()}


def test_json_objects_are_parsed_into_the_fields_read_alone(jsonl_files):
    """A JSON object column read only through fields is parsed into those fields (the rest
    skipped as Arrow parses: ~35 % of the parse of a nested log); read whole anywhere (here
    by ``payload is not null``), it keeps every field. The answers are right either way."""
    from extagg.io.run import plan_query

    path, rows = jsonl_files
    fields_read = pa.struct(
        [("user", pa.struct([("id", pa.int64())])), ("geo", pa.struct([("country", pa.string())]))]
    )
    for where in (None, "payload is not null"):
        query = plan_query(
            path, by=["payload.geo.country"], aggs=["m=max(payload.user.id)"], where=where
        )
        try:
            typ = query.scan.schema.field("payload").type
            got = {r["payload.geo.country"]: r["m"] for r in query.run().read_all().to_pylist()}
        finally:
            query.close()
        if where is None:
            assert typ == fields_read
        else:  # every field, the city (in the second file only) too
            assert typ.field("geo").type.get_field_index("city") >= 0
        keep = (lambda r: r["payload"] is not None) if where else (lambda r: True)
        want = _reference(rows, ["payload.geo.country"], keep)
        assert got == {k[0]: v[2] for k, v in want.items()}


def test_parquet_structs_are_read_by_the_leaves_the_query_needs(tmp_path):
    """Only the leaves of the fields read are decoded (a wide ``big`` field is not); files
    whose structs differ are unified (a field one file lacks is null there), as DuckDB's
    ``union_by_name`` reads them."""
    from extagg.io.inputs import _parquet_columns
    from extagg.io.run import plan_query

    folder = tmp_path / "p"
    folder.mkdir()
    pq.write_table(pa.table({"p": [{"id": i % 3, "big": "x" * 100} for i in range(90)]}),
                   folder / "a.parquet")  # fmt: skip
    pq.write_table(
        pa.table({"p": [{"id": i % 3, "extra": {"n": i}, "big": "y"} for i in range(60)]}),
        folder / "b.parquet",
    )
    query = plan_query(str(folder), by=["p.id"], aggs=["n=count(*)", "e=sum(p.extra.n)"])
    try:
        schema = query.scan.schema
        assert schema.field("p").type == pa.struct(
            [("id", pa.int64()), ("extra", pa.struct([("n", pa.int64())]))]
        )
        stored = pq.read_schema(folder / "b.parquet")
        assert _parquet_columns(stored, schema) == ["p.id", "p.extra.n"]
        got = {r["p.id"]: (r["n"], r["e"]) for r in query.run().read_all().to_pylist()}
    finally:
        query.close()
    want = {k: (30 + 20, sum(i for i in range(60) if i % 3 == k)) for k in range(3)}
    assert got == want

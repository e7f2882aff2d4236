"""Aggregates of expressions over the input's columns: ``sum(price * (1 - discount))``, as
TPC-H Q1 writes them; plain and quoted column names stay columns."""

from __future__ import annotations

import random
import re
from decimal import Decimal

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import extagg
from extagg.cli import main
from extagg.errors import ExpressionError, QueryError

ROWS = 5_000


@pytest.fixture(scope="module")
def lineitem(tmp_path_factory) -> tuple[str, list[dict]]:
    """A lineitem-like Parquet file with decimal(15, 2) columns, in several row groups."""
    rng = random.Random(7)
    rows = [
        {
            "flag": rng.choice("ANR"),
            "price": Decimal(rng.randrange(100_00, 10_000_000_00)) / 100,
            "disc": Decimal(rng.randrange(0, 11)) / 100,
            "tax": Decimal(rng.randrange(0, 9)) / 100,
            "qty": rng.randrange(1, 51),
            "name": rng.choice(["Ann", "bob", "Cid", None]),
        }
        for _ in range(ROWS)
    ]
    schema = pa.schema(
        [("flag", pa.string()), ("price", pa.decimal128(15, 2)), ("disc", pa.decimal128(15, 2)),
         ("tax", pa.decimal128(15, 2)), ("qty", pa.int64()), ("name", pa.string())]
    )  # fmt: skip
    path = tmp_path_factory.mktemp("computed") / "lineitem.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema), path, row_group_size=1_000)
    return str(path), rows


def _by_flag(table: pa.Table) -> dict[str, dict]:
    return {r.pop("flag"): r for r in table.to_pylist()}


@pytest.mark.parametrize("memory", [None, "1m"])
def test_tpch_q1_sums_of_products_are_exact(lineitem, memory):
    path, rows = lineitem
    aggs = [
        "disc_price=sum(price * (1 - disc))",
        "charge=sum(price * (1 - disc) * (1 + tax))",  # past 38 digits of precision: narrowed
        "n=count(qty * 2)",
        "big=max(qty * 1000 + 1)",
        "d=count_distinct(qty % 7)",
        "longest=max(length(name))",
    ]
    out = _by_flag(extagg.aggregate_files(path, by="flag", aggs=aggs, memory=memory).read_all())
    for flag in "ANR":
        mine = [r for r in rows if r["flag"] == flag]
        assert out[flag]["disc_price"] == sum(r["price"] * (1 - r["disc"]) for r in mine)
        assert out[flag]["charge"] == sum(
            r["price"] * (1 - r["disc"]) * (1 + r["tax"]) for r in mine
        )
        assert out[flag]["n"] == len(mine)
        assert out[flag]["big"] == max(r["qty"] for r in mine) * 1000 + 1
        assert out[flag]["d"] == len({r["qty"] % 7 for r in mine})
        assert out[flag]["longest"] == max(len(r["name"]) for r in mine if r["name"])


def test_the_same_from_the_command_line(lineitem, capsys):
    path, rows = lineitem
    argv = ["aggregate", path, "--agg", "s=sum(price * (1 - disc))", "--where", "qty > 10",
            "-o", "-", "-q"]  # fmt: skip
    assert main(argv) == 0
    total = sum(r["price"] * (1 - r["disc"]) for r in rows if r["qty"] > 10)
    assert capsys.readouterr().out.splitlines() == ["s", str(total)]


def test_a_column_named_like_an_expression_is_a_column(tmp_path, capsys):
    """``unit-price`` (a CSV header) is read as a column when there is no ``unit``; quoted,
    ``"a-b"`` is the column even when ``a`` and ``b`` exist too."""
    path = tmp_path / "t.csv"
    pacsv.write_csv(
        pa.table({"unit-price": [1.5, 2.5], "a": [10, 20], "b": [1, 2], "a-b": [100, 200]}), path
    )
    assert main(["aggregate", str(path), "--agg", "s=sum(unit-price)", "--agg", "d=sum(a-b)",
                 "--agg", 'q=sum("a-b")', "-o", "-", "-q"]) == 0  # fmt: skip
    assert capsys.readouterr().out.splitlines() == ["s,d,q", "4,27,300"]
    reader = extagg.aggregate_files(str(path), aggs={"s": ("unit-price", "sum")})
    assert reader.read_all().column("s").to_pylist() == [4.0]


@pytest.mark.parametrize(
    ("agg", "error", "words"),
    [
        ("s=sum(price * (1 - discount))", QueryError, "unknown column 'discount'; did you mean"),
        ("s=sum(price * )", QueryError, "as an expression, 'price *' fails: expected a value"),
        ("s=sum(name * 2)", ExpressionError, "'*' does not apply to string and int"),
        ("s=sum(median(price))", QueryError, "fails: unknown function 'median'"),
    ],
)
def test_expression_errors_are_usage_errors_that_say_why(lineitem, capsys, agg, error, words):
    path, _ = lineitem
    with pytest.raises(error, match=words.replace("(", r"\(").replace("*", r"\*")):
        extagg.aggregate_files(path, aggs=[agg])
    assert main(["aggregate", path, "--agg", agg, "-q"]) == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("date_trunc(month, name)", "fails: date_trunc() takes a quoted text here at position 11"),
        ("qty +", "'qty +' fails: expected a value"),
    ],
)
def test_a_key_that_is_neither_a_column_nor_an_expression_says_why(lineitem, capsys, key, words):
    """A key that does not parse is taken for a column of its text (a CSV header ``a-b``);
    when the input has none, the error says where the expression fails, not only that no
    column is named so."""
    path, _ = lineitem
    with pytest.raises(QueryError) as caught:
        extagg.aggregate_files(path, by=[key], aggs="n=count(*)")
    assert words in str(caught.value)
    assert "quoted: --by '\"Price (EUR)\"'" in str(caught.value)
    assert main(["aggregate", path, "--by", key, "--agg", "n=count(*)", "-q"]) == 2
    assert words in capsys.readouterr().err


def test_keys_may_be_expressions(lineitem, capsys):
    """``--by 'lower(name), qty % 3'``: keys computed per batch, named as given; spilling and
    sorted the same."""
    path, rows = lineitem
    want: dict[tuple, int] = {}
    for r in rows:
        key = (None if r["name"] is None else r["name"].lower(), r["qty"] % 3)
        want[key] = want.get(key, 0) + 1
    for memory, sort in ((None, False), ("1m", True)):
        out = extagg.aggregate_files(
            path, by=["lower(name)", "qty % 3"], aggs="n=count(*)", memory=memory, sort=sort
        ).read_all()
        assert out.column_names == ["lower(name)", "qty % 3", "n"]
        got = {(r["lower(name)"], r["qty % 3"]): r["n"] for r in out.to_pylist()}
        assert got == want
        if sort:
            keys = list(zip(out.column(0).to_pylist(), out.column(1).to_pylist()))
            assert keys == sorted(keys, key=lambda k: (k[0] is None, k[0] or "", k[1]))
    having = "\"substr(name, 1, 1)\" = 'b'"  # the key's column, by its quoted name
    argv = ["aggregate", path, "--by", "substr(name, 1, 1), coalesce(name, 'a,b')",
            "--agg", "n=count(*)", "--having", having, "-o", "-", "-q"]  # fmt: skip
    assert main(argv) == 0
    bobs = sum(r["name"] == "bob" for r in rows)
    assert capsys.readouterr().out.splitlines() == [
        '"substr(name, 1, 1)","coalesce(name, \'a,b\')",n',
        f"b,bob,{bobs}",
    ]


def test_keys_named_with_as(lineitem, capsys):
    """``--by 'lower(name) as who, qty % 3 AS m'``: SQL's alias names the key's result column,
    which ``--having``, ``--order-by`` and ``--sort`` then use; a key's name may be an input
    column's (``lower(name) as name``); a quoted column renamed; clashes are usage errors."""
    path, rows = lineitem
    want: dict[tuple, int] = {}
    for r in rows:
        key = (None if r["name"] is None else r["name"].lower(), r["qty"] % 3)
        want[key] = want.get(key, 0) + 1
    for memory in (None, "1m"):
        out = extagg.aggregate_files(
            path, by=["lower(name) as who", "qty % 3 AS m"], aggs="n=count(*)",
            memory=memory, order_by="who, m desc",
        ).read_all()  # fmt: skip
        assert out.column_names == ["who", "m", "n"]
        assert [(r["who"], r["m"]) for r in out.to_pylist()] == sorted(
            want, key=lambda k: (k[0] is None, k[0] or "", -k[1])
        )
        assert {(r["who"], r["m"]): r["n"] for r in out.to_pylist()} == want
    out = extagg.aggregate_files(
        path, by="lower(name) as name", aggs=["n=count(*)", "first=max(name)"], sort=True
    ).read_all()
    assert out.column_names == ["name", "n", "first"]
    assert out.column("first").to_pylist() == ["Ann", "bob", "Cid", None]  # the input's name
    having = "f = 'A' and \"Who, lower\" = 'bob'"
    argv = ["aggregate", path, "--by", '"flag" as f, lower(name) AS "Who, lower"', "--agg",
            "n=count(*)", "--having", having, "-o", "-", "-q"]  # fmt: skip
    assert main(argv) == 0
    n = sum(r["flag"] == "A" and r["name"] == "bob" for r in rows)
    assert capsys.readouterr().out.splitlines() == ['f,"Who, lower",n', f"A,bob,{n}"]
    # the result's names, in Python too
    table = pa.Table.from_pylist(rows)
    got = extagg.aggregate(table, ["flag as f", "qty % 3 as m"], ["n=count(*)"])
    assert got.column_names == ["f", "m", "n"] and sum(got.column("n").to_pylist()) == ROWS
    for by, words in (
        (["flag as n"], "have the names of key columns"),
        (["flag as k", "name as k"], "two keys named ['k']"),
    ):
        with pytest.raises(QueryError, match=re.escape(words)):
            extagg.aggregate_files(path, by=by, aggs="n=count(*)")
        with pytest.raises(QueryError, match=re.escape(words)):
            extagg.aggregate(table, by, ["n=count(*)"])
    # --agg's way of naming is a comparison in --by: the error says how to name a key
    assert main(["aggregate", path, "--by", "w=lower(name)", "--agg", "n=count(*)", "-q"]) == 2
    assert "to name a key, write it as --by 'lower(name) AS w'" in capsys.readouterr().err


def test_split_alias():
    from extagg._names import ColumnName, split_alias, split_key_aliases

    assert split_alias("date_trunc('month', ts) as month") == ("date_trunc('month', ts)", "month")
    assert split_alias("cast(x as int) AS y") == ("cast(x as int)", "y")
    assert split_alias('a as "My name"') == ("a", "My name")
    for text in ("cast(x as int)", "has", "a as", "a as 1", '"a as b"', "'x as y'", "alias"):
        assert split_alias(text) == (text, None)
    keys, names = split_key_aliases(['"Unit price" as p', "k", ColumnName("a as b")])
    assert keys == ["Unit price", "k", "a as b"] and names == ["p", "k", "a as b"]
    assert isinstance(keys[0], ColumnName)


def test_split_names_keeps_an_expressions_commas():
    from extagg._names import ColumnName
    from extagg.cli_aggregate import split_names

    names = split_names("year(d), substr(s, 1, 2),\"a, b\", coalesce(s, 'x,y'),k")
    assert names == ["year(d)", "substr(s, 1, 2)", "a, b", "coalesce(s, 'x,y')", "k"]
    assert isinstance(names[2], ColumnName) and not isinstance(names[0], ColumnName)


def test_a_value_past_38_digits_is_a_runtime_error_naming_the_expression(tmp_path, capsys):
    """A 256-bit product is aggregated as ``decimal(38, s)``: a value past that stops the run
    (exit 1) naming the expression, not as a read error of the file."""
    from decimal import Decimal

    path = tmp_path / "big.parquet"
    values = [Decimal(10**35), Decimal(10**36)]
    pq.write_table(pa.table({"x": pa.array(values, pa.decimal128(38, 0))}), path)
    out = extagg.aggregate_files(str(path), aggs="s=sum(x * 10)").read_all()
    assert out.column("s").to_pylist() == [Decimal(11 * 10**36)]  # 38 digits: fits
    assert main(["aggregate", str(path), "--agg", "s=sum(x * 100)", "-q"]) == 1
    err = capsys.readouterr().err
    assert "'x * 100'" in err and "38 decimal digits" in err and str(path) not in err


def test_a_key_read_by_an_expression_is_read_as_plain_values(lineitem):
    """A Parquet string key is read as dictionary codes; ``lower(flag)`` beside it needs its
    values (Arrow has no ``utf8_lower`` for dictionaries: the run failed)."""
    path, rows = lineitem
    out = extagg.aggregate_files(path, by=["flag", "lower(flag)"], aggs="n=count(*)").read_all()
    got = {(r["flag"], r["lower(flag)"]): r["n"] for r in out.to_pylist()}
    assert got == {(f, f.lower()): sum(r["flag"] == f for r in rows) for f in "ANR"}


def test_keys_by_month_and_formatted_dates(tmp_path):
    """``--by "date_trunc('month', day)"``: the common bucket of a time series (a date stays a
    date), and ``strftime`` for a text key."""
    import datetime as dt

    path = tmp_path / "days.parquet"
    days = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(100)]
    pq.write_table(pa.table({"day": days, "v": range(100)}), path)
    out = extagg.aggregate_files(
        str(path), by=["date_trunc('month', day)", "strftime(day, '%Y-%m')"],
        aggs="n=count(*)", sort=True,
    ).read_all()  # fmt: skip
    assert out.to_pylist() == [
        {"date_trunc('month', day)": dt.date(2024, m, 1), "strftime(day, '%Y-%m')": f"2024-{m:02d}",
         "n": n}
        for m, n in ((1, 31), (2, 29), (3, 31), (4, 9))
    ]  # fmt: skip


# ---------------------------------------------------------------- extagg.aggregate(...)
def _reference(rows: list[dict], key, value) -> dict:
    out: dict = {}
    for r in rows:
        k = key(r)
        out[k] = out.get(k, 0) + value(r)
    return out


@pytest.mark.parametrize("memory", [None, "1m"])
def test_aggregate_takes_expressions_as_aggregate_files_does(lineitem, memory):
    """``extagg.aggregate`` on Arrow data in memory takes the expressions ``--agg`` and ``--by``
    take (it said "column 'price * (1 - disc)' is not in the batch"): exact decimal sums,
    keys named by their text, spilling at a tiny budget too."""
    path, rows = lineitem
    table = pq.read_table(path)
    out = extagg.aggregate(
        table,
        ["flag", "qty % 3"],
        {"disc_price": ("price * (1 - disc)", "sum"), "n": ("*", "count")},
        memory=memory,
    )
    assert out.column_names == ["flag", "qty % 3", "disc_price", "n"]
    got = {(r["flag"], r["qty % 3"]): r["disc_price"] for r in out.to_pylist()}
    expected = _reference(
        rows, lambda r: (r["flag"], r["qty"] % 3), lambda r: r["price"] * (1 - r["disc"])
    )
    assert got == expected
    texts = extagg.aggregate(table, "flag", ["charge=sum(price * (1 - disc) * (1 + tax))"])
    charge = {r["flag"]: r["charge"] for r in texts.to_pylist()}
    assert charge == _reference(
        rows, lambda r: r["flag"], lambda r: r["price"] * (1 - r["disc"]) * (1 + r["tax"])
    )


@pytest.mark.parametrize("form", ["batches", "reader", "pandas", "dataset", "dict"])
def test_aggregate_with_expressions_reads_every_kind_of_source(form):
    import pyarrow.dataset as ds

    table = pa.table({"k": [1, 2, 1, 3, 2] * 40, "p": [1.5, 2.0, 3.0, 4.0, 0.5] * 40})
    source = {
        "batches": table.to_batches(max_chunksize=7),
        "reader": pa.RecordBatchReader.from_batches(table.schema, table.to_batches(9)),
        "pandas": table.to_pandas(),
        "dataset": ds.dataset(table),
        "dict": {"k": table.column("k").to_numpy(), "p": table.column("p").to_numpy()},
    }[form]
    out = extagg.aggregate(source, "k * 10", ["s=sum(p * 2)", "m=max(p - k)"])
    got = {r["k * 10"]: (r["s"], r["m"]) for r in out.to_pylist()}
    rows = table.to_pylist()
    assert got == {
        k * 10: (
            sum(r["p"] * 2 for r in rows if r["k"] == k),
            max(r["p"] - r["k"] for r in rows if r["k"] == k),
        )
        for k in (1, 2, 3)
    }


def test_aggregate_keeps_columns_named_like_expressions_and_names_unknown_ones():
    table = pa.table({"k": [1, 1, 2], "unit-price": [5, 6, 7], "year(k)": [1, 2, 3]})
    out = extagg.aggregate(table, "k", {"u": ("unit-price", "sum"), "y": ("year(k)", "max")})
    assert sorted(out.to_pylist(), key=lambda r: r["k"]) == [
        {"k": 1, "u": 11, "y": 2},
        {"k": 2, "u": 7, "y": 3},
    ]
    with pytest.raises(QueryError, match=r"unknown column 'prise'.*did you mean 'unit-price'"):
        extagg.aggregate(table, "k", ["s=sum(prise * 2)"])
    with pytest.raises(ExpressionError, match="does not apply"):
        extagg.aggregate(pa.table({"k": [1], "s": ["x"]}), "k", ["t=sum(s * 2)"])
    plain = extagg.aggregate(table, "k", {"u": ("unit-price", "sum")})  # no expression at all
    assert plain.num_rows == 2


def test_aggregate_computes_expressions_over_aggregates(lineitem):
    """``extagg.aggregate(t, keys, ["r=sum(a) / sum(b)"])`` as ``--agg`` takes it: each call an
    aggregate the engine computes, the expression on the result, the columns in order."""
    path, rows = lineitem
    table = pq.read_table(path)
    out = extagg.aggregate(
        table, "flag",
        ["n=count(*)", "disc=sum(price * disc) / sum(price)", "span=max(qty) - min(qty)"],
        memory="1m",
    )  # fmt: skip
    assert out.column_names == ["flag", "n", "disc", "span"]
    assert extagg.run_metrics(out).records_read == ROWS
    got = {r["flag"]: r for r in out.to_pylist()}
    for flag in "ANR":
        mine = [r for r in rows if r["flag"] == flag]
        exact = sum(r["price"] * r["disc"] for r in mine) / sum(r["price"] for r in mine)
        assert abs(got[flag]["disc"] - exact) < Decimal("1e-20")
        assert got[flag]["span"] == max(r["qty"] for r in mine) - min(r["qty"] for r in mine)
    with pytest.raises(QueryError, match="aggregate 'bad': '/' does not apply to string"):
        extagg.aggregate(table, "flag", ["bad=max(name) / count(*)"])


def test_count_if_counts_the_rows_a_condition_holds_for(lineitem, capsys):
    """Spark's ``count_if(cond)``: ``count(case when cond then 1 end)`` — a null or false
    condition does not count, a group (or a global result over no row) where it never holds
    counts 0. The text form, the tuple form and the CLI, spilling under 1 MiB."""
    path, rows = lineitem
    want: dict[str, int] = {}
    for r in rows:
        held = r["name"] is not None and r["name"].lower() == "bob" and r["qty"] > 25
        want[r["flag"]] = want.get(r["flag"], 0) + held
    condition = "lower(name) = 'bob' and qty > 25"
    for aggs in ([f"c=count_if({condition})"], {"c": (condition, "count_if")}):
        for memory in (None, "1m"):
            got = extagg.aggregate_files(path, by="flag", aggs=aggs, memory=memory).read_all()
            assert {r["flag"]: r["c"] for r in got.to_pylist()} == want
    nothing = extagg.aggregate_files(path, aggs=["c=count_if(qty > 0)"], where="qty < 0")
    assert nothing.read_all().to_pylist() == [{"c": 0}]
    argv = ["aggregate", path, "--by", "flag", "--agg", f"count_if({condition})", "--sort",
            "-o", "-", "-q"]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"flag,count_if_{condition}"  # no comma or quote in it: not quoted
    assert lines[1:] == [f"{flag},{n}" for flag, n in sorted(want.items())]


def test_bool_and_and_bool_or_are_spark_and_duckdbs(lineitem, capsys):
    """``bool_and``/``every`` and ``bool_or``/``some`` of a condition: whether it holds for
    every row (at least one) whose condition is not null, null where every one is null — the
    text and the tuple forms, spilling under 1 MiB, against a reference and DuckDB; a
    condition that is not a boolean is a usage error."""
    path, rows = lineitem
    conditions = {r["flag"]: [] for r in rows}
    for r in rows:  # qty > 40 where the name is known, else null
        conditions[r["flag"]].append(None if r["name"] is None else r["qty"] > 40)
    want = {
        flag: {"a": all(c for c in cs if c is not None), "o": any(c for c in cs if c is not None)}
        for flag, cs in conditions.items()
    }
    test = "case when name is not null then qty > 40 end"
    texts = [f"a=bool_and({test})", f"o=bool_or({test})"]
    pairs = {"a": (test, "every"), "o": (test, "SOME")}
    for aggs in (texts, pairs):
        for memory in (None, "1m"):
            got = extagg.aggregate_files(path, by="flag", aggs=aggs, memory=memory).read_all()
            assert _by_flag(got) == want
    none = extagg.aggregate_files(path, aggs=["a=bool_and(qty > 0)", "o=bool_or(qty > 0)"],
                                  where="name is null and qty < 0")  # fmt: skip
    assert none.read_all().to_pylist() == [{"a": None, "o": None}]
    duckdb = pytest.importorskip("duckdb")
    sql = f"select flag, bool_and({test}), bool_or({test}) from '{path}' group by flag"
    assert {f: {"a": a, "o": o} for f, a, o in duckdb.sql(sql).fetchall()} == want
    assert main(["aggregate", path, "--agg", "a=bool_and(qty)", "-q"]) == 2
    assert "a condition of 'case' is a value of type int64, not a test" in capsys.readouterr().err

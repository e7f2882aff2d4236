"""Quantiles (median, quantile_cont, quantile_disc): each group's values sorted beside the
group-by, in bounded memory, against a plain-Python reference and DuckDB."""

from __future__ import annotations

import decimal
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import extagg
from extagg.cli import main
from extagg.columnar import DistinctAggregator, HashAggregator
from extagg.columnar.keys import KeyLayout
from extagg.errors import QueryError
from tests.columnar.reference import canon
from tests.conftest import files_under


def _quantile(values: list, q: float, cont: bool):
    """The reference: DuckDB's definitions over the sorted non-null values."""
    values = sorted((v for v in values if v is not None), key=lambda v: (v != v, v))  # NaN last
    n = len(values)
    if not n:
        return None
    if not cont:
        return values[max(math.ceil(q * n) - 1, 0)]
    position = q * (n - 1)
    lo = math.floor(position)
    hi = min(lo + 1, n - 1)
    part = position - lo
    low = float(values[lo])
    return low if part == 0 else low + (float(values[hi]) - low) * part


def _run(table: pa.Table, keys, aggs, memory, spill_dir=None, threads=1, batch=2_000):
    dirs = None if spill_dir is None else [str(spill_dir)]
    with DistinctAggregator(keys, aggs, memory=memory, spill_dirs=dirs, threads=threads) as agg:
        for start in range(0, table.num_rows, batch):
            agg.update(table.slice(start, batch))
        out = pa.Table.from_batches(list(agg.results()), schema=agg.schema)
        return out, agg.metrics


def _same(got, want) -> bool:
    if got is None or want is None:
        return got is None and want is None
    if isinstance(want, float):
        return (math.isnan(got) and math.isnan(want)) or math.isclose(got, want, rel_tol=1e-12)
    return got == want


FRACTIONS = st.sampled_from([0.0, 0.01, 0.1, 0.25, 0.33, 0.5, 0.75, 0.9, 0.999, 1.0])


@settings(max_examples=25, deadline=None)
@given(
    keys=st.lists(st.one_of(st.none(), st.integers(0, 30)), min_size=1, max_size=3000),
    data=st.data(),
    q=FRACTIONS,
    memory=st.sampled_from(["1m", "64m"]),
    threads=st.sampled_from([1, 2]),
)
def test_quantiles_match_the_reference(keys, data, q, memory, threads, tmp_path_factory):
    n = len(keys)
    floats = data.draw(st.lists(st.one_of(st.none(), st.floats(-1e6, 1e6), st.just(math.nan)),
                                min_size=n, max_size=n))  # fmt: skip
    ints = data.draw(st.lists(st.one_of(st.none(), st.integers(-50, 50)), min_size=n, max_size=n))
    words = [None if i is None else f"w{i % 7}" for i in ints]
    table = pa.table({
        "k": pa.array(keys, pa.int64()), "s": pa.array(words, pa.string()),
        "f": pa.array(floats, pa.float64()), "i": pa.array(ints, pa.int64()),
    })  # fmt: skip
    aggs = {
        "cf": ("f", f"quantile_cont({q})"), "df": ("f", f"quantile_disc({q})"),
        "ci": ("i", f"quantile_cont({q})"), "mi": ("i", "median"),
        "ds": ("s", f"quantile_disc({q})"), "n": ("*", "count"), "t": ("i", "sum"),
    }  # fmt: skip
    spill_dir = tmp_path_factory.mktemp("spill")
    got, _ = _run(table, ["k", "s"], aggs, memory, spill_dir, threads, batch=257)
    groups: dict = {}
    for row in table.to_pylist():
        groups.setdefault((canon(row["k"]), row["s"]), []).append(row)
    assert got.num_rows == len(groups)
    for row in got.to_pylist():
        rows = groups[(canon(row["k"]), row["s"])]
        f = [r["f"] for r in rows]
        i = [r["i"] for r in rows]
        want = {
            "cf": _quantile(f, q, True), "df": _quantile(f, q, False), "ci": _quantile(i, q, True),
            "mi": _quantile(i, 0.5, True), "ds": _quantile([r["s"] for r in rows], q, False),
            "n": len(rows), "t": sum(x for x in i if x is not None) if set(i) - {None} else None,
        }  # fmt: skip
        for name, value in want.items():
            assert _same(row[name], value), (name, row, value)
    assert files_under(spill_dir) == []


def test_many_runs_merge_in_bounded_memory(spill_dir) -> None:
    # 400 K values over 2 K groups at 1 MiB: the sorts write runs and merge them back,
    # beside an aggregator that spills
    rng = np.random.default_rng(5)
    n = 400_000
    table = pa.table({"k": rng.integers(0, 2_000, n), "v": rng.normal(0, 1, n)})
    aggs = {"m": ("v", "median"), "p": ("v", "quantile_disc(0.9)"), "s": ("v", "sum")}
    got, metrics = _run(table, ["k"], aggs, "1m", spill_dir, batch=50_000)
    assert metrics.spill_count >= 5
    assert metrics.peak_granted_bytes <= 1 << 20
    frame = table.to_pandas()
    by = frame.groupby("k")["v"]
    want_m, want_s = by.median(), by.sum()
    want_p = by.apply(lambda v: np.sort(v.to_numpy())[max(math.ceil(0.9 * len(v)) - 1, 0)])
    for row in got.to_pylist():
        assert math.isclose(row["m"], want_m[row["k"]], rel_tol=1e-12)
        assert row["p"] == want_p[row["k"]]
        assert math.isclose(row["s"], want_s[row["k"]], rel_tol=1e-9, abs_tol=1e-9)
    assert files_under(spill_dir) == []


def test_groups_sharing_a_hash_get_their_own_values(spill_dir, monkeypatch) -> None:
    # key hashes cut to 3 bits: every group shares its hash with others, across batches;
    # each group's values must still be its own (the sort orders a hash's groups by key)
    encode = KeyLayout.encode

    def few_hashes(self, cols, n=None, reuse=None):
        encoded = encode(self, cols, n, reuse)
        encoded.hashes &= np.uint64(7)
        return encoded

    monkeypatch.setattr(KeyLayout, "encode", few_hashes)
    rng = np.random.default_rng(9)
    n = 20_000
    words = np.array([f"key-{i}" for i in range(300)], dtype=object)
    table = pa.table(
        {"k": pa.array(words[rng.integers(0, 300, n)]), "v": rng.integers(0, 1_000, n)}
    )
    got, _ = _run(table, ["k"], {"m": ("v", "median"), "n": ("*", "count")}, "2m", spill_dir)
    frame = table.to_pandas()
    want = frame.groupby("k")["v"].median()
    assert got.num_rows == len(want)
    for row in got.to_pylist():
        assert row["m"] == want[row["k"]], row


def _decimal(unscaled: int, scale: int) -> decimal.Decimal:
    return decimal.Decimal(int(unscaled)).scaleb(-scale)


@pytest.mark.parametrize("threads", [1, 2])
def test_types_agree_with_duckdb(tmp_path, threads) -> None:
    duckdb = pytest.importorskip("duckdb")
    rng = np.random.default_rng(3)
    n = 30_000
    table = pa.table({
        "k": pa.array(rng.integers(0, 200, n), mask=rng.random(n) < 0.01),
        "f32": pa.array(rng.normal(0, 5, n).astype(np.float32)),
        "dec": pa.array([_decimal(x, 2) for x in rng.integers(-(10**6), 10**6, n)],
                        pa.decimal128(10, 2)),
        "big": pa.array([_decimal(x, 3) for x in rng.integers(-(10**9), 10**9, n)],
                        pa.decimal128(30, 3)),
        "d": pa.array(np.datetime64("2020-01-01") + rng.integers(0, 999, n).astype("m8[D]")),
        "ts": pa.array(np.datetime64("2020-01-01T00:00:00", "us") + rng.integers(0, 10**12, n)),
        "s": pa.array([f"w{i}" for i in rng.integers(0, 100, n)]).dictionary_encode(),
        "b": pa.array(rng.random(n) < 0.3, mask=rng.random(n) < 0.2),
        "i8": pa.array(rng.integers(-100, 100, n).astype(np.int8)),
    })  # fmt: skip
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=5_000)
    aggs = ["m1=median(f32)", "m2=median(dec)", "m3=median(d)", "m4=median(ts)", "m5=median(s)",
            "m6=median(b)", "m7=median(i8)", "m8=median(big)", "q1=quantile_cont(dec, 0.37)",
            "q2=quantile_disc(d, 0.9)", "q3=quantile_cont(ts, 0.1)", "q4=quantile(s, 0.75)",
            "q5=quantile_cont(i8, 1.0)", "q6=quantile_cont(f32, 0.0)",
            "q7=quantile_cont(big, 0.61)", "r=quantile_cont(i8, 0.9) - median(i8)"]  # fmt: skip
    got = extagg.aggregate_files(path, by=["k"], aggs=aggs, memory="1m", threads=threads,
                                 sort=True).read_all()  # fmt: skip
    select = ", ".join(f"{a.split('=', 1)[1]} AS {a.split('=', 1)[0]}" for a in aggs)
    sql = f"SELECT k, {select} FROM read_parquet('{path}') GROUP BY k ORDER BY k NULLS LAST"
    want = duckdb.sql(sql).arrow()
    want = want.read_all() if hasattr(want, "read_all") else want
    assert got.schema.types[:-1] == want.schema.types[:-1]
    assert got.num_rows == want.num_rows
    for g, w in zip(got.to_pylist(), want.to_pylist(), strict=True):
        for name in g:
            if isinstance(w[name], float):
                assert math.isclose(g[name], w[name], rel_tol=1e-6), (name, g, w)
            else:
                assert g[name] == w[name], (name, g, w)


def test_a_global_median_and_empty_groups() -> None:
    table = pa.table({"k": [1, 1, 2, 3], "v": [5.0, 1.0, None, 2.0]})
    got = extagg.aggregate(table, [], ["m=median(v)", "n=count(*)"])
    assert got.to_pylist() == [{"m": 2.0, "n": 4}]
    got = extagg.aggregate(table, ["k"], {"m": ("v", "median")})
    assert sorted(got.to_pylist(), key=lambda r: r["k"]) == [
        {"k": 1, "m": 3.0}, {"k": 2, "m": None}, {"k": 3, "m": 2.0},
    ]  # fmt: skip
    assert got.schema.field("m").type == pa.float64()


@pytest.mark.skipif(not hasattr(pa, "string_view"), reason="Arrow's view types")
@pytest.mark.parametrize(("threads", "memory"), [(1, None), (2, "1m")])
def test_string_and_binary_views_as_keys_and_values(threads, memory) -> None:
    """Arrow sorts no view types: a quantile of a string view was refused, and one grouped
    by a view key failed in Arrow ("Unsupported type for RecordBatch sorting: binary_view").
    They are sorted as large strings and binaries; a quantile of a view is a view."""
    rng = np.random.default_rng(3)
    n = 30_000
    keys = [f"k{i}" for i in rng.integers(0, 3_000, n)]
    texts = [None if i % 11 == 0 else f"v{i:05d}" for i in rng.integers(0, 50_000, n)]
    plain = pa.table({"k": keys, "v": texts, "i": rng.integers(0, 100, n)})
    views = plain.cast(pa.schema([("k", pa.string_view()), ("v", pa.string_view()),
                                  ("i", pa.int64())]))  # fmt: skip
    aggs = ["m=median(v)", "q=quantile_disc(v, 0.9)", "c=quantile_cont(i, 0.3)"]
    got = extagg.aggregate(views, "k", aggs, threads=threads, memory=memory)
    assert got.schema.field("m").type == pa.string_view()
    want = extagg.aggregate(plain, "k", aggs, threads=1)
    by_key = sorted(got.cast(want.schema).to_pylist(), key=lambda r: r["k"])
    assert by_key == sorted(want.to_pylist(), key=lambda r: r["k"])


@pytest.mark.parametrize("typ", [pa.binary(3), pa.binary_view(), pa.string_view()])
def test_a_group_without_values_beside_views_and_fixed_size_binaries(typ) -> None:
    """A group with no value placed its null by a take on the result type: Arrow takes no
    views ("array_take has no kernel"); a fixed-size binary had no quantile at all."""
    raw = [b"abc", b"abd", b"aaa", None]
    values = pa.array(raw, pa.binary(3)).cast(typ)
    table = pa.table({"k": [1, 1, 1, 2], "b": values})
    got = extagg.aggregate(table, "k", ["m=median(b)", "q=quantile_disc(b, 0.9)"], threads=1)
    assert got.schema.field("m").type == typ
    rows = sorted(
        got.cast(
            pa.schema([("k", pa.int64()), ("m", pa.binary()), ("q", pa.binary())])
        ).to_pylist(),
        key=lambda r: r["k"],
    )
    assert rows == [{"k": 1, "m": b"abc", "q": b"abd"}, {"k": 2, "m": None, "q": None}]


def test_a_quantile_beside_count_distinct_partitions_at_the_smallest_budget() -> None:
    """The join reads a quantile's sorted runs beside a count_distinct's partitions: the
    sort's merge took two runs' batches of 1 024 rows whatever its share (367 KiB of a
    256 KiB share at 1 MiB) and the join, or a partition's merge, was refused memory
    (MemoryLimitError). A capped merge's runs are written in batches that fit it."""
    rng = np.random.default_rng(103)
    n = 20_000

    def dec(values, precision, scale):
        wide = pa.array(values).cast(pa.decimal128(38, scale))
        return wide.cast(pa.decimal128(precision, scale))

    table = pa.table({
        "a": dec(rng.integers(-(10**6), 10**6, 100)[rng.integers(0, 100, n)], 18, 4),
        "b": dec(rng.integers(-(10**6), 10**6, n // 2)[rng.integers(0, n // 2, n)], 30, 3),
        "c": pa.array([bytes([x % 256, x // 256 % 256, 0]) for x in rng.integers(0, n // 2, n)],
                      pa.large_binary()),
        "v": dec(rng.integers(-(10**6), 10**6, n), 18, 4),
        "s": pa.array([f"v{x}" * (1 + x % 3) for x in rng.integers(0, 100, n)]),
    })  # fmt: skip
    aggs = {"var": ("v", "var"), "cd": ("c", "count_distinct"), "m": ("s", "median")}
    want = extagg.aggregate(table, ["a", "b", "c"], aggs, threads=1)
    got = extagg.aggregate(table.to_batches(max_chunksize=1000), ["a", "b", "c"], aggs,
                           memory="1m", threads=1)  # fmt: skip
    keys = [("a", "ascending"), ("b", "ascending"), ("c", "ascending")]
    got, want = got.sort_by(keys), want.sort_by(keys)
    assert got.drop_columns(["var"]).equals(want.drop_columns(["var"]))
    assert np.allclose(got["var"].to_numpy(zero_copy_only=False),
                       want["var"].to_numpy(zero_copy_only=False), equal_nan=True)  # fmt: skip


INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize(
    ("values", "want"),
    [
        ([-INF, NAN], (NAN, NAN, NAN)), ([-INF, INF], (NAN, NAN, NAN)),
        ([1.0, INF], (INF, INF, INF)), ([-INF, 2.0, NAN], (2.0, -INF, NAN)),
        ([1.0, 2.0, NAN, NAN], (NAN, 1.75, NAN)), ([-INF, -INF, 3.0, NAN], (-INF, -INF, NAN)),
    ],
)  # fmt: skip
def test_infinities_and_nans_interpolate_as_duckdb(values, want) -> None:
    """DuckDB interpolates doubles as ``lo * (1 - d) + hi * d`` (NaN sorted last): between
    -inf and 2 that is -inf, where ``lo + (hi - lo) * d`` gave NaN; float32 values it
    interpolates the other way, in doubles (-inf and 2: NaN). Answers checked against
    DuckDB 2.0."""
    aggs = ["m=median(x)", "a=quantile_cont(x, 0.25)", "b=quantile_cont(x, 0.75)"]
    got = extagg.aggregate(pa.table({"x": values}), [], aggs).to_pylist()[0]
    assert str(tuple(got.values())) == str(want)
    narrow = pa.table({"x": pa.array(values, pa.float32())})
    got = extagg.aggregate(narrow, [], aggs).to_pylist()[0]
    assert str(tuple(got.values())) == str(FLOAT32_WANT[str(values)])


#: DuckDB 2.0's answers for the same values as float32
FLOAT32_WANT = {
    "[-inf, nan]": (NAN, NAN, NAN), "[-inf, inf]": (NAN, NAN, NAN),
    "[1.0, inf]": (INF, INF, INF), "[-inf, 2.0, nan]": (2.0, NAN, NAN),
    "[1.0, 2.0, nan, nan]": (NAN, 1.75, NAN), "[-inf, -inf, 3.0, nan]": (NAN, NAN, NAN),
}  # fmt: skip


#: Spark 4.3's ``median``, ``percentile(x, 0.25)``, ``percentile(x, 0.9)`` of the values
SPARK_WANT = {
    (-INF, 2.0): (NAN, NAN, NAN), (2.0, INF): (INF, INF, INF), (-INF, INF): (NAN, NAN, NAN),
    (-INF, -INF): (-INF, -INF, -INF), (INF, INF): (INF, INF, INF), (1.0, NAN): (NAN, NAN, NAN),
    (NAN, NAN): (NAN, NAN, NAN), (0.1, 0.7): (0.4, 0.25, 0.64),
    (1e308, 1.7e308): (1.35e308, 1.175e308, 1.63e308), (-1e308, 1.7e308): (INF, INF, INF),
}  # fmt: skip


def test_spark_percentile_interpolates_as_spark() -> None:
    """``extagg.spark.aggregate``'s quantiles interpolate as Spark's ``percentile``: in
    doubles, ``lo + (hi - lo) d`` (-inf and 2: NaN; -1e308 and 1.7e308 overflow to inf),
    equal neighbours as they are (inf and inf: inf). Answers from Spark 4.3."""
    aggs = {"m": ("x", "quantile_cont(0.5)"), "a": ("x", "quantile_cont(0.25)"),
            "b": ("x", "quantile_cont(0.9)")}  # fmt: skip
    rows = [(i, x) for i, values in enumerate(SPARK_WANT) for x in values]
    table = pa.table({"g": [g for g, _ in rows], "x": [x for _, x in rows]})
    with DistinctAggregator("g", aggs, memory="4m", spark_percentile=True) as agg:
        agg.update(table)
        got = pa.Table.from_batches(list(agg.results())).sort_by("g").to_pylist()
    assert len(got) == len(SPARK_WANT)
    for row, (values, want) in zip(got, SPARK_WANT.items(), strict=True):
        assert str((row["m"], row["a"], row["b"])) == str(want), values


def test_counts_summed_from_no_rows_are_no_values() -> None:
    """The final stage of ``extagg.spark.aggregate`` counts a quantile's values as the sum of
    the partitions' counts: a global aggregate that no partition reached sums none (null),
    which read as 2^63 values ("9223372036854775808 sorted values ... belong to no group")."""
    schema = pa.schema([("v", pa.float64()), ("n", pa.int64())])
    aggs = {"m": ("v", "quantile_cont(0.5)")}
    with DistinctAggregator([], aggs, quantile_counts={"v": ("n", "sum")}, memory="4m") as agg:
        agg.update_plain(pa.RecordBatch.from_pylist([], schema=schema))
        assert [b.to_pylist() for b in agg.results()] == [[{"m": None}]]


@pytest.mark.parametrize("typ", [pa.decimal128(15, 2), pa.decimal128(30, 2), pa.float64(),
                                 pa.date32(), pa.int32()])  # fmt: skip
def test_groups_of_only_nulls_have_null_quantiles(typ) -> None:
    """No group of a batch of results with a value: the median of a decimal of up to 18
    digits failed (IndexError) reading the unscaled values of no values."""
    table = pa.table({"k": [1, 1, 2], "v": pa.array([None, None, None], typ)})
    got = extagg.aggregate(table, "k", ["m=median(v)", "q=quantile_disc(v, 0.5)"], threads=1)
    assert sorted(got.to_pylist(), key=lambda r: r["k"]) == [
        {"k": 1, "m": None, "q": None}, {"k": 2, "m": None, "q": None},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("agg", "words"),
    [
        ("m=median(v, 0.3)", "median() takes one argument, the column; write median(x)"),
        ("m=quantile_cont(v)", "quantile_cont() takes a column and a fraction from 0 to 1"),
        ("m=quantile_disc(v, 1.5)", "quantile_disc() is a number from 0 to 1, not '1.5'"),
        ("m=quantile(v, x)", "the fraction of quantile() is a number from 0 to 1, not 'x'"),
        ("m=percentile_approx(v, 0.5, 0.1)", "accuracy of percentile_approx() is a whole number"),
        ("m=medain(v)", "did you mean 'median'?"),
    ],
)  # fmt: skip
def test_bad_quantiles_are_usage_errors(agg, words) -> None:
    table = pa.table({"k": [1], "v": [1.0]})
    with pytest.raises(
        (QueryError, ValueError),
        match=words.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?"),
    ):
        extagg.aggregate(table, ["k"], [agg])


def test_a_list_column_has_no_quantile() -> None:
    table = pa.table({"k": [1, 2], "v": [[1], [2, 3]]})
    with pytest.raises(Exception, match=r"column 'v' has unsupported type list"):
        _run(table, ["k"], {"m": ("v", "median")}, "8m")


def test_hash_aggregator_alone_points_to_the_aggregator_that_does_quantiles() -> None:
    with pytest.raises(ValueError, match=r"use extagg\.aggregate"):
        HashAggregator(["k"], {"m": ("v", "median")})


def test_the_command_computes_quantiles_and_exits_2_on_a_bad_one(tmp_path, capsys) -> None:
    path = tmp_path / "t.csv"
    path.write_text("k,v\na,1\na,2\na,10\nb,4\nb,\n")
    out = tmp_path / "o.csv"
    argv = ["aggregate", str(path), "--by", "k", "--agg", "m=median(v)", "--agg",
            "p=quantile_disc(v, 0.5)", "--agg", "spread=quantile_cont(v, 1) - quantile_cont(v, 0)",
            "--memory", "1m", "--sort", "-o", str(out), "-q"]  # fmt: skip
    assert main(argv) == 0
    assert out.read_text().splitlines() == ["k,m,p,spread", "a,2,2,9", "b,4,4,0"]
    assert main(["aggregate", str(path), "--agg", "m=quantile_cont(v, 2)", "-q"]) == 2
    assert (
        "the fraction of quantile_cont() is a number from 0 to 1, not '2'"
        in capsys.readouterr().err
    )


def test_a_query_for_the_generic_engine_refuses_quantiles(tmp_path, capsys) -> None:
    # a list key goes to the generic engine, which has no quantiles (it gave wrong values)
    table = pa.table({"k": [[1], [1], [2]], "v": [1.0, 3.0, 2.0]})
    with pytest.raises(QueryError, match="computed by the columnar engine only"):
        extagg.aggregate(table, ["k"], ["m=median(v)"])
    path = tmp_path / "l.jsonl"
    path.write_text('{"k": [1], "v": 1}\n{"k": [2], "v": 3}\n')
    assert main(["aggregate", str(path), "--by", "k", "--agg", "m=median(v)", "-q"]) == 2
    assert "computed by the columnar engine only" in capsys.readouterr().err

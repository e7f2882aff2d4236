"""extagg.spark.aggregate against df.groupBy().agg() on a real local[2]."""

from __future__ import annotations

import datetime as dt
import math
import random
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import extagg.spark as es

pytestmark = pytest.mark.spark


def rows(n: int, seed: int = 11):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = rng.randrange(40)
        name = None if k % 13 == 0 else f"name-{k % 9}"
        fkey = [0.0, -0.0, float("nan"), None, 1.5][k % 5]
        day = None if k % 17 == 0 else dt.date(2024, 1, 1) + dt.timedelta(days=k % 6)
        x = None if i % 7 == 0 else rng.randrange(-1000, 1000)
        y = (
            None
            if i % 5 == 0
            else (float("nan") if i % 97 == 0 and k < 5 else rng.uniform(-50, 50))
        )
        d = None if i % 11 == 0 else Decimal(rng.randrange(10**6)) / 100
        event = dt.date(2020, 1, 1) + dt.timedelta(days=rng.randrange(3000))
        out.append((name, fkey, day, x, y, d, event))
    return out


SCHEMA = "name string, fkey double, day date, x int, y double, d decimal(12,2), event date"

NUMERIC = ["count", "sum", "mean", "min", "max", "var", "var_pop", "std", "std_pop"]


def spark_agg(df, by, aggs):
    from pyspark.sql import functions as F

    funcs = {
        "count": F.count,
        "sum": F.sum,
        "mean": F.avg,
        "min": F.min,
        "max": F.max,
        "var": F.var_samp,
        "var_pop": F.var_pop,
        "std": F.stddev_samp,
        "std_pop": F.stddev_pop,
        "first": F.first,
        "last": F.last,
        "first_non_null": lambda c: F.first(c, ignorenulls=True),
        "last_non_null": lambda c: F.last(c, ignorenulls=True),
    }
    exprs = [
        (F.count(F.lit(1)) if col == "*" else funcs[fn](col)).alias(out)
        for out, (col, fn) in aggs.items()
    ]
    return df.groupBy(*by).agg(*exprs)


def as_dict(df, by):
    out = {}
    for row in df.collect():
        d = row.asDict()
        key = tuple(_norm(d.pop(k)) for k in by)
        assert key not in out, f"group {key} twice"
        out[key] = d
    return out


def _norm(v):
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, float) and v == 0:
        return 0.0
    return v


def assert_same(ours, theirs):
    assert ours.keys() == theirs.keys()
    for key in theirs:
        for name, expected in theirs[key].items():
            got = ours[key][name]
            if isinstance(expected, float) and expected is not None:
                assert got is not None, (key, name)
                if math.isnan(expected):
                    assert math.isnan(got), (key, name, got)
                else:
                    assert math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9), (
                        key,
                        name,
                        got,
                        expected,
                    )
            else:
                assert got == expected, (key, name, got, expected)


def test_every_numeric_function_equals_spark(spark):
    engine = "arrow"
    df = spark.createDataFrame(rows(3000), SCHEMA).repartition(3)
    aggs = {"rows": ("*", "count")}
    for col in ("x", "y", "d"):
        for fn in NUMERIC:
            aggs[f"{fn}_{col}"] = (col, fn)
    aggs["min_day"] = ("event", "min")
    aggs["max_day"] = ("event", "max")
    aggs["n_name"] = ("name", "count")
    by = ["name", "fkey", "day"]
    ours = es.aggregate(df, by, aggs, memory="8m", engine=engine, force_spill_rows=700)
    assert [f.name for f in ours.schema.fields] == [*by, *aggs]
    theirs = spark_agg(df, by, aggs)
    for mine, spark_field in zip(ours.schema.fields, theirs.schema.fields, strict=True):
        assert mine.dataType == spark_field.dataType, mine.name
        # count is NOT NULL in Spark's schema (it was nullable: df.schema == ... was False)
        assert mine.nullable == spark_field.nullable, mine.name
    assert_same(as_dict(ours, by), as_dict(theirs, by))


def test_map_in_pandas_variant(spark):
    # pandas has one missing value for floats: NaN and null are the same there, so no NaN here
    data = [(f"k{i % 5}" if i % 11 else None, float(i % 13), i) for i in range(600)]
    df = spark.createDataFrame(data, "k string, v double, n long").repartition(2)
    aggs = {"s": ("v", "sum"), "m": ("n", "mean"), "sd": ("v", "std"), "mx": ("n", "max")}
    ours = es.aggregate(df, ["k"], aggs, memory="8m", engine="pandas")
    assert_same(as_dict(ours, ["k"]), as_dict(spark_agg(df, ["k"], aggs), ["k"]))


def test_first_and_last_follow_partition_order(spark):
    # one partition per value range: Spark's own first/last then depend only on partition order
    data = [(i % 4, i, None if i % 3 == 0 else i) for i in range(400)]
    df = spark.createDataFrame(data, "k int, v int, w int").coalesce(1)
    aggs = {
        "f": ("v", "first"),
        "l": ("v", "last"),
        "fw": ("w", "first"),
        "lw": ("w", "last"),
        "fnn": ("w", "first_non_null"),
        "lnn": ("w", "last_non_null"),
    }
    ours = as_dict(es.aggregate(df, ["k"], aggs, memory="8m"), ["k"])
    theirs = as_dict(spark_agg(df, ["k"], aggs), ["k"])
    assert ours == theirs
    # several partitions: partition i's values are all below partition i+1's
    df4 = spark.createDataFrame(data, "k int, v int, w int").repartitionByRange(4, "v")
    ours4 = as_dict(es.aggregate(df4, ["k"], aggs, memory="8m"), ["k"])
    assert ours4 == theirs


def test_partial_states_for_users_own_map_in_arrow(spark):
    df = spark.createDataFrame(
        [(i % 3, float(i)) for i in range(300)], "k int, v double"
    ).repartition(4)
    partial_df, plan = es.partial_aggregate(df, ["k"], {"m": ("v", "mean"), "s": ("v", "std")})
    partials = partial_df.collect()
    assert len(partials) <= 4 * 3 and {r["k"] for r in partials} == {0, 1, 2}
    result = as_dict(es.final_aggregate(partial_df, plan), ["k"])
    theirs = as_dict(spark_agg(df, ["k"], {"m": ("v", "mean"), "s": ("v", "std")}), ["k"])
    assert_same(result, theirs)


def test_rdd_or_bad_column_is_refused(spark, spark_context):
    df = spark.createDataFrame([(1, 2)], "k int, v int")
    with pytest.raises(TypeError, match="DataFrame"):
        es.aggregate(spark_context.parallelize([(1, 2)]), ["k"], {"s": ("v", "sum")})
    with pytest.raises(ValueError, match="nope"):
        es.aggregate(df, ["k"], {"s": ("nope", "sum")})


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(-3, 12)),
            st.one_of(st.none(), st.integers(-(10**6), 10**6)),
            st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False), st.just(float("nan"))),
        ),
        max_size=300,
    )
)
def test_random_rows_same_as_group_by_agg(spark, data):
    """extagg.spark.aggregate against df.groupBy().agg() on random rows (null keys, nulls,
    NaN), with spills forced in both phases."""
    df = spark.createDataFrame(data, "k int, x long, y double").repartition(2)
    aggs = {"rows": ("*", "count")}
    for col in ("x", "y"):
        for fn in ("count", "sum", "mean", "min", "max", "var_pop"):
            aggs[f"{fn}_{col}"] = (col, fn)
    ours = es.aggregate(df, ["k"], aggs, memory="4m", force_spill_rows=40)
    assert_same(as_dict(ours, ["k"]), as_dict(spark_agg(df, ["k"], aggs), ["k"]))


def test_sum_and_mean_of_a_day_time_interval_as_spark(spark):
    """A day-time interval sums and averages to an interval (Spark's own types and values:
    the mean exact, rounded half away from zero), with spills forced in both phases."""
    rng = random.Random(3)
    data = [
        (rng.randrange(8), None if i % 9 == 0 else dt.timedelta(microseconds=rng.randrange(-5, 9)))
        for i in range(400)
    ]
    data += [(20, dt.timedelta(microseconds=1)), (20, dt.timedelta(microseconds=2))]  # 1.5 us
    data += [(21, dt.timedelta(microseconds=-1)), (21, dt.timedelta(microseconds=-2))]
    data += [(22, None), (23, dt.timedelta(days=3, hours=1))]
    df = spark.createDataFrame(data, "k int, span interval day to second").repartition(2)
    aggs = {"s": ("span", "sum"), "m": ("span", "mean")}
    ours = es.aggregate(df, ["k"], aggs, memory="4m", force_spill_rows=40)
    theirs = spark_agg(df, ["k"], aggs)
    assert [f.dataType for f in ours.schema.fields] == [f.dataType for f in theirs.schema.fields]
    expected = as_dict(theirs, ["k"])
    assert as_dict(ours, ["k"]) == expected
    assert expected[(20,)]["m"] == dt.timedelta(microseconds=2)
    assert expected[(21,)]["m"] == dt.timedelta(microseconds=-2)


def test_local_workers_run_the_drivers_python_unless_told(spark, spark_context, monkeypatch):
    """Without PYSPARK_PYTHON, PySpark starts local workers with ``python3`` from the PATH —
    not this virtualenv's interpreter, so every task failed with ``No module named
    'extagg'``. ``aggregate`` points local workers at this interpreter; a choice the user
    made is kept."""
    import shutil
    import sys

    from extagg.spark.settings import local_workers_run_this_python

    df = spark.createDataFrame([("a", 1.0), ("b", 2.0), ("a", 3.0)], "k string, v double")
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.setattr(spark_context, "pythonExec", "python3")
    if shutil.which("python3") != sys.executable:
        out = es.aggregate(df, by="k", aggs=["n=count(*)", "s=sum(v)"], memory="32m")
        assert sorted(map(tuple, out.collect())) == [("a", 2, 4.0), ("b", 1, 2.0)]
        assert spark_context.pythonExec == sys.executable
    monkeypatch.setattr(spark_context, "pythonExec", "python3")
    monkeypatch.setenv("PYSPARK_PYTHON", "python3")
    assert not local_workers_run_this_python(spark_context)
    assert spark_context.pythonExec == "python3"


def test_timestamps_big_integer_means_and_an_output_named_as_a_key(spark):
    """A ``timestamp`` column, as key or aggregated, failed every query with a bare
    AssertionError (Arrow's type of it names the session's zone); the mean and deviation of a
    long column whose sum passes 2^53 failed (``Integer value ... not in range``); an output
    named as a key ended in an obscure JVM error."""
    from pyspark.sql import functions as F

    data = [
        ("a", dt.datetime(2020, 1, 1, 12), 2**53 + 1),
        ("a", dt.datetime(2021, 1, 1), 2**53 + 1),
        ("b", dt.datetime(2020, 1, 1, 12), 1),
    ]
    df = spark.createDataFrame(data, "k string, t timestamp, v long").repartition(2)
    ours = es.aggregate(df, ["k"], {"hi": ("t", "max"), "m": ("v", "mean"), "sd": ("v", "std")})
    theirs = df.groupBy("k").agg(
        F.max("t").alias("hi"), F.avg("v").alias("m"), F.stddev("v").alias("sd")
    )
    assert [f.dataType for f in ours.schema.fields] == [f.dataType for f in theirs.schema.fields]
    assert_same(as_dict(ours, ["k"]), as_dict(theirs, ["k"]))
    by_time = es.aggregate(df, ["t"], {"n": ("*", "count")})
    assert as_dict(by_time, ["t"]) == as_dict(df.groupBy("t").agg(F.count("*").alias("n")), ["t"])
    with pytest.raises(ValueError, match=r"output\(s\) \['k'\] have the name of a key column"):
        es.aggregate(df, ["k"], {"k": ("v", "sum")})


def test_a_sum_overflow_names_the_output_not_its_state_column(spark):
    """The error named the internal state column ``'__s_s'`` as the aggregate; then the
    output as the column summed ("sum of column 's'"), which is ``v``."""
    df = spark.createDataFrame([("a", 2**62), ("a", 2**62), ("a", 2**62)], "k string, v long")
    with pytest.raises(Exception) as info:
        es.aggregate(df.repartition(3), ["k"], {"s": ("v", "sum")}).collect()
    text = str(info.value)
    assert "overflow in aggregate 's'" in text and "__s_s" not in text, text[-2000:]
    assert "sum of column 'v'" in text, text[-2000:]


def test_mean_and_deviation_of_longs_whose_sum_leaves_int64_as_spark(spark):
    """Spark's ``avg``/``stddev`` of a long column sum doubles; the partial states summed
    int64 and failed with ``SumOverflowError`` (2^62 + 2^62 + 7)."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(
        [("a", 2**62), ("a", 2**62), ("a", 7), ("b", -(2**62)), ("b", -(2**62)), ("b", -5)],
        "k string, v long",
    ).repartition(2)
    aggs = {"m": ("v", "mean"), "sd": ("v", "std"), "vp": ("v", "var_pop")}
    ours = es.aggregate(df, ["k"], aggs)
    theirs = df.groupBy("k").agg(
        F.avg("v").alias("m"), F.stddev("v").alias("sd"), F.var_pop("v").alias("vp")
    )
    assert [f.dataType for f in ours.schema.fields] == [f.dataType for f in theirs.schema.fields]
    assert_same(as_dict(ours, ["k"]), as_dict(theirs, ["k"]))
    assert as_dict(ours, ["k"])[("a",)]["m"] == 3.0744573456182584e18


def test_unsupported_types_are_refused_at_the_call_naming_the_output(spark):
    """A mean of a date failed in a worker at ``collect()``, naming the state column
    ``'__o_s'`` and ``sum``; an array key too (as a ``PythonException``)."""
    df = spark.createDataFrame(
        [("a", dt.date(2024, 1, 1), [1], "x")], "k string, d date, arr array<int>, s string"
    )
    with pytest.raises(TypeError, match=r"aggregate 'o': mean\('d'\) is not supported") as info:
        es.aggregate(df, ["k"], {"o": ("d", "mean")})
    assert "__o" not in str(info.value)
    with pytest.raises(TypeError, match=r"aggregate 't': sum\('s'\) is not supported"):
        es.aggregate(df, ["k"], {"t": ("s", "sum")})
    with pytest.raises(TypeError, match="key column 'arr' of type array<int> is not supported"):
        es.aggregate(df, ["arr"], {"n": ("*", "count")})
    ok = es.aggregate(df, ["k"], {"lo": ("d", "min"), "hi": ("s", "max")}).collect()
    assert [r.asDict() for r in ok] == [{"k": "a", "lo": dt.date(2024, 1, 1), "hi": "x"}]


def test_deviation_of_values_with_a_large_mean_is_as_exact_as_spark(spark):
    """Partitions' variances were combined as ``Q − S²/N`` (sums of squares): for epoch
    seconds (mean 1.7e9, spread of minutes) every digit cancelled - ``stddev`` 0.0 or off by
    orders of magnitude where Spark's Chan merge of the moments is exact to ~1e-12."""
    from pyspark.sql import functions as F

    rng = random.Random(5)
    data = [(f"s{i % 3}", 1.7e9 + rng.uniform(0, 600)) for i in range(3000)]
    data += [("one", 1.7e9 + 1.5), ("one", 1.7e9 + 2.5)]  # std sqrt(0.5), in two partitions
    df = spark.createDataFrame(data, "k string, t double").repartition(4)
    aggs = {"sd": ("t", "std"), "vp": ("t", "var_pop"), "v": ("t", "var"), "sp": ("t", "std_pop")}
    ours = as_dict(es.aggregate(df, ["k"], aggs), ["k"])
    theirs = df.groupBy("k").agg(
        F.stddev("t").alias("sd"), F.var_pop("t").alias("vp"), F.var_samp("t").alias("v"),
        F.stddev_pop("t").alias("sp"),
    )  # fmt: skip
    assert_same(ours, as_dict(theirs, ["k"]))
    assert math.isclose(ours[("one",)]["sd"], math.sqrt(0.5), rel_tol=1e-9)
    # and across the partial/final stages run by hand, with spills forced in both
    partial_df, plan = es.partial_aggregate(df, ["k"], aggs, force_spill_rows=50)
    final = es.final_aggregate(partial_df, plan)
    assert_same(as_dict(final, ["k"]), as_dict(theirs, ["k"]))


@pytest.mark.parametrize("engine", ["arrow", "pandas"])
def test_decimals_stay_exact_keys_and_sums_as_spark(spark, engine):
    """Decimals were cast to doubles: 23-digit ids ``…123`` and ``…124`` were one group (the
    key itself came back as ``…7741440``), ``sum``/``avg`` of money were doubles. They are
    keys and values as they are now, with Spark's result types and digits."""
    from pyspark.sql import functions as F

    ids = [Decimal("12345678901234567890123"), Decimal("12345678901234567890124")]
    data = [(ids[i % 2], Decimal(i) / 100 + Decimal("0.005") * (i % 2)) for i in range(1, 41)]
    data[::2] = [(k, Decimal("1e7") + v) for k, v in data[::2]]  # past a double's 15 digits
    data.append((ids[0], None))
    df = spark.createDataFrame(data, "k decimal(38,0), v decimal(12,3)").repartition(3)
    aggs = {"n": ("v", "count"), "s": ("v", "sum"), "m": ("v", "mean"), "lo": ("v", "min")}
    ours = es.aggregate(df, ["k"], aggs, engine=engine, force_spill_rows=5)
    theirs = df.groupBy("k").agg(
        F.count("v").alias("n"), F.sum("v").alias("s"), F.avg("v").alias("m"),
        F.min("v").alias("lo"),
    )  # fmt: skip
    assert ours.schema == theirs.schema
    got, expected = as_dict(ours, ["k"]), as_dict(theirs, ["k"])
    assert got == expected and set(got) == {(k,) for k in ids}
    assert str(got[(ids[0],)]["s"]) == str(sum(v for k, v in data if k == ids[0] and v))


def test_a_decimal_sum_past_38_digits_across_partitions_names_the_output(spark):
    """Each partition's sum fits ``decimal(38, 0)``, their total does not: Spark's
    ARITHMETIC_OVERFLOW, raised by the final stage and named by the user's output."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(
        [("a", Decimal(6 * 10**37), 0), ("a", Decimal(6 * 10**37), 1)],
        "k string, v decimal(38,0), p int",
    ).repartition(2, "p")
    with pytest.raises(Exception, match="Overflow"):
        df.groupBy("k").agg(F.sum("v")).collect()
    with pytest.raises(Exception) as info:
        es.aggregate(df, ["k"], {"total": ("v", "sum")}).collect()
    text = str(info.value)
    assert "decimal overflow in aggregate 'total'" in text and "__total" not in text, text[-2000:]


@pytest.mark.parametrize("engine", ["arrow", "pandas"])
def test_count_distinct_beside_other_aggregates_equals_spark(spark, engine):
    """``count_distinct`` was refused ("use extagg.aggregate()"): each partition's distinct
    (keys, value) pairs travel beside its partial states and the final stage counts them in
    bounded memory; nulls are not counted, ``-0.0`` is ``0.0`` and NaNs are one value."""
    from pyspark.sql import functions as F

    rng = random.Random(8)
    nan = float("nan") if engine == "arrow" else 3.5  # pandas: NaN is null
    data = [
        (
            None if i % 31 == 0 else f"k{rng.randrange(25)}",
            None if i % 7 == 0 else rng.randrange(60),
            rng.choice([0.0, -0.0, nan, 1.5, None, 2.5]),
            None if i % 5 == 0 else f"u{rng.randrange(400)}",
        )
        for i in range(4000)
    ]
    df = spark.createDataFrame(data, "k string, x int, f double, u string").repartition(3)
    aggs = {"n": ("*", "count"), "ux": ("x", "count_distinct"), "first_x": ("x", "first"),
            "uf": ("f", "nunique"), "uu": ("u", "count_distinct"), "sx": ("x", "sum"),
            "uk": ("k", "count_distinct")}  # fmt: skip
    ours = es.aggregate(df, ["k"], aggs, engine=engine, force_spill_rows=300, memory="8m")
    theirs = df.groupBy("k").agg(
        F.count("*").alias("n"), F.countDistinct("x").alias("ux"), F.first("x").alias("first_x"),
        F.countDistinct("f").alias("uf"), F.countDistinct("u").alias("uu"),
        F.sum("x").alias("sx"), F.countDistinct("k").alias("uk"),
    )  # fmt: skip
    assert ours.schema == theirs.schema
    got, expected = as_dict(ours, ["k"]), as_dict(theirs, ["k"])
    for row in expected.values():
        row.pop("first_x")  # which row is first is the shuffle's choice
    for row in got.values():
        row.pop("first_x")
    assert got == expected
    only = es.aggregate(df, ["k"], {"uu": ("u", "count_distinct")}, force_spill_rows=300)
    assert {k: r["uu"] for k, r in as_dict(only, ["k"]).items()} == {
        k: r["uu"] for k, r in expected.items()
    }


def test_pandas_engine_timestamps_in_a_session_time_zone(spark):
    """``engine="pandas"`` in a session zone other than UTC moved every timestamp by the zone's
    offset at each stage (pandas holds the session's wall times without a zone, read back as
    UTC): keys and max 8 hours early in New York's summer. Equal to Spark's now, DST edges in."""
    data = [
        (dt.datetime(2024, 11, 3, 1, 30), 1), (dt.datetime(2024, 6, 1, 12, 0), 1),
        (dt.datetime(2024, 3, 10, 3, 30), 2), (dt.datetime(1999, 12, 31, 23, 59, 59), 2),
        (None, 2),
    ]  # fmt: skip
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        df = spark.createDataFrame(data, "t timestamp, g int").repartition(2)
        queries = [
            (["t"], {"n": ("*", "count")}),
            (["g"], {"mx": ("t", "max"), "lo": ("t", "min")}),
        ]
        for by, aggs in queries:
            ours = es.aggregate(df, by, aggs, memory="8m", engine="pandas")
            assert sorted(ours.collect(), key=str) == sorted(
                spark_agg(df, by, aggs).collect(), key=str
            )
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


def test_only_the_columns_read_go_to_the_workers(spark):
    """A column the aggregation does not read — of a type PySpark's Arrow conversion cannot
    take (a year-month interval: ``KeyError: 21`` in the worker), or with a dot in its name
    (``UNRESOLVED_COLUMN``) — no longer fails the job; a dotted name it reads is refused at
    the call, saying what to do."""
    from pyspark.sql import functions as F

    df = spark.sql(
        "select * from values ('a', 1, interval '1-2' year to month, 0), "
        "('b', 2, interval '0-1' year to month, 0), ('a', 3, null, 1) as t(k, v, ym, `x.y`)"
    )
    ours = es.aggregate(df, "k", {"s": ("v", "sum")}, memory="8m")
    assert sorted(map(tuple, ours.collect())) == [("a", 4), ("b", 2)]
    with pytest.raises(ValueError, match=r"\['x.y'\] hold a dot.*withColumnRenamed"):
        es.aggregate(df, "k", {"s": ("x.y", "sum")})
    renamed = df.withColumnRenamed("x.y", "x_y")
    ours = es.aggregate(renamed, "k", {"s": ("x_y", "sum")}, memory="8m")
    assert sorted(map(tuple, ours.collect())) == sorted(
        map(tuple, renamed.groupBy("k").agg(F.sum("x_y").alias("s")).collect())
    )


@pytest.mark.parametrize("engine", ["arrow", "pandas"])
def test_a_global_aggregate_is_one_row_as_df_agg(spark, engine):
    """``by=[]`` is ``df.agg(...)``: one row, also for an empty DataFrame and one with no
    partition at all (``by must name at least one key column`` before). ``count(*)`` alone
    reads no column; PySpark's batches of no column have no rows, and it counted 0."""
    from pyspark.sql import functions as F

    df = spark.range(0, 10_000, numPartitions=4).selectExpr(
        "id", "cast(id % 7 as double) v", "id % 13 k"
    )
    ours = es.aggregate(df, [], ["n=count(*)", "s=sum(v)", "m=mean(v)", "hi=max(id)"],
                        engine=engine, force_spill_rows=100, memory="16m")  # fmt: skip
    theirs = df.agg(F.count("*").alias("n"), F.sum("v").alias("s"), F.avg("v").alias("m"),
                    F.max("id").alias("hi"))  # fmt: skip
    assert ours.schema == theirs.schema
    assert ours.collect() == theirs.collect()
    assert es.aggregate(df, [], ["n=count(*)"], engine=engine).collect()[0].n == 10_000
    assert es.aggregate(df, [], ["d=count_distinct(k)"], engine=engine).collect()[0].d == 13
    for empty in (df.where("id < 0"), spark.createDataFrame(spark.sparkContext.emptyRDD(),
                                                            df.schema)):  # fmt: skip
        got = es.aggregate(empty, [], ["n=count(*)", "s=sum(v)", "d=count_distinct(k)"],
                           engine=engine).collect()  # fmt: skip
        assert [tuple(r) for r in got] == [(0, None, 0)]


def test_a_budget_below_the_engines_minimum_is_refused_at_the_call(spark):
    """``memory="256k"`` started the job and failed in every Python worker (a BudgetError
    wrapped in a PythonException); it is refused on the driver now, as a bad column is."""
    from extagg.errors import BudgetError

    df = spark.range(10).selectExpr("id % 2 k", "id v")
    with pytest.raises(BudgetError, match="below the engines' working minimum"):
        es.aggregate(df, ["k"], ["s=sum(v)"], memory="256k")


@pytest.mark.parametrize("engine", ["arrow", "pandas"])
def test_quantiles_beside_other_aggregates_equal_spark(spark, engine):
    """Quantiles were refused ("no partial state"): each partition sends its (keys, value,
    weight) rows and the final stage sorts each group's values, as many times each as they
    came, beside the merged states: Spark's ``median``, ``percentile`` (doubles, interpolated)
    and ``percentile_approx`` (exact here: one of the values, of the input's type), also with
    spills forced on both stages and a 1 MiB budget."""
    from pyspark.sql import functions as F

    rng = random.Random(21)
    nan = float("nan") if engine == "arrow" else 3.5  # pandas: NaN is null
    data = [
        (
            None if i % 29 == 0 else f"k{rng.randrange(12)}",
            None if i % 7 == 0 else rng.randrange(-40, 40),  # many repeats per group
            rng.choice([None, nan, 0.5, -2.25, rng.uniform(-100, 100)]),
            None if i % 9 == 0 else Decimal(rng.randrange(-(10**6), 10**6)) / 100,
            dt.date(2024, 1, 1) + dt.timedelta(days=rng.randrange(40)),
        )
        for i in range(3000)
    ]
    df = spark.createDataFrame(data, "k string, x int, y double, d decimal(10,2), day date")
    df = df.repartition(3)
    aggs = ["mx=median(x)", "p90=percentile(y, 0.9)", "q25=percentile_approx(x, 0.25)",
            "md=median(d)", "q0=percentile(x, 0)", "q1=quantile_disc(day, 1.0)", "n=count(*)",
            "ux=count_distinct(x)", "sy=sum(y)"]  # fmt: skip
    ours = es.aggregate(df, ["k"], aggs, engine=engine, force_spill_rows=200, memory="1m")
    theirs = df.groupBy("k").agg(
        F.median("x").alias("mx"), F.percentile("y", 0.9).alias("p90"),
        F.percentile_approx("x", 0.25, 1_000_000).alias("q25"), F.median("d").alias("md"),
        F.percentile("x", 0.0).alias("q0"), F.percentile_approx("day", 1.0, 1_000_000).alias("q1"),
        F.count("*").alias("n"), F.countDistinct("x").alias("ux"), F.sum("y").alias("sy"),
    )  # fmt: skip
    assert ours.schema == theirs.schema
    assert [f.dataType.simpleString() for f in ours.schema][1:7] == [
        "double", "double", "int", "double", "double", "date"
    ]  # fmt: skip
    got, expected = as_dict(ours, ["k"]), as_dict(theirs, ["k"])
    assert len(got) == 13
    assert_same(got, expected)
    assert got[("k3",)]["mx"] is not None


def test_a_value_repeated_past_a_batch_and_a_global_quantile_equal_spark(spark):
    """A value a partition holds 150 000 times comes as one weighted row, expanded in
    batches of ``EXPAND_ROWS`` in the final stage; without keys the quantiles are one row,
    null for an empty DataFrame as Spark's."""
    from pyspark.sql import functions as F

    from extagg.spark.dataframe import EXPAND_ROWS

    assert EXPAND_ROWS < 150_000
    df = spark.range(200_000).selectExpr(
        "id % 2 AS g", "CASE WHEN id < 150000 THEN 7 ELSE id END AS v"
    )
    aggs = ["m=median(v)", "p=percentile(v, 0.99)", "a=percentile_approx(v, 0.8)"]
    theirs = [
        F.median("v").alias("m"),
        F.percentile("v", 0.99).alias("p"),
        F.percentile_approx("v", 0.8, 1_000_000).alias("a"),
    ]
    ours = es.aggregate(df, ["g"], aggs, memory="4m")
    assert_same(as_dict(ours, ["g"]), as_dict(df.groupBy("g").agg(*theirs), ["g"]))
    whole = es.aggregate(df, [], aggs, memory="4m").collect()
    assert whole == df.agg(*theirs).collect()
    empty = df.filter("v < 0")
    assert es.aggregate(empty, [], aggs).collect() == empty.agg(*theirs).collect()


def test_quantile_refusals_name_the_output(spark):
    """``percentile`` of text is refused at the call, as Spark refuses it (``quantile_disc``
    takes it); merged states kept between batches cannot hold every value."""
    df = spark.createDataFrame([("a", 1)], "s string, v int")
    with pytest.raises(TypeError, match=r"aggregate 'm': quantile_cont\('s'\).*needs numbers"):
        es.aggregate(df, [], ["m=median(s)"])
    assert es.aggregate(df, [], ["m=quantile_disc(s, 0.5)"]).collect()[0]["m"] == "a"
    partial, plan = es.partial_aggregate(df, ["s"], ["m=median(v)"])
    with pytest.raises(ValueError, match=r"quantiles \('m'\) have no mergeable state"):
        es.final_aggregate(partial, plan, keep_states=True)


@pytest.mark.parametrize("typ", ["double", "float"])
def test_quantiles_of_infinities_and_nans_interpolate_as_spark(spark, typ):
    """Spark's ``percentile`` interpolates in doubles as ``lo + (hi - lo) d`` (floats cast
    first): -inf and 2 give NaN, where the DuckDB form of the command gives -inf (and a float
    column's DuckDB form gave NaN between -inf and -inf)."""
    from pyspark.sql import functions as F

    inf, nan = float("inf"), float("nan")
    groups = [(-inf, 2.0), (2.0, inf), (-inf, inf), (-inf, -inf), (inf, inf), (1.0, nan),
              (nan, nan), (0.1, 0.7), (-inf, -inf, 3.0, nan), (1.0, 2.0, nan, nan)]  # fmt: skip
    data = [(g, x) for g, values in enumerate(groups) for x in values]
    df = spark.createDataFrame(data, f"g int, x {typ}").repartition(2)
    aggs = ["m=median(x)", "a=percentile(x, 0.25)", "b=percentile(x, 0.9)"]
    ours = es.aggregate(df, ["g"], aggs)
    theirs = df.groupBy("g").agg(
        F.median("x").alias("m"), F.percentile("x", 0.25).alias("a"),
        F.percentile("x", 0.9).alias("b"),
    )  # fmt: skip
    assert ours.schema == theirs.schema
    got, expected = as_dict(ours, ["g"]), as_dict(theirs, ["g"])
    assert str(sorted(got.items())) == str(sorted(expected.items()))


def test_pandas_engine_a_column_of_nulls_in_a_partition(spark):
    """``engine="pandas"``: a boolean (string, date) column null throughout a partition is a
    column of ``None`` objects in pandas, which Arrow typed ``null``: "column 'b' holds only
    nulls (Arrow type null)" failed the job. Each frame's columns get their declared types."""
    from pyspark.sql import functions as F

    data = [(1, None, None, None), (1, None, None, None), (2, True, "x", dt.date(2024, 1, 2))]
    df = spark.createDataFrame(data, "k int, b boolean, s string, d date").repartition(3, "k")
    aggs = {"b": ("b", "min"), "s": ("s", "max"), "d": ("d", "min"), "n": ("b", "count")}
    ours = es.aggregate(df, ["k"], aggs, engine="pandas")
    theirs = df.groupBy("k").agg(
        F.min("b").alias("b"), F.max("s").alias("s"), F.min("d").alias("d"),
        F.count("b").alias("n"),
    )  # fmt: skip
    assert ours.schema == theirs.schema
    assert as_dict(ours, ["k"]) == as_dict(theirs, ["k"])
    by_bool = es.aggregate(df, ["b"], {"n": ("*", "count")}, engine="pandas")
    assert as_dict(by_bool, ["b"]) == {(None,): {"n": 2}, (True,): {"n": 1}}


def test_pandas_engine_global_timestamp_min_as_spark(spark):
    """``engine="pandas"``, no key: the final stage starts from a typed empty batch
    (microseconds, the session's zone), then pandas' frames came as nanoseconds: "column
    '__lo_v' changed type between update() calls". Frames take the declared type."""
    from pyspark.sql import functions as F

    base = dt.datetime(2024, 3, 1, 12, 30, 15, 123456)
    data = [(base + dt.timedelta(hours=i), float(i)) for i in range(40)]
    df = spark.createDataFrame(data, "t timestamp, x double").repartition(3)
    aggs = {"lo": ("t", "min"), "hi": ("t", "max"), "sd": ("x", "std_pop")}
    ours = es.aggregate(df, [], aggs, engine="pandas", num_partitions=3).collect()
    theirs = df.agg(F.min("t").alias("lo"), F.max("t").alias("hi"),
                    F.stddev_pop("x").alias("sd")).collect()  # fmt: skip
    assert ours[0]["lo"] == theirs[0]["lo"] == base
    assert ours[0]["hi"] == theirs[0]["hi"]
    assert math.isclose(ours[0]["sd"], theirs[0]["sd"])

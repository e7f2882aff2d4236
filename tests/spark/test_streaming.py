"""The docs' streaming example: a real query killed by SIGKILL mid-batch and restarted."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from extagg.state import read_change_feed

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "spark_stream.py"


def test_killed_and_restarted_query_state_equals_batch_answer(tmp_path):
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "demo", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert "killed the query in batch 2 (exit -9)" in out
    assert "state equals the batch computation" in out
    # batch 2 ran twice (before the kill, and replayed after it) and wrote version 3 both times
    assert out.count("batch 2 merged into the state") == 2
    feed = list(read_change_feed(str(tmp_path / "state"), 0))
    assert sorted({row[0] for row in feed}) == [0, 1, 2, 3, 4]


def test_a_running_sum_leaving_int64_is_an_overflow_error(tmp_path, spark):
    """A long ``sum`` past int64 across micro-batches went into the state unchecked (Spark:
    ARITHMETIC_OVERFLOW; within one batch extagg raises): the state then could not be
    exported. The batch that overflows fails, uncommitted; a mean's sum has no such limit."""
    from extagg.errors import SumOverflowError
    from extagg.spark import StatefulAggregate
    from extagg.state import Checkpoint

    value = 3 * 2**60  # two of them fit in int64, three do not
    one = spark.createDataFrame([("o", value)], "k string, v long")
    state = str(tmp_path / "state")
    running = StatefulAggregate(["k"], {"s": ("v", "sum"), "m": ("v", "mean")}, state)
    running(one, 0)
    running(one, 1)
    with pytest.raises(SumOverflowError, match=r"aggregate 's'.*leaves int64"):
        running(one, 2)
    assert Checkpoint(state).last_committed_batch() == 1
    assert running.results(one.schema)["o"] == {"s": 2 * value, "m": float(value)}


def test_running_deviation_of_values_with_a_large_mean_is_exact(tmp_path, spark):
    """The state kept ``Σx²``-like moments merged as ``Q − S²/N``: epoch seconds (mean 1.7e9,
    spread of minutes) lost every digit. The moments are merged by Chan's formula now."""
    import random
    import statistics

    from extagg.spark import StatefulAggregate

    rng = random.Random(3)
    batches = [[("k", 1.7e9 + rng.uniform(0, 600)) for _ in range(200)] for _ in range(3)]
    batches.append([("lone", 1.7e9)])  # one value: no sample deviation, a zero population one
    running = StatefulAggregate(
        ["k"], {"sd": ("t", "std"), "vp": ("t", "var_pop")}, str(tmp_path / "state")
    )
    schema = "k string, t double"
    for batch_id, rows in enumerate(batches):
        running(spark.createDataFrame(rows, schema).repartition(2), batch_id)
    values = [t for rows in batches[:3] for _, t in rows]
    got = running.results(spark.createDataFrame(batches[0], schema).schema)
    assert math.isclose(got["k"]["sd"], statistics.stdev(values), rel_tol=1e-9)
    assert math.isclose(got["k"]["vp"], statistics.pvariance(values), rel_tol=1e-9)
    assert got["lone"] == {"sd": None, "vp": 0.0}


def test_a_stream_of_decimals_keeps_them_exact(tmp_path, spark):
    """A stream's decimal columns were aggregated as doubles (the state held no decimals):
    sums of money drifted, and decimal(20, 0) ids past 2^53 merged with their neighbours.
    Keys and sums stay exact now; ``mean`` is Spark's ``avg`` (s + 4 digits, half up), and a
    running sum past its type's digits is Spark's overflow, the batch uncommitted."""
    from decimal import Decimal

    from extagg.errors import SumOverflowError
    from extagg.spark import StatefulAggregate
    from extagg.state import Checkpoint

    schema = "k decimal(20,0), v decimal(10,2)"
    running = StatefulAggregate(
        ["k"], {"s": ("v", "sum"), "m": ("v", "mean"), "hi": ("v", "max")},
        str(tmp_path / "state"),
    )  # fmt: skip
    big = Decimal(2**53 + 1)
    batches = [
        [(big, Decimal("0.10")), (big - 1, Decimal("0.20")), (Decimal(7), Decimal("1.25"))],
        [(big, Decimal("0.20")), (Decimal(7), Decimal("2.50")), (Decimal(7), Decimal("0.01"))],
    ]
    for batch_id, rows in enumerate(batches):
        running(spark.createDataFrame(rows, schema).repartition(2), batch_id)
    got = running.results(spark.createDataFrame(batches[0], schema).schema)
    assert got == {
        big: {"s": Decimal("0.30"), "m": Decimal("0.150000"), "hi": Decimal("0.20")},
        big - 1: {"s": Decimal("0.20"), "m": Decimal("0.200000"), "hi": Decimal("0.20")},
        Decimal(7): {"s": Decimal("3.76"), "m": Decimal("1.253333"), "hi": Decimal("2.50")},
    }
    assert all(type(k) is Decimal for k in got)
    # decimal(38, 0) sums stay decimal(38, 0): 6e37 twice passes 38 digits across batches
    wide = StatefulAggregate(["k"], {"s": ("v", "sum")}, str(tmp_path / "wide"))
    one = spark.createDataFrame([(1, Decimal(6 * 10**37))], "k int, v decimal(38,0)")
    wide(one, 0)
    with pytest.raises(SumOverflowError, match=r"aggregate 's'.*more digits than its decimal"):
        wide(one, 1)
    assert Checkpoint(str(tmp_path / "wide")).last_committed_batch() == 0


def test_a_running_count_distinct_is_refused_at_once(tmp_path):
    """Its state would be the set of values: refused when made, not in batch 0's worker."""
    from extagg.spark import StatefulAggregate

    with pytest.raises(ValueError, match=r"count_distinct \('u'\) has no mergeable state"):
        StatefulAggregate(["k"], {"u": ("x", "nunique")}, str(tmp_path / "state"))


def test_a_running_global_aggregate_keeps_one_state_row(tmp_path, spark):
    """``by=[]`` (a stream's ``df.agg(...)``): one state row, keyed by the empty tuple; a
    batch with no rows leaves it as it is."""
    from extagg.spark import StatefulAggregate

    running = StatefulAggregate([], {"n": ("*", "count"), "s": ("v", "sum")},
                                str(tmp_path / "state"))  # fmt: skip
    batch = spark.createDataFrame([("o", 5), ("p", 7)], "k string, v long")
    running(batch, 0)
    running(batch, 1)
    running(batch.where("v < 0"), 2)
    assert running.results(batch.schema) == {(): {"n": 4, "s": 24}}


def test_a_stream_keyed_by_a_date_keeps_timestamps(tmp_path, spark):
    """A stream grouped by a date column, or keeping the max of a timestamp, failed at its
    first batch ("cannot hash a key of type datetime.date", "the state codec cannot encode
    a value of type datetime.datetime")."""
    import datetime as dt

    from extagg.spark import StatefulAggregate

    schema = "d date, t timestamp, v long"
    running = StatefulAggregate(
        ["d"], {"n": ("*", "count"), "last_t": ("t", "max"), "first_t": ("t", "min")},
        str(tmp_path / "state"),
    )  # fmt: skip
    day, other = dt.date(2024, 1, 2), dt.date(2024, 1, 3)
    batches = [
        [(day, dt.datetime(2024, 1, 2, 10), 1), (other, dt.datetime(2024, 1, 3, 9), 2)],
        [(day, dt.datetime(2024, 1, 2, 23, 59, 59, 5), 3), (day, None, 4)],
    ]
    for batch_id, rows in enumerate(batches):
        running(spark.createDataFrame(rows, schema), batch_id)
    got = running.results(spark.createDataFrame(batches[0], schema).schema)
    assert got == {
        day: {"n": 3, "last_t": dt.datetime(2024, 1, 2, 23, 59, 59, 5),
              "first_t": dt.datetime(2024, 1, 2, 10)},
        other: {"n": 1, "last_t": dt.datetime(2024, 1, 3, 9),
                "first_t": dt.datetime(2024, 1, 3, 9)},
    }  # fmt: skip


def test_a_running_min_keeps_a_nan_beside_a_batch_of_nulls(tmp_path, spark):
    """A group whose min/max is NaN in one batch and null (no value) in the other: the merge
    ordered NaN against None and kept None (Spark: NaN)."""
    from extagg.spark import StatefulAggregate

    schema = "k string, v double"
    for order in ([float("nan")], [None]), ([None], [float("nan")]):
        state = str(tmp_path / ("nan-first" if order[0][0] is not None else "null-first"))
        running = StatefulAggregate(["k"], {"lo": ("v", "min"), "hi": ("v", "max")}, state)
        for batch_id, values in enumerate(order):
            running(spark.createDataFrame([("a", v) for v in values], schema), batch_id)
        got = running.results(spark.createDataFrame([], schema).schema)["a"]
        assert math.isnan(got["lo"]) and math.isnan(got["hi"]), (order, got)


def test_a_running_global_first_and_last_survive_an_empty_batch(tmp_path, spark):
    """A global aggregate's batch with no rows still has its one state row, with null
    first/last: merged, it replaced the running last (and an empty first batch the first)."""
    from extagg.spark import StatefulAggregate

    schema = "k string, v long"
    full = spark.createDataFrame([("a", 1), ("b", 2)], schema)
    empty = full.where("v < 0")
    aggs = {"f": ("v", "first"), "l": ("v", "last"), "n": ("*", "count")}
    for name, batches in {"full-empty": [full, empty], "empty-full": [empty, full]}.items():
        running = StatefulAggregate([], aggs, str(tmp_path / name))
        for batch_id, batch in enumerate(batches):
            running(batch.coalesce(1), batch_id)
        assert running.results(full.schema) == {(): {"f": 1, "l": 2, "n": 2}}, name


def test_a_running_decimal_mean_past_its_type_is_an_overflow_error(tmp_path, spark):
    """``avg`` of a ``decimal(38, 10)`` is a ``decimal(38, 14)``: a mean of 10^26 does not fit
    (Spark: NUMERIC_VALUE_OUT_OF_RANGE); the state's finish returned a 41-digit value."""
    import decimal

    from extagg.errors import SumOverflowError
    from extagg.spark import StatefulAggregate

    batch = spark.createDataFrame([("a", decimal.Decimal(10**26))], "k string, m decimal(38,10)")
    running = StatefulAggregate(["k"], {"am": ("m", "mean")}, str(tmp_path / "state"))
    running(batch, 0)
    with pytest.raises(SumOverflowError, match=r"'am'.*decimal\(38,14\)"):
        running.results(batch.schema)


def test_a_running_interval_mean_rounds_half_up(tmp_path, spark):
    """Spark's ``avg`` of a day-time interval rounds half up (away from zero): 1 µs and 4 µs
    average 3 µs, -1 µs and -4 µs -3 µs; the state's finish divided a ``timedelta``, which
    rounds half to even (2 µs)."""
    import datetime as dt

    from pyspark.sql import functions as F

    from extagg.spark import StatefulAggregate

    def batch(micros):
        rows = spark.createDataFrame([("a", m) for m in micros], "k string, us long")
        return rows.select("k", F.expr("make_dt_interval(0, 0, 0, us / 1000000)").alias("iv"))

    for sign in (1, -1):
        running = StatefulAggregate(["k"], {"m": ("iv", "mean")}, str(tmp_path / f"s{sign}"))
        running(batch([sign * 1]), 0)
        running(batch([sign * 4]), 1)
        got = running.results(batch([1]).schema)["a"]["m"]
        assert got == dt.timedelta(microseconds=sign * 3)


def test_a_batch_older_than_the_last_committed_one_is_refused(tmp_path, spark):
    """Spark replays only its last batch; an older batch id rewrote the state's versions
    under the batches committed after it."""
    from extagg.spark import StatefulAggregate
    from extagg.state import Checkpoint

    batch = spark.createDataFrame([("a", 1)], "k string, v long")
    state = str(tmp_path / "state")
    running = StatefulAggregate(["k"], {"n": ("*", "count")}, state)
    for batch_id in range(3):
        running(batch, batch_id)
    running(batch, 2)  # the last batch replayed: the same version again
    with pytest.raises(RuntimeError, match="has already committed batch 2"):
        running(batch, 0)
    assert Checkpoint(state).last_committed_batch() == 2
    assert running.results(batch.schema) == {"a": {"n": 3}}


def test_timestamps_of_a_fall_back_hour_are_kept_as_instants(tmp_path, spark, monkeypatch):
    """PySpark hands a ``timestamp`` over as a naive local wall time: in a zone's fall-back
    hour 01:10 EST is after 01:30 EDT, and two instants share each wall time. The state
    compared and keyed wall times (max 01:30, one key for two instants); it keeps UTC
    instants now, and gives results back as PySpark does (naive, with ``fold``)."""
    import datetime as dt
    import time

    from pyspark.sql import functions as F

    from extagg.spark import StatefulAggregate
    from extagg.state import read_state

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:

        def batch(*epochs):
            rows = spark.createDataFrame([(1, e) for e in epochs], "k int, e long")
            return rows.select("k", F.col("e").cast("timestamp").alias("t"))

        edt_0130, est_0110, est_0130 = 1730611800, 1730614200, 1730615400
        running = StatefulAggregate(["k"], {"hi": ("t", "max"), "lo": ("t", "min")},
                                    str(tmp_path / "minmax"))  # fmt: skip
        running(batch(edt_0130), 0)
        running(batch(est_0110), 1)
        got = running.results(batch(edt_0130).schema)[1]
        assert got["hi"] == dt.datetime(2024, 11, 3, 1, 10) and got["hi"].fold == 1
        assert got["lo"] == dt.datetime(2024, 11, 3, 1, 30) and got["lo"].fold == 0

        keyed = StatefulAggregate(["t"], {"n": ("*", "count")}, str(tmp_path / "keys"))
        keyed(batch(edt_0130, est_0130).select("t"), 0)
        instants = sorted(row[0] for row in read_state(str(tmp_path / "keys")))
        utc = dt.timezone.utc
        assert instants == [dt.datetime.fromtimestamp(e, utc) for e in (edt_0130, est_0130)]
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
        monkeypatch.delenv("TZ")
        time.tzset()

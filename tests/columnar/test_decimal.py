"""Decimal columns: keys, count/min/max/first/last, exact sum and mean (Spark's types), spills.

Compared with a plain-Python reference on ``decimal.Decimal`` (sums exact, means rounded half
up at scale ``s + 4`` as Spark does).
"""

from __future__ import annotations

import decimal
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg import SumOverflowError, run_metrics
from extagg.columnar import _kernels as K
from extagg.columnar import _reference as R
from extagg.columnar import aggregate
from extagg.columnar import functions as F
from extagg.columnar.columns import to_column
from extagg.errors import ExtaggError
from extagg.spill.blocks import ColumnBlock
from extagg.spill.codecs import COLUMN_CODEC

CTX = decimal.Context(prec=200, rounding=decimal.ROUND_HALF_UP)


def _unscaled(precision: int) -> st.SearchStrategy[int]:
    bound = 10**precision - 1
    return st.one_of(
        st.integers(-bound, bound), st.sampled_from([bound, -bound, 0, 1, -1, 10**precision // 2])
    )


def _reference(keys, values, scale, out_scale):
    groups: dict = {}
    for k, v in zip(keys, values):
        groups.setdefault(k, []).append(v)
    out = {}
    for k, vs in groups.items():
        present = [v for v in vs if v is not None]
        row = {"n": len(vs), "c": len(present), "f": vs[0], "l": vs[-1]}
        if present:
            total = decimal.Decimal(0)
            for v in present:
                total = CTX.add(total, v)
            quantum = decimal.Decimal(1).scaleb(-out_scale)
            row |= {
                "s": total,
                "m": CTX.divide(total, len(present)).quantize(quantum, context=CTX),
                "lo": min(present),
                "hi": max(present),
            }
        else:
            row |= {"s": None, "m": None, "lo": None, "hi": None}
        out[k] = row
    return out


AGGS = {
    "n": ("*", "count"), "c": ("v", "count"), "s": ("v", "sum"), "m": ("v", "mean"),
    "lo": ("v", "min"), "hi": ("v", "max"), "f": ("v", "first"), "l": ("v", "last"),
}  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    precision=st.sampled_from([1, 9, 15, 18]),
    scale_share=st.floats(0, 1),
)
def test_narrow_decimals_match_reference_with_spills(data, precision, scale_share) -> None:
    scale = int(precision * scale_share)
    dtype = pa.decimal128(precision, scale)
    n = data.draw(st.integers(0, 150))
    raw = data.draw(st.lists(st.one_of(st.none(), _unscaled(precision)), min_size=n, max_size=n))
    values = [None if u is None else decimal.Decimal(u).scaleb(-scale, CTX) for u in raw]
    key_pool = [None, decimal.Decimal(0).scaleb(-scale), *values[:3]]
    keys = [data.draw(st.sampled_from(key_pool)) for _ in range(n)]
    table = pa.table({"k": pa.array(keys, dtype), "v": pa.array(values, dtype)})
    want = _reference(keys, values, scale, scale + 4)
    for options in ({}, {"force_spill_rows": 7, "batch_size": 3, "fan_in": 2}):
        batches = table.to_batches(max_chunksize=11)
        got = aggregate(batches or table, keys=["k"], aggs=AGGS, **options)
        assert got.schema.field("k").type == dtype
        assert got.schema.field("s").type == pa.decimal128(precision + 10, scale)
        assert got.schema.field("m").type == pa.decimal128(precision + 4, scale + 4)
        assert got.schema.field("lo").type == dtype
        assert {r["k"]: {k: r[k] for k in AGGS} for r in got.to_pylist()} == want


@settings(max_examples=30, deadline=None)
@given(data=st.data(), precision=st.sampled_from([19, 30, 38]))
def test_wide_decimals_sum_and_mean_exactly(data, precision) -> None:
    scale = data.draw(st.integers(0, precision))
    dtype = pa.decimal128(precision, scale)
    n = data.draw(st.integers(0, 120))
    raw = data.draw(st.lists(st.one_of(st.none(), _unscaled(precision)), min_size=n, max_size=n))
    values = [None if u is None else decimal.Decimal(u).scaleb(-scale, CTX) for u in raw]
    keys = [data.draw(st.integers(0, 3)) for _ in range(n)]
    table = pa.table({"k": pa.array(keys, pa.int8()), "v": pa.array(values, dtype)})
    aggs = AGGS
    out_p, out_s = min(38, precision + 4), min(38, scale + 4)
    want = {
        k: {key: row[key] for key in aggs}
        for k, row in _reference(keys, values, scale, out_s).items()
    }
    for options in ({}, {"force_spill_rows": 5, "batch_size": 2, "fan_in": 2}):
        try:
            got = aggregate(table, keys=["k"], aggs=aggs, **options)
        except SumOverflowError as exc:  # only when a true result has more than 38 digits
            too_big = [
                r
                for r in want.values()
                if r["s"] is not None
                and (abs(r["s"]) >= decimal.Decimal(10) ** (38 - scale) or
                     abs(r["m"]) >= decimal.Decimal(10) ** (out_p - out_s))
            ]  # fmt: skip
            assert too_big, exc
            assert "'v'" in str(exc)
            continue
        assert got.schema.field("s").type == pa.decimal128(min(38, precision + 10), scale)
        assert got.schema.field("m").type == pa.decimal128(out_p, out_s)
        assert {r["k"]: {k: r[k] for k in aggs} for r in got.to_pylist()} == want


def test_sum_overflow_past_38_digits_names_the_column() -> None:
    big = decimal.Decimal(10**38 - 1)
    table = pa.table({"k": [1, 1, 2], "amount": pa.array([big, big, big], pa.decimal128(38, 0))})
    with pytest.raises(SumOverflowError, match=r"'amount'.*38 digits.*group 1") as info:
        aggregate(table, keys="k", aggs={"s": ("amount", "sum")})
    assert isinstance(info.value, ExtaggError) and isinstance(info.value, OverflowError)
    # the same after spills (the 192-bit state crosses run files)
    with pytest.raises(SumOverflowError, match="'amount'"):
        aggregate(table, keys="k", aggs={"s": ("amount", "sum")}, force_spill_rows=1)
    # a sum that comes back below 10**38 is exact
    back = pa.table(
        {
            "k": [1, 1, 1],
            "v": pa.array([big, big, decimal.Decimal(-(10**38 - 1))], pa.decimal128(38, 0)),
        }
    )
    assert aggregate(back, keys="k", aggs={"s": ("v", "sum")}).column("s").to_pylist() == [big]


def test_narrow_sum_overflow_past_result_precision() -> None:
    """decimal(1, 0) sums are decimal(11, 0): a sum of 10**11 overflows (too many rows to
    build, so the finalizer is given the state)."""
    col = to_column("d", pa.array([decimal.Decimal(9)], pa.decimal128(1, 0)))
    spec = F.resolve(F.AggregateRequest("s", "d", "sum"), col)
    states = [np.array([10**11], np.uint64), np.array([0], np.int64), np.array([True])]
    with pytest.raises(SumOverflowError, match="11 digits"):
        F.finalize(spec, states)
    states[0][0] = 10**11 - 1
    assert F.finalize(spec, states).to_pylist() == [decimal.Decimal(10**11 - 1)]


def test_mean_rounds_half_up_away_from_zero() -> None:
    v = [decimal.Decimal(x) for x in ("0.01", "0.00", "0.00", "-0.01", "-0.00", "-0.00")]
    table = pa.table({"k": [1, 1, 1, 2, 2, 2], "v": pa.array(v, pa.decimal128(3, 2))})
    # decimal(3,2) means have scale 6: 0.01 / 3 = 0.0033333..., 2/3 cases below
    got = aggregate(table, keys="k", aggs={"m": ("v", "mean")}).to_pylist()
    assert {r["k"]: r["m"] for r in got} == {
        1: decimal.Decimal("0.003333"),
        2: decimal.Decimal("-0.003333"),
    }
    # ties: a decimal(18, 18) mean has scale 22; 1e-18 * 5 / 4 ... use 1e-22 granularity
    ties = [decimal.Decimal("0.000000000000000005"), 0, 0, 0]  # /4 = 1.25e-18 at scale 22: exact
    table = pa.table({"v": pa.array(ties, pa.decimal128(18, 18))})
    assert aggregate(table, keys=[], aggs={"m": ("v", "mean")}).column("m").to_pylist() == [
        decimal.Decimal("0.0000000000000000012500")
    ]
    # scale s + 4 rounds a third: 2e-6 / 3 = 6.666...e-7 -> 6.667e-7, and -6.667e-7
    thirds = pa.table({"v": pa.array([decimal.Decimal("0.000002"), 0, 0], pa.decimal128(7, 6))})
    negs = pa.table({"v": pa.array([decimal.Decimal("-0.000002"), 0, 0], pa.decimal128(7, 6))})
    assert aggregate(thirds, keys=[], aggs={"m": ("v", "mean")}).column("m").to_pylist() == [
        decimal.Decimal("0.0000006667")
    ]
    assert aggregate(negs, keys=[], aggs={"m": ("v", "mean")}).column("m").to_pylist() == [
        decimal.Decimal("-0.0000006667")
    ]
    # an exact tie rounds away from zero (HALF_UP): 1e-6 over 20000 rows is half a unit of
    # scale 10, so 1e-10 (and -1e-10)
    for sign in (1, -1):
        values = [decimal.Decimal(sign) / 1_000_000] + [decimal.Decimal(0)] * 19_999
        t = pa.table({"v": pa.array(values, pa.decimal128(7, 6))})
        got = aggregate(t, keys=[], aggs={"m": ("v", "mean")}).column("m").to_pylist()
        assert got == [decimal.Decimal(sign) / 10**10]


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_wide_decimal_keys_with_other_keys_and_spills(data) -> None:
    """decimal(38, s) keys take two key words; alone and beside a string and an int key."""
    pool = data.draw(st.lists(st.one_of(st.none(), _unscaled(38)), min_size=1, max_size=6))
    n = data.draw(st.integers(0, 80))
    raw = [data.draw(st.sampled_from(pool)) for _ in range(n)]
    tags = [data.draw(st.sampled_from([None, "a", "bb"])) for _ in range(n)]
    dtype = pa.decimal128(38, 3)
    values = [None if u is None else decimal.Decimal(u).scaleb(-3, CTX) for u in raw]
    table = pa.table(
        {
            "d": pa.array(values, dtype),
            "t": pa.array(tags, pa.string()),
            "i": pa.array(range(n), pa.int64()),
        }
    )
    for keys in (["d"], ["t", "d", "i"], ["d", "t"]):
        want: dict = {}
        for row in table.to_pylist():
            key = tuple(row[k] for k in keys)
            want.setdefault(key, [0, 0])
            want[key][0] += 1
            want[key][1] += row["i"]
        for options in ({}, {"force_spill_rows": 5, "batch_size": 2, "fan_in": 2}):
            aggs = {"n": ("*", "count"), "s": ("i", "sum")}
            got = aggregate(table, keys=keys, aggs=aggs, **options)
            assert got.schema.field("d").type == dtype
            rows = {tuple(r[k] for k in keys): [r["n"], r["s"]] for r in got.to_pylist()}
            assert rows == want


def test_decimal_variance_is_float() -> None:
    table = pa.table({"v": pa.array([decimal.Decimal("1.5"), decimal.Decimal("2.5")],
                                    pa.decimal128(5, 1))})  # fmt: skip
    out = aggregate(table, keys=[], aggs={"sd": ("v", "var"), "w": ("v", "var_pop")})
    assert out.to_pylist() == [{"sd": 0.5, "w": 0.25}]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(_unscaled(38), min_size=2, max_size=40),
    st.sampled_from([(20, 0), (38, 2), (38, 10)]),
)
def test_wide_decimal_variance_equals_the_doubles_of_its_values(values, precision_scale) -> None:
    """Two-word decimals become doubles value by value, as Spark casts them: small negative
    values were 0.0 (``-2**64 + (2**64 - 6)`` in doubles), so std of [400667, -6, -12] was
    231325.2 instead of 231330.4."""
    precision, scale = precision_scale
    limit = 10**precision
    values = [v for v in values if abs(v) < limit] + [400_667, -6, -12]
    decimals = [decimal.Decimal(v).scaleb(-scale, CTX) for v in values]
    table = pa.table({"v": pa.array(decimals, pa.decimal128(precision, scale))})
    out = aggregate(table, keys=[], aggs={"w": ("v", "var_pop")}).to_pylist()[0]["w"]
    doubles = np.array([float(d) for d in decimals])
    want = float(np.var(doubles))
    assert out == pytest.approx(want, rel=1e-9, abs=1e-300)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.one_of(st.none(), _unscaled(38))), max_size=60),
    st.lists(st.integers(0, 1), min_size=4, max_size=4),
)
def test_192_bit_kernels_match_reference(rows, merge_to) -> None:
    gids = np.array([g for g, _ in rows], dtype=np.int64)
    arr = pa.array([v for _, v in rows], pa.decimal128(38, 0))
    words = np.zeros((len(rows), 2), np.int64)
    if len(rows):
        words = np.frombuffer(arr.buffers()[1], np.int64).reshape(-1, 2).copy()
    valid = np.array([v is not None for _, v in rows], dtype=np.bool_)
    fresh = [np.zeros(4, np.uint64), np.zeros(4, np.uint64), np.zeros(4, np.int64),
             np.zeros(4, np.bool_)]  # fmt: skip
    fast = [a.copy() for a in fresh]
    slow = [a.copy() for a in fresh]
    K.sum_dec128(gids, words, valid, *fast)
    R.sum_dec128(gids, words, valid, *slow)
    assert all(np.array_equal(a, b) for a, b in zip(fast, slow))
    out = np.array(merge_to, dtype=np.int64)
    mf = [np.zeros(2, np.uint64), np.zeros(2, np.uint64), np.zeros(2, np.int64)]
    ms = [a.copy() for a in mf]
    K.merge_sum192(out, *fast[:3], *mf)
    R.merge_sum192(out, *slow[:3], *ms)
    assert all(np.array_equal(a, b) for a, b in zip(mf, ms))


def test_wide_columns_round_trip_through_the_column_codec() -> None:
    words = np.arange(12, dtype=np.int64).reshape(6, 2)
    block = ColumnBlock(np.arange(6, dtype=np.uint64), {"v:x": words, "s0": np.ones(6)})
    back = COLUMN_CODEC.decode(COLUMN_CODEC.encode(block))
    assert back.columns["v:x"].shape == (6, 2)
    assert np.array_equal(back.columns["v:x"], words)


def test_uint64_sums_are_exact_decimal38() -> None:
    top = 2**64 - 1
    batch = {"k": np.array([1, 1, 1, 2]), "v": np.array([top, top, top, 5], dtype=np.uint64)}
    out = aggregate(batch, keys="k", aggs={"s": ("v", "sum"), "m": ("v", "mean")})
    assert out.schema.field("s").type == pa.decimal128(38, 0)
    assert {r["k"]: r["s"] for r in out.to_pylist()} == {
        1: decimal.Decimal(3 * top),
        2: decimal.Decimal(5),
    }
    assert out.schema.field("m").type == pa.float64()
    spilled = aggregate(batch, keys="k", aggs={"s": ("v", "sum")}, force_spill_rows=1)
    assert {r["k"]: r["s"] for r in spilled.to_pylist()} == {
        1: decimal.Decimal(3 * top),
        2: decimal.Decimal(5),
    }


def test_tpch_like_lineitem_decimals_in_a_partitioned_run() -> None:
    """decimal(15,2) values and a decimal(38,2) column through a budget that spills and
    partitions (partition files carry the wide words)."""
    code = r"""
import decimal, numpy as np, pyarrow as pa, extagg
rng = np.random.default_rng(5)
n, groups = 600_000, 200_000
k = rng.integers(0, groups, n)
cents = rng.integers(-10**9, 10**9, n)
price = pa.Array.from_buffers(pa.decimal128(15, 2), n, [None, pa.py_buffer(
    np.stack([cents, cents >> 63], axis=1).astype(np.int64))])
wide = price.cast(pa.decimal128(38, 2))
t = pa.table({"k": k, "p": price, "w": wide})
agg = extagg.HashAggregator("k", {"s": ("p", "sum"), "sw": ("w", "sum"), "m": ("p", "mean")},
                            memory="4m")
for b in t.to_batches(max_chunksize=20_000):
    agg.update(b)
assert agg.metrics.spill_count >= 2 and agg._partitions is not None  # it partitioned
out = pa.Table.from_batches(list(agg.results()))
want = np.zeros(groups, np.int64); np.add.at(want, k, cents)
got = {r["k"]: r for r in out.to_pylist()}
assert len(got) == len(np.unique(k))
for g, r in got.items():
    assert r["s"] == decimal.Decimal(int(want[g])).scaleb(-2) == r["sw"], g
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.one_of(st.none(), _unscaled(38))), max_size=60),
    st.lists(st.integers(0, 1), min_size=4, max_size=4),
    st.sampled_from(["min", "max", "first", "last", "first_non_null", "last_non_null"]),
)
def test_wide_decimal_value_kernels_match_reference(rows, merge_to, func) -> None:
    """min/max/first/last of 19-38 digit decimals (two-word states) against the reference."""
    arr = pa.array([v for _, v in rows], pa.decimal128(38, 0))
    col = to_column("v", arr)
    spec = F.resolve(F.AggregateRequest("o", "v", func), col)
    gids = np.array([g for g, _ in rows], dtype=np.int64)

    def fresh(n):
        return [np.full(n, f.fill, dtype=f.dtype) for f in spec.states]

    fast, slow = fresh(4), fresh(4)
    F.update(spec, fast, gids, col, 10, K)
    F.update(spec, slow, gids, col, 10, R)
    assert all(np.array_equal(a, b) for a, b in zip(fast, slow))
    out = np.array(merge_to, dtype=np.int64)
    mf, ms = fresh(2), fresh(2)
    F.merge(spec, mf, out, fast, K)
    F.merge(spec, ms, out, slow, R)
    assert all(np.array_equal(a, b) for a, b in zip(mf, ms))
    assert F.finalize(spec, mf).type == pa.decimal128(38, 0)


def test_a_large_narrow_decimal_column_is_copied_into_arrows_pool() -> None:
    """A scan batch's narrow decimal column becomes its low words, copied into Arrow's memory
    pool (which keeps freed pages for the next batch; the C heap gave them back every time);
    small ones stay on the C heap. The values are the unscaled decimals either way."""
    values = [decimal.Decimal(f"{i % 5000 - 2500}.{i % 100:02d}") for i in range(40_000)]
    arr = pa.array(values, type=pa.decimal128(15, 2)).slice(7)
    before = pa.total_allocated_bytes()
    col = to_column("price", arr)
    expected = [int(v.scaleb(2)) for v in values[7:]]
    assert col.values.dtype == np.int64 and col.values.tolist() == expected
    assert pa.total_allocated_bytes() - before >= col.values.nbytes  # held in Arrow's pool
    del col
    assert pa.total_allocated_bytes() == before
    small = to_column("price", arr.slice(0, 100))
    assert small.values.tolist() == expected[:100]


def test_sum_of_a_decimal256_column_says_decimals_of_up_to_38_digits() -> None:
    """The message said "sum needs numbers" of a decimal (files of decimal(38, 10) and
    decimal(38, 0) unify to decimal256(48, 10))."""
    table = pa.table({"k": [1], "d": pa.array([decimal.Decimal("1.5")], pa.decimal256(48, 10))})
    for func in ("sum", "mean"):
        with pytest.raises(TypeError, match=r"\(48, 10\): \w+ takes decimals of up to 38"):
            aggregate(table, keys="k", aggs={"s": ("d", func)}, memory="8m")


@pytest.mark.skipif(not hasattr(pa, "decimal64"), reason="Arrow's decimal32/64 (pyarrow >= 18)")
@pytest.mark.parametrize("width", ["decimal32", "decimal64", "decimal256"])
@pytest.mark.parametrize("threads", [1, 2])
def test_other_decimal_widths_are_read_as_decimal128(width, threads) -> None:
    """Arrow's decimal32, decimal64 (pyarrow writes them to Parquet and reads them back so) and
    decimal256 of up to 38 digits aggregate as the decimal128 of their precision and scale:
    keys, sums, means, extremes, distinct counts and quantiles, with spills and partitions.
    Their sums went to the generic engine, which refused them ("sum needs numbers"; a
    decimal256(20, 2): "takes decimals of up to 38 digits")."""
    precision, scale = {"decimal32": (9, 2), "decimal64": (15, 2), "decimal256": (30, 3)}[width]
    rng = np.random.default_rng(7)
    n = 60_000
    keys = pa.array(rng.integers(0, 20_000, n)).cast(pa.decimal128(38, 0))
    values = pa.array(rng.integers(-(10**6), 10**6, n)).cast(pa.decimal128(38, scale))
    values = pa.array(values.to_pylist()[:-500] + [None] * 500, pa.decimal128(precision, scale))
    as128 = pa.table({"k": keys.cast(pa.decimal128(9, 0)), "v": values})
    table = pa.table({
        "k": as128["k"].cast(getattr(pa, width)(9, 0)),
        "v": as128["v"].cast(getattr(pa, width)(precision, scale)),
    })  # fmt: skip
    aggs = {"s": ("v", "sum"), "a": ("v", "mean"), "lo": ("v", "min"), "n": ("v", "count"),
            "d": ("v", "count_distinct"), "m": ("v", "median")}  # fmt: skip
    want = aggregate(as128, keys="k", aggs=aggs, threads=1).sort_by("k")
    got = aggregate(table.to_batches(max_chunksize=5_000), keys="k", aggs=aggs, memory="2m",
                    threads=threads).sort_by("k")  # fmt: skip
    assert got.equals(want)
    assert got.schema.field("k").type == pa.decimal128(9, 0)
    assert got.schema.field("s").type == pa.decimal128(min(38, precision + 10), scale)
    assert run_metrics(got).spill_count > 0

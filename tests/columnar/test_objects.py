"""``aggregate()`` routes columns the columnar engine cannot type to the generic engine
(:class:`extagg.columnar.objects.ObjectAggregator`): pandas object columns, nested Arrow
columns; property test against a plain-dict reference with forced spills."""

from __future__ import annotations

import math

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import extagg
from extagg.columnar.objects import ObjectAggregator, untyped_columns
from extagg.memory import UnifiedMemoryManager, task_memory_manager


def test_pandas_object_column_of_python_objects():
    df = pd.DataFrame(
        {
            "k": [(1, "a"), (1, "a"), (2, "b"), None, (2, "b")],  # tuples: no Arrow type
            "v": [1.0, float("nan"), 2.0, 4.0, None],
            "o": [1, "x", 2.5, None, "x"],  # mixed: no Arrow type
        }
    )
    assert [c for c, _ in untyped_columns(df, ["k", "v", "o"])] == ["k", "o"]
    t = extagg.aggregate(
        df, "v", {"n": ("o", "count"), "d": ("o", "count_distinct"), "c": ("*", "count")}
    )
    rows = {("nan" if math.isnan(r["v"]) else r["v"]): r for r in t.to_pylist()}
    assert rows.keys() == {1.0, "nan", 2.0, 4.0}  # pandas made None a NaN: one NaN group
    assert (rows["nan"]["c"], rows["nan"]["n"], rows["nan"]["d"]) == (2, 2, 1)
    assert (rows[1.0]["n"], rows[2.0]["d"], rows[4.0]["n"]) == (1, 1, 0)


def test_pandas_tuple_keys_come_back_as_arrow_lists():
    df = pd.DataFrame({"k": [(1, 2), (1, 2), (3, 4)], "v": [1, 2, 3]})
    t = extagg.aggregate(df, "k", {"s": ("v", "sum"), "m": ("v", "mean")})
    assert sorted((tuple(r["k"]), r["s"], r["m"]) for r in t.to_pylist()) == [
        ((1, 2), 3, 1.5), ((3, 4), 3, 3.0),
    ]  # fmt: skip
    assert t.schema.field("s").type == pa.int64()


def test_mixed_result_column_is_a_clear_error():
    df = pd.DataFrame({"k": [1, "a", 1], "v": [1, 2, 3]})
    with pytest.raises(TypeError, match=r"key column 'k' holds values of types \['int', 'str'\]"):
        extagg.aggregate(df, "k", {"s": ("v", "sum")})
    with pytest.raises(TypeError, match=r"sum\('s'\).*type struct<a: int64>"):
        extagg.aggregate(pa.table({"k": [1], "s": [{"a": 1}]}), "k", {"x": ("s", "sum")})


def test_decimal_and_bool_results_keep_the_columnar_types():
    import decimal

    t = pa.table(
        {
            "k": pa.array([[1], [1], [2]]),
            "d": pa.array(
                [decimal.Decimal("1.10"), decimal.Decimal("2.25"), None], pa.decimal128(10, 2)
            ),
            "b": [True, True, False],
        }
    )
    out = extagg.aggregate(t, "k", {"s": ("d", "sum"), "m": ("d", "mean"), "sb": ("b", "sum")})
    assert out.schema.field("s").type == pa.decimal128(20, 2)
    assert out.schema.field("m").type == pa.decimal128(14, 6)
    rows = {tuple(r["k"]): r for r in out.to_pylist()}
    assert rows[(1,)]["s"] == decimal.Decimal("3.35") and rows[(1,)]["sb"] == 2
    assert rows[(1,)]["m"] == decimal.Decimal("1.675000") and rows[(2,)]["s"] is None


values = st.one_of(st.none(), st.lists(st.integers(0, 3), max_size=2))
pairs = st.lists(st.tuples(st.integers(0, 30), values, st.integers(-5, 5)), max_size=300)


@settings(max_examples=25, deadline=None)
@given(pairs, st.sampled_from([None, 7]))
def test_against_a_dict_reference_with_spills(rows, spill_every):
    mm = UnifiedMemoryManager("8m")
    batches = [
        pa.table(
            {
                "k": pa.array([[k] for k, _, _ in rows[i : i + 50]], pa.list_(pa.int64())),
                "l": pa.array([v for _, v, _ in rows[i : i + 50]], pa.list_(pa.int64())),
                "x": pa.array([x for _, _, x in rows[i : i + 50]], pa.int64()),
            }
        )
        for i in range(0, len(rows), 50)
    ]
    aggs = {
        "n": ("*", "count"), "c": ("l", "count"), "d": ("l", "count_distinct"),
        "f": ("l", "first"), "la": ("l", "last_non_null"), "mx": ("l", "max"),
        "s": ("x", "sum"), "v": ("x", "var_pop"),
    }  # fmt: skip
    with ObjectAggregator("k", aggs, memory_manager=mm, force_spill_rows=spill_every) as agg:
        for b in batches:
            agg.update(b)
        got = {tuple(r["k"]): r for b in agg.results() for r in b.to_pylist()}
    assert task_memory_manager(mm).memory_used == 0
    want: dict = {}
    for k, v, x in rows:
        w = want.setdefault((k,), {"n": 0, "c": 0, "d": set(), "f": ("unset",), "la": None,
                                   "mx": None, "xs": []})  # fmt: skip
        w["n"] += 1
        w["xs"].append(x)
        if w["f"] == ("unset",):
            w["f"] = v
        if v is not None:
            w["c"] += 1
            w["d"].add(tuple(v))
            w["la"] = v
            w["mx"] = v if w["mx"] is None or v > w["mx"] else w["mx"]
    assert got.keys() == want.keys()
    for key, w in want.items():
        g = got[key]
        assert (g["n"], g["c"], g["d"], g["f"], g["la"], g["mx"], g["s"]) == (
            w["n"], w["c"], len(w["d"]), w["f"], w["la"], w["mx"], sum(w["xs"]),
        )  # fmt: skip
        mean = sum(w["xs"]) / len(w["xs"])
        assert g["v"] == pytest.approx(
            sum((x - mean) ** 2 for x in w["xs"]) / len(w["xs"]), abs=1e-9
        )


def test_min_and_max_of_lists_and_structs_with_nulls_inside():
    """Python compared ``[1, None]`` with ``[1, 2]`` and raised ``TypeError`` (exit 1 in the
    command line): a null inside a list or struct orders after every value, element by
    element, as DuckDB orders them."""
    table = pa.table({
        "k": ["a", "a", "a", "b"],
        "st": [{"x": 1, "y": "p"}, {"x": 1, "y": None}, None, {"x": None, "y": "q"}],
        "l": [[1, 2], [1, None], [None], [3]],
    })  # fmt: skip
    aggs = {"mn": ("st", "min"), "mx": ("st", "max"), "lmn": ("l", "min"), "lmx": ("l", "max")}
    got = {r["k"]: r for r in extagg.aggregate(table, "k", aggs, memory="16m").to_pylist()}
    assert got["a"]["mn"] == {"x": 1, "y": "p"} and got["a"]["mx"] == {"x": 1, "y": None}
    assert got["a"]["lmn"] == [1, 2] and got["a"]["lmx"] == [None]
    assert got["b"]["mn"] == got["b"]["mx"] == {"x": None, "y": "q"}


@pytest.mark.parametrize(
    "aggs",
    [{"m": ("l", "max")}, {"m": ("l", "max"), "d": ("l", "count_distinct")}],
    ids=["one map", "with count_distinct"],
)
def test_results_come_in_one_order_whatever_spilled(aggs):
    """Hash order in memory too, as the columnar engine's: output does not depend on the budget
    or the thread count."""
    n = 40
    t = pa.table({"k": [f"u{i}" for i in range(n)], "l": pa.array([[i % 7] for i in range(n)])})
    orders = {
        str(options): extagg.aggregate(t, "k", aggs, memory="64m", **options)
        for options in ({}, {"force_spill_rows": 5}, {"threads": 2})
    }
    first = next(iter(orders.values()))
    assert first["k"].to_pylist() != sorted(first["k"].to_pylist())  # not insertion order
    for table in orders.values():
        assert table.equals(first)


def test_a_pandas_interval_key_groups_by_value_and_keeps_its_type():
    df = pd.DataFrame({"k": pd.interval_range(0, 3).repeat(2), "v": [1, 2, 3, 4, 5, 6]})
    t = extagg.aggregate(df, "k", {"s": ("v", "sum")}, memory="4m")
    got = dict(zip(t.to_pandas()["k"], t["s"].to_pylist()))
    assert got == df.groupby("k", observed=True)["v"].sum().to_dict()
    assert t.schema.field("k").type == pa.Table.from_pandas(df).schema.field("k").type


def test_python_ints_past_64_bits_are_aggregated_or_named():
    df = pd.DataFrame({"k": [1, 1, 2], "v": pd.Series([2**70, 1, None], dtype=object)})
    assert untyped_columns(df, ["v"]) == [("v", None)]
    counts = extagg.aggregate(df, "k", {"c": ("v", "count")}, memory="4m")
    assert sorted(counts.to_pylist(), key=lambda r: r["k"]) == [
        {"k": 1, "c": 2},
        {"k": 2, "c": 0},
    ]
    with pytest.raises(TypeError, match="'s' holds integers past 64 bits"):
        extagg.aggregate(df, "k", {"s": ("v", "sum")}, memory="4m")


def test_size_counts_every_row_as_pandas_does():
    df = pd.DataFrame({"k": ["a", "a", "b"], "v": pd.array([1, None, None], dtype="Int64")})
    t = extagg.aggregate(df, "k", {"sz": ("v", "size"), "c": ("v", "count")}, memory="4m")
    want = df.groupby("k").agg(sz=("v", "size"), c=("v", "count")).reset_index()
    assert sorted(t.to_pylist(), key=lambda r: r["k"]) == want.to_dict("records")


def test_a_key_column_of_mixed_types_is_refused_at_the_batch_that_mixes_them():
    """A pandas object key column of ints and strings (or tuples and strings) was folded,
    and spilled, to the end, and only the result's conversion refused it; the batch that
    mixes them is refused now, also when the mix spans batches. Types one Arrow column
    holds (ints and floats) pass."""
    taken = []

    def frames():
        for keys in ([(1, 2), None, (3,)], [(4,)], ["a", (1, 2)], [(5,)]):
            taken.append(len(keys))
            yield pd.DataFrame({"k": pd.Series(keys, dtype=object), "v": range(len(keys))})

    with pytest.raises(TypeError, match=r"'k' holds values of types \['str', 'tuple'\]"):
        extagg.aggregate(frames(), "k", {"s": ("v", "sum")}, memory="8m")
    assert taken == [3, 1, 2]  # refused at the third batch, not after the last
    got = extagg.aggregate(pd.DataFrame({"k": [1, 2.5, None, 1], "v": [1, 2, 3, 4]},
                                        dtype=object), "k", {"s": ("v", "sum")})  # fmt: skip
    assert dict(zip(*got.to_pydict().values())) == {1.0: 5, 2.5: 2, None: 3}

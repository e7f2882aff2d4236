"""HashAggregator against pandas' groupby on random DataFrames (pandas input path too).

pandas conventions mapped to ours: missing values are ``pd.NA`` in nullable columns (a NaN in
a plain float column is a value for us, see ``test_nan_rule``); ``sum`` uses
``min_count=1`` (an all-null group sums to null); pandas' ``first``/``last`` skip nulls, so
they are compared with ``first_non_null``/``last_non_null``; a missing pandas result (NaN)
equals our null.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extagg.columnar import aggregate
from tests.columnar.reference import values_match

OURS = {
    "sum": ("v", "sum"), "mean": ("v", "mean"), "min": ("v", "min"), "max": ("v", "max"),
    "count": ("v", "count"), "size": ("*", "count"), "var": ("v", "var"), "std": ("v", "std"),
    "first": ("v", "first_non_null"), "last": ("v", "last_non_null"),
    "isum": ("w", "sum"), "imax": ("w", "max"), "imean": ("w", "mean"),
}  # fmt: skip


def _pandas(df: pd.DataFrame, keys: list[str]) -> dict:
    g = df.groupby(keys, dropna=False, sort=False)
    cols = {
        "sum": g["v"].sum(min_count=1), "mean": g["v"].mean(), "min": g["v"].min(),
        "max": g["v"].max(), "count": g["v"].count(), "size": g.size(), "var": g["v"].var(),
        "std": g["v"].std(), "first": g["v"].first(), "last": g["v"].last(),
        "isum": g["w"].sum(min_count=1), "imax": g["w"].max(), "imean": g["w"].mean(),
    }  # fmt: skip
    frame = pd.DataFrame(cols)
    out = {}
    for key, row in frame.iterrows():
        key = key if isinstance(key, tuple) else (key,)
        out[tuple(_none(k) for k in key)] = {c: _none(row[c]) for c in cols}
    return out


def _none(x):
    if x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x)):
        return None
    return x.item() if isinstance(x, np.generic) else x


@pytest.mark.parametrize("spill", [False, True])
@given(data=st.data())
def test_matches_pandas_groupby(spill, data, tmp_path) -> None:
    n = data.draw(st.integers(0, 120))
    users = data.draw(st.lists(st.one_of(st.none(), st.integers(-3, 3)), min_size=n, max_size=n))
    days = data.draw(
        st.lists(st.one_of(st.none(), st.sampled_from(["mon", "tue", ""])), min_size=n, max_size=n)
    )
    values = data.draw(st.lists(st.one_of(st.none(), st.floats(-1e3, 1e3)), min_size=n, max_size=n))
    ints = data.draw(st.lists(st.one_of(st.none(), st.integers(-1000, 1000)), min_size=n,
                              max_size=n))  # fmt: skip
    df = pd.DataFrame(
        {
            "user": pd.array(users, dtype="Int64"),
            "day": pd.Series(days, dtype="string"),
            "v": pd.array(values, dtype="Float64"),
            "w": pd.array(ints, dtype="Int64"),
        }
    )
    options = {"force_spill_rows": 9, "batch_size": 4, "fan_in": 2} if spill else {}
    out = aggregate(df, keys=["user", "day"], aggs=OURS, memory="32m",
                    spill_dirs=[str(tmp_path)], **options)  # fmt: skip
    ours = {(r["user"], r["day"]): r for r in out.to_pylist()}
    theirs = _pandas(df, ["user", "day"]) if n else {}
    assert set(ours) == set(theirs)
    for key, want in theirs.items():
        for name, value in want.items():
            assert values_match(ours[key][name], value, rel=1e-9), (key, name, ours[key], value)


NAN_AGGS = {"n": ("*", "count"), "c": ("v", "count"), "s": ("v", "sum"), "hi": ("v", "max")}


def _nan_rule_result(batch) -> dict:
    out = aggregate(batch, keys=["k"], aggs=NAN_AGGS).to_pylist()
    return {
        ("nan" if isinstance(r["k"], float) and math.isnan(r["k"]) else r["k"]): {
            name: ("nan" if isinstance(v, float) and math.isnan(v) else v)
            for name, v in r.items()
            if name != "k"
        }
        for r in out
    }


def test_nan_rule_is_the_same_for_every_container() -> None:
    """NaN is a value (counted, sums to NaN, one key group; -0.0 == 0.0); null is null."""
    keys = [1.0, math.nan, -0.0, 0.0, math.nan, 1.0, None]
    values = [math.nan, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    want = {
        1.0: {"n": 2, "c": 2, "s": "nan", "hi": "nan"},
        "nan": {"n": 2, "c": 2, "s": 5.0, "hi": 4.0},
        0.0: {"n": 2, "c": 2, "s": 5.0, "hi": 3.0},
        None: {"n": 1, "c": 1, "s": 6.0, "hi": 6.0},
    }
    key_mask = np.array([k is None for k in keys])
    plain_keys = np.array([0.0 if k is None else k for k in keys])
    containers = {
        "numpy": {"k": np.ma.masked_array(plain_keys, key_mask), "v": np.array(values)},
        "arrow": pa.table({"k": pa.array(plain_keys, mask=key_mask), "v": pa.array(values)}),
        "pandas arrow-backed": pd.DataFrame(
            {
                "k": pd.Series(
                    pa.array(plain_keys, mask=key_mask), dtype=pd.ArrowDtype(pa.float64())
                ),
                "v": np.array(values),
            }
        ),
    }
    for name, batch in containers.items():
        assert _nan_rule_result(batch) == want, name
    # plain float64 pandas columns (no nulls possible): NaN keys and values are values
    plain = pd.DataFrame({"k": plain_keys[:-1], "v": np.array(values[:-1])})
    assert _nan_rule_result(plain) == {k: v for k, v in want.items() if k is not None}
    # a plain float64 pandas column: NaN stays a value (not pandas' convention: documented)
    frame = pd.DataFrame({"k": np.array([1.0, 1.0, 2.0]), "v": np.array([math.nan, 1.0, 2.0])})
    got = _nan_rule_result(frame)
    assert got[1.0] == {"n": 2, "c": 2, "s": "nan", "hi": "nan"}
    # pd.NA / None are nulls in nullable and object columns
    nullable = pd.DataFrame({"k": [1, 1], "v": pd.array([pd.NA, 2.5], dtype="Float64")})
    assert _nan_rule_result(nullable) == {1: {"n": 2, "c": 1, "s": 2.5, "hi": 2.5}}
    obj = pd.DataFrame({"k": [1, 1], "v": pd.Series([None, "x"], dtype=object)})
    out = aggregate(obj, keys=["k"], aggs={"c": ("v", "count")}).to_pylist()
    assert out == [{"k": 1, "c": 1}]


def test_only_the_query_columns_of_a_frame_or_dict_are_converted() -> None:
    """A DataFrame (or a dict of columns) is converted column by column, and only the columns
    the query reads: one that Arrow cannot hold (mixed Python objects) did fail every query."""
    frame = pd.DataFrame(
        {
            "k": ["a", "b", "a", None],
            "v": pd.array([1, None, 3, 4], dtype="Int64"),
            "span": pd.to_timedelta([1, 2, 3, 4], unit="s"),
            "junk": [1, "x", 2.5, None],  # no one Arrow type holds these
        }
    )
    got = aggregate(
        frame, "k", {"s": ("v", "sum"), "t": ("span", "sum"), "n": ("*", "count")}, memory="8m"
    )
    assert sorted(zip(*got.to_pydict().values()), key=repr) == sorted(
        [("a", 4, pd.Timedelta(seconds=4), 2), ("b", None, pd.Timedelta(seconds=2), 1),
         (None, 4, pd.Timedelta(seconds=4), 1)], key=repr,
    )  # fmt: skip
    # no column read at all: the rows still count
    assert aggregate(frame, [], {"n": ("*", "count")}, memory="8m").to_pydict() == {"n": [4]}
    rows = {"k": [1, 1, 2], "junk": [object(), 1, "x"]}
    assert aggregate(rows, [], {"n": ("*", "count")}, memory="8m").to_pydict() == {"n": [3]}
    assert sorted(aggregate(rows, "k", {"n": ("*", "count")}, memory="8m").to_pylist(),
                  key=repr) == [{"k": 1, "n": 2}, {"k": 2, "n": 1}]  # fmt: skip
    # a column the batch lacks is named with every column it has, converted or not
    with pytest.raises(
        ValueError, match=r"'nope' is not in the batch.*\['k', 'v', 'span', 'junk'\]"
    ):
        aggregate(frame, "k", {"s": ("nope", "sum")}, memory="8m")
    with pytest.raises(ValueError, match=r"'junk' has 2 rows but the batch's first column has 3"):
        aggregate({"k": [1, 1, 2], "junk": [1, "x"]}, "k", {"n": ("*", "count")}, memory="8m")


def test_polars_frames_and_other_arrow_streams_are_read_batch_by_batch() -> None:
    """An object that exports Arrow data by the PyCapsule interface (``__arrow_c_stream__``:
    a Polars ``DataFrame``, a DuckDB relation) is read as a stream of record batches: its
    view types (Polars' strings are ``string_view``), nested columns through the generic
    engine, a spilling run, ``HashAggregator.update`` too."""
    import polars as pl

    from extagg import HashAggregator, run_metrics

    frame = pl.DataFrame(
        {"k": ["a", "b", "a", None], "v": [1, 2, 3, 4], "f": [1.5, None, 2.0, 1.0],
         "tags": [[1], [2], [1], []]}
    )  # fmt: skip
    got = aggregate(
        frame, "k", {"s": ("v", "sum"), "m": ("f", "mean"), "u": ("tags", "count_distinct")},
        memory="8m",
    )  # fmt: skip
    assert sorted(got.to_pylist(), key=repr) == sorted(
        [{"k": "a", "s": 4, "m": 1.75, "u": 1}, {"k": "b", "s": 2, "m": None, "u": 1},
         {"k": None, "s": 4, "m": 1.0, "u": 1}], key=repr,
    )  # fmt: skip
    nested = aggregate(frame, "tags", {"s": ("v", "sum")}, memory="8m")
    assert sorted(nested.to_pylist(), key=repr) == sorted(
        [{"tags": [1], "s": 4}, {"tags": [2], "s": 2}, {"tags": [], "s": 4}], key=repr
    )
    rows = 600_000
    big = pl.DataFrame({"k": np.arange(rows) % 150_000, "v": np.ones(rows, dtype=np.int64)})
    table = aggregate(big, "k", {"s": ("v", "sum")}, memory="4m")
    assert table.num_rows == 150_000 and set(table.column("s").to_pylist()) == {4}
    assert run_metrics(table).spill_count > 0
    with HashAggregator("k", {"s": ("v", "sum")}, memory="8m") as agg:
        agg.update(frame.select("k", "v"))
        out = pa.Table.from_batches(list(agg.results()))
    assert sorted(out.to_pylist(), key=repr) == sorted(
        [{"k": "a", "s": 4}, {"k": "b", "s": 2}, {"k": None, "s": 4}], key=repr
    )
    with (
        pytest.raises(TypeError, match="__arrow_c_stream__"),
        HashAggregator("k", {"s": ("v", "sum")}, memory="8m") as agg,
    ):
        agg.update(object())


def test_big_endian_numpy_and_pandas_columns_are_read_as_native() -> None:
    # Arrow reads native byte order only ("Byte-swapped arrays not supported", no column)
    keys = np.array([3, 1, 3, 2, 1, 3], dtype=">i8")
    values = np.array([0.5, 1.0, 2.0, 4.0, 8.0, 16.0], dtype=">f8")
    want = {1: 9.0, 2: 4.0, 3: 18.5}
    for batch in (
        {"k": keys, "v": values},
        pd.DataFrame({"k": keys, "v": values}),
        pd.DataFrame({"k": keys.astype(">u4"), "v": values.astype(">f4")}),
    ):
        got = aggregate(batch, keys="k", aggs={"s": ("v", "sum")}).to_pydict()
        assert dict(zip(got["k"], got["s"])) == want


def test_lazy_frames_scanners_and_empty_readers() -> None:
    """A Polars ``LazyFrame`` streams through its engine, a ``pyarrow.dataset.Scanner`` is read
    as its reader, and a reader with no batches still gives the result its types."""
    import polars as pl
    import pyarrow.dataset as ds

    lazy = pl.DataFrame({"k": [1, 2, 1, None], "v": [1.5, 2.0, 3.0, 4.0]}).lazy()
    got = aggregate(lazy.filter(pl.col("v") > 1.6), "k", {"s": ("v", "sum")}, memory="4m")
    assert sorted(got.to_pylist(), key=repr) == sorted(
        [{"k": 1, "s": 3.0}, {"k": 2, "s": 2.0}, {"k": None, "s": 4.0}], key=repr
    )
    empty = aggregate(lazy.filter(pl.col("v") > 9), "k", {"s": ("v", "sum")}, memory="4m")
    assert empty.num_rows == 0 and empty.schema.types == [pa.int64(), pa.float64()]
    table = pa.table({"k": [1, 1, 2], "v": [1, 2, 3]})
    scanned = aggregate(ds.dataset(table).scanner(), "k", {"s": ("v", "sum")}, memory="4m")
    assert sorted(scanned.to_pylist(), key=repr) == [{"k": 1, "s": 3}, {"k": 2, "s": 3}]
    reader = pa.RecordBatchReader.from_batches(table.schema, [])
    none = aggregate(reader, "k", {"n": ("*", "count"), "s": ("v", "sum")}, memory="4m")
    assert none.num_rows == 0 and none.schema.types == [pa.int64(), pa.int64(), pa.int64()]


def test_frames_and_dicts_a_query_cannot_read_are_named() -> None:
    twice = pd.DataFrame([[1, 2, 3]], columns=["k", "v", "v"])
    with pytest.raises(ValueError, match="2 columns named 'v'"):
        aggregate(twice, "k", {"s": ("v", "sum")}, memory="4m")
    with pytest.raises(TypeError, match="column 'v' must be an array"):
        aggregate({"k": np.array([1, 2]), "v": 5}, "k", {"s": ("v", "sum")}, memory="4m")


def test_file_only_options_are_named_by_aggregate() -> None:
    table = pa.table({"k": [1], "v": [2]})
    for name in ("sort", "where", "having"):
        with pytest.raises(TypeError, match=f"aggregate\\(\\) takes no {name}="):
            aggregate(table, "k", {"s": ("v", "sum")}, **{name: True})

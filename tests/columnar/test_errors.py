"""Wrong input fails clearly: the error names the column, the type or the function."""

from __future__ import annotations

import decimal
import math
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from extagg import SumOverflowError
from extagg.columnar import HashAggregator, aggregate

AGG = {"n": ("*", "count")}


def test_unknown_aggregate_function() -> None:
    with pytest.raises(ValueError, match=r"unknown aggregate function 'mode' for 'm'"):
        HashAggregator("k", {"m": ("v", "mode")}, memory="8m")


def test_star_only_for_count() -> None:
    with pytest.raises(ValueError, match=r"only count accepts '\*'"):
        HashAggregator("k", {"s": ("*", "sum")}, memory="8m")


@pytest.mark.parametrize("spec", [("v",), ("v", "sum", 1), (1, "sum")])
def test_malformed_aggregate_spec(spec) -> None:
    with pytest.raises(TypeError, match="'s'"):
        HashAggregator("k", {"s": spec}, memory="8m")


def test_aggregates_by_name_may_be_texts_or_pandas_function_names() -> None:
    """``{"n": "count(*)"}`` and pandas' ``{"v": "sum"}`` were refused as malformed pairs."""
    table = pa.table({"k": [1, 2, 1], "v": [1.0, 2.0, 3.0]})
    aggs = {"v": "sum", "n": "count(*)", "top": 'max("v")', "c": ("v", "count")}
    got = aggregate(table, keys="k", aggs=aggs, memory="8m").sort_by("k").to_pydict()
    assert got == {"k": [1, 2], "v": [4.0, 2.0], "n": [2, 1], "top": [3.0, 2.0], "c": [2, 1]}
    with HashAggregator("k", {"n": "count(*)"}, memory="8m") as aggregator:
        aggregator.update(table)
        result = pa.Table.from_batches(list(aggregator.results()))
    assert result.sort_by("k").to_pydict() == {"k": [1, 2], "n": [2, 1]}
    listed = aggregate(table, keys="k", aggs={"v": ["sum", "mean"]}, memory="8m").sort_by("k")
    assert listed.to_pydict() == {"k": [1, 2], "sum_v": [4.0, 2.0], "mean_v": [2.0, 2.0]}
    for bad in ("sum(v", "a=sum(v)"):
        with pytest.raises(ValueError, match=rf"aggregate 'v': '{re.escape(bad)}'"):
            aggregate(table, keys="k", aggs={"v": bad}, memory="8m")


def test_output_name_clashes_with_key() -> None:
    with pytest.raises(ValueError, match=r"\['k'\]"):
        HashAggregator("k", {"k": ("*", "count")}, memory="8m")


def test_missing_column_is_named() -> None:
    with (
        HashAggregator("user", {"s": ("amount", "sum")}, memory="8m") as agg,
        pytest.raises(ValueError, match=r"column 'amount' is not in the batch"),
    ):
        agg.update({"user": np.arange(3), "amt": np.ones(3)})


def test_unsupported_key_type_names_column_and_type() -> None:
    batch = pa.table({"k": pa.array([[1], [2]]), "v": pa.array([1, 2])})
    with (
        HashAggregator("k", AGG, memory="8m") as agg,
        pytest.raises(TypeError, match=r"column 'k' has unsupported type list<item: int64>"),
    ):
        agg.update(batch)
    # aggregate() routes such columns to the generic engine (tests/columnar/test_objects.py)
    assert aggregate(batch, keys="k", aggs=AGG, memory="8m").num_rows == 2


def test_sum_of_strings_names_column_and_type() -> None:
    batch = pa.table({"k": [1, 2], "name": ["a", "b"]})
    with pytest.raises(TypeError, match=r"sum\('name'\).*column 'name' of type string"):
        aggregate(batch, keys="k", aggs={"s": ("name", "sum")}, memory="8m")
    with pytest.raises(TypeError, match=r"var\('name'\).*string"):
        aggregate(batch, keys="k", aggs={"s": ("name", "var")}, memory="8m")
    ts = pa.table({"k": [1], "t": pa.array([1], pa.timestamp("s"))})
    with pytest.raises(TypeError, match=r"mean\('t'\).*timestamp\[s\]"):
        aggregate(ts, keys="k", aggs={"m": ("t", "mean")}, memory="8m")


def test_number_columns_that_change_type_between_updates_are_cast_where_they_fit() -> None:
    """Chunked reads give ``int32`` then ``int64``, or ``int64`` then ``double`` for a chunk
    with a null: each was refused ("changed type between update() calls"), where DuckDB and
    Spark widen. A batch is cast to the first one's types where every value fits; a value
    that does not (a fraction for an integer column, an overflow) is still refused."""
    with HashAggregator("k", {"s": ("v", "sum")}, memory="8m") as agg:
        agg.update({"k": np.arange(3, dtype=np.int64), "v": np.ones(3)})
        agg.update({"k": np.arange(3, dtype=np.int32), "v": np.ones(3)})
        agg.update({"k": np.arange(3, dtype=np.int64), "v": np.arange(3)})
        agg.update(pa.table({"k": [2, None], "v": pa.array([1.5, None], pa.float32())}))
        with pytest.raises(TypeError, match=r"column 'k' changed type.*int64.*double"):
            agg.update({"k": np.array([0.5]), "v": np.ones(1)})
        with pytest.raises(TypeError, match=r"column 'k' changed type.*int64.*uint64"):
            agg.update({"k": np.array([2**63], dtype=np.uint64), "v": np.ones(1)})
        got = pa.Table.from_batches(list(agg.results())).to_pydict()
    assert dict(zip(got["k"], got["s"])) == {0: 2.0, 1: 3.0, 2: 5.5, None: None}
    with HashAggregator("k", {"s": ("v", "sum")}, memory="8m") as agg:
        agg.update({"k": np.arange(3), "v": np.arange(3)})
        with pytest.raises(TypeError, match=r"column 'v' changed type.*int64.*double.*1\.5"):
            agg.update({"k": np.arange(1), "v": np.array([1.5])})


@pytest.mark.parametrize("value", [0.1, 1e300, 16777217.0])
def test_a_double_batch_after_float32_is_cast_only_where_every_value_is_kept(value) -> None:
    """Arrow's float64 → float32 cast does not check: 0.1 was summed as 0.10000000149, 1e300
    as inf, and two double keys merged into one float32 key, all silently."""
    first = pa.table({"k": pa.array([1.0], pa.float32()), "v": pa.array([1.0], pa.float32())})
    with HashAggregator("k", {"s": ("v", "sum")}, memory="8m") as agg:
        agg.update(first)
        agg.update(pa.table({"k": [1.0, 2.5, None], "v": [0.5, None, float("nan")]}))
        for column in ("k", "v"):
            batch = {"k": [1.0], "v": [1.0]} | {column: [value]}
            with pytest.raises(TypeError, match=rf"column '{column}' changed type.*float.*double"):
                agg.update(pa.table(batch))
        got = pa.Table.from_batches(list(agg.results())).to_pydict()
    sums = dict(zip(got["k"], got["s"]))
    assert sums.keys() == {1.0, 2.5, None} and sums[1.0] == 1.5 and sums[2.5] is None
    assert math.isnan(sums[None])


def test_string_and_large_string_batches_mix() -> None:
    with HashAggregator("k", AGG, memory="8m") as agg:
        agg.update(pa.table({"k": pa.array(["a", "b"], pa.string())}))
        agg.update(pa.table({"k": pa.array(["a"], pa.large_string())}))
        out = pa.Table.from_batches(list(agg.results()))
    assert out.schema.field("k").type == pa.string()
    assert sorted(out.to_pylist(), key=lambda r: r["k"]) == [
        {"k": "a", "n": 2},
        {"k": "b", "n": 1},
    ]


def test_integer_sum_overflow_is_reported_with_the_group() -> None:
    batch = {"k": np.array([7, 7, 8]), "v": np.array([2**62, 2**62, 1], dtype=np.int64)}
    with pytest.raises(OverflowError, match=r"sum of column 'v'.*9223372036854775808.*group 7"):
        aggregate(batch, keys="k", aggs={"s": ("v", "sum")}, memory="8m")
    with pytest.raises(SumOverflowError, match="group 7"):  # the extagg error class
        aggregate(batch, keys="k", aggs={"s": ("v", "sum")}, memory="8m")
    # uint64 sums are decimal128(38, 0): 2**64 is no overflow
    unsigned = {"k": np.array([1, 1]), "v": np.array([2**63, 2**63], dtype=np.uint64)}
    out = aggregate(unsigned, keys="k", aggs={"s": ("v", "sum")}, memory="8m")
    assert out.column("s").to_pylist() == [decimal.Decimal(2**64)]


def test_not_a_batch() -> None:
    with (
        HashAggregator("k", AGG, memory="8m") as agg,
        pytest.raises(TypeError, match="a batch must be"),
    ):
        agg.update([1, 2, 3])


def test_columns_of_different_lengths() -> None:
    with (
        HashAggregator("k", AGG, memory="8m") as agg,
        pytest.raises(ValueError, match=r"column 'v' has 2 rows"),
    ):
        agg.update({"k": np.arange(3), "v": np.arange(2)})


def test_update_after_results_and_results_twice() -> None:
    agg = HashAggregator("k", AGG, memory="8m")
    agg.update({"k": np.arange(3)})
    list(agg.results())
    with pytest.raises(RuntimeError, match="update"):
        agg.update({"k": np.arange(3)})
    with pytest.raises(RuntimeError, match="only once"):
        agg.results()


def test_all_null_column_needs_a_type_first_but_not_later() -> None:
    with HashAggregator("k", AGG, memory="8m") as agg:
        with pytest.raises(TypeError, match=r"column 'k' holds only nulls"):
            agg.update(pd.DataFrame({"k": [None, None]}))
        agg.update(pd.DataFrame({"k": ["a", None]}))
        agg.update(pd.DataFrame({"k": [None, None]}))  # null-typed chunk: takes the known type
        rows = pa.Table.from_batches(list(agg.results())).to_pylist()
    assert sorted(rows, key=lambda r: str(r["k"])) == [{"k": None, "n": 3}, {"k": "a", "n": 1}]


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="fan_in"):
        HashAggregator("k", AGG, memory="8m", fan_in=1)
    with pytest.raises(ValueError, match="batch_size"):
        HashAggregator("k", AGG, memory="8m", batch_size=0)
    with pytest.raises(ValueError, match=r"unknown spill compression 'zstd'.*\['lz4', 'none'\]"):
        HashAggregator("k", AGG, memory="8m", compression="zstd")  # before any spill
    with pytest.raises(ValueError, match="force_spill_rows"):
        HashAggregator("k", AGG, memory="8m", force_spill_rows=0)
    with pytest.raises(ValueError, match="chunk_rows must be positive, got 0"):
        HashAggregator("k", AGG, memory="8m", chunk_rows=0)
    with pytest.raises(ValueError, match="memory"):
        HashAggregator("k", AGG, memory="lots")
    with pytest.raises(ValueError, match="distinct"):
        HashAggregator(["k", "k"], AGG, memory="8m")


@pytest.mark.parametrize("source", [None, 42])
def test_a_source_that_is_no_table_nor_iterable_is_named(source):
    """``aggregate(None, ...)`` was Python's bare "'NoneType' object is not iterable"."""
    import extagg

    with pytest.raises(TypeError, match=r"aggregate\(\)'s source must be .* not builtins\."):
        extagg.aggregate(source, "k", {"n": ("*", "count")})


@pytest.mark.parametrize("keys", [None, 5, ["k", 1], b"k"])
def test_keys_that_are_not_column_names_say_so(keys) -> None:
    """``keys=None`` raised "'NoneType' object is not iterable"."""
    with pytest.raises(TypeError, match="keys must be a column name or a list of them"):
        aggregate(pa.table({"k": [1], "v": [1]}), keys=keys, aggs={"s": ("v", "sum")})


@pytest.mark.parametrize("aggs", [["n=count(*)", "t=sum(v)"], "n=count(*)", {"n": "count(*)"}])
def test_no_input_gives_the_asked_columns(aggs) -> None:
    """With no batch at all the result's columns were the raw ``aggs``: ``'n=count(*)'`` as
    a column name, or a text split into one column per character."""
    got = aggregate(iter([]), keys=["k"], aggs=aggs, memory="8m")
    names = ["k", "n", "t"] if isinstance(aggs, list) else ["k", "n"]
    assert got.column_names == names and got.num_rows == 0
    assert got.schema.field("n").type == pa.int64()


@pytest.mark.parametrize(
    "aggs",
    [["n=count(*)", "t=sum(v)"], "t=sum(v)", {"n": "count(*)", "t": "sum(v)"}, {"v": ["sum"]}],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_hash_aggregator_takes_every_form_of_aggs_that_aggregate_does(aggs, threads) -> None:
    """The ``--agg`` texts (a list, or one text) and pandas' ``{column: [functions]}`` failed
    in ``HashAggregator`` with "dictionary update sequence element #0 has length 10", though
    the docs give them for it as for ``aggregate``; the results are ``aggregate``'s."""
    table = pa.table({"k": [1, 2, 1, 3] * 5000, "v": [1.0, 2.0, 3.0, 4.0] * 5000})
    want = aggregate(table, "k", aggs).sort_by("k")
    with HashAggregator("k", aggs, memory="8m", threads=threads, force_spill_rows=3000) as agg:
        agg.update(table)
        got = pa.Table.from_batches(list(agg.results())).sort_by("k")
        assert agg.metrics.spill_count > 0
    assert got.equals(want) and got.num_rows == 3

"""Global aggregates (``keys=[]``): exactly one row, also of empty input, spilled or not."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg.columnar import HashAggregator, aggregate
from tests.columnar.reference import assert_same_groups, reference_groupby, result_dict

AGGS = {
    "n": ("*", "count"), "c": ("x", "count"), "s": ("x", "sum"), "lo": ("x", "min"),
    "hi": ("x", "max"), "avg": ("x", "mean"), "f": ("x", "first"), "l": ("x", "last"),
    "sd": ("x", "std"),
}  # fmt: skip


def test_no_keys_terminates_in_a_fresh_process() -> None:
    """keys=[] used to spin at 100 % CPU forever: guarded by a subprocess timeout."""
    code = (
        "import numpy as np, extagg\n"
        "t = extagg.aggregate({'x': np.arange(100000)}, keys=[], "
        "aggs={'s': ('x', 'sum'), 'n': ('*', 'count')}, force_spill_rows=7000)\n"
        "print(t.to_pylist())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip() == str([{"s": 4999950000, "n": 100000}])


def test_empty_input_gives_one_row_with_sql_values() -> None:
    empty = pa.table({"x": pa.array([], pa.int32())})
    got = aggregate(empty, keys=[], aggs=AGGS).to_pylist()
    assert got == [dict.fromkeys(AGGS, None) | {"n": 0, "c": 0}]
    schema = aggregate(empty, keys=[], aggs=AGGS).schema
    assert schema.field("s").type == pa.int64() and schema.field("lo").type == pa.int32()


def test_no_batches_at_all_gives_one_row() -> None:
    got = aggregate([], keys=[], aggs={"n": ("*", "count"), "s": ("x", "sum")})
    assert got.num_rows == 1
    assert got.column("n").to_pylist() == [0] and got.column("s").to_pylist() == [None]


def test_all_null_values_give_null_sum_and_zero_count() -> None:
    batch = {"x": np.ma.masked_all(5, dtype=np.int64)}
    assert aggregate(batch, keys=[], aggs={"s": ("x", "sum"), "c": ("x", "count")}).to_pylist() == [
        {"s": None, "c": 0}
    ]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.integers(-(2**40), 2**40)), max_size=300),
    st.integers(1, 50),
)
def test_global_matches_reference_with_spills(values: list[int | None], every: int) -> None:
    arr = pa.array(values, pa.int64())
    batches = [pa.record_batch([arr.slice(i, 37)], names=["x"]) for i in range(0, len(values), 37)]
    want = reference_groupby({"x": values}, [], AGGS)
    if not values:
        want = {(): {"n": 0, "c": 0} | {k: None for k in AGGS if k not in ("n", "c")}}
    for options in ({}, {"force_spill_rows": every, "batch_size": 2, "fan_in": 2}):
        with HashAggregator([], AGGS, **options) as agg:
            for b in batches:
                agg.update(b)
            out = list(agg.results())
        table = pa.Table.from_batches(out) if out else aggregate([], keys=[], aggs=AGGS)
        assert table.num_rows == 1
        assert_same_groups(result_dict(table, []), want)


def test_any_value_is_the_first_value_that_is_not_null():
    """DuckDB's ``any_value``: ``first_non_null``'s values, spilled or not."""
    import pyarrow as pa

    import extagg

    keys = [i % 50 for i in range(2000)]
    values = [None if i < 120 or i % 3 else f"v{i}" for i in range(2000)]
    table = pa.table({"k": keys, "v": values})
    for memory in (None, "1m"):
        got = extagg.aggregate(
            table, "k", {"a": ("v", "any_value"), "f": ("v", "first_non_null")}, memory=memory
        )
        rows = got.to_pylist()
        assert all(r["a"] == r["f"] for r in rows)
        want = {}
        for k, v in zip(keys, values, strict=True):
            if v is not None:
                want.setdefault(k, v)
        assert {r["k"]: r["a"] for r in rows} == want

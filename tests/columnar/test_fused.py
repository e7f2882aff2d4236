"""The fused update of several aggregates (interleaved state rows) against the one-aggregate
kernels and the plain-Python reference, bit for bit."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg.collection.typed_table import TypedHashTable
from extagg.columnar import _kernels as K
from extagg.columnar import _reference as R
from extagg.columnar import functions as F
from extagg.columnar.columns import to_column

FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, -0.0, 0.0, 1e308, -1e308, 1e-300]),
)
INTS = st.integers(-(2**63), 2**63 - 1)
# (function, column): every family fused_update takes, and some it leaves to update()
AGGS = [
    ("count", "*"), ("sum", "f"), ("mean", "f"), ("min", "f"), ("max", "f"), ("count", "f"),
    ("sum", "i"), ("mean", "i"), ("min", "i"), ("max", "i"), ("var", "f"), ("first", "i"),
    ("min", "n"), ("sum", "n"), ("count", "s"), ("max", "s32"),
]  # fmt: skip


def _table_states(specs, groups):
    payload = [(f.dtype, f.fill) for spec in specs for f in spec.states]
    table = TypedHashTable(1, 1, False, payload, capacity=1 << (max(groups, 2) * 2).bit_length())
    states, i = [], 0
    for spec in specs:
        states.append(table.payload[i : i + len(spec.states)])
        i += len(spec.states)
    return table, states


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    aggs=st.lists(st.sampled_from(AGGS), min_size=1, max_size=6),
    rows=st.integers(0, 60),
    groups=st.integers(1, 8),
    chunks=st.integers(1, 3),
)
def test_fused_update_matches_one_aggregate_kernels_and_reference(
    data, aggs, rows, groups, chunks
) -> None:
    f = data.draw(st.lists(FLOATS, min_size=rows, max_size=rows))
    i = data.draw(st.lists(INTS, min_size=rows, max_size=rows))
    n = data.draw(st.lists(st.one_of(st.none(), INTS), min_size=rows, max_size=rows))
    s = data.draw(st.lists(st.text(max_size=3), min_size=rows, max_size=rows))
    s32 = data.draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=rows, max_size=rows))
    gids = np.array(data.draw(st.lists(st.integers(0, groups - 1), min_size=rows, max_size=rows)))
    cols = {
        "f": to_column("f", pa.array(f, pa.float64())),
        "i": to_column("i", pa.array(i, pa.int64())),
        "n": to_column("n", pa.array(n, pa.int64())),
        "s": to_column("s", pa.array(s, pa.string())),
        "s32": to_column("s32", pa.array(s32, pa.int32())),
    }
    requests = F.parse_aggs({f"a{j}": (c, fn) for j, (fn, c) in enumerate(aggs)})
    specs = [F.resolve(r, None if r.column is None else cols[r.column]) for r in requests]
    results = []
    for how in ("fused", "reference", "one by one"):
        table, states = _table_states(specs, groups)
        cut = np.linspace(0, rows, chunks + 1).astype(int)
        for lo, hi in itertools.pairwise(cut.tolist()):
            columns = [None if sp.column is None else cols[sp.column].slice(lo, hi) for sp in specs]
            g = gids[lo:hi].astype(np.int64)
            if how == "one by one":
                for spec, st_, col in zip(specs, states, columns):
                    F.update(spec, st_, g, col, lo)
            else:
                kernels = K if how == "fused" else R
                F.update_all(specs, states, g, columns, lo, table.rows, kernels)
        results.append(table.rows[:groups].copy())
    for name in results[0].dtype.names:
        a, b, c = (r[name] for r in results)
        if a.dtype.kind == "f":  # bit for bit, except which NaN (the hardware picks one)
            nan = np.isnan(a)
            assert np.array_equal(nan, np.isnan(b)) and np.array_equal(nan, np.isnan(c))
            a, b, c = (x.view(np.uint64)[~nan] for x in (a, b, c))
        assert np.array_equal(a, b) and np.array_equal(a, c), name


def test_fused_ops_cover_the_common_functions_only() -> None:
    cols = {
        "f": to_column("f", pa.array([1.0, 2.0])),
        "i": to_column("i", pa.array([1, None], pa.int64())),
    }
    aggs = {"a": ("*", "count"), "b": ("f", "sum"), "c": ("f", "var"), "d": ("i", "sum")}
    specs = [F.resolve(r, None if r.column is None else cols[r.column]) for r in F.parse_aggs(aggs)]
    table, states = _table_states(specs, 2)
    plan = F.fused_ops(specs, states, [None, cols["f"], cols["f"], cols["i"]], table.rows)
    assert plan is not None
    ops, floats, ints, fused = plan
    assert fused == {0, 1}  # var is not fused; a column with nulls neither
    assert [int(o[0]) for o in ops] == [K.FUSED_COUNT, K.FUSED_SUM_FLOAT]
    assert len(floats) == 1 and floats[0] is cols["f"].values and len(ints) == 1
    fields = table.row_dtype.fields
    n_at, s_at, c_at, has_at = (fields[f"p{i}"][1] for i in range(4))
    assert ops.tolist() == [
        [K.FUSED_COUNT, 0, n_at, 0, -1],
        [K.FUSED_SUM_FLOAT, 0, s_at, c_at, has_at],
    ]
    # states that are not fields of the rows are never fused
    loose = [[np.zeros(2, dtype=f.dtype) for f in spec.states] for spec in specs]
    assert F.fused_ops(specs, loose, [None, cols["f"], cols["f"], cols["i"]], table.rows) is None


INT_OPS = [("count", "*"), ("sum", "i"), ("mean", "i"), ("min", "i"), ("max", "i"),
           ("count", "i"), ("sum", "d"), ("max", "d")]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    aggs=st.lists(st.sampled_from(INT_OPS), min_size=1, max_size=7),
    rows=st.integers(0, 300),
    groups=st.integers(1, 9),
    chunks=st.integers(1, 3),
)
def test_fused_update_few_matches_fused_update_and_reference(data, aggs, rows, groups, chunks):
    """The few-groups kernel (column at a time into per-group partials) leaves the state rows
    bit for bit as the row-at-a-time kernel and the reference do, chunk after chunk (groups
    absent from a chunk untouched, ``has`` flags and minima set on first sight)."""
    from decimal import Decimal

    i = data.draw(st.lists(INTS, min_size=rows, max_size=rows))
    d = data.draw(st.lists(st.integers(-(10**17), 10**17), min_size=rows, max_size=rows))
    gids = np.array(
        data.draw(st.lists(st.integers(0, groups - 1), min_size=rows, max_size=rows)), np.int64
    )
    cols = {
        "i": to_column("i", pa.array(i, pa.int64())),
        "d": to_column("d", pa.array([Decimal(v).scaleb(-2) for v in d], pa.decimal128(18, 2))),
    }
    requests = F.parse_aggs({f"a{j}": (c, fn) for j, (fn, c) in enumerate(aggs)})
    specs = [F.resolve(r, None if r.column is None else cols[r.column]) for r in requests]
    results = []
    for kernel in (K.fused_update_few, K.fused_update, R.fused_update_few):
        table, states = _table_states(specs, groups)
        cut = np.linspace(0, rows, chunks + 1).astype(int)
        for lo, hi in itertools.pairwise(cut.tolist()):
            columns = [None if sp.column is None else cols[sp.column].slice(lo, hi) for sp in specs]
            plan = F.fused_ops(specs, states, columns, table.rows)
            assert plan is not None
            ops, fcols, icols, fused = plan
            assert fused == set(range(len(specs)))  # every one of these is fused
            rows_u8 = table.rows.view(np.uint8)
            g = gids[lo:hi]
            if kernel is K.fused_update:
                kernel(g, fcols, icols, ops, rows_u8, table.rows.dtype.itemsize)
            else:
                kernel(g, groups, fcols, icols, ops, rows_u8, table.rows.dtype.itemsize)
        results.append(table.rows[:groups].copy())
    for name in results[0].dtype.names:
        a, b, c = (r[name] for r in results)
        assert np.array_equal(a, b) and np.array_equal(a, c), name


def test_update_all_takes_the_few_groups_kernel_only_when_it_applies(monkeypatch) -> None:
    """Integer operations, group ids below FEW_GROUPS, chunks of FEW_GROUPS_MIN_ROWS rows or
    more: the few-groups kernel; floats, many groups or short chunks: the row kernel."""
    calls: list[str] = []
    real_few, real_row = K.fused_update_few, K.fused_update
    monkeypatch.setattr(K, "fused_update_few", lambda *a: (calls.append("few"), real_few(*a)))
    monkeypatch.setattr(K, "fused_update", lambda *a: (calls.append("row"), real_row(*a)))
    n = F.FEW_GROUPS_MIN_ROWS
    cols = {
        "i": to_column("i", pa.array(np.arange(n, dtype=np.int64))),
        "f": to_column("f", pa.array(np.ones(n))),
    }
    for aggs, top, rows, want in [
        ({"a": ("i", "sum"), "n": ("*", "count")}, 3, n, "few"),
        ({"a": ("i", "sum")}, K.FEW_GROUPS, n, "row"),
        ({"a": ("i", "sum")}, 3, n - 1, "row"),
        ({"a": ("f", "sum")}, 3, n, "row"),
    ]:
        specs = [F.resolve(r, None if r.column is None else cols[r.column])
                 for r in F.parse_aggs(aggs)]  # fmt: skip
        table, states = _table_states(specs, top + 1)
        gids = np.arange(rows, dtype=np.int64) % (top + 1)
        columns = [None if sp.column is None else cols[sp.column].slice(0, rows) for sp in specs]
        calls.clear()
        F.update_all(specs, states, gids, columns, 0, table.rows)
        assert calls == [want], (aggs, top, rows)


def test_a_table_of_many_groups_takes_the_row_kernel_without_reading_the_group_ids(
    monkeypatch,
) -> None:
    """``groups`` (the table's groups) above FEW_GROUPS: the row kernel, the group ids not
    scanned for their maximum (~5 % of a fold); the states are the same either way."""
    calls: list[str] = []
    real_few, real_row = K.fused_update_few, K.fused_update
    monkeypatch.setattr(K, "fused_update_few", lambda *a: (calls.append("few"), real_few(*a)))
    monkeypatch.setattr(K, "fused_update", lambda *a: (calls.append("row"), real_row(*a)))
    n = F.FEW_GROUPS_MIN_ROWS
    cols = {"i": to_column("i", pa.array(np.arange(n, dtype=np.int64)))}
    specs = [F.resolve(r, cols["i"]) for r in F.parse_aggs({"a": ("i", "sum"), "m": ("i", "max")})]
    gids = np.arange(n, dtype=np.int64) % 3  # this chunk: the first 3 groups only
    results = []
    for groups, want in [(None, "few"), (3, "few"), (K.FEW_GROUPS + 1, "row")]:
        table, states = _table_states(specs, K.FEW_GROUPS + 1)
        calls.clear()
        F.update_all(specs, states, gids, [cols["i"], cols["i"]], 0, table.rows, groups=groups)
        assert calls == [want], groups
        results.append(table.rows.copy())
    assert all(np.array_equal(r, results[0]) for r in results)
    assert F._few_groups(gids, np.array([[K.FUSED_SUM_INT]]), K.FEW_GROUPS + 1) == 0
    assert F._few_groups(gids, np.array([[K.FUSED_SUM_INT]])) == 3


def test_fused_plans_are_remembered_for_the_same_views_and_column_kinds() -> None:
    """A chunk after chunk of the same table and column kinds reuses the plan (the same ops
    table, this chunk's columns); new state views (a grown table), a column that now has nulls,
    two aggregates now on different columns each get their own plan."""
    cols = {
        "f": to_column("f", pa.array([1.0, 2.0])),
        "g": to_column("g", pa.array([3.0, 4.0])),
        "i": to_column("i", pa.array([1, 2], pa.int64())),
    }
    aggs = {"a": ("*", "count"), "b": ("f", "sum"), "c": ("f", "max"), "d": ("i", "sum")}
    specs = [F.resolve(r, None if r.column is None else cols[r.column]) for r in F.parse_aggs(aggs)]
    table, states = _table_states(specs, 2)
    columns = [None, cols["f"], cols["f"], cols["i"]]
    first = F.fused_ops(specs, states, columns, table.rows)
    again = F.fused_ops(specs, states, [None, cols["f"], cols["f"], cols["i"]], table.rows)
    assert first is not None and again is not None and again[0] is first[0]
    other = to_column("f", pa.array([5.0, 6.0]))  # the next chunk's column, same kind
    nxt = F.fused_ops(specs, states, [None, other, other, cols["i"]], table.rows)
    assert nxt is not None and nxt[0] is first[0] and nxt[1][0] is other.values
    assert len(nxt[1]) == 1 and nxt[3] == {0, 1, 2, 3}
    # two aggregates on two columns: two float columns, another plan
    split = F.fused_ops(specs, states, [None, cols["f"], cols["g"], cols["i"]], table.rows)
    assert split is not None and split[0] is not first[0]
    assert [c is v for c, v in zip(split[1], (cols["f"].values, cols["g"].values))] == [True] * 2
    assert split[0][:, 1].tolist() == [0, 0, 1, 0]
    # a column with nulls in this chunk: not fused, another plan
    nulls = to_column("i", pa.array([1, None], pa.int64()))
    some = F.fused_ops(specs, states, [None, cols["f"], cols["f"], nulls], table.rows)
    assert some is not None and some[3] == {0, 1, 2}
    # a grown table: new views, a plan for them (the offsets are the same)
    grown, grown_states = _table_states(specs, 40)
    after = F.fused_ops(specs, grown_states, columns, grown.rows)
    assert after is not None and after[0] is not first[0]
    assert after[0].tolist() == first[0].tolist()


def test_read_only_and_writable_columns_fuse_together() -> None:
    """A read-only column (an Arrow buffer) beside a writable one (computed in NumPy): their
    tuple was not one numba type, and ``fused_update`` failed to compile (``TypingError``), as
    it did under ``extagg.spark.aggregate(engine="pandas")`` for a mean of a long column."""
    n = 64
    gids = np.arange(n, dtype=np.int64) % 4
    aggs = {"sa": ("a", "sum"), "sb": ("b", "sum"), "mb": ("b", "max")}
    results = []
    for read_only in (False, True):
        cols = {
            "a": to_column("a", pa.array(np.arange(n, dtype=np.float64))),
            "b": to_column("b", pa.array(np.arange(n, dtype=np.float64) * 2)),
        }
        cols["a"].values = cols["a"].values.copy()
        cols["b"].values = cols["b"].values.copy()
        cols["a"].values.flags.writeable = not read_only
        specs = [F.resolve(r, cols[r.column]) for r in F.parse_aggs(aggs)]
        table, states = _table_states(specs, 4)
        F.update_all(specs, states, gids, [cols[sp.column] for sp in specs], 0, table.rows)
        assert cols["b"].values.flags.writeable  # the caller's arrays are left as they were
        results.append(table.rows[:4].copy())
    assert results[0].tobytes() == results[1].tobytes()
    assert results[0].tobytes() != np.zeros_like(results[0]).tobytes()

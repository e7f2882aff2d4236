"""min/max/first/last of string and binary columns: states in a byte arena of the table,
spilled as var columns, merged by comparing bytes (Spark's binary order) or row numbers."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg import aggregate
from extagg.columnar import HashAggregator
from extagg.columnar import _kernels as K
from extagg.columnar import _reference as R
from extagg.spill.blocks import ColumnBlock
from extagg.spill.codecs import COLUMN_CODEC
from tests.conftest import files_under

FUNCS = ("min", "max", "first", "last", "first_non_null", "last_non_null")
AGGS = {f: ("v", f) for f in FUNCS} | {"n": ("v", "count")}


def _reference(keys, values, funcs=FUNCS):
    """Plain-Python GROUP BY: min/max by bytes (str compares by code point, the order of their
    UTF-8 bytes), first/last by row, nulls skipped except by first/last."""
    groups: dict = {}
    for k, v in zip(keys, values):
        groups.setdefault(k, []).append(v)
    out = {}
    for k, vs in groups.items():
        present = [v for v in vs if v is not None]
        row = {
            "min": min(present) if present else None,
            "max": max(present) if present else None,
            "first": vs[0],
            "last": vs[-1],
            "first_non_null": present[0] if present else None,
            "last_non_null": present[-1] if present else None,
            "n": len(present),
        }
        out[k] = {f: row[f] for f in (*funcs, "n")}
    return out


def _result(table: pa.Table, key: str = "k") -> dict:
    rows = table.to_pylist()
    return {r.pop(key): r for r in rows}


def _run(keys, values, arrow_type, memory="256m", batch=None, **options) -> pa.Table:
    table = pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array(values, arrow_type)})
    batches = table.to_batches(max_chunksize=batch) if batch else [table]
    return aggregate(batches, keys=["k"], aggs=AGGS, memory=memory, **options)


texts = st.one_of(
    st.none(),
    st.just(""),
    st.text(max_size=6),
    st.text(alphabet="ab\u00e9\u20ac\U0001f600\x00", max_size=4),
)
binaries = st.one_of(st.none(), st.just(b""), st.binary(max_size=6))


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_strings_match_reference_with_spills(data) -> None:
    n = data.draw(st.integers(0, 60))
    keys = data.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    values = data.draw(st.lists(texts, min_size=n, max_size=n))
    arrow_type = data.draw(st.sampled_from([pa.string(), pa.large_string()]))
    want = _reference(keys, values)
    for options in ({}, {"force_spill_rows": 3, "batch_size": 2, "fan_in": 2, "batch": 5}):
        got = _run(keys, values, arrow_type, **options)
        assert n == 0 or got.schema.field("min").type == arrow_type
        assert _result(got) == want, options


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_binaries_match_reference_with_spills(data) -> None:
    n = data.draw(st.integers(0, 60))
    keys = data.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    values = data.draw(st.lists(binaries, min_size=n, max_size=n))
    arrow_type = data.draw(st.sampled_from([pa.binary(), pa.large_binary()]))
    want = _reference(keys, values)
    for options in ({}, {"force_spill_rows": 4, "batch_size": 3, "fan_in": 2, "batch": 7}):
        got = _run(keys, values, arrow_type, **options)
        assert n == 0 or got.schema.field("max").type == arrow_type
        assert _result(got) == want, options


def test_bytes_order_is_unsigned_and_non_ascii() -> None:
    values = [b"\x7f", b"\x80", b"", b"\xff\x00", b"\xff"]
    got = _result(_run([0] * 5, values, pa.binary(), force_spill_rows=1, batch_size=1))
    assert got[0]["min"] == b"" and got[0]["max"] == b"\xff\x00"
    words = ["zebra", "\u00e9t\u00e9", "Zoo", "\U0001f600", "\u20ac"]
    got = _result(_run([0] * 5, words, pa.string(), force_spill_rows=2))
    assert got[0]["min"] == "Zoo" and got[0]["max"] == "\U0001f600"


def test_all_null_groups_and_dictionary_input() -> None:
    values = pa.array(["x", None, "b", None, "a", "x"]).dictionary_encode()
    table = pa.table({"k": [1, 2, 1, 2, 3, 3], "v": values})
    got = _result(aggregate(table, keys=["k"], aggs=AGGS, force_spill_rows=2))
    assert got[2] == {f: None for f in FUNCS} | {"n": 0}
    assert got[1]["min"] == "b" and got[1]["last"] == "b" and got[3]["max"] == "x"
    assert aggregate(table, keys=["k"], aggs=AGGS).schema.field("min").type == pa.string()


def test_long_values_under_a_tiny_budget_spill_and_merge(spill_dir) -> None:
    """Values up to 120 KiB (over 64 KiB), growing and shrinking, through an 8 MiB budget: many
    spills, and a merge whose read buffers hold one group's four long values per run."""
    rng = np.random.default_rng(3)
    n = 600
    keys = rng.integers(0, 40, n).tolist()
    sizes = rng.integers(0, 120_000, n)
    sizes[::7] = 0
    values = [bytes(rng.integers(97, 100, s, dtype=np.uint8)) for s in sizes]
    values = [None if i % 11 == 0 else v for i, v in enumerate(values)]
    table = pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array(values, pa.large_binary())})
    funcs = ("min", "max", "first", "last")
    aggs = {f: ("v", f) for f in funcs} | {"n": ("v", "count")}
    with HashAggregator(["k"], aggs, memory="8m", spill_dirs=[str(spill_dir)], fan_in=2) as agg:
        for b in table.to_batches(max_chunksize=16):
            agg.update(b)
            assert agg.used <= agg.budget.max_memory
        spills = agg.metrics.spill_count
        got = pa.Table.from_batches(list(agg.results()), schema=agg.schema)
    assert spills >= 5
    assert _result(got) == _reference(keys, values, funcs)
    assert files_under(spill_dir) == []


def test_arena_is_accounted_and_cleared_on_spill() -> None:
    # the one-thread table's arena (threads keep one per thread partition's child)
    agg = HashAggregator(["k"], {"m": ("v", "max")}, memory="64m", threads=1)
    big = "x" * 100_000
    agg.update(pa.table({"k": list(range(50)), "v": [big + str(i) for i in range(50)]}))
    arena = agg.table_state.var_arena
    assert arena is not None and arena.used >= 50 * 100_000
    assert agg.used >= agg.table_state.table.nbytes + arena.nbytes
    agg.force_spill(agg)
    assert agg.table_state.var_arena is None  # all given back
    agg.update(pa.table({"k": [1], "v": ["y"]}))
    got = _result(pa.Table.from_batches(list(agg.results())))
    assert got[1]["m"] == "y" and got[2]["m"] == big + "2"


def test_first_last_ordering_across_spills() -> None:
    # the same key in every chunk: first/last are decided by the global row number
    n = 1000
    keys = [i % 3 for i in range(n)]
    values = [None if i % 5 == 4 else f"r{i:04d}" for i in range(n)]
    for options in ({"force_spill_rows": 7}, {"force_spill_rows": 1, "fan_in": 2}):
        got = _result(_run(keys, values, pa.string(), batch=13, **options))
        assert got == _reference(keys, values), options
        assert got[1]["last"] == "r0997" and got[1]["first"] == "r0001"


def test_min_max_strings_are_partitioned_exactly(spill_dir, caplog) -> None:
    rng = np.random.default_rng(5)
    n = 200_000
    k = rng.integers(0, 100_000, n)
    words = np.array(["", "a", "\u00e9", "zz", "b" * 30, "\u20ac"], dtype=object)
    v = words[rng.integers(0, len(words), n)].tolist()
    v = [None if i % 17 == 0 else s for i, s in enumerate(v)]
    table = pa.table({"k": k, "v": pa.array(v, pa.string())})
    aggs = {"min": ("v", "min"), "max": ("v", "max"), "n": ("v", "count")}
    agg = HashAggregator(["k"], aggs, memory="2m", spill_dirs=[str(spill_dir)])
    with caplog.at_level(logging.INFO, logger="extagg.columnar"), agg:
        for b in table.to_batches(max_chunksize=20_000):
            agg.update(b)
        partitioned = agg._partitions is not None
        got = pa.Table.from_batches(list(agg.results()), schema=agg.schema)
    assert partitioned and "hash partitions" in caplog.text
    assert _result(got) == _reference(k.tolist(), v, ("min", "max"))
    assert files_under(spill_dir) == []


def test_beside_count_distinct() -> None:
    keys = [1, 1, 2, 2, 2, 3]
    values = ["b", "a", None, "c", "c", None]
    table = pa.table({"k": keys, "v": values})
    aggs = {"lo": ("v", "min"), "l": ("v", "last"), "d": ("v", "count_distinct")}
    got = _result(aggregate(table, keys=["k"], aggs=aggs, memory="64m", force_spill_rows=2))
    assert got == {
        1: {"lo": "a", "l": "a", "d": 2},
        2: {"lo": "c", "l": "c", "d": 1},
        3: {"lo": None, "l": None, "d": 0},
    }


def test_global_aggregate_of_strings() -> None:
    table = pa.table({"v": ["q", None, "b"]})
    got = aggregate(table, keys=[], aggs={"m": ("v", "min"), "f": ("v", "first")}).to_pylist()
    assert got == [{"m": "b", "f": "q"}]
    empty = aggregate(table.slice(0, 0), keys=[], aggs={"m": ("v", "min")}).to_pylist()
    assert empty == [{"m": None}]


def test_var_state_block_round_trips_through_the_codec() -> None:
    block = ColumnBlock(
        np.arange(3, dtype=np.uint64),
        {"s2": np.array([True, False, True])},
        {"s0": (np.array([0, 2, 2, 5], np.int64), np.frombuffer(b"ab\xc3\xa9x", np.uint8))},
    )
    back = COLUMN_CODEC.decode(COLUMN_CODEC.encode(block))
    assert back.var_columns["s0"][1].tobytes() == b"ab\xc3\xa9x"
    assert back.var_columns["s0"][0].tolist() == [0, 2, 2, 5]


def _var_column(values):
    data = b"".join(v or b"" for v in values)
    offsets = np.zeros(len(values) + 1, np.int64)
    offsets[1:] = np.cumsum([len(v or b"") for v in values])
    valid = np.array([v is not None for v in values])
    return offsets, np.frombuffer(data, np.uint8).copy(), valid


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 4), binaries), max_size=40),
    chunks=st.integers(1, 4),
    func=st.sampled_from(FUNCS),
)
def test_var_kernels_match_reference(rows, chunks, func) -> None:
    """Update in chunks, gather, then merge the gathered partials: kernels == references."""
    outs = []
    for mod in (K, R):
        groups = 5
        arena = np.zeros(2 + 2 * sum(len(v or b"") for _, v in rows), np.uint8)
        ref = np.zeros(groups, np.int64)
        ln = np.full(groups, -1, np.int64)
        extra = (
            [np.zeros(groups, np.bool_)]
            if func in ("min", "max")
            else [np.full(groups, -1, np.int64), np.zeros(groups, np.bool_)]
        )
        used = 0
        step = max(1, len(rows) // chunks)
        for start in range(0, len(rows), step):
            part = rows[start : start + step]
            gids = np.array([g for g, _ in part], np.int64)
            offsets, data, valid = _var_column([v for _, v in part])
            if func in ("min", "max"):
                used = mod.minmax_var_update(
                    gids, offsets, data, valid, func == "max", arena, used, ref, ln, *extra
                )
            else:
                used = mod.seq_var_update(
                    gids, offsets, data, valid, start, func.endswith("non_null"),
                    func.startswith("last"), arena, used, ref, ln, *extra,
                )  # fmt: skip
        off, data = mod.gather_arena(arena, ref, ln, np.arange(groups, dtype=np.int64))
        # merge the groups' partial rows into 2 output groups
        out_gid = np.arange(groups, dtype=np.int64) % 2
        win = np.full(2, -1, np.int64)
        if func in ("min", "max"):
            mod.merge_minmax_var(out_gid, func == "max", off, data, extra[0], win)
            merged = []
        else:
            dseq, dnull = np.full(2, -1, np.int64), np.zeros(2, np.bool_)
            mod.merge_seq_var(out_gid, func.startswith("last"), *extra, win, dseq, dnull)
            merged = [dseq.tolist(), dnull.tolist()]
        moff, mdata = mod.gather_var_rows(off, data, win)
        outs.append(
            (off.tolist(), data.tobytes(), [e.tolist() for e in extra], win.tolist(),
             merged, moff.tolist(), mdata.tobytes())
        )  # fmt: skip
    assert outs[0] == outs[1]


def test_unsupported_string_function_names_the_column() -> None:
    table = pa.table({"k": [1], "v": ["a"]})
    with pytest.raises(TypeError, match=r"sum.*'v'.*string"):
        aggregate(table, keys=["k"], aggs={"s": ("v", "sum")})


def test_string_keys_and_string_states_share_a_small_budget(spill_dir) -> None:
    """The key arena and the state arena grow side by side under 2 MiB: many spills."""
    rng = np.random.default_rng(11)
    n = 60_000
    keys = [f"key-{i}" * int(1 + i % 5) for i in rng.integers(0, 5_000, n)]
    values = [None if i % 13 == 0 else "v" * int(s) for i, s in enumerate(rng.integers(0, 90, n))]
    table = pa.table({"k": keys, "v": values})
    with HashAggregator(["k"], AGGS, memory="2m", spill_dirs=[str(spill_dir)]) as agg:
        for b in table.to_batches(max_chunksize=4_000):
            agg.update(b)
        spills = agg.metrics.spill_count
        got = pa.Table.from_batches(list(agg.results()), schema=agg.schema)
    assert spills >= 3
    assert _result(got) == _reference(keys, values)
    assert files_under(spill_dir) == []

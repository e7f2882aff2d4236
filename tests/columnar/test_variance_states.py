"""``var_state``: a variance's moments as one mergeable value, for two-stage aggregation."""

from __future__ import annotations

import statistics

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import extagg
from extagg.columnar import HashAggregator, _reference
from extagg.columnar import functions as F
from extagg.columnar.columns import to_column


def _two_stage(keys, values, parts: int, memory: str = "2m", spill: int | None = 7):
    """Stage one per part (``var_state`` of the values), stage two over all the partial rows
    (``var_state`` of the states), both with spills forced; ``{key: (n, m2)}``."""
    partial = []
    for idx in np.array_split(np.arange(len(keys)), parts):
        with HashAggregator("k", {"m": ("v", F.VAR_STATE)}, memory=memory,
                            force_spill_rows=spill) as agg:  # fmt: skip
            agg.update(pa.record_batch({"k": keys[idx], "v": values[idx]}))
            partial += list(agg.results())
    table = pa.Table.from_batches(partial)
    with HashAggregator("k", {"m": ("m", F.VAR_STATE)}, memory=memory,
                        force_spill_rows=spill) as agg:  # fmt: skip
        for batch in table.to_batches(max_chunksize=5):
            agg.update(batch)
        merged = pa.Table.from_batches(list(agg.results())).combine_chunks()
    states = merged.column("m").chunk(0)
    column = to_column("m", states)
    valid = np.ones(len(states), np.bool_) if column.valid is None else column.valid
    rows, n, _mean, m2 = F.unpack_var_states(column, valid)
    keys_out = merged.column("k").to_pylist()
    out = {k: (0, 0.0) for k in keys_out}
    for r, nn, q in zip(np.flatnonzero(valid) if rows is None else rows, n, m2, strict=True):
        out[keys_out[r]] = (int(nn), float(q))
    return out, merged


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.floats(-1e3, 1e3, allow_nan=False)),
        min_size=1,
        max_size=120,
    ),
    st.integers(1, 6),
    st.sampled_from([0.0, 1e6, -3e9]),
)
def test_two_stages_equal_the_variance_of_all_values(pairs, parts, shift):
    keys = np.array([k for k, _ in pairs], dtype=np.int64)
    values = np.array([v for _, v in pairs]) + shift
    got, merged = _two_stage(keys, values, parts)
    for key in set(keys.tolist()):
        group = values[keys == key]
        n, m2 = got[key]
        assert n == len(group)
        expected = float(np.sum((group - group.mean()) ** 2))
        # the values carry ulps of the shift: a relative error ~1e-6 of a spread of ~1e3
        assert m2 == pytest.approx(expected, rel=1e-6, abs=1e-6)
    sd = F.finish_var_states(merged.column("m").chunk(0), "std").to_pylist()
    for key, value in zip(merged.column("k").to_pylist(), sd, strict=True):
        group = values[keys == key].tolist()
        if len(group) < 2:
            assert value is None
        elif shift == 0.0:
            assert value == pytest.approx(statistics.stdev(group), rel=1e-9, abs=1e-9)


def test_a_large_mean_keeps_the_spread_exact():
    """Epoch seconds: mean 1.7e9, spread of minutes (sums of squares lose every digit)."""
    rng = np.random.default_rng(4)
    keys = rng.integers(0, 3, 30_000)
    values = 1.7e9 + rng.uniform(0, 600, 30_000)
    got, _ = _two_stage(keys, values, parts=9, memory="4m", spill=1000)
    for key in range(3):
        group = values[keys == key]
        n, m2 = got[key]
        expected = float(np.sum((group - 1.7e9 - (group - 1.7e9).mean()) ** 2))
        assert n == len(group) and m2 == pytest.approx(expected, rel=1e-9)


def test_states_of_nulls_are_null_and_merged_as_nothing():
    batch = pa.record_batch(
        {"k": pa.array([1, 1, 2, 3, 3]), "v": pa.array([1.0, 3.0, None, 5.0, 7.0])}
    )
    with HashAggregator("k", {"m": ("v", F.VAR_STATE)}) as agg:
        agg.update(batch)
        first = pa.Table.from_batches(list(agg.results()))
    assert first.column("m").type == pa.binary()
    by_key = dict(zip(first.column("k").to_pylist(), first.column("m").to_pylist(), strict=True))
    assert by_key[2] is None and len(by_key[1]) == F.VAR_STATE_DTYPE.itemsize
    again = pa.concat_tables([first, first]).combine_chunks()
    with HashAggregator("k", {"m": ("m", F.VAR_STATE)}) as agg:
        agg.update(again)
        merged = pa.Table.from_batches(list(agg.results())).combine_chunks()
    var = F.finish_var_states(merged.column("m").chunk(0), "var_pop").to_pylist()
    assert dict(zip(merged.column("k").to_pylist(), var, strict=True)) == {1: 1.0, 2: None, 3: 1.0}


def test_the_python_reference_merges_states_as_the_kernels_do():
    rng = np.random.default_rng(9)
    n = rng.integers(1, 50, 64)
    mean = rng.normal(1e6, 10, 64)
    m2 = rng.uniform(0, 100, 64)
    states = F.pack_var_states(n, mean, m2)
    spec = F.resolve(F.AggregateRequest("m", "m", F.VAR_STATE), to_column("m", states))
    gids = rng.integers(0, 5, 64)
    outs = []
    for kernels in (F._kernels, _reference):
        dst = [np.zeros(5, np.int64), np.zeros(5), np.zeros(5)]
        F.update(spec, dst, gids, to_column("m", states), 0, kernels)
        outs.append(dst)
    for compiled, reference in zip(*outs, strict=True):
        np.testing.assert_allclose(compiled, reference, rtol=1e-12)
    assert outs[0][0].sum() == n.sum()


def test_a_value_of_the_wrong_size_is_named():
    batch = pa.record_batch({"k": [1, 2], "m": pa.array([b"x" * 24, b"short"])})
    agg = HashAggregator("k", {"out": ("m", F.VAR_STATE)})
    with agg, pytest.raises(ValueError, match=r"aggregate 'out': column 'm' holds a value of 5 "):
        agg.update(batch)


def test_only_the_engine_takes_var_state():
    """Not a user's function: ``extagg.aggregate`` and the command line refuse it."""
    with pytest.raises(ValueError, match="unknown aggregate function 'var_state'"):
        F.parse_aggs({"m": ("v", "var_state")})
    with pytest.raises(ValueError, match="unknown aggregate function 'var_state'"):
        extagg.aggregate(pa.record_batch({"k": [1], "v": [1.0]}), ["k"], {"m": ("v", "var_state")})
    with pytest.raises(TypeError, match="var_state"):
        F.resolve(F.AggregateRequest("m", "s", F.VAR_STATE), to_column("s", pa.array(["a"])))

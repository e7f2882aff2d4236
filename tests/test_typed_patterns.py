"""The count / sum / mean patterns on the generic engine's typed path: ``Aggregator.counting()``
and ``Aggregator.sum_count()`` folded in compiled code give exactly what the general path (the
same aggregator with ``typed_path=False``) and a plain-dict fold give — same groups, same
combiners bit for bit, same order — with spills forced and budget-driven; their kernels match
their pure-Python references; a spill writes ``(sum, count)`` tuples from the arrays."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg import Aggregator
from extagg.collection import SizeTrackingAppendOnlyMap
from extagg.generic import _typed_fold_kernels as K
from extagg.generic import _typed_fold_reference as R
from extagg.generic.typed_map import TypedReduceMap, aggregator_op
from tests.test_typed_path import INT64, exact, float_values, folds, workloads
from tests.test_typed_path import run_aggregator as run

PATTERNS = {"count": Aggregator.counting, "sum_count": Aggregator.sum_count}


def reference(pairs, agg):
    """A plain dict folded with the aggregator's own functions, record by record."""
    out = {}
    for k, v in pairs:
        out[k] = agg.merge_value(out[k], v) if k in out else agg.create_combiner(v)
    return sorted((exact(k), exact(c)) for k, c in out.items())


def test_patterns_are_recognised():
    assert Aggregator.counting().pattern == "count"
    assert Aggregator.sum_count().pattern == "sum_count"
    assert Aggregator.counting() == Aggregator.counting()
    assert aggregator_op(Aggregator.counting()) == K.OP_COUNT
    assert aggregator_op(Aggregator.sum_count()) == K.OP_SUM_COUNT
    assert aggregator_op(Aggregator.summing()) == K.OP_ADD
    lookalike = Aggregator(lambda v: (v, 1), lambda c, v: (c[0] + v, c[1] + 1), lambda a, b: a)
    assert lookalike.pattern is None and aggregator_op(lookalike) is None
    assert Aggregator.counting().reduce_function is None


@settings(max_examples=100, deadline=None)
@given(workloads(), st.sampled_from(sorted(PATTERNS)), st.sampled_from([None, 1, 7, 64]))
def test_typed_equals_general_and_reference(pairs, pattern, every):
    agg = PATTERNS[pattern]()
    typed, typed_spills, _ = run(pairs, agg, True, memory="16m", force_spill_every=every)
    general, general_spills, _ = run(pairs, agg, False, memory="16m", force_spill_every=every)
    assert typed == general  # same order: insertion order, or hash order once spilled
    assert typed_spills == general_spills
    floats = any(type(v) is float for _, v in pairs)
    if pattern == "count" or not general_spills or not floats:
        # float sums after a spill depend on the merge's grouping (as on the general path)
        assert sorted(typed) == reference(pairs, agg)


@settings(max_examples=30, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.integers(0, 5000), st.integers(-(2**40), 2**40)), max_size=3000),
    pattern=st.sampled_from(sorted(PATTERNS)),
    as_str=st.booleans(),
)
def test_budget_spills_give_the_dict_result(pairs, pattern, as_str, tmp_path_factory):
    """Budget-driven spills (at other records on the two paths): int values, so the result is
    exact whatever the merge's grouping."""
    if as_str:
        pairs = [(f"user_{k}", v) for k, v in pairs]
    agg = PATTERNS[pattern]()
    spill_dir = str(tmp_path_factory.mktemp("spill"))
    typed, _, kind = run(pairs, agg, True, memory="1m", spill_dirs=[spill_dir])
    general, _, _ = run(pairs, agg, False, memory="1m", spill_dirs=[spill_dir])
    assert sorted(typed) == sorted(general) == reference(pairs, agg)
    assert kind is TypedReduceMap


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_large_float_input_spills_many_runs(pattern, tmp_path):
    rng = np.random.default_rng(3)
    names = [f"user_{i}" for i in range(20_000)]
    picks = rng.integers(0, 20_000, 120_000).tolist()
    pairs = [(names[k], float(i % 97) / 4) for i, k in enumerate(picks)]  # exact float sums
    agg = PATTERNS[pattern]()
    typed, spills, kind = run(pairs, agg, True, memory="2m", spill_dirs=[str(tmp_path)])
    general, g_spills, _ = run(pairs, agg, False, memory="2m", spill_dirs=[str(tmp_path)])
    assert spills > 1 and g_spills > 1 and kind is TypedReduceMap
    assert sorted(typed) == sorted(general) == reference(pairs, agg)
    assert [k for k, _ in typed] == [k for k, _ in general]  # hash order
    assert not list(tmp_path.iterdir())


def test_counting_ignores_values_and_hands_over_on_keys():
    values = [None, [1], "x", 2.5, object()]
    pairs = [(i % 3, values[i % 5]) for i in range(40)]
    out, _, kind = run(pairs, Aggregator.counting(), True)
    assert kind is TypedReduceMap
    assert sorted(out) == reference(pairs, Aggregator.counting())
    out, _, kind = run([*pairs, ((1, 2), None)], Aggregator.counting(), True)
    assert kind is SizeTrackingAppendOnlyMap
    assert sorted(out) == reference([*pairs, ((1, 2), None)], Aggregator.counting())


@pytest.mark.parametrize(
    ("pairs", "why"),
    [
        ([("a", 1.0), ("b", 2)], "mixed value types"),
        ([("a", 2**62), ("a", 2**62)], "int sum leaves int64"),
        ([("a", True)], "bool value"),
        ([("a", 1.0), ("b", None)], "None value"),
    ],
)
def test_sum_count_hands_over_exactly(pairs, why):
    agg = Aggregator.sum_count()
    out, _, kind = run(pairs, agg, True)
    assert kind is SizeTrackingAppendOnlyMap, why
    assert sorted(out) == reference(pairs, agg)


def test_fold_combiners():
    """What a failed spill puts back: combiners, folded as merge_combiners does."""
    m = TypedReduceMap(K.OP_SUM_COUNT)
    assert m.fold_typed(["a", "b", "a"], [1.5, 2.0, 0.5]) == 3
    assert m.fold_typed(["b", "c"], [(1.0, 4), (3.0, 2)], combiners=True) == 2
    assert m.fold_typed(["b"], [(1.0, 2**63)], combiners=True) == 0  # count beyond int64
    assert m.fold_typed(["b"], [(1, 2)], combiners=True) == 0  # an int sum among floats
    assert m.fold_typed(["b"], [1.0], combiners=True) == 0  # not a pair
    assert m.destructive_arrays() == (["a", "b", "c"], [(2.0, 2), (3.0, 5), (3.0, 2)])
    c = TypedReduceMap(K.OP_COUNT)
    assert c.fold_typed([5, 6, 5], ["x", "y", "z"]) == 3
    assert c.fold_typed([6, 7], [10, 1], combiners=True) == 2
    assert c.fold_typed([7], [2.0], combiners=True) == 0
    assert c.destructive_arrays() == ([5, 6, 7], [2, 11, 1])


@settings(max_examples=150, deadline=None)
@given(st.booleans().flatmap(lambda ints: st.tuples(st.just(ints), folds(ints))), st.data())
def test_pair_and_count_kernels_match_the_reference(case, data):
    ints, (gids, values, sums, groups_before) = case
    assert values.dtype == (np.int64 if ints else np.float64)
    n, groups = len(gids), len(sums)
    counts = np.array(data.draw(st.lists(INT64, min_size=groups, max_size=groups)), np.int64)
    if data.draw(st.booleans()):  # folding combiners: counts given, possibly overflowing
        counts_in = np.array(data.draw(st.lists(INT64, min_size=n, max_size=n)), np.int64)
    else:
        counts_in = np.empty(0, np.int64)
        counts = np.abs(counts // 4)
    kernel, ref = K.fold_sum_count, R.fold_sum_count
    got_s, want_s, got_c, want_c = sums.copy(), sums.copy(), counts.copy(), counts.copy()
    info = np.iinfo(np.int64)
    bounds = (np.int64(info.min), np.int64(info.max)) if ints else (-np.inf, np.inf)
    got = kernel(gids, values, counts_in, got_s, got_c, groups_before, *bounds)
    want = ref(gids, values, counts_in, want_s, want_c, groups_before, *bounds)
    assert (int(got[0]), int(got[1])) == want
    assert [exact(x) for x in got_s.tolist()] == [exact(x) for x in want_s.tolist()]
    assert got_c.tolist() == want_c.tolist()
    got_c, want_c = np.abs(counts // 4), np.abs(counts // 4)
    got = K.fold_count(gids, got_c, groups_before)
    assert (int(got[0]), int(got[1])) == R.fold_count(gids, want_c, groups_before)
    assert got_c.tolist() == want_c.tolist()


@settings(max_examples=100, deadline=None)
@given(
    st.one_of(st.lists(INT64, max_size=30), st.lists(st.text(max_size=10), max_size=30)),
    st.one_of(
        st.lists(INT64.map(lambda x: x // 2), min_size=30, max_size=30),
        st.lists(float_values, min_size=30, max_size=30),
    ),
    st.lists(st.integers(1, 2**62), min_size=30, max_size=30),
    st.randoms(use_true_random=False),
)
def test_pickled_pairs_are_pickle_of_the_rows(keys, sums, counts, rnd):
    keys = list(dict.fromkeys(keys)) or [0]
    combiners = list(zip(sums[: len(keys)], counts[: len(keys)], strict=True))
    m = TypedReduceMap(K.OP_SUM_COUNT)
    assert m.fold_typed(keys, combiners, combiners=True) == len(keys)
    rows = m.destructive_sorted_rows()
    order = list(range(len(keys)))
    rnd.shuffle(order)
    part = rows.slice(0, len(rows))
    part.order = np.array(order, dtype=np.int64)
    got = part.pickled_rows()
    is_str = type(keys[0]) is str
    size = K.pickled_size(len(keys), 4 * sum(map(len, keys)) if is_str else 0, True)
    out = np.zeros(size, np.uint8)
    end = R.pickle_rows(
        np.array(order, dtype=np.int64), is_str, part._keys, part._offsets, part._arena,
        type(sums[0]) is float, part._states, True, part._counts, out,
    )  # fmt: skip
    assert got == out[:end].tobytes()
    loaded_keys, loaded_values = pickle.loads(got)
    assert loaded_keys == [keys[i] for i in order]
    assert [exact(v) for v in loaded_values] == [exact(combiners[i]) for i in order]
    assert [exact(v) for v in rows.lists()[1]] == [exact(v) for v in combiners]


MERGE_MEANS = Aggregator.reducing(Aggregator.sum_count().merge_combiners)


@st.composite
def combiner_records(draw):
    keys = draw(st.sampled_from([st.integers(-3, 30), st.sampled_from(["a", "bb", "é", ""])]))
    sums = draw(
        st.sampled_from(
            [
                st.integers(-(2**40), 2**40),
                float_values,
                st.one_of(st.integers(-5, 5), float_values, st.just(2**63 + 1)),
            ]
        )
    )
    counts = st.one_of(st.integers(1, 10**6), st.just(2**62))
    combiner = st.tuples(sums, counts)
    values = st.one_of(combiner, st.just((1.0, 0.5))) if draw(st.booleans()) else combiner
    return draw(st.lists(st.tuples(keys, values), max_size=200))


@settings(max_examples=80, deadline=None)
@given(combiner_records(), st.sampled_from([None, 1, 7, 64]))
def test_reduce_side_of_a_mean_is_typed(pairs, every):
    """``reducing(sum_count().merge_combiners)`` — the reduce side of ``combine_by_key`` with
    the mean's functions — folds ``(sum, count)`` records as combiners on the typed path."""
    assert aggregator_op(MERGE_MEANS) == K.OP_SUM_COUNT
    typed, typed_spills, _ = run(pairs, MERGE_MEANS, True, memory="16m", force_spill_every=every)
    general, _, _ = run(pairs, MERGE_MEANS, False, memory="16m", force_spill_every=every)
    assert typed == general
    floats = any(type(v[0]) is float for _, v in pairs)
    if not typed_spills or not floats:
        assert sorted(typed) == reference(pairs, MERGE_MEANS)


def test_reduce_side_of_a_mean_stays_typed_on_plain_combiners():
    pairs = [(k % 7, (k, 1 + k % 3)) for k in range(100)]
    out, _, kind = run(pairs, MERGE_MEANS, True)
    assert kind is TypedReduceMap and sorted(out) == reference(pairs, MERGE_MEANS)

"""The generic engine's typed path (``Aggregator.reducing(add | min | max)`` over plain keys and
numbers, folded in compiled code) gives exactly what the general path gives: same groups, same
states bit for bit, same order (insertion order in memory, hash order once spilled), with spills
forced, and it hands over to the general path exactly when a record does not fit."""

from __future__ import annotations

import math
import operator
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg import Aggregator, ExternalAppendOnlyMap
from extagg.collection import SizeTrackingAppendOnlyMap
from extagg.errors import DestroyedError
from extagg.generic import _typed_fold_kernels as K
from extagg.generic import _typed_fold_reference as R
from extagg.generic.keys import NAN
from extagg.generic.typed_map import TypedReduceMap
from tests.collection.test_pair_arrays import block_of

OPS = {"add": operator.add, "min": min, "max": max}
INT64 = st.integers(-(2**63), 2**63 - 1)


def exact(value):
    """A value with its type and, for floats, its bits (-0.0 distinct from 0.0). Every NaN is
    one value: adding two NaNs gives one of them, and which one (its sign bit) is the compiler's
    choice of operand order, in CPython as in numba."""
    if type(value) is float:
        return ("float", b"nan" if value != value else struct.pack("<d", value))
    if type(value) is tuple:
        return ("tuple", tuple(exact(v) for v in value))
    return (type(value).__name__, value)


def run_aggregator(pairs, agg, typed, **options):
    """The map's output (exactly comparable), its spill count and the kind of its table."""
    with ExternalAppendOnlyMap(agg, typed_path=typed, **options) as m:
        m.insert_all(pairs)
        kind = type(m._map)
        out = [(exact(k), exact(c)) for k, c in m.iterator()]
        return out, m.metrics.spill_count, kind


def run(pairs, func, typed, **options):
    return run_aggregator(pairs, Aggregator.reducing(func), typed, **options)


def reference(pairs, func):
    out = {}
    for k, v in pairs:
        k = NAN if isinstance(k, float) and math.isnan(k) else k
        out[k] = func(out[k], v) if k in out else v
    return sorted((exact(k), exact(c)) for k, c in out.items())


plain_keys = st.one_of(
    st.integers(0, 40),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from(["a", "b", "user_1", "é", "\ud800x", ""]),
)
odd_keys = st.one_of(
    st.booleans(),
    st.floats(allow_nan=True),
    st.integers(2**63, 2**70),
    st.tuples(st.integers(0, 3), st.text(max_size=2)),
)
int_values = st.one_of(st.integers(-5, 5), INT64)
float_values = st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def workloads(draw):
    key_kind = draw(st.sampled_from(["int", "str", "mixed"]))
    value_kind = draw(st.sampled_from(["int", "float", "mixed"]))
    keys = {
        "int": st.one_of(st.integers(-3, 30), INT64),
        "str": st.sampled_from(["a", "bb", "user_123", "é", "\ud800", ""]),
        "mixed": st.one_of(plain_keys, odd_keys),
    }[key_kind]
    values = {
        "int": int_values,
        "float": float_values,
        "mixed": st.one_of(int_values, float_values, st.integers(2**63, 2**65), st.booleans()),
    }[value_kind]
    # mostly fitting records, so that the typed path runs before a record makes it hand over
    n = draw(st.integers(0, 300))
    pairs = draw(st.lists(st.tuples(keys, values), min_size=n, max_size=n))
    return pairs


@settings(max_examples=100, deadline=None)
@given(workloads(), st.sampled_from(sorted(OPS)), st.sampled_from([None, 1, 7, 64]))
def test_typed_equals_general_and_reference(pairs, op, every):
    func = OPS[op]
    typed, typed_spills, _ = run(pairs, func, True, memory="16m", force_spill_every=every)
    general, general_spills, _ = run(pairs, func, False, memory="16m", force_spill_every=every)
    assert typed == general  # same order too: insertion order, or hash order once spilled
    assert typed_spills == general_spills
    if not general_spills:  # after a spill, min/max of NaN or of equal values of other types
        assert sorted(typed) == reference(pairs, func)  # depend on the merge's grouping


@settings(max_examples=40, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.integers(0, 5000), st.integers(-(2**40), 2**40)), max_size=3000),
    op=st.sampled_from(sorted(OPS)),
)
def test_tiny_budget_spills_to_the_same_result(pairs, op, tmp_path_factory):
    """Budget-driven spills (not forced) happen at other records on the two paths; the groups
    and states are the same (int values: exact whatever the grouping of the merge)."""
    func = OPS[op]
    spill_dir = str(tmp_path_factory.mktemp("spill"))
    typed, _, _ = run(pairs, func, True, memory="1m", spill_dirs=[spill_dir])
    general, _, _ = run(pairs, func, False, memory="1m", spill_dirs=[spill_dir])
    assert sorted(typed) == sorted(general) == reference(pairs, func)


def test_large_input_spills_on_the_typed_path(tmp_path):
    rng = np.random.default_rng(5)
    keys = rng.integers(-(2**63), 2**63 - 1, size=50_000).tolist()
    pairs = [(keys[i % 50_000], i) for i in range(200_000)]
    typed, spills, kind = run(pairs, operator.add, True, memory="2m", spill_dirs=[str(tmp_path)])
    general, _, _ = run(pairs, operator.add, False, memory="2m", spill_dirs=[str(tmp_path)])
    assert spills > 0 and kind is TypedReduceMap
    assert [k for k, _ in typed] == [k for k, _ in general]  # both spilled: hash order
    assert sorted(typed) == sorted(general) == reference(pairs, operator.add)


@pytest.mark.parametrize(
    ("pairs", "why"),
    [
        ([(1, 2**62), (2, 1), (1, 2**62), (1, 5)], "int sum leaves int64"),
        ([(1, 1), (True, 1), (1, 1)], "bool key"),
        ([(1, 1.0), (2, 2)], "values of mixed types"),
        ([("a", 1.0), (b"a", 1.0)], "bytes key"),
        ([(1, 1), (2**64, 1)], "int key beyond int64"),
        ([(1.5, 1.0), (1.5, 1.0)], "float key"),
    ],
)
def test_hands_over_exactly_when_a_record_does_not_fit(pairs, why):
    pairs = pairs * 3000  # several chunks: the hand-over happens mid-stream
    typed, _, kind = run(pairs, operator.add, True, memory="64m")
    general, _, _ = run(pairs, operator.add, False, memory="64m")
    assert kind is SizeTrackingAppendOnlyMap, why
    assert typed == general, why


def test_stays_typed_on_fitting_records():
    pairs = [(f"user_{i % 100}", i) for i in range(10_000)]
    for func in OPS.values():
        _, _, kind = run(pairs, func, True, memory="64m")
        assert kind is TypedReduceMap


def test_reduce_function():
    assert Aggregator.reducing(operator.add).reduce_function is operator.add
    # the identity and a + b written as lambdas are recognised by their code
    assert Aggregator(lambda v: v, operator.add, operator.add).reduce_function is operator.add
    lambdas = Aggregator(lambda v: v, lambda c, v: c + v, lambda a, b: a + b)
    assert lambdas.reduce_function is operator.add
    assert Aggregator(lambda v: v, max, max).reduce_function is max
    assert Aggregator(lambda v: v, lambda c, v: c + v, max).reduce_function is None
    assert Aggregator(lambda v: v + 0, operator.add, operator.add).reduce_function is None


# ---------------------------------------------------------------------- kernels vs reference


@st.composite
def folds(draw, ints):
    n = draw(st.integers(0, 200))
    groups_before = draw(st.integers(0, 5))
    gids, next_new = [], groups_before
    for _ in range(n):
        if draw(st.booleans()) or next_new == 0:
            gids.append(next_new)
            next_new += 1
        else:
            gids.append(draw(st.integers(0, next_new - 1)))
    if ints:
        values = draw(st.lists(st.one_of(st.integers(-9, 9), INT64), min_size=n, max_size=n))
        dtype = np.int64
    else:
        values = draw(st.lists(float_values, min_size=n, max_size=n))
        dtype = np.float64
    states = np.array(
        draw(st.lists(st.integers(-9, 9), min_size=next_new, max_size=next_new)), dtype=dtype
    )
    return np.array(gids, dtype=np.int64), np.array(values, dtype=dtype), states, groups_before


@settings(max_examples=200, deadline=None)
@given(st.booleans().flatmap(lambda ints: st.tuples(st.just(ints), folds(ints))), st.integers(0, 2))
def test_fold_kernels_match_the_reference(case, op):
    ints, (gids, values, states, groups_before) = case
    kernel, ref = (K.fold_int, R.fold_int) if ints else (K.fold_float, R.fold_float)
    got_states, want_states = states.copy(), states.copy()
    got = kernel(op, gids, values, got_states, groups_before)
    want = ref(op, gids, values, want_states, groups_before)
    assert (int(got[0]), int(got[1])) == want
    assert [exact(x) for x in got_states.tolist()] == [exact(x) for x in want_states.tolist()]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(INT64, st.sampled_from([-1, -2, 0, 2**61 - 1, 2**61, -(2**63)]))))
def test_vectorised_int_hash_is_pythons(xs):
    from extagg.collection._batch_fold import hash_batch, python_int_hashes

    assert python_int_hashes(np.array(xs, dtype=np.int64)).tolist() == [hash(x) for x in xs]
    if xs:
        assert hash_batch(xs)[0].tolist() == [hash(x) for x in xs]


# -- spills written from the arrays (TypedSortedRows.pickled_rows) ---------------------------------
spill_keys = st.one_of(
    st.lists(INT64, max_size=40),
    st.lists(st.one_of(st.text(max_size=12), st.text(min_size=250, max_size=300)), max_size=40),
)
spill_values = st.one_of(
    st.lists(INT64, min_size=40, max_size=40),
    st.lists(float_values, min_size=40, max_size=40),
)


@settings(max_examples=150, deadline=None)
@given(spill_keys, spill_values, st.randoms(use_true_random=False))
def test_pickled_rows_kernel_is_pickle_of_the_rows(keys, values, rnd):
    """The compiled writer, its reference and ``pickle.dumps`` agree: the bytes load as exactly
    the keys and values (str with surrogates, keys of 256+ bytes, NaN and -0.0 bits, int64
    extremes), whatever the order of the groups."""
    import pickle

    keys = list(dict.fromkeys(keys)) or [0]  # a spilled map holds a group at least
    values = values[: len(keys)]
    m = TypedReduceMap(R.OP_ADD)
    assert m.fold_typed(keys, values) == len(keys)
    rows = m.destructive_sorted_rows()
    order = list(range(len(keys)))
    rnd.shuffle(order)
    part = rows.slice(0, len(rows))
    part.order = np.array(order, dtype=np.int64)
    got = part.pickled_rows()
    is_str = bool(keys) and type(keys[0]) is str
    is_float = bool(values) and type(values[0]) is float
    out = np.zeros(K.pickled_size(len(keys), 4 * sum(map(len, keys)) if is_str else 0), np.uint8)
    end = R.pickle_rows(
        np.array(order, dtype=np.int64), is_str, part._keys, part._offsets, part._arena,
        is_float, part._states, False, np.empty(0, np.uint64), out,
    )  # fmt: skip
    assert got == out[:end].tobytes()
    loaded_keys, loaded_values = pickle.loads(got)
    assert loaded_keys == [keys[i] for i in order]
    assert [exact(v) for v in loaded_values] == [exact(values[i]) for i in order]
    assert rows.lists()[0] == keys  # what a failed spill puts back: first-appearance order
    assert [exact(v) for v in rows.lists()[1]] == [exact(v) for v in values]


def test_string_keys_spill_from_the_arrays_like_the_general_path(tmp_path):
    """A typed map of str keys spills many runs (written without str objects); the merge reads
    them as the general path's runs: same pairs, same order."""
    rng = np.random.default_rng(11)
    names = [f"user_{i}" if i % 7 else f"ü{i}\ud800" for i in range(20_000)]
    pairs = [(names[i], float(v)) for i, v in zip(rng.integers(0, 20_000, 100_000), range(100_000))]
    typed, spills, kind = run(pairs, operator.add, True, memory="2m", spill_dirs=[str(tmp_path)])
    general, g_spills, _ = run(pairs, operator.add, False, memory="2m", spill_dirs=[str(tmp_path)])
    assert spills > 1 and g_spills > 1 and kind is TypedReduceMap
    assert sorted(typed) == sorted(general) == reference(pairs, operator.add)
    assert [k for k, _ in typed] == [k for k, _ in general]  # hash order


@settings(max_examples=40, deadline=None)
@given(
    keys=st.one_of(
        st.lists(st.integers(-(2**63), 2**63 - 1), max_size=300),
        st.lists(st.text(max_size=6), max_size=300),
    ),
    size=st.integers(1, 64),
    op=st.sampled_from(["add", "max", "sum_count"]),
)
def test_destructive_pair_slices_are_destructive_arrays_in_pieces(keys, size, op):
    """Handing a table on a slice at a time gives the same keys and states, in the same order,
    as decoding it whole (ASCII and non-ASCII str keys, int keys, (sum, count) states)."""
    from extagg.generic.typed_map import aggregator_op, typed_op

    values = [i % 7 for i in range(len(keys))]
    ops = {
        "add": typed_op(operator.add),
        "max": typed_op(max),
        "sum_count": aggregator_op(Aggregator.sum_count()),
    }

    def build():
        m = TypedReduceMap(ops[op])
        assert m.fold_typed(keys, values) == len(keys)
        return m

    whole_keys, whole_values = build().destructive_arrays()
    sliced = build()
    pieces = [(p.key_objects(), p.value_objects()) for p in sliced.destructive_pair_slices(size)]
    with pytest.raises(DestroyedError):
        len(sliced)
    assert all(0 < len(k) <= size and len(k) == len(v) for k, v in pieces)
    assert [k for ks, _ in pieces for k in ks] == whole_keys
    assert [v for _, vs in pieces for v in vs] == whole_values


def _block(keys, values, counts=None):
    return block_of(keys, values, counts)


@st.composite
def block_streams(draw):
    """Batches of typed pairs (some as blocks, some as lists), mostly of one key and value
    kind, sometimes with a batch that does not fit (other value type, an int sum overflow)."""
    key_kind = draw(st.sampled_from(["int", "str"]))
    value_kind = draw(st.sampled_from(["int", "float"]))
    keys = st.integers(-3, 40) if key_kind == "int" else st.sampled_from(["a", "bb", "é", ""])
    values = int_values if value_kind == "int" else float_values
    batches = []
    for _ in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 60))
        batch_values = values
        if draw(st.integers(0, 9)) == 0:  # a batch of the other value kind
            batch_values = float_values if value_kind == "int" else int_values
        pairs = draw(st.lists(st.tuples(keys, batch_values), min_size=n, max_size=n))
        kinds = {type(v) for _, v in pairs}
        as_block = len(kinds) == 1 and draw(st.booleans())
        batches.append((pairs, as_block))
    return batches


@settings(max_examples=80, deadline=None)
@given(block_streams(), st.sampled_from(sorted(OPS)), st.sampled_from([None, 1, 7]))
def test_blocks_fold_like_their_pairs(batches, op, every):
    """``insert_batch`` of typed blocks (a typed shuffle's batches) gives exactly what
    ``insert_all`` of the same pairs gives: order, bits, spills, hand-over included."""
    func = OPS[op]

    def fed(use_blocks):
        with ExternalAppendOnlyMap(
            Aggregator.reducing(func), memory="16m", force_spill_every=every
        ) as m:
            for pairs, as_block in batches:
                if use_blocks and as_block:
                    m.insert_batch(_block([k for k, _ in pairs], [v for _, v in pairs]))
                else:
                    m.insert_all(pairs)
            kind = type(m._map)
            out = [(exact(k), exact(c)) for k, c in m.iterator()]
            return out, m.metrics.spill_count, m.metrics.records_read, kind

    assert fed(True) == fed(False)


def test_block_with_an_overflowing_sum_hands_over_mid_block():
    pairs = [(1, 2**62), (2, 1), (1, 2**62), (3, 4), (1, 5)] * 2000
    block = _block([k for k, _ in pairs], [v for _, v in pairs])
    with ExternalAppendOnlyMap(Aggregator.reducing(operator.add), memory="64m") as m:
        m.insert_batch(block)
        assert type(m._map) is SizeTrackingAppendOnlyMap
        out = dict(m.iterator())
    assert out == {1: 2000 * (2**63 + 5), 2: 2000, 3: 8000}


def test_sum_count_combiner_blocks_fold_like_their_pairs(tmp_path):
    """(sum, count) combiners as blocks with counts: the mean's merge side, spilling."""
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 3000, size=40_000).tolist()
    sums = rng.normal(size=40_000).tolist()
    counts = rng.integers(1, 9, size=40_000).tolist()
    agg = Aggregator.reducing(Aggregator.sum_count().merge_combiners)

    def fed(use_blocks):
        with ExternalAppendOnlyMap(agg, memory="1m", spill_dirs=[str(tmp_path)]) as m:
            for start in range(0, 40_000, 5000):
                part = slice(start, start + 5000)
                if use_blocks:
                    m.insert_batch(_block(keys[part], sums[part], counts[part]))
                else:
                    m.insert_all(zip(keys[part], zip(sums[part], counts[part])))
            assert type(m._map) is TypedReduceMap
            return [(exact(k), exact(c)) for k, c in m.iterator()], m.metrics.spill_count

    blocks, spills = fed(True)
    assert spills > 0
    assert (blocks, spills) == fed(False)


def test_fold_pairs_refuses_other_kinds_without_folding():
    typed = TypedReduceMap(K.OP_ADD)
    assert typed.fold_pairs(_block([1, 2], [1, 2])) == 2
    assert typed.fold_pairs(_block(["a"], [1])) == 0  # str keys into an int table
    assert typed.fold_pairs(_block([1], [1.5])) == 0  # float values into an int table
    keys, values = typed.destructive_arrays()
    assert (keys, values) == ([1, 2], [1, 2])

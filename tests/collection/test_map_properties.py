"""Property tests: AppendOnlyMap (fold, update, change_value, get, sort) against a plain dict."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from extagg.collection import AppendOnlyMap, SizeTrackingAppendOnlyMap
from extagg.hashing import order_hash
from tests.collection.map_helpers import FixedHashObject, JavaString

SPECIAL_INTS = [-1, -2, 0, 1, 2**61 - 1, -(2**61 - 1), 2**61, 2**63 - 1, -(2**63), 2**64, -(2**64)]

keys = st.one_of(
    st.integers(-(2**64), 2**64),
    st.integers(-5, 5),
    st.sampled_from(SPECIAL_INTS),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, min_value=-4, max_value=4).map(lambda f: round(f * 2) / 2),
    st.text(max_size=3),
    st.tuples(st.integers(-2, 2), st.text(max_size=1)),
    st.builds(FixedHashObject, st.integers(0, 6), st.integers(0, 1)),
    st.sampled_from(["Aa", "BB", "AaAa", "BBBB", "AaBB"]).map(JavaString),
)
capacities = st.sampled_from([1, 2, 4, 64])


def _reference_fold(reference: dict, calls: list, batch_keys, batch_values) -> None:
    for k, v in zip(batch_keys, batch_values):
        if k in reference:
            calls.append(("merge", reference[k], v))
            reference[k] = reference[k] + (v,)
        else:
            calls.append(("create", v))
            reference[k] = (v,)


def _assert_same(m: AppendOnlyMap, reference: dict) -> None:
    items = list(m.items())
    assert [(k, v) for k, v in items] == list(reference.items())  # same keys, order, values
    assert all(type(a) is type(b) for (a, _), b in zip(items, reference))  # first key kept
    m.check_invariants()


@given(
    capacity=capacities,
    batches=st.lists(st.lists(st.tuples(keys, st.integers(0, 9)), max_size=40), max_size=6),
)
def test_fold_matches_a_dict_and_calls_combiners_in_record_order(capacity, batches):
    m = AppendOnlyMap(capacity)
    reference: dict = {}
    calls: list = []
    expected_calls: list = []

    def create(v):
        calls.append(("create", v))
        return (v,)

    def merge(c, v):
        calls.append(("merge", c, v))
        return (*c, v)

    for batch in batches:
        batch_keys = [k for k, _ in batch]
        batch_values = [v for _, v in batch]
        m.fold(batch_keys, batch_values, create, merge)
        _reference_fold(reference, expected_calls, batch_keys, batch_values)
    assert calls == expected_calls
    _assert_same(m, reference)


@given(capacity=capacities, pairs=st.lists(st.tuples(keys, st.integers(0, 9)), max_size=80))
def test_destructive_sort_is_a_stable_sort_by_order_hash(capacity, pairs):
    m = AppendOnlyMap(capacity)
    m.fold([k for k, _ in pairs], [v for _, v in pairs], lambda v: v, lambda c, v: c + v)
    entries = list(m.items())
    hashes, sorted_keys, sorted_values = m.destructive_sorted_arrays()
    expected = sorted(entries, key=lambda kv: order_hash(kv[0]))  # Python's sort is stable
    assert list(zip(sorted_keys, sorted_values)) == expected
    assert hashes.tolist() == [order_hash(k) for k, _ in expected]


class MapMachine(RuleBasedStateMachine):
    """Any interleaving of single-key and batch operations behaves like a dict."""

    @initialize(capacity=capacities, tracked=st.booleans())
    def setup(self, capacity, tracked):
        self.map = SizeTrackingAppendOnlyMap(capacity) if tracked else AppendOnlyMap(capacity)
        self.reference: dict = {}

    @rule(key=keys, value=st.integers())
    def update(self, key, value):
        self.map.update(key, value)
        self.reference[key] = value

    @rule(key=keys, value=st.integers())
    def change_value(self, key, value):
        had = key in self.reference
        expected = (had, self.reference.get(key), value)
        got = self.map.change_value(key, lambda h, old: (h, old, value))
        assert got == expected
        self.reference[key] = expected

    @rule(pairs=st.lists(st.tuples(keys, st.integers()), max_size=30))
    def fold(self, pairs):
        self.map.fold([k for k, _ in pairs], [v for _, v in pairs], _create, _merge)
        for k, v in pairs:
            self.reference[k] = _merge(self.reference[k], v) if k in self.reference else _create(v)

    @rule(key=keys)
    def get(self, key):
        assert self.map.get(key, "absent") == self.reference.get(key, "absent")
        assert (key in self.map) == (key in self.reference)

    @precondition(lambda self: isinstance(self.map, SizeTrackingAppendOnlyMap))
    @rule()
    def estimate(self):
        assert self.map.estimate_size() > 0

    @invariant()
    def same_as_dict(self):
        assert len(self.map) == len(self.reference)
        assert list(self.map.items()) == list(self.reference.items())
        assert self.map.size <= self.map.grow_threshold

    def teardown(self):
        if hasattr(self, "map"):
            self.map.check_invariants()


def _create(v):
    return ("created", v)


def _merge(c, v):
    return ("merged", c, v)


TestMapMachine = MapMachine.TestCase

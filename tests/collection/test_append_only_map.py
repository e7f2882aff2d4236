"""AppendOnlyMap in the style of Spark's AppendOnlyMapSuite: capacity arithmetic, growth, None
keys, colliding keys, change_value, destructive sort, invalidation, failure paths."""

from __future__ import annotations

import gc
import weakref

import pytest

from extagg import BadKeyError
from extagg.collection import AppendOnlyMap
from extagg.collection.append_only_map import (
    DESTROYED_MESSAGE,
    MAXIMUM_CAPACITY,
    next_power_of_2,
)
from extagg.hashing import order_hash
from tests.collection.map_helpers import (
    FixedHashObject,
    JavaString,
    dict_fold,
    sum_create,
    sum_merge,
)


class SmallLimitMap(AppendOnlyMap):
    """The real map with a low capacity limit, to reach it without allocating 2**29 slots."""

    MAXIMUM_CAPACITY = 64


# -- capacity, threshold and growth arithmetic ------------------------------------------------


@pytest.mark.parametrize(
    ("n", "expected"), [(1, 1), (2, 2), (3, 4), (255, 256), (256, 256), (257, 512)]
)
def test_next_power_of_2(n, expected):
    assert next_power_of_2(n) == expected


@pytest.mark.parametrize(
    ("initial", "capacity", "threshold"),
    [(1, 1, 0), (2, 2, 1), (4, 4, 2), (8, 8, 5), (64, 64, 44), (100, 128, 89), (255, 256, 179)],
)
def test_initial_capacity_and_grow_threshold(initial, capacity, threshold):
    m = AppendOnlyMap(initial)
    assert m.capacity == capacity
    assert m.grow_threshold == threshold
    assert len(m) == m.size == 0


def test_default_capacity_grows_on_the_45th_key():
    m = AppendOnlyMap()
    for i in range(44):
        m.update(i, str(i))
    assert (m.capacity, m.size, m.at_grow_threshold) == (64, 44, True)
    m.update(44, "44")
    assert (m.capacity, m.grow_threshold, m.size, m.at_grow_threshold) == (128, 89, 45, False)
    assert [m.get(i) for i in range(45)] == [str(i) for i in range(45)]
    m.check_invariants()


def test_updating_an_existing_key_at_the_threshold_does_not_grow():
    m = AppendOnlyMap(8)
    for i in range(5):
        m.update(i, i)
    assert m.at_grow_threshold
    m.update(3, "three")
    m.change_value(4, lambda had, old: (had, old))
    m.fold([0, 1], [10, 20], sum_create, sum_merge)
    assert (m.capacity, m.size) == (8, 5)
    assert m.get(3) == "three" and m.get(4) == (True, 4) and m.get(1) == 21


def test_capacity_one_grows_on_the_first_key():
    m = AppendOnlyMap(1)
    m.update("a", 1)
    assert (m.capacity, m.grow_threshold, m.size) == (2, 1, 1)
    m.update("b", 2)
    assert (m.capacity, m.size) == (4, 2)
    m.check_invariants()


@pytest.mark.parametrize("bad", [0, -1, -(2**40)])
def test_invalid_initial_capacity(bad):
    with pytest.raises(ValueError, match=r"requirement failed: Invalid initial capacity"):
        AppendOnlyMap(bad)


def test_initial_capacity_above_the_maximum():
    with pytest.raises(
        ValueError, match=r"requirement failed: Can't make capacity bigger than 536870912 elements"
    ):
        AppendOnlyMap(MAXIMUM_CAPACITY + 1)
    with pytest.raises(ValueError, match=r"bigger than 64 elements"):
        SmallLimitMap(65)


@pytest.mark.parametrize("bad", [1.5, "64", True, None])
def test_initial_capacity_must_be_an_int(bad):
    with pytest.raises(TypeError, match="initial_capacity must be an int"):
        AppendOnlyMap(bad)


def test_growth_beyond_the_maximum_capacity_fails_and_keeps_the_map():
    m = SmallLimitMap()
    for i in range(44):
        m.update(i, i)
    with pytest.raises(
        ValueError, match=r"^requirement failed: Can't contain more than 44 elements$"
    ):
        m.update(44, 44)
    with pytest.raises(ValueError, match="Can't contain more than 44 elements"):
        m.change_value(44, lambda had, old: 0)
    assert (m.size, m.capacity, 44 in m) == (44, 64, False)
    m.check_invariants()


def test_fold_beyond_the_maximum_capacity_keeps_the_records_before():
    m = SmallLimitMap()
    with pytest.raises(ValueError, match="Can't contain more than 44 elements"):
        m.fold(list(range(50)), [1] * 50, sum_create, sum_merge)
    assert m.size == 44
    assert dict(m.items()) == {i: 1 for i in range(44)}
    m.check_invariants()


def test_spark_message_at_the_real_limit():
    assert int(0.7 * MAXIMUM_CAPACITY) == 375809638  # "Can't contain more than 375809638 elements"


# -- get / update / change_value ----------------------------------------------------------------


def test_get_update_and_defaults():
    m = AppendOnlyMap()
    assert m.get("missing") is None
    assert m.get("missing", "dflt") == "dflt"
    m.update("a", 1)
    m.update("a", 2)
    m.update("b", None)  # a None value is allowed, and indistinguishable from absence by get
    assert (m.get("a"), m.get("b"), len(m)) == (2, None, 2)
    assert "b" in m and "c" not in m


def test_none_is_an_ordinary_key():
    m = AppendOnlyMap()
    assert None not in m
    m.update(None, "v")
    assert (m.get(None), None in m, len(m)) == ("v", True, 1)
    assert m.change_value(None, lambda had, old: (had, old)) == (True, "v")
    m.fold([None, 1, None], [1, 2, 3], lambda v: [v], lambda c, v: [*c, v])
    assert m.get(None) == [True, "v", 1, 3]
    assert dict(m.items()) == {None: [True, "v", 1, 3], 1: [2]}
    m.check_invariants()


def test_change_value_semantics():
    m = AppendOnlyMap()
    calls = []

    def fn(had, old):
        calls.append((had, old))
        return (old or 0) + 1

    assert m.change_value("k", fn) == 1
    assert m.change_value("k", fn) == 2
    assert calls == [(False, None), (True, 1)]
    assert m.get("k") == 2


def test_change_value_returns_the_computed_value_when_the_insert_grows_the_table():
    m = AppendOnlyMap()
    for i in range(44):
        m.update(i, i)
    result = m.change_value("new", lambda had, old: f"computed-{had}-{old}")
    assert result == "computed-False-None"
    assert m.capacity == 128
    assert m.get("new") == result
    m.check_invariants()


def test_change_value_that_raises_leaves_the_map_unchanged():
    m = AppendOnlyMap()
    m.update("a", 1)

    def boom(had, old):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        m.change_value("b", boom)
    with pytest.raises(RuntimeError):
        m.change_value("a", boom)
    assert dict(m.items()) == {"a": 1}
    m.check_invariants()


# -- colliding keys -------------------------------------------------------------------------------


def test_fixed_hash_objects_stay_apart_in_every_operation():
    m = AppendOnlyMap(2)
    keys = [FixedHashObject(i, i % 2) for i in range(100)]
    for k in keys[:50]:
        m.update(k, k.value)
    for k in keys[50:75]:
        m.change_value(k, lambda had, old, k=k: (had, k.value))
    m.fold(keys[75:] + keys[:10], [1] * 35, lambda v: ("fold", v), lambda c, v: ("merged", c))
    assert len(m) == 100
    for k in keys[10:50]:
        assert m.get(FixedHashObject(k.value, k.hash_value)) == k.value
    assert m.get(keys[60]) == (False, 60)
    assert m.get(keys[80]) == ("fold", 1)
    assert m.get(keys[3]) == ("merged", 3)
    m.check_invariants()


def test_java_colliding_strings_aa_bb():
    aa, bb = JavaString("Aa"), JavaString("BB")
    assert hash(aa) == hash(bb) == 2112 and aa != bb
    m = AppendOnlyMap()
    m.fold([aa, bb, aa, bb, bb], [1, 10, 2, 20, 30], sum_create, sum_merge)
    assert (m.get(aa), m.get(bb), len(m)) == (3, 60, 2)
    m.check_invariants()


def test_ints_with_equal_python_hashes():
    # hash(-1) == hash(-2) == -2 and hash(0) == hash(2**61 - 1) == 0: equal hashes, unequal keys
    keys = [-1, -2, 0, 2**61 - 1, 2**61, 1, -(2**61 - 1), 2**63 - 1, -(2**63), 2**64, -(2**70)]
    m = AppendOnlyMap(1)
    m.fold(keys * 2, list(range(len(keys) * 2)), sum_create, sum_merge)
    reference: dict = {}
    dict_fold(reference, keys * 2, list(range(len(keys) * 2)))
    assert dict(m.items()) == reference and len(m) == len(keys)
    for k in keys:
        m.update(k, m.get(k) + 1)  # the single-key path finds what the batch path stored
    assert len(m) == len(keys)
    m.check_invariants()


def test_equal_numbers_are_one_key_and_the_first_key_object_is_kept():
    m = AppendOnlyMap()
    m.fold([1, 1.0, True, 2.0, 2], [1, 2, 3, 4, 5], sum_create, sum_merge)
    assert list(m.items()) == [(1, 6), (2.0, 9)]
    assert type(next(iter(m))[0]) is int


def test_nan_keys_compare_by_identity_as_in_a_dict():
    nan1, nan2 = float("nan"), float("nan")
    m = AppendOnlyMap()
    m.fold([nan1, nan1, nan2], [1, 2, 4], sum_create, sum_merge)
    reference: dict = {}
    dict_fold(reference, [nan1, nan1, nan2], [1, 2, 4])
    assert [v for _, v in m.items()] == list(reference.values())


# -- fold ---------------------------------------------------------------------------------------


def test_fold_calls_combiners_exactly_in_record_order():
    calls = []

    def create(v):
        calls.append(("create", v))
        return [v]

    def merge(c, v):
        calls.append(("merge", list(c), v))
        return [*c, v]

    keys = [
        "a",
        "b",
        "a",
        FixedHashObject(1, 0),
        FixedHashObject(2, 0),
        "b",
        "a",
        FixedHashObject(2, 0),
    ]
    m = AppendOnlyMap(1)
    m.fold(keys, list(range(len(keys))), create, merge)
    expected, seen = [], {}
    for k, v in zip(keys, range(len(keys))):
        if k in seen:
            expected.append(("merge", list(seen[k]), v))
            seen[k] = [*seen[k], v]
        else:
            expected.append(("create", v))
            seen[k] = [v]
    assert calls == expected
    assert dict(m.items()) == seen


def test_fold_grows_many_times_within_one_batch():
    m = AppendOnlyMap(1)
    keys = [i * 7919 for i in range(3000)] * 2
    m.fold(keys, [1] * len(keys), sum_create, sum_merge)
    assert m.size == 3000 and m.capacity == 8192
    assert all(v == 2 for _, v in m.items())
    m.check_invariants()


def test_fold_accepts_tuples_and_empty_batches():
    m = AppendOnlyMap()
    m.fold((), (), sum_create, sum_merge)
    m.fold(("x", "y", "x"), (1, 2, 3), sum_create, sum_merge)
    assert dict(m.items()) == {"x": 4, "y": 2}


def test_fold_needs_one_value_per_key():
    with pytest.raises(ValueError, match="one value per key: got 2 keys, 1 values"):
        AppendOnlyMap().fold([1, 2], [1], sum_create, sum_merge)


@pytest.mark.parametrize("error", [KeyError, KeyboardInterrupt])
@pytest.mark.parametrize("failing", ["create", "merge"])
@pytest.mark.parametrize("at", [0, 5, 17, 29])
def test_fold_combiner_failure_keeps_earlier_records_and_a_consistent_map(failing, at, error):
    keys = [("k", i % 11) for i in range(30)]
    calls = []

    def create(v):
        calls.append(v)
        if failing == "create" and v == at:
            raise error("create failed")
        return v

    def merge(c, v):
        calls.append(v)
        if failing == "merge" and v == at:
            raise error("merge failed")
        return c + v

    m = AppendOnlyMap(4)
    m.update("before", 1)
    if (failing == "create") != (at < 11):  # only new keys call create, repeats call merge
        m.fold(keys, list(range(30)), create, merge)
        return
    with pytest.raises(error):
        m.fold(keys, list(range(30)), create, merge)
    assert calls == list(range(at + 1))
    reference = {"before": 1}
    dict_fold(reference, keys[:at], list(range(at)))
    assert dict(m.items()) == reference
    m.check_invariants()
    m.fold(keys, list(range(30)), sum_create, sum_merge)  # still usable
    m.check_invariants()


class _EqFails(FixedHashObject):
    __slots__ = ()

    def __eq__(self, other):
        raise ArithmeticError("cannot compare")

    __hash__ = FixedHashObject.__hash__


def test_fold_key_comparison_failure_keeps_the_records_before_it():
    m = AppendOnlyMap()
    m.update(_EqFails(1, 5), "stored")
    with pytest.raises(BadKeyError, match="record 2: key of type _EqFails") as err:
        m.fold(["new", 7, _EqFails(2, 5), "after"], [1, 2, 3, 4], sum_create, sum_merge)
    assert err.value.index == 2 and isinstance(err.value.__cause__, ArithmeticError)
    assert m.last_fold_count == 2
    assert len(m) == 3 and m.get("new") == 1 and m.get(7) == 2 and "after" not in m
    m.check_invariants()


# -- unhashable keys ------------------------------------------------------------------------------


def test_unhashable_keys_name_their_type_everywhere():
    m = AppendOnlyMap()
    m.update("a", 1)
    with pytest.raises(TypeError, match="unhashable key of type list"):
        m.fold(["b", ["c"]], [1, 2], sum_create, sum_merge)
    with pytest.raises(TypeError, match="unhashable key of type dict"):
        m.update({}, 1)
    with pytest.raises(TypeError, match="unhashable key of type set"):
        m.get({1})
    with pytest.raises(TypeError, match="unhashable key of type bytearray"):
        m.change_value(bytearray(b"x"), lambda had, old: 1)
    with pytest.raises(TypeError, match="unhashable key of type list"):
        [1] in m  # noqa: B015
    assert dict(m.items()) == {"a": 1, "b": 1}  # the records before the bad key are folded


def test_a_key_whose_hash_raises_keeps_the_records_before_it():
    class HashFails:
        def __hash__(self) -> int:
            raise ValueError("no hash today")

    m = AppendOnlyMap()
    keys = [*range(500), HashFails(), *range(500, 1000)]
    with pytest.raises(BadKeyError, match=r"record 500:.*ValueError: no hash today") as err:
        m.fold(keys, [1] * len(keys), sum_create, sum_merge)
    assert isinstance(err.value, TypeError) and isinstance(err.value.__cause__, ValueError)
    assert m.last_fold_count == 500 and dict(m.items()) == {k: 1 for k in range(500)}
    m.check_invariants()


# -- iteration and destructive sort ---------------------------------------------------------------


def test_iteration_yields_pairs_in_insertion_order():
    m = AppendOnlyMap(1)
    keys = ["z", 3, None, (1, "a"), 2.5]
    for i, k in enumerate(keys):
        m.update(k, i)
    assert list(m) == list(m.items()) == [(k, i) for i, k in enumerate(keys)]


def test_destructive_sorted_arrays_order_by_order_hash_with_stable_ties():
    m = AppendOnlyMap(2)
    colliders = [FixedHashObject(i, 3) for i in range(5)]  # equal order hashes: insertion order
    keys = ["b", 10, None, (1, 2), *colliders, -(2**63), 2**70, "a", 2.5]
    m.fold(keys, [f"v{i}" for i in range(len(keys))], sum_create, sum_merge)
    hashes, sorted_keys, sorted_values = m.destructive_sorted_arrays()
    assert hashes.dtype.name == "uint64"
    expected = sorted(range(len(keys)), key=lambda i: order_hash(keys[i]))  # stable
    assert hashes.tolist() == [order_hash(keys[i]) for i in expected]
    assert sorted_keys == [keys[i] for i in expected]
    assert sorted_values == [f"v{i}" for i in expected]
    positions = [sorted_keys.index(c) for c in colliders]
    assert positions == sorted(positions)


def test_destructive_sort_of_an_empty_map():
    hashes, keys, values = AppendOnlyMap().destructive_sorted_arrays()
    assert (len(hashes), keys, values) == (0, [], [])


def test_destructive_sorted_iterator_destroys_the_map_immediately():
    m = AppendOnlyMap()
    m.fold(["x", "y"], [1, 2], sum_create, sum_merge)
    it = m.destructive_sorted_iterator()
    with pytest.raises(AssertionError, match=DESTROYED_MESSAGE):
        m.get("x")
    assert sorted(it) == [("x", 1), ("y", 2)]


def test_every_method_fails_after_a_destructive_sort():
    m = AppendOnlyMap()
    m.update("k", 1)
    m.destructive_sorted_arrays()
    calls = [
        lambda: m.get("k"),
        lambda: m.update("k", 2),
        lambda: m.change_value("k", lambda had, old: 1),
        lambda: m.fold(["k"], [1], sum_create, sum_merge),
        lambda: m.items(),
        lambda: iter(m),
        lambda: len(m),
        lambda: m.size,
        lambda: m.capacity,
        lambda: m.grow_threshold,
        lambda: m.at_grow_threshold,
        lambda: "k" in m,
        lambda: m.destructive_sorted_arrays(),
        lambda: m.destructive_sorted_iterator(),
        lambda: m.check_invariants(),
    ]
    for call in calls:
        with pytest.raises(
            AssertionError, match=r"^Map state is invalid from destructive sorting!$"
        ):
            call()
    assert "destroyed" in repr(m)


def test_destruction_during_iteration_is_reported():
    m = AppendOnlyMap()
    m.fold(["a", "b", "c"], [1, 2, 3], sum_create, sum_merge)
    it = iter(m)
    assert next(it) == ("a", 1)
    m.destructive_sorted_arrays()
    with pytest.raises(AssertionError, match=DESTROYED_MESSAGE):
        next(it)


def test_destructive_sort_releases_the_entries():
    class Key:
        def __hash__(self):
            return 1

    key = Key()
    probe = weakref.ref(key)
    m = AppendOnlyMap()
    m.update(key, "v")
    del key
    _, keys, _ = m.destructive_sorted_arrays()
    assert probe() is keys[0]
    del keys
    gc.collect()
    assert probe() is None  # the destroyed map holds no reference


def test_destructive_sort_with_a_failing_hash_leaves_the_map_intact():
    class Flaky(FixedHashObject):
        __slots__ = ()
        armed = False

        def __hash__(self):
            if Flaky.armed:
                raise ZeroDivisionError("hash failed")
            return 7

    m = AppendOnlyMap()
    m.update(Flaky("x", 7), 1)
    Flaky.armed = True
    with pytest.raises(ZeroDivisionError):
        m.destructive_sorted_arrays()
    Flaky.armed = False
    assert len(m) == 1
    m.check_invariants()


# -- the invariant check itself can fail ----------------------------------------------------


def test_check_invariants_detects_a_wrong_cached_hash():
    m = AppendOnlyMap()
    m.fold(["a", "b"], [1, 2], sum_create, sum_merge)
    m.check_invariants()
    m._hashes[1] ^= 1
    with pytest.raises(AssertionError, match="cached hash"):
        m.check_invariants()


def test_check_invariants_detects_a_duplicate_and_a_lost_entry():
    m = AppendOnlyMap()
    m.fold([1, 2, 3], [1, 2, 3], sum_create, sum_merge)
    m._keys[2] = 1
    with pytest.raises(AssertionError):
        m.check_invariants()
    m2 = AppendOnlyMap()
    m2.fold([1, 2, 3], [1, 2, 3], sum_create, sum_merge)
    m2._table[m2._table >= 0] = -1
    with pytest.raises(AssertionError, match="table slots"):
        m2.check_invariants()

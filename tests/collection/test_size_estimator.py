"""The deterministic deep-size estimator and the sampled entry estimator."""

from __future__ import annotations

import os
import sys
from collections import OrderedDict, deque
from collections.abc import Sequence

import numpy as np
import pytest

from extagg.collection import estimate_size
from extagg.collection.size_estimator import (
    DEFAULT_SAMPLE_SIZE,
    allocated_size,
    estimate_entries_size,
)


def size(obj) -> int:
    """What one object occupies: its ``getsizeof`` in the allocator's size classes."""
    return allocated_size(sys.getsizeof(obj))


@pytest.mark.parametrize(
    ("requested", "occupied"),
    [(1, 16), (16, 16), (24, 32), (28, 32), (33, 48), (512, 512), (513, 528), (1000, 1008)],
)
def test_allocations_round_up_to_the_allocator_size_classes(requested, occupied):
    assert allocated_size(requested) == occupied
    assert allocated_size(requested) % 16 == 0


@pytest.mark.parametrize("obj", [None, True, False, -5, 0, 256, ""])
def test_shared_singletons_count_zero(obj):
    assert estimate_size(obj) == 0


@pytest.mark.parametrize("obj", [257, -6, 2**100, 1.5, "x", "héllo", b"bytes", 3j])
def test_atoms_count_their_own_size(obj):
    assert estimate_size(obj) == size(obj)
    assert sys.getsizeof(obj) <= estimate_size(obj) < sys.getsizeof(obj) + 24


def test_containers_add_their_elements():
    a, b = 10**6, "some text"
    assert estimate_size((a, b)) == size((a, b)) + size(a) + size(b)
    assert estimate_size([a, b, None]) == size([a, b, None]) + size(a) + size(b)
    assert estimate_size({a: b}) == size({a: b}) + size(a) + size(b)
    assert estimate_size({a, b}) == size({a, b}) + size(a) + size(b)
    assert estimate_size(frozenset([a])) == size(frozenset([a])) + size(a)
    assert estimate_size(deque([a])) == size(deque([a])) + size(a)
    od = OrderedDict([(b, a)])
    assert estimate_size(od) == size(od) + size(a) + size(b) + size(vars(od))  # its __dict__


def test_shared_objects_count_once_per_call():
    x = 10**9
    assert estimate_size([x, x, x]) == size([x, x, x]) + size(x)
    inner = [x]
    assert estimate_size((inner, inner)) == size((inner, inner)) + size(inner) + size(x)


def test_cycles_terminate():
    a: list = []
    a.append(a)
    assert estimate_size(a) == size(a)
    d: dict = {}
    d["self"] = d
    assert estimate_size(d) == size(d) + size("self")


def test_deep_nesting_does_not_recurse():
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    assert estimate_size(nested) == 100_000 * size([[]]) + size([])


class WithDict:
    def __init__(self):
        self.name = "a name"
        self.values = [10**6]


class Base:
    __slots__ = ("__private", "public")

    def __init__(self):
        self.public = 10**7
        self.__private = "secret text"


class Derived(Base):
    __slots__ = ("extra", "unset")

    def __init__(self):
        super().__init__()
        self.extra = (10**8,)


def test_instances_are_walked_through_dict_and_slots():
    obj = WithDict()
    expected = size(obj) + estimate_size(vars(obj))
    assert estimate_size(obj) == expected
    d = Derived()
    expected = size(d) + size(10**7) + size("secret text") + size((10**8,)) + size(10**8)
    assert estimate_size(d) == expected


def test_classes_modules_and_functions_are_not_walked():
    assert estimate_size(os) == size(os)
    assert estimate_size(WithDict) == size(WithDict)
    assert estimate_size(estimate_size) == size(estimate_size)
    assert estimate_size([os]) == size([os]) + size(os)


def test_numpy_arrays_count_their_buffer():
    arr = np.zeros(1000)
    assert estimate_size(arr) == size(arr) >= arr.nbytes


def test_deterministic():
    data = {i: (str(i), [float(i)] * 3) for i in range(1000)}
    assert estimate_size(data) == estimate_size(data)


# -- the sampled estimator ------------------------------------------------------------------------


class CountingList(Sequence):
    """A real sequence that counts how many items were read."""

    def __init__(self, items):
        self.items = items
        self.reads = 0

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        self.reads += 1
        return self.items[i]


def test_small_tables_are_measured_exactly():
    keys = [f"k{i}" for i in range(50)]
    values = [float(i) for i in range(50)]
    exact = sum(size(k) + size(v) for k, v in zip(keys, values))
    assert estimate_entries_size(keys, values) == exact
    assert estimate_entries_size([], []) == 0


def test_large_tables_cost_a_sample_not_a_scan():
    n = 1_000_000
    keys = CountingList([10**6 + (i % 1000) for i in range(n)])
    values = CountingList([0.5] * n)
    estimate = estimate_entries_size(keys, values)
    assert keys.reads == values.reads == DEFAULT_SAMPLE_SIZE
    assert estimate == pytest.approx(
        n * size(10**6) + size(0.5) * n / DEFAULT_SAMPLE_SIZE, rel=0.01
    )


def test_sampled_estimate_is_close_for_uniform_entries_and_deterministic():
    keys = [f"key-{i:07d}" for i in range(20_000)]
    values = [(i, float(i)) for i in range(20_000)]
    exact = sum(estimate_size(k) + estimate_size(v) for k, v in zip(keys, values))
    sampled = estimate_entries_size(keys, values)
    assert sampled == pytest.approx(exact, rel=0.05)
    assert sampled == estimate_entries_size(keys, values)


def test_a_large_container_is_sampled_not_walked_whole():
    """One value of millions of objects: the walk held a set of every object's id (353 MiB
    above a 5 M-element list before its MemoryLimitError); a sample of its elements is walked
    now and scaled, within a few percent of the exact walk."""
    import tracemalloc

    from extagg.collection import size_estimator

    values = list(range(1_000_000, 3_000_000))
    exact = allocated_size(sys.getsizeof(values)) + len(values) * allocated_size(
        sys.getsizeof(values[-1])
    )
    tracemalloc.start()
    try:
        got = estimate_size(values)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert abs(got - exact) <= 0.05 * exact
    assert peak < 1 << 20  # a sample's ids, not two million
    nested = {i: [str(i)] * 3 for i in range(10_000)}
    assert estimate_size(nested) > 10_000 * size_estimator.allocated_size(sys.getsizeof([1] * 3))
    # a sampled element larger than the others together counts once, not scaled as if all
    # were like it
    mixed = [0] * 1000 + [list(range(1_000_000, 1_100_000))] + [0] * 999
    assert estimate_size(mixed[1000]) < estimate_size(mixed) < 2 * estimate_size(mixed[1000])

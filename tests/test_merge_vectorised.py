"""The generic combine's vectorised path (plain int/str keys, ``+`` over floats and ints).

It must give exactly what the row-by-row path gives — same keys, same order, the same
combiner objects' values and types, float sums equal bit for bit (the same left fold in the
same order) — and fall back to it for anything else: other key types, unequal keys of one
hash, mixed or non-numeric combiners, a function that is not a plain ``+``, an ``int64``
overflow.
"""

from __future__ import annotations

import functools
import math
import operator
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg import Aggregator, ExternalAppendOnlyMap
from extagg.hashing import order_hashes
from extagg.merge import _combine_kernels as kernels
from extagg.merge import _combine_reference as reference
from extagg.merge import objects
from extagg.merge.objects import combine_object_pieces, is_plain_add
from extagg.spill.blocks import ObjectBlock

from .conftest import files_under

floats = st.floats(allow_nan=True, allow_infinity=True, width=64)
int64s = st.integers(reference.INT64_MIN, reference.INT64_MAX)


def _bits(values):
    """Values with floats as their bit patterns (-0.0 != 0.0), types kept; every NaN is one
    value (Python's own ``nan + nan`` and ``inf - inf`` give either sign, depending on
    which of its compiled adds runs)."""
    return [
        (float, "nan")
        if isinstance(v, float) and v != v
        else (type(v), struct.pack("<d", v))
        if isinstance(v, float)
        else (type(v), v)
        for v in values
    ]


def _starts(draw_sizes):
    sizes = [s for s in draw_sizes if s > 0]
    return np.cumsum([0, *sizes[:-1]]).astype(np.int64), sum(sizes)


# ------------------------------------------------------------------ kernels vs references
@given(data=st.data(), sizes=st.lists(st.integers(1, 12), min_size=1, max_size=20))
def test_float_segment_sum_matches_reference(data, sizes):
    starts, n = _starts(sizes)
    values = np.array(data.draw(st.lists(floats, min_size=n, max_size=n)), dtype=np.float64)
    got = np.empty(len(starts))
    want = np.empty(len(starts))
    assert kernels.segment_sum(values, starts, got, -np.inf, np.inf) == -1
    assert reference.segment_sum(values, starts, want, -np.inf, np.inf) == -1
    assert _bits(got.tolist()) == _bits(want.tolist())
    # and the reference is what reduce(+) over Python floats gives
    ends = [*starts[1:].tolist(), n]
    for g, (s, e) in enumerate(zip(starts.tolist(), ends)):
        assert _bits([want[g].item()]) == _bits(
            [functools.reduce(operator.add, values[s:e].tolist())]
        )


@given(data=st.data(), sizes=st.lists(st.integers(1, 6), min_size=1, max_size=20))
def test_int_segment_sum_matches_reference_and_stops_at_overflow(data, sizes):
    starts, n = _starts(sizes)
    values = np.array(
        data.draw(st.lists(st.one_of(int64s, st.integers(-5, 5)), min_size=n, max_size=n)),
        dtype=np.int64,
    )
    got = np.zeros(len(starts), dtype=np.int64)
    want = np.zeros(len(starts), dtype=np.int64)
    info = np.iinfo(np.int64)
    bounds = (np.int64(info.min), np.int64(info.max))
    at = kernels.segment_sum(values, starts, got, *bounds)
    assert at == reference.segment_sum(values, starts, want, *bounds)
    done = len(starts) if at < 0 else at
    assert got[:done].tolist() == want[:done].tolist()


# ------------------------------------------------------------------ recognising a plain +
def _add_def(c, v):
    return c + v


def test_plain_add_recognised_only_when_it_is_one():
    assert is_plain_add(operator.add)
    assert is_plain_add(lambda a, b: a + b)
    assert is_plain_add(_add_def)
    offset = 1
    for other in (
        lambda a, b: b + a,
        lambda a, b: a - b,
        lambda a, b: a + b + 0,
        lambda a, b: a + b + offset,
        lambda *a: a[0] + a[1],
        lambda a, b, *rest: a + b,
        functools.partial(operator.add),
        operator.sub,
        sum,
        max,
        "not callable",
    ):
        assert not is_plain_add(other), other

    def closure(a, b):
        def inner():
            return a

        return a + b

    assert not is_plain_add(closure)


# ------------------------------------------------------------------ fast path == row path
def _pieces(groups):
    """Hash-sorted pieces (keys unique within each) from ``groups``: key -> values (one per
    piece that holds the key)."""
    width = max((len(v) for v in groups.values()), default=0)
    keys = list(groups)
    hashes = order_hashes(keys) if keys else np.empty(0, np.uint64)
    pieces = []
    for p in range(width):
        rows = [(h, k, groups[k][p]) for h, k in zip(hashes.tolist(), keys) if len(groups[k]) > p]
        rows.sort(key=lambda r: r[0])
        pieces.append(
            ObjectBlock(
                np.array([r[0] for r in rows], dtype=np.uint64),
                [r[1] for r in rows],
                [r[2] for r in rows],
            )
        )
    return pieces


def _row_by_row(pieces, merge, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(objects, "VECTOR_MIN_ROWS", 1 << 62)
        return combine_object_pieces(pieces, merge)


def _same_blocks(a, b):
    assert a.hashes.tolist() == b.hashes.tolist()
    assert [(type(k), k) for k in a.keys] == [(type(k), k) for k in b.keys]
    assert _bits(a.values) == _bits(b.values)


plain_keys = st.one_of(
    st.integers(-(2**70), 2**70),
    int64s,
    st.integers(0, 300),
    st.text(max_size=4),
)
combiners = st.sampled_from(
    [
        lambda a, b: a + b,
        operator.add,
        lambda a, b: a * 0.5 + b,  # not a plain +: called per pair
    ]
)
numbers = st.one_of(
    st.lists(floats, min_size=1, max_size=5),
    st.lists(int64s, min_size=1, max_size=5),
    st.lists(st.integers(-3, 3), min_size=1, max_size=5),
    st.lists(st.one_of(floats, st.integers(-3, 3)), min_size=1, max_size=5),
    st.lists(st.sampled_from([True, 2, 2.5, 2**70]), min_size=1, max_size=5),
)


@settings(max_examples=150, deadline=None)
@given(
    groups=st.dictionaries(plain_keys, numbers, min_size=1, max_size=120),
    merge=combiners,
)
def test_vectorised_combine_equals_row_by_row(groups, merge, monkeypatch):
    pieces = _pieces(groups)
    if len(pieces) < 2:
        return
    want = _row_by_row(pieces, merge, monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(objects, "VECTOR_MIN_ROWS", 2)
        got = combine_object_pieces(pieces, merge)
    _same_blocks(got, want)


@pytest.mark.parametrize("key_kind", ["int", "str"])
def test_unequal_keys_of_one_hash_fall_back(key_kind, monkeypatch):
    """Forged hashes: unequal plain keys share a hash, interleaved; each is combined with its
    equals only, exactly as the row path does it."""
    monkeypatch.setattr(objects, "VECTOR_MIN_ROWS", 2)
    a, b, c = (1, 2, 3) if key_kind == "int" else ("a", "b", "c")
    h = np.array([5, 5, 5, 9], dtype=np.uint64)
    pieces = [
        ObjectBlock(h, [a, b, c, a * 2], [1.0, 2.0, 3.0, 4.0]),
        ObjectBlock(h[:3], [c, a, b], [10.0, 20.0, 30.0]),
    ]
    got = combine_object_pieces(pieces, lambda x, y: x + y)
    assert sorted(zip(got.keys, got.values), key=str) == sorted(
        [(a, 21.0), (b, 32.0), (c, 13.0), (a * 2, 4.0)], key=str
    )
    _same_blocks(got, _row_by_row(pieces, lambda x, y: x + y, monkeypatch))


def test_int64_overflow_gives_python_ints(monkeypatch):
    monkeypatch.setattr(objects, "VECTOR_MIN_ROWS", 2)
    big = 2**62
    h = np.array([1, 2], dtype=np.uint64)
    pieces = [ObjectBlock(h, [1, 2], [big, 5]), ObjectBlock(h, [1, 2], [big, 6])]
    got = combine_object_pieces(pieces, operator.add)
    assert got.values == [2**63, 11]
    assert got.keys == [1, 2]


def test_nan_sums_and_signed_zeros_are_bitwise_the_same(monkeypatch):
    monkeypatch.setattr(objects, "VECTOR_MIN_ROWS", 2)
    h = np.array([1, 2, 3], dtype=np.uint64)
    pieces = [
        ObjectBlock(h, ["x", "y", "z"], [-0.0, math.inf, 1e308]),
        ObjectBlock(h, ["x", "y", "z"], [-0.0, -math.inf, 1e308]),
        ObjectBlock(h, ["x", "y", "z"], [0.0, 1.0, -1e308]),
    ]
    got = combine_object_pieces(pieces, lambda a, b: a + b)
    want = _row_by_row(pieces, lambda a, b: a + b, monkeypatch)
    _same_blocks(got, want)
    assert math.isinf(got.values[2])  # (1e308 + 1e308) - 1e308: left to right, overflows


# ------------------------------------------------------------------ the whole engine
engine_keys = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 40),
    st.sampled_from([2**64, -(2**70)]),
    st.text(max_size=3),
    st.none(),
    st.tuples(st.integers(0, 3), st.text(max_size=1)),
    st.floats(allow_nan=True, width=64),
)
engine_values = st.one_of(st.floats(-1e6, 1e6, width=64), st.integers(-1000, 1000))


@settings(max_examples=60, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(st.one_of(st.integers(0, 60), engine_keys), engine_values), max_size=400
    ),
    every=st.integers(3, 60),
    batch=st.integers(2, 9),
    fan_in=st.integers(2, 6),
    float_only=st.booleans(),
)
def test_engine_results_identical_to_row_by_row_merge(
    spill_dir, monkeypatch, pairs, every, batch, fan_in, float_only
):
    """Forced spills, tiny batches and fan-ins (intermediate merges): the vectorised merge
    gives exactly the row path's output, and the dict's groups."""
    if float_only:
        pairs = [(k, float(v)) for k, v in pairs]
    aggregator = Aggregator(lambda v: v, lambda c, v: c + v, lambda a, b: a + b)
    options = dict(
        memory="16m", spill_dirs=[spill_dir], force_spill_every=every, batch_size=batch,
        fan_in=fan_in, typed_path=False,
    )  # fmt: skip

    def run():
        with ExternalAppendOnlyMap(aggregator, **options) as m:
            m.insert_all(pairs)
            return list(m.iterator())

    monkeypatch.setattr(objects, "VECTOR_MIN_ROWS", 2)
    got = run()
    monkeypatch.setattr(objects, "VECTOR_MIN_ROWS", 1 << 62)
    want = run()
    assert [(type(k), repr(k)) for k, _ in got] == [(type(k), repr(k)) for k, _ in want]
    assert _bits([v for _, v in got]) == _bits([v for _, v in want])
    assert len(got) == len({"nan" if k != k else k for k, _ in pairs})  # 1 == 1.0 == True
    assert files_under(spill_dir) == []


def test_engine_takes_the_vectorised_paths_on_plain_keys(spill_dir, monkeypatch):
    """Spilled int keys with float sums are read and combined as arrays (IntKeyBlock), str
    keys through the NumPy path (both counted), and the result is the dict's."""
    taken: dict[str, list[bool]] = {"arrays": [], "plain": []}

    def counting(name, function):
        def wrapper(pieces, merge):
            out = function(pieces, merge)
            taken[name].append(out is not None)
            return out

        return wrapper

    monkeypatch.setattr(
        objects, "_combine_int_arrays", counting("arrays", objects._combine_int_arrays)
    )
    monkeypatch.setattr(
        objects, "_combine_plain_keys", counting("plain", objects._combine_plain_keys)
    )
    rng = np.random.default_rng(3)
    for kind, keys in (
        ("arrays", (rng.integers(0, 500, 20_000) * 2**53 + 2**62).tolist()),
        ("plain", [f"user_{k}" for k in rng.integers(0, 500, 20_000).tolist()]),
    ):
        taken["arrays"].clear()
        taken["plain"].clear()
        pairs = list(zip(keys, rng.random(len(keys)).tolist()))
        with ExternalAppendOnlyMap(
            Aggregator(lambda v: v, lambda c, v: c + v, lambda a, b: a + b),
            typed_path=False,
            memory="16m",
            spill_dirs=[spill_dir],
            force_spill_every=3_000,
        ) as m:
            m.insert_all(pairs)
            got = list(m.iterator())
            assert m.metrics.spill_count >= 5
        assert taken[kind] and all(taken[kind]), kind
        assert all(type(k) is type(keys[0]) and type(v) is float for k, v in got)
        expected: dict = {}
        for k, v in pairs:
            expected[k] = expected.get(k, 0.0) + v
        assert len(got) == len(dict(got)) == len(expected)
        for k, total in got:  # each key's runs are combined in spill order, not input order
            assert math.isclose(total, expected[k], rel_tol=1e-12)
        assert files_under(spill_dir) == []


@pytest.mark.parametrize("kind", ["int64", "str"])
def test_array_merge_stays_near_its_budget(spill_dir, kind):
    """The array paths hold no more than the row path did: many runs at a 2 MiB budget,
    Python allocations traced during the merge (numbers, lists and NumPy arrays all report to
    tracemalloc), the same 2x bound as ``tests/test_merge_memory.py``."""
    import tracemalloc

    budget = 2 * 1024 * 1024
    rng = np.random.default_rng(11)
    index = rng.integers(0, 25_000, 200_000)
    if kind == "int64":
        keys = (index * 2**37 + 2**62).tolist()
    else:
        keys = [f"user_{k}" for k in index.tolist()]
    values = rng.random(len(keys)).tolist()
    with ExternalAppendOnlyMap(
        Aggregator(lambda v: v, lambda c, v: c + v, lambda a, b: a + b),
        typed_path=False,
        memory=budget,
        spill_dirs=[spill_dir],
    ) as m:
        m.insert_all(zip(keys, values))
        assert m.metrics.spill_count >= 5
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            groups, total = 0, 0.0
            for _, c in m:
                groups += 1
                total += c
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert m.metrics.peak_granted_bytes <= budget
    assert groups == len(set(keys))
    assert math.isclose(total, sum(values), rel_tol=1e-9)
    assert peak <= 2 * budget, f"merge held {peak / 2**20:.1f} MiB at a 2 MiB budget"
    assert files_under(spill_dir) == []


def test_map_after_a_spill_is_presized_and_its_arrays_stay_granted(spill_dir):
    """After a spill of its own the new map starts at the spilled map's capacity, and the
    grant kept covers its (empty) arrays; a spill forced by another consumer starts small."""
    from extagg.collection.append_only_map import DEFAULT_CAPACITY
    from extagg.memory import MemoryConsumer, UnifiedMemoryManager, task_memory_manager

    keys = np.random.default_rng(5).permutation(200_000) + 2**62
    pairs = list(zip(keys.tolist(), [1.0] * len(keys)))
    with ExternalAppendOnlyMap(
        Aggregator(lambda v: v, lambda c, v: c + v, lambda a, b: a + b),
        typed_path=False,
        memory="4m",
        spill_dirs=[spill_dir],
    ) as m:
        m.insert_all(pairs[:60_000])
        assert m.metrics.spill_count >= 1
        spills = m.metrics.spill_count
        for start in range(60_000, len(pairs), 1024):  # stop right after the next spill
            m.insert_all(pairs[start : start + 1024])
            if m.metrics.spill_count > spills:
                break
        assert m.metrics.spill_count > spills
        assert m._map.capacity > DEFAULT_CAPACITY
        assert m.used >= m._map.estimate_size() - 1024 * 200  # one chunk folded since
        assert m.budget.max_memory >= m.used

    manager = UnifiedMemoryManager(8 * 1024 * 1024)
    task = task_memory_manager(manager, "presize-test")
    emap = ExternalAppendOnlyMap(
        Aggregator(lambda v: v, lambda c, v: c + v, lambda a, b: a + b),
        typed_path=False,
        memory_manager=task,
        spill_dirs=[spill_dir],
    )
    try:
        emap.insert_all(pairs[:30_000])
        other = MemoryConsumer(task, name="other")
        got = other.acquire_memory(manager.max_memory)
        assert emap.metrics.spill_count >= 1
        assert emap._map.capacity == DEFAULT_CAPACITY
        other.free_memory(got)
    finally:
        emap.close()
    assert files_under(spill_dir) == []

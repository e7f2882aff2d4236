"""PairArrays: typed pairs as arrays read back as the very pairs they stand for."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg.collection.pair_arrays import PairArrays

INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(st.characters(codec="utf-8"), max_size=6) | st.sampled_from(["", "a", "é", "\ud800"])


def block_of(keys: list, values: list, counts: list | None = None) -> PairArrays:
    """A block built from Python objects (the reference the arrays must read back as)."""
    kind = np.float64 if values and type(values[0]) is float else np.int64
    states = np.array(values, dtype=kind)
    count_array = None if counts is None else np.array(counts, dtype=np.int64)
    if keys and type(keys[0]) is str:
        encoded = [k.encode("utf-8", "surrogatepass") for k in keys]
        offsets = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        arena = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        ascii_keys = all(e.isascii() for e in encoded)
        return PairArrays(None, offsets, arena, ascii_keys, states, count_array)
    return PairArrays(np.array(keys, dtype=np.int64), None, None, True, states, count_array)


@st.composite
def blocks(draw):
    n = draw(st.integers(0, 40))
    keys = draw(st.lists(TEXT if draw(st.booleans()) else INT64, min_size=n, max_size=n))
    if draw(st.booleans()):
        values = draw(st.lists(st.floats(allow_nan=True), min_size=n, max_size=n))
    else:
        values = draw(st.lists(INT64, min_size=n, max_size=n))
    counts = draw(st.none() | st.lists(st.integers(0, 2**40), min_size=n, max_size=n))
    return keys, values, counts


def expected_pairs(keys, values, counts):
    if counts is None:
        return list(zip(keys, values))
    return list(zip(keys, zip(values, counts)))


def exact(obj):
    """A comparable form: types kept, floats by their bits (NaN equals NaN, -0.0 is not 0.0)."""
    if isinstance(obj, tuple):
        return tuple(exact(o) for o in obj)
    if type(obj) is float:
        return ("float", struct.pack("<d", obj))
    return (type(obj).__name__, obj)


def same(a, b) -> bool:
    """The same pairs, value for value and type for type."""
    return [exact(x) for x in a] == [exact(x) for x in b]


@settings(max_examples=150, deadline=None)
@given(blocks(), st.data())
def test_block_reads_back_as_its_pairs(drawn, data):
    keys, values, counts = drawn
    block = block_of(keys, values, counts)
    pairs = expected_pairs(keys, values, counts)
    assert len(block) == len(pairs)
    assert same(list(block), pairs)
    assert same(list(pickle.loads(pickle.dumps(block, protocol=5))), pairs)
    n = len(pairs)
    start = data.draw(st.integers(0, n))
    stop = data.draw(st.integers(start, n))
    assert same(list(block.slice(start, stop)), pairs[start:stop])
    # a slice of a slice pickles from its own bytes only
    part = block.slice(start, stop)
    assert same(list(pickle.loads(pickle.dumps(part, protocol=5))), pairs[start:stop])
    index = data.draw(st.lists(st.integers(0, max(0, n - 1)), max_size=30)) if n else []
    taken = block.take(np.array(index, dtype=np.int64))
    assert same(list(taken), [pairs[i] for i in index])
    assert same(list(PairArrays.concat([block.slice(0, start), part, block.slice(stop, n)])), pairs)


def test_pickled_slice_carries_only_its_own_keys():
    keys = [f"key-{i:06d}" for i in range(10_000)]
    block = block_of(keys, list(range(10_000)))
    small = pickle.dumps(block.slice(5000, 5010), protocol=5)
    assert len(small) < 600
    assert list(pickle.loads(small)) == list(zip(keys[5000:5010], range(5000, 5010)))


def test_inconsistent_blocks_are_refused():
    with pytest.raises(TypeError, match="float64 or int64"):
        PairArrays(np.arange(3), None, None, True, np.arange(3, dtype=np.int32))
    with pytest.raises(ValueError, match="one per state"):
        PairArrays(np.arange(2), None, None, True, np.arange(3))
    with pytest.raises(ValueError, match="n \\+ 1 offsets"):
        PairArrays(None, np.zeros(2, dtype=np.int64), np.empty(0, np.uint8), True, np.arange(3))
    with pytest.raises(TypeError, match="mixed"):
        PairArrays.concat([block_of([1], [1]), block_of(["a"], [1])])

import enum
import os
import subprocess
import sys

import mmh3
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extagg.hashing import (
    NONE_HASH,
    SEED,
    hash_array,
    hash_objects,
    order_hash,
    partition_of,
    stable_hash,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(),
    st.binary(),
)
keys = st.recursive(scalars, lambda inner: st.tuples(inner, inner), max_leaves=6)


def test_known_values_are_fixed():
    # pinned: changing the hash would silently re-partition every user's data and state files
    assert stable_hash(1) == 17219191734650647793
    assert stable_hash("a") == 16052954400332101403
    assert stable_hash(None) == NONE_HASH == 6660190260529705892
    assert stable_hash((1, "a")) == 10856170035730250829


def test_strings_are_mmh3_compatible():
    for s in ["", "a", "héllo", "x" * 100]:
        assert stable_hash(s) == mmh3.hash64(s.encode(), SEED, signed=False)[0]
        assert stable_hash(s.encode()) == stable_hash(s)


@given(keys)
def test_range_is_unsigned_64_bit(key):
    h = stable_hash(key)
    assert 0 <= h < 2**64


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_equal_numbers_hash_equal(i):
    if i in (0, 1):
        assert stable_hash(i) == stable_hash(bool(i))
    f = float(i)
    if f == i:
        assert stable_hash(f) == stable_hash(i)


def test_int_float_bool_agree_like_python_equality():
    assert stable_hash(1) == stable_hash(1.0) == stable_hash(True)
    assert stable_hash(0) == stable_hash(-0.0) == stable_hash(False)
    assert stable_hash(float("nan")) == stable_hash(float("-nan"))
    assert stable_hash(2**70) == stable_hash(float(2**70))
    assert stable_hash(1.5) != stable_hash(1)


@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=50))
def test_hash_array_matches_scalar_ints(values):
    arr = np.array(values, dtype=np.int64)
    assert hash_array(arr).tolist() == [stable_hash(v) for v in values]


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=50))
def test_hash_array_matches_scalar_floats(values):
    arr = np.array(values, dtype=np.float64)
    assert hash_array(arr).tolist() == [stable_hash(v) for v in values]


@pytest.mark.parametrize(
    "dtype",
    [np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_, np.float32],
)
def test_hash_array_every_dtype(dtype):
    arr = np.arange(0, 100).astype(dtype)
    assert hash_array(arr).tolist() == [stable_hash(v.item()) for v in arr]


@given(st.lists(keys, max_size=40))
def test_hash_objects_matches_scalar(values):
    assert hash_objects(values).tolist() == [stable_hash(v) for v in values]


def test_unsupported_types_raise_type_error_naming_the_type():
    with pytest.raises(TypeError, match="list"):
        stable_hash([1, 2])
    with pytest.raises(TypeError, match="frozenset"):
        stable_hash(frozenset())


class Color(str, enum.Enum):  # at module level: spilled keys are pickled
    RED = "red"


def test_a_str_enum_member_hashes_as_its_value_in_a_spilled_map():
    """``class Color(str, Enum)`` members equal their value (and ``hash`` alike), but were
    hashed as ``str(member)`` (``"Color.RED"``): after a spill they made a group apart."""
    import operator

    from extagg import Aggregator, ExternalAppendOnlyMap

    assert stable_hash(Color.RED) == stable_hash("red")
    records = [("red", 1), (Color.RED, 1), ("red", 1)]
    with ExternalAppendOnlyMap(
        Aggregator.reducing(operator.add), memory="4m", force_spill_every=1
    ) as m:
        m.insert_all(records)
        assert list(m.iterator()) == [("red", 3)]


def test_order_hash_falls_back_for_user_objects():
    class Fixed:
        def __hash__(self):
            return 1

    assert order_hash(Fixed()) == order_hash(Fixed())
    assert order_hash("a") == stable_hash("a")


def test_partition_of_in_range():
    assert {partition_of(k, 7) for k in range(1000)} == set(range(7))


def test_independent_of_pythonhashseed():
    code = (
        "from extagg.hashing import stable_hash; print(stable_hash(('user', 42, b'x', None, 1.5)))"
    )
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(out.stdout.strip())
    assert len(outputs) == 1


@given(st.lists(st.text(), max_size=40), st.integers(1, 7), st.integers(1, 30))
def test_hash_str_list_is_stable_hash(strings, piece, piece_chars):
    """The compiled string hashing (spills of str-keyed maps) equals ``stable_hash`` per key,
    for ASCII, non-ASCII and lone-surrogate text, across piece boundaries (of keys and of
    characters, a key longer than a piece included)."""
    import extagg._hash_kernels as hk

    saved = hk.STR_PIECE, hk.STR_PIECE_CHARS
    hk.STR_PIECE, hk.STR_PIECE_CHARS = piece, piece_chars
    try:
        got = hk.hash_str_list(strings)
    finally:
        hk.STR_PIECE, hk.STR_PIECE_CHARS = saved
    assert got is not None
    assert got.tolist() == [stable_hash(s) for s in strings]
    assert got.tolist() == hash_objects(strings).tolist()


def test_hash_str_list_copies_a_bounded_piece_of_long_keys():
    """The pieces joined and encoded were 16384 keys, whatever their length: a spill of
    2000-character keys copied 2 x 31 MiB outside the budget (3.2 x a 16 MiB budget in RSS)."""
    import tracemalloc

    import extagg._hash_kernels as hk

    keys = [f"{i:08d}" + "k" * 2000 for i in range(8000)]  # 16 MB of keys
    hk.hash_str_list(keys[:10])  # compiled before the measure
    tracemalloc.start()
    try:
        got = hk.hash_str_list(keys)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got is not None and got[17] == stable_hash(keys[17])
    assert peak < 2 * 2**20 + 8 * len(keys) * 3, peak  # a 256 Ki-character piece, offsets


def test_hash_str_list_declines_other_keys():
    import extagg._hash_kernels as hk

    class Name(str):
        pass

    assert hk.hash_str_list(["a", 1]) is None
    assert hk.hash_str_list(["a", Name("a")]) is None
    assert hk.hash_str_list(["\ud800", "é", ""]).tolist() == [
        stable_hash(s) for s in ["\ud800", "é", ""]
    ]


@pytest.mark.parametrize(
    "values",
    [
        np.array([-128, 0, 127], np.int8),
        np.array([0, 2**64 - 1, 2**63], np.uint64),
        np.array([-(2**63), 2**63 - 1, 5]),
        np.array([True, False]),
        np.array([0.0, -0.0, float("nan")]),
        np.array([float("inf"), 2.0**63, 2.0**64, -(2.0**63)]),
        np.array([1.5, float("nan"), -0.0, 7.0], np.float32),
        np.array([1.5, 2.0], np.float16),
    ],
)
def test_a_few_keys_hash_one_by_one_as_the_vectorised_form_does(values, monkeypatch):
    """Arrays of up to ``SCALAR_HASH_MAX`` keys (a map's single ``insert``) are hashed key by
    key (~30 us less a call): the same hashes as the vectorised form."""
    import extagg.hashing as hashing

    few = hash_array(values)
    monkeypatch.setattr(hashing, "SCALAR_HASH_MAX", 0)
    assert few.dtype == np.uint64 and few.tolist() == hash_array(values).tolist()

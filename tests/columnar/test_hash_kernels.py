"""The numba hashes equal extagg.hashing.stable_hash bit for bit."""

from __future__ import annotations

import math

import mmh3
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extagg import _hash_kernels as H
from extagg.columnar.columns import to_column
from extagg.columnar.keys import KeyLayout
from extagg.hashing import SEED, stable_hash

NO_MASK = np.zeros(0, dtype=np.bool_)

INT_TYPES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint8": (0, 2**8 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
}
SPECIAL_FLOATS = [
    0.0, -0.0, 1.0, -1.0, 0.5, math.nan, math.inf, -math.inf, 2.0**52, 2.0**53 + 2, 2.0**63,
    -(2.0**63), 2.0**64, -(2.0**64), 2.0**64 - 2048, 2.0**70, -(2.0**70), 1e308, -1e308, 5e-324,
    -(2.0**63) - 2048, 1.7976931348623157e308,
]  # fmt: skip


def _hashes(arr: pa.Array) -> list[int]:
    layout = KeyLayout(["x"], [to_column("x", arr).kind], [arr.type])
    return layout.encode([to_column("x", arr)]).hashes.tolist()


@pytest.mark.parametrize("dtype", list(INT_TYPES))
@given(data=st.data())
def test_integer_columns(dtype: str, data: st.DataObject) -> None:
    lo, hi = INT_TYPES[dtype]
    values = data.draw(st.lists(st.one_of(st.none(), st.integers(lo, hi)), max_size=40))
    arr = pa.array(values, type=pa.from_numpy_dtype(np.dtype(dtype)))
    assert _hashes(arr) == [stable_hash(v) for v in values]


@given(st.lists(st.one_of(st.none(), st.floats(), st.sampled_from(SPECIAL_FLOATS)), max_size=40))
def test_float64_column(values: list) -> None:
    assert _hashes(pa.array(values, type=pa.float64())) == [stable_hash(v) for v in values]


@given(st.lists(st.one_of(st.none(), st.floats(width=32)), max_size=40))
def test_float32_column(values: list) -> None:
    arr = pa.array(values, type=pa.float32())
    assert _hashes(arr) == [stable_hash(v) for v in arr.to_pylist()]


def test_special_floats_scalar() -> None:
    for f in SPECIAL_FLOATS:
        assert int(H.hash_f64(f)) == stable_hash(f), f


@given(st.lists(st.one_of(st.none(), st.booleans()), max_size=20))
def test_bool_column(values: list) -> None:
    assert _hashes(pa.array(values, type=pa.bool_())) == [stable_hash(v) for v in values]


@given(st.lists(st.one_of(st.none(), st.text()), max_size=30))
def test_string_column(values: list) -> None:
    assert _hashes(pa.array(values, type=pa.string())) == [stable_hash(v) for v in values]
    assert _hashes(pa.array(values, type=pa.large_string())) == [stable_hash(v) for v in values]


@given(st.lists(st.one_of(st.none(), st.binary(max_size=70)), max_size=30))
def test_binary_column(values: list) -> None:
    assert _hashes(pa.array(values, type=pa.binary())) == [stable_hash(v) for v in values]


@given(st.binary(max_size=100), st.integers(0, 7))
def test_mmh3_at_any_offset(data: bytes, offset: int) -> None:
    buf = np.frombuffer(b"\xff" * offset + data + b"\xee", dtype=np.uint8)
    got = int(H.mmh3_low64(buf, offset, offset + len(data), np.uint64(SEED)))
    assert got == mmh3.hash64(data, SEED, signed=False)[0]


@given(st.lists(st.binary(max_size=40), max_size=60), st.binary(min_size=1, max_size=20))
def test_var_column_tails_read_as_words_or_bytes(values: list[bytes], after: bytes) -> None:
    """Values of every length packed in one buffer with other bytes after it: a tail within
    16 bytes of the buffer's end is read byte by byte, the others as masked 8-byte words
    (the bytes past a value, another value's or ``after``'s, must not leak into its hash)."""
    data = b"".join(values)
    offsets = np.cumsum([0] + [len(v) for v in values], dtype=np.int64)
    out = np.empty(len(values), dtype=np.uint64)
    for buffer in (data, data + after):  # the last values' tails at the end, then not
        H.hash_var_column(offsets, np.frombuffer(buffer, dtype=np.uint8), NO_MASK, out)
        assert out.tolist() == [mmh3.hash64(v, SEED, signed=False)[0] for v in values]


def test_var_column_every_tail_length() -> None:
    values = [bytes(range(1 + n, 1 + 2 * n)) for n in range(49)]  # lengths 0..48, no zeros
    data = np.frombuffer(b"".join(values) + b"\xff" * 16, dtype=np.uint8)
    offsets = np.cumsum([0] + [len(v) for v in values], dtype=np.int64)
    valid = np.ones(len(values), dtype=np.bool_)
    valid[7] = False
    out = np.empty(len(values), dtype=np.uint64)
    H.hash_var_column(offsets, data, valid, out)
    want = [mmh3.hash64(v, SEED, signed=False)[0] for v in values]
    want[7] = stable_hash(None)
    assert out.tolist() == want


def test_temporal_columns_hash_their_integer_storage() -> None:
    days = pa.array([0, 19000, None, -5], type=pa.date32())
    stamps = pa.array([1, None, -(2**62)], type=pa.timestamp("us", tz="UTC"))
    assert _hashes(days) == [stable_hash(v) for v in [0, 19000, None, -5]]
    assert _hashes(stamps) == [stable_hash(v) for v in [1, None, -(2**62)]]


@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
            st.one_of(st.none(), st.text(max_size=8)),
            st.one_of(st.none(), st.floats()),
            st.one_of(st.none(), st.binary(max_size=5)),
        ),
        max_size=25,
    )
)
def test_multi_column_keys_hash_as_tuples(rows: list) -> None:
    types = [pa.int64(), pa.string(), pa.float64(), pa.binary()]
    arrays = [pa.array([r[j] for r in rows], type=t) for j, t in enumerate(types)]
    cols = [to_column(f"c{j}", a) for j, a in enumerate(arrays)]
    layout = KeyLayout([c.name for c in cols], [c.kind for c in cols], types)
    assert layout.encode(cols).hashes.tolist() == [stable_hash(tuple(r)) for r in rows]


def test_tuple_kernels_match_python_tuples() -> None:
    acc = H.tuple_hash_start(2, 3)
    first = np.array([stable_hash(v) for v in (1, 2, 3)], dtype=np.uint64)
    second = np.array([stable_hash(v) for v in ("a", None, 2.5)], dtype=np.uint64)
    H.tuple_hash_mix(acc, first)
    H.tuple_hash_mix(acc, second)
    assert acc.tolist() == [stable_hash(t) for t in [(1, "a"), (2, None), (3, 2.5)]]

"""Aggregate and key kernels against their plain-Python references (bit for bit)."""

from __future__ import annotations

import decimal
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extagg.columnar import _kernels as K
from extagg.columnar import _key_kernels as KK
from extagg.columnar import _key_reference as KR
from extagg.columnar import _reference as R
from extagg.columnar import functions as F
from extagg.columnar.columns import to_column

FUNCS = [f for f in F.FUNCTIONS]
VALUE_TYPES = {
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "int8": (pa.int8(), st.integers(-128, 127)),
    "uint64": (pa.uint64(), st.integers(0, 2**64 - 1)),
    "uint16": (pa.uint16(), st.integers(0, 2**16 - 1)),
    "float64": (
        pa.float64(),
        st.one_of(st.floats(), st.sampled_from([math.nan, -0.0, math.inf, 1e300])),
    ),
    "float32": (pa.float32(), st.floats(width=32)),
    "bool": (pa.bool_(), st.booleans()),
    "date32": (pa.date32(), st.integers(-100_000, 100_000)),
    "decimal15": (pa.decimal128(15, 2), st.integers(-(10**15) + 1, 10**15 - 1)),
    "decimal38": (pa.decimal128(38, 0), st.integers(-(10**38) + 1, 10**38 - 1)),
}


def _allowed(func: str, type_name: str) -> bool:
    if func in ("sum", "mean", "var", "var_pop", "std", "std_pop"):
        return type_name != "date32"
    return True


def _fresh(spec: F.AggregateSpec, groups: int) -> list[np.ndarray]:
    return [np.full(groups, f.fill, dtype=f.dtype) for f in spec.states]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind == "f":
        return np.array_equal(
            a.view(np.uint64 if a.itemsize == 8 else np.uint32),
            b.view(np.uint64 if b.itemsize == 8 else np.uint32),
        ) or np.array_equal(a, b, equal_nan=True)
    return np.array_equal(a, b)


@pytest.mark.parametrize("type_name", list(VALUE_TYPES))
@pytest.mark.parametrize("func", FUNCS)
@given(data=st.data())
def test_update_and_merge_match_reference(func: str, type_name: str, data) -> None:
    if not _allowed(func, type_name):
        return
    arrow_type, values_st = VALUE_TYPES[type_name]
    raw = data.draw(st.lists(st.one_of(st.none(), values_st), max_size=60))
    if type_name == "date32":
        raw = [None if v is None else v for v in raw]
        arr = pa.array(raw, type=pa.int32()).view(pa.date32())
    elif type_name.startswith("decimal"):
        scale = arrow_type.scale
        ctx = decimal.Context(prec=60)
        values = [None if v is None else decimal.Decimal(v).scaleb(-scale, ctx) for v in raw]
        arr = pa.array(values, type=arrow_type)
    else:
        arr = pa.array(raw, type=arrow_type)
    col = to_column("v", arr)
    spec = F.resolve(F.AggregateRequest("out", "v", func), col)
    groups = 5
    gids = np.array(data.draw(st.lists(st.integers(0, groups - 1), min_size=len(raw),
                                       max_size=len(raw))), dtype=np.int64)  # fmt: skip
    fast, slow = _fresh(spec, groups), _fresh(spec, groups)
    F.update(spec, fast, gids, col, 100, K)
    F.update(spec, slow, gids, col, 100, R)
    for a, b in zip(fast, slow):
        assert _same(a, b), (spec.family, a, b)
    # merge the 5 partial groups into 2 output groups, with either implementation
    out_gid = np.array([0, 1, 0, 1, 1], dtype=np.int64)
    merged_fast, merged_slow = _fresh(spec, 2), _fresh(spec, 2)
    F.merge(spec, merged_fast, out_gid, fast, K)
    F.merge(spec, merged_slow, out_gid, slow, R)
    for a, b in zip(merged_fast, merged_slow):
        assert _same(a, b), (spec.family, a, b)


def test_sum128_detects_overflow_and_wraps_back() -> None:
    col = to_column("v", pa.array([2**63 - 1, 1, -1, 2**63 - 1, 2**63 - 1], type=pa.int64()))
    spec = F.resolve(F.AggregateRequest("s", "v", "sum"), col)
    gids = np.array([0, 0, 0, 1, 1], dtype=np.int64)
    states = _fresh(spec, 2)
    F.update(spec, states, gids, col, 0)
    with pytest.raises(F.SumOverflowError) as info:
        F.finalize(spec, states)
    assert info.value.row == 1 and "overflow" in str(info.value) and "'v'" in str(info.value)
    # group 0 went above int64 and came back: exact, no error
    assert F.finalize(spec, [s[:1] for s in states]).to_pylist() == [2**63 - 1]


@given(st.lists(st.one_of(st.none(), st.floats(), st.floats(width=32)), max_size=40))
def test_float_words_match_reference(values) -> None:
    arr = np.array([0.0 if v is None else v for v in values], dtype=np.float64)
    valid = np.array([v is not None for v in values], dtype=np.bool_)
    a = np.empty(len(arr), dtype=np.uint64)
    b = np.empty(len(arr), dtype=np.uint64)
    KK.float_words(arr, valid, a)
    KR.float_words(arr, valid, b)
    assert a.tolist() == b.tolist()


@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=5)), st.one_of(st.none(), st.binary(max_size=3))
        ),
        max_size=30,
    ),
    st.booleans(),
)
def test_var_packing_matches_reference(rows, prefixed) -> None:
    prefix = 4 if prefixed else 0
    n = len(rows)
    cols = []
    for j in range(2):
        arr = pa.array([r[j] for r in rows], type=pa.binary())
        cols.append(to_column(f"c{j}", arr))
    blobs = []
    for mod in (KK, KR):
        lengths = np.zeros(n, dtype=np.int64)
        for c in cols:
            valid = np.zeros(0, np.bool_) if c.valid is None else c.valid
            mod.add_var_lengths(c.offsets, valid, prefix, lengths)
        offsets = np.zeros(n + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(lengths)
        blob = np.zeros(int(offsets[-1]), dtype=np.uint8)
        cursor = offsets[:-1].copy()
        for c in cols:
            valid = np.zeros(0, np.bool_) if c.valid is None else c.valid
            mod.write_var(cursor, c.offsets, c.data, valid, prefix, blob)
        blobs.append((offsets, blob))
    assert blobs[0][1].tobytes() == blobs[1][1].tobytes()
    if prefixed:
        offsets, blob = blobs[0]
        for j in range(2):
            o1, d1 = KK.unpack_var(offsets, blob, j)
            o2, d2 = KR.unpack_var(offsets, blob, j)
            assert o1.tolist() == o2.tolist() and d1.tobytes() == d2.tobytes()
            got = [d1[o1[i] : o1[i + 1]].tobytes() for i in range(n)]
            assert got == [r[j] or b"" for r in rows]

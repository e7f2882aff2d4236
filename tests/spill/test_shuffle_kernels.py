"""The byte-plane kernels against their NumPy reference (the column codec's ``S`` kind)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from extagg.spill import _shuffle_kernels as SK
from extagg.spill.codecs import byte_planes, from_byte_planes


@given(width=st.sampled_from([4, 8]), n=st.integers(0, 500), seed=st.integers(0, 2**32 - 1))
def test_kernels_match_the_numpy_reference(width, n, seed) -> None:
    dtype = np.uint64 if width == 8 else np.uint32
    values = np.random.default_rng(seed).integers(0, 256, n * width, dtype=np.uint8).view(dtype)
    planes = np.empty(n * width, dtype=np.uint8)
    (SK.to_planes_u64 if width == 8 else SK.to_planes_u32)(values, planes)
    np.testing.assert_array_equal(planes, byte_planes(values).reshape(-1))
    back = np.empty(n, dtype=dtype)
    (SK.from_planes_u64 if width == 8 else SK.from_planes_u32)(planes, back)
    np.testing.assert_array_equal(back, values)
    np.testing.assert_array_equal(from_byte_planes(planes.view(dtype)), values)


def test_kernels_read_unaligned_planes() -> None:
    """A batch's arrays sit anywhere in its payload: the planes may start at any byte."""
    values = np.arange(1000, dtype=np.uint64) * 0x0102030405
    payload = np.zeros(8001, dtype=np.uint8)
    SK.to_planes_u64(values, payload[1:])
    back = np.empty(1000, dtype=np.uint64)
    SK.from_planes_u64(payload[1:], back)
    np.testing.assert_array_equal(back, values)

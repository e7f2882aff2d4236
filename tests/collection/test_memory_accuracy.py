"""The SizeTrackingAppendOnlyMap's estimate against what tracemalloc sees the map really hold.

Contract: the estimate stays within +-30% of the traced bytes. Every key, value and combiner is
created inside the traced window (keys arrive as fresh objects per record, as they do when
parsed from a file), the numba kernels are compiled before it, and the batches are dropped before
measuring, so what remains traced is the map.
"""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from extagg.collection import SizeTrackingAppendOnlyMap

TOLERANCE = 0.30
BATCH = 1024


def _append(c, v):
    c.append(v)
    return c


COMBINERS = {
    # name: (make keys from int indices, create_combiner, merge_value)
    "int": (lambda idx: (idx * 7919 + 10**6).tolist(), lambda v: v, lambda c, v: c + v),
    "float": (lambda idx: (idx + 0.5).tolist(), float, lambda c, v: c + v),
    "str": (
        lambda idx: [f"key-{i:08d}" for i in idx.tolist()],
        lambda v: f"{v:.6f}",
        lambda c, v: c if len(c) > 24 else c + "+",
    ),
    "tuple": (
        lambda idx: list(zip(idx.tolist(), (idx % 7).tolist())),
        lambda v: (1, v),
        lambda c, v: (c[0] + 1, c[1] + v),
    ),
    "list": (lambda idx: idx.tolist(), lambda v: [v], _append),
}


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    m = SizeTrackingAppendOnlyMap(1)
    for make_keys, create, merge in COMBINERS.values():
        m2 = SizeTrackingAppendOnlyMap(1)
        keys = make_keys(np.arange(300))
        m2.fold(keys, [0.5] * 300, create, merge)
        m2.fold(keys, [0.5] * 300, create, merge)
    m.fold([1, "a"], [1, 2], float, float)


def _traced_build(kind: str, num_keys: int) -> tuple[int, int, int]:
    make_keys, create, merge = COMBINERS[kind]
    rng = np.random.default_rng(7)
    records = num_keys * 3 // 2
    indices = rng.integers(0, num_keys, records)
    values = rng.random(records)
    gc.collect()
    tracemalloc.start()
    try:
        m = SizeTrackingAppendOnlyMap()
        for start in range(0, records, BATCH):
            batch_keys = make_keys(indices[start : start + BATCH])
            batch_values = values[start : start + BATCH].tolist()
            m.fold(batch_keys, batch_values, create, merge)
        del batch_keys, batch_values
        traced, _peak = tracemalloc.get_traced_memory()
        return m.estimate_size(), traced, len(m)
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "num_keys", [10_000, pytest.param(200_000, marks=pytest.mark.slow)], ids=["10k", "200k"]
)
@pytest.mark.parametrize("kind", list(COMBINERS))
def test_estimate_within_30_percent_of_traced_memory(kind, num_keys):
    estimate, traced, groups = _traced_build(kind, num_keys)
    assert groups > num_keys * 0.7
    assert traced * (1 - TOLERANCE) <= estimate <= traced * (1 + TOLERANCE), (
        f"{kind}: estimate {estimate} vs traced {traced} ({estimate / traced:.2f}x)"
    )

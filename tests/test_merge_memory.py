"""The generic merge holds what it was granted: many runs merged under a tiny budget.

Regression: the merge handed rows over to the combine once "half a batch per open source" had
been read, a batch being the largest one seen. The in-memory map was read in batches of
``batch_size`` (10 000 rows) while the runs' batches were sized for the budget (~800 rows), so
every hand-over held ~25 run batches per source: 55 MiB of live Python objects at an 8 MiB
budget with 45 runs (23 MiB at this test's 4 MiB). What is left above the budget (~1.8x here:
the run readers' indexes and the combine's copies of a hand-over) is a known gap, bounded
here at 2x so that a regression to the old hand-over fails. Python allocations are measured
with ``tracemalloc`` (numbers, lists and NumPy arrays all report to it), so the test sees what
the process really holds.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from extagg import Aggregator, ExternalAppendOnlyMap

BUDGET = 4 * 1024 * 1024


def _records(n: int, distinct: int):
    rng = np.random.default_rng(7)
    keys = (rng.integers(0, distinct, n) * 73_856_093 + 2**62).astype(np.int64)
    values = rng.random(n)
    for start in range(0, n, 10_000):
        yield from zip(
            keys[start : start + 10_000].tolist(), values[start : start + 10_000].tolist()
        )


@pytest.mark.slow
def test_merge_of_many_runs_stays_near_its_budget() -> None:
    n, distinct = 1_000_000, 60_000
    reference: dict[int, float] = {}
    for k, v in _records(n, distinct):
        reference[k] = reference.get(k, 0.0) + v
    m = ExternalAppendOnlyMap(
        Aggregator(lambda v: v, lambda c, v: c + v, lambda a, b: a + b),
        typed_path=False,
        memory=BUDGET,
    )
    m.insert_all(_records(n, distinct))
    assert m.metrics.spill_count >= 20  # many runs, merged at once or in passes
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        groups, total, keys_xor = 0, 0.0, 0
        for k, c in m:  # nothing kept: what is traced is the merge's own memory
            groups += 1
            total += c
            keys_xor ^= k
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert groups == len(reference)
    assert abs(total - sum(reference.values())) <= 1e-9 * total
    expected_xor = 0
    for k in reference:
        expected_xor ^= k
    assert keys_xor == expected_xor
    assert peak <= 2 * BUDGET, (
        f"merge held {peak / 2**20:.1f} MiB at a {BUDGET / 2**20:.0f} MiB budget"
    )

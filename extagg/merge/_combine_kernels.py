"""numba kernels of the generic engine's vectorised combine (:mod:`extagg.merge.objects`).

:mod:`extagg.merge._combine_reference` is the plain-Python twin and the specification (the
tests compare the two): per group of adjacent rows, a left fold with ``+`` in row order.
"""

from __future__ import annotations

import numpy as np

from extagg._numba import jit

__all__ = ["segment_sum"]


@jit()
def segment_sum(
    values: np.ndarray, starts: np.ndarray, out: np.ndarray, sum_low: float, sum_high: float
) -> int:  # pragma: no cover - compiled
    """Left fold with ``+`` of every group of ``values`` (``float64`` or ``int64``) into
    ``out``; the first group whose sum would leave ``[sum_low, sum_high]``, or ``-1`` (see the
    reference). The bound is tested before each add, so an ``int64`` sum never wraps."""
    n = values.shape[0]
    groups = starts.shape[0]
    for g in range(groups):
        s = starts[g]
        e = starts[g + 1] if g + 1 < groups else n
        total = values[s]
        for i in range(s + 1, e):
            v = values[i]
            if (v > 0 and total > sum_high - v) or (v < 0 and total < sum_low - v):
                return g
            total = total + v
        out[g] = total
    return -1

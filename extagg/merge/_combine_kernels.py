"""numba kernels of the generic engine's vectorised combine (:mod:`extagg.merge.objects`).

:mod:`extagg.merge._combine_reference` is the plain-Python twin and the specification (the
tests compare the two): per group of adjacent rows, a left fold with ``+`` in row order.
"""

from __future__ import annotations

import numpy as np

from extagg._numba import jit

__all__ = ["segment_sum_float", "segment_sum_int"]


@jit()
def segment_sum_float(
    values: np.ndarray, starts: np.ndarray, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    """Left fold with ``+`` of every group of ``values`` into ``out`` (see the reference)."""
    n = values.shape[0]
    groups = starts.shape[0]
    for g in range(groups):
        s = starts[g]
        e = starts[g + 1] if g + 1 < groups else n
        total = values[s]
        for i in range(s + 1, e):
            total = total + values[i]
        out[g] = total


@jit()
def segment_sum_int(
    values: np.ndarray, starts: np.ndarray, out: np.ndarray
) -> int:  # pragma: no cover - compiled
    """The same over ``int64``; the first group that overflows, or ``-1`` (see the reference)."""
    n = values.shape[0]
    groups = starts.shape[0]
    for g in range(groups):
        s = starts[g]
        e = starts[g + 1] if g + 1 < groups else n
        total = values[s]
        for i in range(s + 1, e):
            v = values[i]
            t = total + v
            if ((total ^ t) & (v ^ t)) < 0:
                return g
            total = t
        out[g] = total
    return -1

"""numba kernels of the generic engine's typed path (:mod:`extagg.generic.typed_map`).

They fold a batch of numeric values into per-group states after the typed table has given every
record its group id. :mod:`extagg.generic._typed_fold_reference` is the plain-Python twin and
the specification (the tests compare the two).
"""

from __future__ import annotations

import numpy as np

from extagg._numba import jit
from extagg.generic._typed_fold_reference import OP_ADD, OP_MAX, OP_MIN

__all__ = ["OP_ADD", "OP_MAX", "OP_MIN", "fold_float", "fold_int"]


@jit()
def fold_float(
    op: int, gids: np.ndarray, values: np.ndarray, states: np.ndarray, next_new: int
) -> tuple[int, int]:  # pragma: no cover - compiled
    """Fold ``float64`` ``values`` into ``states`` (see the reference)."""
    n = gids.shape[0]
    for i in range(n):
        g = gids[i]
        v = values[i]
        if g == next_new:
            states[g] = v
            next_new += 1
            continue
        s = states[g]
        if op == OP_ADD:
            states[g] = s + v
        elif op == OP_MIN:
            if v < s:
                states[g] = v
        elif v > s:
            states[g] = v
    return n, next_new


@jit()
def fold_int(
    op: int, gids: np.ndarray, values: np.ndarray, states: np.ndarray, next_new: int
) -> tuple[int, int]:  # pragma: no cover - compiled
    """Fold ``int64`` ``values`` into ``states``, stopping before an overflowing sum."""
    n = gids.shape[0]
    for i in range(n):
        g = gids[i]
        v = values[i]
        if g == next_new:
            states[g] = v
            next_new += 1
            continue
        s = states[g]
        if op == OP_ADD:
            total = s + v  # wraps on overflow: detected by the signs
            if ((s ^ total) & (v ^ total)) < 0:
                return i, next_new
            states[g] = total
        elif op == OP_MIN:
            if v < s:
                states[g] = v
        elif v > s:
            states[g] = v
    return n, next_new

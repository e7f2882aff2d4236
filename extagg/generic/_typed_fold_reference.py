"""Pure-Python references of :mod:`extagg.generic._typed_fold_kernels` (same signatures, same
effects); the tests compare the two. They are also the specification of the typed fold.

A batch of records has already been given group ids (``gids``) by the typed table, new groups
numbered in order of first appearance from ``next_new`` on, so the record that creates group
``g`` is the first record with ``gids[i] == g`` while ``g == next_new``. That record's value
becomes the state (``Aggregator.reducing``'s ``create_combiner`` is the identity); every other
record folds its value in with the operation, exactly as the Python builtins do it:

* ``OP_ADD``: ``state + value``; on ``int64`` an overflow stops the fold at that record (Python
  ints do not overflow: the caller hands the rest to the general path);
* ``OP_MIN``: ``min(state, value)`` keeps ``state`` unless ``value < state`` (so NaN and ``-0.0``
  behave as in Python);
* ``OP_MAX``: ``max(state, value)`` keeps ``state`` unless ``value > state``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["OP_ADD", "OP_MAX", "OP_MIN", "fold_float", "fold_int"]

OP_ADD = 0
OP_MIN = 1
OP_MAX = 2

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def fold_float(
    op: int, gids: np.ndarray, values: np.ndarray, states: np.ndarray, next_new: int
) -> tuple[int, int]:
    """Fold ``float64`` ``values`` into ``states``; returns ``(records folded, next_new)``."""
    for i in range(gids.shape[0]):
        g = int(gids[i])
        v = float(values[i])
        if g == next_new:
            states[g] = v
            next_new += 1
            continue
        s = float(states[g])
        if op == OP_ADD:
            states[g] = s + v
        elif op == OP_MIN:
            if v < s:
                states[g] = v
        elif v > s:
            states[g] = v
    return gids.shape[0], next_new


def fold_int(
    op: int, gids: np.ndarray, values: np.ndarray, states: np.ndarray, next_new: int
) -> tuple[int, int]:
    """Fold ``int64`` ``values`` into ``states``; stops before a sum leaving ``int64`` and
    returns ``(records folded, next_new)``."""
    for i in range(gids.shape[0]):
        g = int(gids[i])
        v = int(values[i])
        if g == next_new:
            states[g] = v
            next_new += 1
            continue
        s = int(states[g])
        if op == OP_ADD:
            total = s + v
            if not _INT64_MIN <= total <= _INT64_MAX:
                return i, next_new
            states[g] = total
        elif op == OP_MIN:
            if v < s:
                states[g] = v
        elif v > s:
            states[g] = v
    return gids.shape[0], next_new

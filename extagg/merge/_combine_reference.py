"""Pure-Python references of :mod:`extagg.merge._combine_kernels` (same signatures, same
results); the tests compare the two. They are also the specification.

The merge hands the generic engine's combine rows sorted by key hash, rows of one key
adjacent and in source order (:func:`extagg.merge.objects.combine_object_pieces`).
``starts`` holds the first row of every group, ascending, ``starts[0] == 0``. Each group's
values are folded from the left in row order, ``((v0 + v1) + v2) + ...`` — exactly what
``functools.reduce(operator.add, group)`` computes over Python floats and ints — so a sum is
the same double, bit for bit, as the user's ``lambda a, b: a + b`` gives — up to the sign
and payload of a NaN, which Python itself does not keep stable (``nan + nan`` and ``inf -
inf`` give either sign depending on which of its compiled adds runs: the generic
``float.__add__`` or the interpreter's specialised one).
"""

from __future__ import annotations

import numpy as np

__all__ = ["INT64_MAX", "INT64_MIN", "segment_sum_float", "segment_sum_int"]

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def segment_sum_float(values: np.ndarray, starts: np.ndarray, out: np.ndarray) -> None:
    """``out[g]`` = the left fold with ``+`` of ``values[starts[g]:starts[g + 1]]``
    (``float64``; the last group runs to the end)."""
    n = len(values)
    groups = len(starts)
    for g in range(groups):
        s = int(starts[g])
        e = int(starts[g + 1]) if g + 1 < groups else n
        total = float(values[s])
        for i in range(s + 1, e):
            total = total + float(values[i])
        out[g] = total


def segment_sum_int(values: np.ndarray, starts: np.ndarray, out: np.ndarray) -> int:
    """The same over ``int64`` values; returns the first group whose sum leaves ``int64`` at
    some step (its ``out`` is undefined, the groups after it not computed), or ``-1``."""
    n = len(values)
    groups = len(starts)
    for g in range(groups):
        s = int(starts[g])
        e = int(starts[g + 1]) if g + 1 < groups else n
        total = int(values[s])
        for i in range(s + 1, e):
            total = total + int(values[i])
            if not INT64_MIN <= total <= INT64_MAX:
                return g
        out[g] = total
    return -1

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

__all__ = ["INT64_MAX", "INT64_MIN", "segment_sum"]

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def segment_sum(
    values: np.ndarray, starts: np.ndarray, out: np.ndarray, sum_low: float, sum_high: float
) -> int:
    """``out[g]`` = the left fold with ``+`` of ``values[starts[g]:starts[g + 1]]`` (the last
    group runs to the end); returns the first group whose sum would leave ``[sum_low,
    sum_high]`` at some step (its ``out`` is undefined, the groups after it not computed), or
    ``-1``. ``int64`` values take ``int64``'s bounds; floats ``±inf``, which never stop."""
    is_int = values.dtype.kind == "i"
    n = len(values)
    groups = len(starts)
    for g in range(groups):
        s = int(starts[g])
        e = int(starts[g + 1]) if g + 1 < groups else n
        total = int(values[s]) if is_int else float(values[s])
        for i in range(s + 1, e):
            v = int(values[i]) if is_int else float(values[i])
            if (v > 0 and total > sum_high - v) or (v < 0 and total < sum_low - v):
                return g
            total = total + v
        out[g] = total
    return -1

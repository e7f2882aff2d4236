"""numba kernels of the CSV/TSV writer: one text column at a time into the rows' bytes.

A CSV field is written as it is unless it holds the delimiter, ``"``, ``\\n`` or ``\\r``, or is
an empty string (kept apart from a null, which is written as nothing): then it is quoted and its
``"`` doubled — RFC 4180's rule, as DuckDB, Polars and Python's ``csv`` module apply it. Columns
that cannot hold such characters (numbers, dates, timestamps) are not looked at
(``check`` false). The pure-Python reference is
:func:`extagg.io.output.csv_lines_by_row`; the tests compare the two.

Array arguments: ``offsets``/``data`` are an Arrow string array's offsets (``n + 1`` of them,
int32 or int64) and bytes; ``valid`` a boolean validity mask, empty when there are no nulls.
"""

from __future__ import annotations

import numpy as np

from extagg._numba import copy_bytes, jit

__all__ = ["csv_field_lengths", "csv_write_fields"]

_jit = jit()

QUOTE = 34  # "
LF = 10
CR = 13


@_jit
def _needs_quotes(data, start, end, delimiter):
    if start == end:
        return True  # an empty string: "" (nothing is a null)
    for k in range(start, end):
        c = data[k]
        if c == QUOTE or c == delimiter or c == LF or c == CR:  # noqa: SIM109 (a loop numba compiles)
            return True
    return False


@_jit
def csv_field_lengths(offsets, data, valid, check, delimiter, lengths):
    """Add each row's field of this column, as written (quoted and escaped where needed), to
    ``lengths[i]`` (separators not included)."""
    n = lengths.shape[0]
    has_nulls = valid.shape[0] > 0
    for i in range(n):
        if has_nulls and not valid[i]:
            continue
        start = offsets[i]
        end = offsets[i + 1]
        size = np.int64(end - start)
        if check and _needs_quotes(data, start, end, delimiter):
            quotes = 0
            for k in range(start, end):
                if data[k] == QUOTE:
                    quotes += 1
            size += quotes + 2
        lengths[i] += size


@_jit
def csv_write_fields(offsets, data, valid, check, delimiter, separator, out, pos):
    """Write each row's field of this column at ``out[pos[i]:]``, then ``separator`` (the
    delimiter, or ``\\n`` after the last column), and advance ``pos[i]`` past them."""
    n = pos.shape[0]
    has_nulls = valid.shape[0] > 0
    for i in range(n):
        p = pos[i]
        if not has_nulls or valid[i]:
            start = offsets[i]
            end = offsets[i + 1]
            if check and _needs_quotes(data, start, end, delimiter):
                out[p] = QUOTE
                p += 1
                for k in range(start, end):
                    c = data[k]
                    out[p] = c
                    p += 1
                    if c == QUOTE:
                        out[p] = QUOTE
                        p += 1
                out[p] = QUOTE
                p += 1
            else:
                size = np.int64(end - start)
                copy_bytes(out, p, data, np.int64(start), size)
                p += size
        out[p] = separator
        pos[i] = p + 1

"""numba kernels of :mod:`extagg.io.decimal_arith`: decimal ``+ - *`` and casts between 128-
and 256-bit decimals, one pass over the values' 64-bit words, for values that fit 63 bits.

A decimal array's values are rows of little-endian 64-bit words (two for 128 bits, four for
256); a value fits when every word above the first is the first word's sign. Each kernel
returns ``False`` as soon as a value (or a result) does not fit, having written nothing the
caller keeps: the caller then uses Arrow's kernel, which is the reference the tests compare
these with. An operand with no rows (``words.shape[0] == 0``) is a scalar, its value given.
"""

from __future__ import annotations

import numpy as np

from extagg._numba import jit

__all__ = ["decimal_arith", "decimal_resize", "low_words_bound", "write_words"]

_jit = jit()

#: the magnitude a scaled operand or a result may reach (a margin below 2^63)
LIMIT = 1 << 62
ADD, SUBTRACT, MULTIPLY = 0, 1, 2


@_jit
def _fits(words, i):
    low = words[i, 0]
    sign = low >> 63
    for k in range(1, words.shape[1]):  # noqa: SIM110 (numba compiles no generator)
        if words[i, k] != sign:
            return False
    return True


@_jit
def _operand_at(words, value, i):
    """(whether it fits, the value) of row ``i`` of an operand (a scalar: ``value``)."""
    if words.shape[0] == 0:
        return True, np.int64(value)
    if not _fits(words, i):
        return False, np.int64(0)
    return True, words[i, 0]


@_jit
def decimal_arith(op, a_words, a_value, a_factor, b_words, b_value, b_factor, out):
    """``out[i] = a[i] * a_factor (op) b[i] * b_factor`` (``op``: ADD, SUBTRACT, MULTIPLY;
    a factor is the power of ten that lines the scales up, 1 for a product); ``False`` if a
    value or a result does not fit."""
    n = out.shape[0]
    limit = np.int64(LIMIT)
    a_most = limit // a_factor  # the largest operand its factor keeps below the limit
    b_most = limit // b_factor
    for i in range(n):
        a_fits, a = _operand_at(a_words, a_value, i)
        b_fits, b = _operand_at(b_words, b_value, i)
        if not (a_fits and b_fits):
            return False
        if a <= -limit or a >= limit or b <= -limit or b >= limit:
            return False
        if op == MULTIPLY:
            # |a|, |b| < 2^62: the float product is within 2^-52 of the exact one, so below
            # 4e18 (< 2^62 ~ 4.6e18) the exact product fits
            if abs(np.float64(a) * np.float64(b)) >= 4.0e18:
                return False
            r = a * b
        else:
            if a > a_most or a < -a_most or b > b_most or b < -b_most:
                return False
            a = a * a_factor
            b = b * b_factor
            r = a + b if op == ADD else a - b  # both below 2^62: no overflow
            if r <= -limit or r >= limit:
                return False
        out[i, 0] = r
        sign = r >> 63
        for k in range(1, out.shape[1]):
            out[i, k] = sign
    return True


@_jit
def decimal_resize(words, out, bound):
    """Each value's words into ``out``'s row width (sign-extended, or cut when narrower);
    ``False`` if a value does not fit the narrower width or reaches ``bound`` in magnitude
    (0: no bound; a narrowing checks that values fit 63 bits, and ``bound``: the precision)."""
    n = words.shape[0]
    wide = words.shape[1]
    width = out.shape[1]
    for i in range(n):
        if width >= wide:
            for k in range(wide):
                out[i, k] = words[i, k]
            sign = words[i, wide - 1] >> 63
            for k in range(wide, width):
                out[i, k] = sign
        else:
            if not _fits(words, i):
                return False
            v = words[i, 0]
            if bound > 0 and (v >= bound or v <= -bound):
                return False
            out[i, 0] = v
            sign = v >> 63
            for k in range(1, width):
                out[i, k] = sign
    return True


@_jit
def low_words_bound(words):
    """The largest magnitude among the values of ``words`` (a decimal array's rows), or -1
    if a value does not fit 63 bits or reaches :data:`LIMIT` (one pass, no branch a row)."""
    low = np.int64(0)
    high = np.int64(0)
    bad = False
    for i in range(words.shape[0]):
        v = words[i, 0]
        sign = v >> 63
        for k in range(1, words.shape[1]):
            bad |= words[i, k] != sign
        low = min(low, v)
        high = max(high, v)
    limit = np.int64(LIMIT)
    if bad or low <= -limit or high >= limit:
        return -1
    return max(high, -low)


@_jit
def write_words(values, out):
    """``values`` (int64) as decimal words: ``out[i, 0] = values[i]``, the other words of
    the row its sign."""
    for i in range(values.shape[0]):
        v = values[i]
        out[i, 0] = v
        sign = v >> 63
        for k in range(1, out.shape[1]):
            out[i, k] = sign

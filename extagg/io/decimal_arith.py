"""Decimal ``+ - *`` and casts between 128- and 256-bit decimals for ``--where`` and computed
aggregate arguments, on the values' 64-bit words where every value allows it.

Arrow's decimal kernels take ~16 ns a value on a batch (TPC-H Q1's ``l_extendedprice * (1 -
l_discount) * (1 + l_tax)`` and the product before it: ~0.5 s of SF1's 6 M rows); the values
are almost always far below 63 bits, where a compiled pass over their words
(:mod:`extagg.io._decimal_kernels`) takes ~1 ns. Each function returns exactly what Arrow's
kernel returns — same values, type and nulls — or ``None`` where it cannot (a value or a
result past 62 bits, scales that do not line up, an operand that is not an array or a
scalar): the caller then runs Arrow's kernel. The tests compare the two.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from extagg.io import _decimal_kernels as K

__all__ = ["DecimalInts", "decimal_binary", "decimal_cast", "decimal_ints"]

_WIDTH = {128: 2, 256: 4}  # 64-bit words a value
_OPS = {
    pc.add_checked: K.ADD, pc.add: K.ADD,
    pc.subtract_checked: K.SUBTRACT, pc.subtract: K.SUBTRACT,
    pc.multiply_checked: K.MULTIPLY, pc.multiply: K.MULTIPLY,
}  # fmt: skip
_NO_WORDS = np.zeros((0, 2), dtype=np.int64)


def _words(arr: pa.Array) -> np.ndarray | None:
    """The ``(n, width)`` words of a decimal array (zero-copy), or ``None``."""
    width = _WIDTH.get(arr.type.bit_width)
    buf = arr.buffers()[1]
    if width is None or buf is None:
        return None
    return np.frombuffer(buf, dtype=np.int64).reshape(-1, width)[arr.offset : arr.offset + len(arr)]


def _operand(x: Any) -> tuple[np.ndarray, int] | None:
    """A decimal operand as (words, scalar value): an array's words, or no words and a valid
    scalar's unscaled value."""
    if isinstance(x, pa.Scalar):
        if not pa.types.is_decimal(x.type) or not x.is_valid:
            return None
        value = x.as_py()
        assert isinstance(value, Decimal)
        unscaled = int(value.scaleb(x.type.scale))
        return (_NO_WORDS, unscaled) if abs(unscaled) < K.LIMIT else None
    if isinstance(x, pa.Array) and pa.types.is_decimal(x.type):
        words = _words(x)
        return None if words is None else (words, 0)
    return None


@functools.lru_cache(maxsize=256)
def _result_type(func: Callable[..., Any], left: pa.DataType, right: pa.DataType) -> pa.DataType:
    return func(pa.array([], left), pa.array([], right)).type


def _pool_words(n: int, width: int) -> tuple[pa.Buffer, np.ndarray]:
    """An ``(n, width)`` ``int64`` array in a buffer of Arrow's pool, which keeps freed pages
    for the next batch (a batch's words from ``malloc`` came from a fresh ``mmap`` every time,
    a page fault per 4 KiB: most of an operation's time on the VM measured)."""
    data = pa.allocate_buffer(n * width * 8)
    return data, np.frombuffer(data, dtype=np.int64).reshape(n, width)


def _validity(*arrays: Any) -> tuple[pa.Buffer | None, int]:
    """The validity bitmap of values null where any of ``arrays`` is (scalars: valid)."""
    with_nulls = [a for a in arrays if isinstance(a, pa.Array) and a.null_count]
    if not with_nulls:
        return None, 0
    valid = with_nulls[0].is_valid()
    for a in with_nulls[1:]:
        valid = pc.and_(valid, a.is_valid())
    mask = valid.to_numpy(zero_copy_only=False)
    return pa.py_buffer(np.packbits(mask, bitorder="little")), int(len(mask) - mask.sum())


def decimal_binary(
    func: Callable[..., Any], left: Any, right: Any, typ: pa.DataType | None = None
) -> pa.Array | None:
    """``func(left, right)`` for decimal ``+ - *`` (arrays or scalars, at least one an array
    of at least one row), or ``None`` (see the module docstring). ``typ``: the result's type
    when it is not Arrow's for these operands — 128-bit operands of a result that needs 256
    bits, which Arrow computes only on operands cast to 256 bits (the same values)."""
    op = _OPS.get(func)
    array = left if isinstance(left, pa.Array) else right
    if op is None or not isinstance(array, pa.Array) or len(array) == 0:
        return None
    a, b = _operand(left), _operand(right)
    if a is None or b is None:
        return None
    if typ is None:
        try:
            typ = _result_type(func, left.type, right.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
    if not pa.types.is_decimal(typ) or typ.bit_width not in _WIDTH:
        return None
    sa, sb = left.type.scale, right.type.scale
    if op == K.MULTIPLY:
        if typ.scale != sa + sb:
            return None
        fa = fb = 1
    else:
        if typ.scale < max(sa, sb) or typ.scale - min(sa, sb) > 18:
            return None
        fa, fb = 10 ** (typ.scale - sa), 10 ** (typ.scale - sb)
    data, out = _pool_words(len(array), _WIDTH[typ.bit_width])
    if not K.decimal_arith(op, a[0], a[1], fa, b[0], b[1], fb, out):
        return None
    bitmap, nulls = _validity(left, right)
    return pa.Array.from_buffers(typ, len(array), [bitmap, data], null_count=nulls)


def decimal_cast(arr: Any, typ: pa.DataType) -> pa.Array | None:
    """``arr`` cast to the decimal ``typ`` of the same scale, 128 or 256 bits (narrowed only
    where every value fits 63 bits and ``typ``'s precision), or ``None``."""
    if not isinstance(arr, pa.Array) or not pa.types.is_decimal(arr.type) or len(arr) == 0:
        return None
    if (
        not pa.types.is_decimal(typ)
        or typ.scale != arr.type.scale
        or typ.bit_width not in _WIDTH
        or (typ.precision < arr.type.precision and typ.bit_width >= arr.type.bit_width)
    ):
        return None
    words = _words(arr)
    if words is None:
        return None
    data, out = _pool_words(len(arr), _WIDTH[typ.bit_width])
    bound = 10**typ.precision if typ.precision < 19 else 0
    if not K.decimal_resize(words, out, bound):
        return None
    bitmap, nulls = _validity(arr)
    return pa.Array.from_buffers(typ, len(arr), [bitmap, data], null_count=nulls)


class DecimalInts:
    """Decimal values as 64-bit unscaled integers, passed between decimal ``+ - *`` of an
    expression: each operation is one NumPy pass with no check (the magnitudes' bound,
    carried along, shows that no value can overflow), and the 128- or 256-bit words are
    written once, for the result (:meth:`to_arrow`). TPC-H Q1's ``l_extendedprice * (1 -
    l_discount) * (1 + l_tax)`` took three Arrow kernels, two casts to 256 bits and a product
    of those; now three reads of the columns' low words, four passes and one write."""

    __slots__ = ("values", "type", "bound", "nulls")

    def __init__(
        self, values: np.ndarray, typ: pa.DataType, bound: int, nulls: tuple[pa.Array, ...]
    ) -> None:
        #: the unscaled values (at null rows: anything)
        self.values = values
        #: the Arrow type of the expression they are the values of
        self.type = typ
        #: no value's magnitude is above it (below 2^62)
        self.bound = bound
        #: the arrays whose nulls are the values' nulls
        self.nulls = nulls

    def __len__(self) -> int:
        return len(self.values)

    def to_arrow(self, typ: pa.DataType | None = None) -> pa.Array:
        """The values as an Arrow decimal array of their type, or of ``typ`` (the same scale,
        at least the precision: ``decimal(38, s)`` for a 256-bit result)."""
        typ = self.type if typ is None else typ
        # the values of valid rows hold the expression's precision (its operands' do); the
        # bound may be larger, from what null rows hold
        assert typ.scale == self.type.scale
        n = len(self.values)
        data, out = _pool_words(n, _WIDTH[typ.bit_width])
        K.write_words(self.values, out)
        bitmap, nulls = _validity(*self.nulls)
        return pa.Array.from_buffers(typ, n, [bitmap, data], null_count=nulls)


def _ints_operand(x: Any) -> tuple[Any, int, int, tuple[pa.Array, ...]] | None:
    """An operand as (unscaled values — an array, or a scalar's ``int`` —, scale, bound of
    the magnitudes, arrays with its nulls), or ``None`` (not a decimal, a value past 62 bits,
    a null scalar)."""
    if isinstance(x, DecimalInts):
        return x.values, x.type.scale, x.bound, x.nulls
    if isinstance(x, pa.Scalar):
        found = _operand(x)
        if found is None:
            return None
        return found[1], x.type.scale, abs(found[1]), ()
    if isinstance(x, pa.Array) and pa.types.is_decimal(x.type):
        words = _words(x)
        if words is None:
            return None
        bound = int(K.low_words_bound(words))
        if bound < 0:
            return None
        return words[:, 0], x.type.scale, bound, ((x,) if x.null_count else ())
    return None


def decimal_ints(
    func: Callable[..., Any], left: Any, right: Any, typ: pa.DataType
) -> DecimalInts | None:
    """``func(left, right)`` (decimal ``+ - *`` whose result has type ``typ``: Arrow's for
    these operands, or the 256-bit one where Arrow needs them cast) as :class:`DecimalInts`,
    from decimal arrays, scalars and :class:`DecimalInts`, at least one not a scalar; or
    ``None`` where a value or a result might not fit 62 bits (the caller then runs Arrow's
    kernel on the operands as Arrow arrays)."""
    op = _OPS.get(func)
    if op is None or not pa.types.is_decimal(typ):
        return None
    a, b = _ints_operand(left), _ints_operand(right)
    if a is None or b is None or (isinstance(a[0], int) and isinstance(b[0], int)):
        return None
    (va, sa, ba, na), (vb, sb, bb, nb) = a, b
    if op == K.MULTIPLY:
        bound = ba * bb
        if typ.scale != sa + sb or bound >= K.LIMIT:
            return None
        values = va * vb
    else:
        if typ.scale < max(sa, sb):
            return None
        fa, fb = 10 ** (typ.scale - sa), 10 ** (typ.scale - sb)
        bound = ba * fa + bb * fb
        if bound >= K.LIMIT:
            return None
        if fa != 1:
            va = va * fa
        if fb != 1:
            vb = vb * fb
        values = va + vb if op == K.ADD else va - vb
    return DecimalInts(np.asarray(values, dtype=np.int64), typ, bound, na + nb)

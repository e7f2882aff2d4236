"""Decimal ``+ - *`` and 128/256-bit casts on the values' words: exactly Arrow's kernels'
results (values, type, nulls) wherever they answer, and Arrow's kernels wherever they do not."""

from __future__ import annotations

import re
from decimal import Decimal, localcontext

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg.io.decimal_arith import decimal_binary, decimal_cast

OPS = [pc.add_checked, pc.subtract_checked, pc.multiply_checked, pc.add, pc.multiply]


@st.composite
def decimal_arrays(draw: st.DrawFn, n: int) -> pa.Array:
    """A decimal array of ``n`` values (after an offset), small or past 63 bits, with nulls."""
    bits = draw(st.sampled_from([128, 256]))
    precision = draw(st.integers(1, 38 if bits == 128 else 60))
    scale = draw(st.integers(0, min(precision, 12)))
    digits = draw(st.sampled_from([min(precision, 6), precision]))  # mostly small values
    top = 10**digits - 1
    values = draw(st.lists(st.none() | st.integers(-top, top), min_size=n + 1, max_size=n + 1))
    typ = (pa.decimal128 if bits == 128 else pa.decimal256)(precision, scale)
    return _from_unscaled(values, typ).slice(1)


def _from_unscaled(values: list[int | None], typ: pa.DataType) -> pa.Array:
    """A decimal array of these unscaled values (built from its words: pyarrow's own
    conversion of ``Decimal`` objects second-guesses the precision)."""
    size = typ.bit_width // 8
    data = b"".join(((v or 0) % (1 << typ.bit_width)).to_bytes(size, "little") for v in values)
    valid = pa.array([v is not None for v in values]).buffers()[1]
    nulls = sum(v is None for v in values)
    return pa.Array.from_buffers(typ, len(values), [valid, pa.py_buffer(data)], null_count=nulls)


@st.composite
def operands(draw: st.DrawFn) -> tuple[object, object]:
    n = draw(st.integers(1, 20))
    left, right = draw(decimal_arrays(n)), draw(decimal_arrays(n))
    if draw(st.booleans()):  # a literal on one side, as ``1 - l_discount``
        value = draw(st.integers(-999, 999))
        scalar = pa.scalar(Decimal(value), pa.decimal128(max(1, len(str(abs(value)))), 0))
        left, right = (scalar, right) if draw(st.booleans()) else (left, scalar)
    return left, right


@settings(max_examples=400, deadline=None)
@given(operands(), st.sampled_from(OPS))
def test_arithmetic_is_arrows_wherever_it_answers(pair, func):
    left, right = pair
    try:
        expected = func(left, right)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        expected = None  # Arrow refuses (a precision past 76 digits, an overflow)
    got = decimal_binary(func, left, right)
    if got is not None:
        assert expected is not None
        assert got.type == expected.type and got.equals(expected)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 20).flatmap(decimal_arrays), st.integers(1, 76))
def test_casts_are_arrows_wherever_they_answer(arr, precision):
    bits = 128 if precision <= 38 and arr.type.bit_width == 256 else 256
    typ = (pa.decimal128 if bits == 128 else pa.decimal256)(
        max(precision, arr.type.scale), arr.type.scale
    )
    try:
        expected = arr.cast(typ)
    except pa.ArrowInvalid:
        expected = None
    got = decimal_cast(arr, typ)
    if got is not None:
        assert expected is not None
        assert got.type == expected.type and got.equals(expected)


def test_the_words_are_used_for_small_values_and_arrow_past_63_bits():
    small = pa.array([Decimal("1.25"), None, Decimal("-3.50")], pa.decimal256(30, 2))
    other = pa.array([Decimal("2.0"), Decimal("1.0"), None], pa.decimal256(30, 1))
    got = decimal_binary(pc.multiply_checked, small, other)
    assert got is not None and got.to_pylist() == [Decimal("2.500"), None, None]
    assert decimal_cast(small, pa.decimal128(38, 2)).to_pylist() == small.to_pylist()
    huge = pa.array([Decimal(2**70)], pa.decimal256(40, 0))
    assert decimal_binary(pc.add_checked, huge, huge) is None  # past 62 bits: Arrow's turn
    assert decimal_cast(huge, pa.decimal128(38, 0)) is None
    narrow = pa.array([Decimal(10**12)], pa.decimal256(20, 0))
    assert decimal_cast(narrow, pa.decimal128(10, 0)) is None  # past the precision: Arrow raises


@pytest.mark.parametrize("bits", [128, 256])
def test_an_empty_or_all_null_operand(bits):
    typ = (pa.decimal128 if bits == 128 else pa.decimal256)(20, 2)
    assert decimal_binary(pc.add_checked, pa.array([], typ), pa.array([], typ)) is None
    nulls = pa.array([None, None], typ)
    got = decimal_binary(pc.add_checked, nulls, nulls)
    assert got is None or got.equals(pc.add_checked(nulls, nulls))


@st.composite
def narrow_operands(draw: st.DrawFn) -> tuple[pa.Array, pa.Array]:
    """Two 128-bit decimal arrays of many digits, as Parquet's money columns are typed."""
    n = draw(st.integers(1, 20))
    arrays = []
    for _ in range(2):
        precision = draw(st.integers(20, 38))
        scale = draw(st.integers(0, 12))
        digits = draw(st.sampled_from([6, 17, precision]))
        top = 10**digits - 1
        values = draw(st.lists(st.none() | st.integers(-top, top), min_size=n, max_size=n))
        arrays.append(_from_unscaled(values, pa.decimal128(precision, scale)))
    return arrays[0], arrays[1]


@settings(max_examples=300, deadline=None)
@given(narrow_operands(), st.sampled_from(OPS))
def test_a_result_past_38_digits_from_128_bit_operands_is_arrows_on_256_bit_ones(pair, func):
    """``decimal(32, 4) * decimal(16, 2)`` (TPC-H Q1's charge) needs 256 bits: Arrow computes
    it only on operands cast to 256 bits; given the result type, the words of the 128-bit
    operands give the same array."""
    left, right = pair
    wide = [pa.decimal256(a.type.precision, a.type.scale) for a in pair]
    try:
        expected = func(left.cast(wide[0]), right.cast(wide[1]))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return  # past 76 digits or an overflow: the caller goes to doubles or raises
    got = decimal_binary(func, left, right, expected.type)
    if got is not None:
        assert got.type == expected.type and got.equals(expected)
    small = pa.array([Decimal("1.5"), None], pa.decimal128(38, 1))
    product = decimal_binary(pc.multiply_checked, small, small, pa.decimal256(76, 2))
    assert product is not None and product.to_pylist() == [Decimal("2.25"), None]


@st.composite
def decimal_tables(draw: st.DrawFn) -> pa.Table:
    """Three decimal columns (128 or 256 bits, values small or up to their precision, nulls),
    read after an offset as a scan's slices are."""
    n = draw(st.integers(1, 12))
    columns = {}
    for name in ("a", "b", "c"):
        bits = draw(st.sampled_from([128, 128, 256]))
        precision = draw(st.integers(1, 38 if bits == 128 else 45))
        scale = draw(st.integers(0, min(precision, 8)))
        top = 10 ** draw(st.sampled_from([min(precision, 5), precision])) - 1
        values = draw(st.lists(st.none() | st.integers(-top, top), min_size=n + 2, max_size=n + 2))
        typ = (pa.decimal128 if bits == 128 else pa.decimal256)(precision, scale)
        columns[name] = _from_unscaled(values, typ).slice(2)
    return pa.table(columns)


def _arithmetic(depth: int) -> st.SearchStrategy[str]:
    leaf = st.sampled_from(["a", "b", "c", "1", "2", "1.5", "0.01", "100"])
    if depth == 0:
        return leaf
    sub = _arithmetic(depth - 1)
    return leaf | st.builds(
        lambda x, op, y: f"({x} {op} {y})", sub, st.sampled_from(["+", "-", "*"]), sub
    )


def _exact(text: str, row: dict[str, Decimal | None]) -> Decimal | None:
    """The expression's value on one row in Python's decimals (null if an operand is)."""
    if any(row[name] is None for name in re.findall(r"\b[abc]\b", text)):
        return None
    with localcontext() as ctx:
        ctx.prec = 300
        return eval(text, {"__builtins__": {}}, {**row, **_LITERALS})


_LITERALS = {"Decimal": Decimal}


@settings(max_examples=300, deadline=None)
@given(decimal_tables(), _arithmetic(3))
def test_decimal_expressions_compute_exact_values(table, text):
    """Eagerly, decimal ``+ - *`` pass their values on as 64-bit integers where they fit, and
    go to Arrow's kernels where not: either way each row's value is the exact one (Python's
    decimals), in the expression's type, null where an operand is null."""
    from extagg.errors import ExpressionError
    from extagg.io.where import parse_expression, shared_subexpressions

    parsed = parse_expression(text)
    try:
        kind = parsed.bind_value(table.schema)
    except ExpressionError:
        return  # operands the grammar refuses
    if not pa.types.is_decimal(kind):
        return  # past 76 digits: doubles
    batch = table.combine_chunks().to_batches()[0]
    assert parsed.evaluate is not None and parsed.evaluate_values is not None
    try:
        with shared_subexpressions():
            got = parsed.evaluate(batch)
            values = parsed.evaluate_values(batch)
    except pa.ArrowInvalid:
        return  # a value past the result's precision: Arrow's overflow error
    if isinstance(got, pa.Scalar):
        return  # literals only
    expected = [_exact(_python(text), row) for row in batch.to_pylist()]
    assert got.type == kind, text
    assert got.to_pylist() == expected, text
    if hasattr(values, "to_arrow"):
        assert values.to_arrow().equals(got), text


def _python(text: str) -> str:
    """The expression's literals as Python decimals."""
    return re.sub(r"(?<![\w.])(\d+(?:\.\d+)?)", r'Decimal("\1")', text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**70), 2**70), min_size=0, max_size=30), st.sampled_from([2, 4]))
def test_the_bound_and_word_kernels_against_python(values, width):
    """``low_words_bound`` is the largest magnitude, or -1 past 62 bits; ``write_words``
    writes each value sign-extended (both beside their plain Python form)."""
    import numpy as np

    from extagg.io import _decimal_kernels as K

    words = (
        np.array(
            [[(v >> (64 * k)) % 2**64 for k in range(width)] for v in values]
            or np.zeros((0, width)),
            dtype=np.uint64,
        )
        .view(np.int64)
        .reshape(-1, width)
    )
    fits = all(abs(v) < K.LIMIT for v in values)
    assert K.low_words_bound(words) == (max((abs(v) for v in values), default=0) if fits else -1)
    small = np.array([v for v in values if abs(v) < K.LIMIT], dtype=np.int64)
    out = np.full((len(small), width), 7, dtype=np.int64)
    K.write_words(small, out)
    back = [sum(int(w) % 2**64 << (64 * k) for k, w in enumerate(row)) for row in out]
    assert [b - (1 << 64 * width) if b >> (64 * width - 1) else b for b in back] == small.tolist()


def test_what_null_rows_hold_does_not_matter():
    """A null row's words may hold anything (Arrow does not zero them): a large value there
    neither fails the narrow result type nor shows in the result."""
    import numpy as np

    from extagg.io.where import parse_expression

    words = np.array([[125, 0], [10**15, 0], [-250, -1]], dtype=np.int64)
    valid = pa.array([True, False, True]).buffers()[1]
    column = pa.Array.from_buffers(
        pa.decimal128(3, 2), 3, [valid, pa.py_buffer(words.tobytes())], null_count=1
    )
    batch = pa.record_batch({"d": column})
    parsed = parse_expression("1 - d * 2")
    assert parsed.bind_value(batch.schema) == pa.decimal128(6, 2)
    assert parsed.evaluate is not None
    assert parsed.evaluate(batch).to_pylist() == [Decimal("-1.50"), None, Decimal("6.00")]

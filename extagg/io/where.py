"""``--where`` / ``--having`` expressions: a small SQL-like grammar parsed into a
``pyarrow.compute.Expression``, so that a Parquet scan can skip row groups by their statistics.

Grammar (keywords are case-insensitive)::

    expr      := or
    or        := and ("or" and)*
    and       := not ("and" not)*
    not       := "not" not | predicate
    predicate := concat [cmp concat | ["not"] "in" "(" literal ("," literal)* ")"
                      | "is" ["not"] "null" | ["not"] "between" concat "and" concat
                      | ["not"] ("like" | "ilike") 'pattern']
    concat    := sum ("||" sum)*
    sum       := product (("+" | "-") product)*
    product   := unary (("*" | "/") unary)*
    unary     := "-" unary | atom
    atom      := number | 'string' | date 'YYYY-MM-DD' | timestamp 'YYYY-MM-DD HH:MM:SS'
               | interval '1 day 2 hours' | interval number unit | interval '1' year
               | true | false | null | column | "quoted column" | `quoted column` | "(" expr ")"
               | function "(" [expr ("," expr)*] ")"
               | case [sum] (when expr then expr)+ [else expr] end
               | cast "(" expr as type ")"        (and postfix: atom "::" type)

``function`` is one of :data:`FUNCTIONS` (DuckDB's names: ``year(d)``, ``lower(s)``,
``starts_with(s, 'x')``, ``regexp_matches(s, 're')``, ``substr(s, 2, 3)``, ``round(x, 2)``,
``coalesce(a, b)``, ``if(c, a, b)``, ``greatest(a, b)``, ``nullif(a, b)``,
``date_trunc('month', d)``, ``strftime(d, '%Y-%m')``, ``strptime(s, '%d/%m/%Y')``,
``to_timestamp(unix_seconds)``, ``split_part(s, ',', 2)``, ``regexp_extract(s, 're', 1)``,
...); their patterns, units,
formats, positions and digit counts are literals. ``case``
(searched, or ``case x when a``) and ``if`` give the first true branch's value (SQL's).

``cmp`` is one of ``= == != <> < <= > >=``; a ``like`` pattern takes SQL's ``%`` (any
characters) and ``_`` (one character), ``ilike`` ignores case; ``\\%``, ``\\_`` and ``\\\\``
are the characters themselves, a backslash before anything else is a backslash (see
:func:`like_regex`). A syntax error raises
:class:`~extagg.errors.ExpressionError`, whose message shows the expression with a caret.
Once the input's column types are known, :meth:`ParsedExpression.bind` parses it again
against them: an operator whose operands do not fit (``int_col = 'x'``) is an
:class:`~extagg.errors.ExpressionError` at that operator, before any row is read.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import difflib
import re
import threading
import zoneinfo
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from extagg._names import PLAIN_NAME, dotted_parts
from extagg.errors import ExpressionError, ExpressionOverflowError, ExpressionValueError, QueryError

__all__ = ["ParsedExpression", "StructField", "parse_expression", "struct_field"]

#: a field inside a struct column: the column's name and the field names down to it
StructField = tuple[str, tuple[str, ...]]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
      | (?P<string>'(?:[^']|'')*')
      | (?P<quoted>"(?:[^"]|"")*"|`[^`]*`)
      | (?P<name>"""
    + PLAIN_NAME
    + r""")
      | (?P<op>::|\|\||<=|>=|<>|!=|==|[=<>(),+\-*/%\[\]])
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "in", "is", "null", "between", "true", "false", "date"}
_KEYWORDS |= {"timestamp", "like", "ilike", "interval"}
#: the words that start a typed literal only when a quoted text (or, after ``interval``, a
#: number) follows; otherwise they are column names (a CSV's ``date`` column)
_LITERAL_WORDS = ("date", "timestamp", "interval")
_CMP = {
    "=": pc.equal,
    "==": pc.equal,
    "!=": pc.not_equal,
    "<>": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}


@dataclass
class _Tok:
    kind: str  # number, string, quoted, name, op, end
    text: str
    pos: int

    @property
    def word(self) -> str:
        return self.text.lower() if self.kind == "name" else ""


@dataclass
class ParsedExpression:
    """The parsed expression, the columns it reads and its source text."""

    expression: pc.Expression
    columns: list[str] = field(default_factory=list)
    text: str = ""
    positions: dict[str, int] = field(default_factory=dict)  # column -> first position
    #: the same expression as eager ``pyarrow.compute`` calls on a batch's columns
    evaluate: Callable[[pa.RecordBatch], Any] | None = None
    #: :attr:`evaluate` that may return a decimal's values as
    #: :class:`~extagg.io.decimal_arith.DecimalInts` (``to_arrow(type)`` writes them once, in
    #: the type the caller needs); set by :meth:`bind_value`
    evaluate_values: Callable[[pa.RecordBatch], Any] | None = None
    #: dotted names read as fields of struct columns: ``"payload.user.id"`` ->
    #: ``("payload", ("user", "id"))`` (see :func:`parse_expression`)
    fields: Mapping[str, StructField] = field(default_factory=dict)
    #: the struct fields the expression reads, by their column; the columns it reads whole
    paths: dict[str, set[tuple[str, ...]]] = field(default_factory=dict)
    whole: set[str] = field(default_factory=set)

    def bind(self, schema: pa.Schema) -> pc.Expression:
        """Fit the expression to the input's column types (``schema``: at least the columns it
        reads) and return it.

        Every operation is checked against its operands' types, so a mismatch is a usage error
        at its operator (``int_col = 'x'``: "'=' does not apply to int64 and string") rather
        than Arrow's error from deep in the scan. A column whose type is ``null`` (all nulls:
        a JSON field never set, a Parquet column of nulls) takes the type of the values it is
        tested ``in``: ``null in (...)`` is null, so the row is dropped, as in SQL."""
        parser = _Parser(self.text, schema, self.fields)
        expr = parser.parse()
        kind = parser.type_of(expr)
        if not (pa.types.is_boolean(kind) or pa.types.is_null(kind)):
            raise ExpressionError(
                f"the expression is a value of type {kind}, not a condition (compare it: "
                "x > 0, x is not null, ...)",
                self.text,
                0,
            )
        if pa.types.is_null(kind):  # ``--where null``, a test of an all-null column: no row
            fn = parser.fn(expr)
            expr = parser.made(expr.cast(pa.bool_()), lambda b: pc.cast(fn(b), pa.bool_()))
        self.expression = expr
        self.evaluate = parser.fn(expr)
        return expr

    def bind_value(self, schema: pa.Schema) -> pa.DataType:
        """Fit the expression to the input's column types as a value — an aggregate's
        argument, ``sum(price * (1 - discount))`` — and return its type (operands that do not
        fit: an :class:`~extagg.errors.ExpressionError` at their operator)."""
        parser = _Parser(self.text, schema, self.fields)
        expr = parser.parse()
        kind = parser.type_of(expr)
        self.expression = expr
        self.evaluate = parser.fn(expr)
        self.evaluate_values = parser.values_fn(expr)
        return kind

    def mask(self, batch: pa.RecordBatch) -> pa.Array | None:
        """The rows of ``batch`` the expression keeps, as a boolean array (null: dropped), or
        ``None`` when it cannot be evaluated eagerly (then filter with :attr:`expression`).

        The same kernels as the expression's, called directly: filtering a batch with an
        expression plans and runs an Acero query each time (~0.5 ms, more than the rest of the
        scan's work for a batch of a few thousand rows)."""
        if self.evaluate is None:
            return None
        try:
            out = self.evaluate(batch)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, KeyError):
            # the expression's own binding says what is wrong, or casts its literals its
            # own way (``decimal * 2``): from now on it filters
            self.evaluate = None
            return None
        if isinstance(out, pa.Scalar):
            if not pa.types.is_boolean(out.type):
                return None
            out = pa.array([out.as_py()] * batch.num_rows, type=pa.bool_())
        if isinstance(out, pa.ChunkedArray):
            out = out.combine_chunks()
        if not pa.types.is_boolean(out.type):
            return None
        return out


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            start = len(text[pos:]) - len(text[pos:].lstrip()) + pos
            raise ExpressionError(f"unexpected character {text[start]!r}", text, start)
        kind = m.lastgroup
        assert kind is not None
        toks.append(_Tok(kind, m.group(kind), m.start(kind)))
        pos = m.end()
    toks.append(_Tok("end", "", len(text)))
    return toks


class _Parser:
    def __init__(
        self,
        text: str,
        schema: pa.Schema | None = None,
        fields: Mapping[str, StructField] | None = None,
    ) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0
        self.columns: dict[str, int] = {}
        self.fields = fields or {}
        #: the fields of struct columns read (by column) and the columns read whole
        self.paths: dict[str, set[tuple[str, ...]]] = {}
        self.whole: set[str] = set()
        #: each expression built (by ``id``; held in ``_made``) → its eager evaluation
        self._fns: dict[int, Callable[[pa.RecordBatch], Any]] = {}
        #: the expressions whose eager form may return DecimalInts (fn() converts them)
        self._decimal_ints: set[int] = set()
        self._made: list[pc.Expression] = []
        #: the quoted-string and date/timestamp literals built (by ``id``) → value and token
        self._quoted: dict[int, tuple[str | pa.Scalar, _Tok]] = {}
        #: the integer literals built (by ``id``) → value: typed by their digits beside a decimal
        self._ints: dict[int, int] = {}
        #: with the input's types: one row of nulls of them, to type (and run: some kernels
        #: check their options only then) every expression as it is built
        self._empty = (
            None
            if schema is None
            else pa.table([pa.nulls(1, f.type) for f in schema], schema=schema)
        )

    def type_of(self, expr: pc.Expression) -> pa.DataType:
        """The type of ``expr`` on the input's columns (raises Arrow's error if it has none)."""
        assert self._empty is not None
        projected = ds.dataset(self._empty).to_table(columns={"value": expr})
        return projected.schema.field(0).type

    def made(self, expr: pc.Expression, fn: Callable[[pa.RecordBatch], Any]) -> pc.Expression:
        """Remember ``fn`` as the eager form of ``expr``."""
        self._made.append(expr)
        self._fns[id(expr)] = fn
        return expr

    def constant(self, value: pa.Scalar) -> pc.Expression:
        """A literal value as an expression (and its eager form)."""
        return self.made(pc.scalar(value), _constant(value))

    def fn(self, expr: pc.Expression) -> Callable[[pa.RecordBatch], Any]:
        """The eager form of an expression this parser built (Arrow values)."""
        fn = self._fns[id(expr)]
        if id(expr) not in self._decimal_ints:
            return fn
        return lambda batch: _arrow_value(fn(batch))

    def values_fn(self, expr: pc.Expression) -> Callable[[pa.RecordBatch], Any]:
        """The eager form of ``expr`` that may return a decimal's values as
        :class:`~extagg.io.decimal_arith.DecimalInts` (see :meth:`_decimal_arithmetic`)."""
        return self._fns[id(expr)]

    def fit_quoted(
        self, left: pc.Expression, right: pc.Expression
    ) -> tuple[pc.Expression, pc.Expression]:
        """A literal compared with a typed operand read as that type, as SQL engines do: a
        quoted string with a non-string operand (``day >= '2024-01-31'``, ``id = '7'``), a
        date or timestamp with a time-zone-aware timestamp column (the literal's wall time in
        that zone); a text that does not read so is an error at the literal."""
        if self._empty is None:
            return left, right
        for mine, other in ((left, right), (right, left)):
            if id(mine) not in self._quoted or id(other) in self._quoted:
                continue
            other_type = self.type_of(other)
            if pa.types.is_string(other_type) or pa.types.is_large_string(other_type):
                continue
            if pa.types.is_null(other_type):
                continue
            value, tok = self._quoted[id(mine)]
            if isinstance(value, Decimal):
                # a decimal number against a float: as the float nearest it (Arrow compared
                # the float converted to the literal's decimal type, rounded: a CSV's 0.3
                # failed '= 0.3', 10 of the literals 0.01 to 0.99 so)
                if not pa.types.is_floating(other_type):
                    continue
                literal = pa.scalar(float(value), other_type)
                typed = self.made(pc.scalar(literal), _constant(literal))
                return (typed, right) if mine is left else (left, typed)
            try:
                literal = _read_as(value, other_type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, ValueError):
                if not isinstance(value, str):
                    continue  # a typed literal: the operator's own check says what is wrong
                raise ExpressionError(
                    f"{tok.text} cannot be read as {other_type}, the type it is compared with",
                    self.text, tok.pos,
                ) from None  # fmt: skip
            if literal is None:
                continue
            typed = self.made(pc.scalar(literal), _constant(literal))
            return (typed, right) if mine is left else (left, typed)
        return left, right

    def fit_in(
        self, left: pc.Expression, value_set: pa.Array, at: _Tok
    ) -> tuple[pc.Expression, pa.Array]:
        """``left in (values)`` with the input's types: quoted values read as ``left``'s type
        (``id in ('7', '9')``, ``day in ('2024-01-31')``: Arrow would cast them per row, but
        its row-group pruning cannot), an all-null column typed as the values (the test is
        null: the row is dropped); a dictionary column (a pandas categorical) as its values."""
        left = self.decoded(left)
        left_type = self.type_of(left)
        if pa.types.is_null(left_type):
            cast = value_set.type
            fn = self.fn(left)
            return self.made(left.cast(cast), lambda b: pc.cast(fn(b), cast)), value_set
        if pa.types.is_string(value_set.type) and not (
            pa.types.is_string(left_type) or pa.types.is_large_string(left_type)
        ):
            try:
                texts = value_set.to_pylist()
                read = [None if v is None else _read_as(v, left_type) for v in texts]
                return left, pa.array(read, left_type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, ValueError):
                raise ExpressionError(
                    f"the values of 'in' cannot be read as {left_type}, the type of what they "
                    "are tested against",
                    self.text, at.pos,
                ) from None  # fmt: skip
        if (
            pa.types.is_timestamp(left_type)
            and (pa.types.is_timestamp(value_set.type) or pa.types.is_date(value_set.type))
            and value_set.type != left_type
        ):
            # date '...' / timestamp '...' values: a wall time in a zoned column's zone, an
            # instant ('...+02:00') as itself (Arrow compared no zoned column with them)
            try:
                read = [None if not v.is_valid else _read_as(v, left_type) for v in value_set]
                fit = [v if r is None else r for v, r in zip(value_set, read)]
                return left, pa.array([v.cast(left_type).as_py() for v in fit], left_type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
                pass  # the operator's own check says what is wrong
        numbers = _is_number(value_set.type)
        whole = pa.types.is_integer(value_set.type) or (
            pa.types.is_decimal(value_set.type) and value_set.type.scale == 0
        )
        if pa.types.is_integer(left_type) and whole:
            # as values of the column's type (Arrow cast the column to int64: a uint64 past
            # 2^63 failed); a value outside its range equals no row
            low, high = _int_range(left_type)
            fit = [v if v is None else int(v) for v in value_set.to_pylist()]
            return left, pa.array([v for v in fit if v is None or low <= v <= high], left_type)
        if pa.types.is_decimal(left_type) and numbers:
            # as decimals of the column's type (Arrow cast the column to the values' type:
            # "Rescaling Decimal value would cause data loss"); a value it cannot hold
            # exactly equals no row
            return left, pa.array(_fitting_decimals(value_set.to_pylist(), left_type), left_type)
        if pa.types.is_floating(left_type) and numbers:
            # -0.0 is 0.0 (Arrow's set lookup tells their bits apart); NaN matches NaN; an
            # integer is the float nearest it, as in SQL
            values = pc.add(pc.cast(value_set, left_type, safe=False), pa.scalar(0.0, left_type))
            zero = self.constant(pa.scalar(0.0, left_type))
            return self.call(pc.add, left, zero), values
        return left, value_set

    def _quoted_values_read(self, left: pc.Expression, values: list[Any], at: _Tok) -> list[Any]:
        """An ``in`` list's quoted values beside others (``d in ('2024-03-01', date
        '2024-03-02')``, ``v in (1, '2')``) read as the type of what they are tested
        against, one by one: the list of mixed values had no one type."""
        if self._empty is None or not any(isinstance(v, str) for v in values):
            return values
        if all(isinstance(v, str) or v is None for v in values):
            return values  # one type: fit_in reads them all
        left_type = self.type_of(self.decoded(left))
        if pa.types.is_string(left_type) or pa.types.is_large_string(left_type):
            return values
        out = []
        for v in values:
            if not isinstance(v, str):
                out.append(v)
                continue
            try:
                out.append(_read_as(v, left_type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, ValueError):
                raise ExpressionError(
                    f"{v!r} in the values of 'in' cannot be read as {left_type}, the type of "
                    "what they are tested against",
                    self.text, at.pos,
                ) from None  # fmt: skip
        return out

    def _temporal_values_read(self, left: pc.Expression, values: list[Any]) -> list[Any]:
        """An ``in`` list's ``date '...'`` / ``timestamp '...'`` values against a timestamp
        column, each read as :func:`_read_as` reads one compared with it (a wall time in a
        zoned column's zone, an instant as itself): the list's one type took a wall time
        beside an instant as UTC."""
        if self._empty is None:
            return values
        left_type = self.type_of(self.decoded(left))
        if not pa.types.is_timestamp(left_type):
            return values
        out = []
        for v in values:
            if isinstance(v, pa.Scalar) and (
                pa.types.is_timestamp(v.type) or pa.types.is_date(v.type)
            ):
                try:
                    read = _read_as(v, left_type)
                    v = read if read is not None else v.cast(left_type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
                    pass  # the operator's own check says what is wrong
            out.append(v)
        return out

    def decoded(self, expr: pc.Expression) -> pc.Expression:
        """``expr`` as its values if it is a dictionary column (a pandas categorical, an Arrow
        file's dictionary): Arrow's ``is_in`` and ``match_like`` take no dictionaries."""
        if self._empty is None:
            return expr
        typ = self.type_of(expr)
        if pa.types.is_dictionary(typ):
            return self.cast(expr, typ.value_type)
        if pa.types.is_string(typ) or pa.types.is_large_string(typ):
            # the files' schema says text, but a file that stores the column as Parquet
            # dictionaries is read so (its batches keep their codes): a no-op cast decodes them
            return self.cast(expr, typ)
        return expr

    def cast(self, expr: pc.Expression, typ: pa.DataType) -> pc.Expression:
        """``expr`` cast to ``typ`` (and its eager form). An integer to a float rounds, as in
        SQL (Spark, DuckDB): Arrow's safe cast refused an int64 past 2^53."""
        fn = self.fn(expr)
        src = self.type_of(expr) if self._empty is not None else None
        safe = not (src is not None and pa.types.is_integer(src) and pa.types.is_floating(typ))
        cast = expr.cast(typ, safe=safe)
        if not safe:
            # behind an addition: a Parquet scan's row-group pruning checks its statistics
            # against a bare cast with a safe cast of its own (``i < 1e300`` failed so)
            cast = pc.add(cast, pc.scalar(pa.scalar(0.0, typ)))
        folded = _folded(lambda v: eager_cast(v, typ, safe), [fn], {})
        if folded is not None:
            return self.made(cast, folded)
        return self.made(cast, lambda b: eager_cast(fn(b), typ, safe))

    def _as_float(self, expr: pc.Expression) -> pc.Expression:
        """An integer operand beside a float as a double: a literal as the double nearest it
        (``f = 9007199254740993`` was refused), a column cast, rounding past 2^53."""
        literal = self._ints.get(id(expr))
        if literal is not None:
            return self.constant(pa.scalar(float(literal), pa.float64()))
        return self.cast(expr, pa.float64())

    def _fit_unsigned(
        self, func: Callable[..., Any], left: pc.Expression, right: pc.Expression
    ) -> tuple[pc.Expression, pc.Expression]:
        """A ``uint64`` beside a signed integer, exactly: compared with a literal of 0 or more
        as a ``uint64``, else (a negative literal, a signed column, arithmetic) with both
        sides as decimals (Arrow took both as int64: a value past 2^63 failed)."""
        left_type, right_type = self.type_of(left), self.type_of(right)
        for mine, other, other_type in ((left, right, right_type), (right, left, left_type)):
            if not pa.types.is_uint64(self.type_of(mine)):
                continue
            if not pa.types.is_signed_integer(other_type):
                continue
            literal = self._ints.get(id(other))
            if func in _ORDER and literal is not None and literal >= 0:
                typed = self.constant(pa.scalar(literal, pa.uint64()))
                return (left, typed) if other is right else (typed, right)
            wide = self._as_decimal(left, left_type), self._as_decimal(right, right_type)
            try:
                self.type_of(func(*wide))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                # a product of two 64-bit columns needs 40 digits: 256-bit decimals
                wide = tuple(self.cast(w, _decimal256(self.type_of(w))) for w in wide)
            return wide[0], wide[1]
        return left, right

    def binary(
        self, func: Callable[..., Any], left: pc.Expression, right: pc.Expression, at: _Tok
    ) -> pc.Expression:
        """A comparison or arithmetic ``func(left, right)`` with SQL's (Spark's, DuckDB's)
        number semantics once the input's types are known: an integer beside a decimal is
        a decimal (Arrow has no kernel for the pair: ``l_quantity < 24`` was refused), a
        decimal beside a float is a float; ``/`` divides (integers too: ``3 / 2`` is 1.5,
        not 1) and a division by zero is null, as is ``%`` by zero (``%``: the remainder of
        the truncated division, with the dividend's sign); floats compare with NaN equal to
        itself and above every other number (Arrow follows IEEE: ``x != x`` kept NaN rows, ``x > 5``
        dropped them, and ``max`` puts NaN last)."""
        months = self._calendar_interval(func, left, right, at)
        if months is not None:
            return months
        if self._empty is None:
            return self.call(func, left, right, at=at)
        days = self._date_days(func, left, right, at)
        if days is not None:
            return days
        left_type, right_type = self.type_of(left), self.type_of(right)
        if pa.types.is_decimal(left_type) and pa.types.is_integer(right_type):
            right = self._as_decimal(right, right_type)
        elif pa.types.is_integer(left_type) and pa.types.is_decimal(right_type):
            left = self._as_decimal(left, left_type)
        elif pa.types.is_decimal(left_type) and pa.types.is_floating(right_type):
            left = self.cast(left, pa.float64())
        elif pa.types.is_floating(left_type) and pa.types.is_decimal(right_type):
            right = self.cast(right, pa.float64())
        elif (
            func is pc.divide
            and (pa.types.is_integer(left_type) or pa.types.is_null(left_type))
            and (pa.types.is_integer(right_type) or pa.types.is_null(right_type))
        ):
            left, right = self.cast(left, pa.float64()), self.cast(right, pa.float64())
        left_type, right_type = self.type_of(left), self.type_of(right)
        if func in _ORDER:
            test = self._integer_against_float_literal(func, left, right, at)
            if test is not None:
                return test
        if pa.types.is_integer(left_type) and pa.types.is_floating(right_type):
            left = self._as_float(left)
        elif pa.types.is_floating(left_type) and pa.types.is_integer(right_type):
            right = self._as_float(right)
        elif pa.types.is_integer(left_type) and pa.types.is_integer(right_type):
            left, right = self._fit_unsigned(func, left, right)
        if func is pc.divide or func is pc.remainder:
            right = self._null_if_zero(right)
        left_type, right_type = self.type_of(left), self.type_of(right)
        if (
            func is pc.divide
            and pa.types.is_decimal128(left_type)
            and pa.types.is_decimal128(right_type)
        ):
            left = self._dividend_for_spark_scale(left, left_type, right_type)
            left_type = self.type_of(left)
        narrow: tuple[pc.Expression, pc.Expression] | None = None
        if (
            func not in _ORDER
            and pa.types.is_decimal(left_type)
            and pa.types.is_decimal(right_type)
        ):
            try:
                self.type_of(func(left, right))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                # a result past 38 digits (``decimal(38, 10) * 2``, as Parquet's widest
                # decimals are; a 256-bit product times a 128-bit column): in 256-bit
                # decimals, as DuckDB and Spark answer it
                narrow = left, right
                left, right = self._as_decimal256(left), self._as_decimal256(right)
                try:
                    self.type_of(func(left, right))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                    # past 76 digits (``decimal(38, 10) * decimal(38, 2)``): as doubles, as
                    # a decimal beside a float is (Spark would drop decimals to fit 38)
                    left, right = self.cast(left, pa.float64()), self.cast(right, pa.float64())
                    narrow = None
                left_type, right_type = self.type_of(left), self.type_of(right)
        if (
            func in _DECIMAL_ARITHMETIC
            and pa.types.is_decimal(left_type)
            and pa.types.is_decimal(right_type)
        ):
            return self._decimal_arithmetic(func, left, right, at, narrow)
        if func in _CHECKED:
            return self._checked(self.call(func, left, right, at=at), func, left, right, at)
        if func not in _ORDER or not (
            pa.types.is_floating(left_type) or pa.types.is_floating(right_type)
        ):
            test = self.call(func, left, right, at=at)
            fast = self._eager_decimal_test(func, left, right) if func in _ORDER else None
            return test if fast is None else self.made(test, fast)
        # Spark's order: NaN = NaN, NaN above every number. Each form names is_nan of every
        # float operand, also where IEEE's answer needs no help: a Parquet row group's min/max
        # leave NaN out, so a test without it (``not (f <= 5)``) would skip row groups
        # holding NaN
        l_nan, r_nan = self._is_nan(left, left_type), self._is_nan(right, right_type)
        l_num, r_num = self.call(pc.invert, l_nan), self.call(pc.invert, r_nan)
        base = pc.equal if func is pc.not_equal else func
        numbers = self.call(
            pc.and_kleene,
            self.call(base, left, right, at=at),
            self.call(pc.and_kleene, l_num, r_num),
        )
        nan_case = {
            pc.equal: lambda: self.call(pc.and_kleene, l_nan, r_nan),
            pc.less: lambda: self.call(pc.and_kleene, l_num, r_nan),
            pc.greater: lambda: self.call(pc.and_kleene, l_nan, r_num),
            # (or(x, not x): true, or null when x is null: NaN >= null is null)
            pc.less_equal: lambda: self.call(
                pc.and_kleene, r_nan, self.call(pc.or_kleene, l_nan, l_num)
            ),
            pc.greater_equal: lambda: self.call(
                pc.and_kleene, l_nan, self.call(pc.or_kleene, r_nan, r_num)
            ),
        }[base]()
        test = self.call(pc.or_kleene, numbers, nan_case)
        test = self.call(pc.invert, test) if func is pc.not_equal else test
        return self.made(test, self._eager_float_test(func, left, right) or self.fn(test))

    def _integer_against_float_literal(
        self, func: Callable[..., Any], left: pc.Expression, right: pc.Expression, at: _Tok
    ) -> pc.Expression | None:
        """An integer compared with a finite float literal (``i < 1e3``) as the same test on
        the integers, so a Parquet scan still skips row groups by their statistics (a cast
        column hides them): as in SQL the integer is taken as the double nearest it, which
        grows with it, so ``double(i) > x`` is ``i >= k`` for the least such ``k``. ``None``
        for other operands."""
        if isinstance(self.fn(left), _Constant):
            func, left, right = _MIRROR[func], right, left
        literal = self.fn(right)
        if not (isinstance(literal, _Constant) and pa.types.is_floating(literal.value.type)):
            return None
        x, typ = literal.value.as_py(), self.type_of(left)
        if (
            x is None
            or x != x
            or not pa.types.is_integer(typ)
            or isinstance(self.fn(left), _Constant)
        ):
            return None
        low, high = _int_range(typ)
        above = _least_int(low, high, lambda n: float(n) > x)  # double(i) > x: i >= above
        from_ = _least_int(low, high, lambda n: float(n) >= x)  # double(i) >= x: i >= from_

        def at_least(n: int) -> pc.Expression:  # i >= n; past the type's top: false
            if n > high:
                return self.call(pc.less, left, self.constant(pa.scalar(low, typ)))
            return self.call(pc.greater_equal, left, self.constant(pa.scalar(n, typ)))

        def below(n: int) -> pc.Expression:  # i < n; past the type's top: true
            if n > high:
                return self.call(pc.greater_equal, left, self.constant(pa.scalar(low, typ)))
            return self.call(pc.less, left, self.constant(pa.scalar(n, typ)))

        if func in (pc.equal, pc.not_equal):
            test = self.call(pc.and_kleene, at_least(from_), below(above))
            return self.call(pc.invert, test) if func is pc.not_equal else test
        return {
            pc.greater: lambda: at_least(above),
            pc.greater_equal: lambda: at_least(from_),
            pc.less: lambda: below(from_),
            pc.less_equal: lambda: below(above),
        }[func]()

    def _checked(
        self,
        expr: pc.Expression,
        func: Callable[..., Any],
        left: pc.Expression,
        right: pc.Expression,
        at: _Tok,
    ) -> pc.Expression:
        """An integer ``+ - *`` whose eager form names the values and the operator when it
        overflows (Arrow's bare "overflow" came out of the scan as the file's read error)."""
        typ = self.type_of(expr)
        if not pa.types.is_integer(typ):
            return expr
        inner, lf, rf, text = self.fn(expr), self.fn(left), self.fn(right), self.text

        def run(batch: pa.RecordBatch) -> Any:
            try:
                return inner(batch)
            except pa.ArrowInvalid as exc:
                if "overflow" not in str(exc).lower():
                    raise
                a, b = _first_overflow(lf(batch), rf(batch), _CHECKED[func], typ)
                raise ExpressionOverflowError(
                    f"integer overflow: {a} {at.text} {b} does not fit {typ} (integer "
                    f"arithmetic keeps its operands' type, as in DuckDB and Spark)",
                    text, at.pos,
                ) from None  # fmt: skip

        return self.made(expr, run)

    def _eager_float_test(
        self, func: Callable[..., Any], left: pc.Expression, right: pc.Expression
    ) -> Callable[[pa.RecordBatch], Any] | None:
        """The comparison of a float with a literal number, on batches, in as few kernels as
        Spark's order allows (the expression keeps its is_nan terms for the row-group
        pruning): IEEE's answer, but ``>``/``>=`` as the negation of ``<=``/``<``, which NaN
        passes (and an integer column the same as before). None for other operands (a NaN
        or null literal, two columns)."""
        fns = self.fn(left), self.fn(right)
        if isinstance(fns[0], _Constant):
            func, fns = _MIRROR[func], (fns[1], fns[0])
        column, literal = fns
        if not isinstance(literal, _Constant) or isinstance(column, _Constant):
            return None
        value = literal.value.as_py()
        if not isinstance(value, (int, float, Decimal)) or value != value:
            return None
        if func in (pc.greater, pc.greater_equal):  # NaN > 5: not (NaN <= 5)
            opposite = pc.less_equal if func is pc.greater else pc.less
            return lambda b: pc.invert(opposite(column(b), literal.value))
        return lambda b: func(column(b), literal.value)

    def _eager_decimal_test(
        self, func: Callable[..., Any], left: pc.Expression, right: pc.Expression
    ) -> Callable[[pa.RecordBatch], Any] | None:
        """A decimal column of at most 18 digits compared with a literal, on batches: the
        unscaled values (a decimal128's low 64-bit words) against the literal scaled to the
        column's scale, in one NumPy comparison (TPC-H Q6's ``l_discount between 0.05 and
        0.07``: 3.5 ns a row in Arrow's decimal kernel, which rescales the pair). None for
        other operands; the expression itself is unchanged (row groups pruned as before)."""
        fns = self.fn(left), self.fn(right)
        types = self.type_of(left), self.type_of(right)
        if isinstance(fns[0], _Constant):
            func, fns, types = _MIRROR[func], (fns[1], fns[0]), (types[1], types[0])
        column, literal = fns
        typ = types[0]
        if (
            not isinstance(literal, _Constant)
            or isinstance(column, _Constant)
            or not pa.types.is_decimal128(typ)
            or typ.precision > 18
        ):
            return None
        value = literal.value.as_py()
        if not isinstance(value, (int, Decimal)):
            return None  # a null literal: Arrow's null answer
        return _unscaled_test(column, typ, func, Decimal(value))

    def _date_days(
        self, func: Callable[..., Any], left: pc.Expression, right: pc.Expression, at: _Tok
    ) -> pc.Expression | None:
        """DuckDB's day arithmetic on dates: ``d + 3``, ``3 + d`` and ``d - 3`` are dates,
        ``d - e`` the days between them as a ``bigint`` (Arrow has no date-and-integer
        kernel, and its ``d - e`` is a duration in seconds); ``None`` for anything else."""
        if func not in (pc.add_checked, pc.subtract_checked):
            return None
        left_type, right_type = self.type_of(left), self.type_of(right)
        is_date = pa.types.is_date32
        if is_date(left_type) and is_date(right_type) and func is pc.subtract_checked:
            return self.call(func, self._day_number(left), self._day_number(right), at=at)
        if is_date(right_type) and pa.types.is_integer(left_type) and func is pc.add_checked:
            left, right, left_type, right_type = right, left, right_type, left_type
        if not (is_date(left_type) and pa.types.is_integer(right_type)):
            return None
        moved = self.call(func, self._day_number(left), self.cast(right, pa.int64()), at=at)
        # int64 -> date32 has no cast: through int32 (a day past its range is an error)
        return self.cast(self.cast(moved, pa.int32()), pa.date32())

    def _day_number(self, date: pc.Expression) -> pc.Expression:
        """A date's days since 1970-01-01 as an ``int64`` (Arrow casts a date only to int32)."""
        return self.cast(self.cast(date, pa.int32()), pa.int64())

    def _calendar_interval(
        self, func: Callable[..., Any], left: pc.Expression, right: pc.Expression, at: _Tok
    ) -> pc.Expression | None:
        """``date '1994-01-01' + interval '1' year`` (TPC-H's form): a date or timestamp
        literal plus or minus an interval of months, as the timestamp DuckDB gives; ``None``
        when no operand is such an interval. Months beside anything else (a column: Arrow has
        no calendar arithmetic) are a usage error at the operator."""
        fns = self.fn(left), self.fn(right)
        kinds = [
            isinstance(f, _Constant) and pa.types.is_interval(f.value.type) for f in fns
        ]  # fmt: skip
        if not any(kinds):
            return None
        if func is pc.add_checked and kinds[0] and not kinds[1]:
            fns, kinds = (fns[1], fns[0]), [False, True]
        when = fns[0]
        usage = (
            f"{at.text!r}: an interval of months or years goes after a date or timestamp "
            "literal (date '1994-01-01' + interval '1' year); beside a column, give the length "
            "in days (interval '30 days')"
        )
        if (
            kinds[0]
            or func not in (pc.add_checked, pc.subtract_checked)
            or not isinstance(when, _Constant)
            or not (pa.types.is_date(when.value.type) or pa.types.is_timestamp(when.value.type))
        ):
            raise ExpressionError(usage, self.text, at.pos)
        start = when.value.as_py()
        if start is None:
            return self.constant(pa.scalar(None, pa.timestamp("us")))
        interval = fns[1].value.as_py()  # type: ignore[attr-defined]
        sign = 1 if func is pc.add_checked else -1
        if not isinstance(start, dt.datetime):
            start = dt.datetime.combine(start, dt.time())
        try:
            moved = add_months(start, sign * interval.months) + sign * dt.timedelta(
                days=interval.days, microseconds=interval.nanoseconds // 1000
            )
        except (ValueError, OverflowError) as exc:
            raise ExpressionError(str(exc), self.text, at.pos) from None
        zone = getattr(when.value.type, "tz", None)
        return self.constant(pa.scalar(moved, pa.timestamp("us", tz=zone)))

    def _as_decimal256(self, expr: pc.Expression) -> pc.Expression:
        """A decimal operand as a 256-bit decimal of its precision and scale."""
        typ = self.type_of(expr)
        return expr if pa.types.is_decimal256(typ) else self.cast(expr, _decimal256(typ))

    def _decimal_arithmetic(
        self,
        func: Callable[..., Any],
        left: pc.Expression,
        right: pc.Expression,
        at: _Tok,
        narrow: tuple[pc.Expression, pc.Expression] | None,
    ) -> pc.Expression:
        """A decimal ``+ - *`` whose eager form computes on 64-bit unscaled values
        (:class:`~extagg.io.decimal_arith.DecimalInts`, passed on to the decimal operations
        over it, turned into an Arrow array only for any other use: :meth:`fn`) where every
        value allows it, and on Arrow's kernels where not. ``narrow``: the operands before
        their cast to 256 bits, when the result needs 256 bits (the values are the same:
        casting both first had taken ~60 % of TPC-H Q1's ``l_extendedprice * (1 -
        l_discount) * (1 + l_tax)``)."""
        expr = self.call(func, left, right, at=at)
        typ = self.type_of(expr)
        if not pa.types.is_decimal(typ) or isinstance(self._fns[id(expr)], _Constant):
            return expr  # literals only (``0.06 - 0.01``): computed once by Arrow (call)
        wide_types = (self.type_of(left), self.type_of(right))
        operands = (left, right) if narrow is None else narrow
        left_fn, right_fn = self._fns[id(operands[0])], self._fns[id(operands[1])]
        arrow = _EAGER.get(func, func)
        key = ("ints", str(expr), str(typ))

        def compute(batch: Any) -> Any:
            from extagg.io.decimal_arith import decimal_binary, decimal_ints  # numba's

            a, b = left_fn(batch), right_fn(batch)
            out = decimal_ints(func, a, b, typ)
            if out is not None:
                return out
            a, b = _arrow_value(a), _arrow_value(b)
            if narrow is None:
                return arrow(a, b)
            out = decimal_binary(func, a, b, typ)
            if out is not None:
                return out
            return arrow(eager_cast(a, wide_types[0]), eager_cast(b, wide_types[1]))

        def run(batch: Any) -> Any:
            memo = getattr(_SHARED, "values", None)
            if memo is None:
                return compute(batch)
            slot = (id(batch), key)
            if slot not in memo:
                memo[slot] = compute(batch)
            return memo[slot]

        self.made(expr, run)
        self._decimal_ints.add(id(expr))
        return expr

    def _dividend_for_spark_scale(
        self, left: pc.Expression, left_type: pa.DataType, right_type: pa.DataType
    ) -> pc.Expression:
        """The dividend of a decimal ``/`` with more scale, so that Arrow's quotient has
        Spark's scale, ``max(6, s1 + p2 + 1)`` (fewer when past 38 digits, down to 6): Arrow
        gives ``max(4, s1 + p2 - s2 + 1)``, so ``decimal(12, 2) / 3`` kept four places and
        ``4.99 / 3 > 1.6633`` was false."""
        p1, s1 = left_type.precision, left_type.scale
        p2, s2 = right_type.precision, right_type.scale
        scale = max(6, s1 + p2 + 1)
        precision = p1 - s1 + s2 + scale
        if precision > 38:
            scale = max(38 - (precision - scale), min(scale, 6))
        dividend_scale = scale - p2 + s2 - 1  # Arrow's rule solved for the dividend's scale
        if dividend_scale <= s1:
            return left
        widened = p1 + dividend_scale - s1
        typ = (pa.decimal128 if widened <= 38 else pa.decimal256)(widened, dividend_scale)
        return self.cast(left, typ)

    def _as_decimal(self, expr: pc.Expression, typ: pa.DataType) -> pc.Expression:
        """An integer operand as a decimal: a literal with its own digits (a decimal of 19
        digits beside a ``decimal(38, 10)`` would need 48), a column with its type's."""
        literal = self._ints.get(id(expr))
        if literal is not None:
            digits = max(1, len(str(abs(literal))))
            return self.constant(pa.scalar(Decimal(literal), pa.decimal128(digits, 0)))
        digits = _INT_DIGITS[typ.bit_width] + (not pa.types.is_signed_integer(typ))
        return self.cast(expr, pa.decimal128(digits, 0))

    def _null_if_zero(self, expr: pc.Expression) -> pc.Expression:
        typ = self.type_of(expr)
        if pa.types.is_null(typ) or not (
            pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ)
        ):
            return expr
        zero = self.constant(pa.scalar(Decimal(0) if pa.types.is_decimal(typ) else 0, typ))
        return self.call(pc.if_else, self.call(pc.equal, expr, zero),
                         self.constant(pa.scalar(None, typ)), expr)  # fmt: skip

    def _is_nan(self, expr: pc.Expression, typ: pa.DataType) -> pc.Expression:
        """Whether ``expr`` is NaN: null where it is null (not a float: false or null)."""
        if pa.types.is_floating(typ):
            return self.call(pc.is_nan, expr)
        unknown = self.constant(pa.scalar(None, pa.bool_()))
        return self.call(pc.if_else, self.call(pc.is_null, expr), unknown,
                         self.constant(pa.scalar(False)))  # fmt: skip

    def call(
        self, func: Callable[..., Any], *args: pc.Expression, at: _Tok | None = None, **kw: Any
    ) -> pc.Expression:
        """``func(*args)`` as an expression, with its eager form; with the input's types, an
        error at the operator token ``at`` if its operands' types do not fit."""
        if func in _LOGICAL and self._empty is not None:
            # SQL's unknown: a null (``not null``, ``null or x``) is a boolean null there
            args = tuple(
                self.made(a.cast(pa.bool_()), _as_bool(self.fn(a)))
                if pa.types.is_null(self.type_of(a))
                else a
                for a in args
            )
        fns = [self.fn(a) for a in args]
        expr = func(*args, **kw)
        if self._empty is not None and at is not None:
            try:
                self.type_of(expr)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                types = [str(self.type_of(a)) for a in args]
                if "value_set" in kw:
                    types.append(f"values of type {kw['value_set'].type}")
                if str(exc) == "overflow":  # Arrow folds the literals of ``i * a * b`` first
                    raise ExpressionError(
                        f"integer overflow: the literals beside {at.text!r} add or multiply to "
                        f"a value outside the operands' types ({' and '.join(types)})",
                        self.text, at.pos,
                    ) from None  # fmt: skip
                hint = ""
                if any(t.startswith("duration") for t in types) and any(
                    _is_number(self.type_of(a)) for a in args
                ):
                    hint = " (a length of time is written interval '90 seconds')"
                raise ExpressionError(
                    f"{at.text!r} does not apply to {' and '.join(types)}{hint}",
                    self.text, at.pos,
                ) from None  # fmt: skip
        eager = _EAGER.get(func, func)
        if self._empty is None:
            return self.made(expr, lambda b: eager(*(f(b) for f in fns), **kw))
        folded = _folded(eager, fns, kw)
        if folded is not None:  # literals only (``date '1998-12-01' - interval '90 days'``)
            return self.made(expr, folded)
        try:  # the node's identity, for shared_subexpressions
            key = (str(expr), str(self.type_of(expr)))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return self.made(expr, lambda b: eager(*(f(b) for f in fns), **kw))

        def run(batch: Any) -> Any:
            memo = getattr(_SHARED, "values", None)
            if memo is None:
                return eager(*(f(batch) for f in fns), **kw)
            slot = (id(batch), key)
            if slot not in memo:
                memo[slot] = eager(*(f(batch) for f in fns), **kw)
            return memo[slot]

        return self.made(expr, run)

    # -------------------------------------------------------------- helpers
    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def error(self, reason: str, tok: _Tok | None = None) -> ExpressionError:
        tok = tok or self.tok
        found = "the end of the expression" if tok.kind == "end" else repr(tok.text)
        return ExpressionError(f"{reason}, found {found}", self.text, tok.pos)

    def take_word(self, *words: str) -> bool:
        if self.tok.word in words:
            self.i += 1
            return True
        return False

    def take_op(self, *ops: str) -> str | None:
        if self.tok.kind == "op" and self.tok.text in ops:
            self.i += 1
            return self.toks[self.i - 1].text
        return None

    def expect_op(self, op: str) -> None:
        if self.take_op(op) is None:
            raise self.error(f"expected {op!r}")

    # -------------------------------------------------------------- grammar
    def parse(self) -> pc.Expression:
        if self.tok.kind == "end":
            raise self.error("expected an expression")
        expr = self.or_()
        if self.tok.kind != "end":
            raise self.error("expected 'and', 'or' or the end of the expression")
        return expr

    def or_(self) -> pc.Expression:
        left = self.and_()
        while (at := self.tok) and self.take_word("or"):
            left = self.call(pc.or_kleene, left, self.and_(), at=at)
        return left

    def and_(self) -> pc.Expression:
        left = self.not_()
        while (at := self.tok) and self.take_word("and"):
            left = self.call(pc.and_kleene, left, self.not_(), at=at)
        return left

    def not_(self) -> pc.Expression:
        at = self.tok
        if self.take_word("not"):
            return self.call(pc.invert, self.not_(), at=at)
        return self.predicate()

    def predicate(self) -> pc.Expression:
        left = self.concat_()
        at = self.tok
        op = self.take_op(*_CMP)
        if op is not None:
            left, right = self.fit_quoted(left, self.concat_())
            return self.binary(_CMP[op], left, right, at)
        if self.take_word("is"):
            negate = self.take_word("not")
            truth = self.tok
            if self.take_word("true", "false"):
                # SQL's boolean test: never null (null is neither true nor false)
                if self._empty is not None:
                    typ = self.type_of(left)
                    if not (pa.types.is_boolean(typ) or pa.types.is_null(typ)):
                        raise self.error(f"'is {truth.word}' tests a boolean, not {typ}", truth)
                value = self.constant(pa.scalar(truth.word == "true"))
                test = self.call(
                    pc.and_kleene,
                    self.call(pc.is_valid, left),
                    self.call(pc.equal, left, value, at=truth),
                )
            elif self.take_word("null"):
                test = self.call(pc.is_null, left)
            else:
                raise self.error("expected 'null', 'true' or 'false' after 'is'")
            return self.call(pc.invert, test) if negate else test
        start = self.i
        negate = self.take_word("not")
        at = self.tok
        if self.take_word("in"):
            self.expect_op("(")
            values = [self.literal_value()]
            while self.take_op(","):
                values.append(self.literal_value())
            self.expect_op(")")
            values = self._quoted_values_read(left, values, at)
            values = self._temporal_values_read(left, values)
            try:
                value_set = _value_set(values)
            except ValueError as exc:
                if self._empty is not None:
                    raise ExpressionError(str(exc), self.text, at.pos) from None
                # parsed without the input's types: its quoted values are read as the
                # column's type once they are known (bind); a stand-in until then
                shown = [v.as_py() if isinstance(v, pa.Scalar) else v for v in values]
                value_set = pa.array([None if v is None else str(v) for v in shown])
            if self._empty is not None:
                left, value_set = self.fit_in(left, value_set, at)
            # SQL's three values: null in (...) is null; x in (..., null) is true if x is in
            # the list, else null (so x not in (..., null) is never true); a null result drops
            # the row, under not as well
            test = self.call(pc.is_in, left, value_set=value_set, skip_nulls=True, at=at)
            unknown = self.constant(pa.scalar(None, pa.bool_()))
            if value_set.null_count:
                test = self.call(pc.if_else, test, self.constant(pa.scalar(True)), unknown)
            test = self.call(pc.if_else, self.call(pc.is_null, left), unknown, test)
            return self.call(pc.invert, test) if negate else test
        at = self.tok
        if at.word in ("like", "ilike"):
            self.i += 1
            pattern = self.literal_value()
            if not isinstance(pattern, str):
                raise self.error(
                    f"expected a quoted pattern after {at.text!r}", self.toks[self.i - 1]
                )
            ignore_case = at.word == "ilike"
            left = self.decoded(left)
            if "\\" in pattern:  # Arrow's own escapes differ between like and ilike
                test = self.call(pc.match_substring_regex, left, pattern=like_regex(pattern),
                                 ignore_case=ignore_case, at=at)  # fmt: skip
            else:
                test = self.call(pc.match_like, left, pattern=pattern, ignore_case=ignore_case,
                                 at=at)  # fmt: skip
            return self.call(pc.invert, test) if negate else test
        if self.take_word("between"):
            low = self.concat_()
            if not self.take_word("and"):
                raise self.error("expected 'and' in 'between ... and ...'")
            high = self.concat_()
            left, low = self.fit_quoted(left, low)
            left, high = self.fit_quoted(left, high)
            test = self.call(
                pc.and_kleene,
                self.binary(pc.greater_equal, left, low, at),
                self.binary(pc.less_equal, left, high, at),
            )
            return self.call(pc.invert, test) if negate else test
        if negate:
            self.i = start
            raise self.error("expected 'in', 'between' or 'like' after 'not'", self.toks[start + 1])
        return left

    def concat_(self) -> pc.Expression:
        """SQL's ``a || b``: the two as text, one after the other (a number or a date as
        :func:`concat` writes it), null where either is (``concat`` skips nulls)."""
        left = self.sum_()
        while (at := self.tok) and self.take_op("||") is not None:
            left = self._joined_texts([left, self.sum_()], at, skip_nulls=False)
        return left

    def sum_(self) -> pc.Expression:
        left = self.product()
        while (at := self.tok) and (op := self.take_op("+", "-")) is not None:
            right = self.product()
            func = pc.add_checked if op == "+" else pc.subtract_checked
            left = self.binary(func, left, right, at)
        return left

    def product(self) -> pc.Expression:
        left = self.unary()
        while (at := self.tok) and (op := self.take_op("*", "/", "%")) is not None:
            right = self.unary()
            left = self.binary(_PRODUCTS[op], left, right, at)
        return left

    def unary(self) -> pc.Expression:
        at = self.tok
        if at.kind == "op" and at.text == "-" and self.toks[self.i + 1].kind == "number":
            return self.postfix(self.atom())  # a negative number: one literal
        if self.take_op("-"):
            return self.call(pc.negate_checked, self.unary(), at=at)
        return self.postfix(self.atom())

    def postfix(self, expr: pc.Expression) -> pc.Expression:
        """``x::type`` (DuckDB's and Postgres' cast) and ``x[i]`` (a list's element, from 1;
        from the end if negative), any number of times."""
        while True:
            at = self.tok
            if self.take_op("::"):
                expr = self._cast_to(expr, self._type_name(), at)
            elif self.take_op("["):
                tok = self.tok
                index = self.literal_value() if tok.kind in ("number", "op") else None
                if type(index) is not int:
                    raise ExpressionError(
                        "a list's index is a whole number: x[1] is the first element, x[-1] "
                        "the last", self.text, tok.pos,
                    )  # fmt: skip
                self.expect_op("]")
                expr = self._list_extract(expr, index, at)
            else:
                return expr

    def cast_call(self) -> pc.Expression:
        """``cast(x as type)`` at the cursor."""
        at = self.tok
        self.i += 2  # cast (
        value = self.or_()
        if not self.take_word("as"):
            raise self.error("expected 'as' and a type: cast(x as double)")
        typ = self._type_name()
        self.expect_op(")")
        return self._cast_to(value, typ, at)

    def _type_name(self) -> pa.DataType:
        """A type's name at the cursor: SQL's (``integer``, ``bigint``, ``double``,
        ``varchar``, ``decimal(15, 2)``, ``date``, ``timestamp``, ...) or Arrow's (``int64``,
        ``float32``, ``string``, ...)."""
        tok = self.tok
        if tok.kind != "name":
            raise self.error(
                "expected a type (integer, bigint, double, decimal(p, s), varchar, date, ...)"
            )
        self.i += 1
        if tok.word == "double" and self.tok.word == "precision":
            self.i += 1
        args: list[int] = []
        if self.take_op("("):
            while True:
                if self.tok.kind != "number" or not self.tok.text.isdigit():
                    raise self.error("expected a whole number in the type's parentheses")
                args.append(int(self.tok.text))
                self.i += 1
                if self.take_op(")"):
                    break
                self.expect_op(",")
        name = tok.word
        if name in ("decimal", "numeric", "dec"):
            precision, scale = {0: (18, 3), 1: (args[0] if args else 0, 0)}.get(
                len(args), tuple(args[:2]) if len(args) == 2 else (0, 0)
            )  # DuckDB's decimal is decimal(18, 3)
            if not (1 <= precision <= 76 and 0 <= scale <= precision):
                raise ExpressionError(
                    f"decimal({precision}, {scale}) is not a decimal type (precision 1 to 76, "
                    "scale 0 to the precision)", self.text, tok.pos,
                )  # fmt: skip
            return (pa.decimal128 if precision <= 38 else pa.decimal256)(precision, scale)
        if args and name not in ("varchar", "char", "character"):
            raise ExpressionError(f"type {tok.text!r} takes no arguments", self.text, tok.pos)
        typ = _SQL_TYPES.get(name)
        if typ is not None:
            return typ
        from extagg.io.inputs import parse_type

        try:
            return parse_type(name)
        except QueryError:
            raise ExpressionError(
                f"unknown type {tok.text!r} (integer, bigint, smallint, tinyint, double, real, "
                "decimal(p, s), varchar, boolean, date, timestamp, or Arrow's: int64, float32, "
                "string, ...)", self.text, tok.pos,
            ) from None  # fmt: skip

    def _cast_to(self, expr: pc.Expression, typ: pa.DataType, at: _Tok) -> pc.Expression:
        """``expr`` cast to ``typ``, checked against its type (a value that does not convert
        is an error when the batch is computed, as in DuckDB)."""
        if self._empty is None:
            return self.cast(expr, typ)
        source = self.type_of(expr)
        if source == typ:
            return expr
        try:
            pc.cast(self._empty_of(source), typ)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            raise ExpressionError(f"{source} cannot be cast to {typ}", self.text, at.pos) from None
        # DuckDB's casts round where Arrow's refuse to lose digits: a float to an integer
        # half to even (2.5 -> 2, as C's nearbyint), a decimal to an integer or to fewer
        # places half away from zero (1.25 -> 1.3, -2.55 -> -3)
        if pa.types.is_floating(source) and pa.types.is_integer(typ):
            expr = self.call(pc.round, expr, round_mode="half_to_even")
        elif pa.types.is_decimal(source) and pa.types.is_integer(typ):
            expr = self.call(pc.round, expr, round_mode="half_towards_infinity")
        elif pa.types.is_decimal(source) and pa.types.is_decimal(typ) and typ.scale < source.scale:
            expr = self.call(pc.round, expr, ndigits=typ.scale, round_mode="half_towards_infinity")
        elif pa.types.is_integer(source) and pa.types.is_decimal(typ):
            # Arrow refuses any decimal of fewer digits than the integer type may have (an
            # int64 into decimal(18, 3)); through 38 digits, each value is checked instead
            wide = pa.decimal128(38, 0) if typ.bit_width == 128 else pa.decimal256(76, 0)
            expr = self.cast(expr, wide)
        return self.cast(expr, typ)

    def atom(self) -> pc.Expression:
        tok = self.tok
        if self.take_op("("):
            inner = self.or_()
            self.expect_op(")")
            return inner
        if tok.kind == "quoted":
            self.i += 1
            name = tok.text[1:-1].replace('""', '"') if tok.text[0] == '"' else tok.text[1:-1]
            return self.column(name, tok.pos, quoted=True)
        if tok.word == "case" and self._starts_case():
            return self.case()
        if (
            tok.word == "cast"
            and self.toks[self.i + 1].kind == "op"
            and self.toks[self.i + 1].text == "("
        ):
            return self.cast_call()
        if (
            tok.kind == "name"
            and tok.word not in _KEYWORDS
            and self.toks[self.i + 1].kind == "op"
            and self.toks[self.i + 1].text == "("
        ):
            return self.function()
        if tok.kind == "name" and (
            tok.word not in _KEYWORDS
            or (tok.word in _LITERAL_WORDS and not self._starts_literal(tok.word))
        ):
            self.i += 1
            return self.column(tok.text, tok.pos)
        value = self.literal_value()
        literal = value if isinstance(value, pa.Scalar) else pa.scalar(value)
        expr = self.made(pc.scalar(value), _constant(literal))
        if isinstance(value, (str, Decimal)) or (
            isinstance(value, pa.Scalar) and pa.types.is_temporal(value.type)
        ):
            self._quoted[id(expr)] = (value, tok)
        elif type(value) is int:
            self._ints[id(expr)] = value
        return expr

    def function(self) -> pc.Expression:
        """``name(arg, ...)`` at the cursor: one of :data:`FUNCTIONS` (DuckDB's names and
        meanings); a pattern, a position or a digit count must be a literal."""
        at = self.tok
        name = at.word
        self.i += 2  # the name and "("
        if name == "unnest":
            raise ExpressionError(
                "unnest() is a whole key, not a part of an expression: --by 'unnest(tags) AS "
                "tag' makes a row of each element", self.text, at.pos,
            )  # fmt: skip
        if name not in FUNCTIONS:
            raise ExpressionError(
                f"unknown function {at.text!r} (functions: {', '.join(sorted(FUNCTIONS))})",
                self.text, at.pos,
            )  # fmt: skip
        kind, low, high = FUNCTIONS[name]
        args: list[pc.Expression] = []
        literals: list[Any] = []
        if not self.take_op(")"):
            while True:
                if kind == "trunc" and not literals:  # date_trunc('month', d): the unit first
                    literals.append(self._function_literal(name, text=True))
                elif kind in _LITERAL_ARGS and args:  # the pattern, start, length or digits
                    text = kind in _TEXT_ARGS or (
                        kind in ("split_part", "extract") and not literals
                    )
                    literals.append(self._function_literal(name, text=text))
                else:
                    args.append(self.or_())
                if self.take_op(")"):
                    break
                self.expect_op(",")
        given = len(args) + len(literals)
        if not low <= given <= high:
            count = str(low) if low == high else f"{low} to {high}" if high < 99 else f"{low}+"
            raise ExpressionError(
                f"{name}() takes {count} argument{'s' if count != '1' else ''}, got {given}",
                self.text, at.pos,
            )  # fmt: skip
        if kind == "coalesce":
            return self.call(pc.coalesce, *args, at=at)
        if kind == "if":
            return self._case([(args[0], args[1])], args[2], at)
        if kind == "extreme":  # nulls left out, as DuckDB's greatest/least; the types alike
            for k in range(1, len(args)):
                for j in range(k):
                    args[j], args[k] = self._alike(args[j], args[k], at)
            func = pc.max_element_wise if name == "greatest" else pc.min_element_wise
            return self.call(func, *args, at=at, skip_nulls=True)
        if kind == "nullif":  # null where a = b, else a
            value, other = args
            same = self.call(
                pc.coalesce,
                self.binary(pc.equal, value, other, at),
                self.constant(pa.scalar(False)),
            )
            kind_of = self.type_of(value) if self._empty is not None else pa.null()
            return self.call(
                pc.if_else, same, self.constant(pa.scalar(None, kind_of)), value, at=at
            )
        if kind == "pattern":
            return self.call(_PATTERN_FUNCTIONS[name], args[0], at=at, pattern=literals[0])
        if kind == "format":
            return self.call(pc.strftime, args[0], at=at, format=literals[0])
        if kind == "parse":
            return self._strptime(args[0], literals[0], at, strict=name == "strptime")
        if kind == "to_timestamp":
            return self._to_timestamp(args[0], at)
        if kind == "epoch":
            return self._epoch(args[0], at, millis=name == "epoch_ms")
        if kind == "concat":
            return self._concat(args, at)
        if kind == "replace":
            text = self._text_argument(args[0], at)
            return self.call(
                pc.replace_substring, text, at=at, pattern=literals[0], replacement=literals[1]
            )
        if kind == "split_part":
            return self._split_part(args[0], literals[0], literals[1], at)
        if kind == "extract":
            return self._regexp_extract(args[0], literals[0], literals[1:], at)
        if kind == "length":
            return self._length(args[0], name, at)
        if kind == "list_contains":
            return self._list_contains(args[0], args[1], name, at)
        if kind == "list_extract":
            return self._list_extract(args[0], literals[0], at)
        if kind == "trunc":
            unit = literals[0].lower()
            if unit not in _TRUNC_UNITS:
                raise ExpressionError(
                    f"date_trunc() takes a unit of {', '.join(_TRUNC_UNITS)}, got {literals[0]!r}",
                    self.text, at.pos,
                )  # fmt: skip
            # ISO weeks, from Monday, as DuckDB's; a date stays a date (DuckDB: a timestamp)
            return self.call(pc.floor_temporal, args[0], at=at, unit=unit, week_starts_monday=True)
        if kind == "substr":
            start = literals[0]
            if start < 1:
                raise ExpressionError(
                    f"substr() counts from 1, got start {start}", self.text, at.pos
                )
            stop = start - 1 + literals[1] if len(literals) > 1 else _NO_STOP
            if stop < start - 1:
                raise ExpressionError("substr() length must be >= 0", self.text, at.pos)
            return self.call(pc.utf8_slice_codeunits, args[0], at=at, start=start - 1, stop=stop)
        if kind == "round":
            digits = literals[0] if literals else 0
            return self.call(
                pc.round, args[0], at=at, ndigits=digits, round_mode="half_towards_infinity"
            )
        func, options = _VALUE_FUNCTIONS[name]
        return self.call(func, args[0], at=at, **options)

    def _list_type(self, expr: pc.Expression, name: str, at: _Tok) -> pa.DataType | None:
        """The type of a list argument (``None`` without the input's types); another type is
        an error at ``at``."""
        if self._empty is None:
            return None
        typ = self.type_of(expr)
        if not (pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_null(typ)):
            raise ExpressionError(
                f"{name} takes a list (a JSON array, a Parquet list), not {typ}",
                self.text, at.pos,
            )  # fmt: skip
        return typ

    def _length(self, value: pc.Expression, name: str, at: _Tok) -> pc.Expression:
        """DuckDB's ``length``/``len``: a text's characters, a list's elements (int64)."""
        typ = self.type_of(value) if self._empty is not None else None
        if typ is not None and (pa.types.is_list(typ) or pa.types.is_large_list(typ)):
            return self.cast(self.call(pc.list_value_length, value, at=at), pa.int64())
        if typ is not None and pa.types.is_null(typ):
            return self.constant(pa.scalar(None, pa.int64()))
        return self.call(pc.utf8_length, value, at=at)

    def _list_contains(
        self, values: pc.Expression, value: pc.Expression, name: str, at: _Tok
    ) -> pc.Expression:
        """DuckDB's ``list_contains(list, value)``: whether an element equals ``value``;
        null where the list is null or the value is (false for an empty list there); a null
        element matches nothing."""
        typ = self._list_type(values, f"{name}()", at)
        if typ is None:  # parsed without the input's types: bound again with them
            return self.call(_list_function("contains", None, None), values, value, at=at)
        if pa.types.is_null(typ):  # a JSON field that is null wherever it is read
            return self.constant(pa.scalar(None, pa.bool_()))
        element = typ.value_type
        value_type = self.type_of(value)
        fractional = pa.types.is_floating(value_type) or pa.types.is_decimal(value_type)
        if pa.types.is_integer(element) and fractional:  # 1.5 among integers: compared as
            typ = (
                pa.large_list(pa.float64())
                if pa.types.is_large_list(typ)
                else pa.list_(pa.float64())
            )  # doubles, as DuckDB does (false, not an error)
            values, value = self.cast(values, typ), self.cast(value, pa.float64())
            element = value_type = pa.float64()
        if value_type != element:
            literal = self._quoted.get(id(value), (self._ints.get(id(value)),))[0]
            try:  # a quoted '7' among numbers is read as one, as DuckDB does
                if literal is not None:  # a literal's value checked now, not per batch
                    scalar = literal if isinstance(literal, pa.Scalar) else pa.scalar(literal)
                    scalar.cast(element)
                value = self.cast(value, element)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                raise ExpressionError(
                    f"{name}() looks for a {value_type} value in a list of {element}",
                    self.text, at.pos,
                ) from None  # fmt: skip
        kernel = _list_function("contains", typ, element)
        return self.call(kernel, values, value, at=at)

    def _list_extract(self, values: pc.Expression, index: int, at: _Tok) -> pc.Expression:
        """DuckDB's ``list[i]`` / ``list_extract(list, i)``: the ``i``-th element from 1, from
        the end if ``i`` is negative; null past either end, for ``i = 0`` and a null list."""
        typ = self._list_type(values, "[] (a list's element)", at)
        if typ is None:
            return self.call(_list_function("extract", None, None, index), values, at=at)
        if pa.types.is_null(typ):
            return self.constant(pa.scalar(None))
        return self.call(_list_function("extract", typ, None, index), values, at=at)

    def _strptime(self, text: pc.Expression, format: str, at: _Tok, strict: bool) -> pc.Expression:
        """DuckDB's ``strptime(text, format)``: a timestamp (microseconds) read by the C
        library's format (``'%d/%m/%Y %H:%M'``); a text not in the format is an error naming
        it (``try_strptime``: null)."""
        text = self._text_argument(text, at)
        expr = self.call(pc.strptime, text, at=at, format=format, unit="us", error_is_null=True)
        if not strict:
            return expr
        parsed, read, source, where = self.fn(expr), self.fn(text), self.text, at.pos

        def checked(batch: Any) -> Any:
            out = parsed(batch)
            if isinstance(out, pa.Scalar):
                values = read(batch)
                if not out.is_valid and values.is_valid:
                    raise _not_in_format(values.as_py(), format, source, where)
                return out
            if out.null_count:
                values = read(batch)
                if out.null_count > values.null_count:
                    missed = pc.and_(pc.is_null(out), pc.is_valid(values))
                    first = pc.index(missed, True).as_py()
                    raise _not_in_format(values[first].as_py(), format, source, where)
            return out

        return self.made(expr, checked)

    def _text_argument(self, expr: pc.Expression, at: _Tok) -> pc.Expression:
        """A text function's argument, its values (a dictionary decoded); anything but text
        is a usage error at the function."""
        if self._empty is None:
            return expr
        typ = self.type_of(self.decoded(expr))
        if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
            raise ExpressionError(f"{at.text}() reads a text, not {typ}", self.text, at.pos)
        return self.decoded(expr)

    def _to_timestamp(self, seconds: pc.Expression, at: _Tok) -> pc.Expression:
        """DuckDB's ``to_timestamp(seconds)``: seconds since 1970 (a Unix time, fractions
        too) as a UTC timestamp, to the microsecond."""
        if self._empty is not None and not _is_number(self.type_of(seconds)):
            raise ExpressionError(
                f"to_timestamp() reads seconds (a number), not {self.type_of(seconds)}",
                self.text, at.pos,
            )  # fmt: skip
        micros = self.call(
            pc.multiply, self.cast(seconds, pa.float64()), self.constant(pa.scalar(1e6)), at=at
        )
        whole = self.cast(self.call(pc.round, micros, at=at), pa.int64())
        return self.cast(whole, pa.timestamp("us", tz="UTC"))

    def _epoch(self, when: pc.Expression, at: _Tok, millis: bool) -> pc.Expression:
        """DuckDB's ``epoch(t)`` (seconds since 1970, a double) and ``epoch_ms(t)`` (whole
        milliseconds, rounded down) of a date or timestamp (a zoned one: its instant)."""
        if self._empty is not None:
            typ = self.type_of(when)
            if not (pa.types.is_timestamp(typ) or pa.types.is_date(typ)):
                raise ExpressionError(
                    f"{at.text}() reads a date or timestamp, not {typ}", self.text, at.pos
                )
            tz = typ.tz if pa.types.is_timestamp(typ) else None
            if not pa.types.is_timestamp(typ) or typ.unit != "us":
                when = self.made(
                    when.cast(pa.timestamp("us", tz=tz), safe=False),
                    _unsafe_cast(self.fn(when), pa.timestamp("us", tz=tz)),
                )
        micros = self.cast(self.cast(when, pa.int64()), pa.float64())
        scale = 1e3 if millis else 1e6
        value = self.call(pc.divide, micros, self.constant(pa.scalar(scale)), at=at)
        if not millis:
            return value
        return self.cast(self.call(pc.floor, value, at=at), pa.int64())

    def _concat(self, args: list[pc.Expression], at: _Tok) -> pc.Expression:
        """DuckDB's ``concat(a, ...)``: the values as text, one after the other, a null as
        nothing (all null: an empty text)."""
        return self._joined_texts(args, at, skip_nulls=True)

    def _joined_texts(
        self, args: list[pc.Expression], at: _Tok, *, skip_nulls: bool
    ) -> pc.Expression:
        """The values of ``args`` as text, one after the other; a null is nothing
        (``skip_nulls``) or makes the result null."""
        texts = []
        for arg in args:
            if self._empty is None:  # types not known: each cast (a text's cast is a no-op)
                texts.append(self.cast(arg, pa.string()))
                continue
            typ = self.type_of(arg)
            if pa.types.is_dictionary(typ) or pa.types.is_large_string(typ):
                arg = self.decoded(arg)
                typ = self.type_of(arg)
            texts.append(arg if pa.types.is_string(typ) else self.cast(arg, pa.string()))
        if not skip_nulls:
            return self.call(pc.binary_join_element_wise, *texts, self.constant(pa.scalar("")),
                             at=at)  # fmt: skip
        return self.call(
            pc.binary_join_element_wise, *texts, self.constant(pa.scalar("")),
            at=at, null_handling="replace", null_replacement="",
        )  # fmt: skip

    def _split_part(self, text: pc.Expression, sep: str, index: int, at: _Tok) -> pc.Expression:
        """DuckDB's ``split_part(s, sep, n)``: the ``n``-th part (from 1; from the end when
        negative) of ``s`` cut at each ``sep``, an empty text where there is none (``n`` 0,
        past the parts); ``sep`` empty cuts every character."""
        text = self._text_argument(text, at)
        if sep == "":
            start = index - 1 if index > 0 else index
            stop = index if index not in (0, -1) else (0 if index == 0 else _NO_STOP)
            return self.call(pc.utf8_slice_codeunits, text, at=at, start=start, stop=stop)
        if index < 0:  # from the end: the same of the reversed text, reversed back
            text = self.call(pc.utf8_reverse, text, at=at)
            sep, count = sep[::-1], -index
        else:
            count = index
        parts = self.call(pc.split_pattern, text, at=at, pattern=sep)
        start = max(count - 1, 0)
        part = self.call(pc.list_slice, parts, at=at, start=start, stop=start + (count > 0))
        joined = self.call(pc.binary_join, part, self.constant(pa.scalar("")), at=at)
        return self.call(pc.utf8_reverse, joined, at=at) if index < 0 else joined

    def _regexp_extract(
        self, text: pc.Expression, pattern: str, group: list[int], at: _Tok
    ) -> pc.Expression:
        """DuckDB's ``regexp_extract(s, pattern[, group])``: the first match of ``pattern``
        (RE2) in ``s``, or its ``group``-th group (from 1), an empty text where it does not
        match."""
        text = self._text_argument(text, at)
        named, names = _named_groups(pattern)
        number = group[0] if group else 0
        if not 0 <= number < len(names):
            raise ExpressionError(
                f"regexp_extract() group {number}: the pattern has {len(names) - 1} group(s)",
                self.text, at.pos,
            )  # fmt: skip
        try:
            pc.extract_regex(pa.array([""], pa.string()), pattern=named)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            reason = str(exc).split(":", 1)[-1].strip()
            raise ExpressionError(
                f"regexp_extract() pattern {pattern!r} is not a regular expression ({reason})",
                self.text, at.pos,
            ) from None  # fmt: skip
        matches = self.call(pc.extract_regex, text, at=at, pattern=named)
        found = self.call(pc.struct_field, matches, at=at, indices=[names[number]])
        empty = self.call(pc.coalesce, found, self.constant(pa.scalar("")), at=at)
        missing = self.constant(pa.scalar(None, pa.string()))
        return self.call(pc.if_else, self.call(pc.is_null, text, at=at), missing, empty, at=at)

    def _function_literal(self, name: str, text: bool) -> Any:
        tok = self.tok
        value = self.literal_value() if tok.kind in ("string", "number", "op") else None
        if text and isinstance(value, str):
            return value
        if not text and type(value) is int:
            return value
        what = "a quoted text" if text else "a whole number"
        raise ExpressionError(f"{name}() takes {what} here", self.text, tok.pos)

    def _starts_case(self) -> bool:
        """Whether the ``case`` at the cursor starts a ``case`` expression: ``when`` follows,
        or (``case x when ...``) a value does; before an operator, a comma, a parenthesis or
        the end it is a column named ``case``."""
        after = self.toks[self.i + 1]
        return after.word == "when" or not (
            after.kind == "end" or (after.kind == "op" and after.text != "(")
        )

    def case(self) -> pc.Expression:
        """``case when c then v [when ...] [else e] end``, or ``case x when a then v ...
        end`` (``x = a``), as in SQL: the value of the first condition that is true (a null
        one is not), else ``e`` or null; the values' types made alike as ``+`` makes them."""
        at = self.tok
        self.i += 1
        subject = None if self.tok.word == "when" else self.sum_()
        branches: list[tuple[pc.Expression, pc.Expression]] = []
        while (when := self.tok) and self.take_word("when"):
            test = (
                self.or_() if subject is None else self.binary(pc.equal, subject, self.sum_(), when)
            )
            if not self.take_word("then"):
                raise self.error("expected 'then'")
            branches.append((test, self.or_()))
        if not branches:
            raise self.error("expected 'when'")
        otherwise = self.or_() if self.take_word("else") else None
        if not self.take_word("end"):
            raise self.error("expected 'when', 'else' or 'end'")
        return self._case(branches, otherwise, at)

    def _case(
        self,
        branches: list[tuple[pc.Expression, pc.Expression]],
        otherwise: pc.Expression | None,
        at: _Tok,
    ) -> pc.Expression:
        """Nested ``if_else`` from the last branch (``if(c, a, b)`` is one branch)."""
        false = self.constant(pa.scalar(False))
        result = otherwise if otherwise is not None else self.constant(pa.scalar(None))
        for test, value in reversed(branches):
            kind = None if self._empty is None else self.type_of(test)
            if kind is not None and not (pa.types.is_boolean(kind) or pa.types.is_null(kind)):
                raise ExpressionError(
                    f"a condition of {at.text!r} is a value of type {kind}, not a test "
                    "(compare it: x > 0)", self.text, at.pos,
                )  # fmt: skip
            true = self.call(pc.coalesce, self._as_bool(test), false)
            value, result = self._alike(value, result, at)
            result = self.call(pc.if_else, true, value, result, at=at)
        return result

    def _as_bool(self, expr: pc.Expression) -> pc.Expression:
        """A condition that may be the null literal (``when null then``): a boolean."""
        if self._empty is not None and pa.types.is_null(self.type_of(expr)):
            return self.cast(expr, pa.bool_())
        return expr

    def _alike(
        self, left: pc.Expression, right: pc.Expression, at: _Tok
    ) -> tuple[pc.Expression, pc.Expression]:
        """Two values of one type, as ``+`` and ``coalesce`` make SQL's types alike: an
        integer beside a decimal a decimal, a decimal or an integer beside a float a float, a
        null literal the other's type, two integers or two decimals the wider."""
        if self._empty is None:
            return left, right
        lt, rt = self.type_of(left), self.type_of(right)
        if lt == rt:
            return left, right
        if pa.types.is_null(lt):
            return self.cast(left, rt), right
        if pa.types.is_null(rt):
            return left, self.cast(right, lt)
        if pa.types.is_decimal(lt) and pa.types.is_integer(rt):
            right = self._as_decimal(right, rt)
        elif pa.types.is_integer(lt) and pa.types.is_decimal(rt):
            left = self._as_decimal(left, lt)
        elif pa.types.is_floating(lt) != pa.types.is_floating(rt) and all(
            _is_number(t) for t in (lt, rt)
        ):
            left, right = self.cast(left, pa.float64()), self.cast(right, pa.float64())
        lt, rt = self.type_of(left), self.type_of(right)
        if lt == rt:
            return left, right
        try:  # Arrow's common type of the two (int32 and int64, two decimals, two strings)
            common = pc.if_else(pa.scalar(True), self._empty_of(lt), self._empty_of(rt)).type
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            raise ExpressionError(
                f"the values of {at.text!r} are of types {lt} and {rt}, which do not mix",
                self.text, at.pos,
            ) from None  # fmt: skip
        return (left if lt == common else self.cast(left, common),
                right if rt == common else self.cast(right, common))  # fmt: skip

    @staticmethod
    def _empty_of(typ: pa.DataType) -> pa.Array:
        return pa.array([], typ)

    def _starts_literal(self, word: str) -> bool:
        """Whether the ``date``/``timestamp``/``interval`` at the cursor starts a literal:
        a quoted text follows (``interval``: or a number, ``interval 2 hours``)."""
        after = self.toks[self.i + 1]
        return after.kind == "string" or (word == "interval" and after.kind == "number")

    def column(self, name: str, pos: int, quoted: bool = False) -> pc.Expression:
        if not quoted and name in self.fields:  # a struct column's field (never when quoted)
            root, path = self.fields[name]
            self.columns.setdefault(root, pos)
            self.paths.setdefault(root, set()).add(path)
            return self.made(
                pc.field(root, *path), lambda b: pc.struct_field(b.column(root), list(path))
            )
        self.columns.setdefault(name, pos)
        self.whole.add(name)
        schema = None if self._empty is None else self._empty.schema
        if (
            schema is not None
            and name in schema.names
            and pa.types.is_float16(schema.field(name).type)
        ):
            # Arrow's compute has no half-float kernels: compared as float32 (the same values
            # and order)
            as_float32 = pc.field(name).cast(pa.float32())
            return self.made(as_float32, lambda b: b.column(name).cast(pa.float32()))
        return self.made(pc.field(name), lambda b: b.column(name))

    def literal_value(self) -> object:
        tok = self.tok
        negative = False
        if tok.kind == "op" and tok.text == "-":
            self.i += 1
            negative, tok = True, self.tok
        if tok.kind == "number":
            self.i += 1
            value: object = _number(tok.text)
            return -value if negative else value  # type: ignore[operator]
        if negative:
            raise self.error("expected a number after '-'")
        if tok.kind == "string":
            self.i += 1
            return tok.text[1:-1].replace("''", "'")
        word = tok.word
        if word in ("true", "false"):
            self.i += 1
            return word == "true"
        if word == "null":
            self.i += 1
            return pa.scalar(None)
        if word == "interval":
            self.i += 1
            lit = self.tok
            after = self.toks[self.i + 1]
            unit = after.kind == "name" and (
                after.word in _INTERVAL_UNITS or after.word in _MONTH_UNITS
            )
            if lit.kind == "number" and after.kind == "name":
                self.i += 2
                text = f"{lit.text} {after.text}"
            elif lit.kind == "string" and unit:  # interval '1' year, as TPC-H writes it
                self.i += 2
                text = f"{lit.text[1:-1]} {after.text}"
            elif lit.kind == "string":
                self.i += 1
                text = lit.text[1:-1]
            else:
                raise self.error("expected a quoted length after 'interval' ('1 day 2 hours')")
            try:
                months, micros = interval_parts(text)
            except ValueError as exc:
                raise ExpressionError(str(exc), self.text, lit.pos) from None
            if months:  # calendar months: added to a date or timestamp literal (binary)
                return pa.scalar(
                    pa.MonthDayNano([months, 0, micros * 1000]), pa.month_day_nano_interval()
                )
            return pa.scalar(micros, pa.duration("us"))
        if word in ("date", "timestamp"):
            self.i += 1
            lit = self.tok
            if lit.kind != "string":
                raise self.error(f"expected a quoted {word} after {word!r}")
            self.i += 1
            text = _iso_padded(lit.text[1:-1])
            try:
                if word == "date":
                    return pa.scalar(dt.date.fromisoformat(text), pa.date32())
                when = dt.datetime.fromisoformat(text)
                if when.tzinfo is not None:  # '...+02:00', '...Z': an instant
                    return pa.scalar(when, pa.timestamp("us", tz="UTC"))
                return pa.scalar(when, pa.timestamp("us"))
            except ValueError:
                raise ExpressionError(
                    f"invalid {word} literal {lit.text}", self.text, lit.pos
                ) from None
        raise self.error("expected a value (number, 'string', date '...', column)")


#: the microseconds of each unit an interval's text may give
_INTERVAL_UNITS = {
    **dict.fromkeys(("microsecond", "microseconds", "us"), 1),
    **dict.fromkeys(("millisecond", "milliseconds", "ms"), 1_000),
    **dict.fromkeys(("second", "seconds", "sec", "secs", "s"), 1_000_000),
    **dict.fromkeys(("minute", "minutes", "min", "mins", "m"), 60_000_000),
    **dict.fromkeys(("hour", "hours", "h"), 3_600_000_000),
    **dict.fromkeys(("day", "days", "d"), 86_400_000_000),
    **dict.fromkeys(("week", "weeks", "w"), 7 * 86_400_000_000),
}
_INTERVAL_PART = re.compile(r"\s*([+-]?(?:\d+\.?\d*|\.\d+))\s*([a-z]+)")
_INTERVAL_CLOCK = re.compile(r"\s*([+-]?)(\d+):(\d{1,2})(?::(\d{1,2}(?:\.\d{1,6})?))?\s*")


def interval_micros(text: str) -> int:
    """The microseconds of an interval's text, as DuckDB and Postgres write one: parts of a
    number and a unit (``1 day 2 hours``, ``90 minutes``, ``1.5 h``, ``-3 days``), then
    optionally a clock (``1 day 02:30:00``, ``00:00:01.5``). Months and years have no fixed
    length and are refused here (see :func:`interval_parts`), as is a length past a
    microsecond's precision."""
    months, micros = interval_parts(text)
    if months:
        raise ValueError(
            f"interval {text!r}: months and years have no fixed length; here the length is "
            "given in days (interval '30 days')"
        )
    return micros


def interval_parts(text: str) -> tuple[int, int]:
    """An interval's text as (whole months, microseconds): :func:`interval_micros`' forms,
    and months and years (``1 year``, ``3 months``, ``1 year 2 days``), which a date or a
    timestamp literal adds as calendar months (``date '1994-01-31' + interval '1 month'`` is
    February's last day), as DuckDB does."""
    rest, total, seen = text.strip().lower(), Decimal(0), False
    months = Decimal(0)
    while rest:
        m = _INTERVAL_PART.match(rest)
        if m is None:
            break
        unit = _INTERVAL_UNITS.get(m.group(2))
        month_unit = _MONTH_UNITS.get(m.group(2))
        if unit is None and month_unit is None:
            raise ValueError(
                f"interval {text!r}: unknown unit {m.group(2)!r} (use microseconds, "
                "milliseconds, seconds, minutes, hours, days, weeks, months or years)"
            )
        if month_unit is not None:
            months += Decimal(m.group(1)) * month_unit
        else:
            total += Decimal(m.group(1)) * unit  # type: ignore[operator]
        rest, seen = rest[m.end() :].lstrip(), True
    if rest:
        clock = _INTERVAL_CLOCK.fullmatch(rest)
        if clock is None:
            raise ValueError(
                f"interval {text!r} is not a length of time ('1 day 2 hours', '90 minutes', "
                "'01:30:00', '1 year')"
            )
        sign, hours, minutes, seconds = clock.groups()
        length = (
            Decimal(hours) * 3_600_000_000 + Decimal(minutes) * 60_000_000
            + Decimal(seconds or 0) * 1_000_000
        )  # fmt: skip
        total += -length if sign == "-" else length
    elif not seen:
        raise ValueError(f"interval {text!r} is empty")
    if total != total.to_integral_value():
        raise ValueError(f"interval {text!r} is finer than a microsecond")
    if months != months.to_integral_value():
        raise ValueError(f"interval {text!r}: months and years are counted whole")
    return int(months), int(total)


#: the months of each calendar unit an interval's text may give
_MONTH_UNITS = {
    **dict.fromkeys(("month", "months", "mon", "mons"), 1),
    **dict.fromkeys(("year", "years", "yr", "yrs", "y"), 12),
    **dict.fromkeys(("decade", "decades"), 120),
    **dict.fromkeys(("century", "centuries"), 1200),
}


def add_months(when: dt.date, months: int) -> dt.date:
    """``when`` (a date or a datetime) ``months`` calendar months later (earlier if negative),
    its day kept or, past the new month's end, that end (``2024-01-31`` + 1: ``2024-02-29``),
    as DuckDB, Postgres and Spark's ``add_months``."""
    import calendar

    total = when.year * 12 + when.month - 1 + months
    year, month = divmod(total, 12)
    if not dt.MINYEAR <= year <= dt.MAXYEAR:
        raise ValueError(f"{when} + {months} months is past the years a date may have")
    day = min(when.day, calendar.monthrange(year, month + 1)[1])
    return when.replace(year=year, month=month + 1, day=day)


def _read_as(value: str | pa.Scalar, typ: pa.DataType) -> pa.Scalar | None:
    """``value`` (a quoted text, or a date/timestamp literal) as a scalar of ``typ``; ``None``
    for a typed literal that needs no change. Raises Arrow's error or ``ValueError`` when the
    text does not read as ``typ``."""
    if isinstance(value, pa.Scalar):  # date '...' / timestamp '...'
        instant = pa.types.is_timestamp(value.type) and value.type.tz is not None
        if instant and pa.types.is_timestamp(typ):
            # an offset given ('...+02:00'): that instant in a zoned column, its UTC wall
            # time in a naive one (Arrow compares no zoned value with a naive one)
            if typ.tz is not None:
                return value.cast(pa.timestamp(typ.unit, tz=typ.tz))
            return value.cast(pa.timestamp(typ.unit))
        if not (pa.types.is_timestamp(typ) and typ.tz is not None):
            return None
        when = value.as_py()
        if when is None:
            return None
        if not isinstance(when, dt.datetime):
            when = dt.datetime.combine(when, dt.time())
        return _timestamp(when, typ)
    if pa.types.is_date(typ) or pa.types.is_timestamp(typ):
        value = _iso_padded(value)
    if pa.types.is_duration(typ):  # '1 hour', '01:30:00': as interval '...'
        return pa.scalar(interval_micros(value), pa.duration("us")).cast(typ)
    if pa.types.is_time(typ):  # '12:00', '12:00:00', '12:00:00.250' (Arrow reads no text)
        when = dt.time.fromisoformat(value.strip())
        return pa.scalar(when, pa.time64("us")).cast(typ)
    try:
        return pa.scalar(value).cast(typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if not pa.types.is_timestamp(typ):
            raise
    return _timestamp(dt.datetime.fromisoformat(value), typ)


_LOOSE_ISO = re.compile(
    r"(\d{4})-(\d{1,2})-(\d{1,2})(?:([ T])(\d{1,2}):(\d{1,2})(?::(\d{1,2}))?)?(.*)", re.DOTALL
)


def _iso_padded(text: str) -> str:
    """A date or timestamp text with its one-digit fields padded (``2024-1-5 7:03`` ->
    ``2024-01-05 07:03``): DuckDB and Spark read them, Python's and Arrow's ISO parsers do
    not. Other text is returned as it is (and refused by the parser as before)."""
    m = _LOOSE_ISO.fullmatch(text.strip())
    if m is None:
        return text
    year, month, day, sep, hour, minute, second, rest = m.groups()
    out = f"{year}-{int(month):02d}-{int(day):02d}"
    if sep is not None:
        out += f"{sep}{int(hour):02d}:{int(minute):02d}"
        if second is not None:
            out += f":{int(second):02d}"
    return out + rest


def _timestamp(when: dt.datetime, typ: pa.TimestampType) -> pa.Scalar:
    """``when`` as a scalar of the timestamp type ``typ``: a naive time in ``typ``'s zone. A
    wall time the zone skips (a daylight-saving gap) is moved forward by the gap, one it has
    twice is the earlier instant: Spark's (Java's) reading of a local time, Python's
    ``fold=0`` (DuckDB also moves a gap's time forward, but takes the later instant of a
    repeated hour; Arrow's ``assume_timezone`` raises on both)."""
    if when.tzinfo is not None or typ.tz is None:
        return pa.scalar(when, pa.timestamp(typ.unit, "UTC" if when.tzinfo else None)).cast(typ)
    try:
        zone = zoneinfo.ZoneInfo(typ.tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):  # "+05:30": no clock changes
        naive = pa.array([when], pa.timestamp(typ.unit))
        return pc.assume_timezone(naive, timezone=typ.tz)[0]
    instant = when.replace(tzinfo=zone, fold=0).astimezone(dt.timezone.utc)
    return pa.scalar(instant, pa.timestamp(typ.unit, "UTC")).cast(typ)


#: the operators of three-valued logic (their operands are tests)
#: the functions of ``--where`` / ``--having``: name -> (kind, fewest, most arguments), with
#: DuckDB's names and meanings (``dayofweek``: Sunday 0; ``length``: characters; ``round``:
#: half away from zero; ``substr``: from 1)
FUNCTIONS: dict[str, tuple[str, int, int]] = {
    **{name: ("value", 1, 1) for name in (
        "year", "quarter", "month", "day", "dayofweek", "dayofyear", "hour", "minute",
        "second", "lower", "upper", "trim", "ltrim", "rtrim", "abs", "floor", "ceil",
    )},
    # a text's characters, or a list's elements
    "length": ("length", 1, 1), "len": ("length", 1, 1), "array_length": ("length", 1, 1),
    **{name: ("list_contains", 2, 2)
       for name in ("list_contains", "list_has", "array_contains", "array_has")},
    **{name: ("list_extract", 2, 2)
       for name in ("list_extract", "list_element", "array_extract")},
    "coalesce": ("coalesce", 1, 99),
    "if": ("if", 3, 3),
    "greatest": ("extreme", 1, 99), "least": ("extreme", 1, 99), "nullif": ("nullif", 2, 2),
    "starts_with": ("pattern", 2, 2), "ends_with": ("pattern", 2, 2),
    "contains": ("pattern", 2, 2), "regexp_matches": ("pattern", 2, 2),
    "substr": ("substr", 2, 3), "substring": ("substr", 2, 3),
    "round": ("round", 1, 2),
    "date_trunc": ("trunc", 2, 2), "strftime": ("format", 2, 2),
    "strptime": ("parse", 2, 2), "try_strptime": ("parse", 2, 2),
    "to_timestamp": ("to_timestamp", 1, 1), "epoch": ("epoch", 1, 1), "epoch_ms": ("epoch", 1, 1),
    "concat": ("concat", 1, 99), "replace": ("replace", 3, 3),
    "split_part": ("split_part", 3, 3), "regexp_extract": ("extract", 2, 3),
}  # fmt: skip
#: the kinds whose arguments after the first are literals (Arrow takes them as options)
_LITERAL_ARGS = (
    "pattern",
    "substr",
    "round",
    "format",
    "parse",
    "replace",
    "split_part",
    "extract",
    "list_extract",
)
#: ... of them, those that are texts (``split_part``'s and ``regexp_extract``'s first only)
_TEXT_ARGS = ("pattern", "format", "parse", "replace")
_TRUNC_UNITS = (
    "year", "quarter", "month", "week", "day", "hour", "minute", "second", "millisecond",
    "microsecond",
)  # fmt: skip
_VALUE_FUNCTIONS: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "year": (pc.year, {}), "quarter": (pc.quarter, {}), "month": (pc.month, {}),
    "day": (pc.day, {}), "dayofweek": (pc.day_of_week, {"count_from_zero": True, "week_start": 7}),
    "dayofyear": (pc.day_of_year, {}), "hour": (pc.hour, {}), "minute": (pc.minute, {}),
    "second": (pc.second, {}), "lower": (pc.utf8_lower, {}), "upper": (pc.utf8_upper, {}),
    "trim": (pc.utf8_trim_whitespace, {}),
    "ltrim": (pc.utf8_ltrim_whitespace, {}), "rtrim": (pc.utf8_rtrim_whitespace, {}),
    "abs": (pc.abs_checked, {}), "floor": (pc.floor, {}), "ceil": (pc.ceil, {}),
}  # fmt: skip
_PATTERN_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "starts_with": pc.starts_with, "ends_with": pc.ends_with,
    "contains": pc.match_substring, "regexp_matches": pc.match_substring_regex,
}  # fmt: skip


class _ListFunction:
    """A list function Arrow has no kernel for (``list_contains``, ``list[i]``): called with
    expressions, a call of a scalar function registered with Arrow for these argument types
    (so a Parquet scan may filter by it); called with values, computed at once. Both run
    :meth:`compute`."""

    def __init__(self, kind: str, list_type: Any, value_type: Any, index: int = 0) -> None:
        self.kind, self.index = kind, index
        self.name = f"extagg_list_{kind}_{index}_{list_type}_{value_type}"
        if list_type is None:  # types unknown (parsed without the input): not callable yet
            return
        with _REGISTERING:
            if self.name in _REGISTERED:
                return
            in_types = {"list": list_type}
            if kind == "contains":
                in_types["value"] = value_type
                out = pa.bool_()
            else:
                out = list_type.value_type
            pc.register_scalar_function(
                lambda ctx, *args: self.compute(*args), self.name,
                {"summary": f"list {kind}", "description": f"extagg's list {kind}"},
                in_types, out,
            )  # fmt: skip
            _REGISTERED.add(self.name)

    def __call__(self, *args: Any) -> Any:
        if any(isinstance(a, pc.Expression) for a in args):
            return pc.Expression._call(self.name, list(args))
        return self.compute(*args)

    def compute(self, lists: Any, value: Any = None) -> Any:
        if isinstance(lists, pa.ChunkedArray):
            lists = lists.combine_chunks()
        if isinstance(lists, pa.Scalar):  # a whole list of nulls (the parser's typing row)
            lists = pa.array([lists.as_py()], type=lists.type)
        if self.kind == "contains":
            return _list_contains(lists, value)
        return _list_element(lists, self.index)


_REGISTERED: set[str] = set()
_REGISTERING = threading.Lock()


def _list_function(kind: str, list_type: Any, value_type: Any, index: int = 0) -> _ListFunction:
    """The :class:`_ListFunction` of ``kind`` for these types (one per process and types)."""
    key = (kind, str(list_type), str(value_type), index)
    fn = _LIST_FUNCTIONS.get(key)
    if fn is None:
        fn = _LIST_FUNCTIONS[key] = _ListFunction(kind, list_type, value_type, index)
    return fn


_LIST_FUNCTIONS: dict[tuple[str, str, str, int], _ListFunction] = {}


def _list_contains(lists: pa.Array, value: Any) -> pa.Array:
    """Per list: whether an element equals ``value`` (a scalar, or an array of one per list).
    As DuckDB: null where the list is null, or the value is and the list not empty."""
    n = len(lists)
    if isinstance(value, pa.ChunkedArray):
        value = value.combine_chunks()
    if isinstance(value, pa.Scalar) and not value.is_valid:
        value = pa.nulls(n, value.type)
    flat = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists).to_numpy()
    each = value if isinstance(value, pa.Scalar) else value.take(pa.array(parents, pa.int64()))
    hits = pc.fill_null(pc.equal(flat, each), False).to_numpy(zero_copy_only=False)
    out = np.zeros(n, dtype=np.bool_)
    out[parents[hits]] = True
    null = lists.is_null()
    if not isinstance(value, pa.Scalar) and value.null_count:
        filled = pc.greater(pc.list_value_length(lists), 0)
        null = pc.or_(null, pc.and_(pc.is_null(value), pc.fill_null(filled, False)))
    if null.null_count == 0 and not pc.any(null).as_py():
        return pa.array(out, type=pa.bool_())
    return pa.array(out, type=pa.bool_(), mask=null.to_numpy(zero_copy_only=False))


def _list_element(lists: pa.Array, index: int) -> pa.Array:
    """Per list: its ``index``-th element from 1 (from the end if negative), null past it."""
    n = len(lists)
    if index == 0 or n == 0:
        return pa.nulls(n, lists.type.value_type)
    offsets = lists.offsets.to_numpy()
    lengths = offsets[1:] - offsets[:-1]
    pos = offsets[:-1] + (index - 1) if index > 0 else offsets[1:] + index
    ok = lengths >= abs(index)
    if lists.null_count:
        ok &= ~lists.is_null().to_numpy(zero_copy_only=False)
    picks = pa.array(np.where(ok, pos, 0), type=pa.int64(), mask=~ok)
    return lists.values.take(picks)


_SHARED = threading.local()


@contextlib.contextmanager
def shared_subexpressions() -> Any:
    """Within it, equal parts of the bound expressions evaluated on one batch (by their
    operation, operands and type) are computed once: TPC-H Q1's two sums share
    ``l_extendedprice * (1 - l_discount)``. Per thread; the batch must stay alive inside."""
    _SHARED.values = {}
    try:
        yield
    finally:
        _SHARED.values = None


def _is_decimal256(x: Any) -> bool:
    return isinstance(x, (pa.Array, pa.Scalar)) and pa.types.is_decimal256(x.type)


def _decimal256_first(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` (decimal ``+ - *``) through :func:`~extagg.io.decimal_arith.decimal_binary`
    when an operand is a 256-bit decimal: Arrow's 256-bit kernels take 3-8 times as long
    (the 128-bit ones are as fast as a compiled pass)."""

    def run(left: Any, right: Any, **kw: Any) -> Any:
        if not kw and (_is_decimal256(left) or _is_decimal256(right)):
            from extagg.io.decimal_arith import decimal_binary  # numba's, when first needed

            out = decimal_binary(func, left, right)
            if out is not None:
                return out
        return func(left, right, **kw)

    return run


def eager_cast(values: Any, typ: pa.DataType, safe: bool = True) -> Any:
    """``pc.cast(values, typ, safe=safe)``; between 128- and 256-bit decimals of one scale
    through :func:`~extagg.io.decimal_arith.decimal_cast` (Arrow's: ~16 ns a value)."""
    if (
        isinstance(values, pa.Array)
        and pa.types.is_decimal(values.type)
        and pa.types.is_decimal(typ)
        and 256 in (values.type.bit_width, typ.bit_width)
    ):
        from extagg.io.decimal_arith import decimal_cast  # numba's, when first needed

        out = decimal_cast(values, typ)
        if out is not None:
            return out
    return pc.cast(values, typ, safe=safe)


#: eager forms of functions, where they differ from Arrow's own
_EAGER: dict[Callable[..., Any], Callable[..., Any]] = {
    f: _decimal256_first(f)
    for f in (pc.add_checked, pc.subtract_checked, pc.multiply_checked, pc.add, pc.subtract,
              pc.multiply)
}  # fmt: skip
#: SQL's type names (DuckDB's, Spark's) for ``cast(x as type)`` and ``x::type``; Arrow's names
#: (``int8`` is 8 bits there, as in ``--column-types``) are read by ``parse_type``
_SQL_TYPES: dict[str, pa.DataType] = {
    "tinyint": pa.int8(), "smallint": pa.int16(), "int2": pa.int16(), "integer": pa.int32(),
    "int": pa.int32(), "int4": pa.int32(), "bigint": pa.int64(), "long": pa.int64(),
    "utinyint": pa.uint8(), "usmallint": pa.uint16(), "uinteger": pa.uint32(),
    "ubigint": pa.uint64(), "real": pa.float32(), "float4": pa.float32(),
    "float": pa.float32(), "double": pa.float64(), "float8": pa.float64(),
    "varchar": pa.string(), "char": pa.string(), "character": pa.string(), "text": pa.string(),
    "string": pa.string(), "boolean": pa.bool_(), "bool": pa.bool_(), "date": pa.date32(),
    "timestamp": pa.timestamp("us"), "datetime": pa.timestamp("us"), "blob": pa.binary(),
}  # fmt: skip
#: the decimal operations computed on DecimalInts (:func:`~extagg.io.decimal_arith.decimal_ints`)
_DECIMAL_ARITHMETIC = frozenset(_EAGER)


def _arrow_value(value: Any) -> Any:
    """An eager value as Arrow's: :class:`~extagg.io.decimal_arith.DecimalInts` as an array
    of its type; anything else as it is."""
    to_arrow = getattr(value, "to_arrow", None)
    return value if to_arrow is None else to_arrow()


#: ``utf8_slice_codeunits``' stop for "to the end"
_NO_STOP = 2**62
_LOGICAL = (pc.invert, pc.and_kleene, pc.or_kleene)
#: the comparisons (NaN is equal to itself and above every number in them)
_ORDER = (pc.equal, pc.not_equal, pc.less, pc.less_equal, pc.greater, pc.greater_equal)
#: ``*``, ``/`` and ``%``: ``/`` and ``%`` by zero are made null first (Spark's answer)
_PRODUCTS = {"*": pc.multiply_checked, "/": pc.divide, "%": pc.remainder}
#: decimal digits of the integers of a bit width
_INT_DIGITS = {8: 3, 16: 5, 32: 10, 64: 19}


#: the integer operations that fail on overflow, and their Python forms
_CHECKED: dict[Callable[..., Any], Callable[[int, int], int]] = {
    pc.add_checked: lambda a, b: a + b,
    pc.subtract_checked: lambda a, b: a - b,
    pc.multiply_checked: lambda a, b: a * b,
}


def _first_overflow(
    left: Any, right: Any, op: Callable[[int, int], int], typ: pa.DataType
) -> tuple[Any, Any]:
    """The operands of the first row whose ``op`` leaves the integer type ``typ`` (for the
    message; ``("?", "?")`` if none is found)."""
    low, high = _int_range(typ)
    rows = max([len(x) for x in (left, right) if not isinstance(x, pa.Scalar)], default=1)
    a_vals = [left.as_py()] * rows if isinstance(left, pa.Scalar) else left.to_pylist()
    b_vals = [right.as_py()] * rows if isinstance(right, pa.Scalar) else right.to_pylist()
    for a, b in zip(a_vals, b_vals, strict=True):
        if a is not None and b is not None and not low <= op(a, b) <= high:
            return a, b
    return "?", "?"


def _decimal256(typ: pa.DataType) -> pa.DataType:
    """The 256-bit decimal type of ``typ``'s precision and scale."""
    return pa.decimal256(typ.precision, typ.scale)


def _least_int(low: int, high: int, test: Callable[[int], bool]) -> int:
    """The least integer of ``low..high`` that passes ``test`` (false below it, true from
    it on), or ``high + 1`` if none does."""
    hi = high + 1
    while low < hi:
        mid = (low + hi) // 2
        if test(mid):
            hi = mid
        else:
            low = mid + 1
    return low


def _int_range(typ: pa.DataType) -> tuple[int, int]:
    """The smallest and largest value of the integer type ``typ``."""
    if pa.types.is_signed_integer(typ):
        return -(2 ** (typ.bit_width - 1)), 2 ** (typ.bit_width - 1) - 1
    return 0, 2**typ.bit_width - 1


def _as_bool(fn: Callable[[pa.RecordBatch], Any]) -> Callable[[pa.RecordBatch], Any]:
    return lambda batch: pc.cast(fn(batch), pa.bool_())


#: beyond any unscaled value of a decimal of at most 18 digits
_DECIMAL64_BOUND = 10**18


def _unscaled_test(
    column: Callable[[pa.RecordBatch], Any], typ: pa.DataType, func: Callable[..., Any],
    literal: Decimal,
) -> Callable[[pa.RecordBatch], Any]:  # fmt: skip
    """``func(column, literal)`` for a ``decimal128`` column ``typ`` of at most 18 digits, as
    a comparison of its unscaled values with an integer: ``x < 0.065`` at scale 2 is ``u < 7``
    (the literal times ``10**scale``, rounded up for ``<``/``>=``, down for ``<=``/``>``;
    ``=`` a value between two steps is false, ``!=`` true). Null values stay null."""
    import decimal

    with decimal.localcontext() as ctx:
        ctx.prec = 100
        scaled = literal.scaleb(typ.scale)
        down = int(scaled.to_integral_value(rounding=decimal.ROUND_FLOOR))
        up = int(scaled.to_integral_value(rounding=decimal.ROUND_CEILING))
    constant: bool | None = None
    op: Any
    if func is pc.less:
        op, bound = np.less, up
    elif func is pc.less_equal:
        op, bound = np.less_equal, down
    elif func is pc.greater:
        op, bound = np.greater, down
    elif func is pc.greater_equal:
        op, bound = np.greater_equal, up
    else:
        op, bound = (np.equal if func is pc.equal else np.not_equal), down
        if down != up:  # between two steps of the column's scale
            constant = func is pc.not_equal
    bound = max(-_DECIMAL64_BOUND, min(_DECIMAL64_BOUND, bound))

    def test(batch: pa.RecordBatch) -> Any:
        values = column(batch)
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if values.type != typ:  # not the type bound (never seen): Arrow's kernel
            return func(values, pa.scalar(literal))
        n = len(values)
        words = values.buffers()[1]
        if constant is not None:
            out = np.full(n, constant)
        elif words is None:  # no values buffer (every value null)
            out = np.zeros(n, dtype=np.bool_)
        else:
            start = 2 * values.offset  # a decimal128 is two int64 words, the low one first
            low = np.frombuffer(words, dtype=np.int64)[start : start + 2 * n : 2]
            out = op(low, bound)
        if values.null_count == 0:
            return pa.array(out, type=pa.bool_())
        return pa.array(out, type=pa.bool_(), mask=values.is_null().to_numpy(zero_copy_only=False))

    return test


@dataclass(frozen=True)
class _Constant:
    """The eager form of a literal: ``value`` whatever the batch."""

    value: pa.Scalar

    def __call__(self, batch: pa.RecordBatch) -> pa.Scalar:
        return self.value


def _named_groups(pattern: str) -> tuple[str, list[str]]:
    """``pattern`` with every capturing group named (Arrow's ``extract_regex`` takes named
    groups only) and the whole match a group of its own; the groups' names by number (0: the
    whole match). A group the pattern names keeps its name."""
    out, names = ["(?P<_extagg_0>"], ["_extagg_0"]
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            start = i + 1 + (pattern[i + 1 : i + 2] == "^")
            if pattern[start : start + 1] == "]":  # a ] first in a class is itself
                out.append(pattern[i : start + 1])
                i = start + 1
                continue
        elif c == "(":
            named = re.match(r"\(\?P?<(\w+)>", pattern[i:])
            if named:
                names.append(named.group(1))
                out.append(f"(?P<{named.group(1)}>")
                i += named.end()
                continue
            if pattern[i + 1 : i + 2] != "?":  # a plain group: numbered, so named
                names.append(f"_extagg_{len(names)}")
                out.append(f"(?P<{names[-1]}>")
                i += 1
                continue
        out.append(c)
        i += 1
    out.append(")")
    return "".join(out), names


def _unsafe_cast(fn: Callable[[Any], Any], typ: pa.DataType) -> Callable[[Any], Any]:
    """``fn``'s values cast to ``typ`` losing precision (nanoseconds to microseconds)."""
    return lambda batch: eager_cast(fn(batch), typ, safe=False)


def _not_in_format(value: str, format: str, text: str, position: int) -> ExpressionValueError:
    return ExpressionValueError(
        f"strptime: {value!r} is not a time in the format {format!r} (try_strptime gives "
        "null for such values)",
        text, position,
    )  # fmt: skip


def _constant(value: pa.Scalar) -> Callable[[pa.RecordBatch], pa.Scalar]:
    """The eager form of a literal: ``value`` whatever the batch."""
    return _Constant(value)


def _folded(
    eager: Callable[..., Any], fns: Sequence[Callable[[Any], Any]], kw: Mapping[str, Any]
) -> _Constant | None:
    """The value of an operation whose operands are all literals, computed once (it was
    computed again for every batch: a fifth of a TPC-H Q1 filter's time at small batches),
    or ``None`` (an operand that is not a literal; an error, which each batch then raises
    as before)."""
    if not fns or not all(isinstance(f, _Constant) for f in fns):
        return None
    try:
        value = eager(*(f.value for f in fns), **kw)  # type: ignore[attr-defined]
    except Exception:  # the same error is raised by the batches' evaluation
        return None
    return _Constant(value) if isinstance(value, pa.Scalar) else None


#: a comparison with its operands swapped (``5 < f`` is ``f > 5``)
_MIRROR = {pc.equal: pc.equal, pc.not_equal: pc.not_equal, pc.less: pc.greater,
           pc.greater: pc.less, pc.less_equal: pc.greater_equal,
           pc.greater_equal: pc.less_equal}  # fmt: skip


def _number(text: str) -> object:
    if re.fullmatch(r"\d+", text):
        value = int(text)
        if value < 2**63:
            return value
        return Decimal(text) if len(text) <= 38 else float(text)  # past int64, as DuckDB
    if "e" in text.lower():
        return float(text)
    return Decimal(text)  # exact: compares exactly against decimal columns


def _is_number(typ: pa.DataType) -> bool:
    return pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ)


def _fitting_decimals(values: list[Any], typ: pa.Decimal128Type) -> list[Decimal | None]:
    """``values`` (numbers, nulls) as decimals of ``typ``, leaving out those it cannot hold
    exactly (more digits or decimals, NaN, infinities): no value of ``typ`` equals them."""
    out: list[Decimal | None] = []
    step = Decimal(1).scaleb(-typ.scale)
    limit = Decimal(10) ** (typ.precision - typ.scale)
    for value in values:
        if value is None:
            out.append(None)
            continue
        exact = Decimal(value) if isinstance(value, int) else Decimal(str(value))
        if exact.is_finite() and abs(exact) < limit and exact.quantize(step) == exact:
            out.append(exact.quantize(step))
    return out


def _value_set(values: Iterable[object]) -> pa.Array:
    vals = [v.as_py() if isinstance(v, pa.Scalar) else v for v in values]
    whole = [Decimal(v) for v in vals if type(v) is int or isinstance(v, Decimal)]
    if (
        any(isinstance(v, Decimal) for v in vals)
        and len(whole) == sum(v is not None for v in vals)
        and all(v == v.to_integral_value() and abs(v) < 10**38 for v in whole)
    ):  # whole numbers past int64 (``u in (18446744073709551615)``): exact, as decimals
        exact = [None if v is None else Decimal(v) for v in vals]  # type: ignore[arg-type]
        return pa.array(exact, pa.decimal128(38, 0))
    if any(isinstance(v, Decimal) for v in vals) and all(
        isinstance(v, (int, Decimal)) for v in vals if v is not None
    ):
        vals = [None if v is None else float(v) for v in vals]  # type: ignore[arg-type]
    try:
        return pa.array(vals)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"the values of 'in (...)' do not share one type: {exc}") from None


def like_regex(pattern: str) -> str:
    """A ``like`` pattern as an anchored RE2 regex: ``%`` any characters (newlines
    included), ``_`` one; a backslash before ``%``, ``_`` or a backslash makes that character
    literal (``'100\\%'``, as Spark's default escape), and before any other character is a
    backslash itself (``'C:\\temp%'`` finds Windows paths, as in DuckDB). Arrow's
    ``match_like`` took ``\\t`` for ``t``, and with ``ignore_case`` for a tab."""
    out = ["(?s)^"]
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern) and pattern[i + 1] in "%_\\":
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    out.append("$")
    return "".join(out)


def parse_expression(
    text: str, fields: Mapping[str, StructField] | None = None
) -> ParsedExpression:
    """Parse ``text`` (see the module docstring) into a ``pyarrow.compute`` expression.

    ``fields``: the unquoted dotted names that are fields of struct columns (a JSON object's
    ``payload.user``), each its column and path; the expression then reads the struct column.
    Other dotted names are columns of that name (a CSV header ``user.id``)."""
    parser = _Parser(text, fields=fields)
    expr = parser.parse()
    parsed = ParsedExpression(
        expr, list(parser.columns), text, dict(parser.columns), parser.fn(expr)
    )
    parsed.fields = dict(fields or {})
    parsed.paths, parsed.whole = parser.paths, parser.whole
    return parsed


def struct_field(name: str, struct_types: Mapping[str, pa.DataType]) -> StructField | None:
    """``name`` read as a field of one of the struct columns ``struct_types``
    (``payload.user.id``: column ``payload``, path ``("user", "id")``; the longest column
    name that is a prefix wins, as a column may have a dot in its name), or ``None`` when no
    struct column starts it. A path that leaves the struct's fields is a
    :class:`~extagg.errors.QueryError` naming the fields there are."""
    parts = dotted_parts(name)  # ``payload."user-agent"``: a quoted field
    for cut in range(len(parts) - 1, 0, -1):
        root = ".".join(parts[:cut])
        if root not in struct_types:
            continue
        typ, path = struct_types[root], parts[cut:]
        for depth, step in enumerate(path):
            at = ".".join([root, *path[:depth]])
            if not pa.types.is_struct(typ):
                raise QueryError(f"{name!r}: {at!r} is a {typ}, not a struct with fields")
            index = typ.get_field_index(step)
            if index < 0:
                names = [typ.field(i).name for i in range(typ.num_fields)]
                close = difflib.get_close_matches(step, names, n=1, cutoff=0.5)
                error = QueryError(
                    f"unknown field {step!r} in struct {'field' if depth else 'column'} {at!r}"
                    f"{f'; did you mean {close[0]!r}?' if close else ''} (its fields: "
                    f"{', '.join(names)})"
                )
                error.column = name  # type: ignore[attr-defined]
                raise error
            typ = typ.field(index).type
        return root, tuple(path)
    return None

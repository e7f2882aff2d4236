"""``--where`` / ``--having`` expressions: a small SQL-like grammar parsed into a
``pyarrow.compute.Expression``, so that a Parquet scan can skip row groups by their statistics.

Grammar (keywords are case-insensitive)::

    expr      := or
    or        := and ("or" and)*
    and       := not ("and" not)*
    not       := "not" not | predicate
    predicate := sum [cmp sum | ["not"] "in" "(" literal ("," literal)* ")"
                      | "is" ["not"] "null" | ["not"] "between" sum "and" sum]
    sum       := product (("+" | "-") product)*
    product   := unary (("*" | "/") unary)*
    unary     := "-" unary | atom
    atom      := number | 'string' | date 'YYYY-MM-DD' | timestamp 'YYYY-MM-DD HH:MM:SS'
               | true | false | null | column | "quoted column" | `quoted column` | "(" expr ")"

``cmp`` is one of ``= == != <> < <= > >=``. A syntax error raises
:class:`~extagg.errors.ExpressionError`, whose message shows the expression with a caret.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from extagg.errors import ExpressionError

__all__ = ["ParsedExpression", "parse_expression"]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
      | (?P<string>'(?:[^']|'')*')
      | (?P<quoted>"(?:[^"]|"")*"|`[^`]*`)
      | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
      | (?P<op><=|>=|<>|!=|==|[=<>(),+\-*/])
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "in", "is", "null", "between", "true", "false", "date"}
_KEYWORDS |= {"timestamp"}
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
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0
        self.columns: dict[str, int] = {}
        #: each expression built (by ``id``; held in ``_made``) → its eager evaluation
        self._fns: dict[int, Callable[[pa.RecordBatch], Any]] = {}
        self._made: list[pc.Expression] = []

    def made(self, expr: pc.Expression, fn: Callable[[pa.RecordBatch], Any]) -> pc.Expression:
        """Remember ``fn`` as the eager form of ``expr``."""
        self._made.append(expr)
        self._fns[id(expr)] = fn
        return expr

    def fn(self, expr: pc.Expression) -> Callable[[pa.RecordBatch], Any]:
        """The eager form of an expression this parser built."""
        return self._fns[id(expr)]

    def call(self, func: Callable[..., Any], *args: pc.Expression, **kw: Any) -> pc.Expression:
        """``func(*args)`` as an expression, with its eager form."""
        fns = [self.fn(a) for a in args]
        return self.made(func(*args, **kw), lambda b: func(*(f(b) for f in fns), **kw))

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
        while self.take_word("or"):
            left = self.call(pc.or_kleene, left, self.and_())
        return left

    def and_(self) -> pc.Expression:
        left = self.not_()
        while self.take_word("and"):
            left = self.call(pc.and_kleene, left, self.not_())
        return left

    def not_(self) -> pc.Expression:
        if self.take_word("not"):
            return self.call(pc.invert, self.not_())
        return self.predicate()

    def predicate(self) -> pc.Expression:
        left = self.sum_()
        op = self.take_op(*_CMP)
        if op is not None:
            return self.call(_CMP[op], left, self.sum_())
        if self.take_word("is"):
            negate = self.take_word("not")
            if not self.take_word("null"):
                raise self.error("expected 'null' after 'is'")
            test = self.call(pc.is_null, left)
            return self.call(pc.invert, test) if negate else test
        start = self.i
        negate = self.take_word("not")
        if self.take_word("in"):
            self.expect_op("(")
            values = [self.literal_value()]
            while self.take_op(","):
                values.append(self.literal_value())
            self.expect_op(")")
            test = self.call(pc.is_in, left, value_set=_value_set(values))
            # SQL: null [not] in (...) is null, so the row is dropped either way
            if negate:
                return self.call(pc.and_kleene, self.call(pc.invert, test),
                                 self.call(pc.is_valid, left))  # fmt: skip
            return test
        if self.take_word("between"):
            low = self.sum_()
            if not self.take_word("and"):
                raise self.error("expected 'and' in 'between ... and ...'")
            high = self.sum_()
            test = self.call(
                pc.and_kleene,
                self.call(pc.greater_equal, left, low), self.call(pc.less_equal, left, high),
            )  # fmt: skip
            return self.call(pc.invert, test) if negate else test
        if negate:
            self.i = start
            raise self.error("expected 'in' or 'between' after 'not'", self.toks[start + 1])
        return left

    def sum_(self) -> pc.Expression:
        left = self.product()
        while (op := self.take_op("+", "-")) is not None:
            right = self.product()
            func = pc.add_checked if op == "+" else pc.subtract_checked
            left = self.call(func, left, right)
        return left

    def product(self) -> pc.Expression:
        left = self.unary()
        while (op := self.take_op("*", "/")) is not None:
            right = self.unary()
            left = self.call(pc.multiply_checked if op == "*" else pc.divide, left, right)
        return left

    def unary(self) -> pc.Expression:
        if self.take_op("-"):
            return self.call(pc.negate_checked, self.unary())
        return self.atom()

    def atom(self) -> pc.Expression:
        tok = self.tok
        if self.take_op("("):
            inner = self.or_()
            self.expect_op(")")
            return inner
        if tok.kind == "quoted":
            self.i += 1
            name = tok.text[1:-1].replace('""', '"') if tok.text[0] == '"' else tok.text[1:-1]
            return self.column(name, tok.pos)
        if tok.kind == "name" and tok.word not in _KEYWORDS:
            self.i += 1
            return self.column(tok.text, tok.pos)
        value = self.literal_value()
        literal = value if isinstance(value, pa.Scalar) else pa.scalar(value)
        return self.made(pc.scalar(value), lambda b: literal)

    def column(self, name: str, pos: int) -> pc.Expression:
        self.columns.setdefault(name, pos)
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
        if word in ("date", "timestamp"):
            self.i += 1
            lit = self.tok
            if lit.kind != "string":
                raise self.error(f"expected a quoted {word} after {word!r}")
            self.i += 1
            text = lit.text[1:-1]
            try:
                if word == "date":
                    return pa.scalar(dt.date.fromisoformat(text), pa.date32())
                return pa.scalar(dt.datetime.fromisoformat(text), pa.timestamp("us"))
            except ValueError:
                raise ExpressionError(
                    f"invalid {word} literal {lit.text}", self.text, lit.pos
                ) from None
        raise self.error("expected a value (number, 'string', date '...', column)")


def _number(text: str) -> object:
    if re.fullmatch(r"\d+", text):
        return int(text)
    if "e" in text.lower():
        return float(text)
    return Decimal(text)  # exact: compares exactly against decimal columns


def _value_set(values: Iterable[object]) -> pa.Array:
    vals = [v.as_py() if isinstance(v, pa.Scalar) else v for v in values]
    if any(isinstance(v, Decimal) for v in vals) and all(
        isinstance(v, (int, Decimal)) for v in vals if v is not None
    ):
        vals = [None if v is None else float(v) for v in vals]  # type: ignore[arg-type]
    try:
        return pa.array(vals)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"the values of 'in (...)' do not share one type: {exc}") from None


def parse_expression(text: str) -> ParsedExpression:
    """Parse ``text`` (see the module docstring) into a ``pyarrow.compute`` expression."""
    parser = _Parser(text)
    expr = parser.parse()
    return ParsedExpression(expr, list(parser.columns), text, dict(parser.columns), parser.fn(expr))

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
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal

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
            left = left | self.and_()
        return left

    def and_(self) -> pc.Expression:
        left = self.not_()
        while self.take_word("and"):
            left = left & self.not_()
        return left

    def not_(self) -> pc.Expression:
        if self.take_word("not"):
            return ~self.not_()
        return self.predicate()

    def predicate(self) -> pc.Expression:
        left = self.sum_()
        op = self.take_op(*_CMP)
        if op is not None:
            return _CMP[op](left, self.sum_())
        if self.take_word("is"):
            negate = self.take_word("not")
            if not self.take_word("null"):
                raise self.error("expected 'null' after 'is'")
            test = left.is_null()
            return ~test if negate else test
        start = self.i
        negate = self.take_word("not")
        if self.take_word("in"):
            self.expect_op("(")
            values = [self.literal_value()]
            while self.take_op(","):
                values.append(self.literal_value())
            self.expect_op(")")
            test = left.isin(_value_set(values))
            # SQL: null [not] in (...) is null, so the row is dropped either way
            return (~test & left.is_valid()) if negate else test
        if self.take_word("between"):
            low = self.sum_()
            if not self.take_word("and"):
                raise self.error("expected 'and' in 'between ... and ...'")
            high = self.sum_()
            test = (left >= low) & (left <= high)
            return ~test if negate else test
        if negate:
            self.i = start
            raise self.error("expected 'in' or 'between' after 'not'", self.toks[start + 1])
        return left

    def sum_(self) -> pc.Expression:
        left = self.product()
        while (op := self.take_op("+", "-")) is not None:
            right = self.product()
            left = pc.add_checked(left, right) if op == "+" else pc.subtract_checked(left, right)
        return left

    def product(self) -> pc.Expression:
        left = self.unary()
        while (op := self.take_op("*", "/")) is not None:
            right = self.unary()
            left = pc.multiply_checked(left, right) if op == "*" else pc.divide(left, right)
        return left

    def unary(self) -> pc.Expression:
        if self.take_op("-"):
            return pc.negate_checked(self.unary())
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
        return pc.scalar(self.literal_value())

    def column(self, name: str, pos: int) -> pc.Expression:
        self.columns.setdefault(name, pos)
        return pc.field(name)

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
    return ParsedExpression(expr, list(parser.columns), text, dict(parser.columns))

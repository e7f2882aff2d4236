"""Column names as users write them in ``--by`` and ``--agg``: quoted (always a column), plain
(a column), or neither (an expression over columns). Light on purpose: the command line reads
``--by`` before pyarrow may be imported (it picks Arrow's memory pool first)."""

from __future__ import annotations

import re
from collections.abc import Iterator

__all__ = [
    "ColumnName",
    "ExpressionText",
    "PLAIN_NAME",
    "dotted_parts",
    "is_plain_name",
    "outside_quotes",
    "split_alias",
    "split_key_aliases",
    "split_top_level",
    "unquote",
]

#: a column name written as it is (as ``--where`` reads one): letters, digits, ``_``, ``.``;
#: after a dot, a quoted part (a struct's field ``payload."user-agent"``)
PLAIN_NAME = r'[^\W\d][\w.]*(?:(?<=\.)(?:"(?:[^"]|"")*"|`[^`]*`)[\w.]*)*'
_PLAIN_NAME = re.compile(PLAIN_NAME)
_QUOTED_NAME = re.compile(r'"(?:[^"]|"")*"|`[^`]*`')


class ColumnName(str):
    """A name quoted where it was given (``sum("unit-price")``, ``--by '"a, b"'``): a
    column, never an expression."""

    __slots__ = ()


class ExpressionText(str):
    """An aggregate's argument written unquoted and not a plain name (``sum(price * (1 -
    discount))``): an expression over the input's columns, computed for every batch — or, if
    the input has no column it names, a column of that very name (``sum(unit-price)``)."""

    __slots__ = ()


def is_plain_name(text: str) -> bool:
    """Whether ``text`` is ``*`` or a name ``--where`` would read as one column."""
    return text == "*" or _PLAIN_NAME.fullmatch(text) is not None


def dotted_parts(name: str) -> list[str]:
    """``name`` cut at its dots outside quotes, each part unquoted: ``payload."user-agent"``
    is ``["payload", "user-agent"]``."""
    parts, start = [], 0
    for i, c, _ in outside_quotes(name):
        if c == ".":
            parts.append(unquote(name[start:i]))
            start = i + 1
    parts.append(unquote(name[start:]))
    return parts


def unquote(col: str) -> str:
    """A name quoted whole (in double quotes, a quote in it doubled, or in backquotes)
    without its quotes; else ``col``."""
    if _QUOTED_NAME.fullmatch(col) is None:
        return col
    return col[1:-1].replace('""', '"') if col[0] == '"' else col[1:-1]


def outside_quotes(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """``(index, character, depth)`` of each character of ``text`` from ``start`` that is
    outside quotes (``''``, ``""``, backquotes), with the parenthesis depth after it (a ``(``
    at the depth it opens, a ``)`` at the one it closes to): the one scan that splitting at
    top-level commas, finding a call's closing parenthesis and checking balance share."""
    depth, quote = 0, ""
    for i in range(start, len(text)):
        c = text[i]
        if quote:
            if c == quote:
                quote = ""  # a doubled quote inside closes and opens again: the same
            continue
        if c in "'\"`":
            quote = c
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        yield i, c, depth


def split_top_level(text: str) -> list[str]:
    """``text`` cut at its commas outside parentheses and quotes (``''``, ``""``, backquotes),
    each part stripped, empty ones left out: ``'"a, b" desc, n'`` is ``['"a, b" desc', 'n']``."""
    parts: list[str] = []
    start = 0
    for i, c, depth in outside_quotes(text):
        if c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def split_alias(text: str) -> tuple[str, str | None]:
    """A key written ``EXPR AS NAME`` (SQL's alias; ``as`` in any case, outside parentheses
    and quotes; ``NAME`` plain or quoted) as ``(EXPR, NAME)``; any other text as ``(text,
    None)``. ``cast(x as int)`` has its ``as`` inside parentheses: no alias."""
    cut = -1
    for i, c, depth in outside_quotes(text):
        if (
            depth == 0
            and c in "aA"
            and text[i : i + 2].lower() == "as"
            and i > 0
            and text[i - 1].isspace()
            and i + 2 < len(text)
            and text[i + 2].isspace()
        ):
            cut = i
    if cut < 0:
        return text, None
    expr, name = text[:cut].strip(), text[cut + 2 :].strip()
    if not expr or not (is_plain_name(name) or _QUOTED_NAME.fullmatch(name)):
        return text, None
    return expr, unquote(name)


def split_key_aliases(keys: list[str]) -> tuple[list[str], list[str]]:
    """``keys`` as given (``"year(d) as y"``, ``'"Unit" AS u'``, ``"k"``) as the keys to group
    by and the result's names for them: ``(["year(d)", "Unit", "k"], ["y", "u", "k"])``, the
    quoted ``"Unit"`` a :class:`ColumnName`. A :class:`ColumnName` is taken whole."""
    grouped: list[str] = []
    names: list[str] = []
    for key in keys:
        expr, alias = (key, None) if isinstance(key, ColumnName) else split_alias(key)
        if alias is not None and _QUOTED_NAME.fullmatch(expr):
            expr = ColumnName(unquote(expr))
        grouped.append(expr)
        names.append(key if alias is None else alias)
    return grouped, names

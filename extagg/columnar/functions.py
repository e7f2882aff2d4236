"""Aggregate functions: names, input checks, state layouts, result types, and their kernels.

Each requested aggregate ``{"total": ("amount", "sum")}`` resolves, once the input types are
known, to an :class:`AggregateSpec`: a *family* of kernels, the per-group state arrays it needs
and the Arrow type of its result. ``update``/``merge``/``finalize`` below dispatch to the
compiled kernels of :mod:`extagg.columnar._kernels` (or any module with the same names, such
as the plain-Python :mod:`extagg.columnar._reference`) and hold no per-row loops.

Result types follow Spark SQL: ``count`` is ``int64``; ``sum`` of integers or bools is
``int64`` and raises :class:`SumOverflowError` when the exact sum does not fit; ``sum`` of
``uint64`` is ``decimal128(38, 0)`` (exact, as DuckDB's ``HUGEINT``); ``sum`` of
``decimal(p, s)`` is ``decimal(min(38, p + 10), s)`` and ``mean`` of it ``decimal(min(38, p +
4), min(38, s + 4))`` (exact, rounded half up); ``sum`` of floats, ``mean`` of numbers and
``var``/``std`` are ``float64``; ``min``, ``max``, ``first`` and ``last`` keep the input type.
A group with no non-null input gets a null (``var``/``std`` need two values,
``var_pop``/``std_pop`` one).

``var_state`` (accepted by :class:`~extagg.columnar.HashAggregator`, not a user's function) is
a variance's mergeable state as one value — the ``(count, mean, M2)`` of its numbers, or the
Chan merge of such values — so that a two-stage aggregation (PySpark's partial and final
stages) combines variances as exactly as one table does: sums of ``x²`` cancel catastrophically
when a group's mean is large against its spread.
"""

from __future__ import annotations

import difflib
import math
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType, ModuleType
from typing import Any

import numpy as np
import pyarrow as pa

from extagg._names import ColumnName, ExpressionText, is_plain_name, outside_quotes, unquote
from extagg.columnar import _kernels
from extagg.columnar.columns import Column, decimal_array, is_decimal64, to_column
from extagg.columnar.var_states import VarArena
from extagg.errors import QueryError, SumOverflowError

__all__ = [
    "FUNCTIONS",
    "ALIASES",
    "DISTINCT_FUNCTIONS",
    "QUANTILE_FUNCTIONS",
    "QUANTILE_ALIASES",
    "quantile_function",
    "AggregateRequest",
    "AggregateSpec",
    "StateField",
    "SumOverflowError",
    "VAR_FUNCTIONS",
    "VAR_STATE",
    "VAR_STATE_DTYPE",
    "is_var_spec",
    "divide_decimal",
    "finish_var_states",
    "pack_var_states",
    "unpack_var_states",
    "merge_var",
    "NO_AGGREGATES",
    "agg_mapping",
    "parse_agg_texts",
    "parse_aggs",
    "resolve",
    "update",
    "update_all",
    "fused_ops",
    "merge",
    "finalize",
]

FUNCTIONS = (
    "count", "sum", "mean", "min", "max", "first", "last", "first_non_null", "last_non_null",
    "var", "var_pop", "std", "std_pop",
)  # fmt: skip
"""The aggregate functions of the columnar engine, by canonical name."""
#: aggregates computed by a second group-by (:mod:`extagg.columnar.distinct`), not in one table
DISTINCT_FUNCTIONS = ("count_distinct",)
"""Functions that need a :class:`~extagg.columnar.distinct.DistinctAggregator` (a second,
external group-by over the distinct values)."""
#: quantiles, computed by an external sort of each group's values beside the group-by
#: (:mod:`extagg.columnar.quantiles`); each takes a fraction, ``quantile_cont(0.9)``
QUANTILE_FUNCTIONS = ("quantile_cont", "quantile_disc")
"""Quantile functions (DuckDB's): ``quantile_cont`` interpolates between the two values around
the fraction, ``quantile_disc`` is the first value at or past it."""
#: other names of the quantiles → (canonical name, the fraction when the name implies it):
#: DuckDB's ``median``, ``quantile``; Spark's ``percentile``, ``percentile_approx`` (exact here)
QUANTILE_ALIASES: Mapping[str, tuple[str, float | None]] = MappingProxyType({
    "median": ("quantile_cont", 0.5),
    "percentile": ("quantile_cont", None),
    "percentile_cont": ("quantile_cont", None),
    "quantile": ("quantile_disc", None),
    "percentile_disc": ("quantile_disc", None),
    "percentile_approx": ("quantile_disc", None),
    "approx_percentile": ("quantile_disc", None),
    "approx_quantile": ("quantile_disc", None),
})  # fmt: skip
#: the quantiles that may take an accuracy after the fraction (Spark's; ignored: exact here)
_ACCURACY_TAKEN = ("percentile_approx", "approx_percentile")
ALIASES = {
    "nunique": "count_distinct",
    "avg": "mean",
    "variance": "var",
    "var_samp": "var",
    "stddev": "std",
    "stddev_samp": "std",
    "std_samp": "std",
    "stddev_pop": "std_pop",
    "size": "count",  # of every row, as pandas' size: count(*) whatever the column
    "any_value": "first_non_null",  # DuckDB's: the first value that is not null
}
"""Other accepted spellings (SQL and pandas names) → canonical function name."""
#: a variance's mergeable state (see the module docstring), for two-stage aggregation
VAR_STATE = "var_state"
#: one ``var_state`` value: 24 bytes, little-endian
VAR_STATE_DTYPE = np.dtype([("n", "<i8"), ("mean", "<f8"), ("m2", "<f8")])
_NUMERIC = ("int", "uint", "float", "bool", "decimal")
_ORDERED = ("int", "uint", "float", "bool", "temporal", "decimal")
_ALL = (*_ORDERED, "string", "binary")
_ACCEPTS = {
    "count": _ALL,
    "sum": _NUMERIC,
    "mean": _NUMERIC,
    "var": _NUMERIC,
    "var_pop": _NUMERIC,
    "std": _NUMERIC,
    "std_pop": _NUMERIC,
    VAR_STATE: (*_NUMERIC, "binary"),
}
_I64 = np.dtype(np.int64)
_U64 = np.dtype(np.uint64)
_F64 = np.dtype(np.float64)
_BOOL = np.dtype(np.bool_)


#: Spark's largest decimal precision
MAX_PRECISION = 38


@dataclass(frozen=True)
class AggregateRequest:
    """One output column as asked for: ``output = func(column)`` (``column`` None for ``*``);
    ``fraction``: a quantile's."""

    output: str
    column: str | None
    func: str
    fraction: float | None = None


@dataclass(frozen=True)
class StateField:
    name: str
    dtype: np.dtype
    fill: Any


@dataclass(frozen=True)
class AggregateSpec:
    """A request resolved against the input type."""

    output: str
    func: str
    column: str | None
    family: str
    arrow_type: pa.DataType | None
    states: tuple[StateField, ...]
    output_type: pa.DataType


#: ``aggs`` of an aggregator by keys with no aggregate at all (``SELECT DISTINCT``: each key
#: once): the first level of ``count_distinct``, which has no state to fold, sort or spill.
#: An empty dict is refused as a mistake; this read-only one is the request.
NO_AGGREGATES: Mapping[str, Any] = MappingProxyType({})


#: ``[NAME=]FUNC(COLUMN)``; a column whose name has parentheses or quotes is written quoted,
#: ``sum("Price (EUR)")`` (a ``"`` inside doubled, as in SQL) or ``sum(`Price (EUR)`)``
_AGG_TEXT = re.compile(
    r"^\s*(?:(?P<name>[^=]+?)\s*=\s*)?(?P<func>[A-Za-z_]\w*)\s*\(\s*(?P<col>.*?)\s*\)\s*$"
)


def _balanced(text: str) -> bool:
    """Whether the parentheses of ``text`` outside its quotes close in order."""
    depth = 0
    for _, _, depth in outside_quotes(text):
        if depth < 0:
            return False
    return depth == 0


#: SQL's ``count(distinct x)``: the word before the argument
_DISTINCT = re.compile(r"distinct\s+", re.IGNORECASE)


def parse_agg_texts(texts: Sequence[str]) -> dict[str, tuple[str, str]]:
    """``['n=count(*)', 'sum(x)']`` → ``{"n": ("*", "count"), "sum_x": ("x", "sum")}`` (the
    ``--agg`` form; an unnamed aggregate is called ``func_column``; SQL's ``count(distinct
    x)`` is ``count_distinct(x)``)."""
    out: dict[str, tuple[str, str]] = {}
    for text in texts:
        m = _AGG_TEXT.match(text) if isinstance(text, str) else None
        if m is None:
            raise QueryError(
                f"cannot read aggregate {text!r}; write NAME=FUNC(COLUMN), e.g. 'n=count(*)' or "
                "'total=sum(amount)' (a column name with parentheses quoted: "
                "'p=sum(\"Price (EUR)\")')"
            )
        func, written = m.group("func"), m.group("col").strip()
        if not _balanced(written):  # sum(a) / sum(b): the argument closed before the end
            raise QueryError(
                f"cannot read aggregate {text!r}: an expression over aggregates is one of the "
                "aggregate texts with a name ('r=sum(a) / sum(b)'; in Python aggs=[...] of "
                "such texts)"
            )
        distinct = _DISTINCT.match(written)
        if distinct is not None:  # SQL's count(distinct x)
            if func.lower() != "count":
                raise QueryError(
                    f"{func}(distinct ...) in {text!r} is not an aggregate here; "
                    "count(distinct x) (count_distinct(x)) is"
                )
            func, written = "count_distinct", written[distinct.end() :].strip()
        if _quantile_name(func) is not None:  # quantile_cont(x, 0.9): the fraction apart
            written, func = _quantile_call(func, written)
        default_name = None
        if func.lower() in REWRITTEN:  # count_if, bool_and ...: another aggregate of an expression
            default_name = f"{func.lower()}_{written}"
            func, written = REWRITTEN[func.lower()](written)
        col: str = unquote(written)
        if col != written:
            col = ColumnName(col)
        elif not is_plain_name(col):
            col = ExpressionText(col)
        name = m.group("name") or default_name
        base = func.split("(")[0]  # a quantile's name without its fraction
        name = (name or (f"{base}" if col == "*" else f"{base}_{col}")).strip()
        if not col:
            raise QueryError(f"aggregate {text!r} names no column (use count(*) to count rows)")
        if name in out:
            raise QueryError(f"two aggregates are named {name!r}")
        out[name] = (col, func)
    return out


def _quantile_name(func: str) -> str | None:
    """The canonical quantile function ``func`` names (``median`` → ``quantile_cont``), or
    None."""
    name = func.strip().lower()
    if name in QUANTILE_FUNCTIONS:
        return name
    return QUANTILE_ALIASES[name][0] if name in QUANTILE_ALIASES else None


def _quantile_call(func: str, written: str) -> tuple[str, str]:
    """The arguments of a quantile's call ``written`` (``x, 0.9``) as (its column or
    expression, the function with its fraction: ``quantile_cont(0.9)``)."""
    commas = [i for i, c, depth in outside_quotes(written) if c == "," and depth == 0]
    if not commas:
        return written, func
    column = written[: commas[0]].strip()
    return column, f"{func}({written[commas[0] + 1 :].strip()})"


def quantile_function(output: str, func: str) -> tuple[str, float] | None:
    """A quantile's function text (``quantile_cont(0.9)``, ``median``, ``percentile_approx(0.5,
    100)``) as (canonical name, fraction); None for a function that is not a quantile. A
    missing or bad fraction is a :class:`~extagg.errors.QueryError` naming ``output``."""
    match = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*(?:\((.*)\))?\s*", func, re.DOTALL)
    name = _quantile_name(match.group(1)) if match else None
    if match is None or name is None:
        return None
    written = match.group(1).lower()
    implied = QUANTILE_ALIASES.get(written, (name, None))[1]
    args = [] if match.group(2) is None else [a.strip() for a in match.group(2).split(",")]
    usage = (
        f"{written}(x)" if implied is not None
        else f"{written}(x, fraction{', accuracy' if written in _ACCURACY_TAKEN else ''}), "
        f"e.g. {written}(x, 0.9)"
    )  # fmt: skip
    most = 0 if implied is not None else 2 if written in _ACCURACY_TAKEN else 1
    if len(args) > most or (implied is None and not args):
        takes = (
            "one argument, the column" if most == 0
            else "a column and a fraction from 0 to 1" if most == 1
            else "a column, a fraction from 0 to 1 and optionally an accuracy"
        )  # fmt: skip
        raise QueryError(f"aggregate {output!r}: {written}() takes {takes}; write {usage}")
    if implied is not None:
        return name, implied
    try:
        fraction = float(args[0])
    except ValueError:
        fraction = math.nan
    if not 0.0 <= fraction <= 1.0:
        raise QueryError(
            f"aggregate {output!r}: the fraction of {written}() is a number from 0 to 1, not "
            f"{args[0]!r} (0.5 is the median); write {usage}"
        )
    if len(args) == 2 and not args[1].isdigit():
        raise QueryError(
            f"aggregate {output!r}: the accuracy of {written}() is a whole number, not "
            f"{args[1]!r} (the quantile is exact here: it changes nothing)"
        )
    return name, fraction


def count_if(condition: str) -> tuple[str, str]:
    """``count_if(condition)`` as Spark defines it: ``count(case when condition then 1 end)``,
    the rows the condition holds for (0 where it never does, no rows included; DuckDB 2.0 gives
    null where every condition is null)."""
    return "count", ExpressionText(f"case when {condition} then 1 end")


def _bool_test(condition: str) -> str:
    """``condition`` as a test that must be a boolean, its nulls kept (a number is a usage
    error: "a condition of 'case' is a value of type int64, not a test"); the condition is
    computed once a batch (equal parts of an expression are shared)."""
    return f"case when {condition} then true when ({condition}) is null then null else false end"


def bool_and(condition: str) -> tuple[str, str]:
    """``bool_and(condition)`` (Spark's ``every``, DuckDB's and Postgres' ``bool_and``): true
    where it holds for every row whose condition is not null, null where every one is null —
    the ``min`` of the booleans."""
    return "min", ExpressionText(_bool_test(condition))


def bool_or(condition: str) -> tuple[str, str]:
    """``bool_or(condition)`` (Spark's ``some``): true where it holds for at least one row, null
    where every condition is null — the ``max`` of the booleans."""
    return "max", ExpressionText(_bool_test(condition))


#: aggregates that are another aggregate of an expression of their argument
REWRITTEN = {
    "count_if": count_if, "bool_and": bool_and, "every": bool_and, "bool_or": bool_or,
    "some": bool_or,
}  # fmt: skip


def agg_mapping(aggs: Any) -> Any:
    """``aggs`` as ``{output: (column, function)}``: a text ``'n=count(*)'`` or a list of them
    is parsed (:func:`parse_agg_texts`), as is a mapping's text value (``{"n": "count(*)"}``);
    a bare function name is pandas' ``{column: function}`` (``{"v": "sum"}``: ``v = sum(v)``).
    Any other mapping is returned as it is."""
    if isinstance(aggs, Mapping) and any(
        isinstance(spec, str) or _function_list(spec) for spec in aggs.values()
    ):
        out: dict[Any, Any] = {}
        for output, spec in aggs.items():
            if _function_list(spec):  # pandas' {column: [functions]}: sum_v, mean_v
                for func in spec:
                    name = f"{func}_{output}"
                    if name in out or name in aggs:
                        raise QueryError(f"two aggregates are named {name!r}")
                    out[name] = (output, func)
            elif not isinstance(spec, str):
                out[output] = _rewritten(spec)
            elif "(" in spec:
                match = _AGG_TEXT.match(spec)
                if match is None or match.group("name") is not None:
                    raise QueryError(
                        f"cannot read aggregate {output!r}: {spec!r}; write FUNC(COLUMN), e.g. "
                        '{"n": "count(*)", "total": "sum(amount)"}'
                    )
                ((_, pair),) = parse_agg_texts([spec]).items()
                out[output] = pair
            else:
                out[output] = (output, spec.strip())
        return out
    if isinstance(aggs, str):
        return parse_agg_texts([aggs])
    if isinstance(aggs, Sequence) and aggs and all(isinstance(a, str) for a in aggs):
        return parse_agg_texts(aggs)
    if isinstance(aggs, Mapping) and any(_rewritten(s) is not s for s in aggs.values()):
        return {output: _rewritten(spec) for output, spec in aggs.items()}
    return aggs


def _rewritten(spec: Any) -> Any:
    """A ``(condition, "count_if")`` (``"bool_and"`` ...) pair as :data:`REWRITTEN` gives it;
    any other as it is."""
    if (
        isinstance(spec, (tuple, list))
        and len(spec) == 2
        and isinstance(spec[1], str)
        and spec[1].lower() in REWRITTEN
        and isinstance(spec[0], str)
    ):
        func, condition = REWRITTEN[spec[1].lower()](spec[0])
        return (condition, func)
    return spec


def _function_list(spec: Any) -> bool:
    """Whether ``spec`` is pandas' list of functions for one column (``["sum", "mean"]``),
    not a ``[column, function]`` pair: a list whose every item is a function name."""
    known = (*FUNCTIONS, *DISTINCT_FUNCTIONS, *ALIASES, "size", "median")
    return (
        isinstance(spec, list)
        and bool(spec)
        and all(isinstance(f, str) and f.lower() in known for f in spec)
    )


def parse_aggs(
    aggs: Mapping[str, Any] | Sequence[str] | str, distinct: bool = False, states: bool = False
) -> list[AggregateRequest]:
    """Check ``{output: (column, function)}`` and canonicalise the function names
    (``distinct``: accept :data:`DISTINCT_FUNCTIONS` too; ``states``: :data:`VAR_STATE`);
    :data:`NO_AGGREGATES` is the one empty ``aggs`` accepted."""
    if aggs is NO_AGGREGATES:
        return []
    aggs = agg_mapping(aggs)
    if not isinstance(aggs, Mapping) or not aggs:
        raise TypeError(
            'aggs must be a non-empty dict like {"total": ("amount", "sum"), "n": ("*", "count")}'
            ' or a list like ["total=sum(amount)", "n=count(*)"]'
        )
    out = []
    for output, spec in aggs.items():
        if not isinstance(output, str):
            raise TypeError(f"aggregate output names must be strings, got {output!r}")
        if not (isinstance(spec, (tuple, list)) and len(spec) == 2):
            raise TypeError(f"aggregate {output!r} must be a (column, function) pair, got {spec!r}")
        column, func = spec
        if not isinstance(column, str) or not isinstance(func, str):
            raise TypeError(f"aggregate {output!r}: column and function must be strings: {spec!r}")
        quantile = quantile_function(output, func)
        if quantile is not None:
            if not distinct:
                raise ValueError(
                    f"aggregate {output!r}: {func} sorts each group's values beside the "
                    "group-by, which HashAggregator does not do alone; use extagg.aggregate() "
                    "or extagg.columnar.DistinctAggregator"
                )
            if column == "*":
                raise ValueError(f"aggregate {output!r}: only count accepts '*', not {func!r}")
            out.append(AggregateRequest(output, column, quantile[0], quantile[1]))
            continue
        name = ALIASES.get(func.lower(), func.lower())
        if func.lower() == "size":  # pandas' size counts every row, nulls too: count(*)
            column = "*"
        if name in DISTINCT_FUNCTIONS and not distinct:
            raise ValueError(
                f"aggregate {output!r}: {func} is a two-level group-by that HashAggregator does "
                "not do alone; use extagg.aggregate() or extagg.columnar.DistinctAggregator"
            )
        known = name in FUNCTIONS or name in DISTINCT_FUNCTIONS
        if not known and not (states and name == VAR_STATE):
            names = sorted(
                (*FUNCTIONS, *DISTINCT_FUNCTIONS, *ALIASES, *REWRITTEN, *QUANTILE_FUNCTIONS,
                 *QUANTILE_ALIASES)
            )  # fmt: skip
            close = difflib.get_close_matches(func.lower(), names, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"unknown aggregate function {func!r} for {output!r}{hint} (known: "
                f"{', '.join(names)})"
            )
        if column == "*" and name != "count":
            raise ValueError(f"aggregate {output!r}: only count accepts '*', not {func!r}")
        out.append(AggregateRequest(output, None if column == "*" else column, name))
    return out


def resolve(request: AggregateRequest, column: Column | None) -> AggregateSpec:
    """The spec of ``request`` given its input column (``None`` for ``count(*)``)."""
    func = request.func
    if column is None:
        return AggregateSpec(
            request.output, func, None, "count_star", None, (StateField("n", _I64, 0),), pa.int64()
        )
    kind, arrow_type = column.kind, column.arrow_type
    if kind in ("string", "binary") and func in VAR_FUNCTIONS:
        return AggregateSpec(
            request.output, func, request.column, f"{func}_var", arrow_type,
            _var_states(func), arrow_type,
        )  # fmt: skip
    if func in ("sum", "mean") and pa.types.is_duration(arrow_type):
        # a duration adds up as its count of the unit, exactly (128-bit sums): the sum and the
        # mean are durations of the same unit, as Spark's day-time intervals, DuckDB's
        # intervals and Polars' durations are
        family, states, _ = _layout(func, "int", arrow_type, _I64)
        family = "sum_int" if func == "sum" else "mean_duration"
        return AggregateSpec(
            request.output, func, request.column, family, arrow_type, states, arrow_type
        )
    accepted = _ACCEPTS.get(func, _ORDERED)
    if kind not in accepted:
        need = {
            _NUMERIC: "a numeric or bool column",
            _ORDERED: "a numeric, bool, decimal or temporal column",
        }.get(accepted, "a column")
        raise TypeError(
            f"aggregate {request.output!r}: {func}({request.column!r}) is not supported for "
            f"column {request.column!r} of type {arrow_type}; {func} needs {need}"
        )
    value_dtype = None if column.values is None else column.values.dtype
    if kind == "decimal":
        family, states, out_type = _decimal_layout(func, arrow_type)
        if family:
            return AggregateSpec(
                request.output, func, request.column, family, arrow_type, states, out_type
            )
    family, states, out_type = _layout(func, kind, arrow_type, value_dtype)
    return AggregateSpec(request.output, func, request.column, family, arrow_type, states, out_type)


#: functions that take string and binary columns, their states in a byte arena
VAR_FUNCTIONS = ("min", "max", "first", "last", "first_non_null", "last_non_null")


def _var_states(func: str) -> tuple[StateField, ...]:
    """``ref``/``len`` of the value in the table's arena (``len`` -1: none), then ``has`` (min,
    max) or ``seq``/``null`` (first, last). In a block the first two are one var column."""
    value = (StateField("ref", _I64, 0), StateField("len", _I64, -1))
    if func in ("min", "max"):
        return (*value, StateField("has", _BOOL, False))
    return (*value, StateField("seq", _I64, -1), StateField("null", _BOOL, False))


def is_var_spec(spec: AggregateSpec) -> bool:
    """Whether ``spec`` keeps variable-length states (see :func:`_var_states`)."""
    return spec.family.endswith("_var")


def _decimal_layout(
    func: str, arrow_type: pa.DataType
) -> tuple[str, tuple[StateField, ...], pa.DataType]:
    """Exact sums and means of decimals (Spark's result types); other functions: ``""``."""
    p, s = arrow_type.precision, arrow_type.scale
    narrow = is_decimal64(arrow_type)
    has = StateField("has", _BOOL, False)
    if narrow:  # unscaled int64 values, 128-bit sums
        words: tuple[StateField, ...] = (StateField("lo", _U64, 0), StateField("hi", _I64, 0))
    else:  # 128-bit values, 192-bit sums
        words = (StateField("lo", _U64, 0), StateField("mid", _U64, 0), StateField("hi", _I64, 0))
    suffix = "" if narrow else "128"
    if func == "sum":
        out = pa.decimal128(min(MAX_PRECISION, p + 10), s)
        return f"sum_dec{suffix}", (*words, has), out
    if func == "mean":
        out = pa.decimal128(min(MAX_PRECISION, p + 4), min(MAX_PRECISION, s + 4))
        return f"mean_dec{suffix}", (*words, has, StateField("n", _I64, 0)), out
    if not narrow and func in ("min", "max"):
        value = (StateField("lo", _I64, 0), StateField("hi", _I64, 0))
        return f"{func}_dec128", (*value, has), arrow_type
    if not narrow and func.startswith(("first", "last")):
        value = (StateField("lo", _I64, 0), StateField("hi", _I64, 0))
        seq = (StateField("seq", _I64, -1), StateField("null", _BOOL, False))
        return f"{func}_dec128", (*value, *seq), arrow_type
    return "", (), arrow_type


def _layout(
    func: str, kind: str, arrow_type: pa.DataType, value_dtype: np.dtype | None
) -> tuple[str, tuple[StateField, ...], pa.DataType]:
    big_unsigned = kind == "uint" and value_dtype == _U64
    sum128 = (StateField("lo", _U64, 0), StateField("hi", _I64, 0), StateField("has", _BOOL, False))
    fsum = (
        StateField("s", _F64, 0.0),
        StateField("c", _F64, 0.0),
        StateField("has", _BOOL, False),
    )
    count = StateField("n", _I64, 0)
    if func == "count":
        return "count", (count,), pa.int64()
    if func == "sum":
        if kind == "float":
            return "sum_float", fsum, pa.float64()
        if big_unsigned:
            return "sum_uint", sum128, pa.decimal128(MAX_PRECISION, 0)
        return "sum_int", sum128, pa.int64()
    if func == "mean":
        if kind == "float":
            return "mean_float", (*fsum, count), pa.float64()
        return ("mean_uint" if big_unsigned else "mean_int"), (*sum128, count), pa.float64()
    if func in ("var", "var_pop", "std", "std_pop", VAR_STATE):
        welford = (count, StateField("mean", _F64, 0.0), StateField("m2", _F64, 0.0))
        if func == VAR_STATE:
            return VAR_STATE, welford, pa.binary()
        return "var", welford, pa.float64()
    assert value_dtype is not None
    if func in ("min", "max"):
        return func, (StateField("v", value_dtype, 0), StateField("has", _BOOL, False)), arrow_type
    seq = (
        StateField("v", value_dtype, 0),
        StateField("seq", _I64, -1),
        StateField("null", _BOOL, False),
    )
    return func, seq, arrow_type


_EMPTY_VALID = np.zeros(0, dtype=np.bool_)


def update(
    spec: AggregateSpec,
    states: Sequence[np.ndarray],
    gids: np.ndarray,
    column: Column | None,
    seq_base: int,
    kernels: ModuleType = _kernels,
    arena: VarArena | None = None,
) -> None:
    """Fold the rows of ``column`` (already sliced like ``gids``) into ``states`` (string and
    binary min/max/first/last: into ``arena``, which has room for all the column's bytes)."""
    family = spec.family
    if family == "count_star":
        kernels.count_rows(gids, states[0])
        return
    assert column is not None
    valid = _EMPTY_VALID if column.valid is None else column.valid
    if family == "count":
        kernels.count_valid(gids, valid, states[0])
        return
    if family.endswith("_var"):
        _update_var(spec, states, gids, column, valid, seq_base, kernels, arena)
        return
    if family == VAR_STATE and column.kind == "binary":
        rows, n, mean, m2 = unpack_var_states(column, valid, spec.output)
        kernels.merge_var(gids if rows is None else gids[rows], n, mean, m2, *states)
        return
    values = column.values
    if column.kind == "decimal" and family in ("var", VAR_STATE):
        values = decimal_floats(column)
    if family.endswith("_dec128") and not family.startswith(("sum", "mean")):
        base = family[: -len("_dec128")]
        if base in ("min", "max"):
            kernels.minmax_dec128(gids, values, valid, base == "max", *states)
        else:
            skip = base.endswith("non_null")
            kernels.seq_dec128(gids, values, valid, seq_base, skip, base.startswith("last"),
                               *states)  # fmt: skip
        return
    if family in ("sum_int", "mean_int", "mean_duration", "sum_dec", "mean_dec"):
        kernels.sum_int(gids, values, valid, states[0], states[1], states[2])
    elif family in ("sum_dec128", "mean_dec128"):
        kernels.sum_dec128(gids, values, valid, states[0], states[1], states[2], states[3])
    elif family in ("sum_uint", "mean_uint"):
        kernels.sum_uint(gids, values, valid, states[0], states[1], states[2])
    elif family in ("sum_float", "mean_float"):
        kernels.sum_float(gids, values, valid, states[0], states[1], states[2])
    elif family == "min":
        kernels.min_update(gids, values, valid, states[0], states[1])
    elif family == "max":
        kernels.max_update(gids, values, valid, states[0], states[1])
    elif family in ("first", "first_non_null"):
        skip = family == "first_non_null"
        kernels.first_update(gids, values, valid, seq_base, skip, *states)
    elif family in ("last", "last_non_null"):
        skip = family == "last_non_null"
        kernels.last_update(gids, values, valid, seq_base, skip, *states)
    elif family in ("var", VAR_STATE):
        kernels.var_update(gids, values, valid, *states)
    else:  # pragma: no cover - resolve() only makes the families above
        raise AssertionError(family)
    if family.startswith("mean"):
        kernels.count_valid(gids, valid, states[-1])


def update_all(
    specs: Sequence[AggregateSpec],
    states: Sequence[Sequence[np.ndarray]],
    gids: np.ndarray,
    columns: Sequence[Column | None],
    seq_base: int,
    rows: np.ndarray | None = None,
    kernels: ModuleType = _kernels,
    arena: VarArena | None = None,
    groups: int | None = None,
) -> None:
    """:func:`update` of every aggregate (``states[k]`` and ``columns[k]`` those of
    ``specs[k]``), in one pass for the common ones.

    ``rows`` is the record array whose fields the states are
    (:attr:`~extagg.collection.typed_table.TypedHashTable.rows`): then count, sum, mean, min and
    max of ``float64``/``int64`` columns without nulls in this chunk (and ``count(*)``) are
    folded by one :func:`~extagg.columnar._kernels.fused_update` call that visits each group's
    row once (one cache miss per row for all of them, prefetched). The other aggregates, or
    all without ``rows``, one by one. ``groups``, the groups of the table (a bound of
    ``gids``), spares the scan of ``gids`` for their bound when it is above ``FEW_GROUPS``."""
    plan = None if rows is None else fused_ops(specs, states, columns, rows)
    fused: set[int] = set()
    if plan is not None:
        assert rows is not None
        ops, fcols, icols, fused = plan
        few = _few_groups(gids, ops, groups)
        if few:
            kernels.fused_update_few(
                gids, few, fcols, icols, ops, rows.view(np.uint8), rows.dtype.itemsize
            )
        else:
            kernels.fused_update(gids, fcols, icols, ops, rows.view(np.uint8), rows.dtype.itemsize)
    for k, spec in enumerate(specs):
        if k not in fused:
            update(spec, states[k], gids, columns[k], seq_base, kernels, arena)


#: rows a chunk needs at least to be folded by ``fused_update_few`` (its partials are set up
#: and added once per operation and group)
FEW_GROUPS_MIN_ROWS = 1 << 10
_FEW_CODES = frozenset((_kernels.FUSED_COUNT, _kernels.FUSED_SUM_INT, _kernels.FUSED_MIN_INT,
                        _kernels.FUSED_MAX_INT))  # fmt: skip


def _few_groups(gids: np.ndarray, ops: np.ndarray, groups: int | None = None) -> int:
    """The bound of ``gids`` when ``fused_update_few`` can fold the chunk (integer operations
    only, group ids below ``FEW_GROUPS``, rows enough); else 0. ``groups`` (a known bound of
    ``gids``, the table's groups) above ``FEW_GROUPS`` answers 0 without reading ``gids``: their
    maximum cost ~5 % of a fold with many groups. (A chunk of only the first few groups of a
    larger table then takes ``fused_update``: same states, a little slower.)"""
    # a set of the few codes, not np.isin: ~1 us against ~75 us, once a chunk
    if len(gids) < FEW_GROUPS_MIN_ROWS or not _FEW_CODES.issuperset(ops[:, 0].tolist()):
        return 0
    if groups is not None and groups > _kernels.FEW_GROUPS:
        return 0
    groups = int(gids.max()) + 1
    return groups if groups <= _kernels.FEW_GROUPS else 0


_NO_FLOATS = (np.zeros(0, dtype=np.float64),)
_NO_INTS = (np.zeros(0, dtype=np.int64),)


def fused_ops(
    specs: Sequence[AggregateSpec],
    states: Sequence[Sequence[np.ndarray]],
    columns: Sequence[Column | None],
    rows: np.ndarray,
) -> tuple[np.ndarray, tuple[np.ndarray, ...], tuple[np.ndarray, ...], set[int]] | None:
    """What :func:`~extagg.columnar._kernels.fused_update` needs for the aggregates it can
    fold: its ``ops`` table, the value columns (float, int) and the indexes of those
    aggregates; None if there are none. A state's place in the row is read off its view (its
    address minus the rows' address); states that are not fields of ``rows`` are not fused.

    The plan depends only on the state views, ``rows`` and the columns' kinds (nulls or not,
    dtype, which aggregates share a column), so it is remembered for them (see
    :data:`_PLANS`): building it took ~90 µs a chunk, a tenth of a small chunk's fold."""
    flat = [view for st in states for view in st]
    shape: list[Any] = []
    for k, col in enumerate(columns):
        if col is None:
            shape.append(None)
            continue
        values = col.values
        if values is None:
            shape.append((col.valid is None, None, -1))
            continue
        same = next((j for j, other in enumerate(columns[:k])
                     if other is not None and other.values is values), -1)  # fmt: skip
        shape.append((col.valid is None, (values.dtype, values.ndim), same))
    key = (id(specs), id(rows), *map(id, flat), *shape)
    seen = _PLANS.get(key)
    if (
        seen is not None
        and seen[0] is specs
        and seen[1]() is rows
        and all(ref() is view for ref, view in zip(seen[2], flat, strict=True))
    ):
        plan = seen[3]
    else:
        plan = _fused_plan(specs, states, columns, rows)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = (specs, weakref.ref(rows), [weakref.ref(v) for v in flat], plan)
    if plan is None:
        return None
    table, f_src, i_src, fused = plan
    floats = _alike(tuple(np.ascontiguousarray(columns[k].values) for k in f_src)) or _NO_FLOATS
    ints = _alike(tuple(np.ascontiguousarray(columns[k].values) for k in i_src)) or _NO_INTS
    return table, floats, ints, set(fused)


#: fused plans by the identity of the specs, the rows, the state views and the columns'
#: kinds (``_fused_plan``'s result, checked by reference on every hit: an ``id`` is reused
#: only after its object is gone); cleared when it holds :data:`_MAX_PLANS`
def _alike(arrays: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """``arrays``, as read-only views if some are read-only and some not: the kernel takes
    them as one tuple, which numba types only if its arrays are alike (an Arrow buffer is
    read-only, a column computed in NumPy writable: ``TypingError`` in ``fused_update``)."""
    if len({a.flags.writeable for a in arrays}) < 2:
        return arrays
    views = tuple(a.view() for a in arrays)
    for view in views:
        view.flags.writeable = False
    return views


_PLANS: dict[tuple[Any, ...], tuple[Any, Any, list[Any], Any]] = {}
_MAX_PLANS = 256


def _fused_plan(
    specs: Sequence[AggregateSpec],
    states: Sequence[Sequence[np.ndarray]],
    columns: Sequence[Column | None],
    rows: np.ndarray,
) -> tuple[np.ndarray, tuple[int, ...], tuple[int, ...], frozenset[int]] | None:
    """:func:`fused_ops`'s plan: the ``ops`` table, the aggregates whose columns are the float
    and the int value columns (in the table's column order), and the aggregates fused."""
    width = rows.dtype.itemsize
    base = _address(rows)

    def at(view: np.ndarray) -> int:
        offset = _address(view) - base
        if view.strides != (width,) or not 0 <= offset < width or len(view) != len(rows):
            raise _NotFields
        return offset

    ops: list[tuple[int, int, int, int, int]] = []
    f_src: list[int] = []
    i_src: list[int] = []
    fused: set[int] = set()

    def index(src: list[int], k: int) -> int:
        values = columns[k].values  # type: ignore[union-attr]
        for j, other in enumerate(src):
            if columns[other].values is values:  # type: ignore[union-attr]
                return j
        src.append(k)
        return len(src) - 1

    K = _kernels
    try:
        for k, (spec, st, col) in enumerate(zip(specs, states, columns, strict=True)):
            family = spec.family
            if family == "count_star":
                ops.append((K.FUSED_COUNT, 0, at(st[0]), 0, -1))
                fused.add(k)
                continue
            if col is None or col.valid is not None or col.values is None:
                continue
            values = col.values
            is_float = values.dtype == _F64 and values.ndim == 1
            is_int = values.dtype == _I64 and values.ndim == 1
            if family == "count":
                ops.append((K.FUSED_COUNT, 0, at(st[0]), 0, -1))
            elif family in ("sum_float", "mean_float") and is_float:
                j = index(f_src, k)
                ops.append((K.FUSED_SUM_FLOAT, j, at(st[0]), at(st[1]), at(st[2])))
                if family == "mean_float":
                    ops.append((K.FUSED_COUNT, 0, at(st[3]), 0, -1))
            elif (
                family in ("sum_int", "mean_int", "mean_duration", "sum_dec", "mean_dec") and is_int
            ):
                j = index(i_src, k)
                ops.append((K.FUSED_SUM_INT, j, at(st[0]), at(st[1]), at(st[2])))
                if family.startswith("mean"):
                    ops.append((K.FUSED_COUNT, 0, at(st[3]), 0, -1))
            elif family in ("min", "max") and (is_float or is_int):
                if is_float:
                    code = K.FUSED_MIN_FLOAT if family == "min" else K.FUSED_MAX_FLOAT
                    j = index(f_src, k)
                else:
                    code = K.FUSED_MIN_INT if family == "min" else K.FUSED_MAX_INT
                    j = index(i_src, k)
                ops.append((code, j, at(st[0]), 0, at(st[1])))
            else:
                continue
            fused.add(k)
    except _NotFields:
        return None
    if not ops:
        return None
    table = np.array(ops, dtype=np.int64).reshape(len(ops), 5)  # shared: never written
    return table, tuple(f_src), tuple(i_src), frozenset(fused)


#: data addresses of the state views seen (``id`` → (weak reference, address)): reading one
#: off ``__array_interface__`` costs ~4 µs, ~20 times a chunk with six aggregates
_ADDRESSES: dict[int, tuple[Any, int]] = {}
_MAX_ADDRESSES = 4096


def _address(view: np.ndarray) -> int:
    """The address of ``view``'s first element (remembered while ``view`` lives)."""
    key = id(view)
    seen = _ADDRESSES.get(key)
    if seen is not None and seen[0]() is view:
        return seen[1]
    address = int(view.__array_interface__["data"][0])
    if len(_ADDRESSES) >= _MAX_ADDRESSES:
        _ADDRESSES.clear()
    _ADDRESSES[key] = (weakref.ref(view), address)
    return address


class _NotFields(Exception):
    """A state array is not a field of the rows given (then nothing is fused)."""


def _update_var(
    spec: AggregateSpec,
    states: Sequence[np.ndarray],
    gids: np.ndarray,
    column: Column,
    valid: np.ndarray,
    seq_base: int,
    kernels: ModuleType,
    arena: VarArena | None,
) -> None:
    assert arena is not None and column.offsets is not None and column.data is not None
    if arena.room < column.data.nbytes:  # the caller reserves room: never write past the end
        raise RuntimeError(
            f"aggregate {spec.output!r}: {arena.room} bytes of room in the state arena for "
            f"{column.data.nbytes} bytes of values"
        )
    base = spec.family[: -len("_var")]
    if base in ("min", "max"):
        arena.used = int(
            kernels.minmax_var_update(
                gids, column.offsets, column.data, valid, base == "max", arena.data, arena.used,
                *states,
            )
        )  # fmt: skip
    else:
        arena.used = int(
            kernels.seq_var_update(
                gids, column.offsets, column.data, valid, seq_base, base.endswith("non_null"),
                base.startswith("last"), arena.data, arena.used, *states,
            )
        )  # fmt: skip


def merge_var(
    spec: AggregateSpec,
    out_gid: np.ndarray,
    groups: int,
    src_var: tuple[np.ndarray, np.ndarray],
    src: Sequence[np.ndarray],
    kernels: ModuleType = _kernels,
) -> tuple[tuple[np.ndarray, np.ndarray], list[np.ndarray]]:
    """Merge block rows of a variable-length state (``src_var`` the values as offsets and
    bytes, ``src`` the fixed states after them) into ``groups`` output groups."""
    offsets, data = src_var
    win = np.full(groups, -1, dtype=np.int64)
    base = spec.family[: -len("_var")]
    rest: list[np.ndarray]
    if base in ("min", "max"):
        kernels.merge_minmax_var(out_gid, base == "max", offsets, data, src[0], win)
        rest = [win >= 0]
    else:
        seq = np.full(groups, -1, dtype=np.int64)
        null = np.zeros(groups, dtype=np.bool_)
        kernels.merge_seq_var(out_gid, base.startswith("last"), src[0], src[1], win, seq, null)
        rest = [seq, null]
    return kernels.gather_var_rows(offsets, data, win), rest


def var_array(
    arrow_type: pa.DataType, var: tuple[np.ndarray, np.ndarray], mask: np.ndarray
) -> pa.Array:
    """Values as offsets and bytes (``mask``: nulls) as an Arrow array of ``arrow_type``."""
    offsets, data = var
    n = len(offsets) - 1
    string = pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
    large = pa.large_string() if string else pa.large_binary()
    nulls = int(mask.sum())
    validity = pa.py_buffer(np.packbits(~mask, bitorder="little")) if nulls else None
    arr = pa.Array.from_buffers(
        large, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls
    )
    return arr if arr.type == arrow_type else arr.cast(arrow_type)


def merge(
    spec: AggregateSpec,
    dst: Sequence[np.ndarray],
    out_gid: np.ndarray,
    src: Sequence[np.ndarray],
    kernels: ModuleType = _kernels,
) -> None:
    """Fold partial states ``src`` (one row per partial) into output groups ``dst``."""
    family = spec.family
    if family.endswith("_dec128") and not family.startswith(("sum", "mean")):
        base = family[: -len("_dec128")]
        if base in ("min", "max"):
            kernels.merge_minmax_dec128(out_gid, base == "max", *src, *dst)
        else:
            kernels.merge_seq_dec128(out_gid, base.startswith("last"), *src, *dst)
        return
    if family in ("count", "count_star"):
        kernels.merge_add(out_gid, src[0], dst[0])
    elif family.startswith(("sum", "mean")):
        has = 2
        if family.endswith("float"):
            kernels.merge_fsum(out_gid, src[0], src[1], dst[0], dst[1])
        elif family.endswith("dec128"):
            kernels.merge_sum192(out_gid, src[0], src[1], src[2], dst[0], dst[1], dst[2])
            has = 3
        else:
            kernels.merge_sum128(out_gid, src[0], src[1], dst[0], dst[1])
        kernels.merge_or(out_gid, src[has], dst[has])
        if family.startswith("mean"):
            kernels.merge_add(out_gid, src[-1], dst[-1])
    elif family == "min":
        kernels.merge_min(out_gid, *src, *dst)
    elif family == "max":
        kernels.merge_max(out_gid, *src, *dst)
    elif family in ("first", "first_non_null"):
        kernels.merge_first(out_gid, *src, *dst)
    elif family in ("last", "last_non_null"):
        kernels.merge_last(out_gid, *src, *dst)
    elif family in ("var", VAR_STATE):
        kernels.merge_var(out_gid, *src, *dst)
    else:  # pragma: no cover
        raise AssertionError(family)


def mean_half_up(lo: np.ndarray, hi: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``sum / n`` of exact 128-bit sums (``lo``, ``hi`` words) of int64 values, rounded half
    away from zero (Spark divides a day-time interval by ``HALF_UP``); 0 where ``n`` is 0.

    The mean of int64 values fits int64 whatever their sum: sums that fit int64 (nearly
    all) are divided in NumPy, the others one by one with Python's integers."""
    out = np.zeros(len(lo), dtype=np.int64)
    total = lo.view(np.int64)
    small = (hi == (total >> np.int64(63))) & (n > 0)
    if small.any():
        t, d = total[small], n[small]
        magnitude = np.abs(t.astype(np.float64)) >= 2.0**62  # |t| may not negate in int64
        if magnitude.any():
            small[np.flatnonzero(small)[magnitude]] = False
            t, d = t[~magnitude], d[~magnitude]
        q, r = np.divmod(np.abs(t), d)
        q += 2 * r >= d
        out[small] = np.where(t < 0, -q, q)
    for row in np.flatnonzero(~small & (n > 0)).tolist():
        exact, count = (int(hi[row]) << 64) + int(lo[row]), int(n[row])
        q, r = divmod(abs(exact), count)
        q += 2 * r >= count
        out[row] = -q if exact < 0 else q
    return out


def _sum128_fits(lo: np.ndarray, hi: np.ndarray, unsigned: bool) -> np.ndarray:
    if unsigned:
        return hi == 0
    return hi == (lo.view(np.int64) >> np.int64(63))


def _sum128_float(lo: np.ndarray, hi: np.ndarray, unsigned: bool) -> np.ndarray:
    fits = _sum128_fits(lo, hi, unsigned)
    small = lo.astype(np.float64) if unsigned else lo.view(np.int64).astype(np.float64)
    big = hi.astype(np.float64) * 18446744073709551616.0 + lo.astype(np.float64)
    return np.where(fits, small, big)


def _fsum(s: np.ndarray, c: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(s), s + c, s)


def decimal_floats(column: Column) -> np.ndarray:
    """A decimal column's values as ``float64`` (for variance, as Spark casts to double).

    Two-word values that fit 64 bits are converted from their signed low word: ``hi * 2**64 +
    lo`` in doubles cancels for small negative values (-6 is ``-2**64 + (2**64 - 6)``, which
    is 0.0 in doubles); only larger magnitudes, whose rounding that sum keeps within an ulp,
    take it."""
    values = column.values
    assert values is not None
    scale = 10.0**column.arrow_type.scale
    if values.ndim == 1:
        return values.astype(np.float64) / scale
    low = np.ascontiguousarray(values[:, 0]).view(np.uint64)
    return _sum128_float(low, values[:, 1], False) / scale


def _words_to_ints(words: Sequence[np.ndarray], rows: np.ndarray) -> list[int]:
    """Python ints of multi-word (low first, last word signed) values at ``rows``."""
    out = []
    for r in rows.tolist():
        value = int(words[-1][r])
        for w in reversed(words[:-1]):
            value = (value << 64) | int(w[r])
        out.append(value)
    return out


def _check_digits(
    spec: AggregateSpec, words: Sequence[np.ndarray], has: np.ndarray, what: str = "sum"
) -> None:
    """Raise :class:`SumOverflowError` for the first group whose exact value (in ``words``)
    needs more digits than the result type's precision."""
    digits = spec.output_type.precision
    limit = 10**digits
    lo = words[0]
    if len(words) == 2:  # 128 bits: small values checked in NumPy
        fits64 = words[1] == (lo.view(np.int64) >> np.int64(63))
        suspects = has & ~fits64
        if digits < 19:
            signed = lo.view(np.int64)
            suspects |= has & fits64 & ((signed >= limit) | (signed <= -limit))
        rows = np.flatnonzero(suspects)
    else:
        rows = np.flatnonzero(has)
    for r, value in zip(rows.tolist(), _words_to_ints(words, rows)):
        if abs(value) >= limit:
            raise SumOverflowError(
                f"decimal overflow in aggregate {spec.output!r}: {what} of column "
                f"{spec.column!r} ({spec.arrow_type}) has more than {digits} digits, the "
                f"precision of its result type {spec.output_type}",
                r,
            )


def _decimal_mean(spec: AggregateSpec, words: Sequence[np.ndarray], n: np.ndarray) -> pa.Array:
    """``sum / n`` at the result scale, rounded half up (away from zero on ties, as Spark)."""
    assert spec.arrow_type is not None  # a decimal input column
    what = f"aggregate {spec.output!r}: mean of column {spec.column!r} ({spec.arrow_type})"
    return _divide_half_up(words, n, spec.arrow_type.scale, spec.output_type, what)


def divide_decimal(total: pa.Array, n: np.ndarray, out_type: pa.DataType, what: str) -> pa.Array:
    """``total / n`` (a decimal128 array of sums, their counts) as ``out_type``, exact and
    rounded half up: the mean of summed partial states, as the engine's own ``mean`` of a
    decimal (a two-stage aggregation's final step). ``what`` names the mean in an overflow."""
    if isinstance(total, pa.ChunkedArray):
        total = total.combine_chunks()
    rows = len(total)
    words = np.frombuffer(total.buffers()[1], dtype=np.int64)
    words = words[2 * total.offset : 2 * (total.offset + rows)].reshape(rows, 2)
    n = np.asarray(n, dtype=np.int64)
    if total.null_count:
        n = np.where(total.is_null().to_numpy(zero_copy_only=False), 0, n)
    lo, hi = words[:, 0].view(np.uint64).copy(), words[:, 1].copy()
    return _divide_half_up((lo, hi), n, total.type.scale, out_type, what)


def _divide_half_up(
    words: Sequence[np.ndarray], n: np.ndarray, in_scale: int, out_type: pa.DataType, what: str
) -> pa.Array:
    """Sums (128- or 192-bit ``words``, at ``in_scale``) over ``n`` as ``out_type``, rounded
    half up; a quotient past its precision is a :class:`SumOverflowError` (``what``)."""
    shift = out_type.scale - in_scale
    factor = 10**shift
    m = len(n)
    q_lo = np.zeros(m, dtype=np.int64)
    empty = n == 0
    lo = words[0].view(np.int64)
    # fast path: the sum fits int64 with room for the factor
    fast = ~empty
    if len(words) == 2:
        fast &= words[1] == (lo >> np.int64(63))
    else:
        fast &= (words[2] == (words[1].view(np.int64) >> np.int64(63))) & (
            words[1].view(np.int64) == (lo >> np.int64(63))
        )
    bound = np.int64((2**63 - 1) // factor)
    fast &= (lo <= bound) & (lo >= -bound)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scaled = np.abs(lo) * np.int64(factor)
        safe_n = np.where(empty, 1, n)
        quotient, remainder = np.divmod(scaled, safe_n)
        quotient += (2 * remainder >= safe_n).astype(np.int64)
    q_lo[fast] = np.where(lo < 0, -quotient, quotient)[fast]
    q_hi = q_lo >> np.int64(63)
    slow = np.flatnonzero(~fast & ~empty)
    if len(slow):
        q_lo = q_lo.copy()
        digits_limit = 10**out_type.precision
        for r, total in zip(slow.tolist(), _words_to_ints(words, slow)):
            count = int(n[r])
            q, rem = divmod(abs(total) * factor, count)
            q += 2 * rem >= count
            q = -q if total < 0 else q
            if abs(q) >= digits_limit:
                raise SumOverflowError(
                    f"decimal overflow in {what}: the mean has more than {out_type.precision} "
                    f"digits at scale {out_type.scale} (result type {out_type})",
                    r,
                )
            q_lo[r] = np.uint64(q & 0xFFFFFFFFFFFFFFFF).view(np.int64)
            q_hi[r] = q >> 64
    return decimal_array(out_type, q_lo, q_hi, empty)


def _typed(values: np.ndarray, arrow_type: pa.DataType, mask: np.ndarray) -> pa.Array:
    mask_or_none = mask if mask.any() else None
    if pa.types.is_decimal(arrow_type):
        signed = values.view(np.int64)
        return decimal_array(arrow_type, signed, signed >> np.int64(63), mask_or_none)
    if pa.types.is_temporal(arrow_type):
        storage = pa.int32() if arrow_type.bit_width == 32 else pa.int64()
        return pa.array(values, type=storage, mask=mask_or_none).view(arrow_type)
    return pa.array(values, type=arrow_type, mask=mask_or_none)


def finalize(spec: AggregateSpec, states: Sequence[Any]) -> pa.Array:
    """The result column of ``spec`` for groups whose final states are ``states``."""
    family = spec.family
    if family in ("count", "count_star"):
        return pa.array(states[0], type=pa.int64())
    if family.endswith("_var"):  # states: (offsets, bytes), then has or seq/null
        if family.startswith(("min", "max")):
            return var_array(spec.output_type, states[0], ~states[1])
        return var_array(spec.output_type, states[0], (states[1] < 0) | states[2])
    if family == "sum_uint":
        lo, hi, has = states
        _check_digits(spec, [lo, hi], has)
        return decimal_array(spec.output_type, lo, hi, ~has)
    if family in ("sum_dec", "sum_dec128"):
        *words, has = states
        _check_digits(spec, words, has)
        return decimal_array(spec.output_type, words[0], words[1], ~has)
    if family in ("min_dec128", "max_dec128"):
        lo, hi, has = states
        return decimal_array(spec.output_type, lo, hi, ~has)
    if family.endswith("_dec128") and not family.startswith(("sum", "mean")):
        lo, hi, seq, null = states
        return decimal_array(spec.output_type, lo, hi, (seq < 0) | null)
    if family in ("mean_dec", "mean_dec128"):
        *words, _has, n = states
        return _decimal_mean(spec, words, n)
    if family == "sum_int":
        lo, hi, has = states
        unsigned = False
        bad = np.flatnonzero(has & ~_sum128_fits(lo, hi, unsigned))
        if len(bad):
            row = int(bad[0])
            exact = (int(hi[row]) << 64) + int(lo[row])
            raise SumOverflowError(
                f"integer overflow in aggregate {spec.output!r}: sum of column {spec.column!r} "
                f"({spec.arrow_type}) is {exact}, outside the range of {spec.output_type}",
                row,
            )
        return _typed(lo.view(np.int64), spec.output_type, ~has)
    if family == "sum_float":
        return _typed(_fsum(states[0], states[1]), pa.float64(), ~states[2])
    if family == "mean_duration":
        lo, hi, _has, n = states
        return _typed(mean_half_up(lo, hi, n), spec.output_type, n == 0)
    if family in ("mean_int", "mean_uint"):
        lo, hi, _has, n = states
        total = _sum128_float(lo, hi, family == "mean_uint")
        with np.errstate(invalid="ignore", divide="ignore"):
            return _typed(total / n, pa.float64(), n == 0)
    if family == "mean_float":
        s, c, _has, n = states
        with np.errstate(invalid="ignore", divide="ignore"):
            return _typed(_fsum(s, c) / n, pa.float64(), n == 0)
    if family in ("min", "max"):
        return _typed(states[0], spec.output_type, ~states[1])
    if family in ("first", "last", "first_non_null", "last_non_null"):
        v, seq, null = states
        return _typed(v, spec.output_type, (seq < 0) | null)
    if family == "var":
        n, _mean, m2 = states
        return _variance(spec.func, n, m2)
    if family == VAR_STATE:
        return pack_var_states(*states)
    raise AssertionError(family)  # pragma: no cover


def _variance(func: str, n: np.ndarray, m2: np.ndarray) -> pa.Array:
    """``func`` (var, var_pop, std, std_pop) of the moments ``n`` and ``m2``: null where
    there are too few values, NaN where one was NaN or infinite (as Spark's)."""
    sample = func in ("var", "std")
    divisor = n - 1 if sample else n
    with np.errstate(invalid="ignore", divide="ignore"):
        result = np.maximum(m2, 0.0) / divisor
    if func.startswith("std"):
        with np.errstate(invalid="ignore"):
            result = np.sqrt(result)
    return _typed(result, pa.float64(), n <= (1 if sample else 0))


def finish_var_states(states: pa.Array, func: str) -> pa.Array:
    """``func`` (var, var_pop, std, std_pop) of each ``var_state`` value of ``states``
    (a null state: no value, a null result)."""
    column = to_column(func, states)
    valid = np.ones(len(states), dtype=np.bool_) if column.valid is None else column.valid
    rows, n_valid, _mean, m2_valid = unpack_var_states(column, valid, func)
    n = np.zeros(len(states), dtype=np.int64)
    m2 = np.zeros(len(states), dtype=np.float64)
    n[rows], m2[rows] = n_valid, m2_valid
    return _variance(ALIASES.get(func, func), n, m2)


def pack_var_states(n: np.ndarray, mean: np.ndarray, m2: np.ndarray) -> pa.Array:
    """``var_state`` values (binary, 24 bytes each; null where ``n`` is 0) of the moments
    ``n`` (count), ``mean`` and ``m2`` (sum of squared deviations from the mean)."""
    rows = len(n)
    packed = np.empty(rows, dtype=VAR_STATE_DTYPE)
    packed["n"], packed["mean"], packed["m2"] = n, mean, m2
    empty = np.asarray(n) == 0
    size = VAR_STATE_DTYPE.itemsize
    offsets = np.arange(0, (rows + 1) * size, size, dtype=np.int32)
    validity = None
    nulls = int(empty.sum())
    if nulls:
        validity = pa.py_buffer(np.packbits(~empty, bitorder="little"))
    return pa.Array.from_buffers(
        pa.binary(), rows, [validity, pa.py_buffer(offsets), pa.py_buffer(packed)], null_count=nulls
    )


def unpack_var_states(
    column: Column, valid: np.ndarray, output: str = "var_state"
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]:
    """The moments of a binary column of ``var_state`` values: ``(rows, n, mean, m2)``,
    ``rows`` the indexes of the non-null values (None: all). A value that is not 24 bytes
    is a ``ValueError`` naming ``output`` and the column."""
    assert column.offsets is not None and column.data is not None
    offsets, data = column.offsets, column.data
    size = VAR_STATE_DTYPE.itemsize
    rows = np.flatnonzero(valid) if len(valid) else None
    starts = offsets[:-1] if rows is None else offsets[rows]
    lengths = np.diff(offsets) if rows is None else offsets[rows + 1] - starts
    if len(lengths) and (lengths != size).any():
        bad = int(np.flatnonzero(lengths != size)[0])
        raise ValueError(
            f"aggregate {output!r}: column {column.name!r} holds a value of "
            f"{int(lengths[bad])} bytes where a {VAR_STATE} of {size} bytes was expected"
        )
    if len(starts) and int(starts[-1]) - int(starts[0]) == size * (len(starts) - 1):
        first = int(starts[0])  # contiguous: a view, no copy
        packed = data[first : first + size * len(starts)].view(VAR_STATE_DTYPE)
    else:
        packed = data[starts[:, None] + np.arange(size)].reshape(-1).view(VAR_STATE_DTYPE)
    return rows, packed["n"].copy(), packed["mean"].copy(), packed["m2"].copy()

"""Aggregate functions: names, input checks, state layouts, result types, and their kernels.

Each requested aggregate ``{"total": ("amount", "sum")}`` resolves, once the input types are
known, to an :class:`AggregateSpec`: a *family* of kernels, the per-group state arrays it needs
and the Arrow type of its result. ``update``/``merge``/``finalize`` below dispatch to the
compiled kernels of :mod:`extagg.columnar._kernels` (or any module with the same names, such
as the plain-Python :mod:`extagg.columnar._reference`) and hold no per-row loops.

Result types follow Spark SQL: ``count`` is ``int64``; ``sum`` of integers or bools is
``int64`` (``uint64`` for ``uint64`` input) and raises :class:`SumOverflowError` when the exact
sum does not fit; ``sum`` of floats, ``mean``, ``var``/``std`` are ``float64``; ``min``,
``max``, ``first`` and ``last`` keep the input type. A group with no non-null input gets a
null (``var``/``std`` need two values, ``var_pop``/``std_pop`` one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa

from extagg.columnar import _kernels
from extagg.columnar.columns import Column
from extagg.errors import SumOverflowError

__all__ = [
    "FUNCTIONS",
    "ALIASES",
    "AggregateRequest",
    "AggregateSpec",
    "StateField",
    "SumOverflowError",
    "parse_aggs",
    "resolve",
    "update",
    "merge",
    "finalize",
]

FUNCTIONS = (
    "count", "sum", "mean", "min", "max", "first", "last", "first_non_null", "last_non_null",
    "var", "var_pop", "std", "std_pop",
)  # fmt: skip
ALIASES = {
    "avg": "mean",
    "variance": "var",
    "var_samp": "var",
    "stddev": "std",
    "stddev_samp": "std",
    "std_samp": "std",
    "stddev_pop": "std_pop",
    "size": "count",
}
_NUMERIC = ("int", "uint", "float", "bool")
_ORDERED = ("int", "uint", "float", "bool", "temporal")
_ALL = (*_ORDERED, "string", "binary")
_ACCEPTS = {
    "count": _ALL,
    "sum": _NUMERIC,
    "mean": _NUMERIC,
    "var": _NUMERIC,
    "var_pop": _NUMERIC,
    "std": _NUMERIC,
    "std_pop": _NUMERIC,
}
_I64 = np.dtype(np.int64)
_U64 = np.dtype(np.uint64)
_F64 = np.dtype(np.float64)
_BOOL = np.dtype(np.bool_)


@dataclass(frozen=True)
class AggregateRequest:
    """One output column as asked for: ``output = func(column)`` (``column`` None for ``*``)."""

    output: str
    column: str | None
    func: str


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


def parse_aggs(aggs: Mapping[str, Any]) -> list[AggregateRequest]:
    """Check ``{output: (column, function)}`` and canonicalise the function names."""
    if not isinstance(aggs, Mapping) or not aggs:
        raise TypeError(
            'aggs must be a non-empty dict like {"total": ("amount", "sum"), "n": ("*", "count")}'
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
        name = ALIASES.get(func.lower(), func.lower())
        if name not in FUNCTIONS:
            known = ", ".join(sorted((*FUNCTIONS, *ALIASES)))
            raise ValueError(f"unknown aggregate function {func!r} for {output!r}; known: {known}")
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
    accepted = _ACCEPTS.get(func, _ORDERED)
    if kind not in accepted:
        need = {
            _NUMERIC: "a numeric or bool column",
            _ORDERED: "a numeric, bool or temporal column (strings are not supported yet)",
        }.get(accepted, "a column")
        raise TypeError(
            f"aggregate {request.output!r}: {func}({request.column!r}) is not supported for "
            f"column {request.column!r} of type {arrow_type}; {func} needs {need}"
        )
    value_dtype = None if column.values is None else column.values.dtype
    family, states, out_type = _layout(func, kind, arrow_type, value_dtype)
    return AggregateSpec(request.output, func, request.column, family, arrow_type, states, out_type)


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
            return "sum_uint", sum128, pa.uint64()
        return "sum_int", sum128, pa.int64()
    if func == "mean":
        if kind == "float":
            return "mean_float", (*fsum, count), pa.float64()
        return ("mean_uint" if big_unsigned else "mean_int"), (*sum128, count), pa.float64()
    if func in ("var", "var_pop", "std", "std_pop"):
        welford = (count, StateField("mean", _F64, 0.0), StateField("m2", _F64, 0.0))
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
) -> None:
    """Fold the rows of ``column`` (already sliced like ``gids``) into ``states``."""
    family = spec.family
    if family == "count_star":
        kernels.count_rows(gids, states[0])
        return
    assert column is not None
    valid = _EMPTY_VALID if column.valid is None else column.valid
    if family == "count":
        kernels.count_valid(gids, valid, states[0])
        return
    values = column.values
    if family in ("sum_int", "mean_int"):
        kernels.sum_int(gids, values, valid, states[0], states[1], states[2])
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
    elif family == "var":
        kernels.var_update(gids, values, valid, *states)
    else:  # pragma: no cover - resolve() only makes the families above
        raise AssertionError(family)
    if family.startswith("mean"):
        kernels.count_valid(gids, valid, states[-1])


def merge(
    spec: AggregateSpec,
    dst: Sequence[np.ndarray],
    out_gid: np.ndarray,
    src: Sequence[np.ndarray],
    kernels: ModuleType = _kernels,
) -> None:
    """Fold partial states ``src`` (one row per partial) into output groups ``dst``."""
    family = spec.family
    if family in ("count", "count_star"):
        kernels.merge_add(out_gid, src[0], dst[0])
    elif family.startswith(("sum", "mean")):
        if family.endswith("float"):
            kernels.merge_fsum(out_gid, src[0], src[1], dst[0], dst[1])
        else:
            kernels.merge_sum128(out_gid, src[0], src[1], dst[0], dst[1])
        kernels.merge_or(out_gid, src[2], dst[2])
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
    elif family == "var":
        kernels.merge_var(out_gid, *src, *dst)
    else:  # pragma: no cover
        raise AssertionError(family)


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


def _typed(values: np.ndarray, arrow_type: pa.DataType, mask: np.ndarray) -> pa.Array:
    mask_or_none = mask if mask.any() else None
    if pa.types.is_temporal(arrow_type):
        storage = pa.int32() if arrow_type.bit_width == 32 else pa.int64()
        return pa.array(values, type=storage, mask=mask_or_none).view(arrow_type)
    return pa.array(values, type=arrow_type, mask=mask_or_none)


def finalize(spec: AggregateSpec, states: Sequence[np.ndarray]) -> pa.Array:
    """The result column of ``spec`` for groups whose final states are ``states``."""
    family = spec.family
    if family in ("count", "count_star"):
        return pa.array(states[0], type=pa.int64())
    if family in ("sum_int", "sum_uint"):
        lo, hi, has = states
        unsigned = family == "sum_uint"
        bad = np.flatnonzero(has & ~_sum128_fits(lo, hi, unsigned))
        if len(bad):
            row = int(bad[0])
            exact = (int(hi[row]) << 64) + int(lo[row])
            raise SumOverflowError(
                f"integer overflow in aggregate {spec.output!r}: sum of column {spec.column!r} "
                f"({spec.arrow_type}) is {exact}, outside the range of {spec.output_type}",
                row,
            )
        values = lo if unsigned else lo.view(np.int64)
        return _typed(values, spec.output_type, ~has)
    if family == "sum_float":
        return _typed(_fsum(states[0], states[1]), pa.float64(), ~states[2])
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
        sample = spec.func in ("var", "std")
        divisor = n - 1 if sample else n
        with np.errstate(invalid="ignore", divide="ignore"):
            result = np.maximum(m2, 0.0) / divisor
        if spec.func.startswith("std"):
            with np.errstate(invalid="ignore"):
                result = np.sqrt(result)
        return _typed(result, pa.float64(), n <= (1 if sample else 0))
    raise AssertionError(family)  # pragma: no cover

"""A plain-Python GROUP BY with the engine's semantics, and helpers to compare results."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

NAN_KEY = ("<nan>",)


def canon(value: Any) -> Any:
    """A dict-safe key element: every NaN is one value (``-0.0 == 0.0`` already holds)."""
    if isinstance(value, float) and math.isnan(value):
        return NAN_KEY
    return value


def _is_nan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _greater(x: Any, v: Any) -> bool:
    if _is_nan(v):
        return False
    return _is_nan(x) or x > v


def _less(x: Any, v: Any) -> bool:
    if _is_nan(x):
        return False
    return _is_nan(v) or x < v


def _sum(values: list[Any]) -> Any:
    if any(isinstance(v, float) for v in values):
        if any(_is_nan(v) for v in values) or (math.inf in values and -math.inf in values):
            return math.nan
        if math.inf in values:
            return math.inf
        if -math.inf in values:
            return -math.inf
        return math.fsum(values)
    return sum(int(v) for v in values)


def _var(values: list[float], ddof: int) -> float | None:
    n = len(values)
    if n <= ddof:
        return None
    if any(_is_nan(v) or math.isinf(v) for v in values):
        return math.nan
    mean = math.fsum(values) / n
    return math.fsum((v - mean) ** 2 for v in values) / (n - ddof)


def aggregate_one(func: str, values: list[Any]) -> Any:
    """``func`` over one group's values (``None`` = null), input order."""
    present = [v for v in values if v is not None]
    if func == "count_star":
        return len(values)
    if func == "count":
        return len(present)
    if func in ("first", "last"):
        return values[0] if func == "first" else values[-1]
    if func in ("first_non_null", "last_non_null"):
        if not present:
            return None
        return present[0] if func == "first_non_null" else present[-1]
    if not present:
        return None
    if func == "sum":
        return _sum(present)
    if func == "mean":
        total = _sum([float(v) if isinstance(v, float) else int(v) for v in present])
        return total / len(present)
    if func == "min":
        best = present[0]
        for v in present[1:]:
            if _less(v, best):
                best = v
        return best
    if func == "max":
        best = present[0]
        for v in present[1:]:
            if _greater(v, best):
                best = v
        return best
    floats = [float(v) for v in present]
    if func in ("var", "std", "var_pop", "std_pop"):
        result = _var(floats, 1 if func in ("var", "std") else 0)
        if result is None or not func.startswith("std"):
            return result
        return math.sqrt(result) if not math.isnan(result) else math.nan
    raise ValueError(func)


def reference_groupby(
    columns: Mapping[str, Sequence[Any]], keys: Sequence[str], aggs: Mapping[str, tuple[str, str]]
) -> dict[tuple, dict[str, Any]]:
    """``{canonical key tuple: {output: value}}`` computed row by row in Python."""
    n = len(next(iter(columns.values()))) if columns else 0
    groups: dict[tuple, list[int]] = {}
    for i in range(n):
        key = tuple(canon(columns[k][i]) for k in keys)
        groups.setdefault(key, []).append(i)
    out = {}
    for key, rows in groups.items():
        result = {}
        for name, (column, func) in aggs.items():
            if column == "*":
                result[name] = aggregate_one("count_star", rows)
            else:
                result[name] = aggregate_one(func, [columns[column][i] for i in rows])
        out[key] = result
    return out


def result_dict(table: pa.Table, keys: Sequence[str]) -> dict[tuple, dict[str, Any]]:
    """The engine's output table as ``{canonical key tuple: {output: value}}``."""
    rows = table.to_pylist()
    out = {}
    for row in rows:
        key = tuple(canon(row[k]) for k in keys)
        assert key not in out, f"group {key!r} appears twice in the output"
        out[key] = {k: v for k, v in row.items() if k not in keys}
    return out


def values_match(got: Any, want: Any, *, rel: float = 1e-9, abs_tol: float = 0.0) -> bool:
    if want is None or got is None:
        return got is None and want is None
    if isinstance(want, float) or isinstance(got, float):
        g, w = float(got), float(want)
        if math.isnan(w) or math.isnan(g):
            return math.isnan(w) and math.isnan(g)
        if math.isinf(w) or math.isinf(g):
            return g == w
        return math.isclose(g, w, rel_tol=rel, abs_tol=max(abs_tol, rel * 1e-3))
    return got == want


def assert_same_groups(
    got: dict[tuple, dict[str, Any]], want: dict[tuple, dict[str, Any]], rel: float = 1e-9
) -> None:
    assert set(got) == set(want), (
        f"groups differ: missing {list(set(want) - set(got))[:5]}, "
        f"extra {list(set(got) - set(want))[:5]}"
    )
    for key, expected in want.items():
        scale = _value_scale(expected)
        for name, value in expected.items():
            assert values_match(got[key][name], value, rel=rel, abs_tol=_spread_tol(name, scale)), (
                f"group {key!r}, {name}: got {got[key][name]!r}, want {value!r}"
            )


_EPS = sys.float_info.epsilon


def _value_scale(expected: dict[str, Any]) -> float:
    """Largest magnitude of a group's values, from its min/max/mean outputs (0 if none)."""
    scale = 0.0
    for name, value in expected.items():
        numeric = isinstance(value, (int, float)) and math.isfinite(value)
        if numeric and name.split("_")[0] in ("min", "max", "mean"):
            scale = max(scale, abs(float(value)))
    return scale


def _spread_tol(name: str, scale: float) -> float:
    """Absolute rounding error of a variance (~eps * x^2) or standard deviation
    (~sqrt(eps) * |x|) of values of magnitude ``scale``, whatever the order of summation: for
    equal values the exact 0 and a reference's 1e-10 are both right."""
    if name.startswith("var"):
        return 16 * _EPS * scale * scale
    if name.startswith("std"):
        return 4 * math.sqrt(_EPS) * scale
    return 0.0

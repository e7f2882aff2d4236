"""Columns the columnar engine cannot type, aggregated through the generic engine.

The columnar engine folds fixed-width numbers, dates, decimals, strings and binaries. A query
that reads a column of any other kind — a nested struct, list or map (a JSON Lines field that
is an object or an array), an all-null column of Arrow type ``null``, a pandas ``object``
column of values Arrow cannot hold in one type — is run by :class:`ObjectAggregator` instead:
every row becomes a Python key tuple and value tuple folded into an
:class:`~extagg.generic.ExternalAppendOnlyMap` under the same task memory manager and budget,
spilled and merged like any generic aggregation. The results come back as Arrow record batches
with the output types the columnar engine gives (keys and ``min``/``max``/``first``/``last``
keep the input type; ``count`` and ``count_distinct`` are ``int64``; sums and means follow
:mod:`extagg.columnar.functions`), in the generic engine's key-hash order.

``count_distinct`` is a two-level group-by here too: a second map holds each
``(key, aggregate, value)`` once; after the input, both maps stream into a third that joins
them by key. No set per group is held.

Nested values are grouped and compared by value: structs as tuples of their fields, lists as
tuples, maps as tuples of ``(key, value)`` pairs (``min``/``max`` compare them as tuples; a
``TypeError`` naming the column is raised where Python cannot order them, e.g. a null inside).
"""

from __future__ import annotations

import decimal
import itertools
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from extagg.columnar import functions as F
from extagg.columnar.columns import (
    check_batch_columns,
    column_kind,
    is_dataset,
    iter_record_batches,
    key_names,
    to_column,
)
from extagg.errors import QueryError, SumOverflowError, UsageError
from extagg.generic import Aggregator, ExternalAppendOnlyMap
from extagg.memory import resolve_task_memory_manager
from extagg.metrics import SpillMetrics

__all__ = ["ObjectAggregator", "untyped_columns"]

log = logging.getLogger(__name__)

#: rows per result batch
RESULT_ROWS = 4_096
#: options of the columnar engine that tune what this engine does not have (ignored here)
_COLUMNAR_ONLY = ("batch_size", "chunk_rows", "threads")
_I64 = (-(1 << 63), (1 << 63) - 1)


def _storage_type(arrow_type: pa.DataType) -> pa.DataType:
    """The type of the values themselves: a dictionary's value type, an extension type's
    storage (a pandas interval is a struct, as its Python values are)."""
    if isinstance(arrow_type, pa.BaseExtensionType):
        return _storage_type(arrow_type.storage_type)
    if pa.types.is_run_end_encoded(arrow_type):  # decoded before the engine sees it
        return _storage_type(arrow_type.value_type)
    return arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type


def typed_by_columnar(arrow_type: pa.DataType | None) -> bool:
    """Whether the columnar engine can fold a column of ``arrow_type`` (``None``: no Arrow
    type, e.g. a pandas object column of mixed values)."""
    return (
        arrow_type is not None
        and not isinstance(arrow_type, pa.BaseExtensionType)  # read as Python values here
        and column_kind(_storage_type(arrow_type)) is not None
    )


def untyped_columns(source: Any, columns: Sequence[str]) -> list[tuple[str, pa.DataType | None]]:
    """The ``columns`` of ``source`` (an Arrow schema, batch, table or dataset, a pandas
    ``DataFrame`` or a dict of arrays) the columnar engine cannot type: ``(name, Arrow type or
    None)``. Columns ``source`` lacks are left to the engine's own error."""
    out: list[tuple[str, pa.DataType | None]] = []
    schema = _schema_of(source)
    if schema is not None:
        for name in columns:
            if name in schema.names and not typed_by_columnar(schema.field(name).type):
                out.append((name, schema.field(name).type))
        return out
    if isinstance(source, Mapping) or type(source).__name__ == "DataFrame":
        check_batch_columns(source, columns)
        for name in columns:
            if name not in source:
                continue
            arrow_type = _arrow_type_of(source[name])
            if not typed_by_columnar(arrow_type):
                out.append((name, arrow_type))
    return out


def _schema_of(source: Any) -> pa.Schema | None:
    if isinstance(source, pa.Schema):
        return source
    if isinstance(source, (pa.RecordBatch, pa.Table, pa.RecordBatchReader)) or is_dataset(source):
        return source.schema
    return None


def _arrow_type_of(values: Any) -> pa.DataType | None:
    """The Arrow type of one pandas/NumPy column, or ``None`` if Arrow cannot hold it."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values.type
    dtype = getattr(values, "dtype", None)
    if isinstance(dtype, np.dtype) and dtype.kind in "iufbMm":
        return pa.from_numpy_dtype(dtype)
    try:
        return pa.array(values, from_pandas=True).type
    except (
        pa.ArrowInvalid,
        pa.ArrowTypeError,
        pa.ArrowNotImplementedError,
        TypeError,
        OverflowError,  # Python ints past 64 bits
    ):
        return None


# --------------------------------------------------------------------- values as Python objects


def _freezer(arrow_type: pa.DataType | None) -> Callable[[Any], Any] | None:
    """How to make a column's Python values hashable and orderable (``None``: as they are)."""
    if arrow_type is None:
        return None
    t = _storage_type(arrow_type)
    if pa.types.is_struct(t):
        inner = [_freezer(t.field(i).type) for i in range(t.num_fields)]
        names = [t.field(i).name for i in range(t.num_fields)]

        def struct(v: Any) -> Any:
            if v is None:
                return None
            return tuple(f(v[n]) if f else v[n] for n, f in zip(names, inner))

        return struct
    if pa.types.is_map(t):
        fk, fv = _freezer(t.key_type), _freezer(t.item_type)

        def mapping(v: Any) -> Any:
            if v is None:
                return None
            return tuple((fk(k) if fk else k, fv(x) if fv else x) for k, x in v)

        return mapping
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        fi = _freezer(t.value_type)

        def listing(v: Any) -> Any:
            if v is None:
                return None
            return tuple(fi(x) for x in v) if fi else tuple(v)

        return listing
    return None


def _missing(v: Any) -> bool:
    """pandas' missing markers in object columns (None, NaN, NA, NaT) are nulls."""
    if v is None:
        return True
    if isinstance(v, float):
        return math.isnan(v)
    name = type(v).__name__
    return name in ("NAType", "NaTType")


def _python_columns(
    batch: Any, columns: Sequence[str], types: dict[str, pa.DataType | None] | None
) -> tuple[list[list[Any]], dict[str, pa.DataType | None], int]:
    """``batch``'s ``columns`` as lists of Python values, their Arrow types, the row count."""
    if isinstance(batch, (pa.RecordBatch, pa.Table)):
        missing = [c for c in columns if c not in batch.schema.names]
        if missing:
            raise ValueError(
                f"column {missing[0]!r} is not in the batch; it has {batch.schema.names}"
            )
        found = {c: batch.schema.field(c).type for c in columns}
        return [batch.column(c).to_pylist() for c in columns], found, batch.num_rows
    if isinstance(batch, Mapping) or type(batch).__name__ == "DataFrame":
        out: list[list[Any]] = []
        found = {}
        n = len(batch) if type(batch).__name__ == "DataFrame" else None
        for c in columns:
            if c not in batch:
                raise ValueError(f"column {c!r} is not in the batch; it has {list(batch)}")
            values = batch[c]
            arrow_type = _arrow_type_of(values) if types is None or types.get(c) else None
            if arrow_type is not None:  # Arrow holds it: NaN of float columns stays a value
                dtype = getattr(values, "dtype", None)
                numeric = isinstance(dtype, np.dtype) and dtype.kind in "iufb"
                arr = pa.array(np.asarray(values) if numeric else values, from_pandas=not numeric)
                out.append(arr.to_pylist())
            else:
                listed = values.tolist() if hasattr(values, "tolist") else list(values)
                out.append([None if _missing(v) else v for v in listed])
            found[c] = arrow_type
            n = len(out[-1]) if n is None else n
        return out, found, n or 0
    raise TypeError(
        "a batch must be a pyarrow RecordBatch or Table, a pandas DataFrame, or a dict of "
        f"arrays, not {type(batch).__module__}.{type(batch).__qualname__}"
    )


# --------------------------------------------------------------------- aggregate functions


class _Agg:
    """One aggregate over Python values: its initial state, fold, merge and final value."""

    def __init__(self, request: F.AggregateRequest, arrow_type: pa.DataType | None, typed: bool):
        self.output = request.output
        self.func = request.func
        self.column = request.column
        self.input_type = arrow_type
        self.out_type: pa.DataType | None
        if request.column is None or self.func == "count" or self.func == "count_distinct":
            self.out_type = pa.int64()
        elif typed:  # a column the columnar engine types: its result type, its checks
            assert arrow_type is not None
            empty = pa.array([], type=_storage_type(arrow_type))
            self.out_type = F.resolve(request, to_column(request.column, empty)).output_type
        elif self.func in F.VAR_FUNCTIONS:
            self.out_type = None if arrow_type is None else _storage_type(arrow_type)
        elif self.func != "sum" and (arrow_type is None or pa.types.is_null(arrow_type)):
            self.out_type = pa.float64()  # mean, var, std of Python numbers (or of nulls)
        elif arrow_type is None:
            self.out_type = None  # the sum of Python numbers: typed by Arrow from the values
        elif pa.types.is_null(arrow_type):
            self.out_type = pa.int64()  # Spark: the sum of no values is a null long
        elif pa.types.is_decimal256(arrow_type):
            raise TypeError(
                f"aggregate {self.output!r}: {self.func}({self.column!r}) is not supported for "
                f"column {self.column!r} of type {arrow_type}: {self.func} takes decimals of "
                "up to 38 digits, as Spark's (files whose decimals need more together, such "
                "as decimal(38, 10) beside decimal(38, 0), unify past 38); cast the column to "
                "decimal(38, s) or float64"
            )
        else:
            raise TypeError(
                f"aggregate {self.output!r}: {self.func}({self.column!r}) is not supported for "
                f"column {self.column!r} of type {arrow_type}; {self.func} needs numbers"
            )

    def describe(self) -> str:
        t = "values of no single Arrow type" if self.input_type is None else self.input_type
        return f"aggregate {self.output!r}: {self.func}({self.column!r}) of column of type {t}"


def _new_state(func: str) -> Any:
    if func in ("count", "count_star", "count_distinct"):
        return 0
    if func in ("sum",):
        return None
    if func == "mean":
        return [None, 0]
    if func in F.VAR_FUNCTIONS or func.startswith(("first", "last")):
        return None
    return [0, 0.0, 0.0]  # var family: n, mean, m2


def _nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _fold(func: str, state: Any, v: Any, seq: int) -> Any:
    """``state`` after one more value ``v`` (row number ``seq``)."""
    if func == "count_star":
        return state + 1
    if func == "count":
        return state + (v is not None)
    if func == "count_distinct":
        return state
    if func in ("first", "last"):
        return _pick(func, state, (seq, v))
    if v is None:
        return state
    if func in ("first_non_null", "last_non_null"):
        return _pick(func, state, (seq, v))
    if isinstance(v, bool) and func not in ("min", "max"):
        v = int(v)
    if func == "sum":
        return v if state is None else state + v
    if func == "mean":
        state[0] = v if state[0] is None else state[0] + v
        state[1] += 1
        return state
    if func in ("min", "max"):
        return v if state is None else _better(func, state, v)
    n, mean, m2 = state  # Welford
    x = float(v)
    n += 1
    delta = x - mean
    mean += delta / n
    return [n, mean, m2 + delta * (x - mean)]


def _pick(func: str, state: Any, candidate: tuple[int, Any]) -> Any:
    if state is None:
        return candidate
    if func.startswith("first"):
        return candidate if candidate[0] < state[0] else state
    return candidate if candidate[0] > state[0] else state


def _better(func: str, a: Any, b: Any) -> Any:
    """``min``/``max`` of two non-null values; NaN is greater than every number (Spark)."""
    if _nan(a) or _nan(b):
        if func == "max":
            return a if _nan(a) else b
        return b if _nan(a) else a
    if isinstance(a, _NESTED) or isinstance(b, _NESTED):
        key_a, key_b = _nested_order(a), _nested_order(b)
        if func == "min":
            return b if key_b < key_a else a
        return b if key_b > key_a else a
    if func == "min":
        return b if b < a else a
    return b if b > a else a


_NESTED = (list, tuple, dict)


def _nested_order(value: Any) -> Any:
    """``value`` (a list, a struct's dict) as a key that orders it as DuckDB does: element
    by element (a struct's fields in order), a NaN inside after every number and a null
    after every value — Python's own comparison of ``[1, None]`` with ``[1, 2]`` raised
    ``TypeError``, and a NaN compared neither less nor greater, so ``min`` of ``[nan]`` and
    ``[1.0]`` was whichever came first."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return tuple(
            (2,) if item is None else (1,) if _nan(item) else (0, _nested_order(item))
            for item in value
        )
    return value


def _merge(func: str, a: Any, b: Any) -> Any:
    """Two states of one group merged."""
    if func in ("count", "count_star", "count_distinct"):
        return a + b
    if func.startswith(("first", "last")):
        return b if a is None else a if b is None else _pick(func, a, b)
    if func == "sum":
        return b if a is None else a if b is None else a + b
    if func == "mean":
        if b[0] is None:
            return a
        if a[0] is None:
            return b
        return [a[0] + b[0], a[1] + b[1]]
    if func in ("min", "max"):
        return b if a is None else a if b is None else _better(func, a, b)
    (na, ma, m2a), (nb, mb, m2b) = a, b  # Chan et al.
    if na == 0:
        return b
    if nb == 0:
        return a
    n = na + nb
    delta = mb - ma
    return [n, ma + delta * nb / n, m2a + m2b + delta * delta * na * nb / n]


def _final(agg: _Agg, state: Any, key: tuple[Any, ...], keys: Sequence[str]) -> Any:
    func = agg.func
    if func in ("count", "count_star", "count_distinct"):
        return state
    if func.startswith(("first", "last")):
        return None if state is None else state[1]
    if func == "sum":
        if state is None:
            return None
        out = agg.out_type
        if out is not None and pa.types.is_integer(out) and not _I64[0] <= state <= _I64[1]:
            group = dict(zip(keys, key))
            raise SumOverflowError(
                f"aggregate {agg.output!r}: the sum of column {agg.column!r} is {state} in "
                f"group {group}, outside int64"
            )
        return state
    if func == "mean":
        total, n = state
        if total is None:
            return None
        if isinstance(total, decimal.Decimal):
            out = agg.out_type
            scale = out.scale if out is not None and pa.types.is_decimal(out) else 4
            with decimal.localcontext() as ctx:
                ctx.prec = 80
                return (total / n).quantize(
                    decimal.Decimal(1).scaleb(-scale), decimal.ROUND_HALF_UP
                )
        return total / n
    if func in ("min", "max"):
        return state
    n, _mean, m2 = state
    pop = func.endswith("_pop")
    if n < (1 if pop else 2):
        return None
    var = m2 / (n if pop else n - 1)
    return math.sqrt(var) if func.startswith("std") else var


# --------------------------------------------------------------------- the aggregator


class ObjectAggregator:
    """GROUP BY over columns the columnar engine cannot type, in the generic engine (see the
    module docstring); the interface of :class:`~extagg.columnar.HashAggregator`
    (``update``, ``results``, ``close``, ``schema``, ``metrics``, ``input_columns``).

    Parameters
    ----------
    keys
        The key column(s); empty for one global row.
    aggs
        Output name -> ``(column, function)``; ``("*", "count")`` counts rows.
    memory
        A private budget (``"256m"`` or bytes).
    memory_manager
        The memory manager (or task memory manager) to take memory from instead.
    spill_dirs
        Spill directories.
    force_spill_rows
        Test knob: spill after this many rows.
    name
        Name of the maps in logs and errors.
    **options
        ``fan_in``, ``compression``, ``max_spill_bytes`` for the maps; the columnar engine's
        tuning options (``batch_size``, ``chunk_rows``, ``threads``) are accepted and unused.

    Raises
    ------
    TypeError
        An aggregate that needs numbers over a nested column (naming the aggregate, the column
        and its type); values Python cannot add or order; results Arrow cannot hold in one
        column (naming it and the value types found).
    """

    def __init__(
        self,
        keys: str | Sequence[str],
        aggs: Mapping[str, tuple[str, str]],
        *,
        memory: int | str | None = None,
        memory_manager: Any = None,
        spill_dirs: Iterable[str] | str | None = None,
        force_spill_rows: int | None = None,
        name: str | None = None,
        **options: Any,
    ) -> None:
        self.keys = key_names(keys)
        if not all(isinstance(k, str) for k in self.keys):
            raise TypeError(f"keys must be column names (strings), got {keys!r}")
        self._requests = F.parse_aggs(aggs, distinct=True)
        quantiles = [r for r in self._requests if r.func in F.QUANTILE_FUNCTIONS]
        if quantiles:  # they sort each group's values, a columnar engine's external sort
            raise QueryError(
                f"aggregate {quantiles[0].output!r}: {quantiles[0].func} is computed by the "
                "columnar engine only, and this query goes to the generic one (a key or "
                "column of nested or mixed values); group by typed columns, or compute "
                "the quantile apart"
            )
        clash = {r.output for r in self._requests} & set(self.keys)
        if clash:
            raise ValueError(f"aggregate outputs {sorted(clash)} have the names of key columns")
        unknown = set(options) - {"fan_in", "compression", "max_spill_bytes", *_COLUMNAR_ONLY}
        if unknown:
            raise TypeError(f"ObjectAggregator got unexpected options {sorted(unknown)}")
        self._map_options = {k: v for k, v in options.items() if k not in _COLUMNAR_ONLY}
        self._map_options.update(spill_dirs=spill_dirs, force_spill_every=force_spill_rows)
        self._tmm = resolve_task_memory_manager(memory, memory_manager)
        self.name = name or "ObjectAggregator"
        values = [r.column for r in self._requests if r.column is not None]
        self._needed = list(dict.fromkeys([*self.keys, *values]))
        self._types: dict[str, pa.DataType | None] | None = None
        self._aggs: list[_Agg] = []
        self._funcs: list[str] = []
        self._distinct: list[int] = []  # indices of the count_distinct aggregates
        self._main: ExternalAppendOnlyMap | None = None
        self._pairs: ExternalAppendOnlyMap | None = None
        self._join: ExternalAppendOnlyMap | None = None
        self._rows = 0
        self._groups = 0
        self._state = "open"
        #: each untyped key column's Python value types seen, with a value of each
        self._value_kinds: dict[str, dict[type, Any]] = {}

    # -- the HashAggregator interface ----------------------------------------------------------

    @property
    def input_columns(self) -> list[str]:
        """The input columns the query reads (keys, then aggregated columns)."""
        return list(self._needed)

    @property
    def schema(self) -> pa.Schema | None:
        """The output schema (known after the first ``update``; a column whose values have no
        Arrow type of their own is typed from the first result batch)."""
        if self._types is None:
            return None
        types = {
            k: pa.null()
            if t is None
            else t
            if isinstance(t, pa.BaseExtensionType)  # a key keeps its extension type
            else _storage_type(t)
            for k, t in self._types.items()
        }
        fields = [pa.field(k, types[k]) for k in self.keys]
        fields += [pa.field(a.output, a.out_type or pa.null()) for a in self._aggs]
        return pa.schema(fields)

    @property
    def metrics(self) -> SpillMetrics:
        """The counters of its maps added up (peaks: the largest)."""
        total = SpillMetrics()
        for m in (self._main, self._pairs, self._join):
            if m is None:
                continue
            for field, value in vars(m.metrics).items():
                if field.startswith("peak"):
                    setattr(total, field, max(getattr(total, field), value))
                elif field not in ("records_read", "groups"):
                    setattr(total, field, getattr(total, field) + value)
        total.records_read = self._rows
        total.groups = self._groups
        return total

    def _map(self, combine: Aggregator[Any, Any], part: str) -> ExternalAppendOnlyMap:
        return ExternalAppendOnlyMap(
            combine, memory_manager=self._tmm, name=f"{self.name}/{part}", **self._map_options
        )

    def _init(self, types: dict[str, pa.DataType | None]) -> None:
        self._types = dict(types)
        for r in self._requests:
            arrow_type = None if r.column is None else types[r.column]
            typed = r.column is not None and typed_by_columnar(arrow_type)
            self._aggs.append(_Agg(r, arrow_type, typed))
        self._funcs = [
            "count_star" if r.column is None else r.func for r in self._requests
        ]  # fmt: skip
        self._distinct = [i for i, f in enumerate(self._funcs) if f == "count_distinct"]
        funcs = self._funcs

        def create(v: tuple[int, tuple[Any, ...]]) -> list[Any]:
            return merge_value([_new_state(f) for f in funcs], v)

        def merge_value(c: list[Any], v: tuple[int, tuple[Any, ...]]) -> list[Any]:
            seq, row = v
            for i, f in enumerate(funcs):
                c[i] = _fold(f, c[i], row[i], seq)
            return c

        def merge_combiners(a: list[Any], b: list[Any]) -> list[Any]:
            for i, f in enumerate(funcs):
                a[i] = _merge(f, a[i], b[i])
            return a

        self._main = self._map(Aggregator(create, merge_value, merge_combiners), "groups")
        if self._distinct:
            self._pairs = self._map(Aggregator(_none, _none2, _none2), "distinct")
        log.info(
            "%s: columns %s are not typed by the columnar engine; aggregating in the generic "
            "engine", self.name, [c for c, t in types.items() if not typed_by_columnar(t)],
        )  # fmt: skip

    def update(self, batch: Any) -> None:
        """Fold one batch (pyarrow RecordBatch/Table, pandas DataFrame or dict of arrays)."""
        if self._state != "open":
            raise UsageError(f"{self.name}: update() after results() or close()")
        parts = (
            iter_record_batches(batch) if isinstance(batch, (pa.RecordBatch, pa.Table)) else [batch]
        )
        for part in parts:
            lists, types, n = _python_columns(part, self._needed, self._types)
            if self._types is None:
                self._init(types)
            else:
                self._check_types(types)
            assert self._main is not None
            self._fold(lists, n, {k for k in self.keys if types[k] is not None})

    def _check_types(self, types: dict[str, pa.DataType | None]) -> None:
        assert self._types is not None
        for name, t in types.items():
            was = self._types[name]
            if t is not None and was is not None and _storage_type(t) != _storage_type(was):
                raise TypeError(
                    f"column {name!r} changed type between update() calls: it was {was}, "
                    f"this batch has {t}"
                )

    def _fold(self, lists: list[list[Any]], n: int, typed_keys: set[str]) -> None:
        """Fold a batch's columns; ``typed_keys``: its key columns of one Arrow type."""
        assert self._types is not None and self._main is not None
        cols = dict(zip(self._needed, lists))
        for name in self.keys:  # before freezing: it makes lists of any value (``'ab'``)
            self._check_one_column(name, cols[name], typed=name in typed_keys)
        for name in self._needed:
            freeze = _freezer(self._types[name])
            if freeze is not None:
                cols[name] = [freeze(v) for v in cols[name]]
        key_cols = [cols[k] for k in self.keys]
        keys = list(zip(*key_cols)) if key_cols else [()] * n
        value_cols = [
            itertools.repeat(None, n) if r.column is None else cols[r.column]
            for r in self._requests
        ]
        rows: Iterable[tuple[Any, ...]] = zip(*value_cols) if value_cols else [()] * n
        start = self._rows
        try:
            self._main.insert_all(zip(keys, zip(range(start, start + n), rows)))
        except TypeError as exc:  # values Python cannot add or order
            raise TypeError(f"{self._culprit(exc)}: {exc}") from exc
        if self._pairs is not None:
            for i in self._distinct:
                column = cols[self._requests[i].column or ""]
                self._pairs.insert_all(
                    ((k, i, v), None) for k, v in zip(keys, column) if v is not None
                )
        self._rows += n

    def _check_one_column(self, name: str, values: list[Any], typed: bool) -> None:
        """Refuse a key column of Python values that no one Arrow column can hold (``1`` and
        ``'a'``) at the batch that mixes them, also with an earlier batch: the result's
        conversion found it only after every row had been folded (and spilled). ``typed``:
        the batch's values have one Arrow type (one of them stands for all)."""
        seen = self._value_kinds.setdefault(name, {})
        before = len(seen)
        if typed:  # one value stands for all
            values = [next((v for v in values if v is not None), None)]
        for v in values:
            kind = tuple if type(v) is list else type(v)  # a list column's values, as tuples
            if v is not None and kind not in seen:
                seen[kind] = v
        if len(seen) > 1 and len(seen) != before:
            try:
                pa.array(list(seen.values()), from_pandas=False)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
                kinds = sorted(t.__name__ for t in seen)
                raise TypeError(
                    f"key column {name!r} holds values of types {kinds} (e.g. "
                    f"{', '.join(repr(v) for v in seen.values())}) that no one Arrow column "
                    "can hold, so the result could not be made; convert the column to one "
                    "type first (df[col].astype(str))"
                ) from None

    def _culprit(self, exc: TypeError) -> str:
        for agg in self._aggs:
            if agg.func in ("sum", "mean", "min", "max") or agg.func.startswith(("var", "std")):
                return agg.describe()
        return self.name

    def results(self) -> Iterator[pa.RecordBatch]:
        """Every group once, in the generic engine's key-hash order. Destructive; call once."""
        if self._state != "open":
            raise UsageError("results() can be called only once, before close()")
        self._state = "reading"
        return self._results()

    def _results(self) -> Iterator[pa.RecordBatch]:
        try:
            if self._types is None:  # no input at all: the types come from no batch
                self._init({c: pa.null() for c in self._needed})
            assert self._main is not None
            groups = self._main.iterator(ordered=True) if self._pairs is None else self._joined()
            empty_global = not self.keys and self._rows == 0
            if empty_global:  # a global aggregate of no rows: one row
                groups = iter([((), [_new_state(f) for f in self._funcs])])
            self._groups = 0
            for chunk in _chunks(groups, RESULT_ROWS):
                batch = self._batch(chunk)
                self._groups += batch.num_rows
                yield batch
        finally:
            self.close()

    def _joined(self) -> Iterator[tuple[Any, list[Any]]]:
        """The groups' states with their distinct counts: both maps streamed into a third."""
        assert self._main is not None and self._pairs is not None
        self._join = self._map(Aggregator(_join_create, _join_value, _join_merge), "join")
        self._join.insert_all((k, c) for k, c in self._main.iterator())
        self._main.close()
        self._join.insert_all((k, i) for (k, i, _v), _none in self._pairs.iterator())
        self._pairs.close()
        for key, (states, counts) in self._join.iterator(ordered=True):
            for i, n in counts.items():
                states[i] = n
            yield key, states

    def _batch(self, chunk: list[tuple[Any, list[Any]]]) -> pa.RecordBatch:
        assert self._types is not None
        arrays = []
        names = [*self.keys, *(a.output for a in self._aggs)]
        for j, name in enumerate(self.keys):
            arrays.append(self._array(name, [key[j] for key, _ in chunk], self._types[name]))
        for i, agg in enumerate(self._aggs):
            values = [_final(agg, states[i], key, self.keys) for key, states in chunk]
            arr = self._array(agg.output, values, agg.out_type)
            agg.out_type = arr.type
            arrays.append(arr)
        for j, name in enumerate(self.keys):
            self._types[name] = arrays[j].type
        return pa.RecordBatch.from_arrays(arrays, names=names)

    @staticmethod
    def _array(name: str, values: list[Any], arrow_type: pa.DataType | None) -> pa.Array:
        t = None if arrow_type is None else _storage_type(arrow_type)
        try:
            arr = pa.array(values, type=t, from_pandas=False)
            if isinstance(arrow_type, pa.BaseExtensionType) and arr.type == arrow_type.storage_type:
                return pa.ExtensionArray.from_storage(arrow_type, arr)  # the key's own type
            return arr
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
            kinds = sorted({type(v).__name__ for v in values if v is not None})
            if isinstance(exc, OverflowError) and set(kinds) <= {"int", "bool"}:
                raise TypeError(
                    f"result column {name!r} holds integers past 64 bits, which no Arrow "
                    "integer column can hold; make the input column Decimal or float values "
                    "first"
                ) from exc
            raise TypeError(
                f"result column {name!r} holds values of types {kinds} that no one Arrow "
                f"column{'' if t is None else f' of type {t}'} can hold ({exc}); convert the "
                "input column to one type first"
            ) from exc

    def close(self) -> None:
        """Close every map (memory released, run files deleted). Idempotent."""
        self._state = "closed"
        for m in (self._main, self._pairs, self._join):
            if m is not None:
                m.close()

    def __enter__(self) -> ObjectAggregator:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


def _chunks(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    while True:
        chunk = list(itertools.islice(items, size))
        if not chunk:
            return
        yield chunk


def _none(_v: Any) -> None:
    return None


def _none2(_a: Any, _b: Any) -> None:
    return None


def _join_create(v: Any) -> list[Any]:
    return _join_value([None, {}], v)


def _join_value(c: list[Any], v: Any) -> list[Any]:
    if isinstance(v, int):  # one distinct value of aggregate v
        c[1][v] = c[1].get(v, 0) + 1
    else:  # the group's states
        c[0] = v
    return c


def _join_merge(a: list[Any], b: list[Any]) -> list[Any]:
    if a[0] is None:
        a[0] = b[0]
    for i, n in b[1].items():
        a[1][i] = a[1].get(i, 0) + n
    return a

"""DataFrame aggregation through Arrow: partial states per partition, a shuffle, a final merge.

``aggregate(df, by, aggs)`` runs the columnar engine (:class:`extagg.HashAggregator`) twice:

1. each input partition is folded into *partial states* in a ``mapInArrow`` — ``sum`` and
   ``count`` for ``mean``; the ``(count, mean, M2)`` moments for ``var``/``std`` (one binary
   ``var_state`` value, :data:`extagg.columnar.functions.VAR_STATE`); the partition's own
   first/last value for ``first``/``last`` (tagged with the partition index so the final merge
   sees partitions in order);
2. the partial rows are shuffled on the keys (``repartition``) and merged in a second
   ``mapInArrow``: sums of sums and counts, min of mins, first of firsts, moments by Chan's
   formula (as Spark's own ``CentralMomentAgg`` merges them), ...; then finished
   (``mean = sum / n``, ``var = M2 / (N − 1)``, ...).

Function names are those of :mod:`extagg.columnar.functions` (``count``, ``sum``, ``mean``/
``avg``, ``min``, ``max``, ``first``, ``last``, ``first_non_null``, ``last_non_null``, ``var``,
``var_pop``, ``std``, ``std_pop`` and aliases), and ``count_distinct``: each partition's
distinct (keys, value) pairs are partial rows of their own kind (:data:`ROW_KIND_COLUMN`), which
the final stage counts with a :class:`~extagg.columnar.distinct.DistinctAggregator` beside the
merged states. Quantiles (``median``, ``percentile``/``quantile_cont``,
``percentile_approx``/``quantile_disc``) have no partial state smaller than their values:
each partition sends its (keys, value, how many times) rows, and the final stage sorts each
group's values (each as many times as it came) beside the merged states, in the same budget.
Result types follow Spark SQL: decimals are
keys and values as they are, ``sum`` of ``decimal(p, s)`` an exact ``decimal(p + 10, s)`` and
``avg`` an exact ``decimal(p + 4, s + 4)`` rounded half up (each capped at 38). Float keys are
normalised as Spark's ``groupBy`` does (``-0.0`` is ``0.0``, every NaN one group).
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from extagg._config import parse_size
from extagg.columnar import HashAggregator
from extagg.columnar.columns import column_kind, to_column
from extagg.columnar.distinct import DistinctAggregator
from extagg.columnar.functions import (
    NO_AGGREGATES,
    QUANTILE_FUNCTIONS,
    VAR_STATE,
    agg_mapping,
    divide_decimal,
    finish_var_states,
    mean_half_up,
    parse_aggs,
    resolve,
)
from extagg.errors import SumOverflowError
from extagg.memory import check_engine_budget, resolve_task_memory_manager
from extagg.spark.merger import report_spill
from extagg.spark.settings import local_workers_run_this_python, worker_budget

__all__ = [
    "AggregationPlan",
    "aggregate",
    "partial_aggregate",
    "final_aggregate",
]

log = logging.getLogger(__name__)

PARTITION_COLUMN = "__extagg_partition"
#: with ``count_distinct`` or quantiles: 0 for a row of partial states, ``k`` for a distinct
#: (keys, value) pair of the ``k``-th ``count_distinct``, then ``len(distinct) + j`` for a (keys,
#: value, weight) row of the ``j``-th quantile column
ROW_KIND_COLUMN = "__extagg_row"
#: the rows of a quantile's values a final stage expands a weighted row to at a time
EXPAND_ROWS = 1 << 16
_ORDERED_FUNCS = ("first", "last", "first_non_null", "last_non_null")
_VAR_FUNCS = ("var", "var_pop", "std", "std_pop")


@dataclass
class _Output:
    """One requested output and the partial/final columns behind it."""

    output: str
    func: str
    column: str | None
    partial: dict[str, tuple[str, str]] = field(default_factory=dict)
    final: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Distinct:
    """A ``count_distinct``: its pairs' value column in the partial rows (``state``), the
    input column they are grouped by in the partial stage (``source``: the column itself, or
    its copy with ``-0.0`` as ``0.0`` for floats)."""

    output: str
    column: str
    state: str
    source: str


@dataclass
class _QuantileColumn:
    """A column whose quantiles are asked for: each partition's (keys, value, weight) rows carry
    its value as ``value`` and how many rows held it as ``weight``; ``count`` is the partial
    state counting its non-null values (summed in the final stage: the sorted values per
    group). ``outputs``: the quantile outputs of the column."""

    column: str
    value: str
    weight: str
    count: str
    outputs: list[str] = field(default_factory=list)


def _spark_types() -> Any:
    from pyspark.sql import types

    return types


def _result_type(func: str, input_type: Any) -> Any:
    """The Spark SQL type of ``func(column)`` (``input_type`` None for ``count(*)``)."""
    T = _spark_types()
    if func in ("count", "count_distinct"):
        return T.LongType()
    if isinstance(input_type, T.DayTimeIntervalType) and func in ("sum", "mean"):
        return input_type if func == "sum" else T.DayTimeIntervalType()  # as Spark's own
    if isinstance(input_type, T.DecimalType) and func in ("sum", "mean"):
        p, s = input_type.precision, input_type.scale
        if func == "sum":
            return T.DecimalType(min(38, p + 10), s)
        return T.DecimalType(min(38, p + 4), min(38, s + 4))
    if func == "sum":
        if isinstance(input_type, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
            return T.LongType()
        if isinstance(input_type, T.BooleanType):
            return T.LongType()
        return T.DoubleType()
    if func == "mean" or func in _VAR_FUNCS:
        return T.DoubleType()
    if func == "quantile_cont":  # Spark's percentile / median
        if isinstance(input_type, (T.DayTimeIntervalType, T.YearMonthIntervalType)):
            return input_type
        return T.DoubleType()
    return input_type  # min, max, first, last, quantile_disc keep the input type


class AggregationPlan:
    """How ``aggs`` over a DataFrame schema split into partial and final columnar aggregations.

    ``partial_schema`` / ``final_schema`` are the Spark schemas of the two ``mapInArrow``
    stages; :meth:`partial` and :meth:`final` are their functions (iterator of Arrow batches in,
    iterator out).

    Parameters
    ----------
    schema
        The Spark schema (``StructType``) of the input DataFrame.
    by
        The key column(s).
    aggs
        Output name -> ``(column, function)``; ``("*", "count")`` counts rows. Or the
        ``extagg aggregate --agg`` texts: ``["n=count(*)", "revenue=sum(amount)"]``.
    memory
        Each task's budget in bytes.
    force_spill_rows
        Testing aid: spill after every this many rows, so that spill paths run on small data.
    timezone
        The session's time zone (``spark.sql.session.timeZone``): Arrow's type of a
        ``timestamp`` column names it (``UTC`` if not given).

    Raises
    ------
    ValueError
        No key column, or an unknown column or function.
    """

    def __init__(
        self,
        schema: Any,
        by: Sequence[str],
        aggs: Mapping[str, tuple[str, str]] | Sequence[str] | str,
        memory: int,
        force_spill_rows: int | None = None,
        timezone: str | None = None,
    ) -> None:
        T = _spark_types()
        self.by = [by] if isinstance(by, str) else list(by)
        self.memory = memory
        self.force_spill_rows = force_spill_rows
        #: the session's time zone: Arrow's type of a ``timestamp`` column names it
        self.timezone = timezone
        fields = {f.name: f for f in schema.fields}
        missing = [c for c in self.by if c not in fields]
        requests = parse_aggs(agg_mapping(aggs), distinct=True)
        clash = sorted({r.output for r in requests} & set(self.by))
        if clash:
            raise ValueError(
                f"aggregate output(s) {clash} have the name of a key column: give them other "
                "names (the result has one column per key and per output)"
            )
        missing += [r.column for r in requests if r.column is not None and r.column not in fields]
        if missing:
            raise ValueError(
                f"columns {sorted(set(missing))} are not in the DataFrame (it has {list(fields)})"
            )
        #: the input columns the stages read: the rest are not sent to the workers
        self.columns_read = list(
            dict.fromkeys([*self.by, *(r.column for r in requests if r.column is not None)])
        )
        dotted = [c for c in [*self.columns_read, *(r.output for r in requests)] if "." in c]
        if dotted:
            raise ValueError(
                f"column name(s) {dotted} hold a dot, which PySpark's mapInArrow/mapInPandas "
                "read as a struct's field (UNRESOLVED_COLUMN); rename them first, e.g. "
                f"df.withColumnRenamed({dotted[0]!r}, {dotted[0].replace('.', '_')!r})"
            )
        self._check_types(fields, requests)
        self.outputs: list[_Output] = []
        #: state column -> integer input column a mean/var/std sums as doubles, as Spark's
        #: ``avg`` does (its int64 sum overflowed where Spark answers: 2^62 + 2^62 + 7)
        self.float_inputs: dict[str, str] = {}
        #: the count_distinct outputs, in order (their pairs' row kind is the index + 1)
        self.distinct: list[_Distinct] = []
        #: the columns with quantiles, in order (row kind ``len(distinct)`` + the index + 1)
        self.quantiles: dict[str, _QuantileColumn] = {}
        #: quantile output -> its final aggregate (value state, ``quantile_cont(0.5)``)
        self._quantile_aggs: dict[str, tuple[str, str]] = {}
        partial_fields = [fields[c] for c in self.by]
        final_fields = [fields[c] for c in self.by]
        for r in requests:
            in_type = None if r.column is None else fields[r.column].dataType
            o = _Output(r.output, r.func, r.column)
            col = r.column or "*"
            p = f"__{r.output}"
            if r.func == "count_distinct":
                assert r.column is not None
                floating = isinstance(in_type, (T.FloatType, T.DoubleType))
                source = f"{p}_d" if floating else r.column  # floats: -0.0 is 0.0 (_prepare)
                self.distinct.append(_Distinct(r.output, r.column, f"{p}_d", source))
                partial_fields.append(T.StructField(f"{p}_d", in_type))
            elif r.func in QUANTILE_FUNCTIONS:
                assert r.column is not None
                # Spark's percentile sorts and interpolates decimals and floats as doubles
                doubles = r.func == "quantile_cont" and isinstance(
                    in_type, (T.DecimalType, T.FloatType)
                )
                source = f"__extagg_x_{r.column}" if doubles else r.column
                if source not in self.quantiles:
                    q = f"__extagg_q{len(self.quantiles)}"
                    column = _QuantileColumn(source, f"{q}_v", f"{q}_w", f"{q}_n")
                    self.quantiles[source] = column
                    if doubles:
                        self.float_inputs[source] = r.column
                    partial_fields += [
                        T.StructField(column.value, T.DoubleType() if doubles else in_type),
                        T.StructField(column.weight, T.LongType()),
                        T.StructField(column.count, T.LongType()),
                    ]
                column = self.quantiles[source]
                column.outputs.append(r.output)
                self._quantile_aggs[r.output] = (column.value, f"{r.func}({r.fraction!r})")
            elif r.func == "count":
                o.partial = {f"{p}_n": (col, "count")}
                o.final = {f"{p}_n": (f"{p}_n", "sum")}
                partial_fields.append(T.StructField(f"{p}_n", T.LongType()))
            elif r.func == "sum":
                o.partial = {f"{p}_s": (col, "sum")}
                o.final = {f"{p}_s": (f"{p}_s", "sum")}
                partial_fields.append(T.StructField(f"{p}_s", _result_type("sum", in_type)))
            elif r.func in _VAR_FUNCS:
                o.partial = {f"{p}_m": (col, VAR_STATE)}
                o.final = {f"{p}_m": (f"{p}_m", VAR_STATE)}
                partial_fields.append(T.StructField(f"{p}_m", T.BinaryType()))
            elif r.func == "mean":
                summed, sum_type = col, _result_type("sum", in_type)
                if isinstance(sum_type, T.LongType):
                    summed, sum_type = f"{p}_x", T.DoubleType()
                    self.float_inputs[summed] = col
                o.partial = {f"{p}_s": (summed, "sum"), f"{p}_n": (col, "count")}
                o.final = {f"{p}_s": (f"{p}_s", "sum"), f"{p}_n": (f"{p}_n", "sum")}
                partial_fields += [
                    T.StructField(f"{p}_s", sum_type),
                    T.StructField(f"{p}_n", T.LongType()),
                ]
            else:  # min, max, first, last, first_non_null, last_non_null
                o.partial = {f"{p}_v": (col, r.func)}
                o.final = {f"{p}_v": (f"{p}_v", r.func)}
                partial_fields.append(T.StructField(f"{p}_v", in_type))
            # count is NOT NULL in Spark's result schema (a group has a count, 0 at least)
            nullable = r.func not in ("count", "count_distinct")
            final_fields.append(T.StructField(r.output, _result_type(r.func, in_type), nullable))
            self.outputs.append(o)
        self.ordered = any(o.func in _ORDERED_FUNCS for o in self.outputs)
        if self.ordered:
            partial_fields.append(T.StructField(PARTITION_COLUMN, T.IntegerType()))
        if self.distinct or self.quantiles:
            partial_fields.append(T.StructField(ROW_KIND_COLUMN, T.IntegerType(), False))
        self.partial_schema = T.StructType(partial_fields)
        extra = {PARTITION_COLUMN, ROW_KIND_COLUMN, *(d.state for d in self.distinct)}
        extra |= {c for q in self.quantiles.values() for c in (q.value, q.weight, q.count)}
        self.state_schema = T.StructType([f for f in partial_fields if f.name not in extra])
        self.final_schema = T.StructType(final_fields)
        self.float_keys = [
            c for c in self.by if isinstance(fields[c].dataType, (T.FloatType, T.DoubleType))
        ]

    def _check_types(self, fields: Mapping[str, Any], requests: Sequence[Any]) -> None:
        """Refuse a key or aggregate input type the engine does not take, at the call and
        named by the user's output: it failed in a worker, at ``collect()``, naming a partial
        state column (``'__o_s': sum('dt')`` for ``mean`` of a date)."""
        for name in self.by:
            arrow_type = self._arrow_type(name, fields[name].dataType)
            if column_kind(arrow_type) is None:
                raise TypeError(
                    f"key column {name!r} of type {fields[name].dataType.simpleString()} is "
                    "not supported by extagg.spark.aggregate (keys are numbers, bools, "
                    "decimals, strings, binaries, dates and timestamps)"
                )
        for r in requests:
            if r.column is None:
                continue
            arrow_type = self._arrow_type(r.column, fields[r.column].dataType)
            if column_kind(arrow_type) is None:
                raise TypeError(
                    f"aggregate {r.output!r}: {r.func}({r.column!r}) is not supported for column "
                    f"{r.column!r} of type {fields[r.column].dataType.simpleString()}"
                )
            if r.func == "quantile_cont" and not _interpolable(fields[r.column].dataType):
                raise TypeError(
                    f"aggregate {r.output!r}: {r.func}({r.column!r}) (Spark's percentile/median) "
                    f"needs numbers or intervals, not {fields[r.column].dataType.simpleString()}; "
                    "quantile_disc (percentile_approx) takes any sortable column"
                )
            if r.func not in ("count_distinct", *QUANTILE_FUNCTIONS):  # keys there: any kind
                resolve(r, to_column(r.column, pa.array([], arrow_type)))  # TypeError if refused

    def _arrow_type(self, name: str, data_type: Any) -> pa.DataType:
        T = _spark_types()
        try:
            schema = self._arrow(T.StructType([T.StructField(name, data_type)]))
        except Exception as exc:  # PySpark's own "not supported" for the type
            raise TypeError(
                f"column {name!r} of type {data_type.simpleString()} is not supported by "
                f"extagg.spark.aggregate: {exc}"
            ) from exc
        return schema.field(0).type

    # ------------------------------------------------------------------ stage functions
    def _arrow(self, schema: Any) -> pa.Schema:
        from pyspark.sql.pandas.types import to_arrow_schema

        try:  # PySpark 4 asserts a zone is given for a timestamp column
            return to_arrow_schema(schema, timezone=self.timezone or "UTC")
        except TypeError:  # pragma: no cover - PySpark 3: timestamps in UTC, no argument
            return to_arrow_schema(schema)

    def partial(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Fold one partition's batches into partial states (one row per group)."""
        aggs = {k: v for o in self.outputs for k, v in o.partial.items()}
        target = self._arrow(self.partial_schema)
        partition = _partition_id() if self.ordered else None
        if self.float_inputs:
            batches = map(self._with_float_inputs, batches)
        for q in self.quantiles.values():  # the values each group's quantiles sort
            aggs[q.count] = (q.column, "count")
        if not (self.distinct or self.quantiles):
            agg = self._aggregator(aggs)
            finish = functools.partial(self._with_partition, partition=partition)
            yield from self._run(agg, batches, target, finish)
            return
        yield from self._partial_with_pairs(batches, aggs, target, partition)

    def _aggregator(
        self,
        aggs: Mapping[str, Any],
        keys: Sequence[str] | None = None,
        memory_manager: Any = None,
    ) -> Any:
        """A stage's aggregator of ``aggs`` by ``keys`` (default the plan's), with the plan's
        budget or a share of ``memory_manager``'s, on one thread: Spark already runs a task
        per core."""
        memory = None if memory_manager is not None else self.memory
        options = {"memory": memory, "memory_manager": memory_manager, "threads": 1,
                   "force_spill_rows": self.force_spill_rows}  # fmt: skip
        levels = [spec[1] == "count_distinct" or out in self._quantile_aggs
                  for out, spec in aggs.items()]  # fmt: skip
        if any(levels):
            counts = {q.value: (q.count, "sum") for q in self.quantiles.values()}
            return DistinctAggregator(
                self.by, aggs, quantile_counts=counts, spark_percentile=True, **options
            )
        return HashAggregator(keys or self.by, aggs, **options)

    def _partial_with_pairs(
        self,
        batches: Iterable[pa.RecordBatch],
        aggs: Mapping[str, Any],
        target: pa.Schema,
        partition: int | None,
    ) -> Iterator[pa.RecordBatch]:
        """The partial states (row kind 0), then each ``count_distinct``'s distinct (keys,
        value) pairs of the partition (row kind ``k``), then each quantile column's (keys,
        value, weight) rows: one budget shared by their aggregators, read one after the
        other."""
        tmm = resolve_task_memory_manager(self.memory, None)
        plain = None
        pairs: list[Any] = []
        try:
            plain = self._aggregator(aggs, memory_manager=tmm) if aggs else None
            for d in self.distinct:
                keys = self.by if d.source in self.by else [*self.by, d.source]
                pairs.append(self._aggregator(NO_AGGREGATES, keys=keys, memory_manager=tmm))
            for q in self.quantiles.values():
                keys = self.by if q.column in self.by else [*self.by, q.column]
                weights = {q.weight: ("*", "count")}
                pairs.append(self._aggregator(weights, keys=keys, memory_manager=tmm))
            values = [q.column for q in self.quantiles.values()]
            for batch in batches:
                if not batch.num_rows:
                    continue
                if plain is not None:
                    plain.update(batch)
                for agg in pairs[: len(self.distinct)]:
                    agg.update(batch)
                for column, agg in zip(values, pairs[len(self.distinct) :], strict=True):
                    present = batch.filter(pc.is_valid(batch.column(column)))
                    if present.num_rows:  # a quantile leaves nulls out
                        agg.update(present)
            if plain is not None:
                yield from self._run(plain, (), target, self._rows_of_kind(0, partition))
            renamed = [{d.state: d.source} for d in self.distinct]
            renamed += [{q.value: q.column} for q in self.quantiles.values()]
            for kind, (names, agg) in enumerate(zip(renamed, pairs, strict=True), 1):
                rows = self._rows_of_kind(kind, partition, names)
                yield from self._run(agg, (), target, rows)
        finally:
            for agg in [plain, *pairs]:
                if agg is not None:
                    agg.close()

    def _rows_of_kind(
        self, kind: int, partition: int | None, renamed: Mapping[str, str] | None = None
    ) -> Callable[[pa.RecordBatch], dict[str, pa.Array]]:
        """The partial rows of ``kind`` from an aggregator's output batch: its columns (a
        ``count_distinct``'s or a quantile's value under its partial name), the row kind,
        nulls for the rest."""

        def finish(batch: pa.RecordBatch) -> dict[str, pa.Array]:
            columns = self._with_partition(batch, partition)
            for name, source in (renamed or {}).items():
                columns[name] = batch.column(source)
            columns[ROW_KIND_COLUMN] = pa.array(np.full(batch.num_rows, kind, np.int32))
            return columns

        return finish

    def _with_float_inputs(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` with the integer columns a mean/var/std sums as doubles beside it (past
        2^53 rounded, as Spark casts them)."""
        for name, column in self.float_inputs.items():
            values = pc.cast(batch.column(column), pa.float64(), safe=False)
            batch = batch.append_column(name, values)
        return batch

    def final(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Merge shuffled partial states into the results."""
        aggs: dict[str, tuple[str, str]] = {k: v for o in self.outputs for k, v in o.final.items()}
        aggs |= {d.output: (d.state, "count_distinct") for d in self.distinct}
        aggs |= self._quantile_aggs
        target = self._arrow(self.final_schema)
        agg = self._aggregator(aggs)
        feed = None
        if self.distinct or self.quantiles:
            feed = functools.partial(_route, agg, len(self.distinct), list(self.quantiles.values()))
        if not self.by:  # a global aggregate's one row, typed, also when no partial row came
            empty = pa.RecordBatch.from_pylist([], schema=self._arrow(self.partial_schema))
            batches = itertools.chain([empty], batches)
        yield from self._run(agg, batches, target, self._finish_final, feed)

    def final_states(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Merge shuffled partial states into one state row per group (not finished)."""
        self.check_states_kept()
        aggs = {k: v for o in self.outputs for k, v in o.final.items()}
        target = self._arrow(self.state_schema)
        yield from self._run(
            self._aggregator(aggs),
            batches,
            target,
            lambda b: {n: b.column(n) for n in b.schema.names},
        )

    def check_states_kept(self) -> None:
        """Refuse to keep merged states of a ``count_distinct`` or a quantile: its state is the
        set of its values (every value), which a running aggregate cannot keep between
        batches."""
        if self.quantiles:
            names = ", ".join(repr(o) for q in self.quantiles.values() for o in q.outputs)
            raise ValueError(
                f"quantiles ({names}) have no mergeable state to keep between batches (it "
                "would be every value): compute them with extagg.spark.aggregate"
            )
        if self.distinct:
            names = ", ".join(repr(d.output) for d in self.distinct)
            raise ValueError(
                f"count_distinct ({names}) has no mergeable state to keep between batches (it "
                "would be the set of its values): compute it with extagg.spark.aggregate"
            )

    def _run(
        self,
        agg: Any,
        batches: Iterable[pa.RecordBatch],
        target: pa.Schema,
        finish: Callable[[pa.RecordBatch], dict[str, pa.Array]],
        feed: Callable[[pa.RecordBatch], None] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Fold ``batches`` into ``agg`` (a ``HashAggregator`` or ``DistinctAggregator``; by
        ``feed`` if given, else ``agg.update``) and yield its results, each turned by
        ``finish`` into the columns of ``target``."""
        update = feed or agg.update
        with agg:
            try:
                for batch in batches:
                    if batch.num_rows or not self.by:
                        update(batch)
                for out in agg.results():
                    columns = finish(out)
                    yield pa.RecordBatch.from_arrays(
                        [self._column(columns, f, out.num_rows) for f in target], schema=target
                    )
            except SumOverflowError as exc:  # named by the user's outputs, not the states'
                raise SumOverflowError(self._public_names(str(exc)), exc.row) from exc
            report_spill(agg.metrics)
            if agg.metrics.spill_count:
                log.info("extagg.spark.aggregate stage: %s", agg.metrics.summary())

    def _column(self, columns: Mapping[str, pa.Array], target: pa.Field, rows: int) -> pa.Array:
        if target.name not in columns:  # a partial row's columns of the other row kinds
            return pa.nulls(rows, target.type)
        return self._fit(columns[target.name], target)

    @functools.cached_property
    def _final_arrow(self) -> pa.Schema:
        return self._arrow(self.final_schema)

    def _fit(self, column: pa.Array, target: pa.Field) -> pa.Array:
        """``column`` as ``target``'s type: a decimal sum of summed partial sums past the
        precision of Spark's sum (``decimal(p + 10, s)``) is a :class:`SumOverflowError`
        (Spark's ARITHMETIC_OVERFLOW), named by the output it is for."""
        try:
            return column.cast(target.type)
        except pa.ArrowInvalid:
            if not pa.types.is_decimal(target.type):
                raise
            raise SumOverflowError(
                self._public_names(
                    f"decimal overflow in aggregate {target.name!r}: the sum has more than "
                    f"{target.type.precision} digits (result type {target.type}, as Spark's "
                    "sum of a decimal)"
                )
            ) from None

    def _public_names(self, message: str) -> str:
        """``message`` with the partial and final state columns (``'__s_s'``) named by the
        output they are for (``'s'``), and as a column by the input column it sums (``'v'``:
        "sum of column 's'" named the output twice)."""
        for o in self.outputs:
            for state in (*o.partial, *o.final):
                if o.column is not None:
                    message = message.replace(f"column {state!r}", f"column {o.column!r}")
                message = message.replace(repr(state), repr(o.output))
        return message

    def _with_partition(self, batch: pa.RecordBatch, partition: int | None) -> dict[str, pa.Array]:
        columns = {name: batch.column(name) for name in batch.schema.names}
        if partition is not None:
            columns[PARTITION_COLUMN] = pa.array([partition] * batch.num_rows, pa.int32())
        return columns

    def _finish_final(self, batch: pa.RecordBatch) -> dict[str, pa.Array]:
        columns = {name: batch.column(name) for name in self.by}
        for o in self.outputs:
            p = f"__{o.output}"
            if o.func == "count":
                columns[o.output] = pc.fill_null(batch.column(f"{p}_n"), 0)
            elif o.func in ("count_distinct", *QUANTILE_FUNCTIONS):
                columns[o.output] = batch.column(o.output)
            elif o.func == "sum":
                columns[o.output] = batch.column(f"{p}_s")
            elif o.func == "mean" and pa.types.is_duration(batch.schema.field(f"{p}_s").type):
                columns[o.output] = _duration_mean(batch.column(f"{p}_s"), batch.column(f"{p}_n"))
            elif o.func == "mean" and pa.types.is_decimal(batch.schema.field(f"{p}_s").type):
                count = pc.fill_null(batch.column(f"{p}_n"), 0).to_numpy(zero_copy_only=False)
                out_type = self._final_arrow.field(o.output).type
                what = f"aggregate {o.output!r}: mean of column {o.column!r}"
                columns[o.output] = divide_decimal(batch.column(f"{p}_s"), count, out_type, what)
            elif o.func == "mean":
                n = pc.cast(pc.fill_null(batch.column(f"{p}_n"), 0), pa.float64())
                s = pc.cast(batch.column(f"{p}_s"), pa.float64(), safe=False)  # as Spark's avg
                columns[o.output] = pc.if_else(pc.greater(n, 0), pc.divide(s, n), None)
            elif o.func in _VAR_FUNCS:
                columns[o.output] = finish_var_states(batch.column(f"{p}_m"), o.func)
            else:
                columns[o.output] = batch.column(f"{p}_v")
        return columns


def _route(
    agg: Any, distinct: int, quantiles: Sequence[_QuantileColumn], batch: pa.RecordBatch
) -> None:
    """Feed partial rows to ``agg`` (a ``DistinctAggregator``): the states to its plain
    aggregates, the distinct pairs (row kinds 1 to ``distinct``) to its ``count_distinct``
    levels, each quantile column's weighted values to its quantiles, each value as many times
    as its weight."""
    kinds = batch.column(ROW_KIND_COLUMN)
    states = pc.equal(kinds, 0)
    if pc.any(states).as_py() or not batch.num_rows:  # none: the states' types, for one row
        agg.update_plain(batch.filter(states))
    if distinct:
        pairs = pc.and_(pc.greater(kinds, 0), pc.less_equal(kinds, distinct))
        if pc.any(pairs).as_py():
            agg.update_distinct(batch.filter(pairs))
    for kind, q in enumerate(quantiles, distinct + 1):
        weighted = batch.filter(pc.equal(kinds, kind))
        for values in _expanded(weighted, q.weight):
            agg.update_quantiles(values)


def _expanded(batch: pa.RecordBatch, weight: str) -> Iterator[pa.RecordBatch]:
    """``batch``'s rows, each as many times as its ``weight`` says, in batches of at most
    :data:`EXPAND_ROWS` rows (a value a partition held a million times is not a million rows
    at once)."""
    if not batch.num_rows:
        return
    ends = np.cumsum(pc.fill_null(batch.column(weight), 0).to_numpy(zero_copy_only=False))
    total = int(ends[-1])
    for start in range(0, total, EXPAND_ROWS):
        positions = np.arange(start, min(total, start + EXPAND_ROWS), dtype=np.int64)
        yield batch.take(pa.array(np.searchsorted(ends, positions, side="right")))


def _duration_mean(total: pa.Array, count: pa.Array) -> pa.Array:
    """The mean of a day-time interval from its summed partials, exact and rounded half up
    (Spark's ``avg`` of an interval); null where no value was counted."""
    sums = pc.fill_null(total.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
    n = pc.fill_null(count, 0).to_numpy(zero_copy_only=False)
    means = mean_half_up(sums.view(np.uint64), sums >> np.int64(63), n)
    return pa.array(means, type=pa.int64(), mask=n == 0).cast(total.type)


def _interpolable(data_type: Any) -> bool:
    """Whether Spark's ``percentile`` takes a column of ``data_type``: numbers and intervals."""
    T = _spark_types()
    numbers = (T.NumericType, T.DayTimeIntervalType, T.YearMonthIntervalType)
    return isinstance(data_type, numbers)


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def _require_dataframe(df: Any, function: str) -> None:
    if not (hasattr(df, "mapInArrow") and hasattr(df, "sparkSession")):
        hint = (
            "; for an RDD of (key, value) pairs use rdd.combineByKey & co. with "
            "extagg.spark.install(), or extagg.spark.combine_by_key"
            if hasattr(df, "mapPartitions")
            else ""
        )
        raise TypeError(f"{function} takes a PySpark DataFrame, got {type(df).__name__}{hint}")
    try:
        sc = df.sparkSession.sparkContext
    except Exception:  # Spark Connect: no context on this side
        return
    local_workers_run_this_python(sc)


def _budget(df: Any, memory: int | str | None) -> int:
    if memory is not None:
        # below the engines' minimum: refused at the call, not in every Python worker
        return check_engine_budget(parse_size(memory, name="memory"))
    sc = df.sparkSession.sparkContext
    return worker_budget(sc.getConf(), sc.master)


def _prepare(df: Any, plan: AggregationPlan) -> Any:
    """The columns the stages read (a column they do not, of a type PySpark's Arrow
    conversion cannot take or with a dot in its name, failed the job), floats normalised."""
    from pyspark.sql import functions as F

    df = df.select(*(F.col("`" + c.replace("`", "``") + "`") for c in plan.columns_read))
    if not plan.columns_read:  # count(*) alone, no key: PySpark's batches of no column had
        df = df.select(F.lit(True).alias("__rows"))  # no rows either (it counted 0)
    for c in plan.float_keys:  # Spark's groupBy normalisation: -0.0 is 0.0
        df = df.withColumn(c, F.when(F.col(c) == 0, F.lit(0.0)).otherwise(F.col(c)))
    for d in plan.distinct:  # and its count(DISTINCT x)'s: a copy, the other aggregates' as is
        if d.source != d.column:
            x = F.col(d.column)
            df = df.withColumn(d.source, F.when(x == 0, F.lit(0.0)).otherwise(x))
    return df


def partial_aggregate(
    df: Any,
    by: Sequence[str] | str,
    aggs: Mapping[str, tuple[str, str]] | Sequence[str] | str,
    *,
    memory: int | str | None = None,
    engine: str = "arrow",
    force_spill_rows: int | None = None,
) -> tuple[Any, AggregationPlan]:
    """Stage 1 alone: a DataFrame of partial states (one row per group per partition).

    Returns ``(partial_df, plan)``; ``final_aggregate(partial_df, plan)`` finishes it. To fold
    partial states inside your own ``mapInArrow`` function, call ``plan.partial(batches)``
    (and declare ``plan.partial_schema``).

    Parameters
    ----------
    df
        The input DataFrame.
    by
        The key column(s).
    aggs
        Output name -> ``(column, function)``; ``("*", "count")`` counts rows. Or the
        ``extagg aggregate --agg`` texts: ``["n=count(*)", "revenue=sum(amount)"]``.
    memory
        Each task's budget (``"256m"`` or bytes); default :func:`extagg.spark.worker_budget`.
    engine
        ``"arrow"`` runs the stages through ``mapInArrow``, ``"pandas"`` through
        ``mapInPandas``.
    force_spill_rows
        Testing aid: spill after every this many rows, so that spill paths run on small data.

    Returns
    -------
    tuple[DataFrame, AggregationPlan]
        The partial states and the plan that finishes them.
    """
    _require_dataframe(df, "extagg.spark.partial_aggregate")
    timezone = df.sparkSession.conf.get("spark.sql.session.timeZone", None)
    plan = AggregationPlan(
        df.schema, by, aggs, _budget(df, memory), force_spill_rows, timezone=timezone
    )
    prepared = _prepare(df, plan)
    return _map(prepared, plan.partial, plan.partial_schema, engine), plan


def final_aggregate(
    partial_df: Any,
    plan: AggregationPlan,
    *,
    num_partitions: int | None = None,
    engine: str = "arrow",
    keep_states: bool = False,
) -> Any:
    """Stage 2: shuffle partial states on the keys and merge them into the results.

    ``keep_states=True`` returns the merged states (``plan.state_schema``) instead of the
    finished results: what a running aggregate stores between batches.

    Parameters
    ----------
    partial_df
        The partial states from :func:`partial_aggregate`.
    plan
        The plan :func:`partial_aggregate` returned with them.
    num_partitions
        Partitions of the shuffle; default Spark's ``spark.sql.shuffle.partitions``.
    engine
        ``"arrow"`` runs the stages through ``mapInArrow``, ``"pandas"`` through
        ``mapInPandas``.
    keep_states
        Return the merged states instead of the finished results.

    Returns
    -------
    DataFrame
        The key columns then the outputs (or the states).
    """
    if not plan.by:  # a global aggregate (df.agg(...)): every partial row to one task
        shuffled = partial_df.repartition(1)
    elif num_partitions:
        shuffled = partial_df.repartition(num_partitions, *plan.by)
    else:
        shuffled = partial_df.repartition(*plan.by)
    if plan.ordered:
        shuffled = shuffled.sortWithinPartitions(PARTITION_COLUMN)
    if keep_states:
        plan.check_states_kept()
        return _map(shuffled, plan.final_states, plan.state_schema, engine)
    return _map(shuffled, plan.final, plan.final_schema, engine)


def aggregate(
    df: Any,
    by: Sequence[str] | str,
    aggs: Mapping[str, tuple[str, str]] | Sequence[str] | str,
    *,
    memory: int | str | None = None,
    num_partitions: int | None = None,
    engine: str = "arrow",
    force_spill_rows: int | None = None,
) -> Any:
    """``df.groupBy(*by).agg(...)`` with extagg's columnar engine in the Python workers.

    Parameters
    ----------
    df
        The input DataFrame.
    by
        The key column(s).
    aggs
        Output name -> ``(column, function)``; ``("*", "count")`` counts rows. Or the
        ``extagg aggregate --agg`` texts: ``["n=count(*)", "revenue=sum(amount)"]``.
    memory
        Each task's budget (``"256m"`` or bytes); default :func:`extagg.spark.worker_budget`.
    num_partitions
        Partitions of the shuffle between the two stages; default
        ``spark.sql.shuffle.partitions``.
    engine
        ``"arrow"`` runs the stages through ``mapInArrow``, ``"pandas"`` through
        ``mapInPandas``.
    force_spill_rows
        Testing aid: spill after every this many rows, so that spill paths run on small data.

    Returns
    -------
    DataFrame
        The key columns then the outputs, one row per group.
    """
    _require_dataframe(df, "extagg.spark.aggregate")
    partial_df, plan = partial_aggregate(
        df, by, aggs, memory=memory, engine=engine, force_spill_rows=force_spill_rows
    )
    return final_aggregate(partial_df, plan, num_partitions=num_partitions, engine=engine)


def _map(
    df: Any,
    fn: Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    schema: Any,
    engine: str,
) -> Any:
    if engine == "arrow":
        return df.mapInArrow(fn, schema)
    if engine == "pandas":
        timezone = df.sparkSession.conf.get("spark.sql.session.timeZone", None) or "UTC"
        stage = _pandas_stage(fn, _declared_types(df.schema, timezone), _timestamps(df.schema),
                              timezone)  # fmt: skip
        return df.mapInPandas(stage, schema)
    raise ValueError(f"engine must be 'arrow' or 'pandas', got {engine!r}")


def _declared_types(schema: Any, timezone: str) -> dict[str, pa.DataType]:
    """The Arrow types of a Spark ``schema``'s columns (those PySpark converts)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    T = _spark_types()
    out = {}
    for f in schema.fields:
        one = T.StructType([f])
        try:
            try:  # PySpark 4 asserts a zone is given for a timestamp column
                arrow = to_arrow_schema(one, timezone=timezone)
            except TypeError:  # pragma: no cover - PySpark 3: timestamps in UTC, no argument
                arrow = to_arrow_schema(one)
        except Exception:  # a type PySpark does not convert: the stages do not read it
            continue
        out[f.name] = arrow.field(0).type
    return out


def _timestamps(schema: Any) -> list[str]:
    """The names of a Spark ``schema``'s ``timestamp`` columns (not ``timestamp_ntz``)."""
    T = _spark_types()
    return [f.name for f in schema.fields if isinstance(f.dataType, T.TimestampType)]


def _pandas_stage(
    fn: Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    declared: Mapping[str, pa.DataType],
    timestamps: Sequence[str] = (),
    timezone: str = "UTC",
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """The ``mapInPandas`` form of a stage: pandas frames ↔ Arrow batches around ``fn``.
    ``declared``: the columns' Arrow types; a decimal column is cast to its own (pandas holds
    ``Decimal`` objects, from which Arrow would infer each frame's own precision and scale),
    and so is a column a frame holds only nulls of (pandas' ``None`` objects: Arrow's type
    ``null``, which no aggregate takes: a boolean column null in a whole partition failed).
    ``timestamps``: the ``timestamp`` columns, which pandas holds as wall times of the
    session's ``timezone`` without a zone: made instants again (read as UTC, every stage
    moved them by the zone's offset: 8 hours in New York's summer after two stages), an
    ambiguous wall time as standard time, as PySpark's own conversion does."""

    def to_batch(frame: Any) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pandas(frame, preserve_index=False)
        for name, arrow_type in declared.items():
            i = batch.schema.get_field_index(name)
            if i < 0 or batch.schema.field(i).type == arrow_type:
                continue
            typ = batch.schema.field(i).type
            if pa.types.is_null(typ) or pa.types.is_decimal(arrow_type):
                batch = batch.set_column(i, name, batch.column(i).cast(arrow_type))
        for name in timestamps:
            i = batch.schema.get_field_index(name)
            column = batch.column(i) if i >= 0 else None
            if column is not None and pa.types.is_timestamp(column.type) and not column.type.tz:
                import pyarrow.compute as pc

                local = pc.assume_timezone(
                    column, timezone, ambiguous="latest", nonexistent="latest"
                )
                # as declared (microseconds; pandas' are nanoseconds): a global aggregate's
                # final stage starts from a typed empty batch, which they must match
                instant = declared.get(name, pa.timestamp(column.type.unit, "UTC"))
                batch = batch.set_column(i, name, local.cast(instant))
        return batch

    def run(frames: Iterable[Any]) -> Iterator[Any]:
        batches = (to_batch(frame) for frame in frames)
        for out in fn(batches):
            yield out.to_pandas()

    return run

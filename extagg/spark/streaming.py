"""Structured Streaming aggregation into extagg's versioned state store (``foreachBatch``).

Each micro-batch is aggregated by :func:`extagg.spark.aggregate`'s two columnar stages (the
final stage keeps the mergeable *states*: sums and counts, the variance moments, min/max,
first/last), streamed to the driver in key-hash order through an
:class:`~extagg.ExternalAppendOnlyMap`, and merged into the state with
:meth:`~extagg.state.StateStoreProvider.merge_update` as version ``batch_id + 1``; then the
batch is committed in the state checkpoint. A batch Spark replays after a crash (state written,
Spark's own commit not) has the same input and rewrites the same version from the version
before it: nothing is added twice.

The state rows are ``key → tuple of state columns``; :meth:`StatefulAggregate.results` (or
:func:`finish_states`) turns them into the requested outputs. Keys and state values must be
types the state codec stores (None, bool, int, float, str, bytes, Decimal, date, datetime,
timedelta, tuples of these): decimal columns stay exact, as keys and as sums, as in Spark, and
date and timestamp columns are keys and min/max/first/last values. A ``timestamp`` is kept as
its instant in UTC (PySpark hands it over as a naive local wall time, which repeats in a
fall-back hour); :meth:`StatefulAggregate.results` gives it back as PySpark does.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import logging
import math
import struct
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from extagg._config import parse_size
from extagg.columnar.distinct import has_distinct, needs_levels
from extagg.columnar.functions import VAR_STATE
from extagg.errors import SumOverflowError
from extagg.generic.aggregator import Aggregator
from extagg.generic.external_map import ExternalAppendOnlyMap
from extagg.spark.dataframe import AggregationPlan, final_aggregate, partial_aggregate
from extagg.state import Checkpoint, read_state

__all__ = ["StatefulAggregate", "finish_states", "stateful_aggregate"]

log = logging.getLogger(__name__)

OPERATOR_NAME = "extagg.spark.stateful_aggregate"


_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MICROSECOND = dt.timedelta(microseconds=1)

#: decimal sums of running totals: exact (the default context keeps 28 digits; Spark's
#: sums have up to 38)
_EXACT = decimal.Context(prec=80)


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, decimal.Decimal) or isinstance(b, decimal.Decimal):
        if isinstance(a, float) or isinstance(b, float):  # a state kept as doubles before
            return float(a) + float(b)
        return _EXACT.add(a, b)
    return a + b


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _add_in_int64(output: str, limit: decimal.Decimal | None, a: Any, b: Any) -> Any:
    """:func:`_add`, an integer total outside ``int64`` or a decimal one of ``limit`` or more
    (its type's digits: ``decimal(p + 10, s)``) a :class:`SumOverflowError` (Spark's
    ARITHMETIC_OVERFLOW; within one batch the engine raises it, across batches this does)."""
    total = _add(a, b)
    if type(total) is int and not _INT64[0] <= total <= _INT64[1]:
        raise SumOverflowError(
            f"aggregate {output!r}: the running total {total} leaves int64 across "
            "micro-batches ([ARITHMETIC_OVERFLOW] in Spark); nothing of this batch is committed"
        )
    if limit is not None and isinstance(total, decimal.Decimal) and abs(total) >= limit:
        raise SumOverflowError(
            f"aggregate {output!r}: the running total {total} has more digits than its "
            "decimal type holds across micro-batches ([ARITHMETIC_OVERFLOW] in Spark); nothing "
            "of this batch is committed"
        )
    return total


def _min(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


def _max(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


_VAR_STATE = struct.Struct("<qdd")  # extagg.columnar.functions.VAR_STATE_DTYPE


def _merge_moments(a: bytes | None, b: bytes | None) -> bytes | None:
    """Chan's merge of two packed ``(count, mean, M2)`` variance states (None: no value)."""
    if a is None:
        return b
    if b is None:
        return a
    (na, ma, qa), (nb, mb, qb) = _VAR_STATE.unpack(a), _VAR_STATE.unpack(b)
    n = na + nb
    delta = mb - ma
    return _VAR_STATE.pack(n, ma + delta * nb / n, qa + qb + delta * delta * (na * nb / n))


def _finish_moments(func: str, state: bytes | None) -> float | None:
    """``func`` (var, var_pop, std, std_pop) of a packed variance state, as the engine's."""
    n, _mean, m2 = _VAR_STATE.unpack(state) if state is not None else (0, 0.0, 0.0)
    denom = n - 1 if func in ("var", "std") else n
    if denom <= 0:
        return None
    var = max(m2, 0.0) / denom if not math.isnan(m2) else m2
    return math.sqrt(var) if func.startswith("std") else var


def _older(a: Any, b: Any) -> Any:
    return a


def _newer(a: Any, b: Any) -> Any:
    return b


def _older_non_null(a: Any, b: Any) -> Any:
    return b if a is None else a


def _newer_non_null(a: Any, b: Any) -> Any:
    return a if b is None else b


_MERGE: dict[str, Callable[[Any, Any], Any]] = {
    "sum": _add,
    "min": _min,
    "max": _max,
    "first": _older,
    "last": _newer,
    "first_non_null": _older_non_null,
    "last_non_null": _newer_non_null,
    VAR_STATE: _merge_moments,
}


def _nan_aware(op: Callable[[Any, Any], Any], a: Any, b: Any) -> Any:
    # Spark's min/max order NaN above every number; None is no value (a group's nulls)
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, float) and math.isnan(a):
        return a if op is _max else b
    if isinstance(b, float) and math.isnan(b):
        return b if op is _max else a
    return op(a, b)


class StatefulAggregate:
    """A ``foreachBatch`` function keeping running aggregates in an extagg state checkpoint.

    Parameters
    ----------
    by
        The key column(s).
    aggs
        Output name -> ``(column, function)``, as for :func:`extagg.spark.aggregate`.
    checkpoint
        The extagg state checkpoint directory (keep it apart from Spark's own
        ``checkpointLocation``).
    memory
        Budget of each stage and of the driver-side sort; default the Spark worker budget.
    operator_id
        The operator in the state checkpoint that holds these aggregates.
    """

    def __init__(
        self,
        by: Sequence[str] | str,
        aggs: Mapping[str, tuple[str, str]],
        checkpoint: str,
        *,
        memory: int | str | None = None,
        operator_id: int = 0,
    ) -> None:
        self.by = [by] if isinstance(by, str) else list(by)
        self.aggs = dict(aggs)
        distinct = [o for o, spec in self.aggs.items() if has_distinct({o: spec})]
        if distinct:
            raise ValueError(
                f"count_distinct ({', '.join(map(repr, distinct))}) has no mergeable state to "
                "keep between batches (it would be the set of its values): compute it with "
                "extagg.spark.aggregate"
            )
        held = [o for o, spec in self.aggs.items() if needs_levels({o: spec})]
        if held:
            raise ValueError(
                f"quantiles ({', '.join(map(repr, held))}) have no mergeable state to keep "
                "between batches (it would be every value): compute them on a batch DataFrame"
            )
        self.checkpoint = Checkpoint(checkpoint)
        self.memory = None if memory is None else parse_size(memory, name="memory")
        self.operator_id = operator_id
        self._plan: AggregationPlan | None = None
        self._merges: list[Callable[[Any, Any], Any]] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ per batch
    def __call__(self, batch_df: Any, batch_id: int) -> None:
        with self._lock:
            self._apply(batch_df, int(batch_id))

    def _apply(self, batch_df: Any, batch_id: int) -> None:
        last = self.checkpoint.last_committed_batch()
        if last is not None and batch_id > last + 1:
            raise RuntimeError(
                f"batch {batch_id} arrived but the state checkpoint {self.checkpoint.path} "
                f"has committed only up to batch {last}: the Spark checkpoint and the state "
                "checkpoint do not belong together"
            )
        if last is not None and batch_id < last:
            # Spark replays only its last batch (``last``: state written, its own commit
            # not); an older one would rewrite versions under the batches committed after it
            raise RuntimeError(
                f"batch {batch_id} arrived but the state checkpoint {self.checkpoint.path} "
                f"has already committed batch {last}: the Spark checkpoint and the state "
                "checkpoint do not belong together"
            )
        partial_df, plan = partial_aggregate(batch_df, self.by, self.aggs, memory=self.memory)
        self._plan = plan
        states_df = final_aggregate(partial_df, plan, keep_states=True)
        names = [c for c in states_df.columns if c not in self.by]
        merges = [_state_merge(plan, name) for name in names]
        instants = _local_timestamps(states_df.schema)
        # an older extagg kept them as naive wall times: read as instants when merged
        held_instants = {i - len(self.by) for i in instants if i >= len(self.by)}
        operator = self.checkpoint.operator(self.operator_id, name=OPERATOR_NAME, num_partitions=1)
        provider = operator.provider(0)
        aggregator: Aggregator[Any, Any] = Aggregator(
            _identity, _merge_states(merges), _merge_states(merges)
        )
        emap = ExternalAppendOnlyMap(aggregator, memory=self.memory or "64m", name="stream-batch")
        try:
            width = len(self.by)
            # a global aggregate has its one row also for an empty batch, with null first
            # and last: merged, they would replace the running ones
            rows = iter(()) if not self.by and batch_df.isEmpty() else states_df.toLocalIterator()
            for row in rows:
                # a binary state (variance moments) comes as a bytearray: stored as bytes
                values = tuple(bytes(v) if isinstance(v, bytearray) else v for v in row)
                if instants:
                    values = tuple(
                        _as_instant(v) if i in instants else v for i, v in enumerate(values)
                    )
                key = values[0] if width == 1 else values[:width]
                emap.insert(key, values[width:])
            version = provider.merge_update(
                batch_id, emap.iterator(ordered=True), _merge_states(merges, held_instants)
            )
        finally:
            emap.close()
            provider.close()
        self.checkpoint.commit(batch_id)
        log.info("extagg stateful batch %d committed as state version %d", batch_id, version)

    # ------------------------------------------------------------------ reading
    def state_columns(self, schema: Any) -> list[str]:
        """The state column names for a stream of ``schema``."""
        plan = AggregationPlan(schema, self.by, self.aggs, 1)
        return [name for o in plan.outputs for name in o.final]

    def results(self, schema: Any, batch_id: int | None = None) -> dict[Any, dict[str, Any]]:
        """``key → {output: value}`` of the committed state (default: the last batch).

        Timestamps come back as PySpark gives them (naive local wall times, ``fold`` set in
        a fall-back hour): two key instants sharing a wall time are one key of this dict;
        :func:`extagg.state.read_state` gives the state's UTC instants."""
        plan = AggregationPlan(schema, self.by, self.aggs, 1)
        return finish_states(plan, read_state(self.checkpoint.path, batch_id=batch_id))


def _identity(value: Any) -> Any:
    return value


def _local_timestamps(schema: Any) -> set[int]:
    """Positions of ``schema``'s ``timestamp`` (local time zone) fields."""
    from pyspark.sql import types as T

    return {i for i, f in enumerate(schema.fields) if isinstance(f.dataType, T.TimestampType)}


def _as_instant(value: Any) -> Any:
    """A Spark ``timestamp`` as PySpark hands it over (a naive wall time of the local zone, its
    ``fold`` telling the two 01:30 of a fall-back hour apart) as an instant in UTC: naive wall
    times compare and hash equal across that hour, so two instants would be one key, and a
    later one the smaller."""
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.astimezone(dt.timezone.utc)
    return value


def _local_time(value: Any) -> Any:
    """An instant kept by :func:`_as_instant` as PySpark gives a ``timestamp``: the local
    zone's naive wall time (``datetime.fromtimestamp``, which sets ``fold``)."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        micros = (value - _EPOCH_UTC) // _MICROSECOND
        return dt.datetime.fromtimestamp(micros // 1_000_000).replace(
            microsecond=micros % 1_000_000
        )
    return value


def _state_merge(plan: AggregationPlan, name: str) -> Callable[[Any, Any], Any]:
    for o in plan.outputs:
        if name in o.final:
            op = _MERGE[o.final[name][1]]
            if op in (_min, _max):
                return functools.partial(_nan_aware, op)
            if op is _add and o.func == "sum":
                return functools.partial(_add_in_int64, o.output, _decimal_limit(plan, name))
            if op is _add and o.func == "mean":  # a double (no limit) or Spark's decimal
                limit = _decimal_limit(plan, name)
                if limit is not None:
                    return functools.partial(_add_in_int64, o.output, limit)
            return op
    raise KeyError(name)


def _decimal_limit(plan: AggregationPlan, name: str) -> decimal.Decimal | None:
    """The least magnitude a decimal state column ``name`` cannot hold (None: not decimal)."""
    from pyspark.sql import types as T

    typ = plan.state_schema[name].dataType
    if not isinstance(typ, T.DecimalType):
        return None
    return decimal.Decimal(10) ** (typ.precision - typ.scale)


def _merge_states(
    merges: list[Callable[[Any, Any], Any]], instants: Collection[int] = ()
) -> Callable[[Any, Any], Any]:
    """The merge of two state tuples, column by column; ``instants``: the positions of
    timestamps, whose old values are read as instants (:func:`_as_instant`)."""

    def merge(old: Any, new: Any) -> Any:
        if instants:
            old = tuple(_as_instant(v) if i in instants else v for i, v in enumerate(old))
        return tuple(m(a, b) for m, a, b in zip(merges, old, new, strict=True))

    return merge


def finish_states(plan: AggregationPlan, rows: Any) -> dict[Any, dict[str, Any]]:
    """Finish ``(key, state tuple, partition)`` rows into ``key → {output: value}``.

    Parameters
    ----------
    plan
        The plan the states were made with (its outputs name and finish each state).
    rows
        ``(key, state tuple, partition)`` rows, as the state checkpoint's readers give them.

    Returns
    -------
    dict
        ``key → {output name: finished value}``.
    """
    names = [name for o in plan.outputs for name in o.final]
    timestamps = _local_timestamps(plan.state_schema)
    key_times = [i for i in range(len(plan.by)) if i in timestamps]
    state_times = {plan.state_schema.fields[i].name for i in timestamps} - set(plan.by)
    out: dict[Any, dict[str, Any]] = {}
    for row in rows:
        key, state = row[0], dict(zip(names, row[1], strict=True))
        if key_times:
            key = (
                _local_time(key)
                if len(plan.by) == 1
                else tuple(_local_time(k) if i in key_times else k for i, k in enumerate(key))
            )
        for name in state_times & state.keys():
            state[name] = _local_time(state[name])
        values: dict[str, Any] = {}
        for o in plan.outputs:
            p = f"__{o.output}"
            if o.func == "count":
                values[o.output] = state[f"{p}_n"] or 0
            elif o.func == "sum":
                values[o.output] = state[f"{p}_s"]
            elif o.func == "mean":
                n, s = state[f"{p}_n"] or 0, state[f"{p}_s"]
                if isinstance(s, decimal.Decimal) and n:  # Spark's avg: s + 4 digits, half up
                    out_type = plan.final_schema[o.output].dataType
                    exact = _EXACT.divide(s, decimal.Decimal(n))
                    quantum = decimal.Decimal(1).scaleb(-out_type.scale)
                    mean = exact.quantize(quantum, decimal.ROUND_HALF_UP, _EXACT)
                    if abs(mean) >= decimal.Decimal(10) ** (out_type.precision - out_type.scale):
                        raise SumOverflowError(
                            f"aggregate {o.output!r}: the mean {mean} of column {o.column!r} "
                            f"has more digits than its type {out_type.simpleString()} holds "
                            "([NUMERIC_VALUE_OUT_OF_RANGE] in Spark)"
                        )
                    values[o.output] = mean
                elif isinstance(s, dt.timedelta) and n:  # exact, half up (Spark's interval avg)
                    micros = s // _MICROSECOND
                    q, r = divmod(abs(micros), n)
                    q += 2 * r >= n
                    values[o.output] = dt.timedelta(microseconds=-q if micros < 0 else q)
                else:
                    values[o.output] = s / n if n else None
            elif o.func.startswith(("var", "std")):
                values[o.output] = _finish_moments(o.func, state[f"{p}_m"])
            else:
                values[o.output] = state[f"{p}_v"]
        out[key] = values
    return out


def stateful_aggregate(
    stream_df: Any,
    by: Sequence[str] | str,
    aggs: Mapping[str, tuple[str, str]],
    *,
    checkpoint: str,
    spark_checkpoint: str,
    memory: int | str | None = None,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
) -> Any:
    """Start a streaming query that keeps ``aggs`` by ``by`` in the state at ``checkpoint``.

    ``spark_checkpoint`` is Spark's own ``checkpointLocation`` (offsets and commits: what makes
    a restarted query replay the batch it was in). ``trigger`` is passed to
    ``writeStream.trigger(**trigger)`` (e.g. ``{"availableNow": True}``). Returns the
    ``StreamingQuery``; the function it runs per batch is its ``.extagg`` attribute.

    Parameters
    ----------
    stream_df
        The streaming DataFrame to aggregate.
    by
        The key column(s).
    aggs
        Output name -> ``(column, function)``, as for :func:`extagg.spark.aggregate`.
    checkpoint
        The extagg state checkpoint directory (keep it apart from Spark's own
        ``checkpointLocation``).
    memory
        Budget of each stage and of the driver-side sort; default the Spark worker budget.
    spark_checkpoint
        Spark's ``checkpointLocation`` for the query.
    trigger
        Keyword arguments of ``writeStream.trigger``.
    query_name
        Name of the streaming query.

    Returns
    -------
    StreamingQuery
        The started query.
    """
    function = StatefulAggregate(by, aggs, checkpoint, memory=memory)
    writer = stream_df.writeStream.foreachBatch(function).option(
        "checkpointLocation", spark_checkpoint
    )
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    query = writer.start()
    try:
        query.extagg = function
    except AttributeError:  # pragma: no cover - a slotted StreamingQuery
        pass
    return query

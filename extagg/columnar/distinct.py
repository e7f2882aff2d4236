"""``count_distinct`` in bounded memory: an external two-level group-by beside the plain one.

``count_distinct(c)`` per group of keys ``K`` is computed without a set per group: a first
:class:`~extagg.columnar.HashAggregator` groups the input by ``K + [c]`` with no aggregate
(each distinct value once per group, spilled and merged like any aggregation: a state column
would only add to what it spills), and a second one groups that output by
``K`` and counts the non-null ``c`` (SQL's ``COUNT(DISTINCT c)`` ignores nulls). The other
aggregates of the query run in a third aggregator over the input. All share one task memory
manager, so one spills when another needs memory.

Every aggregator's results come in the hash order of ``K`` and hold the same groups, so their
outputs are joined as they stream, batch by batch, on the key hashes (rows of colliding hashes
are matched by key). The result is the same, in the same order, as one aggregator would give.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from extagg._config import format_size
from extagg.columnar import functions as F
from extagg.columnar.hash_aggregator import HashAggregator
from extagg.errors import ExtaggError, MemoryLimitError, UsageError
from extagg.memory import MemoryConsumer, resolve_task_memory_manager
from extagg.metrics import SpillMetrics

__all__ = ["DistinctAggregator", "JoinBuffers", "has_distinct"]

_EMPTY_HASHES = np.zeros(0, dtype=np.uint64)


def has_distinct(aggs: Mapping[str, Any]) -> bool:
    """Whether ``aggs`` asks for a distinct aggregate (``count_distinct``/``nunique``)."""
    return any(r.func in F.DISTINCT_FUNCTIONS for r in F.parse_aggs(aggs, distinct=True))


class DistinctAggregator:
    """GROUP BY with ``count_distinct`` beside any other aggregate; the interface of
    :class:`~extagg.columnar.HashAggregator` (``update``, ``results``, ``hashed_results``,
    ``close``, ``schema``, ``metrics``, ``input_columns``) and the same options (``memory``,
    ``memory_manager``, ``spill_dirs``, ``force_spill_rows``, ...), shared by its aggregators.

    Parameters
    ----------
    keys
        The key column(s).
    aggs
        Output name -> ``(column, function)``; ``("*", "count")`` counts rows.
    memory
        The budget (``"256m"`` or bytes) shared by its aggregators.
    memory_manager
        A memory manager to take that memory from instead.
    name
        Name of the consumers in logs and errors.
    **options
        Other options of :class:`~extagg.columnar.HashAggregator`.
    """

    def __init__(
        self,
        keys: str | Sequence[str],
        aggs: Mapping[str, tuple[str, str]],
        *,
        memory: int | str | None = None,
        memory_manager: Any = None,
        name: str | None = None,
        **options: Any,
    ) -> None:
        self.keys = [keys] if isinstance(keys, str) else list(keys)
        requests = F.parse_aggs(aggs, distinct=True)
        self._outputs = [r.output for r in requests]
        clash = set(self._outputs) & set(self.keys)
        if clash:
            raise ValueError(f"aggregate outputs {sorted(clash)} have the names of key columns")
        tmm = resolve_task_memory_manager(memory, memory_manager)
        self._tmm = tmm
        base = name or "DistinctAggregator"
        self._name = base
        shared = dict(options, memory_manager=tmm)
        plain = {o: spec for o, spec in aggs.items() if not _is_distinct(spec)}
        self._plain = HashAggregator(self.keys, plain, name=base, **shared) if plain else None
        #: per distinct aggregate: (output, column, first level, second level)
        self._levels: list[tuple[str, str, HashAggregator, HashAggregator]] = []
        for r in requests:
            if r.func not in F.DISTINCT_FUNCTIONS:
                continue
            assert r.column is not None  # parse_aggs allows '*' for count only
            first_keys = self.keys if r.column in self.keys else [*self.keys, r.column]
            first = HashAggregator(
                first_keys, F.NO_AGGREGATES, name=f"{base}/{r.output}.1", **shared
            )
            second = HashAggregator(
                self.keys, {r.output: (r.column, "count")}, name=f"{base}/{r.output}.2", **shared
            )
            self._levels.append((r.output, r.column, first, second))
        self._parts = [a for a in [self._plain, *(lv[2] for lv in self._levels)] if a is not None]
        self._state = "open"
        self._groups = 0

    # -- the HashAggregator interface ----------------------------------------------------------

    @property
    def input_columns(self) -> list[str]:
        """The input columns the query reads."""
        names: dict[str, None] = {}
        for agg in self._parts:
            names.update(dict.fromkeys(agg.input_columns))
        return list(names)

    @property
    def schema(self) -> pa.Schema | None:
        """The output schema (known after the first ``update``)."""
        fields: dict[str, pa.Field] = {}
        for agg in [self._plain, *(lv[3] for lv in self._levels)]:
            if agg is None:
                continue
            schema = agg.schema
            if schema is None:
                if not self._levels or agg is self._plain:
                    return None
                schema = self._second_schema(agg)
                if schema is None:
                    return None
            for f in schema:
                fields.setdefault(f.name, f)
        return pa.schema([fields[n] for n in [*self.keys, *self._outputs]])

    @property
    def metrics(self) -> SpillMetrics:
        """The counters of all its aggregators added up (peaks: the largest)."""
        total = SpillMetrics()
        aggs = [*self._parts, *(lv[3] for lv in self._levels)]
        for agg in aggs:
            m = agg.metrics
            for field in vars(total):
                if field.startswith("peak"):
                    setattr(total, field, max(getattr(total, field), getattr(m, field)))
                elif field not in ("records_read", "groups"):
                    setattr(total, field, getattr(total, field) + getattr(m, field))
        total.records_read = self._parts[0].metrics.records_read
        total.groups = self._groups
        return total

    def _second_schema(self, second: HashAggregator) -> pa.Schema | None:
        """A second level's schema before it has seen input: keys from its first level."""
        for output, _column, first, other in self._levels:
            if other is second and first.schema is not None:
                keys = [first.schema.field(k) for k in self.keys]
                return pa.schema([*keys, pa.field(output, pa.int64())])
        return None

    def update(self, batch: Any) -> None:
        """Fold one batch into every level-one aggregator."""
        if self._state != "open":
            raise UsageError("update() after results() or close()")
        for agg in self._parts:
            agg.update(batch)

    def results(self) -> Iterator[pa.RecordBatch]:
        """Every group once, in hash order of the keys. Destructive; call once."""
        return (batch for _hashes, batch in self.hashed_results())

    def hashed_results(self) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
        """:meth:`results` with each batch's key hashes."""
        if self._state != "open":
            raise UsageError("results() can be called only once, before close()")
        self._state = "reading"
        return self._results()

    def _results(self) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
        self._groups = 0
        try:
            for _output, _column, first, second in self._levels:
                for batch in first.results(ordered=False):  # level two folds level one
                    second.update(batch)
                first.close()
            streams = [a.hashed_results() for a in [self._plain] if a is not None]
            streams += [lv[3].hashed_results() for lv in self._levels]
            buffers = JoinBuffers(self._tmm, f"{self._name}/join")
            for hashes, batch in join_hashed(streams, self.keys, self._outputs, buffers):
                self._groups += batch.num_rows
                yield hashes, batch
        finally:
            self.close()

    def close(self) -> None:
        """Close every aggregator (memory released, files deleted). Idempotent."""
        self._state = "closed"
        for agg in [*self._parts, *(lv[3] for lv in self._levels)]:
            agg.close()

    def __enter__(self) -> DistinctAggregator:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


def _is_distinct(spec: Any) -> bool:
    func = str(spec[1]).lower() if isinstance(spec, (tuple, list)) and len(spec) == 2 else ""
    return F.ALIASES.get(func, func) in F.DISTINCT_FUNCTIONS


class JoinError(ExtaggError, RuntimeError):
    """The aggregators' outputs to be joined do not hold the same groups (a bug)."""


def _canon(value: Any) -> Any:
    return ("<nan>",) if isinstance(value, float) and math.isnan(value) else value


class JoinBuffers(MemoryConsumer):
    """The join's buffered rows (each stream's unjoined rows, the batch being built),
    accounted to the task's memory manager beside the aggregators; not spillable: a grant
    refused even after the aggregators spilled raises :class:`~extagg.MemoryLimitError`."""

    def hold(self, nbytes: int) -> None:
        """Hold exactly ``nbytes`` (acquire the growth, free the rest)."""
        if nbytes > self.used:
            need = nbytes - self.used
            granted = self.acquire_memory(need)
            if granted < need:
                raise MemoryLimitError(
                    f"{self.name}: the join of count_distinct results needs "
                    f"{format_size(nbytes)} of buffers but the memory manager granted "
                    f"{format_size(self.used)} (max_memory "
                    f"{format_size(self.task_memory_manager.memory_manager.max_memory)})"
                )
        elif nbytes < self.used:
            self.free_memory(self.used - nbytes)


class _Stream:
    """One hash-ordered ``(hashes, batch)`` stream with a buffer of its unjoined rows."""

    def __init__(self, source: Iterator[tuple[np.ndarray, pa.RecordBatch]]) -> None:
        self.source = source
        self.hashes = _EMPTY_HASHES
        self.table: pa.Table | None = None
        self.done = False

    @property
    def nbytes(self) -> int:
        """Bytes of the buffered rows."""
        table = 0 if self.table is None else self.table.get_total_buffer_size()
        return int(self.hashes.nbytes) + table

    def fill(self, rows: int) -> None:
        """Buffer at least ``rows`` rows, unless the stream ends first."""
        while len(self.hashes) < rows and not self.done:
            item = next(self.source, None)
            if item is None:
                self.done = True
                break
            hashes, batch = item
            self.hashes = np.concatenate([self.hashes, hashes])
            piece = pa.Table.from_batches([batch])
            self.table = piece if self.table is None else pa.concat_tables([self.table, piece])

    def take(self, n: int) -> pa.Table:
        assert self.table is not None
        out = self.table.slice(0, n)
        self.table = self.table.slice(n)
        self.hashes = self.hashes[n:]
        return out

    def close(self) -> None:
        close = getattr(self.source, "close", None)
        if close is not None:
            close()


def join_hashed(
    sources: list[Iterator[tuple[np.ndarray, pa.RecordBatch]]],
    keys: Sequence[str],
    outputs: Sequence[str],
    buffers: JoinBuffers | None = None,
) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
    """Join hash-ordered result streams over the same groups into batches of ``keys`` then
    ``outputs`` (each output taken from the stream that has it). ``buffers`` accounts the
    rows held for the join to its memory manager (released when the join ends)."""
    streams = [_Stream(s) for s in sources]

    def account(extra: int = 0) -> None:
        if buffers is not None:
            buffers.hold(sum(s.nbytes for s in streams) + extra)

    try:
        if len(streams) == 1:
            for hashes, batch in sources[0]:
                yield hashes, batch.select([*keys, *outputs])
            return
        while True:
            for s in streams:
                s.fill(1)
            account()
            sizes = [len(s.hashes) for s in streams]
            if max(sizes) == 0:
                return
            if min(sizes) == 0:
                raise JoinError("aggregator outputs to be joined have different group counts")
            n = _cut(streams, min(sizes))
            account()
            hashes = streams[0].hashes[:n].copy()
            for s in streams[1:]:
                if not np.array_equal(s.hashes[:n], hashes):
                    raise JoinError("aggregator outputs to be joined differ in their key hashes")
            tables = [s.take(n) for s in streams]
            if n > 1 and np.any(hashes[1:] == hashes[:-1]):
                tables = _match_collisions(hashes, tables, keys)
            columns = {name: tables[0].column(name) for name in keys}
            for table in tables:
                for name in outputs:
                    if name in table.column_names and name not in columns:
                        columns[name] = table.column(name)
            joined = pa.table({name: columns[name] for name in [*keys, *outputs]}).combine_chunks()
            account(joined.get_total_buffer_size())
            for batch in joined.to_batches():
                yield hashes[: batch.num_rows], batch
                hashes = hashes[batch.num_rows :]
    finally:
        for s in streams:
            s.close()
        if buffers is not None:
            buffers.close_memory()


def _cut(streams: list[_Stream], n: int) -> int:
    """Rows to join now: ``n``, less a trailing run of one hash that may go on in a stream's
    next rows (rows of equal hashes are matched by key, so a run is never split)."""
    while True:
        for s in streams:
            s.fill(n + 1)
        last = streams[0].hashes[n - 1]
        if not any(len(s.hashes) > n and s.hashes[n] == last for s in streams):
            return n
        start = int(np.searchsorted(streams[0].hashes[:n], last, side="left"))
        if start > 0:
            return start
        longer = min(len(s.hashes) for s in streams)  # one run fills the buffers: read on
        if longer == n:
            return n  # a stream ended inside the run: the hash check reports it
        n = longer


def _match_collisions(
    hashes: np.ndarray, tables: list[pa.Table], keys: Sequence[str]
) -> list[pa.Table]:
    """Reorder the rows of equal hashes in ``tables[1:]`` to the key order of ``tables[0]``."""
    n = len(hashes)
    first_keys = [tuple(map(_canon, row)) for row in zip(*(tables[0].column(k).to_pylist()
                                                           for k in keys))]  # fmt: skip
    out = [tables[0]]
    for table in tables[1:]:
        other = [tuple(map(_canon, row)) for row in zip(*(table.column(k).to_pylist()
                                                          for k in keys))]  # fmt: skip
        perm = np.arange(n)
        start = 0
        while start < n:
            stop = start + 1
            while stop < n and hashes[stop] == hashes[start]:
                stop += 1
            if stop - start > 1:
                where = {other[i]: i for i in range(start, stop)}
                try:
                    perm[start:stop] = [where[first_keys[i]] for i in range(start, stop)]
                except KeyError as exc:
                    raise JoinError(f"group {exc.args[0]!r} is missing from an output") from None
            start = stop
        out.append(table.take(pa.array(perm)))
    return out

"""``count_distinct`` in bounded memory: an external two-level group-by beside the plain one.

``count_distinct(c)`` per group of keys ``K`` is computed without a set per group: a first
:class:`~extagg.columnar.HashAggregator` groups the input by ``K + [c]`` with no aggregate
(each distinct value once per group, spilled and merged like any aggregation: a state column
would only add to what it spills), and a second one groups that output by
``K`` and counts the non-null ``c`` (SQL's ``COUNT(DISTINCT c)`` ignores nulls). The other
aggregates of the query run in a third aggregator over the input. All share one task memory
manager, so one spills when another needs memory.

A first level that spills, or grows past :data:`PARTITION_FIRST_GROUPS` pairs, hands its rows
to partition files by the hash of ``K`` instead, and both levels then run on one partition at
a time (:class:`DistinctLevel`).

Every aggregator's results come in the hash order of ``K`` and hold the same groups, so their
outputs are joined as they stream, batch by batch, on the key hashes (rows of colliding hashes
are matched by key). The result is the same, in the same order, as one aggregator would give.

Quantiles (``median``, ``quantile_cont``, ``quantile_disc``) ride along the same way: each
quantile column's values are sorted beside the group-by and read back beside the plain
aggregator's results (:mod:`extagg.columnar.quantiles`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from extagg._config import format_size
from extagg._interrupts import deferred_interrupts
from extagg._malloc import release_free_memory
from extagg.columnar import functions as F
from extagg.columnar.buffers import IO_COPIES
from extagg.columnar.columns import Column, iter_record_batches, key_names, to_columns
from extagg.columnar.hash_aggregator import HashAggregator
from extagg.columnar.keys import KeyLayout
from extagg.columnar.partition_files import (
    MIN_BUFFER_BYTES,
    PARTITION_BITS,
    PartitionWriter,
    block_to_columns,
    buffer_bytes,
    held_bytes,
    rotate_left,
)
from extagg.columnar.quantiles import QuantileColumn
from extagg.errors import ExtaggError, MemoryLimitError, UsageError
from extagg.memory import MemoryConsumer, describe_holders, resolve_task_memory_manager
from extagg.metrics import SpillMetrics
from extagg.spill.blocks import ColumnBlock
from extagg.spill.runfile import RunReader
from extagg.spillable import RunSet

__all__ = [
    "DistinctAggregator",
    "DistinctLevel",
    "HeldBuffers",
    "JoinBuffers",
    "has_distinct",
    "needs_levels",
]

log = logging.getLogger(__name__)

#: a quantile column's sort buffer at most (with its sort's copies)
SORT_BUFFER_CAP = 64 << 20

_EMPTY_HASHES = np.zeros(0, dtype=np.uint64)


def has_distinct(aggs: Mapping[str, Any]) -> bool:
    """Whether ``aggs`` asks for a distinct aggregate (``count_distinct``/``nunique``)."""
    return any(r.func in F.DISTINCT_FUNCTIONS for r in F.parse_aggs(aggs, distinct=True))


def needs_levels(aggs: Mapping[str, Any]) -> bool:
    """Whether ``aggs`` needs a :class:`DistinctAggregator`: a distinct aggregate or a
    quantile (``median``...), computed beside the plain group-by."""
    beside = (*F.DISTINCT_FUNCTIONS, *F.QUANTILE_FUNCTIONS)
    return any(r.func in beside for r in F.parse_aggs(aggs, distinct=True))


class DistinctAggregator:
    """GROUP BY with ``count_distinct`` or quantiles beside any other aggregate; the interface of
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
    quantile_counts
        Quantile column -> the plain aggregate that counts its values per group, where that
        is not ``(column, "count")``: ``extagg.spark.aggregate``'s final stage sums the
        partitions' counts (its values come apart, :meth:`update_quantiles`).
    spark_percentile
        Interpolate the quantiles of numbers as Spark's ``percentile`` does (see
        :class:`~extagg.columnar.quantiles.QuantileColumn`).
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
        quantile_counts: Mapping[str, tuple[str, str]] | None = None,
        spark_percentile: bool = False,
        **options: Any,
    ) -> None:
        self.keys = key_names(keys)
        requests = F.parse_aggs(aggs, distinct=True, states=True)
        self._outputs = [r.output for r in requests]
        clash = set(self._outputs) & set(self.keys)
        if clash:
            raise ValueError(f"aggregate outputs {sorted(clash)} have the names of key columns")
        tmm = resolve_task_memory_manager(memory, memory_manager)
        self._tmm = tmm
        base = name or "DistinctAggregator"
        self._name = base
        shared = dict(options, memory_manager=tmm)
        mapping = F.agg_mapping(aggs)
        by_output = {r.output: r for r in requests}
        plain = {
            o: spec for o, spec in mapping.items()
            if by_output[o].func not in (*F.DISTINCT_FUNCTIONS, *F.QUANTILE_FUNCTIONS)
        }  # fmt: skip
        #: the quantiles, by column: sorted beside the group-by; the plain aggregator counts
        #: each column's values (a hidden output) for them
        self._quantiles: list[QuantileColumn] = []
        quantile_columns: dict[str, list[F.AggregateRequest]] = {}
        for r in requests:
            if r.func in F.QUANTILE_FUNCTIONS:
                assert r.column is not None
                quantile_columns.setdefault(r.column, []).append(r)
        # the sorts' buffers (their sort's copies counted) half of the budget at most: the
        # aggregators need the rest, their partitions' tables while the sorts are read; and
        # SORT_BUFFER_CAP at most: one sort of more is no faster than runs merged by their key
        # hash, and holds more (10 M values: 3.0 s and 636 MiB in one sort, 3.0 s and 265 MiB)
        share = tmm.memory_manager.max_memory // (2 * max(1, len(quantile_columns)))
        sort_buffer = min(SORT_BUFFER_CAP, share)
        for i, (column, asked) in enumerate(quantile_columns.items()):
            count = f"__quantile_count_{i}"
            plain[count] = (quantile_counts or {}).get(column, (column, "count"))
            self._quantiles.append(
                QuantileColumn(
                    self.keys, column, asked, count, tmm, options.get("spill_dirs"),
                    max_buffer_bytes=sort_buffer, name=f"{base}/{column}",
                    spark_percentile=spark_percentile,
                )
            )  # fmt: skip
        self._plain = HashAggregator(self.keys, plain, name=base, **shared) if plain else None
        #: per distinct aggregate: (output, column, first level, second level)
        self._levels: list[DistinctLevel] = []
        for r in requests:
            if r.func not in F.DISTINCT_FUNCTIONS:
                continue
            assert r.column is not None  # parse_aggs allows '*' for count only
            level = DistinctLevel(self.keys, r.output, r.column, shared, f"{base}/{r.output}")
            self._levels.append(level)
        streams = len(self._levels) + (self._plain is not None) + len(self._quantiles)
        if streams > 1:  # merged side by side by the join: a share each, and one for the join
            share = tmm.memory_manager.max_memory // (streams + 1)
            if self._plain is not None:
                self._plain.limit_merge_memory(share)
            for level in self._levels:
                level.limit_merge_memory(share)
            for quantile in self._quantiles:
                quantile.limit_merge_memory(share)
        self._state = "open"
        self._groups = 0

    # -- the HashAggregator interface ----------------------------------------------------------

    @property
    def input_columns(self) -> list[str]:
        """The input columns the query reads."""
        names: dict[str, None] = {}
        if self._plain is not None:
            names.update(dict.fromkeys(self._plain.input_columns))
        for level in self._levels:
            names.update(dict.fromkeys(level.columns))
        for quantile in self._quantiles:
            names.update(dict.fromkeys(quantile.columns))
        return list(names)

    @property
    def schema(self) -> pa.Schema | None:
        """The output schema (known after the first ``update``)."""
        fields: dict[str, pa.Field] = {}
        schemas = [self._plain.schema] if self._plain is not None else []
        schemas += [level.schema for level in self._levels]
        for schema in schemas:
            if schema is None:
                return None
            for f in schema:
                fields.setdefault(f.name, f)
        for quantile in self._quantiles:
            quantile_fields = quantile.fields()
            if quantile_fields is None:
                return None
            fields.update((f.name, f) for f in quantile_fields)
        return pa.schema([fields[n] for n in [*self.keys, *self._outputs]])

    @property
    def metrics(self) -> SpillMetrics:
        """The counters of all its aggregators added up (peaks: the largest)."""
        parts = [self._plain.metrics] if self._plain is not None else []
        parts += [level.metrics for level in self._levels]
        parts += [quantile.metrics() for quantile in self._quantiles]
        total = _sum_metrics(parts)
        total.records_read = parts[0].records_read
        total.groups = self._groups
        return total

    def update(self, batch: Any) -> None:
        """Fold one batch into the plain aggregator and every distinct aggregate's level."""
        if self._state != "open":
            raise UsageError("update() after results() or close()")
        if self._plain is not None:
            self._plain.update(batch)
        for level in self._levels:
            level.update(batch)
        self._update_quantiles(batch)

    def _update_quantiles(self, batch: Any) -> None:
        if self._quantiles:
            schema = self._plain.schema if self._plain is not None else None
            key_types = None if schema is None else [schema.field(k).type for k in self.keys]
            for quantile in self._quantiles:
                quantile.update(batch, key_types)

    def update_plain(self, batch: Any) -> None:
        """Fold a batch into the plain aggregates only; with :meth:`update_distinct`, two
        inputs of the same groups (PySpark's partial states, and the partitions' distinct
        values: ``extagg.spark.aggregate``'s final stage)."""
        if self._state != "open":
            raise UsageError("update_plain() after results() or close()")
        if self._plain is not None:
            self._plain.update(batch)

    def update_distinct(self, batch: Any) -> None:
        """Fold a batch into the ``count_distinct`` levels only (see :meth:`update_plain`)."""
        if self._state != "open":
            raise UsageError("update_distinct() after results() or close()")
        for level in self._levels:
            level.update(batch)

    def update_quantiles(self, batch: Any) -> None:
        """Add a batch's values to the quantiles only (see :meth:`update_plain`; their counts
        come with the plain aggregates, as ``quantile_counts`` says)."""
        if self._state != "open":
            raise UsageError("update_quantiles() after results() or close()")
        self._update_quantiles(batch)

    def results(self, *, ordered: bool = True) -> Iterator[pa.RecordBatch]:
        """Every group once, in hash order of the keys. Destructive; call once.

        ``ordered``: accepted as :meth:`HashAggregator.results` does; the groups come in hash
        order either way (the levels are joined on their hashes)."""
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
            # level two folds level one before anything is read; the levels that set rows
            # aside first: closing their files releases their write buffers for the others
            for level in sorted(self._levels, key=lambda level: not level.partitioned):
                level.finish_input()
            streams = [a.hashed_results() for a in [self._plain] if a is not None]
            for quantile in self._quantiles:  # each adds its columns to the plain results
                streams[0] = quantile.attach(streams[0])
            streams += [level.hashed_results() for level in self._levels]
            buffers = JoinBuffers(self._tmm, f"{self._name}/join")
            for hashes, batch in join_hashed(streams, self.keys, self._outputs, buffers):
                self._groups += batch.num_rows
                yield hashes, batch
                if self._state == "closed":
                    raise UsageError(
                        f"{self._name} was closed while its results were being read: the "
                        "results not read yet are gone (read them to the end, or stop, before "
                        "close())"
                    )
        finally:
            self.close()

    def close(self) -> None:
        """Close every aggregator (memory released, files deleted). Idempotent."""
        self._state = "closed"
        if self._plain is not None:
            self._plain.close()
        for level in self._levels:
            level.close()
        for quantile in self._quantiles:
            quantile.close()

    def __enter__(self) -> DistinctAggregator:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


class JoinError(ExtaggError, RuntimeError):
    """The aggregators' outputs to be joined do not hold the same groups (a bug)."""


def _canon(value: Any) -> Any:
    return ("<nan>",) if isinstance(value, float) and math.isnan(value) else value


class HeldBuffers(MemoryConsumer):
    """Buffers accounted to the task's memory manager beside the aggregators; not spillable:
    a grant refused even after the aggregators spilled raises
    :class:`~extagg.MemoryLimitError` naming ``what`` they are for."""

    what = "buffers"

    def try_hold(self, nbytes: int) -> bool:
        """Hold exactly ``nbytes`` if granted (else hold what was held before)."""
        if nbytes <= self.used:
            self.hold(nbytes)
            return True
        need = nbytes - self.used
        granted = self.acquire_memory(need)
        if granted < need:
            self.free_memory(granted)
            return False
        return True

    def hold(self, nbytes: int) -> None:
        """Hold exactly ``nbytes`` (acquire the growth, free the rest)."""
        if nbytes > self.used:
            need = nbytes - self.used
            granted = self.acquire_memory(need)
            if granted < need:
                mm = self.task_memory_manager.memory_manager
                raise MemoryLimitError(
                    f"{self.name}: {self.what} needs {format_size(nbytes)} of buffers but the "
                    f"memory manager granted {format_size(self.used)} (max_memory "
                    f"{format_size(mm.max_memory)}; {describe_holders(mm)})"
                )
        elif nbytes < self.used:
            self.free_memory(self.used - nbytes)


class JoinBuffers(HeldBuffers):
    """The join's buffered rows (each stream's unjoined rows, the batch being built)."""

    what = "the join of count_distinct results"


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


#: a distinct aggregate's rows are set aside by key hash at most this many levels deep
MAX_GRACE_DEPTH = 3
#: a level's rows are set aside by key hash once its first level holds this many groups,
#: even with memory to spare: one table of every pair is slow to fill once it outgrows the
#: caches (TPC-H SF10 partsupp, 60 M pairs, no limit: 23.4 s and 4.1 GiB in one table, 18.7 s
#: and 254 MiB set aside at 1 M; SF1, 6 M pairs: 1.88 -> 1.97 s, 525 -> 121 MiB; medians)
PARTITION_FIRST_GROUPS = 1 << 20
#: the largest batch a partition file is written in (larger ones gain nothing)
MAX_ASIDE_BATCH_BYTES = 2 << 20
#: rows of a batch hashed and set aside at a time (their temporaries held for them)
GRACE_CHUNK_ROWS = 1 << 16
#: the fewest rows set aside at a time before the buffers shrink (fewer only when rows are
#: so wide that this many would take more than an eighth of the budget, or are refused)
LEAST_CHUNK_ROWS = 256
#: room for a chunk's temporaries that rows set aside keep while a merge feeds them
PINNED_CHUNK_BYTES = 64 << 10


def _sum_metrics(parts: Sequence[SpillMetrics]) -> SpillMetrics:
    """Counters added up, peaks the largest (records and groups left at 0)."""
    total = SpillMetrics()
    for m in parts:
        for field in vars(total):
            if field.startswith("peak"):
                setattr(total, field, max(getattr(total, field), getattr(m, field)))
            elif field not in ("records_read", "groups"):
                setattr(total, field, getattr(total, field) + getattr(m, field))
    return total


class DistinctLevel:
    """One ``count_distinct(column)`` by ``keys``: its two levels, set apart by key hash
    once its first level spills.

    At first the first level groups ``keys + [column]`` and, at the end, the second counts its
    groups by ``keys``. The pairs of a first level that spills rarely come back together (6 M
    TPC-H (part, supplier, order) triples at 1/8 of their table spilled seven sorted runs, all
    merged back before the second level could count them), and a table of tens of millions of
    pairs is slow to fill even in memory. So at its first spill, or once it holds
    :data:`PARTITION_FIRST_GROUPS` pairs (the top level only), the level sets its rows aside
    instead, in :data:`~extagg.columnar.partition_files.NUM_PARTITIONS`
    files by the top bits of the hash of ``keys`` (the pairs its first level holds, then the
    input as it comes), and at the end aggregates each partition with both levels of a child
    level: a sixteenth of the groups, usually in memory (a child that spills partitions again,
    by the next bits). The children's outputs, one partition after the other, are in hash
    order of ``keys``, as the second level's would be. ``depth``: the partitioning level of a
    child (its key hashes share their top ``4 * depth`` bits).
    """

    def __init__(
        self,
        keys: Sequence[str],
        output: str,
        column: str,
        options: dict[str, Any],
        name: str,
        depth: int = 0,
    ) -> None:
        self.keys = list(keys)
        self.output = output
        self.column = column
        #: the input columns it reads
        self.columns = self.keys if column in self.keys else [*self.keys, column]
        self.name = name
        self.depth = depth
        self._options = options
        self.first = HashAggregator(self.columns, F.NO_AGGREGATES, name=f"{name}.1", **options)
        counts = {output: (column, "count")}
        self.second = HashAggregator(self.keys, counts, name=f"{name}.2", **options)
        if depth:
            self.second.nest(depth)
        #: a global count_distinct has one group: nothing to partition by
        self._may_partition = (
            bool(self.keys) and depth < MAX_GRACE_DEPTH and self.first.force_spill_rows is None
        )
        self._aside: _RowsAside | None = None
        self._first_schema: pa.Schema | None = None
        self._children = SpillMetrics()  # the partitions' levels', added as each is done
        self._merge_limit: int | None = None

    def limit_merge_memory(self, nbytes: int) -> None:
        """Its merges hold at most ``nbytes`` of read buffers each (see
        :meth:`HashAggregator.limit_merge_memory`): the second level's, and in a partition's
        level the first's, which runs while the other aggregates' results are being merged
        (the top level's runs before: limited, its smaller run batches had made a query of
        five ``count_distinct`` at 2 MiB three times slower)."""
        self._merge_limit = nbytes
        if self.depth:
            self.first.limit_merge_memory(nbytes)
        self.second.limit_merge_memory(nbytes)

    def share_spill_dirs(self, runs: RunSet[Any]) -> None:
        """Write every file into the spill dirs of ``runs`` (a parent's, which cleans up)."""
        self.first.share_spill_dirs(runs)
        self.second.share_spill_dirs(runs)

    @property
    def partitioned(self) -> bool:
        """Whether its rows are being set aside by key hash."""
        return self._aside is not None

    @property
    def schema(self) -> pa.Schema | None:
        """Keys then the count (known once a first batch came)."""
        if self.second.schema is not None:
            return self.second.schema
        first = self._first_schema or self.first.schema
        if first is None:
            return None
        keys = [first.field(k) for k in self.keys]
        return pa.schema([*keys, pa.field(self.output, pa.int64())])

    @property
    def metrics(self) -> SpillMetrics:
        """Both levels' counters, its partitions' and their levels'."""
        aside = self._aside.metrics if self._aside is not None else SpillMetrics()
        metrics = [self.first.metrics, self.second.metrics, aside, self._children]
        total = _sum_metrics(metrics)
        total.records_read = self.first.metrics.records_read + aside.records_read
        return total

    def update(self, batch: Any) -> None:
        """Fold one batch (any form :meth:`HashAggregator.update` takes)."""
        if self._aside is not None:
            self._aside.write_batch(batch)
            return
        self.first.update(batch)
        self._maybe_partition()

    def update_columns(self, cols: dict[str, Column], n: int) -> None:
        """Fold ``n`` rows of input columns (a partition's, read back)."""
        if self._aside is not None:
            self._aside.write(cols, n)
            return
        self.first.update_columns(cols, n)
        self._maybe_partition()

    def _maybe_partition(self) -> None:
        """After the first level's first spill, or once it holds more than
        :data:`PARTITION_FIRST_GROUPS` groups, set the rows aside by key hash from now on
        (unless the buffers for that are refused: the level then goes on as it was)."""
        first = self.first
        if not self._may_partition:
            return
        spilled = first.metrics.spill_count > 0
        large = self.depth == 0 and first.groups_in_memory > PARTITION_FIRST_GROUPS
        if not (spilled or large):
            return
        self._may_partition = False
        limit = max(
            MIN_BUFFER_BYTES, min(MAX_ASIDE_BATCH_BYTES, buffer_bytes(first.budget.max_memory) // 2)
        )
        aside = _RowsAside(
            first.task_memory_manager,
            f"{self.name}/aside",
            self,
            self.second.runs,
            limit,
            first.budget.max_memory,
        )
        while not aside.try_hold(aside.base_bytes):
            if not aside.shrink_buffers():
                aside.close()
                log.info("%s: no memory to set rows aside by key hash; spilling on", self.name)
                return
        log.info(
            "%s: its first level %s; setting its rows aside by the hash of %s from now on "
            "(partitioning depth %d)", self.name,
            "spilled" if spilled else f"holds {first.groups_in_memory} groups", self.keys,
            self.depth,
        )  # fmt: skip
        self._first_schema = first.schema
        self._aside = aside
        aside.metrics.spill_count += 1
        aside.pin()
        self._limit_first_merge()
        try:
            for batch in first.results(ordered=False):  # its pairs so far, each once
                aside.write_batch(batch)
        finally:
            aside.pinned = False
            first.close()
        aside.metrics.records_read = 0  # the first level counted the input rows of those

    def _limit_first_merge(self) -> None:
        """Let the first level's merge hold at most half of the budget. A first level that
        spilled merges its runs into what its rows feed, the second level or the rows set
        aside, which need memory to start and to grow meanwhile; the merge's read buffers
        cannot be spilled, and all of the budget they took left the second level none (a
        global count_distinct of 146 k strings at 2 MiB, a level with ``force_spill_rows``,
        one nested too deep to partition again: "needs ... to start, 0.0 B held")."""
        half = self.first.budget.max_memory // 2
        limit = half if self._merge_limit is None else min(half, self._merge_limit)
        self.first.limit_merge_memory(limit)

    def finish_input(self) -> None:
        """No more input: the first level's groups folded into the second, or the rows set
        aside closed in their files."""
        if self._aside is not None:
            self._aside.finish()
            release_free_memory()
            return
        self._limit_first_merge()
        for batch in self.first.results(ordered=False):  # level two folds level one
            self.second.update(batch)
        self.first.close()

    def hashed_results(self) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
        """Keys and counts in hash order of the keys, with the hashes (after
        :meth:`finish_input`)."""
        if self._aside is None:
            return self.second.hashed_results()
        return self._partition_results(self._aside)

    def _partition_results(self, aside: _RowsAside) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
        try:
            for part, path in enumerate(aside.paths):
                if path is None:
                    continue
                # one thread: a partition's hashes are rotated (HashAggregator.nest), which
                # the thread partitions' own rotation does not compose with (as for the
                # partitions of a HashAggregator)
                child = DistinctLevel(
                    self.keys, self.output, self.column, dict(self._options, threads=1),
                    f"{self.name}/p{self.depth + 1}.{part}", self.depth + 1,
                )  # fmt: skip
                child.share_spill_dirs(self.second.runs)
                if self._merge_limit is not None:
                    child.limit_merge_memory(self._merge_limit)
                # its pairs are at most its rows: a table that size is not grown step by step
                child.first.expect_groups(aside.rows_in(path))
                rows = aside.read(path)
                try:
                    for cols, n in rows:
                        child.update_columns(cols, n)
                    child.finish_input()
                    yield from child.hashed_results()
                finally:
                    rows.close()  # the file closed and deleted now, even after an error
                    child.close()
                    release_free_memory()
                    done = child.metrics
                    self._children.absorb(done)
                    self._children.peak_memory_bytes = max(
                        self._children.peak_memory_bytes, done.peak_memory_bytes
                    )
        finally:
            self.close()

    def close(self) -> None:
        """Release all memory, delete every file. Idempotent."""
        if self._aside is not None:
            self._aside.close()
        self.first.close()
        self.second.close()


class _RowsAside(HeldBuffers):
    """A :class:`DistinctLevel`'s rows set aside in partition files by the hash of its keys,
    and the buffers that takes: accounted, and spillable between writes (the buffered rows
    written out, the buffers dropped), because they are large (up to half of a small budget)
    and another level, or another ``count_distinct``, may need the memory while no rows come
    here: with two ``count_distinct`` of a string key at 8 MiB, one level's buffers held
    4 MiB while the other's merge could not start."""

    what = "setting count_distinct rows aside by key hash"

    def __init__(
        self,
        tmm: Any,
        name: str,
        level: DistinctLevel,
        spill_runs: RunSet[Any],
        limit: int,
        max_memory: int,
    ) -> None:
        super().__init__(tmm, name)
        self.keys = level.keys
        self.columns = level.columns
        self.rotation = PARTITION_BITS * level.depth
        self.metrics = SpillMetrics()
        self.runs: RunSet[ColumnBlock] = RunSet(
            spill_runs.spill_dirs, spill_runs.compression, self.metrics
        )
        self.writer: PartitionWriter | None = PartitionWriter(self.runs, limit)
        #: what writing holds besides a chunk's temporaries
        self.base_bytes = held_bytes(limit, IO_COPIES)
        self.chunk_bytes = max_memory // 8
        self.paths: list[str | None] = []
        self._layout: KeyLayout | None = None
        self._schema: dict[str, tuple[str, pa.DataType]] = {}
        #: held while rows go into the writer's buffers: a spill then frees nothing
        self._writing = threading.Lock()
        #: while the first level's pairs so far are moved here: its merge, which feeds them,
        #: may take all but the smallest buffers (all of them left no room to write its rows)
        self.pinned = False
        #: the temporaries of the smallest chunk (:data:`LEAST_CHUNK_ROWS` rows, fewer of
        #: wide rows) of the widest rows written yet
        self._least_chunk_bytes = 0

    def spill(self, size: int, trigger: Any) -> int:
        """Write the buffered rows out and release the buffers (none while a chunk is being
        written, or after the input ended). While :attr:`pinned` the smallest buffers stay
        held, the rest released."""
        writer = self.writer
        if writer is None or not self.used:
            return 0
        if not self._writing.acquire(blocking=False):
            return 0
        try:
            with deferred_interrupts():
                writer.release_buffers()
            if self.pinned:  # rows keep coming from the merge asking: the smallest buffers
                writer.limit = MIN_BUFFER_BYTES
                self.base_bytes = held_bytes(writer.limit, IO_COPIES)
        finally:
            self._writing.release()
        keep = self.base_bytes + self._least_chunk_bytes if self.pinned else 0
        freed = max(0, self.used - keep)
        log.debug("%s: buffered rows written, %s of buffers released", self.name,
                  format_size(freed))  # fmt: skip
        if freed:
            self.free_memory(freed)
        return freed

    def pin(self) -> None:
        """Keep the smallest buffers and room for a chunk from now on (see :attr:`pinned`),
        held before the merge feeding it starts: that takes what is free. Buffers above a
        quarter of the budget are shrunk first: the merge's read buffers may belong to
        another task (a thread-local table of a threaded fold), whose memory manager cannot
        make these spill ("cannot merge 3 sorted runs ... granted 0.0 B" with 2 threads)."""
        self._least_chunk_bytes = max(self._least_chunk_bytes, PINNED_CHUNK_BYTES)
        while self.base_bytes > self.chunk_bytes * 2 and self.shrink_buffers():
            pass
        self.hold(min(self.used, self.base_bytes + self._least_chunk_bytes))
        self.try_hold(self.base_bytes + self._least_chunk_bytes)
        self.pinned = True

    def hold(self, nbytes: int) -> None:
        """:meth:`HeldBuffers.hold`; while :attr:`pinned` the room for the smallest chunk is
        kept (given back between chunks, the merge feeding them took it)."""
        if self.pinned:
            nbytes = max(nbytes, min(self.used, self.base_bytes + self._least_chunk_bytes))
        super().hold(nbytes)

    def write_batch(self, batch: Any) -> None:
        """Set aside every row of a batch (any form ``HashAggregator.update`` takes)."""
        known = {name: arrow_type for name, (_kind, arrow_type) in self._schema.items()}
        for rb in iter_record_batches(batch, GRACE_CHUNK_ROWS, self.columns):
            self.write(to_columns(rb, self.columns, known), rb.num_rows)

    def write(self, cols: dict[str, Column], n: int) -> None:
        """Set aside ``n`` rows of input columns, a chunk at a time."""
        writer = self.writer
        if writer is None:
            raise UsageError(f"{self.name}: rows set aside after the input ended")
        cols = {name: cols[name] for name in self.columns}
        if self._layout is None:
            key_cols = [cols[k] for k in self.keys]
            kinds = [c.kind for c in key_cols]
            self._layout = KeyLayout(self.keys, kinds, [c.arrow_type for c in key_cols])
            self._schema = {name: (c.kind, c.arrow_type) for name, c in cols.items()}
        for name, col in cols.items():
            kind, arrow_type = self._schema[name]
            if col.kind != kind or not (col.is_var or col.arrow_type == arrow_type):
                raise TypeError(
                    f"column {name!r} changed type between update() calls: it was "
                    f"{arrow_type}, this batch has {col.arrow_type}"
                )
        # a chunk's temporaries: the keys' words and hashes, the rows' order, a copy of the
        # rows at most; chunks of at most an eighth of the budget
        # (rows of a few KB: fewer than LEAST_CHUNK_ROWS, down to one at a time, so that a
        # chunk never asks for more than the budget: 256 rows of 5,000-byte values wanted
        # 2.6 MiB of a 2 MiB budget)
        row_bytes = 2 * sum(c.nbytes() for c in cols.values()) // max(1, n) + 40
        least = max(1, min(LEAST_CHUNK_ROWS, self.chunk_bytes // row_bytes))
        step = max(least, min(GRACE_CHUNK_ROWS, self.chunk_bytes // row_bytes))
        self._least_chunk_bytes = max(self._least_chunk_bytes, row_bytes * least)
        while not self.try_hold(self.base_bytes + row_bytes * min(n, step)):
            if step > least:  # what others hold cannot be spilled (a merge, the join): less at once
                step //= 2
            elif self.shrink_buffers():
                continue
            elif step > 1:  # the smallest buffers refused too: fewer rows yet
                step //= 2
                least = step
            else:
                break  # the hold below raises MemoryLimitError, naming what it needed
        for start in range(0, n, step):
            stop = min(n, start + step)
            part = cols if stop - start == n else {k: c.slice(start, stop) for k, c in cols.items()}
            self.hold(self.base_bytes + row_bytes * (stop - start))
            hashes = self._layout.encode([part[k] for k in self.keys]).hashes
            if self.rotation:
                hashes = rotate_left(hashes, self.rotation)
            with self._writing, deferred_interrupts():
                writer.write(part, hashes)
            self.metrics.records_read += stop - start

    def shrink_buffers(self) -> bool:
        """Halve the rows buffered per partition (those buffered now written first), down to
        :data:`MIN_BUFFER_BYTES`; False when they are that small already. Under a tiny budget
        whose rest others hold unspillable (a merge, the join), smaller batches beat a
        ``MemoryLimitError``: at 2 MiB a nested level's buffers wanted 896 KiB."""
        writer = self.writer
        if writer is None or writer.limit <= MIN_BUFFER_BYTES:
            return False
        with self._writing, deferred_interrupts():
            writer.release_buffers()
        writer.limit = max(MIN_BUFFER_BYTES, writer.limit // 2)
        self.base_bytes = held_bytes(writer.limit, IO_COPIES)
        return True

    def finish(self) -> None:
        """Close the partition files (their paths in :attr:`paths`); the buffers released."""
        writer, self.writer = self.writer, None
        if writer is None:
            return
        try:
            self.paths = writer.finish()
        except BaseException:
            writer.abort()
            raise
        self.metrics.memory_bytes_spilled += self.metrics.raw_bytes_spilled  # rows as held
        self.hold(0)

    def rows_in(self, path: str) -> int:
        """The rows of one partition file (its footer's count)."""
        with RunReader(path) as reader:
            return sum(int(b.count) for b in reader.batches)

    def read(self, path: str) -> Generator[tuple[dict[str, Column], int], None, None]:
        """The rows of one partition file as input columns, a batch at a time (its largest
        batch's copies held meanwhile); the file deleted once read."""
        started = time.perf_counter()
        try:
            with RunReader(path) as reader:
                largest = max((b.raw_length for b in reader.batches), default=0)
                self.hold(IO_COPIES * largest)
                for i in range(len(reader.batches)):
                    block: ColumnBlock = reader.read_block(i)
                    yield block_to_columns(block, self._schema), len(block)
                    del block
        finally:
            self.runs.remove(path)
            self.paths = [None if p == path else p for p in self.paths]
            self.hold(0)
            self.metrics.merge_time_s += time.perf_counter() - started

    def close(self) -> None:
        """Delete every partition file; release the buffers. Idempotent."""
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.abort()
        for path in self.paths:
            if path is not None:
                self.runs.remove(path)
        self.paths = []
        self.close_memory()

"""Quantiles (``median``, ``quantile_cont``, ``quantile_disc``) in bounded memory.

A quantile needs every value of its group in order, so it has no fixed-size state to fold.
Each quantile column is instead sorted, beside the group-by, by ``(key hash, keys, value)``
with the external sort (:class:`~extagg.columnar.sort.ExternalSort`: runs on disk when its
memory is not granted, merged back k ways): each group's non-null values come out together,
in order, and the groups in the order the aggregator's results come in (hash order; keys
sharing a hash, a 64-bit collision, ordered by the keys). The plain aggregator counts each
group's non-null values (a hidden ``count(column)``), so as its results stream out the
position of each group's quantile in the sorted values is known before they are read: the
values are read once, forward, one sorted batch at a time, never a whole group.

Definitions (DuckDB's, which tests compare against): of ``n`` sorted values ``v[0..n-1]``,
``quantile_disc(q)`` is ``v[max(ceil(q * n) - 1, 0)]`` (Spark's ``percentile_approx`` gives
the same, exactly here), ``quantile_cont(q)`` interpolates ``v[lo] + (v[hi] - v[lo]) * (q(n -
1) - lo)`` around ``q(n - 1)``; ``median`` is ``quantile_cont(0.5)``. ``quantile_cont`` of
integers is a ``float64``, of a ``float32`` a ``float32``, of a decimal the same decimal (the
interpolated value truncated to its scale, as DuckDB does for the width), of a date a
microsecond timestamp, of a timestamp, duration or time the same type (the gap's fraction
rounded half up to the unit); of text, binary or booleans the lower of the two values
(``quantile_disc``). NaN sorts after every number; nulls are left out; a group with no value
gets a null.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from extagg.columnar.columns import iter_record_batches, to_columns
from extagg.columnar.functions import AggregateRequest
from extagg.columnar.keys import KeyLayout
from extagg.columnar.sort import ExternalSort, sort_indices
from extagg.errors import ExtaggError
from extagg.memory import TaskMemoryManager
from extagg.metrics import SpillMetrics

__all__ = ["QuantileColumn", "QuantileJoinError", "quantile_output_type"]

#: the sorted input's key hash column
HASH = "__quantile_hash"
#: the sorted input's value column
VALUE = "__quantile_value"
#: rows of the batches added to the sort at most
SORT_BATCH_ROWS = 65_536
#: a sort buffer's batches, their sort columns combined into one chunk, the sorted copy: what
#: writing a run holds at its peak, in the batches' size (every column is sorted by)
SORT_COPIES = 3


class QuantileJoinError(ExtaggError, RuntimeError):
    """The sorted values do not line up with the aggregator's groups (a bug, never silent)."""


def _value_type(typ: pa.DataType) -> pa.DataType:
    """The type a quantile's values are sorted as: a dictionary's values, a half float as a
    ``float32``, another width of decimal of up to 38 digits as ``decimal128`` (the type the
    other aggregates read it as), a string or binary view as a large string or binary (Arrow
    sorts no views)."""
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    if _is_view(typ):
        return pa.large_string() if pa.types.is_string_view(typ) else pa.large_binary()
    if pa.types.is_fixed_size_binary(typ):  # as its bytes (a uuid's are its order)
        return pa.binary()
    if pa.types.is_float16(typ):
        return pa.float32()
    if pa.types.is_decimal(typ) and typ.bit_width != 128 and typ.precision <= 38:
        return pa.decimal128(typ.precision, typ.scale)
    return typ


def _is_view(typ: pa.DataType) -> bool:
    return pa.types.is_string_view(typ) or pa.types.is_binary_view(typ)


def _sortable(typ: pa.DataType) -> bool:
    return (
        pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ)
        or pa.types.is_decimal(typ) or pa.types.is_temporal(typ) or pa.types.is_string(typ)
        or pa.types.is_large_string(typ) or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
    )  # fmt: skip


def _interpolates(typ: pa.DataType) -> bool:
    """Whether ``quantile_cont`` interpolates values of ``typ`` (else it is discrete)."""
    return (
        pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ)
        or pa.types.is_temporal(typ)
    )  # fmt: skip


def quantile_output_type(func: str, typ: pa.DataType) -> pa.DataType:
    """The result type of ``func`` (``quantile_cont``/``quantile_disc``) over values of
    ``typ`` (as :func:`_value_type` gives it)."""
    if func == "quantile_disc" or not _interpolates(typ):
        return typ
    if pa.types.is_integer(typ) or typ == pa.float64():
        return pa.float64()
    if pa.types.is_date(typ):
        return pa.timestamp("us")
    return typ  # float32, decimals, timestamps, durations, times


class QuantileColumn:
    """The quantiles of one column by ``keys``: its values sorted by (key hash, keys, value),
    read back beside the aggregator's results (:meth:`attach`).

    Parameters
    ----------
    keys
        The group keys.
    column
        The column whose quantiles are asked for.
    requests
        The quantile aggregates of ``column`` (their outputs, functions and fractions).
    count_output
        The plain aggregator's output that counts ``column``'s non-null values per group.
    tmm, spill_dirs
        The memory manager the sort's buffers are granted by, and where its runs go.
    max_buffer_bytes
        The sort's buffer at most (its sort copies it; a share of the budget).
    name
        Its name in logs and errors.
    spark_percentile
        Interpolate numbers as Spark's ``percentile`` does (in doubles, ``lo + (hi - lo) d``,
        equal neighbours, also two NaNs, as they are) instead of as DuckDB does per type.
    """

    def __init__(
        self,
        keys: Sequence[str],
        column: str,
        requests: Sequence[AggregateRequest],
        count_output: str,
        tmm: TaskMemoryManager,
        spill_dirs: Any,
        max_buffer_bytes: int,
        name: str,
        spark_percentile: bool = False,
    ) -> None:
        self.name = name
        self.spark_percentile = spark_percentile
        self.keys = list(keys)
        self.column = column
        self.requests = list(requests)
        self.count_output = count_output
        #: the input columns it reads
        self.columns = self.keys if column in self.keys else [*self.keys, column]
        self._tmm, self._spill_dirs, self._max_buffer = tmm, spill_dirs, max_buffer_bytes
        self._sort: ExternalSort | None = None
        self._merge_limit: int | None = None
        self._layout: KeyLayout | None = None
        self._schema: pa.Schema | None = None  # of the sorted rows
        #: the input's type where its values are sorted as another that is not a result's
        #: (a string or binary view, a fixed-size binary): a quantile is one of its values
        self._shown_type: pa.DataType | None = None
        self.records_read = 0

    # -- input --------------------------------------------------------------------------------

    @property
    def value_type(self) -> pa.DataType | None:
        """The values' type (known after the first batch)."""
        return None if self._schema is None else self._schema.field(VALUE).type

    def fields(self) -> list[pa.Field] | None:
        """The output fields, once the values' type is known."""
        typ = self.value_type
        if typ is None:
            return None
        return [pa.field(r.output, self._output_type(r.func, typ)) for r in self.requests]

    def _output_type(self, func: str, value_type: pa.DataType) -> pa.DataType:
        """A request's result type (a view's quantile is one of its values, as a view)."""
        return self._shown_type or quantile_output_type(func, value_type)

    def update(self, batch: Any, key_types: Sequence[pa.DataType] | None) -> None:
        """Add one input batch's non-null values with their keys' hashes. ``key_types``: the
        aggregator's key types (the keys are sorted as its results give them)."""
        for rb in iter_record_batches(batch, SORT_BATCH_ROWS, self.columns):
            self._add(rb, key_types)

    def _key_fields(self) -> list[pa.Field]:
        assert self._schema is not None
        return [self._schema.field(i) for i in range(1, len(self._schema) - 1)]

    def _start(self, rb: pa.RecordBatch, key_types: Sequence[pa.DataType] | None) -> None:
        written = rb.schema.field(self.column).type
        typ = _value_type(written)
        plain = written.value_type if pa.types.is_dictionary(written) else written
        shown = _is_view(plain) or pa.types.is_fixed_size_binary(plain)
        self._shown_type = plain if shown else None
        if not _sortable(typ):
            func = self.requests[0].func
            raise TypeError(
                f"aggregate {self.requests[0].output!r}: {func}({self.column!r}) is not "
                f"supported for column {self.column!r} of type {written}; a quantile needs "
                "numbers, decimals, dates or times, text or binary"
            )
        types = (
            list(key_types)
            if key_types is not None
            else [rb.schema.field(k).type for k in self.keys]
        )
        key_cols = to_columns(rb, self.keys)
        cols = [key_cols[k] for k in self.keys]
        self._layout = KeyLayout(self.keys, [c.kind for c in cols], [c.arrow_type for c in cols])
        fields = [pa.field(HASH, pa.uint64())]
        if not self._layout.hash_is_key:  # else equal hashes are equal keys: no ties to order
            fields += [pa.field(f"k{i}", _value_type(t)) for i, t in enumerate(types)]
        fields.append(pa.field(VALUE, typ))
        self._schema = pa.schema(fields)
        order = [f.name for f in fields]
        self._sort = ExternalSort(
            self._schema, order, self._tmm, self._spill_dirs,
            max_buffer_bytes=self._max_buffer, name=f"{self.name} sort", copies=SORT_COPIES,
        )  # fmt: skip
        self._sort.max_merge_bytes = self._merge_limit

    def _add(self, rb: pa.RecordBatch, key_types: Sequence[pa.DataType] | None) -> None:
        if self._schema is None:
            self._start(rb, key_types)
        assert self._schema is not None and self._sort is not None
        assert self._layout is not None
        n = rb.num_rows
        key_cols = to_columns(rb, self.keys)
        hashes = self._layout.encode([key_cols[k] for k in self.keys], n).hashes
        arrays: list[pa.Array] = [pa.array(hashes, pa.uint64())]
        for name, field in zip(self.keys, self._key_fields(), strict=False):
            arrays.append(_as_type(rb.column(name), field.type, name))
        values = _as_type(rb.column(self.column), self._schema.field(VALUE).type, self.column)
        arrays.append(values)
        sorted_rows = pa.RecordBatch.from_arrays(arrays, schema=self._schema)
        if values.null_count:
            sorted_rows = sorted_rows.filter(values.is_valid())
        self.records_read += n
        rows = sorted_rows.num_rows
        if not rows:
            return
        # pieces of at most a quarter of the sort's buffer: a piece is always let through
        piece = self._max_buffer // 4 // SORT_COPIES
        step = max(1, min(rows, piece // max(1, sorted_rows.nbytes // rows)))
        for at in range(0, rows, step):
            self._sort.add(sorted_rows.slice(at, step))

    def limit_merge_memory(self, nbytes: int) -> None:
        """Its sort's merge holds at most ``nbytes`` of read buffers (the aggregator's
        partitions need the rest while both are read)."""
        self._merge_limit = nbytes
        if self._sort is not None:
            self._sort.max_merge_bytes = nbytes

    def close(self) -> None:
        """Release its sort's memory and remove its runs. Idempotent."""
        if self._sort is not None:
            self._sort.close()

    # -- output -------------------------------------------------------------------------------

    def metrics(self) -> SpillMetrics:
        """Its sort's runs as spills."""
        m = SpillMetrics()
        if self._sort is not None:
            m.spill_count = m.num_spill_files = self._sort.buffer.runs_written
            m.disk_bytes_spilled = self._sort.buffer.bytes_written
            m.memory_bytes_spilled = self._sort.buffer.memory_written
        return m

    def attach(
        self, results: Iterator[tuple[np.ndarray, pa.RecordBatch]]
    ) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
        """The aggregator's ``results`` (hash order, with :attr:`count_output`) with this
        column's quantiles appended to each batch."""
        sorted_batches = iter(()) if self._sort is None else self._sort.sorted()
        cursor = _Cursor(sorted_batches)
        value_type = self.value_type
        start = 0  # the sorted position of the next group's first value
        for hashes, batch in _whole_hash_runs(results):
            # a count summed from no partial count (a global aggregate of nothing) is null
            counts = pc.fill_null(batch.column(self.count_output), 0)
            counts = counts.to_numpy(zero_copy_only=False)
            counts = counts.astype(np.int64, copy=False)
            order = self._group_order(hashes, batch)
            in_order = counts if order is None else counts[order]
            starts = start + np.cumsum(in_order) - in_order
            start += int(in_order.sum())
            columns = self._quantiles(cursor, starts, in_order, value_type,
                                      hashes if order is None else hashes[order])  # fmt: skip
            if order is not None:  # back to the results' order
                back = pa.array(np.argsort(order, kind="stable"))
                columns = [c.take(back) for c in columns]
            for request, column in zip(self.requests, columns, strict=True):
                batch = batch.append_column(request.output, column)
            yield hashes, batch
        extra = cursor.rows_after(start)
        if extra:
            raise QuantileJoinError(
                f"{extra} sorted values of {self.column!r} belong to no group of the results"
            )

    def _group_order(self, hashes: np.ndarray, batch: pa.RecordBatch) -> np.ndarray | None:
        """The order of a batch's groups in the sort (by hash, then keys: groups sharing a
        hash sorted by their keys as the sort does), or None when it is the batch's own."""
        if len(hashes) < 2 or not np.any(hashes[1:] == hashes[:-1]):
            return None
        assert self._schema is not None
        if not self._key_fields():  # keys whose hash is the key: no two groups share one
            raise QuantileJoinError("two groups share a key hash that is their key")
        table = pa.table(
            [pa.array(hashes, pa.uint64())]
            + [
                _as_type(batch.column(k), f.type, k)
                for k, f in zip(self.keys, self._key_fields(), strict=True)
            ],
            names=self._schema.names[:-1],
        )
        return sort_indices(table, [(n, "ascending") for n in table.column_names]).to_numpy()

    def _quantiles(
        self,
        cursor: _Cursor,
        starts: np.ndarray,
        counts: np.ndarray,
        value_type: pa.DataType | None,
        hashes: np.ndarray,
    ) -> list[pa.Array]:
        """Each request's values for groups of ``counts`` values from ``starts`` (sorted
        positions)."""
        if value_type is None:  # no batch at all: no group has a value
            return [pa.nulls(len(counts), pa.null()) for _ in self.requests]
        has = counts > 0
        n, first = counts[has], starts[has]
        wanted: list[np.ndarray] = []  # sorted positions: each request's low, then its high
        parts: list[np.ndarray | None] = []  # each request's fractions between them, or None
        for r in self.requests:
            q = float(r.fraction if r.fraction is not None else 0.5)
            if r.func == "quantile_cont" and _interpolates(value_type):
                position = q * (n - 1).astype(np.float64)
                lo = np.floor(position).astype(np.int64)
                wanted += [first + lo, first + np.minimum(lo + 1, n - 1)]
                parts.append(position - lo)
            else:
                wanted.append(first + np.maximum(np.ceil(q * n).astype(np.int64) - 1, 0))
                parts.append(None)
        everything = np.concatenate(wanted)
        order = np.argsort(everything, kind="stable")
        values, value_hashes = cursor.take(everything[order])
        if not len(values):  # no group of these has a value: typed, as the interpolation reads
            values = pa.array([], value_type)
        back = np.empty_like(order)
        back[order] = np.arange(len(order))
        values = values.take(pa.array(back))
        value_hashes = value_hashes[back]
        groups = len(n)
        out, at = [], 0
        for r, part in zip(self.requests, parts, strict=True):
            low = values.slice(at, groups)
            if not np.array_equal(value_hashes[at : at + groups], hashes[has]):
                raise QuantileJoinError(
                    f"the sorted values of {self.column!r} do not line up with the groups"
                )
            at += groups
            if part is None:
                picked = low
            else:
                high = values.slice(at, groups)
                picked = _interpolated(low, high, part, value_type, self.spark_percentile)
                at += groups
            out.append(_spread(picked, has, self._output_type(r.func, value_type)))
        return out


def _as_type(values: pa.Array | pa.ChunkedArray, typ: pa.DataType, name: str) -> pa.Array:
    """A batch's column as the type its sort column has (a dictionary decoded)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if values.type == typ:
        return values
    try:
        return values.cast(typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise TypeError(
            f"column {name!r} changed type between batches: it was {typ}, this batch has "
            f"{values.type}"
        ) from exc


def _whole_hash_runs(
    results: Iterator[tuple[np.ndarray, pa.RecordBatch]],
) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
    """``results`` re-cut so that no run of equal hashes (a collision) spans two batches."""
    held: tuple[np.ndarray, pa.RecordBatch] | None = None
    for hashes, batch in results:
        if held is not None:
            hashes = np.concatenate([held[0], hashes])
            batch = pa.concat_batches([held[1], batch])
            held = None
        if not len(hashes):
            continue
        cut = int(np.searchsorted(hashes, hashes[-1], side="left"))
        if cut == 0:  # one hash throughout: wait for the next batch
            held = (hashes, batch)
            continue
        held = (hashes[cut:], batch.slice(cut))
        yield hashes[:cut], batch.slice(0, cut)
    if held is not None and len(held[0]):
        yield held


def _interpolated(
    low: pa.Array,
    high: pa.Array,
    fraction: np.ndarray,
    typ: pa.DataType,
    spark_percentile: bool = False,
) -> pa.Array:
    """``low + (high - low) * fraction`` of each pair, as DuckDB computes it for the type (as
    Spark's ``percentile`` does with ``spark_percentile``)."""
    if pa.types.is_integer(typ) or pa.types.is_floating(typ):
        lo = low.to_numpy(zero_copy_only=False).astype(np.float64)
        hi = high.to_numpy(zero_copy_only=False).astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, 1.7e308 - -1e308
            if spark_percentile:  # [-inf, 2] is NaN, [2, inf] inf, [inf, inf] and [NaN, NaN]
                same = (lo == hi) | (np.isnan(lo) & np.isnan(hi))  # themselves
                value = np.where(same, lo, lo + (hi - lo) * fraction)
                return pa.array(np.where(fraction == 0.0, lo, value), pa.float64())
            if typ == pa.float32():  # DuckDB's in doubles: [-inf, 2] at 0.5 is NaN
                value = lo + (hi - lo) * fraction
            else:  # DuckDB's form for doubles (integers too): [-inf, 2] at 0.5 is -inf
                value = lo * (1.0 - fraction) + hi * fraction
        value = np.where(fraction == 0.0, lo, value)  # inf and NaN stay themselves
        return pa.array(value, pa.float32() if typ == pa.float32() else pa.float64())
    if pa.types.is_decimal(typ):
        return _interpolated_decimals(low, high, fraction, typ)
    # dates, timestamps, durations, times: their integer counts, the fraction of the gap
    # rounded half up (DuckDB's; a date becomes microseconds)
    storage = pa.int64()
    if pa.types.is_date(typ):
        scale = 86_400_000_000 if typ == pa.date32() else 1_000
        lo = low.cast(pa.int32() if typ == pa.date32() else storage).to_numpy(zero_copy_only=False)
        hi = high.cast(pa.int32() if typ == pa.date32() else storage).to_numpy(zero_copy_only=False)
        lo, hi = lo.astype(np.int64) * scale, hi.astype(np.int64) * scale
        out_type: pa.DataType = pa.timestamp("us")
    else:
        width = pa.int32() if typ.bit_width == 32 else storage
        lo = low.cast(width).to_numpy(zero_copy_only=False).astype(np.int64)
        hi = high.cast(width).to_numpy(zero_copy_only=False).astype(np.int64)
        out_type = typ
    value = lo + np.floor((hi - lo) * fraction + 0.5).astype(np.int64)  # hi >= lo
    raw = pa.array(value, storage)
    if out_type.bit_width == 32:
        raw = raw.cast(pa.int32())
    return raw.view(out_type)


def _interpolated_decimals(
    low: pa.Array, high: pa.Array, fraction: np.ndarray, typ: pa.DataType
) -> pa.Array:
    """Decimals interpolated on their unscaled integers, truncated to the scale as DuckDB
    does: of up to 18 digits ``trunc(lo + (hi - lo) * f)`` in doubles (with NumPy), of more
    ``lo + trunc((hi - lo) * f)`` (one by one)."""
    if typ.precision <= 18:
        lo, hi = _unscaled(low), _unscaled(high)
        value = np.trunc(lo + (hi - lo).astype(np.float64) * fraction).astype(np.int64)
        value = np.where(fraction == 0.0, lo, value)
        words = np.empty(2 * len(value), dtype=np.int64)
        words[0::2], words[1::2] = value, value >> 63  # 128-bit two's complement
        return pa.Array.from_buffers(typ, len(value), [None, pa.py_buffer(words)])
    places = -typ.scale
    out = []
    for lo_d, hi_d, f in zip(low.to_pylist(), high.to_pylist(), fraction.tolist(), strict=True):
        lo_i, hi_i = int(lo_d.scaleb(typ.scale)), int(hi_d.scaleb(typ.scale))
        value = lo_i + math.trunc(float(hi_i - lo_i) * f)  # DuckDB's for 128-bit values
        out.append(Decimal(value).scaleb(places))
    return pa.array(out, typ)


def _unscaled(values: pa.Array) -> np.ndarray:
    """The unscaled integers of ``decimal128`` values of up to 18 digits (no nulls): the low
    word of each."""
    words = np.frombuffer(values.buffers()[1], dtype=np.int64)
    return words[2 * values.offset : 2 * (values.offset + len(values)) : 2]


def _spread(values: pa.Array, has: np.ndarray, typ: pa.DataType) -> pa.Array:
    """``values`` (one per group that has values) placed at the groups of ``has``, null at
    the others (placed before the cast to ``typ``: Arrow takes no views)."""
    if not bool(has.all()):
        index = np.full(len(has), -1, dtype=np.int64)
        index[has] = np.arange(int(has.sum()))
        values = values.take(pa.array(index, mask=~has))
    return values if values.type == typ else values.cast(typ)


class _Cursor:
    """Reads sorted batches forward, taking the values at ascending positions."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self._batch: pa.RecordBatch | None = None
        self._base = 0  # the position of the current batch's first row

    def _next(self) -> None:
        if self._batch is not None:
            self._base += self._batch.num_rows
        self._batch = next(self._batches, None)

    def take(self, positions: np.ndarray) -> tuple[pa.Array, np.ndarray]:
        """The values and key hashes at ``positions`` (ascending, none before the last taken)."""
        values: list[pa.Array] = []
        hashes: list[np.ndarray] = []
        i = 0
        while i < len(positions):
            while self._batch is None or positions[i] >= self._base + self._batch.num_rows:
                self._next()
                if self._batch is None:
                    raise QuantileJoinError(
                        f"the sorted values end at {self._base}; the groups count more "
                        f"({int(positions[-1]) + 1})"
                    )
            end = int(np.searchsorted(positions, self._base + self._batch.num_rows, side="left"))
            local = pa.array(positions[i:end] - self._base)
            values.append(self._batch.column(VALUE).take(local))
            hashes.append(self._batch.column(HASH).take(local).to_numpy())
            i = end
        if not values:
            return pa.array([], pa.null()), np.zeros(0, np.uint64)
        joined = pa.concat_arrays(values) if len(values) > 1 else values[0]
        return joined, np.concatenate(hashes)

    def rows_after(self, position: int) -> int:
        """The sorted rows from ``position`` on (all read, to the end)."""
        end = self._base + (0 if self._batch is None else self._batch.num_rows)
        for batch in self._batches:
            end += batch.num_rows
        return end - position

"""``aggregate(...)``: batches in, one Arrow table out."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from extagg.columnar.columns import arrow_stream, dataset_batches, is_batch, is_dataset
from extagg.columnar.distinct import DistinctAggregator, needs_levels
from extagg.columnar.functions import agg_mapping, parse_aggs
from extagg.columnar.hash_aggregator import HashAggregator
from extagg.columnar.objects import ObjectAggregator, untyped_columns
from extagg.metrics import SpillMetrics, metrics_metadata

__all__ = ["aggregate", "make_aggregator"]


def make_aggregator(
    keys: str | Sequence[str], aggs: Mapping[str, tuple[str, str]], **options: Any
) -> HashAggregator | DistinctAggregator:
    """The aggregator for a query: a :class:`HashAggregator`, or a
    :class:`~extagg.columnar.distinct.DistinctAggregator` when ``aggs`` has a
    ``count_distinct``. Both have ``update``, ``results``, ``close``, ``schema``, ``metrics``
    and ``input_columns``.

    Parameters
    ----------
    keys
        The key column(s).
    aggs
        Output name -> ``(column, function)``; ``("*", "count")`` counts rows.
    **options
        Options of :class:`HashAggregator` (``memory``, ``memory_manager``, ``spill_dirs``,
        ...).

    Returns
    -------
    HashAggregator | DistinctAggregator
        The aggregator; close it when done.
    """
    if needs_levels(aggs):
        return DistinctAggregator(keys, aggs, **options)
    return HashAggregator(keys, aggs, **options)


def _columns(keys: str | Sequence[str], aggs: Mapping[str, tuple[str, str]]) -> list[str]:
    names = [keys] if isinstance(keys, str) else list(keys) if isinstance(keys, Sequence) else []
    return [*names, *(r.column for r in parse_aggs(aggs, distinct=True) if r.column)]


def aggregate(
    source: Any,
    keys: str | Sequence[str],
    aggs: Mapping[str, tuple[str, str]] | Sequence[str] | str,
    *,
    progress: bool | Callable[[SpillMetrics], None] = False,
    **options: Any,
) -> pa.Table:
    """Group ``source`` by ``keys`` and compute ``aggs`` in one call; returns a ``pyarrow.Table``.

    Parameters
    ----------
    source
        One batch (pyarrow ``RecordBatch`` or ``Table``, pandas ``DataFrame``, dict of NumPy
        arrays), a ``pyarrow.RecordBatchReader``, a ``pyarrow.dataset.Dataset`` (scanned with
        only the columns the query reads), an object that exports Arrow data by its PyCapsule
        interface (``__arrow_c_stream__``: a Polars ``DataFrame``, a DuckDB relation; read a
        batch at a time), or an iterable of batches (read lazily).
    keys
        Grouping column name or names.
    aggs
        Output name → ``(column, function)``; ``("*", "count")`` counts rows. Or the
        ``extagg aggregate --agg`` texts: ``["n=count(*)", "total=sum(amount)"]``.
    **options
        Passed to :class:`~extagg.HashAggregator` (``memory``, ``memory_manager``,
        ``spill_dirs``, ...); ``count_distinct`` aggregates run a two-level group-by beside it.
    progress
        ``True`` shows a bar of rows folded on stderr (on a terminal; ``EXTAGG_PROGRESS=0`` turns
        it off); a callable is called after every batch with the live
        :class:`~extagg.metrics.SpillMetrics`.

    Returns
    -------
    pyarrow.Table
        Key columns then one column per aggregate, rows in key-hash order. With no input at all
        the key columns have Arrow type ``null``. The run's metrics travel with the table in its
        schema metadata: ``extagg.run_metrics(table)``.

    Raises
    ------
    ValueError, TypeError, OverflowError
        As :class:`~extagg.HashAggregator`; a budget below the engine's working minimum raises
        :class:`~extagg.BudgetError`.

    Notes
    -----
    A key or aggregated column the columnar engine cannot type (nested structs, lists and maps,
    Arrow ``null`` columns, pandas ``object`` columns of mixed values; judged on the first batch)
    is aggregated by :class:`~extagg.columnar.objects.ObjectAggregator` in the generic engine,
    under the same budget and memory manager, with results in the same form.

    O(rows) time plus the spill and merge costs of ``HashAggregator``; memory held is the
    aggregator's (bounded by the budget) plus the output table, which is in memory (one row per
    group): iterate ``HashAggregator.results()`` instead to stream large outputs.

    Examples
    --------
    >>> import pyarrow as pa
    >>> t = aggregate(pa.table({"k": ["a", "b", "a"], "v": [1, 2, 3]}), "k", {"s": ("v", "sum")})
    >>> sorted(t.to_pylist(), key=lambda r: r["k"])
    [{'k': 'a', 's': 4}, {'k': 'b', 's': 2}]
    """
    for name in ("sort", "where", "having"):
        if name in options:
            raise TypeError(
                f"aggregate() takes no {name}=: filter or sort the input or the returned "
                f"table with pyarrow (aggregate_files() takes {name}= for files)"
            )
    asked: Mapping[str, tuple[str, str]] = agg_mapping(aggs)
    stream = arrow_stream(source)  # a Polars DataFrame, a DuckDB relation: read batch by batch
    if stream is not None:
        source = stream
    bar = None
    if progress is True:
        from extagg._progress import progress_bar, progress_enabled

        bar = progress_bar(enabled=progress_enabled(True), unit=" rows", unit_scale=True)
    probe: Any = source
    batches: Iterable[Any] = [source]
    if not is_batch(source) and not is_dataset(source):  # the first batch shows the types
        try:
            it = iter(source)
        except TypeError:
            raise TypeError(
                "aggregate()'s source must be a pyarrow RecordBatch, Table, RecordBatchReader "
                "or Dataset, a pandas DataFrame, a dict of NumPy arrays, or an iterable of "
                f"them; not {type(source).__module__}.{type(source).__qualname__}"
            ) from None
        probe = next(it, None)
        if probe is None and isinstance(source, pa.RecordBatchReader):
            probe = source.schema.empty_table()  # no rows, but the types of the result
        batches = [] if probe is None else itertools.chain([probe], it)
    factory: Callable[..., Any] = make_aggregator
    if probe is not None and untyped_columns(probe, _columns(keys, asked)):
        factory = ObjectAggregator  # Python objects: the generic engine
    with factory(keys, asked, **options) as agg:
        if is_dataset(source):
            batches = dataset_batches(source, agg.input_columns)
        for batch in batches:
            before = agg.metrics.records_read
            agg.update(batch)
            if bar is not None:
                bar.update(agg.metrics.records_read - before)
            elif callable(progress):
                progress(agg.metrics)
        if bar is not None:
            bar.close()
        out = list(agg.results())
        schema = agg.schema
        meta = metrics_metadata(agg.metrics)
    if schema is not None:
        schema = schema.with_metadata(meta)
    if schema is None and out:  # a global aggregate of no input: its one row
        table = pa.Table.from_batches(out)
        return table.replace_schema_metadata(meta)
    if schema is None:
        names = [keys] if isinstance(keys, str) else list(keys)
        counts = ("count", "count_distinct", "nunique", "size")
        types = {name: pa.null() for name in names} | {
            output: pa.int64() if func.lower() in counts else pa.null()
            for output, (_column, func) in asked.items()
        }
        empty = pa.table({name: pa.array([], type=typ) for name, typ in types.items()})
        return empty.replace_schema_metadata(meta)
    return pa.Table.from_batches(out, schema=schema)

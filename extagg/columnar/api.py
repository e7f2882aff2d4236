"""``aggregate(...)``: batches in, one Arrow table out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from extagg.columnar.columns import dataset_batches, is_batch, is_dataset
from extagg.columnar.distinct import DistinctAggregator, has_distinct
from extagg.columnar.hash_aggregator import HashAggregator

__all__ = ["aggregate", "make_aggregator"]


def make_aggregator(
    keys: str | Sequence[str], aggs: Mapping[str, tuple[str, str]], **options: Any
) -> HashAggregator | DistinctAggregator:
    """The aggregator for a query: a :class:`HashAggregator`, or a
    :class:`~extagg.columnar.distinct.DistinctAggregator` when ``aggs`` has a
    ``count_distinct``. Both have ``update``, ``results``, ``close``, ``schema``, ``metrics``
    and ``input_columns``; ``options`` as for :class:`HashAggregator`."""
    if has_distinct(aggs):
        return DistinctAggregator(keys, aggs, **options)
    return HashAggregator(keys, aggs, **options)


def aggregate(
    source: Any,
    keys: str | Sequence[str],
    aggs: Mapping[str, tuple[str, str]],
    **options: Any,
) -> pa.Table:
    """Group ``source`` by ``keys`` and compute ``aggs`` in one call; returns a ``pyarrow.Table``.

    Parameters
    ----------
    source
        One batch (pyarrow ``RecordBatch`` or ``Table``, pandas ``DataFrame``, dict of NumPy
        arrays), a ``pyarrow.RecordBatchReader``, a ``pyarrow.dataset.Dataset`` (scanned with
        only the columns the query reads), or an iterable of batches (read lazily).
    keys
        Grouping column name or names.
    aggs
        Output name → ``(column, function)``; ``("*", "count")`` counts rows.
    **options
        Passed to :class:`~extagg.HashAggregator` (``memory``, ``memory_manager``,
        ``spill_dirs``, ...); ``count_distinct`` aggregates run a two-level group-by beside it.

    Returns
    -------
    pyarrow.Table
        Key columns then one column per aggregate, rows in key-hash order. With no input at all
        the key columns have Arrow type ``null``.

    Raises
    ------
    ValueError, TypeError, OverflowError
        As :class:`~extagg.HashAggregator`; a budget below the engine's working minimum raises
        :class:`~extagg.BudgetError`.

    Notes
    -----
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
    with make_aggregator(keys, aggs, **options) as agg:
        batches: Iterable[Any]
        if is_batch(source):
            batches = [source]
        elif is_dataset(source):
            batches = dataset_batches(source, agg.input_columns)
        else:
            batches = source
        for batch in batches:
            agg.update(batch)
        out = list(agg.results())
        schema = agg.schema
    if schema is None and out:  # a global aggregate of no input: its one row
        return pa.Table.from_batches(out)
    if schema is None:
        names = [keys] if isinstance(keys, str) else list(keys)
        return pa.table({name: pa.array([], type=pa.null()) for name in [*names, *aggs]})
    return pa.Table.from_batches(out, schema=schema)

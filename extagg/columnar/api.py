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
    """Group ``source`` by ``keys`` and compute ``aggs``; returns a ``pyarrow.Table``.

    ``source`` is one batch (pyarrow RecordBatch or Table, pandas DataFrame, dict of NumPy
    arrays), a ``pyarrow.RecordBatchReader``, a ``pyarrow.dataset.Dataset`` (its batches are
    scanned with only the columns the query reads) or an iterable of batches. ``options`` go to
    :class:`HashAggregator` (``memory``, ``memory_manager``, ``spill_dirs``, ...). Rows come in
    hash order of the keys. With no input at all the key columns have Arrow type ``null``.
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

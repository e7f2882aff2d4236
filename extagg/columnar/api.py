"""``aggregate(...)``: batches in, one Arrow table out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from extagg.columnar.columns import is_batch
from extagg.columnar.hash_aggregator import HashAggregator

__all__ = ["aggregate"]


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
        arrays), a ``pyarrow.RecordBatchReader``, or an iterable of batches (read lazily).
    keys
        Grouping column name or names.
    aggs
        Output name → ``(column, function)``; ``("*", "count")`` counts rows.
    **options
        Passed to :class:`~extagg.HashAggregator` (``memory``, ``memory_manager``,
        ``spill_dirs``, ...).

    Returns
    -------
    pyarrow.Table
        Key columns then one column per aggregate, rows in key-hash order. With no input at all
        the key columns have Arrow type ``null``.

    Raises
    ------
    ValueError, TypeError, OverflowError
        As :class:`~extagg.HashAggregator`.

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
    with HashAggregator(keys, aggs, **options) as agg:
        batches: Iterable[Any] = [source] if is_batch(source) else source
        for batch in batches:
            agg.update(batch)
        out = list(agg.results())
        schema = agg.schema
    if schema is None:
        names = [keys] if isinstance(keys, str) else list(keys)
        return pa.table({name: pa.array([], type=pa.null()) for name in [*names, *aggs]})
    return pa.Table.from_batches(out, schema=schema)

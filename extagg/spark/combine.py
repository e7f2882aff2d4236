"""PySpark integration: ``combineByKey`` with extagg's spillable map on both sides of the shuffle.

The map side folds each partition into an :class:`~extagg.ExternalAppendOnlyMap`
(``mapPartitions``), the shuffle places keys with the deterministic
:func:`extagg.hashing.stable_hash` (so every Python worker agrees whatever its
``PYTHONHASHSEED``), and the reduce side merges the
combiners of each partition in another map. The partition functions are plain functions that
users can also pass to their own ``rdd.mapPartitions(...)``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from extagg._config import parse_size
from extagg.generic.aggregator import Aggregator
from extagg.generic.external_map import ExternalAppendOnlyMap
from extagg.hashing import stable_hash
from extagg.spark.settings import worker_budget

__all__ = [
    "combine_by_key",
    "combine_partition",
    "merge_partition",
    "spark_partition_func",
]

log = logging.getLogger(__name__)

PartitionFunc = Callable[[Iterable[tuple[Any, Any]]], Iterator[tuple[Any, Any]]]


def spark_partition_func(key: Any) -> int:
    """The partitioner for ``rdd.partitionBy``: Spark takes it modulo the partition count."""
    return stable_hash(key)


def _run_map(
    aggregator: Aggregator[Any, Any],
    pairs: Iterable[tuple[Any, Any]],
    memory: int | str | None,
    spill_dirs: list[str] | None,
    force_spill_every: int | None,
) -> Iterator[tuple[Any, Any]]:
    emap = ExternalAppendOnlyMap(
        aggregator,
        memory=memory,
        spill_dirs=spill_dirs,
        force_spill_every=force_spill_every,
    )
    try:
        emap.insert_all(pairs)
        yield from emap.iterator()
        if emap.metrics.spill_count:
            log.info("extagg partition done: %s", emap.metrics.summary())
    finally:
        emap.close()


def combine_partition(
    create_combiner: Callable[[Any], Any],
    merge_value: Callable[[Any, Any], Any],
    merge_combiners: Callable[[Any, Any], Any],
    *,
    memory: int | str | None = None,
    spill_dirs: list[str] | None = None,
    force_spill_every: int | None = None,
) -> PartitionFunc:
    """A function for ``rdd.mapPartitions``: folds ``(key, value)`` records into combiners."""
    aggregator = Aggregator(create_combiner, merge_value, merge_combiners)

    def combine_locally(pairs: Iterable[tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
        return _run_map(aggregator, pairs, memory, spill_dirs, force_spill_every)

    return combine_locally


def merge_partition(
    merge_combiners: Callable[[Any, Any], Any],
    *,
    memory: int | str | None = None,
    spill_dirs: list[str] | None = None,
    force_spill_every: int | None = None,
) -> PartitionFunc:
    """A function for ``rdd.mapPartitions``: merges ``(key, combiner)`` records per key."""
    aggregator: Aggregator[Any, Any] = Aggregator(_identity, merge_combiners, merge_combiners)

    def merge_combined(pairs: Iterable[tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
        return _run_map(aggregator, pairs, memory, spill_dirs, force_spill_every)

    return merge_combined


def _identity(value: Any) -> Any:
    return value


def _require_rdd(rdd: Any, function: str) -> None:
    """A DataFrame where an RDD belongs gets a message naming the DataFrame function."""
    if hasattr(rdd, "mapInArrow") and hasattr(rdd, "groupBy"):
        raise TypeError(
            f"{function} takes an RDD of (key, value) pairs, but got a DataFrame; "
            "aggregate DataFrames with extagg.spark.aggregate(df, by=[...], aggs={...}) "
            "(or pass df.rdd.map(...) to build (key, value) pairs)"
        )
    if not hasattr(rdd, "mapPartitions"):
        raise TypeError(f"{function} takes a PySpark RDD, got {type(rdd).__name__}")


def combine_by_key(
    rdd: Any,
    create_combiner: Callable[[Any], Any],
    merge_value: Callable[[Any, Any], Any],
    merge_combiners: Callable[[Any, Any], Any],
    num_partitions: int | None = None,
    memory: int | str | None = None,
    *,
    spill_dirs: list[str] | None = None,
    force_spill_every: int | None = None,
) -> Any:
    """``rdd.combineByKey`` with extagg maps: same results, bounded and accounted memory.

    ``memory`` is the budget of each map (default: :func:`extagg.spark.worker_budget`; the map side
    gets 90% of it, as PySpark's own ``combineByKey`` does). Keys must be hashable by
    :func:`extagg.hashing.stable_hash` (None, bool, int, float, str, bytes, tuples of these).
    """
    _require_rdd(rdd, "extagg.spark.combine_by_key")
    budget = (
        parse_size(memory, name="memory")
        if memory is not None
        else worker_budget(rdd.context.getConf(), rdd.context.master)
    )
    if num_partitions is None:
        num_partitions = rdd.getNumPartitions()
    local = combine_partition(
        create_combiner,
        merge_value,
        merge_combiners,
        memory=int(budget * 0.9),
        spill_dirs=spill_dirs,
        force_spill_every=force_spill_every,
    )
    merged = merge_partition(
        merge_combiners, memory=budget, spill_dirs=spill_dirs, force_spill_every=force_spill_every
    )
    combined = rdd.mapPartitions(local, preservesPartitioning=True)
    shuffled = combined.partitionBy(num_partitions, spark_partition_func)
    return shuffled.mapPartitions(merged, preservesPartitioning=True)

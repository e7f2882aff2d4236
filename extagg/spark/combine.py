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
from extagg.memory import check_engine_budget
from extagg.spark.settings import local_workers_run_this_python, worker_budget

__all__ = [
    "combine_by_key",
    "combine_partition",
    "merge_partition",
    "spark_partition_func",
]

log = logging.getLogger(__name__)

PartitionFunc = Callable[[Iterable[tuple[Any, Any]]], Iterator[tuple[Any, Any]]]


def spark_partition_func(key: Any) -> int:
    """The partitioner for ``rdd.partitionBy``: Spark takes it modulo the partition count.

    Parameters
    ----------
    key
        A key with a deterministic hash (see :func:`extagg.stable_hash`).

    Returns
    -------
    int
        A non-negative int, the same in every Python worker.

    Raises
    ------
    TypeError
        A key type without a deterministic hash.
    """
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
    """A function for ``rdd.mapPartitions``: folds ``(key, value)`` records into combiners.

    Parameters
    ----------
    create_combiner
        ``create_combiner(v)``: the first value of a key → combiner.
    merge_value
        ``merge_value(c, v)``: fold a value into a combiner.
    merge_combiners
        ``merge_combiners(c1, c2)``: merge combiners (when the map spilled).
    memory
        Budget of the map (default: the worker process's default memory manager).
    spill_dirs
        Spill directories (default ``EXTAGG_SPILL_DIR``, else ``SPARK_LOCAL_DIRS``).
    force_spill_every
        Test knob: spill after every N records.

    Returns
    -------
    Callable[[Iterator], Iterator]
        Yields ``(key, combiner)`` pairs of its partition in key-hash order.
    """
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
    """A function for ``rdd.mapPartitions``: merges ``(key, combiner)`` records per key.

    Parameters
    ----------
    merge_combiners
        ``merge_combiners(c1, c2)``: merge two combiners of a key.
    memory
        Budget of the map (default: the worker process's default memory manager).
    spill_dirs
        Spill directories (default ``EXTAGG_SPILL_DIR``, else ``SPARK_LOCAL_DIRS``).
    force_spill_every
        Test knob: spill after every N records.

    Returns
    -------
    Callable[[Iterator], Iterator]
        Yields one ``(key, combiner)`` pair per key of its partition.
    """
    aggregator: Aggregator[Any, Any] = Aggregator.reducing(merge_combiners)

    def merge_combined(pairs: Iterable[tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
        return _run_map(aggregator, pairs, memory, spill_dirs, force_spill_every)

    return merge_combined


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

    Map side: each partition is folded by :func:`combine_partition`; the combiners are shuffled
    with :func:`spark_partition_func`; reduce side: :func:`merge_partition`.

    Parameters
    ----------
    rdd
        A PySpark RDD of ``(key, value)`` pairs.
    create_combiner
        ``create_combiner(v)``: the first value of a key → combiner.
    merge_value
        ``merge_value(c, v)``: fold a value into a combiner.
    merge_combiners
        ``merge_combiners(c1, c2)``: merge two combiners of a key.
    num_partitions
        Output partitions (default: the RDD's).
    memory
        Budget of each map (default: :func:`extagg.spark.worker_budget`; the map side gets 90%
        of it, as PySpark's own ``combineByKey`` does).
    spill_dirs
        Spill directories in the workers (default ``EXTAGG_SPILL_DIR``, else ``SPARK_LOCAL_DIRS``).
    force_spill_every
        Test knob: spill after every N records.

    Returns
    -------
    pyspark.RDD
        ``(key, combiner)`` pairs.

    Raises
    ------
    TypeError
        ``rdd`` is a DataFrame (use :func:`extagg.spark.aggregate`) or not an RDD; (in the
        workers) a key without a deterministic hash: keys must be None, bool, int, float,
        str, bytes or tuples of these.
    """
    _require_rdd(rdd, "extagg.spark.combine_by_key")
    # local workers run this interpreter (python3 from the PATH lacks extagg: every task of
    # getting-started's example failed with "No module named 'extagg'" outside the venv)
    local_workers_run_this_python(rdd.context)
    budget = (
        parse_size(memory, name="memory")
        if memory is not None
        else worker_budget(rdd.context.getConf(), rdd.context.master)
    )
    # on the driver, before any task: a budget the maps cannot work with fails here, not on
    # every executor after its input was read
    check_engine_budget(int(budget * 0.9), name="memory (90% of it, the map side's budget)")
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

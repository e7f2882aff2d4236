"""``extagg.spark.install()``: the RDD API's own shuffles aggregate with extagg.

PySpark's ``combineByKey`` (and so ``reduceByKey``, ``foldByKey``, ``aggregateByKey``) and
``groupByKey`` build their per-partition functions as closures over the module globals
``ExternalMerger`` / ``ExternalGroupBy`` of ``pyspark.core.rdd`` (``pyspark.rdd`` before
Spark 4). cloudpickle ships those globals with each closure, by their value at the moment the
job is submitted. :func:`install` rebinds them, in the driver, to the stand-ins of
:mod:`extagg.spark.shim`, which are pickled by value so that a worker without extagg fails with
a message naming the fix. The stand-ins build :class:`extagg.spark.merger.SparkMerger` in the
worker, on both sides of the shuffle. Partitioning stays PySpark's (``portable_hash``).

While installed, ``RDD._memory_limit`` (the per-worker budget PySpark passes its mergers and
``partitionBy``) also honours ``spark.executor.pyspark.memory`` divided among the executor's
Python workers (:func:`extagg.spark.settings.worker_budget`), and ``countByValue`` /
``countByKey`` count through ``reduceByKey`` instead of one unbounded dict per partition.

``RDD.partitionBy`` with PySpark's default ``portable_hash`` (what every shuffle of these calls
uses) writes its buckets with :func:`extagg.spark.shuffle.write_buckets`: the same partition
numbers and bucket contents, computed a chunk at a time. The partitioner of the result is
PySpark's own (``Partitioner(n, portable_hash)``), so partitioner equality is unchanged. Any
other ``partitionFunc`` goes to PySpark's own ``partitionBy``.
"""

from __future__ import annotations

import importlib
import logging
import operator
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from extagg.spark import shim
from extagg.spark.settings import local_workers_run_this_python, worker_budget

__all__ = ["install", "installed", "is_installed", "uninstall"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_saved: dict[str, Any] = {}


def _rdd_module() -> Any:
    for name in ("pyspark.core.rdd", "pyspark.rdd"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "ExternalMerger") and hasattr(module, "RDD"):
            return module
    raise ImportError(
        "extagg.spark.install() needs PySpark (pip install 'extagg[spark]'): neither "
        "pyspark.core.rdd nor pyspark.rdd could be imported"
    )


def _cloudpickle() -> Any:
    return importlib.import_module("pyspark.cloudpickle")


def _memory_limit(self: Any) -> int:
    """``RDD._memory_limit`` while installed: the worker budget in MiB (asked on the driver
    by every shuffle: where a context made after :func:`install` is seen first)."""
    ctx = self.ctx
    local_workers_run_this_python(ctx)
    return max(1, worker_budget(ctx._conf, ctx.master) >> 20)


def _count_by_value(self: Any) -> dict[Any, int]:
    """``RDD.countByValue`` while installed: a spillable shuffle, then one dict in the driver."""
    counts: dict[Any, int] = defaultdict(int)
    pairs = self.map(lambda value: (value, 1)).reduceByKey(operator.add)
    for key, count in pairs.toLocalIterator():
        counts[key] = count
    return counts


def _partition_by(self: Any, numPartitions: int | None, partitionFunc: Any = None) -> Any:
    """``RDD.partitionBy`` while installed: PySpark's, with extagg writing the buckets when
    ``partitionFunc`` is ``portable_hash`` (see the module docstring)."""
    module = _saved["module"]
    portable_hash = module.portable_hash
    if partitionFunc is None:
        partitionFunc = portable_hash
    if partitionFunc is not portable_hash:
        return _saved["partitionBy"](self, numPartitions, partitionFunc)
    num = self._defaultReducePartitions() if numPartitions is None else numPartitions
    partitioner = module.Partitioner(num, partitionFunc)
    if self.partitioner == partitioner:
        return self
    serializer = self.ctx._unbatched_serializer
    writer = shim.bucket_writer(num, serializer, self._memory_limit() / 2)
    keyed = self.mapPartitionsWithIndex(writer, preservesPartitioning=True)
    keyed._bypass_serializer = True  # the writer yields the shuffle's bytes itself
    jvm = self.ctx._jvm
    with module.SCCallSiteSync(self.context):
        pairs = jvm.PairwiseRDD(keyed._jrdd.rdd()).asJavaPairRDD()
        jpartitioner = jvm.PythonPartitioner(num, id(partitionFunc))
    jrdd = jvm.PythonRDD.valueOfPair(pairs.partitionBy(jpartitioner))
    rdd = module.RDD(jrdd, self.ctx, shim.shuffle_deserializer(serializer))
    rdd.partitioner = partitioner
    return rdd


def _active_context() -> Any:
    """The driver's running ``SparkContext``, or ``None``."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return None
    return SparkContext._active_spark_context


def is_installed() -> bool:
    """Whether :func:`install` is in effect."""
    return bool(_saved)


def install() -> None:
    """Make this driver's RDD shuffles (combineByKey & co., groupByKey, countByKey) use extagg.

    Jobs submitted after the call use it in every Python worker; idempotent; undo with
    :func:`uninstall`. Workers must be able to import extagg (install it on the executors, or
    ship it with ``spark.submit.pyFiles``); one that cannot fails with a message saying so.
    """
    with _lock:
        if _saved:
            return
        module = _rdd_module()
        rdd = module.RDD
        _cloudpickle().register_pickle_by_value(shim)
        _saved.update(
            module=module,
            ExternalMerger=module.ExternalMerger,
            ExternalGroupBy=module.ExternalGroupBy,
            _memory_limit=rdd.__dict__["_memory_limit"],
            countByValue=rdd.__dict__["countByValue"],
            partitionBy=rdd.__dict__["partitionBy"],
        )
        module.ExternalMerger = shim.ExternalMerger
        module.ExternalGroupBy = shim.ExternalGroupBy
        rdd._memory_limit = _memory_limit
        rdd.countByValue = _count_by_value
        rdd.partitionBy = _partition_by
        local_workers_run_this_python(_active_context())
    log.info("extagg.spark installed: RDD shuffles aggregate with extagg")


def uninstall() -> None:
    """Give PySpark back its own mergers (for jobs submitted from now on). Idempotent."""
    with _lock:
        if not _saved:
            return
        module = _saved["module"]
        module.ExternalMerger = _saved["ExternalMerger"]
        module.ExternalGroupBy = _saved["ExternalGroupBy"]
        module.RDD._memory_limit = _saved["_memory_limit"]
        module.RDD.countByValue = _saved["countByValue"]
        module.RDD.partitionBy = _saved["partitionBy"]
        try:
            _cloudpickle().unregister_pickle_by_value(shim)
        except ValueError:  # pragma: no cover - unregistered elsewhere
            pass
        _saved.clear()
    log.info("extagg.spark uninstalled: RDD shuffles use PySpark's own merger again")


@contextmanager
def installed() -> Iterator[None]:
    """``with extagg.spark.installed(): ...`` — install for the block, restore afterwards."""
    was = is_installed()
    install()
    try:
        yield
    finally:
        if not was:
            uninstall()

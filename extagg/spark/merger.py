"""extagg's replacement for PySpark's ``pyspark.shuffle.ExternalMerger``.

:class:`SparkMerger` takes the constructor arguments PySpark's RDD code passes
(``aggregator, memory_limit, serializer``; the others are accepted for compatibility) and has
the methods it calls (``mergeValues``, ``mergeCombiners``, ``items``), backed by an
:class:`~extagg.ExternalAppendOnlyMap` with a budget of ``memory_limit`` MiB — its own
accounted memory, not the process RSS PySpark's merger polls. Spills go under
``SPARK_LOCAL_DIRS`` (see :func:`extagg._config.default_spill_dirs`) and are reported into
``pyspark.shuffle.MemoryBytesSpilled`` / ``DiskBytesSpilled``, the counters PySpark's worker
sends back as the task's spill metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from extagg._config import MiB
from extagg.generic.aggregator import Aggregator
from extagg.generic.external_map import ExternalAppendOnlyMap
from extagg.memory import ENGINE_MIN_BUDGET
from extagg.metrics import SpillMetrics
from extagg.spark.groupby import SpilledValues, SpillingGroupBy

__all__ = ["SparkGroupBy", "SparkMerger", "report_spill"]

log = logging.getLogger(__name__)

#: the engines' working minimum: PySpark hands its merger 90% of ``spark.python.worker.memory``
#: (0.9 MiB of a 1m setting), which is raised to this rather than failing in every worker
MIN_BUDGET = ENGINE_MIN_BUDGET


def report_spill(metrics: SpillMetrics) -> None:
    """Add an engine's spills to the counters PySpark reports as the task's spill metrics."""
    try:
        from pyspark import shuffle
    except ImportError:  # pragma: no cover - only used inside PySpark workers
        return
    shuffle.MemoryBytesSpilled += int(metrics.memory_bytes_spilled)
    shuffle.DiskBytesSpilled += int(metrics.disk_bytes_spilled)


def _is_group_by_key(agg: Any) -> bool:
    """Whether ``agg`` is the list aggregator PySpark's ``RDD.groupByKey`` builds."""
    fn = getattr(agg, "createCombiner", None)
    for _ in range(3):  # PySpark wraps it in fail_on_stopiteration
        name = getattr(fn, "__qualname__", "")
        if name.endswith("groupByKey.<locals>.createCombiner"):
            return True
        cells = getattr(fn, "__closure__", None) or ()
        inner = [c.cell_contents for c in cells if callable(c.cell_contents)]
        if len(inner) != 1:
            return False
        fn = inner[0]
    return False


def _chunked(group: SpillingGroupBy) -> Iterator[tuple[Any, Any]]:
    """``(key, list)`` pieces of a group-by; a spilled key as several pieces of one chunk."""
    try:
        for key, values in group:
            if isinstance(values, SpilledValues):
                for chunk in values.chunks():
                    yield key, chunk
            else:
                yield key, values
    finally:
        group.close()
        report_spill(group.metrics)


class SparkMerger:
    """An ``ExternalMerger``-compatible merger backed by :class:`~extagg.ExternalAppendOnlyMap`.

    ``memory_limit`` is in MiB, as PySpark passes it (``spark.python.worker.memory`` × 0.9 on
    the map side). ``localdirs`` overrides the spill directories. ``scale``, ``partitions`` and
    ``batch`` tune PySpark's own hash partitioning and have no meaning here.
    """

    def __init__(
        self,
        aggregator: Any,
        memory_limit: float = 512,
        serializer: Any = None,
        localdirs: list[str] | None = None,
        scale: int = 1,
        partitions: int = 59,
        batch: int = 1000,
    ) -> None:
        self.agg = aggregator
        self.memory_limit = memory_limit
        self.serializer = serializer
        self.localdirs = localdirs
        self.budget = max(int(float(memory_limit) * MiB), MIN_BUDGET)
        self._map: ExternalAppendOnlyMap | None = None
        self._group: SpillingGroupBy | None = None
        self._mode: str | None = None
        self.metrics = SpillMetrics()

    def _open(self, mode: str) -> ExternalAppendOnlyMap:
        if self._map is not None:
            if mode != self._mode:
                raise RuntimeError(
                    f"this merger already took {self._mode}; mergeValues and mergeCombiners "
                    "cannot be mixed on one merger"
                )
            return self._map
        agg = self.agg
        if mode == "values":
            aggregator = Aggregator(agg.createCombiner, agg.mergeValue, agg.mergeCombiners)
        else:
            aggregator = Aggregator.reducing(agg.mergeCombiners)
        self._mode = mode
        self._map = ExternalAppendOnlyMap(
            aggregator, memory=self.budget, spill_dirs=self.localdirs, name="pyspark-merger"
        )
        self.metrics = self._map.metrics
        return self._map

    def mergeValues(self, iterator: Iterable[tuple[Any, Any]]) -> None:
        """Fold ``(key, value)`` records into combiners."""
        if _is_group_by_key(self.agg):
            # groupByKey's map side: value lists that may outgrow memory, sent in chunks
            if self._group is None:
                self._group = SpillingGroupBy(
                    memory=self.budget, spill_dirs=self.localdirs, name="pyspark-groupby-map"
                )
                self.metrics = self._group.metrics
            self._group.merge_pieces(((k, [v]) for k, v in iterator))
            return
        self._open("values").insert_all(iterator)

    def mergeCombiners(self, iterator: Iterable[tuple[Any, Any]], limit: int | None = None) -> None:
        """Merge ``(key, combiner)`` records."""
        self._open("combiners").insert_all(iterator)

    @property
    def spills(self) -> int:
        """Spills so far (PySpark's attribute)."""
        return self.metrics.spill_count

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Every ``(key, combiner)`` once; releases memory and spill files when exhausted."""
        group, self._group = self._group, None
        if group is not None:
            return _chunked(group)
        emap, self._map = self._map, None
        if emap is None:
            return iter(())
        return self._drain(emap)

    def _drain(self, emap: ExternalAppendOnlyMap) -> Iterator[tuple[Any, Any]]:
        try:
            yield from emap.iterator()
        finally:
            emap.close()
            report_spill(emap.metrics)
            if emap.metrics.spill_count:
                log.info("extagg merger done: %s", emap.metrics.summary())


class SparkGroupBy(SparkMerger):
    """The reduce side of ``groupByKey`` (PySpark's ``ExternalGroupBy``): merges
    ``(key, [values])`` lists per key in a :class:`~extagg.spark.groupby.SpillingGroupBy`, so a
    key with more values than the budget comes back as values streamed from disk."""

    def mergeValues(self, iterator: Iterable[tuple[Any, Any]]) -> None:
        """Group ``(key, value)`` records."""
        self.mergeCombiners(((k, [v]) for k, v in iterator))

    def mergeCombiners(self, iterator: Iterable[tuple[Any, Any]], limit: int | None = None) -> None:
        """Merge ``(key, [values])`` pieces."""
        if self._group is None:
            self._group = SpillingGroupBy(
                memory=self.budget, spill_dirs=self.localdirs, name="pyspark-groupby"
            )
            self.metrics = self._group.metrics
        self._group.merge_pieces(iterator)

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Every ``(key, values)`` once; ``values`` is a list or a ``SpilledValues``."""
        group, self._group = self._group, None
        if group is None:
            return iter(())
        return self._drain_group(group)

    def _drain_group(self, group: SpillingGroupBy) -> Iterator[tuple[Any, Any]]:
        try:
            yield from group
        finally:
            group.close()
            report_spill(group.metrics)

"""extagg's replacement for PySpark's ``pyspark.shuffle.ExternalMerger``.

:class:`SparkMerger` takes the constructor arguments PySpark's RDD code passes
(``aggregator, memory_limit, serializer``; the others are accepted for compatibility) and has
the methods it calls (``mergeValues``, ``mergeCombiners``, ``items``), with a budget of
``memory_limit`` MiB — its own accounted memory, not the process RSS PySpark's merger polls.
``mergeValues`` is the map side of a shuffle (PySpark calls it nowhere else): a
:class:`~extagg.spark.partial.PartialCombiner` that hands its combiners to the shuffle when the
budget is full instead of spilling them (the reduce side merges them by key anyway).
``mergeCombiners`` is the reduce side: an :class:`~extagg.ExternalAppendOnlyMap`.

PySpark wraps the user's functions in ``fail_on_stopiteration`` and builds the combiner of
``reduceByKey`` / ``aggregateByKey`` as closures; :func:`recognise` sees through them, so that
``reduceByKey(operator.add | min | max)`` folds in compiled code on both sides, and an
``aggregateByKey`` whose zero value is immutable skips the ``copy.deepcopy`` of it per key
(which returns the zero itself for immutable values). Spills go under
``SPARK_LOCAL_DIRS`` (see :func:`extagg._config.default_spill_dirs`) and are reported into
``pyspark.shuffle.MemoryBytesSpilled`` / ``DiskBytesSpilled``, the counters PySpark's worker
sends back as the task's spill metrics.

Memory: the engines account for their own tables; the worker also holds what none accounts —
the shuffle reader's unpickled batches, the writer's pending buckets, and what CPython's
allocator keeps once a task freed it (pymalloc gives an arena back only when all of it is
free, so a reused worker carries partly used arenas from task to task). So the engines get
:data:`ENGINE_SHARE` of ``memory_limit`` on both sides, and the C heap a task freed is given
back to the kernel (:func:`extagg._malloc.release_free_memory`) when it ends.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from itertools import chain, groupby
from typing import TYPE_CHECKING, Any, NamedTuple

from extagg._config import MiB
from extagg._malloc import release_free_memory
from extagg.collection.pair_arrays import PairArrays
from extagg.memory import ENGINE_MIN_BUDGET
from extagg.metrics import SpillMetrics
from extagg.spark.groupby import SpillingGroupBy
from extagg.spark.partial import PartialCombiner, fewer_collections, stop_iteration_error

if TYPE_CHECKING:  # the generic engine (numba) is imported where the reduce side needs it
    from extagg.generic.external_map import ExternalAppendOnlyMap

__all__ = ["ENGINE_SHARE", "Recognised", "SparkGroupBy", "SparkMerger", "recognise", "report_spill"]

log = logging.getLogger(__name__)

#: the engines' working minimum: PySpark hands its merger 90% of ``spark.python.worker.memory``
#: (0.9 MiB of a 1m setting), which is raised to this rather than failing in every worker
MIN_BUDGET = ENGINE_MIN_BUDGET
#: the share of ``memory_limit`` the engine itself accounts for, on both sides of the shuffle;
#: the rest is left to what the worker holds outside the engine's accounting (see the module
#: docstring and docs/spark.md)
ENGINE_SHARE = 0.85


def report_spill(metrics: SpillMetrics) -> None:
    """Add an engine's spills to the counters PySpark reports as the task's spill metrics."""
    try:
        from pyspark import shuffle
    except ImportError:  # pragma: no cover - only used inside PySpark workers
        return
    shuffle.MemoryBytesSpilled += int(metrics.memory_bytes_spilled)
    shuffle.DiskBytesSpilled += int(metrics.disk_bytes_spilled)


_WRAPPER = "fail_on_stopiteration.<locals>.wrapper"
#: immutable atoms: ``copy.deepcopy`` returns them (and tuples of them) unchanged
_ATOMS = (int, float, complex, str, bytes, bool, type(None))


def _unwrap(fn: Any) -> Any:
    """The user's function inside PySpark's ``fail_on_stopiteration`` wrappers (PySpark's
    ``Aggregator`` wraps functions ``reduceByKey`` wrapped already), else ``fn``."""
    for _ in range(4):
        if getattr(fn, "__qualname__", "") != _WRAPPER:
            break
        cells = getattr(fn, "__closure__", None) or ()
        inner = [c.cell_contents for c in cells if callable(c.cell_contents)]
        if len(inner) != 1:
            break
        fn = inner[0]
    return fn


def _free(fn: Any) -> dict[str, Any]:
    """A closure's free variables by name (empty for anything else)."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells:
        return {}
    try:
        return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}
    except ValueError:  # an empty cell
        return {}


def _immutable(value: Any) -> bool:
    if type(value) in _ATOMS:
        return True
    return type(value) is tuple and all(_immutable(v) for v in value)


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


class Recognised(NamedTuple):
    """What :func:`recognise` made of a PySpark ``Aggregator``."""

    #: ``createCombiner`` and ``mergeValue`` to fold with (equivalent to PySpark's)
    create: Any
    merge: Any
    #: ``mergeCombiners`` with a typed reduce function unwrapped, else PySpark's
    merge_combiners: Any
    #: the typed-path operation of ``reduceByKey(add | min | max)`` and of the plain sums of
    #: ``foldByKey`` / ``aggregateByKey`` (see :func:`recognise`), else None
    typed_op: int | None
    #: ``groupByKey``'s list aggregator
    group_by_key: bool
    #: the typed fold starts each combiner from an int zero (``foldByKey(0, add)``,
    #: ``aggregateByKey((0, 0), sum-and-count)``)
    typed_from_zero: bool = False


def recognise(agg: Any) -> Recognised:
    """See through the closures PySpark's RDD methods build around the user's functions.

    ``reduceByKey(f)``: ``createCombiner`` is PySpark's identity lambda and ``mergeValue is
    mergeCombiners``; when ``f`` (unwrapped) is ``operator.add``, ``min``, ``max`` — builtins
    that never raise ``StopIteration`` — or a ``lambda a, b: a + b`` (which on the plain numbers
    the typed path takes cannot raise either), the typed path may fold it. ``aggregateByKey(zero,
    seq, comb)`` / ``foldByKey(zero, f)``: ``createCombiner`` is ``lambda v: seq(
    deepcopy(zero), v)``; with an immutable ``zero`` that deep copy is ``zero`` itself, so the
    combiner is built as ``seq(zero, v)``; a sum from an int ``0`` (``foldByKey(0, add)``) or a
    sum and count from ``(0, 0)`` (the mean: ``seq = (c[0] + v, c[1] + 1)``, ``comb = (a[0] +
    b[0], a[1] + b[1])``, written with any argument names) folds typed too, from zero.
    Anything else is used as given.
    """
    create, merge, merge_combiners = agg.createCombiner, agg.mergeValue, agg.mergeCombiners
    if _is_group_by_key(agg):
        return Recognised(create, merge, merge_combiners, None, True)
    name = getattr(_unwrap(create), "__qualname__", "")
    typed = None
    inner = _unwrap(merge)
    if name.endswith("reduceByKey.<locals>.<lambda>") and inner is _unwrap(merge_combiners):
        op = _typed_op(inner)
        if op is not None:
            typed = op
            merge = merge_combiners = inner
        from extagg.generic.aggregator import Aggregator

        create = Aggregator.reducing(inner).create_combiner  # the identity, as PySpark's
        return Recognised(create, _unwrap(merge), merge_combiners, typed, False)
    if name.endswith(("aggregateByKey.<locals>.<lambda>", "foldByKey.<locals>.<lambda>")):
        free = _free(_unwrap(create))
        make_zero = free.get("createZero")
        seq = free.get("seqFunc", free.get("func"))
        zero = _free(make_zero).get("zeroValue", _free)
        if callable(seq) and len(free) == 2 and zero is not _free and _immutable(zero):
            seq = _unwrap(seq)

            def create_from_zero(value: Any) -> Any:
                return seq(zero, value)

            comb = _unwrap(merge_combiners)
            typed = _typed_from_zero(zero, seq, comb)
            if typed is not None:  # plain sums: fold them typed on both sides
                return Recognised(create_from_zero, seq, comb, typed, False, True)
            return Recognised(create_from_zero, _unwrap(merge), merge_combiners, None, False)
    return Recognised(_unwrap(create), _unwrap(merge), merge_combiners, None, False)


def _typed_from_zero(zero: Any, seq: Any, comb: Any) -> int | None:
    """The typed operation of ``foldByKey(0, f)`` / ``aggregateByKey(0, f, g)`` with ``f`` and
    ``g`` a plain ``+``, and of ``aggregateByKey((0, 0), seq, comb)`` where ``seq`` is
    ``(c[0] + v, c[1] + 1)`` and ``comb`` ``(a[0] + b[0], a[1] + b[1])`` (the mean's sum and
    count); ``None`` for anything else. The zeros must be exact ``int`` ``0``s: ``0 + v`` is
    ``v`` for an int and ``0.0 + v`` for a float (the typed fold computes that), where a zero
    ``0.0`` would turn int values into floats."""
    from extagg.function_code import is_plain_add

    if type(zero) is int and zero == 0:
        return _typed_op(seq) if is_plain_add(seq) and is_plain_add(comb) else None
    if type(zero) is not tuple or len(zero) != 2 or any(type(z) is not int or z for z in zero):
        return None
    from extagg.generic.aggregator import Aggregator

    mean = Aggregator.sum_count()
    if Aggregator(mean.create_combiner, seq, comb).pattern != "sum_count":
        return None
    from extagg.generic.typed_map import aggregator_op  # numba: only on this path

    return aggregator_op(mean)


def _typed_op(fn: Any) -> int | None:
    from extagg.function_code import is_plain_add

    if fn is not min and fn is not max and not is_plain_add(fn):
        return None  # numba is imported for the typed path only
    from extagg.generic.typed_map import typed_op

    return typed_op(fn)


def _is_block(batch: Any) -> bool:
    return isinstance(batch, PairArrays)


class SparkMerger:
    """An ``ExternalMerger``-compatible merger: the map side folds in a
    :class:`~extagg.spark.partial.PartialCombiner`, the reduce side merges in an
    :class:`~extagg.ExternalAppendOnlyMap`.

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
        self.budget = max(int(float(memory_limit) * MiB * ENGINE_SHARE), MIN_BUDGET)
        self._map: ExternalAppendOnlyMap | None = None
        self._records: list[Iterable[tuple[Any, Any]]] = []
        self._group: SpillingGroupBy | None = None
        self._mode: str | None = None
        self.metrics = SpillMetrics()

    def _take(self, mode: str) -> None:
        if self._mode is not None and mode != self._mode:
            raise RuntimeError(
                f"this merger already took {self._mode}; mergeValues and mergeCombiners "
                "cannot be mixed on one merger"
            )
        self._mode = mode

    def mergeValues(self, iterator: Iterable[tuple[Any, Any]]) -> None:
        """Take ``(key, value)`` records (the map side of a shuffle): they are folded lazily,
        as :meth:`items` is read, into combiners a key of which may come out more than once
        (each a valid combiner; the reduce side merges them)."""
        self._take("values")
        self._records.append(iterator)

    def mergeCombiners(self, iterator: Iterable[tuple[Any, Any]], limit: int | None = None) -> None:
        """Merge ``(key, combiner)`` records."""
        self._take("combiners")
        if self._map is None:
            from extagg.generic.aggregator import Aggregator
            from extagg.generic.external_map import ExternalAppendOnlyMap

            seen = recognise(self.agg)
            self._map = ExternalAppendOnlyMap(
                Aggregator.reducing(seen.merge_combiners),
                memory=self.budget,
                spill_dirs=self.localdirs,
                name="pyspark-merger",
            )
            self.metrics = self._map.metrics
        emap = self._map
        try:
            with fewer_collections():  # PySpark unpickles the records as we read them
                batches = getattr(iterator, "extagg_batches", None)  # shim.ShuffleStream
                if batches is None:
                    emap.insert_all(iterator)
                    return
                for typed, group in groupby(batches(), _is_block):
                    if typed:
                        for block in group:
                            emap.insert_batch(block)
                    else:
                        emap.insert_all(chain.from_iterable(group))
        except StopIteration as exc:  # PySpark's wrapper was taken off a typed reduce function
            raise stop_iteration_error(exc) from exc

    @property
    def spills(self) -> int:
        """Spills so far (PySpark's attribute)."""
        return self.metrics.spill_count

    def items(self) -> Iterator[tuple[Any, Any]]:
        """The ``(key, combiner)`` pairs; releases memory and spill files when exhausted.

        On the reduce side every key once; on the map side (after :meth:`mergeValues`) the
        partial combiners, folded as they are read."""
        records, self._records = self._records, []
        if records:
            return self._combine(records)
        emap, self._map = self._map, None
        if emap is None:
            return iter(())
        return self._drain(emap)

    def _combine(self, records: list[Iterable[tuple[Any, Any]]]) -> Iterator[tuple[Any, Any]]:
        seen = recognise(self.agg)
        combiner = PartialCombiner(
            seen.create,
            seen.merge,
            typed_op=seen.typed_op,
            typed_from_zero=seen.typed_from_zero,
            lists=seen.group_by_key,
            memory=self.budget,
            spill_dirs=self.localdirs,
            name="pyspark-map-combine",
        )
        self.metrics = combiner.metrics
        source = records[0] if len(records) == 1 else (kv for part in records for kv in part)
        return combiner.combine(source)

    def _drain(self, emap: ExternalAppendOnlyMap) -> Iterator[tuple[Any, Any]]:
        try:
            with fewer_collections():
                yield from emap.iterator()
        finally:
            emap.close()
            release_free_memory()  # the task's freed heap, before the reused worker's next task
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
        with fewer_collections():  # PySpark unpickles the pieces as we read them
            self._group.merge_pieces(iterator, owned=True)  # fresh lists, nobody else's

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Every ``(key, values)`` once; ``values`` is a list or a ``SpilledValues``."""
        group, self._group = self._group, None
        if group is None:
            return iter(())
        return self._drain_group(group)

    def _drain_group(self, group: SpillingGroupBy) -> Iterator[tuple[Any, Any]]:
        try:
            with fewer_collections():
                yield from group
        finally:
            group.close()
            release_free_memory()
            report_spill(group.metrics)

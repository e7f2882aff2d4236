"""The map side of a PySpark shuffle: combine while memory lasts, then hand the combiners on.

PySpark's ``combineByKey`` (and ``reduceByKey``, ``aggregateByKey``, ``foldByKey``,
``groupByKey``) combines records by key in each map task before the shuffle, and merges the
combiners again by key after it. The map-side combine only saves shuffle bytes: a key may leave
a map task more than once, each time as a valid combiner, and the reduce side still gets one
answer per key. So when the combiners outgrow the worker budget, :class:`PartialCombiner` does
not spill them to disk and merge them back (what PySpark's ``ExternalMerger`` does, and what
costs most of its time): it hands them to the shuffle and starts again empty, as Spark SQL's
partial aggregation does. No spill file is written on the map side.

Two folds:

* ``reduceByKey(operator.add | min | max)`` over exact ``int`` or ``str`` keys and ``int`` or
  ``float`` values folds chunks of records in compiled code
  (:class:`extagg.generic.typed_map.TypedReduceMap`); a chunk that does not fit hands the typed
  groups on and continues in the dict fold.
* Every other aggregator: a dict, ``d[k] = merge(d[k], v) if k in d else create(v)``, with
  PySpark's ``fail_on_stopiteration`` wrapper taken off the hot loop (a ``StopIteration`` from
  the user's function still fails the task with PySpark's own error).

groupByKey's combine only saves repeating a key: every value is shipped anyway, which is why
Spark itself runs groupByKey with ``mapSideCombine=false``. When the first generation of
groupByKey's combiners (the records that fit in the budget) saved fewer than
:data:`MIN_COMBINE_SAVING` of the pieces (most keys came once: many keys per map task), the
combiner hands that generation on and passes every further record on as ``(key, [value])``,
holding nothing; an input that fits in one generation is combined whole, as before.

Garbage collection: a shuffle allocates millions of small acyclic containers (record tuples,
groupByKey's lists) — in PySpark's unpickling, in the fold, in the pickling — and CPython's
collector, triggered every 700 allocations, walks the young ones again and again (measured:
unpickling 750 k ``(key, [value])`` pieces 5.8 s with the default thresholds, 1.2 s with a
first-generation threshold of 50 000). :func:`fewer_collections` raises that threshold while
extagg's merger runs in the worker and restores it when the last merger is done; the older
generations' thresholds, and so full collections, are left as they were.

Memory: the combiners are accounted to the budget (:class:`~extagg.spillable.Spillable`'s
threshold policy) from sampled sizes; when the grant falls short they are handed on. While they
are being handed on nothing is folded, so the worker holds one generation of combiners at most.
The dict's combiners leave one by one (popped as the shuffle writer takes them); the typed
table's leave :data:`HAND_ON_SLICE` groups at a time as arrays
(:class:`~extagg.collection.pair_arrays.PairArrays`), which the shuffle writer partitions and
pickles as arrays and anything else reads as Python objects a slice at a time (decoding the
whole table beside itself took the map side of ``reduceByKey`` on str keys to 1.5x its
budget). After a generation has been handed on, and when the task ends, the freed C heap (the
table's arrays, list buffers) is given back to the kernel
(:func:`extagg._malloc.release_free_memory`), so that a reused worker does not carry it into
the next generation or task.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from itertools import chain, islice
from typing import Any

from extagg._config import format_size
from extagg._malloc import release_free_memory
from extagg.collection.pair_arrays import PairArrays
from extagg.collection.size_estimator import estimate_size
from extagg.memory import Consumer
from extagg.spillable import Spillable

__all__ = [
    "HandedOn",
    "MIN_COMBINE_SAVING",
    "YOUNG_THRESHOLD",
    "PartialCombiner",
    "fewer_collections",
    "stop_iteration_error",
]

log = logging.getLogger(__name__)

#: records folded between memory checks (the dict fold, the typed fold)
CHUNK = 1024
TYPED_CHUNK = 8192
#: typed groups decoded to Python objects at a time when they are handed on
HAND_ON_SLICE = 16384
#: a dict entry's own cost beyond its key and combiner: hash, two pointers, index, slack
DICT_ENTRY = 64
#: a list slot per value (groupByKey's combiners are lists)
LIST_SLOT = 8
#: allocations between collections of the youngest generation while a merger runs
YOUNG_THRESHOLD = 50_000
#: groupByKey's map side stops combining when its first generation of combiners saved fewer
#: than this fraction of the pieces it would have shipped uncombined (one per record)
MIN_COMBINE_SAVING = 0.2

_gc_lock = threading.Lock()
_gc_depth = 0
_gc_saved: tuple[int, ...] | None = None


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Raise the youngest generation's collection threshold for the block (nested and
    interleaved blocks, e.g. suspended generators, restore it when the last one ends)."""
    global _gc_depth, _gc_saved
    with _gc_lock:
        if _gc_depth == 0:
            _gc_saved = gc.get_threshold()
            if _gc_saved[0] and _gc_saved[0] < YOUNG_THRESHOLD:  # 0: collection disabled
                gc.set_threshold(YOUNG_THRESHOLD, *_gc_saved[1:])
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_saved is not None:
                gc.set_threshold(*_gc_saved)
                _gc_saved = None


class HandedOn:
    """What :meth:`PartialCombiner.combine` hands on: an iterator of ``(key, combiner)``
    pairs, produced in parts as the combiner folds. A consumer that can take a part whole —
    the shuffle writer (:func:`extagg.spark.shuffle.write_buckets`) — reads :meth:`parts`
    instead: lists or iterators of pairs, and the typed fold's groups as
    :class:`~extagg.collection.pair_arrays.PairArrays` blocks (no Python object per group)."""

    __slots__ = ("_parts", "_pairs")

    def __init__(self, parts: Iterator[Iterable[tuple[Any, Any]]]) -> None:
        self._parts = parts
        self._pairs: Iterator[tuple[Any, Any]] | None = None

    def __iter__(self) -> HandedOn:
        return self

    def __next__(self) -> tuple[Any, Any]:
        if self._pairs is None:
            self._pairs = chain.from_iterable(self._parts)
        return next(self._pairs)

    def parts(self) -> Iterator[Iterable[tuple[Any, Any]]]:
        """The parts, each an iterable of pairs or a ``PairArrays`` (read one or the other:
        not after pairs were taken)."""
        if self._pairs is not None:
            raise RuntimeError("HandedOn: pairs were taken already; the parts are gone")
        return self._parts

    def close(self) -> None:
        """Stop folding and release the combiner (what closing a generator does)."""
        close = getattr(self._parts, "close", None)
        if close is not None:
            close()


class PartialCombiner(Spillable[Any]):
    """Combines ``(key, value)`` records per key within a budget; see the module docstring.

    Parameters
    ----------
    create, merge
        ``createCombiner(v)`` and ``mergeValue(c, v)``, as Spark calls them.
    typed_op
        The :mod:`extagg.generic.typed_map` operation when the aggregator is
        ``reduceByKey(add | min | max)`` or one of the sums :func:`extagg.spark.merger.recognise`
        reads (the typed fold), else ``None``.
    typed_from_zero
        The typed fold's combiners start from an int zero (``foldByKey(0, add)``,
        ``aggregateByKey((0, 0), ...)``): each value is added to ``0`` first.
    lists
        The aggregator is ``groupByKey``'s: ``[v]`` and ``append`` (folded inline).
    memory, spill_dirs, name
        As for :class:`~extagg.spillable.Spillable`.
    """

    def __init__(
        self,
        create: Callable[[Any], Any],
        merge: Callable[[Any, Any], Any],
        *,
        typed_op: int | None = None,
        typed_from_zero: bool = False,
        lists: bool = False,
        memory: int | str | None = None,
        spill_dirs: Iterable[str] | str | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(memory, spill_dirs=spill_dirs, name=name)
        total = self.budget.max_memory
        self.initial_threshold = max(min(5 << 20, total // 16), min(64 << 10, total // 4))
        self.create, self.merge = create, merge
        self.lists = lists
        self._typed: Any = None
        if typed_op is not None:
            from extagg.generic.typed_map import TypedReduceMap  # numba: only on this path

            self._typed = TypedReduceMap(typed_op, from_zero=typed_from_zero)
        self.groups: dict[Any, Any] = {}
        #: values folded into the dict since it was last handed on (list growth)
        self.values = 0
        self.entry_bytes = 96.0  # running estimate of a key + combiner + entry
        self.value_bytes = 36.0  # groupByKey: running estimate of one value + its list slot
        self._out: list[Iterator[Iterable[tuple[Any, Any]]]] | None = None
        #: combiners handed on (keys may repeat across generations), and how many times the
        #: budget made the combiner hand them on early
        self.emitted = 0
        self.flushes = 0
        #: groupByKey: combining stopped paying, every further record is passed on as ``[v]``
        self.passing = False

    # ------------------------------------------------------------------ sizes
    def estimated_bytes(self) -> int:
        """Bytes of the combiners held (sampled sizes; the typed table's arrays exactly)."""
        size = int(len(self.groups) * self.entry_bytes)
        if self.lists:
            size += int(self.values * self.value_bytes)
        if self._typed is not None:
            size += self._typed.estimate_size()
        return size

    def _sample(self, key: Any, value: Any) -> None:
        combiner = self.groups.get(key)
        if self.lists:
            if value is not None:
                self.value_bytes = 0.9 * self.value_bytes + 0.1 * (estimate_size(value) + LIST_SLOT)
            size = estimate_size(key) + 56 + DICT_ENTRY  # the list's header
        else:
            size = estimate_size(key) + estimate_size(combiner) + DICT_ENTRY
        self.entry_bytes = 0.9 * self.entry_bytes + 0.1 * size

    # ------------------------------------------------------------------ folding
    def combine(self, records: Iterable[tuple[Any, Any]]) -> HandedOn:
        """Fold ``records`` lazily; the ``(key, combiner)`` pairs handed on, a key possibly
        more than once (the reduce side merges them)."""
        self.check_open("combine after the combiner closed")
        return HandedOn(self._parts(iter(records)))

    def _parts(self, it: Iterator[tuple[Any, Any]]) -> Iterator[Iterable[tuple[Any, Any]]]:
        with fewer_collections():
            yield from self._combine(it)

    def _combine(self, it: Iterator[tuple[Any, Any]]) -> Iterator[Iterable[tuple[Any, Any]]]:
        try:
            while True:
                typed = self._typed
                chunk = list(islice(it, TYPED_CHUNK if typed is not None else CHUNK))
                if not chunk:
                    break
                with self.lock:
                    estimate = self.estimated_bytes()
                    if typed is not None and len(typed) + len(chunk) > typed.grow_threshold:
                        estimate += typed.growth_bytes()
                    self.maybe_spill(estimate, "memory not granted: handed to the shuffle")
                typed = self._typed  # a new table if the last one was handed on
                out, self._out = self._out, None
                if out is not None:
                    while out:  # no name may keep a handed-on generation alive after it
                        yield from out.pop(0)  # the parts of one source
                    del out
                    release_free_memory()  # the generation's freed heap (module docstring)
                if self.passing:
                    yield from self._pass_through(chunk, it)
                    break
                if typed is not None:
                    keys = [k for k, _ in chunk]
                    values = [v for _, v in chunk]
                    done = typed.fold_typed(keys, values)
                    self.metrics.records_read += done
                    if done == len(chunk):
                        continue
                    yield from self._leave_typed()  # the rest folds in the dict from now on
                    chunk = chunk[done:]
                self._fold(chunk)
            yield from self._drain()
        finally:
            self.close()
            release_free_memory()  # the task's freed heap, before the reused worker's next task
            if self.flushes:
                log.info(
                    "%s: %d combiners handed on, %d times before the end of the input",
                    self.name,
                    self.emitted,
                    self.flushes,
                )

    def _fold(self, chunk: list[tuple[Any, Any]]) -> None:
        groups, create, merge = self.groups, self.create, self.merge
        try:
            if self.lists:  # groupByKey's own [v] / append, inlined
                for k, v in chunk:
                    group = groups.get(k)
                    if group is None:
                        groups[k] = [v]
                    else:
                        group.append(v)
            else:
                for k, v in chunk:
                    groups[k] = merge(groups[k], v) if k in groups else create(v)
        except StopIteration as exc:  # what PySpark's fail_on_stopiteration makes of it
            raise stop_iteration_error(exc) from exc
        self.values += len(chunk)
        self.metrics.records_read += len(chunk)
        k, v = chunk[-1]
        self._sample(k, v)

    def _pass_through(
        self, chunk: list[tuple[Any, Any]], it: Iterator[tuple[Any, Any]]
    ) -> Iterator[list[tuple[Any, list[Any]]]]:
        """groupByKey without the map-side combine (Spark's own ``mapSideCombine=false``):
        every record leaves as ``(key, [value])``; nothing is held."""
        with self.lock:
            self.release_down_to(0)
        while chunk:
            self.metrics.records_read += len(chunk)
            self.emitted += len(chunk)
            yield [(k, [v]) for k, v in chunk]
            chunk = list(islice(it, CHUNK))

    def _leave_typed(self) -> Iterator[PairArrays]:
        typed, self._typed = self._typed, None
        log.debug("%s: records left the typed fold; %d groups handed on", self.name, len(typed))
        self.emitted += len(typed)
        return typed.destructive_pair_slices(HAND_ON_SLICE)

    def _drain(self) -> Iterator[Iterable[tuple[Any, Any]]]:
        if self._typed is not None:
            yield from self._leave_typed()
        groups, self.groups, self.values = self.groups, {}, 0
        self.emitted += len(groups)
        yield _handed_on(groups)

    # ------------------------------------------------------------------ Spillable hooks
    def collection_is_empty(self) -> bool:
        return not self.groups and not self._typed

    def spill_collection(self, size: int, reason: str) -> None:
        """Hand the combiners to the shuffle (yielded before the next chunk is folded)."""
        self.flushes += 1
        log.debug("%s: %s of combiners handed on (%s)", self.name, format_size(size), reason)
        parts: list[Iterator[Iterable[tuple[Any, Any]]]] = []  # sources of parts
        if self._typed is not None and len(self._typed):
            from extagg.generic.typed_map import TypedReduceMap

            op, from_zero = self._typed.op, self._typed.from_zero
            self.emitted += len(self._typed)
            parts.append(self._typed.destructive_pair_slices(HAND_ON_SLICE))
            self._typed = TypedReduceMap(op, from_zero=from_zero)
        if self.groups:
            if self.lists and self.flushes == 1:
                self._decide_pass_through()
            parts.append(iter((_handed_on(self.groups),)))
            self.emitted += len(self.groups)
            self.groups, self.values = {}, 0
        self._out = parts

    def _decide_pass_through(self) -> None:
        """After groupByKey's first generation: stop combining if it saved too few pieces
        (distinct keys close to the records folded: most keys came once within the budget).
        """
        records, pieces = self.values, len(self.groups)
        saving = 1.0 - pieces / max(records, 1)
        if saving < MIN_COMBINE_SAVING:
            self.passing = True
            log.info(
                "%s: map-side combine saved %.0f%% of %d pieces in its first generation; "
                "passing the remaining records on uncombined",
                self.name,
                100 * saving,
                records,
            )

    def force_spill(self, trigger: Consumer) -> int:
        return 0  # combiners can only be handed on between chunks, by the task's own thread

    def release_collection(self) -> None:
        self.groups, self.values, self._typed, self._out = {}, 0, None, None


def _handed_on(groups: dict[Any, Any]) -> Iterator[tuple[Any, Any]]:
    """``groups``' items, each removed from the dict as it is handed on: a combiner is freed
    as soon as the shuffle writer has pickled it, not when the whole generation is done."""
    pop = groups.popitem
    for _ in range(len(groups)):
        yield pop()


def stop_iteration_error(exc: StopIteration) -> Exception:
    """The error PySpark's ``fail_on_stopiteration`` raises for ``exc``."""
    try:
        from pyspark.errors import PySparkRuntimeError
    except ImportError:  # pragma: no cover - only used inside PySpark workers
        return RuntimeError(f"StopIteration raised by a combine function: {exc}")
    return PySparkRuntimeError(
        errorClass="STOP_ITERATION_OCCURRED", messageParameters={"exc": str(exc)}
    )

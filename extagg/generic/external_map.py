"""ExternalAppendOnlyMap: fold (key, value) records into combiners in bounded memory.

The map is a :class:`~extagg.memory.MemoryConsumer`. It folds records into an in-memory
:class:`~extagg.collection.SizeTrackingAppendOnlyMap`; before each chunk of records (a multiple
of 32, as Spark checks every 32 records) it compares the map's estimated size with the memory it
holds, asks the memory manager for ``2 × size − held`` when it has outgrown it, and spills when
the grant falls short: the map is sorted by key hash and written as a run file of independently
decodable LZ4 batches, then started again empty. Iteration merges the in-memory map and every
run through :mod:`extagg.merge.heap`, combining equal keys with ``merge_combiners``.

Deviation from Spark, on purpose: Spark's first 5 MiB (``initialMemoryThreshold``) are a free
allowance never asked of the memory manager. Here every byte is accounted, so that allowance is
acquired like any other memory; it is also capped at 1/16 of the manager so tiny budgets spill.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Iterable, Iterator
from itertools import chain, islice
from typing import Any

from extagg._config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_FAN_IN,
    INITIAL_MEMORY_THRESHOLD,
    env_int,
    format_size,
)
from extagg.collection import SizeTrackingAppendOnlyMap
from extagg.collection.append_only_map import SORT_BYTES_PER_ENTRY
from extagg.generic.aggregator import Aggregator
from extagg.generic.memory_rows import SpillableMemorySource, UnsortedMemoryRows
from extagg.generic.merge_phase import OBJECT_EXPANSION, merged_pairs
from extagg.memory import Consumer, TaskMemoryManager, UnifiedMemoryManager
from extagg.merge.heap import BlockSource, RunSource
from extagg.spill.blocks import ObjectBlock, PermutedObjectBlock
from extagg.spill.codecs import OBJECT_CODEC
from extagg.spillable import Spillable

__all__ = ["ExternalAppendOnlyMap"]

log = logging.getLogger(__name__)

#: records folded per call into the map; spilling is checked between chunks (Spark: every 32)
CHUNK = 1024
MIN_SPILL_FLOOR = 64 * 1024

INSERT_AFTER_ITERATOR = "Cannot insert new elements into a map after calling iterator"
ITERATOR_TWICE = "ExternalAppendOnlyMap.iterator is destructive and should only be called once."


class ExternalAppendOnlyMap(Spillable[ObjectBlock]):
    """A spillable map of key → combiner with Spark's ``combineByKey`` semantics.

    ``memory`` (bytes or a size string like ``"64m"``) gives the map a budget of its own;
    ``memory_manager`` shares a :class:`~extagg.memory.UnifiedMemoryManager` (or a task's
    :class:`~extagg.memory.TaskMemoryManager`) with other consumers; with neither, the process
    default manager is used. Iteration (``iterator()`` or ``iter(map)``) is destructive and
    possible once; see :meth:`iterator` for the order. ``close()`` (or leaving a ``with``
    block) releases the memory and deletes every run file.

    ``force_spill_every`` (or ``EXTAGG_FORCE_SPILL_EVERY``) is a test knob like Spark's
    ``numElementsForceSpillThreshold``: spill after every N records.
    """

    def __init__(
        self,
        aggregator: Aggregator[Any, Any],
        memory: int | str | None = None,
        *,
        memory_manager: UnifiedMemoryManager | TaskMemoryManager | None = None,
        spill_dirs: Iterable[str] | str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        fan_in: int = DEFAULT_FAN_IN,
        compression: str = "lz4",
        max_spill_bytes: int | str | None = None,
        force_spill_every: int | None = None,
        name: str | None = None,
    ) -> None:
        if not isinstance(aggregator, Aggregator):
            raise TypeError(
                f"aggregator must be an extagg.Aggregator, got {type(aggregator).__name__}"
            )
        super().__init__(
            memory,
            memory_manager=memory_manager,
            spill_dirs=spill_dirs,
            batch_size=batch_size,
            fan_in=fan_in,
            compression=compression,
            max_spill_bytes=max_spill_bytes,
            force_spill_every=force_spill_every or env_int("EXTAGG_FORCE_SPILL_EVERY", None),
            name=name,
        )
        self.aggregator = aggregator
        max_memory = self.budget.max_memory
        self.initial_threshold = max(
            min(INITIAL_MEMORY_THRESHOLD, max_memory // 16), min(MIN_SPILL_FLOOR, max_memory // 4)
        )
        self._map: SizeTrackingAppendOnlyMap | None = SizeTrackingAppendOnlyMap()
        self._row_bytes = 64  # in-memory bytes of one row, as last measured
        self._reading: SpillableMemorySource | UnsortedMemoryRows | None = None
        every = self.force_spill_every
        self._chunk = CHUNK if every is None else min(CHUNK, every)

    # ------------------------------------------------------------------ inserting
    def insert(self, key: Hashable, value: Any) -> None:
        """Fold one record (see :meth:`insert_all`)."""
        self.insert_all(((key, value),))

    def insert_all(self, pairs: Iterable[tuple[Hashable, Any]]) -> None:
        """Fold every ``(key, value)`` pair of ``pairs`` (any iterable, consumed lazily).

        If a spill fails (``SpillError``: disk full, spill cap, a combiner that cannot be
        pickled), every record taken from ``pairs`` so far is in the map and the map stays
        usable: continue with the rest of the records, do not insert those again.
        """
        self.check_open(INSERT_AFTER_ITERATOR)
        aggregator = self.aggregator
        create, merge = aggregator.create_combiner, aggregator.merge_value
        it = iter(pairs)
        chunk_size = self._chunk
        while True:
            chunk = list(islice(it, chunk_size))
            if not chunk:
                return
            try:
                keys, values = zip(*chunk)
            except (TypeError, ValueError):
                raise TypeError(_bad_pairs_message(chunk)) from None
            with self.lock:
                self.check_open(INSERT_AFTER_ITERATOR)
                current = self._map
                assert current is not None
                estimate = current.estimate_size()
                if estimate > self.metrics.peak_memory_bytes:
                    self.metrics.peak_memory_bytes = estimate
                # a spill sorts the map first: its working memory is part of what we hold
                estimate += SORT_BYTES_PER_ENTRY * (len(current) + len(keys))
                if len(current) + len(keys) > current.grow_threshold:
                    # this chunk may double the table: ask for the new arrays before they exist
                    estimate += current.growth_bytes()
                try:
                    if self.maybe_spill(estimate):
                        current = self._map
                except BaseException:
                    # the spill failed and the map was rebuilt: keep the records already taken
                    # from the iterable, so everything consumed so far is in the map
                    assert self._map is not None
                    self._map.fold(keys, values, create, merge)
                    self.elements_read += len(keys)
                    self.metrics.records_read += len(keys)
                    raise
                assert current is not None
                current.fold(keys, values, create, merge)
                self.elements_read += len(keys)
                self.metrics.records_read += len(keys)

    # ------------------------------------------------------------------ Spillable hooks
    def collection_is_empty(self) -> bool:
        return not self._map

    def spill_collection(self, size: int, reason: str) -> None:
        """Sort the current map by key hash and write it as a run; on failure keep it."""
        self.log_spill("in-memory map", size)
        self._spill_current_map(size)
        self.metrics.memory_bytes_spilled += size

    def force_spill(self, trigger: Consumer) -> int:
        """Spill the current map, or — when iteration has started — the part of it not yet
        read, and drop the reference to it. Returns the bytes released."""
        if self._reading is not None:
            if not self._reading.spill_rest(trigger):
                return 0
        elif self._map:
            estimate = self._map.estimate_size()
            self.log_spill("in-memory map", estimate, _forced_by(trigger))
            self._spill_current_map(estimate)
            self.elements_read = 0
        else:
            return 0
        freed = self.threshold
        if self._reading is None or self._reading.run is not None:  # not a mere release
            self.metrics.memory_bytes_spilled += freed
        self.release_down_to(0)
        return freed

    def release_collection(self) -> None:
        self._map = None
        if self._reading is not None:
            self._reading.close()

    def _move_to_run(
        self, block: ObjectBlock | PermutedObjectBlock, trigger: Consumer | str | None
    ) -> RunSource[ObjectBlock]:
        """Write the unread, hash-sorted rows of the iteration to a run (a forced spill)."""
        self.log_spill(
            "in-memory map", self.threshold, _forced_by("the merge" if trigger is None else trigger)
        )
        started = time.perf_counter()
        try:
            path = self._write_run(block)
        finally:
            self.metrics.spill_time_s += time.perf_counter() - started
        return self.runs.detach(path)  # owned by the reading source from now on

    def _release_rows(self) -> None:
        self.release_down_to(0)

    def _spill_current_map(self, estimate: int) -> None:
        """Sort the current map by key hash and write it as a run; on failure keep it."""
        assert self._map is not None
        started = time.perf_counter()
        hashes, order, keys, values = self._map.destructive_sort_order()
        self._map = SizeTrackingAppendOnlyMap()
        try:
            self._write_run(PermutedObjectBlock(hashes, order, keys, values))
        except BaseException:
            del hashes, order
            self._map = _rebuild_map(keys, values)
            raise
        finally:
            self.metrics.spill_time_s += time.perf_counter() - started
        log.debug("spilled %d keys (%s estimated)", len(keys), format_size(estimate))

    def _batch_rows(self, block: ObjectBlock | PermutedObjectBlock | None = None) -> int:
        """Rows per run batch: ``batch_size``, fewer when rows are big, so that the merge can
        hold one decoded batch per open run within the budget (``block`` updates the measured
        row size)."""
        if block is not None and len(block):
            self._row_bytes = max(1, block.nbytes() // len(block))
        target = max(64 * 1024, self.budget.max_memory // (4 * self.fan_in))
        return max(16, min(self.batch_size, target // self._row_bytes))

    def _write_run(self, block: ObjectBlock | PermutedObjectBlock) -> str:
        rows = self._batch_rows(block)
        return self.runs.write("map", OBJECT_CODEC, lambda writer: writer.write_sorted(block, rows))

    # ------------------------------------------------------------------ iterating
    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return self.iterator()

    def iterator(self, ordered: bool = False) -> Iterator[tuple[Any, Any]]:
        """Yield every ``(key, combiner)`` once. Destructive; call once.

        When anything spilled, pairs come in ascending :func:`extagg.hashing.order_hash` order
        (the merge order). When nothing spilled they come in insertion order — also
        deterministic, and free — unless ``ordered=True`` asks for key-hash order always (what
        :meth:`extagg.state.StateStoreProvider.merge_update` needs).
        """
        with self.lock:
            self.begin_reading(ITERATOR_TWICE)
            current = self._map
            assert current is not None
            if current:
                estimate = current.estimate_size()
                if estimate > self.metrics.peak_memory_bytes:
                    self.metrics.peak_memory_bytes = estimate
            if not ordered and not self.runs:
                keys, values = current.destructive_arrays()
                self._map = None
                unsorted = UnsortedMemoryRows(
                    keys,
                    values,
                    lock=self.lock,
                    move_to_run=self._move_to_run,
                    release=self._release_rows,
                )
                self._reading = unsorted
                return chain.from_iterable(self._iterate_unsorted(unsorted))
            hashes, order, keys, values = current.destructive_sort_order()
            self._map = None
            memory_source = SpillableMemorySource(
                PermutedObjectBlock(hashes, order, keys, values),
                self.batch_size,
                lock=self.lock,
                move_to_run=self._move_to_run,
                release=self._release_rows,
            )
            self._reading = memory_source
        # pairs are handed out by C-level iterators; Python runs once per block, not per pair
        return chain.from_iterable(self._merged(memory_source))

    def _merged(self, memory_source: SpillableMemorySource) -> Iterator[Iterator[tuple[Any, Any]]]:
        """The merge of the sorted map and every run; closes everything when done, on error
        and when the consumer stops early."""
        sources: list[BlockSource[ObjectBlock]] = [memory_source]
        with self.lock:  # a forced spill from another thread may be moving rows to a run
            sources += self.runs.take_sources()
        merge_memory = 0
        try:
            fan_in = self.fan_in
            if len(sources) > 1:
                per_source = max(1, self.runs.max_batch_bytes * OBJECT_EXPANSION)
                fan_in, merge_memory = self.reserve_merge_memory(
                    per_source, len(sources), spill_rest=lambda: self._spill_rest(memory_source)
                )
            yield from merged_pairs(
                sources,
                self.aggregator.merge_combiners,
                fan_in=fan_in,
                runs=self.runs,
                batch_rows=self._batch_rows,
                metrics=self.metrics,
            )
        finally:
            for source in sources:
                source.close()
            if merge_memory:
                self.free_memory(min(merge_memory, self.used))
            self.close()

    def _spill_rest(self, memory_source: SpillableMemorySource) -> bool:
        """The merge's buffers do not fit next to the map: move its unread rows to a run."""
        if self.threshold <= 0 or not memory_source.spill_rest():
            return False
        self.metrics.memory_bytes_spilled += self.threshold
        self.release_down_to(0)
        return True

    def _iterate_unsorted(self, rows: UnsortedMemoryRows) -> Iterator[Iterator[tuple[Any, Any]]]:
        try:
            while True:
                chunk = rows.next_chunk()
                if chunk is None:
                    return
                keys, values = chunk
                self.metrics.groups += len(keys)
                yield zip(keys, values)
        finally:
            rows.close()
            self.close()

    # ------------------------------------------------------------------ cleanup
    def __repr__(self) -> str:
        state = {"open": "open", "reading": "iterating"}.get(self.phase, self.phase)
        return (
            f"<ExternalAppendOnlyMap {self.name} {state}: {self.metrics.records_read} records, "
            f"{self.metrics.spill_count} spills, {format_size(self.used)} held>"
        )


def _rebuild_map(keys: list[Any], values: list[Any]) -> SizeTrackingAppendOnlyMap:
    """Put the rows of a failed spill back into a fresh map, so the map stays usable."""
    rebuilt = SizeTrackingAppendOnlyMap()
    for key, value in zip(keys, values):
        rebuilt.update(key, value)
    return rebuilt


def _forced_by(trigger: Any) -> str:
    return f"forced by {getattr(trigger, 'name', trigger)}"


def _bad_pairs_message(chunk: list[Any]) -> str:
    for item in chunk:
        if not isinstance(item, tuple) or len(item) != 2:
            try:
                if len(item) == 2:
                    continue
            except TypeError:
                pass
            return (
                "insert_all expects (key, value) pairs; got an item of type "
                f"{type(item).__name__}: {item!r:.80}"
            )
    return "insert_all expects (key, value) pairs"

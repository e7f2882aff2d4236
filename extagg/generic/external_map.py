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
import threading
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
    parse_size,
)
from extagg.collection import SizeTrackingAppendOnlyMap
from extagg.collection.append_only_map import SORT_BYTES_PER_ENTRY
from extagg.generic.aggregator import Aggregator
from extagg.generic.memory_rows import SpillableMemorySource, UnsortedMemoryRows
from extagg.generic.merge_phase import merged_pairs
from extagg.memory import (
    MemoryConsumer,
    TaskMemoryManager,
    UnifiedMemoryManager,
    resolve_task_memory_manager,
)
from extagg.merge.heap import (
    RunSource,
)
from extagg.metrics import SpillMetrics
from extagg.spill.blocks import ObjectBlock, PermutedObjectBlock
from extagg.spill.codecs import OBJECT_CODEC
from extagg.spill.runfile import RunWriter
from extagg.spill.tempdir import SpillDirs

__all__ = ["ExternalAppendOnlyMap"]

log = logging.getLogger(__name__)

#: records folded per call into the map; spilling is checked between chunks (Spark: every 32)
CHUNK = 1024
MIN_SPILL_FLOOR = 64 * 1024


class ExternalAppendOnlyMap(MemoryConsumer):
    """A spillable map of key → combiner with Spark's ``combineByKey`` semantics.

    Records are folded into combiners in a hash table whose size is sampled (Spark's
    ``SizeTracker``); before it outgrows its grant it asks the memory manager for more and spills
    a hash-sorted run file when refused. Iteration (``iterator()`` or ``iter(map)``) merges memory
    and every run; it is destructive and possible once. ``close()`` (or leaving a ``with`` block)
    releases the memory and deletes every run file.

    Parameters
    ----------
    aggregator
        How values fold into combiners.
    memory
        A private budget: bytes or a size string like ``"64m"``.
    memory_manager
        A shared ``UnifiedMemoryManager`` (this thread's task) or ``TaskMemoryManager``. With
        neither ``memory`` nor this, the process default manager is used.
    spill_dirs
        Spill directories (default ``EXTAGG_SPILL_DIR`` or the system temp directory).
    batch_size
        Records per batch in a run file (Spark's ``spark.shuffle.spill.batchSize``).
    fan_in
        Most runs merged at once; more are merged in intermediate passes.
    compression
        ``"lz4"`` or ``"none"`` for run-file batches.
    max_spill_bytes
        Cap on bytes on disk at once (default ``EXTAGG_MAX_SPILL_BYTES``, none).
    force_spill_every
        Test knob (Spark's ``numElementsForceSpillThreshold``, ``EXTAGG_FORCE_SPILL_EVERY``):
        spill after every N records.
    name
        Name in logs and memory reports (default: class name and a counter).

    Raises
    ------
    TypeError
        ``aggregator`` is not an :class:`Aggregator`; a key is unhashable.
    SpillError
        A spill failed (disk full, cap reached, unpicklable combiner); the data stays in memory.
    MemoryLimitError
        Memory could not be granted even after spilling.

    Notes
    -----
    ``insert`` is amortised O(1) per record; a spill sorts n entries in O(n log n) and writes them;
    the merge of r runs costs O(N log r) for N spilled rows. Memory held: the map itself (at most
    the grant, about twice its estimated size before a spill), 16 bytes per entry while a spill
    sorts, and about one decoded batch per run (at most ``fan_in``) while merging — all granted by
    the manager.

    Examples
    --------
    >>> import operator
    >>> with ExternalAppendOnlyMap(Aggregator.reducing(operator.add), memory="8m") as m:
    ...     m.insert_all([("a", 1), ("b", 2), ("a", 3)])
    ...     sorted(m.iterator())
    [('a', 4), ('b', 2)]
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
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if fan_in < 2:
            raise ValueError(f"fan_in must be at least 2, got {fan_in}")
        tmm = resolve_task_memory_manager(memory, memory_manager)
        super().__init__(tmm, name)
        self.aggregator = aggregator
        self.batch_size = batch_size
        self.fan_in = fan_in
        self.compression = compression
        self.force_spill_every = force_spill_every or env_int("EXTAGG_FORCE_SPILL_EVERY", None)
        if self.force_spill_every is not None and self.force_spill_every < 1:
            raise ValueError(f"force_spill_every must be positive, got {force_spill_every}")
        cap = (
            None if max_spill_bytes is None else parse_size(max_spill_bytes, name="max_spill_bytes")
        )
        self._spill_dirs = SpillDirs(
            list(spill_dirs)
            if spill_dirs is not None and not isinstance(spill_dirs, str)
            else spill_dirs,
            max_spill_bytes=cap,
        )
        max_memory = tmm.memory_manager.max_memory
        self._initial_threshold = max(
            min(INITIAL_MEMORY_THRESHOLD, max_memory // 16), min(MIN_SPILL_FLOOR, max_memory // 4)
        )
        self._threshold = 0  # bytes held for the in-memory map (Spark's myMemoryThreshold)
        self._map: SizeTrackingAppendOnlyMap | None = SizeTrackingAppendOnlyMap()
        self._runs: list[str] = []
        self._max_batch_bytes = 0  # largest decoded batch in any run: sizes the merge buffers
        self._row_bytes = 64  # in-memory bytes of one row, as last measured
        self._elements_read = 0
        self._reading: SpillableMemorySource | UnsortedMemoryRows | None = None
        self._lock = threading.RLock()
        self._closed = False
        self.metrics = SpillMetrics()
        self._chunk = (
            CHUNK if self.force_spill_every is None else min(CHUNK, self.force_spill_every)
        )

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
        if self._map is None:
            raise RuntimeError("Cannot insert new elements into a map after calling iterator")
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
            with self._lock:
                current = self._map
                if current is None:
                    raise RuntimeError(
                        "Cannot insert new elements into a map after calling iterator"
                    )
                estimate = current.estimate_size()
                if estimate > self.metrics.peak_memory_bytes:
                    self.metrics.peak_memory_bytes = estimate
                # a spill sorts the map first: its working memory is part of what we hold
                estimate += SORT_BYTES_PER_ENTRY * (len(current) + len(keys))
                if len(current) + len(keys) > current.grow_threshold:
                    # this chunk may double the table: ask for the new arrays before they exist
                    estimate += current.growth_bytes()
                try:
                    if self._maybe_spill(estimate):
                        current = self._map
                except BaseException:
                    # the spill failed and the map was rebuilt: keep the records already taken
                    # from the iterable, so everything consumed so far is in the map
                    self._map.fold(keys, values, create, merge)
                    self._elements_read += len(keys)
                    self.metrics.records_read += len(keys)
                    raise
                current.fold(keys, values, create, merge)
                self._elements_read += len(keys)
                self.metrics.records_read += len(keys)

    def _maybe_spill(self, current: int) -> bool:
        """Spark's ``Spillable.maybeSpill``: ask for more memory, spill if refused."""
        if self._threshold == 0:
            self._threshold = self.acquire_memory(self._initial_threshold)
            self._note_granted()
        should_spill = False
        if current >= self._threshold and current > 0:
            granted = self.acquire_memory(2 * current - self._threshold)
            self._threshold += granted
            self._note_granted()
            should_spill = current >= self._threshold
        if (
            not should_spill
            and self.force_spill_every is not None
            and self._elements_read >= self.force_spill_every
        ):
            should_spill = True
        if not should_spill or not self._map:
            return False
        self._log_spill(current)
        self._spill_current_map(current)
        self._elements_read = 0
        self.metrics.memory_bytes_spilled += current
        self._release_down_to(self._initial_threshold)
        return True

    def _log_spill(self, size: int, trigger: Any = None) -> None:
        """Count a spill event and log Spark's one line for it."""
        self.metrics.spill_count += 1
        count = self.metrics.spill_count
        log.info(
            "Thread %d spilling in-memory map of %s to disk (%d time%s so far)%s",
            threading.get_ident(),
            format_size(size),
            count,
            "s" if count > 1 else "",
            "" if trigger is None else f", forced by {getattr(trigger, 'name', trigger)}",
        )

    def _move_to_run(self, block: ObjectBlock | PermutedObjectBlock, trigger: Any) -> RunSource:
        """Write the unread, hash-sorted rows of the iteration to a run (a forced spill)."""
        self._log_spill(self._threshold, "the merge" if trigger is None else trigger)
        started = time.perf_counter()
        try:
            path = self._write_run(block)
        finally:
            self.metrics.spill_time_s += time.perf_counter() - started
        self._runs.remove(path)  # owned by the reading source from now on
        return RunSource(path, owner=self._spill_dirs)

    def _note_granted(self) -> None:
        if self.used > self.metrics.peak_granted_bytes:
            self.metrics.peak_granted_bytes = self.used

    def _release_down_to(self, keep: int) -> None:
        excess = self._threshold - keep
        if excess > 0:
            self.free_memory(excess)
            self._threshold = keep

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

    def _batch_rows(self, block: ObjectBlock | None = None) -> int:
        """Rows per run batch: ``batch_size``, fewer when rows are big, so that the merge can
        hold one decoded batch per open run within the budget (``block`` updates the measured
        row size)."""
        if block is not None and len(block):
            self._row_bytes = max(1, block.nbytes() // len(block))
        max_memory = self.task_memory_manager.memory_manager.max_memory
        target = max(64 * 1024, max_memory // (4 * self.fan_in))
        return max(16, min(self.batch_size, target // self._row_bytes))

    def _write_run(self, block: ObjectBlock | PermutedObjectBlock) -> str:
        path = self._spill_dirs.new_path("map")
        writer = RunWriter(
            path, OBJECT_CODEC, compression=self.compression, spill_dirs=self._spill_dirs
        )
        try:
            writer.write_sorted(block, self._batch_rows(block))
            info = writer.finish()
        except BaseException:
            writer.abort()
            raise
        self._runs.append(path)
        self._max_batch_bytes = max(self._max_batch_bytes, info.max_batch_bytes)
        self.metrics.num_spill_files += 1
        self.metrics.disk_bytes_spilled += info.disk_bytes
        self.metrics.raw_bytes_spilled += info.raw_bytes
        return path

    # ------------------------------------------------------------------ forced spill
    def spill(self, size: int, trigger: MemoryConsumer) -> int:
        """Free memory because another consumer asked (Spark's ``Spillable.spill``).

        Spills the current map, or — when iteration has started — the part of it not yet read,
        and drops the reference to it. Returns the bytes released.
        """
        if trigger is self or self._closed:
            return 0
        # another thread of the same task may be inside insert_all waiting for memory while
        # holding our lock: then there is nothing we can safely spill, so say so at once
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            return self._spill_locked(trigger)
        finally:
            self._lock.release()

    def _spill_locked(self, trigger: MemoryConsumer) -> int:
        if self._reading is not None:
            if not self._reading.spill_rest(trigger):
                return 0
        elif self._map:
            estimate = self._map.estimate_size()
            self._log_spill(estimate, trigger)
            self._spill_current_map(estimate)
            self._elements_read = 0
        else:
            return 0
        freed = self._threshold
        if self._reading is None or self._reading.run is not None:  # not a mere release
            self.metrics.memory_bytes_spilled += freed
        self._release_down_to(0)
        return freed

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
        with self._lock:
            if self._map is None:
                raise RuntimeError(
                    "ExternalAppendOnlyMap.iterator is destructive and should only be called once."
                )
            if self._map:
                estimate = self._map.estimate_size()
                if estimate > self.metrics.peak_memory_bytes:
                    self.metrics.peak_memory_bytes = estimate
            if not ordered and not self._runs:
                keys, values = self._map.destructive_arrays()
                self._map = None
                unsorted = UnsortedMemoryRows(self, keys, values)
                self._reading = unsorted
                return chain.from_iterable(self._iterate_unsorted(unsorted))
            hashes, order, keys, values = self._map.destructive_sort_order()
            self._map = None
            memory_source = SpillableMemorySource(
                self, PermutedObjectBlock(hashes, order, keys, values)
            )
            self._reading = memory_source
        # pairs are handed out by C-level iterators; Python runs once per block, not per pair
        return chain.from_iterable(merged_pairs(self, memory_source))

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
    @property
    def spill_files(self) -> list[str]:
        """The run files currently on disk."""
        return self._spill_dirs.files

    def close(self) -> None:
        """Release all memory and delete every run file. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._map = None
            if self._reading is not None:
                self._reading.close()
            self._spill_dirs.cleanup()
            self._runs.clear()
            self.close_memory()
            self._threshold = 0

    def __enter__(self) -> ExternalAppendOnlyMap:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("iterating" if self._map is None else "open")
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

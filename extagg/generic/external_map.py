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
import operator
import sys
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from itertools import chain, islice
from typing import Any

from extagg._config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_FAN_IN,
    INITIAL_MEMORY_THRESHOLD,
    env_int,
    format_size,
)
from extagg._interrupts import deferred_interrupts
from extagg.collection import SizeTrackingAppendOnlyMap
from extagg.collection.append_only_map import DEFAULT_CAPACITY, SORT_BYTES_PER_ENTRY
from extagg.collection.pair_arrays import PairArrays
from extagg.collection.size_estimator import estimate_size
from extagg.errors import BadKeyError, MemoryLimitError
from extagg.generic.aggregator import Aggregator
from extagg.generic.keys import canonical_keys
from extagg.generic.memory_rows import SpillableMemorySource, UnsortedMemoryRows
from extagg.generic.merge_phase import OBJECT_EXPANSION, merged_pairs
from extagg.generic.typed_map import (
    TypedReduceMap,
    TypedSortedRows,
    aggregator_op,
    scalar_sorted_rows,
)
from extagg.memory import Consumer, TaskMemoryManager, UnifiedMemoryManager
from extagg.merge.heap import BlockSource, RunSource
from extagg.spill.blocks import ObjectBlock, PermutedObjectBlock
from extagg.spill.codecs import OBJECT_CODEC
from extagg.spillable import Spillable

__all__ = ["ExternalAppendOnlyMap"]

log = logging.getLogger(__name__)

#: records folded per call into the map; spilling is checked between chunks (Spark: every 32)
CHUNK = 1024
#: the same on the typed path (compiled folds amortise their per-chunk cost over more records)
TYPED_CHUNK = 4096
#: the share of ``max_memory`` one chunk's records may take (``MIN_CHUNK_BYTES`` at least):
#: records of 1 MiB in chunks of 1 024 held a GiB under an 8 MiB budget between spill checks
CHUNK_BUDGET_SHARE = 16
MIN_CHUNK_BYTES = 1 << 20
#: records sampled (deep size) in each chunk to size the next
CHUNK_SAMPLES = 4
MIN_SPILL_FLOOR = 64 * 1024

INSERT_AFTER_ITERATOR = "Cannot insert new elements into a map after calling iterator"
ITERATOR_TWICE = "ExternalAppendOnlyMap.iterator is destructive and should only be called once."


class ExternalAppendOnlyMap(Spillable[ObjectBlock]):
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
        Spill directories (default ``EXTAGG_SPILL_DIR``, else ``SPARK_LOCAL_DIRS``, else the
        system temp directory).
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
    typed_path
        Fold ``Aggregator.reducing(operator.add | min | max)``, ``Aggregator.counting()``,
        ``Aggregator.sum_count()`` (and the reducing aggregator of its ``merge_combiners``,
        the reduce side of a mean) over plain ``int``/``str`` keys and ``int``/``float``
        values in compiled code (:mod:`extagg.generic.typed_map`) while the records allow it
        (default ``True``; results are the same either way).

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
        typed_path: bool = True,
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
        #: the typed path's operation while records fit it (None: the general path for good)
        self._typed_op = aggregator_op(aggregator) if typed_path else None
        #: the records' values are combiners (``reducing(sum_count().merge_combiners)``)
        self._typed_combiners = aggregator.pattern == "sum_count_merge"
        self._map: SizeTrackingAppendOnlyMap | TypedReduceMap | None = self._new_map()
        self._row_bytes = 64  # in-memory bytes of one row, as last measured
        self._reading: SpillableMemorySource | UnsortedMemoryRows | None = None
        #: the rows of a spill not yet committed (put back into the map if it fails)
        self._unspilled: tuple[list[Any], list[Any]] | TypedSortedRows | None = None
        every = self.force_spill_every
        chunk = CHUNK if self._typed_op is None else TYPED_CHUNK
        self._chunk = chunk if every is None else min(chunk, every)
        #: records taken from the input at a time: ``_chunk``, fewer when records are big
        #: (measured on each chunk; the first chunk's records are added up as taken)
        self._chunk_records = self._chunk
        self._chunks_sized = False

    def _new_map(
        self, capacity: int = DEFAULT_CAPACITY
    ) -> SizeTrackingAppendOnlyMap | TypedReduceMap:
        """An empty map; after a spill of its own (``capacity``) a general map starts at the
        size the spilled one reached, as it will again: its table is not doubled ten times
        over, and each doubling no longer restarts the size sampling (~60 samples of 100
        entries per map at small budgets, the largest cost of a spill cycle after the fold
        itself). The grant its empty arrays need is kept (:meth:`release_after_spill`); a
        spill forced by another consumer starts small (that memory is wanted elsewhere)."""
        if self._typed_op is not None:
            return TypedReduceMap(self._typed_op)
        return SizeTrackingAppendOnlyMap(capacity)

    def _to_general(self, typed: TypedReduceMap) -> SizeTrackingAppendOnlyMap:
        """Records that do not fit the typed path: move its groups to a general map, for good."""
        general = typed.to_general()
        self._map = general
        self._typed_op = None
        log.debug("%s: records left the typed path; %d groups moved", self.name, len(general))
        return general

    # ------------------------------------------------------------------ inserting
    def insert(self, key: Hashable, value: Any) -> None:
        """Fold one record (see :meth:`insert_all`)."""
        self._insert_pairs(((key, value),), size_chunks=False)

    def insert_all(self, pairs: Iterable[tuple[Hashable, Any]]) -> None:
        """Fold every ``(key, value)`` pair of ``pairs`` (any iterable, consumed lazily).

        Nothing is lost and nothing is half-applied: whatever ends the call (a key that cannot
        be grouped — :class:`~extagg.errors.BadKeyError` naming its record index —, a combiner
        that raises, a failed spill, Ctrl-C), the records folded are exactly the first ones of
        ``pairs``, and ``metrics.records_read`` grew by their number; the rest were not folded
        (some may have been taken from the iterable). Records are folded in chunks; Ctrl-C
        during a chunk is held back until the chunk is folded. After a ``SpillError`` (disk
        full, spill cap, a combiner that cannot be pickled) the map takes no more input (it
        would grow past its grant): it raises again at once; what was folded can still be read.
        """
        self._insert_pairs(pairs, size_chunks=True)

    def _insert_pairs(self, pairs: Iterable[tuple[Hashable, Any]], size_chunks: bool) -> None:
        """:meth:`insert_all`; ``size_chunks``: measure the records to size the chunks (not
        for :meth:`insert`'s one record, where it doubled the cost of a call)."""
        self.check_open(INSERT_AFTER_ITERATOR)
        aggregator = self.aggregator
        create, merge = aggregator.create_combiner, aggregator.merge_value
        it = iter(pairs)
        offset = 0  # records of ``pairs`` folded so far
        while True:
            chunk = self._take_chunk(it) if size_chunks else list(islice(it, self._chunk))
            if not chunk:
                return
            failure: BaseException | None = None
            split = _split_pairs(chunk)
            if split is None:
                bad = _first_bad_pair(chunk)
                failure = TypeError(_bad_pairs_message(chunk[bad], offset + bad))
                split = _split_pairs(chunk[:bad]) or ([], [])
            key_list, values = split
            # records bigger than the last ones: fold the chunk in parts, the map's room
            # checked (and spilled) before each
            step = self._size_chunks(key_list, values) if size_chunks else len(key_list) or 1
            start, n = 0, len(key_list)
            while start < n:
                stop = min(n, start + step)
                every = self.force_spill_every
                if every is not None:  # cut where the count reaches it: the spill follows
                    stop = min(stop, start + max(1, every - self.elements_read))
                self._fold_chunk(key_list[start:stop], values[start:stop], create, merge, offset)
                offset += stop - start
                start = stop
            if failure is not None:
                raise failure

    def _take_chunk(self, it: Iterator[Any]) -> list[Any]:
        """The next chunk of ``it``: ``_chunk_records`` records; the first chunk stops early
        when its records' shallow sizes add up to the chunk's share of the budget (their size
        is not known yet: a first chunk of 1 024 records of 1 MiB is not taken whole)."""
        if self._chunks_sized:
            return list(islice(it, self._chunk_records))
        limit = self._chunk_bytes()
        chunk: list[Any] = []
        total = 0
        getsizeof = sys.getsizeof
        for pair in islice(it, self._chunk_records):
            chunk.append(pair)
            try:
                total += getsizeof(pair[0]) + getsizeof(pair[1])
            except Exception:  # not a pair: reported by the fold, with its index
                break
            if total > limit:
                break
        return chunk

    def _chunk_bytes(self) -> int:
        return max(MIN_CHUNK_BYTES, self.budget.max_memory // CHUNK_BUDGET_SHARE)

    def _size_chunks(self, keys: list[Any], values: Sequence[Any]) -> int:
        """Records per chunk for records like these (a few sampled, deep size), so that a
        chunk takes at most 1/``CHUNK_BUDGET_SHARE`` of the budget: the next chunks are taken
        that size, and this one is folded in parts that size."""
        n = len(keys)
        if n == 0:
            return 1
        step = max(1, n // CHUNK_SAMPLES)
        picks = range(0, n, step)[:CHUNK_SAMPLES]
        total = sum(estimate_size(keys[i]) + estimate_size(values[i]) for i in picks)
        per_record = max(1, total // len(picks))  # shared small ints count 0
        self._chunk_records = max(1, min(self._chunk, self._chunk_bytes() // per_record))
        self._chunks_sized = True
        return self._chunk_records

    def _fold_chunk(
        self,
        keys: list[Any],
        values: Sequence[Any],
        create: Callable[[Any], Any],
        merge: Callable[[Any, Any], Any],
        offset: int,
    ) -> None:
        """Fold one chunk (after a spill if the map has outgrown its grant), all or — on an
        error — exactly the records before the failing one; Ctrl-C waits for the end."""
        with self.lock:
            current = self._room_for(len(keys))
            with deferred_interrupts():
                if isinstance(current, TypedReduceMap):
                    typed = current.fold_typed(keys, values, self._typed_combiners)
                    self.elements_read += typed
                    self.metrics.records_read += typed
                    if typed < len(keys):  # the rest does not fit: the general path from here
                        current = self._to_general(current)
                        keys, values = keys[typed:], values[typed:]
                        offset += typed
                if not isinstance(current, TypedReduceMap):
                    try:
                        canonical_keys(keys, offset)  # the typed path takes plain keys only
                    except BadKeyError as err:
                        cut = err.index - offset  # fold the records before the bad key
                        self._fold_general(current, keys[:cut], values[:cut], create, merge, offset)
                        raise
                    self._fold_general(current, keys, values, create, merge, offset)
            self._check_largest_entry(current)

    def _room_for(self, records: int) -> SizeTrackingAppendOnlyMap | TypedReduceMap:
        """Before folding ``records`` (under the lock): put back a failed spill's rows, account
        for the map as it may grow, spill it if the grant falls short; the map to fold into."""
        self.check_open(INSERT_AFTER_ITERATOR)
        self._restore_unspilled()
        current = self._map
        assert current is not None
        estimate = current.estimate_size()
        if estimate > self.metrics.peak_memory_bytes:
            self.metrics.peak_memory_bytes = estimate
        # a spill sorts the map first: its working memory is part of what we hold
        estimate += SORT_BYTES_PER_ENTRY * (len(current) + records)
        if len(current) + records > current.grow_threshold:
            # this chunk may double the table: ask for the new arrays before they exist
            estimate += current.growth_bytes()
        if self.maybe_spill(estimate):
            current = self._map
            assert current is not None
        return current

    def insert_batch(self, batch: PairArrays) -> None:
        """Fold a block of typed pairs (:class:`~extagg.collection.pair_arrays.PairArrays`, what
        a PySpark shuffle written by :func:`extagg.spark.install` carries): on the typed path
        from its arrays, with no Python object per pair; otherwise as :meth:`insert_all` of its
        pairs. The same result, and the same guarantees, as :meth:`insert_all`."""
        self.check_open(INSERT_AFTER_ITERATOR)
        if not isinstance(self._map, TypedReduceMap):
            self.insert_all(batch)
            return
        create, merge = self.aggregator.create_combiner, self.aggregator.merge_value
        step = self._chunk
        start, n = 0, len(batch)
        while start < n:
            stop = min(n, start + step)
            every = self.force_spill_every
            if every is not None:  # as insert_all cuts its chunks
                stop = min(stop, start + max(1, every - self.elements_read))
            part = batch.slice(start, stop)
            first, start = start, stop
            with self.lock:
                current = self._room_for(len(part))
                with deferred_interrupts():
                    done = 0
                    if isinstance(current, TypedReduceMap):
                        done = current.fold_pairs(part, self._typed_combiners)
                        self.elements_read += done
                        self.metrics.records_read += done
                    if done < len(part):  # the rest does not fit the typed path: the general
                        general = (
                            current
                            if isinstance(current, SizeTrackingAppendOnlyMap)
                            else self._to_general(current)
                        )
                        rest = part.slice(done, len(part))
                        keys, values = rest.key_objects(), rest.value_objects()
                        self._fold_general(general, keys, values, create, merge, first + done)
                        current = general
                self._check_largest_entry(current)

    def _fold_general(
        self,
        current: SizeTrackingAppendOnlyMap,
        keys: list[Any],
        values: Sequence[Any],
        create: Callable[[Any], Any],
        merge: Callable[[Any, Any], Any],
        offset: int,
    ) -> None:
        try:
            current.fold(keys, values, create, merge)
        except BadKeyError as err:
            err.index += offset
            raise
        except BaseException as err:
            at = offset + current.last_fold_count
            if hasattr(err, "add_note"):  # Python 3.11+
                err.add_note(
                    f"raised while folding record {at} of the input into {self.name}; "
                    f"the {at} records before it are folded, it and the rest are not"
                )
            raise
        finally:
            done = current.last_fold_count
            self.elements_read += done
            self.metrics.records_read += done

    def _check_largest_entry(self, current: SizeTrackingAppendOnlyMap | TypedReduceMap) -> None:
        """A record larger than the whole budget can never be spilled and merged: say so now
        (and take no more input), not at the merge after reading everything."""
        size, key = current.largest_entry
        if size > self.budget.max_memory:
            error = MemoryLimitError(
                f"{self.name}: the record of key {key!r:.60} holds {format_size(size)} "
                f"(key and combiner, estimated), more than the whole budget of "
                f"{format_size(self.budget.max_memory)}; it was folded, but could never be "
                "merged after a spill: give the map more memory"
            )
            self.fail(error)
            raise error

    # ------------------------------------------------------------------ Spillable hooks
    def collection_is_empty(self) -> bool:
        """Whether the in-memory map holds nothing to spill."""
        return not self._map and self._unspilled is None

    def spill_collection(self, size: int, reason: str) -> None:
        """Sort the current map by key hash and write it as a run; on failure keep it."""
        self.log_spill("in-memory map", size)
        largest = self._map.largest_entry if self._map is not None else (0, None)
        self._spill_current_map(size, presize=True)
        self.metrics.memory_bytes_spilled += size
        self._check_mergeable(largest)

    def _check_mergeable(self, largest: tuple[int, Any]) -> None:
        """The merge holds two decoded batches at least: if the largest batch written (one
        huge record) makes that exceed the budget, it can never succeed — say so now, naming
        the key of the largest record the spilled map held (``largest``: bytes, key)."""
        need = 2 * OBJECT_EXPANSION * self.runs.max_batch_bytes
        if need > self.budget.max_memory:
            size, key = largest
            record = (
                f"the record of key {key!r:.60}, {format_size(size)} (key and combiner, "
                "estimated), is too large for this budget"
                if size > 0
                else "a record too large for this budget"
            )
            raise MemoryLimitError(
                f"{self.name} spilled a batch of {format_size(self.runs.max_batch_bytes)} "
                f"({record}): merging it will need "
                f"{format_size(need)} for two read buffers, more than the whole budget of "
                f"{format_size(self.budget.max_memory)}; give the map more memory"
            )

    def release_after_spill(self) -> None:
        """Give back all but the initial threshold — or, if more, what the new (presized,
        empty) map's arrays take: they exist already, so their memory stays granted."""
        keep = self.initial_threshold
        if self._map is not None and self._unspilled is None:
            keep = max(keep, min(self.threshold, self._map.estimate_size()))
        self.release_down_to(keep)

    def force_spill(self, trigger: Consumer) -> int:
        """Spill the current map, or — when iteration has started — the part of it not yet
        read, and drop the reference to it. Returns the bytes released."""
        self._restore_unspilled()
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
        """Drop the in-memory map and close the iterator reading it, if any."""
        self._map = None
        self._unspilled = None
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

    def _spill_current_map(self, estimate: int, presize: bool = False) -> None:
        """Sort the current map by key hash and write it as a run; on failure keep it.

        The sorted rows stay referenced by the map (``_unspilled``) until the run is
        committed, so an interrupt at any point loses nothing: a failed write puts them back
        at once, and if a second interrupt stops that, the next call puts them back."""
        current = self._map
        assert current is not None
        started = time.perf_counter()
        block: PermutedObjectBlock | TypedSortedRows
        capacity = DEFAULT_CAPACITY
        if presize and isinstance(current, SizeTrackingAppendOnlyMap):
            capacity = max(DEFAULT_CAPACITY, current.capacity)  # kept: release_after_spill
        with deferred_interrupts():
            if isinstance(current, TypedReduceMap):  # written from its arrays, no objects
                block = current.destructive_sorted_rows()
                self._unspilled = block
            else:
                int_keys = current.int_key_column()
                hashes, order, keys, values = current.destructive_sort_order()
                self._unspilled = (keys, values)
                scalar = scalar_sorted_rows(hashes, order, keys, values, int_keys)
                if scalar is not None:  # plain keys and numbers: written from arrays
                    block = scalar
                    self._unspilled = scalar  # the objects go now; a failure rebuilds them
                else:
                    block = PermutedObjectBlock(hashes, order, keys, values)
                del hashes, order, keys, values, int_keys, scalar
            self._map = self._new_map(capacity)
        rows = len(block)
        try:
            self._write_run(block, self._forget_unspilled)
        except BaseException:
            del block
            self._restore_unspilled()
            raise
        finally:
            self.metrics.spill_time_s += time.perf_counter() - started
        log.debug("spilled %d keys (%s estimated)", rows, format_size(estimate))

    def _forget_unspilled(self) -> None:
        self._unspilled = None

    def _restore_unspilled(self) -> None:
        """Put the rows of a spill that did not complete back into the map."""
        pending = self._unspilled
        if pending is None or self._map is None:
            return
        with deferred_interrupts():
            keys, values = pending.lists() if isinstance(pending, TypedSortedRows) else pending
            current = self._map
            if isinstance(current, TypedReduceMap):
                typed = current.fold_typed(keys, values, combiners=True)
                if typed == len(keys):
                    self._unspilled = None
                    return
                current = self._to_general(current)
                keys, values = keys[typed:], values[typed:]
            current.fold(keys, values, _identity, self.aggregator.merge_combiners)
            self._unspilled = None

    def _batch_rows(
        self, block: ObjectBlock | PermutedObjectBlock | TypedSortedRows | None = None
    ) -> int:
        """Rows per run batch: ``batch_size``, fewer when rows are big, so that the merge can
        hold one decoded batch per open run within the budget (``block`` updates the measured
        row size)."""
        if block is not None and len(block):
            self._row_bytes = max(1, block.nbytes() // len(block))
        target = max(64 * 1024, self.budget.max_memory // (4 * self.fan_in))
        # a batch of one big row at least: sixteen rows of 256 KiB made the merge's two read
        # buffers need 32 MiB under a 32 MiB budget (MemoryLimitError)
        return max(1, min(self.batch_size, target // self._row_bytes))

    def _write_run(
        self,
        block: ObjectBlock | PermutedObjectBlock | TypedSortedRows,
        committed: Callable[[], None] | None = None,
    ) -> str:
        rows = self._batch_rows(block)
        return self.runs.write(
            "map", OBJECT_CODEC, lambda writer: writer.write_sorted(block, rows), committed
        )

    # ------------------------------------------------------------------ iterating
    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return self.iterator()

    def iterator(self, ordered: bool = False) -> Iterator[tuple[Any, Any]]:
        """Yield every ``(key, combiner)`` once. Destructive; call once.

        When anything spilled, pairs come in ascending :func:`extagg.hashing.order_hash` order
        (the merge order). When nothing spilled they come in insertion order — also
        deterministic, and free — unless ``ordered=True`` asks for key-hash order always (what
        :meth:`extagg.state.StateStoreProvider.merge_update` needs).

        Ctrl-C while the iteration is being set up closes the map (it never leaves a map
        destroyed by its sort but still in use).
        """
        try:
            with deferred_interrupts():
                return self._start_iteration(ordered)
        except KeyboardInterrupt:
            self.close()
            raise

    def _start_iteration(self, ordered: bool) -> Iterator[tuple[Any, Any]]:
        with self.lock:
            self._restore_unspilled()
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
            rows = PermutedObjectBlock(hashes, order, keys, values)
            # the map's rows are read in batches of the runs' size, so that the merge's
            # hand-overs (a few batches per open source) stay within the merge's grant
            memory_source = SpillableMemorySource(
                rows,
                self._batch_rows(rows) if self.runs else self.batch_size,
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
        # oldest first: the merge keeps the key of the first source among equal keys (``0``
        # before a later ``False``, as a dict keeps the key it saw first), and the map's rows
        # are the newest
        with self.lock:  # a forced spill from another thread may be moving rows to a run
            sources: list[BlockSource[ObjectBlock]] = [*self.runs.take_sources(), memory_source]
        merge_memory = 0
        try:
            fan_in = self.fan_in
            if len(sources) > 1:
                per_source = max(1, self.runs.max_batch_bytes * OBJECT_EXPANSION)
                fan_in, merge_memory = self.reserve_merge_memory(
                    per_source, len(sources), spill_rest=lambda: self._spill_rest(memory_source)
                )
            for pairs in merged_pairs(
                sources,
                self.aggregator.merge_combiners,
                fan_in=fan_in,
                runs=self.runs,
                batch_rows=self._batch_rows,
                metrics=self.metrics,
            ):
                yield pairs
                self.check_not_closed_while_reading()
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
                self.check_not_closed_while_reading()
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


def _identity(combiner: Any) -> Any:
    return combiner


def _forced_by(trigger: Any) -> str:
    return f"forced by {getattr(trigger, 'name', trigger)}"


_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)


def _split_pairs(chunk: list[Any]) -> tuple[list[Any], list[Any]] | None:
    """``(keys, values)`` of a chunk of ``(key, value)`` pairs, or ``None`` if an item is not
    a pair. Plain 2-tuples (the usual input) are split by C-level passes; ``zip(*chunk)``
    costs ~0.6 µs per record here, four times more."""
    n = len(chunk)
    count = operator.countOf
    if count(map(type, chunk), tuple) == n and count(map(len, chunk), 2) == n:
        return list(map(_FIRST, chunk)), list(map(_SECOND, chunk))
    try:
        keys, values = zip(*chunk, strict=True)
    except (TypeError, ValueError):
        return None
    return list(keys), list(values)


def _first_bad_pair(chunk: list[Any]) -> int:
    """Index of the first item that does not unpack as a ``(key, value)`` pair."""
    for i, item in enumerate(chunk):
        try:
            _key, _value = item
        except (TypeError, ValueError):
            return i
    return len(chunk)


def _bad_pairs_message(item: Any, index: int) -> str:
    return (
        f"insert_all expects (key, value) pairs; record {index} is an item of type "
        f"{type(item).__name__}: {item!r:.80} (the records before it were folded)"
    )

"""The reduce side of ``groupByKey`` (Spark's ``ExternalGroupBy`` role), on :class:`Spillable`.

Value lists per key are folded in memory and spilled as hash-sorted runs when the memory manager
says no. At the end the runs are merged; a key whose values come from more than one run is
gathered into a :class:`SpilledValues`, which keeps at most one chunk of values in memory and
appends the rest to a file of its own — so a key with more values than the budget still works,
its values streamed back from disk when iterated.
"""

from __future__ import annotations

import logging
import pickle
import sys
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from extagg.errors import SpillError
from extagg.hashing import order_hashes
from extagg.memory import Consumer
from extagg.merge.heap import BlockSource, SortedBlockSource, merge_in_passes
from extagg.merge.objects import combine_object_pieces
from extagg.spill.blocks import ObjectBlock
from extagg.spill.codecs import OBJECT_CODEC, pickle_by_value
from extagg.spill.tempdir import SpillDirs
from extagg.spillable import Spillable

__all__ = ["ChunkGrant", "SpilledValues", "SpillingGroupBy"]

log = logging.getLogger(__name__)

ROWS_PER_BATCH = 256
LIST_SLOT = 8  # a list holds one pointer per value
#: per key, what a spill allocates while the lists are still held: the key list, the hashes,
#: their order, the sorted hashes and the two sorted lists (8 bytes each)
SORT_BYTES = 48


def _object_bytes(obj: Any) -> int:
    """``sys.getsizeof`` rounded up to the allocator's 8-byte blocks."""
    return (sys.getsizeof(obj) + 7) & ~7


def _dict_table_growth(groups: dict[Any, Any], more: int) -> int:
    """The bytes a dict allocates next if ``more`` keys are added: an insert-only dict of
    ``n`` keys has a table of the smallest power of two ``size`` with ``2 * size // 3 > n``,
    and doubles it when full (its old table is freed only once the new one is filled)."""
    n = len(groups)
    size = 8
    while 2 * size // 3 <= n:
        size *= 2
    return 2 * sys.getsizeof(groups) if n + more >= 2 * size // 3 else 0


class ChunkGrant:
    """Memory for the values the merge phase keeps in :class:`SpilledValues`' in-memory
    chunks, acquired by the group-by (its consumer) as the chunks fill; a chunk that cannot
    get more is written to its file instead of growing. Grants are kept for reuse and given
    back when the group-by closes."""

    def __init__(self, owner: SpillingGroupBy, value_bytes: float) -> None:
        self.owner = owner
        self.value_bytes = max(value_bytes, 1.0)
        #: bytes acquired for chunks, and bytes of the values they hold now
        self.granted = 0
        self.held = 0
        self.peak_held = 0

    def charge(self, values: int) -> bool:
        """Account ``values`` more values in memory; ``False`` if the manager refused."""
        need = int(values * self.value_bytes)
        if self.held + need > self.granted:
            want = max(self.held + need - self.granted, self.owner.chunk_bytes)
            self.granted += self.owner.acquire_memory(want)
            self.owner.budget.note_granted()
        if self.held + need > self.granted:
            return False
        self.held += need
        self.peak_held = max(self.peak_held, self.held)
        return True

    def reserve(self, nbytes: int) -> None:
        """Acquire ``nbytes`` ahead (room for one chunk before the merge takes its buffers)."""
        self.granted += self.owner.acquire_memory(nbytes)
        self.owner.budget.note_granted()

    def release(self, values: int) -> None:
        """``values`` left memory (written to a file)."""
        self.held = max(0, self.held - int(values * self.value_bytes))


class SpilledValues:
    """One key's values, mostly on disk: ``len()``, repeated iteration, pickles as a list.

    Holds at most ``chunk_values`` values in memory; full chunks are pickled (protocol 5) to a
    file of its own in ``dirs``, removed when the object is garbage collected. With a
    :attr:`grant`, the values held in memory are charged to it, and written out at once when
    it is refused.
    """

    def __init__(self, dirs: list[str], chunk_values: int) -> None:
        self._dirs = SpillDirs(dirs)
        self._chunk = max(1, chunk_values)
        self._buffer: list[Any] = []
        self._path: str | None = None
        self._on_disk = 0
        self._pickles = 0  # lists pickled to the file (a flush may write a partial chunk)
        self._finalizer: weakref.finalize | None = None
        #: where the in-memory values are accounted (the merge phase's), or None
        self.grant: ChunkGrant | None = None
        self._charged = 0

    def extend(self, values: Iterable[Any]) -> None:
        buffer = self._buffer
        for value in values:
            buffer.append(value)
            if len(buffer) >= self._chunk:
                self.flush()
                buffer = self._buffer
        grow = len(buffer) - self._charged
        if self.grant is not None and grow > 0:
            if self.grant.charge(grow):
                self._charged += grow
            else:
                self.flush()

    @property
    def in_memory(self) -> int:
        """Values held in memory (not yet in the file)."""
        return len(self._buffer)

    def flush(self) -> None:
        """Append the values held in memory to the file (its memory can then be given back)."""
        if self.grant is not None and self._charged:
            self.grant.release(self._charged)
        self._charged = 0
        if not self._buffer:
            return
        if self._path is None:
            self._path = self._dirs.new_path("values")
            # through the spill dirs: the last file of the process's subdirectory removes it
            # (a forked worker ending in os._exit left it)
            self._finalizer = weakref.finalize(self, self._dirs.remove, self._path)
        try:
            data = pickle.dumps(self._buffer, protocol=5)
        except Exception as exc:  # values of a class of the driver's __main__
            message = f"cannot serialise the values of one key while spilling: {exc}"
            data = pickle_by_value(self._buffer, exc, lambda: SpillError(message))
        with open(self._path, "ab") as f:
            f.write(data)
            f.flush()
            self._dirs.charge(self._path, f.tell())
        self._on_disk += len(self._buffer)
        self._pickles += 1
        self._buffer = []

    @property
    def on_disk(self) -> int:
        """Values held in the file."""
        return self._on_disk

    def __len__(self) -> int:
        return self._on_disk + len(self._buffer)

    def chunks(self) -> Iterator[list[Any]]:
        """The values as lists of at most one chunk each (what a shuffle should send)."""
        if self._path is not None:
            with open(self._path, "rb") as f:
                for _ in range(self._pickles):
                    yield pickle.load(f)
        if self._buffer:
            yield list(self._buffer)

    def __iter__(self) -> Iterator[Any]:
        if self._path is not None:
            with open(self._path, "rb") as f:
                for _ in range(self._pickles):
                    yield from pickle.load(f)
        yield from self._buffer

    def __reduce__(self) -> tuple[Any, tuple[list[Any]]]:
        return (list, (list(self),))

    def __repr__(self) -> str:
        return f"<SpilledValues {len(self)} values, {self._on_disk} on disk>"


class SpillingGroupBy(Spillable[ObjectBlock]):
    """``key → values`` from ``(key, [values])`` pieces, spilling; iterate once.

    ``values_chunk_bytes`` bounds the memory a gathered key holds (default: 1/8 of the budget).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        total = self.budget.max_memory
        self.initial_threshold = max(min(5 << 20, total // 16), min(64 << 10, total // 4))
        #: a key whose values pass this many bytes moves to a SpilledValues of its own
        self.big_bytes = max(total // 16, 16 << 10)
        #: the in-memory chunk of each SpilledValues
        self.chunk_bytes = max(total // 64, 8 << 10)
        self.groups: dict[Any, list[Any]] | None = {}
        self.big: dict[Any, SpilledValues] = {}
        #: bytes granted for the in-memory chunks of ``big``
        self.chunk_memory = 0
        self.values = 0
        self.value_bytes = 32.0  # running estimate of one value's bytes, plus its list slot
        #: the merge phase's accounting of big keys' in-memory chunks (set when it starts)
        self.merge_chunks: ChunkGrant | None = None
        self.key_bytes = 64.0 + 88.0  # running estimate of one key's object, list header, slack

    # ------------------------------------------------------------------ folding
    def merge_pieces(
        self, pieces: Iterable[tuple[Any, list[Any]]], chunk: int = 256, *, owned: bool = False
    ) -> None:
        """Fold ``(key, list of values)`` pieces. ``owned``: the pieces' lists belong to the
        group-by from now on (fresh from a shuffle's unpickling): a key's first list is kept
        and extended instead of copied."""
        self.check_open("merge after iteration")
        it = iter(pieces)
        while True:
            batch = [p for _, p in zip(range(chunk), it)]
            if not batch:
                return
            with self.lock:
                self.maybe_spill(self.estimated_bytes(chunk))
                groups = self.groups
                assert groups is not None
                big = self.big
                added, moved = 0, False
                big_values = max(1, int(self.big_bytes / self.value_bytes))
                for key, values in batch:
                    added += len(values)
                    if big and key in big:
                        big[key].extend(values)
                        moved = True
                        continue
                    group = groups.get(key)
                    if group is None:
                        if not owned or type(values) is not list:
                            values = list(values)
                        group = groups[key] = values
                    else:
                        group.extend(values)
                    if len(group) > big_values:  # one key outgrows its share: off to disk
                        big[key] = self._spilled_values(group)
                        del groups[key]
                        moved = True
                # a key's own bytes: its object and its list's header and spare slots (the
                # dict's table is measured whole in estimated_bytes)
                first_key = batch[0][0]
                group = groups.get(first_key)
                if group is not None:
                    size = _object_bytes(first_key) + sys.getsizeof(group) - LIST_SLOT * len(group)
                    self.key_bytes = 0.9 * self.key_bytes + 0.1 * size
                    if group:
                        size = _object_bytes(group[-1]) + LIST_SLOT
                        self.value_bytes = 0.9 * self.value_bytes + 0.1 * size
                # values held in memory lists (the big keys' values are in their files)
                self.values = sum(len(g) for g in groups.values()) if moved else self.values + added
                self.elements_read += added
                self.metrics.records_read += added

    def estimated_bytes(self, more: int = 256) -> int:
        """The in-memory lists' bytes: their values, per key its object and list, the dict's
        table (measured), what a spill of them allocates, and the table's next growth if
        ``more`` keys could bring it."""
        groups = self.groups
        if groups is None:
            return 0
        keys = len(groups)
        table = sys.getsizeof(groups) + _dict_table_growth(groups, more)
        return int(self.values * self.value_bytes + keys * (self.key_bytes + SORT_BYTES) + table)

    def _spilled_values(self, first: list[Any]) -> SpilledValues:
        granted = self.acquire_memory(self.chunk_bytes)  # its in-memory chunk
        self.chunk_memory += granted
        self.budget.note_granted()
        chunk_values = max(1, int(max(granted, 4096) / max(self.value_bytes, 1.0)))
        values = SpilledValues(self.runs.spill_dirs.dirs, chunk_values)
        values.extend(first)
        return values

    def _release_chunks(self) -> None:
        for values in self.big.values():
            values.flush()
        self.free_memory(min(self.chunk_memory, self.used))
        self.chunk_memory = 0

    # ------------------------------------------------------------------ Spillable hooks
    def collection_is_empty(self) -> bool:
        return not self.groups

    def spill_collection(self, size: int, reason: str) -> None:
        self.log_spill("in-memory value lists", size, reason)
        block = self._sorted()
        self.runs.write("groups", OBJECT_CODEC, lambda w: w.write_sorted(block, ROWS_PER_BATCH))
        self.metrics.memory_bytes_spilled += size
        self.groups, self.values = {}, 0

    def force_spill(self, trigger: Consumer) -> int:
        if self.phase != "open" or not self.groups:
            return 0
        before = self.used
        self.spill_collection(self.estimated_bytes(), f"forced by {trigger.name}")
        self.release_down_to(0)
        return before - self.used

    def release_collection(self) -> None:
        self.groups = None
        self.chunk_memory = 0  # close() gives back the whole grant

    def _sorted(self) -> ObjectBlock:
        assert self.groups is not None
        keys = list(self.groups)
        hashes = order_hashes(keys)
        order = hashes.argsort(kind="stable")
        groups = self.groups
        return ObjectBlock(
            hashes[order], [keys[i] for i in order], [groups[keys[i]] for i in order]
        )

    # ------------------------------------------------------------------ reading
    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        """``(key, values)`` once per key: a list, or :class:`SpilledValues` for a key that
        spilled more than once."""
        with self.lock:
            self.begin_reading("SpillingGroupBy can be iterated once")
            if self.runs and self.groups:
                self.spill_collection(self.estimated_bytes(), "the merge")
            memory = self._sorted() if self.groups else None
            self.groups = None
            sources: list[BlockSource[ObjectBlock]] = self.runs.take_sources()
            if memory is None:
                self.release_down_to(0)
        try:
            fan_in = self.fan_in
            grant = self.merge_chunks = ChunkGrant(self, self.value_bytes)
            if sources:
                # the big keys' chunks go to their files and their grants back to the budget
                # first, so that they cannot starve the merge of its read buffers
                self._release_chunks()
                for spilled in self.big.values():  # refilled by the merge: accounted now
                    spilled.grant = grant
                grant.reserve(self.chunk_bytes)  # one key's chunk, before the read buffers
                # run files to read: hold their read buffers (the collection was spilled and
                # its memory given back above, so the budget has room for them)
                fan_in, _ = self.reserve_merge_memory(
                    max(1, self.runs.max_batch_bytes * 4), max(2, len(sources))
                )
            # else nothing spilled: the sorted collection is the only source, read in place
            # with the memory it already holds (no read buffers to ask for — asking would
            # fail when the collection fills the whole budget)
            if memory is not None:
                sources.append(SortedBlockSource(memory, ROWS_PER_BATCH))
            dirs = self.runs.spill_dirs.dirs
            chunk_values = max(1, int(self.chunk_bytes / max(self.value_bytes, 1.0)))
            big = self.big

            big_values = max(1, int(self.big_bytes / max(self.value_bytes, 1.0)))

            def gather(a: Any, b: Any) -> Any:
                if isinstance(a, list) and len(a) + len(b) <= big_values:
                    a.extend(b)  # the common case: a small key found in two runs
                    return a
                if not isinstance(a, SpilledValues):
                    gathered = SpilledValues(dirs, chunk_values)
                    gathered.grant = grant
                    gathered.extend(a)
                    a = gathered
                a.extend(b)
                return a

            for block in merge_in_passes(
                sources,
                lambda pieces: combine_object_pieces(pieces, gather),
                fan_in=fan_in,
                write_run=lambda blocks: self.runs.write_merged(
                    blocks, OBJECT_CODEC, ROWS_PER_BATCH
                ),
            ):
                for key, values in zip(block.keys, block.values):
                    if big and key in big:
                        big[key].extend(values)
                        continue
                    self.metrics.groups += 1
                    if isinstance(values, SpilledValues):
                        values.flush()  # handed over whole on disk: its chunk grant is free
                    yield key, values
            self.metrics.groups += len(big)
            for key, spilled in big.items():
                if spilled.grant is not None:
                    spilled.flush()
                yield key, spilled
            self.big = {}
        finally:
            self.close()

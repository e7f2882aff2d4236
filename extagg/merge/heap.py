"""The external merge: hash-sorted sources in, combined hash-sorted blocks out.

One merge serves both engines. Every source is a stream of blocks sorted by hash whose *next*
block's smallest hash is known without reading it (run files keep it in their footer). A heap
keyed by those hashes decides which source to read next; after each read, every buffered row
whose hash is below the smallest pending hash is complete — no source can still produce an
equal hash — so those rows are handed to the engine's ``combine``, which merges rows of equal
keys (generic engine: ``merge_combiners`` in Python; columnar engine: a compiled kernel).
Memory held by the merge is about one batch per source. When there are more sources than the
fan-in allows, groups of sources are first merged into new runs (multi-pass).
"""

from __future__ import annotations

import heapq
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import numpy as np

from extagg.spill.codecs import BatchCodec
from extagg.spill.runfile import RunFile, RunReader, RunWriter
from extagg.spill.tempdir import SpillDirs

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "BlockSource",
    "Combine",
    "HashedRows",
    "RunSource",
    "SortedBlockSource",
    "SortedRows",
    "merge_sources",
    "merge_in_passes",
    "write_run_from",
]

log = logging.getLogger(__name__)


class HashedRows(Protocol):
    """What the merge needs of a block: one ``uint64`` hash per row, ascending, its length and
    slices of the same kind (:class:`~extagg.spill.blocks.ObjectBlock`,
    :class:`~extagg.spill.blocks.ColumnBlock`)."""

    @property
    def hashes(self) -> np.ndarray: ...

    def __len__(self) -> int: ...

    def slice(self, start: int, stop: int) -> Self: ...


B = TypeVar("B", bound=HashedRows)
B_co = TypeVar("B_co", bound=HashedRows, covariant=True)

#: ``combine(pieces)``: hash-sorted pieces (keys unique within each) -> one block, equal keys
#: combined
Combine = Callable[[list[B]], B]


class SortedRows(Protocol[B_co]):
    """An in-memory block sorted by hash whose slices are blocks ``B_co`` (a
    :class:`~extagg.spill.blocks.PermutedObjectBlock` hands out ``ObjectBlock`` slices)."""

    @property
    def hashes(self) -> np.ndarray: ...

    def __len__(self) -> int: ...

    def slice(self, start: int, stop: int) -> B_co: ...

    def tail(self, start: int) -> SortedRows[B_co]: ...


class BlockSource(ABC, Generic[B]):
    """A hash-sorted stream of blocks ``B``."""

    @abstractmethod
    def next_min_hash(self) -> int | None:
        """Smallest hash of the next unread block, or ``None`` when exhausted."""

    @abstractmethod
    def read_next(self) -> B:
        """The next block (only called when :meth:`next_min_hash` is not ``None``)."""

    def close(self) -> None:
        """Release files and memory; safe to call more than once."""


class SortedBlockSource(BlockSource[B]):
    """One in-memory sorted block handed out in slices of ``batch_size`` rows."""

    def __init__(self, block: SortedRows[B], batch_size: int) -> None:
        self.block: SortedRows[B] | None = block
        self.batch_size = batch_size
        self.pos = 0

    def next_min_hash(self) -> int | None:
        if self.block is None or self.pos >= len(self.block):
            return None
        return int(self.block.hashes[self.pos])

    def read_next(self) -> B:
        assert self.block is not None
        start = self.pos
        self.pos = min(start + self.batch_size, len(self.block))
        return self.block.slice(start, self.pos)

    def remaining(self) -> SortedRows[B] | None:
        """The rows not yet handed out (a view), or ``None``."""
        if self.block is None or self.pos >= len(self.block):
            return None
        return self.block.tail(self.pos)

    def close(self) -> None:
        self.block = None


class RunSource(BlockSource[B]):
    """Reads a run file batch by batch, opening it only when first needed (its codec decides
    the block type ``B``).

    With ``owner`` set, the file is deleted through it when the source is exhausted or closed.
    """

    def __init__(self, path: str, owner: SpillDirs | None = None) -> None:
        self.path = path
        self.owner = owner
        self._reader: RunReader | None = None
        self._next = 0
        self._done = False

    def _open(self) -> RunReader:
        if self._reader is None:
            self._reader = RunReader(self.path)
        return self._reader

    def next_min_hash(self) -> int | None:
        if self._done:
            return None
        reader = self._open()
        if self._next >= len(reader.batches):
            self.close()
            return None
        return reader.batches[self._next].min_hash

    def read_next(self) -> B:
        block: B = self._open().read_block(self._next)
        self._next += 1
        return block

    def close(self) -> None:
        self._done = True
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self.owner is not None:
            self.owner.remove(self.path)


def merge_sources(sources: Sequence[BlockSource[B]], combine: Combine[B]) -> Iterator[B]:
    """Merge hash-sorted sources; yields combined blocks in ascending hash order.

    ``combine(pieces)`` receives, for one hash window, the complete rows of each source that has
    any (each piece sorted by hash, keys unique within a piece) and returns one block sorted by
    hash in which rows of equal keys are combined.

    Batches are read in the order of their smallest hash. Complete rows are handed to
    ``combine`` once about half a batch per open source has been read since the last hand-over,
    so the per-call cost is not paid per source and read; the merge holds about two batches per
    open source.
    """
    heap: list[tuple[int, int]] = []
    for i, source in enumerate(sources):
        h = source.next_min_hash()
        if h is not None:
            heap.append((h, i))
    heapq.heapify(heap)
    pending: list[list[B]] = [[] for _ in sources]
    read_since_emit = 0
    blocks_read = rows_read = 0
    try:
        while heap:
            _, i = heapq.heappop(heap)
            block = sources[i].read_next()
            if len(block):
                pending[i].append(block)
                read_since_emit += len(block)
                blocks_read += 1
                rows_read += len(block)
            h = sources[i].next_min_hash()
            if h is not None:
                heapq.heappush(heap, (h, i))
            # hand over once about half a batch per open source has been read: each hand-over
            # touches every source, so fewer, larger ones; the buffers stay about two batches
            # per source. A batch is the mean batch read so far, not the largest: one source
            # with large batches must not make every hand-over hold many batches of the others
            emit_rows = rows_read // max(1, blocks_read)
            if heap and read_since_emit < max(1, emit_rows) * max(1, len(heap) // 2):
                continue
            out = _take_complete(pending, heap[0][0] if heap else None, combine)
            read_since_emit = 0
            if out is not None and len(out):
                yield out
    finally:
        for source in sources:
            source.close()


def _take_complete(pending: list[list[B]], bound: int | None, combine: Combine[B]) -> B | None:
    """Cut every source's buffered rows below ``bound`` (all when ``None``) and combine them.

    The rows below the bound go to ``combine`` as they are buffered (whole blocks and one slice
    per source, no copy); a source's blocks hold distinct keys, so splitting its rows into
    several pieces changes nothing for ``combine``. The rest stays buffered as views.
    """
    pieces: list[B] = []
    for j, blocks in enumerate(pending):
        if not blocks:
            continue
        if bound is None:
            pieces.extend(blocks)
            pending[j] = []
            continue
        limit = np.uint64(bound)
        for i, rows in enumerate(blocks):
            if rows.hashes[-1] < limit:
                pieces.append(rows)
                continue
            cut = int(np.searchsorted(rows.hashes, limit, side="left"))
            if cut:
                pieces.append(rows.slice(0, cut))
            pending[j] = [rows.slice(cut, len(rows)), *blocks[i + 1 :]] if cut else blocks[i:]
            break
        else:
            pending[j] = []
    return combine(pieces) if pieces else None


def merge_in_passes(
    sources: Sequence[BlockSource[B]],
    combine: Combine[B],
    *,
    fan_in: int,
    write_run: Callable[[Iterator[B]], BlockSource[B]],
    on_pass: Callable[[int, int], None] | None = None,
) -> Iterator[B]:
    """Merge any number of sources with at most ``fan_in`` open at once.

    While there are more sources than ``fan_in``, the oldest not yet merged are merged into a
    new run by ``write_run`` (which consumes a block iterator and returns a source over the run
    it wrote): just enough of them that the rest fit in one final merge (the classic "merge
    just enough" rule, so as little as possible is written twice); once every source has been
    merged once, the merged runs are merged again. ``on_pass(merges_so_far, sources_merged)``
    reports each intermediate merge.

    Sources come oldest first and stay in that order (a merged run takes the place of the
    sources it replaces), because ``combine`` keeps, among equal keys, the key of the first
    piece: the key seen first, as a dict keeps it (``0`` before a later ``False``).
    """
    if fan_in < 2:
        raise ValueError(f"fan_in must be at least 2, got {fan_in}")
    current = list(sources)
    merged: list[BlockSource[B]] = []  # runs written by intermediate merges, oldest first
    passes = 0
    try:
        while len(merged) + len(current) > fan_in:
            if len(current) < 2:  # every source merged once: merge the merged runs
                current, merged = [*merged, *current], []
            take = min(fan_in, len(merged) + len(current) - fan_in + 1, len(current))
            group, current = current[:take], current[take:]
            merged.append(write_run(merge_sources(group, combine)))
            log.info(
                "Intermediate merge %d: %d sources into one run, %d left",
                passes + 1,
                take,
                len(merged) + len(current),
            )
            passes += 1
            if on_pass is not None:
                on_pass(passes, take)
        current, merged = [*merged, *current], []
        yield from merge_sources(current, combine)
    finally:
        for source in [*merged, *current]:
            source.close()


def write_run_from(
    blocks: Iterator[B],
    *,
    path: str,
    codec: BatchCodec,
    batch_size: int,
    compression: str = "lz4",
    spill_dirs: SpillDirs | None = None,
) -> tuple[RunSource[B], RunFile]:
    """Write merged blocks to a new run file; returns a source over it and its ``RunFile``."""
    writer = RunWriter(path, codec, compression=compression, spill_dirs=spill_dirs)
    try:
        for block in blocks:
            writer.write_sorted(block, batch_size)
        info = writer.finish()
    except BaseException:
        writer.abort()
        raise
    return RunSource(path, owner=spill_dirs), info

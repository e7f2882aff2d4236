"""Hash partitioning for :class:`~extagg.columnar.HashAggregator` when its table cannot help.

A table that fills its budget while it barely reduces its input (fewer than
:data:`PARTITION_BELOW` rows per group, e.g. 20 M rows over 1 M keys at 1/8 of the memory) would
spill almost every row as a group, sorted, and merge them all back: most of the work for nothing.
When such a table's keys also keep coming back — at least :data:`REPEAT_RATE` of them are already
in earlier runs, so the same keys are being spilled over and over — the aggregator spills that
table once more and from then on sets its input rows aside, as they are, in
:data:`NUM_PARTITIONS` files by the top bits of their key hash (Grace hash aggregation, as DuckDB
and PostgreSQL do). After the input, each partition is aggregated on its own by a child
aggregator that shares the memory manager (and plans with what the task has left): a sixteenth
of the keys, so it usually fits in memory; if not, the child partitions again. The children's
outputs, one partition after the other, are one hash-ordered source for the aggregator's merge,
so the result is the same and in the same order as without partitioning (the tables spilled
before are written partition by partition, and each partition's groups in them are combined
in its child first, so the children's outputs need no merge at all). A partition is always
chosen by the top bits of the hash as the aggregator sees it; a child sees its hashes rotated
left by 4 bits per level (:func:`rotate_left`), so its table and its own partitions use the bits
that still differ.

When keys do not come back (every row a new group, say), spilling sorted tables is the better
plan: the merge then only concatenates, while aggregating a partition would rebuild a table as
large as the partition. The repeat rate is measured on a sample: the hash range that the first
batches of the last :data:`COMPARED_RUNS` runs share (their footers give it), a few thousand keys.

Partition files are run files flagged unordered (column codec): the rows' key hashes, each input
column's values (``v:<name>``, or its offsets and bytes) and its validity (``m:<name>``).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from extagg.collection import _typed_kernels as TK
from extagg.columnar import _radix_kernels as RK
from extagg.columnar.columns import Column, ReusedArrays
from extagg.errors import CorruptFileError
from extagg.merge.heap import BlockSource
from extagg.spill.blocks import ColumnBlock
from extagg.spill.codecs import COLUMN_CODEC
from extagg.spill.runfile import RunReader, RunWriter
from extagg.spillable import RunSet

__all__ = [
    "MAX_LEVEL",
    "NUM_PARTITIONS",
    "PARTITION_BELOW",
    "REPEAT_RATE",
    "PartitionSource",
    "PartitionWriter",
    "buffer_bytes",
    "held_bytes",
    "MIN_BUFFER_BYTES",
    "partition_bounds",
    "partition_of",
    "repeat_rate",
    "sample_bytes",
    "rotate_left",
    "rotate_right",
]

log = logging.getLogger(__name__)

PARTITION_BITS = 4
NUM_PARTITIONS = 1 << PARTITION_BITS
#: a full table reduces its input too little when it came from fewer rows than this per group
PARTITION_BELOW = 2.0
#: ... and then partition once this fraction of its keys are already in earlier runs
REPEAT_RATE = 0.2
#: earlier runs a full table's keys are looked up in (their first batches)
COMPARED_RUNS = 16
#: partition at most this many levels deep (each level uses the next 4 bits of the hash)
MAX_LEVEL = 8

_VALUES = "v:"
_VALID = "m:"


def sample_bytes(runs: list[str]) -> int:
    """Bytes :func:`repeat_rate` holds: the hashes of the first batch of each compared run."""
    total = 0
    for path in runs[-COMPARED_RUNS:]:
        with RunReader(path) as reader:
            if reader.batches:
                total += 8 * reader.batches[0].count
    return total


def repeat_rate(sorted_hashes: np.ndarray, runs: list[str]) -> float | None:
    """The fraction of a full table's keys (its hashes, sorted) that earlier runs already hold.

    Estimated on the hash range the first batches of the last :data:`COMPARED_RUNS` runs all
    cover: the table's keys in that range, looked up among those batches' hashes. ``None`` when
    the sample is too small to tell (fewer than 64 of the table's keys in the range).
    """
    readers = [RunReader(path) for path in runs[-COMPARED_RUNS:]]
    try:
        readers = [r for r in readers if r.batches]
        if not readers:
            return None
        bound = min(r.batches[0].max_hash for r in readers)
        sample = sorted_hashes[: int(np.searchsorted(sorted_hashes, np.uint64(bound), "right"))]
        if len(sample) < 64:
            return None
        seen = []
        for reader in readers:
            hashes = reader.read_block(0).hashes
            seen.append(hashes[: int(np.searchsorted(hashes, np.uint64(bound), "right"))])
        known = np.unique(np.concatenate(seen))
        pos = np.minimum(np.searchsorted(known, sample), len(known) - 1)
        return float(np.count_nonzero(known[pos] == sample)) / len(sample)
    finally:
        for reader in readers:
            reader.close()


def partition_of(hashes: np.ndarray) -> np.ndarray:
    """The partition (0..15) of each hash: its top bits."""
    parts: np.ndarray = (hashes >> np.uint64(64 - PARTITION_BITS)).astype(np.uint8)
    return parts


def partition_bounds(sorted_hashes: np.ndarray, start: int = 0) -> list[tuple[int, int]]:
    """The ``(lo, hi)`` row ranges of each partition among ``sorted_hashes[start:]`` (empty
    ones left out): a sorted run written batch by batch within these ranges has no batch that
    spans two partitions, so each partition's groups can be read from it on their own."""
    firsts = np.arange(1, NUM_PARTITIONS, dtype=np.uint64) << np.uint64(64 - PARTITION_BITS)
    cuts = [start, *(max(start, int(c)) for c in np.searchsorted(sorted_hashes, firsts))]
    cuts.append(len(sorted_hashes))
    return [(lo, hi) for lo, hi in itertools.pairwise(cuts) if hi > lo]


def rotate_left(hashes: np.ndarray, bits: int) -> np.ndarray:
    """Hashes rotated left by ``bits`` (a partition's hashes as its child aggregator sees them).

    All hashes of a partition share their top bits; a child table probing with those bits would
    crowd a sixteenth of its slots. Rotated, the next bits lead, and since the shared bits go to
    the bottom the order among the partition's hashes is unchanged.
    """
    if bits % 64 == 0:
        return hashes
    b = np.uint64(bits % 64)
    rotated: np.ndarray = (hashes << b) | (hashes >> (np.uint64(64) - b))
    return rotated


def rotate_right(hashes: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of :func:`rotate_left`."""
    return rotate_left(hashes, 64 - bits % 64)


def rows_to_block(cols: dict[str, Column], hashes: np.ndarray, rows: np.ndarray) -> ColumnBlock:
    """Rows ``rows`` of the input columns as a block (keyed by their hashes, not sorted)."""
    columns: dict[str, np.ndarray] = {}
    var: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, col in cols.items():
        if col.is_var:
            assert col.offsets is not None and col.data is not None
            var[_VALUES + name] = TK.gather_var(col.offsets, col.data, rows)
        else:
            assert col.values is not None
            columns[_VALUES + name] = col.values[rows]
        if col.valid is not None:
            columns[_VALID + name] = col.valid[rows]
    return ColumnBlock(hashes[rows], columns, var)


def block_to_columns(
    block: ColumnBlock, schema: dict[str, tuple[str, pa.DataType]]
) -> dict[str, Column]:
    """The input columns a partition block holds (``schema``: name -> (kind, Arrow type))."""
    out: dict[str, Column] = {}
    for name, (kind, arrow_type) in schema.items():
        valid = block.columns.get(_VALID + name)
        if kind in ("string", "binary"):
            offsets, data = block.var_columns[_VALUES + name]
            out[name] = Column(name, kind, arrow_type, None, valid, offsets, data)
        else:
            out[name] = Column(name, kind, arrow_type, block.columns[_VALUES + name], valid)
    return out


def buffer_bytes(max_memory: int) -> int:
    """Bytes of rows buffered per partition before they are written as one batch."""
    return max(16 << 10, max_memory // 40)


#: the smallest per-partition buffer worth writing from
MIN_BUFFER_BYTES = 4 << 10


def held_bytes(limit: int, io_copies: int) -> int:
    """Memory a :class:`PartitionWriter` with buffers of ``limit`` bytes holds at most: twice
    that per partition (a partition's rows are written once they reach ``limit``, and a
    chunk's piece may come on top) plus the copies that encoding and compressing one batch
    makes."""
    return (2 * NUM_PARTITIONS + io_copies) * limit


class PartitionWriter:
    """Sets input rows aside in one unordered run file per hash partition.

    Rows are buffered per partition and written in batches of about ``limit`` bytes (small
    batches would cost more per row to write and to read back than the rows themselves).
    Fixed-width columns go straight into one buffer per partition (each chunk's rows grouped
    by partition with a counting sort, then copied into place: a batch is written from the
    buffer as it is); a chunk with variable-length columns (strings) is cut into a block per
    partition, and a partition's blocks are joined when its batch is written.
    """

    def __init__(self, runs: RunSet[ColumnBlock], limit: int) -> None:
        self.runs = runs
        self.limit = limit
        self.paths: list[str | None] = [None] * NUM_PARTITIONS
        self._writers: list[RunWriter | None] = [None] * NUM_PARTITIONS
        self._pending: list[list[ColumnBlock]] = [[] for _ in range(NUM_PARTITIONS)]
        self._pending_bytes = [0] * NUM_PARTITIONS
        self._buffers: _RowBuffers | None = None
        self._order = ReusedArrays()  # a chunk's rows by partition, refilled at every chunk
        self._encoded = bytearray()  # a batch's payload, refilled at every batch

    def write(
        self, cols: dict[str, Column], hashes: np.ndarray, rows: np.ndarray | None = None
    ) -> None:
        """Append every row of ``cols`` (keys hashed to ``hashes``), or rows ``rows`` (int64
        row numbers, ascending), to its partition."""
        if any(col.is_var for col in cols.values()):
            self._write_blocks(cols, hashes, rows)
            return
        if self._buffers is None:
            self._buffers = _RowBuffers(cols, self.limit)
        buffers = self._buffers
        buffers.add_masks(cols)
        n = len(hashes) if rows is None else len(rows)
        step = buffers.capacity  # a piece of the chunk fits beside what a buffer holds
        if n <= step:
            self._scatter(cols, hashes, rows)
            return
        every = np.arange(n, dtype=np.int64) if rows is None else rows
        for start in range(0, n, step):
            self._scatter(cols, hashes, every[start : start + step])

    def _scatter(
        self, cols: dict[str, Column], hashes: np.ndarray, rows: np.ndarray | None
    ) -> None:
        """Rows (at most a buffer's :attr:`~_RowBuffers.capacity`) into their partitions'
        buffers; the buffers that reach it written."""
        buffers = self._buffers
        assert buffers is not None
        chosen = hashes if rows is None else hashes[rows]
        order = self._order.get("order", len(chosen), np.int64)
        bounds = self._order.get("bounds", NUM_PARTITIONS + 1, np.int64)
        RK.radix_partition(chosen, PARTITION_BITS, order, bounds)
        if rows is not None:
            order = rows[order]
        buffers.scatter(cols, hashes, order, bounds)
        for p in np.flatnonzero(buffers.fill >= buffers.capacity).tolist():
            self._flush(p)

    def _write_blocks(
        self, cols: dict[str, Column], hashes: np.ndarray, rows: np.ndarray | None
    ) -> None:
        parts = partition_of(hashes if rows is None else hashes[rows])
        order = np.argsort(parts, kind="stable")
        bounds = np.searchsorted(parts[order], np.arange(NUM_PARTITIONS + 1), side="left")
        if rows is not None:
            order = rows[order]
        grouped = rows_to_block(cols, hashes, order)  # one gather per column for all partitions
        for p in range(NUM_PARTITIONS):
            lo, hi = int(bounds[p]), int(bounds[p + 1])
            if lo < hi:
                block = _copy(grouped.slice(lo, hi))  # its own arrays: buffered for a while
                self._pending[p].append(block)
                self._pending_bytes[p] += block.nbytes()
                if self._pending_bytes[p] >= self.limit:
                    self._flush(p)

    def _flush(self, p: int) -> None:
        if self._buffers is not None and self._buffers.fill[p]:
            # written (encoded into one bytes object) before the buffer is filled again
            self._writer(p).write_block(self._buffers.block(p), self._encoded)
            self._buffers.fill[p] = 0
        blocks, self._pending[p], self._pending_bytes[p] = self._pending[p], [], 0
        if blocks:
            self._writer(p).write_block(ColumnBlock.concat(_same_columns(blocks)))

    def _writer(self, p: int) -> RunWriter:
        writer = self._writers[p]
        if writer is None:
            writer = self.runs.new_writer("part", COLUMN_CODEC, ordered=False)
            self._writers[p] = writer
            self.paths[p] = writer.path
        return writer

    def release_buffers(self) -> None:
        """Write every partition's buffered rows and drop the buffers (the files stay open for
        more): what a spill the memory manager asks for frees; the next write makes them
        again."""
        for p in range(NUM_PARTITIONS):
            self._flush(p)
        self._buffers = None
        self._order.clear()
        self._encoded = bytearray()

    def finish(self) -> list[str | None]:
        """Close every file; returns the path of each partition (``None``: no rows)."""
        metrics = self.runs.metrics
        self.release_buffers()
        for p, writer in enumerate(self._writers):
            if writer is None:
                continue
            info = writer.finish()
            self._writers[p] = None
            metrics.disk_bytes_spilled += info.disk_bytes
            metrics.raw_bytes_spilled += info.raw_bytes
            metrics.num_spill_files += 1
        return self.paths

    def abort(self) -> None:
        """Delete every partition file (after a failure or on close)."""
        self._pending = [[] for _ in range(NUM_PARTITIONS)]
        self._buffers = None
        self._order.clear()
        self._encoded = bytearray()
        for p, writer in enumerate(self._writers):
            if writer is not None:
                writer.abort()
                self._writers[p] = None
        for path in self.paths:
            if path is not None:
                self.runs.remove(path)


class _RowBuffers:
    """One buffer of rows per partition for fixed-width columns: the rows' hashes, each
    column's values and (once a chunk had nulls in it) validity; ``fill[p]`` rows of
    partition ``p`` are in. A partition's rows are written once they reach :attr:`capacity`
    (``limit`` bytes of rows), so a buffer holds up to twice that: the rows before and a
    piece of a chunk of at most :attr:`capacity` rows. Pages are touched only as rows
    arrive: partitions that stay in memory cost nothing."""

    def __init__(self, cols: dict[str, Column], limit: int) -> None:
        row = 8 + sum(_row_bytes(col) for col in cols.values())
        self.capacity = max(1, limit // row)
        shape = (NUM_PARTITIONS, 2 * self.capacity)
        self.fill = np.zeros(NUM_PARTITIONS, dtype=np.int64)
        self.hashes = np.empty(shape, dtype=np.uint64)
        self.values: dict[str, np.ndarray] = {}
        for name, col in cols.items():
            assert col.values is not None
            self.values[name] = np.empty((*shape, *col.values.shape[1:]), col.values.dtype)
        self.masks: dict[str, np.ndarray] = {}

    def add_masks(self, cols: dict[str, Column]) -> None:
        """Start a validity buffer for each column with nulls for the first time (the rows
        already in are valid)."""
        for name, col in cols.items():
            if col.valid is not None and name not in self.masks:
                mask = np.empty(self.hashes.shape, dtype=np.bool_)
                for p in range(NUM_PARTITIONS):
                    mask[p, : self.fill[p]] = True
                self.masks[name] = mask

    def scatter(
        self, cols: dict[str, Column], hashes: np.ndarray, order: np.ndarray, bounds: np.ndarray
    ) -> None:
        """Append a chunk's rows, ``order`` grouped by partition (``bounds``), each to its
        partition's buffer (every partition's rows fit): one kernel call per column."""
        RK.scatter_partitions(hashes, order, bounds, self.fill, self.hashes)
        for name, col in cols.items():
            assert col.values is not None  # fixed-width: the writer's other path takes strings
            RK.scatter_partitions(col.values, order, bounds, self.fill, self.values[name])
            mask = self.masks.get(name)
            if mask is not None:
                valid = col.valid if col.valid is not None else np.ones(len(hashes), np.bool_)
                RK.scatter_partitions(valid, order, bounds, self.fill, mask)
        self.fill += np.diff(bounds)

    def block(self, p: int) -> ColumnBlock:
        """Partition ``p``'s buffered rows as a block of views (valid until it is refilled)."""
        n = int(self.fill[p])
        columns = {_VALUES + name: values[p, :n] for name, values in self.values.items()}
        for name, mask in self.masks.items():
            columns[_VALID + name] = mask[p, :n]
        return ColumnBlock(self.hashes[p, :n], columns, {})


def _row_bytes(col: Column) -> int:
    assert col.values is not None
    return int(col.values.itemsize * int(np.prod(col.values.shape[1:], dtype=np.int64)))


def _copy(block: ColumnBlock) -> ColumnBlock:
    var = {name: (off.copy(), data.copy()) for name, (off, data) in block.var_columns.items()}
    columns = {name: col.copy() for name, col in block.columns.items()}
    return ColumnBlock(block.hashes.copy(), columns, var)


def _same_columns(blocks: list[ColumnBlock]) -> list[ColumnBlock]:
    """Give every block the validity columns any of them has (all valid where missing)."""
    masks = {name for b in blocks for name in b.columns if name.startswith(_VALID)}
    if all(masks <= b.columns.keys() for b in blocks):
        return blocks
    out = []
    for b in blocks:
        columns = dict(b.columns)
        for name in masks - columns.keys():
            columns[name] = np.ones(len(b), dtype=np.bool_)
        out.append(ColumnBlock(b.hashes, columns, b.var_columns))
    return out


class PartitionAggregator(Protocol):
    """What :class:`PartitionSource` needs of a partition's aggregator."""

    @property
    def name(self) -> str: ...

    def close(self) -> None: ...


Child = TypeVar("Child", bound=PartitionAggregator)


class PartitionSource(BlockSource[ColumnBlock], Generic[Child]):
    """The partitions aggregated one after the other, as one hash-ordered stream of blocks.

    Partition ``p`` holds exactly the hashes whose bits at this level are ``p``, so the
    children's outputs, each in hash order, follow each other in hash order too. A child is
    created (``make_child()``) when its partition is first needed, fed the partition's rows
    (``feed(child, columns, rows)``), read (``child_blocks(child)``: its combined blocks in hash
    order), counted (``child_done(child)``) and closed (files deleted, memory released) when
    its last block has been handed out. ``schema`` maps the input columns to ``(kind, Arrow
    type)``.

    ``state_runs``: runs of groups (the aggregator's tables spilled before it partitioned,
    sorted by hash, no batch across two partitions). Each partition's groups in them are folded
    into that partition's child (``fold_states(child, block)``) before its rows, so no merge of
    runs is needed after the children: the children's outputs are the result. ``presize(child,
    rows)`` is told the rows a child is about to get. The runs are deleted on :meth:`close`.

    ``feed_bytes``: consecutive batches of a partition are fed together up to this many bytes
    (the caller holds the memory for that much): a partition written with small buffers (while
    a split table kept most of the budget) is otherwise fed a few hundred rows at a time, and
    the per-call cost of folding them outweighs the rows' own.
    """

    def __init__(
        self,
        paths: list[str | None],
        runs: RunSet[ColumnBlock],
        schema: dict[str, tuple[str, pa.DataType]],
        *,
        name: str,
        make_child: Callable[[], Child],
        feed: Callable[[Child, dict[str, Column], int], None],
        child_blocks: Callable[[Child], Iterator[ColumnBlock]],
        child_done: Callable[[Child], None],
        state_runs: list[str] | None = None,
        fold_states: Callable[[Child, ColumnBlock], None] | None = None,
        presize: Callable[[Child, int], None] | None = None,
        feed_bytes: int = 0,
    ) -> None:
        self.runs = runs
        self._feed_bytes = feed_bytes
        self.schema = schema
        self.name = name
        self._make_child = make_child
        self._feed = feed
        self._child_blocks = child_blocks
        self._child_done = child_done
        self._state_runs = list(state_runs or [])
        self._fold_states = fold_states
        self._presize = presize
        #: (partition, its file) for every partition with rows or (in state runs) groups
        self._paths = [
            (part, path) for part, path in enumerate(paths) if path is not None or self._state_runs
        ]
        self._readers: list[RunReader] | None = None
        #: per state run: the next batch to read
        self._cursors = [0] * len(self._state_runs)
        self._child: Child | None = None
        self._blocks: Iterator[ColumnBlock] | None = None
        self._next: ColumnBlock | None = None

    def _advance(self) -> ColumnBlock | None:
        while self._next is None:
            if self._blocks is not None:
                self._next = next(self._blocks, None)
                if self._next is not None:
                    break
                self._finish_child()
            if not self._paths:
                self._close_state_runs()
                return None
            self._start_child(*self._paths.pop(0))
        return self._next

    def _state_batches(self, part: int) -> list[tuple[int, int]]:
        """``(run, batch)`` of every batch of the state runs in partition ``part``."""
        if self._readers is None:
            self._readers = []
            for path in self._state_runs:
                self._readers.append(RunReader(path))
        shift = np.uint64(64 - PARTITION_BITS)
        out = []
        for r, reader in enumerate(self._readers):
            i = self._cursors[r]
            while i < len(reader.batches):
                info = reader.batches[i]
                first = int(np.uint64(info.min_hash) >> shift)
                if first > part:
                    break
                if first < part or int(np.uint64(info.max_hash) >> shift) != part:
                    raise CorruptFileError(
                        reader.path,
                        info.offset,
                        f"batch {i} holds hashes of partitions other than {part} "
                        f"({info.min_hash:#x}..{info.max_hash:#x}): not a run of groups "
                        "written partition by partition",
                    )
                out.append((r, i))
                i += 1
            self._cursors[r] = i
        return out

    def _start_child(self, part: int, path: str | None) -> None:
        states = self._state_batches(part) if self._state_runs else []
        if path is None and not states:  # no rows, no groups: no child
            return
        child = self._make_child()
        self._child = child
        started = time.perf_counter()
        try:
            readers = self._readers or []
            if self._presize is not None:
                rows = sum(int(readers[r].batches[i].count) for r, i in states)
                if path is not None:
                    with RunReader(path) as reader:
                        rows += sum(b.count for b in reader.batches)
                self._presize(child, rows)
            if states:
                assert self._fold_states is not None
                for r, i in states:
                    self._fold_states(child, readers[r].read_block(i))
            if path is not None:
                with RunReader(path) as reader:
                    pending: list[ColumnBlock] = []
                    pending_bytes = 0
                    for i in range(len(reader.batches)):
                        block: ColumnBlock = reader.read_block(i)
                        if pending and pending_bytes + block.nbytes() > self._feed_bytes:
                            self._feed_blocks(child, pending)
                            pending, pending_bytes = [], 0
                        pending.append(block)
                        pending_bytes += block.nbytes()
                        del block
                    if pending:
                        self._feed_blocks(child, pending)
        finally:
            if path is not None:
                self.runs.remove(path)
            self.runs.metrics.merge_time_s += time.perf_counter() - started
        log.debug("%s aggregated partition %s in child %s", self.name, path, child.name)
        self._blocks = self._child_blocks(child)

    def _feed_blocks(self, child: Child, blocks: list[ColumnBlock]) -> None:
        """Feed ``blocks`` (consecutive batches of one partition) to ``child`` as one; the
        list is emptied, so only the joined block stays alive while it is folded."""
        block = blocks[0] if len(blocks) == 1 else ColumnBlock.concat(_same_columns(blocks))
        blocks.clear()
        self._feed(child, block_to_columns(block, self.schema), len(block))

    def _finish_child(self) -> None:
        child, self._child, self._blocks = self._child, None, None
        if child is not None:
            self._child_done(child)
            child.close()

    def next_min_hash(self) -> int | None:
        block = self._advance()
        return None if block is None else int(block.hashes[0])

    def read_next(self) -> ColumnBlock:
        block = self._advance()
        assert block is not None
        self._next = None
        return block

    def close(self) -> None:
        self._next = None
        blocks = self._blocks
        if blocks is not None:
            close = getattr(blocks, "close", None)
            if close is not None:
                close()
        self._finish_child()
        for _part, path in self._paths:
            if path is not None:
                self.runs.remove(path)
        self._paths = []
        self._close_state_runs()

    def _close_state_runs(self) -> None:
        """Close and delete the state runs (every partition has had its groups)."""
        readers, self._readers = self._readers or [], None
        for reader in readers:
            reader.close()
        runs, self._state_runs = self._state_runs, []
        for path in runs:
            self.runs.remove(path)

"""Threads for :class:`~extagg.columnar.HashAggregator`: owner-partitioned radix aggregation.

With ``threads=N > 1`` the aggregator owns ``P`` (the power of two >= N) *thread partitions*,
chosen by the top ``log2(P)`` bits of the key hash, each folded by a child aggregator that sees
its hashes rotated left by those bits (:func:`~extagg.columnar.partition_files.rotate_left`:
the bits that still differ lead, the order inside the partition is unchanged). Every chunk of
input goes through two parallel phases on a pool of N threads:

1. the chunk is cut into N row slices; each slice's keys are hashed and encoded once
   (``KeyLayout.encode``) and its rows are grouped by partition with a stable counting sort
   (:func:`extagg.columnar._radix_kernels.radix_partition`);
2. worker ``w`` folds partitions ``w, w + N, ...``: for each, it gathers the partition's rows of
   every slice, in slice order (so ``first``/``last`` see the input order), and folds them into
   that partition's child, which takes the keys already encoded.

Partition ``p`` is only ever touched by worker ``p % N``, one chunk at a time: no locks on the
hot path and no final combine, since all the rows of a key go to one child. The children's
outputs, one partition after the other, are the single-thread hash order exactly: the result
does not depend on the thread count.

Few groups: when the first chunk folded on the pool leaves at most :data:`LOCAL_MAX_GROUPS`
groups in all, and at most half as many as its rows, the partitioning (counting sort and
gather, about as much work as the fold itself when the tables sit in the cache) is not worth
it: each worker then folds its row slice of every chunk into a table of its own (a *local*
child, unrotated; thread-local pre-aggregation), and the results merge the partitions' stream
with the locals' streams, combining equal keys (:func:`extagg.merge.heap.merge_in_passes`). If
a local table outgrows ``2 * LOCAL_MAX_GROUPS`` or spills, the chunks after it are partitioned
again, and the locals' groups are folded into the partitions' children at once (each local's
groups come out in hash order, so a partition's are one run of them): input sorted by its key
(ids, times) shows few groups a chunk and many in all, and merging every group of the run
with the locals' at the end had cost it (20 M sorted rows, 5 M groups, two threads: 1.45 s,
now 1.23 s). Not with ``first``/``last``, whose order the combine would not keep.
Same rows in the same order; float sums may differ in the last bits (the additions are
grouped differently, as a spill does).

Memory: the children of worker ``w`` are consumers of one task (``TaskMemoryManager`` with an
explicit id) of the caller's ``UnifiedMemoryManager``, so each worker gets its fair share and
spills its own children cooperatively, and the one budget holds over all of them. Every child
takes its starting memory before any worker runs, and holds at least a floor until the results
are read, so every worker task stays active and none waits for the share of an idle one.

Resident memory: worker threads allocate their temporaries from their own malloc arenas, which
keep freed memory resident; the fold gives it back to the kernel
(:func:`extagg._malloc.release_free_memory`) after a chunk during which a partition spilled,
after the last chunk, and while the results are read whenever the reading worker's grant has
dropped by :data:`TRIM_BYTES` or a partition is done.

Errors: the first exception of a worker (a kernel error, ``MemoryLimitError``, ``SpillError``,
``KeyboardInterrupt``) stops the others at their next partition; the caller re-raises it
unchanged once every worker has stopped, and closes the aggregator.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from typing import Any, Protocol, TypeVar

import numpy as np

from extagg._malloc import release_free_memory
from extagg.columnar import _radix_kernels as RK
from extagg.columnar.columns import Column, ReusedArrays
from extagg.columnar.keys import EncodedKeys
from extagg.columnar.merging import ReserveMerge
from extagg.errors import MemoryLimitError
from extagg.memory import (
    HelperTaskId,
    TaskMemoryManager,
    UnifiedMemoryManager,
    task_memory_manager,
)
from extagg.merge.heap import BlockSource
from extagg.metrics import SpillMetrics
from extagg.spill.blocks import ColumnBlock

__all__ = [
    "LOCAL_MAX_GROUPS",
    "MAX_PARTITION_BITS",
    "ThreadChild",
    "ThreadedFold",
    "partition_bits",
]

log = logging.getLogger(__name__)

#: at most 2**8 thread partitions
MAX_PARTITION_BITS = 8
#: chunks of fewer rows are folded in the caller's thread (same children, same result)
INLINE_ROWS = 1 << 14
#: at most this many groups after the first chunk: fold into thread-local tables from then on
LOCAL_MAX_GROUPS = 1 << 17
#: while results are read: give freed heap memory back once a worker's grant dropped this much
TRIM_BYTES = 1 << 20


def partition_bits(threads: int) -> int:
    """``log2`` of the thread partitions for ``threads`` workers: the power of two >= it."""
    return min(MAX_PARTITION_BITS, max(0, (threads - 1).bit_length()))


class ThreadChild(Protocol):
    """What :class:`ThreadedFold` needs of a partition's aggregator."""

    @property
    def metrics(self) -> SpillMetrics: ...

    @property
    def groups_in_memory(self) -> int:
        """Groups in its in-memory table now."""

    def start(self) -> None:
        """Take the starting memory (its table)."""

    def drop_floor(self) -> None:
        """Give back the memory held beyond what it uses."""

    def reserve_merge_memory(
        self,
        per_source: int,
        num_sources: int,
        spill_rest: Callable[[], bool] | None = None,
        limit: int | None = None,
    ) -> tuple[int, int]:
        """Hold merge buffers (:meth:`extagg.spillable.Spillable.reserve_merge_memory`)."""

    def fold_encoded(self, cols: dict[str, Column], enc: EncodedKeys, n: int) -> None:
        """Fold ``n`` rows whose keys are already encoded (hashes as the child sees them)."""

    @property
    def takes_groups(self) -> bool:
        """Whether :meth:`fold_groups` may be called (not once it is hash-partitioned)."""

    def fold_groups(self, block: ColumnBlock) -> None:
        """Fold a block of groups (combined states, hashed as the parent sees them)."""

    def blocks(self) -> Iterator[ColumnBlock]:
        """Every group once, hashed as the parent sees them, in hash order."""

    def read_with(self, submit: Callable[..., Future[Any]], lanes: int) -> None:
        """Gather its sorted table's result batches ``lanes`` at a time, on ``submit``."""

    def close(self) -> None: ...


_T = TypeVar("_T")


class _Slice:
    """One row slice of a chunk: its columns, encoded keys and rows grouped by partition."""

    __slots__ = ("cols", "enc", "order", "bounds")

    def __init__(
        self, cols: dict[str, Column], enc: EncodedKeys, order: np.ndarray, bounds: np.ndarray
    ) -> None:
        self.cols = cols
        self.enc = enc
        self.order = order
        self.bounds = bounds


def _is_key_word(col: Column, enc: EncodedKeys) -> bool:
    """Whether ``col`` is the one key, its values the words of ``enc`` (the same memory)."""
    values = col.values
    return (
        values is not None
        and col.valid is None
        and values.ndim == 1
        and values.dtype.itemsize == 8
        and values.dtype.kind in "iu"
        and enc.words.shape[1] == 1
        and len(values) == len(enc.words)
        and values.ctypes.data == enc.words.ctypes.data
    )


class ThreadedFold:
    """The thread partitions of one aggregator, their children and the pool that folds them.

    Parameters
    ----------
    name
        The aggregator's name (threads and tasks are named after it).
    threads
        Worker threads (N).
    bits
        ``log2`` of the partitions (P = 2**bits >= N).
    memory_manager
        The manager the workers' tasks take memory from.
    owner_task
        The caller's task id (the workers' task ids derive from it).
    make_child
        ``make_child(partition, task manager, rotation bits)``: a started-empty child.
    encode
        ``encode(columns, rows, reuse)``: hashes and encodes the key columns of a slice of
        rows (its hashes into ``reuse``'s arrays).
    on_peak
        Receives the bytes all workers' tasks hold together after each grant.
    make_local
        ``make_local(worker, task manager)``: a started-empty unrotated child for thread-local
        folding, or ``None`` (no thread-local folding: ``first``/``last``).
    merge
        ``merge(sources, groups, reserve)`` merges hash-sorted block sources, combining equal
        keys (the partitions' stream and the locals' streams; ``groups``: the most rows of each
        source, ``None`` for any number), its buffers held through ``reserve`` (the first
        local child's, on worker 0's task).
    """

    def __init__(
        self,
        *,
        name: str,
        threads: int,
        bits: int,
        memory_manager: UnifiedMemoryManager,
        owner_task: Hashable,
        make_child: Callable[[int, TaskMemoryManager, int], ThreadChild],
        encode: Callable[[dict[str, Column], int, ReusedArrays | None], EncodedKeys],
        on_peak: Callable[[int], None],
        make_local: Callable[[int, TaskMemoryManager], ThreadChild] | None = None,
        merge: Callable[
            [list[BlockSource[ColumnBlock]], list[int | None], ReserveMerge],
            Iterator[ColumnBlock],
        ]
        | None = None,
    ) -> None:
        self.name = name
        self.bits = bits
        self.parts = 1 << bits
        self.threads = min(threads, self.parts)
        ids: list[Hashable] = [HelperTaskId(owner_task, w) for w in range(self.threads)]
        #: one task per worker (explicit ids: any thread may act for it), the same for every
        #: threaded aggregator of the caller's task (they fold one after the other), helpers
        #: of the caller's task: with it they have one fair share, of which each worker may
        #: hold an equal part of what the caller does not
        self.tasks = [task_memory_manager(memory_manager, i) for i in ids]
        self._make_child = make_child
        self._encode = encode
        self._on_peak = on_peak
        self.children: list[ThreadChild] = []
        self._make_local = make_local if merge is not None else None
        self._merge = merge
        #: the thread-local children (few groups), one per worker, once chosen
        self.locals: list[ThreadChild] = []
        #: the metrics of thread-local children whose groups went to the partitions
        self._drained: list[SpillMetrics] = []
        #: "first" (no chunk on the pool yet), "local" or "partition"
        self.mode = "first" if self._make_local is not None and self.threads > 1 else "partition"
        self._pool: ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        #: a chunk's temporaries, filled again at every chunk (see ReusedArrays): those of
        #: each slice (hashes, rows by partition: read by every worker until the chunk is
        #: folded) and those of each worker (its partitions' gathered rows, one at a time);
        #: within the chunk buffers the caller holds
        self._slice_arrays = [ReusedArrays() for _ in range(self.threads)]
        self._worker_arrays = [ReusedArrays() for _ in range(self.threads)]

    # ------------------------------------------------------------------ set-up
    def start(self) -> None:
        """Make every partition's child and its table, in the caller's thread, before any
        worker runs: every worker task holds memory (is counted in the fair share) from now."""
        if self.children:
            return
        try:
            for p in range(self.parts):
                child = self._make_child(p, self.tasks[p % self.threads], self.bits)
                self.children.append(child)
                child.start()
        except BaseException:
            self.close()
            self.children = []
            raise

    def child_metrics(self) -> list[SpillMetrics]:
        """The partitions' aggregators' metrics (live: they spill while the workers fold)."""
        return [*(child.metrics for child in [*self.children, *self.locals]), *self._drained]

    def groups_held(self) -> int:
        """Groups in the partitions' and the thread-local tables now."""
        return sum(child.groups_in_memory for child in [*self.children, *self.locals])

    def held(self) -> int:
        """Bytes the workers' tasks hold together."""
        return sum(t.memory_used for t in self.tasks)

    def note_grant(self) -> None:
        """A child was granted memory: report what all workers hold now."""
        self._on_peak(self.held())

    # ------------------------------------------------------------------ folding
    def fold(self, cols: dict[str, Column], n: int) -> None:
        """Fold ``n`` rows of checked input columns (one chunk) into the partitions' children.

        Returns once every worker is done with the chunk; re-raises the first worker error."""
        self.start()
        inline = n < INLINE_ROWS or self.threads == 1
        slices_n = 1 if inline else self.threads
        bounds = [n * s // slices_n for s in range(slices_n + 1)]
        ranges = [(bounds[s], bounds[s + 1]) for s in range(slices_n)]
        spills = self._spills()
        if self.mode == "local":
            if inline:
                self._fold_local(0, cols, 0, n, n)
            else:
                self._run([partial(self._fold_local, w, cols, lo, hi, n)
                           for w, (lo, hi) in enumerate(ranges)])  # fmt: skip
            self._check_locals()
        elif inline:
            slices = [self._slice(cols, lo, hi, n, s) for s, (lo, hi) in enumerate(ranges)]
            for w in range(self.threads):
                self._fold_worker(w, slices)
        else:
            slices = self._run(
                [partial(self._slice, cols, lo, hi, n, s) for s, (lo, hi) in enumerate(ranges)]
            )
            self._run([partial(self._fold_worker, w, slices) for w in range(self.threads)])
            del slices
            if self.mode == "first":
                self._choose_mode(n)
        if self._spills() != spills:  # a spill's I/O buffers were freed in the workers' arenas
            release_free_memory()

    def _spills(self) -> int:
        return sum(m.spill_count for m in self.child_metrics())

    def _choose_mode(self, rows: int) -> None:
        """After the first chunk folded on the pool (``rows`` rows): few groups, keys that
        repeat (at least two rows per group) and no spill -> thread-local tables from now on
        (if their starting memory is granted)."""
        self.mode = "partition"
        groups = sum(child.groups_in_memory for child in self.children)
        few = groups <= LOCAL_MAX_GROUPS and 2 * groups <= rows
        if not few or self._spills() or self._make_local is None:
            return
        try:
            for w in range(self.threads):
                local = self._make_local(w, self.tasks[w])
                self.locals.append(local)
                local.start()
        except MemoryLimitError as err:
            log.debug("%s: no thread-local tables (%s)", self.name, err)
            locals_, self.locals = self.locals, []
            for local in locals_:
                local.close()
            return
        self.mode = "local"
        for child in self.children:  # few groups, no more rows: the locals keep the tasks active
            child.drop_floor()
        log.debug("%s: %d groups after the first chunk: thread-local tables", self.name, groups)

    def _fold_local(self, w: int, cols: dict[str, Column], lo: int, hi: int, n: int) -> None:
        """Worker ``w``: rows ``lo..hi`` of the chunk into its own table, unpartitioned."""
        part = cols if (lo == 0 and hi == n) else {k: c.slice(lo, hi) for k, c in cols.items()}
        enc = self._encode(part, hi - lo, self._worker_arrays[w])
        self.locals[w].fold_encoded(part, enc, hi - lo)

    def _check_locals(self) -> None:
        """A local table that grew large or spilled: partition the chunks from now on."""
        grown = max(local.groups_in_memory for local in self.locals) > 2 * LOCAL_MAX_GROUPS
        if grown or any(local.metrics.spill_count for local in self.locals):
            self.mode = "partition"
            log.debug("%s: thread-local tables outgrown: partitioning again", self.name)
            self._drain_locals()

    def _drain_locals(self) -> None:
        """Fold every thread-local table's groups into the partitions' children and close
        it (in the caller's thread, between chunks): the results then need no merge. Not if
        a child cannot take groups (hash-partitioned): the locals are then merged at the end."""
        if self._stop.is_set() or not all(child.takes_groups for child in self.children):
            return
        shift = 64 - self.bits
        edges = np.array([p << shift for p in range(1, self.parts)], dtype=np.uint64)
        while self.locals:
            local = self.locals[0]
            for block in local.blocks():
                cuts = [0, *np.searchsorted(block.hashes, edges).tolist(), len(block)]
                for p in range(self.parts):
                    if cuts[p] < cuts[p + 1]:
                        self.children[p].fold_groups(block.slice(cuts[p], cuts[p + 1]))
            self._drained.append(local.metrics)
            self.locals.pop(0)
            local.close()

    def _slice(self, cols: dict[str, Column], lo: int, hi: int, n: int, s: int) -> _Slice:
        """Slice ``s`` (rows ``lo..hi``) of the chunk: keys encoded, rows grouped by partition."""
        part = cols if (lo == 0 and hi == n) else {k: c.slice(lo, hi) for k, c in cols.items()}
        reuse = self._slice_arrays[s]
        enc = self._encode(part, hi - lo, reuse)
        order = reuse.get("order", hi - lo, np.int64)
        bounds = reuse.get("bounds", self.parts + 1, np.int64)
        RK.radix_partition(enc.hashes, self.bits, order, bounds)
        return _Slice(part, enc, order, bounds)

    def _fold_worker(self, w: int, slices: list[_Slice]) -> None:
        """Worker ``w``: its partitions, each gathered from every slice in slice order and
        folded in one call (a child's every call costs Python work, whatever its rows)."""
        for p in range(w, self.parts, self.threads):
            if self._stop.is_set():
                return
            parts = [
                (s, s.order[int(s.bounds[p]) : int(s.bounds[p + 1])])
                for s in slices
                if s.bounds[p] < s.bounds[p + 1]
            ]
            if not parts:
                continue
            reuse = self._worker_arrays[w]  # the partition before is folded: refilled
            enc = EncodedKeys.take_many([(s.enc, rows) for s, rows in parts], self.bits, reuse)
            sub = {}
            for name in parts[0][0].cols:
                # an 8-byte integer key without nulls is its own encoded word (see
                # ``_column_words``): a view of the words gathered, not gathered again
                if all(_is_key_word(s.cols[name], s.enc) for s, _ in parts):
                    first = parts[0][0].cols[name]
                    assert first.values is not None
                    words = enc.words[:, 0].view(first.values.dtype)
                    sub[name] = Column(name, first.kind, first.arrow_type, words)
                    continue
                # a string key's bytes are its encoded keys' (one string key): gathered once
                shared = all(
                    s.cols[name].data is s.enc.var_data
                    and s.cols[name].offsets is s.enc.var_offsets
                    for s, _ in parts
                )
                sub[name] = Column.take_many(
                    [(s.cols[name], rows) for s, rows in parts],
                    reuse,
                    (enc.var_offsets, enc.var_data) if shared else None,
                )
            self.children[p].fold_encoded(sub, enc, len(enc.hashes))

    def _run(self, jobs: list[Callable[[], _T]]) -> list[_T]:
        """Run ``jobs`` on the pool; their results in order, or the first error (by job
        order) once all have stopped."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.name)
        pool = self._pool
        self._stop.clear()
        futures: list[Future[_T]] = [pool.submit(self._guard, job) for job in jobs]
        try:
            wait(futures)
        except BaseException:  # the caller was interrupted: stop the workers, then go on
            self._stop.set()
            _wait_all(futures)
            raise
        for f in futures:
            err = f.exception()
            if err is not None:
                raise err
        return [f.result() for f in futures]

    def _guard(self, job: Callable[[], _T]) -> _T:
        try:
            return job()
        except BaseException:
            self._stop.set()  # the other workers stop at their next partition
            raise

    # ------------------------------------------------------------------ results
    def blocks(self, absorb: Callable[[SpillMetrics], None]) -> Iterator[ColumnBlock]:
        """Every group once in hash order: partition 0's blocks, then 1's, ... (merged with
        the thread-local tables' blocks, if any); ``absorb`` is called with each child's
        metrics once its last block is out, then the child closed."""
        try:
            for arrays in (*self._slice_arrays, *self._worker_arrays):
                arrays.clear()
            streams = self._open_results()
            release_free_memory()  # the chunks' temporaries, freed in the workers' arenas
            if not self.locals:
                if self._pool is not None:  # the workers gather the reader's next batches
                    for child in self.children:
                        child.read_with(self._pool.submit, self.threads)
                yield from self._partition_blocks(streams, absorb)
                return
            self.shutdown()
            assert self._merge is not None
            sources: list[BlockSource[ColumnBlock]] = [
                _Stream(self._partition_blocks(streams, absorb))
            ]
            groups: list[int | None] = [None]
            for local in self.locals:
                groups.append(local.groups_in_memory if not local.metrics.spill_count else None)
                sources.append(_Stream(local.blocks()))
            yield from self._merge(sources, groups, self.locals[0].reserve_merge_memory)
            for local in self.locals:
                absorb(local.metrics)
                local.close()
        finally:
            self.close()

    def _partition_blocks(
        self, streams: list[Iterator[ColumnBlock]], absorb: Callable[[SpillMetrics], None]
    ) -> Iterator[ColumnBlock]:
        """The partitions' blocks, one partition after the other (trimming freed memory)."""
        for p, child in enumerate(self.children):
            task = self.tasks[p % self.threads]
            high = task.memory_used  # the most held since the last trim
            for block in streams[p]:
                yield block
                held = task.memory_used
                if held <= high - TRIM_BYTES:  # a source or merge buffers were freed
                    release_free_memory()
                    high = held
                high = max(high, held)
            absorb(child.metrics)
            child.close()
            release_free_memory()
            log.debug("%s: thread partition %d read", self.name, p)

    def _open_results(self) -> list[Iterator[ColumnBlock]]:
        """Every child's result stream, opened on the pool: opening one sorts its in-memory
        table by hash (the merge itself starts when its first block is read), so the children's
        sorts run side by side."""
        streams: list[Iterator[ColumnBlock] | None] = [None] * len(self.children)

        def open_worker(w: int) -> None:
            for p in range(w, len(self.children), self.threads):
                if self._stop.is_set():
                    return
                streams[p] = self.children[p].blocks()

        if self.threads == 1 or len(self.children) < 2:
            open_worker(0)
        else:
            self._run([partial(open_worker, w) for w in range(self.threads)])
        opened = [s for s in streams if s is not None]
        assert len(opened) == len(streams)
        return opened

    # ------------------------------------------------------------------ cleanup
    def shutdown(self) -> None:
        """Stop the pool's threads (after the last chunk)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def close(self) -> None:
        """Stop the pool, close every child (their files deleted, their memory released)."""
        self._stop.set()
        self.shutdown()
        for arrays in (*self._slice_arrays, *self._worker_arrays):
            arrays.clear()
        errors: list[BaseException] = []
        for child in [*self.children, *self.locals]:
            try:
                child.close()
            except BaseException as err:  # close the others anyway
                errors.append(err)
        if errors:
            raise errors[0]


def _wait_all(futures: list[Future[_T]]) -> None:
    """Wait for every future even if interrupted again meanwhile."""
    while True:
        try:
            wait(futures)
            return
        except BaseException:  # pragma: no cover - a second Ctrl-C while the workers stop
            continue


class _Stream(BlockSource[ColumnBlock]):
    """A hash-sorted iterator of blocks as a merge source."""

    def __init__(self, blocks: Iterator[ColumnBlock]) -> None:
        self._blocks = blocks
        self._next: ColumnBlock | None = None
        self._done = False

    def _peek(self) -> ColumnBlock | None:
        while self._next is None and not self._done:
            block = next(self._blocks, None)
            if block is None:
                self._done = True
            elif len(block):
                self._next = block
        return self._next

    def next_min_hash(self) -> int | None:
        block = self._peek()
        return None if block is None else int(block.hashes[0])

    def read_next(self) -> ColumnBlock:
        block = self._peek()
        assert block is not None
        self._next = None
        return block

    def close(self) -> None:
        self._done = True
        self._next = None
        close = getattr(self._blocks, "close", None)
        if close is not None:
            close()

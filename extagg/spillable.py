"""Spillable: what every engine that spills shares (Spark's ``Spillable.scala``).

An engine folds records into an in-memory *collection* (a map, a typed table, value lists); when
the memory manager will not grant what the collection needs, the collection is written as a
hash-sorted run file and started again, and at the end the runs are merged. :class:`Spillable`
holds that shape once:

* set-up: the arguments every engine takes (``memory`` / ``memory_manager``, ``spill_dirs``,
  ``max_spill_bytes``, ``batch_size``, ``fan_in``, ``compression``, ``name``), checked the same
  way, and the consumer registered with the task's memory manager;
* :meth:`Spillable.maybe_spill`, the template the engine calls between chunks of input: the
  spill *policy* (:meth:`Spillable.should_spill`, by default Spark's threshold doubling) decides,
  the engine's :meth:`Spillable.spill_collection` writes the run;
* :meth:`Spillable.spill`, the :class:`~extagg.memory.MemoryConsumer` hook another consumer's
  request calls, around the engine's :meth:`Spillable.force_spill`;
* the run list (:class:`RunSet`), the memory budget (:class:`MemoryBudget`: hold, trim, floor),
  the merge-memory reservation (:meth:`Spillable.reserve_merge_memory`), the lock, the phase
  (open → reading → closed), ``close()``, the context manager and the finalizer.

To make a new spilling collection, subclass :class:`Spillable` and implement
:meth:`~Spillable.spill_collection`, :meth:`~Spillable.force_spill`,
:meth:`~Spillable.collection_is_empty` and :meth:`~Spillable.release_collection`; call
:meth:`~Spillable.maybe_spill` with the collection's estimated size before folding each chunk,
:meth:`~Spillable.begin_reading` when iteration starts, and merge ``self.runs`` with
:func:`extagg.merge.heap.merge_in_passes`. :class:`extagg.ExternalAppendOnlyMap` is the small
example.

Helpers of an engine receive these objects (the budget, the run set, the lock), never the
engine, so no helper imports the class that calls it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from types import FrameType, TracebackType
from typing import Any, Generic, TypeVar

from extagg._config import DEFAULT_BATCH_SIZE, DEFAULT_FAN_IN, format_size, parse_size
from extagg._interrupts import deferred_interrupts
from extagg.errors import MemoryLimitError, SpillError, UsageError
from extagg.memory import (
    Consumer,
    MemoryConsumer,
    TaskMemoryManager,
    UnifiedMemoryManager,
    describe_holders,
    resolve_task_memory_manager,
)
from extagg.merge.heap import BlockSource, HashedRows, RunSource, write_run_from
from extagg.metrics import SpillMetrics
from extagg.spill.codecs import BatchCodec
from extagg.spill.runfile import COMPRESSIONS, RunFile, RunWriter
from extagg.spill.tempdir import SpillDirs

__all__ = ["MemoryBudget", "RunSet", "Spillable"]

log = logging.getLogger(__name__)

OPEN, READING, CLOSED = "open", "reading", "closed"

_S = TypeVar("_S", bound="Spillable[Any]")
#: the engine's block type (what its run files hold and its merge combines)
B = TypeVar("B", bound=HashedRows)


class MemoryBudget:
    """The memory one consumer holds, asked for and given back in whole amounts.

    :meth:`hold` makes the consumer hold at least a total (all or nothing); :meth:`trim` gives
    back what is above ``max(floor, usage())``, where ``usage`` reports the bytes the engine
    really uses (its collection and buffers). ``max_memory`` is what the engine plans with (the
    manager's size, or less for a partition's aggregator).
    """

    def __init__(
        self,
        consumer: MemoryConsumer,
        metrics: SpillMetrics,
        max_memory: int,
        usage: Callable[[], int] | None = None,
    ) -> None:
        # a proxy: the engine holds its budget, a strong reference back would make a cycle
        # and keep a dropped engine (its files, its grant) alive until the cyclic GC runs
        self.consumer: MemoryConsumer = weakref.proxy(consumer)
        self.metrics = metrics
        self.max_memory = max_memory
        self.floor = 0
        self.usage: Callable[[], int] = usage if usage is not None else self._consumer_used
        #: called after each grant (e.g. to record the peak of several consumers together)
        self.on_grant: Callable[[], None] | None = None

    def _consumer_used(self) -> int:
        return self.consumer.used

    @property
    def used(self) -> int:
        """Bytes the consumer holds."""
        return self.consumer.used

    def note_granted(self) -> None:
        """Record the most memory held at once (``metrics.peak_granted_bytes``)."""
        if self.consumer.used > self.metrics.peak_granted_bytes:
            self.metrics.peak_granted_bytes = self.consumer.used
        if self.on_grant is not None:
            self.on_grant()

    def acquire(self, num_bytes: int) -> int:
        """Ask for ``num_bytes``; returns what was granted (possibly less)."""
        granted = self.consumer.acquire_memory(num_bytes)
        self.note_granted()
        return granted

    def free(self, num_bytes: int) -> None:
        """Give back ``num_bytes`` (at most what is held; nothing once the engine is gone:
        its finalizer released its grant, e.g. a result stream dropped after it)."""
        try:
            num_bytes = min(num_bytes, self.consumer.used)
        except ReferenceError:
            return
        if num_bytes > 0:
            self.consumer.free_memory(num_bytes)

    def hold(self, total: int) -> bool:
        """Hold at least ``total`` bytes; False (holding what was held) if not granted."""
        want = total - self.consumer.used
        if want <= 0:
            return True
        got = self.consumer.acquire_memory(want)
        if got < want:
            if got:
                self.consumer.free_memory(got)
            return False
        self.note_granted()
        return True

    def hold_more(self, extra: int) -> bool:
        """:meth:`hold` what is in use plus ``extra`` bytes."""
        return self.hold(self.usage() + extra)

    def trim(self) -> None:
        """Give back what is no longer in use (keeping the floor); records the peak in use."""
        in_use = self.usage()
        excess = self.consumer.used - max(self.floor, in_use)
        if excess > 0:
            self.consumer.free_memory(excess)
        if in_use > self.metrics.peak_memory_bytes:
            self.metrics.peak_memory_bytes = in_use

    def describe(self) -> str:
        """``"<held> held, max_memory <max>"`` for error messages."""
        return f"{format_size(self.consumer.used)} held, max_memory {format_size(self.max_memory)}"


class RunSet(Generic[B]):
    """The run files an engine has written and not yet merged, in a :class:`SpillDirs`.

    Writing counts the bytes in ``metrics`` and remembers the largest decoded batch
    (``max_batch_bytes``), which sizes the merge's read buffers.
    """

    def __init__(self, spill_dirs: SpillDirs, compression: str, metrics: SpillMetrics) -> None:
        self.spill_dirs = spill_dirs
        self.compression = compression
        self.metrics = metrics
        self.paths: list[str] = []
        self.max_batch_bytes = 0

    def __len__(self) -> int:
        return len(self.paths)

    def __bool__(self) -> bool:
        return bool(self.paths)

    def count(self, info: RunFile) -> None:
        """Count a written file's bytes (and its largest batch)."""
        self.max_batch_bytes = max(self.max_batch_bytes, info.max_batch_bytes)
        self.metrics.disk_bytes_spilled += info.disk_bytes
        self.metrics.raw_bytes_spilled += info.raw_bytes

    def new_writer(self, prefix: str, codec: BatchCodec, *, ordered: bool = True) -> RunWriter:
        """A writer for a new file of this set's spill dirs (not added to the runs)."""
        path = self.spill_dirs.new_path(prefix)
        return RunWriter(
            path, codec, compression=self.compression, spill_dirs=self.spill_dirs, ordered=ordered
        )

    def write(
        self,
        prefix: str,
        codec: BatchCodec,
        write: Callable[[RunWriter], None],
        committed: Callable[[], None] | None = None,
    ) -> str:
        """Write one run with ``write(writer)`` and add it; returns its path.

        On any failure the partial file is removed and the error propagates. Adding the run
        and ``committed()`` (the engine forgets the rows it wrote) happen together, with
        Ctrl-C held back: an interrupt never leaves the rows both in a run and in memory.
        """
        while True:
            path = self.spill_dirs.new_path(prefix)
            writer: RunWriter | None = None
            try:
                writer = RunWriter(
                    path, codec, compression=self.compression, spill_dirs=self.spill_dirs
                )
                write(writer)
                info = writer.finish()
                break
            except SpillError as exc:
                if writer is not None:
                    writer.abort()
                else:
                    self.spill_dirs.remove(path)
                # a full disk among several spill directories: the run again in another
                # (the rows are still in memory); the last one full is the error
                if not self.spill_dirs.set_aside_full(path, exc):
                    raise
            except BaseException:
                if writer is not None:
                    writer.abort()
                else:  # the header's write was interrupted: the writer never existed
                    self.spill_dirs.remove(path)
                raise
        with deferred_interrupts():
            self.count(info)
            self.metrics.num_spill_files += 1
            self.paths.append(writer.path)
            if committed is not None:
                committed()
        return writer.path

    def write_merged(
        self, blocks: Iterator[B], codec: BatchCodec, batch_rows: int
    ) -> BlockSource[B]:
        """Write an intermediate merge's output as a run; returns a source over it."""
        source, info = write_run_from(
            blocks,
            path=self.spill_dirs.new_path("merge"),
            codec=codec,
            batch_size=batch_rows,
            compression=self.compression,
            spill_dirs=self.spill_dirs,
        )
        self.count(info)
        self.metrics.merge_files += 1
        return source

    def source(self, path: str) -> RunSource[B]:
        """A merge source over ``path`` that deletes the file when done."""
        return RunSource(path, owner=self.spill_dirs)

    def detach(self, path: str) -> RunSource[B]:
        """Take ``path`` out of the set: a source now owns (and deletes) it."""
        self.paths.remove(path)
        return self.source(path)

    def take_paths(self) -> list[str]:
        """Every run's path, now the caller's to read and remove; the set is left empty."""
        paths, self.paths = self.paths, []
        return paths

    def take_sources(self) -> list[BlockSource[B]]:
        """Sources over every run, which now own the files; the set is left empty."""
        paths, self.paths = self.paths, []
        return [self.source(p) for p in paths]

    def remove(self, path: str) -> None:
        """Delete one file of the spill dirs."""
        self.spill_dirs.remove(path)


class Spillable(MemoryConsumer, ABC, Generic[B]):
    """Base class of a spillable collection; see the module docstring for the contract.

    Subclasses set ``initial_threshold`` (Spark's ``initialMemoryThreshold``) if they use the
    default :meth:`should_spill`.

    Parameters
    ----------
    memory
        The budget (``"256m"`` or bytes) of a private memory manager; default
        ``EXTAGG_MEMORY`` / the process-wide manager.
    memory_manager
        A shared memory manager (or a task's) to take memory from instead.
    spill_dirs
        Directories for run files (default ``EXTAGG_SPILL_DIR`` / the system temp dir).
    batch_size
        Records per block of a run file.
    fan_in
        Most runs merged at once; more are merged in passes.
    compression
        Codec of run files (``"lz4"``, ...).
    max_spill_bytes
        Cap on bytes on disk at once (default none).
    force_spill_every
        Spill after this many records (Spark's ``numElementsForceSpillThreshold``; tests).
    name
        Name of the consumer in logs and errors.
    """

    #: dropped without close(), it deletes its files and gives back its grant (``__del__``)
    releases_when_dropped = True

    def __init__(
        self,
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
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if fan_in < 2:
            raise ValueError(f"fan_in must be at least 2, got {fan_in}")
        if force_spill_every is not None and force_spill_every < 1:
            raise ValueError(f"force_spill_every must be positive, got {force_spill_every}")
        if compression not in COMPRESSIONS:  # at once, not at the first spill
            raise ValueError(
                f"unknown spill compression {compression!r}: choose one of {sorted(COMPRESSIONS)}"
            )
        tmm = resolve_task_memory_manager(memory, memory_manager)
        super().__init__(tmm, name)
        self.batch_size = batch_size
        self.fan_in = fan_in
        self.compression = compression
        #: spill after this many records (Spark's ``numElementsForceSpillThreshold``; tests)
        self.force_spill_every = force_spill_every
        self.metrics = SpillMetrics()
        cap = (
            None if max_spill_bytes is None else parse_size(max_spill_bytes, name="max_spill_bytes")
        )
        dirs = (
            list(spill_dirs)
            if spill_dirs is not None and not isinstance(spill_dirs, str)
            else spill_dirs
        )
        #: the run files written and not yet merged
        self.runs: RunSet[B] = RunSet(
            SpillDirs(dirs, max_spill_bytes=cap), compression, self.metrics
        )
        self._owns_spill_dirs = True
        self.budget = MemoryBudget(self, self.metrics, tmm.memory_manager.max_memory)
        #: held while the collection changes; a forced spill from another thread waits for it
        self.lock = threading.RLock()
        self.phase = OPEN
        #: whether the results began to be read (a close() then is the end of reading)
        self.read_started = False
        #: records folded since the last spill (Spark's ``_elementsRead``)
        self.elements_read = 0
        #: bytes held for the collection (Spark's ``myMemoryThreshold``), default policy only
        self.threshold = 0
        self.initial_threshold = 0
        #: the error that stopped this engine taking input (a failed spill), if any
        self.failure: BaseException | None = None
        self._created_at = _caller_outside_extagg()

    def share_spill_dirs(self, runs: RunSet[Any]) -> None:
        """Write runs into the spill dirs of ``runs`` (another Spillable's, e.g. a parent's,
        which cleans them up: :meth:`close` then deletes only this one's files)."""
        self.runs.spill_dirs = runs.spill_dirs
        self._owns_spill_dirs = False

    # ------------------------------------------------------------------ the template
    def maybe_spill(self, current: int, reason: str = "memory not granted") -> bool:
        """Spill the collection (estimated at ``current`` bytes) if the policy says so or
        ``force_spill_every`` records were read since the last spill; returns whether it
        spilled (the collection is then empty)."""
        should = self.should_spill(current)
        every = self.force_spill_every
        if not should and every is not None and self.elements_read >= every:
            should, reason = True, f"forced every {every} records"
        if not should:
            return False
        if self.collection_is_empty():
            self.elements_read = 0
            return False
        try:
            self.spill_collection(current, reason)
        except (SpillError, MemoryLimitError) as err:
            self.fail(err)
            raise
        self.elements_read = 0
        self.release_after_spill()
        return True

    def should_spill(self, current: int) -> bool:
        """Spark's policy: when ``current`` reaches the threshold, ask for ``2 × current −
        threshold`` more; spill if the grant leaves the threshold below ``current``."""
        if self.threshold == 0:
            self.threshold = self.budget.acquire(self.initial_threshold)
        if current >= self.threshold and current > 0:
            self.threshold += self.budget.acquire(2 * current - self.threshold)
            return current >= self.threshold
        return False

    def release_after_spill(self) -> None:
        """After :meth:`maybe_spill` spilled: give back all but the initial threshold."""
        self.release_down_to(self.initial_threshold)

    def release_down_to(self, keep: int) -> None:
        """Give back what the threshold holds above ``keep`` bytes."""
        excess = self.threshold - keep
        if excess > 0:
            self.free_memory(excess)
            self.threshold = keep

    @abstractmethod
    def collection_is_empty(self) -> bool:
        """Whether the in-memory collection holds nothing to spill."""

    @abstractmethod
    def spill_collection(self, size: int, reason: str) -> None:
        """Write the in-memory collection (``size`` bytes estimated) as a run and start it
        again empty; on failure keep it usable and raise."""

    @abstractmethod
    def force_spill(self, trigger: Consumer) -> int:
        """Free memory for another consumer (the lock is held); returns the bytes freed."""

    @abstractmethod
    def release_collection(self) -> None:
        """Drop the collection and close whatever reads it (from :meth:`close`)."""

    # ------------------------------------------------------------------ forced spill
    def spill(self, size: int, trigger: Consumer) -> int:
        """Free memory because another consumer asked (Spark's ``Spillable.spill``)."""
        if trigger is self or self.phase == CLOSED:
            return 0
        # another thread of the same task may be folding records and waiting for memory while
        # holding our lock: then there is nothing we can safely spill, so say so at once
        if not self.lock.acquire(blocking=False):
            return 0
        try:
            return self.force_spill(trigger)
        finally:
            self.lock.release()

    def log_spill(self, what: str, size: int, detail: str | None = None) -> None:
        """Count a spill event and log Spark's line for it (``what``: "in-memory map";
        ``detail``, e.g. "forced by <consumer>", is appended after a comma)."""
        self.metrics.spill_count += 1
        count = self.metrics.spill_count
        log.info(
            "Thread %d spilling %s of %s to disk (%d time%s so far)%s",
            threading.get_ident(),
            what,
            format_size(size),
            count,
            "s" if count > 1 else "",
            "" if detail is None else f", {detail}",
        )

    # ------------------------------------------------------------------ reading
    def fail(self, error: BaseException) -> None:
        """Stop taking input because of ``error`` (a spill that failed: folding on would grow
        past the grant). Reading what was folded and :meth:`close` still work."""
        if self.failure is None:
            self.failure = error
            # the error is raised to the caller: logged here only for whoever follows the run
            log.info("%s stops taking input after: %s", self.name, error)

    def check_open(self, action: str) -> None:
        """Raise :class:`~extagg.errors.UsageError` unless records may still be folded, or
        the error of :meth:`fail` again (same type) if the engine stopped taking input."""
        failure = self.failure
        closed = self.phase == CLOSED and not self.read_started
        if closed and failure is None:
            raise UsageError(self._closed_message())
        if self.phase != OPEN and not closed:
            raise UsageError(action)
        if failure is not None:
            then = (  # a threaded fold closes on a failure: its partitions' state is partial
                "it closed then, releasing its records and files"
                if closed
                else "what was folded before it can still be read; close() it"
            )
            message = (
                f"{self.name} takes no more input after an earlier {type(failure).__name__}: "
                f"{failure} ({then})"
            )
            again: BaseException
            if isinstance(failure, SpillError):
                again = SpillError(
                    message, directory=failure.directory, bytes_needed=failure.bytes_needed
                )
            elif isinstance(failure, MemoryLimitError):
                again = MemoryLimitError(message)
            else:
                again = UsageError(message)
            raise again from failure

    def begin_reading(self, message: str) -> None:
        """Enter the reading phase (once): raise :class:`~extagg.errors.UsageError` with
        ``message`` if iteration already started (another message if it is closed)."""
        if self.phase == CLOSED and not self.read_started:
            raise UsageError(self._closed_message())
        if self.phase != OPEN:
            raise UsageError(message)
        self.phase = READING
        self.read_started = True

    def _closed_message(self) -> str:
        """Closed before its results were read (after them, the messages say so)."""
        return (
            f"{self.name} is closed: close() released its records and files, so it takes no "
            "more input and has no results to read"
        )

    def check_not_closed_while_reading(self) -> None:
        """Raise :class:`~extagg.errors.UsageError` if :meth:`close` was called while the
        results were being read: what was not read yet is gone (a closed in-memory source
        looked exhausted, and the results stopped early without a word)."""
        if self.phase == CLOSED:
            raise UsageError(
                f"{self.name} was closed while its results were being read: the results not "
                "read yet are gone (read them to the end, or stop, before close())"
            )

    def reserve_merge_memory(
        self,
        per_source: int,
        num_sources: int,
        spill_rest: Callable[[], bool] | None = None,
        limit: int | None = None,
    ) -> tuple[int, int]:
        """Hold read buffers for a merge of ``num_sources`` (``per_source`` bytes each, at most
        ``limit`` in all); returns ``(fan_in, bytes granted)``.

        If the budget cannot hold them next to the in-memory collection, ``spill_rest()``
        writes its unread rows to disk first (one more run) rather than merging in many
        passes. Fewer than two buffers granted: :class:`~extagg.errors.MemoryLimitError`.
        """
        wanted = min(self.fan_in, num_sources) * per_source
        if limit is not None:
            wanted = min(wanted, max(limit, 2 * per_source))
        granted = self.acquire_memory(wanted)
        if isinstance(self.failure, SpillError):
            # a spill failed (disk full, the spill cap): another would too. What was folded
            # is still read, in one pass (a pass more would write runs), its buffers beyond
            # the grant if they must be: the promise is that it stays readable
            if granted < wanted:
                log.warning(
                    "%s reads its results after %s with %s of merge buffers beyond its grant",
                    self.name, type(self.failure).__name__, format_size(wanted - granted),
                )  # fmt: skip
            return max(2, num_sources), granted
        if granted < wanted and spill_rest is not None:
            with self.lock:
                if spill_rest():
                    granted += self.acquire_memory(wanted - granted)
        self.budget.note_granted()
        if granted < 2 * per_source:
            self.free_memory(granted)
            raise MemoryLimitError(
                f"{self.name} cannot merge {num_sources} sorted runs: it needs "
                f"{format_size(2 * per_source)} for two read buffers of "
                f"{format_size(per_source)} and was granted {format_size(granted)} "
                f"of a {format_size(self.budget.max_memory)} budget "
                f"({describe_holders(self.task_memory_manager.memory_manager)})"
            )
        return max(2, min(self.fan_in, granted // per_source)), granted

    # ------------------------------------------------------------------ cleanup
    @property
    def closed(self) -> bool:
        return self.phase == CLOSED

    @property
    def spill_files(self) -> list[str]:
        """The run files currently on disk."""
        return self.runs.spill_dirs.files

    def close(self) -> None:
        """Release all memory and delete every run file. Idempotent."""
        with self.lock:
            if self.phase == CLOSED:
                return
            self.phase = CLOSED
            self.release_collection()
            if self._owns_spill_dirs:
                self.runs.spill_dirs.cleanup()
            else:
                for path in self.runs.paths:
                    self.runs.remove(path)
            self.runs.paths.clear()
            self.close_memory()
            self.threshold = 0

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self.phase == CLOSED:
                return
            held = self.used
            files = list(self.runs.paths) if self._owns_spill_dirs else []
            size = 0
            gone = 0  # removed already (the spill folders' cleanup at exit ran first)
            for path in files:
                try:
                    size += os.path.getsize(path)
                except OSError:
                    gone += 1
            self.close()
            if held or files:
                log.warning(
                    "%s was dropped without close(): released %s of memory grant and %d run "
                    "file%s (%s%s) in %s; created at %s",
                    self.name,
                    format_size(held),
                    len(files),
                    "" if len(files) == 1 else "s",
                    format_size(size),
                    f"; {gone} removed already" if gone else "",
                    ", ".join(sorted({os.path.dirname(p) for p in files})) or "no spill dir",
                    self._created_at,
                )
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def _caller_outside_extagg() -> str:
    """``file:line`` of the first frame outside extagg that leads here (cheap: a few frames)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("extagg."):
        frame = frame.f_back
    if frame is None:
        return "unknown"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"

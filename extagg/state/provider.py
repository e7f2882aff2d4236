"""StateStoreProvider: the versions of one store directory (Spark's HDFSBackedStateStoreProvider).

A store directory holds ``<version>.delta`` files (the changes of each version) and
``<version>.snapshot`` files (whole versions, written by maintenance or by ``merge_update``).
Version ``v`` is rebuilt from the newest snapshot at or below it plus the deltas after it, or
from a cached version plus the deltas after that one. Two ways to produce ``v + 1``:

* ``get_store(v)`` → put/remove → ``commit()``: the in-memory path; version ``v`` is loaded into
  a dict cached in the memory manager's ``MemoryStore`` (Spark's design);
* ``merge_update(v, pairs, merge_combiners)``: the streaming path; ``v``'s files are merged with
  the engine's hash-ordered output as sorted streams, never holding the state in memory.

Both write byte-identical deltas for the same changes.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from typing import Any

from extagg.errors import CorruptFileError
from extagg.state.atomic import FencedError, file_identity
from extagg.state.cache import LoadedVersion, VersionCache
from extagg.state.codec import decode_key, decode_value, decoding, encode_value
from extagg.state.conf import StateStoreConf, StateStoreMetrics
from extagg.state.errors import (
    ConcurrentCommitError,
    StateStoreCommitError,
    StateStoreError,
    UnexpectedVersionError,
)
from extagg.state.files import (
    DELTA,
    SNAPSHOT,
    StateFileListing,
    StateFileReader,
    StateFileWriter,
    list_state_files,
    remove_stale_temp_files,
    store_id,
)
from extagg.state.store import ReadStateStore, RemovedKey, StateStore
from extagg.state.streams import (
    LiveRecords,
    VersionFiles,
    deletes_first,
    fallback_chain,
    files_for_version,
    missing_file_error,
    open_version,
    open_version_with_fallback,
)
from extagg.state.update import stream_update

__all__ = ["StateStoreProvider", "DEFAULT_STORE_NAME"]

logger = logging.getLogger(__name__)

DEFAULT_STORE_NAME = "default"


class StateStoreProvider:
    """Versions of one state store: ``<root>/<operator>/<partition>[/<store_name>]``.

    Usually obtained from ``Checkpoint.operator(...).provider(partition_id)``; can be built on
    any ``directory``. Loading a version reads its newest snapshot and the deltas after it
    (O(records read)) and holds it as a dict in storage memory; :meth:`merge_update` streams
    instead and holds about one decoded chunk per file merged.

    Parameters
    ----------
    directory
        The store's directory.
    operator_id
        The operator's id (recorded in errors and rows).
    partition_id
        The partition's id.
    store_name
        The store's name within the operator.
    conf
        Snapshot, retention, cache and compression settings (default :class:`StateStoreConf`).
    memory_manager
        The manager whose storage memory caches loaded versions (default: the process manager).
    allow_pickle
        Let values outside the deterministic codec's types be pickled.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        operator_id: int = 0,
        partition_id: int = 0,
        store_name: str = DEFAULT_STORE_NAME,
        conf: StateStoreConf | None = None,
        memory_manager: Any = None,
        allow_pickle: bool = False,
    ) -> None:
        self.directory = os.path.abspath(os.fspath(directory))
        self.operator_id = operator_id
        self.partition_id = partition_id
        self.store_name = store_name
        #: the store id its files' headers carry, checked when they are read (a delta
        #: copied from another partition's folder is corrupt here, not another's state)
        self.store_id = store_id(operator_id, partition_id, store_name)
        self.conf = conf if conf is not None else StateStoreConf()
        if not isinstance(self.conf, StateStoreConf):
            raise TypeError(f"conf must be a StateStoreConf, not {type(conf).__name__}")
        self.allow_pickle = bool(allow_pickle)
        if memory_manager is None:
            from extagg.memory import default_memory_manager

            memory_manager = default_memory_manager()
        self.memory_manager = memory_manager
        self._cache = VersionCache(
            memory_manager.memory_store, self.directory, self.conf.max_versions_in_memory
        )
        self._lock = threading.RLock()
        self._closed = False
        self._current_version = 0
        self._current_keys = 0
        self._current_bytes = 0
        os.makedirs(self.directory, exist_ok=True)
        remove_stale_temp_files(self.directory)

    def __repr__(self) -> str:
        return (
            f"StateStoreProvider[id = (op={self.operator_id},part={self.partition_id},"
            f"store={self.store_name}),dir = {self.directory}]"
        )

    def __enter__(self) -> StateStoreProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StateStoreError(f"{self!r} is closed")

    # ------------------------------------------------------------------ versions
    def list_files(self) -> StateFileListing:
        """The delta and snapshot files of this store."""
        return list_state_files(self.directory)

    def latest_version(self) -> int:
        """The newest version with a file (0 before the first commit)."""
        return self.list_files().latest_version

    def get_store(self, version: int) -> StateStore:
        """A writable store holding ``version``; its ``commit()`` writes ``version + 1``.

        The commit is fenced: if ``version + 1`` did not exist when the store was opened, the
        commit creates it or fails with :class:`ConcurrentCommitError` (another writer committed
        it meanwhile); if it existed (a retried batch), the commit replaces that very file only.
        """
        self._check_version(version)
        expected = file_identity(self._path(version + 1, DELTA))
        return StateStore(self, self._load(version), self._commit_changes, expected_delta=expected)

    def get_read_store(self, version: int) -> ReadStateStore:
        """A read-only store holding ``version``."""
        return ReadStateStore(self, self._load(version))

    def _check_version(self, version: int) -> None:
        self._check_open()
        if isinstance(version, bool) or not isinstance(version, int):
            raise TypeError(f"version must be an int, not {type(version).__name__}")
        if version < 0:
            raise UnexpectedVersionError(
                "[CANNOT_LOAD_STATE_STORE.UNEXPECTED_VERSION] Version cannot be less than 0: "
                f"got {version} for {self!r}",
                version=version,
            )

    def _load(self, version: int) -> LoadedVersion:
        """``version`` as a dict: from the cache, or rebuilt from files (then cached)."""
        self._check_version(version)
        if version == 0:
            self._set_current(0, 0, 0)
            return LoadedVersion(0, {}, 0)
        with self._lock:
            loaded = self._cache.get(version)
            if loaded is not None:
                self._cache.hits += 1
                self._set_current(version, len(loaded.mapping), loaded.encoded_bytes)
                return loaded
            self._cache.misses += 1
        logger.info(
            "The state for version %d of %r is not cached. Reading snapshot and delta files if "
            "needed... (normal for the first batch of a query)",
            version,
            self,
        )
        base = self._cache.newest_at_or_below(version - 1)
        listing = self.list_files()
        from_version = 0 if base is None else base.version
        start, paths = files_for_version(listing, version, repr(self), from_version)
        skip: set[int] = set()
        while True:
            if base is not None and start == base.version:
                loaded = self._replay(base, paths, version)
                break
            mapping: dict[Any, Any] = {}
            encoded = 0
            allow_pickle = self.allow_pickle
            files = VersionFiles(self.directory)
            files.paths = list(paths)
            key = b""
            try:
                records = open_version(paths, repr(self), self.conf.fan_in, store=self.store_id)
                try:
                    with closing(records):
                        for key, value in records:
                            mapping[decode_key(key)] = decode_value(value, allow_pickle)
                            encoded += len(key) + len(value)
                except ValueError as exc:  # a record that cannot be decoded: name its file
                    raise files.corrupt(exc, key) from None
            except CorruptFileError as exc:
                chain = fallback_chain(listing, version, repr(self), from_version, skip, exc)
                if chain is None:
                    raise
                start, paths = chain
                continue
            loaded = LoadedVersion(version, mapping, encoded)
            break
        with self._lock:
            self._cache.put(loaded)
            self._set_current(version, len(loaded.mapping), loaded.encoded_bytes)
        return loaded

    def _replay(self, base: LoadedVersion, paths: list[str], version: int) -> LoadedVersion:
        """``base`` (cached) plus the deltas in ``paths``, replayed into a copy."""
        mapping = dict(base.mapping)
        encoded = base.encoded_bytes
        allow_pickle = self.allow_pickle
        for path in paths:
            try:
                reader = StateFileReader(path, DELTA, label=repr(self), store=self.store_id)
            except FileNotFoundError:
                raise missing_file_error(path, repr(self)) from None
            for key_bytes, value_bytes in deletes_first(reader):
                with decoding(path):
                    key = decode_key(key_bytes)
                old = (
                    mapping.pop(key, _MISSING)
                    if value_bytes is None
                    else mapping.get(key, _MISSING)
                )
                if old is not _MISSING:
                    encoded -= len(key_bytes) + len(encode_value(old, allow_pickle))
                if value_bytes is not None:
                    with decoding(path):
                        mapping[key] = decode_value(value_bytes, allow_pickle)
                    encoded += len(key_bytes) + len(value_bytes)
        return LoadedVersion(version, mapping, encoded)

    def iter_version(self, version: int) -> Iterator[tuple[Any, Any]]:
        """Stream ``(key, value)`` of ``version`` in file order without loading it.

        A corrupt snapshot found before the first row is returned (a bad header or first block)
        is replaced by an older snapshot plus deltas when they exist (with a warning)."""
        self._check_version(version)
        listing = self.list_files()
        allow_pickle = self.allow_pickle
        files = VersionFiles(self.directory)
        records = self._open_records(listing, version, files)
        key = b""
        try:
            for key, value in records:
                yield decode_key(key), decode_value(value, allow_pickle)
        except ValueError as exc:  # a record that cannot be decoded: name its file
            raise files.corrupt(exc, key) from None
        finally:
            records.close()

    def _open_records(
        self, listing: StateFileListing, version: int, files: VersionFiles
    ) -> LiveRecords:
        """The live records of ``version``, its first one already read and decoded (a corrupt
        snapshot passed over for an older chain when there is one); ``files`` gets the chain."""
        return open_version_with_fallback(
            listing,
            version,
            repr(self),
            self.conf.fan_in,
            allow_pickle=self.allow_pickle,
            files=files,
            store=self.store_id,
        )

    def _set_current(self, version: int, num_keys: int, encoded_bytes: int) -> None:
        with self._lock:
            self._current_version = version
            self._current_keys = num_keys
            self._current_bytes = encoded_bytes

    # ------------------------------------------------------------------ writing
    def _path(self, version: int, kind: str) -> str:
        return os.path.join(self.directory, f"{version}.{kind}")

    def _commit_changes(
        self,
        version: int,
        base: dict[Any, Any],
        changes: dict[Any, tuple[bytes, bytes | None, Any]],
        encoded_bytes: int,
        expected: object = None,
    ) -> int:
        """Write a store's changes as ``version + 1`` and cache the new version.

        ``expected``: the identity of ``version + 1``'s delta when the store was opened (``None``:
        there was none), which the commit fences on."""
        self._check_open()
        new_version = version + 1
        delta = StateFileWriter(
            self._path(new_version, DELTA), DELTA, self.conf.compression, store=self.store_id
        )
        new_mapping: dict[Any, Any] | None = None
        try:
            for key_bytes, value_bytes, _value in sorted(changes.values(), key=_first):
                delta.write(key_bytes, value_bytes)
            if expected is not None:
                # a re-commit: the old snapshot of this version must not outlive its delta.
                # Removed just before the new delta is published; meanwhile the old delta still
                # rebuilds the old version, so a crash in between leaves a consistent version.
                self._remove_stale_snapshot(new_version)
            stats = delta.commit(expected)
        except BaseException as exc:
            delta.cancel()
            if isinstance(exc, FencedError):
                raise self._fenced(new_version, exc) from exc
            if isinstance(exc, Exception):
                raise StateStoreCommitError(
                    f"Error committing version {new_version} into {self!r}: error writing "
                    f"state store files, cannot perform commit: {exc}"
                ) from exc
            raise
        if expected is not None:
            # and again after: maintenance may have published a snapshot of the old delta
            # between the removal and the rename (its own check can come before the rename)
            self._remove_stale_snapshot_after_commit(new_version)
        logger.info("Committed version %d for %r to file %s", new_version, self, stats.path)
        with self._lock:
            self._cache.invalidate_from(new_version)
            num_keys = len(base) + _count_delta(base, changes)
            if self.conf.max_versions_in_memory > 0:
                if new_mapping is None:
                    new_mapping = _apply(base, changes)
                self._cache.put(LoadedVersion(new_version, new_mapping, encoded_bytes))
            self._set_current(new_version, num_keys, encoded_bytes)
        return new_version

    def _fenced(self, version: int, exc: FencedError) -> ConcurrentCommitError:
        """The error for a commit another writer beat; this provider's cache forgets
        ``version`` and later ones, so it serves the winner's files from now on."""
        with self._lock:
            self._cache.invalidate_from(version)
        path = self._path(version, DELTA)
        logger.warning("Lost the race to commit version %d of %r: %s", version, self, exc)
        return ConcurrentCommitError(
            f"[CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT] Version {version} of {self!r} was "
            f"committed by another writer while this one was writing it ({exc.strerror}); "
            f"this writer's changes were not published and {path} is the other writer's. "
            f"Load version {version} to continue from it, or open version {version - 1} again "
            "to retry the batch (which replaces it).",
            path=path,
            version=version,
        )

    def _remove_stale_snapshot(self, version: int) -> None:
        """Delete ``version``'s snapshot left by an earlier commit of the same version."""
        try:
            os.remove(self._path(version, SNAPSHOT))
        except FileNotFoundError:
            pass

    def _remove_stale_snapshot_after_commit(self, version: int) -> None:
        """:meth:`_remove_stale_snapshot` once the version is published: a failure is logged,
        not raised, since the commit itself succeeded (its caller must not retry it)."""
        try:
            self._remove_stale_snapshot(version)
        except OSError as exc:
            logger.warning(
                "Could not remove the snapshot of version %d of %r, which may predate its "
                "re-committed delta: %s",
                version,
                self,
                exc,
            )

    def merge_update(
        self,
        version: int,
        pairs: Iterable[tuple[Any, Any]],
        merge_combiners: Callable[[Any, Any], Any],
    ) -> int:
        """Produce ``version + 1`` by merging ``version``'s files with ``pairs`` as streams.

        ``pairs`` are ``(key, combiner)`` in ascending ``stable_hash`` order with each key once,
        as ``ExternalAppendOnlyMap.iterator(ordered=True)`` yields them (``ValueError``
        otherwise). A key
        already stored becomes ``merge_combiners(stored, combiner)``; a new key stores
        ``combiner``; a ``None`` combiner or merged value raises ``ValueError`` (as
        :meth:`StateStore.put`), publishing nothing. Writes the delta of every touched key
        and, when more than ``min_deltas_for_snapshot`` deltas would follow the last snapshot,
        a snapshot, in one pass. The state is never held in memory. Returns the new version.
        """
        self._check_version(version)
        if not callable(merge_combiners):
            raise TypeError("merge_combiners must be callable")
        new_version = version + 1
        expected = file_identity(self._path(new_version, DELTA))  # fences the commit
        listing = self.list_files()
        start, _paths = files_for_version(listing, version, repr(self))
        due = new_version - start > self.conf.min_deltas_for_snapshot
        due = due or new_version in listing.snapshots  # a re-commit replaces a stale snapshot
        files = VersionFiles(self.directory)
        old_records = self._open_records(listing, version, files)
        compression = self.conf.compression
        delta = StateFileWriter(
            self._path(new_version, DELTA), DELTA, compression, store=self.store_id
        )
        snapshot = (
            StateFileWriter(
                self._path(new_version, SNAPSHOT), SNAPSHOT, compression, store=self.store_id
            )
            if due
            else None
        )
        try:
            stats = stream_update(
                old_records,
                pairs,
                merge_combiners,
                delta,
                snapshot,
                self.allow_pickle,
                repr(self),
                files.corrupt,
            )
            if expected is not None:
                self._remove_stale_snapshot(new_version)  # never let it outlive the new delta
            delta.commit(expected)
            published = file_identity(self._path(new_version, DELTA))
        except BaseException as exc:
            delta.cancel()
            if snapshot is not None:
                snapshot.cancel()
            if isinstance(exc, FencedError):
                raise self._fenced(new_version, exc) from exc
            if isinstance(exc, OSError):
                raise StateStoreCommitError(
                    f"Error committing version {new_version} into {self!r}: error writing "
                    f"state store files, cannot perform commit: {exc}"
                ) from exc
            raise
        finally:
            old_records.close()
        if snapshot is None and expected is not None:
            # a re-commit without a snapshot due: none of the old version may outlive it (one
            # maintenance published after the removal above, say)
            self._remove_stale_snapshot_after_commit(new_version)
        if snapshot is not None:
            # after the delta: the version is published by its delta alone; a snapshot that
            # fails to commit is only a missed optimisation, which maintenance makes up for.
            # Fenced on the delta just written: a writer re-committing the version meanwhile
            # must not be shadowed by this snapshot.
            delta_path = self._path(new_version, DELTA)
            try:
                self._publish_snapshot(snapshot, new_version, {delta_path: published})
            except Exception as exc:
                snapshot.cancel()
                logger.warning("Could not write snapshot %d for %r: %s", new_version, self, exc)
        logger.info(
            "Merged version %d for %r: %d keys, %d changed (%d new)%s",
            new_version,
            self,
            stats.num_keys,
            stats.changed_keys,
            stats.new_keys,
            ", with a snapshot" if snapshot is not None else "",
        )
        with self._lock:
            self._cache.invalidate_from(new_version)
            self._set_current(new_version, stats.num_keys, stats.encoded_bytes)
        return new_version

    # ------------------------------------------------------------------ maintenance
    def do_maintenance(self) -> None:
        """Write a snapshot when due and delete files no longer needed. Never raises: errors
        are logged (Spark: maintenance must not fail the caller's batch)."""
        if self._closed:
            return
        for step in (self._do_snapshot, self._cleanup):
            try:
                step()
            except Exception:
                logger.warning(
                    "Error in state maintenance (%s) of %r", step.__name__, self, exc_info=True
                )
        try:
            remove_stale_temp_files(self.directory)
        except OSError:
            logger.warning("Error removing stale temp files of %r", self, exc_info=True)

    def _do_snapshot(self) -> None:
        listing = self.list_files()
        last = listing.latest_version
        if last == 0 or last in listing.snapshots:
            return
        start, paths = files_for_version(listing, last, repr(self))
        if last - start <= self.conf.min_deltas_for_snapshot:
            return
        # the files it is built from, as read: a retried batch may rewrite them meanwhile
        sources: dict[str, object] = {path: file_identity(path) for path in paths}
        writer = StateFileWriter(
            self._path(last, SNAPSHOT), SNAPSHOT, self.conf.compression, store=self.store_id
        )
        try:
            for key, value in open_version_with_fallback(
                listing, last, repr(self), self.conf.fan_in, allow_pickle=self.allow_pickle,
                store=self.store_id,
            ):  # fmt: skip
                writer.write(key, value)
        except BaseException:
            writer.cancel()
            raise
        self._publish_snapshot(writer, last, sources)

    def _publish_snapshot(
        self, writer: StateFileWriter, version: int, sources: dict[str, object]
    ) -> bool:
        """Commit ``writer`` (``version``'s snapshot) only while the files it was built from
        are the ones it read (``sources``: path -> :func:`file_identity`).

        Checked before the rename, and again after it: a file replaced in between (a retried
        batch re-committing the version) makes this remove the snapshot it published, so a
        stale snapshot never outlives the check. A re-commit removes the snapshot itself after
        publishing its delta, which covers a rename after this second check. Returns whether
        the snapshot stayed."""
        if any(file_identity(path) != seen for path, seen in sources.items()):
            writer.cancel()
            logger.info(
                "Not writing snapshot %d for %r: its files changed while it was built",
                version,
                self,
            )
            return False
        stats = writer.commit()
        if any(file_identity(path) != seen for path, seen in sources.items()):
            self._remove_stale_snapshot(version)
            logger.info(
                "Removed snapshot %d of %r: its files changed while it was published", version, self
            )
            return False
        logger.info("Wrote snapshot of version %d (%d keys) for %r", version, stats.records, self)
        return True

    def _cleanup(self) -> None:
        listing = self.list_files()
        earliest = listing.latest_version - self.conf.min_versions_to_retain
        if earliest <= 0:
            return
        start, _paths = files_for_version(listing, earliest, repr(self))
        anchor = start if start in listing.snapshots else 1
        doomed = [path for v, path in listing.deltas.items() if v < anchor]
        doomed += [path for v, path in listing.snapshots.items() if v < anchor]
        for path in sorted(doomed):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        if doomed:
            logger.info(
                "Deleted files older than version %d for %r: %s", anchor, self, sorted(doomed)
            )

    # ------------------------------------------------------------------ metrics
    @property
    def metrics(self) -> StateStoreMetrics:
        """Keys and encoded bytes of the current version, cache memory, hits and misses."""
        with self._lock:
            return StateStoreMetrics(
                num_keys=self._current_keys,
                memory_used_bytes=self._cache.memory_used,
                state_on_current_version_size_bytes=self._current_bytes,
                loaded_map_cache_hit_count=self._cache.hits,
                loaded_map_cache_miss_count=self._cache.misses,
            )

    @property
    def cached_versions(self) -> list[int]:
        """Versions currently cached in storage memory."""
        return self._cache.versions

    def close(self) -> None:
        """Drop the cached versions (freeing their storage memory). Idempotent."""
        with self._lock:
            self._cache.clear()
            self._closed = True


_MISSING = object()


#: live records of a version (no deletes), closable
def _first(item: tuple[bytes, Any, Any]) -> bytes:
    return item[0]


def _apply(
    base: dict[Any, Any], changes: dict[Any, tuple[bytes, bytes | None, Any]]
) -> dict[Any, Any]:
    mapping = dict(base)
    for key, (_key_bytes, value_bytes, value) in changes.items():
        if value_bytes is None:
            mapping.pop(key.key if isinstance(key, RemovedKey) else key, None)
        else:
            mapping[key] = value
    return mapping


def _count_delta(base: dict[Any, Any], changes: dict[Any, tuple[bytes, bytes | None, Any]]) -> int:
    delta = 0
    # stored keys removed and put again as equal keys with other bytes: one key out, and the
    # equal key put is a new one
    replaced = [key.key for key in changes if isinstance(key, RemovedKey)]
    for key, (_key_bytes, value_bytes, _value) in changes.items():
        if isinstance(key, RemovedKey):
            delta -= 1
            continue
        in_base = key in base and not any(key is other or key == other for other in replaced)
        if value_bytes is None and in_base:
            delta -= 1
        elif value_bytes is not None and not in_base:
            delta += 1
    return delta

"""Sorted record streams: a version as a merge of its snapshot and deltas, without loading it.

Every state file is in ascending encoded-key order (``stable_hash`` first), so the state at a
version is the k-way merge of its files, oldest first, where a later record of a key overrides
an earlier one and a delete drops it. Keys compare as Python compares them (``1``, ``1.0`` and
``True`` are one key, as in a dict): records with the same hash but different bytes are decoded
and replayed like dict operations, so the stream equals the dict a replay would build.

The streams hold one buffered chunk per open file and one hash group: memory is bounded by the
number of files, which :func:`open_version` caps at ``fan_in`` by merging in passes through
temporary snapshot files.
"""

from __future__ import annotations

import heapq
import logging
import os
from collections.abc import Collection, Generator, Iterable, Iterator, Sequence

from extagg._config import DEFAULT_FAN_IN
from extagg.errors import CorruptFileError
from extagg.spill.tempdir import SpillDirs
from extagg.state.codec import decode_key, decode_value
from extagg.state.errors import StateFileNotFoundError, StateStoreError, UnexpectedVersionError
from extagg.state.files import SNAPSHOT, StateFileListing, StateFileReader, StateFileWriter

__all__ = [
    "Record",
    "merge_records",
    "deletes_first",
    "files_for_version",
    "open_version",
    "open_version_with_fallback",
    "fallback_chain",
    "missing_file_error",
    "LiveRecords",
    "VersionFiles",
]

logger = logging.getLogger(__name__)

#: (encoded key, encoded value or None for a delete)
Record = tuple[bytes, "bytes | None"]

#: A version's live (encoded key, encoded value) records, in file order
LiveRecords = Generator[tuple[bytes, bytes], None, None]


def _tagged(records: Iterable[Record], age: int) -> Iterator[tuple[bytes, int, bytes | None]]:
    for key, value in records:
        yield key, age, value


def _replay_group(
    group: list[tuple[bytes, int, bytes | None]], sources: Sequence[Iterable[Record]]
) -> list[tuple[bytes, bytes]]:
    """Resolve one hash group whose records differ in bytes: replay them as dict operations.

    A key that cannot be decoded raises :class:`CorruptFileError` naming its source's file."""
    entries: list[list] = []  # [key object, key bytes, value bytes or None (deleted)]
    # oldest first; in one file, deletes before puts (a batch that removed a key and put an
    # equal one with other bytes: the new key object wins, whatever the bytes' order)
    for key_bytes, age, value in sorted(group, key=lambda item: (item[1], item[2] is not None)):
        try:
            key = decode_key(key_bytes)
        except ValueError as exc:
            path = getattr(sources[age], "path", None)
            if path is None:
                raise
            raise _undecodable(path, key_bytes, exc) from None
        for entry in entries:
            if entry[1] == key_bytes or entry[0] == key:
                if value is not None and entry[2] is None:  # re-inserted: the new key object
                    entry[0], entry[1] = key, key_bytes
                entry[2] = value
                break
        else:
            entries.append([key, key_bytes, value])
    return sorted((entry[1], entry[2]) for entry in entries if entry[2] is not None)


def deletes_first(records: Iterable[Record]) -> Iterator[Record]:
    """One file's records with, among those of one hash, the deletes first.

    A batch that removed a stored key and put an equal key with other bytes (``True``, then
    ``1``) writes the delete of the old bytes and the put of the new: replayed in this order,
    the new key object replaces the old one, as in a dict, whatever the order of the bytes."""
    pending: list[Record] = []
    prefix = b""
    for record in records:
        if record[0][:8] != prefix:
            if len(pending) > 1:
                pending.sort(key=_is_put)
            yield from pending
            pending = []
            prefix = record[0][:8]
        pending.append(record)
    if len(pending) > 1:
        pending.sort(key=_is_put)
    yield from pending


def _is_put(record: Record) -> bool:
    return record[1] is not None


def merge_records(sources: Sequence[Iterable[Record]]) -> Iterator[tuple[bytes, bytes]]:
    """The live ``(key, value)`` records of sorted ``sources`` (oldest first), later ones winning.

    Deletes are applied and dropped, so the first source must be a base (a snapshot or the
    first delta): nothing older may hold keys.
    """
    if not sources:
        return
    if len(sources) == 1:
        for key, value in sources[0]:
            if value is not None:
                yield key, value
        return
    merged = heapq.merge(*(_tagged(source, age) for age, source in enumerate(sources)))
    pending = next(merged, None)
    if pending is None:
        return
    group: list[tuple[bytes, int, bytes | None]] = []
    for item in merged:
        if item[0][:8] != pending[0][:8]:
            if group:
                group.append(pending)
                yield from _resolve(group, sources)
                group = []
            elif pending[2] is not None:
                yield pending[0], pending[2]
        else:
            group.append(pending)
        pending = item
    if group:
        group.append(pending)
        yield from _resolve(group, sources)
    elif pending[2] is not None:
        yield pending[0], pending[2]


def _resolve(
    group: list[tuple[bytes, int, bytes | None]], sources: Sequence[Iterable[Record]]
) -> list[tuple[bytes, bytes]]:
    first = group[0][0]
    if all(item[0] == first for item in group):
        value = group[-1][2]  # sorted by (key, age): the newest record wins
        return [] if value is None else [(first, value)]
    return _replay_group(group, sources)


def _undecodable(path: str, key: bytes, exc: ValueError) -> CorruptFileError:
    what = f"key hash 0x{key[:8].hex()}" if len(key) >= 8 else f"key {key.hex()}"
    return CorruptFileError(path, None, f"the record with {what} cannot be decoded: {exc}")


class VersionFiles:
    """The files a version's stream reads (filled in when it opens them), to name the file a
    record that cannot be decoded came from.

    A merged stream does not say which file each record came from (that would cost every
    record); after a decode error :meth:`corrupt` finds it by scanning the files, newest first,
    for the record's key: the newest file holding a key is the one whose record was read.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.paths: list[str] = []

    def locate(self, key: bytes) -> str | None:
        """The newest of :attr:`paths` holding a record of ``key`` (None: none readable does)."""
        for path in reversed(self.paths):
            try:
                with StateFileReader(path) as reader:
                    for record_key, _value in reader:
                        if record_key >= key:
                            if record_key == key:
                                return path
                            break
            except (OSError, ValueError):  # unreadable itself: not the one to name
                continue
        return None

    def corrupt(self, exc: ValueError, key: bytes) -> CorruptFileError:
        """The error for ``exc``, met decoding the record of ``key`` (``exc`` itself when it is
        already a :class:`CorruptFileError`)."""
        if isinstance(exc, CorruptFileError):
            return exc
        return _undecodable(self.locate(key) or self.directory, key, exc)


def missing_file_error(path: str, label: str, kind: str = "delta") -> StateFileNotFoundError:
    """Spark's CANNOT_READ_DELTA_FILE_NOT_EXISTS error for a missing state file."""
    return StateFileNotFoundError(
        f"[CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS] Error reading {kind} file "
        f"{path} of {label}: {path} does not exist.",
        path=path,
        error_class="CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS",
    )


def files_for_version(
    listing: StateFileListing,
    version: int,
    label: str,
    start_version: int = 0,
    skip: Collection[int] = (),
) -> tuple[int, list[str]]:
    """The files that rebuild ``version``: the newest snapshot at or below it, then the deltas.

    With ``start_version`` > 0 the chain starts at that version's state instead (the caller
    holds it, e.g. cached): returns ``(base, paths)`` where ``base`` is the version the first
    path's records apply to (0 or the start version) or the snapshot's own version.
    Snapshots of the versions in ``skip`` (found corrupt) are not used.
    Raises :class:`StateFileNotFoundError` naming the first missing delta.
    """
    if version < 0:
        raise UnexpectedVersionError(
            f"[CANNOT_LOAD_STATE_STORE.UNEXPECTED_VERSION] Version cannot be less than 0: "
            f"{version} for {label}",
            version=version,
        )
    if version > listing.latest_version:
        error = missing_file_error(os.path.join(listing.directory, f"{version}.delta"), label)
        error.args = (f"{error.args[0]} The latest version is {listing.latest_version}.",)
        raise error
    snapshot = max(
        (v for v in listing.snapshots if start_version < v <= version and v not in skip),
        default=None,
    )
    base = start_version if snapshot is None else snapshot
    paths = [] if snapshot is None else [listing.snapshots[snapshot]]
    for delta_version in range(base + 1, version + 1):
        path = listing.deltas.get(delta_version)
        if path is None:
            path = os.path.join(listing.directory, f"{delta_version}.delta")
            error = missing_file_error(path, label)
            oldest = min((v for v in listing.snapshots if v not in skip), default=None)
            if snapshot is None and oldest is not None and version < oldest:
                # the files before the oldest snapshot are gone: maintenance removed them
                error.args = (
                    f"{error.args[0]} Version {version} is older than the oldest snapshot, "
                    f"{oldest}: maintenance removed the files before it (it keeps "
                    f"min_versions_to_retain versions); the earliest version readable is "
                    f"{oldest} (batch {oldest - 1}).",
                )
            raise error
        paths.append(path)
    return base, paths


def _open_reader(path: str, label: str, store: str | None) -> StateFileReader:
    try:
        return StateFileReader(path, label=label, store=store)
    except FileNotFoundError:
        kind = "snapshot" if path.endswith(".snapshot") else "delta"
        raise missing_file_error(path, label, kind) from None


def open_version(
    paths: Sequence[str], label: str, fan_in: int = DEFAULT_FAN_IN, *, store: str | None = None
) -> Generator[tuple[bytes, bytes], None, None]:
    """Stream the live records of the version built from ``paths`` (base first); ``store``:
    the store id their headers must name (see :class:`StateFileReader`).

    More than ``fan_in`` files are merged in passes: the oldest ``fan_in`` into a temporary
    snapshot in the spill directories (``EXTAGG_SPILL_DIR`` or the system temp dir, see
    :mod:`extagg.spill.tempdir`), which then counts as the base. The temporary files are removed
    when the stream ends, fails or is closed.
    """
    if fan_in < 2:
        raise ValueError(f"fan_in must be at least 2, got {fan_in}")
    paths = list(paths)
    spill = SpillDirs() if len(paths) > fan_in else None
    readers: list[StateFileReader] = []
    try:
        while len(paths) > fan_in:
            assert spill is not None
            merged_path = spill.new_path("state-pass")
            writer = StateFileWriter(merged_path, SNAPSHOT, compression="lz4")
            try:
                for path in paths[:fan_in]:
                    readers.append(_open_reader(path, label, store))
                for key, value in merge_records(readers):
                    writer.write(key, value)
                writer.commit()
            except BaseException:
                writer.cancel()
                raise
            finally:
                for reader in readers:
                    reader.close()
                readers = []
            logger.debug("merged %d state files of %s into %s", fan_in, label, merged_path)
            if paths[0] in spill.files:  # the previous pass's file has been consumed
                spill.remove(paths[0])
            paths = [merged_path, *paths[fan_in:]]
        for path in paths:
            readers.append(_open_reader(path, label, store))
        yield from merge_records(readers)
    finally:
        for reader in readers:
            reader.close()
        if spill is not None:
            spill.cleanup()


def fallback_chain(
    listing: StateFileListing,
    version: int,
    label: str,
    from_version: int,
    skip: set[int],
    exc: CorruptFileError,
) -> tuple[int, list[str]] | None:
    """After ``exc`` in a snapshot: the files that rebuild ``version`` without it (an older
    snapshot, or none, plus deltas), or None when the corrupt file is not a snapshot or the
    deltas an older chain needs are gone. ``skip`` collects the snapshots found corrupt."""
    bad = next((v for v, path in listing.snapshots.items() if path == exc.path), None)
    if bad is None or bad in skip:
        return None
    skip.add(bad)
    try:
        start, paths = files_for_version(listing, version, label, from_version, skip)
    except StateStoreError:
        return None
    logger.warning(
        "Snapshot %s of %s is corrupt (%s): rebuilding version %d from %s and deltas "
        "%d..%d instead",
        exc.path,
        label,
        exc.reason,
        version,
        f"the snapshot of version {start}" if start in listing.snapshots else "nothing",
        start + 1,
        version,
    )
    return start, paths


def open_version_with_fallback(
    listing: StateFileListing,
    version: int,
    label: str,
    fan_in: int = DEFAULT_FAN_IN,
    *,
    allow_pickle: bool = False,
    files: VersionFiles | None = None,
    store: str | None = None,
) -> LiveRecords:
    """:func:`open_version` of the files that rebuild ``version``, its first record already
    read and decoded (a check; ``allow_pickle`` as the operator's): a snapshot whose header,
    first block or first record is corrupt is passed over for an older chain when one exists
    (with a warning), so one damaged snapshot does not make a version that its deltas still hold
    unreadable. Damage found later in the stream raises, as rows have gone out. ``files``, when
    given, receives the paths of the chain read; ``store`` as for :func:`open_version`.
    """
    skip: set[int] = set()
    _start, paths = files_for_version(listing, version, label)
    if files is None:
        files = VersionFiles(listing.directory)
    while True:
        files.paths = list(paths)
        records = open_version(paths, label, fan_in, store=store)
        try:
            _check_small_snapshot(paths, label, store)
            first = next(records, None)
            if first is not None:
                try:
                    decode_key(first[0])
                    decode_value(first[1], allow_pickle)
                except ValueError as exc:
                    raise files.corrupt(exc, first[0]) from None
        except CorruptFileError as exc:
            records.close()
            chain = fallback_chain(listing, version, label, 0, skip, exc)
            if chain is None:
                raise
            _start, paths = chain
            continue
        return _chained(first, records)


#: a snapshot of at most this many bytes that starts a chain is read through once before its
#: records go out: damage anywhere in it (a truncated end) then falls back to an older chain,
#: as the provider's ``get_store`` does, instead of raising after rows have gone out
SMALL_SNAPSHOT_BYTES = 4 << 20


def _check_small_snapshot(paths: Sequence[str], label: str, store: str | None) -> None:
    """Read the chain's snapshot through (all its checks) if it is small; raises
    :class:`~extagg.errors.CorruptFileError` where it is damaged."""
    if not paths or not paths[0].endswith(".snapshot"):
        return
    try:
        if os.path.getsize(paths[0]) > SMALL_SNAPSHOT_BYTES:
            return
    except OSError:
        return  # opening it says what is wrong
    with _open_reader(paths[0], label, store) as reader:
        for _record in reader:
            pass


def _chained(first: tuple[bytes, bytes] | None, rest: LiveRecords) -> LiveRecords:
    """``first`` (unless None: the stream was empty) followed by ``rest``; closing it closes
    ``rest``."""
    try:
        if first is not None:
            yield first
        yield from rest
    finally:
        rest.close()

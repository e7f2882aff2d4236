"""Atomic files: a temp file in the same directory, flushed, fsynced, renamed into place.

The temp file ``.<name>.<host>-<pid>-<uuid>.tmp`` is created only when the first bytes are
written, so a store that is only read creates nothing. A failed or cancelled write deletes it;
a writer killed outright leaves it behind, and :func:`remove_stale_temp_files` (run when a
provider opens a directory and by maintenance) deletes the temp files of dead writers. A
re-commit replaces the old file (``os.replace``); the directory is fsynced after the rename and
the renamed file's existence is checked (SPARK-18342, SPARK-40826).

Writers can be fenced: ``commit(expected=...)`` publishes only if the final name is still in the
state the writer saw when it started — absent (``None``: the file is created with ``os.link``,
which fails if the name exists, as HDFS's ``create(overwrite=false)`` does) or the very file it
saw (a :func:`file_identity`; checked just before the rename). Otherwise :class:`FencedError`
(a ``FileExistsError``) is raised and nothing is published.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import BinaryIO

from extagg._sysinfo import pid_namespace

__all__ = [
    "AtomicFile",
    "atomic_open",
    "FencedError",
    "file_identity",
    "remove_stale_temp_files",
    "STALE_TEMP_SECONDS",
    "ANY",
]

logger = logging.getLogger(__name__)

_TEMP_SUFFIX = ".tmp"
#: this host and PID namespace, as temp file names give them: a writer in a container sharing
#: the host name judged another's live temp files by pids that mean nothing here
_HOST = (socket.gethostname().replace(".", "_").replace("-", "_") or "host") + (
    f"_ns{pid_namespace()}" if pid_namespace() else ""
)
#: temp files older than this are removed even when their writer cannot be checked (other host)
STALE_TEMP_SECONDS = 24 * 3600

_active_temp_files: set[str] = set()
_active_lock = threading.Lock()

#: ``commit(expected=ANY)``: replace whatever is there (no fencing)
ANY = object()
#: link(2) errors meaning "this filesystem has no hard links", not "the name exists"
_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK}

FileIdentity = tuple[int, int, int, int]


class FencedError(FileExistsError):
    """Another writer published the file first (or replaced the one this writer saw)."""


def file_identity(path: str | os.PathLike[str]) -> FileIdentity | None:
    """What distinguishes the file now at ``path`` from any later one (``None``: no file)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _fsync_directory(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicFile:
    """A file that appears under its final name only when :meth:`commit` succeeds.

    The temp file is created lazily on the first :meth:`write` (or by :meth:`commit` for an empty
    file). :meth:`cancel` (also on any failure inside :meth:`commit`) removes it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.directory = os.path.dirname(os.path.abspath(self.path))
        self.temp_path: str | None = None
        self._handle: BinaryIO | None = None
        self.bytes_written = 0
        self.closed = False

    def _open(self) -> BinaryIO:
        if self.closed:
            raise ValueError(f"atomic file {self.path} is already committed or cancelled")
        if self._handle is None:
            name = os.path.basename(self.path)
            temp = os.path.join(
                self.directory, f".{name}.{_HOST}-{os.getpid()}-{uuid.uuid4().hex}{_TEMP_SUFFIX}"
            )
            with _active_lock:
                _active_temp_files.add(temp)
            try:
                self._handle = open(temp, "xb")  # noqa: SIM115 - closed by commit/cancel
            except BaseException:
                with _active_lock:
                    _active_temp_files.discard(temp)
                raise
            self.temp_path = temp
        return self._handle

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data`` to the temp file (creating it on first use)."""
        handle = self._open()
        try:
            handle.write(data)
        except OSError as exc:
            self.cancel()
            raise _describe_os_error(exc, self.directory, len(data)) from exc
        self.bytes_written += len(data)

    def commit(self, expected: object = ANY) -> None:
        """Flush, fsync, close and rename the temp file over :attr:`path`; then fsync the dir.

        ``expected``: :data:`ANY` replaces any file; ``None`` publishes only if there is none;
        a :func:`file_identity` only if that file is still there (else :class:`FencedError`).
        """
        try:
            handle = self._open()
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
            temp = self.temp_path
            assert temp is not None
            if expected is None:
                self._link_new(temp)
            else:
                if expected is not ANY and file_identity(self.path) != expected:
                    raise FencedError(
                        errno.EEXIST,
                        f"{self.path} was replaced by another writer since this one started",
                        self.path,
                    )
                os.replace(temp, self.path)
            if not os.path.exists(self.path):  # SPARK-40826: never assume a rename worked
                raise OSError(errno.ENOENT, f"{self.path} does not exist after renaming")
        except BaseException as exc:
            self.cancel()
            if isinstance(exc, OSError) and not isinstance(exc, FencedError):
                raise _describe_os_error(exc, self.directory, self.bytes_written) from exc
            raise
        self._forget_temp()
        self.closed = True
        _fsync_directory(self.directory)

    def _link_new(self, temp: str) -> None:
        """Publish ``temp`` as :attr:`path` only if no file has that name (atomic)."""
        try:
            os.link(temp, self.path)
        except FileExistsError:
            raise FencedError(
                errno.EEXIST, f"{self.path} was created by another writer first", self.path
            ) from None
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
            # no hard links here: check, then rename (a narrow race remains on such filesystems)
            if os.path.lexists(self.path):
                raise FencedError(
                    errno.EEXIST, f"{self.path} was created by another writer first", self.path
                ) from None
            os.replace(temp, self.path)
            return
        os.unlink(temp)

    def cancel(self) -> None:
        """Close and delete the temp file; the final file is left as it was. Idempotent."""
        handle, self._handle = self._handle, None
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()
        if self.temp_path is not None:
            try:
                os.unlink(self.temp_path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.warning("Error deleting temp file %s: %s", self.temp_path, exc)
        self._forget_temp()
        self.closed = True

    def _forget_temp(self) -> None:
        if self.temp_path is not None:
            with _active_lock:
                _active_temp_files.discard(self.temp_path)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """The binary temp file of an :class:`AtomicFile` for ``path``, for writers that need a
    real file (Parquet writers, text wrappers): committed when the block ends normally,
    removed if it raises."""
    atomic = AtomicFile(path)
    try:
        yield atomic._open()
    except BaseException:
        atomic.cancel()
        raise
    atomic.commit()


def _describe_os_error(exc: OSError, directory: str, size: int) -> OSError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return OSError(
            exc.errno,
            f"no space left in {directory} while writing a state file ({size} bytes so far)",
        )
    return exc


def remove_stale_temp_files(directory: str | os.PathLike[str]) -> list[str]:
    """Remove temp files left in ``directory`` by writers that died (killed mid-commit).

    A temp file of this host is stale when its process is gone; one of another host when it is
    older than :data:`STALE_TEMP_SECONDS`. Returns the removed paths.
    """
    directory = os.fspath(directory)
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    now = time.time()
    for name in names:
        if not (name.startswith(".") and name.endswith(_TEMP_SUFFIX)):
            continue
        path = os.path.join(directory, name)
        with _active_lock:
            if path in _active_temp_files:
                continue
        owner = name[: -len(_TEMP_SUFFIX)].rsplit(".", 1)[-1].split("-")
        stale = False
        if len(owner) == 3 and owner[0] == _HOST and owner[1].isdigit():
            pid = int(owner[1])
            stale = pid == os.getpid() or not _process_alive(pid)
        if not stale:
            try:
                stale = now - os.stat(path).st_mtime > STALE_TEMP_SECONDS
            except FileNotFoundError:
                continue
        if stale:
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            removed.append(path)
    if removed:
        logger.info("Removed %d stale temp file(s) in %s: %s", len(removed), directory, removed)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

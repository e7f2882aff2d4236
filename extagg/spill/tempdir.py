"""Spill directories: where run files live, and making sure they go away.

Each process gets its own subdirectory ``extagg-<pid>-<start>-<host>`` in every spill directory
(``<start>``: the process's start time in hundredths of a second since the epoch; ``<host>``: 8 hex
digits of a stable hash of the host name and the PID namespace), so concurrent jobs on one machine
never share files and a folder names the exact process that owns it — and a process judges only
the folders of its own namespace (a container sharing the host name and the disk is "another
host": its pids are not ours). Directories come from the ``spill_dirs`` argument,
else ``EXTAGG_SPILL_DIR`` (several separated by ``os.pathsep``), else Spark's ``SPARK_LOCAL_DIRS``
(so engines inside a Spark task spill where Spark does), else the system temp directory;
files are handed out round-robin across them. Every file is tracked by the :class:`SpillDirs`
that created it and removed by :meth:`SpillDirs.cleanup`.

Nothing is left behind, even by a process killed with SIGKILL:

* the per-process folder is created lazily, with the first spill file, and removed as soon as the
  last file in it is (so a forked worker that exits through ``os._exit`` leaves nothing), and at
  interpreter exit;
* the first time a process uses a spill directory it removes the folders of this host's extagg
  processes that are gone — their pid no longer exists, or it was reused (the process with that
  pid started at another time) — as Spark's ``DiskBlockManager`` cleans its own;
* a forked child re-derives its folder (``os.register_at_fork``): it never writes into, nor
  removes, its parent's.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import re
import secrets
import shutil
import socket
import stat
import threading
import weakref
import zlib
from collections.abc import Sequence
from pathlib import Path

import psutil

from extagg._config import default_spill_dirs, env_size
from extagg._sysinfo import pid_namespace
from extagg.errors import SpillError

__all__ = [
    "SpillDirs",
    "resolve_spill_dirs",
    "note_run_id",
    "expected_run_id",
    "forget_run_id",
    "owner_gone",
    "process_dir_name",
    "remove_orphans",
    "remove_process_dirs",
]

log = logging.getLogger(__name__)

#: (pid, base) -> this process's folder in ``base``; and how many tracked files each folder holds
_process_dirs: dict[tuple[int, str], str] = {}
_dir_files: dict[str, int] = {}
#: bases whose orphans this process has removed already
_swept: set[str] = set()
_process_lock = threading.RLock()  # re-entrant: a finaliser may remove files mid-call
#: the PID whose folders :func:`remove_process_dirs` removed for good (the process is leaving):
#: a thread still spilling then gets an error instead of making its folder again
_left_pid = 0
#: run-file path -> the random id its writer put in its header (see extagg.spill.runfile)
_run_ids: dict[str, bytes] = {}
_run_ids_lock = threading.RLock()
#: every SpillDirs of this process, so a forked child can disown its parent's files
_owners: weakref.WeakSet[SpillDirs] = weakref.WeakSet()

_FOLDER_RE = re.compile(r"^extagg-(\d+)-(\d+)-([0-9a-f]{8})$")
#: folders of extagg before start times were recorded: ``extagg-<pid>-<8 hex>``
_LEGACY_FOLDER_RE = re.compile(r"^extagg-(\d+)-([0-9a-f]{8})$")


def _host_tag() -> str:
    """8 hex digits of the host name and the PID namespace (see the module docstring): a
    process in another namespace of this host removed a live run's folder, its pid unknown
    here."""
    namespace = pid_namespace()
    ident = socket.gethostname() + (f"/pid:{namespace}" if namespace else "")
    return f"{zlib.crc32(ident.encode()):08x}"


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started, in hundredths of a second; None if there is no such process."""
    try:
        return round(psutil.Process(pid).create_time() * 100)
    except psutil.NoSuchProcess:
        return None


def process_dir_name(pid: int | None = None) -> str:
    """The name of process ``pid``'s (default: this one's) folder in a spill directory."""
    pid = os.getpid() if pid is None else pid
    start = _start_time(pid)
    if start is None:
        raise ValueError(f"no process {pid}")
    return f"extagg-{pid}-{start}-{_host_tag()}"


def _is_orphan(name: str, host: str) -> bool:
    match = _FOLDER_RE.match(name)
    if match is not None:
        pid, start, tag = int(match[1]), int(match[2]), match[3]
        if tag != host:  # another machine's (a shared disk): its processes are not ours to judge
            return False
        try:
            actual = _start_time(pid)
        except psutil.Error:  # cannot tell (access denied): keep it
            return False
        # psutil rounds the boot time: allow a hundredth of a second either way
        return actual is None or abs(actual - start) > 1
    legacy = _LEGACY_FOLDER_RE.match(name)
    return legacy is not None and not psutil.pid_exists(int(legacy[1]))


def owner_gone(name: str) -> bool:
    """Whether the process a :func:`process_dir_name` names (``extagg-<pid>-<start>-<host>``)
    is gone: of this host and PID namespace, and no longer running (its pid free, or reused
    by a process that started at another time). Others' are never judged gone."""
    return _is_orphan(name, _host_tag())


def remove_orphans(base: str | os.PathLike[str]) -> list[str]:
    """Remove the folders in ``base`` of this host's extagg processes that no longer exist.

    Returns the paths removed. Called once per process and spill directory, on first use.
    """
    base = os.fspath(base)
    host = _host_tag()
    removed: list[str] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith("extagg-") or not entry.is_dir(follow_symlinks=False):
            continue
        if _is_orphan(entry.name, host):
            shutil.rmtree(entry.path, ignore_errors=True)
            if not os.path.exists(entry.path):
                removed.append(entry.path)
    if removed:
        log.info(
            "Removed %d spill folder(s) of extagg processes that are gone from %s: %s",
            len(removed),
            base,
            ", ".join(os.path.basename(p) for p in removed),
        )
    return removed


def note_run_id(path: str, run_id: bytes) -> None:
    """Remember that the run file at ``path`` must carry ``run_id`` (until it is removed)."""
    with _run_ids_lock:
        _run_ids[os.path.abspath(path)] = run_id


def expected_run_id(path: str) -> bytes | None:
    """The id the run file at ``path`` was written with in this process, if it was."""
    with _run_ids_lock:
        return _run_ids.get(os.path.abspath(path))


def forget_run_id(path: str) -> None:
    with _run_ids_lock:
        _run_ids.pop(os.path.abspath(path), None)


def resolve_spill_dirs(dirs: Sequence[str | os.PathLike[str]] | str | None = None) -> list[str]:
    """The base spill directories: argument > ``EXTAGG_SPILL_DIR`` > ``SPARK_LOCAL_DIRS`` > temp."""
    if isinstance(dirs, (str, os.PathLike)):
        dirs = [dirs]
    if not dirs:
        dirs = default_spill_dirs()
    return [os.path.abspath(os.fspath(d)) for d in dirs]


def _acquire_subdir(base: str) -> str:
    """This process's folder in ``base`` (created now if needed), counted as holding one more
    file until :func:`_release_subdir`."""
    pid = os.getpid()
    with _process_lock:
        path = _process_dirs.get((pid, base))
        if path is None or not os.path.isdir(path):
            if pid == _left_pid:
                raise SpillError(f"cannot spill to {base}: the process is stopping", directory=base)
            if os.path.exists(base) and not os.path.isdir(base):
                raise SpillError(
                    f"cannot spill to {base}: it is not a directory",
                    directory=base,
                    errno=errno.ENOTDIR,
                )
            try:
                os.makedirs(base, exist_ok=True)
                if base not in _swept:
                    _swept.add(base)
                    remove_orphans(base)
                path = os.path.join(base, process_dir_name(pid))
                _make_private_dir(path)
            except OSError as exc:
                raise SpillError(
                    f"cannot create a spill directory under {base}: {exc.strerror or exc}",
                    directory=base,
                    errno=exc.errno,
                ) from exc
            _process_dirs[(pid, base)] = path
        _dir_files[path] = _dir_files.get(path, 0) + 1
        return path


def _make_private_dir(path: str) -> None:
    """Create ``path`` readable by this user only (0700: spills hold the user's data, and the
    merge unpickles the generic engine's runs), or accept it if it is already this user's
    private folder. A folder of that name made by someone else — the name is predictable, and
    the system temp directory is shared — is refused: its owner could read the spills, or put
    a forged run in place of one."""
    try:
        os.mkdir(path, 0o700)
        return
    except FileExistsError:
        pass
    st = os.lstat(path)
    owner = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != owner:
        raise SpillError(
            f"spill folder {path} already exists and is not a folder of this user (owner uid "
            f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): refusing to spill there",
            directory=os.path.dirname(path),
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)


def _release_subdir(path: str) -> None:
    """One file fewer in folder ``path``; the folder goes when it holds none."""
    with _process_lock:
        left = _dir_files.get(path, 0) - 1
        if left > 0:
            _dir_files[path] = left
            return
        _dir_files.pop(path, None)
        for key, value in list(_process_dirs.items()):
            if value == path:
                del _process_dirs[key]
        try:
            os.rmdir(path)
        except OSError:  # not empty (a file someone else put there) or already gone
            pass


def _after_fork_in_child() -> None:
    """A forked child owns none of its parent's folders or files: start afresh (new locks too,
    in case another thread of the parent held one at the fork)."""
    global _process_lock, _run_ids_lock
    _process_lock = threading.RLock()
    _run_ids_lock = threading.RLock()
    _process_dirs.clear()
    _dir_files.clear()
    _swept.clear()
    _run_ids.clear()
    for owner in list(_owners):
        owner._disown()


os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _remove_process_dirs() -> None:
    remove_process_dirs()


def remove_process_dirs(*, leaving: bool = False) -> None:
    """Remove this process's spill subdirectories (at exit; or before an ``os._exit``).
    ``leaving``: the process is about to ``os._exit`` while other threads may still spill;
    none of them makes its folder again."""
    global _left_pid
    pid = os.getpid()
    if leaving:
        _left_pid = pid
    for (owner, _base), path in list(_process_dirs.items()):
        if owner == pid:
            shutil.rmtree(path, ignore_errors=True)


class SpillDirs:
    """Hands out run-file paths round-robin across directories and removes them again.

    ``max_spill_bytes`` (or ``EXTAGG_MAX_SPILL_BYTES``) caps the bytes this owner may have on disk
    at once; exceeding it raises :class:`~extagg.errors.SpillError` before writing more.
    """

    def __init__(
        self,
        dirs: Sequence[str | os.PathLike[str]] | str | None = None,
        *,
        max_spill_bytes: int | None = None,
    ) -> None:
        self.dirs = resolve_spill_dirs(dirs)
        self.max_spill_bytes = (
            max_spill_bytes
            if max_spill_bytes is not None
            else env_size("EXTAGG_MAX_SPILL_BYTES", None)
        )
        self._next = 0
        #: the directories a write found full (left out of the rotation while others are not)
        self._full: set[str] = set()
        self._files: dict[str, int] = {}
        self._lock = threading.Lock()
        _owners.add(self)

    def _disown(self) -> None:
        """In a forked child: the files tracked so far are the parent's, not ours to remove."""
        self._lock = threading.Lock()
        self._files = {}

    def new_path(self, prefix: str = "run", suffix: str = ".run") -> str:
        """A fresh file path in the next directory; the file is tracked until removed."""
        with self._lock:
            base = self.dirs[self._next % len(self.dirs)]
            self._next += 1
            for _ in range(len(self.dirs) - 1):
                if os.fspath(base) not in self._full:
                    break
                base = self.dirs[self._next % len(self.dirs)]
                self._next += 1
            path = os.path.join(_acquire_subdir(base), f"{prefix}-{secrets.token_hex(8)}{suffix}")
            self._files[path] = 0
            return path

    def set_aside_full(self, path: str, error: BaseException) -> bool:
        """After ``error`` writing ``path``: if it is a full disk (or quota) and another of
        the directories is not known full, leave ``path``'s directory out of the rotation
        and return True (write again elsewhere); else False."""
        if getattr(error, "errno", None) not in (errno.ENOSPC, errno.EDQUOT):
            return False
        full = self.directory_of(path)
        with self._lock:
            self._full.add(full)
            if all(os.fspath(d) in self._full for d in self.dirs):
                return False
        log.warning("spill directory %s is full; spilling to the others", full)
        return True

    def charge(self, path: str, num_bytes: int) -> None:
        """Record ``num_bytes`` more written to ``path``; enforce the spill cap."""
        with self._lock:
            if self.max_spill_bytes is not None:
                total = sum(self._files.values()) + num_bytes
                if total > self.max_spill_bytes:
                    raise SpillError(
                        f"spill cap exceeded: writing {num_bytes} more bytes to {path} would put "
                        f"{total} bytes on disk, over max_spill_bytes={self.max_spill_bytes}",
                        directory=self.directory_of(path),
                        bytes_needed=num_bytes,
                    )
            self._files[path] = self._files.get(path, 0) + num_bytes

    @staticmethod
    def directory_of(path: str) -> str:
        """The base spill directory that holds ``path``."""
        return str(Path(path).parent.parent)

    @property
    def bytes_on_disk(self) -> int:
        with self._lock:
            return sum(self._files.values())

    @property
    def files(self) -> list[str]:
        with self._lock:
            return list(self._files)

    def remove(self, path: str) -> None:
        """Delete ``path`` (if it exists) and stop tracking it.

        Deleted first, untracked after: a Ctrl-C between the two (a merge deleting the runs
        it has read) leaves a tracked name that :meth:`cleanup` deletes again, not an
        untracked file left on disk (seen under a stream of interrupts)."""
        forget_run_id(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # pragma: no cover - depends on the filesystem
            log.warning("Error deleting spill file %s: %s", path, exc)
        with self._lock:
            tracked = self._files.pop(path, None) is not None
        if tracked:
            _release_subdir(os.path.dirname(path))

    def cleanup(self) -> None:
        """Delete every file this owner created and still tracks."""
        for path in self.files:
            self.remove(path)

"""Spill directories: where run files live, and making sure they go away.

Each process gets its own subdirectory (``extagg-<pid>-<token>``) in every spill directory, so
concurrent jobs on one machine never share files. Directories come from the ``spill_dirs``
argument, else ``EXTAGG_SPILL_DIR`` (several separated by ``os.pathsep``), else Spark's
``SPARK_LOCAL_DIRS`` (so engines inside a Spark task spill where Spark does), else the system temp
directory; files are handed out round-robin across them. Every file is tracked by the
:class:`SpillDirs` that created it and removed by :meth:`SpillDirs.cleanup`; the per-process
subdirectories are removed at interpreter exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

from extagg._config import default_spill_dirs, env_size
from extagg.errors import SpillError

__all__ = ["SpillDirs", "resolve_spill_dirs"]

log = logging.getLogger(__name__)

_process_dirs: dict[tuple[int, str], str] = {}
_process_lock = threading.Lock()


def resolve_spill_dirs(dirs: Sequence[str | os.PathLike[str]] | str | None = None) -> list[str]:
    """The base spill directories: argument > ``EXTAGG_SPILL_DIR`` > ``SPARK_LOCAL_DIRS`` > temp."""
    if isinstance(dirs, (str, os.PathLike)):
        dirs = [dirs]
    if not dirs:
        dirs = default_spill_dirs()
    return [os.path.abspath(os.fspath(d)) for d in dirs]


def _process_subdir(base: str) -> str:
    """This process's private subdirectory of ``base`` (created on first use)."""
    pid = os.getpid()
    with _process_lock:
        path = _process_dirs.get((pid, base))
        if path is None or not os.path.isdir(path):
            try:
                os.makedirs(base, exist_ok=True)
                path = os.path.join(base, f"extagg-{pid}-{secrets.token_hex(4)}")
                os.makedirs(path, exist_ok=True)
            except OSError as exc:
                raise SpillError(
                    f"cannot create a spill directory under {base}: {exc.strerror or exc}",
                    directory=base,
                    errno=exc.errno,
                ) from exc
            _process_dirs[(pid, base)] = path
        return path


@atexit.register
def _remove_process_dirs() -> None:
    pid = os.getpid()
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
        self._files: dict[str, int] = {}
        self._lock = threading.Lock()

    def new_path(self, prefix: str = "run") -> str:
        """A fresh file path in the next directory; the file is tracked until removed."""
        with self._lock:
            base = self.dirs[self._next % len(self.dirs)]
            self._next += 1
            path = os.path.join(_process_subdir(base), f"{prefix}-{secrets.token_hex(8)}.run")
            self._files[path] = 0
            return path

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
        """Delete ``path`` (if it exists) and stop tracking it."""
        with self._lock:
            self._files.pop(path, None)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # pragma: no cover - depends on the filesystem
            log.warning("Error deleting spill file %s: %s", path, exc)

    def cleanup(self) -> None:
        """Delete every file this owner created and still tracks."""
        for path in self.files:
            self.remove(path)

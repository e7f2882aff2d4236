"""The exception hierarchy of extagg.

Every error subclasses a built-in so callers can catch it naturally: a spill that cannot be
written is an ``OSError``, a corrupt file is a ``ValueError``, running out of granted memory is
a ``MemoryError``.
"""

from __future__ import annotations

import os

__all__ = ["ExtaggError", "SpillError", "CorruptFileError", "MemoryLimitError"]


class ExtaggError(Exception):
    """Base class of every error raised by extagg itself."""


class SpillError(ExtaggError, OSError):
    """Data could not be spilled to disk (disk full, spill cap reached, unserialisable value).

    Also an ``OSError``. The map or aggregator keeps its data; the partial file is removed.

    Parameters
    ----------
    message
        What failed, naming the file or value.
    directory
        Where the spill was going, or ``None``.
    bytes_needed
        How much it tried to write, or ``None``.
    errno
        The ``OSError`` errno behind it (``ENOSPC``...), or ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        directory: str | os.PathLike[str] | None = None,
        bytes_needed: int | None = None,
        errno: int | None = None,
    ) -> None:
        if errno is None:
            super().__init__(message)
        else:
            super().__init__(errno, message)
        self.message = message
        self.directory = None if directory is None else os.fspath(directory)
        self.bytes_needed = bytes_needed

    def __str__(self) -> str:
        return self.message


class CorruptFileError(ExtaggError, ValueError):
    """A spill or state file is truncated, corrupt, or not an extagg file at all.

    Also a ``ValueError``.

    Parameters
    ----------
    path
        The file.
    offset
        Byte offset of the problem, or ``None`` when it concerns the whole file.
    reason
        What is wrong (bad magic, CRC mismatch, short read...).
    """

    def __init__(self, path: str | os.PathLike[str], offset: int | None, reason: str) -> None:
        self.path = os.fspath(path)
        self.offset = offset
        self.reason = reason
        where = "" if offset is None else f" at offset {offset}"
        super().__init__(f"corrupt file {self.path}{where}: {reason}")


class MemoryLimitError(ExtaggError, MemoryError):
    """The memory manager could not grant the memory a consumer needs, even after spilling."""

"""The exception hierarchy of extagg.

Every error subclasses a built-in so callers can catch it naturally: a spill that cannot be
written is an ``OSError``, a corrupt file is a ``ValueError``, running out of granted memory is
a ``MemoryError``.
"""

from __future__ import annotations

import os

__all__ = [
    "CorruptFileError",
    "DestroyedError",
    "ExtaggError",
    "MemoryLimitError",
    "SpillError",
    "SumOverflowError",
    "UsageError",
]


class ExtaggError(Exception):
    """Base class of every error raised by extagg itself."""


class SpillError(ExtaggError, OSError):
    """Data could not be spilled to disk (disk full, spill cap reached, unserialisable value).

    ``directory`` names where the spill was going, ``bytes_needed`` how much it tried to write
    (both may be ``None`` when they do not apply).
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
    """A spill or state file is truncated, corrupt, or not an extagg file at all."""

    def __init__(self, path: str | os.PathLike[str], offset: int | None, reason: str) -> None:
        self.path = os.fspath(path)
        self.offset = offset
        self.reason = reason
        where = "" if offset is None else f" at offset {offset}"
        super().__init__(f"corrupt file {self.path}{where}: {reason}")


class MemoryLimitError(ExtaggError, MemoryError):
    """The memory manager could not grant the memory a consumer needs, even after spilling."""


class SumOverflowError(ExtaggError, OverflowError):
    """An integer sum does not fit its result type; ``row`` is the offending result row."""

    def __init__(self, message: str, row: int) -> None:
        super().__init__(message)
        self.row = row


class UsageError(ExtaggError, RuntimeError):
    """An object was used out of order: records folded into a map or an aggregator after its
    (destructive, once-only) iteration started or after ``close()``, or it was iterated twice.

    Both engines raise it for the same misuse; it is a ``RuntimeError``.
    """


class DestroyedError(UsageError, AssertionError):
    """A collection was used after its destructive sort or iteration gave its memory away.

    Also an ``AssertionError``, as Spark's ``AppendOnlyMap`` asserts it.
    """

"""The exception hierarchy of extagg.

Every error subclasses a built-in so callers can catch it naturally: a spill that cannot be
written is an ``OSError``, a corrupt file is a ``ValueError``, running out of granted memory is
a ``MemoryError``.
"""

from __future__ import annotations

import os

__all__ = [
    "ExtaggError",
    "SpillError",
    "CorruptFileError",
    "MemoryLimitError",
    "UsageError",
    "ExpressionError",
    "InputError",
    "OutputError",
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


class SumOverflowError(ExtaggError, OverflowError):
    """An exact sum (integer or decimal) does not fit its result type; the message names the
    aggregate, the column and the group. ``row`` is the offending result row of its batch."""

    def __init__(self, message: str, row: int = -1) -> None:
        super().__init__(message)
        self.row = row


class MemoryLimitError(ExtaggError, MemoryError):
    """The memory manager could not grant the memory a consumer needs, even after spilling."""


class UsageError(ExtaggError, ValueError):
    """A request that cannot run as written: unknown column or function, bad option value.

    The command line exits with status 2 on it; ``hint`` is an optional second line (the
    available columns, the closest match).
    """


class ExpressionError(UsageError):
    """A ``--where`` / ``--having`` expression that does not parse or names no column.

    ``expression`` is the text, ``position`` the 0-based offset of the offending token; the
    message shows the expression with a caret under that position.
    """

    def __init__(self, reason: str, expression: str, position: int) -> None:
        self.reason = reason
        self.expression = expression
        self.position = max(0, min(position, len(expression)))
        caret = " " * self.position + "^"
        super().__init__(f"{reason} at position {self.position}:\n  {expression}\n  {caret}")


class InputError(ExtaggError, ValueError):
    """An input file that cannot be read: missing, unreadable, corrupt, or of a conflicting
    schema. ``path`` names the file, ``row_group`` the Parquet row group when known."""

    def __init__(self, message: str, *, path: str | None = None, row_group: int | None = None):
        super().__init__(message)
        self.path = path
        self.row_group = row_group


class OutputError(ExtaggError, OSError):
    """The result could not be written (disk full, output exists, directory missing).

    ``directory`` names where it was going, ``bytes_needed`` the size of the write that failed.
    """

    def __init__(
        self,
        message: str,
        *,
        directory: str | None = None,
        bytes_needed: int | None = None,
        errno: int | None = None,
    ) -> None:
        if errno is None:
            super().__init__(message)
        else:
            super().__init__(errno, message)
        self.message = message
        self.directory = directory
        self.bytes_needed = bytes_needed

    def __str__(self) -> str:
        return self.message

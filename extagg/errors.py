"""The exception hierarchy of extagg.

Every error subclasses a built-in so callers can catch it naturally: a spill that cannot be
written is an ``OSError``, a corrupt file is a ``ValueError``, running out of granted memory is
a ``MemoryError``.
"""

from __future__ import annotations

import os
import unicodedata

__all__ = [
    "BadKeyError",
    "BudgetError",
    "CorruptFileError",
    "DestroyedError",
    "ExtaggError",
    "MemoryLimitError",
    "SpillError",
    "SumOverflowError",
    "ExpressionOverflowError",
    "ExpressionValueError",
    "UsageError",
    "QueryError",
    "ExpressionError",
    "InputError",
    "OutputError",
]


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


class SumOverflowError(ExtaggError, OverflowError):
    """An exact sum (integer or decimal) does not fit its result type; the message names the
    aggregate, the column and the group.

    Parameters
    ----------
    message
        What overflowed, naming the aggregate, the column and the group.
    row
        The offending result row of its batch (``-1`` when unknown).
    """

    def __init__(self, message: str, row: int = -1) -> None:
        super().__init__(message)
        self.row = row


class MemoryLimitError(ExtaggError, MemoryError):
    """The memory manager could not grant the memory a consumer needs, even after spilling."""


class UsageError(ExtaggError, RuntimeError):
    """An object was used out of order: records folded into a map or an aggregator after its
    (destructive, once-only) iteration started or after ``close()``, or it was iterated twice.

    Both engines raise it for the same misuse; it is a ``RuntimeError``.
    """


class DestroyedError(UsageError, AssertionError):
    """A collection was used after its destructive sort or iteration gave its memory away.

    Also an ``AssertionError``, as Spark's ``AppendOnlyMap`` asserts it.
    """


class BadKeyError(ExtaggError, TypeError):
    """A record's key cannot be grouped: hashing or comparing it raised, or its type cannot
    keep its identity through a spill (see ``docs/how-it-works.md``, "Key identity").

    The cause is chained (``__cause__``). The records before it were folded; it and the
    records after it were not.

    Parameters
    ----------
    index
        The record's position in the input of the call that failed (0-based).
    key
        The key that could not be grouped.
    reason
        Why (the hashing / comparison error, or the unsupported type).
    """

    def __init__(self, index: int, key: object, reason: str) -> None:
        super().__init__(index, key, reason)
        self.index = index
        self.key = key
        self.reason = reason

    def __str__(self) -> str:
        return (
            f"record {self.index}: {self.reason}; the {self.index} records before it were "
            "folded, it and the records after it were not"
        )


class BudgetError(ExtaggError, ValueError):
    """A memory budget an engine cannot work with (below its working minimum).

    Parameters
    ----------
    message
        The error message, naming the engine and both sizes.
    budget
        The rejected budget in bytes.
    minimum
        The smallest budget in bytes the engine accepts.
    """

    def __init__(self, message: str, *, budget: int, minimum: int) -> None:
        super().__init__(message)
        self.budget = budget
        self.minimum = minimum


class QueryError(ExtaggError, ValueError):
    """A request that cannot run as written: unknown column or function, bad option value.

    The command line exits with status 2 on it; ``hint`` is an optional second line (the
    available columns, the closest match).
    """


class _AtPosition(Exception):
    """An error in an expression's text: the message shows it with a caret under a position
    (``reason``, ``expression`` and the clamped ``position`` kept as attributes)."""

    def __init__(self, reason: str, expression: str, position: int) -> None:
        self.reason = reason
        self.expression = expression
        self.position = max(0, min(position, len(expression)))
        caret = _caret(expression, self.position)
        super().__init__(f"{reason} at position {self.position}:\n  {expression}\n  {caret}")


class ExpressionError(_AtPosition, QueryError):
    """A ``--where`` / ``--having`` expression that does not parse or names no column.

    The message shows the expression with a caret under the position.

    Parameters
    ----------
    reason
        What is wrong.
    expression
        The expression's text.
    position
        The 0-based offset of the offending token (clamped to the text).
    """


class ExpressionOverflowError(_AtPosition, ExtaggError, OverflowError):
    """An integer ``+``, ``-`` or ``*`` of a ``--where`` / ``--having`` expression whose
    result leaves its type on a row's values (as DuckDB and Spark's ANSI mode, the operands'
    type is kept: ``int8 + int8`` is an ``int8``). A runtime error, unlike
    :class:`ExpressionError`: the message names the values and shows the expression with a
    caret under the operator.

    Parameters
    ----------
    reason
        The operation and the values that overflow.
    expression
        The expression's text.
    position
        The 0-based offset of the operator.
    """


class ExpressionValueError(_AtPosition, ExtaggError, ValueError):
    """A value that an expression's function cannot take, found on a row (``strptime`` of a
    text not in its format). A runtime error, unlike :class:`ExpressionError`: the message
    names the value and shows the expression with a caret under the function.

    Parameters
    ----------
    reason
        The function and the value.
    expression
        The expression's text.
    position
        The 0-based offset of the function's name.
    """


def _caret(text: str, position: int) -> str:
    """A caret under ``text[position]`` as a terminal shows ``text``: a wide character (East
    Asian wide or full-width, most emoji) takes two columns, a combining mark or format
    character none, and a tab stays a tab (counting characters put the caret off after
    them)."""
    pad = []
    for ch in text[:position]:
        if ch == "\t":
            pad.append("\t")
        elif unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
            continue
        else:
            pad.append("  " if unicodedata.east_asian_width(ch) in ("W", "F") else " ")
    return "".join(pad) + "^"


class InputError(ExtaggError, ValueError):
    """An input file that cannot be read: missing, unreadable, corrupt, or of a conflicting
    schema.

    Parameters
    ----------
    message
        What is wrong, naming the file.
    path
        The file, when one is to blame.
    row_group
        The Parquet row group, when known.
    """

    def __init__(self, message: str, *, path: str | None = None, row_group: int | None = None):
        super().__init__(message)
        self.path = path
        self.row_group = row_group


class OutputError(ExtaggError, OSError):
    """The result could not be written (disk full, output exists, directory missing).

    Parameters
    ----------
    message
        What went wrong, naming the output.
    directory
        Where the output was going.
    bytes_needed
        The size of the write that failed, when known.
    errno
        The operating system's error number, when the cause is one (``ENOSPC``).
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

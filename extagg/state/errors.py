"""Errors of the state store and its readers.

They subclass built-ins (through :class:`extagg.errors.ExtaggError`) so callers can catch them
naturally, and carry Spark's error class in ``error_class`` so messages can be matched against
Spark's documentation. Corrupt files raise :class:`extagg.errors.CorruptFileError` (a
``ValueError``) naming the file and the offset.
"""

from __future__ import annotations

from collections.abc import Sequence

from extagg.errors import ExtaggError

__all__ = [
    "StateStoreError",
    "UnexpectedVersionError",
    "StateFileNotFoundError",
    "StateStoreCommitError",
    "ConcurrentCommitError",
    "StateSourceError",
    "StateSourceOptionError",
    "StateSourceConflictError",
    "CommittedBatchUnavailableError",
]


class StateStoreError(ExtaggError, RuntimeError):
    """A state store could not be loaded, written or used as asked.

    Parameters
    ----------
    message
        What went wrong, naming the file or option.
    error_class
        Spark's error class (e.g. ``"STDS_INVALID_OPTION_VALUE"``), kept on the exception.
    """

    def __init__(self, message: str, *, error_class: str | None = None) -> None:
        super().__init__(message)
        self.error_class = error_class


class UnexpectedVersionError(StateStoreError, ValueError):
    """A version that cannot exist was asked for (negative, or beyond the files on disk).

    Parameters
    ----------
    message
        What was asked and what exists.
    version
        The version asked for.
    """

    def __init__(self, message: str, *, version: int) -> None:
        super().__init__(message, error_class="CANNOT_LOAD_STATE_STORE.UNEXPECTED_VERSION")
        self.version = version


class StateFileNotFoundError(StateStoreError):
    """A delta or snapshot file needed to rebuild a version does not exist.

    Parameters
    ----------
    message
        What was being rebuilt.
    path
        The missing file.
    error_class
        Spark's error class (e.g. ``"STDS_INVALID_OPTION_VALUE"``), kept on the exception.
    """

    def __init__(self, message: str, *, path: str, error_class: str) -> None:
        super().__init__(message, error_class=error_class)
        self.path = path


class StateStoreCommitError(StateStoreError):
    """Writing a version failed; the previous version is intact and no temp file is left.

    Parameters
    ----------
    message
        What failed, naming the file.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, error_class="CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT")


class ConcurrentCommitError(StateStoreCommitError, FileExistsError):
    """Another writer committed the same version first: this writer's changes were not published
    (its cached copy of the version was dropped).

    Parameters
    ----------
    message
        What happened.
    path
        The version's file.
    version
        The version both writers committed.
    """

    def __init__(self, message: str, *, path: str, version: int) -> None:
        super().__init__(message)
        self.path = path
        self.version = version

    def __str__(self) -> str:
        return str(self.args[0])


class StateSourceError(ExtaggError, ValueError):
    """The state readers cannot answer the request as given.

    Parameters
    ----------
    message
        What is wrong.
    error_class
        Spark's error class (e.g. ``"STDS_INVALID_OPTION_VALUE"``), kept on the exception.
    """

    def __init__(self, message: str, *, error_class: str) -> None:
        super().__init__(message)
        self.error_class = error_class


class StateSourceOptionError(StateSourceError):
    """A reader option has an invalid value or is missing.

    Parameters
    ----------
    option
        The option's name.
    message
        What is wrong with it.
    error_class
        Spark's error class (e.g. ``"STDS_INVALID_OPTION_VALUE"``), kept on the exception.
    """

    def __init__(self, option: str, message: str, *, error_class: str | None = None) -> None:
        if error_class is None:
            error_class = "STDS_INVALID_OPTION_VALUE.WITH_MESSAGE"
            message = f"Invalid value for source option '{option}': {message}"
        super().__init__(message, error_class=error_class)
        self.option = option


class StateSourceConflictError(StateSourceOptionError):
    """Reader options that cannot be given together (``STDS_CONFLICT_OPTIONS``).

    Parameters
    ----------
    options
        The names of all conflicting options.
    message
        Why they conflict.
    """

    def __init__(self, options: Sequence[str], message: str) -> None:
        names = ", ".join(f"'{name}'" for name in options)
        super().__init__(
            options[0],
            f"[STDS_CONFLICT_OPTIONS] The options {names} cannot be specified together. {message}",
            error_class="STDS_CONFLICT_OPTIONS",
        )
        self.options = tuple(options)


class CommittedBatchUnavailableError(StateSourceError):
    """No batch has been committed in the checkpoint (no default batch to read), or the batch
    asked for is past the last committed one: its state files may hold a batch that never
    finished, which Spark's reader refuses rather than show.

    Parameters
    ----------
    checkpoint
        The checkpoint's path.
    batch_id
        The batch asked for, when one was (``None``: the default batch was asked for).
    last_committed
        The last committed batch, if any.
    """

    def __init__(
        self, checkpoint: str, batch_id: int | None = None, last_committed: int | None = None
    ) -> None:
        if batch_id is None:
            detail = ", or pass the batch id explicitly."
        else:
            last = "none" if last_committed is None else f"batch {last_committed}"
            detail = f". Batch {batch_id} was not committed (the last committed: {last})."
        super().__init__(
            "[STDS_COMMITTED_BATCH_UNAVAILABLE] No committed batch found, checkpoint location: "
            f"{checkpoint}. Ensure that the query has run and committed any microbatch before "
            f"stopping{detail}",
            error_class="STDS_COMMITTED_BATCH_UNAVAILABLE",
        )
        self.checkpoint = checkpoint
        self.batch_id = batch_id
        self.last_committed = last_committed

"""Readers of a checkpoint's state: a version, the change feed, the operator metadata.

Like Spark's ``statestore`` and ``state-metadata`` sources. Each call checks its options and
plans the files to read right away (so a bad option or a missing file fails at the call, naming
it), and returns a lazy :class:`~extagg.state.rows.Rows` that streams the rows from disk: one
partition and one merged file set at a time, never the whole state. Versions are read straight
from the files, without a provider or a cache.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from extagg.state import spark as spark_state
from extagg.state.checkpoint import Checkpoint, Operator, OperatorMetadata
from extagg.state.codec import decode_key, decode_value, decoding, encode_value
from extagg.state.errors import (
    CommittedBatchUnavailableError,
    StateFileNotFoundError,
    StateSourceOptionError,
)
from extagg.state.files import (
    DELTA,
    StateFileListing,
    StateFileReader,
    list_state_files,
    store_id,
)
from extagg.state.options import (
    check_batch_option,
    check_store_name_option,
    first_pair,
    merge_pair,
)
from extagg.state.provider import DEFAULT_STORE_NAME
from extagg.state.rows import ChangeRow, MetadataRow, Rows, StateRow
from extagg.state.streams import (
    VersionFiles,
    deletes_first,
    files_for_version,
    open_version,
    open_version_with_fallback,
)

__all__ = ["read_state", "read_change_feed", "read_metadata", "read_diff", "is_spark_checkpoint"]

#: whether a checkpoint folder was written by Spark (then the readers delegate to
#: :mod:`extagg.state.spark`, which returns the rows of Spark's own state sources)
is_spark_checkpoint = spark_state.is_spark_checkpoint

logger = logging.getLogger(__name__)

_STATE_TYPES = {"partition_id": "int32"}
_CHANGE_TYPES = {"batch_id": "int64", "change_type": "string", "partition_id": "int32"}
_METADATA_TYPES = {
    "operator_id": "int64",
    "operator_name": "string",
    "store_name": "string",
    "num_partitions": "int32",
    "min_batch_id": "int64",
    "max_batch_id": "int64",
}


# ------------------------------------------------------------------------------ option checks


def open_checkpoint(path: Any) -> Checkpoint:
    """The checkpoint at ``path``; it must hold a ``state`` directory."""
    if path is None or (isinstance(path, str) and not path.strip()):
        raise StateSourceOptionError(
            "path",
            "[STDS_REQUIRED_OPTION_UNSPECIFIED] 'path' must be specified.",
            error_class="STDS_REQUIRED_OPTION_UNSPECIFIED",
        )
    checkpoint = Checkpoint(os.fspath(path))
    if not os.path.exists(checkpoint.path):
        raise StateSourceOptionError(
            "path", f"checkpoint location {checkpoint.path} does not exist"
        )
    if not os.path.isdir(checkpoint.state_dir):
        raise StateSourceOptionError(
            "path",
            f"no state in checkpoint location {checkpoint.path}: {checkpoint.state_dir} "
            "does not exist",
        )
    return checkpoint


def committed_batch(checkpoint: Checkpoint, batch_id: int | None = None) -> int:
    """``batch_id``, or the last committed batch (Spark's default ``batchId``) when it is
    ``None``. A batch past the last commit is refused as Spark's reader refuses it: its
    version may be one a batch wrote and never committed (a retried batch rewrites it). A
    checkpoint with no commit log at all (versions committed by providers alone) reads any
    batch asked for by its number."""
    last = checkpoint.last_committed_batch()
    if batch_id is None:
        if last is None:
            raise CommittedBatchUnavailableError(checkpoint.path)
        return last
    if last is not None and batch_id > last:
        raise CommittedBatchUnavailableError(checkpoint.path, batch_id, last)
    return batch_id


@dataclass
class _Target:
    """An operator and store resolved against the checkpoint."""

    operator: Operator
    store_name: str
    partitions: list[int]

    @property
    def allow_pickle(self) -> bool:
        return self.operator.metadata.allow_pickle

    def directory(self, partition: int) -> str:
        return self.operator.store_directory(partition, self.store_name)

    def store_id(self, partition: int) -> str:
        """The store id the partition's state files carry in their headers."""
        return store_id(self.operator.operator_id, partition, self.store_name)

    def label(self, partition: int) -> str:
        return (
            f"state store (op={self.operator.operator_id},part={partition},"
            f"store={self.store_name}) in {self.directory(partition)}"
        )

    def check_never_held_state(self, partition: int, batch_id: int) -> None:
        """A partition without state files is one that never held state, unless the commit of
        ``batch_id`` says it held some: then its files are lost, which is an error."""
        held = self.operator.checkpoint.partitions_with_state(
            batch_id, self.operator.operator_id, self.store_name
        )
        if held is not None and partition in held:
            missing = os.path.join(self.directory(partition), f"{batch_id + 1}.delta")
            raise StateFileNotFoundError(
                "[CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS] Error reading "
                f"delta file {missing} of {self.label(partition)}: the partition held state "
                f"when batch {batch_id} was committed, but its folder has no state file.",
                path=missing,
                error_class="CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS",
            )


def _inferred_metadata(checkpoint: Checkpoint, operator_id: int) -> OperatorMetadata:
    """Metadata for an operator directory without a metadata file (Spark: warn, assume)."""
    return checkpoint.inferred_operator_metadata(operator_id)


def resolve_target(
    checkpoint: Checkpoint, operator_id: int, store_name: str, partition_id: int | None
) -> _Target:
    """Check that the operator, store and partition exist."""
    operators = checkpoint.operator_ids()
    if operator_id not in operators:
        raise StateSourceOptionError(
            "operator_id",
            f"operator {operator_id} does not exist in checkpoint location {checkpoint.path} "
            f"(operators: {operators})",
        )
    metadata = checkpoint.operator_metadata(operator_id) or _inferred_metadata(
        checkpoint, operator_id
    )
    if store_name not in metadata.store_names:
        raise StateSourceOptionError(
            "store_name",
            f"store {store_name!r} does not exist in operator {operator_id} "
            f"(stores: {list(metadata.store_names)})",
        )
    if partition_id is not None and partition_id >= metadata.num_partitions:
        raise StateSourceOptionError(
            "partition_id",
            f"partition {partition_id} does not exist: operator {operator_id} has "
            f"{metadata.num_partitions} partitions",
        )
    partitions = list(range(metadata.num_partitions)) if partition_id is None else [partition_id]
    return _Target(Operator(checkpoint, metadata), store_name, partitions)


# ------------------------------------------------------------------------------------ readers
def read_state(
    path: str | os.PathLike[str],
    batch_id: int | None = None,
    operator_id: int = 0,
    store_name: str = DEFAULT_STORE_NAME,
    partition_id: int | None = None,
    snapshot_start_batch_id: int | None = None,
) -> Rows[Any]:
    """The state after ``batch_id`` as ``(key, value, partition_id)`` rows, streamed partition by
    partition.

    A Spark checkpoint is read by :func:`extagg.state.spark.read_state` (its rows and options).

    Parameters
    ----------
    path
        The checkpoint directory.
    batch_id
        The batch whose resulting state to read (default: the last committed batch).
    operator_id
        The operator to read.
    store_name
        The store to read.
    partition_id
        One partition only (default: all).
    snapshot_start_batch_id
        Rebuild from that batch's snapshot plus the deltas after it, which must exist (a check of
        the snapshot); needs ``partition_id``.

    Returns
    -------
    Rows
        Of :class:`StateRow`; iterate (streams the files in bounded memory) or ``.to_arrow()``.

    Raises
    ------
    StateSourceOptionError, StateSourceConflictError, CommittedBatchUnavailableError
        Invalid or conflicting options, or nothing committed, naming the option.
    CorruptFileError
        A damaged state file.
    """
    if path is not None and is_spark_checkpoint(path):
        return spark_state.read_state(
            path, batch_id, operator_id, store_name, partition_id, snapshot_start_batch_id
        )
    batch_id = check_batch_option("batch_id", batch_id)
    operator_id = check_batch_option("operator_id", operator_id, required=True)  # type: ignore[assignment]
    store_name = check_store_name_option(store_name)
    partition_id = check_batch_option("partition_id", partition_id)
    snapshot_start_batch_id = check_batch_option("snapshot_start_batch_id", snapshot_start_batch_id)
    if snapshot_start_batch_id is not None and partition_id is None:
        raise StateSourceOptionError(
            "partition_id",
            "[STDS_REQUIRED_OPTION_UNSPECIFIED] 'partition_id' must be specified together "
            "with 'snapshot_start_batch_id'.",
            error_class="STDS_REQUIRED_OPTION_UNSPECIFIED",
        )
    checkpoint = open_checkpoint(path)
    batch_id = committed_batch(checkpoint, batch_id)
    if snapshot_start_batch_id is not None and snapshot_start_batch_id > batch_id:
        raise StateSourceOptionError(
            "snapshot_start_batch_id",
            f"must be less than or equal to 'batch_id' ({batch_id}), got "
            f"{snapshot_start_batch_id}.",
        )
    target = resolve_target(checkpoint, operator_id, store_name, partition_id)
    version = batch_id + 1
    # (partition, listing, the files to read; None: the newest chain that reads)
    plan: list[tuple[int, StateFileListing, list[str] | None]] = []
    for partition in target.partitions:
        listing = list_state_files(target.directory(partition))
        if not listing.deltas and not listing.snapshots:
            target.check_never_held_state(partition, batch_id)
            continue  # a partition that never held state
        label = target.label(partition)
        if snapshot_start_batch_id is None:
            files_for_version(listing, version, label)  # a missing delta: an error now
            plan.append((partition, listing, None))
        else:
            start = snapshot_start_batch_id + 1
            snapshot = listing.snapshots.get(start)
            if snapshot is None:
                missing = os.path.join(listing.directory, f"{start}.snapshot")
                raise StateFileNotFoundError(
                    "[CANNOT_LOAD_STATE_STORE.CANNOT_READ_SNAPSHOT_FILE_NOT_EXISTS] Error reading "
                    f"snapshot file {missing} of {label}: {missing} does not exist.",
                    path=missing,
                    error_class="CANNOT_LOAD_STATE_STORE.CANNOT_READ_SNAPSHOT_FILE_NOT_EXISTS",
                )
            filtered = type(listing)(listing.directory, dict(listing.deltas), {start: snapshot})
            _start, paths = files_for_version(filtered, version, label, start - 1)
            plan.append((partition, listing, paths))
    allow_pickle = target.allow_pickle

    def produce() -> Iterator[StateRow]:
        for partition, listing, paths in plan:
            label = target.label(partition)
            files = VersionFiles(listing.directory)
            if paths is None:  # past a corrupt snapshot
                records = open_version_with_fallback(
                    listing, version, label, allow_pickle=allow_pickle, files=files,
                    store=target.store_id(partition),
                )  # fmt: skip
            else:  # the snapshot asked for, or an error
                files.paths = list(paths)
                records = open_version(paths, label, store=target.store_id(partition))
            key = b""
            try:
                with closing(records):
                    for key, value in records:
                        yield StateRow(
                            decode_key(key), decode_value(value, allow_pickle), partition
                        )
            except ValueError as exc:  # a record that cannot be decoded: name its file
                raise files.corrupt(exc, key) from None

    return Rows(produce, StateRow._fields, _STATE_TYPES)


def read_change_feed(
    path: str | os.PathLike[str],
    start_batch_id: int,
    end_batch_id: int | None = None,
    operator_id: int = 0,
    store_name: str = DEFAULT_STORE_NAME,
    partition_id: int | None = None,
) -> Rows[Any]:
    """Changes of batches ``start_batch_id`` .. ``end_batch_id`` as
    ``(batch_id, change_type, key, value, partition_id)`` rows: ``"update"`` for puts,
    ``"delete"`` (value ``None``) for removes; per partition, in batch and file order.

    A Spark checkpoint is read by :func:`extagg.state.spark.read_change_feed`.

    Parameters
    ----------
    path
        The checkpoint directory.
    start_batch_id
        First batch whose changes to read.
    end_batch_id
        Last batch (default: the last committed).
    operator_id
        The operator to read.
    store_name
        The store to read.
    partition_id
        One partition only (default: all).

    Returns
    -------
    Rows
        Of :class:`ChangeRow`, streamed from the delta files.
    """

    if path is not None and is_spark_checkpoint(path):
        return spark_state.read_change_feed(
            path, start_batch_id, end_batch_id, operator_id, store_name, partition_id
        )
    start_batch_id = check_batch_option("start_batch_id", start_batch_id, required=True)  # type: ignore[assignment]
    end_batch_id = check_batch_option("end_batch_id", end_batch_id)
    operator_id = check_batch_option("operator_id", operator_id, required=True)  # type: ignore[assignment]
    store_name = check_store_name_option(store_name)
    partition_id = check_batch_option("partition_id", partition_id)
    checkpoint = open_checkpoint(path)
    end_batch_id = committed_batch(checkpoint, end_batch_id)
    if end_batch_id < start_batch_id:
        raise StateSourceOptionError(
            "end_batch_id",
            f"'end_batch_id' ({end_batch_id}) cannot be smaller than 'start_batch_id' "
            f"({start_batch_id}). Please check the input to 'start_batch_id' and 'end_batch_id'.",
        )
    target = resolve_target(checkpoint, operator_id, store_name, partition_id)
    plan: list[tuple[int, list[tuple[int, str]]]] = []
    for partition in target.partitions:
        listing = list_state_files(target.directory(partition))
        if not listing.deltas and not listing.snapshots:
            target.check_never_held_state(partition, end_batch_id)
            continue
        files = []
        for batch in range(start_batch_id, end_batch_id + 1):
            delta = listing.deltas.get(batch + 1)
            if delta is None:
                missing = os.path.join(listing.directory, f"{batch + 1}.delta")
                oldest = min(listing.deltas, default=None)
                why = (
                    f"Batch {batch}'s delta is older than the oldest one kept, "
                    f"{oldest}.delta: maintenance removed it (it keeps min_versions_to_retain "
                    f"versions); the change feed can start at batch {oldest - 1}."
                    if oldest is not None and batch + 1 < oldest
                    else "If the stream job is restarted with a new or updated state operation, "
                    "please create a new checkpoint location or clear the existing checkpoint "
                    "location."
                )
                raise StateFileNotFoundError(
                    f"[CANNOT_READ_STREAMING_STATE_FILE] Error reading streaming state file of "
                    f"{target.label(partition)}: {missing} does not exist. {why}",
                    path=missing,
                    error_class="CANNOT_READ_STREAMING_STATE_FILE",
                )
            files.append((batch, delta))
        plan.append((partition, files))
    allow_pickle = target.allow_pickle

    def produce() -> Iterator[ChangeRow]:
        for partition, files in plan:
            label = target.label(partition)
            for batch, delta in files:
                try:
                    reader = StateFileReader(
                        delta, DELTA, label=label, store=target.store_id(partition)
                    )
                except FileNotFoundError:
                    raise StateFileNotFoundError(
                        f"[CANNOT_READ_STREAMING_STATE_FILE] Error reading streaming state file "
                        f"of {label}: {delta} does not exist.",
                        path=delta,
                        error_class="CANNOT_READ_STREAMING_STATE_FILE",
                    ) from None
                with decoding(delta):
                    for key, value in deletes_first(reader):
                        decoded = decode_key(key)
                        if value is None:
                            yield ChangeRow(batch, "delete", decoded, None, partition)
                        else:
                            value = decode_value(value, allow_pickle)
                            yield ChangeRow(batch, "update", decoded, value, partition)

    return Rows(produce, ChangeRow._fields, _CHANGE_TYPES)


def read_metadata(path: str | os.PathLike[str]) -> Rows[Any]:
    """One row per operator and store: id, name, store, partitions, and the smallest and largest
    committed batch id (-1 when none). Unreadable metadata is skipped with a warning. A Spark
    checkpoint gives the rows of Spark's ``state-metadata`` source instead.

    Parameters
    ----------
    path
        The checkpoint directory.

    Returns
    -------
    Rows
        Of :class:`MetadataRow`.
    """

    if path is not None and is_spark_checkpoint(path):
        return spark_state.read_metadata(path)
    checkpoint = open_checkpoint(path)
    batches = checkpoint.committed_batches()
    low, high = (batches[0], batches[-1]) if batches else (-1, -1)
    rows: list[MetadataRow] = []
    for operator_id in checkpoint.operator_ids():
        try:
            metadata = checkpoint.operator_metadata(operator_id) or _inferred_metadata(
                checkpoint, operator_id
            )
        except (OSError, ValueError) as exc:
            logger.warning("Skipping operator %d of %s: %s", operator_id, checkpoint.path, exc)
            continue
        for store in metadata.store_names:
            rows.append(
                MetadataRow(
                    operator_id,
                    metadata.operator_name,
                    store,
                    metadata.num_partitions,
                    low,
                    high,
                )
            )
    return Rows(lambda: iter(rows), MetadataRow._fields, _METADATA_TYPES)


def read_diff(
    path: str | os.PathLike[str],
    from_batch_id: int,
    to_batch_id: int,
    operator_id: int = 0,
    store_name: str = DEFAULT_STORE_NAME,
    *,
    memory: int | str | None = None,
) -> Rows[Any]:
    """``(change_type, key, old_value, new_value, partition_id)`` rows of the keys whose value
    differs between the state after ``from_batch_id`` and after ``to_batch_id``
    (``added``/``removed``/``changed``). Both versions meet in one external map: bounded memory.
    Values compare by their canonical encoding, not ``==``: an untouched NaN is unchanged, and
    ``1`` → ``1.0`` (other stored bytes) is a change. Works on both kinds of checkpoint."""
    if path is not None and is_spark_checkpoint(path):
        return spark_state.read_diff(
            path, from_batch_id, to_batch_id, operator_id, store_name, memory=memory
        )
    old = read_state(path, from_batch_id, operator_id, store_name)
    new = read_state(path, to_batch_id, operator_id, store_name)

    def produce() -> Iterator[tuple[Any, ...]]:
        # here, not at the top: the generic engine imports numba (~0.25 s of the start of
        # every state command, most of which read without it)
        from extagg.generic import Aggregator, ExternalAppendOnlyMap

        aggregator = Aggregator(first_pair, merge_pair, merge_pair)
        with ExternalAppendOnlyMap(aggregator, memory, name="state-diff") as emap:
            # each side boxed as (value,): None means absent, whatever the value is
            emap.insert_all(((r.partition_id, r.key), ((r.value,), None)) for r in old)
            emap.insert_all(((r.partition_id, r.key), (None, (r.value,))) for r in new)
            for (partition, key), (before, after) in emap.iterator():
                if before is not None and after is not None:
                    if _same_encoding(before[0], after[0]):
                        continue
                    yield "changed", key, before[0], after[0], partition
                elif before is None:
                    yield "added", key, None, after[0], partition
                else:
                    yield "removed", key, before[0], None, partition

    types = {"change_type": "string", "partition_id": "int32"}
    return Rows(produce, spark_state.DIFF_FIELDS, types)


def _same_encoding(before: Any, after: Any) -> bool:
    """Whether two values store the same bytes: NaN is NaN, ``1`` is not ``1.0`` or ``True``.

    Values outside the codec's types (pickled) fall back to ``==``: pickle bytes are not
    canonical, so equal objects may pickle differently."""
    try:
        return encode_value(before) == encode_value(after)
    except TypeError:
        return bool(before == after)

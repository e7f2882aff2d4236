"""``read_state``, ``read_change_feed``, ``read_metadata`` over a Spark checkpoint.

The rows and options of Spark's ``statestore`` and ``state-metadata`` sources: ``key`` and
``value`` are structs named and typed by the store's schema file, ``partition_id`` the state
partition; the change feed adds ``batch_id`` and ``change_type`` (``update``/``delete``).

A version is the newest snapshot at or below it plus the deltas after it. A lone snapshot is
streamed as is; otherwise every record goes through an :class:`extagg.ExternalAppendOnlyMap`
keyed by the key row's bytes (the later record of a key wins, a removal drops it), so a state
larger than the memory budget spills instead of filling a dict. Rows are decoded lazily,
partition by partition, and come out as Python rows or Arrow record batches.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from extagg.state.errors import (
    CommittedBatchUnavailableError,
    StateFileNotFoundError,
    StateSourceConflictError,
    StateSourceOptionError,
)
from extagg.state.files import list_state_files
from extagg.state.options import (
    check_batch_option,
    check_store_name_option,
    first_pair,
    merge_pair,
)
from extagg.state.rows import Rows
from extagg.state.spark.checkpoint import DEFAULT_STORE, SparkCheckpoint
from extagg.state.spark.datafile import iter_records
from extagg.state.spark.metadata import OperatorInfo, StoreInfo
from extagg.state.spark.types import StructField, StructType, to_arrow_type
from extagg.state.spark.unsaferow import RowDecoder
from extagg.state.streams import files_for_version

__all__ = [
    "read_state",
    "read_change_feed",
    "read_metadata",
    "read_diff",
    "version_records",
    "JOIN_SIDES",
    "DIFF_FIELDS",
]

logger = logging.getLogger(__name__)

JOIN_SIDES = ("left", "right", "none")
STATE_FIELDS = ("key", "value", "partition_id")
CHANGE_FIELDS = ("batch_id", "change_type", "key", "value", "partition_id")
DIFF_FIELDS = ("change_type", "key", "old_value", "new_value", "partition_id")
"""Column names of the rows :func:`read_diff` returns."""
METADATA_FIELDS = (
    "operatorId",
    "operatorName",
    "stateStoreName",
    "numPartitions",
    "minBatchId",
    "maxBatchId",
    "operatorProperties",
)
_METADATA_TYPES = {
    "operatorId": "int64",
    "operatorName": "string",
    "stateStoreName": "string",
    "numPartitions": "int32",
    "minBatchId": "int64",
    "maxBatchId": "int64",
    "operatorProperties": "string",
}


# ------------------------------------------------------------------------------ options


def _open(path: Any) -> SparkCheckpoint:
    if path is None or (isinstance(path, str) and not path.strip()):
        raise StateSourceOptionError(
            "path",
            "[STDS_REQUIRED_OPTION_UNSPECIFIED] 'path' must be specified.",
            error_class="STDS_REQUIRED_OPTION_UNSPECIFIED",
        )
    checkpoint = SparkCheckpoint(path)
    if not os.path.isdir(checkpoint.state_dir):
        raise StateSourceOptionError(
            "path", f"no state in checkpoint location {checkpoint.path}: state/ does not exist"
        )
    return checkpoint


def _committed_batch(checkpoint: SparkCheckpoint, batch_id: int | None) -> int:
    """``batch_id``, or the last committed batch when it is ``None``. A batch past the last
    commit is refused as Spark's reader refuses it: its state files may be those of a batch
    that failed or was killed before its commit, which a restarted query redoes."""
    last = checkpoint.last_committed_batch()
    if batch_id is None:
        if last is None:
            raise CommittedBatchUnavailableError(checkpoint.path)
        return last
    if last is None or batch_id > last:
        raise CommittedBatchUnavailableError(checkpoint.path, batch_id, last)
    return batch_id


def _store(
    checkpoint: SparkCheckpoint, operator_id: int, store_name: str
) -> tuple[OperatorInfo, StoreInfo]:
    if operator_id not in checkpoint.operator_ids():
        raise StateSourceOptionError(
            "operatorId",
            f"operator {operator_id} does not exist in checkpoint location {checkpoint.path} "
            f"(operators: {checkpoint.operator_ids()})",
        )
    operator = checkpoint.operator(operator_id)
    store = operator.store(store_name)
    if store is None:
        raise StateSourceOptionError(
            "storeName",
            f"store {store_name!r} does not exist in operator {operator_id} "
            f"(stores: {[s.store_name for s in operator.stores]})",
        )
    return operator, store


def _label(checkpoint: SparkCheckpoint, operator_id: int, partition: int, store: str) -> str:
    return (
        f"HDFSStateStoreProvider[id = (op={operator_id},part={partition}),dir = "
        f"{checkpoint.store_dir(operator_id, partition, store)}]"
    )


# ------------------------------------------------------------------------------ versions
def _latest(c1: tuple[int, bytes | None], c2: tuple[int, bytes | None]) -> tuple[int, bytes | None]:
    return c1 if c1[0] > c2[0] else c2


def _second(_old: Any, new: Any) -> Any:
    return new


def _identity(value: Any) -> Any:
    return value


def version_records(
    paths: list[str], memory: int | str | None = None, memory_manager: Any = None
) -> Iterator[tuple[bytes, bytes]]:
    """The live ``(key, value)`` records of the version that ``paths`` (a snapshot or the
    first delta, then deltas in order) rebuild, through the external map."""
    if len(paths) == 1 and paths[0].endswith(".snapshot"):
        for key, value in iter_records(paths[0], snapshot=True):
            if value is not None:
                yield key, value
        return

    def tagged() -> Iterator[tuple[bytes, tuple[int, bytes | None]]]:
        sequence = 0
        for path in paths:
            for key, value in iter_records(path, snapshot=path.endswith(".snapshot")):
                yield key, (sequence, value)
                sequence += 1

    from extagg.generic import Aggregator, ExternalAppendOnlyMap  # numba: only when needed

    aggregator = Aggregator(_identity, _second, _latest)
    emap = ExternalAppendOnlyMap(
        aggregator, memory, memory_manager=memory_manager, name="spark-state-version"
    )
    try:
        emap.insert_all(tagged())
        for key, (_sequence, value) in emap.iterator():
            if value is not None:
                yield key, value
    finally:
        emap.close()


def _version_paths(
    checkpoint: SparkCheckpoint,
    operator_id: int,
    partition: int,
    store_name: str,
    version: int,
    snapshot_start: int | None = None,
) -> list[str]:
    directory = checkpoint.store_dir(operator_id, partition, store_name)
    label = _label(checkpoint, operator_id, partition, store_name)
    listing = list_state_files(directory)
    if version == 0:
        return []
    if snapshot_start is not None:
        snapshot = listing.snapshots.get(snapshot_start)
        if snapshot is None:
            missing = os.path.join(directory, f"{snapshot_start}.snapshot")
            raise StateFileNotFoundError(
                "[CANNOT_LOAD_STATE_STORE.CANNOT_READ_SNAPSHOT_FILE_NOT_EXISTS] Error reading "
                f"snapshot file {missing} of {label}: {missing} does not exist.",
                path=missing,
                error_class="CANNOT_LOAD_STATE_STORE.CANNOT_READ_SNAPSHOT_FILE_NOT_EXISTS",
            )
        listing = type(listing)(directory, dict(listing.deltas), {snapshot_start: snapshot})
        _start, paths = files_for_version(listing, version, label, snapshot_start - 1)
        return paths
    _start, paths = files_for_version(listing, version, label)
    return paths


def _without_field(schema: StructType, name: str) -> StructType:
    return StructType(tuple(f for f in schema.fields if f.name != name))


def _join_schemas(
    checkpoint: SparkCheckpoint, operator_id: int, side: str
) -> tuple[OperatorInfo, StoreInfo, StructType, StructType, StructType, StructType]:
    operator, store = _store(checkpoint, operator_id, f"{side}-keyWithIndexToValue")
    key_schema, value_schema = checkpoint.schemas(operator_id, store)
    out_key = _without_field(key_schema, "index")
    last = value_schema.fields[-1] if value_schema.fields else None
    matched = last is not None and last.name == "matched"
    out_value = _without_field(value_schema, "matched") if matched else value_schema
    return operator, store, key_schema, value_schema, out_key, out_value


def read_state(
    path: str | os.PathLike[str],
    batch_id: int | None = None,
    operator_id: int = 0,
    store_name: str = DEFAULT_STORE,
    partition_id: int | None = None,
    snapshot_start_batch_id: int | None = None,
    *,
    join_side: str = "none",
    memory: int | str | None = None,
    memory_manager: Any = None,
) -> Rows[tuple[Any, ...]]:
    """The state after ``batch_id`` (default: the last committed batch) as
    ``(key, value, partition_id)`` rows, like ``spark.read.format("statestore")``.

    ``partition_id`` with ``snapshot_start_batch_id`` is Spark's ``snapshotPartitionId`` /
    ``snapshotStartBatchId``: rebuild that partition from that batch's snapshot file. ``join_side``
    (``left``/``right``) reads one side of a stream-stream join (its two stores recombined: key
    = join key, value = the stored input row without ``matched``). ``memory`` budgets the external
    map that rebuilds a version.

    Parameters
    ----------
    path
        The checkpoint location (the folder holding ``offsets/``, ``commits/``, ``state/``).
    batch_id
        The batch whose resulting state is read; default the last committed batch.
    operator_id
        The stateful operator (Spark's ``operatorId``).
    store_name
        The store of the operator (``default``; joins have four).
    partition_id
        Read only this partition (with ``snapshot_start_batch_id``).
    snapshot_start_batch_id
        Rebuild ``partition_id`` starting from this batch's snapshot file.
    join_side
        ``"left"`` / ``"right"`` for one side of a stream-stream join, ``"none"`` otherwise.
    memory
        Budget of the external map that rebuilds a version from snapshot + deltas.
    memory_manager
        A memory manager to take that budget from instead.

    Returns
    -------
    Rows
        ``(key, value, partition_id)`` rows; ``.to_arrow()`` / ``.iter_batches()`` for Arrow.

    Raises
    ------
    StateSourceOptionError
        An invalid option, as Spark names it.
    StateFileNotFoundError
        A delta or snapshot file of the version is missing.
    """
    batch_id = check_batch_option("batchId", batch_id)
    operator_id = check_batch_option("operatorId", operator_id, required=True)  # type: ignore[assignment]
    store_name = check_store_name_option(store_name, "storeName")
    partition_id = check_batch_option("snapshotPartitionId", partition_id)
    snapshot_start_batch_id = check_batch_option("snapshotStartBatchId", snapshot_start_batch_id)
    if join_side not in JOIN_SIDES:
        raise StateSourceOptionError(
            "joinSide", f"must be one of {', '.join(JOIN_SIDES)}, got {join_side!r}"
        )
    if join_side != "none" and store_name != DEFAULT_STORE:
        raise StateSourceConflictError(["joinSide", "storeName"], "")
    if (snapshot_start_batch_id is None) != (partition_id is None) and (
        snapshot_start_batch_id is not None
    ):
        raise StateSourceOptionError(
            "snapshotPartitionId",
            "[STDS_REQUIRED_OPTION_UNSPECIFIED] 'snapshotPartitionId' must be specified.",
            error_class="STDS_REQUIRED_OPTION_UNSPECIFIED",
        )
    checkpoint = _open(path)
    batch_id = _committed_batch(checkpoint, batch_id)
    if snapshot_start_batch_id is not None and snapshot_start_batch_id > batch_id:
        raise StateSourceOptionError(
            "snapshotStartBatchId",
            f"must be less than or equal to 'batchId' ({batch_id}), got {snapshot_start_batch_id}.",
        )
    checkpoint.check_supported(batch_id)
    drop_key_field = drop_value_field = False
    if join_side != "none":
        _operator, store, key_schema, value_schema, out_key, out_value = _join_schemas(
            checkpoint, operator_id, join_side
        )
        drop_key_field = len(out_key.fields) < len(key_schema.fields)
        drop_value_field = len(out_value.fields) < len(value_schema.fields)
    else:
        _operator, store = _store(checkpoint, operator_id, store_name)
        key_schema, value_schema = checkpoint.schemas(operator_id, store)
        out_key, out_value = key_schema, value_schema
    num_partitions = checkpoint.num_partitions(operator_id, store, key_schema)
    if partition_id is not None and partition_id >= num_partitions:
        raise StateSourceOptionError(
            "snapshotPartitionId",
            f"partition {partition_id} does not exist: operator {operator_id} has "
            f"{num_partitions} partitions",
        )
    partitions = range(num_partitions) if partition_id is None else [partition_id]
    version = batch_id + 1
    start = None if snapshot_start_batch_id is None else snapshot_start_batch_id + 1
    plan = [
        (p, _version_paths(checkpoint, operator_id, p, store.store_name, version, start))
        for p in partitions
    ]
    key_row, value_row = RowDecoder(out_key).row_class, RowDecoder(out_value).row_class

    def rows(raw: bool) -> Callable[[], Iterator[tuple[Any, ...]]]:
        """Rows with Python values, or (``raw``) with dates and timestamps as Arrow takes
        them, past year 9999 too."""
        key_decoder = RowDecoder(key_schema, raw_datetimes=raw)
        value_decoder = RowDecoder(value_schema, raw_datetimes=raw)

        def produce() -> Iterator[tuple[Any, ...]]:
            for partition, paths in plan:
                for key, value in version_records(paths, memory, memory_manager):
                    k = key_decoder.decode_tuple(key)
                    v = value_decoder.decode_tuple(value[: len(value) & ~7])
                    if drop_key_field:
                        k = k[:-1]
                    if drop_value_field:
                        v = v[:-1]
                    yield key_row(k), value_row(v), partition

        return produce

    return Rows(
        rows(False),
        STATE_FIELDS,
        {"partition_id": "int32"},
        {"key": to_arrow_type(out_key), "value": to_arrow_type(out_value)},
        arrow_produce=rows(True),
    )


def read_change_feed(
    path: str | os.PathLike[str],
    start_batch_id: int,
    end_batch_id: int | None = None,
    operator_id: int = 0,
    store_name: str = DEFAULT_STORE,
    partition_id: int | None = None,
) -> Rows[tuple[Any, ...]]:
    """Changes of batches ``start_batch_id`` .. ``end_batch_id`` (default: the last committed)
    as ``(batch_id, change_type, key, value, partition_id)`` rows (Spark's ``readChangeFeed``):
    ``update`` for puts, ``delete`` (value null) for removals, per partition in file order.

    Parameters
    ----------
    path
        The checkpoint location (the folder holding ``offsets/``, ``commits/``, ``state/``).
    start_batch_id
        First batch whose changes are read.
    end_batch_id
        Last batch whose changes are read; default the last committed batch.
    operator_id
        The stateful operator (Spark's ``operatorId``).
    store_name
        The store of the operator (``default``; joins have four).
    partition_id
        Read only this partition.

    Returns
    -------
    Rows
        ``(batch_id, change_type, key, value, partition_id)`` rows.

    Raises
    ------
    StateSourceOptionError
        An invalid option (e.g. ``end_batch_id < start_batch_id``), as Spark names it.
    """
    start_batch_id = check_batch_option("changeStartBatchId", start_batch_id, required=True)  # type: ignore[assignment]
    end_batch_id = check_batch_option("changeEndBatchId", end_batch_id)
    operator_id = check_batch_option("operatorId", operator_id, required=True)  # type: ignore[assignment]
    store_name = check_store_name_option(store_name, "storeName")
    partition_id = check_batch_option("partitionId", partition_id)
    checkpoint = _open(path)
    if end_batch_id is None:
        end_batch_id = _committed_batch(checkpoint, None)
    if end_batch_id < start_batch_id:
        raise StateSourceOptionError(
            "changeEndBatchId",
            f"'changeEndBatchId' ({end_batch_id}) cannot be smaller than 'changeStartBatchId' "
            f"({start_batch_id}). Please check the input to 'changeStartBatchId' and "
            "'changeEndBatchId'.",
        )
    _committed_batch(checkpoint, end_batch_id)  # an explicit end past the last commit
    checkpoint.check_supported(end_batch_id)
    _operator, store = _store(checkpoint, operator_id, store_name)
    key_schema, value_schema = checkpoint.schemas(operator_id, store)
    num_partitions = checkpoint.num_partitions(operator_id, store, key_schema)
    if partition_id is not None and partition_id >= num_partitions:
        raise StateSourceOptionError(
            "partitionId",
            f"partition {partition_id} does not exist: operator {operator_id} has "
            f"{num_partitions} partitions",
        )
    partitions = range(num_partitions) if partition_id is None else [partition_id]
    plan = []
    for partition in partitions:
        directory = checkpoint.store_dir(operator_id, partition, store.store_name)
        files = []
        for batch in range(start_batch_id, end_batch_id + 1):
            delta = os.path.join(directory, f"{batch + 1}.delta")
            if not os.path.isfile(delta):
                raise StateFileNotFoundError(
                    "[CANNOT_READ_STREAMING_STATE_FILE] Error reading streaming state file of "
                    f"{_label(checkpoint, operator_id, partition, store.store_name)}: {delta} "
                    "does not exist. If the stream job is restarted with a new or updated state "
                    "operation, please create a new checkpoint location or clear the existing "
                    "checkpoint location.",
                    path=delta,
                    error_class="CANNOT_READ_STREAMING_STATE_FILE",
                )
            files.append((batch, delta))
        plan.append((partition, files))

    def rows(raw: bool) -> Callable[[], Iterator[tuple[Any, ...]]]:
        """Rows with Python values, or (``raw``) with dates and timestamps as Arrow takes
        them, past year 9999 too."""
        key_decoder = RowDecoder(key_schema, raw_datetimes=raw)
        value_decoder = RowDecoder(value_schema, raw_datetimes=raw)

        def produce() -> Iterator[tuple[Any, ...]]:
            for partition, files in plan:
                for batch, delta in files:
                    for key, value in iter_records(delta, snapshot=False):
                        decoded = key_decoder.decode(key)
                        if value is None:
                            yield batch, "delete", decoded, None, partition
                        else:
                            row = value_decoder.decode(value[: len(value) & ~7])
                            yield batch, "update", decoded, row, partition

        return produce

    return Rows(
        rows(False),
        CHANGE_FIELDS,
        {"batch_id": "int64", "change_type": "string", "partition_id": "int32"},
        {"key": to_arrow_type(key_schema), "value": to_arrow_type(value_schema)},
        arrow_produce=rows(True),
    )


def read_diff(
    path: str | os.PathLike[str],
    from_batch_id: int,
    to_batch_id: int,
    operator_id: int = 0,
    store_name: str = DEFAULT_STORE,
    *,
    memory: int | str | None = None,
) -> Rows[tuple[Any, ...]]:
    """What changed between the state after ``from_batch_id`` and after ``to_batch_id``:
    ``(change_type, key, old_value, new_value, partition_id)`` rows, ``change_type`` one of
    ``added``, ``removed``, ``changed`` (unchanged keys are left out). Both versions meet in
    one external map keyed by ``(partition, key bytes)``: bounded memory.

    Parameters
    ----------
    path
        The checkpoint location (the folder holding ``offsets/``, ``commits/``, ``state/``).
    from_batch_id
        The batch whose resulting state is the "before".
    to_batch_id
        The batch whose resulting state is the "after".
    operator_id
        The stateful operator (Spark's ``operatorId``).
    store_name
        The store of the operator (``default``; joins have four).
    memory
        Budget of the external map the two versions meet in.

    Returns
    -------
    Rows
        ``(change_type, key, old_value, new_value, partition_id)`` rows (:data:`DIFF_FIELDS`).
    """
    from_batch_id = check_batch_option("fromBatchId", from_batch_id, required=True)  # type: ignore[assignment]
    to_batch_id = check_batch_option("toBatchId", to_batch_id, required=True)  # type: ignore[assignment]
    operator_id = check_batch_option("operatorId", operator_id, required=True)  # type: ignore[assignment]
    store_name = check_store_name_option(store_name, "storeName")
    checkpoint = _open(path)
    for batch in (from_batch_id, to_batch_id):
        _committed_batch(checkpoint, batch)
    checkpoint.check_supported(to_batch_id)
    _operator, store = _store(checkpoint, operator_id, store_name)
    key_schema, value_schema = checkpoint.schemas(operator_id, store)
    plans = [
        (
            p,
            _version_paths(checkpoint, operator_id, p, store.store_name, from_batch_id + 1),
            _version_paths(checkpoint, operator_id, p, store.store_name, to_batch_id + 1),
        )
        for p in range(checkpoint.num_partitions(operator_id, store, key_schema))
    ]

    def rows(raw: bool) -> Callable[[], Iterator[tuple[Any, ...]]]:
        """Rows with Python values, or (``raw``) with dates and timestamps as Arrow takes
        them, past year 9999 too."""
        key_decoder = RowDecoder(key_schema, raw_datetimes=raw)
        value_decoder = RowDecoder(value_schema, raw_datetimes=raw)

        def produce() -> Iterator[tuple[Any, ...]]:
            from extagg.generic import Aggregator, ExternalAppendOnlyMap  # numba: only when needed

            for partition, old_paths, new_paths in plans:
                emap = ExternalAppendOnlyMap(
                    Aggregator(first_pair, merge_pair, merge_pair), memory, name="spark-state-diff"
                )
                try:
                    emap.insert_all(
                        (key, (value, None)) for key, value in version_records(old_paths, memory)
                    )
                    emap.insert_all(
                        (key, (None, value)) for key, value in version_records(new_paths, memory)
                    )
                    for key, (old, new) in emap.iterator():
                        if old == new:
                            continue
                        kind = "added" if old is None else "removed" if new is None else "changed"
                        yield (
                            kind,
                            key_decoder.decode(key),
                            None if old is None else value_decoder.decode(old[: len(old) & ~7]),
                            None if new is None else value_decoder.decode(new[: len(new) & ~7]),
                            partition,
                        )
                finally:
                    emap.close()

        return produce

    value_type = to_arrow_type(value_schema)
    return Rows(
        rows(False),
        DIFF_FIELDS,
        {"change_type": "string", "partition_id": "int32"},
        {"key": to_arrow_type(key_schema), "old_value": value_type, "new_value": value_type},
        arrow_produce=rows(True),
    )


def read_metadata(path: str | os.PathLike[str]) -> Rows[tuple[Any, ...]]:
    """One row per operator and store, like ``spark.read.format("state-metadata")``:
    ``operatorId, operatorName, stateStoreName, numPartitions, minBatchId, maxBatchId,
    operatorProperties``; batch ids from the commit log (-1 when none). An operator whose
    metadata cannot be read is skipped with a warning.

    Parameters
    ----------
    path
        The checkpoint location (the folder holding ``offsets/``, ``commits/``, ``state/``).

    Returns
    -------
    Rows
        One row per operator and store.
    """
    checkpoint = _open(path)
    batches = checkpoint.committed_batches()
    low, high = (batches[0], batches[-1]) if batches else (-1, -1)
    rows = []
    for operator_id in checkpoint.operator_ids():
        metadata_path = checkpoint.operator_metadata_path(operator_id)
        if metadata_path is None:
            logger.warning("Operator %d of %s has no metadata file", operator_id, checkpoint.path)
            continue
        try:
            operator = checkpoint.operator(operator_id)
        except (OSError, ValueError) as exc:
            logger.warning("Skipping operator %d of %s: %s", operator_id, checkpoint.path, exc)
            continue
        for store in operator.stores:
            rows.append(
                (
                    operator.operator_id,
                    operator.operator_name,
                    store.store_name,
                    store.num_partitions,
                    low,
                    high,
                    operator.properties_json,
                )
            )
    return Rows(lambda: iter(rows), METADATA_FIELDS, _METADATA_TYPES)


def schema_of(fields: list[tuple[str, Any]]) -> StructType:
    """A ``StructType`` from ``(name, SparkType)`` pairs (a small helper for callers)."""
    return StructType(tuple(StructField(name, data_type) for name, data_type in fields))

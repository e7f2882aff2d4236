"""``write_state``: a Spark checkpoint whose state a streaming query resumes from.

Bootstraps the state of a stateful operator (typically a streaming ``groupBy().agg()``) from
rows computed elsewhere -- e.g. an extagg batch aggregation of historical data. Writes, for
``batch_id`` b:

* ``state/<op>/<p>/<b+1>.delta`` and ``<b+1>.snapshot`` for every shuffle partition p (empty
  ones too: Spark needs a file for the version), each key in the partition Spark's
  ``HashPartitioning`` gives it (Murmur3 of the key columns, seed 42, pmod the partitions);
* ``state/<op>/0/_metadata/schema`` (v2) and ``state/<op>/_metadata/metadata`` (v1);
* ``offsets/<b>`` (the SQL confs a restarted query takes from it, and the sources' offsets),
  ``commits/<b>`` and the query ``metadata`` file -- so the query's next batch is b + 1 and
  loads this state.

Every file is written atomically with Hadoop's ``.crc`` side file. Rows stream: one open
LZ4 block stream per partition file, never the whole state in memory.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import shutil
import struct
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from extagg.state.spark.datafile import AtomicFile, atomic_write
from extagg.state.spark.framing import LZ4BlockWriter
from extagg.state.spark.metadata import (
    OperatorInfo,
    StoreInfo,
    operator_metadata_text,
    schema_file_bytes,
)
from extagg.state.spark.partitioning import partition_for
from extagg.state.spark.types import StructType, parse_schema
from extagg.state.spark.unsaferow import RowEncoder

__all__ = ["write_state", "DEFAULT_CONF", "FILE_SOURCE_START"]

logger = logging.getLogger(__name__)

_INT = struct.Struct(">i")
#: the offset of a file source that has read nothing yet (its next batch reads every file)
FILE_SOURCE_START: dict[str, Any] = {"logOffset": -1}
#: SQL confs recorded in the offset log, as Spark 4 records them (shuffle partitions added)
DEFAULT_CONF = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.compression.codec": "lz4",
    "spark.sql.streaming.aggregation.stateFormatVersion": "2",
    "spark.sql.streaming.join.stateFormatVersion": "2",
    "spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion": "2",
    "spark.sql.streaming.multipleWatermarkPolicy": "min",
    "spark.sql.streaming.statefulOperator.useStrictDistribution": "true",
    "spark.sql.streaming.stateStore.rocksdb.formatVersion": "5",
    "spark.sql.streaming.stateStore.encodingFormat": "unsaferow",
}


class _PartitionFiles:
    """The delta and snapshot of one partition, written as records arrive."""

    def __init__(self, directory: str, version: int) -> None:
        self.files = [
            AtomicFile(os.path.join(directory, f"{version}.delta")),
            AtomicFile(os.path.join(directory, f"{version}.snapshot")),
        ]
        self.writers = [LZ4BlockWriter(f) for f in self.files]  # type: ignore[arg-type]
        self.count = 0

    def put(self, key: bytes, value: bytes) -> None:
        record = _INT.pack(len(key)) + key + _INT.pack(len(value)) + value
        for writer in self.writers:
            writer.write(record)
        self.count += 1

    def commit(self) -> None:
        for writer, target in zip(self.writers, self.files):
            writer.write(_INT.pack(-1))
            writer.finish()
            target.commit()

    def abort(self) -> None:
        for target in self.files:
            target.abort()


def _normalized_floats(value: Any) -> Any:
    """``value`` (a key row) with ``-0.0`` as ``0.0`` and every NaN as the one NaN, as
    Spark's ``NormalizeFloatingNumbers`` makes grouping keys: a key written with ``-0.0`` or
    another NaN's bits was never matched by the resumed query, which split the totals."""
    if isinstance(value, float):
        if value != value:
            return math.nan
        return 0.0 if value == 0.0 else value
    if isinstance(value, Mapping):
        return {name: _normalized_floats(v) for name, v in value.items()}
    if isinstance(value, tuple):  # a namedtuple or a pyspark Row too: by position, as before
        return tuple(_normalized_floats(v) for v in value)
    if isinstance(value, list):
        return [_normalized_floats(v) for v in value]
    return value


def _missing_parents(folder: str) -> list[str]:
    """``folder``'s ancestors that do not exist yet, deepest first (removed again if the write
    fails, when still empty)."""
    missing = []
    parent = os.path.dirname(os.path.abspath(folder))
    while parent and not os.path.exists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    return missing


def _ensure_open_files(needed: int, where: str) -> None:
    """Raise the soft limit of open files to fit ``needed`` more (every partition's delta and
    snapshot are written at once: 600 partitions failed with ``Too many open files`` under
    the common limit of 1 024), up to the hard limit; refuse before any file is made if even
    that is too low."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 256  # what the process has open already, and some to spare
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    if hard != resource.RLIM_INFINITY and hard < want:
        raise OSError(
            errno.EMFILE,
            f"writing {needed // 2} partitions keeps {needed} files open, beyond this process's "
            f"limit of {hard} open files (ulimit -n): raise it, or use fewer partitions",
            where,
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _schema(value: StructType | str | dict[str, Any]) -> StructType:
    return value if isinstance(value, StructType) else parse_schema(value)


def _write_log(path: str, lines: Sequence[Any]) -> None:
    text = "v1\n" + "\n".join(json.dumps(line, separators=(",", ":")) for line in lines)
    atomic_write(path, text.encode("utf-8"))


def write_state(
    checkpoint: str | os.PathLike[str],
    operator_id: int,
    key_schema: StructType | str | dict[str, Any],
    value_schema: StructType | str | dict[str, Any],
    rows: Iterable[tuple[Any, Any]],
    batch_id: int = 0,
    *,
    num_partitions: int = 200,
    operator_name: str = "stateStoreSave",
    source_offsets: Sequence[Any] = (FILE_SOURCE_START,),
    watermark_ms: int = 0,
    conf: dict[str, str] | None = None,
    query_id: str | None = None,
) -> dict[int, int]:
    """Write ``rows`` -- ``(key, value)`` pairs, each a dict by field name or a tuple by
    position of ``key_schema`` / ``value_schema`` -- as the state of operator ``operator_id``
    after batch ``batch_id``, in a new Spark checkpoint. Returns keys per partition.

    ``num_partitions`` must equal the query's ``spark.sql.shuffle.partitions`` (it is recorded
    in the offset log, which a restarted query obeys). ``source_offsets`` are the offsets of
    the query's sources after ``batch_id``, one JSON value each (default: one file source that
    has read nothing, so the resumed query reads every file of its input folder).
    Keys must be unique. For a ``groupBy().agg()`` the value schema is the aggregation buffer
    (e.g. ``count(*)`` -> ``count: long``, ``sum(long)`` -> ``sum: long``).

    Parameters
    ----------
    checkpoint
        The checkpoint folder (created; it must not hold this operator's state yet).
    operator_id
        The stateful operator the state belongs to (0 for a query's first aggregation).
    key_schema, value_schema
        Schemas of the key and value rows: a ``StructType``, or Spark's JSON schema as a string
        or dict.
    rows
        Unique ``(key, value)`` pairs.
    batch_id
        The batch after which this is the state; the resumed query starts at ``batch_id + 1``.
    num_partitions
        The query's ``spark.sql.shuffle.partitions``.
    operator_name
        Operator name recorded in the operator metadata.
    source_offsets
        Offsets of the query's sources after ``batch_id``, one JSON value each.
    watermark_ms
        Event-time watermark recorded in the offset log.
    conf
        Extra Spark confs recorded in the offset log.
    query_id
        The query id written to ``metadata`` (default: a new random id).

    Returns
    -------
    dict[int, int]
        Number of keys written per partition.

    Raises
    ------
    FileExistsError
        The operator's state, or a commit / offset of ``batch_id`` or later, already exists.
    ValueError
        A negative id or a non-positive ``num_partitions``.
    """
    path = os.fspath(checkpoint)
    if batch_id < 0 or operator_id < 0:
        raise ValueError(f"batch_id and operator_id must be >= 0, got {batch_id}, {operator_id}")
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    key_type, value_type = _schema(key_schema), _schema(value_schema)
    operator_dir = os.path.join(path, "state", str(operator_id))
    if os.path.exists(operator_dir):
        raise FileExistsError(f"{operator_dir} already exists: write_state bootstraps new state")
    for log in ("commits", "offsets"):
        existing = (
            [n for n in os.listdir(os.path.join(path, log))]
            if os.path.isdir(os.path.join(path, log))
            else []
        )
        if any(name.isdigit() and int(name) >= batch_id for name in existing):
            raise FileExistsError(
                f"{os.path.join(path, log)} already has batch {batch_id} or later"
            )
    key_encoder, value_encoder = RowEncoder(key_type), RowEncoder(value_type)
    version = batch_id + 1
    # a global aggregation (no key) runs in one partition: Spark writes partition 0 only, and
    # a resumed query would leave any other partition's folder without its next versions
    folders = num_partitions if key_type.fields else 1
    _ensure_open_files(2 * folders, operator_dir)
    made = _missing_parents(operator_dir)
    partitions: list[_PartitionFiles] = []
    try:
        for p in range(folders):
            partitions.append(_PartitionFiles(os.path.join(operator_dir, str(p)), version))
        for index, (key, value) in enumerate(rows):
            if value is None:
                raise ValueError(
                    f"row {index}: key {key!r} has no value: a state value cannot be null"
                )
            try:
                key = _normalized_floats(key)
                partition = partition_for(key, key_type, num_partitions) if key_type.fields else 0
                encoded_key = key_encoder.encode(key)
            except (struct.error, TypeError, ValueError, OverflowError, AttributeError) as exc:
                raise ValueError(
                    f"row {index}: key {key!r} does not fit the key schema: {exc}"
                ) from exc
            try:
                encoded_value = value_encoder.encode(value)
            except (struct.error, TypeError, ValueError, OverflowError, AttributeError) as exc:
                raise ValueError(
                    f"row {index}: value {value!r} of key {key!r} does not fit the value "
                    f"schema: {exc}"
                ) from exc
            partitions[partition].put(encoded_key, encoded_value)
        for files in partitions:
            files.commit()
    except BaseException:
        for files in partitions:
            files.abort()
        # nothing of this operator is left: a retry must not find its folders (it refuses an
        # operator that has state already)
        shutil.rmtree(operator_dir, ignore_errors=True)
        for folder in made:
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise
    atomic_write(
        os.path.join(operator_dir, "0", "_metadata", "schema"),
        schema_file_bytes(key_type, value_type),
    )
    operator = OperatorInfo(
        operator_id, operator_name, (StoreInfo("default", 0, num_partitions),), version=1
    )
    atomic_write(
        os.path.join(operator_dir, "_metadata", "metadata"),
        operator_metadata_text(operator).encode("utf-8"),
    )
    metadata = os.path.join(path, "metadata")
    if not os.path.exists(metadata):
        body = {"id": query_id or str(uuid.uuid4())}
        atomic_write(metadata, json.dumps(body, separators=(",", ":")).encode("utf-8"))
    confs = {**DEFAULT_CONF, "spark.sql.shuffle.partitions": str(num_partitions), **(conf or {})}
    batch_metadata = {
        "batchWatermarkMs": watermark_ms,
        "batchTimestampMs": int(time.time() * 1000),
        "conf": confs,
    }
    _write_log(os.path.join(path, "offsets", str(batch_id)), [batch_metadata, *source_offsets])
    before = os.path.join(path, "offsets", str(batch_id - 1))
    if batch_id > 0 and not os.path.exists(before):
        # a resumed query reads the offsets of the batch before the last one too ("batch N-1
        # doesn't exist" otherwise); batch_id is committed, so they only have to be there
        _write_log(before, [batch_metadata, *source_offsets])
    _write_log(
        os.path.join(path, "commits", str(batch_id)), [{"nextBatchWatermarkMs": watermark_ms}]
    )
    counts = {p: files.count for p, files in enumerate(partitions)}
    logger.info("Wrote %d keys of operator %d to %s", sum(counts.values()), operator_id, path)
    return counts

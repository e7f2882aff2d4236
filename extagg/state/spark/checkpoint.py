"""A Spark Structured Streaming checkpoint folder, read without a JVM.

Knows where Spark keeps things (``state/``, ``commits/``, ``offsets/``, ``metadata``), which
operators and stores exist, their schemas, and which batches committed; tells a Spark checkpoint
from an extagg one; refuses what it cannot read (RocksDB provider, row checksums) by name.
"""

from __future__ import annotations

import json
import logging
import os
from functools import cached_property
from typing import Any

from extagg.errors import CorruptFileError, ExtaggError
from extagg.state.errors import StateSourceError
from extagg.state.spark.framing import detect_codec
from extagg.state.spark.metadata import (
    OperatorInfo,
    StoreInfo,
    log_batches,
    read_log,
    read_operator_metadata,
    read_schema_file,
)
from extagg.state.spark.types import StructType

__all__ = ["SparkCheckpoint", "is_spark_checkpoint", "UnsupportedCheckpointError"]

logger = logging.getLogger(__name__)

DEFAULT_STORE = "default"
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


class UnsupportedCheckpointError(ExtaggError, ValueError):
    """A Spark checkpoint written in a way extagg does not read (e.g. the RocksDB provider)."""


def _head(path: str, size: int = 8) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(size)
    except OSError:
        return b""


def _numeric_dirs(path: str) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(path) if n.isdigit() and str(int(n)) == n)
    except (FileNotFoundError, NotADirectoryError):
        return []


def is_spark_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a checkpoint written by Spark (rather than by extagg's store).

    Parameters
    ----------
    path
        The checkpoint folder.

    Returns
    -------
    bool
        ``True`` when its offset log, operator metadata, data file framing or commit log is
        Spark's.
    """
    path = os.fspath(path)
    if os.path.isdir(os.path.join(path, "offsets")):
        return True
    state = os.path.join(path, "state")
    for operator in _numeric_dirs(state):
        meta = os.path.join(state, str(operator), "_metadata")
        if _head(os.path.join(meta, "metadata"), 3) in (b"v1\n", b"v2\n") or os.path.isdir(
            os.path.join(meta, "v2")
        ):
            return True
        for partition in _numeric_dirs(os.path.join(state, str(operator)))[:1]:
            directory = os.path.join(state, str(operator), str(partition))
            for name in sorted(os.listdir(directory))[:8]:
                if name.endswith((".delta", ".snapshot")) and not name.startswith("."):
                    return detect_codec(_head(os.path.join(directory, name))) is not None
    for batch in log_batches(os.path.join(path, "commits"))[-1:]:
        return _head(os.path.join(path, "commits", str(batch)), 3) == b"v1\n"
    return False


class SparkCheckpoint:
    """The Spark checkpoint at ``path``.

    Parameters
    ----------
    path
        The checkpoint folder (``checkpointLocation``).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.state_dir = os.path.join(self.path, "state")
        self.commits_dir = os.path.join(self.path, "commits")
        self.offsets_dir = os.path.join(self.path, "offsets")

    def __repr__(self) -> str:
        return f"SparkCheckpoint({self.path!r})"

    # --------------------------------------------------------------------------- logs
    def committed_batches(self) -> list[int]:
        """The batch ids in the commit log, ascending."""
        return log_batches(self.commits_dir)

    def last_committed_batch(self) -> int | None:
        """The newest committed batch id, or ``None`` when nothing was committed."""
        batches = self.committed_batches()
        return batches[-1] if batches else None

    def commit_entry(self, batch_id: int) -> dict[str, Any]:
        """``commits/<batch>``'s JSON (``nextBatchWatermarkMs``...)."""
        values = read_log(os.path.join(self.commits_dir, str(batch_id)))
        return values[0] if values else {}

    def offset_entry(self, batch_id: int) -> list[Any]:
        """``offsets/<batch>``: the batch metadata (``conf``...) then one offset per source."""
        return read_log(os.path.join(self.offsets_dir, str(batch_id)))

    def batch_conf(self, batch_id: int | None = None) -> dict[str, str]:
        """The SQL confs recorded in the offset log of ``batch_id`` (default: the newest)."""
        batches = log_batches(self.offsets_dir)
        if batch_id is None or batch_id not in batches:
            candidates = [b for b in batches if batch_id is None or b <= batch_id]
            if not candidates:
                return {}
            batch_id = candidates[-1]
        entry = self.offset_entry(batch_id)
        if not entry or not isinstance(entry[0], dict):
            return {}
        return dict(entry[0].get("conf") or {})

    @cached_property
    def query_id(self) -> str | None:
        path = os.path.join(self.path, "metadata")
        try:
            with open(path, encoding="utf-8") as handle:
                return json.loads(handle.readline()).get("id")
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise CorruptFileError(path, 0, f"bad query metadata JSON: {exc}") from None

    def check_supported(self, batch_id: int | None = None) -> None:
        """Refuse a checkpoint extagg cannot read: RocksDB (or another) provider, row checksums."""
        if batch_id is not None and batch_id in self.committed_batches():
            self.commit_entry(batch_id)  # refuses an unknown commit log version
        conf = self.batch_conf(batch_id)
        provider = conf.get("spark.sql.streaming.stateStore.providerClass", HDFS_PROVIDER)
        if provider != HDFS_PROVIDER:
            raise UnsupportedCheckpointError(
                f"{self.path} was written by state store provider {provider} (offsets log); "
                f"extagg reads Spark's default provider {HDFS_PROVIDER} only"
            )
        if conf.get("spark.sql.streaming.stateStore.rowChecksum.enabled", "false") == "true":
            raise UnsupportedCheckpointError(
                f"{self.path} has state row checksums enabled "
                "(spark.sql.streaming.stateStore.rowChecksum.enabled); extagg reads state "
                "without row checksums only"
            )
        for operator in self.operator_ids():
            base = os.path.join(self.state_dir, str(operator))
            for partition in _numeric_dirs(base)[:1]:
                names = os.listdir(os.path.join(base, str(partition)))
                if any(n.endswith((".zip", ".changelog")) or n == "SSTs" for n in names):
                    raise UnsupportedCheckpointError(
                        f"{os.path.join(base, str(partition))} holds RocksDB state store files "
                        "(.zip/.changelog/SSTs); extagg reads the HDFS-backed provider only"
                    )

    # ------------------------------------------------------------------------- operators
    def operator_ids(self) -> list[int]:
        """The ids of the operators that have a folder under ``state/``, ascending."""
        return _numeric_dirs(self.state_dir)

    def operator_dir(self, operator_id: int) -> str:
        """``state/<operator_id>`` of the checkpoint."""
        return os.path.join(self.state_dir, str(operator_id))

    def operator_metadata_path(self, operator_id: int) -> str | None:
        """The newest v2 metadata file if any, else the v1 file if present."""
        meta = os.path.join(self.operator_dir(operator_id), "_metadata")
        for v2 in (os.path.join(meta, "v2"), os.path.join(meta, "metadata", "v2")):
            batches = log_batches(v2)
            if batches:
                return os.path.join(v2, str(batches[-1]))
        v1 = os.path.join(meta, "metadata")
        return v1 if os.path.isfile(v1) else None

    def operator(self, operator_id: int) -> OperatorInfo:
        """The operator's metadata; inferred from its folders (with a warning) when absent."""
        path = self.operator_metadata_path(operator_id)
        if path is not None:
            return read_operator_metadata(path)
        base = self.operator_dir(operator_id)
        partitions = _numeric_dirs(base)
        stores = {DEFAULT_STORE} if partitions else set()
        for partition in partitions:
            directory = os.path.join(base, str(partition))
            stores.update(
                n
                for n in os.listdir(directory)
                if not n.startswith("_") and os.path.isdir(os.path.join(directory, n))
            )
            if any(n.endswith((".delta", ".snapshot")) for n in os.listdir(directory)):
                stores.add(DEFAULT_STORE)
        if not stores:
            raise StateSourceError(
                f"operator {operator_id} of {self.path} has neither metadata nor partitions",
                error_class="STDS_FAILED_TO_READ_OPERATOR_METADATA",
            )
        if any(s != DEFAULT_STORE for s in stores) and not any(
            os.path.isfile(os.path.join(base, str(p), "1.delta")) for p in partitions[:1]
        ):
            stores.discard(DEFAULT_STORE)
        logger.warning(
            "Operator %d of %s has no metadata file; assuming %d partitions and stores %s",
            operator_id,
            self.path,
            len(partitions),
            sorted(stores),
        )
        num = max(partitions, default=-1) + 1
        return OperatorInfo(
            operator_id, "", tuple(StoreInfo(s, 0, num) for s in sorted(stores)), version=0
        )

    def store_dir(self, operator_id: int, partition_id: int, store_name: str) -> str:
        """The folder of one store's files: ``state/<op>/<part>[/<store>]``."""
        base = os.path.join(self.operator_dir(operator_id), str(partition_id))
        return base if store_name == DEFAULT_STORE else os.path.join(base, store_name)

    def num_partitions(self, operator_id: int, store: StoreInfo, key_schema: StructType) -> int:
        """The partitions of a store to read: the metadata's ``numPartitions`` (the shuffle's),
        but 1 for a global aggregation (``groupBy().agg(...)``, keyed by ``struct<>``), whose
        state Spark keeps in partition 0 only. A partition without its folder is an error
        naming it, not a partial answer (Spark's reader counts the folders it finds)."""
        base = self.operator_dir(operator_id)
        found = set(_numeric_dirs(base))
        if not key_schema.fields and found == {0}:
            return 1
        missing = sorted(set(range(store.num_partitions)) - found)
        if found and missing:
            raise StateSourceError(
                f"[STDS_FAILED_TO_READ_STATE] operator {operator_id} of {self.path} has "
                f"{store.num_partitions} partitions but no folder for partition {missing[0]} "
                f"({os.path.join(base, str(missing[0]))}): its state is incomplete",
                error_class="STDS_FAILED_TO_READ_STATE",
            )
        return store.num_partitions

    def schemas(self, operator_id: int, store: StoreInfo) -> tuple[StructType, StructType]:
        """The key and value schemas of a store (v3 file named by metadata v2, else the v1/v2
        schema file of the lowest partition that has one)."""
        if store.schema_file:
            path = store.schema_file
            if path.startswith("file:"):
                path = path[5:].lstrip("/")
                path = "/" + path
            if os.path.isfile(path):
                return read_schema_file(path)
        for partition in range(store.num_partitions):
            path = os.path.join(
                self.store_dir(operator_id, partition, store.store_name), "_metadata", "schema"
            )
            if os.path.isfile(path):
                return read_schema_file(path)
        raise StateSourceError(
            f"[STDS_FAILED_TO_READ_STATE_SCHEMA] Failed to read the state schema of operator "
            f"{operator_id}, store {store.store_name!r} in {self.path}: no "
            "<partition>/_metadata/schema file",
            error_class="STDS_FAILED_TO_READ_STATE_SCHEMA",
        )

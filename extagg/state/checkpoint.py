"""A checkpoint: state stores per operator and partition, operator metadata, and a commit log.

Layout (as in a Spark checkpoint)::

    <checkpoint>/state/<operator_id>/_metadata/metadata     name, partitions, stores, codecs
    <checkpoint>/state/<operator_id>/<partition_id>/        files of the "default" store
    <checkpoint>/state/<operator_id>/<partition_id>/<name>/ files of store <name>
    <checkpoint>/commits/<batch_id>                          one file per committed batch

Version = batch id + 1; version 0 is the empty state before the first batch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from extagg.errors import CorruptFileError
from extagg.state.codec import KEY_CODEC, VALUE_CODEC, VALUE_CODEC_PICKLE
from extagg.state.conf import StateStoreConf
from extagg.state.errors import StateStoreCommitError, StateStoreError
from extagg.state.files import AtomicFile, list_state_files, remove_stale_temp_files
from extagg.state.provider import DEFAULT_STORE_NAME, StateStoreProvider

__all__ = ["Checkpoint", "Operator", "OperatorMetadata", "check_store_name"]

logger = logging.getLogger(__name__)

METADATA_FORMAT = "extagg-state-operator"
METADATA_VERSION = 1


def _check_id(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} cannot be negative, got {value}")
    return value


def check_store_name(name: Any) -> str:
    """A valid store name (a directory name that cannot be mistaken for a partition or file)."""
    if not isinstance(name, str):
        raise TypeError(f"store_name must be a str, not {type(name).__name__}")
    stripped = name.strip()
    if not stripped:
        raise ValueError("store_name cannot be empty")
    if (
        stripped != name
        or "/" in name
        or "\\" in name
        or name.startswith((".", "_"))
        or name.isdigit()
    ):
        raise ValueError(
            f"invalid store_name {name!r}: use a plain directory name without slashes, leading "
            "'.' or '_', surrounding spaces, and not all digits"
        )
    return name


@dataclass(frozen=True)
class OperatorMetadata:
    """What ``<checkpoint>/state/<operator_id>/_metadata/metadata`` records (JSON).

    Parameters
    ----------
    operator_id
        The operator's id (non-negative).
    operator_name
        A name for people and the metadata reader.
    num_partitions
        Partitions of the operator's state.
    store_names
        Store names used so far (``"default"`` first).
    key_codec
        Codec of keys in the state files (``"extagg1"``).
    value_codec
        Codec of values: ``"extagg1"``, or ``"extagg1+pickle"`` when pickle is allowed.
    """

    operator_id: int
    operator_name: str
    num_partitions: int
    store_names: tuple[str, ...]
    key_codec: str = KEY_CODEC
    value_codec: str = VALUE_CODEC

    @property
    def allow_pickle(self) -> bool:
        """Whether values may be pickled (the operator was created with ``allow_pickle``)."""
        return self.value_codec == VALUE_CODEC_PICKLE

    def to_json(self) -> str:
        """The JSON text written to the metadata file (sorted keys)."""
        return json.dumps(
            {
                "format": METADATA_FORMAT,
                "version": METADATA_VERSION,
                "operator_id": self.operator_id,
                "operator_name": self.operator_name,
                "num_partitions": self.num_partitions,
                "store_names": list(self.store_names),
                "key_codec": self.key_codec,
                "value_codec": self.value_codec,
            },
            indent=1,
            sort_keys=True,
        )

    @classmethod
    def read(cls, path: str) -> OperatorMetadata:
        """Parse a metadata file; :class:`~extagg.errors.CorruptFileError` (a ``ValueError``)
        naming the file when it is not one."""
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
            if data.get("format") != METADATA_FORMAT:
                raise ValueError(f"format is {data.get('format')!r}, not {METADATA_FORMAT!r}")
            if data.get("version") != METADATA_VERSION:
                raise ValueError(f"unsupported metadata version {data.get('version')!r}")
            if data["key_codec"] != KEY_CODEC or data["value_codec"] not in (
                VALUE_CODEC,
                VALUE_CODEC_PICKLE,
            ):
                raise ValueError(
                    f"unknown codecs {data['key_codec']!r}/{data['value_codec']!r} "
                    "(written by a newer extagg?)"
                )
            return cls(
                operator_id=int(data["operator_id"]),
                operator_name=str(data["operator_name"]),
                num_partitions=int(data["num_partitions"]),
                store_names=tuple(str(name) for name in data["store_names"]),
                key_codec=data["key_codec"],
                value_codec=data["value_codec"],
            )
        except (OSError, UnicodeDecodeError) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise CorruptFileError(path, None, f"cannot read operator metadata: {exc}") from exc
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # a CorruptFileError (a ValueError, as this was) names the file, as for the
            # state's other files
            reason = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise CorruptFileError(path, None, f"invalid operator metadata: {reason}") from exc

    def write(self, path: str) -> None:
        """Write atomically (temp file + rename); ``StateStoreCommitError`` names the file."""
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            target = AtomicFile(path)
            target.write(self.to_json().encode("utf-8"))
            target.commit()
        except OSError as exc:
            raise StateStoreCommitError(
                f"cannot write operator metadata {path}: {exc.strerror or exc}"
            ) from exc


@contextlib.contextmanager
def _metadata_lock(path: str) -> Iterator[None]:
    """Hold an exclusive lock on operator metadata ``path`` (a ``flock`` on ``path.lock``)
    while it is read, changed and written: processes that open an operator with new store
    names at once lost each other's names (31 of 40 in a probe)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no flock (Windows): one writer at a time
        yield
        return
    try:
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a read-only checkpoint: nothing is written to it either
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


class Checkpoint:
    """A checkpoint directory; nothing is created until an operator or commit is written.

    Parameters
    ----------
    path
        The checkpoint directory (``state/`` and ``commits/`` live under it).

    Examples
    --------
    >>> import tempfile
    >>> cp = Checkpoint(tempfile.mkdtemp())
    >>> op = cp.operator(0, name="totals", num_partitions=2)
    >>> cp.last_committed_batch() is None
    True
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.state_dir = os.path.join(self.path, "state")
        self.commits_dir = os.path.join(self.path, "commits")
        self.remove_stale_temp_files()

    def remove_stale_temp_files(self) -> list[str]:
        """Remove the temp files writers killed mid-commit left in ``commits/`` and in the
        operators' ``_metadata/`` (each store directory is cleaned when its provider opens it).
        Returns the removed paths."""
        removed = remove_stale_temp_files(self.commits_dir)
        for operator_id in self.operator_ids():
            removed += remove_stale_temp_files(os.path.dirname(self.metadata_path(operator_id)))
        return removed

    def __repr__(self) -> str:
        return f"Checkpoint({self.path!r})"

    def metadata_path(self, operator_id: int) -> str:
        """Path of the metadata file of ``operator_id``."""
        return os.path.join(self.state_dir, str(operator_id), "_metadata", "metadata")

    def operator_ids(self) -> list[int]:
        """Operators with a directory under ``state/``, ascending."""
        try:
            names = os.listdir(self.state_dir)
        except FileNotFoundError:
            return []
        return sorted(
            int(name)
            for name in names
            if name.isdigit() and os.path.isdir(os.path.join(self.state_dir, name))
        )

    def operator_metadata(self, operator_id: int) -> OperatorMetadata | None:
        """The recorded metadata of ``operator_id`` (``None`` if it has none)."""
        try:
            return OperatorMetadata.read(self.metadata_path(operator_id))
        except FileNotFoundError:
            return None

    def inferred_operator_metadata(self, operator_id: int) -> OperatorMetadata:
        """Metadata for an operator directory without a metadata file (Spark: warn, assume):
        as many partitions as its highest partition folder says, and the stores found."""
        directory = os.path.join(self.state_dir, str(operator_id))
        partitions = [int(name) for name in os.listdir(directory) if name.isdigit()]
        stores = {DEFAULT_STORE_NAME}
        for partition in partitions:
            base = os.path.join(directory, str(partition))
            stores.update(
                name for name in os.listdir(base) if os.path.isdir(os.path.join(base, name))
            )
        logger.warning(
            "Operator %d of %s has no metadata file; assuming %d partitions and stores %s",
            operator_id,
            self.path,
            max(partitions, default=-1) + 1,
            sorted(stores),
        )
        return OperatorMetadata(
            operator_id, "", max(partitions, default=-1) + 1, tuple(sorted(stores))
        )

    def operator(
        self,
        operator_id: int,
        name: str | None = None,
        num_partitions: int | None = None,
        *,
        allow_pickle: bool | None = None,
        store_names: tuple[str, ...] | list[str] | None = None,
    ) -> Operator:
        """Open (and on first use record) operator ``operator_id``'s metadata.

        A new operator needs ``num_partitions``; an existing one checks that the given
        ``name``, ``num_partitions`` and ``allow_pickle`` match what was recorded
        (``ValueError`` naming both values otherwise). Store names used later by
        :meth:`Operator.provider` are added to the metadata.
        """
        _check_id(operator_id, "operator_id")
        if store_names is not None:
            store_names = tuple(check_store_name(store) for store in store_names)
        with _metadata_lock(self.metadata_path(operator_id)):
            return self._open_operator(operator_id, name, num_partitions, allow_pickle, store_names)

    def _open_operator(
        self,
        operator_id: int,
        name: str | None,
        num_partitions: int | None,
        allow_pickle: bool | None,
        store_names: tuple[str, ...] | None,
    ) -> Operator:
        existing = self.operator_metadata(operator_id)
        if existing is None:
            if num_partitions is None:
                raise ValueError(
                    f"operator {operator_id} of {self.path} has no metadata yet: pass "
                    "num_partitions to create it"
                )
            _check_id(num_partitions, "num_partitions")
            if num_partitions == 0:
                raise ValueError("num_partitions must be at least 1")
            metadata = OperatorMetadata(
                operator_id=operator_id,
                operator_name=name if name is not None else f"operator_{operator_id}",
                num_partitions=num_partitions,
                store_names=store_names or (DEFAULT_STORE_NAME,),
                value_codec=VALUE_CODEC_PICKLE if allow_pickle else VALUE_CODEC,
            )
            metadata.write(self.metadata_path(operator_id))
            return Operator(self, metadata)
        mismatches = []
        if name is not None and name != existing.operator_name:
            mismatches.append(f"operator name {name!r} (recorded {existing.operator_name!r})")
        if num_partitions is not None and num_partitions != existing.num_partitions:
            mismatches.append(
                f"number of partitions {num_partitions} (recorded {existing.num_partitions})"
            )
        if allow_pickle is not None and bool(allow_pickle) != existing.allow_pickle:
            mismatches.append(
                f"allow_pickle={bool(allow_pickle)} (recorded {existing.allow_pickle})"
            )
        if mismatches:
            raise ValueError(
                f"operator {operator_id} of checkpoint {self.path} does not match its metadata: "
                + "; ".join(mismatches)
                + ". Use a new checkpoint location (or operator id) for a changed operator."
            )
        operator = Operator(self, existing)
        for store in store_names or ():
            operator.add_store_name(store, locked=True)
        return operator

    # ------------------------------------------------------------------ commit log
    def commit(self, batch_id: int) -> None:
        """Record that every partition committed batch ``batch_id`` (version ``batch_id + 1``).

        Checks every store directory that holds state files: each must have the batch's delta
        (``StateStoreError`` naming the first that does not), and every partition that held
        state at the previous commit must still have its files (a partition lost to a bad
        copy is not taken for one that never held state). The commit records the partitions
        that hold state, which the readers check the same way. Re-committing is allowed.
        """
        _check_id(batch_id, "batch_id")
        version = batch_id + 1
        before = [b for b in self.committed_batches() if b < batch_id]
        held: dict[str, dict[str, list[int]]] = {}
        for operator_id in self.operator_ids():
            # without its metadata file (lost), checked as the readers read it: from the
            # partition folders, rather than not at all
            metadata = self.operator_metadata(operator_id) or self.inferred_operator_metadata(
                operator_id
            )
            operator = Operator(self, metadata)
            for store in metadata.store_names:
                had = self.partitions_with_state(before[-1], operator_id, store) if before else None
                partitions = held.setdefault(str(operator_id), {}).setdefault(store, [])
                for partition in range(metadata.num_partitions):
                    listing = list_state_files(operator.store_directory(partition, store))
                    if not listing.deltas and not listing.snapshots:
                        if had is not None and partition in had:
                            raise StateStoreError(
                                f"cannot commit batch {batch_id} of {self.path}: partition "
                                f"{partition} of operator {operator_id} (store {store!r}) held "
                                f"state at batch {before[-1]} but "
                                f"{operator.store_directory(partition, store)} has no state file"
                            )
                        continue
                    if version not in listing.deltas:
                        raise StateStoreError(
                            f"cannot commit batch {batch_id} of {self.path}: partition "
                            f"{partition} of operator {operator_id} (store {store!r}) has not "
                            f"committed version {version} "
                            f"({os.path.join(listing.directory, f'{version}.delta')} is missing)"
                        )
                    partitions.append(partition)
        path = os.path.join(self.commits_dir, str(batch_id))
        entry = {"batch_id": batch_id, "version": 1, "partitions_with_state": held}
        try:
            os.makedirs(self.commits_dir, exist_ok=True)
            target = AtomicFile(path)
            target.write(json.dumps(entry, sort_keys=True).encode("utf-8"))
            target.commit()
        except OSError as exc:  # the batch stays uncommitted; the commit can be retried
            raise StateStoreCommitError(
                f"cannot commit batch {batch_id} of {self.path}: writing {path} failed: "
                f"{exc.strerror or exc}"
            ) from exc
        logger.info("Committed batch %d of %s", batch_id, self.path)

    def partitions_with_state(
        self, batch_id: int, operator_id: int, store_name: str = DEFAULT_STORE_NAME
    ) -> frozenset[int] | None:
        """The partitions of a store that held state when batch ``batch_id`` was committed,
        or ``None`` if its commit does not say (written before this was recorded, or not
        committed)."""
        path = os.path.join(self.commits_dir, str(batch_id))
        try:
            with open(path, "rb") as handle:
                entry = json.loads(handle.read().decode("utf-8"))
            recorded = entry["partitions_with_state"][str(operator_id)][store_name]
        except (FileNotFoundError, KeyError, TypeError):
            return None
        except (OSError, ValueError) as exc:
            raise CorruptFileError(path, None, f"unreadable commit file: {exc}") from exc
        if not isinstance(recorded, list) or not all(isinstance(p, int) for p in recorded):
            raise CorruptFileError(
                path,
                None,
                f"'partitions_with_state' of operator {operator_id} store {store_name!r} "
                "is not a list of partition ids",
            )
        return frozenset(recorded)

    def committed_batches(self) -> list[int]:
        """Committed batch ids, ascending (numeric file names under ``commits/``)."""
        try:
            names = os.listdir(self.commits_dir)
        except FileNotFoundError:
            return []
        return sorted(int(name) for name in names if name.isdigit() and str(int(name)) == name)

    def last_committed_batch(self) -> int | None:
        """The newest committed batch id, or ``None``."""
        batches = self.committed_batches()
        return batches[-1] if batches else None


class Operator:
    """One stateful operator of a checkpoint; hands out a provider per partition and store.

    Obtained from :meth:`Checkpoint.operator`.

    Parameters
    ----------
    checkpoint
        The checkpoint it belongs to.
    metadata
        Its recorded metadata.
    """

    def __init__(self, checkpoint: Checkpoint, metadata: OperatorMetadata) -> None:
        self.checkpoint = checkpoint
        self.metadata = metadata
        self.operator_id = metadata.operator_id
        self.directory = os.path.join(checkpoint.state_dir, str(metadata.operator_id))

    def __repr__(self) -> str:
        m = self.metadata
        return (
            f"Operator(id={m.operator_id}, name={m.operator_name!r}, "
            f"partitions={m.num_partitions}, stores={list(m.store_names)})"
        )

    def store_directory(self, partition_id: int, store_name: str = DEFAULT_STORE_NAME) -> str:
        """``<state>/<op>/<partition>`` for the default store, else ``.../<store_name>``."""
        base = os.path.join(self.directory, str(partition_id))
        return base if store_name == DEFAULT_STORE_NAME else os.path.join(base, store_name)

    def add_store_name(self, store_name: str, *, locked: bool = False) -> None:
        """Record ``store_name`` in the metadata (if new), under the metadata's lock
        (``locked``: the caller holds it)."""
        check_store_name(store_name)
        if store_name in self.metadata.store_names:
            return
        if not locked:
            with _metadata_lock(self.checkpoint.metadata_path(self.operator_id)):
                self.add_store_name(store_name, locked=True)
            return
        current = self.checkpoint.operator_metadata(self.operator_id) or self.metadata
        names = current.store_names
        if store_name not in names:
            names = (*names, store_name)
        self.metadata = OperatorMetadata(
            operator_id=current.operator_id,
            operator_name=current.operator_name,
            num_partitions=current.num_partitions,
            store_names=names,
            key_codec=current.key_codec,
            value_codec=current.value_codec,
        )
        self.metadata.write(self.checkpoint.metadata_path(self.operator_id))

    def provider(
        self,
        partition_id: int,
        store_name: str = DEFAULT_STORE_NAME,
        conf: StateStoreConf | None = None,
        *,
        memory_manager: Any = None,
    ) -> StateStoreProvider:
        """The state store provider of ``partition_id`` and ``store_name``."""
        _check_id(partition_id, "partition_id")
        if partition_id >= self.metadata.num_partitions:
            raise ValueError(
                f"partition_id {partition_id} is out of range: operator {self.operator_id} has "
                f"{self.metadata.num_partitions} partitions"
            )
        self.add_store_name(store_name)
        return StateStoreProvider(
            self.store_directory(partition_id, store_name),
            operator_id=self.operator_id,
            partition_id=partition_id,
            store_name=store_name,
            conf=conf,
            memory_manager=memory_manager,
            allow_pickle=self.metadata.allow_pickle,
        )

"""StateStore: a writable view of one version, committed as the next version's delta.

A store reads through to the loaded version's dict (shared with the cache, never modified) and
keeps its own changes on top, so ``get_store`` costs nothing and an abort costs nothing. Keys
and values are encoded on ``put`` (a bad type fails there, naming it) and the changes are written
at ``commit`` as one sorted delta file, atomically. Nothing touches the disk before ``commit``.

Values handed out by ``get``/``items`` are the caller's own: mutable ones (lists, pickled
objects) are copies, so mutating them cannot change a cached version; ``put`` them back to
store a change.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from extagg.state.codec import canonical_key, decode_value, encode_key, encode_value
from extagg.state.conf import StateStoreMetrics
from extagg.state.errors import StateStoreError

if TYPE_CHECKING:
    from extagg.state.cache import LoadedVersion

__all__ = ["CommitChanges", "ReadStateStore", "RemovedKey", "StateStore", "StoreOwner"]

#: ``(version, base mapping, changes, encoded bytes, expected identity of the new delta) -> new
#: version``: writes a store's changes as ``version + 1``, fenced against a concurrent writer
#: (the provider's commit, handed to the stores it makes)
CommitChanges = Callable[
    [int, dict[Any, Any], dict[Any, tuple[bytes, bytes | None, Any]], int, object], int
]


class StoreOwner(Protocol):
    """What a store reads of the provider that made it (its identity, options and metrics)."""

    directory: str
    operator_id: int
    partition_id: int
    store_name: str
    allow_pickle: bool

    @property
    def metrics(self) -> StateStoreMetrics: ...


logger = logging.getLogger(__name__)

_MISSING = object()


class _KeyProbe:
    """Finds the key object a dict holds for an equal key (``True`` for ``1``) in one lookup:
    the dict compares its stored key with the probe, and the stored key's ``__eq__`` defers to
    the probe's, which notes it."""

    __slots__ = ("key", "found")

    def __init__(self, key: Any) -> None:
        self.key = key
        self.found: Any = _MISSING

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        if self.key is other or self.key == other:  # `is`: the canonical NaN is not ==
            self.found = other
            return True
        return False


def _stored_key(mapping: dict[Any, Any], key: Any) -> Any:
    """The key object ``mapping`` holds for ``key`` (``key`` itself if none is equal)."""
    probe = _KeyProbe(key)
    return probe.found if probe in mapping and probe.found is not _MISSING else key


class RemovedKey:
    """A change's dict key for the delete of a stored key that the batch then put again as an
    equal key with other bytes (``remove(True)``, ``put(1, v)``): as in a dict, the new key
    object replaces the old one, so the delta holds both records, the delete of the old bytes
    and the put of the new. Equal only to another ``RemovedKey`` of the same bytes (never to a
    key), so it never shadows one.

    Parameters
    ----------
    key_bytes
        The encoded key the delete is recorded with.
    key
        The key object removed (equal to the stored one).
    """

    __slots__ = ("key_bytes", "key")

    def __init__(self, key_bytes: bytes, key: Any) -> None:
        self.key_bytes = key_bytes
        self.key = key

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RemovedKey):
            return self.key_bytes == other.key_bytes
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.key_bytes)


_SCALARS = (int, float, str, bytes, bool, type(None))

UPDATING, COMMITTED, ABORTED = "UPDATING", "COMMITTED", "ABORTED"


def _is_immutable(value: Any) -> bool:
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is tuple:
        return all(_is_immutable(item) for item in value)
    return False


class ReadStateStore:
    """A read-only view of ``version`` of a provider's state (``provider.get_read_store(v)``).

    ``get`` is O(1) on the loaded version; ``put``, ``remove`` and ``commit`` raise
    :class:`StateStoreError`.

    Parameters
    ----------
    provider
        The provider it reads from.
    loaded
        The loaded version (internal; obtain stores from the provider).
    """

    def __init__(self, provider: StoreOwner, loaded: LoadedVersion) -> None:
        self._provider = provider
        self._base = loaded.mapping
        self._loaded = loaded
        self.version = loaded.version
        self._allow_pickle = provider.allow_pickle

    # ------------------------------------------------------------------ reading
    def _own(self, value: Any) -> Any:
        """``value`` itself if immutable, else a private deep copy."""
        if _is_immutable(value):
            return value
        if self._allow_pickle:
            return copy.deepcopy(value)
        return decode_value(encode_value(value))

    def _lookup(self, key: Hashable) -> Any:
        return self._base.get(canonical_key(key), _MISSING)

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when the key is absent."""
        value = self._lookup(key)
        return default if value is _MISSING else self._own(value)

    def __contains__(self, key: Hashable) -> bool:
        return self._lookup(key) is not _MISSING

    def __len__(self) -> int:
        return len(self._base)

    def _keys_snapshot(self) -> list[Any]:
        return list(self._base)

    def items(self) -> Iterator[tuple[Any, Any]]:
        """``(key, value)`` pairs. The key list is taken at the first ``next``; puts and
        removes made while iterating are allowed (removed keys are skipped, new keys unseen)."""
        for key in self._keys_snapshot():
            value = self._lookup(key)
            if value is not _MISSING:
                yield key, self._own(value)

    def keys(self) -> Iterator[Any]:
        """The keys (same snapshot rule as :meth:`items`)."""
        for key, _value in self.items():
            yield key

    __iter__ = keys

    @property
    def metrics(self) -> StateStoreMetrics:
        """Metrics of this store: its key count, and the provider's cache figures."""
        provider = self._provider.metrics
        return StateStoreMetrics(
            num_keys=len(self),
            memory_used_bytes=provider.memory_used_bytes,
            state_on_current_version_size_bytes=self._state_bytes(),
            loaded_map_cache_hit_count=provider.loaded_map_cache_hit_count,
            loaded_map_cache_miss_count=provider.loaded_map_cache_miss_count,
        )

    def _state_bytes(self) -> int:
        return self._loaded.encoded_bytes

    # ------------------------------------------------------------------ writing
    def put(self, key: Hashable, value: Any) -> None:
        """Not allowed: raises :class:`StateStoreError`."""
        raise StateStoreError(f"Cannot put into a read-only state store: {self!r}")

    def remove(self, key: Hashable) -> None:
        """Not allowed: raises :class:`StateStoreError`."""
        raise StateStoreError(f"Cannot remove from a read-only state store: {self!r}")

    def commit(self) -> int:
        """Not allowed: raises :class:`StateStoreError`."""
        raise StateStoreError(f"Cannot commit a read-only state store: {self!r}")

    def abort(self) -> None:
        """Nothing to discard in a read-only store."""

    @property
    def has_committed(self) -> bool:
        return False

    def __enter__(self) -> ReadStateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()

    def __repr__(self) -> str:
        p = self._provider
        return (
            f"{type(self).__name__}[id=(op={p.operator_id},part={p.partition_id},"
            f"store={p.store_name}),version={self.version},dir={p.directory}]"
        )


class StateStore(ReadStateStore):
    """A writable view of ``version`` :meth:`commit` writes ``version + 1``.

    States: updating → committed | aborted. ``put`` rejects ``None`` values (Spark: "Cannot put
    a null value"); ``remove`` of an absent key records nothing. A store used after commit or
    abort raises :class:`StateStoreError`. As a context manager it aborts unless committed.
    ``put``/``remove`` are O(1); ``commit`` writes the changed keys sorted, O(k log k) for k
    changes. Memory held: the loaded version (a dict, accounted as storage memory) plus the
    changes. Obtained from ``provider.get_store(v)``.

    Parameters
    ----------
    provider
        The provider it belongs to.
    loaded
        The loaded version (internal; obtain stores from the provider).
    commit
        The provider's function that writes the changes as version ``version + 1``.
    expected_delta
        Identity of ``version + 1``'s delta file when the store was opened (``None``: absent),
        which fences the commit against a concurrent writer.
    """

    def __init__(
        self,
        provider: StoreOwner,
        loaded: LoadedVersion,
        commit: CommitChanges,
        *,
        expected_delta: object = None,
    ) -> None:
        super().__init__(provider, loaded)
        self._commit = commit
        #: identity of ``version + 1``'s delta when opened (None: absent): fences the commit
        self._expected_delta = expected_delta
        # key -> (encoded key, encoded value or None for a delete, value object or None)
        self._changes: dict[Any, tuple[bytes, bytes | None, Any]] = {}
        #: how many :class:`RemovedKey` entries ``_changes`` holds (usually none)
        self._replaced = 0
        self._size = len(self._base)
        self._bytes = loaded.encoded_bytes
        self._state = UPDATING

    def _lookup(self, key: Hashable) -> Any:
        key = canonical_key(key)
        change = self._changes.get(key)
        if change is None:
            if self._replaced and self._removed_entry(key) is not None:
                return _MISSING  # its stored key was removed, and the key put since removed
            return self._base.get(key, _MISSING)
        return _MISSING if change[1] is None else change[2]

    def __len__(self) -> int:
        return self._size

    def _keys_snapshot(self) -> list[Any]:
        keys = [key for key in self._base if key not in self._changes]
        for key, change in self._changes.items():
            if change[1] is None:
                continue
            if key in self._base and self._removed_entry(key) is None:
                # a put keeps the stored key object (``put(1.0, v)`` over a stored 1 leaves 1),
                # as the committed version will show it
                key = _stored_key(self._base, key)
            keys.append(key)
        return keys

    def _state_bytes(self) -> int:
        return self._bytes

    def _check(self, action: str) -> None:
        if self._state != UPDATING:
            raise StateStoreError(f"Cannot {action} after already committed or aborted: {self!r}")

    def _touch(self, key: Hashable) -> tuple[bytes | None, bool]:
        """The encoded key this batch already uses for ``key`` (or None), and whether the key
        is in the base version; accounts the base entry's bytes on first touch."""
        change = self._changes.get(key)
        if change is not None:
            return change[0], key in self._base and self._removed_entry(key) is None
        old = self._base.get(key, _MISSING)
        if old is _MISSING or self._removed_entry(key) is not None:  # (already accounted)
            return None, False
        self._bytes -= len(encode_key(key)) + len(encode_value(old, self._allow_pickle))
        return None, True

    def _removed_entry(self, key: Any) -> RemovedKey | None:
        """The recorded delete of the stored key equal to ``key``, if this batch removed it and
        then put an equal key with other bytes (the stored key is then gone: ``key``'s entry
        is the new key's alone)."""
        if not self._replaced:
            return None
        entry = RemovedKey(encode_key(_stored_key(self._base, key)), key)
        return entry if entry in self._changes else None

    def put(self, key: Hashable, value: Any) -> None:
        """Set ``key`` to ``value`` (encoded now; ``TypeError`` names an unsupported type)."""
        self._check("put")
        key = canonical_key(key)  # every NaN is one key, as on disk
        if value is None:
            raise ValueError(f"Cannot put a null value (key {key!r}) into {self!r}")
        new_key = encode_key(key)
        encoded = encode_value(value, self._allow_pickle)
        if not _is_immutable(value):  # keep what was encoded, not what the caller may mutate
            value = decode_value(encoded, self._allow_pickle)
        key_bytes, in_base = self._touch(key)
        if self._lookup(key) is _MISSING:
            self._size += 1
        if key_bytes is None:
            key_bytes = new_key
        else:  # an earlier put/remove of this batch; its live entry (if any) leaves the count
            previous = self._changes[key]
            if previous[1] is not None:
                self._bytes -= len(previous[0]) + len(previous[1])
            elif in_base and key_bytes != new_key:
                # removed, now put again as an equal key with other bytes: the new key object
                # wins, as in a dict (del d[True]; d[1] = v holds 1): the delete stays, apart
                # and before the put (in the delta too: deletes of one hash replay first)
                del self._changes[key]
                self._changes[RemovedKey(key_bytes, key)] = (key_bytes, None, None)
                self._replaced += 1
                key_bytes = new_key
        if self._replaced and self._changes.pop(RemovedKey(key_bytes, key), None) is not None:
            self._replaced -= 1  # the put has the stored key's bytes: it replaces the delete
            self._changes.pop(key, None)  # and goes after the deletes kept
        self._changes[key] = (key_bytes, encoded, value)
        self._bytes += len(key_bytes) + len(encoded)

    def remove(self, key: Hashable) -> None:
        """Remove ``key``; a key that is not there is ignored (no delete is recorded)."""
        self._check("remove")
        key = canonical_key(key)
        if self._lookup(key) is _MISSING:
            return
        _key_bytes, in_base = self._touch(key)
        previous = self._changes.get(key)
        if previous is not None and previous[1] is not None:
            self._bytes -= len(previous[0]) + len(previous[1])
        self._size -= 1
        if in_base:  # the delete names the stored key's bytes (True's, for a remove(1))
            self._changes[key] = (encode_key(_stored_key(self._base, key)), None, None)
        else:  # added in this batch only: nothing to record
            del self._changes[key]

    def commit(self) -> int:
        """Write the changes as ``version + 1`` (atomically) and return the new version."""
        self._check("commit")
        new_version = self._commit(
            self.version, self._base, self._changes, self._bytes, self._expected_delta
        )  # on failure the store stays updating: commit again, or abort
        self._state = COMMITTED
        return new_version

    def abort(self) -> None:
        """Discard the changes (nothing was written); a committed store stays committed."""
        if self._state == UPDATING:
            self._state = ABORTED
            self._changes = {}
            logger.debug("Aborted version %d of %r", self.version + 1, self)

    @property
    def has_committed(self) -> bool:
        """Whether :meth:`commit` succeeded."""
        return self._state == COMMITTED

    def __enter__(self) -> StateStore:
        return self

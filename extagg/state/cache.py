"""The cache of loaded versions: blocks of the unified memory manager's ``MemoryStore``.

Each cached version is one storage block whose size is a deterministic estimate of the loaded
dict (sampled deep size), so the bytes are accounted against the memory budget and execution
memory can evict them. At most ``max_versions`` versions stay cached, with Spark's rule
(``putStateIntoStateCacheMap``): when full, a version older than every cached one is not
inserted, otherwise the oldest cached version makes room.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
from collections.abc import Hashable
from typing import Any

from extagg.collection.size_estimator import estimate_size

__all__ = ["LoadedVersion", "VersionCache", "estimate_map_size"]

logger = logging.getLogger(__name__)

#: entries measured to estimate a loaded map
SAMPLE_ENTRIES = 128

_instance_counter = itertools.count()


def estimate_map_size(mapping: dict[Any, Any]) -> int:
    """Bytes a loaded version holds: the dict plus the deep size of an evenly spaced sample of
    its entries, scaled to all entries. Deterministic; O(len) in C plus O(sample) in Python."""
    total = sys.getsizeof(mapping)
    count = len(mapping)
    if count == 0:
        return total
    step = max(1, count // SAMPLE_ENTRIES)
    measured = 0
    sampled = 0
    for key, value in itertools.islice(mapping.items(), 0, None, step):
        measured += estimate_size(key) + estimate_size(value)
        sampled += 1
    return total + measured * count // sampled


class LoadedVersion:
    """One version in memory: its dict, its encoded bytes and its estimated size."""

    __slots__ = ("encoded_bytes", "estimated_size", "mapping", "version")

    def __init__(self, version: int, mapping: dict[Any, Any], encoded_bytes: int) -> None:
        self.version = version
        self.mapping = mapping
        self.encoded_bytes = encoded_bytes
        self.estimated_size = estimate_map_size(mapping)


class VersionCache:
    """The cached versions of one provider (thread-safe).

    ``memory_store`` is a :class:`extagg.memory.MemoryStore`; ``label`` names the provider in
    block ids, which are unique per provider instance so a fresh provider never sees another
    one's blocks.
    """

    def __init__(self, memory_store: Any, label: str, max_versions: int) -> None:
        self._store = memory_store
        self._prefix = f"state:{label}#{next(_instance_counter)}:"
        self._max_versions = max_versions
        self._sizes: dict[int, int] = {}  # cached version -> block size
        self._tokens: dict[int, int] = {}  # cached version -> id() of the cached object
        self._lock = threading.RLock()
        self.hits = 0
        self.misses = 0

    def block_id(self, version: int) -> str:
        """The ``MemoryStore`` block id of ``version``."""
        return f"{self._prefix}{version}"

    @property
    def versions(self) -> list[int]:
        """Cached versions, ascending."""
        with self._lock:
            return sorted(self._sizes)

    @property
    def memory_used(self) -> int:
        """Storage bytes held by this cache's blocks."""
        with self._lock:
            return sum(self._sizes.values())

    def get(self, version: int) -> LoadedVersion | None:
        """The cached ``version`` or ``None`` (not cached, or evicted by the memory manager)."""
        with self._lock:
            if version not in self._sizes:
                return None
        loaded = self._store.get(self.block_id(version))
        if loaded is None:
            with self._lock:
                self._sizes.pop(version, None)
                self._tokens.pop(version, None)
        return loaded

    def newest_at_or_below(self, version: int) -> LoadedVersion | None:
        """The newest cached version ``<= version`` still in memory, or ``None``."""
        for candidate in sorted((v for v in self.versions if v <= version), reverse=True):
            loaded = self.get(candidate)
            if loaded is not None:
                return loaded
        return None

    def put(self, loaded: LoadedVersion) -> bool:
        """Cache ``loaded`` under Spark's at-most-``max_versions`` rule; ``True`` if cached."""
        version = loaded.version
        with self._lock:
            if self._max_versions <= 0:
                self._clear_locked()
                return False
            while len(self._sizes) > self._max_versions:
                self._remove_locked(min(self._sizes))
            if len(self._sizes) == self._max_versions and version not in self._sizes:
                oldest = min(self._sizes)
                if oldest > version:
                    return False
                self._remove_locked(oldest)
            stored = self._store.put(
                self.block_id(version), loaded, loaded.estimated_size, self._on_evict
            )
            if stored:
                self._sizes[version] = loaded.estimated_size
                self._tokens[version] = id(loaded)
            else:
                self._sizes.pop(version, None)
                self._tokens.pop(version, None)
                logger.info(
                    "State version %d (%d bytes) could not be cached: storage memory is full",
                    version,
                    loaded.estimated_size,
                )
            return stored

    def invalidate_from(self, version: int) -> None:
        """Drop every cached version ``>= version`` (they are being rewritten)."""
        with self._lock:
            for cached in [v for v in self._sizes if v >= version]:
                self._remove_locked(cached)

    def clear(self) -> None:
        """Drop every cached version, freeing its storage memory."""
        with self._lock:
            self._clear_locked()

    def _clear_locked(self) -> None:
        for cached in list(self._sizes):
            self._remove_locked(cached)

    def _remove_locked(self, version: int) -> None:
        self._sizes.pop(version, None)
        self._tokens.pop(version, None)
        self._store.remove(self.block_id(version))

    def _on_evict(self, block_id: Hashable, value: Any) -> None:
        """The memory manager evicted one of our blocks: forget it (it is rebuilt from files)."""
        text = str(block_id)
        if not text.startswith(self._prefix):
            return
        version = int(text[len(self._prefix) :])
        with self._lock:
            if self._tokens.get(version) == id(value):  # not a newer block of that version
                self._sizes.pop(version, None)
                self._tokens.pop(version, None)
        logger.debug("State version %d was evicted from storage memory", version)

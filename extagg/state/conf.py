"""Settings and metrics of state store providers (Spark's StateStoreConf and store metrics)."""

from __future__ import annotations

from dataclasses import dataclass

from extagg._config import DEFAULT_FAN_IN
from extagg.state.files import COMPRESSIONS

__all__ = ["StateStoreConf", "StateStoreMetrics"]


@dataclass(frozen=True)
class StateStoreConf:
    """How a provider snapshots, retains, caches and compresses versions.

    Parameters
    ----------
    min_deltas_for_snapshot
        Spark's ``stateStore.minDeltasForSnapshot``: maintenance (and ``merge_update``) writes a
        snapshot once more than this many deltas follow the last snapshot.
    min_versions_to_retain
        Spark's ``minBatchesToRetain``: cleanup keeps every file needed to rebuild the last
        this-many versions.
    max_versions_in_memory
        Spark's ``maxBatchesToRetainInMemory``: loaded versions cached in the memory manager's
        ``MemoryStore`` (0 disables the cache).
    compression
        ``"lz4"`` or ``"none"`` for the files written.
    fan_in
        Most files merged at once when streaming a version (more: merged in passes).
    """

    min_deltas_for_snapshot: int = 10
    min_versions_to_retain: int = 100
    max_versions_in_memory: int = 2
    compression: str = "lz4"
    fan_in: int = DEFAULT_FAN_IN

    def __post_init__(self) -> None:
        for name, minimum in (
            ("min_deltas_for_snapshot", 1),
            ("min_versions_to_retain", 1),
            ("max_versions_in_memory", 0),
            ("fan_in", 2),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"StateStoreConf.{name} must be an int, not {value!r}")
            if value < minimum:
                raise ValueError(f"StateStoreConf.{name} must be at least {minimum}, got {value}")
        if self.compression not in COMPRESSIONS:
            raise ValueError(
                f"StateStoreConf.compression must be one of {sorted(COMPRESSIONS)}, "
                f"got {self.compression!r}"
            )


@dataclass(frozen=True)
class StateStoreMetrics:
    """A provider's (or a store's) metrics, named as in Spark.

    Parameters
    ----------
    num_keys
        Keys of the current version (the last loaded, committed or merged one).
    memory_used_bytes
        Storage memory held by this provider's cached versions.
    state_on_current_version_size_bytes
        Encoded bytes (keys + values) of the current version.
    loaded_map_cache_hit_count
        Version loads served from the cache.
    loaded_map_cache_miss_count
        Version loads rebuilt from files.
    """

    num_keys: int = 0
    memory_used_bytes: int = 0
    state_on_current_version_size_bytes: int = 0
    loaded_map_cache_hit_count: int = 0
    loaded_map_cache_miss_count: int = 0

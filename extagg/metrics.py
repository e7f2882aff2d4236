"""Metrics every engine exposes: what came in, what spilled, what it cost."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from extagg._config import format_size

__all__ = ["SpillMetrics"]


@dataclass
class SpillMetrics:
    """Counters of one aggregation (Spark's task metrics plus merge figures).

    ``memory_bytes_spilled`` is the in-memory size of what was spilled (the estimate at spill
    time), ``disk_bytes_spilled`` the bytes written to run files (after compression),
    ``raw_bytes_spilled`` the same before compression. ``spill_count`` counts spill events,
    ``num_spill_files`` run files written by spills (merge passes write more files, counted in
    ``merge_files``; ``merge_passes`` counts those intermediate merges — the final merge into
    the caller's iterator is not counted). ``peak_memory_bytes`` is the largest in-memory size
    seen; ``peak_granted_bytes`` the most memory held from the manager at once.
    """

    records_read: int = 0
    groups: int = 0
    spill_count: int = 0
    num_spill_files: int = 0
    memory_bytes_spilled: int = 0
    disk_bytes_spilled: int = 0
    raw_bytes_spilled: int = 0
    peak_memory_bytes: int = 0
    peak_granted_bytes: int = 0
    spill_time_s: float = 0.0
    merge_time_s: float = 0.0
    merge_passes: int = 0
    merge_files: int = 0

    def absorb(self, other: SpillMetrics) -> None:
        """Add the spill and merge figures of a helper's metrics (a partition's aggregator);
        records and groups are not added (they are counted where they are read and handed
        out)."""
        self.spill_count += other.spill_count
        self.num_spill_files += other.num_spill_files
        self.memory_bytes_spilled += other.memory_bytes_spilled
        self.disk_bytes_spilled += other.disk_bytes_spilled
        self.raw_bytes_spilled += other.raw_bytes_spilled
        self.spill_time_s += other.spill_time_s
        self.merge_time_s += other.merge_time_s
        self.merge_passes += other.merge_passes
        self.merge_files += other.merge_files
        self.peak_memory_bytes = max(self.peak_memory_bytes, other.peak_memory_bytes)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def summary(self) -> str:
        """One human line, for logs and the CLI."""
        return (
            f"{self.records_read:,} records -> {self.groups:,} groups; "
            f"{self.spill_count} spills ({self.num_spill_files} files, "
            f"{format_size(self.memory_bytes_spilled)} in memory, "
            f"{format_size(self.disk_bytes_spilled)} on disk); "
            f"peak {format_size(self.peak_memory_bytes)}; "
            f"spill {self.spill_time_s:.2f} s, merge {self.merge_time_s:.2f} s "
            f"in {self.merge_passes} pass(es)"
        )

"""Metrics every engine exposes: what came in, what spilled, what it cost."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from extagg._config import format_size

__all__ = ["SpillMetrics"]


@dataclass
class SpillMetrics:
    """Counters of one aggregation (Spark's task metrics plus merge figures).

    The ``.metrics`` of a map or aggregator.

    Parameters
    ----------
    records_read
        Records (rows) inserted.
    groups
        Distinct keys produced by the last iteration.
    spill_count
        Spill events.
    num_spill_files
        Run files written by spills.
    memory_bytes_spilled
        In-memory size of what was spilled (the estimate at spill time).
    disk_bytes_spilled
        Bytes written to run files, after compression.
    raw_bytes_spilled
        The same before compression.
    peak_memory_bytes
        Largest in-memory size seen.
    peak_granted_bytes
        Most memory held from the manager at once.
    spill_time_s
        Seconds spent spilling.
    merge_time_s
        Seconds spent merging.
    merge_passes
        Intermediate merge passes (the final merge into the caller is not counted).
    merge_files
        Run files written by those passes.
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
        """Every counter by name (for JSON and benchmarks)."""
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

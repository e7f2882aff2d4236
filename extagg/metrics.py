"""Metrics every engine exposes: what came in, what spilled, what it cost."""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from extagg._config import format_size

__all__ = ["RunMetrics", "SpillMetrics", "register_metrics", "run_metrics"]


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

    def take_spills_of(self, helpers: Iterable[SpillMetrics]) -> None:
        """Set the spill and merge figures to the sum of ``helpers``' (the thread partitions'
        aggregators, which do all the spilling of a threaded one): live while they run,
        never counted twice however often it is called."""
        total = SpillMetrics()
        for other in helpers:
            total.absorb(other)
        for name in _HELPER_FIELDS:
            setattr(self, name, getattr(total, name))
        self.peak_memory_bytes = max(self.peak_memory_bytes, total.peak_memory_bytes)

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


@dataclass
class RunMetrics:
    """What one file aggregation (``aggregate_files`` / ``extagg aggregate``) did and cost.

    Live while the run goes on (progress callbacks get this object), final once ``finished``.

    Attributes
    ----------
    rows_read, bytes_read
        Input rows and bytes read so far.
    rows_total
        Input rows to read: known for Parquet (after row groups skipped by the filter),
        ``None`` otherwise.
    bytes_total
        Total size of the input files.
    files
        Number of input files.
    row_groups_read, row_groups_total
        Parquet row groups read, of all row groups (the rest were skipped by ``where``).
    files_skipped
        Parquet files whose hive folder names ``where`` excludes: left out unopened (their
        row groups are not in ``row_groups_total``).
    groups
        Distinct groups aggregated (with ``limit``: those merged before the limit was
        reached, when ``groups_partial``).
    groups_partial
        The result was cut at ``limit`` before every group was merged.
    rows_out
        Result rows produced (after ``having`` and ``limit``).
    spill_count, num_spill_files
        Times the aggregation spilled, and run files written.
    memory_bytes_spilled, disk_bytes_spilled
        Bytes released from memory by spills, and bytes written to disk.
    sort_runs
        Sorted runs written by the external sort of ``sort=True`` or ``order_by``.
    peak_granted_bytes, budget_bytes
        Peak memory granted by the memory manager, and the budget.
    wall_time_s, input_time_s
        Wall time of the run, and the part of it spent reading input.
    rss_import_bytes
        Process RSS when the run started (interpreter and imports).
    rss_fixed_bytes
        RSS once the kernels the query needs were loaded (a few rows of the first batch
        folded by a throwaway aggregator), before the run folds any data: the fixed cost;
        the rest of ``peak_rss_bytes`` is data.
    peak_rss_bytes
        Peak RSS of the process.
    finished
        Whether the run has ended (the figures are final).
    """

    rows_read: int = 0
    rows_total: int | None = None
    bytes_read: int = 0
    bytes_total: int = 0
    files: int = 0
    row_groups_read: int = 0
    row_groups_total: int = 0
    files_skipped: int = 0
    groups: int = 0
    groups_partial: bool = False
    rows_out: int = 0
    spill_count: int = 0
    num_spill_files: int = 0
    memory_bytes_spilled: int = 0
    disk_bytes_spilled: int = 0
    sort_runs: int = 0
    peak_granted_bytes: int = 0
    budget_bytes: int = 0
    wall_time_s: float = 0.0
    input_time_s: float = 0.0
    rss_import_bytes: int = 0
    rss_fixed_bytes: int = 0
    peak_rss_bytes: int = 0
    finished: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The figures as a plain dict (field name -> value), as ``--json-summary`` writes."""
        return asdict(self)

    @property
    def rows_per_s(self) -> float:
        return self.rows_read / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def summary(self) -> str:
        """The end-of-run paragraph the CLI prints on stderr."""
        fixed = min(self.rss_fixed_bytes, self.peak_rss_bytes)
        data = self.peak_rss_bytes - fixed
        notes = []
        if self.row_groups_total:
            notes.append(f"{self.row_groups_read} of {self.row_groups_total} Parquet row groups")
        if self.files_skipped:
            notes.append(f"{self.files_skipped:,} files skipped by their folder names")
        rg = f" ({'; '.join(notes)})" if notes else ""
        spilled = (
            "Nothing spilled"
            if not self.spill_count
            else f"Spilled {_counted(self.spill_count, 'time')}: "
            f"{format_size(self.memory_bytes_spilled)} in memory, "
            f"{format_size(self.disk_bytes_spilled)} on disk"
        )
        return (
            f"Read {_counted(self.rows_read, 'row')} ({format_size(self.bytes_read)} in "
            f"{_counted(self.files, 'file')}{rg}) into "
            f"{'at least ' if self.groups_partial else ''}{_counted(self.groups, 'group')} "
            f"({_counted(self.rows_out, 'row')} out) in "
            f"{self.wall_time_s:.2f} s, {self.rows_per_s:,.0f} rows/s. {spilled}. "
            "Peak memory granted "
            f"{format_size(self.peak_granted_bytes)} of a {format_size(self.budget_bytes)} "
            f"budget; peak RSS {format_size(self.peak_rss_bytes)} = fixed "
            f"{format_size(fixed)} (interpreter, imports, the query's kernels; "
            f"{format_size(self.rss_import_bytes)} before the first batch) + data "
            f"{format_size(data)}."
        )


def _counted(n: int, noun: str) -> str:
    """``1 row``, ``2 rows``, ``1,000 rows``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


_METRICS: weakref.WeakKeyDictionary[Any, RunMetrics] = weakref.WeakKeyDictionary()
_META_KEY = b"extagg.metrics"


def register_metrics(result: Any, metrics: RunMetrics) -> None:
    """Make ``metrics`` reachable from ``result`` through :func:`run_metrics`."""
    _METRICS[result] = metrics


def metrics_metadata(metrics: RunMetrics | SpillMetrics) -> dict[bytes, bytes]:
    """Schema metadata carrying ``metrics`` (how a returned ``pyarrow.Table`` keeps them)."""
    kind = "run" if isinstance(metrics, RunMetrics) else "spill"
    return {_META_KEY: json.dumps({"kind": kind, **metrics.as_dict()}).encode()}


def run_metrics(result: Any) -> RunMetrics | SpillMetrics:
    """The metrics of what ``aggregate`` / ``aggregate_files`` returned.

    A ``pyarrow.RecordBatchReader`` from ``aggregate_files`` → its live :class:`RunMetrics`
    (final after the reader is exhausted); a ``pyarrow.Table`` from ``aggregate`` → the
    :class:`SpillMetrics` stored in its schema metadata (``b"extagg.metrics"``, JSON);
    a ``RunMetrics`` (what ``aggregate_files(..., output=...)`` returns) → itself.

    Parameters
    ----------
    result
        What ``aggregate`` or ``aggregate_files`` returned.

    Returns
    -------
    RunMetrics | SpillMetrics
        The run's metrics.

    Raises
    ------
    ValueError
        ``result`` carries no extagg metrics.
    """
    if isinstance(result, (RunMetrics, SpillMetrics)):
        return result
    try:
        found = _METRICS.get(result)
    except TypeError:
        found = None
    if found is not None:
        return found
    schema = getattr(result, "schema", None)
    meta = getattr(schema, "metadata", None) or {}
    if _META_KEY in meta:
        data = json.loads(meta[_META_KEY])
        kind = data.pop("kind", "spill")
        cls = RunMetrics if kind == "run" else SpillMetrics
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})
    raise ValueError(
        f"{type(result).__name__} carries no extagg metrics (only what aggregate() and "
        "aggregate_files() return does)"
    )


#: the figures :meth:`SpillMetrics.absorb` adds up (peak memory is a maximum instead)
_HELPER_FIELDS = (
    "spill_count",
    "num_spill_files",
    "memory_bytes_spilled",
    "disk_bytes_spilled",
    "raw_bytes_spilled",
    "spill_time_s",
    "merge_time_s",
    "merge_passes",
    "merge_files",
)

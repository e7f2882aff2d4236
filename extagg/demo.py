"""The built-in demo: aggregate a few million generated records under a small budget.

It exists so a new user sees the whole engine work — folding, spilling, merging — with one
command, and so the figures it prints can be checked: the totals are verified against NumPy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from extagg._config import format_size, parse_size
from extagg._progress import progress_bar, progress_enabled
from extagg._sysinfo import current_rss, peak_rss, reset_peak_rss
from extagg.generic.aggregator import Aggregator
from extagg.generic.external_map import ExternalAppendOnlyMap

__all__ = ["run_demo"]

log = logging.getLogger(__name__)

CHUNK = 16_384  # records generated at a time: the input holds ~2 MiB, not the budget


def generate(records: int, keys: int, seed: int, bar: Any) -> Iterator[tuple[int, float]]:
    """``records`` (user id, amount) pairs with Zipf-like skew, generated chunk by chunk."""
    rng = np.random.default_rng(seed)
    for start in range(0, records, CHUNK):
        n = min(CHUNK, records - start)
        ids = (rng.pareto(1.2, n) * keys / 8).astype(np.int64) % keys
        amounts = np.round(rng.gamma(2.0, 20.0, n), 2)
        yield from zip(ids.tolist(), amounts.tolist())
        bar.update(n)


def generate_batches(records: int, keys: int, seed: int) -> Iterator[dict[str, np.ndarray]]:
    """The same records as :func:`generate`, as column batches for the columnar engine."""
    rng = np.random.default_rng(seed)
    for start in range(0, records, CHUNK):
        n = min(CHUNK, records - start)
        ids = (rng.pareto(1.2, n) * keys / 8).astype(np.int64) % keys
        amounts = np.round(rng.gamma(2.0, 20.0, n), 2)
        yield {"user": ids, "amount": amounts}


def run_columnar(records: int, keys: int, seed: int, budget: int) -> tuple[int, int, float]:
    """The same aggregation with the numba engine; prints its figures, returns the totals."""
    from extagg.columnar import HashAggregator

    aggs = {"n": ("*", "count"), "total": ("amount", "sum"), "hi": ("amount", "max")}
    started = time.perf_counter()
    with HashAggregator(keys=["user"], aggs=aggs, memory=budget, force_spill_rows=500) as warm:
        warm.update(next(generate_batches(2_000, keys, seed)))  # compiles or loads the kernels
        for _ in warm.results():
            pass
    print(
        f"\ncolumnar kernels ready in {time.perf_counter() - started:.2f} s (numba compiles them "
        "on first use and caches them; later runs load them)"
    )
    started = time.perf_counter()
    with HashAggregator(
        keys=["user"],
        aggs=aggs,
        memory=budget,
    ) as agg:
        for batch in generate_batches(records, keys, seed):
            agg.update(batch)
        groups = count = 0
        total = 0.0
        for out in agg.results():
            groups += out.num_rows
            count += int(out.column("n").to_numpy().sum())
            total += float(out.column("total").to_numpy().sum())
        metrics = agg.metrics
    elapsed = time.perf_counter() - started
    print(
        f"columnar engine (numba), same data and budget: {groups:,} groups in {elapsed:.2f} s "
        f"({records / elapsed:,.0f} records/s); {metrics.spill_count} spills, "
        f"{format_size(metrics.disk_bytes_spilled)} on disk, "
        f"peak granted {format_size(metrics.peak_granted_bytes)}"
    )
    return groups, count, total


def expected_totals(records: int, keys: int, seed: int) -> tuple[int, float]:
    """The number of distinct keys and the grand total, computed independently with NumPy."""
    rng = np.random.default_rng(seed)
    seen = np.zeros(keys, dtype=bool)
    total = 0.0
    for start in range(0, records, CHUNK):
        n = min(CHUNK, records - start)
        ids = (rng.pareto(1.2, n) * keys / 8).astype(np.int64) % keys
        amounts = np.round(rng.gamma(2.0, 20.0, n), 2)
        seen[ids] = True
        total += float(amounts.sum())
    return int(seen.sum()), total


def run_demo(
    records: int = 3_000_000,
    keys: int = 1_000_000,
    memory: str = "32m",
    seed: int = 42,
    spill_dirs: list[str] | None = None,
) -> int:
    """Aggregate count/sum/max per key under ``memory``; print results and spill metrics."""
    budget = parse_size(memory, name="memory")
    print(
        f"extagg demo: {records:,} records over up to {keys:,} keys, "
        f"sum/count/max per key under a {format_size(budget)} budget"
    )
    aggregator: Aggregator[float, list[float]] = Aggregator(
        lambda v: [1, v, v],
        lambda c, v: [c[0] + 1, c[1] + v, max(c[2], v)],
        lambda a, b: [a[0] + b[0], a[1] + b[1], max(a[2], b[2])],
    )
    # load the compiled kernels first: their code is fixed overhead, not memory the map holds
    with ExternalAppendOnlyMap(aggregator, memory=budget, spill_dirs=spill_dirs) as warm_up:
        warm_up.insert_all((i % 100, 1.0) for i in range(2_000))
        for _ in warm_up.iterator():
            pass
    rss_start = current_rss()
    reset_peak_rss()
    started = time.perf_counter()
    bar = progress_bar(enabled=progress_enabled(True), total=records, unit="rec", desc="folding")
    with ExternalAppendOnlyMap(aggregator, memory=budget, spill_dirs=spill_dirs) as emap:
        emap.insert_all(generate(records, keys, seed, bar))
        bar.close()
        folded = time.perf_counter()
        groups = 0
        count = 0
        total = 0.0
        top: list[tuple[int, int, float, float]] = []
        for key, (n, s, hi) in emap.iterator():
            groups += 1
            count += n
            total += s
            if len(top) < 5 or n > top[-1][1]:
                top = sorted([*top, (key, n, s, hi)], key=lambda t: -t[1])[:5]
        merged = time.perf_counter()
        metrics = emap.metrics
    rss_peak = peak_rss()
    want_groups, want_total = expected_totals(records, keys, seed)
    ok = groups == want_groups and count == records and abs(total - want_total) < 1e-6 * want_total
    print(f"\n{'key':>10} {'count':>8} {'sum':>14} {'max':>10}")
    for key, n, s, hi in top:
        print(f"{key:>10} {n:>8,} {s:>14,.2f} {hi:>10,.2f}")
    elapsed = merged - started
    print(
        f"\nresult: {groups:,} groups, {count:,} records, total {total:,.2f} "
        f"({'verified against NumPy' if ok else 'MISMATCH with NumPy'})"
    )
    print(
        f"time: {elapsed:.2f} s ({records / elapsed:,.0f} records/s; "
        f"fold {folded - started:.2f} s, merge {merged - folded:.2f} s)"
    )
    print(
        f"spills: {metrics.spill_count} ({metrics.num_spill_files} run files, "
        f"{format_size(metrics.memory_bytes_spilled)} in memory -> "
        f"{format_size(metrics.disk_bytes_spilled)} on disk, "
        f"{format_size(metrics.raw_bytes_spilled)} before LZ4), merge passes {metrics.merge_passes}"
    )
    print(
        f"memory: peak map estimate {format_size(metrics.peak_memory_bytes)}, "
        f"peak granted {format_size(metrics.peak_granted_bytes)} of {format_size(budget)}; "
        f"process RSS {format_size(rss_start)} at start (kernels loaded), peak "
        f"{format_size(rss_peak)} (+{format_size(max(0, rss_peak - rss_start))}, input "
        f"generator included)"
    )
    col_groups, col_count, col_total = run_columnar(records, keys, seed, budget)
    col_ok = (
        col_groups == want_groups
        and col_count == records
        and abs(col_total - want_total) < 1e-6 * want_total
    )
    print(f"columnar result {'matches' if col_ok else 'DOES NOT MATCH'} NumPy")
    return 0 if ok and col_ok else 1

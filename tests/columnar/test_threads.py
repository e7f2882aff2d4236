"""``threads=N`` in the columnar engine: same rows in the same order for every thread count.

The threaded path (thread partitions by the top hash bits, a child per partition on a worker's
memory task, :mod:`extagg.columnar.threaded`) is compared with ``threads=1`` (order and values)
and with a plain-Python reference (values), spills forced; errors in a worker must stop every
worker, reach the caller with their own type and leave no file and no memory behind.
"""

from __future__ import annotations

import decimal
import math
import os
import platform
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extagg import _malloc as M
from extagg.columnar import HashAggregator, aggregate
from extagg.columnar import _key_reference as KR
from extagg.columnar import _radix_kernels as RK
from extagg.columnar import threaded as T
from extagg.errors import MemoryLimitError, SpillError
from extagg.memory import UnifiedMemoryManager

from .reference import assert_same_groups, reference_groupby, result_dict

THREADS = (1, 2, 4, 8)


@pytest.fixture(autouse=True)
def _pool_even_for_small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny test inputs go through the thread pool too (not the caller-thread shortcut)."""
    monkeypatch.setattr(T, "INLINE_ROWS", 0)


def _files(path: Path) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


# ----------------------------------------------------------------------------- the kernel


@settings(max_examples=60, deadline=None)
@given(
    hashes=st.lists(st.integers(0, 2**64 - 1), max_size=300),
    bits=st.integers(1, T.MAX_PARTITION_BITS),
)
def test_radix_partition_matches_reference(hashes: list[int], bits: int) -> None:
    h = np.array(hashes, dtype=np.uint64)
    got_order, got_bounds = np.empty(len(h), np.int64), np.empty((1 << bits) + 1, np.int64)
    want_order, want_bounds = np.empty(len(h), np.int64), np.empty((1 << bits) + 1, np.int64)
    RK.radix_partition(h, bits, got_order, got_bounds)
    KR.radix_partition(h, bits, want_order, want_bounds)
    assert got_order.tolist() == want_order.tolist()
    assert got_bounds.tolist() == want_bounds.tolist()


@settings(max_examples=40, deadline=None)
@given(
    hashes=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=100),
    picks=st.lists(st.integers(0, 10**6), max_size=100),
    bits=st.integers(0, 63),
    width=st.integers(1, 3),
)
def test_gather_kernels_match_reference(
    hashes: list[int], picks: list[int], bits: int, width: int
) -> None:
    h = np.array(hashes, dtype=np.uint64)
    rows = np.array([p % len(h) for p in picks], dtype=np.int64)
    words = (h[:, None] * np.arange(1, width + 1, dtype=np.uint64)).copy()
    got, want = np.empty(len(rows), np.uint64), np.empty(len(rows), np.uint64)
    RK.gather_hashes(h, rows, bits, got)
    KR.gather_hashes(h, rows, bits, want)
    assert got.tolist() == want.tolist()
    got_w, want_w = np.empty((len(rows), width), np.uint64), np.empty((len(rows), width), np.uint64)
    RK.gather_words(words, rows, got_w)
    KR.gather_words(words, rows, want_w)
    assert got_w.tolist() == want_w.tolist()


def test_partition_bits() -> None:
    assert [T.partition_bits(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [0, 1, 2, 2, 3, 3, 4]
    assert T.partition_bits(10_000) == T.MAX_PARTITION_BITS


# ----------------------------------------------------------------------------- same results

AGGS = {
    "o_n": ("*", "count"),
    "o_sum": ("v", "sum"),
    "o_first": ("v", "first"),
    "o_last": ("v", "last"),
    "o_smin": ("s", "min"),
    "o_smax": ("s", "max"),
    "o_fsum": ("f", "sum"),
}


def _table(rows: list[tuple[int | None, str | None, int | None, float]]) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([r[0] for r in rows], pa.int64()),
            "s": pa.array([r[1] for r in rows], pa.string()),
            "v": pa.array([r[2] for r in rows], pa.int64()),
            "f": pa.array([r[3] for r in rows], pa.float64()),
        }
    )


def _batches(table: pa.Table, size: int) -> list[pa.RecordBatch]:
    return table.to_batches(max_chunksize=size)


def _assert_same(got: pa.Table, want: pa.Table, keys: list[str], floats: list[str]) -> None:
    """Same rows in the same order; float columns within rounding (sum order may differ)."""
    assert got.schema.names == want.schema.names
    assert got.num_rows == want.num_rows
    for name in got.schema.names:
        g, w = got[name].to_pylist(), want[name].to_pylist()
        if name in floats:
            assert all(
                (a is None and b is None) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
                for a, b in zip(g, w)
            ), name
        else:
            assert g == w, name


row = st.tuples(
    st.one_of(st.none(), st.integers(-50, 50), st.integers(-(2**63), 2**63 - 1)),
    st.one_of(st.none(), st.text(max_size=6)),
    st.one_of(st.none(), st.integers(-1000, 1000)),
    st.floats(-1e6, 1e6),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(row, min_size=1, max_size=400),
    keys=st.sampled_from([["k"], ["s"], ["k", "s"]]),
    batch=st.integers(1, 200),
    spill_every=st.one_of(st.none(), st.integers(20, 200)),
    order_free=st.booleans(),
)
def test_same_rows_same_order_for_every_thread_count(
    rows: list[tuple[int | None, str | None, int | None, float]],
    keys: list[str],
    batch: int,
    spill_every: int | None,
    order_free: bool,
) -> None:
    """``order_free``: without first/last, so few groups fold into thread-local tables."""
    table = _table(rows)
    aggs = {k: v for k, v in AGGS.items() if v[0] not in keys}
    if order_free:
        aggs = {k: v for k, v in aggs.items() if v[1] not in ("first", "last")}
    outs = {}
    for threads in THREADS:
        outs[threads] = aggregate(
            _batches(table, batch),
            keys,
            aggs,
            threads=threads,
            memory="64m",
            force_spill_rows=spill_every,
        )
    for threads in THREADS[1:]:
        _assert_same(outs[threads], outs[1], keys, ["o_fsum"])
    want = reference_groupby(table.to_pydict(), keys, aggs)
    assert_same_groups(result_dict(outs[8], keys), want)


@settings(max_examples=10, deadline=None)
@given(
    values=st.lists(
        st.tuples(st.integers(0, 30), st.decimals(-(10**6), 10**6, places=2, allow_nan=False)),
        min_size=1,
        max_size=200,
    )
)
def test_decimal_and_count_distinct(values: list[tuple[int, decimal.Decimal]]) -> None:
    table = pa.table(
        {
            "k": pa.array([v[0] for v in values], pa.int32()),
            "d": pa.array([v[1] for v in values], pa.decimal128(12, 2)),
        }
    )
    aggs = {"sd": ("d", "sum"), "mx": ("d", "max"), "nd": ("d", "count_distinct")}
    outs = [aggregate(table, "k", aggs, threads=t, memory="64m") for t in THREADS]
    for out in outs[1:]:
        assert out.equals(outs[0])
    groups: dict[int, list[decimal.Decimal]] = {}
    for k, d in values:
        groups.setdefault(k, []).append(d.quantize(decimal.Decimal("0.01")))
    want = {(k,): {"sd": sum(ds), "mx": max(ds), "nd": len(set(ds))} for k, ds in groups.items()}
    assert result_dict(outs[-1], ["k"]) == want


def _spill_input(n: int = 60_000, distinct: int = 30_000) -> pa.Table:
    rng = np.random.default_rng(3)
    idx = rng.integers(0, distinct, n)
    keys = (idx.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
    return pa.table({"k": keys, "v": rng.integers(0, 100, n), "f": rng.random(n)})


def test_spilling_threads_same_result_and_budget_held(tmp_path: Path) -> None:
    """A budget that makes every thread's child spill: same output as one thread, the memory
    granted to all threads together never above the budget, no file left."""
    table = _spill_input(150_000, 100_000)
    aggs = {"s": ("v", "sum"), "n": ("*", "count"), "m": ("f", "mean"), "l": ("v", "last")}
    want = aggregate(table, "k", aggs, threads=1, memory="64m")
    for threads in (2, 4):
        with HashAggregator("k", aggs, memory="8m", threads=threads, spill_dirs=str(tmp_path),
                            chunk_rows=2048) as agg:  # fmt: skip
            for b in _batches(table, 7000):
                agg.update(b)
            assert agg.threads == threads
            spilled = agg.metrics.spill_count  # live: the partitions' spills seen at once
            assert spilled > 0 and agg.metrics.disk_bytes_spilled > 0
            got = pa.Table.from_batches(list(agg.results()))
            assert agg.metrics.spill_count == spilled  # not counted again at the results
            assert 0 < agg.metrics.peak_granted_bytes <= 8 << 20
            assert agg.metrics.records_read == table.num_rows
        _assert_same(got, want, ["k"], ["m"])
        assert _files(tmp_path) == []


def test_small_budget_falls_back_to_fewer_threads(caplog: pytest.LogCaptureFixture) -> None:
    table = _spill_input(20_000, 5_000)
    want = aggregate(table, "k", {"s": ("v", "sum")}, threads=1, memory="2m")
    with (
        caplog.at_level("INFO", logger="extagg.columnar.hash_aggregator"),
        HashAggregator("k", {"s": ("v", "sum")}, memory="2m", threads=8) as agg,
    ):
        agg.update(table)
        assert agg.threads < 8
        got = pa.Table.from_batches(list(agg.results()))
    assert "thread partitions" in caplog.text
    assert got.equals(want)


def test_default_thread_count_needs_a_budget_for_large_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Threads not asked for: every core when the budget gives chunks of 2**16 rows and more
    (here, one int key and one value: ~113 MiB) and 32 MiB per partition, one thread below
    (where two threads were measured slower than one, and past the limit in RSS); an explicit
    count is obeyed down to the engine minimum."""
    monkeypatch.delenv("EXTAGG_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    table = _spill_input(70_000, 20_000)
    want = aggregate(table, "k", {"s": ("v", "sum")}, threads=1, memory="64m")
    cases = (("512m", None, 2), ("160m", None, 2), ("100m", None, 1), ("72m", None, 1),
             ("32m", None, 1), ("32m", 2, 2), ("72m", 2, 2))  # fmt: skip
    for memory, explicit, threads in cases:
        with HashAggregator("k", {"s": ("v", "sum")}, memory=memory, threads=explicit) as agg:
            agg.update(table)
            assert agg.threads == threads, (memory, explicit)
            got = pa.Table.from_batches(list(agg.results()))
        assert got.equals(want)


def test_asked_for_threads_not_used_where_chunks_would_fold_inline(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An explicit thread count whose budget gives chunks under ``INLINE_ROWS`` rows folds
    in one thread: such chunks are folded in the caller's thread partition after partition,
    twice the work for nothing (int-1M at 14 MiB: 6.2 s with two, 3.6 with one)."""
    monkeypatch.setattr(T, "INLINE_ROWS", 1 << 14)
    table = _spill_input(70_000, 20_000)
    want = aggregate(table, "k", {"s": ("v", "sum")}, threads=1, memory="64m")
    for memory, threads in (("8m", 1), ("64m", 2)):
        with (
            caplog.at_level("INFO", logger="extagg.columnar.hash_aggregator"),
            HashAggregator("k", {"s": ("v", "sum")}, memory=memory, threads=2) as agg,
        ):
            agg.update(table)
            assert agg.threads == threads, memory
            got = pa.Table.from_batches(list(agg.results()))
        assert got.equals(want)
    assert "gives chunks of" in caplog.text


def test_freed_heap_memory_given_back_after_spills_and_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The workers' malloc arenas are trimmed after a chunk during which a partition spilled,
    after the last chunk and after every partition's results (the RSS the memory manager
    cannot see)."""
    calls: list[str] = []
    monkeypatch.setattr(T, "release_free_memory", lambda: calls.append("trim") or True)
    table = _spill_input(300_000, 250_000)
    with HashAggregator("k", {"s": ("v", "sum")}, memory="8m", threads=2, chunk_rows=2048) as agg:
        for b in _batches(table, 7000):
            agg.update(b)
        folded = len(calls)
        assert agg.metrics.spill_count > 0 and folded > 0
        groups = sum(b.num_rows for b in agg.results())
    assert groups == len(set(table["k"].to_pylist()))
    assert len(calls) >= folded + 1 + 2  # the last chunk, then each of the two partitions


def test_few_groups_fold_into_thread_local_tables_then_partition_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Few groups after the first chunk: every worker folds into its own table; once a local
    table outgrows the limit the chunks are partitioned again and the local tables' groups
    are folded into the partitions (none is left to merge at the end); the same rows in the
    same order as one thread, memory within the budget, no file left."""
    monkeypatch.setattr(T, "LOCAL_MAX_GROUPS", 64)
    rng = np.random.default_rng(5)
    few = rng.integers(0, 50, 40_000)
    many = rng.integers(0, 30_000, 60_000)
    idx = np.concatenate([few, few[:5000], many])
    keys = (idx.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
    table = pa.table({"k": keys, "v": rng.integers(0, 100, len(idx)), "f": rng.random(len(idx))})
    aggs = {"s": ("v", "sum"), "n": ("*", "count"), "m": ("f", "mean"), "x": ("v", "max")}
    want = aggregate(table, "k", aggs, threads=1, memory="64m")
    for memory in ("64m", "8m"):
        with HashAggregator("k", aggs, memory=memory, threads=2, spill_dirs=str(tmp_path)) as agg:
            threaded = None
            modes = []
            for b in _batches(table, 5000):
                agg.update(b)
                threaded = threaded or agg._threaded
                assert threaded is not None
                modes.append(threaded.mode)
            assert threaded is not None and threaded.locals == []
            assert modes[0] == "local" and modes[-1] == "partition", modes
            assert sum(m.records_read for m in threaded.child_metrics()) == len(idx)
            got = pa.Table.from_batches(list(agg.results()))
            assert 0 < agg.metrics.peak_granted_bytes <= agg.budget.max_memory
        _assert_same(got, want, ["k"], ["m"])
        assert _files(tmp_path) == []


def test_first_last_never_fold_into_thread_local_tables() -> None:
    table = _spill_input(20_000, 10)
    with HashAggregator("k", {"l": ("v", "last")}, memory="64m", threads=2) as agg:
        agg.update(table)
        assert agg._threaded is not None and agg._threaded.mode == "partition"
        got = pa.Table.from_batches(list(agg.results()))
    assert got.equals(aggregate(table, "k", {"l": ("v", "last")}, threads=1, memory="64m"))


def test_release_free_memory_is_safe_anywhere() -> None:
    """glibc: trims and counts; elsewhere nothing happens. Concurrent calls are fine."""
    before = M.trims()
    results: list[bool] = []
    workers = [threading.Thread(target=lambda: results.append(M.release_free_memory()))
               for _ in range(4)]  # fmt: skip
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(results) == 4 and all(isinstance(r, bool) for r in results)
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert M.trims() - before == (4 if glibc else 0)


def test_global_aggregate_uses_one_thread() -> None:
    table = _spill_input(5_000)
    with HashAggregator([], {"s": ("v", "sum")}, threads=4) as agg:
        assert agg.threads == 1
        agg.update(table)
        (batch,) = list(agg.results())
    assert batch.column(0).to_pylist() == [int(pa.compute.sum(table["v"]).as_py())]


# ----------------------------------------------------------------------------- options


def test_threads_option_validated_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    aggs = {"n": ("*", "count")}
    for bad in (0, -2, 1.5, True, "2"):
        with pytest.raises(ValueError, match="threads"):
            HashAggregator("k", aggs, threads=bad)  # type: ignore[arg-type]
    monkeypatch.setenv("EXTAGG_THREADS", "3")
    assert HashAggregator("k", aggs).threads == 3
    assert HashAggregator("k", aggs, threads=2).threads == 2  # the argument wins
    monkeypatch.setenv("EXTAGG_THREADS", "many")
    with pytest.raises(ValueError, match="EXTAGG_THREADS"):
        HashAggregator("k", aggs)
    monkeypatch.delenv("EXTAGG_THREADS")
    assert HashAggregator("k", aggs).threads == len(os.sched_getaffinity(0))


# ----------------------------------------------------------------------------- errors


def _assert_clean(agg: HashAggregator, mm: UnifiedMemoryManager, spill_dir: Path) -> None:
    assert agg.closed
    assert _files(spill_dir) == []
    assert mm.execution_memory_used == 0


def test_kernel_error_in_one_worker_stops_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fold kernel failing in a worker thread: the caller gets its error, all is closed."""
    from extagg.columnar import hash_aggregator as HA

    original = HA.F.update_all  # every aggregate of a chunk is folded through it
    calls = {"n": 0}

    def update(*args, **kwargs):  # type: ignore[no-untyped-def]
        if threading.current_thread() is not threading.main_thread():
            calls["n"] += 1
            if calls["n"] == 5:
                raise RuntimeError("kernel failed in a worker")
        return original(*args, **kwargs)

    monkeypatch.setattr(HA.F, "update_all", update)
    mm = UnifiedMemoryManager("64m")
    agg = HashAggregator("k", {"s": ("v", "sum")}, memory_manager=mm, threads=4,
                         spill_dirs=str(tmp_path), force_spill_rows=2_000)  # fmt: skip
    with pytest.raises(RuntimeError, match="kernel failed in a worker"):
        for b in _batches(_spill_input(40_000), 10_000):
            agg.update(b)
    _assert_clean(agg, mm, tmp_path)


def test_overflow_at_results_closes_every_thread_partition(tmp_path: Path) -> None:
    """An int64 sum that overflows (found when the results are finished): OverflowError,
    every child closed, no file left."""
    n = 50_000
    keys = np.arange(n, dtype=np.int64)
    values = np.ones(n, dtype=np.int64)
    values[[7, 8]] = 2**62 * 3 // 2
    keys[8] = 7  # key 7 twice: its sum leaves the int64 range
    mm = UnifiedMemoryManager("64m")
    agg = HashAggregator("k", {"s": ("v", "sum")}, memory_manager=mm, threads=4,
                         spill_dirs=str(tmp_path), force_spill_rows=5_000)  # fmt: skip
    agg.update({"k": keys, "v": values})
    with pytest.raises(OverflowError, match="overflow"):
        list(agg.results())
    _assert_clean(agg, mm, tmp_path)


def _fail_in_partition(monkeypatch: pytest.MonkeyPatch, part: int, error: BaseException) -> None:
    """Make the child of thread partition ``part`` raise ``error`` on its second fold."""
    original = HashAggregator.fold_encoded
    calls = {"n": 0}

    def fold_encoded(self: HashAggregator, cols, enc, n):  # type: ignore[no-untyped-def]
        if self.name.endswith(f"/t{part}"):
            calls["n"] += 1
            if calls["n"] == 2:
                raise error
        original(self, cols, enc, n)

    monkeypatch.setattr(HashAggregator, "fold_encoded", fold_encoded)


@pytest.mark.parametrize(
    "error",
    [MemoryLimitError("no memory for partition 1"), KeyboardInterrupt("stop partition 1")],
    ids=["MemoryLimitError", "KeyboardInterrupt"],
)
def test_worker_error_reaches_caller_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    _fail_in_partition(monkeypatch, 1, error)
    mm = UnifiedMemoryManager("64m")
    table = _spill_input(40_000)
    agg = HashAggregator("k", {"s": ("v", "sum")}, memory_manager=mm, threads=2,
                         spill_dirs=str(tmp_path), force_spill_rows=3_000)  # fmt: skip
    with pytest.raises(type(error)) as info:
        for b in _batches(table, 10_000):
            agg.update(b)
    assert info.value is error
    _assert_clean(agg, mm, tmp_path)


def test_spill_cap_in_workers_raises_spill_error(tmp_path: Path) -> None:
    mm = UnifiedMemoryManager("64m")
    agg = HashAggregator("k", {"s": ("v", "sum")}, memory_manager=mm, threads=4,
                         spill_dirs=str(tmp_path), force_spill_rows=2_000,
                         max_spill_bytes=50_000)  # fmt: skip
    with pytest.raises(SpillError, match="spill cap"):
        agg.update(_spill_input(60_000))
    _assert_clean(agg, mm, tmp_path)
    with pytest.raises(Exception, match=r"closed|after|no more input"):
        agg.update(_spill_input(10))


def test_ctrl_c_while_workers_run_finishes_the_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT to the main thread while workers fold: the chunk is folded whole, then
    KeyboardInterrupt; the aggregator stays open and consistent."""
    original = HashAggregator.fold_encoded
    sent = {"done": False}
    main_thread = threading.main_thread().ident
    assert main_thread is not None

    def fold_encoded(self: HashAggregator, cols, enc, n):  # type: ignore[no-untyped-def]
        if not sent["done"]:
            sent["done"] = True
            # to the main thread, as a terminal's Ctrl-C is: os.kill from a worker lets the
            # kernel pick the sending thread, whose C-level handler the waiting main thread
            # may not see in time (flaky in CI)
            signal.pthread_kill(main_thread, signal.SIGINT)
        original(self, cols, enc, n)

    monkeypatch.setattr(HashAggregator, "fold_encoded", fold_encoded)
    table = _spill_input(30_000, 1_000)
    # a process started in the background by a non-interactive shell (as CI runs) inherits
    # SIGINT ignored, and Python then installs no KeyboardInterrupt handler: install it here
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with HashAggregator("k", {"n": ("*", "count")}, threads=2, memory="64m") as agg:
            with pytest.raises(KeyboardInterrupt):
                agg.update(table)
            assert not agg.closed
            assert agg.metrics.records_read == table.num_rows  # one chunk: folded whole
            got = pa.Table.from_batches(list(agg.results()))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sum(got["n"].to_pylist()) == table.num_rows


# ----------------------------------------------------------------------------- memory (RSS)

_RSS_SCRIPT = textwrap.dedent(
    """
    import numpy as np, pyarrow as pa, resource
    from extagg.columnar import HashAggregator

    def rss():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))

    def hwm():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM"))

    limit = 48 << 20
    rng = np.random.default_rng(1)
    n = 3_000_000
    keys = (rng.integers(0, 1_000_000, n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    table = pa.table({"k": keys.view(np.int64), "v": rng.integers(0, 9, n)})
    with HashAggregator("k", {"s": ("v", "sum")}, memory="64m", threads=2) as warm:
        warm.update(table.slice(0, 300_000))
        for _ in warm.results():
            pass
    from extagg._numba import ensure_target
    ensure_target()  # numba's registries, filled by a kernel compiled mid-run (cold cache)
    open("/proc/self/clear_refs", "w").write("5")
    base = rss()
    with HashAggregator("k", {"s": ("v", "sum")}, memory=limit, threads=2) as agg:
        for b in table.to_batches(max_chunksize=1 << 20):
            agg.update(b)
        groups = sum(b.num_rows for b in agg.results())
        spills = agg.metrics.spill_count
    print(hwm() - base, limit, groups, spills)
    """
)


@pytest.mark.slow
def test_peak_rss_with_all_threads_spilling() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    above, limit, groups, spills = map(int, proc.stdout.split())
    assert groups > 900_000 and spills > 0
    assert above <= 1.25 * limit, (above, limit)


@given(
    st.lists(
        st.lists(st.one_of(st.none(), st.text(max_size=12)), min_size=1, max_size=20),
        min_size=1,
        max_size=4,
    ),
    st.integers(0, 3),
    st.randoms(use_true_random=False),
)
def test_a_partitions_rows_of_every_slice_gather_in_order(parts: list, skip: int, rnd) -> None:
    """A worker hands a partition's rows of all slices over in one call: the chosen rows of
    each slice's keys and columns one slice after the other, as if gathered from one array
    (a slice starting inside its column's bytes, validity masks, null-key masks of slices
    without nulls, string and int columns)."""
    from extagg.columnar.columns import Column, to_columns
    from extagg.columnar.keys import EncodedKeys, KeyLayout

    layout = KeyLayout(["s"], ["string"], [pa.string()])
    picks: list[tuple[Column, Column, EncodedKeys, np.ndarray]] = []
    whole: list[str | None] = []
    for values in parts:
        batch = pa.record_batch(
            {"s": pa.array(values, pa.string()), "n": pa.array(range(len(values)), pa.int64())}
        )
        cols = to_columns(batch, ["s", "n"])
        cut = min(skip, len(values) - 1)  # a slice that starts inside the bytes
        s_col, n_col = cols["s"].slice(cut, len(values)), cols["n"].slice(cut, len(values))
        rows = np.array(
            sorted(rnd.sample(range(len(values) - cut), rnd.randint(0, len(values) - cut))),
            dtype=np.int64,
        )
        picks.append((s_col, n_col, layout.encode([s_col]), rows))
        whole += [values[cut + int(r)] for r in rows]
    got = Column.take_many([(s_col, rows) for s_col, _n, _e, rows in picks])
    numbers = Column.take_many([(n_col, rows) for _s, n_col, _e, rows in picks])
    enc = EncodedKeys.take_many([(e, rows) for _s, _n, e, rows in picks], 5)
    assert len(got) == len(numbers) == len(enc.hashes) == len(whole)
    want_n = [int(n_col.values[r]) for _s, n_col, _e, rows in picks for r in rows]
    assert numbers.values is not None and numbers.values.tolist() == want_n
    got_valid = np.ones(len(whole), bool) if got.valid is None else got.valid
    assert got_valid.tolist() == [v is not None for v in whole]
    texts = [
        bytes(got.data[got.offsets[i] : got.offsets[i + 1]]).decode() if got_valid[i] else None
        for i in range(len(whole))
    ]
    assert texts == whole
    if all(e.var_data is s.data and e.var_offsets is s.offsets for s, _n, e, _r in picks):
        # the key's bytes are its encoded keys' (strings without bytes under nulls): the
        # column takes the keys' gathered bytes, its mask gathered on its own
        shared = Column.take_many(
            [(s_col, rows) for s_col, _n, _e, rows in picks],
            gathered_var=(enc.var_offsets, enc.var_data),
        )
        assert shared.offsets is enc.var_offsets and shared.data is enc.var_data
        assert np.array_equal(shared.offsets, got.offsets)
        assert shared.data.tobytes() == got.data.tobytes()
        assert (shared.valid is None) == (got.valid is None)
        assert shared.valid is None or np.array_equal(shared.valid, got.valid)
    if not whole:
        return
    want_col = to_columns(pa.record_batch({"s": pa.array(whole, pa.string())}), ["s"])["s"]
    want = layout.encode([want_col])
    rotated = (want.hashes << np.uint64(5)) | (want.hashes >> np.uint64(59))
    assert enc.hashes.tolist() == rotated.tolist()

    def null_bits(nulls: np.ndarray) -> list[int]:  # empty: no null key at all
        return nulls.tolist() if len(nulls) else [0] * len(whole)

    assert null_bits(enc.nulls) == null_bits(want.nulls)
    for i in range(len(whole)):
        a = enc.var_data[enc.var_offsets[i] : enc.var_offsets[i + 1]]
        b = want.var_data[want.var_offsets[i] : want.var_offsets[i + 1]]
        assert a.tobytes() == b.tobytes()


def test_a_string_keys_bytes_are_gathered_once_for_its_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker gathers a string key's bytes once, for its encoded keys, and the key column
    takes them (no second gather and join of the same bytes); other columns are gathered."""
    from extagg.columnar.columns import Column

    shared: dict[str, list[bool]] = {}
    original = Column.take_many

    def take_many(parts, reuse=None, gathered_var=None):  # type: ignore[no-untyped-def]
        shared.setdefault(parts[0][0].name, []).append(gathered_var is not None)
        return original(parts, reuse, gathered_var)

    monkeypatch.setattr(Column, "take_many", staticmethod(take_many))
    rng = np.random.default_rng(5)
    keys = [None if i % 97 == 0 else f"user_{i}" for i in rng.integers(0, 3_000, 20_000)]
    table = pa.table({"k": pa.array(keys, pa.string()), "v": rng.integers(0, 9, 20_000)})
    aggs = {"s": ("v", "sum"), "n": ("k", "count"), "m": ("k", "max")}
    got = aggregate(table, "k", aggs, threads=2, memory="64m")
    assert shared["k"] and all(shared["k"]) and shared["v"] and not any(shared["v"])
    assert got.equals(aggregate(table, "k", aggs, threads=1, memory="64m"))


def test_dictionary_coded_keys_fold_by_their_codes_in_one_thread() -> None:
    """Keys that come as dictionary codes (Parquet's small dictionaries) fold by their codes,
    which the thread partitions cannot do: the threads are chosen at the first batch with rows
    (the file reader's first batch is an empty table that only fixes the types), one thread for
    coded keys, the asked-for count otherwise; the same result either way."""
    rng = np.random.default_rng(5)
    words = np.array(["A", "N", "R", "F", "O"])
    keys = words[rng.integers(0, 5, 40_000)]
    values = rng.random(40_000)
    plain = pa.table({"k": pa.array(keys), "v": values})
    coded = pa.record_batch({"k": pa.array(keys).dictionary_encode(), "v": values})
    want = aggregate(plain, "k", {"s": ("v", "sum")}, threads=1, memory="64m")
    for batch, threads in ((coded, 1), (plain, 2)):
        with HashAggregator("k", {"s": ("v", "sum")}, threads=2, memory="64m") as agg:
            agg.update(plain.slice(0, 0))  # types only, as the file reader starts
            assert agg.threads == 2
            agg.update(batch)
            assert agg.threads == threads
            got = pa.Table.from_batches(list(agg.results()))
        got_sums = {k: v["s"] for k, v in result_dict(got, ["k"]).items()}
        assert got_sums == pytest.approx({k: v["s"] for k, v in result_dict(want, ["k"]).items()})


# ------------------------------------------------------- results gathered on the workers


def _many_groups(n: int = 30_000, distinct: int = 20_000, seed: int = 21) -> pa.Table:
    """More groups than half the rows: thread partitions, not thread-local tables."""
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "k": rng.integers(-(2**62), 2**62, distinct)[rng.integers(0, distinct, n)],
            "s": pa.array([f"u{x}" for x in rng.integers(0, distinct, n)]),
            "v": rng.random(n),
        }
    )


def _gathering_threads(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The names of the threads that gather result batches from now on."""
    from extagg.columnar.layout import BlockLayout

    names: set[str] = set()
    real = BlockLayout.gather

    def gather(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        names.add(threading.current_thread().name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(BlockLayout, "gather", gather)
    return names


@pytest.mark.parametrize("threads", [2, 4])
def test_result_batches_are_gathered_ahead_on_the_workers(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """A thread partition's sorted table is read ``threads`` batches at a time, the reader's
    and the rest on the pool: the same rows in the same order as one thread."""
    table = _many_groups()
    aggs = {"t": ("v", "sum"), "n": ("*", "count"), "hi": ("v", "max")}
    want = aggregate(table, ["k"], aggs, threads=1, batch_size=100)
    names = _gathering_threads(monkeypatch)
    got = aggregate(table, ["k"], aggs, threads=threads, batch_size=100, name="ahead")
    assert got.equals(want)
    assert "MainThread" in names and any(n.startswith("ahead") for n in names), names
    # string keys: a batch's rows depend on its bytes; its range is found first, then
    # gathered ahead all the same (here batches cut by their bytes as well as their rows)
    names.clear()
    monkeypatch.setattr("extagg.columnar.hash_aggregator.BATCH_VAR_BYTES", 300)
    strings = aggregate(table, ["s"], aggs, threads=threads, batch_size=100, name="strings")
    assert strings.equals(aggregate(table, ["s"], aggs, threads=1, batch_size=100))
    assert "MainThread" in names and any(n.startswith("strings") for n in names), names


def test_spill_requested_while_batches_are_gathered_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another consumer of a worker's task asks for its memory while the results are read,
    batches gathered ahead: the unread groups go to a run and nothing is lost or repeated."""
    from extagg.memory import HelperTaskId, MemoryConsumer, task_memory_manager

    table = _many_groups(60_000, 40_000, seed=22)
    aggs = {"t": ("v", "sum"), "n": ("*", "count")}
    want = aggregate(table, ["k"], aggs, threads=1, batch_size=500)
    mm = UnifiedMemoryManager("32m")
    names = _gathering_threads(monkeypatch)
    with HashAggregator(
        ["k"],
        aggs,
        memory_manager=mm,
        threads=2,
        batch_size=500,
        spill_dirs=[str(tmp_path)],
        name="hogged",
    ) as agg:
        agg.update(table)
        assert agg.metrics.spill_count == 0
        batches = agg.results()
        first = [next(batches) for _ in range(3)]  # partition 0 is being read, 1 waits
        for worker in (0, 1):  # the one being read (a batch gathered ahead), the other
            task = HelperTaskId(agg.task_memory_manager.task_id, worker)
            hog = MemoryConsumer(task_memory_manager(mm, task))
            hog.acquire_memory(mm.max_memory - 2 * 1024 * 1024)
            hog.free_memory(hog.used)
        rest = list(batches)
        spilled = agg.metrics.spill_count
    got = pa.Table.from_batches(first + rest)
    assert spilled >= 2 and any(n.startswith("hogged") for n in names), names
    assert got.column("k").equals(want.column("k")) and got.column("n").equals(want.column("n"))
    np.testing.assert_allclose(got.column("t").to_numpy(), want.column("t").to_numpy())
    assert _files(tmp_path) == []

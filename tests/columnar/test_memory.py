"""Memory: budgets are kept and accounted exactly, other consumers can make us spill, files go."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pyarrow as pa
import pytest

from extagg.collection import typed_table
from extagg.columnar import HashAggregator
from extagg.errors import BudgetError, SpillError
from extagg.memory import MemoryConsumer, UnifiedMemoryManager, task_memory_manager
from tests.conftest import files_under

AGGS = {"s": ("v", "sum"), "n": ("*", "count"), "hi": ("v", "max")}


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    """These tests read the one-thread table's accounting and spills, also in a run of the
    suite with ``EXTAGG_TEST_THREADS=2`` (threads: tests/columnar/test_threads.py)."""
    monkeypatch.setenv("EXTAGG_THREADS", "1")


def _data(n: int, keys: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"k": rng.integers(0, keys, n), "v": rng.random(n)}


def _expected(data: dict[str, np.ndarray]) -> dict[int, tuple[float, int]]:
    order = np.argsort(data["k"], kind="stable")
    keys, starts = np.unique(data["k"][order], return_index=True)
    sums = np.add.reduceat(data["v"][order], starts)
    counts = np.diff(np.append(starts, len(order)))
    return {int(k): (float(s), int(c)) for k, s, c in zip(keys, sums, counts)}


def _collect(batches) -> dict[int, tuple[float, int]]:
    table = pa.Table.from_batches(list(batches))
    return {r["k"]: (r["s"], r["n"]) for r in table.to_pylist()}


def _assert_close(got, want) -> None:
    assert set(got) == set(want)
    for k, (s, n) in want.items():
        assert got[k][1] == n and got[k][0] == pytest.approx(s, rel=1e-12)


def test_small_budget_spills_and_stays_within_it(spill_dir) -> None:
    data = _data(300_000, 100_000)
    mm = UnifiedMemoryManager("4m")
    with HashAggregator("k", AGGS, memory_manager=mm, spill_dirs=[str(spill_dir)]) as agg:
        for start in range(0, 300_000, 50_000):
            agg.update({c: a[start : start + 50_000] for c, a in data.items()})
            assert agg.used <= mm.max_memory
            # a table while it reduces its input, else its input partitioned (3 rows per key)
            assert agg.used >= (
                agg.table_state.table.nbytes
                if agg.table_state.table is not None
                else agg.table_state.aside_bytes
            )
        assert agg._partitions is not None
        assert agg.metrics.spill_count >= 1
        assert len(agg.spill_files) > agg.metrics.num_spill_files == agg.metrics.spill_count
        _assert_close(_collect(agg.results()), _expected(data))
        m = agg.metrics
        assert m.peak_granted_bytes <= mm.max_memory
        assert m.groups == 100_000 or m.groups == len(_expected(data))
        assert m.disk_bytes_spilled > 0 and m.raw_bytes_spilled > 0 and m.spill_time_s > 0
    assert agg.used == 0
    assert files_under(spill_dir) == []


def test_accounting_matches_live_numpy_memory(monkeypatch) -> None:
    # tracemalloc sees NumPy's allocations, not the huge-page mappings of large table arrays
    # (tests/collection/test_typed_table.py checks those are given back): allocate with NumPy
    monkeypatch.setattr(typed_table, "HUGE_PAGE_BYTES", 1 << 62)
    data = _data(200_000, 150_000, seed=3)
    tracemalloc.start()
    try:
        with HashAggregator("k", AGGS, memory="256m") as agg:
            agg.update(data)
            table = agg.table_state.table
            arrays = [table.slots, table.key_words, table.key_nulls, table.meta, *table.payload]
            live = sum(a.nbytes for a in arrays)
            assert table.nbytes == live  # the table counts exactly what it allocated
            del arrays
            reserved = agg.table_state.scratch + agg.table_state.io_bytes
            assert agg.used == max(agg.budget.floor, table.nbytes + reserved)
            snapshot_before = tracemalloc.get_traced_memory()[0]
            agg.table_state.table = None  # drop the table: tracemalloc sees its bytes go
            del table
            freed = snapshot_before - tracemalloc.get_traced_memory()[0]
            agg.table_state.table = None
    finally:
        tracemalloc.stop()
    assert freed == pytest.approx(live, rel=0.05)


def test_budget_below_minimum_is_rejected_at_construction() -> None:
    with pytest.raises(BudgetError, match=r"32.0 KiB \(32768 bytes\) is below .* minimum"):
        HashAggregator("k", AGGS, memory="32k")


class Hog(MemoryConsumer):
    """Another consumer of the same task that wants memory and cannot spill."""


def test_another_consumer_makes_the_aggregator_spill(spill_dir) -> None:
    mm = UnifiedMemoryManager("32m")
    data = _data(200_000, 60_000, seed=5)
    with HashAggregator("k", AGGS, memory_manager=mm, spill_dirs=[str(spill_dir)]) as agg:
        agg.update({c: a[:100_000] for c, a in data.items()})
        held = agg.used
        assert held > 4 * 1024 * 1024 and agg.metrics.spill_count == 0
        hog = Hog(task_memory_manager(mm))
        granted = hog.acquire_memory(mm.max_memory - 4 * 1024 * 1024)
        assert granted == mm.max_memory - 4 * 1024 * 1024
        assert agg.used < held and agg.metrics.spill_count == 1 and agg.table_state.table is None
        hog.free_memory(granted)
        agg.update({c: a[100_000:] for c, a in data.items()})
        _assert_close(_collect(agg.results()), _expected(data))
        hog.close_memory()
    assert files_under(spill_dir) == []


def test_spill_requested_while_results_are_read(spill_dir) -> None:
    mm = UnifiedMemoryManager("32m")
    data = _data(120_000, 40_000, seed=9)
    with HashAggregator("k", AGGS, memory_manager=mm, spill_dirs=[str(spill_dir)],
                        force_spill_rows=50_000, batch_size=1000) as agg:  # fmt: skip
        agg.update(data)
        assert agg.metrics.spill_count == 2  # two runs on disk, the rest in memory
        it = agg.results()
        first = [next(it)]
        held = agg.used
        hog = Hog(task_memory_manager(mm))
        hog.acquire_memory(mm.max_memory - agg.used + 1024 * 1024)
        assert agg.used < held and agg.metrics.spill_count == 3
        got = _collect(first + list(it))
        hog.close_memory()
    _assert_close(got, _expected(data))
    assert files_under(spill_dir) == []


@pytest.mark.parametrize("ordered", [True, False])
def test_spill_requested_after_results_are_asked_for_before_they_are_read(
    spill_dir, ordered
) -> None:
    """Results asked for but not begun (a stream joined beside others and read after them,
    as count_distinct's levels are) still give their table up to another consumer: it held
    the table while a count_distinct partition beside it failed with MemoryLimitError."""
    mm = UnifiedMemoryManager("32m")
    data = _data(60_000, 30_000, seed=12)
    with HashAggregator("k", AGGS, memory_manager=mm, spill_dirs=[str(spill_dir)],
                        batch_size=1000, threads=1) as agg:  # fmt: skip
        agg.update(data)
        it = agg.results(ordered=ordered)
        held = agg.used
        assert held > 1024 * 1024 and agg.metrics.spill_count == 0
        hog = Hog(task_memory_manager(mm))
        granted = hog.acquire_memory(mm.max_memory - 1024 * 1024)
        assert granted == mm.max_memory - 1024 * 1024
        assert agg.used < 1024 * 1024 and agg.metrics.spill_count == 1
        hog.free_memory(granted)
        got = list(it)
        hog.close_memory()
    _assert_close(_collect(got), _expected(data))
    assert files_under(spill_dir) == []


def test_unordered_results_read_the_table_as_it_was_made() -> None:
    data = {"k": np.array([50, 7, 50, 3, 9, 7, 1000, 3]), "v": np.arange(8.0)}
    with HashAggregator("k", AGGS, memory="16m", threads=1) as agg:
        agg.update(data)
        rows = pa.Table.from_batches(list(agg.results(ordered=False))).to_pylist()
    assert [r["k"] for r in rows] == [50, 7, 3, 9, 1000]  # first seen first, no sort
    assert _collect([pa.Table.from_pylist(rows).to_batches()[0]]) == _expected(data)
    with HashAggregator("k", AGGS, memory="16m", threads=1) as agg:
        agg.update(data)
        ordered = [r["k"] for b in agg.results() for r in b.to_pylist()]
    assert ordered != [50, 7, 3, 9, 1000] and sorted(ordered) == [3, 7, 9, 50, 1000]


def test_unordered_results_after_spills_are_merged_in_hash_order(spill_dir) -> None:
    data = _data(30_000, 8_000, seed=4)
    kwargs = {"memory": "16m", "spill_dirs": [str(spill_dir)], "threads": 1}
    with HashAggregator("k", AGGS, force_spill_rows=10_000, **kwargs) as agg:
        agg.update(data)
        unordered = list(agg.results(ordered=False))
        assert agg.metrics.spill_count >= 2
    with HashAggregator("k", AGGS, **kwargs) as agg:
        agg.update(data)
        ordered = list(agg.results())
    assert pa.Table.from_batches(unordered).equals(pa.Table.from_batches(ordered))
    assert files_under(spill_dir) == []


def test_spill_requested_while_unordered_results_are_read(spill_dir) -> None:
    """The unread groups of a table read in its own order are spilled sorted, then read from
    the run: every group once."""
    mm = UnifiedMemoryManager("32m")
    data = _data(60_000, 30_000, seed=11)
    with HashAggregator("k", AGGS, memory_manager=mm, spill_dirs=[str(spill_dir)],
                        batch_size=1000, threads=1) as agg:  # fmt: skip
        agg.update(data)
        assert agg.metrics.spill_count == 0
        it = agg.results(ordered=False)
        first = [next(it), next(it)]
        held = agg.used
        hog = Hog(task_memory_manager(mm))
        hog.acquire_memory(mm.max_memory - agg.used + 1024 * 1024)
        assert agg.used < held and agg.metrics.spill_count == 1
        rest = list(it)
        hog.close_memory()
    got = pa.Table.from_batches(first + rest)
    assert got.num_rows == len(np.unique(data["k"]))  # no group twice, none lost
    _assert_close(_collect(first + rest), _expected(data))
    assert files_under(spill_dir) == []


def test_unordered_results_with_string_keys_and_states(spill_dir) -> None:
    """Keys and states in arenas: the unordered read, with and without a spill of its unread
    groups, gives the ordered read's groups."""
    rng = np.random.default_rng(8)
    n = 50_000
    table = pa.table({
        "k": [f"user-{i}" for i in rng.integers(0, 20_000, n)],
        "s": [f"v{i}" * (1 + i % 5) for i in rng.integers(0, 1000, n)],
        "x": rng.random(n),
    })  # fmt: skip
    aggs = {"lo": ("s", "min"), "hi": ("s", "max"), "f": ("x", "first"), "n": ("*", "count")}

    def run(ordered: bool, hog: bool = False) -> list[dict]:
        mm = UnifiedMemoryManager("32m")
        with HashAggregator("k", aggs, memory_manager=mm, spill_dirs=[str(spill_dir)],
                            threads=1, batch_size=500) as agg:  # fmt: skip
            for piece in table.to_batches(max_chunksize=7000):
                agg.update(piece)
            it = agg.results(ordered=ordered)
            out = [next(it)]
            if hog:
                other = Hog(task_memory_manager(mm))
                other.acquire_memory(mm.max_memory - agg.used + (1 << 20))
                assert agg.metrics.spill_count == 1
            out += list(it)
            if hog:
                other.close_memory()
        return pa.Table.from_batches(out).to_pylist()

    ordered = run(True)
    unordered = run(False)
    assert [r["k"] for r in unordered] != [r["k"] for r in ordered]  # not sorted by hash
    by_key = sorted(ordered, key=lambda r: r["k"])
    assert sorted(unordered, key=lambda r: r["k"]) == by_key
    assert sorted(run(False, hog=True), key=lambda r: r["k"]) == by_key
    assert files_under(spill_dir) == []


def test_failed_spill_keeps_the_aggregator_usable(spill_dir) -> None:
    data = _data(10_000, 3_000, seed=2)
    with HashAggregator("k", AGGS, memory="16m", spill_dirs=[str(spill_dir)],
                        force_spill_rows=5_000, max_spill_bytes=1) as agg:  # fmt: skip
        with pytest.raises(SpillError, match="spill cap"):
            agg.update(data)
        assert files_under(spill_dir) == []
        agg.table_state.table.check_invariants()
        agg.force_spill_rows = None
        got = _collect(agg.results())
    first = {c: a[:5_000] for c, a in data.items()}  # the rows folded before the failure
    _assert_close(got, _expected(first))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_spill_failing_mid_chunk_counts_the_rows_it_left_in_the_table(spill_dir, threads):
    """A table full mid-chunk whose spill failed (a spill cap) kept the chunk's rows folded so
    far, and the results had them, but ``records_read`` did not count them (704 rows short
    in 229 376): a caller resuming from it would fold them twice."""
    with HashAggregator("k", {"n": ("*", "count")}, memory="16m", spill_dirs=[str(spill_dir)],
                        threads=threads, max_spill_bytes="300k") as agg:  # fmt: skip
        with pytest.raises(SpillError, match="spill cap"):
            for start in range(0, 2_000_000, 50_000):
                agg.update(pa.record_batch({"k": np.arange(start, start + 50_000)}))
        read = agg.metrics.records_read
        keys = np.sort(np.concatenate([b.column("k").to_numpy() for b in agg.results()]))
    assert 50_000 < read < 2_000_000
    np.testing.assert_array_equal(keys, np.arange(read))  # exactly the rows counted


def test_close_mid_iteration_removes_files_and_memory(spill_dir) -> None:
    agg = HashAggregator("k", AGGS, memory="16m", spill_dirs=[str(spill_dir)],
                         force_spill_rows=2_000, batch_size=100)  # fmt: skip
    agg.update(_data(10_000, 5_000))
    it = agg.results()
    next(it)
    assert files_under(spill_dir)
    agg.close()
    assert agg.used == 0 and files_under(spill_dir) == []
    it.close()


def test_generator_abandoned_cleans_up(spill_dir) -> None:
    agg = HashAggregator("k", AGGS, memory="16m", spill_dirs=[str(spill_dir)],
                         force_spill_rows=2_000)  # fmt: skip
    agg.update(_data(10_000, 5_000))
    it = agg.results()
    next(it)
    it.close()  # what happens when a consumer stops early and drops the iterator
    assert agg.used == 0 and files_under(spill_dir) == []


def test_a_long_key_after_a_full_table_spill(spill_dir) -> None:
    # a table that filled its budget with short keys keeps its arrays when it spills; a key
    # that then needs the memory for the arena makes it spill again and start small (with the
    # arrays kept, a 1.5 MB key cannot fit next to them in 3 MiB: MemoryLimitError). Each short
    # key comes three times in a row, so the tables reduce their input and are spilled (not
    # partitioned).
    short = [f"s{i}" for i in range(60_000)]
    long = "L" * 1_500_000
    mm = UnifiedMemoryManager("3m")
    with HashAggregator(
        "k", {"n": ("*", "count")}, memory_manager=mm, spill_dirs=[str(spill_dir)]
    ) as agg:
        agg.update(pa.table({"k": [k for k in short for _ in range(3)]}))
        spills = agg.metrics.spill_count
        assert spills >= 1 and agg._partitions is None  # full tables spilled, arrays kept
        agg.update(pa.table({"k": [long, *short[:10]]}))
        assert agg.metrics.spill_count > spills
        got = {r["k"]: r["n"] for r in pa.Table.from_batches(list(agg.results())).to_pylist()}
    want = dict.fromkeys(short, 3) | {long: 1} | dict.fromkeys(short[:10], 4)
    assert got == want
    assert files_under(spill_dir) == []


@pytest.mark.parametrize("state", [False, True])
def test_a_chunk_of_long_strings_is_folded_in_pieces_at_the_minimum_budget(
    spill_dir, state
) -> None:
    """400 keys of 3 KB (1.2 MB, more than the whole 1 MiB budget) in one batch: the chunk's
    key bytes were asked for at once ("needs 1173.8 KiB more for the key bytes of a chunk")."""
    keys = [f"{i:05d}" + "x" * 3000 for i in range(400)]
    aggs = {"n": ("*", "count")} | ({"hi": ("s", "max")} if state else {})
    batch = pa.record_batch({"k": keys * 2, "s": keys[::-1] * 2})
    with HashAggregator("k", aggs, memory="1m", spill_dirs=[str(spill_dir)]) as agg:
        agg.update(batch)
        got = pa.Table.from_batches(list(agg.results()))
    assert sorted(got.column("k").to_pylist()) == sorted(keys)
    assert set(got.column("n").to_pylist()) == {2}
    if state:
        want = dict(zip(keys, keys[::-1]))
        assert all(want[k] == hi for k, hi in zip(got.column("k").to_pylist(),
                                                  got.column("hi").to_pylist()))  # fmt: skip

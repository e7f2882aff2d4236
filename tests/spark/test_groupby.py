"""SpillingGroupBy (both sides of ``groupByKey``) driven directly, without Spark."""

from __future__ import annotations

import tracemalloc
from collections import defaultdict
from typing import Any

import pytest

from extagg.spark.groupby import SpilledValues, SpillingGroupBy
from extagg.spark.merger import SparkGroupBy

BUDGET = 1 << 20


def _reference(pieces: list[tuple[Any, list[Any]]]) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = defaultdict(list)
    for key, values in pieces:
        out[key].extend(values)
    return dict(out)


def _collect(group: SpillingGroupBy) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = {}
    for key, values in group:
        assert key not in out
        out[key] = list(values) if isinstance(values, SpilledValues) else values
    return out


@pytest.mark.parametrize("records", [4_500])
def test_collection_filling_the_whole_budget_without_spilling_is_read(records: int) -> None:
    """Regression: folding grew the in-memory lists until they held the whole grant without
    a spill; iterating then asked for merge read buffers with nothing left and failed
    (``cannot merge 2 sorted runs ... granted 0.0 B``), though there was no run to read."""
    pieces = [(f"k{i * 7 % records}" if i % 2 else i, [i % 1000]) for i in range(records)]
    group = SpillingGroupBy(memory=BUDGET, name="pyspark-groupby-map")
    group.merge_pieces(pieces)
    # the case under test: nothing spilled and the collection holds all of the budget
    assert len(group.runs) == 0
    assert group.used == BUDGET
    assert _collect(group) == _reference(pieces)
    assert group.closed and group.used == 0


def test_spilled_and_in_memory_still_merge_within_budget() -> None:
    """With runs on disk the merge still gets its read buffers and gives every value once."""
    pieces = [(i % 3000, [i]) for i in range(60_000)] + [("big", [i]) for i in range(40_000)]
    group = SpillingGroupBy(memory=BUDGET, force_spill_every=7_000)
    group.merge_pieces(pieces)
    assert len(group.runs) > 1
    got = _collect(group)
    want = _reference(pieces)
    assert got.keys() == want.keys()
    for key, values in want.items():
        assert sorted(got[key]) == sorted(values)
    assert group.closed and group.used == 0


def test_reduce_side_merger_filling_the_budget() -> None:
    """The reduce side (SparkGroupBy, PySpark's ExternalGroupBy role) over a full budget."""
    merger = SparkGroupBy(None, memory_limit=1)
    pieces = [(i, [i, -i]) for i in range(10_000)]
    merger.mergeCombiners(iter(pieces))
    assert dict(merger.items()) == _reference(pieces)


def test_big_keys_chunks_do_not_starve_the_merge() -> None:
    """Regression: each key moved to a SpilledValues kept the grant of its in-memory chunk
    until close(); ~100 of them held the whole budget and the merge of the runs could not get
    two read buffers. Their chunks now go to their files and the grants back before the merge."""
    pieces = [(k, [v]) for k in range(100) for v in range(2000)]
    pieces += [(("m", j), [v]) for j in range(20) for v in range(1500)]
    pieces += [(("s", i % 5000), [i]) for i in range(30000)]
    group = SpillingGroupBy(memory=BUDGET, force_spill_every=20_000)
    group.merge_pieces(pieces)
    assert len(group.big) > 64 and len(group.runs) > 1
    assert group.used > group.threshold  # the chunks hold grants of their own
    got = _collect(group)
    want = _reference(pieces)
    assert got.keys() == want.keys()
    for key, values in want.items():
        assert sorted(got[key]) == sorted(values)
    assert group.closed and group.used == 0


def test_spilled_values_flush_of_a_partial_chunk() -> None:
    """A flush of a partial chunk (before the merge) keeps every value, in order."""
    values = SpilledValues([], chunk_values=3)
    values.extend(range(5))
    values.flush()
    values.extend(range(5, 9))
    assert list(values) == list(range(9))
    assert [len(c) for c in values.chunks()] == [3, 2, 3, 1]
    assert len(values) == 9 and values.on_disk == 8


def test_estimate_counts_what_the_lists_really_take() -> None:
    """The size the spill policy sees covers the keys, lists and dict entries, not only the
    values (it was ~5x low for one-value keys: 32 MiB workers grew to ~400 MiB RSS)."""
    records = 50_000
    pieces = [(f"k{i * 7 % records}" if i % 2 else i, [i % 1000]) for i in range(records)]
    group = SpillingGroupBy(memory=256 << 20)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        group.merge_pieces(iter(pieces))
        real = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(group.runs) == 0
    assert 0.7 * real <= group.estimated_bytes() <= 2 * real
    group.close()


def test_merge_phase_big_key_chunks_are_charged_to_the_manager() -> None:
    """A key with more values than the budget, found in many runs: the values the merge keeps
    in its SpilledValues' memory chunk are granted by the manager (charged as they arrive,
    given back when the key is handed over), never held beside the budget."""
    pieces = []
    for r in range(100):  # ~1 000 values of "big" in every run: below the fold's big-key line
        pieces += [("big", [r * 1_000 + j]) for j in range(1_000)]
        pieces += [(r * 1_000 + j, [j]) for j in range(1_000)]
    group = SpillingGroupBy(memory=BUDGET, force_spill_every=2_000)
    group.merge_pieces(pieces)
    assert len(group.runs) > 50 and "big" not in group.big
    seen = []
    out = {}
    for key, values in group:
        grant = group.merge_chunks
        assert grant is not None and grant.held <= grant.granted <= group.used <= BUDGET
        seen.append(grant.held)
        out[key] = list(values) if isinstance(values, SpilledValues) else values
        if isinstance(values, SpilledValues):
            assert values.in_memory == 0  # handed over on disk, its chunk grant free
    grant = group.merge_chunks
    assert grant is not None and grant.peak_held > 0  # the big key's chunk was accounted
    assert sorted(out["big"]) == list(range(100_000)) and len(out) == 100_001
    assert group.closed and group.used == 0


def test_a_refused_chunk_grant_writes_the_values_out() -> None:
    from extagg.memory import MemoryConsumer, UnifiedMemoryManager, task_memory_manager
    from extagg.spark.groupby import ChunkGrant

    mm = UnifiedMemoryManager(BUDGET)
    group = SpillingGroupBy(memory_manager=mm)
    hog = MemoryConsumer(task_memory_manager(mm), "hog")
    hog.acquire_memory(BUDGET - group.used)  # nothing left to grant
    values = SpilledValues([], chunk_values=1_000)
    values.grant = ChunkGrant(group, 32.0)
    values.extend(range(500))
    assert values.in_memory == 0 and values.on_disk == 500  # refused: written, not held
    assert list(values) == list(range(500))
    hog.free_memory(BUDGET // 2)
    values.extend(range(500, 600))
    assert values.in_memory == 100 and values.grant.held == 3_200 <= values.grant.granted
    values.flush()
    assert values.grant.held == 0
    hog.close_memory()
    group.close()


def test_spilled_values_leave_no_folder_behind_a_worker_that_ends_in_os_exit(tmp_path):
    """The file of one key's values was removed when the object went, but not the process's
    spill subdirectory it was the last file of: a forked PySpark worker, which ends in
    ``os._exit`` (no exit handlers), left the folder behind."""
    import gc
    import os

    pid = os.fork()
    if pid == 0:  # a forked worker, as PySpark's daemon makes
        code = 1
        try:
            values = SpilledValues([str(tmp_path)], chunk_values=10)
            values.extend(range(100))
            code = 0 if values.on_disk and list(values) == list(range(100)) else 2
            del values
            gc.collect()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert os.listdir(tmp_path) == []

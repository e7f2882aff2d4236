"""Partitioning: a full table that barely reduces its input sets the input aside by hash.

Each test checks that partitioning really happened (or did not) and compares the result with a
plain-Python reference, and with the same aggregation in memory (same groups, same order).
"""

from __future__ import annotations

import importlib
import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st

import extagg.spill.runfile as runfile
from extagg.columnar import HashAggregator
from extagg.columnar.partition_files import (
    partition_bounds,
    partition_of,
    rotate_left,
    rotate_right,
)
from extagg.errors import CorruptFileError, MemoryLimitError, SpillError
from tests.columnar.reference import assert_same_groups, reference_groupby, result_dict
from tests.conftest import files_under
from tests.spill.test_runfile import FullDisk

AGGS = {
    "n": ("*", "count"),
    "nv": ("v", "count"),
    "s": ("v", "sum"),
    "lo": ("v", "min"),
    "hi": ("v", "max"),
    "avg": ("v", "mean"),
    "var": ("v", "var"),
}
LOG = "extagg.columnar"


def _run(table: pa.Table, keys, aggs, memory, spill_dir=None, batch=20_000, **kw):
    dirs = None if spill_dir is None else [str(spill_dir)]
    with HashAggregator(keys, aggs, memory=memory, spill_dirs=dirs, **kw) as agg:
        for start in range(0, table.num_rows, batch):
            agg.update(table.slice(start, batch))
        partitioned = agg._partitions is not None
        out = pa.Table.from_batches(list(agg.results()), schema=agg.schema)
        return out, partitioned, agg.metrics


def _int_table(rows: int, keys: int, seed: int = 0, nulls: bool = True) -> pa.Table:
    rng = np.random.default_rng(seed)
    k = rng.integers(0, keys, rows)
    v = rng.normal(0, 100, rows)
    key_mask = (rng.random(rows) < 0.01) if nulls else None
    v_mask = (rng.random(rows) < 0.05) if nulls else None
    return pa.table({"k": pa.array(k, mask=key_mask), "v": pa.array(v, mask=v_mask)})


def _check(table: pa.Table, keys, aggs, got: pa.Table) -> None:
    want = reference_groupby(table.to_pydict(), keys, aggs)
    assert_same_groups(result_dict(got, keys), want, rel=1e-7)


def test_low_reduction_input_is_partitioned_and_exact(spill_dir, caplog) -> None:
    table = _int_table(200_000, 100_000)  # 2 rows per key: a table of its budget reduces little
    with caplog.at_level(logging.INFO, logger=LOG):
        got, partitioned, metrics = _run(table, ["k"], AGGS, "2m", spill_dir)
    assert partitioned
    assert "hash partitions" in caplog.text
    assert metrics.num_spill_files >= 16  # the table once, then the partitions
    assert metrics.records_read == table.num_rows
    _check(table, ["k"], AGGS, got)
    in_memory, partitioned_again, _ = _run(table, ["k"], AGGS, "512m")
    assert not partitioned_again
    assert got.column("k").to_pylist() == in_memory.column("k").to_pylist()  # same order
    assert files_under(spill_dir) == []


def test_high_reduction_input_keeps_spilling_tables(spill_dir) -> None:
    rng = np.random.default_rng(1)
    k = np.repeat(rng.permutation(40_000), 8)  # 8 adjacent rows per key: tables reduce 8×
    table = pa.table({"k": k, "v": rng.random(len(k))})
    got, partitioned, metrics = _run(table, ["k"], AGGS, "1m", spill_dir)
    assert not partitioned and metrics.spill_count >= 2
    _check(table, ["k"], AGGS, got)


def test_first_and_last_are_never_partitioned(spill_dir) -> None:
    # they need every row's position; a partition's rows would be numbered again
    table = _int_table(200_000, 100_000, seed=2)
    aggs = {"f": ("v", "first"), "l": ("v", "last"), "n": ("*", "count")}
    got, partitioned, metrics = _run(table, ["k"], aggs, "2m", spill_dir)
    assert not partitioned and metrics.spill_count >= 2
    _check(table, ["k"], aggs, got)


def test_partitions_partition_again_when_they_do_not_fit(spill_dir, caplog) -> None:
    rng = np.random.default_rng(3)
    # 25 000 keys per partition: more than 1 MiB holds (twice: the spilled tables' groups of a
    # partition come first, its rows then still fill the table again and again)
    k = rng.integers(0, 400_000, 1_000_000)
    v = rng.random(len(k))
    table = pa.table({"k": k, "v": v})
    aggs = {"n": ("*", "count"), "s": ("v", "sum")}
    with caplog.at_level(logging.INFO, logger=LOG):
        got, partitioned, _ = _run(table, ["k"], aggs, "1m", spill_dir, batch=50_000)
    assert partitioned
    assert "(level 1)" in caplog.text  # a partition's aggregator partitioned too
    keys, counts = np.unique(k, return_counts=True)
    sums = np.bincount(k, weights=v)[keys]
    order = np.argsort(got.column("k").to_numpy())
    assert np.array_equal(got.column("k").to_numpy()[order], keys)
    assert np.array_equal(got.column("n").to_numpy()[order], counts)
    assert np.allclose(got.column("s").to_numpy()[order], sums, rtol=1e-12)
    in_memory, _, _ = _run(table, ["k"], aggs, "512m", batch=50_000)
    assert got.column("k").to_pylist() == in_memory.column("k").to_pylist()  # same order
    assert files_under(spill_dir) == []


def test_distinct_keys_keep_spilling_sorted_tables(spill_dir, caplog) -> None:
    # every row a new group: nothing comes back, so partitioning would only rebuild tables
    rng = np.random.default_rng(7)
    table = pa.table({"k": rng.permutation(200_000), "v": rng.random(200_000)})
    with caplog.at_level(logging.INFO, logger=LOG):
        got, partitioned, metrics = _run(table, ["k"], AGGS, "2m", spill_dir)
    assert not partitioned and metrics.spill_count >= 3
    assert "hash partitions" not in caplog.text
    _check(table, ["k"], AGGS, got)


@pytest.mark.parametrize("kind", ["str", "float", "two-keys"])
def test_other_key_types_partition_exactly(spill_dir, kind) -> None:
    rng = np.random.default_rng(4)
    n = 120_000
    base = rng.integers(0, 60_000, n)
    v = pa.array(rng.random(n), mask=rng.random(n) < 0.05)
    if kind == "str":
        cols = {"k": pa.array([f"key-{x}" for x in base], mask=base % 97 == 0), "v": v}
        keys = ["k"]
    elif kind == "float":
        f = base.astype(np.float64) / 7
        f[base % 50 == 0] = np.nan
        f[base % 51 == 0] = -0.0
        f[base % 52 == 0] = 0.0
        cols = {"k": pa.array(f), "v": v}
        keys = ["k"]
    else:
        cols = {"a": pa.array(base // 300), "b": pa.array(base % 300).cast(pa.int16()), "v": v}
        keys = ["a", "b"]
    table = pa.table(cols)
    got, partitioned, _ = _run(table, keys, AGGS, "3m" if kind == "str" else "2m", spill_dir)
    assert partitioned
    _check(table, keys, AGGS, got)


def test_disk_full_while_partitioning_fails_clearly_and_cleans_up(spill_dir, monkeypatch) -> None:
    table = _int_table(300_000, 150_000, seed=5)
    written = []

    def opener(path):
        written.append(path)
        return FullDisk(path, 10_000 if "part-" in path else 1 << 40)

    monkeypatch.setattr(runfile, "open_for_writing", opener)
    agg = HashAggregator("k", AGGS, memory="2m", spill_dirs=[str(spill_dir)])
    with pytest.raises(SpillError, match="No space left"):
        for start in range(0, table.num_rows, 20_000):
            agg.update(table.slice(start, 20_000))
    assert any("part-" in p for p in written)
    # some rows of the failed chunk may be on disk and others not: the aggregator is closed,
    # and a later update says after what (as a one-thread table's failed spill does)
    with pytest.raises(SpillError, match=r"no more input after an earlier SpillError.*closed"):
        agg.update(table.slice(0, 10))
    assert agg.used == 0 and files_under(spill_dir) == []


def test_closing_while_reading_partitions_removes_everything(spill_dir) -> None:
    table = _int_table(300_000, 150_000, seed=6)
    agg = HashAggregator("k", AGGS, memory="2m", spill_dirs=[str(spill_dir)], batch_size=1000)
    for start in range(0, table.num_rows, 20_000):
        agg.update(table.slice(start, 20_000))
    assert agg._partitions is not None
    it = agg.results()
    next(it)
    assert files_under(spill_dir)
    it.close()
    assert agg.used == 0 and files_under(spill_dir) == []


@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=50), st.integers(1, 15))
def test_rotation_is_invertible_and_keeps_a_partitions_order(values, level) -> None:
    hashes = np.array(values, dtype=np.uint64)
    top = np.uint64(0xA) << np.uint64(60)
    part = (hashes & ~(np.uint64(0xF) << np.uint64(60))) | top  # one partition's hashes
    assert np.all(partition_of(part) == 0xA)
    rotated = rotate_left(part, 4)
    assert np.array_equal(rotate_right(rotated, 4), part)
    assert np.array_equal(np.argsort(rotated, kind="stable"), np.argsort(part, kind="stable"))
    assert np.array_equal(rotate_right(rotate_left(hashes, 4 * level), 4 * level), hashes)


def test_no_memory_for_partition_buffers_keeps_spilling_tables(spill_dir, monkeypatch) -> None:
    module = importlib.import_module("extagg.columnar.partitioning")
    monkeypatch.setattr(module, "held_bytes", lambda limit, copies: 1 << 40)  # never granted
    table = _int_table(200_000, 100_000, seed=8)
    got, partitioned, metrics = _run(table, ["k"], AGGS, "2m", spill_dir)
    assert not partitioned and metrics.spill_count >= 3
    _check(table, ["k"], AGGS, got)
    assert files_under(spill_dir) == []


# -- the tables spilled before partitioning are folded into the partitions' aggregators


@given(st.lists(st.integers(0, 2**64 - 1), max_size=60), st.integers(0, 70))
def test_partition_bounds_cut_sorted_hashes_by_partition(values, start) -> None:
    hashes = np.sort(np.array(values, dtype=np.uint64))
    start = min(start, len(hashes))
    ranges = partition_bounds(hashes, start)
    # reference: walk the rows, a new range whenever the partition changes
    want: list[list[int]] = []
    for row in range(start, len(hashes)):
        if want and int(hashes[row]) >> 60 == int(hashes[want[-1][0]]) >> 60:
            want[-1][1] = row + 1
        else:
            want.append([row, row + 1])
    assert ranges == [tuple(r) for r in want]


def test_spilled_tables_fold_into_partitions_without_a_merge(spill_dir, caplog) -> None:
    """Tables spilled before partitioning were written partition by partition; each
    partition's groups are folded into its aggregator, so nothing is merged afterwards: same
    groups as the reference, same order as in memory, every file removed."""
    table = _int_table(300_000, 150_000, seed=9)
    with caplog.at_level(logging.INFO, logger=LOG):
        got, partitioned, metrics = _run(table, ["k"], AGGS, "2m", spill_dir)
    assert partitioned and metrics.spill_count >= 2  # tables spilled before partitioning
    assert metrics.merge_passes == 0
    assert "hash partitions" in caplog.text
    _check(table, ["k"], AGGS, got)
    in_memory, _, _ = _run(table, ["k"], AGGS, "512m")
    assert got.column("k").to_pylist() == in_memory.column("k").to_pylist()
    assert files_under(spill_dir) == []


def test_string_states_still_merge_the_spilled_tables(spill_dir) -> None:
    """String min/max states live in an arena: their spilled tables are merged with the
    partitions' outputs as before."""
    rng = np.random.default_rng(10)
    n = 150_000
    k = rng.integers(0, 75_000, n)
    names = pa.array([f"n{x % 977}" for x in rng.integers(0, 10**6, n)])
    table = pa.table({"k": k, "name": names})
    aggs = {"lo": ("name", "min"), "hi": ("name", "max"), "n": ("*", "count")}
    got, partitioned, _ = _run(table, ["k"], aggs, "3m", spill_dir)
    assert partitioned
    _check(table, ["k"], aggs, got)
    assert files_under(spill_dir) == []


def test_a_run_batch_across_partitions_is_a_corrupt_file(spill_dir, monkeypatch) -> None:
    """Runs whose batches span two partitions (not written by this version) are refused
    with the file named, and every file is removed."""
    runs = importlib.import_module("extagg.columnar.runs")
    monkeypatch.setattr(runs, "partition_bounds", lambda hashes, start: [(start, len(hashes))])
    table = _int_table(300_000, 150_000, seed=9)
    with pytest.raises(CorruptFileError, match="partitions other than"):
        _run(table, ["k"], AGGS, "2m", spill_dir)
    assert files_under(spill_dir) == []


def _capacities_around_the_first_spill(spill_dir) -> tuple[int, int]:
    rng = np.random.default_rng(11)
    k = np.repeat(rng.permutation(400_000), 4)  # 4 adjacent rows per key: no partitioning
    table = pa.table({"k": k, "v": rng.random(len(k))})
    aggs = {"s": ("v", "sum"), "n": ("*", "count")}
    with HashAggregator("k", aggs, memory="28m", spill_dirs=[str(spill_dir)]) as agg:
        before, after = [0], [0]  # capacities before the first spill and after it
        for start in range(0, table.num_rows, 50_000):
            agg.update(table.slice(start, 50_000))
            spilled = agg.metrics.spill_count > 0
            (after if spilled else before).append(agg.table_state.table.capacity)
        assert agg.metrics.spill_count >= 1
        assert 0 < agg.metrics.peak_granted_bytes <= 28 << 20
        got = pa.Table.from_batches(list(agg.results()))
    order = np.argsort(got.column("k").to_numpy())
    keys, counts = np.unique(k, return_counts=True)
    assert np.array_equal(got.column("k").to_numpy()[order], keys)
    assert np.array_equal(got.column("n").to_numpy()[order], counts)
    assert files_under(spill_dir) == []
    return max(before), max(after)


def test_a_table_spilled_when_full_starts_again_larger(spill_dir, monkeypatch) -> None:
    """Doubling a full table by copying holds old and new arrays; once spilled and empty it
    is allocated new at the largest size granted: fewer spills, the budget still held. Group
    arrays that grow in place (a reserved mapping) let the first table double that far
    already, and the next one is no smaller."""
    from extagg.collection import typed_table

    in_place = _capacities_around_the_first_spill(spill_dir)
    monkeypatch.setattr(typed_table, "_reserve_bytes", lambda nbytes: 0)  # as under ``ulimit -v``
    copied = _capacities_around_the_first_spill(spill_dir)
    assert copied[1] >= 2 * copied[0]  # stopped where doubling was refused; then larger
    assert in_place[0] >= 2 * copied[0] and in_place[1] >= in_place[0]


@pytest.mark.parametrize("keys", [["k"], ["a", "b"]])
def test_a_split_table_keeps_its_lower_partitions_in_memory(spill_dir, caplog, keys) -> None:
    """Hybrid: a full table that barely reduces writes the groups of half its partitions and
    keeps the rest, aggregating their rows in memory to the end; the other partitions' rows
    are set aside. Null keys included; same groups as the reference, same order as in memory,
    the budget held, no file left."""
    table = _int_table(400_000, 150_000, seed=12)
    if keys != ["k"]:
        k = table.column("k")
        table = pa.table({"a": pc.divide(k, 1000), "b": pc.bit_wise_and(k, 1023), "v": table["v"]})
    with (
        caplog.at_level(logging.INFO, logger=LOG),
        HashAggregator(keys, AGGS, memory="6m", spill_dirs=[str(spill_dir)]) as agg,
    ):
        for start in range(0, table.num_rows, 20_000):
            agg.update(table.slice(start, 20_000))
        resident = agg.table_state.resident_parts
        assert 0 < resident < 16, resident  # some partitions stayed in memory
        got = pa.Table.from_batches(list(agg.results()), schema=agg.schema)
        assert 0 < agg.metrics.peak_granted_bytes <= 6 << 20
        assert agg.metrics.records_read == table.num_rows
    assert "keeping" in caplog.text
    _check(table, keys, AGGS, got)
    in_memory, _, _ = _run(table, keys, AGGS, "512m")
    assert got.select(keys).equals(in_memory.select(keys))  # same order
    assert files_under(spill_dir) == []


def test_a_split_table_folds_and_feeds_its_partitions_in_large_pieces(
    spill_dir, monkeypatch
) -> None:
    """After a split most rows of a chunk are written per partition, and the partitions are
    written with small buffers (the table keeps the memory): the chunks grow to the size the
    input has once partitioned (if granted), and a partition's small batches are fed to its
    aggregator together, not a few hundred rows per call (which made a 20 M-row run 2.5x
    slower). Same groups as the reference, the budget held."""
    import extagg.columnar.hash_aggregator as ha
    import extagg.columnar.partition_files as pf

    reads: list[int] = []
    feeds: list[int] = []
    read_block = pf.RunReader.read_block
    update = ha.HashAggregator._update_columns

    def counting_read(self, i):  # type: ignore[no-untyped-def]
        block = read_block(self, i)
        if "part-" in self.path:
            reads.append(len(block))
        return block

    def counting_update(self, cols, n, enc=None, step=None):  # type: ignore[no-untyped-def]
        if "/p" in self.name:
            feeds.append(n)
        return update(self, cols, n, enc, step)

    monkeypatch.setattr(pf.RunReader, "read_block", counting_read)
    monkeypatch.setattr(ha.HashAggregator, "_update_columns", counting_update)
    table = _int_table(400_000, 150_000, seed=12)
    with HashAggregator(["k"], AGGS, memory="6m", spill_dirs=[str(spill_dir)]) as agg:
        first_chunk_rows = None
        for start in range(0, table.num_rows, 20_000):
            agg.update(table.slice(start, 20_000))
            if first_chunk_rows is None:
                first_chunk_rows = agg.table_state.chunk_rows
        assert 0 < agg.table_state.resident_parts < 16  # split
        assert first_chunk_rows is not None
        assert agg.table_state.chunk_rows > first_chunk_rows
        got = pa.Table.from_batches(list(agg.results()), schema=agg.schema)
        assert 0 < agg.metrics.peak_granted_bytes <= 6 << 20
    assert reads and sum(feeds) == sum(reads)
    # fed together: thousands of rows a call (the split's buffers write ~2 K-row batches)
    assert len(feeds) * 2 <= len(reads) + 16, (len(feeds), len(reads))
    assert sorted(feeds)[len(feeds) // 2] >= 4096, feeds
    _check(table, ["k"], AGGS, got)
    assert files_under(spill_dir) == []


def test_a_chunks_strings_not_granted_at_once_are_set_aside_in_pieces(
    spill_dir, monkeypatch
) -> None:
    # at a budget of a few MiB the partition buffers and the input's batches can hold nearly
    # all of it (a file's query at 1 MiB): a chunk's string copies not granted at once are
    # set aside a piece at a time (a MemoryLimitError before)
    rng = np.random.default_rng(12)
    ids = rng.integers(0, 60_000, 100_000)
    table = pa.table({
        "k": pa.array([f"user-{i:06d}" for i in ids.tolist()]),
        "v": rng.normal(0, 1, len(ids)),
    })  # fmt: skip
    aggs = {"n": ("*", "count"), "s": ("v", "sum")}
    module = importlib.import_module("extagg.columnar.hash_aggregator")
    module_set_aside = module.set_aside
    asked: dict[str, list[int]] = {"granted": [], "refused": []}
    most = {"bytes": 4096}

    class Tight:  # the budget as set_aside sees it: at most most["bytes"] more at once
        def __init__(self, budget) -> None:
            self.budget = budget

        def hold_more(self, nbytes: int) -> bool:
            fits = nbytes <= most["bytes"]
            asked["granted" if fits else "refused"].append(nbytes)
            return fits and self.budget.hold_more(nbytes)

        def __getattr__(self, name: str):
            return getattr(self.budget, name)

    def tight_set_aside(st, *args, **kwargs) -> None:
        budget, st.budget = st.budget, Tight(st.budget)
        try:
            module_set_aside(st, *args, **kwargs)
        finally:
            st.budget = budget

    monkeypatch.setattr(module, "set_aside", tight_set_aside)
    got, partitioned, metrics = _run(table, ["k"], aggs, "2m", spill_dir, batch=50_000)
    assert partitioned and asked["refused"] and asked["granted"]
    assert metrics.records_read == table.num_rows
    _check(table, ["k"], aggs, got)
    assert files_under(spill_dir) == []
    most["bytes"] = 8  # not even a row's copies
    with pytest.raises(MemoryLimitError, match="to set aside a row's"):
        _run(table, ["k"], aggs, "2m", spill_dir, batch=50_000)
    assert files_under(spill_dir) == []

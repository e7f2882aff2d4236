"""count_distinct: an external two-level group-by, joined with the other aggregates."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg import run_metrics
from extagg.columnar import DistinctAggregator, HashAggregator, aggregate
from extagg.columnar.distinct import JoinError, join_hashed
from tests.columnar.reference import canon


def _reference(keys, urls, values):
    groups: dict = {}
    for k, u, v in zip(keys, urls, values):
        g = groups.setdefault(canon(k), {"n": 0, "u": set(), "s": None, "vu": set()})
        g["n"] += 1
        if u is not None:
            g["u"].add(u)
        if v is not None:
            g["s"] = v if g["s"] is None else g["s"] + v
            g["vu"].add(canon(v) if v != 0 else 0.0)
    return {k: {"n": g["n"], "u": len(g["u"]), "s": g["s"], "vu": len(g["vu"])}
            for k, g in groups.items()}  # fmt: skip


AGGS = {
    "n": ("*", "count"), "u": ("url", "count_distinct"), "s": ("i", "sum"),
    "vu": ("v", "nunique"),
}  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_matches_reference_with_spills_in_both_levels(data) -> None:
    n = data.draw(st.integers(0, 200))
    keys = data.draw(st.lists(st.one_of(st.none(), st.integers(0, 6)), min_size=n, max_size=n))
    urls = data.draw(
        st.lists(st.one_of(st.none(), st.sampled_from(["", "a", "b", "c/d", "é"])),
                 min_size=n, max_size=n)
    )  # fmt: skip
    values = data.draw(
        st.lists(st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.5, math.nan, -2.0])),
                 min_size=n, max_size=n)
    )  # fmt: skip
    ints = [None if k is None else k * 3 for k in keys]
    table = pa.table(
        {
            "k": pa.array(keys, pa.int16()),
            "url": pa.array(urls, pa.string()),
            "v": pa.array(values, pa.float64()),
            "i": pa.array(ints, pa.int64()),
        }
    )
    want = {
        k: {"n": r["n"], "u": r["u"], "s": None if r["n"] == 0 else r["s"], "vu": r["vu"]}
        for k, r in _reference(keys, urls, values).items()
    }
    for k, r in want.items():  # sum of ints
        total = [x for kk, x in zip(keys, ints) if canon(kk) == k and x is not None]
        r["s"] = sum(total) if total else None
    forced = {"force_spill_rows": 9, "batch_size": 2, "fan_in": 2}
    for options in ({}, forced):
        with DistinctAggregator("k", AGGS, **options) as agg:
            for batch in table.to_batches(max_chunksize=23):
                agg.update(batch)
            out = list(agg.results())
            if options:  # every level that read 9 rows or more spilled
                for level in agg._levels:
                    for part in (level.first, level.second):
                        m = part.metrics
                        assert m.records_read < 9 or m.spill_count > 0
        rows = pa.Table.from_batches(out).to_pylist() if out else []
        got = {canon(r["k"]): {c: r[c] for c in AGGS} for r in rows}
        assert got == want
        assert [r["k"] for r in rows] == [
            r["k"] for r in aggregate(table, keys="k", aggs={"n": ("*", "count")}).to_pylist()
        ] or not rows  # same hash order as a plain aggregation


def test_tiny_budget_spills_both_levels() -> None:
    rng = np.random.default_rng(3)
    n = 300_000
    k = rng.integers(0, 100_000, n)
    u = rng.integers(0, 50, n)
    table = pa.table({"k": k, "u": u, "x": rng.normal(size=n)})
    with DistinctAggregator(
        "k", {"d": ("u", "count_distinct"), "m": ("x", "max")}, memory="3m"
    ) as agg:
        for batch in table.to_batches(max_chunksize=10_000):
            agg.update(batch)
        out = pa.Table.from_batches(list(agg.results()))
        (level,) = agg._levels
        # the first level spilled once, then the rows went aside by key hash
        assert level.first.metrics.spill_count > 0 and level.partitioned
        assert agg.metrics.spill_count > level.first.metrics.spill_count
    pairs = np.unique(k * 100_000 + u)
    want = np.bincount(pairs // 100_000, minlength=100_000)
    got = dict(zip(out.column("k").to_pylist(), out.column("d").to_pylist()))
    assert got == {g: int(want[g]) for g in np.unique(k)}


def test_global_count_distinct_and_empty_input() -> None:
    table = pa.table({"u": pa.array([1, 2, 2, None, 1], pa.int32())})
    assert aggregate(table, keys=[], aggs={"d": ("u", "count_distinct")}).to_pylist() == [{"d": 2}]
    empty = table.slice(0, 0)
    aggs = {"d": ("u", "count_distinct"), "n": ("*", "count")}
    assert aggregate(empty, keys=[], aggs=aggs).to_pylist() == [{"d": 0, "n": 0}]


def test_hash_aggregator_points_to_the_two_level_form() -> None:
    with pytest.raises(ValueError, match="DistinctAggregator"):
        HashAggregator("k", {"d": ("u", "count_distinct")})
    with pytest.raises(ValueError, match="only count accepts"):
        DistinctAggregator("k", {"d": ("*", "count_distinct")})


def _stream(hashes, keys, value_name, values, cuts):
    out = []
    start = 0
    for stop in [*cuts, len(hashes)]:
        batch = pa.record_batch(
            {"k": pa.array(keys[start:stop], pa.int64()), value_name: values[start:stop]}
        )
        out.append((np.array(hashes[start:stop], dtype=np.uint64), batch))
        start = stop
    return iter(out)


def test_join_matches_colliding_hashes_by_key_across_batches() -> None:
    hashes = [1, 5, 5, 5, 9, 9, 12]
    left_keys = [10, 50, 51, 52, 90, 91, 120]
    right_keys = [10, 52, 50, 51, 91, 90, 120]  # colliding keys in another order
    left = _stream(hashes, left_keys, "a", [k * 2 for k in left_keys], [2, 5])
    right = _stream(hashes, right_keys, "b", [k * 3 for k in right_keys], [1, 3, 4, 6])
    rows = []
    for h, batch in join_hashed([left, right], ["k"], ["a", "b"]):
        assert len(h) == batch.num_rows
        rows.extend(batch.to_pylist())
    assert rows == [{"k": k, "a": 2 * k, "b": 3 * k} for k in left_keys]


def test_join_reports_groups_that_differ() -> None:
    left = _stream([1, 2], [1, 2], "a", [1, 2], [])
    right = _stream([1, 3], [1, 3], "b", [1, 3], [])
    with pytest.raises(JoinError):
        list(join_hashed([left, right], ["k"], ["a", "b"]))


def test_join_buffers_are_accounted_to_the_manager() -> None:
    from extagg.columnar.distinct import JoinBuffers
    from extagg.memory import UnifiedMemoryManager, task_memory_manager

    mm = UnifiedMemoryManager("16m")
    tmm = task_memory_manager(mm)
    n = 50_000
    rng = np.random.default_rng(4)
    batch = pa.table({"k": rng.integers(0, 20_000, n), "url": rng.integers(0, 5, n),
                      "i": rng.integers(0, 9, n)})  # fmt: skip
    held = []
    with DistinctAggregator("k", {"u": ("url", "count_distinct"), "s": ("i", "sum")},
                            memory_manager=mm) as agg:  # fmt: skip
        agg.update(batch)
        for _ in agg.results():
            held.append(sum(c.used for c in tmm.consumers if isinstance(c, JoinBuffers)))
    assert max(held) > 0  # the rows buffered for the join are granted by the manager
    assert tmm.memory_used == 0 and not any(isinstance(c, JoinBuffers) for c in tmm.consumers)


def test_join_buffers_refused_raise_memory_limit() -> None:
    from extagg.columnar.distinct import JoinBuffers
    from extagg.errors import MemoryLimitError
    from extagg.memory import UnifiedMemoryManager, task_memory_manager

    mm = UnifiedMemoryManager("2m")
    buffers = JoinBuffers(task_memory_manager(mm), "join")
    buffers.hold(1 << 20)
    assert buffers.used == 1 << 20
    with pytest.raises(MemoryLimitError, match=r"join of count_distinct results needs 3\.0 MiB"):
        buffers.hold(3 << 20)
    buffers.hold(1 << 10)
    assert buffers.used == 1 << 10
    buffers.close_memory()


def _distinct_table(n: int, seed: int, strings: bool = False) -> pa.Table:
    rng = np.random.default_rng(seed)
    part = rng.integers(0, 4_000, n)
    supp = rng.integers(0, 4, n)
    order = rng.integers(0, 1_000, n).astype(float)
    order[rng.random(n) < 0.05] = np.nan  # nulls of the distinct column are not counted
    k1 = pa.array([f"p{p}" for p in part]) if strings else pa.array(part)
    k2 = pa.array(supp, mask=rng.random(n) < 0.02)  # null keys are a group of their own
    return pa.table({"k1": k1, "k2": k2, "o": pa.array(order, from_pandas=True),
                     "x": rng.integers(0, 9, n)})  # fmt: skip


@pytest.mark.parametrize("strings", [False, True])
def test_a_spilling_level_sets_rows_aside_by_key_hash(tmp_path, caplog, strings) -> None:
    """At its first spill a level partitions its rows by the hash of the keys; each partition
    then runs both levels (a child that spills partitions again, by the next bits): same rows
    in the same order as in memory, the budget held, every file deleted."""
    from extagg.memory import UnifiedMemoryManager, task_memory_manager

    table = _distinct_table(500_000, 5, strings)
    aggs = {"u": ("o", "count_distinct"), "s": ("x", "sum"), "n": ("*", "count")}
    with DistinctAggregator(["k1", "k2"], aggs) as agg:
        for batch in table.to_batches(max_chunksize=30_000):
            agg.update(batch)
        want = pa.Table.from_batches(list(agg.results()))
        assert not agg._levels[0].partitioned
    mm = UnifiedMemoryManager("2m")
    tmm = task_memory_manager(mm)
    peak = 0
    caplog.set_level("INFO", logger="extagg.columnar.distinct")
    with DistinctAggregator(
        ["k1", "k2"], aggs, memory_manager=mm, spill_dirs=[str(tmp_path)]
    ) as agg:
        for batch in table.to_batches(max_chunksize=30_000):
            agg.update(batch)
            peak = max(peak, tmm.memory_used)
        out = []
        for batch in agg.results():
            out.append(batch)
            peak = max(peak, tmm.memory_used)
        assert agg._levels[0].partitioned
        assert agg.metrics.records_read == table.num_rows
        assert agg.metrics.disk_bytes_spilled > 0
    got = pa.Table.from_batches(out)
    assert got.num_rows == want.num_rows > 15_000
    assert got.equals(want)  # same groups, same counts, same (hash) order
    assert peak <= mm.max_memory and tmm.memory_used == 0
    assert "partitioning depth 1" in caplog.text  # a partition was split again
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_partitioned_level_checks_types_and_cleans_up_on_error(tmp_path) -> None:
    table = _distinct_table(200_000, 6)
    with DistinctAggregator(
        ["k1", "k2"], {"u": ("o", "count_distinct")}, memory="2m", spill_dirs=[str(tmp_path)]
    ) as agg:
        for batch in table.to_batches(max_chunksize=20_000):
            agg.update(batch)
        assert agg._levels[0].partitioned
        bad = table.slice(0, 10).set_column(2, "o", pa.array(["a"] * 10))
        with pytest.raises(TypeError, match="column 'o' changed type"):
            agg.update(bad)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.parametrize("key_type", ["decimal", "date", "timestamp_tz", "dictionary", "large",
                                      "float", "int8"])  # fmt: skip
def test_partitioned_level_keeps_key_types_and_hashes(key_type) -> None:
    """The pairs read out of the first level at the switch and the input rows after it hash
    alike (the join with the plain aggregate checks every hash) and keep the key's type."""
    import decimal

    rng = np.random.default_rng(2)
    n = 120_000
    base = rng.integers(0, 3_000, n)
    keys = {
        "decimal": lambda: pa.array([decimal.Decimal(int(b)) / 100 for b in base],
                                    pa.decimal128(15, 2)),
        "date": lambda: pa.array(base.astype("datetime64[D]")),
        "timestamp_tz": lambda: pa.array(base.astype("datetime64[s]")).cast(
            pa.timestamp("s", tz="UTC")),
        "dictionary": lambda: pa.array([f"s{b}" for b in base]).dictionary_encode(),
        "large": lambda: pa.array([f"s{b}" for b in base], pa.large_string()),
        "float": lambda: pa.array(np.where(base % 7 == 0, -0.0, base / 3.0)),
        "int8": lambda: pa.array((base % 100).astype(np.int8)),
    }  # fmt: skip
    table = pa.table({"k": keys[key_type](), "b": pa.array(base % 5),
                      "o": rng.integers(0, 400, n), "x": rng.integers(0, 5, n)})  # fmt: skip
    aggs = {"u": ("o", "count_distinct"), "s": ("x", "sum")}
    outs = []
    for memory in (None, "2m"):
        with DistinctAggregator(["k", "b"], aggs, memory=memory) as agg:
            for batch in table.to_batches(max_chunksize=20_000):
                agg.update(batch)
            outs.append(pa.Table.from_batches(list(agg.results())))
            assert agg._levels[0].partitioned == (memory is not None)
    assert outs[1].equals(outs[0])


def _partitioned(agg: DistinctAggregator, table: pa.Table) -> None:
    for batch in table.to_batches(max_chunksize=20_000):
        agg.update(batch)
    assert agg._levels[0].partitioned


def test_partitioned_level_with_threads_gives_the_same_rows(tmp_path) -> None:
    table = _distinct_table(300_000, 8)
    aggs = {"u": ("o", "count_distinct"), "n": ("*", "count")}
    want = aggregate(table, keys=["k1", "k2"], aggs=aggs)
    got = aggregate(table, keys=["k1", "k2"], aggs=aggs, memory="3m", threads=2,
                    spill_dirs=[str(tmp_path)])  # fmt: skip
    assert got.equals(want)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_corrupt_partition_file_is_named_and_everything_removed(tmp_path) -> None:
    from extagg.errors import CorruptFileError

    table = _distinct_table(200_000, 9)
    with DistinctAggregator(["k1", "k2"], {"u": ("o", "count_distinct")}, memory="2m",
                            spill_dirs=[str(tmp_path)]) as agg:  # fmt: skip
        _partitioned(agg, table)
        results = agg.results()
        level = agg._levels[0]
        level.finish_input()  # idempotent: the results() below find the files closed
        path = next(p for p in level._aside.paths if p is not None)
        with open(path, "r+b") as f:
            f.seek(200)
            byte = f.read(1)
            f.seek(200)
            f.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(CorruptFileError, match=path.rsplit("/", 1)[-1]):
            list(results)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_interrupt_while_partitions_are_aggregated_leaves_nothing(tmp_path, monkeypatch) -> None:
    from extagg.columnar.distinct import DistinctLevel
    from extagg.memory import UnifiedMemoryManager, task_memory_manager

    table = _distinct_table(200_000, 10)
    mm = UnifiedMemoryManager("2m")
    tmm = task_memory_manager(mm)
    calls = []
    real = DistinctLevel.update_columns

    def interrupted(self, cols, n):
        calls.append(n)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(self, cols, n)

    with DistinctAggregator(["k1", "k2"], {"u": ("o", "count_distinct"), "s": ("x", "sum")},
                            memory_manager=mm, spill_dirs=[str(tmp_path)]) as agg:  # fmt: skip
        _partitioned(agg, table)
        monkeypatch.setattr(DistinctLevel, "update_columns", interrupted)
        with pytest.raises(KeyboardInterrupt):
            list(agg.results())
    assert len(calls) == 3 and tmm.memory_used == 0
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_spill_cap_reached_while_setting_rows_aside(tmp_path) -> None:
    """A full disk (here: the spill cap) while rows are set aside raises SpillError naming
    it; nothing stays behind."""
    from extagg.errors import SpillError

    table = _distinct_table(300_000, 11)
    aggs = {"u": ("o", "count_distinct")}
    agg = DistinctAggregator(["k1", "k2"], aggs, memory="2m", spill_dirs=[str(tmp_path)],
                             max_spill_bytes="1500k")  # fmt: skip
    with agg, pytest.raises(SpillError, match="max_spill_bytes") as raised:
        for batch in table.to_batches(max_chunksize=20_000):
            agg.update(batch)
        list(agg.results())
    assert agg._levels[0].partitioned
    assert any(str(e.path).endswith("partition_files.py") for e in raised.traceback)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.parametrize("threads", [1, 2])
def test_a_large_first_level_partitions_without_memory_pressure(
    monkeypatch, caplog, threads
) -> None:
    """Past ``PARTITION_FIRST_GROUPS`` pairs the top level partitions with memory to spare
    (its children only when they spill): same rows, same order."""
    import extagg.columnar.distinct as D

    table = _distinct_table(200_000, 12)
    aggs = {"u": ("o", "count_distinct"), "s": ("x", "sum")}
    want = aggregate(table, keys=["k1", "k2"], aggs=aggs)
    monkeypatch.setattr(D, "PARTITION_FIRST_GROUPS", 20_000)
    caplog.set_level("INFO", logger="extagg.columnar.distinct")
    with DistinctAggregator(["k1", "k2"], aggs, threads=threads) as agg:
        _partitioned(agg, table)
        got = pa.Table.from_batches(list(agg.results()))
        assert agg.metrics.spill_count == 1  # the switch; nothing spilled
    assert got.equals(want)
    assert "groups; setting its rows aside" in caplog.text and "depth 1" not in caplog.text


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("memory", ["1m", "2m", "8m"])
def test_several_count_distinct_and_a_string_state_share_a_tiny_budget(
    tmp_path, memory, threads
) -> None:
    """Two ``count_distinct`` (an int and a string column) beside a string ``max``, by a string
    key. Each level's rows-aside buffers took up to half of the budget, unspillable, and the
    first merge of the join took the rest: ``MemoryLimitError`` at 1, 2 and even 8 MiB. Now
    the buffers are written out when others need the memory, shrink when refused, and each
    of the join's merges has a share."""
    import pyarrow.parquet as pq

    from extagg import aggregate_files

    table = _distinct_table(120_000, 12, strings=True)
    table = table.append_column("s", pa.array([f"s{x % 300}" for x in range(table.num_rows)]))
    aggs = {
        "n": ("*", "count"), "u": ("o", "count_distinct"), "v": ("s", "count_distinct"),
        "hi": ("s", "max"),
    }  # fmt: skip
    src = tmp_path / "t.parquet"
    pq.write_table(table, src, row_group_size=20_000)
    spill = tmp_path / "spill"
    want = aggregate(table, keys=["k1"], aggs=aggs)
    got = aggregate_files(src, by=["k1"], aggs=aggs, memory=memory, threads=threads,
                          spill_dirs=[str(spill)]).read_all()  # fmt: skip
    key = [("k1", "ascending")]
    assert got.sort_by(key).equals(want.sort_by(key))
    assert not [p for p in spill.rglob("*") if p.is_file()]


@pytest.mark.parametrize("memory", ["1m", "2m", "4m"])
def test_count_distinct_beside_a_sum_by_many_string_keys(memory) -> None:
    """200 k rows, ~86 k string keys: the sum's aggregator, its rows set aside by partition,
    held its buffers (2.5 MiB at 4 MiB) when the level's rows-aside asked for 140 KiB, and
    the level's merge moving its pairs aside took the rest: ``MemoryLimitError`` at 1, 2 and
    4 MiB. Now a spill asked of an aggregator with nothing to spill gives back its empty
    table or partition buffers, and the rows-aside keeps the room for a chunk while that
    merge feeds it."""
    n = 200_000
    rng = np.random.default_rng(0)
    keys = rng.integers(0, n // 2, n)
    table = pa.table(
        {"k": pa.array([f"k{i}" for i in keys]), "v": pa.array(rng.integers(0, 10**9, n))}
    )
    aggs = {"cd": ("v", "count_distinct"), "s": ("v", "sum")}
    got = aggregate(table, keys="k", aggs=aggs, memory=memory, threads=1)
    want = table.group_by("k").aggregate([("v", "count_distinct"), ("v", "sum")])
    assert got.num_rows == want.num_rows
    assert sorted(zip(got["k"].to_pylist(), got["cd"].to_pylist(), got["s"].to_pylist())) == (
        sorted(zip(want["k"].to_pylist(), want["v_count_distinct"].to_pylist(),
                   want["v_sum"].to_pylist()))
    )  # fmt: skip


@pytest.mark.slow
def test_count_distinct_beside_string_states_at_the_smallest_budget() -> None:
    """A sum, a string ``min`` and ``first`` and a ``count_distinct`` by ~20 k string keys at
    1 MiB: a partition of the level read back started its table sized for the partition's
    rows, without headroom, and an empty table of 623 KiB then had no room for its first
    chunk's key bytes (``MemoryLimitError``). An empty table is now started again at its
    smallest when that happens."""
    n = 100_000
    rng = np.random.default_rng(7)
    table = pa.table(
        {
            "k": pa.array([f"key-{i:06d}-ü" for i in rng.integers(0, 20_000, n)]),
            "v": pa.array(rng.integers(-(10**12), 10**12, n)),
        }
    )
    aggs = {"s": ("v", "sum"), "lo": ("k", "min"), "f": ("k", "first"),
            "cd": ("v", "count_distinct")}  # fmt: skip
    batches = table.to_batches(max_chunksize=7919)
    got = aggregate(batches, keys="k", aggs=aggs, memory="1m", threads=1)
    assert run_metrics(got).spill_count > 0
    want = aggregate(batches, keys="k", aggs=aggs)
    key = [("k", "ascending")]
    assert got.sort_by(key).equals(want.sort_by(key))
    ref = table.group_by("k").aggregate([("v", "count_distinct"), ("v", "sum")]).sort_by(key)
    assert got.sort_by(key)["cd"].to_pylist() == ref["v_count_distinct"].to_pylist()
    assert got.sort_by(key)["s"].to_pylist() == ref["v_sum"].to_pylist()


def test_rows_aside_buffers_are_written_out_when_others_need_the_memory(tmp_path) -> None:
    """The level's partition buffers are a spillable consumer: asked to spill (between
    writes) it writes what it buffered and holds nothing; later rows and the result are as
    without the spill."""
    table = _distinct_table(300_000, 13)
    aggs = {"u": ("o", "count_distinct")}
    want = aggregate(table, keys=["k1", "k2"], aggs=aggs)
    with DistinctAggregator(["k1", "k2"], aggs, memory="3m", spill_dirs=[str(tmp_path)]) as agg:
        batches = table.to_batches(max_chunksize=20_000)
        for batch in batches[:6]:
            agg.update(batch)
        aside = agg._levels[0]._aside
        assert aside is not None and aside.used > 0
        assert aside.spill(1 << 30, None) > 0 and aside.used == 0
        assert aside.spill(1 << 30, None) == 0  # nothing more to give
        for batch in batches[6:]:
            agg.update(batch)
        got = pa.Table.from_batches(list(agg.results()))
    assert got.sort_by([("k1", "ascending"), ("k2", "ascending")]).equals(
        want.sort_by([("k1", "ascending"), ("k2", "ascending")])
    )
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_results_take_ordered_as_hash_aggregators_do() -> None:
    """``make_aggregator`` gives a :class:`DistinctAggregator` for any ``count_distinct``
    query: its ``results(ordered=False)`` raised ``TypeError``."""
    batch = pa.record_batch({"k": [1, 1, 2, 1], "u": [5, 6, 5, 5]})
    with DistinctAggregator(["k"], {"d": ("u", "count_distinct")}, memory="2m") as agg:
        agg.update(batch)
        rows = {r["k"]: r["d"] for b in agg.results(ordered=False) for r in b.to_pylist()}
    assert rows == {1: 2, 2: 1}


def _many_distinct_table(n: int, levels: int) -> pa.Table:
    rng = np.random.default_rng(1)
    names = np.array(["", "a", "B", "é", "z", "ab", "\U0001f600"], dtype=object)
    cols = {
        "sk": pa.array(names[rng.integers(0, len(names), n)]),
        "fk": pa.array(rng.choice(np.array([-1.5, 0.0, 1.5, 2.5, np.inf]), n)),
    }
    for i in range(levels):
        cols[f"c{i}"] = pa.array(rng.integers(0, n // (2 + i), n))
    return pa.table(cols)


def _check_many_distinct(got: pa.Table, table: pa.Table, levels: int) -> None:
    rows = {(r["sk"], r["fk"]): r for r in got.to_pylist()}
    data = table.to_pydict()
    for i in range(levels):
        want: dict = {}
        for a, b, v in zip(data["sk"], data["fk"], data[f"c{i}"]):
            want.setdefault((a, b), set()).add(v)
        assert {k: rows[k][f"d{i}"] for k in want} == {k: len(v) for k, v in want.items()}
    assert sum(r["n"] for r in rows.values()) == table.num_rows


@pytest.mark.slow
def test_eight_count_distinct_share_the_smallest_budget() -> None:
    """Eight ``count_distinct`` beside a count and a string ``min`` at 1 MiB: nine streams
    merged side by side by the join, each with a ninth of the budget, but their run batches
    were sized for the whole budget (two read buffers of 96 KiB each, more than a share), and
    a partition's first level merged with no limit at all while the join ran:
    ``MemoryLimitError``. Run batches are now sized so two read buffers fit in the share."""
    levels = 8
    table = _many_distinct_table(60_000, levels)
    aggs: dict = {f"d{i}": (f"c{i}", "count_distinct") for i in range(levels)}
    aggs.update(n=("*", "count"), mn=("sk", "min"))
    got = aggregate(table.to_batches(max_chunksize=8192), keys=["sk", "fk"], aggs=aggs,
                    memory="1m", threads=1)  # fmt: skip
    assert run_metrics(got).spill_count > 0
    _check_many_distinct(got, table, levels)


def test_kernels_warmed_beside_many_count_distinct_at_the_smallest_budget(tmp_path) -> None:
    """``aggregate_files`` loads the query's kernels by folding, spilling and merging a few
    rows with a second aggregator beside the run's own; with eight ``count_distinct`` at
    1 MiB that throwaway merge did not fit beside the run's seventeen tables and the run failed
    with ``MemoryLimitError`` before reading a row. The warm-up is best effort now."""
    import pyarrow.parquet as pq

    from extagg import aggregate_files

    levels = 8
    table = _many_distinct_table(20_000, levels)
    src = tmp_path / "t.parquet"
    pq.write_table(table, src, row_group_size=5_000)
    aggs: dict = {f"d{i}": (f"c{i}", "count_distinct") for i in range(levels)}
    aggs.update(n=("*", "count"), mn=("sk", "min"))
    spill = tmp_path / "spill"
    got = aggregate_files(src, by=["sk", "fk"], aggs=aggs, memory="1m", threads=1,
                          spill_dirs=[str(spill)]).read_all()  # fmt: skip
    _check_many_distinct(got, table, levels)
    assert not [p for p in spill.rglob("*") if p.is_file()]


def _no_files(path) -> bool:
    return not [p for p in path.rglob("*") if p.is_file()]


@pytest.mark.parametrize("memory", ["1m", "2m", "4m"])
def test_global_count_distincts_merge_and_count_at_small_budgets(tmp_path, memory) -> None:
    """Two global ``count_distinct`` (no keys: their levels never partition), ~146 k distinct
    strings and ints. A first level that spilled merged its runs into its second level with
    read buffers for its whole fan-in, the whole budget, unspillable: the second could not
    start (``cs.2 needs 128.0 KiB to start ... 0.0 B held``) at 2 MiB. The first level's
    merge now holds at most half of the budget."""
    rng = np.random.default_rng(13)
    x = rng.integers(0, 300_000, 200_000)
    table = pa.table({"s": [f"v{a}" for a in x], "i": x})
    aggs = {"cs": ("s", "count_distinct"), "ci": ("i", "count_distinct")}
    got = aggregate(table.to_batches(max_chunksize=20_000), keys=[], aggs=aggs, memory=memory,
                    threads=1, spill_dirs=[str(tmp_path)])  # fmt: skip
    assert run_metrics(got).spill_count > 0
    distinct = len(np.unique(x))
    assert got.to_pylist() == [{"cs": distinct, "ci": distinct}]
    assert _no_files(tmp_path)


@pytest.mark.parametrize("threads", [1, 2])
def test_global_count_distincts_from_files_at_the_smallest_budget(tmp_path, threads) -> None:
    """The same through ``aggregate_files`` (the CLI's path), which failed at 1 and 2 MiB."""
    import pyarrow.parquet as pq

    from extagg import aggregate_files

    rng = np.random.default_rng(13)
    x = rng.integers(0, 300_000, 200_000)
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"s": [f"v{a}" for a in x], "i": x}), src, row_group_size=20_000)
    aggs = {"cs": ("s", "count_distinct"), "ci": ("i", "count_distinct")}
    spill = tmp_path / "spill"
    got = aggregate_files(src, by=[], aggs=aggs, memory="1m", threads=threads,
                          spill_dirs=[str(spill)]).read_all()  # fmt: skip
    distinct = len(np.unique(x))
    assert got.to_pylist() == [{"cs": distinct, "ci": distinct}]
    assert _no_files(spill)


def test_count_distinct_with_forced_spills_beside_a_sum(tmp_path) -> None:
    """``force_spill_rows=100`` (a level never partitions then): each first level spilled
    every 100 rows and merged its ~200 runs into the second level with all of the budget;
    the second could not start at any budget (1-16 MiB)."""
    rng = np.random.default_rng(0)
    n = 20_000
    table = pa.table({"k": rng.integers(0, 2000, n), "v": rng.integers(0, 100_000, n),
                      "f": rng.integers(0, 9, n)})  # fmt: skip
    aggs = {"cd": ("v", "count_distinct"), "s": ("f", "sum")}
    got = aggregate(table, keys="k", aggs=aggs, memory="1m", threads=1, force_spill_rows=100,
                    spill_dirs=[str(tmp_path)])  # fmt: skip
    want = table.group_by("k").aggregate([("v", "count_distinct"), ("f", "sum")])
    assert sorted(zip(got["k"].to_pylist(), got["cd"].to_pylist(), got["s"].to_pylist())) == (
        sorted(zip(want["k"].to_pylist(), want["v_count_distinct"].to_pylist(),
                   want["f_sum"].to_pylist()))
    )  # fmt: skip
    assert _no_files(tmp_path)


def _check_distinct_by_k(got: pa.Table, table: pa.Table) -> None:
    want = table.group_by("k").aggregate([("v", "count_distinct")])
    assert sorted(zip(got["k"].to_pylist(), got["cd"].to_pylist())) == sorted(
        zip(want["k"].to_pylist(), want["v_count_distinct"].to_pylist())
    )


@pytest.mark.parametrize("memory", ["1m", "2m"])
def test_count_distinct_of_values_of_a_few_kb_sets_rows_aside(tmp_path, memory) -> None:
    """2,000 values of 5,000 characters by 500 string keys: the rows set aside went in chunks
    of 256 rows at least, whose temporaries (2.6 MiB) were more than the budget, and moving
    the first level's pairs aside found its merge holding the rest (``MemoryLimitError`` at 1
    and 2 MiB). Chunks of wide rows are now fewer rows, down to one."""
    rng = np.random.default_rng(0)
    n = 2000
    keys = [f"k{x}" for x in rng.integers(0, n // 4, n)]
    table = pa.table({"k": keys, "v": [f"{x:08d}".ljust(5000, "x") for x in rng.integers(0, n, n)]})
    got = aggregate(table.to_batches(max_chunksize=1000), keys="k",
                    aggs={"cd": ("v", "count_distinct")}, memory=memory, threads=1,
                    spill_dirs=[str(tmp_path)])  # fmt: skip
    assert run_metrics(got).spill_count > 0
    _check_distinct_by_k(got, table)
    assert _no_files(tmp_path)


def test_count_distinct_of_long_strings_nested_three_levels_deep(tmp_path) -> None:
    """400 values of 10-25 KB by 10 keys of 10-20 KB at 1 MiB: the rows went aside three
    levels deep, and a level that deep (it cannot partition again) merged its first level
    into its second with all of the budget (``p3.10.2 needs 162.7 KiB to start``)."""
    rng = np.random.default_rng(3)
    n, width = 400, 20_000
    table = pa.table({"k": [f"k{rng.integers(0, 10)}" * (width // 2) for _ in range(n)],
                      "v": [f"v{i}" * (width // 4) for i in range(n)]})  # fmt: skip
    got = aggregate(table.to_batches(max_chunksize=3), keys="k",
                    aggs={"cd": ("v", "count_distinct")}, memory="1m", threads=1,
                    spill_dirs=[str(tmp_path)])  # fmt: skip
    _check_distinct_by_k(got, table)
    assert _no_files(tmp_path)


def test_refused_start_names_who_holds_the_memory() -> None:
    """A requester that holds nothing was starved by another consumer: the error names it."""
    from extagg import MemoryLimitError
    from extagg.memory import MemoryConsumer, UnifiedMemoryManager, task_memory_manager

    class Hog(MemoryConsumer):
        def spill(self, size: int, trigger: object) -> int:
            return 0

    mm = UnifiedMemoryManager("1m")
    hog = Hog(task_memory_manager(mm), "hog")
    assert hog.acquire_memory(mm.max_memory) == mm.max_memory
    try:
        agg = HashAggregator("k", {"n": ("*", "count")}, memory_manager=mm)
        with agg, pytest.raises(MemoryLimitError, match=r"held by hog \(1024.0 KiB\)"):
            agg.update(pa.table({"k": [1, 2, 3]}))
    finally:
        hog.close_memory()


@pytest.mark.parametrize("memory", ["48m", "64m"])
def test_two_threads_set_rows_aside_and_merge_a_thread_local_table(tmp_path, memory):
    """With two threads a thread-local table of the first level (another task) spilled, the
    level began to set its rows aside, and those buffers (28 MiB of a 64 MiB run) were held
    while the thread-local table's merge needed read buffers its task could not make them
    give back: "cannot merge 3 sorted runs ... granted 0.0 B", exit 1, at 48-64 MiB only."""
    import pyarrow.parquet as pq

    import extagg

    rng = np.random.default_rng(7)
    n = 450_000
    table = pa.table({
        "f1": np.array(list("abcde"))[rng.integers(0, 5, n)],
        "f2": np.array(list("vwxyz"))[rng.integers(0, 5, n)],
        "f3": [f"u{i:07d}" for i in rng.integers(0, 300_000, n)],
    })  # fmt: skip
    pq.write_table(table, tmp_path / "cd.parquet", row_group_size=25_000)
    got = extagg.aggregate_files(
        str(tmp_path / "cd.parquet"), by=["f1", "f2"], aggs=["n=count(*)", "c=count_distinct(f3)"],
        memory=memory, threads=2, sort=True,
    ).read_all()  # fmt: skip
    want = table.group_by(["f1", "f2"]).aggregate([("f3", "count"), ("f3", "count_distinct")])
    want = want.sort_by([("f1", "ascending"), ("f2", "ascending")])
    assert got.column("n").to_pylist() == want.column("f3_count").to_pylist()
    assert got.column("c").to_pylist() == want.column("f3_count_distinct").to_pylist()

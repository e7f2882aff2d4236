"""The Python side: aggregate_files' reader, output, progress callbacks and run_metrics();
aggregate()'s metrics in schema metadata; the external sort of results."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import extagg
from extagg.columnar.sort import external_sort
from extagg.errors import QueryError
from extagg.memory import UnifiedMemoryManager, task_memory_manager
from extagg.metrics import RunMetrics, SpillMetrics
from tests.io.conftest import AGGS, as_dict, assert_same, reference, sample_table


@pytest.fixture
def parquet(tmp_path, table):
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=1_000)
    return path


def test_reader_metrics_are_live_then_final(parquet, table):
    seen: list[tuple[int, int, bool]] = []

    def progress(m: RunMetrics) -> None:
        seen.append((m.rows_read, m.groups, m.finished))

    reader = extagg.aggregate_files(str(parquet), by="k", aggs=AGGS, progress=progress)
    assert isinstance(reader, pa.RecordBatchReader)
    m = extagg.run_metrics(reader)
    assert m.rows_read == table.num_rows and not m.finished and m.rows_total == table.num_rows
    assert_same(as_dict(reader.read_all(), ["k"]), reference(table, ["k"]))
    assert m.finished and m.groups == 40 and m.rows_out == 40
    assert m.peak_granted_bytes > 0 and m.budget_bytes > 0 and m.wall_time_s > 0
    assert m.rss_fixed_bytes > 0 and m.peak_rss_bytes >= m.rss_import_bytes
    rows = [r for r, _, _ in seen]
    assert rows == sorted(rows) and rows[-1] == table.num_rows and seen[-1][2] is True
    assert "Read 5,000 rows" in m.summary() and "40 groups" in m.summary()


def test_summary_counts_read_as_english():
    """One of a thing is singular; no spill is said so, not "Spilled 0 time(s)"."""
    one = RunMetrics(rows_read=1, files=1, groups=1, rows_out=1).summary()
    assert "Read 1 row (" in one and "in 1 file)" in one and "into 1 group (1 row out)" in one
    assert "Nothing spilled." in one and "Spilled" not in one
    many = RunMetrics(rows_read=2_000, files=3, groups=0, rows_out=0, spill_count=1).summary()
    assert "Read 2,000 rows" in many and "in 3 files" in many and "into 0 groups (0 rows" in many
    assert "Spilled 1 time:" in many


def test_output_returns_metrics_and_respects_overwrite(tmp_path, parquet, table):
    out = tmp_path / "r.arrow"
    m = extagg.aggregate_files(str(parquet), by=["k", "s"], aggs=AGGS, output=str(out))
    assert isinstance(m, RunMetrics) and m.finished and extagg.run_metrics(m) is m
    with pa.ipc.open_file(out) as f:
        assert_same(as_dict(f.read_all(), ["k", "s"]), reference(table, ["k", "s"]))
    with pytest.raises(QueryError, match="overwrite"):
        extagg.aggregate_files(str(parquet), by="k", aggs=AGGS, output=str(out))
    extagg.aggregate_files(str(parquet), by="k", aggs=AGGS, output=str(out), overwrite=True)
    with pa.ipc.open_file(out) as f:
        assert f.read_all().num_rows == 40


def test_an_unknown_option_is_a_query_error(parquet):
    with pytest.raises(QueryError, match="unknown option 'thread'; did you mean 'threads'"):
        extagg.aggregate_files(str(parquet), by="k", aggs=AGGS, thread=2)


def test_global_aggregate_without_keys(parquet, table):
    reader = extagg.aggregate_files(str(parquet), aggs=AGGS, where="k < 0")
    assert reader.read_all().to_pylist() == [{"n": 0, "sv": None, "mq": None}]
    reader = extagg.aggregate_files(str(parquet), aggs=AGGS)
    [row] = reader.read_all().to_pylist()
    assert row["n"] == table.num_rows and row["mq"] == max(table.column("q").to_pylist())


def test_aggregate_table_carries_its_metrics(table):
    calls = []
    out = extagg.aggregate(table, "k", AGGS, memory="4m", progress=calls.append)
    m = extagg.run_metrics(out)
    assert isinstance(m, SpillMetrics)
    assert m.records_read == table.num_rows and m.groups == out.num_rows == 40
    assert calls and all(isinstance(c, SpillMetrics) for c in calls)
    assert out.schema.metadata and b"extagg.metrics" in out.schema.metadata
    with pytest.raises(ValueError, match="no extagg metrics"):
        extagg.run_metrics(pa.table({"a": [1]}))


def _sort_reference(t: pa.Table, keys: list[str]) -> list[tuple]:
    rows = list(zip(*(t.column(k).to_pylist() for k in keys)))
    return sorted(rows, key=lambda r: tuple((v is None, v) for v in r))


@given(
    st.lists(
        st.tuples(st.one_of(st.none(), st.integers(-5, 5)), st.text("abc", max_size=3)),
        min_size=0, max_size=300, unique=True,
    ),
    st.integers(1, 40),
)  # fmt: skip
def test_external_sort_matches_sorted(rows, batch_rows):
    """Unique keys (as result groups are), a budget of a few batches: many runs, k-way merge."""
    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("x", pa.int64())])
    t = pa.table({"a": [r[0] for r in rows], "b": [r[1] for r in rows],
                  "x": list(range(len(rows)))}, schema=schema)  # fmt: skip
    tmm = task_memory_manager(UnifiedMemoryManager(max_memory=3_000))
    m = RunMetrics()
    out = pa.Table.from_batches(
        list(
            external_sort(
                iter(t.to_batches(max_chunksize=batch_rows)), schema, ["a", "b"], tmm, None, m
            )
        ),
        schema=schema,
    )
    assert _sort_reference(out, ["a", "b"]) == list(zip(out["a"].to_pylist(), out["b"].to_pylist()))
    assert sorted(out["x"].to_pylist()) == list(range(len(rows)))  # every row once
    if len(rows) > 3 * batch_rows and len(rows) > 60:
        assert m.sort_runs > 1
    assert tmm.memory_used == 0


def test_sorted_results_of_many_files(tmp_path):
    parts = [sample_table(2_000, seed=i) for i in range(3)]
    for i, t in enumerate(parts):
        pq.write_table(t, tmp_path / f"p{i}.parquet")
    reader = extagg.aggregate_files(str(tmp_path), by=["s", "k"], aggs=AGGS, sort=True, memory="2m")
    out = reader.read_all()
    keys = list(zip(out["s"].to_pylist(), out["k"].to_pylist()))
    assert keys == sorted(keys)
    assert_same(as_dict(out, ["k", "s"]), reference(pa.concat_tables(parts), ["k", "s"]))


def test_scan_batches_take_a_quarter_of_the_budget_while_the_table_is_small(tmp_path):
    """Few groups: the scan's batches grow to 1/4 of the budget (fewer, larger batches); a
    table that grows past 1/4 (a unique key that spills) brings them back to 1/8."""
    import numpy as np

    from extagg.io.run import plan_query

    n = 600_000
    rng = np.random.default_rng(11)
    table = pa.table(
        {
            "k": rng.integers(0, 4, n),
            "u": rng.permutation(n).astype(np.int64),
            "v": rng.random(n),
        }
    )
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=50_000)
    sizes = {}
    for key in ("k", "u"):
        query = plan_query(path, by=key, aggs={"s": ("v", "sum")}, memory="8m")
        try:
            groups = sum(b.num_rows for b in query.run())
        finally:
            query.close()
        m = query.metrics
        assert groups == (4 if key == "k" else n)
        assert m.peak_granted_bytes <= m.budget_bytes
        sizes[key] = query.scan.batch_rows
        assert (m.spill_count > 0) == (key == "u")
    # two 8-byte columns (and the batch's overheads), a batch read ahead: ~30 K rows in 1/8
    # of 8 MiB, twice that in 1/4
    assert sizes["k"] == 2 * sizes["u"] and 20_000 < sizes["u"] < 40_000


def test_external_sort_merges_many_runs_within_its_grant(tmp_path):
    """Hundreds of runs: the merge loaded a batch of every run at once, outside the budget
    (628 MB of RSS for 643 runs at 8 MiB; the run's summary missed it). Now at most
    ``MAX_FAN_IN`` runs are merged at a time, within the memory granted, in passes."""
    import numpy as np

    from extagg.columnar import sort

    n = 300_000
    keys = np.random.default_rng(8).permutation(n)
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    result = pa.table({"k": keys, "v": keys * 3}, schema=schema)
    budget = 128 << 10
    tmm = task_memory_manager(UnifiedMemoryManager(max_memory=budget))
    m = RunMetrics()
    batches = sort.external_sort(
        iter(result.to_batches(max_chunksize=2_000)), schema, ["k"], tmm, str(tmp_path), m
    )
    base = pa.total_allocated_bytes()
    peak, got = 0, []
    for batch in batches:
        got.append(batch.column("k").to_numpy().copy())  # not a view of Arrow's buffer
        peak = max(peak, pa.total_allocated_bytes() - base)
    assert m.sort_runs > sort.MAX_FAN_IN  # more than one pass
    assert np.array_equal(np.concatenate(got), np.arange(n))
    # a merge of 32 runs holds 3 copies of a 1024-row batch of each (16 KiB), and its output
    assert peak < 2 << 20, peak
    assert tmm.memory_used == 0 and not list(tmp_path.rglob("*.run"))


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_sort_run_is_an_error_naming_it(tmp_path, damage):
    """Sort runs are checked when read back (length and CRC-32 of every batch): a flipped
    byte gave wrong rows with no error, a truncated run an error naming no file."""
    import numpy as np

    from extagg.columnar import sort
    from extagg.errors import CorruptFileError

    n = 50_000
    keys = np.random.default_rng(3).permutation(n)
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    result = pa.table({"k": keys, "v": keys * 3}, schema=schema)
    tmm = task_memory_manager(UnifiedMemoryManager(max_memory=256 << 10))
    m = RunMetrics()
    batches = sort.external_sort(
        iter(result.to_batches(max_chunksize=2_000)), schema, ["k"], tmm, str(tmp_path), m
    )
    first = next(batches)
    assert first.column("k").to_pylist()[:3] == [0, 1, 2]
    runs = sorted(tmp_path.rglob("sort-*.run"))
    assert len(runs) > 1
    victim = runs[-1]
    size = victim.stat().st_size
    with open(victim, "r+b") as handle:
        if damage == "flip":
            handle.seek(size - 100)
            byte = handle.read(1)
            handle.seek(size - 100)
            handle.write(bytes([byte[0] ^ 0x5A]))
        else:
            handle.truncate(size - 100)
    with pytest.raises(CorruptFileError) as info:
        for _ in batches:
            pass
    assert info.value.path == str(victim)
    assert ("checksum" if damage == "flip" else "truncated") in info.value.reason
    assert tmm.memory_used == 0 and not list(tmp_path.rglob("*.run"))


@pytest.mark.parametrize("sort", [False, True])
def test_a_reader_dropped_half_read_frees_its_files_and_grant_at_once(tmp_path, sort):
    """The run's generators held the query, which held them: a reader dropped after one batch
    kept its spill files and grant until the cyclic GC ran (then a ReferenceError traceback
    printed from a finalizer). Now dropping it frees them, the GC off."""
    import gc

    import numpy as np

    rng = np.random.default_rng(0)
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"k": rng.integers(0, 200_000, 400_000)}), src, row_group_size=50_000)
    spill = tmp_path / "spill"
    mm = UnifiedMemoryManager("2m")
    gc.disable()
    try:
        reader = extagg.aggregate_files(
            str(src), by=["k"], aggs={"n": ("*", "count")}, memory_manager=mm,
            spill_dirs=[str(spill)], sort=sort,
        )  # fmt: skip
        assert reader.read_next_batch().num_rows > 0
        assert [p for p in spill.rglob("*") if p.is_file()]
        del reader
        assert not [p for p in spill.rglob("*") if p.is_file()]
        assert mm.execution_memory_used == 0
    finally:
        gc.enable()


def test_a_missing_output_directory_is_refused_before_the_input_is_read(tmp_path, monkeypatch):
    """``output=`` in a folder that does not exist: the whole input was read and spilled
    first, then ``OutputError``; it is checked before the scan now."""
    import extagg.io.run as run_module

    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": list(range(1000)), "v": [1.0] * 1000}), src)
    monkeypatch.setattr(run_module, "plan_query", None)  # never reached
    missing = tmp_path / "nowhere" / "out.parquet"
    with pytest.raises(extagg.OutputError, match=r"its directory .* does not exist"):
        extagg.aggregate_files(src, by="k", aggs={"s": ("v", "sum")}, output=missing)
    assert not missing.parent.exists()


def test_an_output_that_fails_after_the_run_leaves_no_spill_file(tmp_path):
    """A write that fails once the result is ready (no file can be made in ``/proc``): the
    run's spill files and grant were left until the exception object was collected (in a
    REPL's ``sys.last_exc``: for good). They are gone when the exception is raised."""
    n = 40_000
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": list(range(n)), "v": [1.0] * n}), src, row_group_size=4_000)
    spill = tmp_path / "spill"
    with pytest.raises(extagg.OutputError, match="no file can be made in /proc"):
        try:
            extagg.aggregate_files(
                src,
                by="k",
                aggs={"s": ("v", "sum")},
                memory="1m",
                spill_dirs=[str(spill)],
                output="/proc/extagg-out.csv",
            )
        except extagg.OutputError:
            assert spill.exists() and not [p for p in spill.rglob("*") if p.is_file()]
            raise


def test_schema_may_be_given_as_text(tmp_path):
    """``schema="id:int64,name:string"`` (as ``--schema`` takes it) raised a bare
    ``AttributeError``; another object is refused by name."""
    src = tmp_path / "nh.csv"
    src.write_text("1,a\n2,b\n1,c\n")
    got = extagg.aggregate_files(str(src), schema="id:int64,name:string", header=False, by="id",
                                 aggs=["n=count(*)", "u=max(name)"], sort=True)  # fmt: skip
    assert got.read_all().to_pylist() == [{"id": 1, "n": 2, "u": "c"}, {"id": 2, "n": 1, "u": "b"}]
    with pytest.raises(QueryError, match=r"schema must be a pyarrow\.Schema"):
        extagg.aggregate_files(str(src), schema=["id"], header=False, by="id")


def test_a_reader_dropped_unread_releases_the_run_quietly(tmp_path, caplog):
    """The docs say to drop a reader that will not be read; one dropped before its first
    batch left the aggregator to its finaliser, which warned on stderr that it "was dropped
    without close()". Its grant and files go now, without a word."""
    import gc

    from extagg.memory import UnifiedMemoryManager

    src = tmp_path / "t.csv"
    src.write_text("k,v\n" + "".join(f"{i % 50},{i}\n" for i in range(5_000)))
    manager = UnifiedMemoryManager(max_memory=64 << 20)
    reader = extagg.aggregate_files(str(src), by="k", aggs=["s=sum(v)"], memory_manager=manager)
    assert manager.execution_memory_used > 0
    del reader
    gc.collect()
    assert manager.execution_memory_used == 0
    assert "dropped without close" not in caplog.text

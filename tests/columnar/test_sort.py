"""The external sort's merge of runs led by a 64-bit integer key (cut by binary search)
against Arrow's in-memory sort: every row once, in order, within a tiny budget."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg.columnar import sort
from extagg.memory import UnifiedMemoryManager, task_memory_manager
from extagg.metrics import RunMetrics

KEYS = [("lead", "ascending"), ("v", "ascending"), ("s", "ascending")]


def _sorted_externally(table: pa.Table, keys, budget: int, tmp_path, by_lead: bool = True):
    if not by_lead:
        original = sort._leads_by_integers
        sort._leads_by_integers = lambda schema, keys: False
    try:
        tmm = task_memory_manager(UnifiedMemoryManager(max_memory=budget))
        metrics = RunMetrics()
        batches = sort.external_sort(
            iter(table.to_batches(max_chunksize=700)), table.schema, keys, tmm, str(tmp_path),
            metrics,
        )  # fmt: skip
        out = pa.Table.from_batches(list(batches), schema=table.schema)
    finally:
        if not by_lead:
            sort._leads_by_integers = original
    assert tmm.memory_used == 0 and not list(tmp_path.rglob("*.run"))
    return out, metrics


def _rows(table: pa.Table) -> list[tuple]:
    return [tuple(r.values()) for r in table.to_pylist()]


def _key(row: tuple) -> tuple:  # nulls last, as the sort puts them
    return tuple((v is None, v if v is not None else 0) for v in row)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(0, 12_000),
    leads=st.sampled_from([1, 3, 50, 10**6]),
    nulls=st.booleans(),
    unsigned=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_runs_led_by_an_integer_merge_in_order(n, leads, nulls, unsigned, seed, tmp_path_factory):
    rng = np.random.default_rng(seed)
    lead = rng.integers(0, leads, n)
    lead_type = pa.uint64() if unsigned else pa.int64()
    if not unsigned:
        lead = lead - leads // 2
    table = pa.table({
        "lead": pa.array(lead, lead_type, mask=(rng.random(n) < 0.05) if nulls else None),
        "v": pa.array(rng.normal(0, 1, n), mask=rng.random(n) < 0.02),
        "s": pa.array([f"w{i}" for i in rng.integers(0, 5, n)]),
    })  # fmt: skip
    out, metrics = _sorted_externally(table, KEYS, 32 << 10, tmp_path_factory.mktemp("runs"))
    rows = _rows(out)
    assert sorted(rows, key=_key) == rows
    assert sorted(rows, key=_key) == sorted(_rows(table), key=_key)
    if n > 5_000:
        assert metrics.sort_runs > 1


@pytest.mark.parametrize("leads", [1, 4, 100_000])
def test_one_lead_over_many_batches_and_many_leads_merge_alike(tmp_path, leads) -> None:
    # one lead value over every run (a global quantile's hash) goes round by every key; many
    # distinct leads are cut by binary search: both give what the plain merge gives
    rng = np.random.default_rng(leads)
    n = 60_000
    table = pa.table({
        "lead": pa.array(rng.integers(0, leads, n), pa.uint64()),
        "v": rng.normal(0, 1, n), "s": pa.array([f"w{i}" for i in rng.integers(0, 9, n)]),
    })  # fmt: skip
    cut, metrics = _sorted_externally(table, KEYS, 24 << 10, tmp_path / "a")
    plain, _ = _sorted_externally(table, KEYS, 24 << 10, tmp_path / "b", by_lead=False)
    assert metrics.sort_runs > sort.MAX_FAN_IN  # a pass of merges before the last
    assert _rows(cut) == _rows(plain)


@pytest.mark.parametrize("values", ["ascending", "descending", "random"])
def test_a_round_by_every_key_holds_about_a_batch_per_run(tmp_path, values) -> None:
    # one lead value (a global quantile's hash) and runs of disjoint value ranges: every
    # round goes by every key, with one run owning the smallest rows round after round; the
    # others' rows wait in their runs' loaded rows (not in a pile that grows each round)
    n = 200_000
    v = {"ascending": np.arange(n), "descending": np.arange(n)[::-1],
         "random": np.random.default_rng(3).permutation(n)}[values]  # fmt: skip
    table = pa.table({"lead": pa.array(np.full(n, 7), pa.int64()), "v": v.astype(np.float64),
                      "s": pa.array(["w"] * n)})  # fmt: skip
    tmm = task_memory_manager(UnifiedMemoryManager(max_memory=128 << 10))
    metrics = RunMetrics()
    batches = sort.external_sort(
        iter(table.to_batches(max_chunksize=2_000)), table.schema, KEYS, tmm, str(tmp_path),
        metrics,
    )  # fmt: skip
    base = pa.total_allocated_bytes()
    peak, got = 0, []
    for batch in batches:
        got.append(batch.column("v").to_numpy().copy())
        peak = max(peak, pa.total_allocated_bytes() - base)
    assert metrics.sort_runs > sort.MAX_FAN_IN
    assert np.array_equal(np.concatenate(got), np.arange(n, dtype=np.float64))
    assert peak < 2 << 20, peak
    assert tmm.memory_used == 0 and not list(tmp_path.rglob("*.run"))


def test_a_capped_merge_holds_its_cap_while_read(tmp_path) -> None:
    """A sort read beside others (a quantile's, joined with count_distinct's results) has a
    cap on its merge: its runs are written in batches two of which fit it, and a buffer
    larger than the cap that never spilled is written as a run rather than held whole while
    it is read. Every row once, in order."""
    rng = np.random.default_rng(4)
    n = 40_000
    table = pa.table({"lead": rng.integers(0, 1000, n), "v": rng.random(n),
                      "s": pa.array([f"s{x}" for x in rng.integers(0, 500, n)])})  # fmt: skip
    want = table.sort_by(KEYS)
    cap = 96 << 10
    for budget, buffer in ((8 << 20, None), (2 << 20, 256 << 10)):
        tmm = task_memory_manager(UnifiedMemoryManager(max_memory=budget))
        ext = sort.ExternalSort(table.schema, KEYS, tmm, str(tmp_path), max_buffer_bytes=buffer)
        ext.max_merge_bytes = cap
        for batch in table.to_batches(max_chunksize=2_000):
            ext.add(batch)
        held, out = [], []
        for batch in ext.sorted():
            held.append(ext.buffer.used)
            out.append(batch)
        assert ext.runs == 0 and tmm.memory_used == 0  # all read: closed, files removed
        assert max(held) <= cap, (budget, max(held))
        assert pa.Table.from_batches(out).equals(want)
        assert not list(tmp_path.rglob("*.run"))

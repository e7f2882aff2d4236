"""Budgets are checked when an engine is built: below the engines' working minimum is rejected,
above what the machine (and its cgroup) can give is clamped with a warning, a negative size
string says so. The minimum itself is shown to work: both engines spill and merge with it."""

from __future__ import annotations

import logging
import operator
from collections import Counter
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pytest

from extagg import Aggregator, BudgetError, ExternalAppendOnlyMap, HashAggregator
from extagg._config import parse_size
from extagg.memory import (
    ENGINE_MIN_BUDGET,
    UnifiedMemoryManager,
    cap_to_machine,
    machine_memory_limit,
)

from .test_sizing import fake_v1, fake_v2

GiB = 2**30
SUM = Aggregator(lambda v: v, operator.add, operator.add)


def _columnar(memory: int | str, keys: np.ndarray, spill_dir: Path) -> dict:
    table = pa.table({"k": keys, "v": np.ones(len(keys))})
    with HashAggregator("k", {"n": ("v", "sum")}, memory=memory, spill_dirs=[str(spill_dir)]) as a:
        for batch in table.to_batches(max_chunksize=20_000):
            a.update(batch)
        out = pa.Table.from_batches(list(a.results()))
        assert a.metrics.spill_count > 0, "the minimum budget should make it spill"
    return dict(zip(out["k"].to_pylist(), out["n"].to_pylist()))


@pytest.mark.parametrize("strings", [False, True], ids=["int-keys", "string-keys"])
def test_columnar_engine_spills_and_merges_at_the_minimum(tmp_path: Path, strings: bool) -> None:
    rng = np.random.default_rng(1)
    ints = rng.integers(0, 50_000, 150_000)
    keys = np.array([f"key-{x}" for x in ints], dtype=object) if strings else ints
    got = _columnar(ENGINE_MIN_BUDGET, keys, tmp_path)
    assert got == {k: float(c) for k, c in Counter(keys.tolist()).items()}


def test_generic_engine_spills_and_merges_at_the_minimum(tmp_path: Path) -> None:
    records = [(i % 50_000, 1) for i in range(150_000)]
    with ExternalAppendOnlyMap(SUM, memory=ENGINE_MIN_BUDGET, spill_dirs=[str(tmp_path)]) as emap:
        emap.insert_all(records)
        got = dict(emap.iterator())
        assert emap.metrics.spill_count > 0
    assert got == {k: 3 for k in range(50_000)}


@pytest.mark.parametrize("budget", [1, 1024, "1k", "512k", ENGINE_MIN_BUDGET - 1])
@pytest.mark.parametrize("engine", ["columnar", "generic"])
def test_budgets_below_the_minimum_fail_at_construction(budget: int | str, engine: str) -> None:
    with pytest.raises(BudgetError) as info:
        if engine == "columnar":
            HashAggregator("k", {"n": ("v", "sum")}, memory=budget)
        else:
            ExternalAppendOnlyMap(SUM, memory=budget)
    assert isinstance(info.value, ValueError)
    assert info.value.budget == parse_size(budget)
    assert info.value.minimum == ENGINE_MIN_BUDGET
    assert f"({parse_size(budget)} bytes)" in str(info.value)
    assert f"({ENGINE_MIN_BUDGET} bytes)" in str(info.value)


def test_zero_budget_is_rejected_naming_it() -> None:
    with pytest.raises(ValueError, match="memory '0'"):
        ExternalAppendOnlyMap(SUM, memory="0")


def test_a_shared_manager_below_the_minimum_is_rejected_too() -> None:
    mm = UnifiedMemoryManager("64k")  # a manager alone may be tiny (accounting tests use 1000)
    with pytest.raises(BudgetError, match=r"max_memory of 64\.0 KiB"):
        ExternalAppendOnlyMap(SUM, memory_manager=mm)
    with pytest.raises(BudgetError, match=r"max_memory of 64\.0 KiB"):
        HashAggregator("k", {"n": ("v", "sum")}, memory_manager=mm)


@pytest.mark.parametrize("text", ["-5m", "-1", " -0.5g", "-5 MiB"])
def test_negative_size_strings_say_negative(text: str) -> None:
    with pytest.raises(ValueError, match=r"negative size") as info:
        parse_size(text, name="memory")
    assert repr(text) in str(info.value)
    with pytest.raises(ValueError, match=r"negative size"):
        ExternalAppendOnlyMap(SUM, memory=text)


def test_negative_int_says_negative() -> None:
    with pytest.raises(ValueError, match=r"negative size"):
        parse_size(-5)


@pytest.mark.parametrize("budget", ["64t", 2**70])
def test_budgets_above_the_machine_are_clamped_with_a_warning(
    budget: int | str, caplog: pytest.LogCaptureFixture
) -> None:
    limit = machine_memory_limit()
    assert limit <= psutil.virtual_memory().total
    with caplog.at_level(logging.WARNING, logger="extagg"):
        mm = UnifiedMemoryManager(budget)
        emap = ExternalAppendOnlyMap(SUM, memory=budget)
    assert mm.max_memory == limit
    assert emap.task_memory_manager.memory_manager.max_memory == limit
    emap.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert f"({parse_size(budget)} bytes)" in warnings[0]
    assert f"({limit} bytes)" in warnings[0]


def test_a_budget_the_machine_can_give_is_kept(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="extagg"):
        assert UnifiedMemoryManager("64m").max_memory == 64 * 2**20
    assert not caplog.records


def test_the_cgroup_limit_lowers_the_ceiling(tmp_path: Path) -> None:
    root = tmp_path / "v2"
    proc = fake_v2(
        root, "/a/b", {"/": ("max", 0, 0), "/a": (str(GiB), 0, 0), "/a/b": ("max", 0, 0)}
    )
    assert machine_memory_limit(root, proc) == min(GiB, psutil.virtual_memory().total)
    assert cap_to_machine(2 * GiB, cgroup_root=root, proc_cgroup=proc) == machine_memory_limit(
        root, proc
    )
    root1 = tmp_path / "v1"
    proc1 = fake_v1(root1, "/job", {"/": (9223372036854771712, 0, 0), "/job": (GiB // 2, 0, 0)})
    assert machine_memory_limit(root1, proc1) == GiB // 2

"""The workloads the fault suites run, their references, and the invariant checker.

Each workload is small enough that failing every one of its I/O operations in turn is cheap,
but runs every path: several spills, merge passes (``fan_in=2``), run batches, state commits
through both write paths, snapshots, cleanup and the checkpoint's commit log. ``scale``
(``EXTAGG_FAULT_SCALE``) makes them larger. They are also the children the kill loops SIGKILL.
"""

from __future__ import annotations

import operator
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from extagg import Aggregator, ExternalAppendOnlyMap, HashAggregator
from extagg.errors import ExtaggError
from extagg.hashing import stable_hash
from extagg.memory import UnifiedMemoryManager
from extagg.state import Checkpoint, StateStoreConf

SUM = Aggregator(lambda v: v, operator.add, operator.add)
STATE_CONF = StateStoreConf(
    min_deltas_for_snapshot=2, min_versions_to_retain=3, max_versions_in_memory=2
)
STATE_KEYS = 40


#: read at import: the suite's autouse fixture clears EXTAGG_* variables before each test
SCALE = int(os.environ.get("EXTAGG_FAULT_SCALE", "1"))


def scale() -> int:
    return SCALE


# ------------------------------------------------------------------------------ engines
def generic_records(n: int) -> list[tuple[int, int]]:
    return [((i * 7919) % (n // 10), i % 7) for i in range(n)]


def generic_reference(n: int) -> dict[int, int]:
    out: Counter[int] = Counter()
    for key, value in generic_records(n):
        out[key] += value
    return dict(out)


def run_generic(spill_dir: str, mm: UnifiedMemoryManager, n: int) -> dict[int, int]:
    """Spill every 400 records, merge two runs at a time (intermediate merge runs)."""
    with ExternalAppendOnlyMap(
        SUM, memory_manager=mm, spill_dirs=[spill_dir], force_spill_every=400, fan_in=2,
        batch_size=64,
    ) as emap:  # fmt: skip
        emap.insert_all(generic_records(n))
        return dict(emap.iterator())


def columnar_table(n: int) -> pa.Table:
    keys = (np.arange(n, dtype=np.int64) * 7919) % (n // 8)
    return pa.table({"k": keys, "v": np.arange(n, dtype=np.int64) % 11})


def columnar_reference(n: int) -> dict[int, tuple[int, int]]:
    table = columnar_table(n).to_pydict()
    sums: Counter[int] = Counter()
    counts: Counter[int] = Counter()
    for key, value in zip(table["k"], table["v"]):
        sums[key] += value
        counts[key] += 1
    return {key: (sums[key], counts[key]) for key in sums}


def run_columnar(spill_dir: str, mm: UnifiedMemoryManager, n: int) -> dict[int, tuple[int, int]]:
    """Spill every 500 rows, merge two runs at a time."""
    with HashAggregator(
        "k", {"s": ("v", "sum"), "n": ("v", "count")}, memory_manager=mm,
        spill_dirs=[spill_dir], force_spill_rows=500, fan_in=2, batch_size=64,
    ) as agg:  # fmt: skip
        for batch in columnar_table(n).to_batches(max_chunksize=250):
            agg.update(batch)
        out = pa.Table.from_batches(list(agg.results())).to_pydict()
    return {k: (s, c) for k, s, c in zip(out["k"], out["s"], out["n"])}


# ------------------------------------------------------------------------------ state
def batch_changes(batch: int) -> tuple[dict[int, int], list[int]]:
    """Batch ``batch``'s puts (or, odd batches, increments merged with ``+``) and removes."""
    puts = {(batch * 7 + j * 3) % STATE_KEYS: batch + 1 for j in range(12)}
    removes = [] if batch % 2 else [(batch * 5 + j) % STATE_KEYS for j in range(3)]
    return puts, [key for key in removes if key not in puts]


def model(version: int) -> dict[int, int]:
    """The state at ``version`` (after batches ``0 .. version - 1``)."""
    state: dict[int, int] = {}
    for batch in range(version):
        puts, removes = batch_changes(batch)
        for key, value in puts.items():
            state[key] = state.get(key, 0) + value if batch % 2 else value
        for key in removes:
            state.pop(key, None)
    return state


def run_state(
    root: str, mm: UnifiedMemoryManager, batches: int, report: Any = None
) -> tuple[int, int | None]:
    """Run state batches from the checkpoint's last committed one up to ``batches``: even ones
    through ``get_store``/``commit``, odd ones through ``merge_update``; each followed by the
    checkpoint's commit and maintenance. Returns (the last version whose store commit returned,
    the last batch whose checkpoint commit returned)."""
    checkpoint = Checkpoint(root)
    op = checkpoint.operator(0, name="faults", num_partitions=1)
    last = checkpoint.last_committed_batch()
    committed_version, committed_batch = (0, None) if last is None else (last + 1, last)
    provider = op.provider(0, conf=STATE_CONF, memory_manager=mm)
    try:
        for batch in range((last + 1) if last is not None else 0, batches):
            puts, removes = batch_changes(batch)
            if batch % 2:
                pairs = sorted(puts.items(), key=lambda item: stable_hash(item[0]))
                committed_version = provider.merge_update(batch, pairs, operator.add)
            else:
                store = provider.get_store(batch)
                for key, value in puts.items():
                    store.put(key, value)
                for key in removes:
                    store.remove(key)
                committed_version = store.commit()
            checkpoint.commit(batch)
            committed_batch = batch
            if report is not None:
                report(batch)
            provider.do_maintenance()
    finally:
        provider.close()
    return committed_version, committed_batch


# ------------------------------------------------------------------------------ invariants
def leftovers(directory: str | Path) -> list[str]:
    """Every file and folder below ``directory``."""
    found = []
    for root, dirs, files in os.walk(directory):
        found += [os.path.join(root, name) for name in dirs + files]
    return sorted(found)


def temp_files(directory: str | Path) -> list[str]:
    return [path for path in leftovers(directory) if path.endswith(".tmp")]


def check_engine_outcome(
    outcome: Any, reference: Any, spill_dir: str, mm: UnifiedMemoryManager
) -> None:
    """Results equal the reference or the error is a precise ExtaggError; nothing is left in
    the spill directory; every grant is back."""
    if isinstance(outcome, BaseException):
        assert isinstance(outcome, ExtaggError), f"not an ExtaggError: {outcome!r}"
        assert spill_dir in str(outcome), f"the error does not name the spill directory: {outcome}"
    else:
        assert outcome == reference, "wrong result"
    assert leftovers(spill_dir) == [], f"left behind: {leftovers(spill_dir)}"
    assert mm.execution_memory_used == 0, f"{mm.execution_memory_used} bytes still granted"


def check_state(root: str, expect_version: int | None, expect_batch: int | None) -> int:
    """Reopening removes every temp file; the last committed batch's version, and the newest
    version, read back equal to the model. Returns the newest version."""
    from extagg.state import StateStoreProvider

    checkpoint = Checkpoint(root)
    last_batch = checkpoint.last_committed_batch()
    if expect_batch is not None or last_batch is not None:
        assert last_batch == expect_batch, f"commit log says {last_batch}, not {expect_batch}"
    directory = os.path.join(root, "state", "0", "0")
    mm = UnifiedMemoryManager("64m", wait_timeout=5)
    provider = StateStoreProvider(directory, conf=STATE_CONF, memory_manager=mm)
    try:
        assert temp_files(root) == [], f"temp files left: {temp_files(root)}"
        latest = provider.latest_version()
        if expect_version is not None:
            assert latest == expect_version, f"latest version {latest}, not {expect_version}"
        versions = {latest} | ({last_batch + 1} if last_batch is not None else set())
        for version in versions:
            got = dict(provider.get_read_store(version).items())
            assert got == model(version), f"version {version} reads back wrong"
    finally:
        provider.close()
    assert mm.storage_memory_used == 0
    return latest


if __name__ == "__main__":  # the children of the kill loops
    kind, target, SCALE = sys.argv[1], sys.argv[2], int(sys.argv[3])
    budget = UnifiedMemoryManager("64m", wait_timeout=5)
    if kind == "state":
        print("ready", flush=True)
        run_state(target, budget, 10**9, lambda b: print("batch", b, flush=True))
    run = run_generic if kind == "generic" else run_columnar
    size = (3000 if kind == "generic" else 4000) * scale()
    run(target, budget, size)  # warm (imports, kernels): the kills land in steady spilling
    print("ready", flush=True)
    while True:
        run(target, budget, size)

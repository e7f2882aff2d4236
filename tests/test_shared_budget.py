"""Several ExternalAppendOnlyMaps in threads share one budget (issue: unified memory manager)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from extagg import Aggregator, ExternalAppendOnlyMap
from extagg.memory import UnifiedMemoryManager

from .conftest import files_under

#: a sum as PySpark jobs write it, used with ``typed_path=False``: the general path
SUM = Aggregator(lambda v: v, lambda c, v: c + v, lambda a, b: a + b)
MiB = 2**20
#: the stated fixed overhead on top of budget x 1.25: allocator slack, merge and I/O buffers
FIXED_OVERHEAD = 48 * MiB


def fold_in_thread(mm, spill_dir, seed, n, keys, results, metrics, errors):
    try:
        emap = ExternalAppendOnlyMap(
            SUM, typed_path=False, memory_manager=mm, spill_dirs=[spill_dir]
        )
        emap.insert_all((((i * 7919 + seed) % keys), 1) for i in range(n))
        results[seed] = dict(emap.iterator())
        metrics[seed] = emap.metrics
        emap.close()
    except BaseException as exc:  # pragma: no cover - reported by the test
        errors.append(exc)


@pytest.mark.slow
@pytest.mark.parametrize("threads", [2, 4])
def test_maps_in_threads_share_one_budget(spill_dir, threads):
    budget = 64 * MiB
    mm = UnifiedMemoryManager(max_memory=budget)
    results, metrics, errors = {}, {}, []
    high_water = [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            high_water[0] = max(high_water[0], mm.execution_memory_used + mm.storage_memory_used)
            mm.check_invariants()
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    keys = 1_000_000 // threads * 2
    n = keys * 2
    workers = [
        threading.Thread(
            target=fold_in_thread, args=(mm, spill_dir, s, n, keys, results, metrics, errors)
        )
        for s in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
    done.set()
    watcher.join()
    assert not errors, errors
    assert all(not w.is_alive() for w in workers), "a map never finished"
    for seed in range(threads):
        want = {}
        for i in range(n):
            k = (i * 7919 + seed) % keys
            want[k] = want.get(k, 0) + 1
        assert results[seed] == want
        assert metrics[seed].spill_count > 0, f"map {seed} never spilled"
        assert metrics[seed].peak_granted_bytes <= budget
    assert high_water[0] <= budget
    assert mm.execution_memory_used == 0
    assert files_under(spill_dir) == []


PEAK_RSS_SCRIPT = textwrap.dedent(
    """
    import json, sys, threading
    from extagg import Aggregator, ExternalAppendOnlyMap
    from extagg._sysinfo import current_rss, peak_rss
    from extagg.memory import UnifiedMemoryManager

    budget = int(sys.argv[1])
    agg = Aggregator(lambda v: v, lambda c, v: c + v, lambda a, b: a + b)
    # warm up: load the compiled kernels so their fixed cost is not counted as data
    warm = ExternalAppendOnlyMap(agg, memory="8m", force_spill_every=10)
    warm.insert_all((i, 1) for i in range(100))
    list(warm.iterator())
    from extagg._numba import ensure_target
    ensure_target()  # numba's registries, filled by a kernel compiled mid-run (cold cache)
    base = current_rss()
    mm = UnifiedMemoryManager(max_memory=budget)
    out = {}
    def run(seed):
        m = ExternalAppendOnlyMap(agg, memory_manager=mm)
        m.insert_all((((i * 7919 + seed) % 400_000), 1.0) for i in range(1_500_000))
        out[seed] = (sum(v for _, v in m.iterator()), m.metrics.spill_count)
    threads = [threading.Thread(target=run, args=(s,)) for s in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(json.dumps({"base": base, "peak": peak_rss(), "out": out}))
    """
)


@pytest.mark.slow
def test_peak_rss_of_two_maps_stays_within_budget(tmp_path):
    budget = 64 * MiB
    env = dict(os.environ, EXTAGG_SPILL_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_RSS_SCRIPT, str(budget)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(proc.stdout)
    for total, spills in report["out"].values():
        assert total == 1_500_000
        assert spills > 0
    growth = report["peak"] - report["base"]
    # the contract: budget x 1.25 + a fixed overhead (allocator slack, merge buffers, I/O)
    assert growth <= budget * 1.25 + FIXED_OVERHEAD, f"peak RSS grew {growth / MiB:.0f} MiB"

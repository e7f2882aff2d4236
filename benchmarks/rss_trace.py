"""RSS over time of one spilling aggregation, sampled every 10 ms, with its spills and merge.

A sampler thread reads this process's RSS (``/proc/self/status``) and the memory the engine holds
from the manager every ``--interval`` seconds while the generic engine
(``ExternalAppendOnlyMap``, a sum over int keys) inserts records under a small budget and then
iterates the merged result. Spill events and intermediate merge passes are taken from the
``extagg`` logger's INFO lines (one per event), with their time. The result is
``results/rss-trace.json`` (``--quick``: ``rss-trace-quick.json``), drawn by ``plots.py``.

    .venv/bin/python benchmarks/rss_trace.py            # 3 M records, 1 M keys, 48 MiB: ~10 s
    .venv/bin/python benchmarks/rss_trace.py --quick    # 200 k records: ~2 s
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import operator
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import MIB, RESULTS_DIR, current_rss, machine_info

from extagg import Aggregator, ExternalAppendOnlyMap
from extagg.memory import UnifiedMemoryManager, resolve_memory_budget


class _EventLog(logging.Handler):
    """Keeps the time and text of every INFO line of the ``extagg`` logger."""

    def __init__(self, start: float) -> None:
        super().__init__(logging.INFO)
        self.start = start
        self.events: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        kind = "spill" if "spilling" in message else "merge pass" if "merge" in message else "log"
        self.events.append(
            {"t": time.perf_counter() - self.start, "kind": kind, "message": message}
        )


def records(n: int, keys: int, seed: int = 7) -> Iterator[tuple[int, float]]:
    """``n`` records over ``keys`` distinct int keys in a scattered order, made chunk by chunk."""
    rng = np.random.default_rng(seed)
    for start in range(0, n, 65_536):
        size = min(65_536, n - start)
        ks = (np.arange(start, start + size) * 2_654_435_761) % keys
        yield from zip(ks.tolist(), rng.random(size).tolist())


def trace(n: int, keys: int, budget: int, interval: float) -> dict[str, Any]:
    mm = UnifiedMemoryManager(budget)
    # prime: imports, numba cache loads, lazy initialisation (not part of the trace)
    with ExternalAppendOnlyMap(Aggregator.reducing(operator.add), memory="64m") as warm:
        warm.insert_all(records(20_000, 2_000))
        for _ in warm.iterator():
            pass
    gc.collect()
    baseline = current_rss()
    start = time.perf_counter()
    samples: list[tuple[float, int, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.perf_counter() - start, current_rss(), mm.execution_memory_used))
            stop.wait(interval)

    events = _EventLog(start)
    log = logging.getLogger("extagg")
    old_level, old_propagate = log.level, log.propagate
    log.addHandler(events)
    log.setLevel(logging.INFO)
    log.propagate = False
    sampler = threading.Thread(target=sample, name="rss-sampler", daemon=True)
    sampler.start()
    phases: dict[str, list[float]] = {}
    try:
        with ExternalAppendOnlyMap(Aggregator.reducing(operator.add), memory_manager=mm) as m:
            t0 = time.perf_counter() - start
            m.insert_all(records(n, keys))
            t1 = time.perf_counter() - start
            groups = sum(1 for _ in m.iterator())
            t2 = time.perf_counter() - start
            metrics = m.metrics.as_dict()
        phases = {"insert": [t0, t1], "merge": [t1, t2]}
        time.sleep(5 * interval)  # a few samples after close: the memory given back
    finally:
        stop.set()
        sampler.join()
        log.removeHandler(events)
        log.setLevel(old_level)
        log.propagate = old_propagate
    if groups != keys:
        raise SystemExit(f"trace run produced {groups} groups, expected {keys}")
    return {
        "engine": "extagg (ExternalAppendOnlyMap)",
        "records": n,
        "keys": keys,
        "budget": budget,
        "interval_s": interval,
        "baseline_rss": baseline,
        "samples": [{"t": t, "rss": r, "granted": g} for t, r, g in samples],
        "events": events.events,
        "phases": phases,
        "metrics": metrics,
        "machine": machine_info(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny data (a check, not a figure)")
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--keys", type=int, default=None)
    parser.add_argument("--memory", default=None, help="budget, e.g. 48m")
    parser.add_argument("--interval", type=float, default=0.01, help="seconds between samples")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    n = args.records or (200_000 if args.quick else 3_000_000)
    keys = args.keys or (50_000 if args.quick else 1_000_000)
    budget = resolve_memory_budget(args.memory or ("4m" if args.quick else "48m"))
    result = trace(n, keys, budget, args.interval)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("rss-trace-quick.json" if args.quick else "rss-trace.json")
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    spills = sum(1 for e in result["events"] if e["kind"] == "spill")
    peak = max(s["rss"] for s in result["samples"]) - result["baseline_rss"]
    print(
        f"{path}: {len(result['samples'])} samples, {spills} spills, peak RSS above baseline "
        f"{peak / MIB:.1f} MiB under a {budget / MIB:.0f} MiB budget"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

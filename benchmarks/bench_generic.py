"""Generic engine benchmark: ExternalAppendOnlyMap vs PySpark's ExternalMerger vs a plain dict.

A sum of float values over ``(key, value)`` records: 20 M records over 1 M full-range int64 keys
(every one outside ±2**61, where Python's ``hash(x) != x``) and 5 M records over 1 M short
strings (``user_123``), plus the older 10 M-record workloads (1 M and 5 M int keys below 2**48,
2 M strings ``key-%012x``), fed to every engine by the same generator (records made chunk by
chunk from seeded NumPy; no input list is held). ``extagg`` and ``merger`` are given the same
Python lambdas (``lambda v: v``, ``lambda c, v: c + v``, ``lambda a, b: a + b``), which extagg
recognises by their code as a sum (``extagg.function_code``) and folds in compiled code (its
typed path); ``extagg-general`` is the same with ``typed_path=False``: every record calls the
lambdas, what any other Python combiner costs. ``extagg-typed`` is
``Aggregator.reducing(operator.add)``. Each engine runs in memory (a budget nothing
reaches) and at a small budget that makes both spilling engines spill. ``ExternalMerger``
compares its limit with the whole process RSS, so it gets the budget above the child's RSS at
the start of the timed block. Every run is a fresh process (see ``_harness``): one untimed
warm-up, then medians of ``--runs`` runs with min–max, peak RSS above the child's baseline
(imports + a small priming run) for each. ``feed`` is the generator alone (its cost is in
every engine's time). A default run measures issue 11's two workloads scaled down
(``int64-125k``, ``user-250k``: same records per key and budget per key; ``--workloads int64-1M
user-1M`` for the full sizes) and then the *interleaved* comparison: every engine in turn in one
process, three rounds, CPU seconds (load on a shared machine then hits all engines alike);
about ten minutes on an idle 2-core machine. Usage::

    python benchmarks/bench_generic.py            # default run, updates benchmarks/README.md
    python benchmarks/bench_generic.py --quick    # tiny data, one run, no README update
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as H

GIB = 1024 * H.MIB
#: records the generator makes at a time: its lists of 65 536 Python keys and values (and the
#: NumPy temporaries behind them) took 15.9 MiB of RSS by themselves (the ``feed`` engine, in
#: a fresh process) — more than the 8 MiB budget the engines are measured against at it —
#: and 5.4 MiB at 8 192; a PySpark partition's iterator streams a deserialised batch at a time
CHUNK = 1 << 13
SEED = 20240601
IN_MEMORY_BUDGET = 8 * GIB
PRIME_RECORDS = 20_000

#: name → records, distinct keys, key kind, spilling budget (bytes)
WORKLOADS: dict[str, dict[str, Any]] = {
    "int64-1M": {
        "records": 20_000_000,
        "distinct": 1_000_000,
        "kind": "int64",
        "spill": 64 * H.MIB,
    },
    "user-1M": {"records": 5_000_000, "distinct": 1_000_000, "kind": "user", "spill": 64 * H.MIB},
    # issue 11's workloads scaled down (records per key and budget per key kept): the default
    "int64-125k": {"records": 2_500_000, "distinct": 125_000, "kind": "int64", "spill": 8 * H.MIB},
    "user-250k": {"records": 1_250_000, "distinct": 250_000, "kind": "user", "spill": 16 * H.MIB},
    "int64-250k": {"records": 5_000_000, "distinct": 250_000, "kind": "int64", "spill": 16 * H.MIB},
    "user-500k": {"records": 2_500_000, "distinct": 500_000, "kind": "user", "spill": 32 * H.MIB},
    "int-1M": {"records": 10_000_000, "distinct": 1_000_000, "kind": "int", "spill": 64 * H.MIB},
    "int-5M": {"records": 10_000_000, "distinct": 5_000_000, "kind": "int", "spill": 128 * H.MIB},
    "str-2M": {"records": 10_000_000, "distinct": 2_000_000, "kind": "str", "spill": 128 * H.MIB},
}
QUICK_WORKLOADS: dict[str, dict[str, Any]] = {
    "int64-1M": {"records": 200_000, "distinct": 10_000, "kind": "int64", "spill": 8 * H.MIB},
    "user-1M": {"records": 200_000, "distinct": 40_000, "kind": "user", "spill": 8 * H.MIB},
    "int64-125k": {"records": 200_000, "distinct": 10_000, "kind": "int64", "spill": 8 * H.MIB},
    "user-250k": {"records": 200_000, "distinct": 40_000, "kind": "user", "spill": 8 * H.MIB},
    "int64-250k": {"records": 200_000, "distinct": 10_000, "kind": "int64", "spill": 8 * H.MIB},
    "user-500k": {"records": 200_000, "distinct": 40_000, "kind": "user", "spill": 8 * H.MIB},
    "int-1M": {"records": 200_000, "distinct": 20_000, "kind": "int", "spill": 8 * H.MIB},
    "int-5M": {"records": 200_000, "distinct": 100_000, "kind": "int", "spill": 8 * H.MIB},
    "str-2M": {"records": 200_000, "distinct": 40_000, "kind": "str", "spill": 8 * H.MIB},
}
ENGINES = ("extagg", "extagg-general", "extagg-typed", "merger", "dict", "feed")
SPILLING_ENGINES = ("extagg", "extagg-general", "extagg-typed", "merger")
#: workloads a full run measures unless ``--workloads`` says otherwise: issue 11's two, scaled
#: down so that a default run (fresh processes and the interleaved table) takes ~10 minutes
DEFAULT_WORKLOADS = ("int64-125k", "user-250k")
#: the interleaved in-process comparison: name → records, distinct keys, kind, spilling budget
INTERLEAVED: dict[str, dict[str, Any]] = {
    "int64": {"records": 2_000_000, "distinct": 100_000, "kind": "int64", "spill": 8 * H.MIB},
    "user_N": {"records": 1_000_000, "distinct": 200_000, "kind": "user", "spill": 8 * H.MIB},
}
QUICK_INTERLEAVED: dict[str, dict[str, Any]] = {
    "int64": {"records": 50_000, "distinct": 5_000, "kind": "int64", "spill": 1 * H.MIB},
    "user_N": {"records": 50_000, "distinct": 10_000, "kind": "user", "spill": 1 * H.MIB},
}


# ---------------------------------------------------------------------------- the input


def records(total: int, distinct: int, kind: str, seed: int = SEED) -> Iterator[tuple[Any, float]]:
    """The deterministic record stream: every key exactly ``total // distinct`` times, scattered."""
    for start in range(0, total, CHUNK):
        stop = min(total, start + CHUNK)
        index = H.permuted_key_index(start, stop, total, distinct, seed)
        if kind == "int64":
            keys = full_range_keys(index).tolist()
        elif kind == "user":
            keys = [f"user_{k}" for k in index.tolist()]
        else:
            keys = H.scramble_keys(index).tolist()
        if kind == "str":
            keys = [f"key-{k:012x}" for k in keys]
        values = np.random.default_rng([seed, start]).random(stop - start).tolist()
        yield from zip(keys, values)


def full_range_keys(index: np.ndarray) -> np.ndarray:
    """Distinct key numbers → distinct int64 keys with ``2**62 <= |key| < 2**63``, both signs
    (a 62-bit bijection; its low bit is the sign): 64-bit ids, where ``hash(x) != x``."""
    mixed = H.permute_bits(index.astype(np.uint64), 62, SEED)
    magnitude = ((mixed >> np.uint64(1)) + np.uint64(1 << 62)).astype(np.int64)
    return np.where((mixed & np.uint64(1)) == 1, -magnitude, magnitude)


# ---------------------------------------------------------------------------- the engines

#: the combiner functions of ``extagg`` and ``merger``: Python lambdas, as PySpark jobs pass
LAMBDAS = (lambda v: v, lambda c, v: c + v, lambda a, b: a + b)


def run_extagg(
    stream: Iterator[tuple[Any, float]],
    budget: int,
    force: int | None = None,
    typed: bool = False,
    general: bool = False,
) -> dict:
    """``typed``: ``Aggregator.reducing(operator.add)``; else the lambdas, which extagg
    recognises as that (``extagg.function_code``) unless ``general`` turns the typed path off:
    then every record calls them, what any other Python combiner costs."""
    from extagg import Aggregator, ExternalAppendOnlyMap

    groups, total = 0, 0.0
    aggregator = Aggregator.reducing(operator.add) if typed else Aggregator(*LAMBDAS)
    with ExternalAppendOnlyMap(
        aggregator, memory=budget, force_spill_every=force, typed_path=not general
    ) as m:
        m.insert_all(stream)
        peak_after_insert = H.peak_rss()  # where the peak came: folding or merging
        typed_path = type(m._map).__name__ == "TypedReduceMap"
        for _, c in m.iterator():
            groups += 1
            total += c
        mt = m.metrics
    return {
        "typed_path": typed_path,
        "groups": groups,
        "total": total,
        "spills": mt.spill_count,
        "disk_bytes_spilled": mt.disk_bytes_spilled,
        "memory_bytes_spilled": mt.memory_bytes_spilled,
        "peak_granted_bytes": mt.peak_granted_bytes,
        "merge_passes": mt.merge_passes,
        "peak_rss_after_insert": peak_after_insert,
    }


def run_merger(stream: Iterator[tuple[Any, float]], budget: int) -> dict:
    import pyspark.shuffle as ps

    limit_mib = (H.current_rss() + budget) // H.MIB
    spill_dir = tempfile.mkdtemp(prefix="bench-merger-")
    disk_before, memory_before = ps.DiskBytesSpilled, ps.MemoryBytesSpilled
    try:
        m = ps.ExternalMerger(
            ps.Aggregator(*LAMBDAS),
            memory_limit=limit_mib,
            localdirs=[spill_dir],
        )
        m.mergeValues(stream)
        peak_after_insert = H.peak_rss()
        groups, total = 0, 0.0
        for _, c in m.items():
            groups += 1
            total += c
        spills = m.spills
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)
    return {
        "groups": groups,
        "total": total,
        "spills": spills,
        "disk_bytes_spilled": ps.DiskBytesSpilled - disk_before,
        "memory_bytes_spilled": ps.MemoryBytesSpilled - memory_before,
        "limit_mib": limit_mib,
        "peak_rss_after_insert": peak_after_insert,
    }


def run_dict(stream: Iterator[tuple[Any, float]], budget: int) -> dict:
    d: dict[Any, float] = {}
    get = d.get
    for k, v in stream:
        d[k] = get(k, 0.0) + v
    groups, total = 0, 0.0
    for _, c in d.items():
        groups += 1
        total += c
    return {"groups": groups, "total": total}


def run_feed(stream: Iterator[tuple[Any, float]], budget: int) -> dict:
    n = 0
    for _ in stream:
        n += 1
    return {"records": n}


def run_extagg_typed(stream: Iterator[tuple[Any, float]], budget: int) -> dict:
    return run_extagg(stream, budget, typed=True)


def run_extagg_general(stream: Iterator[tuple[Any, float]], budget: int) -> dict:
    return run_extagg(stream, budget, general=True)


RUNNERS = {
    "extagg": run_extagg,
    "extagg-typed": run_extagg_typed,
    "extagg-general": run_extagg_general,
    "merger": run_merger,
    "dict": run_dict,
    "feed": run_feed,
}


#: engine → runner of the interleaved comparison (``mode`` chooses the budget)
INTERLEAVED_ENGINES = ("merger", "extagg", "extagg-general", "extagg-typed", "dict", "feed")


def interleaved(case: dict[str, Any]) -> dict[str, Any]:
    """Every engine in this one process, in turn, ``rounds`` times, in memory and spilling:
    the load of a shared machine then hits all engines alike. CPU and wall seconds per run."""
    rounds, spill = case["rounds"], case["spill"]
    prime = records(PRIME_RECORDS, PRIME_RECORDS // 10, case["kind"], seed=SEED + 1)
    run_extagg(prime, spill, force=PRIME_RECORDS // 4, typed=True)
    run_extagg(records(PRIME_RECORDS, PRIME_RECORDS // 10, case["kind"]), spill, general=True)
    out: dict[str, Any] = {}
    for _ in range(rounds):
        for mode, budget in (("in memory", IN_MEMORY_BUDGET), ("spilling", spill)):
            for engine in INTERLEAVED_ENGINES:
                if mode == "spilling" and engine not in SPILLING_ENGINES:
                    continue
                stream = records(case["records"], case["distinct"], case["kind"])
                cpu, wall = time.process_time(), time.perf_counter()
                result = RUNNERS[engine](stream, budget)
                cell = out.setdefault(f"{engine}|{mode}", {"cpu": [], "wall": [], "spills": 0})
                cell["cpu"].append(time.process_time() - cpu)
                cell["wall"].append(time.perf_counter() - wall)
                cell["spills"] = result.get("spills", 0)
    return {"interleaved": out, "load_average": list(os.getloadavg())}


def interleaved_table(results: dict[str, dict[str, Any]], rounds: int) -> str:
    """Ratios of the interleaved run's median CPU seconds (wall seconds in brackets)."""
    import statistics

    rows = []
    for name, res in results.items():
        cells = res["interleaved"]

        def med(engine: str, mode: str, field: str = "cpu", cells: dict = cells) -> float:
            return statistics.median(cells[f"{engine}|{mode}"][field])

        def ratio(a: str, b: str, mode: str, target: float | None = None) -> str:
            cpu = med(a, mode) / med(b, mode)
            wall = med(a, mode, "wall") / med(b, mode, "wall")
            mark = "" if target is None else (" ✅" if cpu >= target else " ❌")
            return f"{cpu:.2f}×{mark} ({wall:.2f}×)"

        spec = res["spec"]
        rows.append(
            [
                f"{name} ({spec['records'] / 1e6:g} M / {spec['distinct'] / 1e3:g} k, "
                f"{H.format_bytes(spec['spill'])})",
                ratio("merger", "extagg", "in memory", 1.2),
                ratio("merger", "extagg", "spilling", 2.0),
                ratio("merger", "extagg-general", "in memory"),
                ratio("merger", "extagg-general", "spilling"),
                ratio("dict", "extagg-typed", "in memory", 1.0),
                ratio("merger", "extagg-typed", "spilling"),
                ratio("dict", "extagg", "in memory"),
                " / ".join(
                    str(cells[f"{e}|spilling"]["spills"])
                    for e in ("extagg", "extagg-general", "extagg-typed", "merger")
                ),
                ", ".join(
                    f"{e} {med(e, 'in memory'):.2f}"
                    for e in ("merger", "extagg", "extagg-general", "extagg-typed", "dict", "feed")
                ),
                ", ".join(f"{x:.1f}" for x in res["load_average"]),
            ]
        )
    headers = [
        "workload (records / keys, spilling budget)", "in memory: merger / extagg (target ≥ 1.2)",
        "both spill: merger / extagg (target ≥ 2)", "in memory: merger / extagg-general",
        "both spill: merger / extagg-general", "dict / extagg-typed (target ≥ 1)",
        "both spill: merger / extagg-typed", "dict / extagg",
        "spills extagg / general / typed / merger", "CPU s in memory (medians)", "load at end",
    ]  # fmt: skip
    return "\n".join(
        [
            f"Interleaved in one process ({rounds} rounds of every engine in turn, medians of "
            "CPU seconds, wall-clock ratios in brackets; every engine includes `feed`):",
            "",
            H.markdown_table(headers, rows),
        ]
    )


def child(case: dict[str, Any]) -> dict[str, Any]:
    """One measured run in this fresh process (the parent reads the printed result)."""
    import pyspark.shuffle  # noqa: F401  - every child carries the same libraries

    import extagg  # noqa: F401

    if case["engine"] == "interleaved":
        return interleaved(case)

    rss_after_imports = H.current_rss()
    run = RUNNERS[case["engine"]]
    budget = case["budget"]
    prime = records(PRIME_RECORDS, max(1, PRIME_RECORDS // 10), case["kind"], seed=SEED + 1)
    if case["engine"].startswith("extagg"):  # loads the spill and merge paths
        run_extagg(
            prime,
            budget,
            force=PRIME_RECORDS // 4,
            typed=case["engine"] == "extagg-typed",
            general=case["engine"] == "extagg-general",
        )
    else:
        run(prime, budget)
    stream = records(case["records"], case["distinct"], case["kind"])
    cpu_started = time.process_time()
    t = H.timed(lambda: run(stream, budget))
    cpu = time.process_time() - cpu_started
    out = {**t.as_dict(), **t.value, "rss_after_imports": rss_after_imports, "cpu_s": cpu}
    if "peak_rss_after_insert" in out:
        out["peak_above_baseline_after_insert"] = out.pop("peak_rss_after_insert") - t.baseline_rss
    out["records_per_s"] = case["records"] / t.seconds
    return out


# ---------------------------------------------------------------------------- the parent


def cases_of(name: str, spec: dict[str, Any], engines: list[str]) -> list[dict[str, Any]]:
    out = []
    for engine in engines:
        base = {
            "workload": name,
            "engine": engine,
            **{k: spec[k] for k in ("records", "distinct", "kind")},
        }
        out.append({**base, "mode": "in memory", "budget": IN_MEMORY_BUDGET})
        if engine in SPILLING_ENGINES:
            out.append({**base, "mode": "spilling", "budget": spec["spill"]})
    return out


def summary_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in results:
        c, s = r["case"], r["summary"]
        budget = "–" if c["engine"] in ("dict", "feed") else H.format_bytes(c["budget"])
        if "error" in s:
            rows.append(
                [c["workload"], c["engine"], c["mode"], budget, f"failed: {s['error']}"] + [""] * 7
            )
            continue
        peak = s["peak_above_baseline"]
        within = ""
        if c["engine"] in SPILLING_ENGINES and c["mode"] == "spilling":
            within = f"{peak[0] / c['budget']:.2f}×"
        rows.append(
            [
                c["workload"],
                c["engine"],
                c["mode"],
                budget,
                H.format_range(s["seconds"]),
                f"{s['cpu_s'][0]:.2f}" if "cpu_s" in s else "–",
                f"{s['records_per_s'][0] / 1e6:.2f} M",
                str(int(s["spills"][0])) if "spills" in s else "–",
                H.format_bytes(s["disk_bytes_spilled"][0]) if "disk_bytes_spilled" in s else "–",
                f"{H.format_bytes(peak[0])} ({H.format_bytes(peak[1])}–{H.format_bytes(peak[2])})",
                within,
                H.format_bytes(s["baseline_rss"][0]),
            ]
        )
    return rows


def _median(results: list[dict[str, Any]], workload: str, engine: str, mode: str, field: str):
    for r in results:
        c = r["case"]
        if (c["workload"], c["engine"], c["mode"]) == (workload, engine, mode):
            value = r["summary"].get(field)
            return value[0] if isinstance(value, list) else None
    return None


def target_rows(results: list[dict[str, Any]], workloads: list[str]) -> list[list[str]]:
    """Issue 11's targets: the general path ≥ 1.2× ExternalMerger in memory and ≥ 2× while both
    spill, the typed path ≥ 1× a dict loop; peak RSS ≤ 1.25 × the budget."""

    def ratio(a, b, target=None):
        if not (a and b):
            return "–"
        mark = "" if target is None else (" ✅" if a >= target * b else " ❌")
        return f"{a / b:.2f}×{mark}"

    rows = []
    for w in workloads:

        def med(engine, mode, field="seconds", w=w):
            return _median(results, w, engine, mode, field)

        budget = next(
            (
                r["case"]["budget"]
                for r in results
                if r["case"]["workload"] == w and r["case"]["mode"] == "spilling"
            ),
            None,
        )
        peaks = []
        for engine in ("extagg", "extagg-general", "extagg-typed"):
            peak = med(engine, "spilling", "peak_above_baseline")
            if peak is not None and budget:
                mark = " ✅" if peak <= 1.25 * budget else " ❌"
                peaks.append(f"{engine}: {peak / budget:.2f}×{mark}")
        engines = ("extagg", "extagg-general", "extagg-typed", "merger")
        spills = [med(e, "spilling", "spills") for e in engines]
        rows.append(
            [
                w,
                ratio(med("merger", "in memory"), med("extagg", "in memory"), 1.2),
                ratio(med("merger", "spilling"), med("extagg", "spilling"), 2.0),
                ratio(med("merger", "in memory"), med("extagg-general", "in memory")),
                ratio(med("merger", "spilling"), med("extagg-general", "spilling")),
                ratio(med("dict", "in memory"), med("extagg-typed", "in memory"), 1.0),
                ratio(med("merger", "spilling"), med("extagg-typed", "spilling")),
                ratio(med("dict", "in memory"), med("extagg", "in memory")),
                " / ".join("–" if x is None else f"{x:.0f}" for x in spills),
                "; ".join(peaks) or "–",
            ]
        )
    return rows


def render(results: list[dict[str, Any]], workloads: list[str], info: dict[str, Any], args) -> str:
    headers = [
        "workload", "engine", "mode", "budget", "time s, median (min–max)", "CPU s", "records/s",
        "spills", "spilled (disk)", "peak RSS above baseline (min–max)", "peak/budget", "baseline RSS",
    ]  # fmt: skip
    targets = [
        "workload", "in memory: merger / extagg (target ≥ 1.2)",
        "both spill: merger / extagg (target ≥ 2)", "in memory: merger / extagg-general",
        "both spill: merger / extagg-general", "dict / extagg-typed (target ≥ 1)",
        "both spill: merger / extagg-typed", "dict / extagg",
        "spills extagg / general / typed / merger",
        "peak RSS above baseline / budget (target ≤ 1.25)",
    ]  # fmt: skip
    load = ", ".join(f"{x:.1f}" for x in info["load_average"])
    load_end = ", ".join(f"{x:.1f}" for x in info.get("load_average_end", []))
    return "\n".join(
        [
            f"Measured {info['time']} with `{' '.join(args.command)}`: {info['cpus']} cores, "
            f"{H.format_bytes(info.get('memory_total'))}, Python {info['python']}, pyspark {info.get('pyspark')}; "
            f"load average at start {load}, at end {load_end}. "
            f"{args.runs} timed runs after {args.warmup} warm-up, each a fresh process.",
            "",
            H.markdown_table(headers, summary_rows(results)),
            "",
            H.markdown_table(targets, target_rows(results, workloads)),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    H.add_common_arguments(parser)
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS))
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--records", type=int, help="override the record count of every workload")
    parser.add_argument("--distinct", type=int, help="override the distinct keys of every workload")
    parser.add_argument("--spill-mib", type=int, help="override the spilling budget (MiB)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per child")
    parser.add_argument(
        "--interleaved-rounds",
        type=int,
        help="rounds of the interleaved in-process comparison (default 3, quick 1; 0: skip)",
    )
    args = parser.parse_args()
    if args.child:
        H.run_guarded(lambda: child(json.loads(args.child)))
        return
    args.command = ["python", "benchmarks/bench_generic.py", *sys.argv[1:]]
    table = QUICK_WORKLOADS if args.quick else WORKLOADS
    suffix = "-quick" if args.quick else ""
    args.checkpoint = H.checkpoint_file(args, f"generic{suffix}")
    args.runs = args.runs if args.runs is not None else (1 if args.quick else 3)
    # no warm-up child by default: each child primes the engine (imports, compiled kernels,
    # spill and merge paths) before its timed block
    args.warmup = args.warmup if args.warmup is not None else 0
    names = args.workloads or list(table if args.quick else DEFAULT_WORKLOADS)
    info = H.machine_info()
    results = []
    started = time.perf_counter()
    for name in names:
        spec = dict(table[name])
        if args.records:
            spec["records"] = args.records
            spec["distinct"] = min(spec["distinct"], args.records)
        if args.distinct:
            spec["distinct"] = args.distinct
        if args.spill_mib:
            spec["spill"] = args.spill_mib * H.MIB
        for case in cases_of(name, spec, args.engines):
            print(f"{name} {case['engine']} {case['mode']} ...", file=sys.stderr, flush=True)
            r = H.run_case(__file__, case, runs=args.runs, warmup=args.warmup, timeout=args.timeout,
                           log=lambda m: print(m, file=sys.stderr, flush=True),
                           checkpoint=args.checkpoint)  # fmt: skip
            s = r["summary"]
            if "seconds" in s:
                print(f"  {H.format_range(s['seconds'])} s, peak +{H.format_bytes(s['peak_above_baseline'][0])}",
                      file=sys.stderr, flush=True)  # fmt: skip
            results.append(r)
    _check_agreement(results)
    rounds = args.interleaved_rounds
    rounds = rounds if rounds is not None else (1 if args.quick else 3)
    mixed: dict[str, dict[str, Any]] = {}
    for name, spec in (QUICK_INTERLEAVED if args.quick else INTERLEAVED).items():
        if not rounds:
            break
        print(f"interleaved {name} ...", file=sys.stderr, flush=True)
        case = {"engine": "interleaved", "rounds": rounds, **spec}
        r = H.run_case(__file__, case, runs=1, warmup=0, timeout=args.timeout * 4)
        if "error" in r["summary"]:
            raise SystemExit(f"interleaved {name} failed: {r['summary']['error']}")
        mixed[name] = {**r["runs"][0], "spec": spec}
    info["load_average_end"] = list(os.getloadavg())
    info["wall_s"] = time.perf_counter() - started
    text = render(results, names, info, args)
    if mixed:
        text += "\n\n" + interleaved_table(mixed, rounds)
    print(text)
    payload = {
        "machine": info,
        "workloads": {n: table[n] for n in names},
        "results": results,
        "interleaved": mixed,
    }
    H.write_results(f"generic{suffix}", payload, text, args.out)
    args.checkpoint.unlink(missing_ok=True)
    if not args.quick and not args.no_readme:
        H.update_readme("bench_generic", text)


def _check_agreement(results: list[dict[str, Any]]) -> None:
    """Every engine of a workload must find the same groups and the same total."""
    by_workload: dict[str, list[tuple[str, float, float]]] = {}
    for r in results:
        s = r["summary"]
        if "groups" in s:
            by_workload.setdefault(r["case"]["workload"], []).append(
                (f"{r['case']['engine']} {r['case']['mode']}", s["groups"][0], s["total"][0])
            )
    for workload, found in by_workload.items():
        _, groups, total = found[0]
        for label, g, t in found[1:]:
            if g != groups or abs(t - total) > 1e-6 * max(1.0, abs(total)):
                raise SystemExit(
                    f"{workload}: {label} found {g} groups / total {t}, expected {groups} / {total}"
                )


if __name__ == "__main__":
    main()

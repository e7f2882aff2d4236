"""Generic engine benchmark: ExternalAppendOnlyMap vs PySpark's ExternalMerger vs a plain dict.

A sum of float values over 10 M ``(key, value)`` records with 1 M and 5 M distinct int keys and
2 M distinct string keys, fed to every engine by the same generator (records made chunk by
chunk from seeded NumPy; no input list is held). Each engine runs in memory (a budget nothing
reaches) and at a small budget that makes both spilling engines spill. ``ExternalMerger``
compares its limit with the whole process RSS, so it gets the budget above the child's RSS at
the start of the timed block. Every run is a fresh process (see ``_harness``): one untimed
warm-up, then medians of ``--runs`` runs with min–max, peak RSS above the child's baseline
(imports + a small priming run) for each. ``feed`` is the generator alone (its cost is in
every engine's time). Usage::

    python benchmarks/bench_generic.py            # full size, updates benchmarks/README.md
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
CHUNK = 1 << 16
SEED = 20240601
IN_MEMORY_BUDGET = 8 * GIB
PRIME_RECORDS = 20_000

#: name → records, distinct keys, key kind, spilling budget (bytes)
WORKLOADS: dict[str, dict[str, Any]] = {
    "int-1M": {"records": 10_000_000, "distinct": 1_000_000, "kind": "int", "spill": 64 * H.MIB},
    "int-5M": {"records": 10_000_000, "distinct": 5_000_000, "kind": "int", "spill": 128 * H.MIB},
    "str-2M": {"records": 10_000_000, "distinct": 2_000_000, "kind": "str", "spill": 128 * H.MIB},
}
QUICK_WORKLOADS: dict[str, dict[str, Any]] = {
    "int-1M": {"records": 200_000, "distinct": 20_000, "kind": "int", "spill": 8 * H.MIB},
    "int-5M": {"records": 200_000, "distinct": 100_000, "kind": "int", "spill": 8 * H.MIB},
    "str-2M": {"records": 200_000, "distinct": 40_000, "kind": "str", "spill": 8 * H.MIB},
}
ENGINES = ("extagg", "merger", "dict", "feed")
SPILLING_ENGINES = ("extagg", "merger")


# ---------------------------------------------------------------------------- the input


def records(total: int, distinct: int, kind: str, seed: int = SEED) -> Iterator[tuple[Any, float]]:
    """The deterministic record stream: every key exactly ``total // distinct`` times, scattered."""
    for start in range(0, total, CHUNK):
        stop = min(total, start + CHUNK)
        keys = H.scramble_keys(H.permuted_key_index(start, stop, total, distinct, seed)).tolist()
        if kind == "str":
            keys = [f"key-{k:012x}" for k in keys]
        values = np.random.default_rng([seed, start]).random(stop - start).tolist()
        yield from zip(keys, values)


# ---------------------------------------------------------------------------- the engines


def run_extagg(stream: Iterator[tuple[Any, float]], budget: int, force: int | None = None) -> dict:
    from extagg import Aggregator, ExternalAppendOnlyMap

    groups, total = 0, 0.0
    with ExternalAppendOnlyMap(
        Aggregator.reducing(operator.add), memory=budget, force_spill_every=force
    ) as m:
        m.insert_all(stream)
        peak_after_insert = H.peak_rss()  # where the peak came: folding or merging
        for _, c in m.iterator():
            groups += 1
            total += c
        mt = m.metrics
    return {
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
            ps.Aggregator(_identity, operator.add, operator.add),
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


def _identity(v: Any) -> Any:
    return v


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


RUNNERS = {"extagg": run_extagg, "merger": run_merger, "dict": run_dict, "feed": run_feed}


def child(case: dict[str, Any]) -> dict[str, Any]:
    """One measured run in this fresh process (the parent reads the printed result)."""
    import pyspark.shuffle  # noqa: F401  - every child carries the same libraries

    import extagg  # noqa: F401

    rss_after_imports = H.current_rss()
    run = RUNNERS[case["engine"]]
    budget = case["budget"]
    prime = records(PRIME_RECORDS, max(1, PRIME_RECORDS // 10), case["kind"], seed=SEED + 1)
    if case["engine"] == "extagg":
        run_extagg(prime, budget, force=PRIME_RECORDS // 4)  # loads the spill and merge paths
    else:
        run(prime, budget)
    stream = records(case["records"], case["distinct"], case["kind"])
    t = H.timed(lambda: run(stream, budget))
    out = {**t.as_dict(), **t.value, "rss_after_imports": rss_after_imports}
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
                [c["workload"], c["engine"], c["mode"], budget, f"failed: {s['error']}"] + [""] * 6
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
    rows = []
    for w in workloads:
        ext_mem = _median(results, w, "extagg", "in memory", "seconds")
        ext_sp = _median(results, w, "extagg", "spilling", "seconds")
        em_mem = _median(results, w, "merger", "in memory", "seconds")
        em_sp = _median(results, w, "merger", "spilling", "seconds")
        dict_mem = _median(results, w, "dict", "in memory", "seconds")
        em_spills = _median(results, w, "merger", "spilling", "spills")
        ext_spills = _median(results, w, "extagg", "spilling", "spills")
        peak = _median(results, w, "extagg", "spilling", "peak_above_baseline")
        budget = next(
            (
                r["case"]["budget"]
                for r in results
                if r["case"]["workload"] == w and r["case"]["mode"] == "spilling"
            ),
            None,
        )

        def ratio(a, b):
            return f"{a / b:.2f}×" if a and b else "–"

        no_spill = ratio(em_mem, ext_mem)
        spill = ratio(em_sp, ext_sp)
        rows.append(
            [
                w,
                no_spill + (" ✅" if em_mem and ext_mem and em_mem >= ext_mem else " ❌"),
                spill + (" ✅" if em_sp and ext_sp and em_sp >= 1.5 * ext_sp else " ❌"),
                f"{ext_spills:.0f} / {em_spills:.0f}"
                if ext_spills is not None and em_spills is not None
                else "–",
                (f"{peak / budget:.2f}× budget" + (" ✅" if peak <= 1.25 * budget else " ❌"))
                if peak is not None and budget
                else "–",
                ratio(dict_mem, ext_mem),
            ]
        )
    return rows


def render(results: list[dict[str, Any]], workloads: list[str], info: dict[str, Any], args) -> str:
    headers = [
        "workload", "engine", "mode", "budget", "time s, median (min–max)", "records/s",
        "spills", "spilled (disk)", "peak RSS above baseline (min–max)", "peak/budget", "baseline RSS",
    ]  # fmt: skip
    targets = [
        "workload", "no spill: ExternalMerger time / extagg time (target ≥ 1)",
        "both spill: ExternalMerger / extagg (target ≥ 1.5)", "spills extagg / merger",
        "extagg peak RSS above baseline (target ≤ 1.25 × budget)", "dict time / extagg time",
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
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per child")
    args = parser.parse_args()
    if args.child:
        H.run_guarded(lambda: child(json.loads(args.child)))
        return
    args.command = ["python", "benchmarks/bench_generic.py", *sys.argv[1:]]
    table = QUICK_WORKLOADS if args.quick else WORKLOADS
    suffix = "-quick" if args.quick else ""
    args.checkpoint = H.checkpoint_file(args, f"generic{suffix}")
    args.runs = args.runs if args.runs is not None else (1 if args.quick else 3)
    args.warmup = args.warmup if args.warmup is not None else (0 if args.quick else 1)
    names = args.workloads or list(table)
    info = H.machine_info()
    results = []
    started = time.perf_counter()
    for name in names:
        spec = dict(table[name])
        if args.records:
            spec["records"] = args.records
            spec["distinct"] = min(spec["distinct"], args.records)
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
    info["load_average_end"] = list(os.getloadavg())
    info["wall_s"] = time.perf_counter() - started
    text = render(results, names, info, args)
    print(text)
    payload = {"machine": info, "workloads": {n: table[n] for n in names}, "results": results}
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

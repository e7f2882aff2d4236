"""Scale curves: how extagg's time and memory grow with rows, groups, the budget and threads.

Four curves, each point a fresh process (``_harness.run_case``), the same generated input for
every engine (``SUM(v), COUNT(*) GROUP BY k`` over int64 keys spread over the whole int64
range, each of ``groups`` keys equally often, in scattered order):

* ``rows``: 1 M … 100 M rows with ``rows / 10`` groups, no limit — extagg on 1 thread and on
  every core, DuckDB and Polars' streaming engine on every core, and the generic engine
  (``ExternalAppendOnlyMap`` over Python records) up to 10 M rows;
* ``groups``: 20 M rows (50 M for 50 M groups) with 10 … 50 M groups, no limit, same engines;
* ``budget``: 20 M rows, 10 M groups, from no limit down to 1/32 of the memory extagg's
  in-memory table was granted — extagg on 1 thread and on every core, DuckDB on every core
  with the same ``memory_limit``: time and peak RSS above the baseline;
* ``threads``: 20 M rows with 1 M and 10 M groups, extagg and DuckDB on 1 … every core.

Peak RSS "above baseline" is what the aggregation added once the input was built (see
``_harness.timed``). Results go to ``results/scaling.json`` and ``.md``, the table into
``benchmarks/README.md`` and the plots to ``docs/img/scaling-*.png``. Usage::

    python benchmarks/bench_scaling.py                      # every curve (~1 h here)
    python benchmarks/bench_scaling.py --curves threads budget --runs 1 --warmup 0
    python benchmarks/bench_scaling.py --quick              # tiny sizes, checks the script
    python benchmarks/bench_scaling.py --plot-only          # redraw the PNGs from the JSON
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as H

SEED = 11
NO_LIMIT = 16 * 1024 * H.MIB
AGGS = {"total": ("v", "sum"), "n": ("*", "count")}
BATCH_ROWS = 1 << 20
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
IMG_DIR = Path(__file__).resolve().parent.parent / "docs" / "img"

FULL = {
    "rows": [1_000_000, 3_000_000, 10_000_000, 30_000_000, 100_000_000],
    "groups": [10, 1_000, 100_000, 1_000_000, 10_000_000, 50_000_000],
    "generic_rows": 10_000_000,
    "fixed_rows": 20_000_000,
    "budget_groups": 10_000_000,
    "thread_groups": [1_000_000, 10_000_000],
    "fractions": [2, 4, 8, 16, 32],
}
QUICK = {
    "rows": [20_000, 100_000],
    "groups": [10, 10_000],
    "generic_rows": 20_000,
    "fixed_rows": 100_000,
    "budget_groups": 50_000,
    "thread_groups": [10_000],
    "fractions": [4],
}
CURVES = ("rows", "groups", "budget", "threads")


# ---------------------------------------------------------------------------- the input

_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)


def full_range_keys(index: np.ndarray) -> np.ndarray:
    """Key numbers → distinct int64 keys over the whole int64 range (murmur3's finaliser, a
    bijection of 64-bit words)."""
    x = index.astype(np.uint64) + np.uint64(1)
    x ^= x >> np.uint64(33)
    x *= _M1
    x ^= x >> np.uint64(33)
    x *= _M2
    x ^= x >> np.uint64(33)
    return x.view(np.int64)


def make_table(rows: int, groups: int) -> Any:
    """``rows`` rows ``(k int64, v float64)``: each of ``groups`` keys ``rows // groups`` times
    (± 1), scattered; built in 1 M-row batches."""
    import pyarrow as pa

    batches = []
    for start in range(0, rows, BATCH_ROWS):
        stop = min(rows, start + BATCH_ROWS)
        index = H.permuted_key_index(start, stop, rows, groups, SEED)
        values = (index % 1000).astype(np.float64) * 0.25
        batches.append(pa.record_batch({"k": full_range_keys(index), "v": values}))
    return pa.Table.from_batches(batches)


# ---------------------------------------------------------------------------- the engines


def run_extagg(table: Any, budget: int | None, threads: int) -> tuple[int, float, dict]:
    from extagg import HashAggregator

    with HashAggregator("k", AGGS, memory=budget or NO_LIMIT, threads=threads) as agg:
        for batch in table.to_batches():
            agg.update(batch)
        groups, total = _consume(agg.results())
        m = agg.metrics
    return groups, total, {"spills": m.spill_count, "peak_granted_bytes": m.peak_granted_bytes}


def run_generic(table: Any, budget: int | None, threads: int) -> tuple[int, float, dict]:
    import operator

    from extagg import Aggregator, ExternalAppendOnlyMap

    def records():
        for batch in table.to_batches():
            yield from zip(batch.column(0).to_pylist(), batch.column(1).to_pylist())

    groups, total = 0, 0.0
    with ExternalAppendOnlyMap(
        Aggregator.reducing(operator.add), memory=budget or NO_LIMIT
    ) as merged:
        merged.insert_all(records())
        for _key, value in merged:
            groups += 1
            total += value
        spills = merged.metrics.spill_count
    return groups, total, {"spills": spills}


def run_duckdb(table: Any, budget: int | None, threads: int) -> tuple[int, float, dict]:
    import duckdb

    temp = tempfile.mkdtemp(prefix="bench-duckdb-")
    config: dict[str, Any] = {
        "threads": threads,
        "temp_directory": temp,
        "preserve_insertion_order": False,
    }
    if budget:
        config["memory_limit"] = f"{max(1, budget // H.MIB)}MiB"
    try:
        con = duckdb.connect(config=config)
        con.register("t", table)
        sql = "SELECT k, sum(v) AS total, count(*) AS n FROM t GROUP BY k"
        groups, total = _consume(con.sql(sql).to_arrow_reader())
        con.close()
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return groups, total, {}


def run_polars(table: Any, budget: int | None, threads: int) -> tuple[int, float, dict]:
    import polars as pl  # POLARS_MAX_THREADS was set before the import (child)

    df = pl.from_arrow(table)
    out = (
        df.lazy()
        .group_by("k")
        .agg(pl.col("v").sum().alias("total"), pl.len().alias("n"))
        .collect(engine="streaming")
    )
    return out.height, float(out["total"].sum()), {}


ENGINES = {
    "extagg": run_extagg,
    "generic": run_generic,
    "duckdb": run_duckdb,
    "polars-streaming": run_polars,
}


def _consume(batches: Any) -> tuple[int, float]:
    import pyarrow.compute as pc

    groups, total = 0, 0.0
    for batch in batches:
        groups += batch.num_rows
        total += float(pc.sum(batch.column("total")).as_py() or 0.0)
    return groups, total


def child(case: dict[str, Any]) -> dict[str, Any]:
    """One measured point in this fresh process."""
    if case["engine"] == "polars-streaming":
        os.environ["POLARS_MAX_THREADS"] = str(case["threads"])
    run = ENGINES[case["engine"]]
    started = time.perf_counter()
    table = make_table(case["rows"], case["groups"])
    made = time.perf_counter() - started
    run(table.slice(0, 20_000), None, case["threads"])  # imports, kernel loads, thread pools
    t = H.timed(lambda: run(table, case["budget"], case["threads"]))
    groups, total, extra = t.value
    return {
        **t.as_dict(),
        **extra,
        "groups": groups,
        "total": total,
        "rows_per_s": case["rows"] / t.seconds,
        "input_seconds": made,
    }


# ---------------------------------------------------------------------------- the parent


def plan(curve: str, sizes: dict[str, Any]) -> list[dict[str, Any]]:
    """The points of one curve without their budgets (``budget`` ones get theirs later)."""
    many = CPUS
    cores = sorted({1, many})
    points: list[dict[str, Any]] = []

    def add(engine: str, threads: int, rows: int, groups: int, budget: int | None = None) -> None:
        points.append({"curve": curve, "engine": engine, "threads": threads, "rows": rows,
                       "groups": groups, "budget": budget})  # fmt: skip

    if curve in ("rows", "groups"):
        series = (
            [(r, max(10, r // 10)) for r in sizes["rows"]]
            if curve == "rows"
            else [(max(sizes["fixed_rows"], g), g) for g in sizes["groups"]]
        )
        for rows, groups in series:
            for t in cores:
                add("extagg", t, rows, groups)
            add("duckdb", many, rows, groups)
            add("polars-streaming", many, rows, groups)
            if curve == "rows" and rows <= sizes["generic_rows"]:
                add("generic", 1, rows, groups)
    elif curve == "threads":
        for groups in sizes["thread_groups"]:
            for t in range(1, many + 1):
                add("extagg", t, sizes["fixed_rows"], groups)
                add("duckdb", t, sizes["fixed_rows"], groups)
    return points


def label(case: dict[str, Any]) -> str:
    budget = H.format_bytes(case["budget"]) if case["budget"] else "none"
    return (f"{case['curve']}: {case['engine']} {case['threads']}t, {case['rows']:,} rows, "
            f"{case['groups']:,} groups, limit {budget}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    H.add_common_arguments(parser)
    parser.add_argument("--curves", nargs="+", choices=CURVES, default=list(CURVES))
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--engines", nargs="+", choices=list(ENGINES), default=list(ENGINES))
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNGs from the JSON")
    parser.add_argument("--img", type=Path, default=IMG_DIR, help="where the PNGs go")
    args = parser.parse_args(argv)
    if args.child:
        import json

        H.run_guarded(lambda: child(json.loads(args.child)))
        return 0
    suffix = "-quick" if args.quick else ""
    out_dir = args.out or H.RESULTS_DIR
    if args.plot_only:
        import json

        payload = json.loads((out_dir / f"scaling{suffix}.json").read_text(encoding="utf-8"))
        for path in draw(payload["results"], args.img):
            print(path)
        return 0
    args.runs = args.runs or (1 if args.quick else 3)
    args.warmup = args.warmup if args.warmup is not None else (0 if args.quick else 1)
    sizes = QUICK if args.quick else FULL
    checkpoint = H.checkpoint_file(args, f"scaling{suffix}")
    info = H.machine_info()
    started = time.time()
    results: list[dict[str, Any]] = []

    def measure(case: dict[str, Any]) -> dict[str, Any] | None:
        if case["engine"] not in args.engines:
            return None
        print(label(case), "...", file=sys.stderr, flush=True)
        r = H.run_case(__file__, case, runs=args.runs, warmup=args.warmup, timeout=args.timeout,
                       log=lambda m: print(m, file=sys.stderr, flush=True),
                       checkpoint=checkpoint)  # fmt: skip
        s = r["summary"]
        if "seconds" in s:
            print(f"  {H.format_range(s['seconds'])} s, peak +"
                  f"{H.format_bytes(s['peak_above_baseline'][0])}", file=sys.stderr, flush=True)  # fmt: skip
        results.append(r)
        return r

    for curve in args.curves:
        if curve != "budget":
            for case in plan(curve, sizes):
                measure(case)
            continue
        rows, groups = sizes["fixed_rows"], sizes["budget_groups"]
        base = {"curve": "budget", "rows": rows, "groups": groups}
        unlimited = measure({**base, "engine": "extagg", "threads": 1, "budget": None}) or {}
        granted = unlimited.get("summary", {}).get("peak_granted_bytes", [groups * 64])[0]
        budgets: list[int | None] = [None, *(int(granted) // f for f in sizes["fractions"])]
        runners = list(dict.fromkeys([("extagg", 1), ("extagg", CPUS), ("duckdb", CPUS)]))
        for budget in budgets:
            for engine, threads in runners:
                if budget is None and (engine, threads) == ("extagg", 1):
                    continue  # measured above
                measure({**base, "engine": engine, "threads": threads, "budget": budget})
    info["wall_s"] = time.time() - started
    info["load_average_end"] = list(os.getloadavg())
    disagreements = check(results)
    text = render(results, info, [sys.argv[0], *(argv or sys.argv[1:])], disagreements)
    payload = {"machine": info, "sizes": sizes, "results": results}
    H.write_results(f"scaling{suffix}", payload, text, args.out)
    checkpoint.unlink(missing_ok=True)
    if not args.quick and not args.no_readme:
        H.update_readme("bench_scaling", text)
    if not args.quick:
        for path in draw(results, args.img):
            print(path)
    print(text)
    if disagreements:
        print("\n".join(disagreements), file=sys.stderr)
        return 1
    return 0


def check(results: list[dict[str, Any]]) -> list[str]:
    """Every engine must find the same groups and total for the same input."""
    seen: dict[tuple[int, int], tuple[float, float, str]] = {}
    problems = []
    for r in results:
        c, s = r["case"], r["summary"]
        if "groups" not in s:
            continue
        key = (c["rows"], c["groups"])
        got = (s["groups"][0], s["total"][0], c["engine"])
        if got[0] != c["groups"]:
            problems.append(f"{label(c)}: {got[0]:,} groups, expected {c['groups']:,}")
        if key in seen:
            want = seen[key]
            if want[0] != got[0] or abs(want[1] - got[1]) > 1e-9 * max(1.0, abs(want[1])):
                problems.append(f"{label(c)}: {got[:2]} but {want[2]} found {want[:2]}")
        else:
            seen[key] = got
    return problems


def render(
    results: list[dict[str, Any]], info: dict[str, Any], command: list[str], problems: list[str]
) -> str:
    headers = ["curve", "engine", "threads", "rows", "groups", "memory limit",
               "time s, median (min–max)", "M rows/s", "ns/row", "peak RSS above baseline",
               "spills"]  # fmt: skip
    rows = []
    for r in results:
        c, s = r["case"], r["summary"]
        head = [c["curve"], c["engine"], str(c["threads"]), f"{c['rows']:,}", f"{c['groups']:,}",
                H.format_bytes(c["budget"]) if c["budget"] else "none"]  # fmt: skip
        if "error" in s:
            rows.append([*head, f"failed: {s['error'][:120]}", "", "", "", ""])
            continue
        peak = s["peak_above_baseline"][0]
        ratio = f" ({peak / c['budget']:.2f}× limit)" if c["budget"] else ""
        rows.append([*head, H.format_range(s["seconds"]), f"{s['rows_per_s'][0] / 1e6:.1f}",
                     f"{1e9 * s['seconds'][0] / c['rows']:.0f}", H.format_bytes(peak) + ratio,
                     str(int(s["spills"][0])) if "spills" in s else ""])  # fmt: skip
    load = ", ".join(f"{x:.1f}" for x in info["load_average"])
    load_end = ", ".join(f"{x:.1f}" for x in info.get("load_average_end", []))
    lines = [
        f"Measured {info['time']} with `{' '.join(command)}` in {info.get('wall_s', 0) / 60:.0f} "
        f"min: {info['cpus']} cores, Python {info['python']}, numba {info.get('numba')}, "
        f"duckdb {info.get('duckdb')}, polars {info.get('polars')}; load average at start "
        f"{load}, at end {load_end}. Each point: fresh processes, median of the timed runs.",
        "",
        H.markdown_table(headers, rows),
    ]
    if problems:
        lines += ["", "**Disagreements:**", *(f"- {p}" for p in problems)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- plots


def _series(results: list[dict[str, Any]], curve: str) -> dict[str, list[tuple[Any, ...]]]:
    out: dict[str, list[tuple[Any, ...]]] = {}
    for r in results:
        c, s = r["case"], r["summary"]
        if c["curve"] != curve or "seconds" not in s:
            continue
        name = f"{c['engine']} {c['threads']}t"
        out.setdefault(name, []).append((c, s))
    return out


def draw(results: list[dict[str, Any]], img_dir: Path) -> list[Path]:
    """``scaling-rows.png``, ``scaling-groups.png``, ``scaling-budget.png``, ``scaling-threads.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullLocator

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    img_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        path = img_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    for curve, field, xlabel in (("rows", "rows", "input rows"), ("groups", "groups", "groups")):
        series = _series(results, curve)
        if not series:
            continue
        fig, (ax_t, ax_n) = plt.subplots(1, 2, figsize=(11, 4))
        for name, points in sorted(series.items()):
            points.sort(key=lambda p: p[0][field])
            xs = [p[0][field] for p in points]
            ax_t.plot(xs, [p[1]["seconds"][0] for p in points], marker="o", label=name)
            ax_n.plot(xs, [1e9 * p[1]["seconds"][0] / p[0]["rows"] for p in points], marker="o",
                      label=name)  # fmt: skip
        for ax, ylabel in ((ax_t, "seconds"), (ax_n, "ns per input row")):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.25)
        ax_t.legend(fontsize=8)
        title = "rows / 10 groups" if curve == "rows" else "20 M rows (50 M for 50 M groups)"
        fig.suptitle(f"SUM, COUNT GROUP BY int64 key, no limit: time vs {xlabel} ({title})")
        save(fig, f"scaling-{curve}.png")

    series = _series(results, "budget")
    if series:
        fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(11, 4))
        limits = sorted({c["budget"] for pts in series.values() for c, _ in pts if c["budget"]})
        top = 2 * max(limits) if limits else 1
        for name, points in sorted(series.items()):
            points.sort(key=lambda p: p[0]["budget"] or top)
            xs = [(p[0]["budget"] or top) / H.MIB for p in points]
            ax_t.plot(xs, [p[1]["seconds"][0] for p in points], marker="o", label=name)
            ax_r.plot(xs, [p[1]["peak_above_baseline"][0] / H.MIB for p in points], marker="o",
                      label=name)  # fmt: skip
        if limits:
            ms = [b / H.MIB for b in limits]
            ax_r.plot(ms, [1.25 * m for m in ms], "k--", lw=1, label="1.25 × limit")
        ticks = [b / H.MIB for b in limits] + [top / H.MIB]
        labels = [f"{t:.0f}" for t in ticks[:-1]] + ["no limit"]
        for ax, ylabel in ((ax_t, "seconds"), (ax_r, "peak RSS above baseline, MiB")):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(ticks, labels, fontsize=8)  # the limits only: no overlapping minor labels
            ax.xaxis.set_minor_locator(NullLocator())
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
            ax.tick_params(axis="y", which="minor", labelsize=7)
            ax.set_xlabel("memory limit, MiB")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.25)
        ax_r.legend(fontsize=8)
        fig.suptitle("20 M rows, 10 M int64 groups: time and peak RSS vs the memory limit")
        save(fig, "scaling-budget.png")

    series = _series(results, "threads")
    if series:
        fig, ax = plt.subplots(figsize=(6, 4))
        by_engine: dict[tuple[str, int], dict[int, float]] = {}
        for points in series.values():
            for c, s in points:
                by_engine.setdefault((c["engine"], c["groups"]), {})[c["threads"]] = s["seconds"][0]
        for (engine, groups), times in sorted(by_engine.items()):
            if 1 not in times:
                continue
            ts = sorted(times)
            ax.plot(ts, [times[1] / times[t] for t in ts], marker="o",
                    label=f"{engine}, {groups:,} groups")  # fmt: skip
        most = max((t for times in by_engine.values() for t in times), default=1)
        ax.plot([1, most], [1, most], "k:", lw=1, label="linear")
        ax.set_xlabel("threads")
        ax.set_ylabel("speed-up over 1 thread")
        ax.grid(True, alpha=0.25)
        ax.legend(fontsize=8)
        ax.set_title("20 M rows, int64 keys, no limit: speed-up vs threads")
        save(fig, "scaling-threads.png")
    return written


if __name__ == "__main__":
    sys.exit(main())

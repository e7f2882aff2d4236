"""File to result: ``extagg.aggregate_files`` vs DuckDB vs Polars (streaming) on TPC-H lineitem.

Inputs: ``lineitem`` at scale factor 1 (``--sf 10`` too, optional) from ``tpchgen-cli``, as one
Parquet file and one CSV file, cached in ``$EXTAGG_BENCH_DATA`` (else ``benchmarks/data/``):
``tpch-sf10/lineitem.parquet`` is ~2.5 GB, the CSV ~7.5 GB (``--formats parquet`` skips it).
Queries:

- ``q1``: TPC-H Q1's grouping and sums/means (without its computed columns):
  ``GROUP BY l_returnflag, l_linestatus WHERE l_shipdate <= date '1998-09-02'``;
- ``q1full``: TPC-H Q1 as written, its ``sum(l_extendedprice * (1 - l_discount))`` and
  ``sum(l_extendedprice * (1 - l_discount) * (1 + l_tax))`` too;
- ``q6``: TPC-H Q6, a global ``sum(l_extendedprice * l_discount)`` under a selective filter
  (a year of ship dates, a discount range, ``l_quantity < 24``: 2 % of the rows kept);
- ``orderkey``: ``GROUP BY l_orderkey`` (1.5 M groups per SF) with count and ``sum(l_quantity)``;
- ``partsupp``: ``GROUP BY l_partkey, l_suppkey`` with ``count_distinct(l_orderkey)``.

Each at no limit and at 1/8 of the peak memory extagg's own no-limit run was granted (DuckDB's
``memory_limit`` gets the same; Polars has no such knob and runs its streaming engine). Every
run is a fresh process, the engines' runs of a case interleaved (``_harness.run_cases_interleaved``;
``--sequential``: one engine's runs after the other's): the child imports its engine (timed
on its own: "engine import"; extagg's whole engine, numba included, as ``import duckdb`` loads
DuckDB's), resets the peak-RSS counter, runs the query from the file to the last result batch,
and reports the time,
the peak RSS above that baseline and the process's whole-life peak, and a checksum of the answer
(group count, column sums) that the parent compares with DuckDB's to 1e-9 relative. extagg's
child is set up as ``extagg aggregate`` sets up its process (Arrow on jemalloc, no pandas, the
C heap keeping freed memory for reuse); its time includes loading its compiled kernels; under a
limit its row also shows the "data" part of its RSS: the peak above the run's fixed RSS
(imports and the query's kernels), against the limit. Threads: ``--threads`` (default 1) for all three (extagg's ``threads=``, DuckDB
``threads``, ``POLARS_MAX_THREADS``; Arrow's CPU and I/O pools). Usage::

    python benchmarks/bench_files.py [--sf 1] [--sf10] [--threads 2] [--runs 3] [--quick]
        [--formats parquet] [--no-readme]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    DATA_DIR,
    MIB,
    add_common_arguments,
    answer_checksum,
    checkpoint_file,
    current_rss,
    format_bytes,
    format_range,
    machine_info,
    markdown_table,
    peak_rss,
    reset_peak_rss,
    run_case,
    run_cases_interleaved,
    run_guarded,
    same_answer,
    setup_engine_process,
    update_readme,
    write_results,
)

SCRIPT = str(Path(__file__).resolve())
CUTOFF = "1998-09-02"
QUERIES: dict[str, dict[str, Any]] = {
    "q1": {
        "by": ["l_returnflag", "l_linestatus"],
        "aggs": {
            "sum_qty": ("l_quantity", "sum"), "sum_base_price": ("l_extendedprice", "sum"),
            "avg_qty": ("l_quantity", "mean"), "avg_price": ("l_extendedprice", "mean"),
            "avg_disc": ("l_discount", "mean"), "count_order": ("*", "count"),
        },
        "where": f"l_shipdate <= date '{CUTOFF}'",
    },
    "q1full": {  # TPC-H Q1 as written: its computed sums too
        "by": ["l_returnflag", "l_linestatus"],
        "aggs": {
            "sum_qty": ("l_quantity", "sum"), "sum_base_price": ("l_extendedprice", "sum"),
            "sum_disc_price": ("l_extendedprice * (1 - l_discount)", "sum"),
            "sum_charge": ("l_extendedprice * (1 - l_discount) * (1 + l_tax)", "sum"),
            "avg_qty": ("l_quantity", "mean"), "avg_price": ("l_extendedprice", "mean"),
            "avg_disc": ("l_discount", "mean"), "count_order": ("*", "count"),
        },
        "where": "l_shipdate <= date '1998-12-01' - interval '90 days'",
    },
    "q6": {  # TPC-H Q6: no key, a selective filter on decimals and dates
        "by": [],
        "aggs": {"revenue": ("l_extendedprice * l_discount", "sum")},
        "where": "l_shipdate >= date '1994-01-01' and l_shipdate < date '1995-01-01' "
                 "and l_discount between 0.05 and 0.07 and l_quantity < 24",
    },
    "orderkey": {
        "by": ["l_orderkey"],
        "aggs": {"n": ("*", "count"), "qty": ("l_quantity", "sum")},
        "where": None,
    },
    "partsupp": {
        "by": ["l_partkey", "l_suppkey"],
        "aggs": {"orders": ("l_orderkey", "count_distinct")},
        "where": None,
    },
}  # fmt: skip
#: each query's ``where`` as a Polars expression (``pl`` given)
POLARS_FILTERS: dict[str, Any] = {
    "q1": lambda pl: pl.col("l_shipdate") <= pl.date(1998, 9, 2),
    "q1full": lambda pl: pl.col("l_shipdate") <= pl.date(1998, 9, 2),
    "q6": lambda pl: (
        (pl.col("l_shipdate") >= pl.date(1994, 1, 1))
        & (pl.col("l_shipdate") < pl.date(1995, 1, 1))
        & pl.col("l_discount").is_between(0.05, 0.07)
        & (pl.col("l_quantity") < 24)
    ),
}
SQL_FUNC = {"sum": "sum({})", "mean": "avg({})", "count": "count(*)",
            "count_distinct": "count(DISTINCT {})"}  # fmt: skip


# ---------------------------------------------------------------------------- data


def dataset(sf: float, fmt: str, quick: bool) -> Path:
    """lineitem at scale ``sf`` as one ``fmt`` file (generated once with tpchgen-cli)."""
    name = f"tpch-sf{sf:g}"
    out = DATA_DIR / name / f"lineitem.{fmt}"
    if out.exists():
        return out
    exe = shutil.which("tpchgen-cli") or str(Path(sys.executable).parent / "tpchgen-cli")
    tmp = Path(tempfile.mkdtemp(dir=DATA_DIR.parent if DATA_DIR.parent.exists() else None))
    try:
        cmd = [exe, fmt, "-s", f"{sf:g}", "--tables", "lineitem", "--output-dir", str(tmp)]
        print(f"generating {out} ...", flush=True)
        subprocess.run(cmd, check=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / f"lineitem.{fmt}", out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------- child


def child(case: dict[str, Any]) -> dict[str, Any]:
    q = QUERIES[case["query"]]
    path, fmt, engine, memory = case["path"], case["format"], case["engine"], case["memory"]
    setup_engine_process(engine, case["threads"])
    imported = time.perf_counter()
    if engine == "extagg":
        # the engine whole, as `import duckdb` / `import polars` load theirs: `import extagg`
        # alone is lazy, and numba's import (~0.35 s) then fell inside the timed run
        import extagg
        import extagg.columnar
        import extagg.io.run

        def run() -> tuple[Any, dict[str, Any]]:
            reader = extagg.aggregate_files(
                path, by=q["by"], aggs=q["aggs"], where=q["where"], memory=memory,
                threads=case["threads"],
            )  # fmt: skip
            answer = answer_checksum(reader)
            m = extagg.run_metrics(reader)
            return answer, {"spills": m.spill_count, "peak_granted": m.peak_granted_bytes,
                           "disk_spilled": m.disk_bytes_spilled,
                           "above_fixed": max(0, m.peak_rss_bytes - m.rss_fixed_bytes),
                           "budget": m.budget_bytes}  # fmt: skip
    elif engine == "duckdb":
        import duckdb

        con = duckdb.connect()
        con.execute(f"SET threads={case['threads']}")
        con.execute(f"SET temp_directory='{tempfile.gettempdir()}/extagg-bench-duckdb'")
        if memory:
            con.execute(f"SET memory_limit='{memory // MIB}MiB'")
        src = f"read_parquet('{path}')" if fmt == "parquet" else f"read_csv('{path}')"
        cols = [SQL_FUNC[f].format(c) + f" AS {n}" for n, (c, f) in q["aggs"].items()]
        where = "" if not q["where"] else f" WHERE {q['where']}"
        keys = ", ".join(q["by"])
        if keys:
            sql = f"SELECT {keys}, {', '.join(cols)} FROM {src}{where} GROUP BY {keys}"
        else:  # a global aggregate
            sql = f"SELECT {', '.join(cols)} FROM {src}{where}"

        def run() -> tuple[Any, dict[str, Any]]:
            res = con.execute(sql)
            table = res.to_arrow_table() if hasattr(res, "to_arrow_table") else res.arrow()
            return table, {}
    else:
        import polars as pl

        def run() -> tuple[Any, dict[str, Any]]:
            lf = (
                pl.scan_parquet(path)
                if fmt == "parquet"
                else pl.scan_csv(path, try_parse_dates=True)
            )
            if q["where"]:
                lf = lf.filter(POLARS_FILTERS[case["query"]](pl))
            exprs = []
            for n, (c, f) in q["aggs"].items():
                if c == "*":  # count(*)
                    exprs.append(pl.len().alias(n))
                    continue
                col = pl.col(c) if c.isidentifier() else pl.sql_expr(c)  # q1full's products
                e = {"sum": col.sum, "mean": col.mean, "count": col.count,
                     "count_distinct": col.n_unique}[f]()  # fmt: skip
                exprs.append(e.alias(n))
            grouped = lf.group_by(q["by"]).agg(exprs) if q["by"] else lf.select(exprs)
            out = grouped.collect(engine="streaming")
            return out.to_arrow(), {}

    import_seconds = time.perf_counter() - imported
    reset_peak_rss()
    baseline = current_rss()
    cpu_start = os.times()
    started = time.perf_counter()
    table, extra = run()
    seconds = time.perf_counter() - started
    cpu_end = os.times()
    return {
        "seconds": seconds,
        # the engine's import, before the timed run (the process's start-up beside it)
        "import_seconds": import_seconds,
        # user + system CPU of the child (all its threads) over the same span: on a shared
        # machine this says more than the wall time
        "cpu_seconds": (cpu_end.user - cpu_start.user) + (cpu_end.system - cpu_start.system),
        "peak_above_baseline": max(0, peak_rss() - baseline),
        "baseline_rss": baseline,
        **(table if isinstance(table, dict) else answer_checksum(table.to_batches())),
        **extra,
    }


# ---------------------------------------------------------------------------- parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    parser.add_argument("--sf10", action="store_true", help="also run scale factor 10")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--formats", nargs="+", default=["parquet", "csv"])
    parser.add_argument("--queries", nargs="+", default=list(QUERIES))
    parser.add_argument("--engines", nargs="+", default=["extagg", "duckdb", "polars"])
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument(
        "--memory", nargs="*", default=[], metavar="SIZE",
        help="more limits to run every query at besides none and 1/8 (e.g. 85m: a fixed "
        "budget, comparable across versions whose no-limit run holds different amounts)",
    )  # fmt: skip
    parser.add_argument(
        "--sequential", action="store_true",
        help="run each engine's runs one after the other (checkpointed: --resume works); "
        "by default the engines' runs are interleaved",
    )  # fmt: skip
    args = parser.parse_args()
    if args.child:
        run_guarded(lambda: child(json.loads(args.child)))
        return
    quick = args.quick
    runs = args.runs or (1 if quick else 3)
    warmup = args.warmup if args.warmup is not None else (0 if quick else 1)
    sfs = [0.01] if quick else [args.sf, *([10.0] if args.sf10 else [])]
    name = "files-quick" if quick else "files"
    checkpoint = checkpoint_file(args, name)
    info = machine_info()
    load_start = os.getloadavg()
    results = []
    rows = []
    for sf in sfs:
        for fmt in args.formats:
            path = dataset(sf, fmt, quick)
            for query in args.queries:
                limits: list[tuple[str, int | None]] = [("none", None)]
                base_case = {"query": query, "format": fmt, "path": str(path), "sf": sf,
                             "threads": args.threads}  # fmt: skip
                per_limit: dict[str, dict[str, Any]] = {}
                for label in ["none", "1/8", *args.memory]:
                    if label == "1/8":
                        granted = per_limit.get("none", {}).get("extagg", {}).get("peak_granted")
                        if not granted:
                            continue
                        limits.append(("1/8", max(8 * MIB, int(granted[0]) // 8)))
                    elif label != "none":
                        from extagg._config import parse_size

                        limits.append((label, parse_size(label, name="--memory")))
                    memory = dict(limits)[label]
                    # polars: no memory limit to give it
                    engines = [e for e in args.engines if e != "polars" or label == "none"]
                    cases = [{**base_case, "engine": e, "memory": memory} for e in engines]
                    print(f"sf{sf:g} {fmt} {query} limit={label}: {', '.join(engines)}"
                          + (" (runs interleaved)" if not args.sequential else ""), flush=True)  # fmt: skip
                    if not args.sequential:
                        done = run_cases_interleaved(SCRIPT, cases, runs=runs, warmup=warmup,
                                                     timeout=args.timeout, log=print)  # fmt: skip
                    else:
                        done = [run_case(SCRIPT, case, runs=runs, warmup=warmup,
                                         timeout=args.timeout, log=print, checkpoint=checkpoint)
                                for case in cases]  # fmt: skip
                    for engine, res in zip(engines, done, strict=True):
                        results.append(res)
                        per_limit.setdefault(label, {})[engine] = res["summary"]
                        if "cpu_seconds" in res["summary"]:
                            print(f"  {engine}: {res['summary']['seconds'][0]:.2f} s wall, "
                                  f"{res['summary']['cpu_seconds'][0]:.2f} s CPU", flush=True)  # fmt: skip
                    duck = per_limit.get(label, {}).get("duckdb")
                    for engine, summ in per_limit.get(label, {}).items():
                        if "error" in summ:
                            rows.append([f"{sf:g}", fmt, query, label, engine, summ["error"][:60],
                                         "", "", "", "", "", "", ""])  # fmt: skip
                            continue
                        same = "—" if duck is None or "error" in duck or engine == "duckdb" else (
                            "yes" if same_answer(summ, duck) else "**no**"
                        )  # fmt: skip
                        ratio = (
                            f"{summ['seconds'][0] / duck['seconds'][0]:.2f}×"
                            if duck and "error" not in duck else ""
                        )  # fmt: skip
                        imports = summ.get("import_seconds", [0.0])[0]
                        with_import = (
                            f"{(summ['seconds'][0] + imports) / (duck['seconds'][0] + duck.get('import_seconds', [0.0])[0]):.2f}×"
                            if duck and "error" not in duck else ""
                        )  # fmt: skip
                        data = ""
                        if engine == "extagg" and memory and "above_fixed" in summ:
                            data = (f" (data {format_bytes(summ['above_fixed'][0])}, "
                                    f"{summ['above_fixed'][0] / memory:.2f}× limit)")  # fmt: skip
                        rows.append([
                            f"{sf:g}", fmt, query,
                            label if memory is None else f"{label} ({format_bytes(memory)})",
                            engine, format_range(summ["seconds"], unit=" s"), ratio,
                            f"{imports:.2f} s", with_import,
                            format_bytes(summ["peak_above_baseline"][0]) + data,
                            format_bytes(summ["process_peak_rss"][0]),
                            str(summ.get("spills", ["—"])[0] if isinstance(summ.get("spills"), list) else "—"),
                            same,
                        ])  # fmt: skip
    headers = ["SF", "format", "query", "limit", "engine", "time (median, min–max)", "vs DuckDB",
               "engine import", "vs DuckDB with imports", "peak RSS above baseline", "process peak RSS", "spills", "same answer as DuckDB"]  # fmt: skip
    load_end = os.getloadavg()
    text = (
        f"Measured with {args.threads} thread(s) per engine; {runs} timed (+{warmup} warm-up) per case, fresh "
        f"process each. Load average at start {load_start[0]:.1f}, at end {load_end[0]:.1f}"
        + (
            " (2 cores, shared with other work: absolute times are noisy).\n\n"
            if max(load_start[0], load_end[0]) > 1.5
            else " (a quiet machine).\n\n"
        )
        + markdown_table(headers, rows)
    )
    print(text)
    payload = {"machine": info, "results": results, "load": [load_start, load_end]}
    write_results(name, payload, text, args.out)
    if not quick and not args.no_readme:
        update_readme("bench_files", text)
    checkpoint.unlink(missing_ok=True)


if __name__ == "__main__":
    main()

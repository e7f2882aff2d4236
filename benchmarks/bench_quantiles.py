"""Exact quantiles per group from a Parquet file: ``extagg aggregate`` vs DuckDB vs Polars.

Input: ``quantiles-N.parquet``, generated once (seeded, a row group at a time) into
``$EXTAGG_BENCH_DATA`` (else ``benchmarks/data/``): ``--rows`` rows (10 M by default; ``--quick``
50 K) of ``k`` (int64, 100 K groups; 500 with ``--quick``), ``v`` (float64, normal) and ``i``
(int64, 0-999). Queries:

- ``median``: ``GROUP BY k`` with ``median(v)``;
- ``quantiles``: ``GROUP BY k`` with ``quantile_cont(v, 0.9)``, ``quantile_disc(i, 0.5)`` and
  ``count(*)``.

Each engine runs with no limit and at each ``--limits`` (extagg's ``memory=``, DuckDB's
``memory_limit``; Polars has none and runs once). A quantile has no fixed-size state: DuckDB
holds every group's values in memory (and fails where they do not fit), extagg sorts them
beside the group-by, on disk when they do not fit (docs/columnar.md, "Quantiles").

Every run is a fresh process, the engines' runs interleaved; the child imports its engine
(timed on its own), then runs the query from the file to the last result batch and reports
the time, the peak RSS above that baseline and the process's, and a checksum of the answer
(group count, column sums) that the parent compares with DuckDB's (with no limit). One
thread each by default (``--threads``). Usage::

    python benchmarks/bench_quantiles.py [--rows 10000000] [--limits 256m 64m] [--threads 1]
        [--runs 3] [--quick] [--no-readme]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    DATA_DIR,
    add_common_arguments,
    answer_checksum,
    format_bytes,
    format_range,
    machine_info,
    markdown_table,
    measured_run,
    run_cases_interleaved,
    run_guarded,
    same_answer,
    setup_engine_process,
    update_readme,
    write_results,
)

SCRIPT = str(Path(__file__).resolve())
QUERIES: dict[str, dict[str, str]] = {
    "median": {"m": "median(v)"},
    "quantiles": {"p90": "quantile_cont(v, 0.9)", "mid": "quantile_disc(i, 0.5)", "n": "count(*)"},
}


def dataset(rows: int, groups: int) -> Path:
    """``rows`` seeded rows as one Parquet file (written once, a row group at a time)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = DATA_DIR / f"quantiles-{rows}.parquet"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261129)
    tmp = out.with_suffix(".tmp")
    schema = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("i", pa.int64())])
    with pq.ParquetWriter(tmp, schema) as writer:
        for start in range(0, rows, 1 << 20):
            n = min(rows, start + (1 << 20)) - start
            writer.write_table(pa.table({
                "k": rng.integers(0, groups, n), "v": rng.normal(0, 1, n),
                "i": rng.integers(0, 1000, n),
            }, schema=schema))  # fmt: skip
    os.replace(tmp, out)
    return out


def child(case: dict[str, Any]) -> dict[str, Any]:
    aggs, path, engine = QUERIES[case["query"]], case["path"], case["engine"]
    threads, limit = case["threads"], case["limit"]
    setup_engine_process(engine, threads)
    imported = time.perf_counter()
    if engine == "extagg":
        import extagg
        import extagg.columnar
        import extagg.io.run

        def run() -> dict[str, Any]:
            texts = [f"{name}={text}" for name, text in aggs.items()]
            reader = extagg.aggregate_files(
                path, by=["k"], aggs=texts, memory=limit or "16g", threads=threads
            )
            return answer_checksum(reader)
    elif engine == "duckdb":
        import tempfile

        import duckdb

        config = {"threads": threads, "preserve_insertion_order": False,
                  "temp_directory": tempfile.mkdtemp(prefix="duckdb-")}  # fmt: skip
        if limit:
            config["memory_limit"] = limit.upper().replace("M", "MB").replace("G", "GB")
        con = duckdb.connect(config=config)
        cols = ", ".join(f"{text} AS {name}" for name, text in aggs.items())
        sql = f"SELECT k, {cols} FROM read_parquet('{path}') GROUP BY k"

        def run() -> dict[str, Any]:
            res = con.execute(sql)
            table = res.to_arrow_table() if hasattr(res, "to_arrow_table") else res.arrow()
            return answer_checksum(table.to_batches())
    else:
        import polars as pl

        def run() -> dict[str, Any]:
            if case["query"] == "median":
                exprs = [pl.col("v").median().alias("m")]
            else:
                exprs = [
                    pl.col("v").quantile(0.9, interpolation="linear").alias("p90"),
                    pl.col("i").quantile(0.5, interpolation="lower").alias("mid"),
                    pl.len().alias("n"),
                ]  # "lower" at 0.5: v[floor((n - 1) / 2)] = v[ceil(n / 2) - 1], DuckDB's
            out = pl.scan_parquet(path).group_by("k").agg(exprs)
            table = out.collect(engine="streaming").to_arrow()
            return answer_checksum(table.to_batches())

    return measured_run(run, imported)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--limits", nargs="*", default=["256m", "64m"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--queries", nargs="+", default=list(QUERIES))
    parser.add_argument("--engines", nargs="+", default=["extagg", "duckdb", "polars"])
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    if args.child:
        run_guarded(lambda: child(json.loads(args.child)))
        return
    runs = args.runs or (1 if args.quick else 3)
    warmup = args.warmup if args.warmup is not None else (0 if args.quick else 1)
    rows, groups = (50_000, 500) if args.quick else (args.rows, 100_000)
    path = dataset(rows, groups)
    info, load_start = machine_info(), os.getloadavg()
    results, table_rows = [], []
    for query in args.queries:
        for limit in [None, *args.limits]:
            engines = [e for e in args.engines if limit is None or e != "polars"]
            cases = [{"query": query, "path": str(path), "engine": e, "threads": args.threads,
                      "limit": limit} for e in engines]  # fmt: skip
            label = limit or "none"
            print(f"{path.name} {query} at {label}: {', '.join(engines)}", flush=True)
            done = run_cases_interleaved(SCRIPT, cases, runs=runs, warmup=warmup,
                                         timeout=args.timeout, log=print)  # fmt: skip
            results.extend(done)
            summaries = {e: res["summary"] for e, res in zip(engines, done, strict=True)}
            if limit is None:
                reference = summaries.get("duckdb")
            duck = summaries.get("duckdb")
            for engine, summ in summaries.items():
                if "error" in summ:
                    table_rows.append([query, label, engine, summ["error"][:70], "", "", "", ""])
                    continue
                timed = duck is not None and "error" not in duck
                checked = reference is not None and "error" not in reference
                table_rows.append([
                    query, label, engine, format_range(summ["seconds"], unit=" s"),
                    f"{summ['seconds'][0] / duck['seconds'][0]:.2f}×" if timed else "",
                    format_bytes(summ["peak_above_baseline"][0]),
                    format_bytes(summ["process_peak_rss"][0]),
                    "—" if not checked or (engine == "duckdb" and limit is None)
                    else ("yes" if same_answer(summ, reference) else "**no**"),
                ])  # fmt: skip
    headers = ["query", "memory limit", "engine", "time (median, min–max)", "vs DuckDB",
               "peak RSS above baseline", "process peak RSS", "same answer as DuckDB"]  # fmt: skip
    load_end = os.getloadavg()
    text = (
        f"Measured on {path.name} ({rows:,} rows, {groups:,} groups) with {args.threads} "
        f"thread(s) per engine; {runs} timed (+{warmup} warm-up) per case, fresh process each. "
        f"Load average at start {load_start[0]:.1f}, at end {load_end[0]:.1f}.\n\n"
        + markdown_table(headers, table_rows)
    )
    print(text)
    name = "quantiles-quick" if args.quick else "quantiles"
    write_results(name, {"machine": info, "results": results}, text, args.out)
    if not args.quick and not args.no_readme:
        update_readme("bench_quantiles", text)


if __name__ == "__main__":
    main()

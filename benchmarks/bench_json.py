"""A log of nested JSON objects to a result: ``extagg aggregate`` vs DuckDB vs Polars (streaming).

Input: ``events.jsonl``, generated once (seeded, written a chunk at a time) into
``$EXTAGG_BENCH_DATA`` (else ``benchmarks/data/``): ``--lines`` lines (2 M by default, ~230 MB;
``--quick`` 20 K) of ``{"ts": unix seconds, "kind": "click" | "view" | "buy", "payload":
{"user": {"id": ...}, "geo": {"country": ...}, "amount": ...}, "tags": [0-3 of 6 words]}`` —
the shape of a product's event log. Queries (keys and arguments are fields inside the objects,
a time bucket computed from the Unix time, a row per element of a list):

- ``country``: ``GROUP BY payload.geo.country`` with ``count(*)``;
- ``hourly``: ``GROUP BY payload.geo.country, date_trunc('hour', to_timestamp(ts))`` with
  ``count(*)``, ``count(DISTINCT payload.user.id)`` and ``sum(payload.amount)``, ``WHERE kind =
  'buy'``;
- ``tags``: ``GROUP BY unnest(tags)`` with ``count(*)`` and ``count(DISTINCT payload.user.id)``
  (Polars: ``explode``, the nulls of empty lists left out).

Every run is a fresh process, the engines' runs interleaved; the child imports its engine
(timed on its own), then runs the query from the file to the last result batch and reports
the time, the peak RSS above that baseline and the process's peak, and a checksum of the
answer (group count, column sums) that the parent compares with DuckDB's. extagg runs in a
process set up as ``extagg aggregate`` sets up its own (Arrow on jemalloc, no pandas). One
thread each by default (``--threads``: extagg's ``threads=``, DuckDB's ``threads``,
``POLARS_MAX_THREADS``, and Arrow's CPU and I/O pools, which parse the JSON). Usage::

    python benchmarks/bench_json.py [--lines 2000000] [--threads 1] [--runs 3] [--quick]
        [--no-readme]
"""

from __future__ import annotations

import argparse
import json
import os
import random
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
QUERIES: dict[str, dict[str, Any]] = {
    "country": {
        "by": ["payload.geo.country"],
        "aggs": {"n": "count(*)"},
        "where": None,
    },
    "hourly": {
        "by": ["payload.geo.country", "date_trunc('hour', to_timestamp(ts)) AS h"],
        "aggs": {
            "n": "count(*)",
            "users": "count(DISTINCT payload.user.id)",
            "amount": "sum(payload.amount)",
        },
        "where": "kind = 'buy'",
    },
    "tags": {
        "by": ["unnest(tags) AS tag"],
        "aggs": {"n": "count(*)", "users": "count(DISTINCT payload.user.id)"},
        "where": None,
        "duckdb_group_by": "tag",  # DuckDB: "Cannot group on an UNNEST" with GROUP BY ALL
    },
}
#: the words of the events' ``tags`` lists
TAGS = ("new", "promo", "mobile", "retry", "vip", "beta")


def dataset(lines: int) -> Path:
    """``lines`` seeded events as one JSON Lines file (written once, a chunk at a time)."""
    out = DATA_DIR / f"events-tags-{lines}.jsonl"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(20261129)
    tag_rng = random.Random(20261130)  # its own: the other fields as in the log without tags
    tmp = out.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for start in range(0, lines, 100_000):
            chunk = []
            for i in range(start, min(lines, start + 100_000)):
                event = {
                    "ts": 1_700_000_000 + i,
                    "kind": rng.choice(("click", "view", "buy")),
                    "payload": {
                        "user": {"id": rng.randrange(max(1, lines // 10))},
                        "geo": {"country": rng.choice(("de", "fr", "us", "jp", "br"))},
                        "amount": round(rng.random() * 100, 2),
                    },
                    "tags": tag_rng.sample(TAGS, tag_rng.randrange(4)),
                }
                chunk.append(json.dumps(event))
            f.write("\n".join(chunk) + "\n")
    os.replace(tmp, out)
    return out


def child(case: dict[str, Any]) -> dict[str, Any]:
    q, path, engine, threads = QUERIES[case["query"]], case["path"], case["engine"], case["threads"]
    setup_engine_process(engine, threads)
    imported = time.perf_counter()
    if engine == "extagg":
        import extagg
        import extagg.columnar
        import extagg.io.run

        def run() -> dict[str, Any]:
            aggs = [f"{name}={text}" for name, text in q["aggs"].items()]
            reader = extagg.aggregate_files(
                path, by=q["by"], aggs=aggs, where=q["where"], threads=threads
            )
            return answer_checksum(reader)
    elif engine == "duckdb":
        import duckdb

        con = duckdb.connect()
        con.execute(f"SET threads={threads}")
        keys = q["by"]
        cols = [f"{text} AS {name}" for name, text in q["aggs"].items()]
        where = f" WHERE {q['where']}" if q["where"] else ""
        sql = (f"SELECT {', '.join(keys)}, {', '.join(cols)} FROM read_json('{path}'){where} "
               f"GROUP BY {q.get('duckdb_group_by', 'ALL')}")  # fmt: skip

        def run() -> dict[str, Any]:
            res = con.execute(sql)
            table = res.to_arrow_table() if hasattr(res, "to_arrow_table") else res.arrow()
            return answer_checksum(table.to_batches())
    else:
        import polars as pl

        def run() -> dict[str, Any]:
            payload = pl.col("payload")
            country = payload.struct.field("geo").struct.field("country").alias("country")
            lf = pl.scan_ndjson(path)
            user = payload.struct.field("user").struct.field("id")
            if case["query"] == "country":
                out = lf.group_by(country).agg(pl.len().alias("n"))
            elif case["query"] == "tags":  # explode makes a null of an empty list: left out
                out = (
                    lf.select("tags", user.alias("user")).explode("tags")
                    .filter(pl.col("tags").is_not_null())
                    .group_by(pl.col("tags").alias("tag"))
                    .agg(pl.len().alias("n"), pl.col("user").n_unique().alias("users"))
                )  # fmt: skip
            else:
                hour = pl.from_epoch("ts").dt.truncate("1h").alias("h")
                out = (
                    lf.filter(pl.col("kind") == "buy")
                    .group_by(country, hour)
                    .agg(pl.len().alias("n"),
                         user.n_unique().alias("users"),
                         payload.struct.field("amount").sum().alias("amount"))
                )  # fmt: skip
            table = out.collect(engine="streaming").to_arrow()
            return answer_checksum(table.to_batches())

    return measured_run(run, imported)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--lines", type=int, default=2_000_000)
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
    path = dataset(20_000 if args.quick else args.lines)
    info, load_start = machine_info(), os.getloadavg()
    results, rows = [], []
    for query in args.queries:
        cases = [{"query": query, "path": str(path), "engine": e, "threads": args.threads}
                 for e in args.engines]  # fmt: skip
        print(f"{path.name} {query}: {', '.join(args.engines)} (runs interleaved)", flush=True)
        done = run_cases_interleaved(SCRIPT, cases, runs=runs, warmup=warmup,
                                     timeout=args.timeout, log=print)  # fmt: skip
        summaries = {e: res["summary"] for e, res in zip(args.engines, done, strict=True)}
        results.extend(done)
        duck = summaries.get("duckdb")
        for engine, summ in summaries.items():
            if "error" in summ:
                rows.append([query, engine, summ["error"][:60], "", "", "", "", ""])
                continue
            ok = duck is not None and "error" not in duck
            rows.append([
                query, engine, format_range(summ["seconds"], unit=" s"),
                f"{summ['seconds'][0] / duck['seconds'][0]:.2f}×" if ok else "",
                f"{summ['import_seconds'][0]:.2f} s",
                format_bytes(summ["peak_above_baseline"][0]),
                format_bytes(summ["process_peak_rss"][0]),
                "—" if not ok or engine == "duckdb" else ("yes" if same_answer(summ, duck) else "**no**"),
            ])  # fmt: skip
    headers = ["query", "engine", "time (median, min–max)", "vs DuckDB", "engine import",
               "peak RSS above baseline", "process peak RSS", "same answer as DuckDB"]  # fmt: skip
    load_end = os.getloadavg()
    text = (
        f"Measured on {path.name} with {args.threads} thread(s) per engine; {runs} timed "
        f"(+{warmup} warm-up) "
        f"per case, fresh process each. Load average at start {load_start[0]:.1f}, at end "
        f"{load_end[0]:.1f}.\n\n" + markdown_table(headers, rows)
    )
    print(text)
    name = "json-quick" if args.quick else "json"
    write_results(name, {"machine": info, "results": results}, text, args.out)
    if not args.quick and not args.no_readme:
        update_readme("bench_json", text)


if __name__ == "__main__":
    main()

"""Columnar engine benchmark: extagg vs DuckDB vs Polars vs pandas vs a bare numba table.

Workloads (cached inputs, see ``_datasets``): 20 M rows of int64 keys with 1 M and 10 M
distinct keys and 5 M rows with 1 M distinct string keys (``sum``/``count``/``max`` of a float64
column); TPC-H ``lineitem`` at SF1 and SF10 grouped by ``l_orderkey`` and by ``(l_orderkey,
l_partkey, l_suppkey)`` (sums of quantity and price). Every engine runs with no limit; extagg
and DuckDB (1 and 2 threads) also at 1/8 of the memory extagg's in-memory table was granted.
Each run is a fresh process holding the whole input in memory (the baseline); one untimed
warm-up, medians of ``--runs`` runs with min–max, peak RSS above the baseline for each. Under a
limit extagg's child then runs the query a second time, untimed, to report its "data" RSS: the
timed run's peak includes the spill and merge kernels loaded during it. The engines' runs of a workload and limit are interleaved (``--sequential``: one engine's after the
other's), so a machine whose speed drifts over minutes slows them alike. Usage::

    python benchmarks/bench_columnar.py                 # full suite, updates benchmarks/README.md
    python benchmarks/bench_columnar.py --quick         # tiny data, one run, no README update
    python benchmarks/bench_columnar.py --workloads int-1M tpch-sf1-orderkey --engines extagg duckdb-1t
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _datasets as D
import _harness as H

NO_LIMIT = 16 * 1024 * H.MIB  # extagg's budget "with no limit": nothing here comes near it
SYNTH_AGGS = {"total": ("v", "sum"), "n": ("*", "count"), "hi": ("v", "max")}
TPCH_AGGS = {"qty": ("l_quantity", "sum"), "price": ("l_extendedprice", "sum")}
KEYS_1 = ["l_orderkey"]
KEYS_3 = ["l_orderkey", "l_partkey", "l_suppkey"]


def _synth(rows: int, distinct: int, kind: str) -> dict[str, Any]:
    return {"kind": kind, "rows": rows, "distinct": distinct, "keys": ["k"], "aggs": SYNTH_AGGS}


def _tpch(sf: float, keys: list[str]) -> dict[str, Any]:
    return {"kind": "tpch", "sf": sf, "keys": keys, "aggs": TPCH_AGGS}


WORKLOADS = {
    "int-1M": _synth(20_000_000, 1_000_000, "int"),
    "int-10M": _synth(20_000_000, 10_000_000, "int"),
    "str-1M": _synth(5_000_000, 1_000_000, "str"),
    "tpch-sf1-orderkey": _tpch(1, KEYS_1),
    "tpch-sf1-3keys": _tpch(1, KEYS_3),
    "tpch-sf10-orderkey": _tpch(10, KEYS_1),
    "tpch-sf10-3keys": _tpch(10, KEYS_3),
}
QUICK_WORKLOADS = {
    "int-1M": _synth(200_000, 20_000, "int"),
    "int-10M": _synth(200_000, 100_000, "int"),
    "str-1M": _synth(50_000, 10_000, "str"),
    "tpch-sf1-orderkey": _tpch(0.01, KEYS_1),
    "tpch-sf1-3keys": _tpch(0.01, KEYS_3),
}
#: engine → threads it uses, and whether it can be given a memory limit
ENGINES = {
    "extagg": (1, True),
    "extagg-2t": (2, True),
    "duckdb-1t": (1, True),
    "duckdb-2t": (2, True),
    "polars-eager": (os.cpu_count() or 1, False),
    "polars-streaming": (os.cpu_count() or 1, False),
    "pandas": (1, False),
    "ceiling": (1, False),
    # another checkout of extagg (``EXTAGG_BENCH_BASELINE``: its root directory), side by side
    # with this one in the same run: before/after ratios under the same machine load
    "extagg-baseline": (1, True),
}


# ---------------------------------------------------------------------------- the engines
# Each ``prepare_*`` turns the loaded Arrow table into the engine's own input (untimed, part of
# the baseline) and returns ``run(table_or_input) -> (groups, first aggregate's total, extra)``.


def prepare_extagg(spec: dict[str, Any], budget: int | None, threads: int | None = None):
    import inspect

    from extagg import HashAggregator

    # the baseline may predate ``threads`` (then it has one thread)
    known = "threads" in inspect.signature(HashAggregator).parameters
    options = {"threads": threads} if threads is not None and known else {}

    def run(table):
        with HashAggregator(
            spec["keys"], spec["aggs"], memory=budget or NO_LIMIT, **options
        ) as agg:
            for batch in table.to_batches():
                agg.update(batch)
            peak_after_update = H.peak_rss()  # where the peak came: folding or merging
            groups, total = _consume(agg.results(), first)
            m = agg.metrics
        extra = {
            "spills": m.spill_count,
            "disk_bytes_spilled": m.disk_bytes_spilled,
            "peak_granted_bytes": m.peak_granted_bytes,
            "merge_passes": m.merge_passes,
            "peak_rss_after_update": peak_after_update,
        }
        return groups, total, extra

    first = next(iter(spec["aggs"]))
    return lambda table: table, run


def _consume(batches, column: str) -> tuple[int, float]:
    """Rows and the total of ``column`` over a stream of result batches, holding none of them.

    The out-of-core engines stream their output (to a file, a writer, a next stage): holding a
    result as large as the input would put the output, not the engine, over the memory limit.
    """
    rows, total = 0, 0.0
    for batch in batches:
        rows += batch.num_rows
        total += _total(batch.column(column))
    return rows, total


def _sql(spec: dict[str, Any]) -> str:
    keys = ", ".join(spec["keys"])
    parts = [
        f"count(*) AS {out}" if col == "*" else f"{fn}({col}) AS {out}"
        for out, (col, fn) in spec["aggs"].items()
    ]
    return f"SELECT {keys}, {', '.join(parts)} FROM t GROUP BY {keys}"


def prepare_duckdb(spec: dict[str, Any], budget: int | None, threads: int):
    import duckdb

    temp = tempfile.mkdtemp(prefix="bench-duckdb-")
    atexit.register(shutil.rmtree, temp, True)
    config: dict[str, Any] = {
        "threads": threads,
        "temp_directory": temp,
        "preserve_insertion_order": False,
    }
    if budget:
        config["memory_limit"] = f"{max(1, budget // H.MIB)}MiB"
    con = duckdb.connect(config=config)
    sql = _sql(spec)

    def run(table):
        con.register("t", table)  # a zero-copy view: the prime run sees its own small table
        try:
            groups, total = _consume(con.sql(sql).to_arrow_reader(), next(iter(spec["aggs"])))
        finally:
            shutil.rmtree(temp, ignore_errors=True)
            os.makedirs(temp, exist_ok=True)
        return groups, total, {}

    return lambda table: table, run


def _polars_exprs(spec: dict[str, Any]):
    import polars as pl

    exprs = []
    for out, (col, fn) in spec["aggs"].items():
        exprs.append(pl.len().alias(out) if col == "*" else getattr(pl.col(col), fn)().alias(out))
    return exprs


def prepare_polars(spec: dict[str, Any], streaming: bool):
    import polars as pl

    exprs, first = _polars_exprs(spec), next(iter(spec["aggs"]))

    def run(df):
        if streaming:
            out = df.lazy().group_by(spec["keys"]).agg(exprs).collect(engine="streaming")
        else:
            out = df.group_by(spec["keys"]).agg(exprs)
        return out.height, float(out[first].sum()), {}

    return pl.from_arrow, run


def prepare_pandas(spec: dict[str, Any]):
    value = next(col for col, _ in spec["aggs"].values() if col != "*")
    named = {
        out: (value, "size") if col == "*" else (col, fn) for out, (col, fn) in spec["aggs"].items()
    }
    first = next(iter(spec["aggs"]))

    def run(df):
        out = df.groupby(spec["keys"], sort=False).agg(**named)
        return len(out), float(out[first].sum()), {}

    return lambda table: table.to_pandas(), run


def prepare_ceiling(spec: dict[str, Any]):
    """The bare presized table with one aggregate: ``sum`` of the first aggregated column (the
    issue's ceiling: interleaved key/state slots, sized for the known number of groups)."""
    from numba_ceiling import ceiling_aggregate

    column = next(col for col, fn in spec["aggs"].values() if col != "*")

    def setup(table):
        if any(str(table.schema.field(k).type) != "int64" for k in spec["keys"]):
            raise SystemExit("the numba ceiling takes int64 keys only")
        keys = [table.column(k).to_numpy() for k in spec["keys"]]
        values = [table.column(column).to_numpy()]
        groups = spec.get("distinct")
        if groups is None:  # TPC-H: learn the number of groups once, untimed
            groups = len(ceiling_aggregate(keys, values, ["sum"])[1])
        return keys, values, groups

    def run(data):
        keys, values, groups = data
        _, counts, states = ceiling_aggregate(keys, values, ["sum"], groups=groups)
        return len(counts), float(states[0].sum()), {}

    return setup, run


def _total(column) -> float:
    import pyarrow.compute as pc

    return float(pc.sum(column).as_py() or 0.0)


def make_engine(name: str, spec: dict[str, Any], budget: int | None):
    if name == "extagg-baseline":
        root = os.environ.get("EXTAGG_BENCH_BASELINE")
        if not root:
            raise SystemExit("extagg-baseline needs EXTAGG_BENCH_BASELINE=<another checkout>")
        sys.path.insert(0, root)  # this fresh process imports that checkout's extagg
        return prepare_extagg(spec, budget, ENGINES[name][0])
    if name in ("extagg", "extagg-2t"):
        return prepare_extagg(spec, budget, ENGINES[name][0])
    if name.startswith("duckdb"):
        return prepare_duckdb(spec, budget, ENGINES[name][0])
    if name.startswith("polars"):
        return prepare_polars(spec, streaming=name.endswith("streaming"))
    if name == "pandas":
        return prepare_pandas(spec)
    if name == "ceiling":
        return prepare_ceiling(spec)
    raise ValueError(f"unknown engine {name!r}")


def child(case: dict[str, Any]) -> dict[str, Any]:
    """One measured run in this fresh process (the parent reads the printed result)."""
    import pyarrow as pa

    spec = case["spec"]
    setup, run = make_engine(case["engine"], spec, case["budget"])
    rss_after_imports = H.current_rss()
    table = D.load_table(Path(case["path"]))
    data = setup(table)
    if data is not table:
        del table
    run(_head(data, 50_000, pa))  # imports, numba cache loads, lazy initialisation
    t = H.timed(lambda: run(data))
    groups, total, extra = t.value
    out = {**t.as_dict(), **extra, "groups": groups, "total": total}
    if "peak_rss_after_update" in out:
        out["peak_above_baseline_after_update"] = out.pop("peak_rss_after_update") - t.baseline_rss
    out["rows_per_s"] = case["rows"] / t.seconds
    out["rss_after_imports"] = rss_after_imports
    if case["engine"].startswith("extagg") and case["budget"]:
        # the timed run loaded the spill, partition and merge kernels (the warm-up on 50 000
        # rows does not spill): its peak includes them. A second run, every kernel loaded,
        # gives the data's part alone (as bench_files.py's "data").
        again = H.timed(lambda: run(data))
        out["data_peak_above_baseline"] = again.peak_above_baseline
    return out


def _head(data: Any, rows: int, pa) -> Any:
    if isinstance(data, pa.Table):
        return data.slice(0, rows)
    if isinstance(data, tuple):
        keys, values, _groups = data
        return [k[:rows] for k in keys], [v[:rows] for v in values], None
    return data.head(rows)


# ---------------------------------------------------------------------------- the parent


def _rows(path: Path) -> int:
    import pyarrow.ipc as ipc

    with ipc.open_file(str(path)) as f:
        return sum(f.get_batch(i).num_rows for i in range(f.num_record_batches))


def eighth_budget(
    in_memory: dict[str, Any] | None, spec: dict[str, Any], rows: int
) -> tuple[int, str]:
    """1/8 of what extagg's in-memory table was granted (or, if that run failed, an estimate)."""
    granted = (in_memory or {}).get("summary", {}).get("peak_granted_bytes")
    if granted:
        return max(1, int(granted[0]) // 8), "extagg in-memory grant / 8"
    width = 8 * (len(spec["keys"]) + len(spec["aggs"]) + 3)
    groups = spec.get("distinct", rows)
    return max(1, groups * width * 2 // 8), "estimate (groups × row width × 2) / 8"


def run_workload(name: str, spec: dict[str, Any], args) -> list[dict[str, Any]]:
    path = D.dataset_path(spec)
    rows = _rows(path)
    out = []

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def run(engines: list[str], mode: str, budget: int | None, note: str = "") -> dict[str, Any]:
        """The engines on one mode, their runs interleaved (``--sequential``: one after the
        other, checkpointed)."""
        cases = [{"workload": name, "engine": engine, "mode": mode, "budget": budget,
                  "note": note, "threads": ENGINES[engine][0], "rows": rows, "path": str(path),
                  "spec": spec} for engine in engines]  # fmt: skip
        log(f"{name} {mode}: {', '.join(engines)} ...")
        if args.sequential:
            done = [H.run_case(__file__, case, runs=args.runs, warmup=args.warmup,
                               timeout=args.timeout, log=log, checkpoint=args.checkpoint)
                    for case in cases]  # fmt: skip
        else:
            done = H.run_cases_interleaved(__file__, cases, runs=args.runs, warmup=args.warmup,
                                           timeout=args.timeout, log=log)  # fmt: skip
        for engine, r in zip(engines, done, strict=True):
            s = r["summary"]
            if "seconds" in s:
                log(f"  {engine}: {H.format_range(s['seconds'])} s, "
                    f"peak +{H.format_bytes(s['peak_above_baseline'][0])}")  # fmt: skip
            out.append(r)
        return dict(zip(engines, done, strict=True))

    engines = [e for e in args.engines if not (e == "ceiling" and spec["kind"] == "str")]
    in_memory = run(engines, "no limit", None)
    if args.no_limit_only:
        return out
    budget, how = eighth_budget(in_memory.get("extagg"), spec, rows)
    limited = [e for e in engines if ENGINES[e][1]]
    if limited:
        run(limited, "1/8", budget, how)
    return out


def _find(results, workload, engine, mode, field="seconds"):
    for r in results:
        c = r["case"]
        if (c["workload"], c["engine"], c["mode"]) == (workload, engine, mode):
            v = r["summary"].get(field)
            return v[0] if isinstance(v, list) else None
    return None


def summary_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in results:
        c, s = r["case"], r["summary"]
        limit = H.format_bytes(c["budget"]) if c["budget"] else "none"
        head = [c["workload"], c["engine"], str(c["threads"]), limit]
        if "error" in s:
            rows.append([*head, f"failed: {s['error'][:160]}", "", "", "", ""])
            continue
        peak = s["peak_above_baseline"]
        ratio = f" = {peak[0] / c['budget']:.2f}× limit" if c["budget"] else ""
        if "data_peak_above_baseline" in s:
            data = s["data_peak_above_baseline"][0]
            ratio += f" (data {H.format_bytes(data)}, {data / c['budget']:.2f}× limit)"
        rows.append(
            [
                *head,
                H.format_range(s["seconds"]),
                f"{s['rows_per_s'][0] / 1e6:.1f}",
                f"{H.format_bytes(peak[0])} ({H.format_bytes(peak[1])}–{H.format_bytes(peak[2])}){ratio}",
                f"{int(s['spills'][0])} / {H.format_bytes(s['disk_bytes_spilled'][0])}"
                if "spills" in s
                else "",
                f"{int(s['groups'][0]):,}",
            ]
        )
    return rows


def _failed(results, workload, engine, mode) -> bool:
    return any(
        (r["case"]["workload"], r["case"]["engine"], r["case"]["mode"]) == (workload, engine, mode)
        and "error" in r["summary"]
        for r in results
    )


def _check(value: float | None, ok: bool, fmt: str = "{:.2f}×") -> str:
    return "–" if value is None else fmt.format(value) + (" ✅" if ok else " ❌")


def target_rows(results: list[dict[str, Any]], workloads: list[str]) -> list[list[str]]:
    rows = []
    for w in workloads:
        ext = _find(results, w, "extagg", "no limit")
        ceiling = _find(results, w, "ceiling", "no limit")
        pandas = _find(results, w, "pandas", "no limit")
        ext8 = _find(results, w, "extagg", "1/8")
        d1 = _find(results, w, "duckdb-1t", "1/8")
        d2 = _find(results, w, "duckdb-2t", "1/8")
        peak8 = _find(results, w, "extagg", "1/8", "data_peak_above_baseline")
        if peak8 is None:  # a baseline without the second run
            peak8 = _find(results, w, "extagg", "1/8", "peak_above_baseline")
        budget = next((r["case"]["budget"] for r in results
                       if r["case"]["workload"] == w and r["case"]["mode"] == "1/8"), None)  # fmt: skip
        vs_ceiling = ceiling / ext if ext and ceiling else None
        vs_pandas = pandas / ext if ext and pandas else None
        slowdown = ext8 / ext if ext and ext8 else None
        rss = peak8 / budget if peak8 is not None and budget else None
        vs_d1 = ext8 / d1 if ext8 and d1 else None
        vs_d2 = ext8 / d2 if ext8 and d2 else None
        rows.append(
            [
                w,
                _check(vs_ceiling, vs_ceiling is not None and vs_ceiling >= 0.7, "{:.0%}"),
                _check(vs_pandas, vs_pandas is not None and vs_pandas >= 3),
                _check(slowdown, slowdown is not None and slowdown <= 3),
                _check(rss, rss is not None and rss <= 1.25),
                _check(vs_d1, vs_d1 is not None and vs_d1 <= 2)
                if d1 or not ext8 or not _failed(results, w, "duckdb-1t", "1/8")
                else "DuckDB failed at this limit ✅",
                "–" if vs_d2 is None else f"{vs_d2:.2f}× (2 threads vs extagg's 1)",
            ]
        )
    return rows


def render(results: list[dict[str, Any]], workloads: list[str], info: dict[str, Any], args) -> str:
    headers = ["workload", "engine", "threads", "memory limit", "time s, median (min–max)",
               "M rows/s", "peak RSS above baseline (min–max)", "spills / spilled (disk)", "groups"]  # fmt: skip
    targets = ["workload", "extagg throughput / ceiling (≥ 70%)", "pandas time / extagg (≥ 3×)",
               "extagg 1/8 time / in memory (≤ 3×)", "extagg 1/8 data RSS / limit (≤ 1.25×)",
               "extagg 1/8 time / DuckDB 1 thread 1/8 (≤ 2×)", "extagg 1/8 / DuckDB 2 threads 1/8"]  # fmt: skip
    load = ", ".join(f"{x:.1f}" for x in info["load_average"])
    load_end = ", ".join(f"{x:.1f}" for x in info.get("load_average_end", []))
    return "\n".join(
        [
            f"Measured {info['time']} with `{' '.join(args.command)}` in {info.get('wall_s', 0) / 60:.0f} min: "
            f"{info['cpus']} cores, {H.format_bytes(info.get('memory_total'))}, Python {info['python']}, "
            f"numba {info.get('numba')}, duckdb {info.get('duckdb')}, polars {info.get('polars')}, "
            f"pandas {info.get('pandas')}; load average at start {load}, at end {load_end}. "
            f"{args.runs} timed runs after {args.warmup} warm-up, each a fresh process"
            f"{', one engine after the other' if args.sequential else ', the engines interleaved'}.",
            "",
            H.markdown_table(headers, summary_rows(results)),
            "",
            H.markdown_table(targets, target_rows(results, workloads)),
        ]
    )


def check_agreement(results: list[dict[str, Any]]) -> list[str]:
    """Engines of a workload must agree on the group count and the first aggregate's total."""
    problems, first = [], {}
    for r in results:
        s, c = r["summary"], r["case"]
        if "groups" not in s:
            continue
        got = (s["groups"][0], s["total"][0])
        ref = first.setdefault(c["workload"], (got, c["engine"]))
        (groups, total), ref_engine = ref
        if got[0] != groups or abs(got[1] - total) > 1e-6 * max(1.0, abs(total)):
            problems.append(
                f"{c['workload']}: {c['engine']} {c['mode']} gave {got}, {ref_engine} {(groups, total)}"
            )
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    H.add_common_arguments(parser)
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS))
    parser.add_argument(
        "--engines",
        nargs="+",
        choices=list(ENGINES),
        default=[e for e in ENGINES if e != "extagg-baseline"],  # it needs another checkout
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per child")
    parser.add_argument(
        "--no-limit-only", action="store_true", help="skip the runs at 1/8 of the memory"
    )
    parser.add_argument(
        "--sequential", action="store_true",
        help="run each engine's runs one after the other (checkpointed: --resume works); "
        "by default the engines' runs of a workload and limit are interleaved",
    )  # fmt: skip
    args = parser.parse_args()
    if args.child:
        H.run_guarded(lambda: child(json.loads(args.child)))
        return
    args.command = ["python", "benchmarks/bench_columnar.py", *sys.argv[1:]]
    table = QUICK_WORKLOADS if args.quick else WORKLOADS
    suffix = "-quick" if args.quick else ""
    args.checkpoint = H.checkpoint_file(args, f"columnar{suffix}")
    args.runs = args.runs if args.runs is not None else (1 if args.quick else 3)
    args.warmup = args.warmup if args.warmup is not None else (0 if args.quick else 1)
    names = [n for n in (args.workloads or list(table)) if n in table]
    info = H.machine_info()
    started = time.perf_counter()
    results = []
    for name in names:
        results += run_workload(name, table[name], args)
    info["load_average_end"] = list(os.getloadavg())
    info["wall_s"] = time.perf_counter() - started
    problems = check_agreement(results)
    text = render(results, names, info, args)
    if problems:
        text += "\n\nDisagreements between engines:\n" + "\n".join(f"- {p}" for p in problems)
    print(text)
    payload = {"machine": info, "workloads": {n: table[n] for n in names}, "results": results,
               "problems": problems}  # fmt: skip
    H.write_results(f"columnar{suffix}", payload, text, args.out)
    args.checkpoint.unlink(missing_ok=True)
    if not args.quick and not args.no_readme:
        H.update_readme("bench_columnar", text)
    if problems:
        raise SystemExit("engines disagree: " + "; ".join(problems))


if __name__ == "__main__":
    main()

"""Peak RSS of ``extagg aggregate`` on big files at small budgets: fixed cost vs the run's own.

Each case runs the CLI in a fresh process with ``--json-summary`` and prints the budget, the RSS
when the run started (after planning), after the first batch was folded ("fixed": interpreter,
imports, kernels, first batch), the process peak, and the peak above "fixed" against the budget.

    python benchmarks/scan_memory.py --parquet a.parquet --parquet b.parquet --csv l.csv \\
        pq:q1:16m pq:orderkey:64m csv:q1:16m

Cases are ``INPUT:QUERY:BUDGET`` with INPUT ``pq`` or ``csv`` and QUERY ``q1`` (TPC-H Q1's
grouping and filter) or ``orderkey`` (``GROUP BY l_orderkey``) over TPC-H ``lineitem``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20
QUERIES = {
    "q1": ["--by", "l_returnflag,l_linestatus", "--agg", "s=sum(l_quantity)",
           "--agg", "p=mean(l_extendedprice)", "--agg", "d=mean(l_discount)",
           "--agg", "n=count(*)", "--where", "l_shipdate <= date '1998-09-02'"],
    "orderkey": ["--by", "l_orderkey", "--agg", "n=count(*)", "--agg", "q=sum(l_quantity)"],
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parquet", action="append", default=[], help="a Parquet input file")
    parser.add_argument("--csv", action="append", default=[], help="a CSV input file")
    parser.add_argument("--python", default=sys.executable, help="interpreter with extagg")
    parser.add_argument("cases", nargs="+", help="INPUT:QUERY:BUDGET, e.g. pq:q1:16m")
    args = parser.parse_args()
    inputs = {"pq": args.parquet, "csv": args.csv}
    print(f"# load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            source, query, budget = case.split(":")
            summary = os.path.join(tmp, "summary.json")
            cmd = [args.python, "-m", "extagg", "aggregate", *inputs[source], *QUERIES[query],
                   "--memory", budget, "-o", os.path.join(tmp, "out.parquet"), "--overwrite",
                   "-q", "--json-summary", summary]  # fmt: skip
            start = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - start
            if proc.returncode:
                print(f"{case}: failed: {proc.stderr[-500:]}")
                continue
            with open(summary, encoding="utf-8") as f:
                m = json.load(f)
            b, fixed, peak = m["budget_bytes"], m["rss_fixed_bytes"], m["peak_rss_bytes"]
            print(
                f"{case:20s} {wall:6.1f} s  start {m['rss_import_bytes'] / MIB:4.0f} MiB  "
                f"fixed {fixed / MIB:4.0f} MiB  peak {peak / MIB:4.0f} MiB  "
                f"peak-fixed {(peak - fixed) / MIB:4.0f} MiB ({(peak - fixed) / b:.2f}x budget)  "
                f"granted {m['peak_granted_bytes'] / MIB:5.1f} MiB  spills {m['spill_count']}"
            )


if __name__ == "__main__":
    main()

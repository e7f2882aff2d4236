"""``make demo``: the main job — ``extagg aggregate`` on a built-in Parquet sample.

Generates (once, cached under ``.cache/``) a lineitem-like dataset, runs two queries with the
real command in a fresh process each — one that reduces to a handful of groups (TPC-H Q1's
shape), one with a million groups that spills under its budget — shows their progress, first
rows and summaries, and checks every answer against a second computation in NumPy, exiting 1
if anything differs.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from extagg.sample import write_lineitem

__all__ = ["run_files_demo"]

CUTOFF = "1998-09-02"


def _cents(arr: pa.Array) -> np.ndarray:
    """The unscaled values of a non-negative ``decimal128(p, 2)`` array below 2**63."""
    words = np.frombuffer(arr.buffers()[1], dtype=np.int64)
    return words[2 * arr.offset : 2 * (arr.offset + len(arr)) : 2]


def _run(cmd: list[str]) -> dict[str, Any]:
    shown = ["extagg", *cmd[3:]]
    print(f"\n$ {shlex.join(shown)}", flush=True)
    proc = subprocess.run(cmd)  # progress bar and summary go to our stderr
    if proc.returncode != 0:
        raise SystemExit(f"demo: the command failed with exit status {proc.returncode}")
    summary_path = cmd[cmd.index("--json-summary") + 1]
    with open(summary_path, encoding="utf-8") as f:
        return json.load(f)


def _show(path: str, rows: int) -> pa.Table:
    table = pq.read_table(path)
    head = table.slice(0, rows).to_pylist()
    names = table.column_names
    cells = [[str(r[n]) for n in names] for r in head]
    widths = [max(len(n), *(len(c[i]) for c in cells)) for i, n in enumerate(names)]
    print("  ".join(n.rjust(w) for n, w in zip(names, widths)))
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, widths)))
    print(f"{table.num_rows:,} rows in {path}")
    return table


def _check_q1(files: list[str], result: pa.Table) -> None:
    cutoff = (np.datetime64(CUTOFF) - np.datetime64("1970-01-01")).astype(int)
    want: dict[tuple[str, str], list[int]] = {}
    cols = ["l_returnflag", "l_linestatus", "l_quantity", "l_extendedprice", "l_discount",
            "l_shipdate"]  # fmt: skip
    for path in files:
        for b in pq.ParquetFile(path).iter_batches(batch_size=250_000, columns=cols):
            keep = b.column("l_shipdate").cast(pa.int32()).to_numpy() <= cutoff
            flags = b.column("l_returnflag").to_numpy(zero_copy_only=False)[keep]
            stats = b.column("l_linestatus").to_numpy(zero_copy_only=False)[keep]
            qty = _cents(b.column("l_quantity"))[keep]
            price = _cents(b.column("l_extendedprice"))[keep]
            disc = _cents(b.column("l_discount"))[keep]
            for f in np.unique(flags):
                for s in np.unique(stats):
                    sel = (flags == f) & (stats == s)
                    if sel.any():
                        acc = want.setdefault((f, s), [0, 0, 0, 0])
                        acc[0] += int(sel.sum())
                        acc[1] += int(qty[sel].sum())
                        acc[2] += int(price[sel].sum())
                        acc[3] += int(disc[sel].sum())
    got = {(r["l_returnflag"], r["l_linestatus"]): r for r in result.to_pylist()}
    if got.keys() != want.keys():
        raise SystemExit(f"demo: Q1 groups differ: {sorted(got)} vs NumPy {sorted(want)}")
    for key, (n, qty, price, disc) in want.items():
        r = got[key]
        exact = (r["n"], r["sum_qty"], r["sum_price"])
        expected = (n, Decimal(qty) / 100, Decimal(price) / 100)
        mean = Decimal(disc) / 100 / n
        if exact != expected or abs(r["avg_disc"] - mean) > Decimal("0.000001"):
            raise SystemExit(f"demo: Q1 group {key} differs: {r} vs NumPy {expected}, {mean}")


def _check_q2(files: list[str], result: pa.Table, orders: int) -> None:
    count = np.zeros(orders + 2, dtype=np.int64)
    qty = np.zeros(orders + 2, dtype=np.int64)
    top = np.full(orders + 2, -1, dtype=np.int64)
    for path in files:
        cols = ["l_orderkey", "l_quantity", "l_extendedprice"]
        for b in pq.ParquetFile(path).iter_batches(batch_size=250_000, columns=cols):
            key = b.column("l_orderkey").to_numpy()
            count += np.bincount(key, minlength=len(count))
            qty += np.bincount(
                key, weights=_cents(b.column("l_quantity")), minlength=len(qty)
            ).astype(np.int64)
            np.maximum.at(top, key, _cents(b.column("l_extendedprice")))
    keys = result.column("l_orderkey").to_numpy()
    present = np.flatnonzero(count)
    ok = (
        len(keys) == len(present)
        and np.array_equal(np.sort(keys), present)
        and np.array_equal(result.column("n").to_numpy(), count[keys])
        and np.array_equal(_cents(result.column("qty").combine_chunks()), qty[keys])
        and np.array_equal(_cents(result.column("top").combine_chunks()), top[keys])
    )
    if not ok:
        raise SystemExit("demo: Q2 (GROUP BY l_orderkey) differs from NumPy")


def run_files_demo(
    rows: int = 4_000_000,
    seed: int = 42,
    memory_q1: str = "64m",
    memory_q2: str = "32m",
    cache: str = ".cache",
    spill_dirs: list[str] | None = None,
) -> int:
    """Generate the sample if needed, run both queries, verify them; returns the exit status."""
    data = os.path.join(cache, f"lineitem-{rows}-{seed}")
    if not os.path.isdir(data):
        print(f"generating {rows:,} lineitem-like rows into {data}/ (once; cached) ...",
              flush=True)  # fmt: skip
        started = time.perf_counter()
        files = write_lineitem(data, rows, seed)
        print(f"  {len(files)} Parquet files in {time.perf_counter() - started:.1f} s")
    files = write_lineitem(data, rows, seed)
    size = sum(os.path.getsize(f) for f in files)
    print(f"input: {data}/ ({len(files)} Parquet files, {size / 2**20:.0f} MiB, {rows:,} rows)")
    out = os.path.join(cache, "demo")
    os.makedirs(out, exist_ok=True)
    base = [sys.executable, "-m", "extagg", "aggregate", data]
    extra: list[str] = []
    for d in spill_dirs or []:
        extra += ["--spill-dir", d]
    q1_out, q2_out = os.path.join(out, "q1.parquet"), os.path.join(out, "q2.parquet")
    q1 = _run([
        *base, "--by", "l_returnflag,l_linestatus", "--agg", "sum_qty=sum(l_quantity)",
        "--agg", "sum_price=sum(l_extendedprice)", "--agg", "avg_disc=mean(l_discount)",
        "--agg", "n=count(*)", "--where", f"l_shipdate <= date '{CUTOFF}'", "--sort",
        "--memory", memory_q1, "-o", q1_out, "--overwrite", *extra,
        "--json-summary", os.path.join(out, "q1.json"),
    ])  # fmt: skip
    r1 = _show(q1_out, 10)
    _check_q1(files, r1)
    print("Q1 verified against NumPy: every group, exact decimal sums, counts and means")
    q2 = _run([
        *base, "--by", "l_orderkey", "--agg", "n=count(*)", "--agg", "qty=sum(l_quantity)",
        "--agg", "top=max(l_extendedprice)", "--memory", memory_q2, "-o", q2_out,
        "--overwrite", *extra, "--json-summary", os.path.join(out, "q2.json"),
    ])  # fmt: skip
    r2 = _show(q2_out, 5)
    _check_q2(files, r2, (rows + 3) // 4)
    print(f"Q2 verified against NumPy: {r2.num_rows:,} groups, counts, exact sums and maxima")
    if q2["spill_count"] == 0:
        print(f"note: Q2 did not spill under {memory_q2}")
    print(
        f"\nspills: Q1 {q1['spill_count']}, Q2 {q2['spill_count']} "
        f"({q2['disk_bytes_spilled'] / 2**20:.1f} MiB on disk); both answers match NumPy."
    )
    return 0

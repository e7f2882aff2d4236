"""Writing a large result: ``extagg aggregate -o`` in each output format vs DuckDB's ``COPY``.

TPC-H lineitem (scale factor ``--sf``, as one Parquet file, made by ``tpchgen-cli`` as for
``bench_files.py``) grouped by ``l_orderkey`` (1.5 M groups per scale factor) with
``sum(l_quantity)`` and ``count(*)``, written to CSV, gzip'd / zstd'd / bzip2'd CSV, JSON Lines,
gzip'd JSON Lines and Parquet; DuckDB (one connection, ``threads`` as extagg's) copies the same
query to CSV, gzip'd CSV, JSON and Parquet. Each run is a fresh process timed from its start
(the command as a user runs it: imports and kernel loading included), the engines' runs
interleaved; the table shows the median, the range and the output's size. ``--quick``: one
run on 20 000 generated rows (the tests run it so the script cannot rot); DuckDB's rows are left
out where it is not installed. Usage::

    python benchmarks/bench_outputs.py [--sf 1] [--runs 3] [--threads 1] [--quick]
"""

from __future__ import annotations

import argparse
import decimal
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_files import dataset

EXTAGG_OUTPUTS = ["csv", "csv.gz", "csv.zst", "csv.bz2", "jsonl", "jsonl.gz", "parquet"]
DUCKDB_OUTPUTS = ["csv", "csv.gz", "json", "parquet"]
QUERY = "SELECT l_orderkey, sum(l_quantity) s, count(*) n FROM read_parquet('{src}') GROUP BY ALL"


def _extagg(src: Path, out: Path, threads: int) -> list[str]:
    return [
        sys.executable, "-m", "extagg", "aggregate", str(src), "--by", "l_orderkey",
        "--agg", "s=sum(l_quantity)", "--agg", "n=count(*)", "--threads", str(threads),
        "-q", "--overwrite", "-o", str(out),
    ]  # fmt: skip


def _duckdb(src: Path, out: Path, threads: int) -> list[str]:
    code = (
        "import duckdb; c = duckdb.connect(); "
        f"c.execute('SET threads={threads}'); c.execute('SET enable_progress_bar=false'); "
        f"c.execute({f'COPY ({QUERY.format(src=src)}) TO {str(out)!r}'!r})"
    )
    return [sys.executable, "-c", code]


def _quick_input(directory: Path) -> Path:
    """20 000 rows of lineitem's two columns, 5 000 order keys."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 20_000
    quantity = [decimal.Decimal(i % 50 + 1) for i in range(rows)]
    table = pa.table(
        {
            "l_orderkey": pa.array([(i * 7919) % 5_000 for i in range(rows)], pa.int64()),
            "l_quantity": pa.array(quantity, pa.decimal128(15, 2)),
        }
    )
    path = directory / "lineitem.parquet"
    pq.write_table(table, path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sf", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="20 000 generated rows, one run")
    args = parser.parse_args()
    cases = [("extagg", ext, _extagg) for ext in EXTAGG_OUTPUTS]
    if importlib.util.find_spec("duckdb") is not None:
        cases += [("duckdb", ext, _duckdb) for ext in DUCKDB_OUTPUTS]
    times: dict[tuple[str, str], list[float]] = {}
    sizes: dict[tuple[str, str], int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = _quick_input(Path(tmp)) if args.quick else dataset(args.sf, "parquet", quick=False)
        runs = 1 if args.quick else args.runs
        for _ in range(runs):
            for engine, ext, command in cases:
                out = Path(tmp) / f"{engine}.{ext}"
                if out.exists():
                    os.remove(out)
                started = time.perf_counter()
                subprocess.run(command(src, out, args.threads), check=True)
                times.setdefault((engine, ext), []).append(time.perf_counter() - started)
                sizes[(engine, ext)] = out.stat().st_size
    print(f"| engine | output | time s, median (min–max) of {runs} | bytes |")
    print("|---|---|---|---|")
    for engine, ext, _command in cases:
        took = times[(engine, ext)]
        print(
            f"| {engine} | .{ext} | {statistics.median(took):.2f} ({min(took):.2f}–"
            f"{max(took):.2f}) | {sizes[(engine, ext)]:,} |"
        )


if __name__ == "__main__":
    main()

"""Inputs of the columnar benchmark, generated once and cached as Arrow IPC files in ``data/``.

Synthetic sets come from seeded NumPy (every key exactly ``rows // distinct`` times, scattered;
see :func:`_harness.permuted_key_index`). TPC-H ``lineitem`` is made by ``tpchgen-cli`` (a
PyPI wheel) and reduced to the five columns the queries read, decimals cast to float64, so
every engine reads the same plain columns. Children load a cached file fully into memory
(no memory map: the input is part of the baseline, not of the measured peak).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import _harness as H
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

__all__ = ["dataset_path", "load_table"]

log = logging.getLogger(__name__)

SEED = 7
IPC_BATCH_ROWS = 1 << 20
TPCH_COLUMNS = ["l_orderkey", "l_partkey", "l_suppkey", "l_quantity", "l_extendedprice"]


def dataset_path(spec: dict[str, Any]) -> Path:
    """Where the cached input of a workload lives (made on first use)."""
    if spec["kind"] == "tpch":
        path = H.DATA_DIR / f"tpch-sf{spec['sf']:g}-lineitem5.arrow"
        if not path.exists():
            _make_tpch(spec["sf"], path)
    else:
        path = H.DATA_DIR / f"{spec['kind']}-{spec['rows']}-{spec['distinct']}.arrow"
        if not path.exists():
            _make_synthetic(spec, path)
    return path


def load_table(path: Path) -> pa.Table:
    """Read a cached input into memory (anonymous buffers, not a memory map)."""
    with pa.OSFile(str(path), "rb") as f:
        return ipc.open_file(f).read_all()


def _write_atomically(path: Path, schema: pa.Schema, batches: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    try:
        with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _make_synthetic(spec: dict[str, Any], path: Path) -> None:
    rows, distinct, kind = spec["rows"], spec["distinct"], spec["kind"]
    universe = None
    if kind == "str":
        codes = H.scramble_keys(np.arange(distinct, dtype=np.int64)).tolist()
        universe = pa.array([f"key-{c:012x}" for c in codes], type=pa.string())
    key_type = pa.string() if kind == "str" else pa.int64()
    schema = pa.schema([("k", key_type), ("v", pa.float64())])

    def batches():
        for start in range(0, rows, IPC_BATCH_ROWS):
            stop = min(rows, start + IPC_BATCH_ROWS)
            index = H.permuted_key_index(start, stop, rows, distinct, SEED)
            keys = (
                universe.take(pa.array(index)) if universe is not None else H.scramble_keys(index)
            )
            values = np.random.default_rng([SEED, start]).random(stop - start)
            yield pa.record_batch([pa.array(keys), pa.array(values)], schema=schema)

    _write_atomically(path, schema, batches())


def _tpchgen() -> str:
    here = Path(sys.executable).parent / "tpchgen-cli"
    found = str(here) if here.exists() else shutil.which("tpchgen-cli")
    if not found:
        raise SystemExit("tpchgen-cli not found: pip install tpchgen-cli (the bench extra)")
    return found


def _make_tpch(sf: float, path: Path) -> None:
    raw_dir = H.DATA_DIR / f"sf{sf:g}"
    raw = raw_dir / "lineitem.parquet"
    if not raw.exists():
        raw_dir.mkdir(parents=True, exist_ok=True)
        cmd = [_tpchgen(), "parquet", "-s", f"{sf:g}", "--tables", "lineitem", "-o", str(raw_dir)]
        subprocess.run(cmd, check=True, capture_output=True)
    source = pq.ParquetFile(raw)
    schema = pa.schema(
        [(c, pa.int64()) for c in TPCH_COLUMNS[:3]] + [(c, pa.float64()) for c in TPCH_COLUMNS[3:]]
    )

    def batches():
        for batch in source.iter_batches(batch_size=IPC_BATCH_ROWS, columns=TPCH_COLUMNS):
            yield pa.record_batch(
                [batch.column(c).cast(schema.field(c).type) for c in TPCH_COLUMNS], schema=schema
            )

    _write_atomically(path, schema, batches())

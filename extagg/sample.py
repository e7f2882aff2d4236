"""A built-in sample: a lineitem-like Parquet dataset, generated chunk by chunk, seeded.

Columns follow TPC-H's ``lineitem``: integer keys (``l_orderkey`` with about four lines per
order, so rows/4 distinct orders), decimals (``l_quantity``, ``l_extendedprice``,
``l_discount``, ``l_tax`` as ``decimal128(15, 2)``), dates (``l_shipdate``), low-cardinality
strings (``l_returnflag``, ``l_linestatus``, ``l_shipmode``) and a high-cardinality one
(``l_comment``). The same ``rows`` and ``seed`` give the same files, byte for byte.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

__all__ = ["LINEITEM_SCHEMA", "lineitem_chunks", "write_lineitem"]

CHUNK_ROWS = 250_000
FILE_ROWS = 1_000_000
_EPOCH = dt.date(1970, 1, 1)
_START = (dt.date(1992, 1, 2) - _EPOCH).days
_END = (dt.date(1998, 12, 1) - _EPOCH).days
_CUTOFF = (dt.date(1995, 6, 17) - _EPOCH).days
_MODES = np.array(["AIR", "FOB", "MAIL", "RAIL", "REG AIR", "SHIP", "TRUCK"], dtype=object)
_WORDS = np.array(
    [
        "carefully", "final", "deposits", "sleep", "furiously", "quickly", "ironic", "packages",
        "haggle", "blithely", "regular", "accounts", "bold", "requests", "nag", "slyly",
        "express", "theodolites",
    ],
    dtype=object,
)  # fmt: skip
DEC = pa.decimal128(15, 2)

LINEITEM_SCHEMA = pa.schema(
    [
        ("l_orderkey", pa.int64()),
        ("l_partkey", pa.int64()),
        ("l_suppkey", pa.int64()),
        ("l_linenumber", pa.int32()),
        ("l_quantity", DEC),
        ("l_extendedprice", DEC),
        ("l_discount", DEC),
        ("l_tax", DEC),
        ("l_returnflag", pa.string()),
        ("l_linestatus", pa.string()),
        ("l_shipdate", pa.date32()),
        ("l_shipmode", pa.string()),
        ("l_comment", pa.string()),
    ]
)


def decimal_from_cents(cents: np.ndarray) -> pa.Array:
    """A ``decimal128(15, 2)`` array whose values are ``cents / 100`` (non-negative)."""
    words = np.zeros((len(cents), 2), dtype=np.int64)
    words[:, 0] = cents
    return pa.Array.from_buffers(DEC, len(cents), [None, pa.py_buffer(words.tobytes())])


def lineitem_chunks(rows: int, seed: int) -> Iterator[pa.RecordBatch]:
    """``rows`` lineitem-like rows, ``CHUNK_ROWS`` at a time (never the whole table)."""
    rng = np.random.default_rng(seed)
    for start in range(0, rows, CHUNK_ROWS):
        n = min(CHUNK_ROWS, rows - start)
        idx = np.arange(start, start + n, dtype=np.int64)
        orderkey = idx // 4 + 1
        linenumber = (idx % 4 + 1).astype(np.int32)
        partkey = rng.integers(1, 200_001, n)
        suppkey = rng.integers(1, 10_001, n)
        quantity = rng.integers(1, 51, n) * 100
        price_each = rng.integers(90_000, 210_000, n)  # cents
        extended = quantity // 100 * price_each
        discount = rng.integers(0, 11, n)
        tax = rng.integers(0, 9, n)
        shipdate = rng.integers(_START, _END, n).astype(np.int32)
        shipped_late = shipdate > _CUTOFF
        flag = np.where(shipped_late, "N", np.where(rng.random(n) < 0.5, "R", "A")).astype(object)
        status = np.where(shipped_late, "O", "F").astype(object)
        comment = (
            _WORDS[rng.integers(0, len(_WORDS), n)] + " " + _WORDS[rng.integers(0, len(_WORDS), n)]
            + " " + np.char.mod("%x", rng.integers(0, 1 << 40, n)).astype(object)
        )  # fmt: skip
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(orderkey), pa.array(partkey), pa.array(suppkey), pa.array(linenumber),
                decimal_from_cents(quantity), decimal_from_cents(extended),
                decimal_from_cents(discount), decimal_from_cents(tax), pa.array(flag, pa.string()),
                pa.array(status, pa.string()), pa.array(shipdate, pa.date32()),
                pa.array(_MODES[rng.integers(0, len(_MODES), n)], pa.string()),
                pa.array(comment, pa.string()),
            ],
            schema=LINEITEM_SCHEMA,
        )  # fmt: skip


def write_lineitem(directory: str, rows: int, seed: int = 42) -> list[str]:
    """Generate the sample into ``directory`` (once: an existing complete copy is reused).

    Files are written to a temporary sibling directory that is renamed when complete, so an
    interrupted generation is never mistaken for a cached one.
    """
    import pyarrow.parquet as pq

    if os.path.isdir(directory):
        return sorted(os.path.join(directory, f) for f in os.listdir(directory))
    tmp = f"{directory}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        writer = None
        part = -1
        written = 0
        for batch in lineitem_chunks(rows, seed):
            if writer is None or written >= FILE_ROWS:
                if writer is not None:
                    writer.close()
                part += 1
                written = 0
                path = os.path.join(tmp, f"part-{part:03d}.parquet")
                writer = pq.ParquetWriter(path, LINEITEM_SCHEMA, compression="zstd")
            writer.write_batch(batch, row_group_size=125_000)
            written += batch.num_rows
        if writer is not None:
            writer.close()
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(os.path.join(directory, f) for f in os.listdir(directory))

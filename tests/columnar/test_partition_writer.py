"""The partition writer: every row set aside once, in its partition's file, in input order.

The fixed-width path scatters a chunk's rows into per-partition buffers with a numba kernel
(compared here with its Python reference); the rows read back from the files are compared
with a plain-Python grouping of the input, through chunks larger than a buffer, validity
masks that appear mid-stream, wide (decimal128) columns and row subsets.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg.columnar import _key_reference as KR
from extagg.columnar import _radix_kernels as RK
from extagg.columnar.columns import Column, ReusedArrays
from extagg.columnar.keys import EncodedKeys
from extagg.columnar.partition_files import (
    NUM_PARTITIONS,
    PARTITION_BITS,
    PartitionWriter,
    partition_of,
)
from extagg.metrics import SpillMetrics
from extagg.spill.runfile import RunReader
from extagg.spill.tempdir import SpillDirs
from extagg.spillable import RunSet


@settings(max_examples=60, deadline=None)
@given(
    hashes=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=80),
    fill=st.lists(st.integers(0, 5), min_size=NUM_PARTITIONS, max_size=NUM_PARTITIONS),
    kind=st.sampled_from(["int64", "float64", "bool", "wide"]),
)
def test_scatter_partitions_matches_reference(
    hashes: list[int], fill: list[int], kind: str
) -> None:
    h = np.array(hashes, dtype=np.uint64)
    n = len(h)
    order = np.empty(n, np.int64)
    bounds = np.empty(NUM_PARTITIONS + 1, np.int64)
    RK.radix_partition(h, PARTITION_BITS, order, bounds)
    rng = np.random.default_rng(n)
    values = {
        "int64": rng.integers(-(2**62), 2**62, n),
        "float64": rng.normal(size=n),
        "bool": rng.random(n) < 0.5,
        "wide": rng.integers(-(2**62), 2**62, (n, 2)),
    }[kind]
    starts = np.array(fill, dtype=np.int64)
    shape = (NUM_PARTITIONS, n + 6, *values.shape[1:])
    got = np.zeros(shape, dtype=values.dtype)
    want = np.zeros(shape, dtype=values.dtype)
    RK.scatter_partitions(values, order, bounds, starts, got)
    KR.scatter_partitions(values, order, bounds, starts, want)
    assert np.array_equal(got, want)
    assert starts.tolist() == fill  # the kernel leaves the fill counts to the caller


def _chunk(rng: np.random.Generator, n: int, masked: bool) -> tuple[dict[str, Column], np.ndarray]:
    hashes = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    k = rng.integers(-(2**62), 2**62, n)
    v = rng.normal(size=n)
    d = rng.integers(-(2**62), 2**62, (n, 2))
    valid = (rng.random(n) < 0.7) if masked else None
    cols = {
        "k": Column("k", "int", pa.int64(), k),
        "v": Column("v", "float", pa.float64(), v, valid),
        "d": Column("d", "decimal", pa.decimal128(38, 2), d),
    }
    return cols, hashes


def _read_partitions(paths: list[str | None]) -> dict[int, dict[str, list]]:
    out: dict[int, dict[str, list]] = {}
    for p, path in enumerate(paths):
        rows: dict[str, list] = {"h": [], "k": [], "v": [], "valid": [], "d": []}
        if path is not None:
            with RunReader(path) as reader:
                for i in range(len(reader.batches)):
                    block = reader.read_block(i)
                    n = len(block)
                    rows["h"] += block.hashes.tolist()
                    rows["k"] += block.columns["v:k"].tolist()
                    rows["v"] += block.columns["v:v"].tolist()
                    mask = block.columns.get("m:v")
                    rows["valid"] += [True] * n if mask is None else mask.tolist()
                    rows["d"] += [tuple(r) for r in block.columns["v:d"].tolist()]
        out[p] = rows
    return out


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 400), min_size=1, max_size=6),
    masked=st.lists(st.booleans(), min_size=6, max_size=6),
    subset=st.booleans(),
    limit=st.sampled_from([1, 200, 4_000, 1 << 20]),
    seed=st.integers(0, 2**16),
)
def test_every_row_is_set_aside_once_in_input_order(
    tmp_path_factory, sizes: list[int], masked: list[bool], subset: bool, limit: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    dirs = SpillDirs([str(tmp_path_factory.mktemp("parts"))])
    writer = PartitionWriter(RunSet(dirs, "lz4", SpillMetrics()), limit)
    want: dict[int, dict[str, list]] = {
        p: {"h": [], "k": [], "v": [], "valid": [], "d": []} for p in range(NUM_PARTITIONS)
    }
    try:
        for i, n in enumerate(sizes):
            cols, hashes = _chunk(rng, n, masked[i])
            rows = np.flatnonzero(rng.random(n) < 0.6).astype(np.int64) if subset else None
            writer.write(cols, hashes, rows)
            picked = range(n) if rows is None else rows.tolist()
            parts = partition_of(hashes)
            valid = cols["v"].valid
            for r in picked:
                w = want[int(parts[r])]
                w["h"].append(int(hashes[r]))
                w["k"].append(int(cols["k"].values[r]))
                w["v"].append(float(cols["v"].values[r]))
                w["valid"].append(True if valid is None else bool(valid[r]))
                w["d"].append(tuple(cols["d"].values[r].tolist()))
        paths = writer.finish()
        got = _read_partitions(paths)
        for p in range(NUM_PARTITIONS):
            assert got[p] == want[p], f"partition {p}"
            assert (paths[p] is None) == (not want[p]["h"])
    finally:
        writer.abort()
        dirs.cleanup()
    assert not dirs.files


def test_a_buffer_is_written_once_it_holds_limit_bytes_of_rows(tmp_path) -> None:
    """Batches of about ``limit`` bytes, not one per chunk: the reader's cost is per batch."""
    rng = np.random.default_rng(1)
    dirs = SpillDirs([str(tmp_path)])
    limit = 40 * 1_000  # a row: hash 8 + k 8 + v 8 + d 16 = 40 bytes
    writer = PartitionWriter(RunSet(dirs, "lz4", SpillMetrics()), limit)
    for _ in range(50):
        cols, hashes = _chunk(rng, 640, masked=False)  # ~40 rows a partition a chunk
        writer.write(cols, hashes)
    paths = writer.finish()
    counts, full = [], []
    for path in paths:
        assert path is not None
        with RunReader(path) as reader:
            batches = [b.count for b in reader.batches]
        counts += batches
        full += batches[:-1]  # the last: what was left at the end
    assert sum(counts) == 50 * 640
    assert full and min(full) >= 1_000 and max(counts) < 2_000
    dirs.cleanup()


def test_reused_arrays_hand_out_the_same_memory_until_it_is_too_small() -> None:
    arrays = ReusedArrays()
    a = arrays.get("x", 100, np.int64)
    b = arrays.get("x", 60, np.int64)
    assert a.shape == (100,) and b.shape == (60,) and np.shares_memory(a, b)
    c = arrays.get("x", 200, np.int64)  # larger: a new array
    assert c.shape == (200,) and not np.shares_memory(a, c)
    d = arrays.get("x", 10, np.float64)  # another type: a new array
    assert d.dtype == np.float64 and not np.shares_memory(c, d)
    w = arrays.get("w", 5, np.uint64, 2)
    assert w.shape == (5, 2)
    assert arrays.nbytes() == 10 * 8 + 5 * 16  # x replaced by the float array
    arrays.clear()
    assert arrays.nbytes() == 0


def test_gathers_into_reused_arrays_equal_fresh_ones() -> None:
    rng = np.random.default_rng(3)
    n = 500
    valid = rng.random(n) < 0.8
    col = Column("v", "float", pa.float64(), rng.normal(size=n), valid)
    enc = EncodedKeys(
        rng.integers(0, 2**63, n, dtype=np.uint64),
        rng.integers(0, 2**63, (n, 2), dtype=np.uint64),
        (rng.random(n) < 0.1).astype(np.uint8),
        np.zeros(0, np.int64),
        np.zeros(0, np.uint8),
    )
    reuse = ReusedArrays()
    for _ in range(3):  # the same arrays filled again each time
        parts = [np.sort(rng.choice(n, 40, replace=False)) for _ in range(3)]
        fresh = Column.take_many([(col, rows) for rows in parts])
        reused = Column.take_many([(col, rows) for rows in parts], reuse)
        assert np.array_equal(fresh.values, reused.values)
        assert np.array_equal(fresh.valid, reused.valid)
        fresh_keys = EncodedKeys.take_many([(enc, rows) for rows in parts], 4)
        reused_keys = EncodedKeys.take_many([(enc, rows) for rows in parts], 4, reuse)
        for name in ("hashes", "words", "nulls"):
            assert np.array_equal(getattr(fresh_keys, name), getattr(reused_keys, name))
    assert np.shares_memory(reused.values, reuse.get("v:v", 1, np.float64))

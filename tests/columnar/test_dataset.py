"""``aggregate`` over a ``pyarrow.dataset.Dataset``: batches scanned, only needed columns read."""

from __future__ import annotations

import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from extagg import aggregate


def _write(tmp_path: pathlib.Path) -> tuple[ds.Dataset, pa.Table]:
    rng = np.random.default_rng(1)
    parts = []
    for i in range(3):
        t = pa.table(
            {
                "k": rng.integers(0, 50, 2000),
                "v": rng.normal(size=2000),
                "unused": pa.array([b"x" * 100] * 2000),
            }
        )
        pq.write_table(t, tmp_path / f"part{i}.parquet", row_group_size=500)
        parts.append(t)
    return ds.dataset(str(tmp_path), format="parquet"), pa.concat_tables(parts)


def test_dataset_matches_table(tmp_path: pathlib.Path) -> None:
    dataset, table = _write(tmp_path)
    aggs = {"n": ("*", "count"), "s": ("v", "sum")}
    got = aggregate(dataset, keys="k", aggs=aggs, force_spill_rows=700).to_pylist()
    want = aggregate(table, keys="k", aggs=aggs).to_pylist()
    key = lambda r: r["k"]  # noqa: E731
    got, want = sorted(got, key=key), sorted(want, key=key)
    assert [r["n"] for r in got] == [r["n"] for r in want]
    assert np.allclose([r["s"] for r in got], [r["s"] for r in want], rtol=1e-12)


def test_dataset_reads_only_needed_columns(tmp_path: pathlib.Path, monkeypatch) -> None:
    dataset, _ = _write(tmp_path)
    import extagg.columnar.api as api

    seen: list[pa.Schema] = []
    original = api.dataset_batches

    def spy(dataset, columns):
        for batch in original(dataset, columns):
            seen.append(batch.schema)
            yield batch

    monkeypatch.setattr(api, "dataset_batches", spy)
    out = aggregate(dataset, keys=[], aggs={"n": ("*", "count"), "m": ("v", "max")})
    assert out.column("n").to_pylist() == [6000]
    assert seen and all(schema.names == ["v"] for schema in seen)


def test_dataset_missing_column(tmp_path: pathlib.Path) -> None:
    dataset, _ = _write(tmp_path)
    with pytest.raises(ValueError, match=r"column 'nope' is not in the dataset.*'unused'"):
        aggregate(dataset, keys="nope", aggs={"n": ("*", "count")})

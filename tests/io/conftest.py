"""Small input files in every format, and a pandas reference to compare results with."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest


def sample_table(n: int = 5_000, seed: int = 7) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "k": rng.integers(0, 40, n),
            "s": pa.array(rng.choice(["x", "y", "z"], n)),
            "v": np.round(rng.random(n) * 100, 3),
            "q": rng.integers(1, 50, n).astype(np.int32),
        }
    )


def reference(table: pa.Table, by: list[str]) -> dict:
    """{key tuple: (count, sum v, max q)} computed with pandas."""
    df = table.to_pandas()
    g = df.groupby(by, dropna=False).agg(n=("v", "size"), sv=("v", "sum"), mq=("q", "max"))
    return {
        (k if isinstance(k, tuple) else (k,)): (int(r.n), float(r.sv), int(r.mq))
        for k, r in g.iterrows()
    }


def as_dict(result: pa.Table, by: list[str]) -> dict:
    rows = result.to_pylist()
    return {tuple(r[k] for k in by): (r["n"], r["sv"], r["mq"]) for r in rows}


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, (n, sv, mq) in want.items():
        gn, gsv, gmq = got[key]
        assert (gn, gmq) == (n, mq), key
        assert gsv == pytest.approx(sv, rel=1e-9), key


AGGS = {"n": ("*", "count"), "sv": ("v", "sum"), "mq": ("q", "max")}


@pytest.fixture
def table() -> pa.Table:
    return sample_table()

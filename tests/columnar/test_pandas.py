"""HashAggregator against pandas' groupby on random DataFrames (pandas input path too).

pandas conventions mapped to ours: a NaN in a pandas float column is a null; ``sum`` uses
``min_count=1`` (an all-null group sums to null); pandas' ``first``/``last`` skip nulls, so
they are compared with ``first_non_null``/``last_non_null``; a missing pandas result (NaN)
equals our null.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extagg.columnar import aggregate
from tests.columnar.reference import values_match

OURS = {
    "sum": ("v", "sum"), "mean": ("v", "mean"), "min": ("v", "min"), "max": ("v", "max"),
    "count": ("v", "count"), "size": ("*", "count"), "var": ("v", "var"), "std": ("v", "std"),
    "first": ("v", "first_non_null"), "last": ("v", "last_non_null"),
    "isum": ("w", "sum"), "imax": ("w", "max"), "imean": ("w", "mean"),
}  # fmt: skip


def _pandas(df: pd.DataFrame, keys: list[str]) -> dict:
    g = df.groupby(keys, dropna=False, sort=False)
    cols = {
        "sum": g["v"].sum(min_count=1), "mean": g["v"].mean(), "min": g["v"].min(),
        "max": g["v"].max(), "count": g["v"].count(), "size": g.size(), "var": g["v"].var(),
        "std": g["v"].std(), "first": g["v"].first(), "last": g["v"].last(),
        "isum": g["w"].sum(min_count=1), "imax": g["w"].max(), "imean": g["w"].mean(),
    }  # fmt: skip
    frame = pd.DataFrame(cols)
    out = {}
    for key, row in frame.iterrows():
        key = key if isinstance(key, tuple) else (key,)
        out[tuple(_none(k) for k in key)] = {c: _none(row[c]) for c in cols}
    return out


def _none(x):
    if x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x)):
        return None
    return x.item() if isinstance(x, np.generic) else x


@pytest.mark.parametrize("spill", [False, True])
@given(data=st.data())
def test_matches_pandas_groupby(spill, data, tmp_path) -> None:
    n = data.draw(st.integers(0, 120))
    users = data.draw(st.lists(st.one_of(st.none(), st.integers(-3, 3)), min_size=n, max_size=n))
    days = data.draw(
        st.lists(st.one_of(st.none(), st.sampled_from(["mon", "tue", ""])), min_size=n, max_size=n)
    )
    values = data.draw(st.lists(st.one_of(st.none(), st.floats(-1e3, 1e3)), min_size=n, max_size=n))
    ints = data.draw(st.lists(st.one_of(st.none(), st.integers(-1000, 1000)), min_size=n,
                              max_size=n))  # fmt: skip
    df = pd.DataFrame(
        {
            "user": pd.array(users, dtype="Int64"),
            "day": pd.Series(days, dtype="string"),
            "v": pd.Series([np.nan if v is None else v for v in values], dtype="float64"),
            "w": pd.array(ints, dtype="Int64"),
        }
    )
    options = {"force_spill_rows": 9, "batch_size": 4, "fan_in": 2} if spill else {}
    out = aggregate(df, keys=["user", "day"], aggs=OURS, memory="32m",
                    spill_dirs=[str(tmp_path)], **options)  # fmt: skip
    ours = {(r["user"], r["day"]): r for r in out.to_pylist()}
    theirs = _pandas(df, ["user", "day"]) if n else {}
    assert set(ours) == set(theirs)
    for key, want in theirs.items():
        for name, value in want.items():
            assert values_match(ours[key][name], value, rel=1e-9), (key, name, ours[key], value)

"""Sum and mean of duration columns: durations of the same unit, exact, the mean rounded half
away from zero (Spark's ``avg`` of a day-time interval), with spills and threads.

Compared with a plain-Python reference on the integer counts of the unit.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg import SumOverflowError
from extagg.columnar import aggregate
from extagg.columnar.functions import mean_half_up

I64 = 2**63


def _reference(keys: list[int], values: list[int | None]) -> dict[int, tuple[int | None, ...]]:
    sums: dict[int, list[int]] = {}
    for k, v in zip(keys, values, strict=True):
        sums.setdefault(k, [])
        if v is not None:
            sums[k].append(v)
    out: dict[int, tuple[int | None, ...]] = {}
    for k, vs in sums.items():
        if not vs:
            out[k] = (None, None)
            continue
        total = sum(vs)
        q, r = divmod(abs(total), len(vs))
        q += 2 * r >= len(vs)
        out[k] = (total, -q if total < 0 else q)
    return out


def _by_key(table: pa.Table, unit: str) -> dict[int, tuple[int | None, ...]]:
    ints = {name: table.column(name).cast(pa.int64()).to_pylist() for name in ("s", "m")}
    assert table.schema.field("s").type == pa.duration(unit)
    assert table.schema.field("m").type == pa.duration(unit)
    return {
        k: (s, m)
        for k, s, m in zip(table.column("k").to_pylist(), ints["s"], ints["m"], strict=True)
    }


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 30),
            st.one_of(st.none(), st.integers(-(10**12), 10**12), st.sampled_from([1, -1, 2, -2])),
        ),
        max_size=400,
    ),
    unit=st.sampled_from(["s", "ms", "us", "ns"]),
    threads=st.sampled_from([1, 2]),
)
def test_sum_and_mean_of_durations_match_reference(rows, unit, threads) -> None:
    keys = [k for k, _ in rows]
    values = [v for _, v in rows]
    table = pa.table({"k": pa.array(keys, pa.int64()), "d": pa.array(values, pa.duration(unit))})
    got = aggregate(
        table,
        "k",
        {"s": ("d", "sum"), "m": ("d", "avg")},
        memory="8m",
        force_spill_rows=37,
        threads=threads,
    )
    assert _by_key(got, unit) == _reference(keys, values)


def test_mean_rounds_half_away_from_zero_and_sums_past_int64() -> None:
    big = I64 - 1
    table = pa.table(
        {
            "k": [1, 1, 2, 2, 3, 3, 4, 5],
            "d": pa.array([1, 2, -1, -2, big, big, None, -big], pa.duration("ns")),
        }
    )
    got = aggregate(table, "k", {"m": ("d", "mean")}, memory="8m")
    means = dict(zip(got.column("k").to_pylist(), got.column("m").cast(pa.int64()).to_pylist()))
    assert means == {1: 2, 2: -2, 3: big, 4: None, 5: -big}  # 1.5 -> 2, -1.5 -> -2
    # the sum of group 3 (2 * (2**63 - 1)) does not fit its type: said, with the column
    with pytest.raises(SumOverflowError, match=r"sum of column 'd' \(duration\[ns\]\)"):
        aggregate(table, "k", {"s": ("d", "sum")}, memory="8m")


def test_mean_half_up_of_wide_sums_matches_python_integers() -> None:
    rng = np.random.default_rng(5)
    exact = [int(x) for x in rng.integers(-(2**62), 2**62, 200)]
    exact += [2**63 - 1, -(2**63) + 1, 3 * 2**62, -3 * 2**62, 2**100, -(2**100)]
    counts = [int(c) for c in rng.integers(1, 10, len(exact))]
    counts[-2:] = [2**40, 2**40]  # means that fit int64 of sums that do not
    lo = np.array([e & (2**64 - 1) for e in exact], dtype=np.uint64)
    hi = np.array([e >> 64 for e in exact], dtype=np.int64)
    n = np.array(counts, dtype=np.int64)
    expected = []
    for e, c in zip(exact, counts, strict=True):
        q, r = divmod(abs(e), c)
        q += 2 * r >= c
        expected.append(-q if e < 0 else q)
    fits = [abs(x) < I64 for x in expected]
    assert mean_half_up(lo, hi, n)[fits].tolist() == [x for x, f in zip(expected, fits) if f]


def test_variance_of_a_duration_and_sum_of_a_timestamp_still_refused() -> None:
    table = pa.table({"k": [1], "d": pa.array([1], pa.duration("s"))})
    with pytest.raises(TypeError, match=r"var\('d'\).*duration\[s\]"):
        aggregate(table, "k", {"v": ("d", "var")}, memory="8m")
    ts = pa.table({"k": [1], "t": pa.array([1], pa.timestamp("s"))})
    with pytest.raises(TypeError, match=r"sum\('t'\).*timestamp\[s\]"):
        aggregate(ts, "k", {"s": ("t", "sum")}, memory="8m")

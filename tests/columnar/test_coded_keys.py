"""Dictionary-coded key columns (``columnar/coded_keys.py``): folded by their codes, the same
answers as a pyarrow GROUP BY of the decoded keys and as the engine's own per-row path."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg.columnar import HashAggregator
from extagg.columnar.coded_keys import (
    KEPT_COMBINATIONS,
    CodedKeys,
    coded_keys,
    max_combinations,
)

AGGS = {
    "n": ("*", "count"),
    "s": ("v", "sum"),
    "lo": ("v", "min"),
    "hi": ("v", "max"),
    "c": ("v", "count"),
    "m": ("v", "mean"),
}
ORDER_AGGS = {"f": ("v", "first"), "l": ("v", "last"), "fs": ("v2", "first")}

FLAGS = st.one_of(st.none(), st.sampled_from(["A", "N", "R", "", "é"]))
STATUS = st.one_of(st.none(), st.sampled_from(["F", "O"]))
VALUES = st.one_of(st.none(), st.integers(-(2**40), 2**40))


def _dictionary(values: list[str | None], shuffle: int, extra: list[str]) -> pa.DictionaryArray:
    """``values`` dictionary-encoded with unused and repeated dictionary entries, in an order
    that depends on ``shuffle``: a dictionary need not be minimal, sorted or unique."""
    distinct = sorted({v for v in values if v is not None})
    rng = np.random.default_rng(shuffle)
    dictionary = list(rng.permutation(np.array(distinct + extra, dtype=object))) + distinct[:1]
    position = {v: i for i, v in enumerate(dictionary)}
    codes = pa.array([None if v is None else position[v] for v in values], pa.int32())
    return pa.DictionaryArray.from_arrays(codes, pa.array(dictionary, pa.string()))


def _batches(rows, batch_rows: int, shuffle: int, plain_every: int):
    """Record batches of ``rows`` (flag, status, v, v2): keys dictionary-coded, every
    ``plain_every``-th batch plain strings (both kinds in one run)."""
    out = []
    for k, start in enumerate(range(0, len(rows), batch_rows)):
        part = rows[start : start + batch_rows]
        flags = [r[0] for r in part]
        status = [r[1] for r in part]
        v = pa.array([r[2] for r in part], pa.int64())
        v2 = pa.array([None if r[2] is None else str(r[2]) for r in part], pa.string())
        if plain_every and k % plain_every == plain_every - 1:
            cols = [pa.array(flags, pa.string()), pa.array(status, pa.string())]
        else:
            cols = [_dictionary(flags, shuffle + k, ["zz"]), _dictionary(status, shuffle, [])]
        out.append(pa.record_batch([*cols, v, v2], names=["flag", "status", "v", "v2"]))
    return out


def _result(agg: HashAggregator) -> dict:
    table = pa.Table.from_batches(list(agg.results()))
    keys = list(zip(table.column("flag").to_pylist(), table.column("status").to_pylist()))
    cols = [c for c in table.column_names if c not in ("flag", "status")]
    rows = dict(zip(keys, zip(*(table.column(c).to_pylist() for c in cols))))
    assert len(rows) == len(keys), "a group came out twice"
    return rows


def _run(batches, aggs, **options) -> dict:
    with HashAggregator(["flag", "status"], aggs, **options) as agg:
        for b in batches:
            agg.update(b)
        return _result(agg)


def _pyarrow_reference(rows) -> dict:
    table = pa.table(
        {
            "flag": pa.array([r[0] for r in rows], pa.string()),
            "status": pa.array([r[1] for r in rows], pa.string()),
            "v": pa.array([r[2] for r in rows], pa.int64()),
        }
    )
    grouped = table.group_by(["flag", "status"], use_threads=False).aggregate(
        [([], "count_all"), ("v", "sum"), ("v", "min"), ("v", "max"), ("v", "count")]
    )
    out = {}
    for row in grouped.to_pylist():
        out[(row["flag"], row["status"])] = (
            row["count_all"], row["v_sum"], row["v_min"], row["v_max"], row["v_count"],
        )  # fmt: skip
    return out


ROWS = st.lists(st.tuples(FLAGS, STATUS, VALUES), min_size=1, max_size=300)


@settings(max_examples=60, deadline=None)
@given(ROWS, st.integers(1, 70), st.integers(0, 1000), st.sampled_from([0, 2, 3]))
def test_coded_keys_match_pyarrow_group_by(rows, batch_rows, shuffle, plain_every):
    batches = _batches(rows, batch_rows, shuffle, plain_every)
    got = _run(batches, AGGS)
    want = _pyarrow_reference(rows)
    assert set(got) == set(want)
    for key, (n, s, lo, hi, c, m) in got.items():
        assert (n, s, lo, hi, c) == want[key]
        if c:
            assert m == pytest.approx(s / c)
        else:
            assert m is None


@settings(max_examples=40, deadline=None)
@given(ROWS, st.integers(1, 70), st.integers(0, 1000), st.integers(1, 40))
def test_coded_keys_with_spills_equal_the_per_row_path(rows, batch_rows, shuffle, every):
    """First/last (row order), string states, forced spills and merges: the same as the
    batches with their keys decoded, which take the engine's per-row path."""
    aggs = {**AGGS, **ORDER_AGGS, "smin": ("v2", "min")}
    coded = _batches(rows, batch_rows, shuffle, 0)
    plain = [
        pa.record_batch(
            [c.dictionary_decode() if pa.types.is_dictionary(c.type) else c for c in b.columns],
            names=b.schema.names,
        )
        for b in coded
    ]
    want = _run(plain, aggs)
    assert _run(coded, aggs) == want
    assert _run(coded, aggs, force_spill_rows=every, fan_in=2) == want


@settings(max_examples=30, deadline=None)
@given(ROWS, st.integers(1, 70), st.integers(0, 1000), st.integers(1, 4))
def test_coded_keys_after_a_spill_asked_by_another_consumer(rows, batch_rows, shuffle, every):
    """A spill the memory manager asks for (another consumer needs the memory) releases the
    table and its string-state arena; the next coded chunk must make them again (it asserted
    on the missing arena: ``extagg aggregate`` crashed on any string key with a string
    min/max/first/last once the scan's memory made the aggregator spill)."""
    aggs = {**ORDER_AGGS, "smin": ("v2", "min"), "smax": ("v2", "max"), "n": ("*", "count")}
    coded = _batches(rows, batch_rows, shuffle, 0)
    want = _run(coded, aggs)
    with HashAggregator(["flag", "status"], aggs) as agg:
        for i, b in enumerate(coded):
            agg.update(b)
            if i % every == 0:
                agg.spill(1 << 40, None)
        assert _result(agg) == want
        assert agg.metrics.spill_count >= 1


def _fold_counting_encodes(agg: HashAggregator, batches) -> tuple[dict, list[int]]:
    """Fold ``batches`` with ``agg`` and give its result and the number of keys each call of
    its key encoding took, from the second batch on (the first learns the types on the
    per-row path)."""
    encoded: list[int] = []
    real = agg._encode

    def spy(cols, n=None):
        out = real(cols, n)
        encoded.append(len(out.hashes))
        return out

    with agg:
        agg.update(batches[0])
        agg._encode = spy  # type: ignore[method-assign]
        for b in batches[1:]:
            agg.update(b)
        return _result(agg), encoded


def test_the_codes_path_hashes_the_combinations_not_the_rows():
    """The keys encoded (hashed, placed in the table) are the few combinations present, not
    one per row: the path is taken, and gives the answer."""
    rows = [("A" if i % 3 else "R", "F" if i % 2 else None, i) for i in range(50_000)]
    batches = _batches(rows, 20_000, 7, 0)
    agg = HashAggregator(["flag", "status"], AGGS, memory="64m")
    got, encoded = _fold_counting_encodes(agg, batches)
    assert got == {
        key: (n, s, lo, hi, c, pytest.approx(s / c))
        for key, (n, s, lo, hi, c) in _pyarrow_reference(rows).items()
    }
    # one batch whole, its few new combinations encoded (none when all were seen before)
    assert encoded and max(encoded) <= 6 and len(encoded) <= len(batches) - 1


def test_decimal_values_and_wide_keys_by_codes():
    """Decimal sums and means (Spark's types and rounding) over coded keys equal the per-row
    path's; a dictionary of binaries works as one of strings."""
    values = [Decimal("1.25"), Decimal("-3.10"), None, Decimal("99999999.99")] * 500
    keys = [b"x", b"y", None, b"x"] * 500
    dec = pa.array(values, pa.decimal128(15, 2))
    coded = pa.array(keys, pa.binary()).dictionary_encode()
    aggs = {"s": ("d", "sum"), "m": ("d", "mean"), "n": ("*", "count")}
    results = []
    for key_col in (coded, coded.dictionary_decode()):
        batch = pa.record_batch([key_col, dec], names=["k", "d"])
        with HashAggregator(["k"], aggs) as agg:
            agg.update(batch.slice(0, 100))
            agg.update(batch.slice(100))
            table = pa.Table.from_batches(list(agg.results()))
        results.append(sorted(table.to_pylist(), key=lambda r: (r["k"] is None, r["k"] or b"")))
    assert results[0] == results[1]
    assert results[0][0]["s"] == Decimal("1.25") * 500 + Decimal("99999999.99") * 500


def test_many_combinations_fall_back_to_decoding():
    """More possible combinations than a chunk's rows: the keys are decoded (same answer)."""
    n = 3000
    dictionary = pa.array([f"k{i}" for i in range(n)])
    codes = pa.array(np.arange(n, dtype=np.int32)[::-1] % 7)
    arr = pa.DictionaryArray.from_arrays(codes, dictionary)
    batch = pa.record_batch([arr, arr, pa.array(np.arange(n))], names=["a", "b", "v"])
    ck = coded_keys(batch, ["a", "b"])
    assert ck is not None and ck.combinations() is None  # 3000 * 3000 > max_combinations
    with HashAggregator(["a", "b"], {"s": ("v", "sum")}) as agg:
        agg.update(batch.slice(0, 10))
        agg.update(batch.slice(10))
        got = {(r["a"], r["b"]): r["s"] for r in pa.Table.from_batches(agg.results()).to_pylist()}
    want: dict = {}
    for i in range(n):
        key = (f"k{(n - 1 - i) % 7}",) * 2
        want[key] = want.get(key, 0) + i
    assert got == want


def _python_combinations(ck: CodedKeys) -> list[tuple]:
    """The reference: each row's key values, decoded one by one."""
    return list(zip(*(arr.to_pylist() for arr in ck.arrays)))


@given(
    st.lists(st.tuples(FLAGS, STATUS, st.one_of(st.none(), st.integers(0, 3))), min_size=1,
             max_size=80),
    st.integers(0, 100),
)  # fmt: skip
def test_combinations_decode_to_the_rows_keys(rows, shuffle):
    """Every row's combination number names its own key values (a null as its own code), and
    the key columns of the combinations present decode to exactly the distinct keys."""
    a = _dictionary([r[0] for r in rows], shuffle, ["q"])
    b = _dictionary([r[1] for r in rows], shuffle + 1, [])
    c = pa.array([r[2] for r in rows], pa.int64()).dictionary_encode()
    ck = CodedKeys(["a", "b", "c"], [a, b, c])
    found = ck.combinations()
    assert found is not None
    combo, total = found
    assert total <= max(max_combinations(len(rows)), KEPT_COMBINATIONS)
    assert combo.min() >= 0 and combo.max() < total
    lookup = np.full(total, -1, dtype=np.int64)
    present = ck.missing(combo, total, lookup)
    cols = ck.key_columns(present)
    decoded = list(zip(*(_decode(cols[k]) for k in ("a", "b", "c"))))
    keys = _python_combinations(ck)
    by_combo = {int(cmb): key for cmb, key in zip(combo, keys)}
    assert sorted(by_combo) == list(present)
    assert [by_combo[int(p)] for p in present] == decoded
    # rows with the same key values: the same combination, unless a dictionary repeats a value
    lookup[present[:1]] = 0
    assert list(ck.missing(combo, total, lookup)) == list(present[1:])


def _decode(col) -> list:
    """A column from ``key_columns`` back to Python values."""
    if col.is_var:
        out = []
        for i in range(len(col)):
            if col.valid is not None and not col.valid[i]:
                out.append(None)
            else:
                out.append(bytes(col.data[col.offsets[i] : col.offsets[i + 1]]).decode())
        return out
    values = col.values.tolist()
    return [None if col.valid is not None and not col.valid[i] else v for i, v in enumerate(values)]


def test_non_dictionary_keys_are_not_coded():
    batch = pa.record_batch(
        [pa.array(["a"]).dictionary_encode(), pa.array(["b"])], names=["x", "y"]
    )
    assert coded_keys(batch, ["x", "y"]) is None
    assert coded_keys(batch, ["x"]) is not None
    assert coded_keys(batch, []) is None
    assert coded_keys(batch, ["nope"]) is None


CODE_TYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32]


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(
        st.tuples(
            st.sampled_from(CODE_TYPES),
            st.integers(1, 6),  # dictionary length
            st.booleans(),  # has nulls
        ),
        min_size=1,
        max_size=3,
    ),
    rows=st.integers(0, 40),
    seed=st.integers(0, 2**32 - 1),
)
def test_code_kernels_match_their_references(keys, rows, seed):
    """``combine_codes`` and ``lookup_groups`` (numba) against their pure-Python references,
    on codes of every integer type, nulls whose slots hold garbage, and lookups with holes."""
    from extagg.columnar import _key_kernels as K
    from extagg.columnar import _key_reference as R

    rng = np.random.default_rng(seed)
    combo_k = np.empty(rows, dtype=np.int64)
    combo_r = np.empty(rows, dtype=np.int64)
    total = 1
    for i, (dtype, length, nulls) in enumerate(keys):
        base = length + (1 if nulls else 0)
        total *= base
        codes = rng.integers(0, length, rows).astype(dtype)
        valid = rng.random(rows) < 0.7 if nulls else np.zeros(0, dtype=np.bool_)
        if nulls:
            codes[~valid] = np.iinfo(dtype).max  # a null's slot: garbage
        K.combine_codes(combo_k, codes, valid, base, i == 0)
        R.combine_codes(combo_r, codes, valid, base, i == 0)
    assert combo_k.tolist() == combo_r.tolist()
    assert all(0 <= c < total for c in combo_k.tolist())
    lookup = np.where(rng.random(total) < 0.5, rng.integers(0, 100, total), -1).astype(np.int64)
    gids_k = np.empty(rows, dtype=np.int64)
    gids_r = np.empty(rows, dtype=np.int64)
    misses = K.lookup_groups(combo_k, lookup, gids_k)
    assert misses == R.lookup_groups(combo_r, lookup, gids_r)
    assert gids_k.tolist() == gids_r.tolist() == lookup[combo_r].tolist()
    assert misses == int((lookup[combo_r] < 0).sum())


def test_lookups_of_several_dictionary_orders_are_kept():
    """A CSV parser gives each block its dictionaries in the order the block met the values:
    the lookups of the last few orders are kept, so blocks that cycle through them encode
    nothing after the first of each; a spill or another table starts afresh, and the
    oldest of more orders than kept is dropped."""
    from extagg.columnar.coded_keys import KEPT_DICTIONARY_SETS, CodedLookup

    def coded(order: list[str], status: list[str]) -> CodedKeys:
        flag = pa.DictionaryArray.from_arrays(pa.array([0, 1, 2, 0], pa.int32()), order)
        st = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0, 1], pa.int32()), status)
        return CodedKeys(["flag", "status"], [flag, st])

    orders = [
        (["A", "N", "R"], ["F", "O"]),
        (["N", "A", "R"], ["O", "F"]),
        (["R", "A", "N"], ["F", "O"]),
    ]

    class Table:
        pass

    table = Table()
    kept = CodedLookup()
    first = [kept.get(table, 0, coded(*o), 6) for o in orders]
    assert len({id(lookup) for lookup in first}) == 3
    for i, o in enumerate(orders * 4):
        assert kept.get(table, 0, coded(*o), 6) is first[i % 3]
    assert kept.get(table, 1, coded(*orders[0]), 6) is not first[0]  # after a spill
    assert kept.get(Table(), 1, coded(*orders[0]), 6) is not first[0]  # another table
    letters = [chr(ord("a") + i) for i in range(KEPT_DICTIONARY_SETS + 1)]
    many = [([letters[i], "x", "y"], ["F", "O"]) for i in range(KEPT_DICTIONARY_SETS + 1)]
    lookups = [kept.get(table, 1, coded(*o), 6) for o in many]
    assert kept.get(table, 1, coded(*many[-1]), 6) is lookups[-1]
    assert kept.get(table, 1, coded(*many[0]), 6) is not lookups[0]  # the oldest went

    # end to end: batches cycling through three orders encode each order's combinations once
    batches = []
    for i in range(12):
        order, status = orders[i % 3]
        flag = pa.DictionaryArray.from_arrays(pa.array([0, 1, 2, 1] * 50, pa.int32()), order)
        st = pa.DictionaryArray.from_arrays(pa.array([0, 1, 1, 0] * 50, pa.int32()), status)
        v = pa.array(range(i * 200, i * 200 + 200), pa.int64())
        batches.append(
            pa.record_batch([flag, st, v, v.cast(pa.string())], names=["flag", "status", "v", "v2"])
        )
    agg = HashAggregator(["flag", "status"], AGGS, memory="64m")
    got, encoded = _fold_counting_encodes(agg, batches)
    assert len(encoded) == 3, encoded  # orders 2, 3 and 1 (the first batch's went per row)
    rows = [
        (b.column(0)[j].as_py(), b.column(1)[j].as_py(), b.column(2)[j].as_py())
        for b in batches
        for j in range(b.num_rows)
    ]
    assert {k: v[0] for k, v in got.items()} == {
        k: v[0] for k, v in _pyarrow_reference(rows).items()
    }


def test_dictionaries_of_string_views_as_keys_and_values() -> None:
    """Polars exports ``Categorical``/``Enum`` columns as dictionaries of string views, which
    Arrow can neither decode nor take from: both raised ``ArrowNotImplementedError``."""
    codes = pa.array([0, 1, 0, None, 2], pa.uint32())
    view = pa.DictionaryArray.from_arrays(codes, pa.array(["a", "b", "c"], pa.string_view()))
    binary = pa.DictionaryArray.from_arrays(codes, pa.array([b"x", b"y", b"z"], pa.binary_view()))
    batch = pa.record_batch({"k": view, "b": binary, "v": [1, 2, 3, 4, 5]})
    aggs = {"s": ("v", "sum"), "top": ("k", "max"), "low": ("b", "min")}
    with HashAggregator(["k"], aggs, memory="2m", force_spill_rows=3) as agg:
        for _ in range(3):  # the first batch decoded, the next ones by their codes
            agg.update(batch)
        got = {r["k"]: (r["s"], r["top"], r["low"]) for b in agg.results() for r in b.to_pylist()}
    assert got == {"a": (12, "a", b"x"), "b": (6, "b", b"y"), "c": (15, "c", b"z"),
                   None: (12, None, None)}  # fmt: skip

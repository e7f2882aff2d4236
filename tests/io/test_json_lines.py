"""JSON Lines output built a column at a time: the same bytes as a ``json.dumps`` per row."""

from __future__ import annotations

import datetime as dt
import decimal
import json

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg.io.output import json_lines, json_lines_by_row

FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0.0, -0.0, 1.0, 1e-5, 1e15, 1e16, 1.5e-7, 2.0**53 + 1, 5e-324, 0.1]
)
TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=8) | st.sampled_from(
    ['"', "\\", "\n\t\r\b\f", "\x00\x1f\x7f", "\u2028é😀", ""]
)
#: (Arrow type, values) of every kind of column a result may hold
COLUMNS = {
    "int8": (pa.int8(), st.integers(-128, 127)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "uint64": (pa.uint64(), st.integers(0, 2**64 - 1)),
    "bool": (pa.bool_(), st.booleans()),
    "float64": (pa.float64(), FLOATS),
    "float32": (pa.float32(), st.floats(width=32)),
    "string": (pa.string(), TEXT),
    "large_string": (pa.large_string(), TEXT),
    "decimal(25,2)": (pa.decimal128(25, 2), st.decimals(-(10**22), 10**22, places=2)),
    "decimal(38,10)": (  # str() writes those under 1e-6 with an exponent: 1E-7
        pa.decimal128(38, 10),
        st.decimals(-(10**27), 10**27, places=10)
        | st.sampled_from([decimal.Decimal(v) for v in ("1E-10", "0.0000001", "-0.0000009999")]),
    ),
    "decimal(10,0)": (pa.decimal128(10, 0), st.decimals(-(10**9), 10**9, places=0)),
    "date32": (pa.date32(), st.dates()),
    "timestamp[us]": (pa.timestamp("us"), st.datetimes()),
    "timestamp[us,UTC]": (
        pa.timestamp("us", "UTC"),
        st.datetimes(timezones=st.just(dt.timezone.utc)),
    ),
    "timestamp[ns]": (pa.timestamp("ns"), st.integers(-(2**62), 2**62)),
    "timestamp[s,UTC]": (pa.timestamp("s", "UTC"), st.integers(-(10**10), 10**10)),
    "timestamp[ms]": (pa.timestamp("ms"), st.integers(-(10**13), 10**13) | st.just(1_000)),
    "timestamp[ms,Asia/Kolkata]": (pa.timestamp("ms", "Asia/Kolkata"), st.integers(0, 10**13)),
    "duration[s]": (pa.duration("s"), st.integers(-(10**9), 10**9)),
    "binary": (pa.binary(), st.binary(max_size=6)),
    "list<double>": (pa.list_(pa.float64()), st.lists(FLOATS, max_size=3)),
    "struct": (
        pa.struct([("a", pa.int64()), ("b", pa.string())]),
        st.fixed_dictionaries({"a": st.integers(-5, 5), "b": TEXT}),
    ),
}


#: what every column name of a batch ends with (a quote a writer must escape)
QUOTED_SUFFIX = st.just(' "q"')


@st.composite
def batches(
    draw: st.DrawFn,
    columns: dict[str, tuple[pa.DataType, st.SearchStrategy]] = COLUMNS,
    suffixes: st.SearchStrategy[str] = QUOTED_SUFFIX,
) -> pa.RecordBatch:
    """1-4 of ``columns`` (name -> type, values), 1-12 rows after an offset, with nulls; each
    column named by its kind and a drawn suffix."""
    names = draw(st.lists(st.sampled_from(sorted(columns)), min_size=1, max_size=4, unique=True))
    rows = draw(st.integers(1, 12))
    arrays = []
    for name in names:
        typ, values = columns[name]
        data = draw(st.lists(st.none() | values, min_size=rows + 2, max_size=rows + 2))
        arrays.append(pa.array(data, typ).slice(1, rows))  # an offset, as a result's slices
    return pa.RecordBatch.from_arrays(arrays, names=[n + draw(suffixes) for n in names])


@settings(max_examples=300, deadline=None)
@given(batches())
def test_json_lines_equal_a_dumps_per_row(batch):
    assert json_lines(batch) == json_lines_by_row(batch)


def test_every_line_is_json_and_non_finite_floats_are_strings():
    batch = pa.record_batch(
        {
            "k": pa.array([1, None, 3], pa.int64()),
            "x": [1.5, float("nan"), float("-inf")],
            "s": ['a"b\\', None, "\x01"],
            "d": pa.array(
                [decimal.Decimal("1.50"), None, decimal.Decimal("-0.01")], pa.decimal128(12, 2)
            ),
        }
    )
    text = json_lines(batch)
    assert text == json_lines_by_row(batch)
    rows = [json.loads(line) for line in text.decode().splitlines()]
    assert rows == [
        {"k": 1, "x": 1.5, "s": 'a"b\\', "d": "1.50"},
        {"k": None, "x": "NaN", "s": None, "d": None},
        {"k": 3, "x": "-Infinity", "s": "\x01", "d": "-0.01"},
    ]


@pytest.mark.parametrize("rows", [0, 3])
def test_a_batch_of_no_columns(rows):
    batch = pa.record_batch([pa.array(range(rows))], names=["k"]).select([])
    assert json_lines(batch) == json_lines_by_row(batch) == b"{}\n" * rows

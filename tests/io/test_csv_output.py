"""CSV/TSV output: fields quoted only where they must be, by compiled kernels that write the
bytes of the per-field Python reference, and read back as the rows Arrow's own writer gives."""

from __future__ import annotations

import csv
import io

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg.io.output import _binary_as_base64, csv_header, csv_lines, csv_lines_by_row
from tests.io.test_json_lines import COLUMNS, batches

DELIMITERS = st.sampled_from([",", "\t"])
#: text that is mostly what a CSV field must be quoted for
CSV_TEXT = st.text(alphabet=st.sampled_from('ab,\t"\r\n é\x00'), max_size=6) | st.text(max_size=4)
CSV_COLUMNS = {
    **COLUMNS,
    "string": (pa.string(), CSV_TEXT),
    "large_string": (pa.large_string(), CSV_TEXT),
    "dictionary": (pa.dictionary(pa.int32(), pa.string()), CSV_TEXT),
}


def csv_batches() -> st.SearchStrategy[pa.RecordBatch]:
    """Batches whose text (values and column names) is mostly what CSV must quote."""
    return batches(CSV_COLUMNS, CSV_TEXT)


@settings(max_examples=300, deadline=None)
@given(csv_batches(), DELIMITERS)
def test_csv_lines_equal_the_per_field_reference(batch, delimiter):
    batch = _binary_as_base64(batch)  # as the writer hands them over: binaries as base64 text
    assert csv_lines(batch, delimiter) == csv_lines_by_row(batch, delimiter)


def _rows(text: bytes, delimiter: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text.decode("utf-8"), newline=""), delimiter=delimiter))


@settings(max_examples=200, deadline=None)
@given(csv_batches(), DELIMITERS)
def test_read_back_as_the_rows_arrows_writer_gives(batch, delimiter):
    """The same fields as Arrow's CSV writer (which quotes every string), read by Python's
    ``csv`` module: only the quoting differs."""
    batch = _binary_as_base64(batch)
    arrow = io.BytesIO()
    pacsv.write_csv(batch, arrow, pacsv.WriteOptions(delimiter=delimiter))
    ours = csv_header(batch.schema.names, delimiter) + csv_lines(batch, delimiter)
    assert _rows(ours, delimiter) == _rows(arrow.getvalue(), delimiter)


def test_only_the_fields_that_need_it_are_quoted():
    batch = pa.record_batch(
        {
            "k": pa.array(["a", "b,c", 'q"', "", None, "x\ny", "cr\r", "t\tab"]),
            "n": pa.array([1, 2, None, 4, 5, 6, 7, 8], pa.int64()),
        }
    )
    assert csv_lines(batch, ",").decode().split("\n")[:-1] == [
        "a,1", '"b,c",2', '"q""",', '"",4', ",5", '"x', 'y",6', '"cr\r",7', "t\tab,8"
    ]  # fmt: skip
    assert csv_lines(batch, "\t").decode().endswith('"cr\r"\t7\n"t\tab"\t8\n')
    assert csv_header(["a", "b c", 'x"', "d,e"], ",") == b'a,b c,"x""","d,e"\n'


@pytest.mark.parametrize("rows", [0, 1, 70_000])
def test_sizes_and_offsets(rows):
    """A sliced string column (an offset into its buffers) and a batch larger than a chunk."""
    values = pa.array([f"v{i}" if i % 3 else f"v,{i}" for i in range(rows + 5)])
    batch = pa.record_batch({"s": values.slice(5, rows), "i": pa.array(range(rows), pa.int64())})
    assert csv_lines(batch) == csv_lines_by_row(batch)
    assert len(_rows(csv_lines(batch), ",")) == rows

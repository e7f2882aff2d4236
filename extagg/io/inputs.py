"""Input files as a stream of record batches: Parquet through Parquet's own reader (a batch
of rows at a time), CSV/TSV/JSON Lines through Arrow's streaming readers held a few blocks
ahead (:class:`_GatedStream`), Arrow IPC streams a record batch at a time, hive-partitioned
Parquet and Arrow IPC files through ``pyarrow.dataset``.

:func:`open_input` resolves paths, globs and directories (hive-partitioned folders become
columns), picks the format from the extension (``.parquet``, ``.csv``/``.tsv``, ``.jsonl``,
``.arrow``/``.feather``, ``.arrows``; ``.gz``/``.zst``/``.bz2`` text is decompressed while
read) or from ``format``, unifies the schemas of the files over the columns the query needs
(missing columns read as nulls, numbers widened) and returns an :class:`InputScan`. Its
:meth:`InputScan.batches` reads only the needed columns, pushes the filter into the scan
(Parquet row groups whose statistics exclude it are never read) and never holds more than a
few batches.
"""

from __future__ import annotations

import atexit
import contextlib
import csv
import difflib
import functools
import logging
import os
import re
import time
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from extagg._input_paths import COMPRESSION_CODECS, expand_input_paths
from extagg._names import is_plain_name
from extagg.errors import InputError, QueryError

__all__ = ["InputScan", "ScanProgress", "open_input", "parse_type", "row_bytes", "FORMATS"]

log = logging.getLogger(__name__)
#: a CSV key column is parsed as a dictionary when its first block holds at most one distinct
#: value in this many rows, and at most :data:`CODED_SAMPLE_VALUES` values
CODED_SAMPLE_RATIO = 16
CODED_SAMPLE_VALUES = 1 << 12
#: rows of that block counted first (see :meth:`InputScan.few_distinct`)
CODED_PREFIX_ROWS = 1 << 15

FORMATS = ("parquet", "csv", "tsv", "json", "ipc")
_EXT = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".txt": "csv",
    ".jsonl": "json",
    ".ndjson": "json",
    ".json": "json",
    ".arrow": "ipc",
    ".ipc": "ipc",
    ".feather": "ipc",
    ".arrows": "ipc",
}
_LOCAL = pafs.LocalFileSystem()
_HIVE = re.compile(r"^([^=/]+)=([^/]*)$")


@dataclass
class ScanProgress:
    """What has been read so far (updated while :meth:`InputScan.batches` runs)."""

    rows: int = 0  # read: before the filter drops any
    bytes: int = 0
    files_done: int = 0
    row_groups_read: int = 0


#: CSV/JSON blocks a text scan reads ahead of the parsed batches taken from Arrow's reader.
#: The reader needs the block after the one it parses (to finish that one's last row), so
#: two ahead left the parse and the fold taking turns (TPC-H Q1 on SF1 CSV, one thread:
#: 1.9 s against 1.6 s for four or more, or for Arrow's own 32)
TEXT_BLOCKS_AHEAD = 4
#: blocks' worth of memory a text scan holds at most, raw or parsed: those read ahead, the
#: parser's copies of those it parses, their columns, the batches queued and folded
#: (measured in Arrow's pool on TPC-H lineitem CSV, four ahead: 6 blocks with one parsing
#: thread, 11 with two; see ``_ScanMemory`` in :mod:`extagg.io.run`)
TEXT_BLOCKS_HELD = 3 * TEXT_BLOCKS_AHEAD
#: the largest block of CSV/JSON text parsed at once (a record must fit in one)
MAX_TEXT_BLOCK_BYTES = 1 << 22


def text_blocks_held(ahead: int) -> int:
    """Blocks' worth of memory a text scan holds with ``ahead`` blocks read ahead."""
    return 3 * ahead


@dataclass
class InputScan:
    """The resolved input: files, format, unified schema, and the scan to run."""

    files: list[str]
    format: str
    schema: pa.Schema
    columns: list[str]
    filter: Any
    total_bytes: int
    total_rows: int | None  # known for Parquet (after row-group pruning)
    row_groups_total: int
    row_groups_selected: int
    #: Parquet files left out by their folder names (see :func:`_prune_row_groups`)
    files_skipped: int = 0
    batch_rows: int = 65_536
    #: batches decoded ahead of the one being folded (by a reader thread, so that decoding
    #: overlaps the aggregation); fragments (row groups, text files) are read one at a time
    readahead: int = 1
    #: bytes of CSV/JSON text parsed at once (one block becomes one batch)
    block_bytes: int = MAX_TEXT_BLOCK_BYTES
    #: CSV/JSON blocks read ahead of the parsed batches taken (fewer under a tiny budget);
    #: the scan then holds up to :func:`text_blocks_held` blocks
    text_blocks_ahead: int = TEXT_BLOCKS_AHEAD
    #: string columns read as dictionary arrays, the query's keys, grouped by their codes:
    #: from Parquet as the file's dictionary pages hold them (codes and the values once);
    #: from CSV/TSV parsed so (see :meth:`few_distinct`)
    dictionary_columns: list[str] = field(default_factory=list)
    #: the columns the filter reads
    filter_columns: list[str] = field(default_factory=list)
    #: the filter evaluated eagerly on a batch (a boolean mask, or None: use ``filter``)
    filter_mask: Callable[[pa.RecordBatch], pa.Array | None] | None = None
    #: whether a Parquet batch's filter step may be left to the consumer when it waits for
    #: the reader (see :func:`_prefetched`): it then holds the unfiltered batch and its
    #: filtered copy while the reader decodes the next, one batch more than the scan's
    #: share of the budget counts otherwise; the run allows it only while that share has room
    filter_on_consumer: bool = True
    progress: ScanProgress = field(default_factory=ScanProgress)
    _parts: list[tuple[str, Any, ds.FileFormat, dict[str, Any]]] = field(default_factory=list)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The needed columns of every row the filter keeps, a batch at a time.

        One reader thread for all the files, one after the other (a thread per file cost
        ~3 ms a file, 0.9 of 1.0 s on 300 small Parquet files): it goes on to the next file
        while the last batches of one are folded. A file's end comes through the queue as a
        marker, so the progress and an error's file are those of the batches taken."""
        parts = self._parts
        current = 0
        pieces = _prefetched(
            self._pieces(), self.readahead, _finish_piece, lambda: self.filter_on_consumer
        )
        small = _SmallBatches()
        try:
            for out in pieces:
                if isinstance(out, _FileEnd):
                    for index in range(out.first if out.first >= 0 else out.index, out.index + 1):
                        path, _dataset, fmt, opts = parts[index]
                        self.progress.files_done += 1
                        self.progress.bytes += _size(path)
                        if fmt == "parquet":
                            self.progress.row_groups_read += opts.get("row_groups", 0)
                    current = out.index + 1
                else:
                    batch, rows_read = out
                    self.progress.rows += rows_read  # before the filter: the rows read
                    if batch is not None and batch.num_rows:
                        yield from small.add(batch, self.batch_rows // COALESCE_DIVISOR)
        except (pa.ArrowInvalid, pa.ArrowIOError, pa.ArrowNotImplementedError, OSError) as exc:
            path, _dataset, fmt, opts = parts[current]
            raise self._read_error(path, fmt, exc, opts) from exc
        yield from small.flush()

    def _pieces(self) -> Iterator[_Piece | _FileEnd]:
        """Every file's decoded batches, each with the step left to finish it (the filter,
        the columns), then the file's end.

        Small Parquet files (fewer rows than a gathered batch: a streaming job's output, a
        folder per day) are finished here and gathered, in order, into one piece followed by
        one end for all of them: a piece and an end per file, each handed over between the
        threads, cost more than reading the file (6 120 files of 33 rows: 7.1 s of which
        2.2 s reading)."""
        small = _SmallFiles()
        finish_small = _FilterStep(self.columns, self.filter)  # one for every small file
        for index, (path, dataset, _fmt, opts) in enumerate(self._parts):
            least = max(1, self.batch_rows // COALESCE_DIVISOR)
            if "row_group_ids" in opts and opts.get("rows", least) < least:
                try:
                    for item in _parquet_batches(
                        path, opts["row_group_ids"], opts["schema"], self.filter,
                        lambda: self.batch_rows, self.dictionary_columns, self.filter_mask,
                        opts.get("folder_values"),
                    ):  # fmt: skip
                        small.add(finish_small(item), item[0].num_rows)
                except BaseException:
                    yield from small.flush()  # the files before this one: their ends
                    raise
                small.ended(index)
                # enough rows kept for a batch, or read for one (a filter that keeps few:
                # the progress and the files' ends are not held back for thousands of files)
                if small.rows >= least or small.rows_read >= self.batch_rows:
                    yield from small.flush()
                continue
            yield from small.flush()
            finish: Callable[[Any], pa.RecordBatch] | None
            if "text" in opts:
                items: Iterator[Any] = self._text_batches(path, opts["text"])
                finish = _FilterStep(self.columns, self.filter, self.filter_mask)
            elif "row_group_ids" in opts:
                # the filter's mask is the finishing step's, with the filter's copy: on the
                # side that waits (TPC-H Q6, four comparisons a row: the reader's thread was
                # the critical path with both, 0.27 s of SF1, while the fold's sat idle)
                items = _parquet_batches(
                    path, opts["row_group_ids"], opts["schema"], self.filter,
                    lambda: self.batch_rows, self.dictionary_columns, None,
                    opts.get("folder_values"),
                )  # fmt: skip
                finish = _FilterStep(self.columns, self.filter, self.filter_mask)
            elif "stream" in opts:
                items = self._stream_batches(path, opts["stream"])
                finish = _FilterStep(self.columns, self.filter, self.filter_mask)
            else:
                items = self._fragment_batches(dataset)
                finish = None
            for item in items:
                yield _Piece(item, finish)
            yield _FileEnd(index)
        yield from small.flush()

    def few_distinct(self, columns: Sequence[str]) -> bool:
        """Whether ``columns`` take few distinct values in the first block of the first text
        file (at most one in :data:`CODED_SAMPLE_RATIO` of its rows each, and at most
        :data:`CODED_SAMPLE_VALUES`): then parsing them as dictionaries is worth it (a few
        codes per chunk instead of a string hashed per row). Keys whose values turn out many
        later are decoded again by the aggregator, chunk by chunk."""
        import pyarrow.compute as pc
        import pyarrow.csv as pacsv

        texts = [(path, opts["text"]) for path, _, _, opts in self._parts if "text" in opts]
        if not columns or not texts:
            return False
        path, text = texts[0]
        if set(columns) & set(text.folder_values):
            return False  # a key from the folder names, not the text
        base = text.file_format.default_fragment_scan_options
        # the first block only, through a gate (see _text_schema): a reader left reading a
        # Python file ahead on its I/O thread when the query then failed (an unknown column)
        # aborted the process at exit now and then ("terminate called without an active
        # exception")
        gate = _GatedStream(_text_stream(path, text.encoding), ahead=1)
        source = gate.arrow_stream()

        # the keys as the scan types them (a first file's own guess may be null: a column
        # empty in its first block) and as nulls where this file has none of them
        types = {name: text.schema.field(name).type for name in columns}
        convert = _convert_options(base.convert_options, types, include=columns)
        convert.include_missing_columns = True

        def open_reader() -> Any:
            return pacsv.open_csv(
                source,
                read_options=_read_options(base.read_options, min(self.block_bytes, 1 << 20)),
                parse_options=text.file_format.parse_options,
                convert_options=convert,
            )

        reader = None
        try:
            reader = gate.call(open_reader)
            batch = gate.call(reader.read_next_batch, taken=True)
        except (pa.ArrowException, OSError) as exc:
            # plain strings then; the scan itself reports what is wrong with the file
            log.debug("%s: no key sample (%s); keys read as strings", path, exc)
            return False
        finally:
            gate.close()  # before the reader goes (see _text_schema)
            del reader
        if batch is None or batch.num_rows == 0:
            return False
        most = min(CODED_SAMPLE_VALUES, batch.num_rows // CODED_SAMPLE_RATIO)
        # a prefix first: Arrow's count of a block of distinct strings held a hash table of
        # all of them (82 MiB for 3 M-row CSV's 4 MiB block, whatever the budget); a block
        # with few values has few in its prefix too
        prefix = batch.slice(0, CODED_PREFIX_ROWS)
        return all(
            pc.count_distinct(part.column(name), mode="all").as_py() <= most
            for name in columns
            for part in (prefix, batch)
        )

    def _fragment_batches(self, dataset: Any) -> Iterator[tuple[pa.RecordBatch | None, int]]:
        """One fragment (row group, file) at a time: a scan of the whole dataset decodes
        fragments ahead into Arrow's pool as fast as it can read them, without bound when the
        aggregation is the slower side (245 MiB at a 16 MiB budget on TPC-H Q1).

        Each batch (filtered by Arrow) comes with the rows it counts as read: a Parquet row
        group's rows come after its batches, as ``(None, rows)``, since the rows the filter
        dropped are read too."""
        for fragment in dataset.get_fragments():
            groups = getattr(fragment, "row_groups", None) if self.filter is not None else None
            batches = fragment.to_batches(
                schema=dataset.schema, columns=self.columns, filter=self.filter,
                batch_size=self.batch_rows, batch_readahead=0, fragment_readahead=0,
                use_threads=True,
            )  # fmt: skip
            if not groups:
                for batch in batches:
                    yield batch, batch.num_rows
                continue
            for batch in batches:
                yield batch, 0
            yield None, sum(group.num_rows for group in groups)

    def _stream_batches(
        self, path: str, stream: _IpcStream
    ) -> Iterator[tuple[pa.RecordBatch, pa.Array | None]]:
        """An Arrow IPC *stream* file (``.arrows``; ``pyarrow.dataset`` reads only the IPC
        file format), or an IPC file with run-end encoded columns, a record batch at a time
        as written: the needed columns, with the folder names' columns and the scan's types,
        cut into batches of at most ``batch_rows`` rows for a :class:`_FilterStep`."""
        schema = stream.schema
        folder = _FolderColumns(stream.folder_values, schema)
        with pa.OSFile(path, "rb") as source:
            for batch in _ipc_record_batches(source, is_ipc_stream(path)):
                have = set(batch.schema.names)
                if folder.names:
                    batch = folder.add(batch)
                n = batch.num_rows
                cols = [
                    _as_type(batch.column(f.name), f.type)
                    if f.name in have or f.name in folder.names
                    else pa.nulls(n, f.type)
                    for f in schema
                ]
                # no column (count(*) alone): the batch's rows, which from_arrays would lose
                batch = (
                    pa.RecordBatch.from_arrays(cols, schema=schema) if cols else batch.select([])
                )
                step = max(1, self.batch_rows)
                for start in range(0, n, step):
                    yield batch.slice(start, step), None

    def _text_batches(
        self, path: str, text: _TextFile
    ) -> Iterator[tuple[pa.RecordBatch, pa.Array | None]]:
        """A CSV/TSV/JSON Lines file through Arrow's streaming reader, its (decompressed)
        bytes read through a :class:`_GatedStream`: a few blocks ahead of the parsed
        batches taken, not Arrow's 32. Each parsed block gets the columns from the folder
        names and the scan's types (numbers widened, missing columns as nulls), and is cut
        into batches of at most ``batch_rows`` rows, each left to a :class:`_FilterStep`
        (no mask: the filter is evaluated there, on whichever side waits)."""
        coded = set(self.dictionary_columns) if text.fmt in ("csv", "tsv") else set()
        schema = pa.schema(
            f.with_type(_coded_type(f)) if f.name in coded else f for f in text.schema
        )
        parsed = pa.schema([f for f in schema if f.name not in text.folder_values])
        folder = _FolderColumns(text.folder_values, schema)
        delivered = 0  # rows given out: a restarted read skips them
        while True:
            gate = _GatedStream(_text_stream(path, text.encoding), ahead=self.text_blocks_ahead)
            try:
                source = gate.arrow_stream()
                reader = gate.call(
                    functools.partial(_open_text, source, text, parsed, self.block_bytes)
                )
                rows_before = 0  # Arrow numbers a JSON error's row within its block
                while True:
                    try:
                        block = gate.call(reader.read_next_batch, taken=True)
                    except pa.ArrowInvalid as exc:
                        restart = _quoted_empty_past_sample(str(exc), path, text, parsed)
                        if restart is None:
                            raise pa.ArrowInvalid(
                                _row_of_file(str(exc), rows_before, path, text.encoding)
                            ) from exc
                        text = restart
                        break
                    if block is None:
                        return
                    rows_before += block.num_rows
                    if rows_before <= delivered:  # read again after a restart
                        continue
                    if rows_before - block.num_rows < delivered:
                        block = block.slice(delivered - (rows_before - block.num_rows))
                    delivered = rows_before
                    if folder.names:
                        block = folder.add(block)
                    if not len(schema):  # count(*) alone: no column, the rows (all parsed)
                        block = block.select([])
                    elif block.schema != schema:
                        block = _block_as(
                            block, schema, rows_before - block.num_rows, text.fmt,
                            decimal_comma=_decimal_point(text) == ",",
                        )  # fmt: skip
                    step = max(1, self.batch_rows)
                    for start in range(0, block.num_rows, step):
                        yield block.slice(start, step), None
            finally:
                gate.close()

    def _read_error(self, path: str, fmt: str, exc: Exception, opts: dict[str, Any]) -> InputError:
        text: _TextFile | None = opts.get("text")
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if reason == "overflow" and self.filter is not None:  # Arrow's word, nothing more
            reason = (
                "integer overflow in the --where expression's arithmetic (integer + - * keep "
                "their operands' type, as in DuckDB and Spark)"
            )
        if fmt == "parquet":  # find the row group that fails: slow, but only on this path
            parquet = ds.ParquetFileFormat()
            for group in opts.get("row_group_ids", []):
                try:
                    frag = parquet.make_fragment(path, _LOCAL, row_groups=[group])
                    frag.to_table(columns=self.columns, filter=self.filter, schema=self.schema)
                except Exception:
                    return InputError(
                        f"cannot read {path}, row group {group}: {reason}", path=path,
                        row_group=group,
                    )  # fmt: skip
        hint = _mixed_json_hint(reason)
        if fmt == "json" and "unexpected field" in reason:
            nested = ", ".join(repr(f.name) for f in self.schema if _holds_struct(f.type))
            hint = (
                " (a field that is not in the first block of the file, which the types are "
                f"inferred from, appears later — in the objects of column {nested}, or beside "
                "them: extagg stops rather than drop a field from the objects it aggregates)"
            )
        if fmt in ("csv", "tsv") and "CSV column #" in reason:
            given = text.given if text is not None else frozenset()
            hint = _csv_column_hint(reason, _file_column_names(path, text), given)
            if text is not None:
                sep = text.file_format.parse_options.delimiter
                hint = _bad_value_line(reason, path, text.encoding, sep) + hint
        if fmt in ("csv", "tsv"):
            hint = _ragged_row_line(str(exc), path, text.encoding if text else None) + hint
        if fmt == "json" and "Failed to convert JSON" in reason:
            hint = (
                " (a field's type was inferred from the first block of the file and a later "
                "line holds another; give it with --column-types NAME:TYPE)"
            )
        if "straddl" in reason or "increase block size" in reason:
            reason, hint = _long_record(reason, self.block_bytes, "1/48")
        return InputError(f"cannot read {path}: {reason}{hint}", path=path)


_QUOTED_EMPTY = re.compile(r"CSV column #(\d+): .*CSV conversion error to .+: invalid value ''$")


def _quoted_empty_past_sample(
    reason: str, path: str, text: _TextFile, parsed: pa.Schema
) -> _TextFile | None:
    """A CSV number (or date, or boolean) column's first quoted empty field ``""`` past the
    sample its types came from stops Arrow's reader (``invalid value ''``); the field is a
    null (see _csv_types). Returns ``text`` with that column parsed as text and cast, for
    the read to start again, or ``None`` for any other error."""
    match = _QUOTED_EMPTY.search(reason)
    if match is None or text.fmt not in ("csv", "tsv"):
        return None
    names = _file_column_names(path, text)
    index = int(match.group(1))
    if index >= len(names) or names[index] not in parsed.names or names[index] in text.as_text:
        return None
    log.info("%s: column %r holds a quoted empty field past the first block: read again, "
             "that column as text", path, names[index])  # fmt: skip
    return replace(text, as_text=text.as_text | {names[index]})


def _long_record(reason: str, block_bytes: int, share: str) -> tuple[str, str]:
    """Arrow's error for a record that spans more blocks than its reader takes
    (``straddling object ... (try to increase block size?)``), and what would read it."""
    size = f"{block_bytes / (1 << 20):.3g} MiB"
    larger = (
        f"a larger --memory reads larger blocks ({share} of it, up to 4 MiB)"
        if block_bytes < MAX_TEXT_BLOCK_BYTES
        else "a record longer than 4 MiB, the largest block, cannot be read"
    )
    hint = (
        f" (a line longer than the {size} blocks text is read in under this budget: each "
        f"record must fit in one; {larger})"
    )
    return reason.replace(" (try to increase block size?)", ""), hint


_RAGGED_ROW = re.compile(r"CSV parse error: Expected \d+ columns, got \d+: (.*)$", re.DOTALL)


def _ragged_row_line(reason: str, path: str, encoding: str | None) -> str:
    """Where the row of Arrow's ``Expected 2 columns, got 3: a,1,2`` is in ``path``: its line
    number (`` (line 100002)``), found by reading the file again (on an error's path only,
    for at most :data:`RAGGED_ROW_SEARCH_S`), or ``""``. Arrow names the row's text but not
    its place, and in a file of millions of rows the text alone does not find it."""
    match = _RAGGED_ROW.search(reason)
    if match is None or not match.group(1).strip():
        return ""
    import time

    needle = b"\n" + match.group(1).encode("utf-8", "replace")
    data = b"\n"  # line 1 starts after a newline too
    newlines_before = 0  # in the text before data[0], the one put first not counted
    give_up = time.monotonic() + RAGGED_ROW_SEARCH_S
    try:
        with _text_stream(path, encoding) as stream:
            ended = False
            while time.monotonic() < give_up:
                chunk = stream.read(1 << 20)
                ended = not chunk
                data += chunk
                at = data.find(needle)
                while at >= 0:
                    end = at + len(needle)
                    if end == len(data) and not ended:
                        break  # the byte after it is not read yet
                    if end == len(data) or data[end : end + 1] in (b"\n", b"\r"):
                        line = newlines_before + data.count(b"\n", 0, at) + 1
                        return f" (line {line})"
                    at = data.find(needle, at + 1)
                if ended:
                    return ""
                cut = len(data) - len(needle)
                if cut > 0:
                    newlines_before += data.count(b"\n", 0, cut)
                    data = data[cut:]
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError):
        pass
    return ""


#: how long an error's path may read a CSV file again to find a ragged row's line
RAGGED_ROW_SEARCH_S = 10.0

_BAD_VALUE = re.compile(r"CSV column #(\d+): .*invalid value '(.*)'$", re.DOTALL)


def _bad_value_line(reason: str, path: str, encoding: str | None, delimiter: str) -> str:
    """Where the value of Arrow's ``In CSV column #1: ... invalid value 'abc'`` is in
    ``path``: the line of the first row that holds it in that column (`` (line 600002)``,
    as DuckDB names it), found by reading the file again with Python's CSV reader (on an
    error's path only, for at most :data:`RAGGED_ROW_SEARCH_S`), or ``""``."""
    match = _BAD_VALUE.search(reason)
    if match is None:
        return ""
    import csv
    import io
    import time

    index, value = int(match.group(1)), match.group(2)
    give_up = time.monotonic() + RAGGED_ROW_SEARCH_S
    try:
        with _text_stream(path, encoding) as stream:
            text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")
            reader = csv.reader(text, delimiter=delimiter)
            first = reader.line_num + 1
            for count, row in enumerate(reader):
                if len(row) > index and row[index] == value:
                    return f" (line {first})"
                first = reader.line_num + 1
                if count % 65_536 == 0 and time.monotonic() > give_up:
                    return ""
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, csv.Error, ValueError):
        pass
    return ""


def _csv_column_hint(reason: str, names: Sequence[str], given: Collection[str] = ()) -> str:
    """What to do about Arrow's CSV error ``reason`` (``In CSV column #N: ...``), naming the
    column from the file's ``names`` (Arrow counts them from 0); ``given``: the columns whose
    types the user gave (``--column-types``, ``--schema``), which were not inferred."""
    m = re.search(r"CSV column #(\d+)", reason)
    column = ""
    name = None
    if m is not None and int(m.group(1)) < len(names):
        name = names[int(m.group(1))]
        column = f" of column {name!r}"
    if name is not None and name in given and "conversion" in reason.lower():
        return f" (a value{column} does not fit the type given to it)"
    if "Rescaling Decimal" in reason:
        return (
            f" (a value{column} has more decimal places than the scale its type gives, and "
            "is not rounded: give a larger scale with --column-types)"
        )
    if "conversion" in reason.lower():
        return f" (the type{column} was inferred from the first block; give it with --column-types)"
    return ""


def _csv_header(path: str, delimiter: str, encoding: str | None = None) -> list[str]:
    """The names in a CSV file's first line (none if it cannot be read): for messages."""
    try:
        with _text_stream(path, encoding) as stream:
            head = stream.read(1 << 16).decode("utf-8", "replace")
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError):
        return []
    return next(csv.reader([head.splitlines()[0] if head else ""], delimiter=delimiter), [])


def _file_column_names(path: str, text: _TextFile | None) -> list[str]:
    """A CSV file's column names in file order, as its reader sees them (none if it cannot
    tell): what Arrow's ``CSV column #N`` counts."""
    if text is None:
        return []
    try:
        return _text_schema(path, text.fmt, text.file_format, text.encoding).names
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError):
        return []


_BLOCK_ROW = re.compile(r" in row (\d+)$")


def _row_of_file(
    reason: str, rows_before: int, path: str | None = None, encoding: str | None = None
) -> str:
    """Arrow's JSON error ``... in row N`` (N from 0, within the block parsed) as the row of
    the file from 1, ``rows_before`` being the rows of the blocks before; with ``path``, also
    its line where blank lines (which are no rows) make them differ."""
    first, *rest = reason.split("\n", 1)
    m = _BLOCK_ROW.search(first)
    if m is None:
        return reason
    row = rows_before + int(m.group(1)) + 1
    where = f"data row {row} of the file"
    line = None if path is None else _json_row_line(path, encoding, row)
    if line is not None and line != row:
        where += f" (line {line}: blank lines are no rows)"
    return "\n".join([f"{first[: m.start()]} in {where}", *rest])


def _json_row_line(path: str, encoding: str | None, row: int) -> int | None:
    """The line of a JSON Lines file's ``row``-th object (from 1; blank lines skipped), read
    again on an error's path for at most :data:`RAGGED_ROW_SEARCH_S`; None if not found."""
    import time

    give_up = time.monotonic() + RAGGED_ROW_SEARCH_S
    seen = number = 0
    rest = b""
    try:
        with _text_stream(path, encoding) as stream:
            while time.monotonic() < give_up:
                chunk = stream.read(1 << 20)
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop() if chunk else b""
                for line in lines:
                    number += 1
                    if line.strip():
                        seen += 1
                        if seen == row:
                            return number
                if not chunk:
                    return None
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError):
        pass
    return None


_JSON_MIXED = re.compile(r"Column\(/?([^)]*)\) changed from (\w+) to (\w+)")


def _mixed_json_hint(reason: str) -> str:
    """Arrow reads a JSON field as one type: say which field mixes which types."""
    m = _JSON_MIXED.search(reason)
    if m is None:
        return ""
    name, was, now = m.groups()
    if not name and was == "object" and now == "array":
        return (
            " (the file holds a JSON array, not JSON Lines: write one object per line, e.g. "
            "jq -c '.[]' FILE > FILE.jsonl)"
        )
    field = name.replace("/", ".")
    typed = {"number": "int64 (or float64)", "string": "string", "boolean": "bool"}
    if was == "null" and now in typed and "/" not in name:
        return (
            f" (field {field!r} is null in every line of the first block its type is inferred "
            f"from, and then holds {now}s: give its type, --column-types {field}:{typed[now]})"
        )
    return (
        f" (field {field!r} holds both {was} and {now} values; a column has "
        "one type: make the field one type in every line, e.g. quote the numbers)"
    )


_DONE = object()

#: bytes read from a Parquet file at a time (the column chunk being decoded is streamed)
PARQUET_BUFFER_BYTES = 1 << 16


def _parquet_batches(
    path: str,
    row_groups: list[int],
    schema: pa.Schema,
    filter: Any,
    batch_rows: Callable[[], int],
    dictionary_columns: Sequence[str] = (),
    filter_mask: Callable[[pa.RecordBatch], pa.Array | None] | None = None,
    folder_values: dict[str, Any] | None = None,
) -> Iterator[tuple[pa.RecordBatch, pa.Array | None]]:
    """The selected row groups of one Parquet file, ``batch_rows()`` rows at a time (asked
    again at every row group: the scan's batch size is resized after the first batch), as
    ``schema`` (missing columns as nulls, types widened to it), each with the mask of the rows
    ``filter`` keeps (``None``: no filter, or one to apply as an expression); a
    :class:`_FilterStep` then filters the batch and keeps the needed columns.

    ``pyarrow.dataset`` decodes a whole row group before it hands out the first batch (11 MiB
    of TPC-H Q1's columns for the 114 K-row groups ``tpchgen-cli`` writes; ~100 MiB for the
    1 M-row groups pyarrow writes by default) and reads its column chunks whole
    (``pre_buffer``), whatever the budget. Parquet's own reader, with a buffered stream and no
    pre-buffering, decodes a batch's rows of each column at a time: what the scan holds
    then follows the budget (see ``_ScanMemory`` in :mod:`extagg.io.run`).

    ``dictionary_columns`` (string columns the filter does not read) come as dictionary
    arrays of ``schema``'s value type: decoding a dictionary page into one string per row
    costs more than the rest of TPC-H Q1's scan, and the engine groups by the codes.
    ``filter_mask`` evaluates ``filter`` eagerly (see
    :meth:`~extagg.io.where.ParsedExpression.mask`). ``folder_values``: the values of the
    hive folder columns (the last of ``schema``'s), added to every batch."""
    if not row_groups:
        return
    folder = None
    if folder_values:
        folder = _FolderColumns(folder_values, schema)
        schema = pa.schema([f for f in schema if f.name not in folder_values])
    import pyarrow.parquet as pq

    options = {"pre_buffer": False, "buffer_size": PARQUET_BUFFER_BYTES, "memory_map": False}
    with contextlib.ExitStack() as stack:
        reader = stack.enter_context(pq.ParquetFile(path, **options))
        coded = _small_dictionaries(reader.metadata, dictionary_columns, row_groups)
        if coded:
            reader = stack.enter_context(
                pq.ParquetFile(path, metadata=reader.metadata, read_dictionary=coded, **options)
            )
        have = set(reader.schema_arrow.names)
        read = _parquet_columns(reader.schema_arrow, schema)
        as_is: bool | None = None  # decided on the first batch (a file's batches are alike)
        for batch in (
            batch
            for group in row_groups
            for batch in reader.iter_batches(
                batch_size=batch_rows(), row_groups=[group], columns=read, use_threads=False
            )
        ):
            if as_is is None:  # the file's batches have the scan's types: taken as they come
                as_is = len(read) == len(schema) and all(
                    _as_type(c, f.type) is c for c, f in zip(batch.columns, schema, strict=True)
                )
            if as_is:
                out = batch
            else:
                arrays = []
                for f in schema:
                    if f.name in have:
                        arrays.append(_as_type(batch.column(f.name), f.type))
                    else:
                        arrays.append(pa.nulls(batch.num_rows, f.type))
                out = pa.RecordBatch.from_arrays(arrays, names=schema.names)
            if folder is not None:
                out = folder.add(out)
            mask = None if filter is None or filter_mask is None else filter_mask(out)
            yield out, mask


#: batches of fewer rows than the scan's batch size over this are gathered into one (see
#: :class:`_SmallBatches`)
COALESCE_DIVISOR = 8


class _SmallBatches:
    """Small batches gathered, in order, into one of at least ``least`` rows: a dataset of many
    small files (a streaming job's output, a folder per day) gave a batch per file or row
    group, and the fold's fixed cost per batch (~0.5 ms: hashing, probing, accounting) made
    6 120 Parquet files of 33 rows each take 15 s. The gathered batches and their copy hold
    at most ``4 * least`` rows beside the scan's batches (a half of one at the divisor 8)."""

    def __init__(self) -> None:
        self._held: list[pa.RecordBatch] = []
        self._rows = 0
        self._concat = getattr(pa, "concat_batches", None)  # pyarrow >= 19

    def add(self, batch: pa.RecordBatch, least: int) -> Iterator[pa.RecordBatch]:
        if self._concat is None or batch.num_rows >= least:
            yield from self.flush()
            yield batch
            return
        if self._held and batch.schema != self._held[0].schema:
            yield from self.flush()  # another file's types (nullability, dictionary width)
        self._held.append(batch)
        self._rows += batch.num_rows
        if self._rows >= least:
            yield from self.flush()

    def flush(self) -> Iterator[pa.RecordBatch]:
        if not self._held:
            return
        held, self._held, self._rows = self._held, [], 0
        if len(held) == 1:
            yield held[0]
            return
        assert self._concat is not None
        gathered = self._concat(held)
        del held
        yield gathered


class _FilterStep:
    """What is left of a decoded batch's scan: drop the rows the filter does not keep (by
    the batch's mask, or by the filter expression when there is no mask) and the columns
    only the filter read. A copy of every kept value (TPC-H Q1 at SF10: ~0.5 s of the
    reader thread's ~2.2 s), which :func:`_prefetched` runs on whichever side of the queue
    is waiting for the other."""

    def __init__(
        self,
        columns: Sequence[str],
        filter: Any,
        filter_mask: Callable[[pa.RecordBatch], pa.Array | None] | None = None,
    ) -> None:
        self.columns = list(columns)
        self.filter = filter
        #: evaluates the filter on a batch that comes without its mask (a third of the time
        #: of ``batch.filter(expression)`` on a CSV block: ~80 against ~240 us)
        self.filter_mask = filter_mask

    def __call__(self, item: tuple[pa.RecordBatch, pa.Array | None]) -> pa.RecordBatch:
        out, mask = item
        if mask is None and self.filter is not None and self.filter_mask is not None:
            mask = self.filter_mask(out)
        if mask is not None:
            out = out.select(self.columns)
            if mask.true_count < len(mask):  # nulls and falses dropped, as the filter's
                out = out.filter(mask)
            return out
        if self.filter is not None:
            return out.filter(self.filter).select(self.columns)
        return out.select(self.columns)


#: a column chunk's dictionary page (compressed) of at most this size is read as codes: a
#: writer that gives up on a dictionary (too many values; 1 MiB in Arrow's and arrow-rs's
#: writers) leaves a large one, and Arrow would then build dictionaries by hashing each value
SMALL_DICTIONARY_PAGE_BYTES = 64 << 10


def _small_dictionaries(
    metadata: Any, columns: Sequence[str], row_groups: Sequence[int]
) -> list[str]:
    """The ``columns`` whose chunks in every one of ``row_groups`` start with a small
    dictionary page (see :data:`SMALL_DICTIONARY_PAGE_BYTES`)."""
    if not columns:
        return []
    schema = metadata.schema
    index = {schema.column(i).path: i for i in range(len(schema))}
    out = []
    for name in columns:
        i = index.get(name)
        if i is None:
            continue
        for group in row_groups:
            chunk = metadata.row_group(group).column(i)
            start = chunk.dictionary_page_offset
            if not chunk.has_dictionary_page or start is None:
                break
            if chunk.data_page_offset - start > SMALL_DICTIONARY_PAGE_BYTES:
                break
        else:
            out.append(name)
    return out


def _block_as(
    block: pa.RecordBatch, schema: pa.Schema, rows_before: int, fmt: str,
    decimal_comma: bool = False,
) -> pa.RecordBatch:  # fmt: skip
    """A parsed text block's columns cast to the scan's ``schema``; a value that does not
    convert (JSON text read as a date or a timestamp) is an error naming the column, its
    type, the value and its row (``rows_before`` the block's first). ``decimal_comma``: the
    text's numbers are written ``1,5``."""
    columns = []
    for f in schema:
        column = block.column(f.name)
        if pa.types.is_string(column.type) and not (
            pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
            or pa.types.is_dictionary(f.type) or pa.types.is_binary(f.type)
        ):  # fmt: skip
            import pyarrow.compute as pc

            # a quoted empty field of a number (or JSON date) column is a null
            column = pc.if_else(pc.equal(column, ""), pa.scalar(None, column.type), column)
            if decimal_comma and (pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)):
                column = pc.replace_substring(column, ",", ".")
        try:
            if pa.types.is_string(column.type) and pa.types.is_timestamp(f.type) and f.type.tz:
                columns.append(_zoned(column, f.type))
                continue
            columns.append(_as_type(column, f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            where = f": {exc}"
            values = block.column(f.name)
            for i in range(len(values) if pa.types.is_string(values.type) else 0):
                try:
                    values.slice(i, 1).cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    value = values[i].as_py()
                    shown = value if len(value) <= 80 else value[:77] + "..."
                    where = f": {shown!r} in data row {rows_before + i + 1} of the file"
                    break
            kind = "JSON" if fmt == "json" else "CSV"
            raise pa.ArrowInvalid(
                f"Failed to convert {kind} column {f.name!r} to {f.type}{where}"
            ) from exc
    return pa.RecordBatch.from_arrays(columns, schema=schema)


#: text that ends with a zone offset (``Z``, ``+02:00``, ``-0500``)
_OFFSET = r"(Z|z|[+-][0-9]{2}(:?[0-9]{2})?)$"


def _zoned(texts: pa.Array, to: pa.DataType) -> pa.Array:
    """Timestamp text read into ``to`` (a timestamp with a zone): a value with an offset is
    that instant; one without is a wall time in ``to``'s zone (as a database reads text into
    a column of its session's zone; an ambiguous time at a DST change the earlier instant, a
    skipped one moved forward). Arrow's cast refused any value without an offset."""
    import pyarrow.compute as pc

    with_offset = pc.match_substring_regex(texts, _OFFSET)
    if pc.all(with_offset).as_py() is not False:  # every value has one (or none is there)
        return texts.cast(to)
    naive = pa.timestamp(to.unit)
    walls = pc.if_else(with_offset, pa.scalar(None, pa.string()), texts).cast(naive)
    local = wall_time_instants(walls, to.tz)
    if not pc.any(with_offset).as_py():
        return local
    instants = pc.if_else(with_offset, texts, pa.scalar(None, pa.string())).cast(to)
    return pc.if_else(with_offset, instants, local)


def wall_time_instants(walls: pa.Array, zone: str) -> pa.Array:
    """Naive timestamps ``walls`` read as wall times in ``zone``: one a clock change repeats
    is the earlier instant, one it skips is moved forward by the gap (``02:15:30`` on a
    spring-forward night is ``03:15:30``), as Spark, DuckDB and Python's ``fold=0`` read
    them. (Arrow's ``nonexistent="latest"`` made every skipped time the change's instant,
    so distinct values merged.)"""
    import pyarrow.compute as pc

    before = pc.assume_timezone(walls, timezone=zone, ambiguous="earliest",
                                nonexistent="earliest")  # fmt: skip
    after = pc.assume_timezone(walls, timezone=zone, ambiguous="earliest", nonexistent="latest")
    skipped = pc.not_equal(before, after)
    if not pc.any(skipped).as_py():
        return after
    # ``before`` is the last instant ahead of the gap: the wall time past it, added to it
    moved = pc.add(before, pc.subtract(walls, pc.local_timestamp(before)))
    return pc.if_else(skipped, moved, after)


def _decimal_point(text: _TextFile) -> str:
    """The decimal point of a CSV/TSV file's numbers (``--decimal-comma``: ``,``)."""
    if text.fmt not in ("csv", "tsv"):
        return "."
    return str(text.file_format.default_fragment_scan_options.convert_options.decimal_point)


def _as_type(arr: pa.Array, to: pa.DataType) -> pa.Array:
    """``arr`` cast to ``to``; a dictionary array stays one, of ``to`` values. An integer
    column widened to a float one (another file's) rounds past 2^53, as in SQL: Arrow's
    safe cast stopped the run at such a value (an int64 id beside a file of floats)."""
    if pa.types.is_run_end_encoded(arr.type):
        import pyarrow.compute as pc

        arr = pc.run_end_decode(arr)
    if pa.types.is_dictionary(arr.type) and not pa.types.is_dictionary(to):
        if not _holds_text(to):  # dates, decimals, numbers: their values (see _plain)
            return arr.cast(to)
        if arr.type.value_type == to:
            return arr
        return arr.cast(pa.dictionary(arr.type.index_type, to))
    if arr.type == to:
        return arr
    if pa.types.is_integer(arr.type) and pa.types.is_floating(to):
        return arr.cast(to, safe=False)
    return arr.cast(to)


class _WaitBalance:
    """Which side of the scan's queue has lately been waiting for the other: the reader
    thread blocked on a full queue, or the consumer (the fold) on an empty one. Each side's
    waits are summed with a decay per wait, so the answer follows the run's recent phase
    (the fold's kernels loading at the start, then the steady state). Updated without a
    lock: a lost update only delays the answer by a batch."""

    DECAY = 0.8

    def __init__(self) -> None:
        self.reader_wait = 0.0
        self.consumer_wait = 0.0

    def reader_waited(self, seconds: float) -> None:
        self.reader_wait = self.reader_wait * self.DECAY + seconds

    def consumer_waited(self, seconds: float) -> None:
        self.consumer_wait = self.consumer_wait * self.DECAY + seconds

    def consumer_starved(self) -> bool:
        return self.consumer_wait > self.reader_wait


@dataclass
class _Piece:
    """A decoded item of a file and the step that makes it a batch (None: it is one)."""

    item: Any
    finish: Callable[[Any], pa.RecordBatch] | None


@dataclass
class _FileEnd:
    """The end of the scan's ``index``-th file, in the stream of its batches (and of the
    files from ``first`` on, when small files were gathered)."""

    index: int
    first: int = -1


class _SmallFiles:
    """The finished batches of consecutive small files, gathered by the reader thread into
    one piece (see :meth:`InputScan._pieces`), and the files they came from."""

    def __init__(self) -> None:
        self._batches = _SmallBatches()
        self._gathered: list[pa.RecordBatch] = []
        self.rows = 0
        self.rows_read = 0
        self._first = -1
        self._last = -1

    def add(self, batch: pa.RecordBatch, rows_read: int) -> None:
        self.rows_read += rows_read
        if batch.num_rows:
            self.rows += batch.num_rows
            self._gathered.extend(self._batches.add(batch, 1 << 62))

    def ended(self, index: int) -> None:
        if self._first < 0:
            self._first = index
        self._last = index

    def flush(self) -> Iterator[_Piece | _FileEnd]:
        if self._first < 0 and not self.rows_read:
            return
        # a batch per run of alike files (another file's types end a run: see _SmallBatches)
        gathered: list[pa.RecordBatch | None] = [*self._gathered, *self._batches.flush()]
        rows_read = self.rows_read
        for batch in gathered or [None]:
            yield _Piece((batch, rows_read), None)
            rows_read = 0
        if self._first >= 0:
            yield _FileEnd(self._last, self._first)
        self._gathered, self.rows, self.rows_read, self._first, self._last = [], 0, 0, -1, -1


def _finish_piece(piece: _Piece | _FileEnd) -> tuple[pa.RecordBatch | None, int] | _FileEnd:
    """The piece's batch, and the rows it had before the filter (which the scan read)."""
    if isinstance(piece, _FileEnd):
        return piece
    if piece.finish is None:  # (batch or None, rows read) from the dataset's own scan
        return piece.item
    batch, _mask = piece.item
    return piece.finish(piece.item), batch.num_rows


def _prefetched(
    items: Iterator[Any],
    ahead: int,
    finish: Callable[[Any], Any] | None = None,
    hand_over: Callable[[], bool] = lambda: True,
) -> Iterator[Any]:
    """``items``, read by a thread at most ``ahead`` items in front of the caller (Arrow
    decodes without the GIL, so reading overlaps the aggregation); its exceptions are raised
    here, where the item would have come. Leaving early stops the thread.

    ``finish`` (optional) is the last step of each item (e.g. :class:`_FilterStep`), done on
    whichever side is the faster lately (see :class:`_WaitBalance`): by the reader thread
    while the caller keeps up, by the caller while it waits for the reader (then the step
    runs beside the next item's decoding, on the caller's otherwise idle core). TPC-H Q1
    at SF10: the reader's thread is the critical path, and filtering the batches on the
    caller's side took ~0.5 s off it. ``hand_over()`` false keeps the step on the reader
    (the caller would hold one more batch than the budget allows)."""
    if ahead <= 0:
        for item in items:
            yield item if finish is None else finish(item)
        return
    import queue
    import threading

    queued: queue.Queue[Any] = queue.Queue(maxsize=ahead)
    stop = threading.Event()
    balance = _WaitBalance()

    def put(item: Any) -> bool:
        started = time.perf_counter()
        try:
            while not stop.is_set():
                try:
                    queued.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False
        finally:
            balance.reader_waited(time.perf_counter() - started)

    def read() -> None:
        try:
            for item in items:
                if finish is not None and not (hand_over() and balance.consumer_starved()):
                    entry = (True, finish(item), False)
                else:  # unfinished only when there is a step left to the caller
                    entry = (finish is None, item, False)
                if not put(entry):
                    return
        except BaseException as exc:  # handed to the caller
            put((True, exc, True))
            return
        put((True, _DONE, True))

    thread = threading.Thread(target=read, name="extagg-scan", daemon=True)
    thread.start()
    try:
        while True:
            started = time.perf_counter()
            done, item, last = queued.get()
            balance.consumer_waited(time.perf_counter() - started)
            if last:
                if item is not _DONE:
                    raise item
                return
            yield item if done else finish(item)  # type: ignore[misc]
    finally:
        stop.set()
        thread.join()


def _convert_options(
    convert: Any, types: dict[str, pa.DataType] | None = None, include: Sequence[str] = ()
) -> Any:
    """``convert`` (CSV conversion options) with more column ``types`` and, if given, only
    the columns ``include``."""
    import pyarrow.csv as pacsv

    return pacsv.ConvertOptions(
        check_utf8=convert.check_utf8, column_types={**convert.column_types, **(types or {})},
        null_values=convert.null_values, true_values=convert.true_values,
        false_values=convert.false_values, strings_can_be_null=convert.strings_can_be_null,
        quoted_strings_can_be_null=convert.quoted_strings_can_be_null,
        timestamp_parsers=convert.timestamp_parsers, decimal_point=convert.decimal_point,
        include_columns=list(include) or convert.include_columns,
        include_missing_columns=convert.include_missing_columns,
    )  # fmt: skip


def _coded_type(f: pa.Field) -> pa.DataType:
    """The dictionary type a CSV key column of ``f``'s type is parsed into."""
    return pa.dictionary(pa.int32(), f.type)


@dataclass
class _TextFile:
    """How a CSV/TSV/JSON Lines file is parsed: its format's options, the scan's schema
    (every column the query reads, the folder ones included) and the values of the columns
    its hive folder names give."""

    fmt: str
    file_format: Any
    schema: pa.Schema
    folder_values: dict[str, Any]
    #: the text's encoding when not UTF-8 (``--encoding``)
    encoding: str | None = None
    #: columns parsed as text and cast (their quoted empty fields as nulls: see _csv_types)
    as_text: frozenset[str] = frozenset()
    #: columns whose types the user gave (``--column-types``, ``--schema``): for messages
    given: frozenset[str] = frozenset()
    #: JSON object columns whose type holds only the fields the query reads (the others are
    #: skipped as they are parsed)
    pruned: frozenset[str] = frozenset()


#: delimiters a ``.csv`` file's header may use instead of a comma
OTHER_DELIMITERS = (";", "\t", "|")


#: delimiters a shell cannot pass as one character easily, by the names users write
_DELIMITER_NAMES = {"\\t": "\t", "tab": "\t", "\\x09": "\t", "\\u0009": "\t", "\\|": "|"}


def parse_delimiter(delimiter: str | None) -> str | None:
    """``--delimiter``: one character, or ``\\t`` / ``tab`` for a tab (as DuckDB's
    ``delim='\\t'``); anything else a :class:`QueryError` (``None``: sniff it)."""
    if delimiter is None:
        return None
    chosen = _DELIMITER_NAMES.get(delimiter.lower() if len(delimiter) > 1 else delimiter, delimiter)
    if len(chosen) != 1 or chosen in ("\n", "\r", '"'):
        raise QueryError(
            f"--delimiter must be one character (or '\\t' for a tab), got {delimiter!r}"
        )
    return chosen


def parse_quote(quote: str | None, fmt: str) -> str | bool:
    """``--quote``: the character CSV fields are quoted with (``"`` by default), or ``none``
    (``''``, ``None``) for text that quotes nothing — TSV as databases and Unix tools write
    it, where a value may begin with ``"`` (with quoting, such a value swallowed the lines
    after it up to the next ``"``). ``False`` in Arrow's terms for none."""
    if quote is None or quote == "" or str(quote).lower() == "none":
        return False
    if quote == '"':
        return quote
    if fmt not in ("csv", "tsv"):
        raise QueryError("--quote applies to CSV/TSV only")
    if len(quote) != 1 or quote in ("\n", "\r"):
        raise QueryError(f"--quote must be one character or 'none', got {quote!r}")
    return quote


def sniff_delimiter(path: str, encoding: str | None = None) -> str:
    """The delimiter of a ``.csv`` file given none: ``,`` unless its header line has no comma
    and exactly one of :data:`OTHER_DELIMITERS` (``;`` in the CSVs of locales whose decimal
    separator is a comma, as Excel writes them; ``|``; tabs). Read as DuckDB's sniffer would,
    but from the header only: a comma anywhere in it (outside quoted names) keeps the comma."""
    try:
        with _text_stream(path, encoding) as stream:
            head = stream.read(1 << 16)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError):
        return ","  # the reader says what is wrong with the file
    line = head.split(b"\n", 1)[0].decode("utf-8", "replace").lstrip("\ufeff")
    line = re.sub(r'"[^"]*"', "", line)  # a quoted name's own commas ("name, full"|v)
    found = [d for d in OTHER_DELIMITERS if d in line]
    if "," in line or len(found) != 1:
        return ","
    log.info("%s: header has %r between its names and no comma: delimiter %r", path, found[0],
             found[0])  # fmt: skip
    return found[0]


def _text_stream(path: str, encoding: str | None = None) -> Any:
    """``path``'s bytes, decompressed if its extension says so (``.gz``, ``.bz2``, ``.zst``,
    in any case: Arrow's own detection knows lower case only, and ``.CSV.GZ`` was parsed
    compressed), as UTF-8 if they are text in another ``encoding`` (see
    :class:`_Transcoded`)."""
    raw = _LOCAL.open_input_stream(path, compression=None)
    name = path.lower()
    codec = next((c for suffix, c in COMPRESSION_CODECS.items() if name.endswith(suffix)), None)
    if codec is not None:
        raw = pa.CompressedInputStream(raw, codec)
    if encoding is None or _is_utf8(encoding):
        return raw
    return _Transcoded(raw, encoding)


def _is_utf8(encoding: str) -> bool:
    """Whether ``encoding`` (a codec name, ``LookupError`` if none) is UTF-8."""
    import codecs

    return codecs.lookup(encoding).name == "utf-8"


class _Transcoded:
    """A stream of text in another encoding, read as UTF-8 (``--encoding``), converted by
    Python's codec on the thread that reads. Arrow's own (``ReadOptions.encoding``) calls
    the codec from Arrow's I/O thread, past the :class:`_GatedStream`: a scan left
    unfinished then aborted the process at exit now and then ("terminate called without
    an active exception"). A byte the encoding does not allow is an error of the read."""

    def __init__(self, raw: Any, encoding: str) -> None:
        import codecs

        self._raw = raw
        self._decoder = codecs.getincrementaldecoder(encoding)()
        self._encoding = encoding
        self._pending = b""
        self._ended = False

    def read(self, nbytes: int = -1) -> bytes:
        """Up to ``nbytes`` bytes of UTF-8 (all that is left if negative)."""
        while not self._ended and (nbytes < 0 or len(self._pending) < nbytes):
            raw = self._raw.read(max(nbytes, 1 << 16))
            self._ended = not raw
            try:
                text = self._decoder.decode(raw, final=self._ended)
            except UnicodeDecodeError as exc:
                raise OSError(f"not {self._encoding} text: {exc}") from None
            self._pending += text.encode("utf-8")
        if nbytes < 0:
            nbytes = len(self._pending)
        out, self._pending = self._pending[:nbytes], self._pending[nbytes:]
        return out

    def read_buffer(self, nbytes: int = -1) -> Any:
        return pa.py_buffer(self.read(nbytes))

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> _Transcoded:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_options(read: Any, block_bytes: int) -> Any:
    """CSV read options ``read`` with ``block_bytes`` blocks."""
    import pyarrow.csv as pacsv

    return pacsv.ReadOptions(
        block_size=block_bytes, column_names=read.column_names,
        autogenerate_column_names=read.autogenerate_column_names,
        skip_rows=read.skip_rows, encoding=read.encoding,
    )  # fmt: skip


def _open_text(source: Any, text: _TextFile, schema: pa.Schema, block_bytes: int) -> Any:
    """Arrow's streaming reader of a CSV/JSON ``source``, parsing only ``schema``'s columns,
    as ``schema``'s types (columns the file lacks as nulls), ``block_bytes`` at a time."""
    if text.fmt == "json":
        import pyarrow.json as pajson

        # fields the query does not read are skipped; but "ignore" would also drop a field of
        # an object column that first appears after the block its type was inferred from (a
        # max or count_distinct of the objects then silently wrong): "infer" fails there
        nested = any(_holds_struct(f.type) and f.name not in text.pruned for f in schema)
        # dates and times are parsed from their text by a cast (see _json_temporal_types):
        # Arrow's JSON reader reads no date32, and read into a timestamp without a zone, a
        # value with an offset ("…+02:00") was silently moved to UTC
        as_text = pa.schema(f.with_type(pa.string()) if _is_temporal(f.type) else f for f in schema)
        return pajson.open_json(
            source,
            read_options=pajson.ReadOptions(block_size=block_bytes),
            parse_options=pajson.ParseOptions(
                explicit_schema=as_text, unexpected_field_behavior="infer" if nested else "ignore"
            ),
        )
    import pyarrow.csv as pacsv

    base = text.file_format.default_fragment_scan_options
    types = {f.name: pa.string() if f.name in text.as_text else f.type for f in schema}
    convert = _convert_options(base.convert_options, types=types, include=schema.names)
    convert.include_missing_columns = True
    return pacsv.open_csv(
        source, read_options=_read_options(base.read_options, block_bytes),
        parse_options=text.file_format.parse_options, convert_options=convert,
    )  # fmt: skip


def _struct_of_fields(arrow_type: pa.DataType, paths: Sequence[tuple[str, ...]]) -> pa.DataType:
    """The struct ``arrow_type`` with only the fields on ``paths`` (and what is inside them)."""
    below: dict[str, list[tuple[str, ...]]] = {}
    for path in paths:
        below.setdefault(path[0], []).append(path[1:])
    fields = []
    for f in arrow_type:
        rests = below.get(f.name)
        if rests is None:
            continue
        if any(not rest for rest in rests) or not pa.types.is_struct(f.type):
            fields.append(f)  # read whole
        else:
            fields.append(f.with_type(_struct_of_fields(f.type, rests)))
    return pa.struct(fields)


def _leaves_named_plainly(paths: Sequence[tuple[str, ...]]) -> bool:
    """Whether no field on ``paths`` has a dot in its name (Parquet's column paths are dotted:
    such a field's leaves cannot be named alone)."""
    return all("." not in step for path in paths for step in path)


def _parquet_columns(file_schema: pa.Schema, schema: pa.Schema) -> list[str]:
    """The column paths to read from a Parquet file of ``file_schema`` for the scan's
    ``schema``: a column's name, or for a struct the scan holds fewer fields of (those the
    query reads), the dotted paths of its leaves there, so the others are not decoded."""
    read: list[str] = []
    for f in schema:
        if f.name not in file_schema.names:
            continue
        stored = file_schema.field(f.name).type
        if pa.types.is_struct(f.type) and pa.types.is_struct(stored) and stored != f.type:
            leaves = [p for p in _leaf_paths(f.name, f.type) if _has_path(stored, p[1:])]
            read.extend(".".join(p) for p in leaves)
            if leaves:
                continue
        read.append(f.name)
    return read


def _leaf_paths(name: str, arrow_type: pa.DataType) -> list[tuple[str, ...]]:
    """The paths from column ``name`` down to each leaf (non-struct field) of ``arrow_type``."""
    if not pa.types.is_struct(arrow_type):
        return [(name,)]
    return [(name, *path) for child in arrow_type for path in _leaf_paths(child.name, child.type)]


def _has_path(arrow_type: pa.DataType, path: Sequence[str]) -> bool:
    """Whether the struct ``arrow_type`` has the field at ``path``."""
    for step in path:
        if not pa.types.is_struct(arrow_type) or arrow_type.get_field_index(step) < 0:
            return False
        arrow_type = arrow_type.field(step).type
    return True


def _holds_struct(arrow_type: pa.DataType) -> bool:
    """Whether JSON objects are parsed into ``arrow_type`` (a struct, or a list of them)."""
    if pa.types.is_struct(arrow_type):
        return True
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return _holds_struct(arrow_type.value_type)
    return False


def _text_schema(path: str, fmt: str, file_format: Any, encoding: str | None = None) -> pa.Schema:
    """The schema Arrow infers from the first block of a CSV/JSON file (its first
    ``block_size`` bytes, decompressed), read through a :class:`_GatedStream` that lets
    the reader have the next block only: ``file_format.inspect`` opens a reader that reads
    32 blocks ahead (~130 MiB for a 4 MiB sample, in the process's peak before the run)."""
    return _text_sample(path, fmt, file_format, encoding, rows=False)[0]


def _text_has_rows(path: str, fmt: str, file_format: Any, encoding: str | None = None) -> bool:
    """Whether a CSV/JSON file has a data row (its first block parsed, as for its schema)."""
    return _text_sample(path, fmt, file_format, encoding, rows=True)[1]


def _text_sample(
    path: str, fmt: str, file_format: Any, encoding: str | None, rows: bool
) -> tuple[pa.Schema, bool, pa.RecordBatch | None]:
    """The schema of :func:`_text_schema` and, with ``rows``, whether a first batch came
    (``True`` without ``rows``), and that batch (parsed with the schema: no more reading)."""
    gate = _GatedStream(_text_stream(path, encoding), ahead=1)
    source = gate.arrow_stream()
    if fmt == "json":
        import pyarrow.json as pajson

        def open_reader() -> Any:
            read = file_format.default_fragment_scan_options.read_options
            return pajson.open_json(source, read_options=read)
    else:
        import pyarrow.csv as pacsv

        opts = file_format.default_fragment_scan_options

        def open_reader() -> Any:
            return pacsv.open_csv(
                source, read_options=opts.read_options,
                parse_options=file_format.parse_options, convert_options=opts.convert_options,
            )  # fmt: skip

    reader = None
    try:
        reader = gate.call(open_reader)
        if not rows:
            return reader.schema, True, None
        first = gate.call(reader.read_next_batch, taken=True)
        return reader.schema, first is not None, first
    finally:
        # the gate opens before the reader goes: a JSON reader's destructor waits for the
        # read its I/O thread has started, which waits for the gate
        gate.close()
        del reader


def _is_temporal(arrow_type: pa.DataType) -> bool:
    """A date or a timestamp (JSON text cast to it; Arrow casts no text to a time)."""
    return pa.types.is_timestamp(arrow_type) or pa.types.is_date32(arrow_type)


#: JSON text a date or a timestamp is read from (ISO 8601), its zone apart
_JSON_DATE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_JSON_TIMESTAMP = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,9})?)?)?"
_JSON_ZONE = r"(Z|[+-][0-9]{2}:?[0-9]{2})$"


def _json_temporal_types(
    path: str, file_format: Any, inferred: pa.Schema, columns: Sequence[str],
    options: dict[str, Any],
) -> pa.Schema:  # fmt: skip
    """The types of a JSON Lines file's text ``columns`` that hold dates or timestamps, from
    the sample block's values (as CSV's inference types them; Arrow's JSON inference typed
    ``2024-01-01`` as ``timestamp[s]``, left a timestamp with a fraction of a second a
    string, and moved one with an offset to UTC in a timestamp without a zone):

    - every value ``YYYY-MM-DD``: ``date32``;
    - every value a timestamp with an offset (``Z``, ``+02:00``): ``timestamp[unit, UTC]``;
    - every value a timestamp (or a date) without one: ``timestamp[unit]``;
    - offsets on some values only: ``string`` (the instants and the wall times cannot be
      ordered together).

    ``unit`` is ``s``, or ``us`` (``ns`` past six digits) when a value has a fraction of a
    second. A column typed with ``--column-types`` keeps its type."""
    given = options.get("column_types") or {}
    candidates = [
        name
        for name in columns
        if name not in given
        and len(inferred.get_all_field_indices(name)) == 1
        and (inferred.field(name).type == pa.string() or _is_temporal(inferred.field(name).type))
    ]
    if not candidates:
        return inferred
    texts = _json_sample_texts(path, file_format, candidates)
    if texts is None:
        return inferred
    import pyarrow.compute as pc

    types: dict[str, pa.DataType] = {}
    for name in candidates:
        values = texts.column(name).drop_null()
        if not len(values):
            continue
        was = inferred.field(name).type

        def every(pattern: str, column: pa.Array = values) -> bool:
            return bool(pc.all(pc.match_substring_regex(column, pattern)).as_py())

        if every(_JSON_DATE):
            try:
                values.cast(pa.date32())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # 2024-02-30
                continue
            types[name] = pa.date32()
            continue
        if not every(_JSON_TIMESTAMP):
            if was != pa.string():
                types[name] = pa.string()
            continue
        zoned = pc.match_substring_regex(values, _JSON_ZONE)
        if not (pc.all(zoned).as_py() or not pc.any(zoned).as_py()):
            types[name] = pa.string()  # offsets on some values only
            continue
        digits = pc.replace_substring_regex(values, r"^[^.]*\.?([0-9]*).*$", r"\1")
        fraction = pc.max(pc.utf8_length(digits)).as_py()
        unit = "s" if not fraction else "us" if fraction <= 6 else "ns"
        typ = pa.timestamp(unit, "UTC") if pc.all(zoned).as_py() else pa.timestamp(unit)
        try:
            values.cast(typ)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # 25:00, or a year 0
            types[name] = pa.string()
            continue
        if typ != was:
            types[name] = typ
    if types:
        log.info("%s: columns typed from their sample's text: %s", path, types)
    return pa.schema(f.with_type(types[f.name]) if f.name in types else f for f in inferred)


def _json_wide_integer_types(
    path: str, file_format: Any, inferred: pa.Schema, first: pa.RecordBatch | None,
    options: dict[str, Any],
) -> pa.Schema:  # fmt: skip
    """The types of a JSON Lines file's integer columns with values past ``int64``, which
    Arrow's JSON inference reads as ``float64``: 64-bit unsigned ids and hashes past 2**63
    lost their low bits there, and distinct keys were silently summed as one group (DuckDB
    reads them as ``HUGEINT``). A column of the sample block whose every value is an integer
    literal (``3.0`` and ``1e20`` are floats, as JSON writers mean them) and one of them past
    ``int64`` is read as ``uint64`` (none negative), ``decimal(20, 0)`` (past ``int64`` both
    ways), or ``decimal(38, 0)`` (up to 38 digits). A column typed with ``--column-types``
    keeps its type."""
    if first is None or not first.num_rows:
        return inferred
    import pyarrow.compute as pc

    given = options.get("column_types") or {}
    names = first.schema.names
    candidates = []
    for column, name in zip(first.columns, names):
        if name in given or names.count(name) > 1:
            continue
        if column.type == pa.float64() and column.null_count < len(column):
            largest = pc.max(pc.abs(column)).as_py()
            if largest is not None and largest >= 2.0**63:
                candidates.append(name)
    if not candidates:
        return inferred
    integers = _json_sample_integers(path, file_format, candidates)
    types: dict[str, pa.DataType] = {}
    for name, (low, high) in integers.items():
        if low >= 0 and high < 1 << 64:
            types[name] = pa.uint64()
        elif low >= -(1 << 63) and high < 1 << 64:
            types[name] = pa.decimal128(20, 0)
        elif max(-low, high) < 10**38:
            types[name] = pa.decimal128(38, 0)
    if types:
        log.info("%s: integer columns past int64 typed from their sample's text: %s", path, types)
    return pa.schema(f.with_type(types[f.name]) if f.name in types else f for f in inferred)


def _json_sample_integers(
    path: str, file_format: Any, columns: Sequence[str]
) -> dict[str, tuple[int, int]]:
    """The smallest and largest value of each of ``columns`` whose every value in a JSON
    Lines file's first block (its sample) is an integer literal. Python's ``json`` reads the
    block's lines: Arrow's JSON reader keeps no number's text (and this runs only where a
    sampled float is past ``int64``)."""
    import json

    block_bytes = file_format.default_fragment_scan_options.read_options.block_size
    with contextlib.closing(_text_stream(path)) as stream:
        block = stream.read(block_bytes)
        complete = len(block) < block_bytes
    lines = block.split(b"\n")
    if not complete:
        lines.pop()  # cut by the block's end (Arrow's first block ends at a line's end too)
    bounds: dict[str, tuple[int, int]] = {}
    refused: set[str] = set()
    for line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            return {}  # Arrow parsed it: something this check does not follow; leave it
        if not isinstance(row, dict):
            return {}
        for name in columns:
            value = row.get(name)
            if value is None or name in refused:
                continue
            if type(value) is not int:
                refused.add(name)
                continue
            low, high = bounds.get(name, (value, value))
            bounds[name] = (min(low, value), max(high, value))
    return {name: pair for name, pair in bounds.items() if name not in refused}


def _json_sample_texts(
    path: str, file_format: Any, columns: Sequence[str]
) -> pa.RecordBatch | None:
    """The ``columns`` of a JSON Lines file's first block (the sample its types are inferred
    from, read as in :func:`_text_schema`) as strings."""
    import pyarrow.json as pajson

    read = file_format.default_fragment_scan_options.read_options
    parse = pajson.ParseOptions(
        explicit_schema=pa.schema([(n, pa.string()) for n in columns]),
        unexpected_field_behavior="ignore",
    )
    try:
        return _first_block(
            path, lambda source: pajson.open_json(source, read_options=read, parse_options=parse)
        )
    except pa.ArrowInvalid:  # a value that is not a string (a number beside "2024-…")
        return None


#: what to do about a CSV file that is not UTF-8 (the error's last words)
_NOT_UTF8_FIX = (
    "give its encoding (e.g. --encoding latin-1), or read a column's bytes with "
    "--column-types NAME:binary"
)
#: an integer as CSV writes it (space around it is trimmed when parsed), and one written
#: with a leading zero (not ``0`` alone)
_INTEGER_LITERAL = r"^\s*[+-]?[0-9]+\s*$"
_LEADING_ZERO = r"^\s*([+-]?0[0-9]|\+)"
#: a number as CSV writes it (what Arrow's inference reads as int64 or float64)
_NUMBER = r"^\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*$"


def _csv_sample_schema(
    path: str, file_format: Any, options: dict[str, Any], names: list[str] | None,
    quoted_empty: set[str],
) -> pa.Schema:  # fmt: skip
    """The schema Arrow reads from a CSV file's sample (:func:`_text_schema`). A column typed
    by the user (``--column-types v:float64``) whose sample holds a quoted empty field
    ``""`` stopped the read there ("invalid value ''"): such a column is read as text and
    cast (added to ``quoted_empty``, ``""`` a null), and keeps the type given. So is every
    column given a timestamp type with a zone (``t:timestamp[s,tz=Europe/Paris]``): Arrow's
    parser reads only text with an offset into one, and a wall time without one is a time
    in that zone (see :func:`_zoned`)."""
    given = options.get("column_types") or {}
    fmt = "tsv" if file_format.parse_options.delimiter == "\t" else "csv"
    as_text = {n: t for n, t in given.items() if pa.types.is_timestamp(t) and t.tz is not None}
    sep = file_format.parse_options.delimiter
    sample_format = file_format
    if as_text:
        types = {**given, **dict.fromkeys(as_text, pa.string())}
        sample_format = _file_format(fmt, {**options, "delimiter": sep, "column_types": types},
                                     names)  # fmt: skip
    while True:
        try:
            inferred = _text_schema(path, fmt, sample_format, options.get("encoding"))
            break
        except pa.ArrowInvalid as exc:
            match = _QUOTED_EMPTY.search(str(exc))
            if match is None:
                raise
            header = names or _csv_header(path, sep, options.get("encoding"))
            index = int(match.group(1))
            name = header[index] if index < len(header) else ""
            if name not in given or name in as_text or pa.types.is_string(given[name]):
                raise
            as_text[name] = given[name]
            types = {**given, **dict.fromkeys(as_text, pa.string())}
            sample_format = _file_format(
                fmt, {**options, "delimiter": sep, "column_types": types}, names
            )
    quoted_empty.update(as_text)
    for name, typ in as_text.items():
        inferred = inferred.set(inferred.get_field_index(name), pa.field(name, typ))
    return inferred


def _csv_types(
    path: str, file_format: Any, inferred: pa.Schema, columns: Sequence[str],
    options: dict[str, Any], quoted_empty: set[str] | None = None,
) -> pa.Schema:  # fmt: skip
    """The types of a CSV file's ``columns`` (those the query reads) fitted to what the sample
    block ``inferred`` was inferred from, as DuckDB types them (Arrow's inference alone lost
    values):

    - integers past int64 (inferred ``float64``, which merged distinct ids):
      ``decimal(38, 0)``, or ``string`` past 38 digits;
    - integers written with a leading zero (``007``; inferred ``int64``, which made ``007``,
      ``7`` and ``0007`` one key): ``string``;
    - text that is not UTF-8 (inferred ``binary``, then output as base64): an
      :class:`~extagg.errors.InputError` naming the file and the column;
    - numbers beside quoted empty fields (``"10.5"``, ``""``: a file that quotes every field;
      inferred ``string``, so nothing could sum it): numbers, ``""`` a null there (as in Spark
      and DuckDB; in a text column it stays the empty string). Such columns are added to
      ``quoted_empty``: they are parsed as text and cast, ``""`` as null
      (see :func:`_block_as`).

    A column typed with ``--column-types`` or ``--schema`` keeps its type. The values are
    those of the same sample block, parsed again as strings (only the number and text
    columns: one more parse of the sample, for files that have such columns)."""
    given = options.get("column_types") or {}
    numbers: list[str] = []
    for name in columns:
        if name in given or len(inferred.get_all_field_indices(name)) != 1:
            continue  # typed by the user; or not in this file, or twice (refused later)
        t = inferred.field(name).type
        if t == pa.binary():
            raise InputError(
                f"cannot read {path}: column {name!r} holds text that is not UTF-8 (a byte "
                f"that UTF-8 does not allow, e.g. Latin-1's é); {_NOT_UTF8_FIX}",
                path=path,
            )
        if t in (pa.int64(), pa.float64(), pa.string()):
            numbers.append(name)
    if not numbers:
        return inferred
    texts = _csv_sample_texts(path, file_format, numbers, options.get("encoding"))
    if texts is None:
        return inferred
    import pyarrow.compute as pc

    types: dict[str, pa.DataType] = {}
    for name in numbers:
        values = texts.column(name)  # an empty field is null, and nulls are skipped
        if values.null_count == len(values):
            continue
        if inferred.field(name).type == pa.string():
            # only a quoted empty field reads as '' here (an empty one is null)
            empty = pc.equal(values, "")
            if not pc.any(empty).as_py():
                continue
            values = pc.filter(values, pc.invert(empty))
            if options.get("decimal_point") == ",":  # 10,5 as 10.5
                values = pc.replace_substring(values, ",", ".")
            if not len(values) or not pc.all(pc.match_substring_regex(values, _NUMBER)).as_py():
                continue
            if pc.any(pc.match_substring_regex(values, _LEADING_ZERO)).as_py():
                continue  # ids with their zeros: text
            integers = pc.all(pc.match_substring_regex(values, _INTEGER_LITERAL)).as_py()
            try:
                typed = pa.int64() if integers else pa.float64()
                values.cast(typed)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # past int64
                continue
            types[name] = typed
            if quoted_empty is not None:
                quoted_empty.add(name)
            continue
        if inferred.field(name).type == pa.float64():
            if not pc.all(pc.match_substring_regex(values, _INTEGER_LITERAL)).as_py():
                continue  # a float (0.5, 1e3, nan): float64 it is
            digits = pc.max(pc.binary_length(values)).as_py()  # an upper bound: one pass
            if digits > 38:
                digits = pc.max(
                    pc.utf8_length(pc.replace_substring_regex(values, "[^0-9]", ""))
                ).as_py()
            types[name] = pa.decimal128(38, 0) if digits <= 38 else pa.string()
        if pc.any(pc.match_substring_regex(values, _LEADING_ZERO)).as_py():
            types[name] = pa.string()
    if types:
        log.info("%s: columns typed from their sample's text: %s", path, types)
    return pa.schema(f.with_type(types[f.name]) if f.name in types else f for f in inferred)


def _csv_sample_texts(
    path: str, file_format: Any, columns: Sequence[str], encoding: str | None = None
) -> pa.RecordBatch | None:
    """The ``columns`` of a CSV file's first block (the sample its types are inferred from,
    read as in :func:`_text_schema`) as strings, empty fields as nulls."""
    import pyarrow.csv as pacsv

    opts = file_format.default_fragment_scan_options
    convert = _convert_options(
        opts.convert_options, types={n: pa.string() for n in columns}, include=columns
    )

    def open_reader(source: Any) -> Any:
        return pacsv.open_csv(
            source, read_options=opts.read_options, parse_options=file_format.parse_options,
            convert_options=convert,
        )  # fmt: skip

    return _first_block(path, open_reader, encoding)


def _first_block(
    path: str, open_reader: Callable[[Any], Any], encoding: str | None = None
) -> pa.RecordBatch | None:
    """The first batch of the reader ``open_reader(source)`` makes of a text file's bytes,
    read through a :class:`_GatedStream` that lets it have one block (see :func:`_text_schema`)."""
    gate = _GatedStream(_text_stream(path, encoding), ahead=1)
    source = gate.arrow_stream()
    reader = None
    try:
        reader = gate.call(lambda: open_reader(source))
        batch: pa.RecordBatch | None = gate.call(reader.read_next_batch, taken=True)
        return batch
    finally:
        gate.close()  # before the reader goes (see _text_schema)
        del reader


class _FolderColumns:
    """The columns a hive folder's names give, as arrays of one repeated value, cut to each
    block's length from one array made long enough."""

    def __init__(self, values: dict[str, Any], schema: pa.Schema) -> None:
        self.names = [name for name in schema.names if name in values]
        self._scalars = [pa.scalar(values[n], schema.field(n).type) for n in self.names]
        self._arrays: list[pa.Array] = []

    def add(self, block: pa.RecordBatch) -> pa.RecordBatch:
        if not self.names:  # the query reads none of them
            return block
        n = block.num_rows
        if not self._arrays or len(self._arrays[0]) < n:
            # as long as a small file's batch: one is made per file (6 120 files of 33 rows:
            # 0.9 s of 4.5 with 1 024 rows made by a take each)
            self._arrays = [pa.repeat(s, n) for s in self._scalars]
        arrays = [*block.columns, *(a.slice(0, n) for a in self._arrays)]
        return pa.RecordBatch.from_arrays(arrays, names=[*block.schema.names, *self.names])


#: seconds a read waits past the limit while the reader's caller waits for a batch (a
#: safety net: see :class:`_GatedStream`)
GATE_ESCAPE_S = 0.2


#: seconds :func:`_close_open_gates` waits at most at exit for a reader to take its end of
#: file (it returns as soon as the reader has: this bounds a starved machine's case only;
#: 0.5 s was too short once on a loaded CI machine, and the process aborted)
GATE_EXIT_WAIT_S = 5.0


def _close_open_gates() -> None:
    """At exit, before the interpreter finalizes: close every gate of a scan left unfinished
    (its generator still referenced), wait until the reader's I/O thread has taken the end
    of the file and left, and keep the gate's ``pa.PythonFile`` for good: a thread of
    Arrow's that takes the GIL of a finalizing interpreter (a read, or the file's destructor
    when that thread drops the last reference) aborts the process ("terminate called
    without an active exception", exit 134)."""
    gates = list(_OPEN_GATES)
    for gate in gates:
        gate.close()
    deadline = time.monotonic() + GATE_EXIT_WAIT_S
    for gate in gates:
        gate.wait_until_ended(max(0.0, deadline - time.monotonic()))
        python_file = gate.python_file()
        if python_file is not None:  # never freed: the process is ending
            import ctypes

            ctypes.pythonapi.Py_IncRef(ctypes.py_object(python_file))


class _GatedStream:
    """A file-like stream for Arrow (:meth:`arrow_stream`) whose reads wait while the
    reader is :data:`TEXT_BLOCKS_AHEAD` blocks ahead of the batches taken from it.

    Arrow's streaming CSV and JSON readers read their input on an I/O thread up to 32
    blocks ahead of the batch asked for, into Arrow's memory pool, outside any budget
    (84 MiB of 1.6 MiB blocks while TPC-H Q1 ran on SF1 CSV at 26 MiB). Each
    read here is one block (the readers ask for ``block_size`` bytes at a time) and waits
    until the caller has taken enough batches (:meth:`call` with ``taken``). Arrow gives a
    batch for every block, an empty one for a block of blank lines; should a block ever give
    none, the count would lag and both sides would wait: a read also goes ahead once the
    caller has waited for a batch for :data:`GATE_ESCAPE_S`."""

    def __init__(self, stream: Any, ahead: int | None = None) -> None:
        import threading

        self._stream = stream
        self._ahead = TEXT_BLOCKS_AHEAD if ahead is None else ahead
        self._cond = threading.Condition()
        self._reads = 0
        self._taken = 0
        self._caller_waits_since: float | None = None
        #: the most blocks read ahead of those taken (for tests)
        self.max_lead = 0
        self.closed = False
        self._inside = 0  # threads in a read now
        self._ended = False  # a read has returned the end of the file since close()
        #: the ``pa.PythonFile`` over this stream, while one lives (see :meth:`arrow_stream`)
        self.python_file: Callable[[], Any] = lambda: None
        #: a ``\r`` that ended the last read, held back for the next (see :meth:`read`)
        self._carry = b""
        _OPEN_GATES.add(self)

    def arrow_stream(self) -> Any:
        """This stream as an Arrow input stream for a reader. Arrow's threads call
        :meth:`read` through a ``pa.PythonFile`` behind a ``pa.BufferedInputStream``: the
        buffered stream copies each block into Arrow's memory while the read holds the GIL
        (a ``pa.PythonFile`` read alone lends Arrow the Python object, which the I/O thread
        then releases, taking the GIL, possibly in a finalizing interpreter)."""
        python_file = pa.PythonFile(self, mode="r")
        self.python_file = weakref.ref(python_file)
        # blocks of at least one byte are read straight into the block's buffer
        return pa.BufferedInputStream(python_file, buffer_size=1)

    def readable(self) -> bool:
        return True

    def read(self, nbytes: int = -1) -> Any:
        """Up to ``nbytes`` bytes (an Arrow buffer); the end of the file once closed."""
        with self._cond:
            self._inside += 1
        try:
            if not self._admit():
                self._ended = True
                return b""
            carry, self._carry = self._carry, b""
            want = nbytes - len(carry) if nbytes > len(carry) else nbytes
            buffer: Any = self._stream.read_buffer(want)
            if carry:
                buffer = carry + buffer.to_pybytes()
            size = len(buffer)
            if not size:  # the end of the file: no more reads
                self._ended = True
            elif size > 1 and buffer[size - 1 : size] == b"\r":
                # each read is a block of Arrow's CSV reader, which drops the \n of a quoted
                # \r\n split between two blocks (pyarrow 26): blocks do not end in a \r
                self._carry = b"\r"
                buffer = buffer[: size - 1]
            return buffer
        finally:
            with self._cond:
                self._inside -= 1
                self._cond.notify_all()

    def wait_until_ended(self, timeout: float) -> bool:
        """Wait (after :meth:`close`) until the reader's thread has been given the end of
        the file and is out of this object's methods; ``False`` after ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: self._ended and not self._inside, timeout)

    def _admit(self) -> bool:
        import sys

        with self._cond:
            while not self.closed and self._reads > self._taken + self._ahead:
                since = self._caller_waits_since
                if since is not None and time.monotonic() - since >= GATE_ESCAPE_S:
                    break
                if sys.is_finalizing():
                    break
                self._cond.wait(GATE_ESCAPE_S / 4)
            if self.closed:
                return False
            self._reads += 1
            self.max_lead = max(self.max_lead, self._reads - self._taken)
            return True

    def call(self, fn: Callable[[], Any], taken: bool = False) -> Any:
        """``fn()`` (which waits on the reader) marked as the caller waiting; ``taken``: it
        takes a batch (``StopIteration`` is returned as ``None``)."""
        with self._cond:
            self._caller_waits_since = time.monotonic()
        try:
            return fn()
        except StopIteration:
            return None
        finally:
            with self._cond:
                self._caller_waits_since = None
                self._taken += taken
                self._cond.notify_all()

    def close(self) -> None:
        """Reads from now on see the end of the file (the reader's thread stops reading).
        The file itself is closed with the last reference to it: Arrow's thread may be in a
        read of it now."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()


#: the gates not closed yet (see :func:`_close_open_gates`)
_OPEN_GATES: weakref.WeakSet[_GatedStream] = weakref.WeakSet()
atexit.register(_close_open_gates)


def row_bytes(schema: pa.Schema) -> int:
    """A rough decoded width of one row of ``schema`` (variable-width values counted as 32 B)."""
    total = 0
    for f in schema:
        try:
            total += max(1, f.type.bit_width // 8) + 1
        except ValueError:  # strings, binaries, nested: offsets plus a guess of the data
            total += 4 + 32
    return max(total, 8)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def detect_format(path: str) -> str | None:
    """The format of ``path`` from its extension (compression suffixes looked through)."""
    name = path.lower()
    for suffix in COMPRESSION_CODECS:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return _EXT.get(os.path.splitext(name)[1])


_TYPES = {
    "int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
    "int": pa.int64(), "bigint": pa.int64(), "uint8": pa.uint8(), "uint16": pa.uint16(),
    "uint32": pa.uint32(), "uint64": pa.uint64(), "float32": pa.float32(), "float": pa.float32(),
    "float64": pa.float64(), "double": pa.float64(), "bool": pa.bool_(), "boolean": pa.bool_(),
    "string": pa.string(), "str": pa.string(), "utf8": pa.string(), "binary": pa.binary(),
    "large_string": pa.large_string(), "date": pa.date32(), "date32": pa.date32(),
    "timestamp": pa.timestamp("us"),
}  # fmt: skip


def parse_type(text: str) -> pa.DataType:
    """An Arrow type from its name: ``int64``, ``string``, ``date32``, ``decimal(15,2)``,
    ``timestamp[ms]``, ..."""
    given = text.strip().replace(" ", "")
    t = given.lower()
    if t in _TYPES:
        return _TYPES[t]
    m = re.fullmatch(r"decimal(?:128)?\((\d+),(\d+)\)", t)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    m = re.fullmatch(r"timestamp\[(s|ms|us|ns)(?:,tz=(.+))?\]", given, flags=re.IGNORECASE)
    if m:  # the zone as given: 'Europe/Paris', not 'europe/paris' (which nothing reads)
        return pa.timestamp(m.group(1).lower(), tz=_time_zone(m.group(2), text))
    raise QueryError(
        f"unknown column type {text!r}; known: {', '.join(sorted(_TYPES))}, decimal(p,s), "
        "timestamp[unit]"
    )


def _time_zone(zone: str | None, text: str) -> str | None:
    """A timestamp type's zone, checked: an IANA name (``UTC``, ``Europe/Paris``) or a fixed
    offset (``+02:00``); a misspelt one failed only when the result was written."""
    if zone is None or re.fullmatch(r"[+-]\d\d:\d\d", zone):
        return zone
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise QueryError(
            f"unknown time zone {zone!r} in column type {text!r}: give an IANA name such as "
            "'UTC' or 'Europe/Paris', or an offset such as '+02:00'"
        ) from None
    return zone


def parse_column_types(spec: str | None) -> dict[str, pa.DataType]:
    """``"a=int64,b=decimal(15,2),t=timestamp[s,tz=UTC]"`` (or ``a:int64``) as a dict of Arrow
    types (commas inside ``(...)`` and ``[...]`` belong to the type)."""
    out: dict[str, pa.DataType] = {}
    if not spec:
        return out
    for part in re.split(r",(?![^()\[\]]*[)\]])", spec):
        if not part.strip():
            continue
        # name=type or name:type, whichever comes first ('t:timestamp[s,tz=UTC]' has both)
        cut = min((i for i in (part.find("="), part.find(":")) if i >= 0), default=-1)
        name, typ = part[:cut], part[cut + 1 :]
        if cut < 0 or not name.strip():
            raise QueryError(f"column type {part!r} must look like name=type")
        out[name.strip()] = parse_type(typ)
    return out


def _file_format(fmt: str, options: dict[str, Any], column_names: list[str] | None) -> Any:
    import pyarrow.csv as pacsv

    if fmt in ("csv", "tsv"):
        delimiter = options.get("delimiter") or ("\t" if fmt == "tsv" else ",")
        types = options.get("column_types") or {}
        read = pacsv.ReadOptions(
            block_size=options.get("block_size", 1 << 22),
            column_names=column_names,
            autogenerate_column_names=False,
            skip_rows=options.get("skip_rows", 0),
        )
        # an empty field is null; a quoted empty one ("") the empty string; nothing else, as in
        # DuckDB, Polars and Spark: Arrow's default markers read the country NA, "n/a" and
        # "NULL" as nulls, and a float's nan as null (extagg's own CSV writes NaN as nan)
        convert = pacsv.ConvertOptions(
            column_types=types,
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
            decimal_point=options.get("decimal_point", "."),
        )
        # a quoted value may hold a newline (a comment, an address): without this a block
        # boundary inside one ended the run ("CSV parser got out of sync with chunker"); the
        # streaming reader parses one block at a time, at the same speed either way
        quote = options.get("quote", '"')
        parse = pacsv.ParseOptions(
            delimiter=delimiter, newlines_in_values=quote is not False, quote_char=quote
        )
        return ds.CsvFileFormat(parse_options=parse, read_options=read, convert_options=convert)
    if fmt == "json":
        import pyarrow.json as pajson

        # types inferred from a sample as large as CSV's (Arrow's default block is 1 MiB)
        sample = pajson.ReadOptions(block_size=options.get("block_size", 1 << 22))
        return ds.JsonFileFormat(read_options=sample)
    if fmt == "ipc":
        return ds.IpcFileFormat()
    return ds.ParquetFileFormat()


def _closest(name: str, choices: Sequence[str]) -> str:
    same = [c for c in choices if c.lower() == name.lower()]  # another case: YEAR for year
    spaced = [c for c in choices if c.strip() == name.strip() and c != name]
    if spaced:  # a header "id, name": quoted, the name keeps its space
        return f'; did you mean {spaced[0]!r}? (quote it: "{spaced[0]}")'
    best = same or difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f"; did you mean {best[0]!r}?" if best else ""


def _in_struct(name: str, structs: Collection[str]) -> bool:
    """Whether the dotted ``name`` starts with one of the struct columns ``structs``."""
    return any(name.startswith(f"{root}.") for root in structs)


def _not_a_struct_field(name: str, schema: pa.Schema, path: str) -> None:
    """Refuse ``--column-types`` for ``name`` when it is a field inside one of ``schema``'s
    struct columns: declared, it would be a top-level field of that name, never set (nulls);
    a field inside an object takes the type the object's sample gave it."""
    for f in schema:
        if pa.types.is_struct(f.type) and name.startswith(f"{f.name}."):
            raise QueryError(
                f"--column-types {name}: {path} has it as a field inside the object column "
                f"{f.name!r}, whose fields take the types the first block gives them; "
                f"convert it in the query instead (cast({name} as TYPE))"
            )


def unknown_column(name: str, available: Sequence[str], what: str = "column") -> QueryError:
    """The usage error for a column that is not there: the available ones and the closest
    (the name is kept as the error's ``column``)."""
    error = QueryError(
        f"unknown {what} {name!r}{_closest(name, available)} (available: {', '.join(available)})"
    )
    error.column = name  # type: ignore[attr-defined]
    return error


def open_input(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    needed: Sequence[str],
    *,
    filter: Any = None,
    filter_columns: Sequence[str] = (),
    format: str | None = None,
    delimiter: str | None = None,
    column_types: dict[str, pa.DataType] | None = None,
    schema: pa.Schema | None = None,
    header: bool = True,
    sample_bytes: int = 1 << 22,
    encoding: str | None = None,
    quote: str | None = '"',
    bind_filter: Callable[[pa.Schema], Any] | None = None,
    decimal_comma: bool = False,
    struct_paths: Mapping[str, Sequence[tuple[str, ...]]] | None = None,
) -> InputScan:
    """Resolve ``paths`` and plan a scan of the ``needed`` columns (see the module docstring).

    CSV column types are inferred from the first ``sample_bytes`` of each file. ``encoding``
    (a Python codec name) is that of CSV/TSV text not in UTF-8; ``decimal_comma``: its numbers
    are written ``1,5`` (a delimiter other than ``,`` is then needed).
    ``bind_filter(schema)``, given the types of the columns read (the filter's among them)
    before any row group is pruned, returns ``filter`` fitted to them, or raises.
    ``struct_paths``: struct columns the query reads only through these fields; JSON Lines
    objects are then parsed into those fields alone (the others skipped: ~35 % of the parse),
    and a Parquet struct's other leaves are not read.

    Raises :class:`~extagg.errors.InputError` (missing files, schemas that cannot be unified,
    naming both files and the column) and :class:`~extagg.errors.QueryError` (a needed column
    that no file has, with the closest match).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [os.fspath(paths)]
    files = expand_input_paths([os.fspath(p) for p in paths])
    tsv_files: set[str] = set()  # .tsv files beside .csv ones: read as CSV split by tabs
    if format is not None:
        fmt = format.lower()
        if fmt in ("arrow", "feather"):
            fmt = "ipc"
        if fmt in ("jsonl", "ndjson"):
            fmt = "json"
        if fmt not in FORMATS:
            raise QueryError(f"unknown format {format!r}; known: {', '.join(FORMATS)}")
    else:
        kinds = {f: detect_format(f) for f, _ in files}
        unknown = [f for f, k in kinds.items() if k is None]
        if unknown:
            raise QueryError(
                f"cannot tell the format of {unknown[0]} from its extension; give --format "
                f"({', '.join(FORMATS)})"
            )
        found = sorted({k for k in kinds.values() if k is not None})
        if found == ["csv", "tsv"] and delimiter is None:
            found, tsv_files = ["csv"], {f for f, k in kinds.items() if k == "tsv"}
        if found == ["csv", "tsv"]:
            raise QueryError(
                "the inputs mix .csv and .tsv files, and --delimiter would apply to all of "
                "them: leave it out (each file is read with its own), or aggregate one format "
                "at a time"
            )
        if len(found) > 1:
            raise QueryError(f"the inputs mix formats {found}; aggregate one format at a time")
        fmt = found[0]
    if encoding is not None:
        if fmt not in ("csv", "tsv"):
            raise QueryError("--encoding applies to CSV/TSV only (JSON Lines are UTF-8)")
        try:
            _is_utf8(encoding)
        except LookupError:
            raise QueryError(f"unknown encoding {encoding!r} (e.g. latin-1, cp1252)") from None
    if fmt in ("csv", "tsv", "json"):
        # an empty text file holds no rows (log rotation leaves many): Arrow's readers refuse
        # it ("Empty CSV file", "Empty JSON stream"), which stopped the whole run
        empty = {f for f, _ in files if _holds_no_text(f, encoding)}
        if empty:
            log.info("input: %d empty file(s) skipped, e.g. %s", len(empty), min(empty))
            if len(empty) == len(files):
                return _scan_of_nothing(
                    [f for f, _ in files], fmt, needed, filter_columns, schema, column_types
                )
            files = [(f, base) for f, base in files if f not in empty]
    delimiter = parse_delimiter(delimiter)
    options: dict[str, Any] = {
        "delimiter": delimiter, "column_types": dict(column_types or {}),
        "block_size": sample_bytes, "encoding": encoding, "quote": parse_quote(quote, fmt),
        "decimal_point": "," if decimal_comma else ".",
    }  # fmt: skip
    if decimal_comma and fmt not in ("csv", "tsv"):
        raise QueryError("--decimal-comma applies to CSV/TSV only")
    if decimal_comma and delimiter == ",":
        raise QueryError("--decimal-comma needs a delimiter other than ',' (e.g. --delimiter ';')")
    names = None
    if schema is not None:
        options["column_types"] = {**{f.name: f.type for f in schema}, **options["column_types"]}
        if fmt in ("csv", "tsv"):
            # every column in order: the schema names them, as DuckDB's ``columns`` and
            # Polars' ``schema`` do; a header line is skipped, not read as names
            names = schema.names
            options["skip_rows"] = 1 if header else 0
    elif not header:
        raise QueryError("files without a header need --schema to name their columns")
    if fmt not in ("csv", "tsv") and (delimiter or not header):
        raise QueryError("--delimiter and --no-header apply to CSV/TSV only")
    file_format = _file_format(fmt, options, names)
    # each .csv file's own delimiter when none is given (as DuckDB's sniffer, per file): a
    # ';' file beside ',' ones was read as one column, its values nulls
    file_formats: dict[str, Any] = {}
    if fmt == "csv" and not delimiter and (header or tsv_files):
        by_delimiter = {",": file_format}
        for path, _base in files:
            if path in tsv_files:
                sep = "\t"
            else:
                sep = sniff_delimiter(path, encoding) if header else ","
            if sep not in by_delimiter:
                by_delimiter[sep] = _file_format(fmt, {**options, "delimiter": sep}, names)
            file_formats[path] = by_delimiter[sep]
            if sep == "," and decimal_comma:
                raise InputError(
                    f"{path}: its fields are separated by commas, so its numbers cannot have a "
                    "decimal comma (--decimal-comma); give the --delimiter it uses",
                    path=path,
                )

    def format_of(path: str) -> Any:
        return file_formats.get(path, file_format)

    rows_seen: dict[str, bool] = {}

    def has_rows(path: str) -> bool:
        """Whether the text file ``path`` has a data row (asked once a file)."""
        if path not in rows_seen:
            rows_seen[path] = _text_has_rows(path, fmt, format_of(path), options.get("encoding"))
        return rows_seen[path]

    # ---------------------------------------------------------------- schemas
    read_cols = list(dict.fromkeys([*needed, *filter_columns]))
    per_file: list[tuple[str, pa.Schema]] = []
    runs: set[str] = set()  # Arrow files with run-end encoded columns
    #: each CSV file's number columns that hold quoted empty fields (see _csv_types)
    quoted_empty: dict[str, set[str]] = {}
    #: each Parquet file's row groups and rows, when there is no filter to prune them by
    footers: dict[str, tuple[int, int]] = {}
    for path, _base in files:
        try:
            if fmt in ("csv", "tsv"):
                empties = quoted_empty.setdefault(path, set())
                inferred = _csv_sample_schema(path, format_of(path), options, names, empties)
                typed = _csv_types(path, format_of(path), inferred, read_cols, options, empties)
                per_file.append((path, typed))
            elif fmt == "json":
                inferred, _, first = _text_sample(path, fmt, format_of(path), None, rows=True)
                typed = _json_wide_integer_types(path, format_of(path), inferred, first, options)
                del first  # the sample block, parsed
                typed = _json_temporal_types(path, format_of(path), typed, read_cols, options)
                for name, given in options["column_types"].items():
                    # a field the query reads, first set past the sample, declared (one it
                    # does not read stays a typo: "did you mean")
                    if name not in typed.names and name in read_cols:
                        _not_a_struct_field(name, typed, path)
                        typed = typed.append(pa.field(name, given))
                per_file.append((path, typed))
            elif fmt == "ipc" and is_ipc_stream(path):
                with pa.OSFile(path, "rb") as source, pa.ipc.open_stream(source) as reader:
                    per_file.append((path, reader.schema))
            elif fmt == "parquet":
                # the footer read once: its schema now, its row groups for the plan below
                # (with no filter to prune them by: read again per file, 0.4 ms each)
                import pyarrow.parquet as pq

                footer = pq.read_metadata(path)
                per_file.append((path, footer.schema.to_arrow_schema()))
                if filter is None:
                    footers[path] = (footer.num_row_groups, footer.num_rows)
            else:
                file_schema = file_format.inspect(path, _LOCAL)
                per_file.append((path, file_schema))
                if any(pa.types.is_run_end_encoded(f.type) for f in file_schema):
                    runs.add(path)
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            reason, hint = _row_of_file(reason, 0, path, encoding), _mixed_json_hint(reason)
            if "straddl" in reason or "increase block size" in reason:  # the sample's block
                reason, hint = _long_record(reason, sample_bytes, "1/16")
            if fmt in ("csv", "tsv") and "CSV column #" in reason:
                sep = format_of(path).parse_options.delimiter
                file_names = names or _csv_header(path, sep, encoding)
                hint = _csv_column_hint(reason, file_names, options["column_types"])
                hint = _bad_value_line(reason, path, encoding, sep) + hint
            if fmt in ("csv", "tsv"):
                hint = _ragged_row_line(str(exc), path, encoding) + hint
            raise InputError(f"cannot read {path} as {fmt}: {reason}{hint}", path=path) from exc
        except UnicodeDecodeError as exc:  # the column names of a header not in UTF-8
            raise InputError(
                f"cannot read {path} as {fmt}: its header is not UTF-8 text ({exc}); "
                "give its encoding (e.g. --encoding latin-1), or name the columns with --schema "
                "(the header line is then skipped)",
                path=path,
            ) from exc
    hive: dict[str, pa.DataType] = {}
    folder_values: dict[str, set[str]] = {}
    for path, base in files:
        if base is None:
            continue
        rel = os.path.relpath(os.path.dirname(path), base)
        for part in [] if rel == "." else rel.split(os.sep):
            m = _HIVE.match(part)
            if m:
                hive.setdefault(m.group(1), pa.string())
                folder_values.setdefault(m.group(1), set()).add(m.group(2))
    if fmt not in ("csv", "tsv", "json") and set(column_types or {}) - set(hive):
        raise QueryError(
            "--column-types applies to CSV/TSV and JSON Lines only, and to hive folder columns "
            "(Parquet and Arrow files carry their types)"
        )
    available = list(dict.fromkeys([n for _, s in per_file for n in s.names] + list(hive)))
    #: the struct columns, by name (their fields over every file): a dotted name the input
    #: lacks may be a field of one (``payload.user``), which the caller reads as an expression
    structs: dict[str, pa.DataType] = {}
    for _, file_schema in per_file:
        for f in file_schema:
            if pa.types.is_struct(f.type) and f.name not in structs:
                try:
                    structs[f.name] = _unify_column(f.name, per_file).type
                except InputError:  # reported as such once the query's columns are known
                    structs[f.name] = f.type
    missing = [name for name in dict.fromkeys([*needed, *filter_columns]) if name not in available]
    if missing:  # the first named; all of them kept for the caller (struct fields among them)
        name = missing[0]
        error = unknown_column(name, available)
        error.struct_types = structs  # type: ignore[attr-defined]
        error.missing = missing  # type: ignore[attr-defined]
        if fmt == "json" and is_plain_name(name) and not _in_struct(name, structs):
            # fields are those of the sample's objects
            error = QueryError(
                f"{error}; a JSON Lines field first set past the first block of a file "
                f"(which the fields are read from) is not seen: declare it with "
                f"--column-types {name}:TYPE"
            )
            error.column = name  # type: ignore[attr-defined]
            error.struct_types = structs  # type: ignore[attr-defined]
            error.missing = missing  # type: ignore[attr-defined]
        raise error
    for name in column_types or {}:  # a typo would leave the type it meant unused
        if name not in available:
            raise unknown_column(name, available, "column in --column-types")
    for path, schema in per_file:
        twice = [n for n in read_cols if schema.get_all_field_indices(n)[1:]]
        if twice:
            raise InputError(
                f"{path} has {len(schema.get_all_field_indices(twice[0]))} columns named "
                f"{twice[0]!r}; the query cannot tell them apart (rename them in the file, or "
                "for CSV name every column with --schema and skip the header)",
                path=path,
            )
    fields: list[pa.Field] = []
    # JSON Lines: a type given overrides the one inferred from the first block (the reader is
    # given the schema); CSV's were given to the inference itself
    json_types = options["column_types"] if fmt == "json" else {}
    pruned_structs: set[str] = set()  # parsed into the fields read alone
    for name in read_cols:
        if name in hive:
            continue
        if name in json_types:
            fields.append(pa.field(name, json_types[name]))
            continue
        unified_field = _unify_column(name, per_file)
        if (
            fmt in ("csv", "tsv")
            and unified_field.type == pa.null()
            and any(has_rows(path) for path, schema in per_file if name in schema.names)
        ):
            # empty in every file's sample: text, as DuckDB reads it (a null column failed on
            # the first value past the sample, "CSV conversion error to null"); in files of
            # a header only it stays null (no value to read: `sum` of it is null, not an
            # error that it is text)
            unified_field = unified_field.with_type(pa.string())
        fields_read = (struct_paths or {}).get(name)
        if (
            fields_read
            and pa.types.is_struct(unified_field.type)
            and (fmt == "json" or (fmt == "parquet" and _leaves_named_plainly(fields_read)))
        ):
            unified_field = unified_field.with_type(
                _struct_of_fields(unified_field.type, fields_read)
            )
            pruned_structs.add(name)
        fields.append(unified_field)
    # hive folder columns: typed from every folder's value (as Spark and DuckDB do), or as given
    groups: dict[str | None, list[str]] = {}
    for path, base in files:
        groups.setdefault(base, []).append(path)
    for name in hive:
        given = (column_types or {}).get(name)
        hive[name] = given if given is not None else folder_column_type(folder_values[name])
    fields += [pa.field(n, hive[n]) for n in read_cols if n in hive]
    unified = pa.schema(fields)
    if filter is not None and bind_filter is not None:
        filter = bind_filter(unified)

    parts: list[tuple[str, Any, Any, dict[str, Any]]] = []
    total_rows: int | None = 0 if fmt == "parquet" else None
    rg_total = rg_selected = skipped = 0
    # the folder columns the query reads (the others are neither parsed nor added)
    hive_schema = pa.schema([pa.field(n, hive[n]) for n in read_cols if n in hive])
    # a file given on its own, beside hive folders, has the folder columns too: nulls (or its
    # own column of that name); without them the scan failed with a KeyError
    part_schema = pa.schema([*[f for f in unified if f.name not in hive], *hive_schema])
    for base, group in groups.items():
        partitioning = ds.partitioning(hive_schema, flavor="hive") if base is not None else None
        for path in group:
            kwargs: dict[str, Any] = {"format": file_format, "schema": part_schema}
            if base is not None:
                kwargs["partitioning"] = partitioning
                kwargs["partition_base_dir"] = base
            if path in footers:  # Parquet, every row group read: no dataset to prune by
                n_rg, rows = footers[path]
                rg_total += n_rg
                rg_selected += n_rg
                whole: dict[str, Any] = {
                    "row_groups": n_rg, "rows": rows, "row_group_ids": list(range(n_rg)),
                    "schema": part_schema,
                }  # fmt: skip
                if base is not None:
                    whole["folder_values"] = _folder_values_parsed(
                        path, base, partitioning, list(hive)
                    )
                assert total_rows is not None
                total_rows += rows
                parts.append((path, None, fmt, whole))
                continue
            if fmt in ("csv", "tsv", "json"):
                values = _folder_values(path, kwargs, list(hive)) if base is not None else {}
                text = _TextFile(fmt, format_of(path), part_schema, values, encoding,
                                 frozenset(quoted_empty.get(path, ())),
                                 frozenset(options["column_types"]),
                                 frozenset(pruned_structs))  # fmt: skip
                parts.append((path, None, fmt, {"text": text}))
                continue
            if fmt == "ipc" and (path in runs or is_ipc_stream(path)):
                # a stream, or a file with run-end encoded columns (the dataset scan cannot
                # cast them to their values: "Unsupported cast from run_end_encoded"), read a
                # batch at a time by pyarrow.ipc, each column decoded
                values = _folder_values(path, kwargs, list(hive)) if base is not None else {}
                parts.append((path, None, fmt, {"stream": _IpcStream(part_schema, values)}))
                continue
            dataset = ds.dataset([path], **kwargs)
            opts: dict[str, Any] = {}
            if fmt == "parquet":
                # the row groups to read, by number: a dataset kept for each file held its
                # metadata and statistics (~16 KiB a file: 1 GiB for 61 K small files)
                pruned, n_rg, n_sel, rows = _prune_row_groups(dataset, filter, part_schema)
                if not n_rg and base is not None:
                    skipped += 1  # its folder names exclude it
                rg_total += n_rg
                rg_selected += n_sel
                opts["row_groups"] = n_sel
                opts["rows"] = rows
                opts["row_group_ids"] = _row_group_ids(pruned)
                opts["schema"] = part_schema
                if base is not None:
                    opts["folder_values"] = _folder_values(path, kwargs, list(hive), dataset)
                assert total_rows is not None
                total_rows += rows
                del pruned
                dataset = None
            parts.append((path, dataset, fmt, opts))
    scan = InputScan(
        files=[f for f, _ in files], format=fmt,
        schema=pa.schema([unified.field(n) for n in needed]), columns=list(needed),
        filter=filter, total_bytes=sum(_size(f) for f, _ in files), total_rows=total_rows,
        row_groups_total=rg_total, row_groups_selected=rg_selected, files_skipped=skipped,
    )  # fmt: skip
    scan._parts = parts
    scan.filter_columns = list(filter_columns)
    log.info(
        "input: %d %s file(s), %d bytes, columns %s, row groups %d of %d",
        len(files), fmt, scan.total_bytes, needed, rg_selected, rg_total,
    )  # fmt: skip
    return scan


def _holds_no_text(path: str, encoding: str | None = None) -> bool:
    """Whether a text file (decompressed) holds nothing but white space, after a UTF-8 byte
    order mark if it starts with one (read until its first other byte: a blank file of more
    than 4 KiB, or one of a BOM alone, was "Empty CSV file", exit 1)."""
    if _size(path) == 0:
        return True
    try:
        with _text_stream(path, encoding) as stream:
            first = True
            while True:
                piece = stream.read(1 << 16)
                if first:
                    piece, first = piece.removeprefix(b"\xef\xbb\xbf"), False
                if piece.strip():
                    return False
                if not piece:
                    return True
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError):
        return False  # the reader says what is wrong with it


def _scan_of_nothing(
    files: list[str],
    fmt: str,
    needed: Sequence[str],
    filter_columns: Sequence[str],
    declared: pa.Schema | None = None,
    column_types: dict[str, pa.DataType] | None = None,
) -> InputScan:
    """The scan of text files that are all empty: no rows. A ``--schema`` (``declared``)
    still names the columns — one it does not have is an unknown column, as with rows — and
    gives their types; else a column takes its ``--column-types`` type, or ``null`` (as in a
    result of no input), and since no header can tell a mistyped column name from a real
    one, a warning says so."""
    if declared is not None:
        for name in [*needed, *filter_columns]:
            if name not in declared.names:
                raise unknown_column(name, declared.names)
        types = {f.name: f.type for f in declared}
    else:
        types = dict(column_types or {})
        log.warning(
            "every input is empty (%s): no header names its columns, so those the query "
            "names are not checked; the result has no rows",
            files[0] if len(files) == 1 else f"{len(files)} files, e.g. {min(files)}",
        )
    fields = [pa.field(n, types.get(n, pa.null())) for n in needed]
    scan = InputScan(
        files=files, format=fmt, schema=pa.schema(fields),
        columns=list(needed), filter=None, total_bytes=0, total_rows=0,
        row_groups_total=0, row_groups_selected=0,
    )  # fmt: skip
    scan._parts = []
    scan.filter_columns = list(filter_columns)
    return scan


#: the first bytes of an Arrow IPC *file* (Feather v2); a stream starts with a message
IPC_FILE_MAGIC = b"ARROW1"


def _ipc_record_batches(source: Any, stream: bool) -> Iterator[pa.RecordBatch]:
    """The record batches of an open Arrow IPC stream or file, one at a time."""
    if stream:
        with pa.ipc.open_stream(source) as reader:
            yield from reader
        return
    with pa.ipc.open_file(source) as reader:
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


def is_ipc_stream(path: str) -> bool:
    """Whether ``path`` holds the Arrow IPC stream format rather than the file format."""
    with open(path, "rb") as f:
        head = f.read(len(IPC_FILE_MAGIC))
    return head != IPC_FILE_MAGIC


@dataclass
class _IpcStream:
    """How to read one Arrow IPC stream: the scan's schema for it (the folder columns'
    included) and its folder columns' values."""

    schema: pa.Schema
    folder_values: dict[str, Any]


#: the folder name Hive and Spark give a null partition value
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_FOLDER_INT = re.compile(r"^-?(0|[1-9][0-9]*)$")
_FOLDER_FLOAT = re.compile(r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$")
_FOLDER_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")
_FOLDER_TIMESTAMP = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?$"
)


def folder_column_type(raw_values: Iterator[str] | set[str] | list[str]) -> pa.DataType:
    """The type of a hive folder column, from the values its folder names give (URL-encoded,
    as written; the null marker ignored), inferred as Spark infers partition columns: int32
    when every value fits, else int64, else float64 (integers and decimals mixed), else date32
    (``YYYY-MM-DD``), else timestamp[us] (``YYYY-MM-DD HH:MM[:SS[.ffffff]]``), else string.

    Unlike Spark, a number written with leading zeros or a plus sign (``zip=01234``) keeps the
    column a string: read as an integer it would lose its digits."""
    from datetime import date, datetime
    from urllib.parse import unquote

    values = {unquote(v) for v in raw_values} - {HIVE_NULL}
    if not values:
        return pa.string()
    if all(_FOLDER_INT.match(v) for v in values):
        numbers = [int(v) for v in values]
        if all(-(2**31) <= n < 2**31 for n in numbers):
            return pa.int32()
        if all(-(2**63) <= n < 2**63 for n in numbers):
            return pa.int64()
        return pa.string()
    if all(_FOLDER_FLOAT.match(v) for v in values):
        return pa.float64()

    def all_parse(pattern: re.Pattern[str], parse: Callable[[str], Any]) -> bool:
        try:
            return all(pattern.match(v) and parse(v) for v in values)
        except ValueError:  # 2024-02-30
            return False

    if all_parse(_FOLDER_DATE, date.fromisoformat):
        return pa.date32()
    if all_parse(_FOLDER_TIMESTAMP, datetime.fromisoformat):
        return pa.timestamp("us")
    return pa.string()


def _folder_values_parsed(
    path: str, base: str, partitioning: Any, names: Sequence[str]
) -> dict[str, Any]:
    """:func:`_folder_values` from the path's folder names alone, as a dataset of the file
    would find them (``partition_base_dir``), without making one (~0.1 ms a file)."""
    folders = os.path.relpath(os.path.dirname(path), base)
    if folders == os.curdir:
        return dict.fromkeys(names)
    # the last segment of what parse() is given is a file's name: the folders end with "/"
    keys = ds.get_partition_keys(partitioning.parse("/" + folders.replace(os.sep, "/") + "/"))
    return {name: keys.get(name) for name in names}


def _folder_values(
    path: str, kwargs: dict[str, Any], names: list[str], dataset: Any = None
) -> dict[str, Any]:
    """The values of the hive columns ``names`` that the folder names of ``path`` give (a
    column its folders do not name, or name as null, is null); ``dataset``: the file's,
    when made already."""
    if dataset is None:
        dataset = ds.dataset([path], **kwargs)
    fragment = next(iter(dataset.get_fragments()))
    keys = ds.get_partition_keys(fragment.partition_expression)
    return {name: keys.get(name) for name in names}


def _unify_column(name: str, per_file: list[tuple[str, pa.Schema]]) -> pa.Field:
    """One column's type over every file that has it: widened, or an error naming two files."""
    seen: list[tuple[str, pa.Field]] = [
        (path, s.field(name)) for path, s in per_file if name in s.names
    ]
    current_path, current = seen[0]
    for path, f in seen[1:]:
        if f.type == current.type:
            continue
        if pa.types.is_dictionary(current.type) or pa.types.is_dictionary(f.type):
            # a pandas categorical beside plain strings: both as their values
            current = current.with_type(_values_of(current.type))
            f = f.with_type(_values_of(f.type))
            if f.type == current.type:
                continue
        widened = _integer_and_decimal(current.type, f.type) or _uint64_and_signed(
            current.type, f.type
        )
        if widened is not None:
            current, current_path = current.with_type(widened).with_nullable(True), path
            continue
        zones = _zoned_timestamps(current.type, f.type)
        if zones is not None:
            current, current_path = current.with_type(zones).with_nullable(True), path
            continue
        if {_kind(current.type), _kind(f.type)} == {"integer", "decimal"}:
            raise InputError(
                f"column {name!r} has type {current.type} in {current_path} but {f.type} in "
                f"{path}; a decimal that holds both needs more than 38 digits (cast the "
                "integers to the decimal's type, or the decimals to float64)",
                path=path,
            )
        try:
            merged = pa.unify_schemas(
                [pa.schema([current]), pa.schema([f])], promote_options="permissive"
            ).field(name)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            raise InputError(
                f"column {name!r} has type {current.type} in {current_path} but {f.type} in "
                f"{path}; these cannot be unified (cast one; for CSV/JSON Lines, --column-types)",
                path=path,
            ) from None
        if merged.type == pa.null():
            merged = f
        current, current_path = merged.with_nullable(True), path
    return current.with_type(_plain(current.type)).with_nullable(True)


_UNITS = ("s", "ms", "us", "ns")


def _zoned_timestamps(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """Two time-zone-aware timestamp types with different zones (``UTC`` and ``Etc/UTC``,
    ``UTC`` and ``Europe/Paris``: each file stores UTC instants, the zone only shows them)
    as one in UTC, of the finer unit, as DuckDB reads them (``TIMESTAMPTZ``); ``None`` for
    any other pair."""
    if not (pa.types.is_timestamp(a) and pa.types.is_timestamp(b)):
        return None
    if a.tz is None or b.tz is None or a.tz == b.tz:
        return None
    unit = max(a.unit, b.unit, key=_UNITS.index)
    return pa.timestamp(unit, tz="UTC")


def _kind(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "integer"
    return "decimal" if pa.types.is_decimal(t) else "other"


def _values_of(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


#: decimal digits an integer type needs
_INTEGER_DIGITS = {8: 3, 16: 5, 32: 10, 64: 19}


def _integer_and_decimal(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The decimal that holds both an integer type and a decimal one (``int32`` and
    ``decimal(12, 4)``: ``decimal(14, 4)``; Arrow's own promotion gave ``decimal(13, 4)``,
    and the scan failed on the first value that needed the digit), or None for other
    pairs or past 38 digits."""
    if pa.types.is_integer(a) and pa.types.is_decimal(b):
        a, b = b, a
    if not (pa.types.is_decimal(a) and pa.types.is_integer(b)):
        return None
    digits = _INTEGER_DIGITS[b.bit_width] + (b.bit_width == 64 and pa.types.is_unsigned_integer(b))
    precision = max(a.precision - a.scale, digits) + a.scale
    if precision > 38:
        return None
    return pa.decimal128(precision, a.scale)


def _uint64_and_signed(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """``decimal(20, 0)`` for ``uint64`` beside a signed integer, which holds both exactly
    (Arrow's promotion gave ``int64``, and the scan failed past 2^63 - 1 on a value it called
    a read error of the file; DuckDB widens to a 128-bit integer); None for other pairs."""
    if pa.types.is_signed_integer(a) and b == pa.uint64():
        a, b = b, a
    if a == pa.uint64() and pa.types.is_signed_integer(b):
        return pa.decimal128(20, 0)
    return None


def _plain(t: pa.DataType) -> pa.DataType:
    """View types (Parquet files written by Rust tools hold ``string_view``) as their plain
    forms, which every Arrow kernel (the scan's filter, the engine's keys) handles."""
    if t == pa.string_view():
        return pa.string()
    if t == pa.binary_view():
        return pa.binary()
    if pa.types.is_run_end_encoded(t):  # an Arrow file's runs: their values
        return _plain(t.value_type)
    if pa.types.is_dictionary(t) and not _holds_text(t.value_type):
        # an Arrow file's dictionary of dates or decimals: its values (the engine groups and
        # folds strings by their codes, other types as they are; a dictionary of them failed
        # with a traceback, "DictionaryArray converter ... not implemented")
        return _plain(t.value_type)
    return t


def _holds_text(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    )  # fmt: skip


def _prune_row_groups(dataset: Any, filter: Any, schema: pa.Schema) -> tuple[Any, int, int, int]:
    """The dataset narrowed to the row groups whose statistics may satisfy ``filter`` (a file
    whose folder names cannot is left out before its footer is read)."""
    frags = list(dataset.get_fragments() if filter is None else dataset.get_fragments(filter))
    if not frags:
        return ds.FileSystemDataset([], schema, dataset.format, dataset.filesystem), 0, 0, 0
    kept = []
    total = 0
    rows = 0
    for frag in frags:
        frag.ensure_complete_metadata()
        total += frag.num_row_groups
        groups = (
            frag.split_by_row_group(filter, schema=schema)
            if filter is not None
            else frag.split_by_row_group()
        )
        for g in groups:
            kept.append(g)
            rows += sum(rg.num_rows for rg in g.row_groups)
    pruned = ds.FileSystemDataset(kept, schema, dataset.format, dataset.filesystem)
    return pruned, total, len(kept), rows


def _row_group_ids(dataset: Any) -> list[int]:
    """The ids of the row groups a pruned dataset of one file kept, in file order."""
    return sorted(rg.id for frag in dataset.get_fragments() for rg in frag.row_groups)

"""Result writers: Parquet, CSV, JSON Lines, Arrow IPC, streamed a batch at a time.

An output file appears only complete: batches go to a temporary file in the output's own
directory, which is fsynced and renamed over the final name when the last batch is written
(and removed on any error or interrupt). ``-`` writes CSV to stdout. CSV and JSON Lines are
text: binary values go into them as base64, and JSON Lines writes non-finite floats as strings.
A text output whose name ends in ``.gz``, ``.zst``/``.zstd`` or ``.bz2`` (``out.csv.gz``) is
compressed as it is written, as the inputs with those suffixes are read; Parquet and Arrow IPC
compress inside the file and refuse such a suffix.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import decimal
import errno as errno_mod
import gzip
import json
import logging
import math
import os
import re
import stat
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import IO, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from extagg._input_paths import COMPRESSION_CODECS, output_problem
from extagg.errors import OutputError, QueryError
from extagg.spill.tempdir import owner_gone, process_dir_name

log = logging.getLogger(__name__)

__all__ = [
    "OUTPUT_FORMATS",
    "ResultWriter",
    "atomic_output",
    "output_compression",
    "output_format",
    "remove_unfinished_outputs",
]

OUTPUT_FORMATS = ("parquet", "csv", "tsv", "jsonl", "ipc")
_EXT = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".arrow": "ipc",
    ".ipc": "ipc",
    ".feather": "ipc",
}


#: gzip's level: the gzip command's default. Arrow's gzip stream has no level and uses 9,
#: which took 4.5x the time of a plain CSV on a 1.5 M-row result (8.5 s against 1.9) for 4 %
#: fewer bytes; its header holds no name and no time, so equal results give equal bytes
GZIP_LEVEL = 6


def output_compression(path: str) -> str | None:
    """The codec ``path``'s last suffix asks for (``gzip``, ``zstd``, ``bz2``), or None."""
    if path == "-":
        return None
    return COMPRESSION_CODECS.get(os.path.splitext(path.lower())[1])


def output_format(path: str, explicit: str | None = None) -> str:
    """The format to write ``path`` in: ``explicit`` or the extension's, a compression suffix
    looked through (``out.csv.gz`` is CSV); ``-`` is CSV. Parquet or Arrow IPC with a
    compression suffix is refused: those formats compress inside the file, and a gzip'd
    Parquet file is one no reader opens."""
    codec = output_compression(path)
    if explicit:
        fmt = {"arrow": "ipc", "feather": "ipc", "json": "jsonl"}.get(explicit, explicit)
        if fmt not in OUTPUT_FORMATS:
            raise QueryError(
                f"unknown output format {explicit!r}; known: {', '.join(OUTPUT_FORMATS)}"
            )
    elif path == "-":
        return "csv"
    else:
        stem = os.path.splitext(path)[0] if codec is not None else path
        by_ext = _EXT.get(os.path.splitext(stem.lower())[1])
        if by_ext is None:
            raise QueryError(
                f"cannot tell the output format of {path!r} from its extension; give "
                f"--output-format ({', '.join(OUTPUT_FORMATS)})"
            )
        fmt = by_ext
    if codec is not None and fmt in ("parquet", "ipc"):
        name = "Parquet" if fmt == "parquet" else "Arrow IPC"
        raise QueryError(
            f"cannot write {path!r}: {name} compresses inside the file (a {codec} stream of "
            f"it is a file no {name} reader opens); drop the "
            f"{os.path.splitext(path)[1]!r} suffix, or write csv, tsv or jsonl"
        )
    return fmt


class _KeepOpen:
    """The output's temp file as the compressor's sink: closing the compressed stream writes
    its last block and trailer but must leave the file open, to be fsynced and renamed."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.closed = False

    def write(self, data: Any) -> int:
        return self._raw.write(data)

    def flush(self) -> None:
        self._raw.flush()

    def close(self) -> None:
        self.closed = True


def _temp_beside(path: str) -> tuple[str, IO[bytes]]:
    """A new temporary file in ``path``'s directory (same filesystem: the rename is atomic),
    with the permissions the file will have: those of the file it replaces, else what
    ``open()`` would give under the umask (``mkstemp`` makes it 0600, which the rename kept:
    outputs only their writer could read)."""
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    _remove_stale_temps(directory, name)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{name}.{process_dir_name()}.", suffix=_TEMP_SUFFIX, dir=directory
    )
    _unfinished.add(tmp)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    try:
        os.fchmod(fd, mode)
    except OSError:  # pragma: no cover - filesystems without modes
        pass
    return tmp, os.fdopen(fd, "wb")


_TEMP_SUFFIX = ".extagg-tmp"
#: the temp files of this process's outputs not yet renamed into place or removed
_unfinished: set[str] = set()


def remove_unfinished_outputs() -> None:
    """Remove the temp files of every output still being written (the command is leaving
    with ``os._exit``: no writer's ``abort`` runs)."""
    for tmp in list(_unfinished):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        _unfinished.discard(tmp)


#: a temp file's name: ``.<output name>.<writer process, as its spill folder>.<random>``
_TEMP_NAME = re.compile(r"^\.(.+)\.(extagg-\d+-\d+-[0-9a-f]{8})\.[^.]+\.extagg-tmp$")


def _remove_stale_temps(directory: str, name: str) -> None:
    """Remove the temp files of output ``name`` whose writer is gone (killed with ``kill -9``
    or by the OOM killer mid-write: they stayed beside the output for good). A live writer's,
    another host's or another PID namespace's are left alone."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        match = _TEMP_NAME.match(entry)
        if match is None or match[1] != name or not owner_gone(match[2]):
            continue
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, entry))
            log.info("removed %s, left by a writer that is gone", os.path.join(directory, entry))


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def _publish(handle: IO[bytes], tmp: str, path: str) -> None:
    """fsync ``handle`` (the open temp file ``tmp``), close it, rename it over ``path`` and
    fsync the directory, so that ``path`` is either the old file or the whole new one."""
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()
    os.replace(tmp, path)
    _unfinished.discard(tmp)
    try:
        dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:  # pragma: no cover - directories that cannot be opened
        return
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """A binary file to write ``path`` through: a temp file in the same directory, fsynced
    and renamed over ``path`` when the block ends normally, removed if it raises.

    Examples
    --------
    >>> import os, tempfile
    >>> target = os.path.join(tempfile.mkdtemp(), "summary.json")
    >>> with atomic_output(target) as f:
    ...     _ = f.write(b"{}\\n")
    >>> open(target, "rb").read()
    b'{}\\n'
    """
    target = os.fspath(path)
    tmp, handle = _temp_beside(target)
    try:
        yield handle
        _publish(handle, tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):  # closing flushes, which fails again on a full disk
            handle.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        _unfinished.discard(tmp)
        raise


def _json_default(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, uuid.UUID):  # an arrow.uuid column's values
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _json_float(value: float) -> Any:
    """``value`` as JSON writes it: a NaN or infinite float as its name in a string."""
    if math.isfinite(value):
        return value
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def _json_nested(value: Any) -> Any:
    """``value`` (a list, a struct's dict, a map's list of pairs) with every float in it as
    :func:`_json_float` writes it."""
    if isinstance(value, float):
        return _json_float(value)
    if isinstance(value, dict):
        return {k: _json_nested(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_nested(v) for v in value]
    return value


def _holds_floats(typ: pa.DataType) -> bool:
    if pa.types.is_floating(typ):
        return True
    return any(_holds_floats(typ.field(i).type) for i in range(typ.num_fields))


def _json_rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The rows of ``batch`` as JSON writes them: a NaN or infinite float — a column's or
    one inside a list, struct or map — as the string ``"NaN"``, ``"Infinity"`` or
    ``"-Infinity"`` (JSON has no such numbers: ``json.dumps`` wrote bare ``NaN``, which JSON
    readers reject), as Spark's JSON writer does. Nanosecond timestamps and times are ISO
    text with nine digits, nanosecond durations seconds as a float: Python's datetime holds
    microseconds, and a value between two failed the write ("not safely convertible")."""
    batch = _nanoseconds_as_json(batch)
    rows = batch.to_pylist()
    for name, col in zip(batch.schema.names, batch.columns):
        if col.null_count == len(col):
            continue
        if pa.types.is_floating(col.type):
            if pc.all(pc.is_finite(col)).as_py() is not False:
                continue
            for row in rows:
                value = row[name]
                if value is not None:
                    row[name] = _json_float(value)
        elif pa.types.is_nested(col.type) and _holds_floats(col.type):
            for row in rows:
                row[name] = _json_nested(row[name])
        elif col.type == pa.month_day_nano_interval():  # a tuple: json wrote [0, 30, 5]
            for row in rows:
                value = row[name]
                row[name] = None if value is None else interval_text(value)
    return rows


#: one value as ``json.dumps(value, default=_json_default, ensure_ascii=False)`` writes it
_JSON_VALUE = json.JSONEncoder(default=_json_default, ensure_ascii=False).encode
#: a string as JSON text, quoted and escaped (what ``json.dumps(..., ensure_ascii=False)`` calls)
_JSON_STRING: Callable[[str], str] = json.encoder.encode_basestring


def _json_texts(batch: pa.RecordBatch, i: int) -> pa.Array:
    """Column ``i`` of ``batch`` (after :func:`_nanoseconds_as_json`) as the JSON text of each
    value, as :func:`_json_rows` and ``json.dumps`` write it. Integers, booleans, dates,
    decimals of scale 0-6 (which ``str(Decimal)`` writes without an exponent) and timestamps
    (:func:`_isoformat`) by Arrow's casts; floats by ``float.__repr__`` (json's own; Arrow's
    shortest text is laid out otherwise: ``1`` for ``1.0``, ``1e+15``); strings by json's C
    escaper; anything else per value through :func:`_json_rows`."""
    col = batch.column(i)
    typ = col.type
    if pa.types.is_integer(typ) or pa.types.is_boolean(typ):
        return pc.fill_null(col.cast(pa.string()), "null")
    if pa.types.is_date(typ) or (pa.types.is_decimal(typ) and 0 <= typ.scale <= 6):
        quoted = pc.binary_join_element_wise('"', col.cast(pa.string()), '"', "")
        return pc.fill_null(quoted, "null")
    if pa.types.is_timestamp(typ) and typ.unit in ("s", "ms", "us") and typ.tz in (None, "UTC"):
        quoted = pc.binary_join_element_wise('"', _isoformat(col), '"', "")
        return pc.fill_null(quoted, "null")
    values = col.to_pylist()
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        texts = ["null" if v is None else _JSON_STRING(v) for v in values]
    elif pa.types.is_floating(typ) and not col.null_count and pc.all(pc.is_finite(col)).as_py():
        texts = list(map(float.__repr__, values))
    elif pa.types.is_floating(typ):
        texts = [_json_float_text(v) for v in values]
    else:
        name = batch.schema.names[i]
        rows = _json_rows(pa.RecordBatch.from_arrays([col], names=[name]))
        texts = [_JSON_VALUE(row[name]) for row in rows]
    return pa.array(texts, pa.string())


def _json_float_text(value: float | None) -> str:
    """A float (or null) as :func:`_json_rows` and ``json.dumps`` write it (see
    :func:`_json_float`)."""
    if value is None:
        return "null"
    if value - value == 0:  # finite
        return float.__repr__(value)
    return '"NaN"' if value != value else ('"Infinity"' if value > 0 else '"-Infinity"')


def _isoformat(col: pa.Array) -> pa.Array:
    """A timestamp column (second, milli- or microsecond; no zone or UTC) as ``isoformat``
    writes its values: Arrow's ``2024-01-02 03:04:05.120Z`` is
    ``2024-01-02T03:04:05.120000+00:00``, and a whole second has no fraction."""
    typ = col.type
    # years 1-9999 (others are text already: _nanoseconds_as_json): "YYYY-MM-DD HH:MM:SS",
    # then the fraction and a Z, at fixed places, so literal edits (a regex took 4x the time)
    text = pc.utf8_replace_slice(col.cast(pa.string()), 10, 11, "T")
    if typ.unit == "ms":
        text = pc.utf8_replace_slice(text, 23, 23, "000")
    if typ.unit != "s":
        text = pc.replace_substring(text, ".000000", "")
    if typ.tz is not None:
        text = pc.replace_substring(text, "Z", "+00:00")
    return text


def json_lines_by_row(batch: pa.RecordBatch) -> bytes:
    """``batch`` as JSON Lines, a dict and a ``json.dumps`` per row: the reference
    :func:`json_lines` is tested against."""
    return "".join(
        json.dumps(row, default=_json_default, ensure_ascii=False) + "\n"
        for row in _json_rows(batch)
    ).encode("utf-8")


def json_lines(batch: pa.RecordBatch) -> bytes:
    """``batch`` as JSON Lines, the bytes :func:`json_lines_by_row` gives (a row's keys in
    column order, ``", "`` and ``": "`` between them), built a column at a time: a dict and a
    ``json.dumps`` per row took 8 s of a 10 s run writing 1.5 M rows."""
    if batch.num_columns == 0:
        return b"{}\n" * batch.num_rows
    batch = _nanoseconds_as_json(batch)
    parts: list[Any] = []
    for i, name in enumerate(batch.schema.names):
        parts.append(("{" if i == 0 else ", ") + _JSON_STRING(name) + ": ")
        parts.append(_json_texts(batch, i))
    parts.append("}\n")
    lines = pc.binary_join_element_wise(*parts, "")
    _validity, offsets, data = lines.buffers()
    bounds = memoryview(offsets).cast("i")  # int32, the platform's order as Arrow writes it
    start, end = bounds[lines.offset], bounds[lines.offset + len(lines)]
    return data[start:end].to_pybytes()


#: column types whose text (Arrow's cast to string) never holds a quote, a delimiter or a
#: line break: the CSV writer does not look into their values
_PLAIN_TEXT_TYPES = (
    pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_boolean,
    pa.types.is_date, pa.types.is_time, pa.types.is_timestamp, pa.types.is_duration,
    pa.types.is_null,
)  # fmt: skip


def _plain_text(typ: pa.DataType) -> bool:
    return any(test(typ) for test in _PLAIN_TEXT_TYPES)


def csv_field(text: str, delimiter: str) -> str:
    """One CSV field: quoted, its ``"`` doubled, if it holds ``"``, the delimiter or a line
    break, or is empty (``""``: a null is written as nothing); else as it is."""
    if text == "" or any(c in text for c in ('"', delimiter, "\n", "\r")):
        return '"' + text.replace('"', '""') + '"'
    return text


def csv_header(names: list[str], delimiter: str) -> bytes:
    """The CSV header line of ``names``."""
    return (delimiter.join(csv_field(name, delimiter) for name in names) + "\n").encode("utf-8")


def _csv_texts(batch: pa.RecordBatch) -> list[tuple[pa.Array, bool]]:
    """Each column as Arrow's text of it (the text Arrow's CSV writer writes: its cast to
    string) and whether its values must be looked into for quoting."""
    out = []
    for col in batch.columns:
        typ = col.type
        if pa.types.is_dictionary(typ):
            col = col.dictionary_decode()
        text = col if pa.types.is_string(col.type) else col.cast(pa.string())
        out.append((text, not _plain_text(typ)))
    return out


def csv_lines_by_row(batch: pa.RecordBatch, delimiter: str = ",") -> bytes:
    """``batch`` as CSV lines (no header), a Python string per field: the reference
    :func:`csv_lines` is tested against."""
    columns = [
        [
            "" if value is None else csv_field(value, delimiter) if check else value
            for value in text.to_pylist()
        ]
        for text, check in _csv_texts(batch)
    ]
    lines = (delimiter.join(fields) + "\n" for fields in zip(*columns))
    return "".join(lines).encode("utf-8")


def csv_lines(batch: pa.RecordBatch, delimiter: str = ",") -> bytes:
    """``batch`` as CSV lines (no header), the bytes :func:`csv_lines_by_row` gives: a field
    is quoted only where it must be (see :func:`csv_field`), as DuckDB and Polars write CSV;
    Arrow's CSV writer quotes every string. Two compiled passes a column: the fields' sizes,
    then their bytes at each row's next position."""
    import numpy as np

    from extagg.io import _csv_kernels as CK

    n = batch.num_rows
    if batch.num_columns == 0:
        return b"\n" * n
    texts = []
    for text, check in _csv_texts(batch):
        _validity, offsets, data = text.buffers()
        bounds = np.frombuffer(offsets, dtype=np.int32)[text.offset : text.offset + n + 1]
        chars = np.zeros(0, np.uint8) if data is None else np.frombuffer(data, dtype=np.uint8)
        valid = (
            np.zeros(0, np.bool_)
            if text.null_count == 0
            else text.is_valid().to_numpy(zero_copy_only=False)
        )
        texts.append((bounds, chars, valid, check))
    sep = ord(delimiter)
    lengths = np.full(n, len(texts), dtype=np.int64)  # the delimiters and the line break
    for bounds, chars, valid, check in texts:
        CK.csv_field_lengths(bounds, chars, valid, check, sep, lengths)
    pos = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1], out=pos[1:])
    out = np.empty(int(pos[-1] + lengths[-1]) if n else 0, dtype=np.uint8)
    last = len(texts) - 1
    for j, (bounds, chars, valid, check) in enumerate(texts):
        CK.csv_write_fields(bounds, chars, valid, check, sep, sep if j < last else 10, out, pos)
    return out.tobytes()


def interval_text(value: Any) -> str:
    """A month-day-nano interval (``pyarrow.MonthDayNano``) as DuckDB writes one:
    ``1 year 2 months 3 days 04:05:06.000007``; ``00:00:00`` when it is empty."""
    months, days, nanos = value.months, value.days, value.nanoseconds
    parts = []
    years, months = int(months / 12), months - int(months / 12) * 12  # truncated, with sign
    for count, unit in ((years, "year"), (months, "month"), (days, "day")):
        if count:
            parts.append(f"{count} {unit}{'' if abs(count) == 1 else 's'}")
    if nanos or not parts:
        sign, nanos = ("-" if nanos < 0 else ""), abs(nanos)
        seconds, fraction = divmod(nanos, 10**9)
        minutes, seconds = divmod(seconds, 60)
        hours, minutes = divmod(minutes, 60)
        clock = f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}"
        if fraction:
            digits = f"{fraction:09d}"
            clock += "." + (digits[:6] if digits.endswith("000") else digits)
        parts.append(clock)
    return " ".join(parts)


#: Python's datetime years: a date or timestamp outside them has no Python value
_PY_DAYS = (
    (dt.date(1, 1, 1) - dt.date(1970, 1, 1)).days,
    (dt.date(9999, 12, 31) - dt.date(1970, 1, 1)).days,
)
_UNIT_PER_DAY = {"s": 86_400, "ms": 86_400_000, "us": 86_400_000_000, "ns": 86_400_000_000_000}


def beyond_python_dates(col: pa.Array | pa.ChunkedArray) -> bool:
    """Whether a date or timestamp column holds a value Python's ``datetime`` cannot (years
    past 9999 or before 1, which Arrow, Parquet, DuckDB and Spark hold): ``to_pylist()``
    fails on it with "date value out of range", naming nothing."""
    typ = col.type
    if pa.types.is_date32(typ) or pa.types.is_date64(typ):
        per_day = 1 if pa.types.is_date32(typ) else 86_400_000
    elif pa.types.is_timestamp(typ):
        per_day = _UNIT_PER_DAY[typ.unit]
    else:
        return False
    if col.null_count == len(col):
        return False
    storage = pa.int32() if pa.types.is_date32(typ) else pa.int64()
    low, high = pc.min_max(col.cast(storage)).values()
    margin = 1  # a day's room: a zone's offset moves the wall time
    return bool(
        low.as_py() < (_PY_DAYS[0] + margin) * per_day
        or high.as_py() >= (_PY_DAYS[1] - margin) * per_day
    )


def dates_beyond_python_as_text(table: pa.Table) -> pa.Table:
    """``table`` with each date or timestamp column that holds a value outside Python's years
    as Arrow's text of it (``21956-09-21 00:00:00.000000``), for the printed table."""
    for i, col in enumerate(table.columns):
        if beyond_python_dates(col):
            table = table.set_column(i, table.field(i).name, col.cast(pa.string()))
    return table


def _nanoseconds_as_json(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its nanosecond timestamp, time and duration columns as JSON values, and
    its dates and timestamps that Python cannot hold (:func:`beyond_python_dates`) as ISO
    text."""
    ns = [
        i for i, t in enumerate(batch.schema.types)
        if ((pa.types.is_timestamp(t) or pa.types.is_time64(t) or pa.types.is_duration(t))
        and t.unit == "ns") or beyond_python_dates(batch.column(i))
    ]  # fmt: skip
    if not ns:
        return batch
    columns = list(batch.columns)
    for i in ns:
        col = columns[i]
        if pa.types.is_duration(col.type):
            columns[i] = pc.divide(col.cast(pa.int64()).cast(pa.float64()), 1e9)
        elif pa.types.is_timestamp(col.type):
            # "2024-01-01 11:00:00.123456789+0100" as isoformat writes it: a T, +01:00
            text = pc.replace_substring_regex(col.cast(pa.string()), " ", "T", max_replacements=1)
            columns[i] = pc.replace_substring_regex(text, r"([+-][0-9]{2})([0-9]{2})$", r"\1:\2")
        else:
            columns[i] = col.cast(pa.string())
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _is_binary(typ: pa.DataType) -> bool:
    return bool(
        pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
        or pa.types.is_fixed_size_binary(typ)
    )


def _is_text(typ: pa.DataType) -> bool:
    if pa.types.is_dictionary(typ):
        return True
    return bool(
        pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_string_view(typ)
        or _is_binary(typ)
    )  # fmt: skip


def _is_nested(typ: pa.DataType) -> bool:
    return bool(pa.types.is_nested(typ))


def _as_text(typ: pa.DataType) -> bool:
    """Whether CSV writes a column of ``typ`` as text made here (Arrow's CSV writer has none)."""
    return (
        _is_binary(typ) or _is_nested(typ) or isinstance(typ, pa.BaseExtensionType)
        or typ == pa.month_day_nano_interval()
    )  # fmt: skip


def _extension_text(col: pa.Array) -> pa.Array:
    """An extension column as text: a UUID in its canonical form (as DuckDB and Spark write
    it), any other by its storage (Arrow's CSV writer refused them: ``Unsupported
    Type:extension<arrow.uuid>``)."""
    storage = col.storage
    if col.type.extension_name == "arrow.uuid":
        return pa.array(
            [None if v is None else str(uuid.UUID(bytes=v)) for v in storage.to_pylist()],
            pa.string(),
        )
    if _is_binary(storage.type):
        return _binary_as_base64(pa.RecordBatch.from_arrays([storage], names=["v"])).column(0)
    return storage.cast(pa.string())


def _text_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` as CSV writes it: binary columns as their base64 text (as JSON Lines
    writes them; their bytes need not be UTF-8, which CSV text must be), lists, structs and
    maps as their JSON text (as JSON Lines writes them; Arrow's CSV writer refused them,
    ``Unsupported Type:list<item: string>``)."""
    return pa.schema([f.with_type(pa.string()) if _as_text(f.type) else f for f in schema])


def _binary_as_base64(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its binary columns as base64 text and its nested columns as JSON text
    (see :func:`_text_schema`)."""
    if not any(_as_text(f.type) for f in batch.schema):
        return batch
    columns = []
    for col, f in zip(batch.columns, batch.schema):
        if isinstance(f.type, pa.BaseExtensionType):
            col = _extension_text(col)
        elif f.type == pa.month_day_nano_interval():
            col = pa.array(
                [None if v is None else interval_text(v) for v in col.to_pylist()], pa.string()
            )
        elif _is_binary(f.type):
            texts = [
                None if v is None else base64.b64encode(v).decode("ascii") for v in col.to_pylist()
            ]
            col = pa.array(texts, pa.string())
        elif _is_nested(f.type):
            rows = _json_rows(pa.RecordBatch.from_arrays([col], names=["v"]))
            col = pa.array(
                [
                    None
                    if row["v"] is None
                    else json.dumps(row["v"], default=_json_default, ensure_ascii=False)
                    for row in rows
                ],
                pa.string(),
            )
        columns.append(col)
    return pa.RecordBatch.from_arrays(columns, schema=_text_schema(batch.schema))


#: bytes a Parquet row group's rows take at most in memory while they are gathered (by the
#: schema's widths, see :func:`parquet_row_group_rows`)
ROW_GROUP_BYTES = 4 << 20


#: rows Arrow's Parquet writer encodes at a time: it checks whether a page is full after each
#: such step of a chunk, and starts over at each chunk (see :func:`_aligned_batches`)
PARQUET_WRITE_BATCH_ROWS = 1024


def _aligned_batches(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """``batches`` cut again into batches of :data:`PARQUET_WRITE_BATCH_ROWS` rows (the last
    one fewer): the Parquet writer then makes the same pages, and the file the same bytes,
    however the results were batched (they are batched by the budget and the thread count;
    a dictionary-encoded column's pages also depended on chunks longer than 4096 rows). Only
    the rows around a boundary are copied."""
    step = PARQUET_WRITE_BATCH_ROWS
    out: list[pa.RecordBatch] = []
    pending: list[pa.RecordBatch] = []  # the start of a window of ``step`` rows
    pending_rows = 0
    for batch in batches:
        offset = 0
        if pending_rows:
            take = min(step - pending_rows, batch.num_rows)
            pending.append(batch.slice(0, take))
            pending_rows += take
            offset = take
            if pending_rows < step:
                continue
            out.append(_concat_batches(pending))
            pending, pending_rows = [], 0
        whole = (batch.num_rows - offset) // step * step
        out.extend(batch.slice(start, step) for start in range(offset, offset + whole, step))
        rest = batch.num_rows - offset - whole
        if rest:
            pending, pending_rows = [batch.slice(offset + whole, rest)], rest
    if pending:
        out.append(_concat_batches(pending))
    return out


def _concat_batches(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def parquet_row_group_rows(schema: pa.Schema) -> int:
    """The rows of every Parquet row group written for ``schema`` (the last one may have
    fewer): a power of two from 4 096 to 65 536 whose rows take about
    :data:`ROW_GROUP_BYTES` (8 bytes a fixed-width value at most, 32 a string or nested one).

    The results come in batches whose sizes depend on the budget, the spills and the threads
    (a row group per batch: 395 row groups, some of 11 rows, for 1.9 M groups at 8 MiB, 188
    with no limit); cut to one size, the file's bytes depend on its rows only. An Arrow IPC
    file's record batches are cut the same way."""
    width = sum(
        max(1, (t.bit_width + 7) // 8) if pa.types.is_primitive(t) else 32 for t in schema.types
    )
    rows = max(1 << 12, min(1 << 16, ROW_GROUP_BYTES // max(1, width)))
    return 1 << (rows.bit_length() - 1)


class ResultWriter:
    """Write a stream of result batches to ``path`` in ``fmt`` (see the module docstring).

    Use as a context manager: leaving it by an exception removes the temporary file; leaving
    it normally commits (fsync, rename). ``bytes_written`` counts what reached the file.
    """

    def __init__(self, path: str, fmt: str, schema: pa.Schema, *, overwrite: bool = False):
        self.path = path
        self.fmt = fmt
        self.schema = schema
        self.rows = 0
        self.bytes_written = 0
        self._tmp: str | None = None
        self._file: IO[bytes] | None = None
        self._writer: Any = None
        #: Parquet and Arrow IPC: the rows of the next row group (record batch), gathered
        #: until there are enough
        self._group: list[pa.RecordBatch] = []
        self._group_rows = 0
        self._row_group_rows = parquet_row_group_rows(schema)
        #: a text output's codec (``out.csv.gz``) and the compressed stream written through
        self.compression = output_compression(path) if fmt in ("csv", "tsv", "jsonl") else None
        self._compressed: Any = None
        self._delimiter = "\t" if fmt == "tsv" else ","
        if path == "-":
            self.directory = "<stdout>"
            self._file = sys.stdout.buffer
        else:
            problem = output_problem(path, overwrite)
            if problem is not None:
                raise OutputError(problem, errno=errno_mod.EEXIST)
            if fmt == "parquet":
                for f in schema:
                    if f.type == pa.month_day_nano_interval():
                        raise OutputError(
                            f"column {f.name!r} of type {f.type} cannot be written to "
                            "Parquet (Arrow's Parquet writer has no interval type); write "
                            ".arrow, .jsonl or .csv"
                        )
            if os.path.islink(path):  # the link's target is replaced; the link stays
                path = self.path = os.path.realpath(path)
            if os.path.exists(path) and not os.path.isfile(path):
                raise OutputError(
                    f"output {path} is not a regular file (a pipe, a device): the result is "
                    "written to a temporary file renamed over it; write to a file, or -o - "
                    "for standard output"
                )
            self.directory = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(self.directory):
                raise OutputError(f"output directory {self.directory} does not exist")
            try:
                self._tmp, self._file = _temp_beside(path)
            except OSError as exc:
                raise OutputError(
                    f"cannot write {path}: no file can be made in {self.directory}: "
                    f"{exc.strerror or exc}",
                    directory=self.directory,
                    errno=exc.errno,
                ) from exc
        #: the format's writer starts (a CSV header, a Parquet or Arrow schema) at the first
        #: batch or the commit: an error before any result (a --having that does not fit the
        #: result's types) left a CSV header on stdout
        self._opened = False

    def _open(self) -> None:
        assert self._file is not None
        self._opened = True
        sink: Any = self._file
        with self._disk_errors(0):
            if self.compression == "gzip":  # closing it leaves the file open
                sink = self._compressed = gzip.GzipFile(
                    filename="", mode="wb", fileobj=self._file, compresslevel=GZIP_LEVEL, mtime=0
                )
            elif self.compression is not None:
                sink = self._compressed = pa.CompressedOutputStream(
                    pa.PythonFile(_KeepOpen(self._file), mode="w"), self.compression
                )
            if self.fmt == "parquet":
                import pyarrow.parquet as pq

                # dictionary pages for text only: a result has a row per group, so its numbers
                # (keys, sums) rarely repeat, and their dictionary builders held ~1/4 of a
                # 24 MiB budget above the fixed RSS for nothing
                text = [f.name for f in self.schema if _is_text(f.type)]
                self._writer = pq.ParquetWriter(
                    sink, self.schema, compression="zstd", use_dictionary=text or False,
                    write_batch_size=PARQUET_WRITE_BATCH_ROWS,
                )  # fmt: skip
            elif self.fmt in ("csv", "tsv"):
                sink.write(csv_header(self.schema.names, self._delimiter))
            elif self.fmt == "ipc":
                self._writer = pa.ipc.new_file(sink, self.schema)

    def _disk_errors(self, nbytes: int) -> Any:
        writer = self

        class _Guard:
            def __enter__(self) -> None:
                return None

            def __exit__(self, typ: Any, exc: Any, tb: Any) -> Literal[False]:
                if exc is None:
                    return False
                code = getattr(exc, "errno", None)
                text = str(exc)
                if code == errno_mod.ENOSPC or "No space left" in text:
                    raise OutputError(
                        f"disk full writing {writer.path} in {writer.directory}: "
                        f"no space for {nbytes:,} more bytes "
                        f"({writer.bytes_written:,} written before)",
                        directory=writer.directory, bytes_needed=nbytes,
                        errno=errno_mod.ENOSPC,
                    ) from exc  # fmt: skip
                if isinstance(exc, (OSError, pa.ArrowIOError)) and not isinstance(exc, OutputError):
                    raise OutputError(
                        f"cannot write {writer.path}: {text}", directory=writer.directory,
                        bytes_needed=nbytes, errno=code,
                    ) from exc  # fmt: skip
                return False

        return _Guard()

    def write(self, batch: pa.RecordBatch) -> None:
        """Append one batch."""
        if batch.num_rows == 0:
            return
        if not self._opened:
            self._open()
        nbytes = batch.nbytes
        with self._disk_errors(nbytes):
            if self.fmt == "jsonl":
                assert self._file is not None
                lines = json_lines(batch)
                sink = self._compressed if self._compressed is not None else self._file
                sink.write(lines)
                nbytes = len(lines)
            elif self.fmt in ("csv", "tsv"):
                assert self._file is not None
                lines = csv_lines(_binary_as_base64(batch), self._delimiter)
                sink = self._compressed if self._compressed is not None else self._file
                sink.write(lines)
                nbytes = len(lines)
            elif self.fmt in ("parquet", "ipc"):
                self._group.append(batch)
                self._group_rows += batch.num_rows
                nbytes = 0
                while self._group_rows >= self._row_group_rows:
                    nbytes += self._write_row_group(self._row_group_rows)
            else:
                self._writer.write_batch(batch)
        self.rows += batch.num_rows
        self.bytes_written += nbytes

    def _write_row_group(self, rows: int) -> int:
        """Write the first ``rows`` gathered rows as one Parquet row group (one Arrow record
        batch); their bytes."""
        gathered = pa.Table.from_batches(self._group, schema=self.schema)
        head = gathered.slice(0, rows)
        if self.fmt == "ipc":
            self._writer.write_batch(_concat_batches(head.to_batches()))
        else:
            aligned = pa.Table.from_batches(_aligned_batches(head.to_batches()), self.schema)
            self._writer.write_table(aligned, row_group_size=max(1, rows))
        self._group = gathered.slice(rows).to_batches()
        self._group_rows -= rows
        return int(head.nbytes)

    def commit(self) -> None:
        """Finish the file, fsync it and give it its final name."""
        if not self._opened:
            self._open()
        with self._disk_errors(0):
            if self._writer is not None:
                if self._group_rows:
                    self.bytes_written += self._write_row_group(self._group_rows)
                self._writer.close()
                self._writer = None
            if self._compressed is not None:
                self._compressed.close()  # its last block and trailer
                self._compressed = None
            assert self._file is not None
            self._file.flush()
            if self._tmp is None:
                return
            _publish(self._file, self._tmp, self.path)
            self._file = None
            self._tmp = None

    def abort(self) -> None:
        """Drop the partial output (idempotent)."""
        if self._tmp is None:
            return
        for closable in (self._writer, self._compressed, self._file):
            if closable is not None:
                with contextlib.suppress(Exception):  # a full disk fails them again
                    closable.close()
        self._writer = self._compressed = self._file = None
        try:
            os.unlink(self._tmp)
        except FileNotFoundError:
            pass
        _unfinished.discard(self._tmp)
        self._tmp = None

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, typ: Any, exc: Any, tb: Any) -> None:
        if exc is None:
            try:
                self.commit()
            except BaseException:
                self.abort()
                raise
        else:
            self.abort()

"""Input normalisation: pyarrow, pandas and dict-of-NumPy batches to typed NumPy columns.

Every input column becomes a :class:`Column`: fixed-width values as a NumPy array (integers,
floats, bools, and the integer storage of dates, times, timestamps and durations), or
variable-length values (strings, binary) as ``int64`` offsets starting at 0 plus a ``uint8``
arena, with an optional boolean validity mask. The original Arrow type is kept so results come
back with the type that went in.

Null conventions, one rule for every container (Spark's and DuckDB's): a float NaN is a value
(it is counted, sums to NaN, all NaNs are one group) and only a missing value is a null: Arrow
nulls; in pandas ``pd.NA``/``None`` (nullable dtypes such as ``Float64``/``Int64``/``string``,
object columns) and ``NaT``; in a dict of NumPy arrays masked entries (``numpy.ma``), ``None``
in object arrays and NaT. A plain ``float64`` pandas column therefore keeps its NaNs as values,
unlike pandas' own ``groupby`` — use a nullable ``Float64`` column for missing numbers. (In a
pandas column of strings or objects NaN can only mean "missing", so it is a null there.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from extagg.collection._typed_kernels import gather_var

__all__ = [
    "Column",
    "ReusedArrays",
    "concat_var",
    "KINDS",
    "column_kind",
    "DECIMAL64_DIGITS",
    "decimal_array",
    "is_decimal64",
    "is_batch",
    "is_dataset",
    "arrow_stream",
    "check_batch_columns",
    "dataset_batches",
    "iter_record_batches",
    "to_columns",
    "type_name",
]

#: kind of every supported Arrow type family
KINDS = ("int", "uint", "float", "bool", "temporal", "decimal", "string", "binary")

#: decimals of at most this many digits are held as their unscaled ``int64`` value; wider ones
#: as ``(n, 2)`` ``int64`` words (low word as unsigned, high word signed: Arrow's decimal128)
DECIMAL64_DIGITS = 18
#: the most digits of a decimal the engine takes (decimal128's; Spark's, DuckDB's)
MAX_DECIMAL_DIGITS = 38


def is_decimal64(arrow_type: pa.DataType) -> bool:
    """A decimal column whose unscaled values fit ``int64`` (at most 18 digits)."""
    return pa.types.is_decimal(arrow_type) and arrow_type.precision <= DECIMAL64_DIGITS


class ReusedArrays:
    """Arrays that one line of work (a worker, a slice of every chunk) fills again at every
    chunk instead of allocating them anew. Why: a chunk's temporaries (hashes, gathered
    columns: a few MiB) freed at the end of every chunk leave the top of a thread's malloc
    arena free, which glibc returns to the kernel, and the next chunk faults the pages in
    again — with two threads 40 % more page faults than one and ~0.5 s more system time on
    20 M rows (TPC-style int64 keys, 10 M groups). An array is handed out as a view of the
    first ``n`` rows; whoever asks for the same name again gets the same memory, so a caller
    uses one only until it asks again (the chunk is folded by then)."""

    __slots__ = ("_arrays",)

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def get(self, name: str, n: int, dtype: Any, width: int | None = None) -> np.ndarray:
        """Rows ``0..n`` of array ``name`` (``(n,)``, or ``(n, width)`` when ``width`` is
        given), uninitialised; reallocated when too small or of another type."""
        dtype = np.dtype(dtype)
        tail = () if width is None else (width,)
        arr = self._arrays.get(name)
        if arr is None or arr.shape[0] < n or arr.dtype != dtype or arr.shape[1:] != tail:
            arr = np.empty((n, *tail), dtype=dtype)
            self._arrays[name] = arr
        return arr[:n]

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())

    def clear(self) -> None:
        self._arrays.clear()


@dataclass
class Column:
    """One input column: fixed-width ``values`` or variable-length ``offsets``/``data``."""

    name: str
    kind: str
    arrow_type: pa.DataType
    values: np.ndarray | None = None
    valid: np.ndarray | None = None  # None: no nulls
    offsets: np.ndarray | None = None
    data: np.ndarray | None = None

    @property
    def is_var(self) -> bool:
        return self.kind in ("string", "binary")

    def __len__(self) -> int:
        if self.is_var:
            assert self.offsets is not None
            return len(self.offsets) - 1
        assert self.values is not None
        return len(self.values)

    def slice(self, start: int, stop: int) -> Column:
        """Rows ``[start, stop)`` as views (variable-length offsets are rebased to 0)."""
        valid = None if self.valid is None else self.valid[start:stop]
        if self.is_var:
            assert self.offsets is not None and self.data is not None
            off = self.offsets[start : stop + 1]
            lo, hi = int(off[0]), int(off[-1])
            return Column(
                self.name, self.kind, self.arrow_type, None, valid, off - lo, self.data[lo:hi]
            )
        assert self.values is not None
        return Column(self.name, self.kind, self.arrow_type, self.values[start:stop], valid)

    def take(self, rows: np.ndarray) -> Column:
        """Rows ``rows`` (int64 row numbers) as a new column (copies; offsets from 0)."""
        return Column.take_many([(self, rows)])

    @staticmethod
    def take_many(
        parts: Sequence[tuple[Column, np.ndarray]],
        reuse: ReusedArrays | None = None,
        gathered_var: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> Column:
        """Rows ``rows`` of each ``(column, rows)`` part (columns of one name and type), one
        part after the other, as one new column: fixed-width values gathered straight into
        it; variable-length ones gathered per part, then joined (offsets from 0). A validity
        mask only if some part has one. ``reuse``: fixed-width values and the mask gathered
        into its arrays (valid until the next call with the same ``reuse``).
        ``gathered_var``: the ``(offsets, data)`` of these rows, gathered already (a string
        key's bytes, which its encoded keys share): only the mask is gathered then."""
        first = parts[0][0]
        total = sum(len(rows) for _, rows in parts)
        valid = None
        if any(c.valid is not None for c, _ in parts):
            if reuse is None:
                valid = np.ones(total, dtype=np.bool_)
            else:
                valid = reuse.get("m:" + first.name, total, np.bool_)
                valid.fill(True)
        values = None
        if not first.is_var:
            assert first.values is not None
            shape = first.values.shape
            if reuse is None:
                values = np.empty((total, *shape[1:]), dtype=first.values.dtype)
            else:
                width = shape[1] if len(shape) > 1 else None
                values = reuse.get("v:" + first.name, total, first.values.dtype, width)
        var = []
        at = 0
        for col, rows in parts:
            end = at + len(rows)
            # mode="clip": the rows are ours (in range); NumPy's default ("raise") gathers
            # into a temporary and copies it to ``out``, 2.2x slower on int64
            if valid is not None and col.valid is not None:
                np.take(col.valid, rows, out=valid[at:end], mode="clip")
            if values is not None:
                assert col.values is not None
                np.take(col.values, rows, axis=0, out=values[at:end], mode="clip")
            elif gathered_var is None:
                assert col.offsets is not None and col.data is not None
                var.append(gather_var(col.offsets, col.data, rows))
            at = end
        if values is not None:
            return Column(first.name, first.kind, first.arrow_type, values, valid)
        if gathered_var is not None:
            offsets, data = gathered_var
        else:
            offsets, data = var[0] if len(var) == 1 else concat_var(var)
        return Column(first.name, first.kind, first.arrow_type, None, valid, offsets, data)

    def nbytes(self) -> int:
        total = 0
        for arr in (self.values, self.valid, self.offsets, self.data):
            if arr is not None:
                total += arr.nbytes
        return total


def concat_var(parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Variable-length values given as ``(offsets, data)`` pieces, one after the other, as
    one ``(offsets from 0, data)`` (copied; a piece's offsets need not start at 0)."""
    offsets = [np.zeros(1, dtype=np.int64)]
    data = []
    end = 0
    for off, values in parts:
        lo, hi = int(off[0]), int(off[-1])
        offsets.append(off[1:] - lo + end)
        data.append(values[lo:hi])
        end += hi - lo
    return np.concatenate(offsets), np.concatenate(data)


def type_name(arrow_type: pa.DataType) -> str:
    """A readable name of an Arrow type for error messages."""
    return str(arrow_type)


def key_names(keys: Any) -> list[str]:
    """The key column names ``keys`` gives: one name, or a sequence of them (empty: a global
    aggregate); anything else is a ``TypeError`` saying so (``keys=None`` raised "'NoneType'
    object is not iterable")."""
    if isinstance(keys, str):
        return [keys]
    if not isinstance(keys, (bytes, Mapping)) and hasattr(keys, "__iter__"):
        names = list(keys)
        if all(isinstance(k, str) for k in names):
            return names
    raise TypeError(
        f"keys must be a column name or a list of them ([] for one row over all input), not "
        f"{keys!r}"
    )


def column_kind(arrow_type: pa.DataType) -> str | None:
    """The :data:`KINDS` entry of an Arrow type, or ``None`` if unsupported."""
    t = pa.types
    if t.is_boolean(arrow_type):
        return "bool"
    if t.is_signed_integer(arrow_type):
        return "int"
    if t.is_unsigned_integer(arrow_type):
        return "uint"
    if t.is_floating(arrow_type):
        return "float"
    if t.is_temporal(arrow_type) and not t.is_interval(arrow_type):
        return "temporal"
    if t.is_decimal(arrow_type) and arrow_type.precision <= MAX_DECIMAL_DIGITS:
        return "decimal"  # decimal32/64/256 are read as the decimal128 of their precision
    if t.is_string(arrow_type) or t.is_large_string(arrow_type) or _is_view(arrow_type, "string"):
        return "string"
    if t.is_binary(arrow_type) or t.is_large_binary(arrow_type) or _is_view(arrow_type, "binary"):
        return "binary"
    if t.is_fixed_size_binary(arrow_type):
        return "binary"
    return None


def _is_view(arrow_type: pa.DataType, what: str) -> bool:
    check = getattr(pa.types, f"is_{what}_view", None)
    return bool(check and check(arrow_type))


def is_batch(obj: Any) -> bool:
    """Whether ``obj`` is one batch (as opposed to an iterable of batches)."""
    return isinstance(obj, (pa.RecordBatch, pa.Table, Mapping)) or _is_dataframe(obj)


def is_dataset(obj: Any) -> bool:
    """Whether ``obj`` is a ``pyarrow.dataset.Dataset`` (without importing pyarrow.dataset)."""
    module = type(obj).__module__
    if not module.startswith("pyarrow._dataset"):
        return False
    import pyarrow.dataset as ds

    return isinstance(obj, ds.Dataset)


def arrow_stream(obj: Any) -> pa.RecordBatchReader | None:
    """A reader of the record batches of an object that exports them by Arrow's PyCapsule
    interface (``__arrow_c_stream__``: a Polars ``DataFrame``, a DuckDB relation, ...), read
    lazily, or ``None`` for anything else (pyarrow's own objects, pandas, dicts included).
    A ``pyarrow.dataset.Scanner`` is read as its reader, a Polars ``LazyFrame`` by its
    streaming engine a batch at a time (``collect_batches``)."""
    kind = type(obj)
    if kind.__name__ == "Scanner" and kind.__module__.startswith("pyarrow"):
        return obj.to_reader()
    if kind.__name__ == "LazyFrame" and kind.__module__.startswith("polars"):
        schema = pa.table(obj.head(0).collect()).schema
        frames = obj.collect_batches()
        return pa.RecordBatchReader.from_batches(
            schema, (b for frame in frames for b in pa.table(frame).cast(schema).to_batches())
        )
    if kind.__module__.startswith(("pyarrow", "pandas")) or isinstance(obj, Mapping):
        return None
    if not hasattr(kind, "__arrow_c_stream__"):
        return None
    return pa.RecordBatchReader.from_stream(obj)


def dataset_batches(dataset: Any, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """The record batches of a ``pyarrow.dataset.Dataset``, reading only ``columns``.

    A column the dataset does not have raises ``ValueError`` naming it and the columns it has.
    """
    names = dataset.schema.names
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"column {missing[0]!r} is not in the dataset; it has columns {names}")
    return iter(dataset.to_batches(columns=list(columns)))


def iter_record_batches(
    batch: Any, max_rows: int | None = None, columns: Sequence[str] | None = None
) -> Iterator[pa.RecordBatch]:
    """The record batches of one input batch, each at most ``max_rows`` rows (zero-copy slices).

    Accepts a ``pyarrow.RecordBatch`` or ``Table``, a pandas ``DataFrame`` or a mapping of column
    name to NumPy array (or sequence), or an object that exports Arrow record batches by the
    PyCapsule interface (:func:`arrow_stream`). ``columns``: the only columns of a
    ``DataFrame`` or a mapping converted (the query's; others may hold what Arrow cannot,
    mixed Python objects).
    """
    if isinstance(batch, pa.RecordBatch):
        yield from _sliced(batch, max_rows)
    elif isinstance(batch, pa.Table):
        batches = batch.to_batches()
        if not batches:  # an empty table still carries its schema
            batches = [pa.RecordBatch.from_pylist([], schema=batch.schema)]
        for rb in batches:
            yield from _sliced(rb, max_rows)
    elif _is_dataframe(batch):  # whole frame at once: column types inferred from every row
        _check_has_columns([str(name) for name in batch.columns], columns)
        yield from _sliced(_record_batch_from_pandas(batch, columns), max_rows)
    elif isinstance(batch, Mapping):
        _check_has_columns([str(name) for name in batch], columns)
        yield from _sliced(_record_batch_from_mapping(batch, columns), max_rows)
    elif (reader := arrow_stream(batch)) is not None:
        for rb in reader:
            yield from _sliced(rb, max_rows)
    else:
        raise TypeError(
            "a batch must be a pyarrow RecordBatch or Table, a pandas DataFrame, a dict of NumPy "
            "arrays or an object with Arrow's __arrow_c_stream__ (a Polars DataFrame), not "
            f"{type(batch).__module__}.{type(batch).__qualname__}"
        )


def _check_has_columns(names: list[str], columns: Sequence[str] | None) -> None:
    """The error :func:`to_columns` gives for a column the batch lacks, before only the query's
    columns are converted (so that it lists all the batch has)."""
    missing = [] if columns is None else [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"column {missing[0]!r} is not in the batch; it has columns {names}")


def _sliced(rb: pa.RecordBatch, max_rows: int | None) -> Iterator[pa.RecordBatch]:
    rb = _plain_columns(rb)
    n = rb.num_rows
    if max_rows is None or n <= max_rows:
        yield rb
        return
    for start in range(0, n, max_rows):
        yield rb.slice(start, max_rows)


def _plain_columns(rb: pa.RecordBatch) -> pa.RecordBatch:
    """``rb`` with run-end encoded columns decoded (Arrow casts them to nothing) and the
    dictionaries of string or binary views (Polars' ``Categorical`` and ``Enum`` columns)
    made plain: Arrow can neither decode nor take from them."""
    coded = [
        i for i, f in enumerate(rb.schema)
        if pa.types.is_run_end_encoded(f.type)
        or (pa.types.is_dictionary(f.type) and _view_value(f.type.value_type) is not None)
    ]  # fmt: skip
    if not coded:
        return rb
    import pyarrow.compute as pc

    arrays = list(rb.columns)
    for i in coded:
        arr = arrays[i]
        if pa.types.is_run_end_encoded(arr.type):
            arr = arrays[i] = pc.run_end_decode(arr)
        if pa.types.is_dictionary(arr.type) and _view_value(arr.type.value_type) is not None:
            plain = _view_value(arr.type.value_type)
            arrays[i] = pa.DictionaryArray.from_arrays(arr.indices, arr.dictionary.cast(plain))
    return pa.RecordBatch.from_arrays(arrays, names=rb.schema.names)


def _view_value(arrow_type: pa.DataType) -> pa.DataType | None:
    """The plain type of a string or binary view type; ``None`` for other types."""
    if _is_view(arrow_type, "string"):
        return pa.large_string()
    if _is_view(arrow_type, "binary"):
        return pa.large_binary()
    return None


def _is_dataframe(obj: Any) -> bool:
    module = type(obj).__module__
    return module.startswith("pandas") and type(obj).__name__ == "DataFrame"


def check_batch_columns(batch: Any, columns: Sequence[str]) -> None:
    """A pandas ``DataFrame`` or a dict of arrays whose ``columns`` a query can read: each one
    column of values (``TypeError``/``ValueError`` naming it otherwise)."""
    if type(batch).__name__ == "DataFrame":
        names = [str(c) for c in batch.columns]
        for name in columns:
            if names.count(name) > 1:
                raise ValueError(
                    f"the DataFrame has {names.count(name)} columns named {name!r}; rename them "
                    "so the query can tell them apart"
                )
        return
    if isinstance(batch, Mapping):
        for name in columns:
            values = batch.get(name)
            if values is not None and (
                isinstance(values, (str, bytes)) or not hasattr(values, "__len__")
            ):
                raise TypeError(
                    f"column {name!r} must be an array or a sequence of values, got a "
                    f"{type(values).__name__}"
                )


def _record_batch_from_pandas(frame: Any, columns: Sequence[str] | None = None) -> pa.RecordBatch:
    """A DataFrame's columns (those named in ``columns``, if given) as Arrow arrays: NaN in NumPy
    float columns stays a value, pandas' missing markers (``pd.NA``, ``None``, ``NaT``, NaN in
    object/string columns) are nulls."""
    if columns is not None:
        check_batch_columns(frame, columns)
    arrays = []
    names = []
    wanted = None if columns is None else set(columns)
    for i in range(frame.shape[1]):
        name = str(frame.columns[i])
        if wanted is not None and name not in wanted:
            continue
        names.append(name)
        series = frame.iloc[:, i]
        dtype = series.dtype
        if isinstance(dtype, np.dtype) and not dtype.isnative:  # Arrow takes native order only
            series = series.astype(dtype.newbyteorder("="))
        try:
            if isinstance(dtype, np.dtype) and dtype.kind == "f":
                values = series.to_numpy()
                if values.dtype == np.float16:
                    values = values.astype(np.float32)
                arrays.append(pa.array(values, from_pandas=False))
            else:
                arrays.append(pa.array(series, from_pandas=True))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError) as exc:
            raise TypeError(
                f"column {frame.columns[i]!r} of pandas dtype {dtype} cannot be converted: {exc}"
            ) from exc
    if not arrays:  # no column the query reads: its rows still count
        return pa.RecordBatch.from_arrays([pa.nulls(len(frame))], names=["__rows"]).select([])
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _record_batch_from_mapping(
    batch: Mapping[str, Any], columns: Sequence[str] | None = None
) -> pa.RecordBatch:
    arrays = []
    names = []
    length = None
    wanted = None if columns is None else set(columns)
    for name, values in batch.items():
        if wanted is not None and str(name) not in wanted:
            rows = len(values) if hasattr(values, "__len__") else None  # not converted
        else:
            arr = _arrow_from_numpy(str(name), values)
            names.append(str(name))
            arrays.append(arr)
            rows = len(arr)
        if length is None:
            length = rows
        elif rows is not None and rows != length:
            raise ValueError(
                f"column {name!r} has {rows} rows but the batch's first column has {length}"
            )
    if not arrays and length:  # no column the query reads: its rows still count
        return pa.RecordBatch.from_arrays([pa.nulls(length)], names=["__rows"]).select([])
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _arrow_from_numpy(name: str, values: Any) -> pa.Array:
    """An Arrow array over a NumPy array (zero-copy for plain numeric arrays)."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    mask = None
    if isinstance(values, np.ma.MaskedArray):
        mask = np.ma.getmaskarray(values)
        values = values.data
    arr = values if isinstance(values, np.ndarray) else np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"column {name!r} must be one-dimensional, got shape {arr.shape}")
    if not arr.dtype.isnative:  # big-endian: Arrow takes native byte order only (a copy)
        arr = arr.astype(arr.dtype.newbyteorder("="))
    try:
        if arr.dtype.kind in "iufb":
            if arr.dtype == np.float16:
                arr = arr.astype(np.float32)
            return pa.array(arr, mask=mask)  # NaN stays a value
        if arr.dtype.kind in "MmUSO":
            return pa.array(arr, mask=mask, from_pandas=arr.dtype.kind in "Mm")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError) as exc:
        raise TypeError(
            f"column {name!r} of NumPy dtype {arr.dtype} cannot be converted: {exc}"
        ) from exc
    raise TypeError(f"column {name!r} has unsupported NumPy dtype {arr.dtype}")


def _validity(arr: pa.Array) -> np.ndarray | None:
    if arr.null_count == 0:
        return None
    return arr.is_valid().to_numpy(zero_copy_only=False)


def _fixed_values(arr: pa.Array, dtype: np.dtype) -> np.ndarray:
    buf = arr.buffers()[1]
    if buf is None:
        return np.zeros(len(arr), dtype=dtype)
    return np.frombuffer(buf, dtype=dtype)[arr.offset : arr.offset + len(arr)]


def _decimal_values(arr: pa.Array) -> np.ndarray:
    """Unscaled values: ``int64`` (up to 18 digits: the low words, one compact copy) or the
    ``(n, 2)`` ``int64`` words of each decimal128 (zero-copy)."""
    n = len(arr)
    buf = arr.buffers()[1]
    words = (
        np.zeros((n, 2), dtype=np.int64)
        if buf is None
        else np.frombuffer(buf, dtype=np.int64).reshape(-1, 2)[arr.offset : arr.offset + n]
    )
    if is_decimal64(arr.type):
        return _arrow_pool_copy(words[:, 0])
    return words


def _as_decimal128(arr: pa.Array) -> tuple[pa.DataType, np.ndarray]:
    """A decimal32, decimal64 or decimal256 (of up to 38 digits) array's type as the
    decimal128 of its precision and scale, and its unscaled values as
    :func:`_decimal_values` gives them: the engine has one decimal type (Arrow's other widths
    went to the generic engine, which refused their sums). decimal64's values are its own
    buffer, decimal32's widened."""
    typ = arr.type
    as128 = pa.decimal128(typ.precision, typ.scale)
    if typ.bit_width <= 64:  # decimal32, decimal64 (pyarrow >= 18)
        storage = np.dtype(np.int64 if typ.bit_width == 64 else np.int32)
        return as128, _fixed_values(arr, storage).astype(np.int64, copy=False)
    return as128, _decimal_values(arr.cast(as128))


def _arrow_pool_copy(values: np.ndarray) -> np.ndarray:
    """A contiguous copy of ``values`` in memory from Arrow's pool, not the C heap: a scan
    makes one such copy per decimal column and batch, and glibc handed each freed copy's pages
    back to the kernel, so the next batch's came fresh (TPC-H Q1 on SF10: 1.0 s of page faults
    for three columns); Arrow's allocators keep freed pages for the next batch."""
    if values.nbytes < _POOL_COPY_MIN_BYTES:
        return np.ascontiguousarray(values)
    buffer = pa.allocate_buffer(values.nbytes)
    out = np.frombuffer(buffer, dtype=values.dtype)
    np.copyto(out, values)
    return out


#: copies smaller than this stay on the C heap (glibc serves them from its free lists)
_POOL_COPY_MIN_BYTES = 128 << 10


def decimal_array(
    arrow_type: pa.DataType, lo: np.ndarray, hi: np.ndarray, mask: np.ndarray | None
) -> pa.Array:
    """A decimal128 array from the low (unsigned or signed) and high (signed) 64-bit words of
    its unscaled values; ``mask`` marks nulls."""
    n = len(lo)
    words = np.empty((n, 2), dtype=np.int64)
    words[:, 0] = lo.view(np.int64) if lo.dtype == np.uint64 else lo
    words[:, 1] = hi.view(np.int64) if hi.dtype == np.uint64 else hi
    validity = None
    nulls = 0
    if mask is not None and mask.any():
        validity = pa.py_buffer(np.packbits(~mask, bitorder="little"))
        nulls = int(mask.sum())
    return pa.Array.from_buffers(arrow_type, n, [validity, pa.py_buffer(words)], null_count=nulls)


_TEMPORAL_STORAGE: dict[int, tuple[pa.DataType, np.dtype]] = {
    32: (pa.int32(), np.dtype(np.int32)),
    64: (pa.int64(), np.dtype(np.int64)),
}


def to_column(name: str, arr: pa.Array) -> Column:
    """Normalise one Arrow array (dictionary arrays are decoded)."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    arrow_type = arr.type
    kind = column_kind(arrow_type)
    valid = _validity(arr)
    if kind is None:
        raise TypeError(f"column {name!r} has unsupported type {type_name(arrow_type)}")
    if kind == "bool":
        values = arr.fill_null(False).to_numpy(zero_copy_only=False)
        return Column(name, kind, arrow_type, values, valid)
    if kind in ("int", "uint", "float"):
        if pa.types.is_float16(arrow_type):
            arr = arr.cast(pa.float32())
        dtype = np.dtype(arr.type.to_pandas_dtype())
        return Column(name, kind, arrow_type, _fixed_values(arr, dtype), valid)
    if kind == "temporal":
        storage, dtype = _TEMPORAL_STORAGE[arrow_type.bit_width]
        return Column(name, kind, arrow_type, _fixed_values(arr.view(storage), dtype), valid)
    if kind == "decimal":
        if not pa.types.is_decimal128(arrow_type):
            return Column(name, kind, *_as_decimal128(arr), valid)
        return Column(name, kind, arrow_type, _decimal_values(arr), valid)
    # variable length: 64-bit offsets; 32-bit ones are widened in NumPy (a pyarrow cast costs
    # ~0.3 ms a call, more than the chunk's hashing at the small chunks of a small budget)
    small = pa.types.is_string(arrow_type) or pa.types.is_binary(arrow_type)
    if not (small or pa.types.is_large_string(arrow_type) or pa.types.is_large_binary(arrow_type)):
        target = pa.large_string() if kind == "string" else pa.large_binary()
        arr = arr.cast(target)
    bufs = arr.buffers()
    n = len(arr)
    width = np.int32 if small else np.int64
    offsets = np.frombuffer(bufs[1], dtype=width)[arr.offset : arr.offset + n + 1]
    if small:
        offsets = offsets.astype(np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(bufs[2], dtype=np.uint8)[lo:hi] if bufs[2] is not None else _NO_BYTES
    if lo:
        offsets = offsets - lo
    return Column(name, kind, arrow_type, None, valid, offsets, data)


_NO_BYTES = np.zeros(0, dtype=np.uint8)


def to_columns(
    rb: pa.RecordBatch, names: Iterable[str], types: Mapping[str, pa.DataType] | None = None
) -> dict[str, Column]:
    """The named columns of a record batch; a missing column raises ``ValueError``.

    A column of Arrow type ``null`` (all values missing, e.g. a pandas object column of
    ``None``) takes its type from ``types`` (the types seen before).
    """
    out: dict[str, Column] = {}
    schema_names: Sequence[str] = rb.schema.names
    for name in names:
        if name in out:
            continue
        index = rb.schema.get_field_index(name)
        if index < 0:
            raise ValueError(
                f"column {name!r} is not in the batch; it has columns {list(schema_names)}"
            )
        arr = rb.column(index)
        if pa.types.is_null(arr.type):
            known = None if types is None else types.get(name)
            if known is None:
                raise TypeError(
                    f"column {name!r} holds only nulls (Arrow type null), so its type is unknown; "
                    "give it a type in the first batch (e.g. a typed pyarrow array)"
                )
            arr = pa.nulls(len(arr), type=known)
        out[name] = to_column(name, arr)
    return out

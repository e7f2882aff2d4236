"""Batch codecs: how one block becomes the bytes of one batch in a run file (before compression).

Two codecs share one file format: pickled Python rows for the generic engine and raw NumPy
columns for the columnar engine. Both start with the hash column as raw little-endian ``uint64``
so the hashes are never pickled.
"""

from __future__ import annotations

import functools
import pickle
import struct
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from extagg.errors import SpillError
from extagg.spill.blocks import ColumnBlock, IntKeyBlock, ObjectBlock

__all__ = [
    "BatchCodec",
    "ObjectCodec",
    "ColumnCodec",
    "OBJECT_CODEC",
    "COLUMN_CODEC",
    "codec_by_id",
]

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class BatchCodec(ABC):
    """Encodes a block to bytes and back. ``codec_id`` is stored in the run-file header."""

    codec_id: int = 0
    name: str = ""

    @abstractmethod
    def encode(self, block: Any) -> bytes:
        """The uncompressed payload of one batch."""

    @abstractmethod
    def decode(self, payload: memoryview | bytes) -> Any:
        """The block a payload holds (``ValueError`` if it is malformed)."""

    #: whether :meth:`encode_into` writes the payload straight into the buffer (else it is
    #: :meth:`encode` and a copy: writers then do not use it)
    encodes_into = False

    def encode_into(self, block: Any, buffer: bytearray) -> memoryview:
        """:meth:`encode` into ``buffer`` (grown to the payload if smaller, reused from batch
        to batch: a fresh multi-MiB ``bytes`` per batch costs page faults); a view of the
        payload, valid until ``buffer`` is used again (release it before then)."""
        data = self.encode(block)
        buffer[:] = data
        return memoryview(buffer)

    def for_compression(self, compression: str) -> BatchCodec:
        """The codec a writer of ``compression`` uses (same ``codec_id``: same reader)."""
        return self


#: how a batch of int keys written from arrays starts (PROTO 5, EMPTY_LIST, MARK, LONG1):
#: see :mod:`extagg.spill._pickle_reference` for the whole shape
_INT_ROWS_START = b"\x80\x05](\x8a"


class ObjectCodec(BatchCodec):
    """``u32 n | n × u64 hashes | pickle((keys, values))``.

    A block with a ``pickled_rows()`` method (the generic engine's typed path,
    :class:`extagg.generic.typed_map.TypedSortedRows`) supplies those pickle bytes itself,
    written from its arrays; the batch is the same."""

    codec_id = 1
    name = "object"

    def encode(self, block: ObjectBlock) -> bytes:
        hashes = np.ascontiguousarray(block.hashes, dtype="<u8")
        pickled = getattr(block, "pickled_rows", None)
        if pickled is not None:
            body = pickled()
        else:
            rows = (block.keys, block.values)
            try:
                body = pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                failure = exc
                body = pickle_by_value(rows, exc, lambda: _unpicklable_row(block, failure))
        return b"".join((_U32.pack(len(hashes)), hashes.tobytes(), body))

    def decode(self, payload: memoryview | bytes) -> ObjectBlock:
        """The batch's rows; a batch of plain int keys and float or int combiners in the
        shape the engine writes them from arrays comes back as an :class:`IntKeyBlock`
        (read by a compiled parser, :mod:`extagg.spill._pickle_kernels`), any other is
        unpickled."""
        view = memoryview(payload)
        (n,) = _U32.unpack_from(view, 0)
        end = 4 + 8 * n
        if end > len(view):
            raise ValueError(f"batch holds {len(view)} bytes, too few for {n} hashes")
        hashes = np.frombuffer(view[4:end], dtype="<u8").astype(np.uint64)
        if view[end : end + len(_INT_ROWS_START)] == _INT_ROWS_START:
            # written from arrays (a pickler writes a FRAME after PROTO): parse it compiled;
            # imported here so that a worker that never sees such a batch never loads numba
            from extagg.spill import _pickle_kernels as PK

            key_bits = np.empty(n, dtype=np.uint64)
            value_bits = np.empty(n, dtype=np.uint64)
            data = np.frombuffer(view, np.uint8, offset=end)
            kind = PK.parse_int_rows(data, n, key_bits, value_bits)
            if kind != PK.NOT_PARSED:
                numbers = value_bits.view(np.float64 if kind == PK.FLOAT_VALUES else np.int64)
                return IntKeyBlock(hashes, key_bits.view(np.int64), numbers)
            del key_bits, value_bits
        keys, values = pickle.loads(view[end:])
        if len(keys) != n or len(values) != n:
            raise ValueError(f"batch declares {n} rows but holds {len(keys)} keys")
        return ObjectBlock(hashes, list(keys), list(values))


def pickle_by_value(obj: Any, exc: Exception, error: Callable[[], Exception]) -> bytes:
    """``obj`` pickled by PySpark's cloudpickle inside a PySpark task, where ``pickle``
    failed with ``exc``; else raise ``error()``.

    In a PySpark worker, classes and functions of the driver's ``__main__`` (a script's, a
    notebook's) exist by value only: PySpark's cloudpickle made them, and plain ``pickle``
    cannot name them (``attribute lookup UserId on __main__ failed``), so a job whose keys
    or combiners are such classes failed at its first spill. The cloudpickle that made them
    pickles them (its registry makes a class unpickle as the same class object, so keys
    stay equal across spills); ``pickle.loads`` reads the result. Outside a task the rules
    are plain ``pickle``'s, whatever is imported."""
    if _in_pyspark_task():
        try:
            from pyspark import cloudpickle

            return bytes(cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))  # type: ignore[no-untyped-call]
        except Exception:
            pass
    raise error() from exc


def _in_pyspark_task() -> bool:
    if "pyspark" not in sys.modules:
        return False
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - a pyspark without it
        return False
    return TaskContext.get() is not None


def _unpicklable_row(block: ObjectBlock, exc: Exception) -> SpillError:
    """Find the row that cannot be pickled and name its key's type."""
    for key, value in zip(block.keys, block.values):
        for what, obj in (("key", key), ("combiner", value)):
            try:
                pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as row_exc:
                subject = "a key" if what == "key" else "the combiner of a key"
                return SpillError(
                    f"cannot serialise {subject} of type {type(key).__name__} "
                    f"({type(obj).__name__}: {row_exc}) while spilling"
                )
    return SpillError(f"cannot serialise a batch of {len(block)} rows while spilling: {exc}")


def _little_endian(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr


@functools.lru_cache(maxsize=4096)
def _column_prefix(name: str, width: int, dtype: str) -> bytes:
    """What precedes a column's array length: kind, name, (width,) and dtype. ``width``: a
    wide fixed column's words a row, -1 a fixed column, -2 a variable one (its offsets), -3 a
    fixed column stored byte plane by byte plane."""
    raw = name.encode("utf-8")
    kind = b"W" if width >= 0 else {-1: b"F", -2: b"V", -3: b"S"}[width]
    head = kind + _U32.pack(len(raw)) + raw
    if width >= 0:
        head += _U32.pack(width)
    code = dtype.encode("ascii")
    return head + _U32.pack(len(code)) + code


#: what precedes a variable column's bytes array (its dtype: ``|u1``)
_DATA_PREFIX = _U32.pack(3) + b"|u1"


def _bytes_view(arr: np.ndarray) -> memoryview:
    """A C-contiguous array's bytes, without a copy (``b"".join`` takes buffers)."""
    return arr.reshape(-1).view(np.uint8).data


#: the fewest rows of a column worth storing byte plane by byte plane
SHUFFLE_MIN_ROWS = 64


class ColumnCodec(BatchCodec):
    """``u32 n | n × u64 hashes | u32 ncols | per column: kind, name, dtype, arrays``.

    Fixed columns (kind ``F``) store one array; wide fixed columns (kind ``W``: ``n × width``
    values per row, e.g. the two words of a decimal128) store ``u32 width`` and one array;
    variable columns (``V``) store their offsets and data arrays. A reader that does not know a
    kind rejects the batch (it names the kind), so files with wide columns are never misread.

    ``shuffle``: integer and date/time columns of 4- or 8-byte values that span less than
    their two top bytes can count are stored byte plane by byte plane (kind ``S``: every
    value's first byte, then every second byte, ...; Blosc's shuffle). The planes of the high
    bytes of such keys and counts are runs of one or two values, so LZ4 compresses them fast
    and well: three TPC-H int64 key columns, 0.96 MB, LZ4 1.52 ms to 0.39 MB plain, 0.24 ms
    to 0.20 MB shuffled. Full-range values (random 64-bit ids, hashes) gain nothing and are
    stored plain, as are floats. Writers without compression do not shuffle.
    Decoding is zero-copy views over the decompressed payload, but for shuffled columns
    (compiled kernels in :mod:`extagg.spill._shuffle_kernels` rearrange them).
    """

    codec_id = 2
    name = "column"
    encodes_into = True

    def __init__(self, shuffle: bool = True) -> None:
        self.shuffle = shuffle

    def for_compression(self, compression: str) -> BatchCodec:
        """This codec for a writer of ``compression``: unshuffled when it is ``none``."""
        return COLUMN_CODEC_PLAIN if compression == "none" else self

    def encode(self, block: ColumnBlock) -> bytes:
        # arrays joined through their buffers: one copy of the rows (the join), not two
        return b"".join(self._parts(block))

    def encode_into(self, block: ColumnBlock, buffer: bytearray) -> memoryview:
        parts = [memoryview(part).cast("B") for part in self._parts(block)]
        size = sum(len(part) for part in parts)
        if len(buffer) < size:  # grown, never shrunk: its pages stay mapped from batch to batch
            buffer.extend(bytes(size - len(buffer)))
        view = memoryview(buffer)[:size]
        at = 0
        for part in parts:
            view[at : at + len(part)] = part
            at += len(part)
        return view

    def _parts(self, block: ColumnBlock) -> list[bytes | memoryview]:
        """The payload's pieces in order: fixed bytes (a column's kind, name and dtype come
        from a cache: small batches pay per column, not per byte) and the arrays' buffers."""
        hashes = np.ascontiguousarray(block.hashes, "<u8")
        parts: list[bytes | memoryview] = [
            _U32.pack(len(hashes)),
            _bytes_view(hashes),
            _U32.pack(len(block.columns) + len(block.var_columns)),
        ]
        shuffle = self.shuffle and len(hashes) >= SHUFFLE_MIN_ROWS
        for name, col in block.columns.items():
            arr = _little_endian(col)
            if shuffle and arr.ndim == 1 and arr.dtype.kind in "iuM" and _narrow(arr):
                parts.append(_column_prefix(name, -3, arr.dtype.str))
                parts.append(_U64.pack(arr.nbytes))
                parts.append(_bytes_view(_to_planes(arr)))
                continue
            width = arr.shape[1] if arr.ndim == 2 else -1
            parts.append(_column_prefix(name, width, arr.dtype.str))
            parts.append(_U64.pack(arr.nbytes))
            parts.append(_bytes_view(arr))
        for name, (offsets, data) in block.var_columns.items():
            parts.append(_column_prefix(name, -2, "<i8"))
            offsets = _little_endian(np.asarray(offsets, dtype=np.int64))
            parts.append(_U64.pack(offsets.nbytes))
            parts.append(_bytes_view(offsets))
            data = np.ascontiguousarray(data, dtype=np.uint8)
            parts.append(_DATA_PREFIX)
            parts.append(_U64.pack(data.nbytes))
            parts.append(_bytes_view(data))
        return parts

    def decode(self, payload: memoryview | bytes) -> ColumnBlock:
        view = memoryview(payload)
        (n,) = _U32.unpack_from(view, 0)
        pos = 4 + 8 * n
        hashes = np.frombuffer(view[4:pos], dtype="<u8")
        (ncols,) = _U32.unpack_from(view, pos)
        pos += 4
        columns: dict[str, np.ndarray] = {}
        var_columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for _ in range(ncols):
            kind = bytes(view[pos : pos + 1])
            (name_len,) = _U32.unpack_from(view, pos + 1)
            name = bytes(view[pos + 5 : pos + 5 + name_len]).decode("utf-8")
            pos += 5 + name_len
            if kind == b"F":
                arr, pos = self._read_array(view, pos)
                columns[name] = arr
            elif kind == b"S":
                arr, pos = self._read_array(view, pos)
                columns[name] = _from_planes(arr)
            elif kind == b"W":
                (width,) = _U32.unpack_from(view, pos)
                arr, pos = self._read_array(view, pos + 4)
                if width == 0 or len(arr) % width:
                    raise ValueError(f"wide column {name!r} of {len(arr)} values, width {width}")
                columns[name] = arr.reshape(-1, width)
            elif kind == b"V":
                offsets, pos = self._read_array(view, pos)
                data, pos = self._read_array(view, pos)
                var_columns[name] = (offsets, data)
            else:
                raise ValueError(f"unknown column kind {kind!r} for column {name!r}")
        if pos != len(view):
            raise ValueError(f"{len(view) - pos} unexpected trailing bytes in column batch")
        return ColumnBlock(hashes, columns, var_columns)

    @staticmethod
    def _read_array(view: memoryview, pos: int) -> tuple[np.ndarray, int]:
        (dlen,) = _U32.unpack_from(view, pos)
        dtype = np.dtype(bytes(view[pos + 4 : pos + 4 + dlen]).decode("ascii"))
        pos += 4 + dlen
        (nbytes,) = _U64.unpack_from(view, pos)
        pos += 8
        if pos + nbytes > len(view) or nbytes % max(1, dtype.itemsize):
            raise ValueError(f"array of {nbytes} bytes does not fit the batch")
        return np.frombuffer(view[pos : pos + nbytes], dtype=dtype), pos + nbytes


def _narrow(arr: np.ndarray) -> bool:
    """Whether an integer array's values span less than its two top bytes can count (they
    are then planes of one or two values: worth shuffling; full-range values are not)."""
    if arr.itemsize < 4 or len(arr) == 0:
        return False
    ints = arr.view(np.int64) if arr.dtype.kind == "M" else arr
    return int(ints.max()) - int(ints.min()) < 1 << (8 * (arr.itemsize - 2))


def byte_planes(arr: np.ndarray) -> np.ndarray:
    """A 1-D array's bytes plane by plane: byte 0 of every value, then byte 1, ... (a
    ``(itemsize, n)`` uint8 array)."""
    return np.ascontiguousarray(arr.view(np.uint8).reshape(len(arr), arr.itemsize).T)


def from_byte_planes(stored: np.ndarray) -> np.ndarray:
    """The inverse of :func:`byte_planes`: the values of dtype ``stored.dtype`` whose bytes
    ``stored`` holds plane by plane (a new array)."""
    width = stored.itemsize
    planes = stored.view(np.uint8).reshape(width, len(stored))
    return np.ascontiguousarray(planes.T).view(stored.dtype).reshape(len(stored))


def _to_planes(arr: np.ndarray) -> np.ndarray:
    """:func:`byte_planes` (flat), by a compiled kernel for 4- and 8-byte values."""
    if arr.itemsize not in (4, 8):
        return byte_planes(arr)
    # imported here: a process that never spills narrow columns never loads numba for it
    from extagg.spill import _shuffle_kernels as SK

    out = np.empty(arr.nbytes, dtype=np.uint8)
    if arr.itemsize == 8:
        SK.to_planes_u64(arr.view(np.uint64), out)
    else:
        SK.to_planes_u32(arr.view(np.uint32), out)
    return out


def _from_planes(stored: np.ndarray) -> np.ndarray:
    """:func:`from_byte_planes`, by a compiled kernel for 4- and 8-byte values."""
    if stored.itemsize not in (4, 8):
        return from_byte_planes(stored)
    from extagg.spill import _shuffle_kernels as SK

    planes = stored.view(np.uint8)
    if stored.itemsize == 8:
        out = np.empty(len(stored), dtype=np.uint64)
        SK.from_planes_u64(planes, out)
    else:
        out = np.empty(len(stored), dtype=np.uint32)
        SK.from_planes_u32(planes, out)
    return out.view(stored.dtype)


OBJECT_CODEC = ObjectCodec()
COLUMN_CODEC = ColumnCodec()
#: the column codec of writers that do not compress (nothing gained by shuffling)
COLUMN_CODEC_PLAIN = ColumnCodec(shuffle=False)
_CODECS = {c.codec_id: c for c in (OBJECT_CODEC, COLUMN_CODEC)}


def codec_by_id(codec_id: int) -> BatchCodec:
    """The codec stored under ``codec_id`` in a run-file header (``KeyError`` if unknown)."""
    return _CODECS[codec_id]

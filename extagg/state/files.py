"""Delta and snapshot files: the record format, the streaming reader and the atomic writer.

Layout of ``<version>.delta`` and ``<version>.snapshot``::

    header (never compressed)
        magic  b"EXAGSTAT" · format version u8 (2) · kind u8 (1 delta, 2 snapshot)
        · compression u8 (0 none, 1 LZ4 frame) · flags u8 (bit 0: records sorted)
        · store id length u16 · store id UTF-8 (``op=<operator>,part=<partition>,store=<name>``;
        empty: not a store's, e.g. a merge pass's temporary file) · CRC32 of every header byte
        before it (big-endian u32)
        (format 1, still read: the first 12 bytes and their CRC32, 16 bytes in all)
    body (an LZ4 frame with block and content checksums, or raw bytes)
        records as in Spark's HDFS state store: int32 key size, key bytes, int32 value size, value
        bytes; value size -1 marks a delete (deltas only); key size -1 ends the records
        trailer: u64 record count, u32 CRC32 of every body byte before it

All integers are big-endian. Keys are encoded by :mod:`extagg.state.codec` (8-byte stable hash +
encoding), and records are in strictly ascending bytewise key order, which is ascending
``stable_hash`` order. Readers stream the body in bounded chunks and check everything: a
truncated, flipped, empty or foreign file raises :class:`extagg.errors.CorruptFileError` — and
so does a file of another store: one whose header's store id is not the store reading it (a
partition's delta copied into another's folder: its records would be read as the other's
state). The version is the file's name only, so the same records of one store give the same
bytes in every version.

Writes are atomic (:class:`extagg.state.atomic.AtomicFile`): a temp file in the same directory,
created when the first bytes are written, flushed, fsynced and renamed over the final name.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import lz4.frame

from extagg.errors import CorruptFileError
from extagg.state.atomic import ANY, AtomicFile, remove_stale_temp_files

__all__ = [
    "DELTA",
    "SNAPSHOT",
    "COMPRESSIONS",
    "AtomicFile",
    "StateFileWriter",
    "StateFileReader",
    "StateFileListing",
    "store_id",
    "state_file_name",
    "list_state_files",
    "remove_stale_temp_files",
]

logger = logging.getLogger(__name__)

MAGIC = b"EXAGSTAT"
FORMAT_VERSION = 2
#: the formats read: 1 had no store id in its header
READ_FORMAT_VERSIONS = (1, 2)
DELTA = "delta"
SNAPSHOT = "snapshot"
_KIND_CODES = {DELTA: 1, SNAPSHOT: 2}
_KIND_NAMES = {code: name for name, code in _KIND_CODES.items()}
COMPRESSIONS = {"none": 0, "lz4": 1}
_COMPRESSION_NAMES = {code: name for name, code in COMPRESSIONS.items()}
FLAG_SORTED = 1

_HEADER = struct.Struct(">8sBBBB")
#: format 2's header after the fields of ``_HEADER``: the store id's length
_STORE_LENGTH = struct.Struct(">H")
#: the longest store id a header holds
MAX_STORE_ID_BYTES = 4096
_S_I = struct.Struct(">i")
_S_U32 = struct.Struct(">I")
_TRAILER = struct.Struct(">QI")
_S_Q = struct.Struct(">Q")
_EOF_MARK = _S_I.pack(-1)
_DELETE_MARK = _S_I.pack(-1)

#: uncompressed bytes buffered before a compressed block is written
WRITE_BUFFER_SIZE = 256 * 1024
#: compressed bytes read at a time, and the most decompressed bytes produced per step
READ_CHUNK_SIZE = 256 * 1024
DECOMPRESSED_CHUNK_SIZE = 512 * 1024


def store_id(operator_id: int, partition_id: int, store_name: str) -> str:
    """The store id a state file's header names its store by (see the module docstring)."""
    return f"op={operator_id},part={partition_id},store={store_name}"


def state_file_name(version: int, kind: str) -> str:
    """``"<version>.delta"`` or ``"<version>.snapshot"``."""
    if kind not in _KIND_CODES:
        raise ValueError(f"unknown state file kind {kind!r}: expected 'delta' or 'snapshot'")
    return f"{version}.{kind}"


# ---------------------------------------------------------------------------------------------
# writer


@dataclass
class FileStats:
    """What a finished writer wrote: records, body bytes before compression, file bytes."""

    path: str
    records: int
    raw_bytes: int
    file_bytes: int


class StateFileWriter:
    """Writes one delta or snapshot file, records in strictly ascending key order.

    ``write(key_bytes, value_bytes)`` with ``value_bytes=None`` writes a delete (deltas only).
    Nothing touches the disk until :data:`WRITE_BUFFER_SIZE` bytes are buffered or
    :meth:`commit` is called; :meth:`cancel` discards everything. The header records
    ``store`` (a :func:`store_id`), which readers check.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        kind: str,
        compression: str = "lz4",
        *,
        store: str = "",
    ) -> None:
        if kind not in _KIND_CODES:
            raise ValueError(f"unknown state file kind {kind!r}")
        if compression not in COMPRESSIONS:
            raise ValueError(
                f"unknown state file compression {compression!r}: expected one of "
                f"{sorted(COMPRESSIONS)}"
            )
        self.kind = kind
        self.compression = compression
        self._file = AtomicFile(path)
        self.path = self._file.path
        store_bytes = store.encode("utf-8")
        if len(store_bytes) > MAX_STORE_ID_BYTES:
            raise ValueError(f"store id of {len(store_bytes)} bytes (at most {MAX_STORE_ID_BYTES})")
        head = _HEADER.pack(
            MAGIC, FORMAT_VERSION, _KIND_CODES[kind], COMPRESSIONS[compression], FLAG_SORTED
        )
        head += _STORE_LENGTH.pack(len(store_bytes)) + store_bytes
        self._header = head + _S_U32.pack(zlib.crc32(head))
        self._compressor = (
            lz4.frame.LZ4FrameCompressor(
                block_size=lz4.frame.BLOCKSIZE_MAX256KB,
                block_checksum=True,
                content_checksum=True,
            )
            if compression == "lz4"
            else None
        )
        self._started = False
        self._buffer = bytearray()
        self._crc = 0
        self._previous_key = b""
        self.records = 0
        self.raw_bytes = 0

    def write(self, key: bytes, value: bytes | None) -> None:
        """Append one record; keys must be strictly ascending (``ValueError`` otherwise)."""
        if key <= self._previous_key:
            raise ValueError(
                f"state file {self.path}: keys must be written in strictly ascending order "
                f"(key {key.hex()} after {self._previous_key.hex()})"
            )
        self._previous_key = key
        buf = self._buffer
        buf += _S_I.pack(len(key))
        buf += key
        if value is None:
            if self.kind == SNAPSHOT:
                raise ValueError(f"snapshot {self.path} cannot hold a delete record")
            buf += _DELETE_MARK
        else:
            buf += _S_I.pack(len(value))
            buf += value
        self.records += 1
        if len(buf) >= WRITE_BUFFER_SIZE:
            self._flush_buffer()

    def _flush_buffer(self) -> None:
        data = bytes(self._buffer)
        self._buffer.clear()
        self._crc = zlib.crc32(data, self._crc)
        self.raw_bytes += len(data)
        out = b""
        if not self._started:
            self._started = True
            out = self._header
            if self._compressor is not None:
                out += self._compressor.begin()
        if self._compressor is not None:
            data = self._compressor.compress(data)
        self._file.write(out + data if out else data)

    def commit(self, expected: object = ANY) -> FileStats:
        """Write the end marker and trailer and atomically publish the file (``expected``: see
        :meth:`AtomicFile.commit`; fences concurrent writers of one version)."""
        try:
            self._buffer += _EOF_MARK
            self._buffer += _S_Q.pack(self.records)
            body = bytes(self._buffer)
            self._buffer.clear()
            self._crc = zlib.crc32(body, self._crc)
            body += _S_U32.pack(self._crc)
            self.raw_bytes += len(body)
            out = b""
            if not self._started:
                self._started = True
                out = self._header + (
                    self._compressor.begin() if self._compressor is not None else b""
                )
            if self._compressor is not None:
                body = self._compressor.compress(body) + self._compressor.flush()
            self._file.write(out + body)
            self._file.commit(expected)
        except BaseException:
            self.cancel()
            raise
        return FileStats(self.path, self.records, self.raw_bytes, self._file.bytes_written)

    def cancel(self) -> None:
        """Discard the file being written (no temp file stays behind)."""
        self._buffer.clear()
        self._file.cancel()


# ---------------------------------------------------------------------------------------------
# reader


class StateFileReader:
    """Streams the records of one state file as ``(key_bytes, value_bytes_or_None)``.

    Opening reads and checks the header. Iterating decompresses at most
    :data:`DECOMPRESSED_CHUNK_SIZE` bytes at a time, checks sizes, key order, the record count,
    the body checksum and the end of the file, and closes the file when done. ``label`` (e.g.
    the provider) is added to error messages. A header's store id must be ``store`` when
    that is given (a header of format 1, or with no store id, is not checked).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        expected_kind: str | None = None,
        label: str = "",
        *,
        store: str | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.label = label
        #: the store id the header names ("": none)
        self.store = ""
        self._header_size = 0
        self._handle: BinaryIO | None = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        try:
            self._read_header(expected_kind)
            self._check_store(store)
        except BaseException:
            self.close()
            raise
        self._offset = self._header_size
        self._decompressor = lz4.frame.LZ4FrameDecompressor() if self.compression == "lz4" else None

    def _corrupt(self, reason: str, offset: int | None = None) -> CorruptFileError:
        where = f" of {self.label}" if self.label else ""
        return CorruptFileError(
            self.path,
            self._offset if offset is None else offset,
            f"error reading {getattr(self, 'kind', 'state')} file{where}: {reason}",
        )

    def _read_header(self, expected_kind: str | None) -> None:
        assert self._handle is not None
        head = self._handle.read(_HEADER.size + 4)
        if not head:
            raise self._corrupt("the file is empty (no header)", 0)
        if len(head) < _HEADER.size + 4:
            raise self._corrupt(f"the file is too short for a header ({len(head)} bytes)", 0)
        magic, version, kind, compression, flags = _HEADER.unpack_from(head)
        if magic != MAGIC:
            raise self._corrupt(f"not an extagg state file (magic {magic!r})", 0)
        if version not in READ_FORMAT_VERSIONS:
            if _S_U32.unpack_from(head, _HEADER.size)[0] != zlib.crc32(head[: _HEADER.size]):
                raise self._corrupt("header checksum mismatch", 0)
            raise self._corrupt(
                f"unsupported format version {version} (this extagg reads "
                f"{', '.join(map(str, READ_FORMAT_VERSIONS))})",
                8,
            )
        if version >= 2:  # the 4 bytes read after the fields: the id's length, 2 more
            (store_length,) = _STORE_LENGTH.unpack_from(head, _HEADER.size)
            if store_length > MAX_STORE_ID_BYTES:
                raise self._corrupt(f"header store id of {store_length} bytes", _HEADER.size)
            rest = store_length + _STORE_LENGTH.size
            head += self._handle.read(rest)
            if len(head) < _HEADER.size + 4 + rest:
                raise self._corrupt(f"the file is too short for a header ({len(head)} bytes)", 0)
        if _S_U32.unpack_from(head, len(head) - 4)[0] != zlib.crc32(head[:-4]):
            raise self._corrupt("header checksum mismatch", 0)
        self._header_size = len(head)
        if version >= 2:
            try:
                self.store = head[_HEADER.size + _STORE_LENGTH.size : -4].decode("utf-8")
            except UnicodeDecodeError:
                raise self._corrupt("header store id is not UTF-8", _HEADER.size) from None
        if kind not in _KIND_NAMES or compression not in _COMPRESSION_NAMES:
            raise self._corrupt(f"unknown kind {kind} or compression {compression}", 9)
        if flags != FLAG_SORTED:
            raise self._corrupt(f"unknown flags 0x{flags:02x}", 11)
        self.kind = _KIND_NAMES[kind]
        self.compression = _COMPRESSION_NAMES[compression]
        if expected_kind is not None and self.kind != expected_kind:
            raise self._corrupt(f"holds a {self.kind} where a {expected_kind} was expected", 9)

    def _check_store(self, store: str | None) -> None:
        """A file of another store is corrupt in this one's folder: its records are not this
        store's state."""
        if store is not None and self.store and self.store != store:
            raise self._corrupt(
                f"its header says it belongs to store ({self.store}), not ({store}): a file "
                "copied from another partition, operator or store",
                _HEADER.size,
            )

    def close(self) -> None:
        """Close the file (iteration also closes it at the end or on error)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()

    def __enter__(self) -> StateFileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _more(self) -> bytes:
        """The next piece of the body (b"" at the end of the input)."""
        handle = self._handle
        if handle is None:
            raise ValueError(f"state file reader of {self.path} is closed")
        decompressor = self._decompressor
        if decompressor is None:
            data = handle.read(READ_CHUNK_SIZE)
            self._offset += len(data)
            return data
        while True:
            if decompressor.eof:
                return b""
            try:
                if decompressor.needs_input:
                    data = handle.read(READ_CHUNK_SIZE)
                    if not data:
                        return b""
                    self._offset += len(data)
                    out = decompressor.decompress(data, max_length=DECOMPRESSED_CHUNK_SIZE)
                else:
                    out = decompressor.decompress(b"", max_length=DECOMPRESSED_CHUNK_SIZE)
            except RuntimeError as exc:
                raise self._corrupt(f"LZ4 data is corrupt: {exc}") from None
            if out:
                return out

    def __iter__(self) -> Iterator[tuple[bytes, bytes | None]]:
        return self.records()

    def records(self) -> Iterator[tuple[bytes, bytes | None]]:
        """Yield every record in file order, then check the trailer and the end of the file.

        An uncompressed body has no block checksums, so a flipped bit would only show at the
        trailer, after the damaged records had gone out: its checksum is verified first, in a
        streaming pass (bounded memory, one more read of the file)."""
        try:
            if self._decompressor is None and not self._body_checksum_matches():
                for _record in self._records():  # raises the precise error (truncated, ...)
                    pass
                raise self._corrupt("body checksum mismatch")
            yield from self._records()
        finally:
            self.close()

    def _body_checksum_matches(self) -> bool:
        """Whether an uncompressed body's CRC-32 (every byte before the last 4) is the one its
        last 4 bytes hold; reads the file in :data:`READ_CHUNK_SIZE` pieces and rewinds."""
        handle = self._handle
        if handle is None:
            raise ValueError(f"state file reader of {self.path} is closed")
        body_end = os.fstat(handle.fileno()).st_size - 4
        pos = self._header_size
        crc = 0
        handle.seek(pos)
        while pos < body_end:
            data = handle.read(min(READ_CHUNK_SIZE, body_end - pos))
            if not data:
                break
            crc = zlib.crc32(data, crc)
            pos += len(data)
        stored = handle.read(4) if pos == body_end else b""
        handle.seek(self._header_size)
        return len(stored) == 4 and _S_U32.unpack(stored)[0] == crc

    def _refill(self, buf: bytes, pos: int, crc: int, need: int) -> tuple[bytes, int]:
        """``buf[pos:]`` extended to at least ``need`` bytes; the consumed part goes into crc."""
        crc = zlib.crc32(memoryview(buf)[:pos], crc)
        rest = buf[pos:]
        pieces = [rest]
        have = len(rest)
        while have < need:
            more = self._more()
            if not more:
                raise self._corrupt(
                    "the file is truncated: it ends before the end-of-records marker"
                )
            pieces.append(more)
            have += len(more)
        return b"".join(pieces), crc

    def _records(self) -> Iterator[tuple[bytes, bytes | None]]:
        unpack_i = _S_I.unpack_from
        is_snapshot = self.kind == SNAPSHOT
        buf = b""
        pos = 0
        crc = 0
        count = 0
        previous = b""
        while True:
            if pos + 4 > len(buf):
                buf, crc = self._refill(buf, pos, crc, 4)
                pos = 0
            key_size = unpack_i(buf, pos)[0]
            if key_size < 9:
                if key_size == -1:
                    break
                raise self._corrupt(f"key size cannot be {key_size}")
            key_end = pos + 4 + key_size
            if key_end + 4 > len(buf):
                buf, crc = self._refill(buf, pos, crc, key_size + 8)
                pos = 0
                key_end = 4 + key_size
            value_size = unpack_i(buf, key_end)[0]
            if value_size >= 0:
                end = key_end + 4 + value_size
                if end > len(buf):
                    buf, crc = self._refill(buf, pos, crc, key_size + 8 + value_size)
                    key_end -= pos
                    end -= pos
                    pos = 0
                key = buf[pos + 4 : key_end]
                value: bytes | None = buf[key_end + 4 : end]
                pos = end
            elif value_size == -1 and not is_snapshot:
                key = buf[pos + 4 : key_end]
                value = None
                pos = key_end + 4
            else:
                raise self._corrupt(f"value size cannot be {value_size}")
            if key <= previous:
                raise self._corrupt("records are out of key order (or a key repeats)")
            previous = key
            count += 1
            yield key, value
        # trailer: record count and the CRC32 of every body byte before it
        if pos + 4 + _TRAILER.size > len(buf):
            buf, crc = self._refill(buf, pos, crc, 4 + _TRAILER.size)
            pos = 0
        stored_count, stored_crc = _TRAILER.unpack_from(buf, pos + 4)
        crc = zlib.crc32(memoryview(buf)[: pos + 4 + 8], crc)
        if stored_count != count:
            raise self._corrupt(f"the trailer counts {stored_count} records but {count} were read")
        if stored_crc != crc:
            raise self._corrupt("body checksum mismatch")
        if pos + 4 + _TRAILER.size != len(buf) or self._more():
            raise self._corrupt("unexpected data after the end of the records")
        if self._decompressor is not None:
            if not self._decompressor.eof:
                raise self._corrupt("the LZ4 frame is truncated")
            if self._decompressor.unused_data:
                raise self._corrupt("unexpected data after the LZ4 frame")
        assert self._handle is not None
        if self._handle.read(1):
            raise self._corrupt("unexpected data after the LZ4 frame")


# ---------------------------------------------------------------------------------------------
# directory listing


@dataclass
class StateFileListing:
    """The delta and snapshot files of one store directory, by version."""

    directory: str
    deltas: dict[int, str] = field(default_factory=dict)
    snapshots: dict[int, str] = field(default_factory=dict)

    @property
    def latest_version(self) -> int:
        """The newest version with a file (0 when the directory holds none)."""
        return max([0, *self.deltas, *self.snapshots])

    @property
    def versions(self) -> list[int]:
        """Every version with a delta or a snapshot, ascending."""
        return sorted(set(self.deltas) | set(self.snapshots))


def list_state_files(directory: str | os.PathLike[str]) -> StateFileListing:
    """List ``<version>.delta`` and ``<version>.snapshot`` in ``directory`` (missing dir: empty).

    Hidden files (temp files) and subdirectories (other stores) are skipped; any other file is
    logged as unidentified and ignored.
    """
    directory = os.fspath(directory)
    listing = StateFileListing(directory)
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return listing
    for entry in entries:
        name = entry.name
        if name.startswith(".") or entry.is_dir():
            continue
        parts = name.split(".")
        kind = parts[1] if len(parts) == 2 else ""
        if kind in _KIND_CODES and parts[0].isdigit() and str(int(parts[0])) == parts[0]:
            version = int(parts[0])
            (listing.deltas if kind == DELTA else listing.snapshots)[version] = entry.path
        else:
            logger.warning("Could not identify file %s", entry.path)
    return listing

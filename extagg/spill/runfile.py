"""The run file: a hash-sorted run of rows, written once, read batch by batch.

Layout (all integers little-endian)::

    header   32 bytes   magic b"EXTAGRUN" | u16 format version | u8 batch codec |
                        u8 compression | u32 flags (bit 0: unordered) | 16-byte run id
    batch 0  ...        codec payload, compressed independently (LZ4 block) or stored raw
    batch 1  ...
    footer   52 bytes per batch: u64 offset | u64 stored length | u64 raw length | u64 rows |
                                 u64 min hash | u64 max hash | u32 crc32 of the stored bytes
    trailer  32 bytes   u64 footer offset | u32 batches | u64 rows | u32 crc32 of the footer |
                        magic b"EXTAGEND"

A run is sorted by hash within and across batches, unless the *unordered* flag is set (the raw
input rows a partitioning aggregation sets aside; then each batch's hash range is its min and max).
A reader needs nothing but the file: the trailer locates the footer, the footer gives each batch's
byte range, row count and hash range (which the merge uses to decide what to read next without
decoding). Every batch is decodable on its own and checked by CRC-32 before it is decompressed.

The run id is random, made by the writer, which returns it in :class:`RunFile` and registers it
with the spill directories for the file's path; a reader of that path checks it (or an id it is
given), so a run file replaced by another valid run — another map's, or an older one of the same
map — is a :class:`~extagg.errors.CorruptFileError`, not silently merged. Version 1 files (no id)
are rejected like any unknown version.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import lz4.block
import numpy as np

from extagg.errors import CorruptFileError, SpillError
from extagg.spill.codecs import BatchCodec, codec_by_id
from extagg.spill.tempdir import SpillDirs, expected_run_id, forget_run_id, note_run_id

__all__ = ["RunWriter", "RunReader", "RunFile", "BatchInfo", "COMPRESSIONS"]

MAGIC = b"EXTAGRUN"
END_MAGIC = b"EXTAGEND"
FORMAT_VERSION = 2
#: bytes of the random id in the header
RUN_ID_BYTES = 16
COMPRESSIONS = {"none": 0, "lz4": 1}
_COMPRESSION_NAMES = {v: k for k, v in COMPRESSIONS.items()}
_HEADER = struct.Struct("<8sHBBI16s")
_ENTRY = struct.Struct("<QQQQQQI")
_TRAILER = struct.Struct("<QIQI8s")
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
#: header flag: batches are not sorted by hash (nor across batches)
FLAG_UNORDERED = 1


def open_for_writing(path: str) -> Any:
    """Open a new run file, readable by its owner only (its folder is private too: see
    :mod:`extagg.spill.tempdir`). The one place files are created, so tests can inject I/O
    faults."""
    return open(path, "wb", opener=_owner_only)


def _owner_only(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


@dataclass(frozen=True)
class BatchInfo:
    """One footer entry: where a batch is and what it holds."""

    offset: int
    length: int
    raw_length: int
    count: int
    min_hash: int
    max_hash: int
    crc: int


@dataclass(frozen=True)
class RunFile:
    """A finished run file."""

    path: str
    num_batches: int
    num_records: int
    disk_bytes: int
    raw_bytes: int
    max_batch_bytes: int = 0
    #: the random id in the header (what a reader of ``path`` expects)
    run_id: bytes = b""


#: batches smaller than this are encoded into a new ``bytes`` even when the caller has a
#: buffer to reuse: joining a few parts costs less than filling a buffer part by part, and
#: small allocations come from malloc's free lists (no page faults)
SCRATCH_MIN_BYTES = 256 << 10


class RunWriter:
    """Writes one run file. Blocks must arrive sorted by hash, non-decreasing across calls,
    unless ``ordered`` is false (then the file is flagged unordered).

    ``run_id`` (16 bytes) fixes the header's id, for byte-identical files; by default it is random.
    Files are byte-identical for the same input apart from that id (bytes 16-31).

    On a full disk the partial file is removed and :class:`~extagg.errors.SpillError` names the
    directory and the bytes needed; any other failure also removes the file.
    """

    def __init__(
        self,
        path: str,
        codec: BatchCodec,
        *,
        compression: str = "lz4",
        spill_dirs: SpillDirs | None = None,
        ordered: bool = True,
        run_id: bytes | None = None,
    ) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(
                f"unknown spill compression {compression!r}: choose one of {sorted(COMPRESSIONS)}"
            )
        self.path = path
        self.codec = codec.for_compression(compression)
        self.compression = compression
        self.ordered = ordered
        self._spill_dirs = spill_dirs
        self._entries: list[BatchInfo] = []
        self._records = 0
        self._raw_bytes = 0
        self._last_hash = -1
        self._file: Any = None
        self._offset = 0
        self._scratch = bytearray()  # large batches are encoded into it (see write_block)
        #: random identity of this run, written in the header and checked by readers
        self.run_id = secrets.token_bytes(RUN_ID_BYTES) if run_id is None else run_id
        if len(self.run_id) != RUN_ID_BYTES:
            raise ValueError(f"a run id is {RUN_ID_BYTES} bytes, got {len(self.run_id)}")
        self._open()

    def _open(self) -> None:
        header = _HEADER.pack(
            MAGIC,
            FORMAT_VERSION,
            self.codec.codec_id,
            COMPRESSIONS[self.compression],
            0 if self.ordered else FLAG_UNORDERED,
            self.run_id,
        )
        try:
            self._file = open_for_writing(self.path)
        except OSError as exc:
            self._fail(exc, len(header))
        note_run_id(self.path, self.run_id)
        self._write(header)

    def _write(self, data: bytes | memoryview) -> None:
        if self._spill_dirs is not None:
            try:
                self._spill_dirs.charge(self.path, len(data))
            except SpillError:
                self.abort()
                raise
        try:
            self._file.write(data)
        except OSError as exc:
            self._fail(exc, len(data))
        self._offset += len(data)

    def _fail(self, exc: OSError, nbytes: int) -> None:
        self.abort()
        directory = (
            SpillDirs.directory_of(self.path) if self._spill_dirs else os.path.dirname(self.path)
        )
        if exc.errno in _DISK_FULL:
            raise SpillError(
                f"No space left on device in spill directory {directory} while writing {nbytes} "
                f"bytes to {self.path}; free space, or point spill_dirs / EXTAGG_SPILL_DIR at a "
                "larger disk",
                directory=directory,
                bytes_needed=nbytes,
                errno=exc.errno,
            ) from exc
        raise SpillError(
            f"cannot write spill file {self.path} in {directory}: {exc.strerror or exc}",
            directory=directory,
            bytes_needed=nbytes,
            errno=exc.errno,
        ) from exc

    def write_block(self, block: Any, scratch: bytearray | None = None) -> int:
        """Append ``block`` as one batch; returns the bytes written. A large batch is encoded
        into a buffer reused from batch to batch (see
        :meth:`~extagg.spill.codecs.BatchCodec.encode_into`): ``scratch``, one the caller
        shares among its writers, or else this writer's own (dropped when it finishes)."""
        n = len(block)
        if n == 0:
            return 0
        hashes = block.hashes
        if not self.ordered:
            lo, hi = int(hashes.min()), int(hashes.max())
        else:
            lo, hi = int(hashes[0]), int(hashes[-1])
        if self.ordered and lo < self._last_hash:
            self.abort()
            raise ValueError(
                f"blocks written to {self.path} are not in hash order "
                f"({lo} after {self._last_hash})"
            )
        try:
            if not self.codec.encodes_into or block.nbytes() < SCRATCH_MIN_BYTES:
                raw: bytes | memoryview = self.codec.encode(block)
            else:
                raw = self.codec.encode_into(block, self._scratch if scratch is None else scratch)
        except SpillError:
            self.abort()
            raise
        try:
            stored = lz4.block.compress(raw, store_size=False) if self.compression == "lz4" else raw
            entry = BatchInfo(self._offset, len(stored), len(raw), n, lo, hi, zlib.crc32(stored))
            self._write(stored)
        finally:
            if isinstance(raw, memoryview):
                raw.release()  # the caller may resize its scratch again
        self._entries.append(entry)
        self._records += n
        self._raw_bytes += entry.raw_length
        self._last_hash = hi
        return entry.length

    def write_sorted(self, block: Any, batch_size: int) -> None:
        """Write a sorted block as batches of at most ``batch_size`` rows."""
        for start in range(0, len(block), batch_size):
            self.write_block(block.slice(start, start + batch_size))

    def finish(self) -> RunFile:
        """Write the footer and close; the file is complete and readable."""
        footer = b"".join(
            _ENTRY.pack(e.offset, e.length, e.raw_length, e.count, e.min_hash, e.max_hash, e.crc)
            for e in self._entries
        )
        trailer = _TRAILER.pack(
            self._offset, len(self._entries), self._records, zlib.crc32(footer), END_MAGIC
        )
        self._write(footer + trailer)
        self._scratch = bytearray()
        try:
            self._file.close()
        except OSError as exc:
            self._fail(exc, 0)
        self._file = None
        return RunFile(
            self.path,
            len(self._entries),
            self._records,
            self._offset,
            self._raw_bytes,
            max((e.raw_length for e in self._entries), default=0),
            self.run_id,
        )

    def abort(self) -> None:
        """Close and delete the partial file (safe to call more than once)."""
        self._scratch = bytearray()
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
        if self._spill_dirs is not None:
            self._spill_dirs.remove(self.path)
        else:
            forget_run_id(self.path)
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None or self._file is not None:
            self.abort()


class RunReader:
    """Reads a run file batch by batch; validates everything it reads.

    Any truncation, bit flip or foreign file raises :class:`~extagg.errors.CorruptFileError`
    naming the file, the offset and the reason. ``run_id`` is the id the file must carry;
    without it, the id its writer registered for ``path`` in this process (if any).
    """

    def __init__(self, path: str, run_id: bytes | None = None) -> None:
        self.path = path
        self._expected_id = run_id if run_id is not None else expected_run_id(path)
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise CorruptFileError(path, None, "spill file does not exist") from None
        try:
            self._read_index()
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise

    def _corrupt(self, offset: int | None, reason: str) -> CorruptFileError:
        return CorruptFileError(self.path, offset, reason)

    def _pread(self, size: int, offset: int) -> bytes:
        data = os.pread(self._fd, size, offset)
        if len(data) != size:
            raise self._corrupt(offset, f"expected {size} bytes, file ends after {len(data)}")
        return data

    def _read_index(self) -> None:
        status = os.fstat(self._fd)
        if not stat.S_ISREG(status.st_mode):
            kind = "a directory" if stat.S_ISDIR(status.st_mode) else "not a regular file"
            raise self._corrupt(None, f"the spill file's path is {kind} now")
        size = status.st_size
        self.file_size = size
        if size < _HEADER.size + _TRAILER.size:
            raise self._corrupt(0, f"file is too short to be an extagg run file ({size} bytes)")
        magic, version, codec_id, compression, flags, run_id = _HEADER.unpack(
            self._pread(_HEADER.size, 0)
        )
        if magic != MAGIC:
            raise self._corrupt(0, f"not an extagg run file (magic {magic!r})")
        if version != FORMAT_VERSION:
            raise self._corrupt(
                8,
                f"unsupported run-file format version {version} "
                f"(this extagg reads {FORMAT_VERSION})",
            )
        if self._expected_id is not None and run_id != self._expected_id:
            raise self._corrupt(
                16,
                f"run id {run_id.hex()} is not the {self._expected_id.hex()} its writer gave it: "
                "the file was replaced by another run",
            )
        self.run_id = run_id
        try:
            self.codec = codec_by_id(codec_id)
        except KeyError:
            raise self._corrupt(10, f"unknown batch codec id {codec_id}") from None
        if compression not in _COMPRESSION_NAMES:
            raise self._corrupt(11, f"unknown compression id {compression}")
        if flags & ~FLAG_UNORDERED:
            raise self._corrupt(12, f"unknown header flags {flags:#x}")
        self.ordered = not flags & FLAG_UNORDERED
        self.compression = _COMPRESSION_NAMES[compression]
        tpos = size - _TRAILER.size
        footer_offset, nbatches, nrecords, footer_crc, end = _TRAILER.unpack(
            self._pread(_TRAILER.size, tpos)
        )
        if end != END_MAGIC:
            raise self._corrupt(tpos, "missing end marker: the file is truncated or corrupt")
        if footer_offset + nbatches * _ENTRY.size != tpos or footer_offset < _HEADER.size:
            raise self._corrupt(tpos, "footer position does not match the file size")
        footer = self._pread(nbatches * _ENTRY.size, footer_offset)
        if zlib.crc32(footer) != footer_crc:
            raise self._corrupt(footer_offset, "footer checksum mismatch")
        self.batches: list[BatchInfo] = []
        expected = _HEADER.size
        total = 0
        for i in range(nbatches):
            entry = BatchInfo(*_ENTRY.unpack_from(footer, i * _ENTRY.size))
            if entry.offset != expected or entry.min_hash > entry.max_hash:
                raise self._corrupt(
                    footer_offset + i * _ENTRY.size, f"bad index entry for batch {i}"
                )
            expected = entry.offset + entry.length
            total += entry.count
            self.batches.append(entry)
        if expected != footer_offset or total != nrecords:
            raise self._corrupt(footer_offset, "batch index does not add up to the file")
        self.num_records = nrecords

    def read_block(self, i: int) -> Any:
        """Decode batch ``i`` (checksum verified, hashes checked against the footer)."""
        entry = self.batches[i]
        stored = self._pread(entry.length, entry.offset)
        if zlib.crc32(stored) != entry.crc:
            raise self._corrupt(entry.offset, f"checksum mismatch in batch {i}")
        try:
            raw = (
                lz4.block.decompress(stored, uncompressed_size=entry.raw_length)
                if self.compression == "lz4"
                else stored
            )
            if len(raw) != entry.raw_length:
                raise ValueError(f"decoded {len(raw)} bytes, expected {entry.raw_length}")
            block = self.codec.decode(raw)
        except CorruptFileError:
            raise
        except Exception as exc:
            raise self._corrupt(entry.offset, f"cannot decode batch {i}: {exc}") from exc
        hashes = block.hashes
        if not self.ordered:
            wrong = len(block) != entry.count or (
                len(hashes) > 0
                and (int(hashes.min()) != entry.min_hash or int(hashes.max()) != entry.max_hash)
            )
        else:
            wrong = (
                len(block) != entry.count
                or int(hashes[0]) != entry.min_hash
                or int(hashes[-1]) != entry.max_hash
                or (len(hashes) > 1 and bool(np.any(hashes[1:] < hashes[:-1])))
            )
        if wrong:
            raise self._corrupt(entry.offset, f"batch {i} does not match its index entry")
        return block

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        fd = getattr(self, "_fd", -1)
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> RunReader:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

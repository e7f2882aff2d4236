"""Delta and snapshot files of Spark's HDFS-backed state store: records in, records out.

Inside the compression stream (see :mod:`extagg.state.spark.framing`) a file is a sequence of
big-endian ``int32 key size, key, int32 value size, value`` records -- value size -1 is a
removal (deltas only) -- ended by a key size of -1. Keys and values are ``UnsafeRow`` bytes.
Files are written atomically (temp file, fsync, rename) with the ``.<name>.crc`` side file
Hadoop's checksum file system keeps, so that Spark verifies them as its own.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Iterator

from extagg.errors import CorruptFileError
from extagg.state.spark.framing import LZ4BlockWriter, decompressed_chunks

__all__ = ["iter_records", "write_records", "write_crc", "crc_path", "atomic_write", "AtomicFile"]

_INT = struct.Struct(">i")
#: Hadoop's ChecksumFileSystem: "crc\0", bytes per checksum, then a CRC-32 per chunk
CRC_MAGIC = b"crc\x00"
BYTES_PER_CHECKSUM = 512


def iter_records(path: str, snapshot: bool) -> Iterator[tuple[bytes, bytes | None]]:
    """``(key, value)`` records of a state file; ``value`` is ``None`` for a removal.

    Raises :class:`CorruptFileError` naming the file and the offset (in the decompressed
    stream) of a bad size or a truncated record, and ``FileNotFoundError`` for a missing file.
    """
    with open(path, "rb") as handle:
        buffer = bytearray()
        pos = 0
        consumed = 0  # decompressed bytes dropped from the front of buffer
        chunks = decompressed_chunks(handle, path)

        def fill(need: int) -> bool:
            nonlocal buffer, pos, consumed
            while len(buffer) - pos < need:
                try:
                    chunk = next(chunks)
                except StopIteration:
                    return False
                if pos:
                    del buffer[:pos]
                    consumed += pos
                    pos = 0
                buffer += chunk
            return True

        kind = "snapshot" if snapshot else "delta"
        unpack = _INT.unpack_from
        while True:
            if len(buffer) - pos < 4 and not fill(4):
                raise CorruptFileError(
                    path, consumed + pos, f"truncated {kind} file: no end-of-file marker"
                )
            (key_size,) = unpack(buffer, pos)
            if key_size == -1:
                # the compressed stream read to its end: its end block checked (a file cut in
                # it, or with its checksum damaged, read as whole; Spark's reader stops here)
                for _rest in chunks:
                    pass
                return
            if key_size < 0:
                raise CorruptFileError(path, consumed + pos, f"key size cannot be {key_size}")
            start = consumed + pos
            if len(buffer) - pos < 8 + key_size and not fill(8 + key_size):
                raise CorruptFileError(path, start, "truncated record")
            key = bytes(buffer[pos + 4 : pos + 4 + key_size])
            pos += 4 + key_size
            (value_size,) = unpack(buffer, pos)
            pos += 4
            if value_size < 0:
                if snapshot or value_size != -1:
                    raise CorruptFileError(
                        path, consumed + pos - 4, f"value size cannot be {value_size}"
                    )
                yield key, None
                continue
            if len(buffer) - pos < value_size and not fill(value_size):
                raise CorruptFileError(path, start, "truncated record")
            yield key, bytes(buffer[pos : pos + value_size])
            pos += value_size


def crc_path(path: str) -> str:
    """Hadoop's checksum side file of ``path``: ``.<name>.crc`` beside it."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.crc")


def write_crc(path: str, data: bytes) -> None:
    """Write ``path``'s ``.crc`` side file for ``data`` (its whole content)."""
    checksums = b"".join(
        struct.pack(">I", zlib.crc32(data[i : i + BYTES_PER_CHECKSUM]))
        for i in range(0, len(data), BYTES_PER_CHECKSUM)
    )
    atomic_write(
        crc_path(path), CRC_MAGIC + struct.pack(">i", BYTES_PER_CHECKSUM) + checksums, crc=False
    )


def atomic_write(path: str, data: bytes, crc: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (temp file, fsync, rename), and its ``.crc``."""
    directory, name = os.path.split(path)
    os.makedirs(directory or ".", exist_ok=True)
    temp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if crc:
            write_crc(path, data)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


class AtomicFile:
    """A file written to a temp name and renamed into place on :meth:`commit`, its ``.crc``
    computed as it streams (4 bytes per 512 written: the data itself is not kept)."""

    def __init__(self, path: str) -> None:
        self.path = path
        directory, name = os.path.split(path)
        os.makedirs(directory or ".", exist_ok=True)
        self._temp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
        self._handle = open(self._temp, "wb")  # noqa: SIM115 - closed by commit/abort
        self._pending = bytearray()
        self._checksums = bytearray()

    def write(self, data: bytes) -> None:
        self._handle.write(data)
        self._pending += data
        full = len(self._pending) - len(self._pending) % BYTES_PER_CHECKSUM
        for i in range(0, full, BYTES_PER_CHECKSUM):
            chunk = self._pending[i : i + BYTES_PER_CHECKSUM]
            self._checksums += struct.pack(">I", zlib.crc32(chunk))
        del self._pending[:full]

    def commit(self) -> None:
        if self._pending:
            self._checksums += struct.pack(">I", zlib.crc32(self._pending))
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        header = CRC_MAGIC + struct.pack(">i", BYTES_PER_CHECKSUM)
        atomic_write(crc_path(self.path), header + bytes(self._checksums), crc=False)
        os.replace(self._temp, self.path)

    def abort(self) -> None:
        self._handle.close()
        if os.path.exists(self._temp):
            os.unlink(self._temp)


def write_records(path: str, records: Iterable[tuple[bytes, bytes | None]]) -> int:
    """Write a state file of ``records`` (lz4 block stream) atomically with its ``.crc``;
    returns the record count. Streams: one 32 KiB block is buffered at a time."""
    target = AtomicFile(path)
    try:
        writer = LZ4BlockWriter(target)  # type: ignore[arg-type]
        count = 0
        for key, value in records:
            writer.write(_INT.pack(len(key)) + key)
            writer.write(_INT.pack(-1) if value is None else _INT.pack(len(value)) + value)
            count += 1
        writer.write(_INT.pack(-1))
        writer.finish()
        target.commit()
    except BaseException:
        target.abort()
        raise
    return count

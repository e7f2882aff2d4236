"""Compression streams of Spark state files: lz4-java's block stream (the default), and
zstd, snappy-java and LZF framing when their Python packages are installed.

lz4-java ``LZ4BlockOutputStream`` (as Spark's ``LZ4CompressionCodec`` configures it): blocks of
``"LZ4Block"``, a token (high nibble: 0x1 raw, 0x2 LZ4; low nibble: log2(block size) - 10),
little-endian compressed length, original length and checksum (XXHash32 of the original bytes,
seed 0x9747b28c, masked to 28 bits), then the data; an empty raw block ends the stream.
Every failure names the file and the byte offset of the block that failed.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from typing import IO, Any

from extagg.errors import CorruptFileError, ExtaggError

__all__ = [
    "CodecUnavailableError",
    "LZ4_MAGIC",
    "BLOCK_SIZE",
    "detect_codec",
    "decompressed_chunks",
    "LZ4BlockWriter",
    "xxhash32",
]

LZ4_MAGIC = b"LZ4Block"
_HEADER = struct.Struct("<BIII")  # token, compressed length, original length, checksum
HEADER_SIZE = len(LZ4_MAGIC) + _HEADER.size
METHOD_RAW = 0x10
METHOD_LZ4 = 0x20
SEED = 0x9747B28C
#: Spark's spark.io.compression.lz4.blockSize default (32k)
BLOCK_SIZE = 32 * 1024
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SNAPPY_MAGIC = b"\x82SNAPPY\x00"
LZF_MAGIC = b"ZV"

_PACKAGES = {"zstd": "zstandard", "snappy": "python-snappy", "lzf": "python-lzf"}


class CodecUnavailableError(ExtaggError, RuntimeError):
    """A state file uses a compression codec whose Python package is not installed."""


def xxhash32(data: bytes, seed: int = SEED) -> int:
    """XXHash32 of ``data`` (lz4-java's block checksum before masking)."""
    import xxhash

    return xxhash.xxh32_intdigest(data, seed)


def detect_codec(head: bytes) -> str | None:
    """The codec whose framing ``head`` (a file's first bytes) starts with, or ``None``."""
    if head.startswith(LZ4_MAGIC):
        return "lz4"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    if head.startswith(SNAPPY_MAGIC):
        return "snappy"
    if head.startswith(LZF_MAGIC):
        return "lzf"
    return None


def _need(codec: str, path: str) -> Any:
    module = {"zstd": "zstandard", "snappy": "snappy", "lzf": "lzf"}[codec]
    try:
        return __import__(module)
    except ImportError:
        raise CodecUnavailableError(
            f"{path} is compressed with {codec}, which needs the Python package "
            f"{_PACKAGES[codec]!r} (pip install {_PACKAGES[codec]}); without it extagg reads "
            "lz4 (Spark's default) only"
        ) from None


def _read_exact(handle: IO[bytes], size: int, path: str, offset: int, what: str) -> bytes:
    data = handle.read(size)
    if len(data) != size:
        raise CorruptFileError(
            path, offset, f"truncated: {what} needs {size} bytes, only {len(data)} left"
        )
    return data


def _lz4_chunks(handle: IO[bytes], path: str) -> Iterator[bytes]:
    import lz4.block

    offset = 0
    while True:
        magic = handle.read(len(LZ4_MAGIC))
        if not magic:
            raise CorruptFileError(path, offset, "truncated: the LZ4 stream has no end block")
        if magic != LZ4_MAGIC:
            raise CorruptFileError(path, offset, f"bad LZ4 block magic {magic!r}")
        header = _read_exact(handle, _HEADER.size, path, offset, "an LZ4 block header")
        token, compressed, original, checksum = _HEADER.unpack(header)
        method, level = token & 0xF0, token & 0x0F
        if method not in (METHOD_RAW, METHOD_LZ4) or original > 1 << (10 + level):
            raise CorruptFileError(path, offset, f"bad LZ4 block token 0x{token:02x}")
        if original == 0:
            if compressed != 0 or checksum != 0:
                raise CorruptFileError(path, offset, "bad LZ4 end block")
            return
        if method == METHOD_RAW and compressed != original:
            raise CorruptFileError(path, offset, "raw LZ4 block with unequal lengths")
        body = _read_exact(handle, compressed, path, offset, "an LZ4 block")
        if method == METHOD_RAW:
            data = body
        else:
            try:
                data = lz4.block.decompress(body, uncompressed_size=original)
            except lz4.block.LZ4BlockError as exc:
                raise CorruptFileError(
                    path, offset, f"LZ4 block does not decompress: {exc}"
                ) from None
            if len(data) != original:
                raise CorruptFileError(path, offset, "LZ4 block decompressed to the wrong size")
        if xxhash32(data) & 0x0FFFFFFF != checksum:
            raise CorruptFileError(path, offset, "LZ4 block checksum mismatch")
        yield data
        offset += HEADER_SIZE + compressed


def _zstd_chunks(handle: IO[bytes], path: str) -> Iterator[bytes]:
    zstandard = _need("zstd", path)
    reader = zstandard.ZstdDecompressor().stream_reader(handle, read_across_frames=True)
    try:
        while True:
            data = reader.read(1 << 16)
            if not data:
                return
            yield data
    except zstandard.ZstdError as exc:
        raise CorruptFileError(path, None, f"zstd stream does not decompress: {exc}") from None


def _snappy_chunks(handle: IO[bytes], path: str) -> Iterator[bytes]:
    snappy = _need("snappy", path)
    _read_exact(handle, 16, path, 0, "the snappy-java header")
    offset = 16
    while True:
        size_bytes = handle.read(4)
        if not size_bytes:
            return
        if len(size_bytes) < 4:
            raise CorruptFileError(path, offset, "truncated snappy chunk length")
        (size,) = struct.unpack(">i", size_bytes)
        body = _read_exact(handle, size, path, offset, "a snappy chunk")
        try:
            yield snappy.uncompress(body)
        except Exception as exc:  # the package raises its own error types
            raise CorruptFileError(
                path, offset, f"snappy chunk does not decompress: {exc}"
            ) from None
        offset += 4 + size


def _lzf_chunks(handle: IO[bytes], path: str) -> Iterator[bytes]:
    lzf = _need("lzf", path)
    offset = 0
    while True:
        head = handle.read(3)
        if not head:
            return
        if len(head) < 3 or head[:2] != LZF_MAGIC or head[2] not in (0, 1):
            raise CorruptFileError(path, offset, f"bad LZF chunk header {head!r}")
        if head[2] == 0:
            (size,) = struct.unpack(">H", _read_exact(handle, 2, path, offset, "LZF length"))
            yield _read_exact(handle, size, path, offset, "an LZF chunk")
            offset += 5 + size
        else:
            sizes = _read_exact(handle, 4, path, offset, "LZF lengths")
            compressed, original = struct.unpack(">HH", sizes)
            body = _read_exact(handle, compressed, path, offset, "an LZF chunk")
            data = lzf.decompress(body, original)
            if data is None or len(data) != original:
                raise CorruptFileError(path, offset, "LZF chunk does not decompress")
            yield data
            offset += 7 + compressed


def decompressed_chunks(handle: IO[bytes], path: str) -> Iterator[bytes]:
    """The decompressed bytes of a state file, chunk by chunk (codec detected from its head)."""
    head = handle.read(8)
    codec = detect_codec(head)
    if codec is None:
        raise CorruptFileError(
            path,
            0,
            f"not a Spark state file: unknown compression framing {head!r} (supported: lz4 "
            "block stream; zstd, snappy, lzf with their Python packages)",
        )
    stream = io.BufferedReader(_Prefixed(head, handle))
    return {"lz4": _lz4_chunks, "zstd": _zstd_chunks, "snappy": _snappy_chunks, "lzf": _lzf_chunks}[
        codec
    ](stream, path)


class _Prefixed(io.RawIOBase):
    """A raw stream that replays already-read bytes before the rest of a file."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self._head = head
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            size = min(len(buffer), len(self._head))
            buffer[:size] = self._head[:size]
            self._head = self._head[size:]
            return size
        data = self._rest.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class LZ4BlockWriter:
    """Writes an lz4-java block stream to a binary file object, as Spark's codec does."""

    def __init__(self, handle: IO[bytes], block_size: int = BLOCK_SIZE) -> None:
        if block_size < 64 or block_size & (block_size - 1) or block_size > 1 << 25:
            raise ValueError(f"block_size must be a power of two in [64, 32M], got {block_size}")
        self._handle = handle
        self._block_size = block_size
        self._level = max(0, block_size.bit_length() - 1 - 10)
        self._buffer = bytearray()

    def write(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= self._block_size:
            self._flush_block(bytes(self._buffer[: self._block_size]))
            del self._buffer[: self._block_size]

    def _flush_block(self, data: bytes) -> None:
        import lz4.block

        compressed = lz4.block.compress(data, store_size=False)
        method = METHOD_LZ4
        if len(compressed) >= len(data):
            compressed, method = data, METHOD_RAW
        checksum = xxhash32(data) & 0x0FFFFFFF
        self._handle.write(
            LZ4_MAGIC + _HEADER.pack(method | self._level, len(compressed), len(data), checksum)
        )
        self._handle.write(compressed)

    def finish(self) -> None:
        """Flush the last block and write the empty end block."""
        if self._buffer:
            self._flush_block(bytes(self._buffer))
            self._buffer.clear()
        self._handle.write(LZ4_MAGIC + _HEADER.pack(METHOD_RAW | self._level, 0, 0, 0))

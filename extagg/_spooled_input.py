"""Standard input (``-``) and pipes as input files of ``extagg aggregate``.

The scan reads files, not streams: a file's size for the progress bar, a Parquet footer at its
end, a text sample to infer the columns' types and then the whole file again, the rows before a
bad value to name its line. A stream given as an input (``-``, ``/dev/stdin``, a FIFO, a
process substitution ``<(zcat x.gz)``) is therefore first copied, a block at a time and as its
bytes come (compressed input stays compressed), to a file in this process's spill folder, and
that file is read instead. The copy is removed when the run ends, whether it succeeds, fails or
is interrupted (with the spill folder, also when the command leaves at once, and by the next
run if the process was killed). Its format is ``--format``'s, else a named pipe's extension's,
else told from its first bytes: Parquet's and Arrow's magic numbers, a JSON object, else CSV
(the delimiter sniffed as for a file).
"""

from __future__ import annotations

import bz2
import errno
import logging
import os
import stat
import sys
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from extagg.errors import InputError, QueryError

if TYPE_CHECKING:
    from extagg.spill.tempdir import SpillDirs

__all__ = ["STDIN", "SpooledInputs", "is_stream"]

log = logging.getLogger("extagg.cli")

#: the input path that names standard input
STDIN = "-"
_BLOCK = 1 << 20
#: the suffix a spooled stream is given for each ``--format``
_SUFFIX = {"parquet": ".parquet", "csv": ".csv", "tsv": ".tsv", "json": ".jsonl", "ipc": ".arrow"}
#: compressed streams by their magic bytes: the suffix that has the scan decompress them
_COMPRESSED = ((b"\x1f\x8b", ".gz"), (b"BZh", ".bz2"), (b"\x28\xb5\x2f\xfd", ".zst"))


def is_stream(path: str) -> bool:
    """Whether ``path`` names a stream to spool: ``-``, or an existing path that is neither a
    regular file nor a directory (a pipe, a character device such as ``/dev/stdin``)."""
    if path == STDIN:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


class SpooledInputs:
    """The input paths with every stream among them copied to a file.

    :meth:`copy_streams` copies the streams (in the order given; standard input once, however
    often ``-`` is named), :meth:`remove` removes the copies, :meth:`described` puts each
    stream's own name back into a message that names its copy.

    Parameters
    ----------
    paths
        The input paths as given.
    fmt
        ``--format``, or ``None`` to tell each stream's format from its first bytes.
    spill_dirs
        The spill directories (the copies go to the first), or ``None`` for the default.
    progress
        Whether a bar on stderr counts the bytes copied (a long stream shows it is read).
    """

    def __init__(
        self, paths: Sequence[str], fmt: str | None, spill_dirs: Any = None, progress: bool = False
    ) -> None:
        self.given = list(paths)
        self.fmt = fmt
        self.progress = progress
        self._spill_dirs = spill_dirs
        self._owner: SpillDirs | None = None
        #: the copy of each stream, by its given name
        self.copies: dict[str, str] = {}
        self._log_filter = _StreamNames(self)

    @property
    def paths(self) -> list[str]:
        """The input paths, each stream's replaced by its copy's."""
        return [self.copies.get(p, p) for p in self.given]

    def copy_streams(self) -> None:
        """Copy every stream among the paths to a file (none: nothing is done); until
        :meth:`remove`, log records name the streams, not their copies."""
        for path in self.given:
            if is_stream(path) and path not in self.copies:
                if not self._log_filter.installed:
                    self._log_filter.install()
                self._copy(path)

    def described(self, message: str) -> str:
        """``message`` with each copy's path replaced by the name of the stream copied."""
        for path, copy in self.copies.items():
            message = message.replace(copy, _name(path))
        return message

    def remove(self) -> None:
        """Remove every copy made."""
        if self._owner is not None:
            self._owner.cleanup()
        self._log_filter.uninstall()

    def _copy(self, path: str) -> None:
        name = _name(path)
        if path == STDIN:
            if sys.stdin is None or sys.stdin.isatty():
                what = "there is none" if sys.stdin is None else "it is a terminal"
                raise QueryError(
                    f"'-' reads standard input, but {what}: pipe the data in "
                    "(`zcat events.csv.gz | extagg aggregate - ...`) or name a file"
                )
            source: BinaryIO = sys.stdin.buffer
            opened = None
        else:
            try:
                opened = source = open(path, "rb")  # noqa: SIM115 (closed below)
            except OSError as exc:
                raise InputError(f"cannot read {path}: {exc.strerror or exc}", path=path) from exc
        try:
            first = _read(source, name)
            fmt = self.fmt
            if fmt is None and path != STDIN:  # a FIFO named like a file: its extension
                from extagg.io.inputs import detect_format

                fmt = detect_format(path)
            suffix = _suffix(first, fmt, name)
            if self._owner is None:
                from extagg.spill.tempdir import SpillDirs

                self._owner = SpillDirs(self._spill_dirs)
            directory = self._owner.dirs[0]
            try:
                # tracked before the first byte is written: an error or Ctrl-C removes it
                copy = self._owner.new_path("input", suffix=suffix)
                self.copies[path] = copy
                out = open(copy, "wb")  # noqa: SIM115 (closed below)
            except OSError as exc:
                raise InputError(
                    f"cannot copy {name} to a file in {directory}: {exc.strerror or exc}",
                    path=name,
                ) from exc
            from extagg._progress import progress_bar

            bar = progress_bar(enabled=self.progress, desc=f"copying {name}", unit="B",
                               unit_scale=True, unit_divisor=1024, leave=False)  # fmt: skip
            with out, bar:
                written = 0
                block = first
                while block:
                    _write(out, block, copy, directory, name, written)
                    written += len(block)
                    bar.update(len(block))
                    block = _read(source, name)
            log.info("%s copied to %s (%d bytes) to be read as a file", name, copy, written)
        finally:
            if opened is not None:
                opened.close()


class _StreamNames(logging.Filter):
    """On the root logger's handlers: a record that names a copy names its stream instead
    (``every input is empty (standard input)``, not a file in the spill folder)."""

    def __init__(self, inputs: SpooledInputs) -> None:
        super().__init__()
        self.inputs = inputs
        self.handlers: list[logging.Handler] = []

    @property
    def installed(self) -> bool:
        return bool(self.handlers)

    def install(self) -> None:
        self.handlers = list(logging.getLogger().handlers)
        for handler in self.handlers:
            handler.addFilter(self)

    def uninstall(self) -> None:
        for handler in self.handlers:
            handler.removeFilter(self)
        self.handlers = []

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        described = self.inputs.described(message)
        if described != message:
            record.msg, record.args = described, None
        return True


def _name(path: str) -> str:
    """How a stream is named in messages."""
    return "standard input" if path == STDIN else path


def _read(source: BinaryIO, name: str) -> bytes:
    """The next block of ``source`` (empty at its end)."""
    try:
        return source.read(_BLOCK)
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror or exc}", path=name) from exc


def _write(out: Any, block: bytes, copy: str, directory: str, name: str, written: int) -> None:
    """``block`` written to the copy; a full disk named with the directory and the bytes."""
    try:
        out.write(block)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InputError(
                f"no space left in {directory} to copy {name} to a file ({written + len(block):,}"
                " bytes needed so far): free space there, or give --spill-dir elsewhere",
                path=name,
            ) from exc
        raise InputError(f"cannot write {copy}: {exc.strerror or exc}", path=name) from exc


def _suffix(first: bytes, fmt: str | None, name: str) -> str:
    """The copy's file suffix: its format's extension (``fmt``, or told from the first
    bytes), then its compression's, so that the scan reads it as it would such a file."""
    compression = next((ext for magic, ext in _COMPRESSED if first.startswith(magic)), "")
    if fmt is not None:
        if fmt not in _SUFFIX:
            raise QueryError(f"unknown --format {fmt!r}; known: {', '.join(_SUFFIX)}")
        return _SUFFIX[fmt] + compression
    if not first:
        return ".csv"  # nothing: an empty CSV, as an empty file
    if first.startswith(b"PAR1"):
        return ".parquet"
    if first.startswith((b"ARROW1", b"\xff\xff\xff\xff")):
        return ".arrow"
    text = _decompressed_start(first, compression)
    if text is None:
        raise QueryError(
            f"cannot tell the format of {name} from its first bytes (they do not decompress "
            f"as {compression[1:]}): give --format"
        )
    start = text.lstrip(b"\xef\xbb\xbf \t\r\n")
    return (".jsonl" if start.startswith(b"{") else ".csv") + compression


def _decompressed_start(first: bytes, compression: str) -> bytes | None:
    """The start of a compressed stream's text from its first block, or ``None`` where it
    cannot be decompressed."""
    try:
        if compression == ".gz":
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(first, 4096)
        if compression == ".bz2":
            return bz2.BZ2Decompressor().decompress(first, 4096)
        if compression == ".zst":
            import pyarrow as pa

            stream = pa.CompressedInputStream(pa.BufferReader(first), "zstd")
            return bytes(stream.read(4096))
    except (zlib.error, OSError, EOFError, ValueError):
        return None
    return first
